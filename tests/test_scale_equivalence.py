"""Every speed shortcut is exact: the same scenarios with and without it give the same times.

Shortcuts (docs/performance.md): key-independent route memo (always on, same paths), compact
step schedules (``compact_schedules``), flow bundles (``bundles``). Where the shortcut is exact by
construction the comparison is exact (==); where another flow splits a bundle, the members
continue as ordinary flows and the comparison is still exact in practice — we allow 1e-12
relative for float noise of a differently ordered solve, far inside the 0.1% rule.
"""

from __future__ import annotations

import random

import networkx as nx
import pytest
import simpy

from dessim.collectives import build_schedule, run_collective, run_schedule
from dessim.collectives.schedule import CompactSchedule
from dessim.engine import EngineOptions, Shortcuts, simulate
from dessim.network import FlowNetwork, make_network
from dessim.taskgraph import Task, TaskGraph
from dessim.topology import load_topology
from dessim.topology.builders import switch
from dessim.topology.graph import Topology
from dessim.topology.routing import Router
from engine_helpers import star

COLUMNS = ("src", "dst", "nbytes", "reduce_bytes", "channel", "dep_start", "dep_index")
MODES = [dict(compact_schedules=True, bundles=True), dict(compact_schedules=True, bundles=False),
         dict(compact_schedules=False, bundles=False)]


def replay(topo, op, group, size, *, compact_schedules, bundles, chunks=1, channels=1, reduction_bw=None,
           cross=(), algo="ring"):
    """Run one collective (plus ``cross`` = (src, dst, bytes, start) transfers) from time 0."""
    sched = build_schedule(op, algo, group, size, chunks=chunks, channels=channels,
                           compact_schedules=compact_schedules)
    env = simpy.Environment()
    net = make_network("flow", env, topo, bundles=bundles)
    run = run_schedule(net, sched, reduction_bw=reduction_bw, bundles=bundles)
    finishes = []
    for src, dst, nbytes, start in cross:
        def go(src=src, dst=dst, nbytes=nbytes, start=start):
            yield env.timeout(start)
            finishes.append((yield net.transfer(src, dst, nbytes)))
        env.process(go())
    env.run()
    return run, finishes


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("p,channels,chunks", [(2, 1, 1), (3, 2, 1), (5, 1, 3), (8, 2, 2)])
def test_compact_ring_schedule_has_the_builders_rows(op, p, channels, chunks):
    group = list(range(p))[::-1]
    compact = build_schedule(op, "ring", group, 1e6, chunks=chunks, channels=channels)
    rows = build_schedule(op, "ring", group, 1e6, chunks=chunks, channels=channels, compact_schedules=False)
    assert isinstance(compact, CompactSchedule) and len(compact) == len(rows)
    for col in COLUMNS:
        assert list(getattr(compact, col)) == list(getattr(rows, col)), col
    compact.validate()


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("p,channels,chunks", [(2, 1, 1), (4, 2, 1), (6, 1, 2), (16, 2, 3)])
def test_ring_on_a_switch_is_identical_with_and_without_shortcuts(op, p, channels, chunks):
    topo = switch(p, "50GB/s", "500ns")
    runs = [replay(topo, op, range(p), 2**24, chunks=chunks, channels=channels, **m)[0]
            for m in MODES]
    assert runs[0].bundles_started > 0 and runs[1].bundles_started == 0
    for other in runs[1:]:
        assert other.duration == runs[0].duration
        assert list(other.transfer_start) == list(runs[0].transfer_start)
        assert list(other.transfer_finish) == list(runs[0].transfer_finish)
        assert other.rank_finish == runs[0].rank_finish


def test_reduction_cost_is_identical_with_and_without_shortcuts():
    topo = switch(6, "50GB/s", "1us")
    runs = [replay(topo, "allreduce", range(6), 6e6, reduction_bw=20e9, **m)[0] for m in MODES]
    assert runs[0].bundles_started > 0
    for other in runs[1:]:
        assert list(other.transfer_finish) == list(runs[0].transfer_finish)


