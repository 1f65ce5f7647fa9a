"""``auto``: pick an algorithm per op, size, group and topology the way a tuner does.

NCCL's tuner evaluates a cost model per (algorithm, protocol) and takes the cheapest
(reference README §2.5). dessim's :func:`choose` builds each candidate's schedule (every
registered algorithm that can run the op on the group) and estimates its time on the
*topology* without running a simulation:

* **critical path** — each transfer costs its route's ``latency + nbytes / bottleneck``
  (alpha-beta with the topology's real paths, ECMP key 0), plus its reduction time when a
  ``reduction_bw`` is given; a transfer starts when its dependencies finish;
* **link load** — the busiest channel's bytes / capacity, a lower bound that captures
  contention the critical path ignores (e.g. halving-doubling on a physical ring).

The estimate is the larger of the two; it is exact for schedules without contention and a
lower bound otherwise. Cost: O(transfers × path length), far below a simulation. Ties go
to the candidate listed first in :data:`~dessim.collectives.algorithms.ALGORITHMS`.

Decisions are memoised per topology by the group's *shape* (:func:`group_shape`): groups
whose members are joined by the same routes up to renaming — e.g. the TP groups of the
nodes of a cluster — get the same candidates' estimates, so auto decides once for all.
"""

from __future__ import annotations


from array import array
from dataclasses import dataclass

import simpy

from dessim.collectives.algorithms import ALGORITHMS, build_schedule, check_supported
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Schedule
from dessim.errors import CollectiveError, DessimError
from dessim.network import make_network
from dessim.topology.graph import Topology

__all__ = ["Estimate", "AutoChoice", "estimate_schedule", "choose", "group_shape"]


@dataclass(frozen=True)
class Estimate:
    """One candidate's estimate (seconds) or the reason it cannot run."""

    algorithm: str
    time_s: float | None
    critical_path_s: float | None = None
    link_load_s: float | None = None
    reason: str = ""

    def describe(self) -> str:
        if self.time_s is None:
            return f"{self.algorithm}: not applicable ({self.reason})"
        return (f"{self.algorithm}: {self.time_s * 1e6:.3f} us (critical path "
                f"{self.critical_path_s * 1e6:.3f} us, busiest link {self.link_load_s * 1e6:.3f} us)")


@dataclass(frozen=True)
class AutoChoice:
    """The chosen algorithm and every candidate's estimate, best first."""

    algorithm: str
    estimates: tuple[Estimate, ...]

    def explanation(self) -> str:
        lines = [f"auto chose {self.algorithm} (estimated critical path vs busiest link):"]
        lines += [f"  {e.describe()}" for e in self.estimates]
        return "\n".join(lines)


def _estimator(topology: Topology):
    """One analytical network per topology for estimates: its router and route caches are
    shared by every auto decision on that topology (:meth:`Topology.derived`)."""
    return topology.derived("auto_estimator",
                            lambda t: make_network("analytical", simpy.Environment(), t))


def estimate_schedule(schedule: Schedule, topology: Topology,
                      reduction_bw: float | None = None) -> tuple[float, float]:
    """(critical-path time, busiest-link time) of ``schedule`` on ``topology`` in seconds."""
    net = _estimator(topology)
    capacity = net.channels.capacity
    load: dict[int, float] = {}          # bytes per channel the schedule touches
    routes: dict[tuple[int, int], tuple[float, float, tuple[int, ...]]] = {}
    finish = array("d", [0.0]) * len(schedule)
    src, dst, nbytes, red = schedule.src, schedule.dst, schedule.nbytes, schedule.reduce_bytes
    dep_start, dep_index = schedule.dep_start, schedule.dep_index
    best = 0.0
    for i in range(len(schedule)):
        pair = (src[i], dst[i])
        r = routes.get(pair)
        if r is None:
            route = net.route(topology.node_of(pair[0]), topology.node_of(pair[1]))
            r = routes[pair] = (route.latency, route.bottleneck, route.channels)
        lat, bottleneck, chans = r
        n = nbytes[i]
        for c in chans:
            load[c] = load.get(c, 0.0) + n
        ready = max((finish[j] for j in dep_index[dep_start[i]:dep_start[i + 1]]), default=0.0)
        t = ready + lat + n / bottleneck
        if reduction_bw and red[i]:
            t += red[i] / reduction_bw
        finish[i] = t
        if t > best:
            best = t
    busiest = max((b / capacity[c] for c, b in load.items()), default=0.0)
    return best, busiest


