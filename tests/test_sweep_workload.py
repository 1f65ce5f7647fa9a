"""Workload sweeps: parallelism: auto, HBM capacity and memory expansion reach the workload
layer, identical results with 1 and 2 workers, and `dessim explore`.

A tiny transformer (4 layers, hidden 256) on one DGX A100 node (8 GPUs) keeps every
simulation well under a second.
"""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from dessim.errors import SpecError
from dessim.sweep.memory import POOL_NODE, memory_setup, with_expansion
from dessim.sweep.runner import run_sweep
from dessim.sweep.spec import parse_sweep
from dessim.topology import load_topology
from dessim.workload import estimate_memory, load_workload

TINY = """\
name: tiny
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256}
parallelism: {tp: 1, pp: 1}
training: {global_batch: 8, micro_batch: 1, zero_stage: 1, recompute: selective, bucket_size: 1MiB}
"""
TOPOLOGY = "dgx-a100:nodes=1"
GPUS = 8
#: Between the smallest and the largest memory estimate of the tiny model's layouts on 8 GPUs
#: (about 10 and 30 MB), so that some layouts fit and some do not.
HBM = 14e6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wl") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


def sweep(tiny: str, axes: dict, **base) -> dict:
    return {"name": "t", "kind": "workload",
            "base": {"workload": tiny, "topology": TOPOLOGY, **base}, "axes": axes}


def valid_layouts(model, gpus: int, global_batch: int) -> set[tuple[int, int, int]]:
    """(tp, pp, dp) by the divisibility rules of docs/workloads.md, brute force."""
    out = set()
    for tp in range(1, min(gpus, 8) + 1):
        for pp in range(1, gpus + 1):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if (model.heads % tp or model.kv_heads % tp or model.ffn_hidden % tp
                    or model.layers % pp or global_batch % dp):
                continue
            out.add((tp, pp, dp))
    return out


@pytest.fixture(scope="module")
def auto(tiny):
    spec = sweep(tiny, {"memory.hbm_capacity": ["14MB"], "memory.expansion_capacity": ["0GB", "1GB"],
                        "memory.expansion_bw": ["10GB/s", "100GB/s"], "parallelism": "auto"})
    return run_sweep(spec, workers=1)


def by_expansion(table: pd.DataFrame, capacity: float, bw: float) -> pd.DataFrame:
    return table[(table["memory.expansion_capacity"] == capacity) & (table["memory.expansion_bw"] == bw)]


# ---------------------------------------------------------------- parallelism: auto
def test_auto_enumerates_every_valid_layout_and_no_invalid_one(auto, tiny):
    spec = load_workload(tiny)
    plain = by_expansion(auto.table, 0, 10e9)
    got = set(zip(plain["workload.parallelism.tp"], plain["workload.parallelism.pp"],
                  plain["workload.parallelism.dp"]))
    assert got == valid_layouts(spec.model, GPUS, 8)
    assert len(got) == len(plain)   # one point per layout without expansion
    assert set(plain["offload"]) == {"none"}
    assert all(plain["layout"] == [f"tp{t}-pp{p}-dp{d}" for t, p, d in
                                   zip(plain["workload.parallelism.tp"], plain["workload.parallelism.pp"],
                                       plain["workload.parallelism.dp"])])


def test_auto_does_not_depend_on_the_layout_written_in_the_workload_file(tiny):
    # the file says tp=1, pp=1 (dp=8 on 8 GPUs), which a batch of 4 does not allow; other
    # layouts do
    t = run_sweep(sweep(tiny, {"workload.training.global_batch": [4], "parallelism": "auto"},
                       engine={"network": "analytical"})).table
    got = set(zip(t["workload.parallelism.tp"], t["workload.parallelism.pp"], t["workload.parallelism.dp"]))
    assert got == valid_layouts(load_workload(tiny).model, GPUS, 4)
    assert set(t["status"]) == {"ok"}


