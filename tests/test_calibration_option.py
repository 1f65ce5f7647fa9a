"""Every simulating command takes ``--calibration FILE`` and names the calibration it ran
with: sweep (table column and report), explore, cluster (text and JSON), and a bad file is
one clear error."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from dessim.cli.main import cli

TINY = """\
name: tiny
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256}
parallelism: {tp: 1, pp: 1}
training: {global_batch: 8, micro_batch: 1, zero_stage: 1, recompute: selective, bucket_size: 1MiB}
"""


@pytest.fixture(scope="module")
def calibration_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cal") / "lab.yaml"
    path.write_text("name: lab\nnccl: {call_overhead: 31us}\nlinks:\n  nvlink3: {efficiency: 0.7}\n")
    return str(path)


def test_sweep_explore_and_cluster_take_a_calibration(tmp_path, calibration_file):
    runner = CliRunner()
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nkind: collective\nbase:\n  topology: dgx-a100:nodes=1\n"
                    "  collective: {op: allreduce}\naxes:\n  collective.size: [1MiB]\n")
    res = runner.invoke(cli, ["sweep", str(spec), "--no-progress", "-o", str(tmp_path / "s.csv"),
                              "--calibration", calibration_file])
    assert res.exit_code == 0, res.output
    assert "calibration: lab@" in res.output
    table = pd.read_csv(tmp_path / "s.csv")
    assert table["calibration"].str.startswith("lab@").all()
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY)
    res = runner.invoke(cli, ["explore", str(workload), "--topology", "dgx-a100:nodes=1",
                              "--hbm", "14MB", "--no-progress", "--calibration", calibration_file])
    assert res.exit_code == 0, res.output
    assert "calibration: lab@" in res.output
    res = runner.invoke(cli, ["cluster", "workloads/cluster-two-jobs.yaml", "--no-alone", "--json",
                              "--calibration", calibration_file])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["calibration"].startswith("lab@")
    res = runner.invoke(cli, ["cluster", "workloads/cluster-two-jobs.yaml", "--no-alone",
                              "--calibration", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_unknown_link_technology_in_a_calibration_is_refused_by_every_command(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("links:\n  nvlnk4: {efficiency: 0.7}\n")
    res = CliRunner().invoke(cli, ["collective", "allreduce", "--size", "1MiB", "--topology",
                                   "dgx-h100:nodes=1", "--calibration", str(bad)])
    assert res.exit_code == 2 and "nvlnk4" in res.output and "nvlink4" in res.output


def test_calibrate_prints_the_json_schema_of_calibration_files():
    import json as _json

    from click.testing import CliRunner as _Runner

    from dessim.cli.main import cli as _cli

    res = _Runner().invoke(_cli, ["calibrate", "--schema"])
    assert res.exit_code == 0, res.output
    schema = _json.loads(res.output)
    assert {"nccl", "links", "devices"} <= set(schema["properties"])


def test_a_value_overridden_without_a_source_does_not_keep_the_builtin_source():
    from dessim.catalog.calibration import default_calibration, load_calibration, parse_calibration

    merged = load_calibration(parse_calibration({"links": {"ib_ndr": {"efficiency": 0.8}}}))
    assert merged.link("ib_ndr").efficiency == 0.8 and merged.link("ib_ndr").source == ""
    assert merged.link("nvlink4").source == default_calibration().link("nvlink4").source
