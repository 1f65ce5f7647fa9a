"""Group shapes: groups joined by the same routes up to renaming run every collective the
same way, so auto's decision and closed-form TP times are computed once per shape (issue 9).
Equal shapes must imply equal results; different sub-networks must get different shapes."""

from __future__ import annotations

import pytest

from dessim.collectives import get_op
from dessim.collectives.auto import choose, group_shape
from dessim.topology import load_topology
from dessim.engine import EngineOptions, Shortcuts
from dessim.workload.transformer.tp_islands import TPIslands


@pytest.fixture(scope="module")
def dgx():
    return load_topology("dgx-a100:nodes=4")


def test_tp_groups_of_different_nodes_share_a_shape(dgx):
    shapes = {group_shape(tuple(range(8 * n, 8 * n + 8)), dgx) for n in range(4)}
    assert len(shapes) == 1


def test_different_sub_networks_get_different_shapes(dgx):
    in_node = group_shape((0, 1, 2, 3), dgx)
    across = group_shape((0, 8, 16, 24), dgx)            # one GPU per node: NICs and a leaf
    half = group_shape((0, 1, 2, 3, 4, 5, 6, 7, 8), dgx)   # 9 ranks
    assert len({in_node, across, half}) == 3
    # hierarchical reads the topology's grid: a sub-grid and a non-sub-grid differ there
    flat = load_topology("switch:n=16")
    assert group_shape((0, 1), flat)[3] == group_shape((2, 3), flat)[3]


@pytest.mark.parametrize("op,size", [("allreduce", 64e6), ("allgather", 1e6),
                                     ("reducescatter", 4e5), ("broadcast", 8e6)])
def test_groups_of_one_shape_get_the_same_choice(dgx, op, size):
    o = get_op(op)
    for groups in ([tuple(range(8 * n, 8 * n + 8)) for n in range(4)],
                   [(1, 9, 17, 25), (0, 8, 16, 24)]):
        assert len({group_shape(g, dgx) for g in groups}) == 1
        choices = [choose(o, g, size, dgx) for g in groups]
        assert len({(c.algorithm, c.protocol, tuple((e.algorithm, e.protocol, e.time_s)
                                                     for e in c.estimates))
                    for c in choices}) == 1


def test_closed_form_tp_times_per_shape_equal_the_per_group_simulation(dgx):
    tp = [tuple(range(8 * n, 8 * n + 8)) for n in range(4)]
    memo = TPIslands(dgx, tp)
    fresh = TPIslands(dgx, tp, options=EngineOptions(record_links=False, shortcuts=Shortcuts(shape_memo=False)))
    for g in tp:
        for op, size in (("allreduce", 3e7), ("allgather", 5e6), ("reducescatter", 5e6)):
            assert memo.time(op, size, g) == fresh.time(op, size, g)
    assert len(memo._by_shape) == 3                        # one simulation per op and size



def test_workload_iteration_identical_with_and_without_the_shape_memo():
    from dessim.engine import EngineOptions
    from dessim.workload import simulate_workload

    ov = {"tp": 8, "pp": 2, "dp": 2, "global_batch": 8, "schedule": "1f1b",
          "generator": {"granularity": "stage", "fold": True}}
    runs = [simulate_workload("gpt3-1.3b", "dgx-a100:nodes=4", overrides=ov,
                              options=EngineOptions(record_links=False, shortcuts=Shortcuts(shape_memo=memo)))
            for memo in (True, False)]
    assert runs[0].iteration_s == runs[1].iteration_s
    assert runs[0].simulation.link_bytes == runs[1].simulation.link_bytes
