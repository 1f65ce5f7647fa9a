"""Replica folding of offload memcpys (issue 17): a folded memcpy copies on every lane, each
image between its own GPU and its own nearest memory node (host DRAM of its socket, a CXL
expander on its PCIe switch); the result is the unfolded run's and the full replay's, and a
lane that cannot keep up is reported as lane skew, never hidden."""

from __future__ import annotations

from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dessim.engine import EngineOptions, simulate
from dessim.engine.links import LinkProof
from dessim.engine.options import Shortcuts
from dessim.errors import TaskGraphError
from dessim.taskgraph import Fold, Task, TaskGraph, taskgraph_from_dict, taskgraph_to_dict
from dessim.topology.graph import Topology
from dessim.workload import simulate_workload
from tests.fold_helpers import assert_folded_equals_unfolded

#: lane 1 maps ranks 0, 1 (socket 0) onto 2, 3 (socket 1)
SWAP = np.array([[0, 1, 2, 3], [2, 3, 0, 1]])
RTOL = 1e-9


def two_sockets(mem1_bw: float = 10e9, ecmp: bool = False) -> Topology:
    """gpu0, gpu1 on switch sw0 with host memory mem0; gpu2, gpu3 on sw1 with mem1; sw0 - sw1
    joined. ``mem1_bw``: mem1's link (bytes/s; mem0's is 10 GB/s). ``ecmp``: gpu0 also
    reaches sw0 through a second switch, so its route to mem0 has two equal-cost paths."""
    g = nx.Graph()
    for s in (0, 1):
        g.add_node(f"sw{s}", kind="switch")
        g.add_node(f"mem{s}", kind="host_mem")
        g.add_edge(f"mem{s}", f"sw{s}", type="pcie", bw=10e9 if s == 0 else mem1_bw, lat=1e-6)
    for i in range(4):
        g.add_node(f"gpu{i}", kind="gpu", device="H100", transit=False)
        g.add_edge(f"gpu{i}", f"sw{i // 2}", type="pcie", bw=20e9, lat=1e-6)
    g.add_edge("sw0", "sw1", type="custom", bw=5e9, lat=1e-6)
    if ecmp:
        g.remove_edge("gpu0", "sw0")
        for a in ("swa", "swb"):
            g.add_node(a, kind="switch")
            g.add_edge("gpu0", a, type="pcie", bw=20e9, lat=0.5e-6)
            g.add_edge(a, "sw0", type="pcie", bw=20e9, lat=0.5e-6)
    return Topology(g, "two-sockets")


def _offload_program(graph: TaskGraph, ranks: tuple[int, ...], mem: str) -> None:
    """Per rank: load 1 GB from ``mem``, compute 10 ms, store 1 GB back; the pair of ranks
    then all-reduces (so the copies of two ranks of one socket share its memory link)."""
    for r in ranks:
        graph.add(Task(f"in{r}", r, "memcpy", stream="mem.in", size=1e9, mem_node=mem, direction="to_hbm"))
        graph.add(Task(f"c{r}", r, "compute", duration=1e-2), [f"in{r}"])
        graph.add(Task(f"out{r}", r, "memcpy", stream="mem.out", size=1e9, mem_node=mem,
                       direction="from_hbm"), [f"c{r}"])
        graph.add(Task(f"ar{r}", r, "collective", stream="dp", op="allreduce", size=1e8,
                       group=tuple(ranks), coll_id=f"ar{ranks[0]}", algo="ring"), [f"out{r}"])


def _graphs(topo_mem1_bw: float = 10e9) -> tuple[TaskGraph, TaskGraph]:
    full = TaskGraph("full")
    _offload_program(full, (0, 1), "mem0")
    _offload_program(full, (2, 3), "mem1")
    folded = TaskGraph("folded", fold=Fold(SWAP))
    _offload_program(folded, (0, 1), "mem0")
    return full, folded


# ---------------------------------------------------------------------- hand-built graphs

def test_folded_memcpy_copies_each_image_to_its_own_memory_node():
    topo = two_sockets()
    full, folded = _graphs()
    opts = EngineOptions(record_links=False)
    a, b = simulate(full, topo, opts), simulate(folded, topo, opts)
    assert b.makespan_s == pytest.approx(a.makespan_s, rel=1e-12)
    assert b.meta["fold"]["max_lane_skew_s"] == 0.0
    # lane 1's copies crossed socket 1's memory link, not socket 0's nor the socket link
    assert b.link_bytes[("mem1", "sw1")] == pytest.approx(2e9)     # ranks 2, 3 load 1 GB each
    assert b.link_bytes[("sw1", "mem1")] == pytest.approx(2e9)     # and store it back
    assert b.link_bytes.keys() == a.link_bytes.keys()
    for link, v in a.link_bytes.items():
        assert b.link_bytes[link] == pytest.approx(v, rel=1e-12), link
    full_ranks = {r.rank: r for r in a.ranks}
    assert [r.rank for r in b.ranks] == [0, 1]
    for r in b.ranks:
        assert r == full_ranks[r.rank]


