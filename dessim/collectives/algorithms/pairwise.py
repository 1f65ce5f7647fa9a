"""Pairwise-exchange all-to-all (Thakur et al. 2005): ``p-1`` steps; in step s rank i
sends its block for rank i+s and receives from rank i-s: ``(p-1)α + (p-1)/p·Sβ``."""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


@register
class Pairwise(Algorithm):
    name = "pairwise"
    summary = "pairwise exchange: p-1 steps, one peer per step"
    ops = frozenset({"alltoall"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        p = len(group)
        for s in range(1, p):
            lane.step((group[i], group[(i + s) % p], size / p, 0.0) for i in range(p))