@pytest.mark.parametrize("seed", range(6))
def test_cross_traffic_splits_bundles_without_changing_any_time(seed):
    # Random point-to-point flows hit the ring's channels mid-step: bundles split into their
    # members, which continue as ordinary flows; every time matches the unbundled run.
    rng = random.Random(seed)
    p = 8
    topo = switch(p + 2, "50GB/s", "500ns")
    lone = 2**24 / p / 50e9
    cross = [(rng.randrange(p + 2), rng.randrange(p + 2), rng.choice([1e5, 1e6, 5e6]),
              rng.uniform(0, 2 * (p - 1) * lone)) for _ in range(5)]
    cross = [c for c in cross if c[0] != c[1]]
    runs = [replay(topo, "allreduce", range(p), 2**24, cross=cross, **m) for m in MODES]
    (base, base_cross), others = runs[0], runs[1:]
    for run, fin in others:
        assert run.duration == pytest.approx(base.duration, rel=1e-12)
        assert list(run.transfer_finish) == pytest.approx(list(base.transfer_finish), rel=1e-12)
        assert sorted(fin) == pytest.approx(sorted(base_cross), rel=1e-12)


def test_two_rings_sharing_a_switch_port_split_and_agree():
    # Rings over {0..3} and {2..5} both use gpu2 and gpu3's links: their bundles collide.
    topo = switch(6, "50GB/s", "500ns")
    out = []
    for m in MODES:
        env = simpy.Environment()
        net = make_network("flow", env, topo, bundles=m["bundles"])
        runs = [run_schedule(net, build_schedule("allreduce", "ring", g, 8e6, compact_schedules=m["compact_schedules"]),
                             bundles=m["bundles"], key_base=k << 20)
                for k, g in enumerate(([0, 1, 2, 3], [2, 3, 4, 5]))]
        env.run()
        out.append([list(r.transfer_finish) for r in runs])
    for other in out[1:]:
        for a, b in zip(other, out[0]):
            assert a == pytest.approx(b, rel=1e-12)


def ecmp_fabric() -> Topology:
    """4 GPUs on 2 leaves joined by 2 spines: cross-leaf pairs have two equal paths."""
    g = nx.Graph()
    for s in ("s0", "s1", "l0", "l1"):
        g.add_node(s, kind="switch")
    for i in range(4):
        g.add_node(f"g{i}", kind="gpu")
        g.add_edge(f"g{i}", f"l{i // 2}", type="x", bw=1e9, lat=1e-6)
    for leaf in ("l0", "l1"):
        for spine in ("s0", "s1"):
            g.add_edge(leaf, spine, type="x", bw=1e9, lat=1e-6)
    return Topology(g, "ecmp")


def test_key_dependent_routes_bundle_only_in_exact_groups_and_match():
    """On an ECMP fabric a step's routes depend on each transfer's key: the step is split
    into exact bundle groups routed with those keys; times equal the per-flow runs."""
    topo = ecmp_fabric()
    assert not Router(topo).key_independent("g0", "g2")
    assert Router(topo).key_independent("g0", "g1")
    for p, op, algo in ((4, "allreduce", "ring"), (4, "alltoall", "direct")):
        runs = [replay(topo, op, range(p), 4e6, algo=algo, **m)[0] for m in MODES]
        for other in runs[1:]:
            assert list(other.transfer_finish) == pytest.approx(list(runs[0].transfer_finish), rel=1e-12)
            assert other.rank_finish == pytest.approx(runs[0].rank_finish, rel=1e-12)


def _leaf_spine_ecmp() -> Topology:
    """8 GPUs on 4 leaves, 4 spines: a ring step crosses the spines with ECMP choices."""
    g = nx.Graph()
    for sw in [f"s{i}" for i in range(4)] + [f"l{i}" for i in range(4)]:
        g.add_node(sw, kind="switch")
    for i in range(8):
        g.add_node(f"g{i}", kind="gpu")
        g.add_edge(f"g{i}", f"l{i // 2}", type="x", bw=1e9, lat=1e-6)
    for leaf in range(4):
        for spine in range(4):
            g.add_edge(f"l{leaf}", f"s{spine}", type="x", bw=1e9, lat=1e-6)
    return Topology(g, "leaf-spine-ecmp")


def _with_and_without_bundles(network: str, topo, op: str, group: list[int], size: float,
                              key_base: int):
    """The runs of one ring schedule with bundles on, then off."""
    out = []
    for bundles in (True, False):
        sched = build_schedule(op, "ring", group, size, topology=topo)
        env = simpy.Environment()
        net = make_network(network, env, topo, bundles=bundles)
        run = run_schedule(net, sched, bundles=bundles, key_base=key_base)
        env.run()
        out.append(run)
    return out


