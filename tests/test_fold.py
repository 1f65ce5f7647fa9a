"""Replica folding (issue 9): a folded task graph holds one representative per orbit of
identical ranks; the engine carries every transfer and collective on all lanes. Where the
lanes stay in step the result is the unfolded run's, float for float; where they do not,
the engine says by how much."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from dessim.engine import EngineOptions, Noise, simulate
from dessim.errors import TaskGraphError
from dessim.taskgraph import Fold, Task, TaskGraph, taskgraph_from_dict, taskgraph_to_dict
from dessim.topology.graph import Topology
from dessim.workload import simulate_workload
from tests.engine_helpers import star
from tests.fold_helpers import assert_folded_equals_unfolded

# ---------------------------------------------------------------------- the Fold object


def test_fold_checks_its_permutations():
    with pytest.raises(TaskGraphError, match="lane 0 must be the identity"):
        Fold(np.array([[1, 0], [0, 1]]))
    with pytest.raises(TaskGraphError, match="lane 1 is not a permutation"):
        Fold(np.array([[0, 1, 2], [1, 1, 2]]))
    with pytest.raises(TaskGraphError, match="2-D"):
        Fold(np.array([0, 1]))
    for row in ([0, 1, 3], [0, -1, 2], [2, 2, 2]):        # out of range, wrapped, repeated
        with pytest.raises(TaskGraphError, match="lane 2 is not a permutation"):
            Fold(np.array([[0, 1, 2], [2, 0, 1], row]))
    assert Fold(np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]])).lanes == 3


@pytest.mark.parametrize("kw", [
    dict(tp=2, pp=2, dp=4, cp=2, global_batch=8),
    dict(tp=2, pp=1, dp=8, ep=4, global_batch=8),
    dict(tp=2, pp=2, dp=4, cp=2, order=("tp", "dp", "cp", "pp"), global_batch=8),
    dict(tp=1, pp=2, dp=2, cp=4, ep=2, global_batch=4),
])
def test_digit_lanes_are_the_coordinate_shifts_they_are_defined_as(kw):
    """_digit_lane_permutations (whole-array arithmetic) maps every rank as its definition
    does, rank by rank through ParallelLayout.coords and rank_of."""
    from dessim.workload.transformer.generator import _digit_lanes, lane_permutations
    from dessim.workload.transformer.layout import ParallelLayout

    lo = ParallelLayout(**kw)
    step, q = _digit_lanes(lo)
    perm = lane_permutations(lo)
    shifts = lo.cp // step
    assert perm.shape == (lo.tp * shifts * lo.dp, lo.world_size)
    for a in range(lo.tp):
        for c in range(shifts):
            for b in range(lo.dp):
                row = perm[(a * shifts + c) * lo.dp + b].tolist()
                for r in range(lo.world_size):
                    x = lo.coords(r)
                    dp = (x.dp % q + b % q) % q + q * ((x.dp // q + b // q) % (lo.dp // q))
                    assert row[r] == lo.rank_of(tp=(x.tp + a) % lo.tp, cp=(x.cp + c * step) % lo.cp,
                                                dp=dp, pp=x.pp)


def test_instances_are_the_distinct_images_of_a_group():
    # 4 ranks, lanes: identity and the swap (0 2)(1 3)
    fold = Fold(np.array([[0, 1, 2, 3], [2, 3, 0, 1]]))
    inst, where = fold.instances((0, 1))
    assert inst == [(0, 1), (2, 3)]
    assert where == {0: [(0, 0), (1, 2)], 1: [(0, 1), (1, 3)]}
    # a group that maps onto itself is one instance; each member's images land in it
    inst, where = fold.instances((0, 2))
    assert inst == [(0, 2)]
    assert where == {0: [(0, 0), (0, 2)], 2: [(0, 2), (0, 0)]}


def test_two_representatives_of_one_orbit_are_rejected():
    fold = Fold(np.array([[0, 1, 2, 3], [2, 3, 0, 1]]))
    g = TaskGraph("bad", fold=fold)
    g.add(Task("a", 0, "compute", duration=1e-3))
    g.add(Task("b", 2, "compute", duration=1e-3))
    with pytest.raises(TaskGraphError, match="image of more than one"):
        g.validate(num_ranks=4)


def test_a_fold_must_cover_the_topology():
    g = TaskGraph("small", fold=Fold(np.array([[0, 1], [1, 0]])))
    g.add(Task("a", 0, "compute", duration=1e-3))
    with pytest.raises(TaskGraphError, match="the graph has 2 ranks but the topology has 4 GPUs"):
        simulate(g, star(4))


# ---------------------------------------------------------------------- hand-built graphs

SWAP = np.array([[0, 1, 2, 3], [2, 3, 0, 1]])


def _pair_program(graph: TaskGraph, ranks: tuple[int, ...]) -> None:
    """Each listed pair (r, r+1): compute, send r -> r+1, then an all-reduce over (r, r+1)."""
    for r in ranks:
        p = r + 1
        graph.add(Task(f"c{r}", r, "compute", duration=1e-3))
        graph.add(Task(f"s{r}", r, "send", stream="pp", peer=p, tag=7, size=8e6), [f"c{r}"])
        graph.add(Task(f"v{p}", p, "recv", stream="pp", peer=r, tag=7, size=8e6))
        graph.add(Task(f"k{p}", p, "compute", duration=2e-3), [f"v{p}"])
        for q in (r, p):
            graph.add(Task(f"ar{q}", q, "collective", stream="dp", op="allreduce", size=64e6,
                           group=(r, p), coll_id=f"ar{r}", algo="ring"),
                      [f"c{r}" if q == r else f"k{p}"])


def test_folded_graph_replays_like_the_unfolded_one_on_a_symmetric_network():
    topo = star(4)
    full = TaskGraph("full")
    _pair_program(full, (0, 2))
    folded = TaskGraph("folded", fold=Fold(SWAP))
    _pair_program(folded, (0,))
    a = simulate(full, topo, EngineOptions(record_links=False))
    b = simulate(folded, topo, EngineOptions(record_links=False))
    assert b.makespan_s == a.makespan_s
    assert b.link_bytes == a.link_bytes                 # all lanes' traffic was on the network
    assert b.meta["fold"]["max_lane_skew_s"] == 0.0
    assert b.meta["fold"]["lanes"] == 2 and b.meta["fold"]["ranks_simulated"] == 2
    assert [r.rank for r in b.ranks] == [0, 1]          # per-rank accounting of representatives
    full_ranks = {r.rank: r for r in a.ranks}
    for r in b.ranks:
        assert r == full_ranks[r.rank]


def two_speed_topology(latency: bool = False) -> Topology:
    """gpu0 - gpu1 at 2 GB/s, gpu2 - gpu3 at 1 GB/s: lanes that cannot stay in step (with
    ``latency``: gpu0 - gpu1 also 1 us slower)."""
    g = nx.Graph()
    for i in range(4):
        g.add_node(f"gpu{i}", kind="gpu", device="H100")
    g.add_edge("gpu0", "gpu1", type="custom", bw=2e9, lat=1e-6 if latency else 0.0)
    g.add_edge("gpu2", "gpu3", type="custom", bw=1e9, lat=0.0)
    g.add_node("sw", kind="switch")
    g.add_edge("gpu1", "sw", type="custom", bw=1e9, lat=0.0)
    g.add_edge("gpu3", "sw", type="custom", bw=1e9, lat=0.0)
    return Topology(g, "two-speed")


def test_lanes_out_of_step_are_reported_not_hidden():
    topo = two_speed_topology()
    g = TaskGraph("folded", fold=Fold(SWAP))
    g.add(Task("s", 0, "send", peer=1, tag=0, size=2e9))
    g.add(Task("r", 1, "recv", peer=0, tag=0, size=2e9))
    res = simulate(g, topo, EngineOptions(record_links=False))
    # lane 0 needs 1 s, lane 1 (gpu2 -> gpu3) 2 s; the folded tasks wait for the slower lane
    assert res.makespan_s == pytest.approx(2.0)
    fold = res.meta["fold"]
    assert fold["max_lane_skew_s"] == pytest.approx(1.0)
    assert fold["skewed_tasks"] == 1
    assert fold["max_lane_skew_rel"] == pytest.approx(0.5)


def test_replicas_with_different_speeds_cannot_be_folded():
    g = TaskGraph("folded", fold=Fold(SWAP))
    g.add(Task("c", 0, "compute", duration=1e-3))
    with pytest.raises(TaskGraphError, match="image of rank 0"):
        simulate(g, star(4), EngineOptions(noise=Noise(slowdown={2: 1.5})))


def test_a_folded_graph_survives_the_json_round_trip():
    g = TaskGraph("folded", fold=Fold(SWAP, ("dp",)))
    _pair_program(g, (0,))
    back = taskgraph_from_dict(taskgraph_to_dict(g))
    assert back.fold is not None and back.fold.dims == ("dp",)
    assert np.array_equal(back.fold.perm, SWAP)
    topo = star(4)
    opts = EngineOptions(record_links=False)
    assert simulate(back, topo, opts).makespan_s == simulate(g, topo, opts).makespan_s


# ---------------------------------------------------------------------- generated workloads

LAYOUT = {"tp": 8, "pp": 2, "dp": 2, "global_batch": 8, "micro_batch": 1, "schedule": "1f1b"}


def _pair(granularity: str, topology: str = "dgx-a100:nodes=4", **extra):
    out = []
    for fold in (False, True):
        r = simulate_workload("gpt3-1.3b", topology, overrides={
            **LAYOUT, **extra, "generator": {"granularity": granularity, "fold": fold}},
            options=EngineOptions(record_links=False))
        out.append(r)
    return out


@pytest.mark.parametrize("granularity", ["stage", "layer"])
def test_folded_training_iteration_equals_the_unfolded_one(granularity):
    full, folded = _pair(granularity)
    assert folded.taskgraph.fold is not None and folded.taskgraph.fold.lanes == 16
    assert len(folded.taskgraph) * 16 == len(full.taskgraph)
    assert folded.simulation.meta["fold"]["max_lane_skew_s"] == 0.0
    assert folded.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    a, b = full.summary(), folded.summary()
    for key in ("mfu", "bubble_fraction", "compute_s", "exposed_comm_total_s"):
        assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
    for cat, v in a["exposed_comm_s"].items():
        assert b["exposed_comm_s"][cat] == pytest.approx(v, rel=1e-9, abs=1e-12), cat
    # the same bytes crossed every link: the network carried all lanes
    bytes_a, bytes_b = full.simulation.link_bytes, folded.simulation.link_bytes
    assert bytes_a.keys() == bytes_b.keys()
    for link, v in bytes_a.items():
        assert bytes_b[link] == pytest.approx(v, rel=1e-12, abs=1e-3), link


def test_folding_falls_back_with_a_reason():
    r = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=4", overrides={
        **LAYOUT, "generator": {"granularity": "layer", "fold": True}},
        options=EngineOptions(record_links=False, noise=Noise(slowdown={3: 1.5})))
    assert r.taskgraph.fold is None
    assert "slowdown" in r.taskgraph.meta["fold_fallback"]


def test_tp_groups_with_different_closed_form_times_are_not_folded(monkeypatch):
    """Closed-form TP delays are invisible to the engine's lane check, so a fold whose TP
    groups would time differently must be refused up front."""
    from dessim.workload.transformer.tp_islands import TPIslands

    real = TPIslands.time

    def skewed(self, op, size, group):
        t = real(self, op, size, group)
        return None if t is None else t * (1.01 if group[0] % 16 >= 8 else 1.0)   # DP replica 1

    monkeypatch.setattr(TPIslands, "time", skewed)
    r = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=4", overrides={
        **LAYOUT, "generator": {"granularity": "stage", "fold": True}},
        options=EngineOptions(record_links=False))
    assert r.taskgraph.fold is None
    assert "different closed-form collective times" in r.taskgraph.meta["fold_fallback"]


def test_folded_graphs_cannot_be_merged_into_a_shared_cluster():
    from dessim.errors import WorkloadError
    from dessim.workload.multijob import merge_graphs

    g = TaskGraph("folded", fold=Fold(SWAP))
    g.add(Task("c", 0, "compute", duration=1e-3))
    with pytest.raises(WorkloadError, match="job 'a' has a folded task graph"):
        merge_graphs("two", [("a", g, [0, 1, 2, 3])])


def test_cli_reports_folding_and_its_refusal():
    from click.testing import CliRunner

    from dessim.cli.main import cli

    base = ["simulate", "gpt3-1.3b", "-t", "dgx-a100:nodes=4", "--tp", "8", "--pp", "2",
            "--global-batch", "8", "--granularity", "stage"]
    res = CliRunner().invoke(cli, base + ["--fold"])
    assert res.exit_code == 0, res.output
    assert "replica folding     2 ranks simulated × 16 lanes; largest lane skew 0s" in res.output
    res = CliRunner().invoke(cli, base + ["--fold", "--slowdown", "3=1.5"])
    assert res.exit_code == 0, res.output
    assert "replica folding     off: per-rank compute slowdown" in res.output
    res = CliRunner().invoke(cli, base + ["--fold", "--offload-optimizer", "host"])
    assert res.exit_code == 0, res.output
    assert "replica folding     2 ranks simulated × 16 lanes; largest lane skew 0s" in res.output


@pytest.mark.parametrize("overrides,granularity", [
    ({"tp": 8, "pp": 2, "dp": 2, "global_batch": 8, "micro_batch": 1, "schedule": "interleaved",
      "virtual_stages": 2, "model": {"layers": 8}}, "stage"),
    ({"tp": 8, "pp": 1, "dp": 4, "global_batch": 16, "zero_stage": 3, "model": {"layers": 4}}, "layer"),
    ({"tp": 8, "pp": 4, "dp": 1, "global_batch": 8, "micro_batch": 1, "model": {"layers": 8}}, "stage"),
    ({"tp": 1, "pp": 2, "dp": 16, "global_batch": 64, "model": {"layers": 4}}, "layer"),
    ({"tp": 4, "pp": 2, "dp": 4, "global_batch": 16, "model": {"layers": 4}}, "stage"),
], ids=["interleaved", "zero3", "tp-lanes-only", "dp-lanes-only", "tp4-shares-nodes"])
def test_folding_is_exact_across_layouts(overrides, granularity):
    """Interleaved schedules, ZeRO-3 gathers inside passes, only TP or only DP lanes, and TP
    groups that share a node with DP peers: the folded iteration equals the unfolded one."""
    runs = [simulate_workload("gpt3-1.3b", "dgx-a100:nodes=4", overrides={
        **overrides, "generator": {"granularity": granularity, "fold": fold}},
        options=EngineOptions(record_links=False)) for fold in (False, True)]
    full, folded = runs
    assert folded.taskgraph.fold is not None
    assert len(folded.taskgraph) < len(full.taskgraph)
    assert folded.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert folded.simulation.meta["fold"]["max_lane_skew_s"] == 0.0


def test_folded_run_with_recorded_link_utilisation_matches():
    """With utilisation recorded (timelines), bundles are off and every lane is its own flow:
    still the unfolded iteration, and the link series covers all lanes' traffic."""
    runs = [simulate_workload("gpt3-1.3b", "dgx-a100:nodes=4", overrides={
        **LAYOUT, "generator": {"granularity": "stage", "fold": fold}},
        options=EngineOptions(record_links=True)) for fold in (False, True)]
    full, folded = runs
    assert folded.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    busy = lambda r: {link for _, link, u in r.simulation.link_series if u > 0}
    assert busy(folded) == busy(full)