def test_a_folded_memcpy_lane_that_cannot_keep_up_is_reported():
    """Socket 1's memory link at half the speed: lane 1's copies take longer, the folded
    tasks wait for it and the engine reports the skew (rerun unfolded for the exact run)."""
    topo = two_sockets(mem1_bw=5e9)
    _, folded = _graphs()
    res = simulate(folded, topo, EngineOptions(record_links=False))
    fold = res.meta["fold"]
    assert fold["max_lane_skew_s"] > 0.1 and fold["skewed_tasks"] >= 2


def test_a_folded_memcpy_must_name_its_ranks_nearest_memory_node():
    g = TaskGraph("folded", fold=Fold(SWAP))
    g.add(Task("m", 0, "memcpy", size=1e6, mem_node="mem1", direction="to_hbm"))
    with pytest.raises(TaskGraphError, match="task 'm': .* rank 0's nearest one \\('mem0'\\), not 'mem1'"):
        simulate(g, two_sockets(), EngineOptions(record_links=False))
    g.validate(num_ranks=4)                  # the graph itself is well formed


def test_a_folded_memcpy_on_an_ecmp_route_is_refused():
    """Rank 1's lane image is rank 0, whose GPU reaches mem0 over two equal-cost paths."""
    g = TaskGraph("folded", fold=Fold(np.array([[0, 1, 2, 3], [1, 0, 3, 2]])))
    g.add(Task("m", 1, "memcpy", size=1e6, mem_node="mem0", direction="to_hbm"))
    g.add(Task("n", 2, "compute", duration=1e-3))
    with pytest.raises(TaskGraphError, match="rank 0's GPU and 'mem0' has several equal-cost paths"):
        simulate(g, two_sockets(ecmp=True), EngineOptions(record_links=False))


def test_a_folded_memcpy_graph_survives_the_json_round_trip():
    topo = two_sockets()
    _, folded = _graphs()
    back = taskgraph_from_dict(taskgraph_to_dict(folded))
    opts = EngineOptions(record_links=False)
    a, b = simulate(folded, topo, opts), simulate(back, topo, opts)
    assert b.makespan_s == a.makespan_s and b.link_bytes == a.link_bytes


def test_the_link_memo_footprint_of_a_folded_memcpy_covers_every_lane():
    """The per-link memo's footprint of a folded memcpy is every lane's route: image 2's GPU
    with ITS memory node mem1 — not the representative's mem0 seen from gpu2."""
    topo = two_sockets()
    _, folded = _graphs()
    from dessim.engine.memlanes import memcpy_lanes
    from dessim.topology.routing import Router

    router = Router(topo)
    tasks = list(folded)
    run = SimpleNamespace(tasks=tasks, topology=topo, fold=folded.fold,
                          memcpy_lanes=lambda r, m: memcpy_lanes(router, topo, folded.fold, r, m))
    proof = LinkProof.__new__(LinkProof)
    proof.run = run
    i = next(k for k, t in enumerate(tasks) if t.kind == "memcpy" and t.rank == 0)
    pairs = set(proof._pairs(i))
    assert pairs == {("gpu0", "mem0"), ("mem0", "gpu0"), ("gpu2", "mem1"), ("mem1", "gpu2")}


# ---------------------------------------------------------------------- generated workloads

def _runs(workload: str, topology: str, overrides: dict) -> tuple:
    """The unfolded, folded (default shortcuts) and exact (every shortcut off, layer
    granularity, unfolded) runs of one layout."""
    def run(generator: dict, shortcuts: Shortcuts):
        return simulate_workload(workload, topology, overrides={**overrides, "generator": generator},
                                 options=EngineOptions(record_links=False, shortcuts=shortcuts))
    return (run({"fold": False}, Shortcuts()), run({"fold": True}, Shortcuts()),
            run({"fold": False, "granularity": "layer"}, Shortcuts.none()))