@pytest.mark.parametrize("network", ["flow", "analytical"])
def test_ecmp_ring_steps_run_as_bundle_groups_with_the_same_times(network):
    grouped, single = _with_and_without_bundles(network, _leaf_spine_ecmp(), "allreduce",
                                                list(range(8)), 8e6, 5 << 20)
    assert grouped.bundles_started > 0 and single.bundles_started == 0
    assert list(grouped.transfer_finish) == pytest.approx(list(single.transfer_finish), rel=1e-12)


@pytest.mark.parametrize("network", ["flow", "analytical"])
def test_a_ring_out_of_lockstep_starts_its_ready_members_as_bundle_groups(network):
    # One GPU per node over two scalable units: the two crossing connections have more
    # latency, so no step completes at one instant; members ready together (the same
    # distance from the crossings) start as exact bundle groups, with the same times.
    grouped, single = _with_and_without_bundles(network, load_topology("dgx-h100:nodes=64"),
                                                "reducescatter", [8 * n + 3 for n in range(64)],
                                                8e8, 7 << 20)
    assert grouped.bundles_started > 63 and single.bundles_started == 0
    assert grouped.finish_time == pytest.approx(single.finish_time, rel=1e-12)
    assert list(grouped.transfer_finish) == pytest.approx(list(single.transfer_finish), rel=1e-12)


def test_bundle_template_refuses_what_it_cannot_carry_exactly():
    topo = switch(4, "50GB/s", "500ns")
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    assert net.bundle_template([0, 1], [1, 2]) is not None
    # gpu0 -> switch carries two members: each gets half of it, the same share for both
    both = net.bundle_template([0, 0], [1, 2])
    assert both is not None and both.rate == 25e9
    # 0->1 and 0->2 would get half a link, 1->3 a whole one: not one rate, no bundle
    assert net.bundle_template([0, 0, 1], [1, 2, 3]) is None
    assert net.bundle_template([0], [0]) is None               # local copy
    assert FlowNetwork(env, topo, bundles=False).bundle_template([0], [1]) is None
    assert FlowNetwork(env, topo, record_links=True).bundle_template([0], [1]) is None


def test_run_collective_reports_the_same_figures_either_way():
    a = run_collective("allreduce", "64MiB", "switch:n=32,bw=50GB/s,lat=1us")
    b = run_collective("allreduce", "64MiB", "switch:n=32,bw=50GB/s,lat=1us", bundles=False,
                       compact_schedules=False)
    assert (a.time_s, a.busbw_GBps, a.link_util_max) == (b.time_s, b.busbw_GBps, b.link_util_max)
    assert a.link_util == b.link_util


