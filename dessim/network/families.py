"""Lane families: one flow that stands for its images in the other lanes of a folded run.

A folded task graph (:class:`~dessim.taskgraph.Fold`) simulates one representative rank per
orbit; every transfer it makes has an *image* in each other lane — the same transfer between
the lane's images of its endpoints. Without families the engine starts every image as its
own flow. A :class:`LaneFamily` lets it start ONE flow instead, on the union of the images'
routes (:meth:`dessim.network.base.Network.family_route`): every image channel carries the
flow's rate, so each channel is loaded exactly as the separate images would load it —
provided every image moves at the representative's rate.

That proviso is what the flow model *certifies* at every rate solve rather than assumes
(:class:`dessim.network.flow.FlowNetwork` with families): the max-min allocation is unique,
and a feasible allocation is the max-min one iff every flow has a bottleneck — a saturated
channel on which no flow is faster (Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5;
"Max-min bottleneck" in docs/references.md). The family flow's
rates are feasible by construction (image channels are real channels with their true load);
so if, after a solve, EVERY image route of every family flow has a bottleneck, giving every
image the family's rate is the max-min allocation of the unfolded network — the run is
exact. If some image lacks one (the lanes are not symmetric: ECMP hashes that collide for
some lanes only, unequal links), the solve raises :class:`QuotientBroken` and the engine
replays the graph without families. The images must also agree on what the flow model
charges before the flow shares bandwidth: equal route latency (checked here) and, for
collectives, equal protocol software latency (checked by the executor).

Images of one family may share a channel — the images of a cross-leaf send all climb the
leaf's uplinks: the family's route then lists that channel once per image, and the max-min
system loads it with the family's rate that many times (:class:`~dessim.network.maxmin.Variable`
``mult``), exactly what the separate images would put on it.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dessim.errors import NetworkError

__all__ = ["ComposedLaneFamily", "LaneFamily", "QuotientBroken"]


class QuotientBroken(NetworkError):
    """A lane family cannot stand for its images exactly (raised during a run; the engine
    then replays without families and says why)."""


@dataclass(frozen=True, eq=False)
class LaneFamily:
    """The other lanes' images of transfers started with this family.

    ``perms[i]`` maps every global rank to its image in image ``i`` (an integer array over
    all ranks: a lane of the fold), ``key_offsets[i]`` is added to the ECMP key of the
    image (a collective's images run on other communicators, whose connections have other
    key bases). The representative's own transfer is not listed."""

    perms: tuple[np.ndarray, ...]
    key_offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.perms) != len(self.key_offsets) or not self.perms:
            raise NetworkError(f"lane family: {len(self.perms)} rank maps for "
                               f"{len(self.key_offsets)} key offsets (need >= 1, equal counts)")

    def __len__(self) -> int:
        """Images besides the representative."""
        return len(self.perms)

    def images(self, src: int, dst: int, key: int) -> list[tuple[int, int, int]]:
        """``(source, destination, ECMP key)`` of every image of ``src -> dst`` (ranks)."""
        return [(int(p[src]), int(p[dst]), key + off) for p, off in zip(self.perms, self.key_offsets)]

    @classmethod
    def of_lanes(cls, perm: np.ndarray, lanes: Sequence[int],
                 key_offsets: Sequence[int] | None = None) -> "LaneFamily":
        """The family of lanes ``lanes`` of a fold's ``perm`` (rows: lanes), with the given key
        offsets (default 0: images keep the key)."""
        offs = tuple(int(k) for k in key_offsets) if key_offsets is not None else (0,) * len(lanes)
        return cls(tuple(perm[k] for k in lanes), offs)


class _ComposedMaps(SequenceABC):
    """The maps ``lanes[n][syms[k]]`` for every ``(n, k)`` in n-major order but ``(0, 0)``,
    each built only when asked for."""

    def __init__(self, lanes: tuple[np.ndarray, ...], syms: tuple[np.ndarray, ...]) -> None:
        self.lanes, self.syms = lanes, syms

    def __len__(self) -> int:
        return len(self.lanes) * len(self.syms) - 1

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if not -len(self) <= j < len(self):
            raise IndexError(j)
        n, k = divmod(j % len(self) + 1, len(self.syms))
        return self.lanes[n][self.syms[k]]


@dataclass(frozen=True, eq=False)
class ComposedLaneFamily(LaneFamily):
    """A :class:`LaneFamily` whose maps are compositions: image ``(n, k)`` of a transfer
    leaving rank ``r`` leaves ``lanes[n][syms[k][r]]`` — a symmetry's map, then a lane —,
    for every ``(n, k)`` in n-major order except ``(0, 0)`` (the representative: ``lanes[0]``
    and ``syms[0]`` are identities), with ``lanes[n]``'s key offset. The same images as the
    family of the composed maps ``lanes[n][syms[k]]``, kept as their factors: a
    collective's orbit family (8 lanes x 128 rotations of 16,384-rank maps on the CP
    preset) was 1,023 arrays of 128 KiB each, of which :meth:`images` reads two entries."""

    lanes: tuple[np.ndarray, ...] = ()
    syms: tuple[np.ndarray, ...] = ()

    @classmethod
    def compose(cls, lanes: Sequence[np.ndarray], lane_offsets: Sequence[int],
                syms: Sequence[np.ndarray]) -> "ComposedLaneFamily":
        """The family of ``lanes`` (each with its key offset) after the maps ``syms``."""
        lanes, syms = tuple(lanes), tuple(syms)
        offs = tuple(off for n, off in enumerate(lane_offsets) for k in range(len(syms)) if n or k)
        return cls(_ComposedMaps(lanes, syms), offs, lanes, syms)

    def images(self, src: int, dst: int, key: int) -> list[tuple[int, int, int]]:
        """:meth:`LaneFamily.images`, reading each factor at the entries it needs."""
        at_src = np.array([m[src] for m in self.syms], dtype=np.int64)
        at_dst = np.array([m[dst] for m in self.syms], dtype=np.int64)
        a = np.concatenate([lane[at_src] for lane in self.lanes])[1:].tolist()
        b = np.concatenate([lane[at_dst] for lane in self.lanes])[1:].tolist()
        return [(x, y, key + off) for x, y, off in zip(a, b, self.key_offsets)]
