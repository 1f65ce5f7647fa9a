"""Recursive doubling / halving on 2^k ranks, with the standard fold for other group sizes.

Fold (MPICH, Thakur–Rabenseifner–Gropp 2005; docs/references.md): with ``p' = 2^⌊lg p⌋``
and ``r = p - p'``, among the first ``2r`` ranks the even ones are *extra*: each first hands
its data to the next (odd) rank, the ``p'`` *core* ranks run the power-of-two algorithm —
a core rank with an extra partner is responsible for both ranks' blocks — and finally each
partner sends the extra rank its result.

Exchanges move whole sets of blocks, so every byte count follows from how many blocks a core
rank's half of the group owns. Reduce-scatter and all-gather keep one block of ``size / p``
per rank (a core rank with an extra partner holds two, as MPICH's ``newcnts``); all-reduce
splits the vector into ``p'`` equal parts of ``size / p'``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dessim.collectives.schedule import Lane


@dataclass(frozen=True)
class Fold:
    """Core ranks, their extra partners and block counts for a group order."""

    core: tuple[int, ...]
    extra_of: dict[int, int]           #: core rank -> its extra rank
    blocks: tuple[int, ...]            #: blocks each core position is responsible for

    @classmethod
    def of(cls, order: tuple[int, ...]) -> "Fold":
        p = len(order)
        r = p - (1 << (p.bit_length() - 1))
        core, extra_of = [], {}
        for i, rank in enumerate(order):
            if i < 2 * r and i % 2 == 0:
                extra_of[order[i + 1]] = rank
            else:
                core.append(rank)
        return cls(tuple(core), extra_of, tuple(2 if c in extra_of else 1 for c in core))

    def uniform(self) -> "Fold":
        """The same fold with one block per core rank (all-reduce splits the vector into
        ``p'`` equal parts; only reduce-scatter keeps the per-rank blocks)."""
        return Fold(self.core, self.extra_of, (1,) * len(self.core))

    def span(self, start: int, length: int) -> int:
        """Blocks owned by core positions ``start .. start+length-1``."""
        return sum(self.blocks[start:start + length])


def fold_in(lane: Lane, fold: Fold, nbytes: float, reduce: bool) -> None:
    """Extra ranks hand ``nbytes`` to their core partner (reduced there if ``reduce``)."""
    if fold.extra_of:
        lane.step((e, c, nbytes, nbytes if reduce else 0.0) for c, e in fold.extra_of.items())


def fold_out(lane: Lane, fold: Fold, nbytes: float) -> None:
    """Core partners send ``nbytes`` of result to their extra rank."""
    if fold.extra_of:
        lane.step((c, e, nbytes, 0.0) for c, e in fold.extra_of.items())


def doubling_full(lane: Lane, fold: Fold, nbytes: float, reduce: bool) -> None:
    """Recursive doubling exchanging the whole buffer each step (all-reduce, short msgs)."""
    core, q = fold.core, len(fold.core)
    d = 1
    while d < q:
        lane.step((core[j], core[j ^ d], nbytes, nbytes if reduce else 0.0) for j in range(q))
        d <<= 1


def halving_scatter(lane: Lane, fold: Fold, block: float) -> None:
    """Recursive halving reduce-scatter: distance q/2, q/4, ..., 1; each rank sends the
    blocks its partner's half is responsible for and reduces what it receives."""
    core, q = fold.core, len(fold.core)
    d = q >> 1
    while d >= 1:
        sends = []
        for j in range(q):
            partner = j ^ d
            n = fold.span(partner & ~(d - 1), d) * block
            sends.append((core[j], core[partner], n, n))
        lane.step(sends)
        d >>= 1


def doubling_gather(lane: Lane, fold: Fold, block: float) -> None:
    """Recursive doubling all-gather: distance 1, 2, ..., q/2; each rank sends every block
    its aligned group of ``d`` core ranks holds."""
    core, q = fold.core, len(fold.core)
    d = 1
    while d < q:
        lane.step((core[j], core[j ^ d], fold.span(j & ~(d - 1), d) * block, 0.0)
                  for j in range(q))
        d <<= 1


def allgather(lane: Lane, group: tuple[int, ...], size: float) -> None:
    """Recursive-doubling all-gather of ``size`` (whole array) with the fold."""
    fold, block = Fold.of(group), size / len(group)
    fold_in(lane, fold, block, reduce=False)
    doubling_gather(lane, fold, block)
    fold_out(lane, fold, size - block)
