"""Interval arithmetic for time accounting (unions, differences, lengths), in seconds."""

from __future__ import annotations

from operator import itemgetter
from typing import Iterable

Interval = tuple[float, float]

__all__ = ["union", "length", "subtract"]

_start = itemgetter(0)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of half-open intervals [start, end); empty ones dropped.

    Sorted by start alone: intervals with equal starts all join the same run whatever
    their order (each starts no later than the run's end), and a run's bounds are the least
    start and the greatest end of its members, so the result is the one sorting by
    (start, end) gives — float for float — with cheaper comparisons than tuples'."""
    items = [i for i in intervals if i[1] > i[0]]
    items.sort(key=_start)
    out: list[Interval] = []
    if not items:
        return out
    add = out.append
    lo, hi = items[0]
    for s, e in items:
        if s <= hi:
            if e > hi:
                hi = e
        else:
            add((lo, hi))
            lo, hi = s, e
    add((lo, hi))
    return out


def length(intervals: Iterable[Interval]) -> float:
    """Total length of an already disjoint interval list."""
    return sum(e - s for s, e in intervals)




def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` minus ``b`` for disjoint sorted interval lists."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out
