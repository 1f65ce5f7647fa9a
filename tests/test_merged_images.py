"""Merged images (issue 17): in a folded graph the images of one collective run as ONE step
schedule. The merge must change nothing: same transfers, same dependencies, same flows at the
same instants, so every result float equals the run with one schedule per image."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.collectives import build_schedule
from dessim.collectives.executor import merge_instances, run_schedule
from dessim.collectives.schedule import merge_disjoint
from dessim.engine import EngineOptions, Shortcuts
from dessim.network import make_network
from dessim.topology import load_topology
from dessim.workload import simulate_workload

OPS = [("allreduce", "ring"), ("allgather", "ring"), ("reducescatter", "ring"),
       ("alltoall", "direct")]


def _instances(k: int, n: int) -> list[tuple[int, ...]]:
    """k disjoint groups of n ranks, interleaved (images of a group under a DP shift)."""
    return [tuple(range(i, k * n, k)) for i in range(k)]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(OPS), st.integers(2, 4), st.integers(2, 5), st.integers(1, 3))
def test_merged_schedule_holds_every_instance_transfer_with_its_own_dependencies(opalgo, k, n, channels):
    op, algo = opalgo
    scheds = [build_schedule(op, algo, g, 1e6, channels=channels) for g in _instances(k, n)]
    merged = merge_disjoint(scheds)
    assert merged is not None and merged.communicator == scheds[0].group
    assert merged.group == tuple(r for s in scheds for r in s.group)
    assert len(merged) == sum(len(s) for s in scheds)
    # transfer t of instance i is found in the merged rows, with the images of its deps
    rows = {}
    for t in merged:
        rows[(t.src, t.dst, t.channel, t.nbytes, t.reduce_bytes,
              frozenset((merged.src[d], merged.dst[d], merged.channel[d]) for d in t.deps))] = \
            rows.get((t.src, t.dst, t.channel, t.nbytes, t.reduce_bytes,
                      frozenset((merged.src[d], merged.dst[d], merged.channel[d]) for d in t.deps)), 0) + 1
    want: dict = {}
    for s in scheds:
        for t in s:
            key = (t.src, t.dst, t.channel, t.nbytes, t.reduce_bytes,
                   frozenset((s.src[d], s.dst[d], s.channel[d]) for d in t.deps))
            want[key] = want.get(key, 0) + 1
    assert rows == want


def test_merge_refuses_what_is_not_images_of_one_collective():
    a, b = _instances(2, 4)
    ring = lambda g, size=1e6, algo="ring": build_schedule("allreduce", algo, g, size)
    assert merge_disjoint([ring(a)]) is None                             # nothing to merge
    assert merge_disjoint([ring(a), ring(a)]) is None                    # not disjoint
    assert merge_disjoint([ring(a), ring(b, size=2e6)]) is None          # other size
    assert merge_disjoint([ring(a), build_schedule("allgather", "ring", b, 1e6)]) is None
    assert merge_disjoint([ring(a), ring(b[:3])]) is None                # other shape
    assert merge_disjoint([ring(a), ring(b)]) is not None


def _finish_times(topo, schedules, merged: bool) -> dict[int, float]:
    """Run the schedules at once (plus cross traffic that splits bundles) and return
    every rank's finish time."""
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    net.transfer(0, 9, 3e6)                       # cross traffic on rank 0's links
    if merged:
        sched = merge_instances(net, schedules)
        assert sched is not None
        runs = [run_schedule(net, sched)]
    else:
        runs = [run_schedule(net, s) for s in schedules]
    env.run()
    return {r: t for run in runs for r, t in run.rank_finish.items()}


@pytest.mark.parametrize("op, algo", OPS)
def test_merged_run_finishes_every_rank_when_separate_runs_do(op, algo):
    topo = load_topology("dgx-h100:nodes=2")
    scheds = [build_schedule(op, algo, g, 8e6) for g in _instances(4, 4)]
    assert _finish_times(topo, scheds, True) == _finish_times(topo, scheds, False)


def test_merge_needs_routes_that_ignore_the_ecmp_key():
    """Instances use different ECMP key bases: on a fabric with several equal paths between
    nodes the merge is refused (its single key base could route differently)."""
    topo = load_topology("leafspine:16,4,spines=4")
    net = make_network("flow", simpy.Environment(), topo)
    scheds = [build_schedule("allreduce", "ring", (i, i + 8), 1e6) for i in range(2)]
    assert merge_instances(net, scheds) is None


@pytest.mark.parametrize("workload, overrides", [
    pytest.param("mixtral-8x7b", {"tp": 2, "pp": 1, "ep": 4, "global_batch": 16, "micro_batch": 1,
                                  "model": {"layers": 2}}, id="ep4-tp2"),
    pytest.param("llama3-8b", {"tp": 2, "pp": 2, "cp": 2, "global_batch": 8, "micro_batch": 1,
                               "model": {"layers": 4}}, id="cp2-pp2"),
    pytest.param("gpt3-1.3b", {"tp": 2, "pp": 1, "sp": True, "global_batch": 16, "micro_batch": 2,
                               "generator": {"granularity": "layer"}}, id="sp-layer"),
])
def test_merged_images_change_no_result(workload, overrides):
    runs = [simulate_workload(workload, "dgx-h100:nodes=2", overrides=overrides,
                              options=EngineOptions(record_links=False,
                                                    shortcuts=Shortcuts(merged_images=on,
                                                                        lane_families=False)))
            for on in (False, True)]
    off, on = runs
    assert on.simulation.meta["fold"]["merged_image_runs"] > 0
    assert off.simulation.meta["fold"]["merged_image_runs"] == 0
    assert on.shortcuts()["merged_image_runs"] == on.simulation.meta["fold"]["merged_image_runs"]
    assert on.iteration_s == off.iteration_s
    assert on.simulation.link_bytes == off.simulation.link_bytes
    assert on.summary()["exposed_comm_s"] == off.summary()["exposed_comm_s"]
    assert [(r.compute_s, r.exposed_comm_s) for r in on.simulation.ranks] == \
        [(r.compute_s, r.exposed_comm_s) for r in off.simulation.ranks]
