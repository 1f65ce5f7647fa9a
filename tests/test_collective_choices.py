"""Every run says what ran its collectives (issue 16: "``auto`` ... says what it chose in every
output"): per group category, the collective runs per ``algorithm/protocol`` — one run per
instance of a collective's group, whether simulated, replayed from a memo, folded into lanes
or extrapolated — and the choices of collectives timed in closed form (TP islands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli

TINY = """\
name: tiny
model: {layers: 2, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256}
parallelism: {tp: 2, pp: 2}
training: {global_batch: 8, micro_batch: 1, bucket_size: 1MiB}
"""
TRACE = Path(__file__).parent / "data" / "chakra" / "allreduce_1MiB_8npu" / "ALL_REDUCE"


def run(args: list[str]) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("choices") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


@pytest.mark.parametrize("layout,topology,closed", [
    ("{tp: 2, pp: 2}", "dgx-a100:nodes=1", False),   # DP shares the TP ports: TP simulated
    ("{tp: 8, pp: 2}", "dgx-a100:nodes=2", True),    # one TP group per node: closed form
])
def test_the_counts_do_not_depend_on_the_shortcuts(tmp_path, layout, topology, closed):
    """The default run (folding, memo, closed-form TP) reports the same collective runs as
    the exact replay of every task; TP collectives timed in closed form name the choice the
    exact replay simulates."""
    path = tmp_path / "w.yaml"
    path.write_text(TINY.replace("{tp: 2, pp: 2}", layout))
    args = ["simulate", str(path), "-t", topology, "--json"]
    fast = json.loads(run(args))["collectives"]
    exact = json.loads(run(args + ["--exact"]))["collectives"]
    assert fast["settings"].startswith("algorithm auto")
    assert exact["closed_form"] == {} and sum(exact["chosen"]["tp"].values()) > 0
    if closed:
        assert "tp" not in fast["chosen"]
        assert fast["closed_form"]["tp"] == sorted(exact["chosen"]["tp"])
    else:
        assert fast["closed_form"] == {}
    assert {g: c for g, c in fast["chosen"].items()} == \
        {g: c for g, c in exact["chosen"].items() if not (closed and g == "tp")}


def test_a_forced_algorithm_is_reported_as_asked(tiny):
    out = run(["simulate", tiny, "-t", "dgx-a100:nodes=1", "--algo", "tree"])
    line = next(x for x in out.splitlines() if x.strip().startswith("collectives"))
    assert "dp tree/" in line and "algorithm tree, as asked" in line


def test_the_text_report_names_auto_and_the_tuner(tiny):
    out = run(["simulate", tiny, "-t", "dgx-a100:nodes=1"])
    line = next(x for x in out.splitlines() if x.strip().startswith("collectives"))
    assert "NCCL's tuning model" in line and "runs per group" in line


def test_a_chakra_replay_reports_nccls_choice():
    """One 8-GPU all-reduce of 1 MiB on a DGX H100: NCCL's tuner is what ran it, and both
    the JSON and the text say which algorithm and protocol."""
    out = json.loads(run(["replay", str(TRACE), "-t", "dgx-h100:nodes=1", "--json"]))
    chosen = out["collectives"]["chosen"]
    assert list(chosen) == ["collective"]
    assert sum(chosen["collective"].values()) == 1
    text = run(["replay", str(TRACE), "-t", "dgx-h100:nodes=1"])
    (algo,) = chosen["collective"]
    assert f"collective {algo} ×1" in text


def test_jobs_sharing_a_cluster_report_the_shared_runs_choices():
    root = Path(__file__).parent.parent
    out = json.loads(run(["cluster", str(root / "workloads" / "cluster-two-jobs.yaml"), "--json"]))
    chosen = out["collectives"]["chosen"]
    assert chosen and all(n > 0 for per in chosen.values() for n in per.values())
    text = run(["cluster", str(root / "workloads" / "cluster-two-jobs.yaml")])
    line = next(x for x in text.splitlines() if x.strip().startswith("collectives"))
    for group, per in chosen.items():
        for ap, n in per.items():
            assert f"{ap} ×{n:,}" in line and group in line
