"""Rabenseifner's halving-doubling (Thakur et al. 2005; docs/references.md).

* reducescatter: recursive halving, ``lg p α + (p-1)/p Sβ``;
* allgather: recursive doubling (the same as ``rd``);
* allreduce: halving reduce-scatter + doubling all-gather,
  ``2 lg p α + 2(p-1)/p Sβ`` for ``p = 2^k``. Other sizes fold the extra ranks
  (:mod:`~dessim.collectives.algorithms.recursive`): ``(2⌊lg p⌋+2)α + (2(p'-1)/p' + 2)Sβ``
  with ``p' = 2^⌊lg p⌋`` (MPICH's comment writes ``(p-1)/p``, exact only when ``p' = p``).
"""

from __future__ import annotations

from dessim.collectives.algorithms import recursive
from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


@register
class HalvingDoubling(Algorithm):
    name = "hd"
    summary = "Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather"
    ops = frozenset({"allreduce", "reducescatter", "allgather"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        p = len(group)
        if p < 2:
            return
        if op.name == "allgather":
            recursive.allgather(lane, group, size)
            return
        fold = recursive.Fold.of(group)
        recursive.fold_in(lane, fold, size, reduce=True)
        if op.name == "allreduce":
            even = fold.uniform()
            block = size / len(fold.core)
            recursive.halving_scatter(lane, even, block)
            recursive.doubling_gather(lane, even, block)
            recursive.fold_out(lane, fold, size)
        else:
            recursive.halving_scatter(lane, fold, size / p)
            recursive.fold_out(lane, fold, size / p)
