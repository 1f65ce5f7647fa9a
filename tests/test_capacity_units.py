"""A memory capacity written as a string names its unit: ``--hbm 40`` would be a 40-byte GPU
(every layout "does not fit"), so it is refused with what a bare number would mean."""

from __future__ import annotations

import pytest

from dessim.errors import UnitError
from dessim.sweep.memory import memory_setup
from dessim.units import parse_capacity, parse_size
from dessim.workload.transformer.plan import plan_workload


@pytest.mark.parametrize("text", ["80GB", "40GiB", "1.5TB", "0", 80e9, 4096])
def test_a_capacity_with_a_unit_or_as_a_number_is_a_size(text):
    assert parse_capacity(text, "--hbm") == parse_size(text, "--hbm")


@pytest.mark.parametrize("text", ["40", "80.5", " 256 "])
def test_a_bare_string_is_refused_saying_what_it_would_mean(text):
    with pytest.raises(UnitError, match=rf"--hbm: '{text}' has no unit; .* would mean {float(text):g} bytes"):
        parse_capacity(text, "--hbm")


def test_every_capacity_entry_refuses_a_bare_string():
    with pytest.raises(UnitError, match="memory.hbm_capacity: '80' has no unit"):
        memory_setup({"hbm_capacity": "80"})
    with pytest.raises(UnitError, match="memory.expansion_capacity: '256' has no unit"):
        memory_setup({"expansion_capacity": "256"})
    with pytest.raises(UnitError, match="override hbm_capacity: '40' has no unit"):
        plan_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides={"hbm_capacity": "40"})