def _assert_exact(full, folded, exact) -> None:
    assert_folded_equals_unfolded(full, folded)
    for r in folded.simulation.ranks:         # per-rank figures of the representatives
        f = next(x for x in full.simulation.ranks if x.rank == r.rank)
        for name in ("compute_s", "comm_s", "exposed_comm_s", "wait_s", "idle_s", "end_s"):
            assert getattr(r, name) == pytest.approx(getattr(f, name), rel=RTOL, abs=1e-12), name
        for cat, v in f.exposed_by_category.items():
            assert r.exposed_by_category[cat] == pytest.approx(v, rel=RTOL, abs=1e-12), cat
    assert folded.iteration_s == pytest.approx(exact.iteration_s, rel=RTOL)
    a, b = exact.summary(), folded.summary()
    assert b["exposed_comm_total_s"] == pytest.approx(a["exposed_comm_total_s"], rel=RTOL, abs=1e-12)
    for cat, v in a["exposed_comm_s"].items():
        assert b["exposed_comm_s"][cat] == pytest.approx(v, rel=RTOL, abs=1e-12), cat


SMALL = {"micro_batch": 1, "model": {"layers": 4}}


@pytest.mark.parametrize("topology,overrides", [
    ("dgx-h100:nodes=2", {"tp": 2, "pp": 2, "dp": 4, "global_batch": 16, "offload_optimizer": "host"}),
    ("dgx-h100:nodes=2", {"tp": 4, "pp": 1, "dp": 4, "global_batch": 8, "offload_activations": "host"}),
    ("cxl", {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "offload_optimizer": "cxl",
             "offload_activations": "cxl"}),
], ids=["host-optimizer", "host-activations", "cxl-both"])
def test_offloading_layouts_fold_exactly(topology, overrides):
    full, folded, exact = _runs("gpt3-1.3b", topology, {**SMALL, **overrides})
    assert "fold_fallback" not in folded.taskgraph.meta
    assert any(t.kind == "memcpy" for t in folded.taskgraph)
    _assert_exact(full, folded, exact)


@settings(max_examples=6, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]),
       where=st.sampled_from([("dgx-h100:nodes=2", "host"), ("cxl", "cxl"), ("cxl:expanders=2,attach=cpu", "cxl")]),
       what=st.sampled_from(["offload_optimizer", "offload_activations"]))
def test_small_offloading_layouts_fold_exactly(tp, pp, where, what):
    topology, target = where
    gpus = 16 if topology.startswith("dgx") else 8
    dp = gpus // (tp * pp)
    full, folded, exact = _runs("gpt3-1.3b", topology, {
        **SMALL, "tp": tp, "pp": pp, "dp": dp, "global_batch": 2 * dp, what: target})
    _assert_exact(full, folded, exact)


@pytest.mark.parametrize("topology", ["cxl:expanders=3", "cxl:expanders=1"])
def test_uneven_expanders_stay_unfolded_with_the_reason(topology):
    """Three expanders for four PCIe switches give the GPUs of the fourth a longer route (one
    expander: its switch's GPUs a shorter one): lanes could not stay in step, so the
    generator does not fold, says why, and the run is the full replay's."""
    overrides = {**SMALL, "tp": 2, "pp": 1, "dp": 4, "global_batch": 8, "offload_optimizer": "cxl"}
    full, folded, exact = _runs("gpt3-1.3b", topology, overrides)
    assert folded.taskgraph.fold is None
    assert folded.taskgraph.meta["fold_fallback"].startswith("offload routes differ: rank ")
    assert folded.iteration_s == full.iteration_s == pytest.approx(exact.iteration_s, rel=RTOL)


def test_offload_over_ecmp_routes_stays_unfolded_with_the_reason():
    """ECMP between a GPU and its memory: the unfolded engine picks the path per task, which a
    folded task's images cannot reproduce, so the generator does not fold, and says why."""
    r = simulate_workload("gpt3-1.3b", two_sockets(ecmp=True), overrides={
        **SMALL, "tp": 2, "pp": 1, "dp": 2, "global_batch": 4, "offload_optimizer": "host",
        "generator": {"fold": True}}, options=EngineOptions(record_links=False))
    assert r.taskgraph.fold is None
    assert "equal-cost paths (ECMP)" in r.taskgraph.meta["fold_fallback"]


def test_a_saved_folded_offload_graph_replays_to_the_same_iteration(tmp_path):
    """``simulate --save-graph`` writes the folded graph with its memcpys (one memory node
    per task, as before); ``dessim run`` replays it to the same iteration."""
    import json

    from click.testing import CliRunner

    from dessim.cli.main import cli

    graph = tmp_path / "g.json"
    res = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=2", "--tp", "2",
                                   "--global-batch", "32", "--offload-optimizer", "host",
                                   "--save-graph", str(graph), "--json"])
    assert res.exit_code == 0, res.output
    iteration = json.loads(res.output)["iteration_s"]
    saved = json.loads(graph.read_text())
    assert saved["fold"]["perm"] and any(t["kind"] == "memcpy" for t in saved["tasks"])
    res = CliRunner().invoke(cli, ["run", str(graph), "-t", "dgx-h100:nodes=2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["fold_lanes"] == 16 and out["makespan_s"] == iteration
