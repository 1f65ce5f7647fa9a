"""Max-min fair rate allocation by progressive filling (water-filling).

The textbook flow-level bandwidth-sharing model (SimGrid CM02 with cross traffic off, "raw" in
SimGrid 4.1; "SimGrid LMM" and "SimGrid CM02" in docs/references.md): every flow gets the
largest rate such that no channel exceeds its capacity and no flow can gain without taking
from a flow whose rate is not larger.

Algorithm: all unfixed flows grow together; the channel with the smallest fair share
``remaining capacity / unfixed flows`` saturates first and fixes its flows at that share; repeat.
Channels sit in a heap keyed by ``(share, channel id)`` with lazy invalidation — a channel's
share never decreases while filling and every change pushes a fresh entry, so a popped entry
whose share is out of date is simply dropped — which makes one solve
``O(sum of path lengths * log channels)`` instead of a linear scan per round (a linear scan is
fine for the few coupled flows a collective step makes; the heap keeps large coupled sets
tractable — docs/performance.md, ``bench_network.py``).

Deterministic: ties are broken by channel id, then flows are fixed in the order given.
"""

from __future__ import annotations

import heapq
from typing import Hashable, Mapping, Sequence, TypeVar

__all__ = ["solve_maxmin"]

F = TypeVar("F", bound=Hashable)


def solve_maxmin(flow_channels: Mapping[F, Sequence[int]],
                 capacity: Mapping[int, float] | Sequence[float]) -> dict[F, float]:
    """Max-min fair rates (bytes/s) of flows crossing channels of given capacity (bytes/s).

    ``flow_channels[f]`` lists the channel ids that flow ``f`` crosses. A channel listed twice
    for one flow is crossed twice and carries twice the flow's rate (a route never does that on
    a full-duplex link; it could cross a half-duplex link both ways). A flow that crosses no
    channel is unconstrained: its rate is ``float('inf')``. The result has the keys of
    ``flow_channels`` in the same order.
    """
    inf = float("inf")
    rates: dict[F, float] = {}
    users: dict[int, list[F]] = {}
    for f, chans in flow_channels.items():
        if not chans:
            rates[f] = inf
        for c in chans:
            lst = users.get(c)
            if lst is None:
                users[c] = [f]
            else:
                lst.append(f)

    # One pass builds the residual capacities, the unfixed counts (a flow once per crossing)
    # and the initial heap.
    remaining: dict[int, float] = {}
    unfixed: dict[int, int] = {}
    heap: list[tuple[float, int]] = []
    for c, fs in users.items():
        cap = float(capacity[c])
        n = len(fs)
        remaining[c] = cap
        unfixed[c] = n
        heap.append((cap / n, c))
    heapq.heapify(heap)

    left = len(flow_channels) - len(rates)   # flows still to fix: stop as soon as none is
    while left:
        share, c = heapq.heappop(heap)
        n = unfixed[c]
        if n == 0:
            continue
        current = remaining[c] / n
        if current != share:  # stale: a newer entry with the grown share is in the heap
            continue
        # Channel c saturates: every unfixed flow on it gets `share`.
        touched: set[int] = set()
        for f in users[c]:
            if f in rates:
                continue
            rates[f] = share
            left -= 1
            for d in flow_channels[f]:
                unfixed[d] -= 1
                remaining[d] -= share
                touched.add(d)
        remaining[c] = 0.0
        for d in touched:
            if d != c and unfixed[d] > 0:
                if remaining[d] < 0.0:  # float noise only: shares never exceed capacity
                    remaining[d] = 0.0
                heapq.heappush(heap, (remaining[d] / unfixed[d], d))
    return {f: rates[f] for f in flow_channels}
