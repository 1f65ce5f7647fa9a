"""Cluster schedulers for jobs arriving over time: how many GPUs each job holds, and which.

A policy (:data:`POLICIES`) is called at every arrival and completion with the *active* jobs
(arrived, not finished) in arrival order and the cluster's GPU count; it returns every active
job's GPU count (0: the job waits). :func:`place` then turns counts into GPU ranks.

Every job has a requested size ``gpus`` and a range ``min_gpus ≤ n ≤ max_gpus`` (both default
to ``gpus``); a job only ever runs on one of its :meth:`Demand.sizes`: ``min_gpus·2^k`` up to
``max_gpus``, plus ``gpus`` and ``max_gpus`` (data parallelism must divide the global batch;
doubling keeps it dividing).

``fifo`` — first come, first served, static partitions
    Running jobs keep their GPUs until they finish. Waiting jobs start in arrival order with
    their requested ``gpus`` as soon as that many are free; a job that does not fit blocks
    every later one (no backfilling) — the static partitioning of Mesos/YARN-style cluster
    managers that Dorm compares against.
``fair`` — static fair-share partitions
    As ``fifo``, but a job starts with ``min(gpus, fair share)`` (rounded down to one of its
    sizes, at least ``min_gpus``), the fair share being the cluster split max-min fairly over
    the active jobs' requests (:func:`fair_shares`); partitions are never resized.
``dorm`` — dynamic partitions (Sun et al. 2017, "Dorm: Dynamically Partitioning Cluster
    Resources for Data-Parallel Applications", arXiv:1704.06738)
    At every event the whole cluster is repartitioned: active jobs are admitted in arrival
    order at ``min_gpus`` while they fit, then GPUs are handed out one size step at a time to
    the admitted job holding the fewest (ties: earliest arrival) until no job can grow within
    ``max_gpus`` and the free GPUs — max-min fair over discrete sizes and work-conserving, so
    jobs expand into idle GPUs and shrink back when others arrive. A running job whose count
    changes pauses for the scheduler's ``resize_overhead`` (checkpoint and restart; Dorm
    reports its sharing overhead below 5 %: a setting, default 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

__all__ = ["Demand", "POLICIES", "fair_shares", "place", "fifo", "fair", "dorm"]


@dataclass(frozen=True)
class Demand:
    """What a policy knows of one active job: its name, sizes and current count (0: waiting)."""

    name: str
    gpus: int
    min_gpus: int
    max_gpus: int
    current: int = 0

    def sizes(self) -> list[int]:
        """The GPU counts the job may run on, ascending (module docstring)."""
        out = {self.gpus, self.max_gpus}
        n = self.min_gpus
        while n <= self.max_gpus:
            out.add(n)
            n *= 2
        return sorted(s for s in out if self.min_gpus <= s <= self.max_gpus)

    def at_most(self, limit: float) -> int:
        """The largest size ``<= limit`` (0 if even ``min_gpus`` exceeds it)."""
        return max((s for s in self.sizes() if s <= limit), default=0)


def fair_shares(demands: Sequence[float], total: float) -> list[float]:
    """Max-min fair (water-filling) split of ``total`` over ``demands``: every job gets
    ``min(demand, level)`` with the level that uses the whole ``total`` (or every demand)."""
    share = [0.0] * len(demands)
    left = float(total)
    open_ = sorted(range(len(demands)), key=lambda i: demands[i])
    while open_ and left > 1e-12:
        level = left / len(open_)
        i = open_[0]
        if demands[i] <= level:
            share[i] = float(demands[i])
            left -= demands[i]
            open_.pop(0)
        else:
            for j in open_:
                share[j] = level
            left = 0.0
            open_ = []
    return share


def fifo(active: Sequence[Demand], total: int) -> dict[str, int]:
    """First come, first served with static partitions (module docstring)."""
    out = {d.name: d.current for d in active}
    free = total - sum(out.values())
    for d in active:
        if d.current:
            continue
        if d.gpus > free:
            break
        out[d.name] = d.gpus
        free -= d.gpus
    return out


def fair(active: Sequence[Demand], total: int) -> dict[str, int]:
    """Static partitions sized at the fair share when a job starts (module docstring)."""
    out = {d.name: d.current for d in active}
    free = total - sum(out.values())
    shares = fair_shares([d.gpus for d in active], total)
    for d, share in zip(active, shares):
        if d.current:
            continue
        n = d.at_most(min(d.gpus, share + 1e-9, free))
        if n == 0:
            break
        out[d.name] = n
        free -= n
    return out


def dorm(active: Sequence[Demand], total: int) -> dict[str, int]:
    """Dynamic repartitioning, max-min fair and work-conserving (module docstring)."""
    out = {d.name: 0 for d in active}
    free = total
    admitted = []
    for d in active:
        if d.min_gpus > free:
            break
        out[d.name] = d.min_gpus
        free -= d.min_gpus
        admitted.append(d)
    order = {d.name: i for i, d in enumerate(active)}
    while True:
        growable = []
        for d in admitted:
            bigger = [s for s in d.sizes() if s > out[d.name] and s - out[d.name] <= free]
            if bigger:
                growable.append((out[d.name], order[d.name], d, bigger[0]))
        if not growable:
            return out
        _, _, d, size = min(growable, key=lambda g: (g[0], g[1]))
        free -= size - out[d.name]
        out[d.name] = size


#: Scheduling policies by name (the cluster file's ``scheduler.policy``).
POLICIES: Mapping[str, Callable[[Sequence[Demand], int], dict[str, int]]] = {
    "fifo": fifo, "fair": fair, "dorm": dorm}


def place(previous: Mapping[str, tuple[int, ...]], counts: Mapping[str, int], total: int) -> dict[str, tuple[int, ...]]:
    """GPU ranks for ``counts`` (jobs in arrival order): a job keeping its count keeps its
    ranks, a shrinking job keeps the first ones, growing and new jobs take the lowest free ranks."""
    out: dict[str, tuple[int, ...]] = {}
    for name, n in counts.items():
        if n and name in previous:
            out[name] = tuple(previous[name][:n])
    used = {r for ranks in out.values() for r in ranks}
    free = [r for r in range(total) if r not in used]
    for name, n in counts.items():
        have = out.get(name, ())
        if n > len(have):
            extra, free = free[: n - len(have)], free[n - len(have):]
            out[name] = tuple(have) + tuple(extra)
    return {name: out[name] for name in counts if counts[name]}
