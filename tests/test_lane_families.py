"""Lane families (issue 17): in a folded run, ONE flow stands for its images in the other
lanes, on the union of their routes, and every rate solve certifies that each image has a
max-min bottleneck at the family's rate. Where the lanes are symmetric the run equals the
one that starts every image; where they are not, the certificate fails and the engine
replays without families, saying why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.collectives import build_schedule
from dessim.collectives.schedule import is_relabelling, orbit_plan
from dessim.engine import EngineOptions, Shortcuts, simulate
from dessim.network import make_network
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.taskgraph import Fold, Task, TaskGraph
from dessim.topology import Topology, load_topology
from dessim.workload import simulate_workload
from test_fold import two_speed_topology

#: dgx-h100:nodes=2: node 0's GPUs 0..7, node 1's 8..15; the node swap is an automorphism
SWAP_NODES = np.array([(r + 8) % 16 for r in range(16)])
RTOL = 1e-9


def _finish(topo: Topology, fam: LaneFamily, flows: list[tuple[int, int, float, float]],
            family: bool) -> list[float]:
    """Finish times of each transfer (src, dst, bytes, start time s) and of its images under
    ``fam``: as one family flow, or as separate flows."""
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    out: list[list[float]] = [[] for _ in flows]

    def start(k: int, src: int, dst: int, size: float) -> None:
        if family:
            net.transfer(src, dst, size, family=fam).callbacks.append(
                lambda e: out[k].extend([e.value] * (1 + len(fam))))
            return
        for a, b, _ in [(src, dst, 0)] + fam.images(src, dst, 0):
            net.transfer(a, b, size).callbacks.append(lambda e: out[k].append(e.value))

    for k, (src, dst, size, at) in enumerate(flows):
        env.timeout(at).callbacks.append(lambda _e, k=k, s=src, d=dst, n=size: start(k, s, d, n))
    env.run()
    return [t for times in out for t in sorted(times)]


_flows = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15),
                            st.sampled_from([1e5, 4e6, 3e7]), st.sampled_from([0.0, 1e-5, 3e-4])),
                  min_size=1, max_size=8).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)

#: symmetric networks and lanes that are automorphisms of them: the node swap of two DGX
#: nodes (images on channels of their own), and the GPU shift inside each leaf of a
#: one-spine leaf-spine (images of cross-leaf flows share the leaf's uplink)
SYMMETRIC = {"dgx-h100:nodes=2": LaneFamily((SWAP_NODES,), (0,)),
             "leafspine:16,4,spines=1": LaneFamily(
                 tuple(np.array([4 * (r // 4) + (r % 4 + k) % 4 for r in range(16)])
                       for k in (1, 2, 3)), (0, 0, 0))}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(SYMMETRIC)), _flows)
def test_a_family_flow_finishes_with_its_images_on_a_symmetric_network(spec, flows):
    topo, fam = load_topology(spec), SYMMETRIC[spec]
    assert _finish(topo, fam, flows, True) == pytest.approx(_finish(topo, fam, flows, False), rel=RTOL)


def test_the_certificate_catches_an_image_that_runs_faster():
    """Cross traffic on the representative's path only: the family is held at half rate
    while its image has its channels to itself, so the solve is not the unfolded one."""
    env = simpy.Environment()
    net = make_network("flow", env, load_topology("dgx-h100:nodes=2"))
    net.transfer(0, 8, 1e8, family=LaneFamily((SWAP_NODES,), (0,)))
    net.transfer(0, 8, 1e8)                         # not symmetric: no image on 8 -> 0
    with pytest.raises(QuotientBroken, match="no bottleneck"):
        env.run()


def test_family_routes_refuse_images_of_other_latency_and_other_models():
    net = make_network("flow", simpy.Environment(), two_speed_topology(latency=True))
    swap = np.array([2, 3, 0, 1])
    with pytest.raises(QuotientBroken, match="latency"):
        net.transfer(0, 1, 1e6, family=LaneFamily((swap,), (0,)))
    analytical = make_network("analytical", simpy.Environment(), load_topology("dgx-h100:nodes=1"))
    with pytest.raises(QuotientBroken, match="does not certify"):
        analytical.transfer(0, 1, 1e6, family=LaneFamily((np.roll(np.arange(8), 1),), (0,)))


def test_images_on_one_channel_load_it_once_each():
    """Three images on the representative's own path (the identity lane, thrice): the
    channels carry four times the family's rate, as four separate flows would load them."""
    topo = load_topology("dgx-h100:nodes=1")
    ident = np.arange(8)
    times = []
    for family in (True, False):
        env = simpy.Environment()
        net = make_network("flow", env, topo)
        if family:
            ev = net.transfer(0, 1, 1e9, family=LaneFamily((ident,) * 3, (0, 0, 0)))
            assert ev.callbacks is not None
            ev.callbacks.append(lambda e: times.append(e.value))
        else:
            for _ in range(4):
                net.transfer(0, 1, 1e9).callbacks.append(lambda e: times.append(e.value))
        env.run()
    assert times[1:] == [times[1]] * 4
    assert times[0] == pytest.approx(times[1], rel=RTOL)


