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

import numpy as np

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Lane, StepPattern, StepPlan, StepPlanBuilder
from dessim.topology.graph import Topology

#: Ops whose direct schedule is uniform steps of all pairs (reduce-scatter phase, gather phase).
_STEPS: dict[str, tuple[bool, ...]] = {"allgather": (False,), "alltoall": (False,),
                                       "reducescatter": (True,), "allreduce": (True, False)}


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

    def plan(self, op: Op, group: tuple[int, ...], size: float, chunks: int,
             lanes: list[tuple[int, ...]]) -> StepPlan | None:
        """The same transfers and dependencies as :meth:`emit` as uniform all-pairs steps
        (:class:`StepPlan`), so that a step can run as one network bundle; None for rooted
        ops and for ``chunks > 1`` (a chunk's gather would wait on two earlier steps).

        Dependencies, as :class:`Lane` produces them: the gather step's send ``s -> d`` waits
        for everything ``s`` and ``d`` sent and received in the reduce-scatter step."""
        phases = _STEPS.get(op.name)
        channels = len(lanes)
        p = len(group)
        if phases is None or chunks != 1 or p < 2:
            return None
        pairs = [(i, (i + k) % p) for i in range(p) for k in range(1, p)]
        order = np.asarray(group, dtype=np.int64)
        src = order[[i for i, _ in pairs]]
        dst = order[[j for _, j in pairs]]
        none = np.zeros(len(pairs) + 1, dtype=np.int64)
        first = StepPattern(src, dst, none, none[:0])
        block = size / channels / p
        builder = StepPlanBuilder()
        gather = None
        if len(phases) == 2:
            touching: list[list[int]] = [[] for _ in range(p)]   # members sent or received by rank
            for m, (i, j) in enumerate(pairs):
                touching[i].append(m)
                touching[j].append(m)
            deps = [sorted(set(touching[i]) | set(touching[j])) for i, j in pairs]
            start = np.cumsum([0] + [len(d) for d in deps], dtype=np.int64)
            index = np.fromiter((m for d in deps for m in d), dtype=np.int64, count=int(start[-1]))
            gather = StepPattern(src, dst, start, index)
        for c in range(channels):
            prev = builder.add(first, -1, block, block if phases[0] else 0.0, c)
            if gather is not None:
                builder.add(gather, prev, block, 0.0, c)
        return builder.build()

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
