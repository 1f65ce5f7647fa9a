"""Replay a :class:`~dessim.collectives.schedule.Schedule` on a network model.

:func:`run_schedule` starts at ``env.now`` and drives everything with callbacks on the
network's transfer events (no simpy process per transfer):

* transfer ``i`` starts when every transfer in its ``deps`` is complete and both its source
  and destination ranks have *arrived* (``arrivals``: optional ``rank -> simpy.Event``, used
  by the task-graph engine when ranks reach the collective at different times; a rank
  without an event has arrived);
* each transfer is started with its own ECMP key ``key_base + i``, so flows between the
  same endpoints (several channels) spread over equal-cost paths;
* optional reduction cost (off by default): when a transfer with ``reduce_bytes`` arrives,
  the receiver spends ``reduce_bytes / reduction_bw`` seconds reducing, and the transfers
  that depend on it wait for that. This is the γ term of reference README §2.1 with
  γ = 1 / ``reduction_bw`` (bytes/second). The reduction does not occupy the network.

A rank's part ends with the last transfer it sends or receives (for a receive, including its
reduction). The run's ``done`` event succeeds when every transfer is complete.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import simpy

from dessim.collectives.schedule import Schedule
from dessim.errors import CollectiveError

__all__ = ["ScheduleRun", "run_schedule"]


@dataclass
class ScheduleRun:
    """Timing of one replayed schedule (seconds of simulated time)."""

    schedule: Schedule
    start_time: float                  #: env.now when run_schedule was called
    done: simpy.Event                  #: succeeds (value: finish time) when all is complete
    transfer_start: array = field(repr=False)   #: per transfer; NaN until started
    transfer_finish: array = field(repr=False)  #: per transfer (last byte arrived); NaN until
    rank_events: dict[int, simpy.Event] = field(repr=False, default_factory=dict)
    rank_finish: dict[int, float] = field(default_factory=dict)  #: filled as ranks finish
    finish_time: float = math.nan      #: set when ``done`` succeeds

    @property
    def duration(self) -> float:
        """finish_time - start_time (NaN while running)."""
        return self.finish_time - self.start_time


def run_schedule(network, schedule: Schedule, *, arrivals: dict[int, simpy.Event] | None = None,
                 reduction_bw: float | None = None, key_base: int = 0) -> ScheduleRun:
    """Start ``schedule`` on ``network`` (a :class:`~dessim.network.base.Network`) now.

    Returns at once with a :class:`ScheduleRun`; run the environment to make progress.
    """
    if reduction_bw is not None and not (isinstance(reduction_bw, (int, float))
                                         and reduction_bw > 0 and math.isfinite(reduction_bw)):
        raise CollectiveError(f"reduction bandwidth {reduction_bw!r} must be a finite number "
                              "> 0 bytes/second (or None for free reductions)")
    env: simpy.Environment = network.env
    n = len(schedule)
    src, dst, nbytes, red = schedule.src, schedule.dst, schedule.nbytes, schedule.reduce_bytes
    dep_start, dep_index = schedule.dep_start, schedule.dep_index
    nan = math.nan
    run = ScheduleRun(schedule, env.now, env.event(), array("d", [nan]) * n, array("d", [nan]) * n)

    # Dependents in CSR form (offsets + flat indices): memory O(edges), no list per transfer.
    waiting = array("l", [0]) * n
    out_count = array("l", [0]) * (n + 1)
    for i in range(n):
        waiting[i] = dep_start[i + 1] - dep_start[i]
    for j in dep_index:
        out_count[j + 1] += 1
    for i in range(n):
        out_count[i + 1] += out_count[i]
    out_index = array("l", [0]) * len(dep_index)
    fill = array("l", out_count)
    for i in range(n):
        for j in dep_index[dep_start[i]:dep_start[i + 1]]:
            out_index[fill[j]] = i
            fill[j] += 1
    del fill

    # Per-rank bookkeeping: transfers left per rank, and its done event.
    left = dict.fromkeys(schedule.group, 0)
    for i in range(n):
        left[src[i]] += 1
        left[dst[i]] += 1
    for r in schedule.group:
        run.rank_events[r] = env.event()

    # Arrivals: a transfer also waits for each endpoint that has not arrived yet.
    absent: set[int] = set()
    if arrivals:
        absent = {r for r, ev in arrivals.items()
                  if r in left and not (ev.triggered and ev.processed)}
    touching: dict[int, list[int]] = {r: [] for r in absent}
    if absent:
        for i in range(n):
            for r in (src[i], dst[i]):
                if r in absent:
                    waiting[i] += 1
                    touching[r].append(i)

    state = {"released": 0, "ranks_left": len(left)}

    def rank_finished(r: int) -> None:
        run.rank_finish[r] = env.now
        run.rank_events[r].succeed(env.now)
        state["ranks_left"] -= 1
        check_done()

    def check_done() -> None:
        if state["released"] == n and state["ranks_left"] == 0 and not run.done.triggered:
            run.finish_time = env.now
            run.done.succeed(env.now)

    def release(i: int) -> None:
        """Transfer i and its reduction are complete: wake dependents, account dst."""
        state["released"] += 1
        for k in range(out_count[i], out_count[i + 1]):
            j = out_index[k]
            waiting[j] -= 1
            if waiting[j] == 0:
                start(j)
        d = dst[i]
        left[d] -= 1
        if left[d] == 0:
            rank_finished(d)
        else:
            check_done()

    def finished(i: int) -> None:
        run.transfer_finish[i] = env.now
        s = src[i]
        left[s] -= 1
        if left[s] == 0:
            rank_finished(s)
        if reduction_bw and red[i] > 0:
            env.timeout(red[i] / reduction_bw).callbacks.append(lambda _e, i=i: release(i))
        else:
            release(i)

    def start(i: int) -> None:
        run.transfer_start[i] = env.now
        ev = network.transfer(src[i], dst[i], nbytes[i], key=key_base + i)
        ev.callbacks.append(lambda _e, i=i: finished(i))

    def arrived(r: int) -> None:
        absent.discard(r)
        if left[r] == 0:
            rank_finished(r)
        for i in touching.pop(r):
            waiting[i] -= 1
            if waiting[i] == 0:
                start(i)

    for r in sorted(absent):
        arrivals[r].callbacks.append(lambda _e, r=r: arrived(r))
    for r in schedule.group:
        if left[r] == 0 and r not in absent:
            rank_finished(r)
    for i in range(n):
        if waiting[i] == 0:
            start(i)
    check_done()
    return run
