"""Pieces of data-parallel training shared by every task-graph generator (the transformer
generator of :mod:`dessim.workload.transformer.generator` and the DLRM / CNN generators): how gradients
are packed into buckets.

Gradient buckets (PyTorch DDP / Megatron-LM ``overlap_grad_reduce``)
    Gradients become ready block by block in backward order. Each reduction group kind (e.g.
    ``dp_cp`` for dense weights and ``edp`` for expert weights, or just ``dp``) has its
    own bucket; a block's gradient bytes are added to it, and as soon as it holds at least
    ``limit`` bytes it is reduced — right after the block that filled it, so the reduction
    overlaps the rest of the backward. What is left is reduced after the last block, group
    kinds in the order given. ``limit = 0``: one reduction per group kind after the last
    block. PyTorch's default bucket is 25 MiB (``bucket_cap_mb=25``, DDP documentation):
    :data:`DEFAULT_BUCKET_SIZE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from dessim.errors import WorkloadError

__all__ = ["Bucket", "fill_buckets", "DEFAULT_GROUPS", "DEFAULT_BUCKET_SIZE"]

#: Gradient bucket size: PyTorch DDP's default ``bucket_cap_mb=25`` (MiB).
DEFAULT_BUCKET_SIZE: int = 25 * 2**20

#: Group kinds when a generator has a single data-parallel group.
DEFAULT_GROUPS: tuple[str, ...] = ("dp",)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One gradient reduction: ``nbytes`` of group kind ``group``, issued when block
    ``after`` (a block name of the input) is done."""

    group: str
    nbytes: float
    after: str


def fill_buckets(blocks: Iterable[tuple[str, Mapping[str, float]]], limit: float,
                 groups: Sequence[str] = DEFAULT_GROUPS) -> list[Bucket]:
    """Buckets of the gradients of ``blocks`` — ``(block name, {group kind: gradient bytes})``
    in the order the backward finishes them — with bucket size ``limit`` bytes (module
    docstring). Group kinds missing from a block's mapping contribute 0 bytes."""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
        raise WorkloadError(f"bucket size {limit!r} must be a number of bytes >= 0 (0: no bucketing)")
    pending = {g: 0.0 for g in groups}
    out: list[Bucket] = []
    last = None
    for name, grads in blocks:
        last = name
        for g in groups:
            pending[g] += float(grads.get(g, 0.0))
            if limit and pending[g] >= limit:
                out.append(Bucket(g, pending[g], name))
                pending[g] = 0.0
    if last is not None:
        for g in groups:
            if pending[g] > 0:
                out.append(Bucket(g, pending[g], last))
    return out