def test_layouts_that_do_not_fit_are_recorded_with_the_reason(auto, tiny):
    spec = load_workload(tiny)
    plain = by_expansion(auto.table, 0, 10e9)
    for _, row in plain.iterrows():
        layout = spec.layout(GPUS, tp=int(row["workload.parallelism.tp"]),
                             pp=int(row["workload.parallelism.pp"]))
        need = estimate_memory(spec.model, layout, spec.memory_options()).total
        if need <= HBM:
            assert row["status"] == "ok", row["reason"]
            assert row["memory_per_gpu_bytes.total"] == pytest.approx(need)
            assert row["memory_capacity_bytes"] == HBM   # the override reached the workload
        else:
            assert row["status"] == "failed" and row["error_type"] == "MemoryFitError"
            assert "does not fit" in row["reason"] and "exceeds the capacity of 0.014 GB" in row["reason"]
    assert {"ok", "failed"} == set(plain["status"])


def test_memory_expansion_lets_layouts_fit_by_offloading_to_the_pool(auto):
    plain = by_expansion(auto.table, 0, 10e9)
    expanded = by_expansion(auto.table, 1e9, 100e9)
    offloaded = expanded[expanded["offload"] != "none"]
    assert len(offloaded) and set(offloaded["layout"]) <= set(plain[plain["status"] == "failed"]["layout"])
    for _, row in offloaded[offloaded["status"] == "ok"].iterrows():
        assert row["memory_per_gpu_bytes.total"] <= HBM
        assert row["memory_per_gpu_bytes.offloaded:cxl"] > 0
        assert row["exposed_comm_s.offload"] >= 0
    # the fewest parts are offloaded: a layout that fits with one part is not tried with both
    for layout, rows in offloaded.groupby("layout"):
        policies = set(rows["offload"])
        assert not ("optimizer+activations" in policies and len(policies) > 1), layout
    # a layout that fits without offload runs without it, with the same result as without
    # expansion (the pool is unused)
    cols = ["layout", "status", "iteration_s"]
    same = expanded[expanded["offload"] == "none"][cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(same, plain[plain["status"] == "ok"][cols].reset_index(drop=True))
    assert len(expanded[expanded["status"] == "ok"]) > len(plain[plain["status"] == "ok"])


def test_a_faster_expansion_link_never_slows_an_offloading_layout(auto):
    slow = by_expansion(auto.table, 1e9, 10e9).set_index(["layout", "offload"])
    fast = by_expansion(auto.table, 1e9, 100e9).set_index(["layout", "offload"])
    ok = slow[(slow["status"] == "ok")].index.intersection(fast[fast["status"] == "ok"].index)
    moved = [i for i in ok if i[1] != "none"]
    assert moved
    for i in moved:
        assert fast.loc[i, "iteration_s"] <= slow.loc[i, "iteration_s"] + 1e-12
        assert fast.loc[i, "exposed_comm_s.offload"] <= slow.loc[i, "exposed_comm_s.offload"] + 1e-12


def test_expansion_capacity_is_checked(tiny):
    spec = sweep(tiny, {"memory.expansion_capacity": ["1MB"], "parallelism": "auto"},
                 memory={"hbm_capacity": "14MB"})
    t = run_sweep(spec).table
    too_small = t[t["offload"] != "none"]
    assert len(too_small) and set(too_small["status"]) == {"failed"}
    assert set(too_small["error_type"]) == {"MemoryFitError"}
    over = [r for r in too_small["reason"] if "expansion memory" in r]
    assert over and all("more than its capacity of 976.6KiB (memory.expansion_capacity)" in r for r in over)


def test_explicit_offload_without_expansion_is_a_recorded_failure(tiny):
    t = run_sweep(sweep(tiny, {"memory.offload_optimizer": ["cxl"]})).table
    assert t["status"].tolist() == ["failed"] and "cxl_mem node" in t["reason"][0]


def test_with_expansion_adds_one_pool_with_a_link_per_gpu():
    topo = load_topology(TOPOLOGY)
    setup = memory_setup({"expansion_capacity": "256GB", "expansion_bw": "64GB/s"})
    big = with_expansion(topo, setup)
    assert big.nodes_of_kind("cxl_mem") == [POOL_NODE]
    assert big.graph.nodes[POOL_NODE]["capacity"] == 256e9 * GPUS
    for gpu in topo.gpus:
        link = big.link(gpu, POOL_NODE)
        assert (link.bw, link.efficiency, link.type) == (64e9, 1.0, "cxl")
    assert with_expansion(topo, memory_setup({"expansion_capacity": 0})) is topo


# ---------------------------------------------------------------- workers, explore, errors
def test_workload_sweep_is_identical_with_one_and_two_workers(tiny):
    spec = sweep(tiny, {"memory.expansion_capacity": ["0GB", "1GB"], "parallelism": "auto"},
                 memory={"hbm_capacity": "14MB"}, engine={"network": "analytical"})
    one = run_sweep(spec, workers=1).table.drop(columns="eval_wall_s")
    two = run_sweep(spec, workers=2).table.drop(columns="eval_wall_s")
    pd.testing.assert_frame_equal(one, two)
    assert {"ok", "failed"} == set(one["status"])


def test_explore_ranks_the_layouts_and_lists_those_that_do_not_fit(tiny, tmp_path):
    from dessim.cli.explore_cmd import command as explore

    out = tmp_path / "e.csv"
    res = CliRunner().invoke(explore, [tiny, "--topology", TOPOLOGY, "--hbm", "14MB",
                                       "--no-progress", "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out)
    ok = table[table["status"] == "ok"].sort_values("iteration_s")
    text = res.output
    assert f"{len(ok)} layouts fit, {len(table) - len(ok)} do not" in text
    lines = text.splitlines()
    ranked = lines[lines.index(next(l for l in lines if "fastest first" in l)) + 2:][:len(ok)]
    assert [l.split()[0] for l in ranked] == list(ok["layout"])     # fastest first
    for layout in table[table["status"] == "failed"]["layout"]:
        assert f"  {layout}: MemoryFitError: " in text


@pytest.mark.parametrize("axes, message", [
    ({"workload.parallelism.tp": [2], "parallelism": "auto"},
     r"axes.workload.parallelism.tp: parallelism: auto chooses tp, pp, dp, cp, ep"),
    ({"memory.hbm": ["40GB"]}, r"unknown key 'hbm' in memory; valid keys: hbm_capacity, "
                               r"expansion_capacity, expansion_bw"),
    ({"memory.expansion_bw": ["100GB"]}, r"axes.memory.expansion_bw\[0\].*lacks '/s'"),
])
def test_bad_workload_axes_are_refused_before_anything_runs(tiny, axes, message):
    with pytest.raises(SpecError, match=message):
        run_sweep(parse_sweep(sweep(tiny, axes), "s.yaml"))


def test_base_memory_keys_are_checked(tiny):
    with pytest.raises(SpecError, match=r"base.memory: unknown key 'hbm'; valid keys: hbm_capacity"):
        parse_sweep(sweep(tiny, {"memory.hbm_capacity": ["40GB"]}, memory={"hbm": 1}), "s.yaml")


def test_a_point_whose_workload_cannot_be_resolved_is_recorded_not_raised(tiny):
    t = run_sweep(sweep(tiny, {"workload.model.heads": [7], "parallelism": "auto"})).table
    assert len(t) == 1 and t["status"][0] == "failed" and "heads" in t["reason"][0]


@pytest.mark.parametrize("workload, valid", [(None, "valid: sections model, parallelism, training"),
                                             ("dlrm-small", "valid: bucket_size, check_memory")])
def test_a_misspelt_top_level_override_is_one_error_before_any_point_runs(tiny, tmp_path, workload, valid):
    """'overrides: {trainng: ...}' was recorded as the same failure for every point after
    each had started; now the sweep stops at once with one error naming the key, the
    closest valid one and the valid keys of the workload's kind, and writes no results."""
    import yaml

    from dessim.cli.main import cli

    spec = tmp_path / "s.yaml"
    doc = sweep(workload or tiny, {"engine.network": ["analytical", "flow"]},
                overrides={"trainng": {"global_batch": 16}})
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "r.csv"
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--no-progress", "-o", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.count("error: ") == 1 and "invalid configuration, nothing was run" in res.output
    assert res.output.count("unknown") == 1
    assert "override 'trainng' (did you mean 'training'?); " + valid in res.output
    assert not out.exists()
