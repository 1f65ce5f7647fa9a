"""Keeping Python's cyclic garbage collector off large task graphs.

A full (oldest-generation) pass of the collector visits every tracked object alive, and
passes come every ~10^5 allocations, so while a graph of 10^5–10^6 tasks is being built
or replayed, each pass revisits all of it: 40 % of the generation time of a 526 k-task
graph, 14 % of a replay's (docs/performance.md, step 19). Neither needs the collector
then — a graph holds no reference cycles that become garbage while it is built, and a
replay's garbage is collected all the same among the objects it allocates — so:

* :func:`collector_paused` turns the collector off while a graph is built (on again after,
  if it was on: cycles made meanwhile are then found as usual);
* :func:`heap_frozen` leaves the objects alive at its start (the graph, the topology, the
  replay's set-up) out of every pass until it ends (``gc.freeze``); the collector keeps
  collecting what is allocated meanwhile; ``gc.freeze()`` inside moves new objects out too.

Neither changes what a program computes, only when unreachable cycles are freed.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["collector_paused", "heap_frozen"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (restored to its previous state after)."""
    was_on = gc.isenabled()
    if was_on:
        gc.collect()  # nothing uncollected (a previous run's cycles) stays alive meanwhile
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Objects alive at the start (and at each further ``gc.freeze()`` inside) skipped by the
    collector until the block ends; then they are its oldest generation again. Not nested:
    the end of the block thaws every frozen object."""
    gc.collect()     # garbage still uncollected (a previous run's cycles) is not frozen alive
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
