"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward
passes over the micro-batches of an iteration.

A stage's program is a list of :class:`PipeOp` — ``(phase, micro_batch, chunk)`` with phase
``"F"`` (forward) or ``"B"`` (backward) and ``chunk`` the model chunk of the stage (always 0
unless interleaved). Every stage sees the same micro-batches; what differs is the order:

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
    (:class:`~dessim.workload.transformer.layout.ParallelLayout` checks it).

Chunk ``c`` of stage ``s`` is virtual stage ``c·p + s`` (global order of the model's layers,
:meth:`ParallelLayout.stage_layers`), so a forward activation flows from virtual stage ``j``
to ``j + 1`` — from stage ``p - 1`` chunk ``c`` back to stage 0 chunk ``c + 1`` when
interleaved — and gradients the other way.

With uniform stages, free communication and forward/backward times ``F`` and ``B`` per
stage (all chunks), these orders give the textbook bubbles (GPipe (Huang et al. 2019);
Narayanan et al. 2021, §2.2; docs/references.md): ``(p-1)(F+B)`` idle per stage out of
``(m+p-1)(F+B)`` for GPipe and 1F1B, and ``(p-1)(F+B)/v`` out of ``m(F+B) + (p-1)(F+B)/v``
interleaved.
"""

from __future__ import annotations

from typing import NamedTuple

from dessim.errors import WorkloadError
from dessim.workload.transformer.layout import SCHEDULES

__all__ = ["PipeOp", "stage_program", "virtual_stage", "prev_virtual", "next_virtual"]


class PipeOp(NamedTuple):
    """One pass of one micro-batch through one model chunk of a stage."""

    phase: str   #: "F" forward, "B" backward
    mb: int      #: micro-batch index, 0-based
    chunk: int   #: model chunk of the stage (0 unless interleaved)


def _check(schedule: str, stage: int, p: int, m: int, v: int) -> None:
    if schedule not in SCHEDULES:
        raise WorkloadError(f"schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
    if not (p >= 1 and m >= 1 and v >= 1 and 0 <= stage < p):
        raise WorkloadError(f"pipeline schedule: need p, m, v >= 1 and 0 <= stage < p "
                            f"(got stage={stage}, p={p}, m={m}, v={v})")
    if SCHEDULES[schedule].interleaved and m % p:
        raise WorkloadError(f"interleaved schedule: micro-batches m={m} must be divisible by pp={p}")
    if not SCHEDULES[schedule].interleaved and v != 1:
        raise WorkloadError(f"schedule {schedule!r} has one chunk per stage (got v={v})")


def _interleaved_op(k: int, p: int, v: int, forward: bool) -> PipeOp:
    group, within = divmod(k, p * v)
    chunk = within // p
    if not forward:
        chunk = v - 1 - chunk
    return PipeOp("F" if forward else "B", group * p + within % p, chunk)


def stage_program(schedule: str, stage: int, p: int, m: int, v: int = 1) -> list[PipeOp]:
    """The ordered passes of pipeline stage ``stage`` (see the module docstring)."""
    _check(schedule, stage, p, m, v)
    if schedule == "gpipe":
        return [PipeOp("F", i, 0) for i in range(m)] + [PipeOp("B", i, 0) for i in range(m)]
    if not SCHEDULES[schedule].interleaved:
        warm = min(p - stage - 1, m)
        ops = [PipeOp("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            ops += [PipeOp("F", warm + i, 0), PipeOp("B", i, 0)]
        ops += [PipeOp("B", i, 0) for i in range(m - warm, m)]
        return ops
    total = m * v
    warm = min(2 * (p - stage - 1) + (v - 1) * p, total)
    ops = [_interleaved_op(k, p, v, True) for k in range(warm)]
    for i in range(total - warm):
        ops += [_interleaved_op(warm + i, p, v, True), _interleaved_op(i, p, v, False)]
    ops += [_interleaved_op(k, p, v, False) for k in range(total - warm, total)]
    return ops


def virtual_stage(stage: int, chunk: int, p: int) -> int:
    """Global position of chunk ``chunk`` of stage ``stage``: ``chunk·p + stage``."""
    return chunk * p + stage


def next_virtual(stage: int, chunk: int, p: int, v: int) -> tuple[int, int] | None:
    """(stage, chunk) that receives this chunk's forward output; None for the last one."""
    j = virtual_stage(stage, chunk, p) + 1
    return None if j >= p * v else (j % p, j // p)


def prev_virtual(stage: int, chunk: int, p: int) -> tuple[int, int] | None:
    """(stage, chunk) whose forward output this chunk consumes; None for the first one."""
    j = virtual_stage(stage, chunk, p) - 1
    return None if j < 0 else (j % p, j // p)
