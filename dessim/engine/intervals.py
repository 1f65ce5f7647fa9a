"""Interval arithmetic for time accounting (unions, differences, lengths), in seconds."""

from __future__ import annotations

from typing import Iterable

Interval = tuple[float, float]

__all__ = ["union", "length", "subtract"]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of half-open intervals [start, end); empty ones dropped."""
    out: list[Interval] = []
    for s, e in sorted([i for i in intervals if i[1] > i[0]]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
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
