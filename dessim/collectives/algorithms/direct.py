"""Direct: every rank sends to every peer at once (one step; two for allreduce).

* allgather / alltoall: each rank sends one block of ``size/p`` to each of the ``p-1`` others;
  on a fully connected topology every pair has its own link (``α + S/p·β``); on a switch all
  ``p-1`` flows of a rank share its injection link (``2·lat + (p-1)/p·S/bw``).
* reducescatter: rank i sends block j to rank j, which reduces it.
* allreduce: direct reduce-scatter then direct all-gather ("two-shot").
* broadcast / reduce: the root sends to / receives from every rank at once.
* sendrecv: the single transfer group[0] -> group[1].
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


def all_pairs(group: tuple[int, ...], nbytes: float, reduce: bool):
    """Every ordered pair (i, i+k) for k = 1..p-1, source-major (deterministic)."""
    p = len(group)
    red = nbytes if reduce else 0.0
    return [(group[i], group[(i + k) % p], nbytes, red) for i in range(p) for k in range(1, p)]


@register
class Direct(Algorithm):
    name = "direct"
    summary = "every rank sends to every other rank at once"
    ops = frozenset({"allgather", "alltoall", "reducescatter", "allreduce", "broadcast",
                     "reduce", "sendrecv"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        p = len(group)
        if p < 2:
            return
        name = op.name
        if name in ("allgather", "alltoall"):
            lane.step(all_pairs(group, size / p, reduce=False))
        elif name == "reducescatter":
            lane.step(all_pairs(group, size / p, reduce=True))
        elif name == "allreduce":
            lane.step(all_pairs(group, size / p, reduce=True))
            lane.step(all_pairs(group, size / p, reduce=False))
        elif name == "broadcast":
            lane.step((root, r, size, 0.0) for r in group if r != root)
        elif name == "reduce":
            lane.step((r, root, size, size) for r in group if r != root)
        else:  # sendrecv
            lane.step([(group[0], group[1], size, 0.0)])
