"""Replica folding: a task graph that holds only representative ranks (issue 9).

In a data-parallel training job the ``dp`` replicas, and inside a replica the ``tp`` ranks of
a tensor-parallel group, run the same program: the same compute tasks, and communication
that is the same up to a renaming of ranks. A *folded* task graph keeps the tasks of one
representative rank per orbit and a :class:`Fold`: ``L`` permutations of the ranks
(``perm[k, r]`` is the image of rank ``r`` in lane ``k``; lane 0 is the identity) under
which the whole program is invariant.

The engine replays a folded graph as follows (:mod:`dessim.engine.engine`):

* compute tasks run once, on the representative — their images would run the same tasks at
  the same times;
* a send ``r -> q`` moves its bytes on every lane: ``perm[k, r] -> perm[k, q]`` for all ``k``
  (all of them real flows that share the network with everything else); both tasks end
  when the last lane's transfer ends;
* a memcpy of ``r`` moves its bytes on every lane, between ``perm[k, r]``'s GPU and that
  image's own memory node (its nearest of the kind; :mod:`dessim.engine.memlanes`); the
  task ends when the last lane's copy ends;
* a collective over ``group`` runs on every distinct image of the group
  (:meth:`Fold.instances`) — e.g. the DP all-reduce of TP rank 0 stands for the DP
  all-reduces of all TP ranks; a representative's task ends when its last image's part ends.

So all traffic of the unfolded run is on the network; what is folded away is the compute and
the per-rank bookkeeping. The result is *exact* when the lanes stay in step — when every
image of a transfer or collective finishes at the same time, which holds when the network
treats the lanes symmetrically (e.g. each lane on its own rail, or on channels that only it
uses). When it does not (ECMP collisions that hit some lanes and not others), the folded run
synchronises the lanes at each transfer — each waits for the slowest — and the engine
reports the largest lane skew it saw (``SimulationResult.meta["fold"]``) so that the
approximation is visible; rerun unfolded for the exact figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dessim.errors import TaskGraphError

__all__ = ["Fold"]


@dataclass(frozen=True, eq=False)
class Fold:
    """``perm``: an ``(L, n)`` integer array, each row a permutation of ``0..n-1``, row 0 the
    identity. ``dims``: what the lanes stand for (documentation, e.g. ``("tp", "dp")``)."""

    perm: np.ndarray
    dims: tuple[str, ...] = ()
    _instances: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _inverse: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _orbit_table: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        perm = np.asarray(self.perm)
        if perm.ndim != 2 or perm.shape[0] < 1 or perm.shape[1] < 1:
            raise TaskGraphError(f"fold: perm must be a non-empty 2-D array (lanes × ranks), got shape {perm.shape}")
        if not np.issubdtype(perm.dtype, np.integer):
            raise TaskGraphError(f"fold: perm must hold integer ranks, got dtype {perm.dtype}")
        n = perm.shape[1]
        ident = np.arange(n)
        if not np.array_equal(perm[0], ident):
            raise TaskGraphError("fold: lane 0 must be the identity permutation")
        # a row is a permutation of 0..n-1 when its values lie in range and every value is hit
        # (O(L·n); a sort of every row was O(L·n·log n): 0.5 s at 1,024 lanes × 16,384 ranks)
        inside = (perm.min(axis=1) >= 0) & (perm.max(axis=1) < n)
        hit = np.zeros(perm.shape, dtype=bool)
        lanes = np.flatnonzero(inside)
        hit[lanes[:, None], perm if len(lanes) == len(perm) else perm[lanes]] = True
        bad = np.flatnonzero(~inside | ~hit.all(axis=1))
        if len(bad):
            raise TaskGraphError(f"fold: lane {int(bad[0])} is not a permutation of ranks 0..{n - 1}")
        perm = perm.astype(np.int64, copy=False)
        perm.setflags(write=False)
        object.__setattr__(self, "perm", perm)
        object.__setattr__(self, "dims", tuple(self.dims))

    @property
    def lanes(self) -> int:
        """How many images each representative stands for (itself included)."""
        return int(self.perm.shape[0])

    @property
    def num_ranks(self) -> int:
        return int(self.perm.shape[1])

    def images(self, rank: int) -> list[int]:
        """``[perm[k, rank] for every lane k]`` (lane order; lane 0 is ``rank`` itself)."""
        return self.perm[:, rank].tolist()

    def instances(self, group: Sequence[int]) -> tuple[list[tuple[int, ...]], dict[int, list[tuple[int, int]]]]:
        """The distinct images of ``group`` and, for each member, where its images land.

        Returns ``(instances, where)``: ``instances`` lists the distinct image groups (member
        order mapped lane-wise; the first one is ``group`` itself) and ``where[r]`` lists the
        ``(instance index, image rank)`` pairs of member ``r`` — each image once. Cached."""
        key = tuple(group)
        got = self._instances.get(key)
        if got is not None:
            return got
        imgs = self.perm[:, list(key)]                       # (L, |group|)
        index: dict[frozenset, int] = {}
        instances: list[tuple[int, ...]] = []
        lane_inst: list[int] = []
        for row in imgs.tolist():
            s = frozenset(row)
            i = index.get(s)
            if i is None:
                i = index[s] = len(instances)
                instances.append(tuple(row))
            lane_inst.append(i)
        where: dict[int, list[tuple[int, int]]] = {}
        for r, images in zip(key, imgs.T.tolist()):     # member r's image in each lane
            seen: set[tuple[int, int]] = set()
            pairs = []
            for i, image in zip(lane_inst, images):
                pair = (i, image)
                if pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
            where[r] = pairs
        got = (instances, where)
        self._instances[key] = got
        return got

    def canonical_pair(self, src: int, dst: int) -> tuple[int, int]:
        """The pair ``(src, dst)`` carried by the lane that maps the smallest rank of
        ``src``'s orbit onto ``src``, backwards: ``(m, perm[k]⁻¹[dst])``. Images of one
        pair under any lane have the same canonical pair (lanes acting freely, as
        :meth:`check_representatives` demands), so a send ``r -> q`` and its recv match
        even when the recv is held by the representative of ``q``'s orbit as the image of
        another pair — a ring exchange inside one orbit (context parallelism: the recv of
        ``r`` from its previous rank is the image of the recv of ``q`` from ``r``)."""
        lane_of, orbit_min = self._orbits()
        k = int(lane_of[src])
        if k <= 0:           # a representative (or lanes that are not a group: as given)
            return src, dst
        inv = self._inverse.get(k)
        if inv is None:
            inv = self._inverse[k] = np.argsort(self.perm[k])
        return int(orbit_min[src]), int(inv[dst])

    def _orbits(self) -> tuple[np.ndarray, np.ndarray]:
        """Per rank: its orbit's smallest rank ``m`` and the first lane ``k`` with
        ``perm[k, m]`` = the rank. Cached."""
        if self._orbit_table is None:
            perm = self.perm
            orbit_min = perm.min(axis=0)          # lanes form a group: the orbit's smallest rank
            mins = np.flatnonzero(orbit_min == np.arange(self.num_ranks))
            lane_of = np.full(self.num_ranks, -1, dtype=np.int64)
            for k in range(self.lanes - 1, -1, -1):        # the first lane wins
                lane_of[perm[k, mins]] = k
            object.__setattr__(self, "_orbit_table", (lane_of, orbit_min))
        return self._orbit_table

    def check_representatives(self, ranks: Sequence[int]) -> None:
        """Raise unless no two of ``ranks`` (the ranks that hold tasks) share an orbit: every
        rank of the unfolded run must be simulated exactly once."""
        ranks = sorted(set(ranks))
        if not ranks:
            return
        if ranks[-1] >= self.num_ranks:
            raise TaskGraphError(f"fold: task rank {ranks[-1]} is outside the fold's {self.num_ranks} ranks")
        imgs = self.perm[:, ranks]
        flat = imgs.ravel()
        uniq, first, counts = np.unique(flat, return_index=True, return_counts=True)
        if len(uniq) != len(flat):
            # name the offender: a rank two representatives (or two lanes) both map to
            dup = int(uniq[np.flatnonzero(counts > 1)[0]])
            owners = sorted({ranks[c] for c in np.flatnonzero((imgs == dup).any(axis=0))})
            raise TaskGraphError(f"fold: rank {dup} is an image of more than one simulated task "
                                 f"rank / lane (representatives {owners}); folded graphs must hold "
                                 "one representative per orbit and lanes that act freely")

    def to_dict(self) -> dict:
        return {"dims": list(self.dims), "perm": self.perm.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "Fold":
        if not isinstance(d, dict) or "perm" not in d:
            raise TaskGraphError("fold: expected an object with 'perm' (and optional 'dims')")
        extra = set(d) - {"perm", "dims"}
        if extra:
            raise TaskGraphError(f"fold: unknown key(s) {sorted(extra)}; valid: dims, perm")
        try:
            perm = np.asarray(d["perm"], dtype=np.int64)
        except (TypeError, ValueError):
            raise TaskGraphError("fold: perm must be a list of equal-length integer lists") from None
        return cls(perm, tuple(d.get("dims", ())))
