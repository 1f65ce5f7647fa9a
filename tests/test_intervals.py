"""Interval arithmetic (``dessim.engine.intervals``): the union sorted by start alone equals,
float for float, the union of the same intervals sorted as (start, end) tuples — the
definition it replaced (docs/performance.md, step 20) — including equal starts, touching
and empty intervals, in any input order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.engine.intervals import length, subtract, union


def union_by_tuples(intervals):
    """The reference: sorted (start, end) tuples, merged left to right."""
    out = []
    for s, e in sorted([i for i in intervals if i[1] > i[0]]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


#: few distinct values, so that equal starts, equal ends and touching intervals are common
times = st.sampled_from([0.0, 0.5, 1.0, 1.25, 2.0, 3.0, 1e-9, 7.0]) | st.floats(0, 10, allow_nan=False)
intervals = st.lists(st.tuples(times, times), max_size=40)


@settings(max_examples=400, deadline=None)
@given(intervals)
def test_union_equals_the_tuple_sorted_union(ivs):
    got = union(ivs)
    assert got == union_by_tuples(ivs)
    assert [tuple(map(float.hex, i)) for i in got] == \
        [tuple(map(float.hex, i)) for i in union_by_tuples(ivs)]
    assert length(got) == length(union_by_tuples(ivs))
    assert union(list(reversed(ivs))) == got             # any input order


def test_union_merges_touching_and_drops_empty_intervals():
    assert union([(2.0, 3.0), (0.0, 1.0), (1.0, 2.0), (5.0, 5.0), (4.0, 3.5)]) == [(0.0, 3.0)]
    assert union([]) == []
    assert subtract(union([(0.0, 4.0)]), union([(1.0, 2.0)])) == [(0.0, 1.0), (2.0, 4.0)]