def group_shape(group: tuple[int, ...], topology: Topology) -> tuple:
    """Everything a collective on ``group`` depends on, with members named by their position
    in ``group`` and channels by their order of first use: per ordered member pair its route's
    channels and latency (ECMP key 0, as the estimates use), the capacity of every channel,
    and each algorithm's :meth:`~dessim.collectives.algorithms.base.Algorithm.topology_key`.

    Two groups with equal shapes are the same sub-network up to renaming, so every schedule,
    estimate and idle-network time of a collective is the same on both (its transfers use
    only these routes). Equal shapes are a sufficient condition, never a guess."""
    net = _estimator(topology)
    capacity = net.channels.capacity
    node = topology.node_of
    chan_id: dict[int, int] = {}
    routes = []
    for a in group:
        na = node(a)
        for b in group:
            if a != b:
                r = net.route(na, node(b))
                routes.append((tuple(chan_id.setdefault(c, len(chan_id)) for c in r.channels),
                               r.latency))
    caps = tuple(capacity[c] for c in chan_id)
    keys = tuple(alg.topology_key(tuple(group), topology) for alg in ALGORITHMS.values())
    return (len(group), tuple(routes), caps, keys)


def choose(op: Op, group: tuple[int, ...], size: float, topology: Topology, *,
           chunks: int = 1, channels: int = 1, root: int | None = None,
           reduction_bw: float | None = None, memo: bool = True, **options) -> AutoChoice:
    """Estimate every applicable algorithm and return the fastest with the explanation
    (memoised per topology by :func:`group_shape`; ``memo=False`` estimates afresh, with
    the same result)."""
    group = tuple(group)
    if not memo:
        return _choose(op, group, size, topology, chunks=chunks, channels=channels, root=root,
                       reduction_bw=reduction_bw, **options)
    memo = topology.derived("auto_choices", lambda _t: {})
    rpos = None if root is None else (group.index(root) if root in group else ("not in group", root))
    key = (op.name, float(size), chunks, channels, rpos,
           reduction_bw, tuple(sorted((k, repr(v)) for k, v in options.items())),
           group_shape(group, topology))
    got = memo.get(key)
    if got is None:
        got = memo[key] = _choose(op, group, size, topology, chunks=chunks, channels=channels,
                                  root=root, reduction_bw=reduction_bw, **options)
    return got


def _choose(op: Op, group: tuple[int, ...], size: float, topology: Topology, *,
            chunks: int, channels: int, root: int | None, reduction_bw: float | None,
            **options) -> AutoChoice:
    estimates = []
    for name, alg in ALGORITHMS.items():
        if op.name not in alg.ops:
            continue
        try:
            check_supported(op, alg, group, topology, options)
            sched = build_schedule(op, alg, group, size, chunks=chunks, channels=channels,
                                   root=root, topology=topology, **options)
        except DessimError as exc:
            estimates.append(Estimate(name, None, reason=str(exc)))
            continue
        cp, load = estimate_schedule(sched, topology, reduction_bw)
        estimates.append(Estimate(name, max(cp, load), cp, load))
    ok = [e for e in estimates if e.time_s is not None]
    if not ok:
        raise CollectiveError(f"auto: no algorithm can run {op.name} on this group: "
                              + "; ".join(e.describe() for e in estimates))
    ranked = sorted(ok, key=lambda e: e.time_s) + [e for e in estimates if e.time_s is None]
    return AutoChoice(ranked[0].algorithm, tuple(ranked))
