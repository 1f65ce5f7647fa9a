"""Recursive doubling (Thakur et al. 2005): ``lg p`` exchange steps.

* allreduce: each step exchanges and reduces the whole buffer, ``lg p(α + Sβ)`` — the
  latency-optimal choice for short messages;
* allgather: step k exchanges the ``2^k`` blocks gathered so far, ``lg p α + (p-1)/p Sβ``.

Other group sizes use the fold of :mod:`~dessim.collectives.algorithms.recursive`.
"""

from __future__ import annotations

from dessim.collectives.algorithms import recursive
from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


@register
class RecursiveDoubling(Algorithm):
    name = "rd"
    summary = "recursive doubling (whole buffer per step for allreduce)"
    ops = frozenset({"allreduce", "allgather"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        if len(group) < 2:
            return
        if op.name == "allgather":
            recursive.allgather(lane, group, size)
            return
        fold = recursive.Fold.of(group)
        recursive.fold_in(lane, fold, size, reduce=True)
        recursive.doubling_full(lane, fold, size, reduce=True)
        recursive.fold_out(lane, fold, size)