def test_is_relabelling_is_the_lane_map_of_a_schedule():
    shift = np.array([(r + 4) % 8 for r in range(8)])
    a = build_schedule("allreduce", "ring", (0, 1, 2, 3), 1e6, channels=2)
    b = build_schedule("allreduce", "ring", (4, 5, 6, 7), 1e6, channels=2)
    assert is_relabelling(a, b, shift)
    assert not is_relabelling(a, b, np.arange(8))                                  # wrong map
    assert not is_relabelling(a, build_schedule("allreduce", "ring", (4, 5, 6, 7), 2e6), shift)
    assert not is_relabelling(a, build_schedule("allreduce", "ring", (4, 6, 5, 7), 1e6, channels=2),
                              shift)                                               # other ring
    tree_a = build_schedule("allreduce", "dbtree", (0, 1, 2, 3), 1e6)
    tree_b = build_schedule("allreduce", "dbtree", (4, 5, 6, 7), 1e6)
    assert is_relabelling(tree_a, tree_b, shift) == (type(tree_a) is type(tree_b))


@pytest.mark.parametrize("workload, overrides", [
    pytest.param("mixtral-8x7b", {"tp": 2, "pp": 1, "ep": 4, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep4-tp2"),
    pytest.param("llama3-8b", {"tp": 2, "pp": 2, "cp": 2, "global_batch": 8, "micro_batch": 1,
                               "model": {"layers": 4}}, id="cp2-pp2"),
    pytest.param("gpt3-1.3b", {"tp": 2, "pp": 2, "global_batch": 16, "micro_batch": 2,
                               "generator": {"granularity": "layer"}}, id="pp2-layer"),
])
def test_lane_families_change_no_result(workload, overrides):
    runs = [simulate_workload(workload, "dgx-h100:nodes=2", overrides=overrides,
                              options=EngineOptions(record_links=False,
                                                    shortcuts=Shortcuts(lane_families=on)))
            for on in (False, True)]
    off, on = runs
    fold = on.simulation.meta["fold"]
    assert fold["lane_family_runs"] > 0 and fold["lane_families_refused"] is None
    assert 0 < fold["lane_orbit_runs"] <= fold["lane_family_runs"]
    assert off.simulation.meta["fold"]["lane_family_runs"] == 0
    assert on.shortcuts()["lane_family_runs"] == fold["lane_family_runs"]
    assert on.iteration_s == pytest.approx(off.iteration_s, rel=RTOL)
    assert on.simulation.link_bytes.keys() == off.simulation.link_bytes.keys()
    for link, nbytes in off.simulation.link_bytes.items():
        assert on.simulation.link_bytes[link] == pytest.approx(nbytes, rel=RTOL, abs=1e-3)
    for a, b in zip(on.simulation.ranks, off.simulation.ranks):
        assert a.rank == b.rank
        assert a.compute_s == pytest.approx(b.compute_s, rel=RTOL)
        assert a.exposed_comm_s == pytest.approx(b.exposed_comm_s, rel=RTOL, abs=1e-12)


def test_asymmetric_lanes_are_replayed_without_families_and_say_why():
    g = TaskGraph("folded", fold=Fold(np.array([[0, 1, 2, 3], [2, 3, 0, 1]])))
    g.add(Task("s", 0, "send", peer=1, tag=0, size=2e9))
    g.add(Task("r", 1, "recv", peer=0, tag=0, size=2e9))
    # without bundles (which would carry the two lanes as two exact one-member bundles and
    # leave no family to refuse)
    res = simulate(g, two_speed_topology(), EngineOptions(record_links=False,
                                                          shortcuts=Shortcuts(bundles=False)))
    fold = res.meta["fold"]
    assert "no bottleneck" in fold["lane_families_refused"]
    assert fold["lane_family_runs"] == 0
    # the replay without families: the slower lane sets the time, and the skew is reported
    assert res.makespan_s == pytest.approx(2.0)
    assert fold["max_lane_skew_s"] == pytest.approx(1.0)


def _leaf_lanes() -> Fold:
    """leafspine:16,4,spines=1 (4 GPUs per leaf, one spine): lanes shift the GPU inside its
    leaf, so the images of a cross-leaf send all climb the same leaf -> spine link."""
    return Fold(np.array([[4 * (r // 4) + (r % 4 + k) % 4 for r in range(16)] for k in range(4)]))


def test_images_that_share_uplinks_run_as_one_family():
    """The images of the send (and of the all-reduce) all climb one leaf -> spine link: each
    family flow crosses it four times, and the run equals the one with every lane."""
    topo = load_topology("leafspine:16,4,spines=1")
    results = []
    for on in (True, False):
        g = TaskGraph("folded", fold=_leaf_lanes())
        g.add(Task("s", 0, "send", peer=8, tag=0, size=1e8))
        g.add(Task("r", 8, "recv", peer=0, tag=0, size=1e8))
        g.add(Task("ar0", 0, "collective", op="allreduce", size=4e7, group=(0, 4), coll_id="ar",
                   algo="ring"), ["s"])
        g.add(Task("ar4", 4, "collective", op="allreduce", size=4e7, group=(0, 4), coll_id="ar",
                   algo="ring"), [])
        # bundles off: they would carry the send's four lanes as one exact bundle instead
        results.append(simulate(g, topo, EngineOptions(
            record_links=False, shortcuts=Shortcuts(lane_families=on, bundles=False))))
    on, off = results
    assert on.meta["fold"]["lane_families_refused"] is None
    assert on.meta["fold"]["lane_family_runs"] == 2
    assert on.makespan_s == pytest.approx(off.makespan_s, rel=RTOL)
    assert on.link_bytes.keys() == off.link_bytes.keys()
    for link, nbytes in off.link_bytes.items():
        assert on.link_bytes[link] == pytest.approx(nbytes, rel=RTOL)


_SHIFT8 = [np.array([(r + k) % 8 for r in range(8)]) for k in range(8)]


@pytest.mark.parametrize("op, algo, channels", [("allreduce", "ring", 2), ("allgather", "ring", 1),
                                                ("reducescatter", "ring", 3), ("alltoall", "direct", 1),
                                                ("allreduce", "direct", 1)])
def test_an_invariant_schedule_keeps_one_transfer_per_orbit(op, algo, channels):
    """Under the 8 rotations of ranks 0..7, a schedule keeps the transfers leaving rank 0;
    each full step is the rotations of its kept transfers (bytes, channel, dependencies
    rotated too), and a kept transfer depends on the rotations back to rank 0 of what its
    full row depended on."""
    full = build_schedule(op, algo, tuple(range(8)), 1e6, channels=channels)
    reduced = orbit_plan(full, _SHIFT8)
    assert reduced is not None and reduced.params["orbit"] == 8
    assert len(reduced) * 8 == len(full) and len(reduced.plan) == len(full.plan)
    assert set(reduced.src) == {0}
    pair = lambda d, sch: (sch.src[d], sch.dst[d])
    to_zero = lambda a, b: (0, (b - a) % 8)           # the rotation of a -> b leaving rank 0
    rows = {}
    for s, (a, b) in enumerate(zip(full.plan.offset, full.plan.offset[1:])):
        rows.update({(s, full.src[i], full.dst[i]): i for i in range(a, b)})
    for s, (a, b) in enumerate(zip(reduced.plan.offset, reduced.plan.offset[1:])):
        for i in range(a, b):
            j0 = rows[(s, reduced.src[i], reduced.dst[i])]
            deps0 = {pair(d, full) for d in full.deps(j0)}
            assert {pair(d, reduced) for d in reduced.deps(i)} == {to_zero(*x) for x in deps0}
            for k in range(8):
                j = rows[(s, k, (reduced.dst[i] + k) % 8)]
                assert (full.nbytes[j], full.channel[j]) == (reduced.nbytes[i], reduced.channel[i])
                assert {((x - k) % 8, (y - k) % 8) for x, y in (pair(d, full) for d in full.deps(j))} \
                    == deps0


def test_a_schedule_that_is_not_invariant_is_not_reduced():
    lanes4 = [np.array([(r + 2 * k) % 8 for r in range(8)]) for k in range(4)]
    assert orbit_plan(build_schedule("allreduce", "ring", (0, 2, 4, 6), 1e6), lanes4) is not None
    assert orbit_plan(build_schedule("allreduce", "ring", (0, 4, 2, 6), 1e6), lanes4) is None
    assert orbit_plan(build_schedule("allreduce", "ring", (0, 2, 4, 6), 1e6), lanes4[:3]) is None
    assert orbit_plan(build_schedule("allreduce", "dbtree", (0, 2, 4, 6), 1e6), lanes4) is None


def test_a_ring_over_hosts_keeps_the_first_hosts_transfers():
    """Rotating whole hosts (two ranks each) maps a ring over 0..7 onto itself without
    fixing a rank: the kept transfers are those leaving ranks 0 and 1 (the first host), and
    every rank is counted with the rank of the first host it is a rotation of."""
    full = build_schedule("allreduce", "ring", tuple(range(8)), 1e6)
    by_host = [np.array([(r + 2 * k) % 8 for r in range(8)]) for k in range(4)]
    reduced = orbit_plan(full, by_host)
    assert reduced is not None and reduced.params["orbit"] == 4
    assert len(reduced) * 4 == len(full) and set(reduced.src) == {0, 1}
    assert reduced.account == {r: r % 2 for r in range(8)}
    assert orbit_plan(full, by_host[:3]) is None            # not a group of maps acting freely


def test_transfers_hashed_onto_equal_cost_paths_get_no_family():
    """Two spines: a cross-leaf transfer's lanes would hash onto different spines and
    collide on some only, so it is refused before it starts, not after a failed solve."""
    net = make_network("flow", simpy.Environment(), load_topology("leafspine:16,4,spines=2"))
    within_leaf = LaneFamily((np.array([4 * (r // 4) + (r % 4 + 1) % 4 for r in range(16)]),), (0,))
    with pytest.raises(QuotientBroken, match="ECMP"):
        net.transfer(0, 8, 1e6, family=within_leaf)
    net.transfer(0, 1, 1e6, family=within_leaf)          # inside a leaf: one path, a family


def test_simulate_says_when_lane_families_were_refused(capsys):
    from dessim.cli.simulate_cmd import print_summary

    run = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=2", overrides={"tp": 2, "global_batch": 32})
    s = run.summary()
    print_summary(s)
    shown = capsys.readouterr().out
    assert "lane families on" in shown and "lane families refused" not in shown
    s["fold"] = {**s["fold"], "lane_families_refused": "at t = 1 s the lane image 0 -> 8 ..."}
    print_summary(s)
    assert "lane families refused (every lane replayed): at t = 1 s" in capsys.readouterr().out
    s["shortcuts"] = {**s["shortcuts"], "lane_orbit_runs": 3}
    s["fold"] = {**s["fold"], "lane_families_refused": None,
                 "lane_rank_rotations_refused": "at t = 2 s the lane image 1 -> 2 ..."}
    print_summary(s)
    shown = capsys.readouterr().out
    assert "and collectives (3 of them one transfer per orbit)" in shown
    assert ("lane orbits rotating GPUs inside hosts refused (replayed with orbits of whole hosts "
            "for the collectives that had not ended): at t = 2 s") in shown


_mixed = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.sampled_from([1e5, 4e6, 3e7]),
                            st.sampled_from([0.0, 1e-5, 3e-4]), st.booleans()),
                  min_size=1, max_size=10).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)


def _certified_run(flows, everything: bool):
    """Family flows (node swap) and plain ones (cross traffic that may break the symmetry):
    the finish times, or the time and message of the first failed certificate."""
    env = simpy.Environment()
    net = make_network("flow", env, load_topology("dgx-h100:nodes=2"))
    net.certify_all = everything
    fam = LaneFamily((SWAP_NODES,), (0,))
    done: list[float] = []
    for src, dst, size, at, family in flows:
        env.timeout(at).callbacks.append(
            lambda _e, s=src, d=dst, n=size, f=family: net.transfer(
                s, d, n, family=fam if f else None).callbacks.append(lambda e: done.append(e.value)))
    try:
        env.run()
    except QuotientBroken as exc:
        return ("broken", env.now, str(exc))
    return ("ok", sorted(done))


@settings(max_examples=60, deadline=None)
@given(_mixed)
def test_the_incremental_certificate_decides_like_checking_everything(flows):
    """Checking only what a solve changed (and each recurring state once) passes and fails
    exactly where checking every family flow at every solve does."""
    assert _certified_run(flows, False) == _certified_run(flows, True)


def test_a_collective_family_on_asymmetric_lanes_is_replayed_exactly():
    """An all-reduce over (0, 1) whose image (2, 3) runs on slower links: the family's
    certificate fails, the run is replayed without families and equals the run without
    them."""
    runs = []
    for on in (True, False):
        g = TaskGraph("folded", fold=Fold(np.array([[0, 1, 2, 3], [2, 3, 0, 1]])))
        for r in (0, 1):
            g.add(Task(f"ar{r}", r, "collective", op="allreduce", size=4e8, group=(0, 1),
                       coll_id="ar", algo="ring"))
        runs.append(simulate(g, two_speed_topology(), EngineOptions(
            record_links=False, shortcuts=Shortcuts(lane_families=on, bundles=False))))
    on, off = runs
    assert "no bottleneck" in on.meta["fold"]["lane_families_refused"]
    assert off.meta["fold"]["lane_families_refused"] is None
    assert on.makespan_s == off.makespan_s and on.link_bytes == off.link_bytes
    assert on.meta["fold"]["max_lane_skew_s"] > 0          # the lanes really differ


def _host_rail_rotations(hosts: int, per_host: int = 8) -> list[np.ndarray]:
    """Every (host rotation, rank-in-host rotation) of ranks 0..hosts*per_host-1, identity first."""
    n = hosts * per_host
    return [np.array([((r // per_host + a) % hosts) * per_host + (r % per_host + b) % per_host
                      for r in range(n)]) for a in range(hosts) for b in range(per_host)]


def test_a_pipelined_rail_alltoall_keeps_one_transfer_per_orbit():
    """A rail all-to-all in pipeline chunks is per-transfer rows (each chunk waits on its
    phase and on the previous chunk of the connection). Rotating hosts and the ranks inside
    hosts maps it onto itself: the reduced schedule keeps the transfers leaving rank 0, the
    k-th transfer of a connection standing for the k-th of each rotated connection, and each
    kept transfer waits for the rotations back to rank 0 of what it waited for."""
    topo = load_topology("dgx-h100:nodes=4")
    full = build_schedule("alltoall", "rail", tuple(range(32)), 3.2e7, topology=topo,
                          pipeline_chunks=3, network_share=0.5)
    maps = _host_rail_rotations(4)
    reduced = orbit_plan(full, maps)
    assert reduced is not None and type(reduced) is type(full)
    assert reduced.params["orbit"] == 32 and len(reduced) * 32 == len(full)
    assert set(reduced.src) == {0} and reduced.account == {r: 0 for r in range(32)}

    def rotation_to_zero(a: int) -> np.ndarray:
        return next(np.argsort(m) for m in maps if m[0] == a)

    def named(sch):                          # (src, dst, channel, k-th on its connection)
        seen, out = {}, []
        for i in range(len(sch)):
            conn = (sch.src[i], sch.dst[i], sch.channel[i])
            out.append((*conn, seen.get(conn, 0)))
            seen[conn] = seen.get(conn, 0) + 1
        return out

    full_names, red_names = named(full), named(reduced)
    index = {name: i for i, name in enumerate(full_names)}
    for i, (a, b, c, k) in enumerate(red_names):
        j = index[(a, b, c, k)]
        assert (full.nbytes[j], full.reduce_bytes[j]) == (reduced.nbytes[i], reduced.reduce_bytes[i])
        want = set()
        for d in full.deps(j):
            s, t, ch, kk = full_names[d]
            m = rotation_to_zero(s)
            want.add((0, int(m[t]), ch, kk))
        assert {red_names[d] for d in reduced.deps(i)} == want
        assert all(d < i for d in reduced.deps(i))
    # a rotation that is not a symmetry of the rail structure (ranks shifted across hosts)
    assert orbit_plan(full, [np.array([(r + k) % 32 for r in range(32)]) for k in range(32)]) is None


def _folded_rail_alltoall() -> tuple[TaskGraph, Topology]:
    perm = np.array([[((r // 32 + k // 32) % 2) * 32 + (r % 32 + k % 32) % 32 for r in range(64)]
                     for k in range(64)])
    g = TaskGraph("folded", fold=Fold(perm))
    g.add(Task("a2a", 0, "collective", op="alltoall", size=6.4e7, group=tuple(range(32)),
               coll_id="a2a", algo="rail",
               attrs={"algo_options": {"pipeline_chunks": 2, "network_share": 0.5}}))
    return g, load_topology("dgx-h100:nodes=8")


def test_a_folded_rail_alltoall_runs_one_transfer_per_orbit_and_equals_every_lane():
    """dgx-h100:nodes=8, two EP groups of four hosts; lanes rotate ranks inside a group and
    swap the groups. The one member task of the folded all-to-all runs its pipelined rail
    schedule as one transfer per orbit of the host x rail rotations (certified), and the run
    equals the one without families."""
    results = []
    for on in (True, False):
        g, topo = _folded_rail_alltoall()
        results.append(simulate(g, topo, EngineOptions(record_links=False,
                                                       shortcuts=Shortcuts(lane_families=on))))
    on, off = results
    fold = on.meta["fold"]
    assert fold["lane_orbit_runs"] == 1 and fold["lane_family_runs"] == 1
    assert fold["lane_families_refused"] is None and fold["lane_orbits_refused"] is None
    assert on.makespan_s == pytest.approx(off.makespan_s, rel=RTOL)
    assert on.link_bytes.keys() == off.link_bytes.keys()
    for link, nbytes in off.link_bytes.items():
        assert on.link_bytes[link] == pytest.approx(nbytes, rel=RTOL)


def test_a_broken_orbit_is_replayed_with_orbits_of_whole_hosts(monkeypatch):
    """Orbit symmetries need not be lanes, so traffic beside an orbit run may break them
    while the lanes hold: the first failed certificate of a run whose orbits rotated GPUs
    inside hosts (this all-to-all's host x rail rotations) replays it with orbits of whole
    hosts (and says why); only further failures drop orbits, then families
    (test_a_run_is_replayed_with_host_orbits_then_without_orbits_then_without_families).
    (The failure is injected: a run that used orbits raises once.)"""
    import dessim.engine.engine as engine_module

    real_run = engine_module._Run.run
    calls = []

    def run(self):
        calls.append((self.families_on, self.orbits_on))
        real_run(self)
        if self.orbit_runs and len(calls) == 1:
            raise QuotientBroken("injected: an orbit image has no bottleneck")

    monkeypatch.setattr(engine_module._Run, "run", run)
    g, topo = _folded_rail_alltoall()
    res = simulate(g, topo, EngineOptions(record_links=False))
    fold = res.meta["fold"]
    assert calls == [(True, True), (True, True)]
    assert fold["lane_rank_rotations_refused"] == "injected: an orbit image has no bottleneck"
    assert fold["lane_orbits_refused"] is None and fold["lane_families_refused"] is None
    assert fold["lane_family_runs"] == 1 and fold["lane_orbit_runs"] == 1
    g, topo = _folded_rail_alltoall()
    exact = simulate(g, topo, EngineOptions(record_links=False, shortcuts=Shortcuts.none()))
    assert res.makespan_s == pytest.approx(exact.makespan_s, rel=RTOL)


def _rail_alltoall_beside_a_ring(a2a: float = 6.4e7, ring: float = 2e8,
                                 chunks: int = 2) -> tuple[TaskGraph, Topology]:
    """dgx-h100:nodes=4, lanes that rotate the 32 ranks in order (a data-parallel fold of one
    rank per lane), one member task of a pipelined rail all-to-all and one of a ring
    all-reduce, both over every rank and at the same time (as deepseek-v3's expert dispatch
    beside its gradient ring). The ring enters each host at GPU 0 and leaves at GPU 7, so it
    breaks the all-to-all's host x rail rotations but keeps the rotations of whole hosts."""
    perm = np.array([[(r + k) % 32 for r in range(32)] for k in range(32)])
    g = TaskGraph("folded", fold=Fold(perm))
    g.add(Task("a2a", 0, "collective", op="alltoall", size=a2a, group=tuple(range(32)),
               coll_id="a2a", algo="rail", stream="ep",
               attrs={"algo_options": {"pipeline_chunks": chunks, "network_share": 0.5}}))
    g.add(Task("dp", 0, "collective", op="allreduce", size=ring, group=tuple(range(32)),
               coll_id="dp", algo="ring", stream="dp"))
    return g, load_topology("dgx-h100:nodes=4")


def _two_alltoalls_the_second_beside_a_ring() -> tuple[TaskGraph, Topology]:
    """:func:`_rail_alltoall_beside_a_ring` with one more all-to-all that runs first, alone:
    the ring and the second all-to-all start when it ends."""
    g, topo = _rail_alltoall_beside_a_ring()
    first = Task("a2a0", 0, "collective", op="alltoall", size=6.4e7, group=tuple(range(32)),
                 coll_id="a2a0", algo="rail", stream="ep",
                 attrs={"algo_options": {"pipeline_chunks": 2, "network_share": 0.5}})
    out = TaskGraph("folded", fold=g.fold)
    out.add(first)
    for t in g:
        out.add(t, deps=["a2a0"])
    return out, topo


def test_collectives_that_ended_before_the_failure_keep_their_orbits_inside_hosts(monkeypatch):
    """Every rate up to a failed certificate was certified, so the replay runs the same until
    then: the all-to-all that had ended keeps its host x rail orbits, the one beside the ring
    takes orbits of whole hosts, and the run equals the full replay."""
    import dessim.engine.engine as engine_module

    real_run = engine_module._Run.run
    runs = []

    def run(self):
        try:
            real_run(self)
        finally:
            runs.append((self.rank_rotations, self.rank_rotation_runs, self.orbit_runs))

    monkeypatch.setattr(engine_module._Run, "run", run)
    g, topo = _two_alltoalls_the_second_beside_a_ring()
    res = simulate(g, topo, EngineOptions(record_links=False))
    assert runs == [(True, 2, 3), (frozenset({"a2a0"}), 1, 3)]
    assert "has no bottleneck" in res.meta["fold"]["lane_rank_rotations_refused"]
    monkeypatch.setattr(engine_module._Run, "run", real_run)
    g, topo = _two_alltoalls_the_second_beside_a_ring()
    _assert_same_run(res, simulate(g, topo, EngineOptions(record_links=False,
                                                          shortcuts=Shortcuts.none())))


def _assert_same_run(got, exact) -> None:
    """Makespan and bytes per link equal to 1e-9."""
    assert got.makespan_s == pytest.approx(exact.makespan_s, rel=RTOL)
    assert got.link_bytes.keys() == exact.link_bytes.keys()
    for link, nbytes in exact.link_bytes.items():
        assert got.link_bytes[link] == pytest.approx(nbytes, rel=RTOL)


def test_orbits_broken_inside_hosts_are_replayed_with_orbits_of_whole_hosts():
    """The ring beside the all-to-all breaks its host x rail orbits (a real certificate
    failure, not an injected one): the replay keeps orbits, of whole hosts only, they
    certify, and the run equals the full replay."""
    g, topo = _rail_alltoall_beside_a_ring()
    res = simulate(g, topo, EngineOptions(record_links=False))
    fold = res.meta["fold"]
    assert "has no bottleneck" in fold["lane_rank_rotations_refused"]
    assert fold["lane_orbits_refused"] is None and fold["lane_families_refused"] is None
    assert fold["lane_orbit_runs"] == 2
    g, topo = _rail_alltoall_beside_a_ring()
    _assert_same_run(res, simulate(g, topo, EngineOptions(record_links=False,
                                                          shortcuts=Shortcuts.none())))


@settings(max_examples=12, deadline=None)
@given(st.tuples(st.sampled_from([1e6, 6.4e7, 3e8]), st.sampled_from([1e5, 2e7, 2e8, 1e9]),
                 st.sampled_from([1, 2, 4])))
def test_orbits_beside_a_ring_equal_the_full_replay(case):
    """Whatever the sizes (the ring shorter or longer than the all-to-all, so the failure
    comes early, late or never), the run with every shortcut equals the full replay."""
    a2a, ring, chunks = case
    g, topo = _rail_alltoall_beside_a_ring(a2a, ring, chunks)
    got = simulate(g, topo, EngineOptions(record_links=False))
    g, topo = _rail_alltoall_beside_a_ring(a2a, ring, chunks)
    _assert_same_run(got, simulate(g, topo, EngineOptions(record_links=False,
                                                          shortcuts=Shortcuts.none())))


def test_a_long_ring_after_the_alltoall_equals_the_full_replay_bit_for_bit():
    """All-to-all 1 MB, ring 200 MB, 4 chunks: the ring runs alone for most of the run, its
    credited sends overlapping, and solves re-rate family flows and the full replay's image
    flows at unchanged rates at different instants. Progress is accounted
    only when a flow's rate changes, so both runs round every flow's remaining bytes alike:
    equal bit for bit (with progress accounted at every solve, 1.03e-8 apart, the ring ending
    11 ps late). Every run of the shortcuts, and each switched off, gives the same times."""
    g, topo = _rail_alltoall_beside_a_ring(1e6, 2e8, 4)
    exact = simulate(g, topo, EngineOptions(record_links=False, shortcuts=Shortcuts.none()))
    base = Shortcuts()
    for shortcuts in (base, replace(base, channel_quotient=False),
                      replace(base, lane_families=False, lane_orbits=False)):
        g, topo = _rail_alltoall_beside_a_ring(1e6, 2e8, 4)
        got = simulate(g, topo, EngineOptions(record_links=False, shortcuts=shortcuts))
        assert got.makespan_s == exact.makespan_s
        assert got.span_records == exact.span_records


def test_a_run_is_replayed_with_host_orbits_then_without_orbits_then_without_families(monkeypatch):
    """The order of the replays after failed certificates (failures injected): orbits that
    rotate GPUs inside hosts, then orbits of whole hosts, then families without orbits, then
    every lane; each refusal is reported, and the last run equals the full replay."""
    import dessim.engine.engine as engine_module

    real_run = engine_module._Run.run
    calls = []

    def run(self):
        calls.append((self.families_on, self.orbits_on, self.rank_rotations))
        real_run(self)
        if self.families_on:
            raise QuotientBroken(f"injected {len(calls)}")

    monkeypatch.setattr(engine_module._Run, "run", run)
    g, topo = _rail_alltoall_beside_a_ring(ring=1e5)
    res = simulate(g, topo, EngineOptions(record_links=False))
    fold = res.meta["fold"]
    # the first replay fails for real at 42.7 us, before the ring ends (105 us): the ring's
    # network senders pay what is left of their latency after their connection's previous
    # send (executor "Connections"), so the rotation inside hosts no longer maps the ring's
    # rates onto the all-to-all's images. No collective had ended: none keeps orbits inside
    # hosts; the next two failures are the injected ones
    assert calls == [(True, True, True), (True, True, frozenset()), (True, False, True),
                     (False, False, True)]
    assert fold["lane_rank_rotations_refused"].startswith("at t = 4.26")
    assert "not symmetric" in fold["lane_rank_rotations_refused"]
    assert (fold["lane_orbits_refused"], fold["lane_families_refused"]) == ("injected 2",
                                                                            "injected 3")
    g, topo = _rail_alltoall_beside_a_ring(ring=1e5)
    monkeypatch.setattr(engine_module._Run, "run", real_run)
    _assert_same_run(res, simulate(g, topo, EngineOptions(record_links=False,
                                                          shortcuts=Shortcuts.none())))


_spread = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.sampled_from([1e5, 4e6, 3e7]),
                             st.sampled_from([0.0, 1e-5, 3e-4, 2e-3, 5e-2]), st.booleans()),
                   min_size=2, max_size=12).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)


@settings(max_examples=60, deadline=None)
@given(_spread)
def test_solves_without_family_flows_skip_the_certificate_and_decide_alike(flows):
    """A solve while no lane-family flow shares bandwidth has nothing to certify and is
    skipped (the channel figures remembered so far go stale): with family flows starting
    again after such periods, the runs still pass and fail exactly where checking every
    family flow at every solve does, and the count of family flows is right at every solve."""
    from dessim.network.base import FamilyRoute
    from dessim.network.flow import FlowNetwork

    solve = FlowNetwork._solve

    def checked(self, now):
        assert self._family_flows == sum(type(f.route) is FamilyRoute for f in self._active.values())
        solve(self, now)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(FlowNetwork, "_solve", checked)
        assert _certified_run(flows, False) == _certified_run(flows, True)
