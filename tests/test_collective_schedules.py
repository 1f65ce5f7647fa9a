"""Collective schedules as data: ops, registry, bytes conservation, structure (no network)."""

from __future__ import annotations

import math

import pytest

from dessim.collectives import ALGORITHMS, OPS, build_schedule, get_op
from dessim.collectives.algorithms.dbtree import dtree_parents
from dessim.collectives.schedule import Schedule, ScheduleBuilder
from dessim.errors import CollectiveError
from dessim.topology.builders import switch
from dessim.topology.presets import dgx_h100

S = 1 << 20


# --------------------------------------------------------------------------- ops
@pytest.mark.parametrize("spelling", ["allreduce", "All-Reduce", "all_reduce", "ALLREDUCE"])
def test_op_names_normalise_case_hyphen_underscore(spelling):
    assert get_op(spelling).name == "allreduce"


def test_unknown_op_lists_valid_names():
    with pytest.raises(CollectiveError) as err:
        get_op("allscatter")
    for name in OPS:
        assert name in str(err.value)


@pytest.mark.parametrize("op,factor", [("allreduce", 2 * 7 / 8), ("reducescatter", 7 / 8),
                                       ("allgather", 7 / 8), ("broadcast", 1.0),
                                       ("reduce", 1.0), ("alltoall", 7 / 8), ("sendrecv", 1.0)])
def test_busbw_factors_are_nccl_tests_ones(op, factor):
    # nccl-tests doc/PERFORMANCE.md for n = 8 ranks
    assert get_op(op).busbw_factor(8) == pytest.approx(factor)


# --------------------------------------------------------------------------- every combination
def _cases():
    for name, alg in ALGORITHMS.items():
        if name in ("hierarchical", "nvls", "nvlstree", "collnet", "collnetdirect"):
            continue    # need a topology: tested below and in tests/test_collnet.py
        for op in sorted(alg.ops):
            for p in ([2] if op == "sendrecv" else [2, 3, 5, 6, 8, 12]):
                yield name, op, p


@pytest.mark.parametrize("algo,op,p", list(_cases()))
@pytest.mark.parametrize("channels,chunks", [(1, 1), (2, 3)])
def test_every_algorithm_and_op_conserves_bytes(algo, op, p, channels, chunks):
    group = tuple(range(100, 100 + p))          # global ranks need not start at 0
    root = group[-1] if get_op(op).rooted and op != "sendrecv" else None
    sched = build_schedule(op, algo, group, S * p, channels=channels, chunks=chunks, root=root)
    sched.validate()
    assert len(sched) > 0


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("group", [tuple(range(32)), tuple(range(8, 16)),
                                   tuple(range(0, 32, 8))])
def test_hierarchical_conserves_bytes_on_whole_dimensions(op, group):
    topo = dgx_h100(4)   # dims (8, 4)
    sched = build_schedule(op, "hierarchical", group, S, topology=topo, channels=2)
    sched.validate()


def test_validate_rejects_a_schedule_missing_a_step():
    full = build_schedule("allgather", "ring", range(4), 4000.0)
    broken = Schedule(full.op, "broken", full.group, full.size)
    b = ScheduleBuilder(broken)
    for t in full.transfers[:-4]:                # drop the last step
        b.add(t.src, t.dst, t.nbytes, t.deps, t.reduce_bytes)
    with pytest.raises(CollectiveError, match="receives"):
        broken.validate()


def test_validate_rejects_a_rank_that_never_hears_from_another():
    sched = Schedule(get_op("allgather"), "bogus", (0, 1, 2), 300.0)
    b = ScheduleBuilder(sched)
    for s, d in [(0, 1), (1, 2), (2, 0)]:        # enough bytes, but 0 never hears from 1
        b.add(s, d, 200.0)
    with pytest.raises(CollectiveError, match="never hears"):
        sched.validate()


# --------------------------------------------------------------------------- structure
@pytest.mark.parametrize("p", [2, 4, 5, 8])
def test_ring_allreduce_moves_exactly_the_bandwidth_optimal_bytes(p):
    sched = build_schedule("allreduce", "ring", range(p), float(S))
    assert all(math.isclose(v, 2 * (p - 1) / p * S) for v in sched.bytes_sent().values())
    assert sched.critical_path_length() == 2 * (p - 1)
    assert sched.total_reduce_bytes() == pytest.approx((p - 1) * S)


def test_halving_doubling_is_2_lg_p_steps_and_bandwidth_optimal_for_power_of_two():
    sched = build_schedule("allreduce", "hd", range(16), float(S))
    assert sched.critical_path_length() == 2 * 4
    assert all(math.isclose(v, 2 * 15 / 16 * S) for v in sched.bytes_sent().values())


@pytest.mark.parametrize("p,steps", [(6, 2 * 2 + 2), (12, 2 * 3 + 2)])
def test_halving_doubling_folds_extra_ranks(p, steps):
    # (2⌊lg p⌋ + 2) steps (Thakur et al. 2005, non-power-of-two)
    assert build_schedule("allreduce", "hd", range(p), float(S)).critical_path_length() == steps