def staggered_graph(p: int) -> TaskGraph:
    """Ranks compute for different times (a staggered all-reduce: no bundles), then compute
    alike and run two all-reduces on disjoint halves together (bundled)."""
    g = TaskGraph("staggered")
    for r in range(p):
        g.add(Task(f"c{r}", r, "compute", duration=1e-4 * (1 + r % 3)))
        g.add(Task(f"ar{r}", r, "collective", op="allreduce", size=4e6, group=tuple(range(p)),
                   coll_id="ar", algo="ring"), [f"c{r}"])
        g.add(Task(f"d{r}", r, "compute", duration=2e-4), [f"ar{r}"])
        half = tuple(range(p // 2)) if r < p // 2 else tuple(range(p // 2, p))
        g.add(Task(f"h{r}", r, "collective", op="allreduce", size=2e6, group=half,
                   coll_id=f"h{r >= p // 2}", algo="ring"), [f"d{r}"])
    return g


@pytest.mark.parametrize("record", [False, True])
def test_engine_results_identical_with_and_without_shortcuts(record):
    graph, topo = staggered_graph(8), star(8)
    res = [simulate(graph, topo, EngineOptions(record_links=record,
                                               shortcuts=Shortcuts(bundles=b, compact_schedules=c)))
           for b, c in ((True, True), (False, True), (False, False))]
    for other in res[1:]:
        assert other.makespan_s == res[0].makespan_s
        assert other.span_records == res[0].span_records
        assert other.link_bytes == pytest.approx(res[0].link_bytes, rel=1e-12)
    if not record:  # bundles ran (fewer network events), yet nothing changed
        assert res[0].events < res[1].events


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather", "alltoall"])
@pytest.mark.parametrize("p,channels", [(2, 1), (3, 2), (5, 1), (8, 3)])
def test_compact_direct_schedule_has_the_builders_rows(op, p, channels):
    group = list(range(p))[::-1]
    compact = build_schedule(op, "direct", group, 1e6, channels=channels)
    rows = build_schedule(op, "direct", group, 1e6, channels=channels, compact_schedules=False)
    assert isinstance(compact, CompactSchedule) and len(compact) == len(rows)
    for col in COLUMNS:
        assert list(getattr(compact, col)) == list(getattr(rows, col)), col
    compact.validate()


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "alltoall"])
@pytest.mark.parametrize("p,channels", [(2, 1), (4, 2), (8, 1)])
def test_direct_on_a_switch_is_one_uniform_bundle_per_step_and_identical(op, p, channels):
    """All p(p-1) sends of a direct step share the injection links uniformly: one bundle,
    with the times of the per-flow max-min solve."""
    topo = switch(p, "50GB/s", "500ns")
    runs = [replay(topo, op, range(p), 2**24, channels=channels, algo="direct", **m)[0]
            for m in MODES]
    assert runs[0].bundles_started > 0 and runs[1].bundles_started == 0
    for other in runs[1:]:
        assert other.duration == pytest.approx(runs[0].duration, rel=1e-12)
        assert list(other.transfer_finish) == pytest.approx(list(runs[0].transfer_finish), rel=1e-12)
        assert other.rank_finish == pytest.approx(runs[0].rank_finish, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_cross_traffic_splits_uniform_bundles_without_changing_any_time(seed):
    rng = random.Random(seed)
    p = 6
    topo = switch(p + 2, "50GB/s", "500ns")
    cross = [(rng.randrange(p + 2), rng.randrange(p + 2), rng.choice([1e5, 1e6, 5e6]),
              rng.uniform(0, 2e-4)) for _ in range(5)]
    cross = [c for c in cross if c[0] != c[1]]
    runs = [replay(topo, "allreduce", range(p), 2**24, cross=cross, algo="direct", **m) for m in MODES]
    (base, base_cross), others = runs[0], runs[1:]
    for run, fin in others:
        assert list(run.transfer_finish) == pytest.approx(list(base.transfer_finish), rel=1e-12)
        assert sorted(fin) == pytest.approx(sorted(base_cross), rel=1e-12)


def test_bundle_groups_split_transfers_into_exact_bundles():
    """Members that share channels (transitively) form one group; members alone with equal
    latency and bottleneck are merged; every transfer is in exactly one group, and running
    the groups gives the times of the individual flows."""
    topo = switch(8, "50GB/s", "500ns")
    srcs, dsts = [0, 0, 3, 5, 6], [1, 2, 4, 7, 7]
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    groups = net.bundle_groups(srcs, dsts)
    members = sorted(m for _, ms in groups for m in ms)
    assert members == [0, 1, 2, 3, 4]
    by_members = {ms: t for t, ms in groups}
    assert by_members[(0, 1)].rate == 25e9          # share gpu0's uplink
    assert by_members[(2,)] is not None and len(by_members[(2,)]) == 1
    assert by_members[(3, 4)].rate == 25e9          # share gpu7's downlink
    assert FlowNetwork(env, topo, bundles=False).bundle_groups(srcs, dsts) is None

    def finishes(bundled: bool) -> list[float]:
        env = simpy.Environment()
        net = FlowNetwork(env, topo, bundles=bundled)
        done = [None] * len(srcs)
        groups = net.bundle_groups(srcs, dsts) or ((None, tuple(range(len(srcs)))),)
        for template, ms in groups:
            if template is None:
                for k in ms:
                    net.transfer(srcs[k], dsts[k], 1e7).callbacks.append(
                        lambda _e, k=k: done.__setitem__(k, env.now))
            else:
                net.start_bundle(template, 1e7, lambda idx, ms=ms: [done.__setitem__(ms[i], env.now) for i in idx])
        env.run()
        return done

    assert finishes(True) == pytest.approx(finishes(False), rel=1e-12)


def test_a_connection_keeps_one_path_for_all_its_steps():
    """Every transfer of a ring's connection between two leaves (one channel) crosses the same
    spine, as an NCCL queue pair's packets do; the whole collective is one communicator."""
    topo = ecmp_fabric()
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    run_schedule(net, build_schedule("allreduce", "ring", [0, 1, 2, 3], 8e6), key_base=7 << 20)
    env.run()
    up = net.link_bytes()
    # ring 0->1->2->3->0: g1 -> g2 and g3 -> g0 cross between the leaves, 2(p-1) = 6 steps each
    for leaf in ("l0", "l1"):
        used = [up[(leaf, spine)] for spine in ("s0", "s1")]
        assert sorted(used)[0] == 0.0 and sorted(used)[1] == pytest.approx(6 * 8e6 / 4)
