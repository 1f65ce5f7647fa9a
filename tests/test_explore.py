"""``dessim explore`` (issue 17): every layout is simulated exactly as a separate ``dessim
simulate`` run of it would be (same automatic shortcuts, same figures to the last bit), the
results and their order do not depend on the number of worker processes, layouts that do not
fit are reported with the reason without being simulated, and the report says which
shortcuts the layouts took.

A tiny transformer (4 layers, hidden 256) on one DGX A100 node keeps each run to seconds.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.sweep.points import flatten
from tests.test_sweep_workload import TINY, TOPOLOGY

#: Some of the tiny model's layouts on 8 GPUs fit (12 to 31 MB per GPU): 5 fit in 20 MB, 4 do not.
HBM = "20MB"
#: Host time and what only a sweep records: the only entries allowed to differ.
NOT_RESULTS = {"eval_wall_s", "wall_s", "index", "key", "status", "reason", "error_type",
               "layout", "offload"}


def invoke(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wl") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


@pytest.fixture(scope="module")
def explored(tiny) -> dict:
    return invoke(["explore", tiny, "-t", TOPOLOGY, "--hbm", HBM, "--workers", "1", "--json"])


def _results(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("eval_wall_s",)} for r in rows]


def test_results_and_order_do_not_depend_on_the_workers(tiny, explored):
    two = invoke(["explore", tiny, "-t", TOPOLOGY, "--hbm", HBM, "--workers", "2", "--json"])
    assert _results(two["ranked"]) == _results(explored["ranked"])
    assert _results(two["failed"]) == _results(explored["failed"])
    assert len(explored["ranked"]) >= 3 and explored["failed"]


def test_every_layout_equals_a_separate_simulate_run_exactly(tiny, explored):
    for row in explored["ranked"]:
        lay = {k: row[f"workload.parallelism.{k}"] for k in ("tp", "pp", "dp")}
        alone = invoke(["simulate", tiny, "-t", TOPOLOGY, "--hbm", HBM, "--json",
                        *(a for k, v in lay.items() for a in (f"--{k}", str(v)))])
        flat = flatten({k: v for k, v in alone.items() if k != "groups"})
        compared = [k for k in row if k in flat and k not in NOT_RESULTS]
        assert {"iteration_s", "tokens_per_s", "mfu", "events", "tasks",
                "memory_per_gpu_bytes.total", "exposed_comm_total_s"} <= set(compared)
        assert {k: row[k] for k in compared} == {k: flat[k] for k in compared}, row["layout"]
        # the same automatic fast path as simulate's default
        assert row["granularity"] == alone["granularity"]
        assert row["shortcuts.folded"] == alone["shortcuts"]["folded"]


def test_layouts_that_do_not_fit_are_skipped_with_the_reason(explored):
    for row in explored["failed"]:
        assert row["error_type"] == "MemoryFitError" and "does not fit" in row["reason"]
        assert row["events"] is None and row["iteration_s"] is None   # never simulated


def test_the_report_names_the_shortcuts_the_layouts_took(tiny):
    res = CliRunner().invoke(cli, ["explore", tiny, "-t", TOPOLOGY, "--hbm", HBM,
                                   "--workers", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if l.startswith("shortcuts"))
    assert "chosen automatically, as dessim simulate does" in line
    assert "replica folding" in line and "exact" in line


def test_costliest_layouts_are_evaluated_first_and_the_table_keeps_its_order(tiny, tmp_path):
    """Explore's points carry a work estimate (``layout_cost``); the runner evaluates them
    costliest first (the journal is written in evaluation order with one worker), while the
    table stays in point order with the same results as with two workers."""
    from dessim.cli.explore_cmd import explore_spec
    from dessim.sweep.runner import journal_path, run_sweep, sweep_points
    from dessim.sweep.spec import parse_sweep

    spec = parse_sweep(explore_spec(tiny, TOPOLOGY, memory={"hbm_capacity": HBM}), "test")
    points = sweep_points(spec)
    costs = {p.key: p.cost for p in points}
    assert all(c is not None and c > 0 for c in costs.values())
    # more micro-batches per pipeline (less dp) and tensor parallelism: more tasks to replay
    by_layout = {p.params["layout"]: p.cost for p in points}
    assert by_layout["tp2-pp1-dp4"] > by_layout["tp1-pp1-dp8"]
    assert by_layout["tp1-pp2-dp4"] > by_layout["tp1-pp1-dp8"]
    out = tmp_path / "r.csv"
    result = run_sweep(spec, out=out, workers=1)
    order = [json.loads(line)["key"] for line in journal_path(out).read_text().splitlines()]
    assert sorted(order) == sorted(costs)
    assert [costs[k] for k in order] == sorted(costs.values(), reverse=True)
    assert list(result.table["index"]) == sorted(result.table["index"])
    plain = run_sweep(spec, workers=2).table.drop(columns="eval_wall_s")
    assert plain.equals(result.table.drop(columns="eval_wall_s"))


def test_a_schedule_that_needs_stages_does_not_stop_the_enumeration():
    """deepseek-v3 (dualpipe: an even pp >= 2; ep=64) on 16 GPUs: the one-GPU resolution
    failed on the schedule and the file's own layout on ep, so explore reported one invalid
    layout '-' instead of enumerating them (every one too large for 16 H100s here)."""
    res = CliRunner().invoke(cli, ["explore", "deepseek-v3", "-t", "dgx-h100:nodes=2", "--workers", "1",
                                   "--no-progress", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    layouts = [p["layout"] for p in data["failed"]]
    assert len(layouts) > 10 and "-" not in layouts and "tp1-pp16-dp1" in layouts
    assert {p["error_type"] for p in data["failed"]} == {"MemoryFitError"}


#: A tiny MoE whose all-to-all goes through DeepEP and whose file does not set sequence
#: parallelism: TP with DeepEP needs SP (Megatron-core's MoE layer refuses TP without SP in training).
TINY_DEEPEP = """\
name: tiny-deepep
model: {layers: 2, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256, experts: 4, top_k: 2}
parallelism: {tp: 1, pp: 1, dp: 8, ep: 4}
training: {global_batch: 8, micro_batch: 1, moe_dispatch: deepep}
"""


def test_deepep_layouts_with_tp_run_with_sequence_parallelism_and_say_so(tmp_path):
    """Before, explore marked every tp > 1 layout of such a file invalid ('moe_dispatch
    deepep with tp=2 needs sequence parallelism'); now those layouts run with SP on, a column
    and one line of the report say so, and each equals a separate ``simulate --sp`` run."""
    path = tmp_path / "moe.yaml"
    path.write_text(TINY_DEEPEP)
    args = ["explore", str(path), "-t", "dgx-h100:nodes=1", "--workers", "1"]
    data = invoke([*args, "--json"])
    assert not data["failed"], data["failed"]
    rows = data["ranked"]
    assert {r["workload.parallelism.tp"] for r in rows} >= {1, 2, 4, 8}
    for row in rows:
        assert row["workload.parallelism.sp"] is (row["workload.parallelism.tp"] > 1) is row["layout.sp"]
    row = next(r for r in rows if r["layout"] == "tp2-pp1-dp4-ep4")
    alone = invoke(["simulate", str(path), "-t", "dgx-h100:nodes=1", "--json", "--tp", "2", "--dp", "4",
                    "--sp"])
    assert row["iteration_s"] == alone["iteration_s"] and row["events"] == alone["events"]
    text = CliRunner().invoke(cli, [*args, "--no-progress"])
    assert text.exit_code == 0, text.output
    n = sum(r["workload.parallelism.tp"] > 1 for r in rows)
    assert f"sequence parallelism: on in the {n} layouts with tp > 1, which the workload does not set" \
        in text.output
    assert "needs sequence parallelism" not in text.output


def test_a_workload_with_sp_on_gets_no_sp_column(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(TINY_DEEPEP.replace("ep: 4}", "ep: 4, sp: true}"))
    data = invoke(["explore", str(path), "-t", "dgx-h100:nodes=1", "--workers", "1", "--json"])
    assert data["ranked"] and not data["failed"]
    assert all("workload.parallelism.sp" not in r for r in data["ranked"])


def test_an_explicit_sp_false_is_kept_and_the_layouts_that_need_sp_are_refused_with_the_reason(tmp_path):
    """'sp: false' in the file was taken as 'not set': explore turned SP on for every tp > 1
    layout with DeepEP and said 'although the workload says sp: false'. An explicit false
    is now kept: the layouts with tp = 1 run as before, each with tp > 1 is listed as invalid
    with the reason, and no layout runs with SP."""
    path = tmp_path / "moe.yaml"
    path.write_text(TINY_DEEPEP.replace("ep: 4}", "ep: 4, sp: false}"))
    args = ["explore", str(path), "-t", "dgx-h100:nodes=1", "--workers", "1"]
    data = invoke([*args, "--json"])
    assert data["ranked"] and all(r["workload.parallelism.tp"] == 1 and not r["layout.sp"] for r in data["ranked"])
    assert all("workload.parallelism.sp" not in r for r in data["ranked"])
    refused = data["failed"]
    assert refused and {r["workload.parallelism.tp"] for r in refused} == {2, 4, 8}
    for r in refused:
        assert (f"moe_dispatch deepep with tp={r['workload.parallelism.tp']} needs sequence parallelism "
                "(sp: true)") in r["reason"]
    unset = tmp_path / "unset.yaml"
    unset.write_text(TINY_DEEPEP)
    assert len(data["ranked"]) + len(refused) == len(invoke(["explore", str(unset), "-t", "dgx-h100:nodes=1",
                                                               "--workers", "1", "--json"])["ranked"])
    text = CliRunner().invoke(cli, [*args, "--no-progress"])
    assert text.exit_code == 0, text.output
    assert "sequence parallelism: on" not in text.output
    assert "tp2-pp1-dp4-ep4: WorkloadError: " in text.output
