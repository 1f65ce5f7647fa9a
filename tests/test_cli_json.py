"""``--json`` on compare, explore and sweep: one JSON object, SI units, nulls for missing
values, the same figures as the text report and the table file."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from dessim.cli.main import cli

TINY = """\
name: tiny
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256}
parallelism: {tp: 1, pp: 1}
training: {global_batch: 16, micro_batch: 1}
"""


def invoke(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_compare_json_matches_the_csv(tmp_path):
    csv = tmp_path / "c.csv"
    out = invoke(["compare", "allreduce", "--algos", "ring,tree", "--sizes", "1MiB,64MiB",
                  "-t", "switch:8", "--csv", str(csv), "--json"])
    table = pd.read_csv(csv)
    assert len(out["rows"]) == len(table) == 4
    assert [r["time_s"] for r in out["rows"]] == list(table["time_s"])
    assert out["files"] == [str(csv)]
    for size, algo in out["winners"].items():
        rows = [r for r in out["rows"] if r["size_bytes"] == float(size)]
        assert min(rows, key=lambda r: r["time_s"])["algorithm"] == algo


def test_explore_json_ranks_fastest_first_and_lists_failures(tmp_path):
    wl = tmp_path / "tiny.yaml"
    wl.write_text(TINY)
    out = invoke(["explore", str(wl), "-t", "dgx-a100:nodes=1", "--hbm", "14MB",
                  "--no-progress", "--workers", "1", "--json"])
    times = [r["iteration_s"] for r in out["ranked"]]
    assert times and times == sorted(times)
    assert out["failed"], "with 14 MB of HBM some layouts do not fit"
    assert all(r["error_type"] == "MemoryFitError" and r["reason"] for r in out["failed"])
    # a failed point has no metrics: real nulls, not NaN (invalid JSON) or -1
    assert all(r["iteration_s"] is None for r in out["failed"])
    assert len(out["ranked"]) + len(out["failed"]) == out["points"]


def test_sweep_json_best_and_every_point(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nkind: collective\nbase:\n  topology: switch:8\n"
                    "  collective: {op: allreduce}\naxes:\n  collective.size: [1MiB, 64MiB]\n"
                    "  engine.collectives.algo: [ring, tree]\n")
    table = tmp_path / "s.csv"
    out = invoke(["sweep", str(spec), "--no-progress", "-o", str(table), "--json",
                  "-g", "collective.size"])
    assert out["points"] == 4 and len(out["results"]) == 4 and out["pending"] == 0
    assert out["files"] and out["journal"].endswith(".journal.jsonl")
    csv = pd.read_csv(table)
    assert sorted(r["time_s"] for r in out["results"]) == sorted(csv["time_s"])
    assert len(out["best"]) == 2        # one per size
    for best in out["best"]:
        same = [r["time_s"] for r in out["results"]
                if r["collective.size"] == best["collective.size"]]
        assert best["time_s"] == min(same)
