"""Keeping Python's cyclic garbage collector off large task graphs.

A full (oldest-generation) pass of the collector visits every tracked object alive, and
passes come every ~10^5 allocations, so while a graph of 10^5–10^6 tasks is being built
or replayed, each pass revisits all of it: 40 % of the generation time of a 526 k-task
graph, 14 % of a replay's (docs/performance.md, step 19). Neither needs the collector
then — a graph holds no reference cycles that become garbage while it is built, and a
replay's garbage is collected all the same among the objects it allocates — so:

* :func:`collector_paused` turns the collector off while a graph is built (on again after,
  if it was on: cycles made meanwhile, and a previous run's, are then found as usual);
* :func:`heap_frozen` leaves the objects alive at its start (the graph, the topology, the
  replay's set-up) out of every pass until it ends (``gc.freeze``); the collector keeps
  collecting what is allocated meanwhile; :meth:`Freezer.freeze` inside moves new objects
  out too. It first runs one full collection when a frozen block has ended since the
  last one, so that a previous run's garbage (a cycle through simpy's callbacks) is not
  frozen alive through this one — not before a process's first replay, which has no
  previous run (its 50–100 ms would be most of a generated graph's set-up:
  docs/performance.md, "Generation: the engine reads rows"). That collection visits the
  whole heap (50–100 ms in a large process), so the engine freezes only graphs of at
  least :data:`LARGE_GRAPH_TASKS` tasks: for small graphs the passes it saves cost less than
  it (a sweep of thousands of small points, the test suite: 2.4× slower with it on every
  run).

Neither changes what a program computes, only when unreachable cycles are freed.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["LARGE_GRAPH_TASKS", "Freezer", "collector_paused", "heap_frozen"]

#: Graphs with at least this many tasks are replayed inside :func:`heap_frozen`.
LARGE_GRAPH_TASKS = 20_000


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (restored to its previous state after)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class Freezer:
    """What :func:`heap_frozen` yields: :meth:`freeze` moves the objects alive now out of the
    collector's passes, :meth:`thaw` puts every frozen object back; both do nothing when the
    block is not ``active``."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def freeze(self) -> None:
        if self.active:
            gc.freeze()

    def thaw(self) -> None:
        if self.active:
            gc.unfreeze()


#: whether a frozen block (a replay) has ended since the last collection :func:`heap_frozen`
#: ran: its garbage may be in the heap
_run_ended = False


@contextmanager
def heap_frozen(active: bool = True) -> Iterator[Freezer]:
    """Objects alive at the start (and at each :meth:`Freezer.freeze` inside) skipped by the
    collector until the block ends; then they are its oldest generation again. Not nested:
    the end of the block thaws every frozen object. ``active`` False: nothing is frozen or
    collected (the module docstring says when that pays)."""
    global _run_ended
    freezer = Freezer(active)
    if active:
        if _run_ended:   # a previous run's cycles, still uncollected, are not frozen alive
            gc.collect()
            _run_ended = False
        freezer.freeze()
    try:
        yield freezer
    finally:
        freezer.thaw()
        _run_ended = _run_ended or active
