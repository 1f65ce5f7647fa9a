"""How far a running simulation has got, for whoever watches it (the command line's status line).

A run of the engine takes from milliseconds to the better part of an hour (docs/performance.md);
a watcher registered with :func:`watching` is told, at most every ``every_s`` seconds of wall
time, a :class:`Progress`: tasks finished out of the graph's, and the simulated time reached.
Nothing is reported without a watcher, and a watcher only reads: the simulation, its events and
its results are the same with or without one (tests/test_progress.py).

The watcher is held in a context variable, so that the layers between the caller and the engine
(workload generation, micro-batch extrapolation, sweeps) need not pass it along. One engine run
reports from ``tasks_done`` 0 upwards; a new run (the next short run of an extrapolation, or a
replay after a folding shortcut was refused) starts again from 0, with its own ``tasks_total``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = ["Progress", "watching", "Ticker"]


@dataclass(frozen=True)
class Progress:
    """One report of an engine run: ``tasks_done`` of ``tasks_total`` tasks finished, simulated
    time ``sim_time_s`` reached (s), ``wall_s`` seconds of wall time since the run started."""

    tasks_done: int
    tasks_total: int
    sim_time_s: float
    wall_s: float


#: The current watcher and its reporting interval (s of wall time), or None.
_WATCHER: ContextVar[tuple[Callable[[Progress], None], float] | None] = ContextVar(
    "dessim_engine_progress", default=None)


@contextmanager
def watching(report: Callable[[Progress], None], every_s: float = 0.5) -> Iterator[None]:
    """Within the block, every engine run calls ``report`` with its :class:`Progress` at most
    every ``every_s`` seconds of wall time (``every_s`` ≥ 0; 0: at every check)."""
    if not every_s >= 0:
        raise ValueError(f"every_s must be a number of seconds >= 0, got {every_s!r}")
    token = _WATCHER.set((report, float(every_s)))
    try:
        yield
    finally:
        _WATCHER.reset(token)


class Ticker:
    """The engine's side (:class:`dessim.engine.engine._Run`): the run calls :meth:`check` once
    its finished-task count reaches :attr:`next_at` (infinite when nobody watches, so the hot
    path costs one comparison per finished task), and :meth:`check` returns the next count."""

    #: Finished tasks between two looks at the wall clock.
    STRIDE = 16

    __slots__ = ("total", "next_at", "_report", "_every", "_t0", "_last")

    def __init__(self, total: int) -> None:
        watcher = _WATCHER.get()
        self.total = total
        self.next_at: float = float("inf") if watcher is None else 0
        self._report, self._every = watcher if watcher is not None else (None, 0.0)
        self._t0 = self._last = time.perf_counter()

    def check(self, done: int, sim_time_s: float) -> float:
        """Report if the interval has passed (or the run is complete); the next count to check at."""
        now = time.perf_counter()
        if self._report is not None and (now - self._last >= self._every or done >= self.total):
            self._last = now
            self._report(Progress(done, self.total, sim_time_s, now - self._t0))
        return done + self.STRIDE
