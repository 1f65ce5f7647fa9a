"""Ring algorithms (NCCL "Ring"; reference README §2.1, §2.3).

* allreduce = ring reduce-scatter (p-1 steps, reduce on arrival) + ring all-gather (p-1
  steps), each step moving one block of ``size/p`` to the next rank:
  ``2(p-1)(α + S/p·β)`` on an idle network.
* reducescatter / allgather: ``p-1`` steps of ``size/p`` (``size`` = whole array).
* broadcast / reduce: a chain along the ring starting at (broadcast) or ending at (reduce)
  the root; with ``chunks`` k it pipelines: ``(p-2+k)(α + S/k·β)``.

Channels: odd channels run the ring in the opposite direction, as NCCL does with its
bidirectional rings, so two channels use both directions of every ring link.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane
from dessim.topology.graph import Topology


def ring_order(group: tuple[int, ...], channel: int) -> tuple[int, ...]:
    """The ring of a channel: the group order, reversed on odd channels."""
    return group if channel % 2 == 0 else group[::-1]


@register
class Ring(Algorithm):
    name = "ring"
    summary = "ring reduce-scatter + all-gather; chains for broadcast/reduce"
    ops = frozenset({"allreduce", "reducescatter", "allgather", "broadcast", "reduce"})

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        order = ring_order(group, lane.channel)
        p = len(order)
        if p < 2:
            return
        if op.name in ("broadcast", "reduce"):
            start = order.index(root)
            if op.name == "broadcast":       # root, root+1, ..., root-1
                chain = order[start:] + order[:start]
            else:                            # root+1, ..., root-1, root
                chain = order[start + 1:] + order[:start + 1]
            red = size if op.reduces else 0.0
            for h in range(p - 1):
                lane.step([(chain[h], chain[h + 1], size, red)])
            return
        block = size / p
        hops = [(order[i], order[(i + 1) % p]) for i in range(p)]
        phases = {"allreduce": (True, True), "reducescatter": (True, False),
                  "allgather": (False, True)}[op.name]
        if phases[0]:
            for _ in range(p - 1):
                lane.step((a, b, block, block) for a, b in hops)
        if phases[1]:
            for _ in range(p - 1):
                lane.step((a, b, block, 0.0) for a, b in hops)
