"""NCCL's double binary tree (NCCL 2.4; reference README §2.3).

Two complementary binary trees each carry half of the data: tree 0 is NCCL's in-order binary
tree (``ncclGetBtree``: a rank's parent is found from its lowest set bit), tree 1 its mirror
(``p`` even) or its shift by one (``p`` odd), as in ``ncclGetDtree``; a rank that is a leaf
in one tree is an inner node of the other, so the per-rank traffic is balanced.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import SUB_CHANNEL, Algorithm, register
from dessim.collectives.algorithms.trees import emit_tree
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


def btree_parent(p: int) -> list[int]:
    """Parents of NCCL's in-order binary tree over ranks 0..p-1 (root 0 has parent -1)."""
    parent = [-1] * p
    for rank in range(1, p):
        bit = 1
        while bit < p and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= p:
            up = rank ^ bit
        parent[rank] = up
    return parent


def dtree_parents(p: int) -> tuple[list[int], list[int]]:
    """Parents of NCCL's two complementary trees (mirror for even p, shift for odd p)."""
    t0 = btree_parent(p)
    if p % 2:   # shift: rank r plays rank r-1 of tree 0
        t1 = [-1 if t0[(r - 1) % p] < 0 else (t0[(r - 1) % p] + 1) % p for r in range(p)]
    else:       # mirror: rank r plays rank p-1-r
        t1 = [-1 if t0[p - 1 - r] < 0 else p - 1 - t0[p - 1 - r] for r in range(p)]
    return t0, t1


@register
class DoubleBinaryTree(Algorithm):
    name = "dbtree"
    summary = "NCCL double binary tree: two complementary trees, each half the data"
    ops = frozenset({"allreduce"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        if len(group) < 2:
            return
        merged: dict[int, list[int]] = {}
        for t, parent in enumerate(dtree_parents(len(group))):
            sub = Lane(lane.builder, lane.channel + SUB_CHANNEL * (t + 1),
                       {r: list(v) for r, v in lane.pending.items()})
            emit_tree(sub, group, parent, size / 2, up=True, down=True)
            for r, v in sub.pending.items():
                merged.setdefault(r, []).extend(v)
        lane.pending.update(merged)
