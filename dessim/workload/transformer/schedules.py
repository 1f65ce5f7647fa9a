"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward
passes over the micro-batches of an iteration.

A stage's program is a list of :class:`PipeOp` — ``(phase, micro_batch, chunk)`` with phase
``"F"`` (forward), ``"B"`` (backward) or ``"W"`` (weight gradient) and ``chunk`` the model
chunk of the stage (always 0 unless interleaved or bidirectional). A ``B`` is the whole
backward unless it is ``split``: then it computes only the input gradient (what the previous
stage waits for) and a later ``W`` of the same micro-batch and chunk computes the weight
gradients (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2). Every stage
sees the same micro-batches; what differs is the order:

``gpipe`` (Huang et al. 2019)
    All ``m`` forwards, then all ``m`` backwards, micro-batches in order.
``1f1b`` (PipeDream-Flush; Megatron-LM ``forward_backward_pipelining_without_interleaving``)
    ``w = min(p - s - 1, m)`` warm-up forwards on stage ``s``, then ``m - w`` pairs
    (forward, backward), then ``w`` cool-down backwards.
``interleaved`` (Narayanan et al. SC21; Megatron-LM ``forward_backward_pipelining_with_interleaving``)
    ``v`` chunks per stage; virtual micro-batch ``k`` (0 ≤ k < m·v) is micro-batch
    ``(k // (p·v))·p + k % p`` of chunk ``(k % (p·v)) // p`` for forwards and of chunk
    ``v - 1 - (k % (p·v)) // p`` for backwards. Warm-up: ``min(2(p - s - 1) + (v - 1)p, m·v)``
    forwards, then (forward ``w + i``, backward ``i``) pairs, then the remaining backwards —
    Megatron-LM's ``get_model_chunk_id`` and warm-up count. Needs ``m % p == 0``
    (:class:`~dessim.workload.transformer.layout.ParallelLayout` checks it). The chunks may
    hold different numbers of layers (``pipeline_layers``).
``zb-h1`` (Qi et al. 2024, §3.1, Fig. 3 top)
    1F1B with split backwards; stage ``s`` delays its W passes until ``s`` are pending, so
    every stage holds ``p`` micro-batches (1F1B's first-stage peak) and the delayed W passes
    fill the cool-down: bubble ``(p-1)(F + B - W)`` per stage, a third of 1F1B's
    ``(p-1)(F + B + W)`` when ``F = B = W``.
``zb-h2`` (Qi et al. 2024, §3.1, Fig. 3 bottom)
    ``2p - 1`` micro-batches in flight: extra warm-up forwards fill the wait for the first
    B, W passes move to the tail; with ``F = B = W`` and ``m >= 2p - 1`` no stage idles
    between its first and its last pass (:func:`_zb_h2_programs`).
``dualpipe`` (DeepSeek-AI 2024, DeepSeek-V3 Technical Report §3.2.1, Fig. 5; deepseek-ai/DualPipe)
    Stage ``s`` holds chunk 0 = pipeline piece ``s`` and chunk 1 = piece ``p - 1 - s``;
    micro-batches ``0..m/2-1`` run through the chunks 0 from stage 0 to ``p - 1`` and
    ``m/2..m-1`` through the chunks 1 from stage ``p - 1`` to 0. Eight steps per stage
    (warm-up forwards of both directions, zero-bubble B/W/F, the main phase of overlapped
    (F, B) pairs of opposite directions, B/B, W/B and final W passes; :func:`_dualpipe`).
    ``paired`` marks the second pass of an overlapped pair: the generator lets each pass's
    communication overlap the other's computation.

Chunk ``c`` of stage ``s`` is virtual stage ``c·p + s`` (global order of the model's layers,
:meth:`ParallelLayout.stage_layers`), so a forward activation flows from virtual stage ``j``
to ``j + 1`` — from stage ``p - 1`` chunk ``c`` back to stage 0 chunk ``c + 1`` when
interleaved — and gradients the other way; bidirectional: see :func:`next_virtual`.

With uniform stages, free communication and forward/backward times ``F`` and ``B`` per
stage (all chunks), these orders give the textbook bubbles (GPipe (Huang et al. 2019);
Narayanan et al. 2021, §2.2; docs/references.md): ``(p-1)(F+B)`` idle per stage out of
``(m+p-1)(F+B)`` for GPipe and 1F1B, and ``(p-1)(F+B)/v`` out of ``m(F+B) + (p-1)(F+B)/v``
interleaved. :func:`unit_timeline` times any schedule that way (the papers' diagrams);
tests/test_pipeline_schedules.py checks the diagrams tick by tick and the bubbles against
the closed forms.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from dessim.errors import WorkloadError
from dessim.workload.transformer.layout import SCHEDULES

__all__ = ["PipeOp", "TimedOp", "stage_program", "virtual_stage", "prev_virtual", "next_virtual",
           "unit_timeline", "unit_bubble", "peak_held", "diagram"]


class PipeOp(NamedTuple):
    """One pass of one micro-batch through one model chunk of a stage."""

    phase: str   #: "F" forward, "B" backward (input gradient), "W" weight gradient
    mb: int      #: micro-batch index, 0-based
    chunk: int   #: model chunk of the stage (0 unless interleaved or bidirectional)
    #: B only: the weight gradients are left to a later "W" op (zero-bubble split); a B
    #: without it is the whole backward (input and weight gradients)
    split: bool = False
    #: DualPipe: this pass runs as a pair with the previous one (F&B), each one's
    #: communication overlapped by the other's computation
    paired: bool = False


def _check(schedule: str, stage: int, p: int, m: int, v: int) -> None:
    if schedule not in SCHEDULES:
        raise WorkloadError(f"schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
    if not (p >= 1 and m >= 1 and v >= 1 and 0 <= stage < p):
        raise WorkloadError(f"pipeline schedule: need p, m, v >= 1 and 0 <= stage < p "
                            f"(got stage={stage}, p={p}, m={m}, v={v})")
    sched = SCHEDULES[schedule]
    if sched.interleaved and m % p:
        raise WorkloadError(f"interleaved schedule: micro-batches m={m} must be divisible by pp={p}")
    if sched.interleaved and v < 2:     # as ParallelLayout refuses it: v = 1 is no interleaving
        raise WorkloadError(f"interleaved schedule: needs v >= 2 model chunks per stage (got v={v}); "
                            "use '1f1b' for one chunk per stage")
    if not sched.interleaved and v != 1:
        raise WorkloadError(f"schedule {schedule!r} has one chunk per stage (got v={v})")
    if sched.bidirectional and (p % 2 or m % 2 or m < 2 * p):
        raise WorkloadError(f"schedule 'dualpipe': need an even p and an even m >= 2p (got p={p}, m={m})")


def _interleaved_op(k: int, p: int, v: int, forward: bool) -> PipeOp:
    group, within = divmod(k, p * v)
    chunk = within // p
    if not forward:
        chunk = v - 1 - chunk
    return PipeOp("F" if forward else "B", group * p + within % p, chunk)


def _one_f_one_b(stage: int, p: int, m: int) -> list[PipeOp]:
    warm = min(p - stage - 1, m)
    ops = [PipeOp("F", i, 0) for i in range(warm)]
    for i in range(m - warm):
        ops += [PipeOp("F", warm + i, 0), PipeOp("B", i, 0)]
    ops += [PipeOp("B", i, 0) for i in range(m - warm, m)]
    return ops


def _interleaved(stage: int, p: int, m: int, v: int) -> list[PipeOp]:
    total = m * v
    warm = min(2 * (p - stage - 1) + (v - 1) * p, total)
    ops = [_interleaved_op(k, p, v, True) for k in range(warm)]
    for i in range(total - warm):
        ops += [_interleaved_op(warm + i, p, v, True), _interleaved_op(i, p, v, False)]
    ops += [_interleaved_op(k, p, v, False) for k in range(total - warm, total)]
    return ops


def _zb_h1(stage: int, p: int, m: int) -> list[PipeOp]:
    """ZB-H1 (Qi et al. 2024, §3.1, Fig. 3 top): 1F1B's ``p - stage - 1`` warm-up forwards and
    (F, B) steps, the W of each B delayed until ``stage`` W passes are pending (so every
    stage holds the first stage's ``p`` micro-batches, 1F1B's peak), then the remaining B
    passes each followed by a W, then the delayed W passes, which fill the cool-down."""
    warm = min(p - stage - 1, m)
    ops = [PipeOp("F", i, 0) for i in range(warm)]
    pending: list[int] = []
    for i in range(m):
        if warm + i < m:
            ops.append(PipeOp("F", warm + i, 0))
        ops.append(PipeOp("B", i, 0, split=True))
        pending.append(i)
        if len(pending) > stage or warm + i >= m:
            ops.append(PipeOp("W", pending.pop(0), 0))
    return ops + [PipeOp("W", i, 0) for i in pending]


@lru_cache(maxsize=64)
def _zb_h2_programs(p: int, m: int) -> tuple[tuple[PipeOp, ...], ...]:
    """ZB-H2 (Qi et al. 2024, §3.1, Fig. 3 bottom), every stage's order at once: the passes
    placed on a unit-time grid (``F = B = W = 1``, free communication), each stage at every
    tick taking the first that is ready of: the next B, the next F if fewer than ``2p - 1``
    micro-batches are in flight (the schedule's memory bound, ``(2p-1)·M_B``), the oldest
    pending W. The extra warm-up forwards fill the wait for the first B and the W passes
    move to the tail, so with ``m >= 2p - 1`` every stage is busy without a gap from its
    first pass to its last: the paper's parallelogram (tests/test_pipeline_schedules.py)."""
    limit = 2 * p - 1
    done: dict[tuple[str, int, int], int] = {}
    nf, nb, held = [0] * p, [0] * p, [0] * p
    pending: list[list[int]] = [[] for _ in range(p)]
    programs: list[list[PipeOp]] = [[] for _ in range(p)]

    def ready(key: tuple[str, int, int], t: int) -> bool:
        return done.get(key, t + 1) <= t

    t = 0
    while any(nb[s] < m or pending[s] for s in range(p)):
        for s in range(p):
            k = nb[s]
            if k < m and ready(("B", s + 1, k) if s < p - 1 else ("F", s, k), t):
                programs[s].append(PipeOp("B", k, 0, split=True))
                done[("B", s, k)] = t + 1
                nb[s] += 1
                pending[s].append(k)
                continue
            k = nf[s]
            if k < m and held[s] < limit and (s == 0 or ready(("F", s - 1, k), t)):
                programs[s].append(PipeOp("F", k, 0))
                done[("F", s, k)] = t + 1
                nf[s] += 1
                held[s] += 1
                continue
            if pending[s]:
                programs[s].append(PipeOp("W", pending[s].pop(0), 0))
                held[s] -= 1
        t += 1
    return tuple(tuple(prog) for prog in programs)


def _dualpipe(stage: int, p: int, m: int) -> list[PipeOp]:
    """DualPipe (DeepSeek-AI 2024, §3.2.1, Fig. 5; the eight steps of ``DualPipe.step`` in
    deepseek-ai/DualPipe ``dualpipe/dualpipe.py``). ``phase`` 0 is the direction whose first
    half of the pipeline holds this stage (chunk 0 for the first ``p/2`` stages, chunk 1 for
    the others); micro-batches ``0..m/2-1`` enter at stage 0 (chunk 0) and ``m/2..m-1`` at
    stage ``p-1`` (chunk 1). Weight gradients of split backwards run in FIFO order."""
    half, h = p // 2, min(stage, p - 1 - stage)
    flip = 1 if stage >= half else 0
    middle = h == half - 1
    nf, nb = [0, 0], [0, 0]            # next forward / backward micro-batch per phase
    pending: list[tuple[int, int]] = []  # (mb, chunk) of split backwards, FIFO
    ops: list[PipeOp] = []

    def mb_of(phase: int, k: int) -> tuple[int, int]:
        chunk = phase ^ flip
        return k + chunk * (m // 2), chunk

    def f(phase: int, paired: bool = False) -> None:
        mb, chunk = mb_of(phase, nf[phase])
        nf[phase] += 1
        ops.append(PipeOp("F", mb, chunk, paired=paired))

    def b(phase: int, zb: bool = False, paired: bool = False) -> None:
        mb, chunk = mb_of(phase, nb[phase])
        nb[phase] += 1
        ops.append(PipeOp("B", mb, chunk, split=zb, paired=paired))
        if zb:
            pending.append((mb, chunk))

    def w() -> None:
        mb, chunk = pending.pop(0)
        ops.append(PipeOp("W", mb, chunk))

    for _ in range((half - h - 1) * 2):          # step 1: nF0
        f(0)
    for _ in range(h + 1):                        # step 2: nF0F1
        f(0)
        f(1)
    for _ in range(half - h - 1):                 # step 3: nB1W1F1 (zero bubble)
        b(1, zb=True)
        w()
        f(1)
    for i in range(m // 2 - p + h + 1):           # step 4: nF0B1F1B0 (overlapped pairs)
        f(0)
        b(1, paired=not (i == 0 and middle))     # the middle stage's first pair is not overlapped
        f(1)
        b(0, paired=True)
    for _ in range(half - h - 1):                 # step 5: nB1F1B0
        b(1)
        f(1)
        b(0, paired=True)
    zb = False
    for i in range(h + 1):                        # step 6: nB1B0, zero bubble from the middle on
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        b(1, zb=zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        b(0, zb=zb)
    for _ in range(half - h - 1):                 # step 7: nWB0 (zero bubble)
        w()
        b(0, zb=True)
    while pending:                                # step 8: nW
        w()
    return ops


def stage_program(schedule: str, stage: int, p: int, m: int, v: int = 1) -> list[PipeOp]:
    """The ordered passes of pipeline stage ``stage`` (see the module docstring)."""
    _check(schedule, stage, p, m, v)
    if schedule == "gpipe":
        return [PipeOp("F", i, 0) for i in range(m)] + [PipeOp("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b(stage, p, m)
    if schedule == "interleaved":
        return _interleaved(stage, p, m, v)
    if schedule == "zb-h1":
        return _zb_h1(stage, p, m)
    if schedule == "zb-h2":
        return list(_zb_h2_programs(p, m)[stage])
    return _dualpipe(stage, p, m)


# ---------------------------------------------------------------------- routes
def virtual_stage(stage: int, chunk: int, p: int, bidirectional: bool = False) -> int:
    """Global position of chunk ``chunk`` of stage ``stage``: ``chunk·p + stage``; with a
    bidirectional schedule ``chunk·p`` plus the position in its direction (``stage`` for
    chunk 0, ``p - 1 - stage`` for chunk 1)."""
    if bidirectional and chunk == 1:
        return p + p - 1 - stage
    return chunk * p + stage


def next_virtual(stage: int, chunk: int, p: int, v: int,
                 bidirectional: bool = False) -> tuple[int, int] | None:
    """(stage, chunk) that receives this chunk's forward output; None for the last one."""
    if bidirectional:
        nxt = stage + 1 if chunk == 0 else stage - 1
        return (nxt, chunk) if 0 <= nxt < p else None
    j = virtual_stage(stage, chunk, p) + 1
    return None if j >= p * v else (j % p, j // p)


def prev_virtual(stage: int, chunk: int, p: int,
                 bidirectional: bool = False) -> tuple[int, int] | None:
    """(stage, chunk) whose forward output this chunk consumes; None for the first one."""
    if bidirectional:
        prv = stage - 1 if chunk == 0 else stage + 1
        return (prv, chunk) if 0 <= prv < p else None
    j = virtual_stage(stage, chunk, p) - 1
    return None if j < 0 else (j % p, j // p)


# ---------------------------------------------------------------------- analysis
class TimedOp(NamedTuple):
    """A pass on the unit-time timeline of :func:`unit_timeline`."""

    stage: int
    op: PipeOp
    start: float
    end: float


def _input_key(stage: int, op: PipeOp, p: int, v: int, bi: bool) -> tuple[str, int, int, int] | None:
    """The pass whose end ``op`` waits for: (phase, stage, chunk, micro-batch), or None."""
    if op.phase == "F":
        src = prev_virtual(stage, op.chunk, p, bi)
        return None if src is None else ("F", src[0], src[1], op.mb)
    if op.phase == "B":
        src = next_virtual(stage, op.chunk, p, v, bi)
        return ("F", stage, op.chunk, op.mb) if src is None else ("B", src[0], src[1], op.mb)
    return ("B", stage, op.chunk, op.mb)


def unit_timeline(schedule: str, p: int, m: int, v: int = 1, *, f: float = 1.0, b: float = 1.0,
                  w: float = 1.0) -> list[list[TimedOp]]:
    """Every stage's passes timed as the papers draw them: free communication, forward
    ``f``, input-gradient ``b`` and weight-gradient ``w`` time per chunk (a whole backward
    takes ``b + w``); a pass starts when its stage has finished the previous one and its
    input is ready (forward: the previous virtual stage's forward of the micro-batch;
    backward: the next virtual stage's backward, or its own forward on the last; W: its B);
    the first pass of a DualPipe pair also waits for the second's input (DualPipe receives
    both, then computes the pair).
    Times are in units of the caller's choice (seconds in the generator's sense)."""
    bi = SCHEDULES[schedule].bidirectional if schedule in SCHEDULES else False
    programs = [stage_program(schedule, s, p, m, v) for s in range(p)]
    done: dict[tuple[str, int, int, int], float] = {}   # (phase, stage, chunk, mb) -> end
    out: list[list[TimedOp]] = [[] for _ in range(p)]
    pos, free = [0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while pos[s] < len(programs[s]):
                op = programs[s][pos[s]]
                key = _input_key(s, op, p, v, bi)
                length = {"F": f, "W": w}.get(op.phase, b if op.split else b + w)
                if key is not None and key not in done:
                    break
                start = max(free[s], done[key] if key is not None else 0.0)
                follow = programs[s][pos[s] + 1] if pos[s] + 1 < len(programs[s]) else None
                if follow is not None and follow.paired:   # a pair starts when both inputs are there
                    other = _input_key(s, follow, p, v, bi)
                    if other is not None and other not in done:
                        break
                    start = max(start, done[other] if other is not None else 0.0)
                free[s] = start + length
                done[(op.phase, s, op.chunk, op.mb)] = free[s]
                out[s].append(TimedOp(s, op, start, free[s]))
                pos[s] += 1
                progress = True
    stuck = [s for s in range(p) if pos[s] < len(programs[s])]
    if stuck:  # pragma: no cover - every schedule here is deadlock-free (tests/test_pipeline_schedules.py)
        raise AssertionError(f"schedule {schedule!r} deadlocks on stages {stuck}")
    return out


def unit_bubble(schedule: str, p: int, m: int, v: int = 1, **times: float) -> float:
    """Idle time over busy time of :func:`unit_timeline` — the papers' bubble relative to the
    ideal time: the window from the first pass's start to the last pass's end on any stage,
    times ``p``, minus the busy time, over the busy time."""
    tl = unit_timeline(schedule, p, m, v, **times)
    lo = min(t.start for row in tl for t in row)
    hi = max(t.end for row in tl for t in row)
    busy = sum(t.end - t.start for row in tl for t in row)
    return (p * (hi - lo) - busy) / busy


@lru_cache(maxsize=4096)
def peak_held(schedule: str, stage: int, p: int, m: int, v: int = 1,
              weights: tuple[float, ...] | None = None) -> float:
    """Peak activations stage ``stage`` holds along its pass order, in micro-batches through
    all its layers: a forward of chunk ``c`` adds ``weights[c]`` (default: equal chunks) and
    the pass that completes the chunk's backward — the whole backward, or the W of a split
    one — frees it (the input-gradient pass of a split backward frees only part of a layer's
    activations, Qi et al. 2024 Table 1; counted as held until W, an upper bound)."""
    program = stage_program(schedule, stage, p, m, v)
    chunks = 1 + max(op.chunk for op in program)
    weights = weights or tuple(1.0 for _ in range(chunks))
    held = peak = 0.0
    for op in program:
        if op.phase == "F":
            held += weights[op.chunk]
            peak = max(peak, held)
        elif op.phase == "W" or not op.split:
            held -= weights[op.chunk]
    return peak / sum(weights)


def diagram(schedule: str, p: int, m: int, v: int = 1, *, f: int = 1, b: int = 1, w: int = 1) -> list[str]:
    """The papers' schedule diagram as text, one line per stage and one cell per time unit of
    :func:`unit_timeline` (whole-number pass times): ``F3`` is the forward of micro-batch 3
    (1-based, as the papers number them), ``B`` the backward (input gradient when split),
    ``W`` the weight gradient, a ``'`` per chunk after the first (interleaved: model chunk,
    DualPipe: the reverse direction), ``.`` idle. Cells are space-separated."""
    rows = []
    for row in unit_timeline(schedule, p, m, v, f=f, b=b, w=w):
        cells: list[str] = []
        for t in row:
            cells += ["."] * (int(t.start) - len(cells))
            cells += [f"{t.op.phase}{t.op.mb + 1}{chr(39) * t.op.chunk}"] * int(t.end - t.start)
        rows.append(" ".join(cells))
    return rows
