"""Stage granularity: a whole pass (one micro-batch through one stage chunk, one phase) as
few compute tasks, exact when its TP collectives are in closed form
(:mod:`dessim.workload.transformer.tp_islands`).

With every TP collective of a pass timed in closed form and nothing else inside the pass
(no EP all-to-all, CP exchange, ZeRO-3 gather or activation offload), the pass is a fixed
program of two streams (``compute`` and ``tp``) of one rank whose members start together and
stay together. :func:`pass_timeline` replays that program with the engine's rules (a step
starts when its dependencies and the previous step of its stream are done); the pass then
becomes one compute task per *segment*, cut after each compute step that other tasks depend
on (a DP gradient bucket fires after the layer that completes it), each lasting exactly the
time between cuts. A TP collective still running after the last compute (the input-gradient
all-reduce of a stage's first layer, overlapped with its weight gradient) becomes a ``delay``
on the ``tp`` stream after the last segment, so the makespan is unchanged.

Accounting: a segment keeps the summed ``flops``, ``bytes`` and ``attrs["model_flops"]`` of
its kernels; ``attrs["tp_comm_s"]`` is the TP communication time inside it and
``attrs["tp_exposed_s"]`` the part not overlapped by compute (what the engine would report
as exposed TP communication), ``attrs["tp_exposed_iv"]`` its intervals from the segment's
start (the engine runs the segment as compute; the summary's figures take those intervals
out of it, :func:`dessim.workload.common.figures.rank_exposure`). Units: seconds, FLOPs, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from dessim.engine.intervals import length, subtract, union
from dessim.taskgraph.model import kernel_mix
from dessim.workload.transformer.passes import Step

__all__ = ["PassTimeline", "Segment", "pass_timeline"]


@dataclass(frozen=True)
class Segment:
    """One compute task of a merged pass: steps ``first..last`` (template indices)."""

    first: int
    last: int
    duration: float
    flops: float
    bytes: float
    model_flops: float
    tp_comm_s: float
    tp_exposed_s: float
    #: seconds of its kernels by device-model kernel kind (:attr:`TaskGraph.kernel_mix`)
    kernel_s: tuple[tuple[str, float], ...] = ()
    #: the intervals of ``tp_exposed_s``, seconds from the segment's start
    tp_exposed_iv: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class PassTimeline:
    """The merged pass: its segments, the TP time after the last compute (``tail``) and the
    start of its first TP collective relative to the pass start (``first_tp``)."""

    segments: tuple[Segment, ...]
    tail: float
    first_tp: float


def pass_timeline(steps: Sequence[Step], cuts: set[int], kernel_time: Callable[[object], float],
                  coll_time: Callable[[Step], float | None]) -> PassTimeline | None:
    """Replay ``steps`` from time 0 on idle streams; ``None`` if a step is not mergeable
    (anything but compute and closed-form collectives). ``cuts``: compute step indices that
    must end a segment (the last compute step always does)."""
    n = len(steps)
    end = [0.0] * n
    start = [0.0] * n
    free: dict[str, float] = {}
    comp_iv: list[tuple[float, float]] = []
    tp_iv: list[tuple[int, float, float]] = []
    ktimes: dict[int, list[float]] = {}
    for i, s in enumerate(steps):
        t0 = max([end[d] for d in s.deps] + [free.get(s.stream, 0.0)])
        if s.kind == "compute":
            ktimes[i] = [kernel_time(k) for k in s.kernels]
            dur = sum(ktimes[i])
        elif s.kind == "collective":
            got = coll_time(s)
            if got is None:
                return None
            dur = got
        else:
            return None
        start[i], end[i] = t0, t0 + dur
        free[s.stream] = end[i]
        if s.kind == "compute":
            comp_iv.append((t0, end[i]))
        else:
            tp_iv.append((i, t0, end[i]))
    computes = [i for i, s in enumerate(steps) if s.kind == "compute"]
    if not computes:
        return None
    bounds = sorted({c for c in cuts if c in set(computes)} | {computes[-1]})
    segs = []
    prev_end, prev_idx = 0.0, -1
    for b in bounds:
        members = [i for i in computes if prev_idx < i <= b]
        win = (prev_end, end[b])
        tp_in = [(max(a, win[0]), min(e, win[1])) for _, a, e in tp_iv if e > win[0] and a < win[1]]
        comm = length(union(tp_in))
        gaps = subtract(union(tp_in), union(comp_iv))
        segs.append(Segment(prev_idx + 1, b, end[b] - prev_end,
                            sum(k.flops for i in members for k in steps[i].kernels),
                            sum(k.bytes for i in members for k in steps[i].kernels),
                            sum(k.flops for i in members for k in steps[i].kernels if k.is_model_flops),
                            comm, length(gaps),
                            kernel_mix([k.device_kind for i in members for k in steps[i].kernels],
                                       [t for i in members for t in ktimes[i]]),
                            tuple((a - win[0], e - win[0]) for a, e in gaps)))
        prev_end, prev_idx = end[b], b
    last_tp = max((e for _, _, e in tp_iv), default=0.0)
    first_tp = min((a for _, a, _ in tp_iv), default=float("inf"))
    return PassTimeline(tuple(segs), max(0.0, last_tp - prev_end), first_tp)
