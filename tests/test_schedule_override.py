"""``--schedule`` on an interleaved preset: a schedule with one chunk per stage sets
virtual_stages to 1 unless --interleave is given too ('workload show llama3-405b
--schedule zb-h1' failed with "virtual_stages=2 needs schedule 'interleaved'")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.errors import DessimError
from dessim.workload.transformer.plan import resolve_workload


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zb-h2", "gpipe"])
def test_a_one_chunk_schedule_replaces_the_interleaving(schedule):
    spec, _, _ = resolve_workload("llama3-405b", {"schedule": schedule}, 256)
    assert (spec.training.schedule, spec.training.virtual_stages) == (schedule, 1)


def test_an_explicit_interleave_is_still_checked():
    with pytest.raises(DessimError, match="virtual_stages=2 needs schedule 'interleaved'"):
        resolve_workload("llama3-405b", {"schedule": "zb-h1", "virtual_stages": 2}, 256)


def test_the_command_line():
    res = CliRunner().invoke(cli, ["workload", "show", "llama3-405b", "-t", "dgx-h100:nodes=32",
                                   "--schedule", "zb-h1", "--global-batch", "64"])
    assert res.exit_code == 0, res.output
    assert "zb-h1" in res.output.splitlines()[1] and "interleaved" not in res.output