@pytest.mark.parametrize("workload, overrides", [
    pytest.param("mixtral-8x7b", {"tp": 2, "pp": 1, "ep": 4, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep4-tp2"),
    pytest.param("mixtral-8x7b", {"tp": 1, "pp": 2, "ep": 8, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep8-pp2"),
    pytest.param("llama3-8b", {"tp": 2, "pp": 2, "cp": 2, "global_batch": 8, "micro_batch": 1,
                               "model": {"layers": 4}}, id="cp2-pp2"),
    pytest.param("mixtral-8x7b", {"tp": 2, "pp": 1, "ep": 4, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2, "routing": {"distribution": "zipf"}}},
                 id="ep4-zipf-routing"),      # imbalanced routing: every rank at the hottest load
    pytest.param("llama3-8b", {"tp": 2, "pp": 1, "cp": 4, "global_batch": 4, "micro_batch": 1,
                               "model": {"layers": 2}}, id="cp4-ring"),
    # etp != tp: lanes shift the stage-local index by lcm(tp·cp, etp·ep)
    pytest.param("mixtral-8x7b", {"tp": 2, "pp": 1, "ep": 8, "etp": 1, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="etp1-ep8"),
    pytest.param("mixtral-8x7b", {"tp": 4, "pp": 2, "ep": 4, "etp": 1, "global_batch": 4, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="etp1-pp2"),
    pytest.param("mixtral-8x7b", {"tp": 2, "cp": 2, "pp": 1, "ep": 8, "etp": 1, "global_batch": 8,
                                  "micro_batch": 1, "model": {"layers": 2}}, id="etp1-cp2"),
    # etp = tp with EP over CP × DP (Megatron-core's expert grid): TP, CP and DP-rotation lanes
    pytest.param("mixtral-8x7b", {"tp": 2, "cp": 2, "pp": 1, "ep": 4, "global_batch": 8, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep4-cp2-dp4"),
    pytest.param("mixtral-8x7b", {"tp": 2, "cp": 2, "pp": 1, "ep": 2, "global_batch": 8, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep2-over-the-cp-pair"),
    pytest.param("mixtral-8x7b", {"tp": 1, "cp": 2, "pp": 1, "ep": 4, "global_batch": 8, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="tp1-cp2-ep4"),
    # ep > cp with EP groups across the two hosts: the lanes shift the DP digit inside them
    pytest.param("mixtral-8x7b", {"tp": 2, "cp": 2, "pp": 1, "ep": 8, "global_batch": 4, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep8-over-cp2-dp4-across-hosts"),
    pytest.param("mixtral-8x7b", {"tp": 2, "cp": 2, "pp": 1, "ep": 8, "global_batch": 4, "micro_batch": 1,
                                  "moe_dispatch": "deepep", "model": {"layers": 2}}, id="ep8-over-cp2-deepep-rail"),
    pytest.param("mixtral-8x7b", {"tp": 1, "cp": 4, "pp": 1, "ep": 2, "global_batch": 8, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep2-inside-cp4"),
])
@pytest.mark.parametrize("granularity", ["stage", "layer"])
def test_expert_and_context_parallel_replicas_fold_exactly(workload, overrides, granularity):
    """Balanced routing makes expert-parallel ranks replicas in time; lanes shift within and
    across EP groups so every all-to-all maps onto an all-to-all (issue 17)."""
    runs = [simulate_workload(workload, "dgx-h100:nodes=2", overrides=dict(
        overrides, generator={"granularity": granularity, "fold": fold}),
        options=EngineOptions(record_links=False)) for fold in (False, True)]
    assert_folded_equals_unfolded(*runs)


def test_expert_parallel_lanes_map_ep_groups_onto_ep_groups():
    from dessim.workload.transformer.generator import lane_permutations
    from dessim.workload.transformer.layout import ParallelLayout

    lo = ParallelLayout(tp=2, pp=1, dp=8, ep=4, global_batch=8)
    groups = {frozenset(g) for kind in ("ep", "edp", "tp") for g in lo.groups(kind)}
    for perm in lane_permutations(lo):
        assert sorted(perm.tolist()) == list(range(lo.world_size))
        assert all(frozenset(perm[list(g)].tolist()) in groups for g in groups)


def test_context_parallel_ranks_fold_onto_one_representative_per_stage():
    """CP ranks run the same program up to a cyclic shift of the ring (issue 17): lanes shift
    the CP index too, so a folded graph holds one rank per pipeline stage, and the ring's
    K/V sends inside one orbit still find their recvs (Fold.canonical_pair)."""
    res = simulate_workload("llama3-8b", "dgx-h100:nodes=2", overrides={
        "tp": 2, "pp": 2, "cp": 4, "global_batch": 4, "micro_batch": 1, "model": {"layers": 2},
        "generator": {"granularity": "layer", "fold": True}}, options=EngineOptions(record_links=False))
    fold = res.simulation.meta["fold"]
    assert fold["dims"] == ["tp", "cp", "dp"] and fold["lanes"] == 2 * 4 * 1
    assert fold["ranks_simulated"] == 2 and fold["max_lane_skew_s"] == 0.0
    assert {t.rank for t in res.taskgraph} == {0, res.taskgraph.fold.perm.shape[1] // 2}


def test_canonical_pair_is_the_same_for_every_image_of_a_pair():
    from dessim.taskgraph.fold import Fold
    n = 8
    perm = np.array([[(r + k) % n for r in range(n)] for k in range(n)])     # one orbit, a ring
    fold = Fold(perm)
    for k in range(n):
        assert fold.canonical_pair(int(perm[k, 0]), int(perm[k, 1])) == (0, 1)
        assert fold.canonical_pair(int(perm[k, 3]), int(perm[k, 2])) == (0, 7)


@pytest.mark.parametrize("granularity", ["stage", "layer"])
def test_context_parallel_ring_without_communication_folds_exactly(granularity):
    """With communication off (``--no-comm``) a CP ring's sends and recvs are free
    dependencies; folded, the recv of the representative from its previous rank is paired
    with the image it holds — its own send to the next rank — as the engine pairs transfers
    (:meth:`Fold.canonical_pair`), and the iteration equals the unfolded one."""
    overrides = {"tp": 2, "pp": 1, "cp": 4, "global_batch": 4, "micro_batch": 1, "model": {"layers": 2}}
    full, folded = (simulate_workload("llama3-8b", "dgx-h100:nodes=2", overrides=dict(
        overrides, generator={"granularity": granularity, "fold": fold, "comm": False}),
        options=EngineOptions(record_links=False)) for fold in (False, True))
    assert folded.taskgraph.fold is not None and full.taskgraph.fold is None
    assert folded.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    g = folded.taskgraph
    free = {t.id: t for t in g if t.kind == "delay" and t.stream.startswith("cp.")}
    recvs = [t for t in free.values() if t.stream == "cp.recv"]
    assert recvs and len(recvs) * 2 == len(free)
    for t in recvs:      # each waits for the send of the same KV block to the next rank
        sends = [free[d] for d in g.deps(t.id) if d in free]
        assert [(s.stream, s.name) for s in sends] == [("cp.send", t.name)]
