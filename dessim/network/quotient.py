"""The channel quotient: one max-min constraint per block of channels no route tells apart.

A lane family's flow (:mod:`dessim.network.families`) crosses the channels of all its images
— 512 channels for a cross-host send of mixtral's 64-image families on 256 GPUs — so its
rate solves, joins and removals cost as much as the images' separate flows would. Yet the
constraints it writes are mostly copies of each other: every image channel of a symmetric
family carries the same flows with the same coefficients.

Max-min fairness depends on the feasible set only (a flow cannot gain without taking from a
flow whose rate is not larger), and two channels of equal capacity whose constraint rows
``sum_f n_f(c) * r_f <= cap_c`` are equal (every flow crosses both equally often, ``n_f``
counting a family's images) are one constraint written twice. Dropping the copy changes
neither the feasible set nor the max-min allocation, nor any channel's load or its fastest
flow — so the family certificate reads a channel's figures from its block.

:class:`ChannelQuotient` keeps a partition of the channels into *blocks* such that every
route seen so far crosses all channels of a block equally often (and they have one
capacity): the coarsest such partition, refined route by route (partition refinement).
No symmetry is assumed, so nothing needs certifying and nothing is refused: a route that
treats two channels of a block differently splits it, and where lanes are automorphisms of
the topology and routes lane-equivariant (destination routing, docs/network.md), a family's
images never do — every channel orbit of the lane group stays inside one block, so a family
flow crosses a handful of blocks. A flow then becomes a max-min variable on its blocks, each
with a weight, the number of its crossings of each channel of the block
(:class:`QuotientRoute`).

Blocks are numbered like channels, so the max-min system treats them as constraints: a block
first formed from channels no route had crossed takes the id of its first channel; a block
split off an older one a new id past the channels (with the block's capacity). A split never
changes a rate or a load (the parts are copies of one constraint): the caller moves the flows
on the split block to the parts (:meth:`dessim.network.maxmin.MaxMinSystem.split`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dessim.network.base import FamilyRoute, Route

__all__ = ["ChannelQuotient", "QuotientRoute"]

#: Bound on the cached quotient routes (cleared when full; recomputed on demand).
_MAX_CACHED = 200_000


@dataclass(frozen=True, eq=False)
class QuotientRoute:
    """A route as the max-min system sees it under a :class:`ChannelQuotient`.

    ``blocks`` (ascending ids) with ``weights`` (crossings of each of the block's channels;
    None when all are 1) and ``mult`` (blocks of weight > 1 -> weight, or None); ``checks``:
    the distinct block tuples of a family route's images with the first image giving each
    (the certificate checks each once; empty for a plain route); ``cut``: this object's
    serial number (equal cuts, the same ``checks``); ``channels``/``counts``: the route's
    distinct real channels and how often it crosses each (numpy, for per-channel occupancy);
    ``version``: the quotient's version at which it was last known current (no block of it
    split since)."""

    route: Route
    blocks: tuple[int, ...]
    weights: tuple[int, ...] | None
    mult: dict[int, int] | None
    checks: tuple[tuple[tuple[int, ...], Route], ...]
    cut: int
    channels: np.ndarray
    counts: np.ndarray
    version: int


class ChannelQuotient:
    """A partition of channels into blocks no route seen so far tells apart (module
    docstring). ``capacity``: the constraints' capacities (bytes/s) by id — channels first;
    a new block's capacity is appended to it (the max-min system's own list)."""

    def __init__(self, capacity: list[float], on_split: Callable[[int, list[int], bool], None]
                 ) -> None:
        """``on_split(b, parts, keep)`` is called when block ``b`` splits into new blocks
        ``parts`` (besides itself when ``keep``), before the routes on it are quoted again;
        :attr:`split_blocks` lists the blocks split since it was last emptied."""
        self.capacity = capacity
        self.n_channels = len(capacity)
        #: block of each channel (-1: crossed by no route yet)
        self.block_of: list[int] = [-1] * self.n_channels
        self.members: dict[int, set[int]] = {}
        #: quotient version when each block last split (a cached route on it is stale)
        self.split_at: dict[int, int] = {}
        self.version = 0
        self.splits = 0
        self._on_split = on_split
        self.split_blocks: list[int] = []
        self._cache: dict[int, QuotientRoute] = {}
        self._made = 0          # quoted routes made: each one's ``cut``

    @property
    def blocks(self) -> int:
        """Blocks now (channels crossed by some route, grouped)."""
        return len(self.members)

    @property
    def channels_seen(self) -> int:
        """Channels crossed by some route so far."""
        return sum(len(m) for m in self.members.values())

    def of(self, route: Route) -> QuotientRoute:
        """``route`` under the quotient (refining the blocks by it first, if it is new)."""
        got = self._cache.get(id(route))
        if got is not None and got.route is route:
            v = got.version
            if v == self.version:               # no block split since it was quoted
                return got
            split_at = self.split_at
            for b in got.blocks:
                if split_at[b] > v:
                    break
            else:
                # none of its blocks split: the same quote, known valid at this version (the
                # version is the cache's own bookkeeping, read nowhere else: updated in
                # place rather than copying the quote)
                object.__setattr__(got, "version", self.version)
                return got
        else:
            self._refine(route)
        return self.requote(route)

    def _refine(self, route: Route) -> None:
        """Split every block that ``route`` crosses unequally (some of its channels more
        often than others, or not at all); channels crossed for the first time form blocks
        of their own by (capacity, crossings)."""
        counts = Counter(route.channels)
        block_of, members, cap = self.block_of, self.members, self.capacity
        groups: dict[tuple, list[int]] = {}
        for c, k in counts.items():            # route order: deterministic ids
            b = block_of[c]
            groups.setdefault((b, k) if b >= 0 else (-1, cap[c], k), []).append(c)
        touched: dict[int, list[list[int]]] = {}
        for key, chans in groups.items():
            if key[0] < 0:                      # new channels: a block named by its first
                b = chans[0]
                members[b] = set(chans)
                for c in chans:
                    block_of[c] = b
                self.split_at[b] = self.version
            else:
                touched.setdefault(key[0], []).append(chans)
        for b, parts in touched.items():
            whole = members[b]
            if len(parts) == 1 and len(parts[0]) == len(whole):
                continue                        # crossed uniformly: still one block
            self.version += 1
            self.splits += 1
            keep = sum(len(p) for p in parts) < len(whole)   # channels not crossed remain b
            new: list[int] = []
            for i, chans in enumerate(parts):
                if not keep and i == 0:
                    whole.intersection_update(chans)          # the first part stays b
                    continue
                nb = len(cap)
                cap.append(cap[b])
                members[nb] = set(chans)
                whole.difference_update(chans)
                for c in chans:
                    block_of[c] = nb
                self.split_at[nb] = self.version
                new.append(nb)
            self.split_at[b] = self.version
            self.split_blocks.append(b)
            self._on_split(b, new, True)

    def requote(self, route: Route) -> QuotientRoute:
        """``route`` (already seen: it refined the blocks) under the blocks as they are now."""
        got = self._quotient(route)
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[id(route)] = got
        return got

    def _quotient(self, route: Route) -> QuotientRoute:
        block_of = self.block_of
        chans = route.channels
        counts = Counter(chans)
        weight: dict[int, int] = {}
        for c, k in counts.items():     # any channel of a block stands for it: one weight
            weight.setdefault(block_of[c], k)
        bl = tuple(sorted(weight))
        w = [weight[b] for b in bl]
        weights = None if all(k == 1 for k in w) else tuple(w)
        mult = None if weights is None else {b: k for b, k in zip(bl, w) if k > 1}
        checks: tuple = ()
        if type(route) is FamilyRoute:  # the certificate's work: each distinct image once
            allb = [block_of[c] for c in chans]
            seen: dict[tuple[int, ...], Route] = {}
            pos = 0
            for image, n in zip(route.images, route.cut):
                seen.setdefault(tuple(sorted(set(allb[pos:pos + n]))), image)
                pos += n
            checks = tuple(seen.items())
        self._made += 1
        return QuotientRoute(route, bl, weights, mult, checks, self._made,
                             np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)),
                             np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                             self.version)

    def parts(self, channels: Sequence[int]) -> list[int]:
        """The blocks of ``channels`` (ascending, distinct)."""
        return sorted({self.block_of[c] for c in channels})