def test_recursive_doubling_allreduce_is_lg_p_steps_of_the_whole_buffer():
    sched = build_schedule("allreduce", "rd", range(8), float(S))
    assert sched.critical_path_length() == 3
    assert set(sched.nbytes) == {float(S)}


@pytest.mark.parametrize("k", [1, 4, 16])
def test_chunked_chain_broadcast_pipelines(k):
    # (p - 2 + k) sequential transfers ("Pipelined chain and tree" in docs/references.md)
    sched = build_schedule("broadcast", "ring", range(8), float(S), chunks=k)
    assert sched.critical_path_length() == 8 - 2 + k


def test_ring_channels_alternate_direction():
    sched = build_schedule("allgather", "ring", range(4), 4000.0, channels=2)
    pairs = {(t.src, t.dst, t.channel) for t in sched}
    assert (0, 1, 0) in pairs and (1, 0, 1) in pairs and (1, 0, 0) not in pairs


@pytest.mark.parametrize("p", [4, 8, 16, 24])
def test_double_binary_tree_inner_nodes_are_complementary(p):
    trees = dtree_parents(p)
    inner = [{parent[i] for i in range(p) if parent[i] >= 0} for parent in trees]
    roots = [[i for i in range(p) if parent[i] < 0] for parent in trees]
    assert all(len(r) == 1 for r in roots)
    assert not inner[0] & inner[1]     # a leaf in one tree is an inner node of the other


def test_direct_allgather_is_one_step_of_every_pair():
    sched = build_schedule("allgather", "direct", range(6), 6000.0)
    assert len(sched) == 30 and sched.critical_path_length() == 1


def test_sendrecv_is_a_single_transfer():
    sched = build_schedule("sendrecv", "direct", (3, 5), 1000.0)
    assert sched.transfers == [sched[0]] and (sched[0].src, sched[0].dst) == (3, 5)


def test_hierarchical_allreduce_phases_on_dgx_group():
    topo = dgx_h100(2)
    sched = build_schedule("allreduce", "hierarchical", range(16), 16.0 * S, topology=topo)
    # ring RS in node (7 steps) + ring AR across 2 nodes (2 steps) + ring AG in node (7)
    assert sched.critical_path_length() == 7 + 2 + 7
    inter = [t for t in sched if t.src // 8 != t.dst // 8]
    assert sum(t.nbytes for t in inter) == pytest.approx(16 * 2 * (1 / 2) * 16 * S / 8)


# --------------------------------------------------------------------------- bad input
def test_unknown_algorithm_lists_valid_ones():
    with pytest.raises(CollectiveError) as err:
        build_schedule("allreduce", "bruck", range(4), 1.0)
    for name in ALGORITHMS:
        assert name in str(err.value)


def test_algorithm_that_cannot_run_op_says_which_can():
    with pytest.raises(CollectiveError, match=r"pairwise.*cannot run allreduce.*ring"):
        build_schedule("allreduce", "pairwise", range(4), 1.0)


def test_hierarchical_needs_whole_dimensions():
    with pytest.raises(CollectiveError, match="whole dimensions"):
        build_schedule("allreduce", "hierarchical", range(6), 1.0, topology=dgx_h100(2))


def test_hierarchical_needs_a_topology_and_valid_inner():
    with pytest.raises(CollectiveError, match="topology"):
        build_schedule("allreduce", "hierarchical", range(8), 1.0)
    with pytest.raises(CollectiveError, match="cannot run reducescatter"):
        build_schedule("allreduce", "hierarchical", range(16), 1.0, topology=dgx_h100(2),
                       inner="tree,ring")


@pytest.mark.parametrize("kwargs,match", [({"size": 0}, "size"), ({"size": -5}, "size"),
                                          ({"chunks": 0}, "chunks"), ({"group": ()}, "empty"),
                                          ({"group": (1, 1)}, "repeats")])
def test_bad_sizes_and_groups(kwargs, match):
    args = {"op": "allreduce", "algo": "ring", "group": (0, 1), "size": 8.0} | kwargs
    with pytest.raises(CollectiveError, match=match):
        build_schedule(**args)


def test_sendrecv_needs_two_ranks_and_root_must_be_in_group():
    with pytest.raises(CollectiveError, match="exactly 2"):
        build_schedule("sendrecv", "direct", range(3), 1.0)
    with pytest.raises(CollectiveError, match="root"):
        build_schedule("broadcast", "ring", range(3), 1.0, root=7)


def test_switch_topology_builds_all_algorithms_deterministically():
    topo = switch(6, "50GB/s", "500ns")
    a = build_schedule("allreduce", "hierarchical", range(6), 1e6, topology=topo)
    b = build_schedule("allreduce", "hierarchical", range(6), 1e6, topology=topo)
    assert a.transfers == b.transfers
