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

import numpy as np

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane, StepPattern, StepPlan, StepPlanBuilder
from dessim.topology.graph import Topology

#: (reduce-scatter phase, all-gather phase) of the ring ops that are made of uniform steps.
_PHASES = {"allreduce": (True, True), "reducescatter": (True, False), "allgather": (False, True)}


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
        phases = _PHASES[op.name]
        if phases[0]:
            for _ in range(p - 1):
                lane.step((a, b, block, block) for a, b in hops)
        if phases[1]:
            for _ in range(p - 1):
                lane.step((a, b, block, 0.0) for a, b in hops)

    def plan(self, op: Op, group: tuple[int, ...], size: float, chunks: int,
             channels: int) -> StepPlan | None:
        """The same transfers and dependencies as :meth:`emit` over ``channels × chunks``
        lanes (see :func:`~dessim.collectives.algorithms.build_schedule`), as a
        :class:`StepPlan`; None for the ops that are not uniform steps (broadcast, reduce).

        Dependencies, as :class:`Lane` and the FIFO connections produce them: member ``i``
        (hop ``order[i] -> order[i+1]``) of a step waits for members ``i-1, i, i+1`` of the
        previous step of its lane (its sender's send and receive, its receiver's send); the
        first step of chunk ``k > 0`` waits for member ``i`` of chunk ``k-1``'s last step
        (the previous transfer on the same connection)."""
        if op.name not in _PHASES or len(group) < 2:
            return None
        p = len(group)
        steps = (p - 1) * sum(_PHASES[op.name])
        block = size / (chunks * channels) / p
        idx = np.arange(p, dtype=np.int64)
        ring_deps = [sorted({(i - 1) % p, i, (i + 1) % p}) for i in range(p)]
        ring_start = np.cumsum([0] + [len(d) for d in ring_deps], dtype=np.int64)
        ring_index = np.fromiter((j for d in ring_deps for j in d), dtype=np.int64)
        builder = StepPlanBuilder()
        for c in range(channels):
            order = np.asarray(ring_order(group, c), dtype=np.int64)
            src, dst = order, np.roll(order, -1)
            first = StepPattern(src, dst, np.zeros(p + 1, dtype=np.int64), idx[:0])
            chained = StepPattern(src, dst, np.arange(p + 1, dtype=np.int64), idx)
            ring = StepPattern(src, dst, ring_start, ring_index)
            last = -1
            for k in range(chunks):
                for j in range(steps):
                    reduces = _PHASES[op.name][0] and j < p - 1
                    pattern = ring if j else (chained if k else first)
                    last = builder.add(pattern, last, block, block if reduces else 0.0, c)
        return builder.build()
