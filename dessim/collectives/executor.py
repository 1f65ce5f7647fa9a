"""Replay a :class:`~dessim.collectives.schedule.Schedule` on a network model.

:func:`run_schedule` starts at ``env.now`` and drives everything with callbacks on the
network's transfer events (no simpy process per transfer):

* transfer ``i`` starts when every transfer in its ``deps`` is complete and both its source
  and destination ranks have *arrived* (``arrivals``: optional ``rank -> simpy.Event``, used
  by the task-graph engine when ranks reach the collective at different times; a rank
  without an event has arrived);
* a transfer on channel ``c`` is started with ECMP key ``key_base + c``: like NCCL's
  connections (one queue pair per peer and channel, set up once per communicator), every
  transfer between two ranks on one channel takes the same path, and several channels spread
  over equal-cost paths;
* optional reduction cost (off by default): when a transfer with ``reduce_bytes`` arrives,
  the receiver spends ``reduce_bytes / reduction_bw`` seconds reducing, and the transfers
  that depend on it wait for that. This is the γ term of Thakur et al. 2005
  (docs/references.md) with γ = 1 / ``reduction_bw`` (bytes/second). The reduction does not
  occupy the network.

A rank's part ends with the last transfer it sends or receives (for a receive, including its
reduction). The run's ``done`` event succeeds when every transfer is complete.

**Connections** (rule of the transfer, plain and compact schedules alike). Every schedule
chains the transfers of one ``(source, destination, channel)`` connection: each waits for the
previous one (its *predecessor*; the schedule builders add that dependency, FIFO). A
connection keeps up to ``W`` messages in flight, ``W`` = ``params["window"]``, by default
``NCCL_STEPS`` = 8 (:data:`CONNECTION_SLOTS`): NCCL's send primitives post a step into one of
the peer's 8 FIFO slots and go on, waiting only for a free slot (NVIDIA/nccl
``src/device/prims_ll.h`` ``waitSend``: ``sendConnHeadCache + NCCL_STEPS < sendConnHead + 1``;
``prims_simple.h`` ``waitPeer`` likewise), and DeepEP's RDMA channels post each chunk with a
non-blocking ``put_nbi`` (deepseek-ai/DeepEP @567632dd ``csrc/kernels/internode.cu``: the
``kRDMASenderCoordinator`` warp stalls only when ``num_max_rdma_chunked_recv_tokens`` tokens
are unacknowledged; the rail all-to-all's ``window`` option, default 1). A transfer's
predecessor still serialises the bytes, but not the latency: the transfer is *issued* when
its other dependencies are complete, its endpoints have arrived and the transfer W places
back on its connection is complete (a free slot), and its bytes move from
``max(issue + L, predecessor's finish)``, ``L`` its software plus route latency — so it pays
only ``max(0, issue + L − now)`` when its predecessor finishes ``now``
(:meth:`Network.transfer`'s ``latency``; :func:`_credit_left`). That is the rule "a send
waits for its predecessor's bytes to have *left* the sender, not to have arrived": they left
at ``finish − L`` (a transfer pays its latency, then moves its bytes), so the sender is free
from ``max(issue, finish − L)``, and ``max(issue, now − L) + L − now`` = ``max(0, issue + L −
now)``. The credit covers the protocol's software step latency as well as the route's: NCCL's
per-hop latency ``hwLat`` (``src/graph/tuning.cc``) is the time from a sender's post to the
receiver seeing the data (LL: the receiver polls the flags of the lines the sender stored,
``prims_ll.h`` ``readLL``; across nodes the proxy's network send), and NCCL's model charges it
once per step on the ring's data path, not again on the sender — for a ring across nodes it
charges the network latency ``interLat`` on only ``2(nNodes − 1)`` of an all-reduce's
``2(p − 1)`` steps (``ncclTopoTuneModel``, ring branch), which holds only if a sender does not
wait for its previous send's latency.

Only a transfer whose predecessor completes *after* its other dependencies gets a credit.
When every dependency completes at one instant (a uniform step: ``issue = now``) it pays its
whole latency, exactly as without the rule; so whole-step bundles, the closed forms on idle
networks, lane families, the per-link memo and merged images are unchanged there. Nor does a
transfer that waits for nothing but its predecessor get one, unless the schedule sets its
``window``: with NCCL's slots that dependency alone is the next chunk of a ring (its first
step), which a rank's thread sends once it has finished the previous chunk, in program order
(the plan does not name the receive it finished last), so it is issued when its predecessor
completes, as before; an explicit window (DeepEP's chunks, posted as they are ready) issues
it when its endpoints have arrived. On an idle
connection K messages of ``τ`` seconds each then take ``L + K·τ`` instead of ``K·(L + τ)``
when ``L <= (W − 1)·τ``; in general message ``c`` arrives at
``f_c = max(f_{c−1}, f_{c−W} + L) + τ`` (``f_{−1} = −∞``, ``f_{c−W} = 0`` for ``c < W``;
tests/test_rail_window.py). W = 1 (the rail all-to-all without ``window``) is the plain FIFO:
every message pays L after its predecessor arrived. In a ring the receive dependency already
bounds how far a sender runs ahead: member ``i−1`` can lead member ``i`` by at most ``p − 1``
steps (its data went round the ring), and on rails of equal connections the previous slow
hop is ``hops`` upstream with the same latency, so the 8 slots do not bind there (they can in a ring
of more than 8 ranks whose one connection is much slower than the others).

A :class:`~dessim.collectives.schedule.CompactSchedule` is replayed step by step with the same
semantics (:func:`_run_plan`): when a whole step completes at one instant, the next step's
members all become ready at that instant, so the step is started as ONE network bundle
(``bundles=True``, the default; exact, see :mod:`dessim.network.flow`) or as its members one
by one. As soon as a step completes piecemeal (a bundle split by other traffic, ranks arriving
at different times), the dependent members are tracked one by one from the step pattern's
dependencies — no per-transfer rows are ever materialised. ``bundles=False`` starts every
member as its own transfer: same results (tests/test_scale_equivalence.py).
"""

from __future__ import annotations

import math
import weakref
from array import array
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
import simpy

from dessim.collectives.nccl.system import arch_of
from dessim.collectives.protocols import RAW, Protocol, link_class, net_overhead, wire_factor
from dessim.collectives.schedule import (CompactSchedule, FluidSchedule, Schedule, StepPattern,
                                         merge_disjoint, pipelines)
from dessim.errors import CollectiveError
from dessim.network.base import Route
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.network.flow import WAKE_PRIORITY
from dessim.topology.hosts import host_map

__all__ = ["ScheduleRun", "run_schedule", "merge_instances", "family_refusal"]


@dataclass
class ScheduleRun:
    """Timing of one replayed schedule (seconds of simulated time).

    ``transfer_start`` / ``transfer_finish`` (per transfer, NaN until it happens) are arrays;
    for a compact schedule they are assembled from per-step records when first read.
    """

    schedule: Schedule
    start_time: float                  #: env.now when run_schedule was called
    done: simpy.Event                  #: succeeds (value: finish time) when all is complete
    _start: array | Callable[[], array] = field(repr=False)
    _finish: array | Callable[[], array] = field(repr=False)
    rank_events: dict[int, simpy.Event] = field(repr=False, default_factory=dict)
    rank_finish: dict[int, float] = field(default_factory=dict)  #: filled as ranks finish
    finish_time: float = math.nan      #: set when ``done`` succeeds
    bundles_started: int = 0           #: steps started as one network bundle (compact only)
    streamed: bool = False             #: channels ran as coupled flows (``stream_rings=True``)

    @property
    def transfer_start(self) -> array:
        return self._start if isinstance(self._start, array) else self._start()

    @property
    def transfer_finish(self) -> array:
        return self._finish if isinstance(self._finish, array) else self._finish()

    @property
    def duration(self) -> float:
        """finish_time - start_time (NaN while running)."""
        return self.finish_time - self.start_time


def merge_instances(network, schedules: Sequence[Schedule]) -> CompactSchedule | None:
    """The instances of one collective (images of it under a replica fold: same shape,
    disjoint groups) as ONE schedule to run with :func:`run_schedule`, when that run is the
    same as running each alone (:func:`~dessim.collectives.schedule.merge_disjoint`) on
    ``network``: every transfer's route is independent of the ECMP key (instances use
    different key bases) and every instance spans the same number of hosts on the same GPU
    architecture (what a protocol's charges depend on). None otherwise.

    Exact: each transfer waits for what it waited for alone, starts at the same instant
    and takes the same route, so the network sees the same flows; what is saved is one run's
    bookkeeping (arrivals, rank events, bundles) per instance."""
    merged = merge_disjoint(schedules)
    if merged is None:
        return None
    topo = network.topology
    hosts = host_map(topo)
    shape = {(len(hosts.split(sch.group)), arch_of(topo, sch.group[0])) for sch in schedules}
    if len(shape) != 1:
        return None
    plan = merged.plan
    pairs = {(a, b) for p in plan.patterns for a, b in zip(p.src.tolist(), p.dst.tolist())}
    if network.fixed_routes([a for a, _ in pairs], [b for _, b in pairs]) is None:
        return None
    return merged


def family_refusal(network, schedule: Schedule, key_base: int, family: LaneFamily) -> str | None:
    """Why ``family`` cannot carry ``schedule``'s transfers on ``network`` (started with ECMP
    keys ``key_base + channel``), or None when every transfer has a family route
    (:meth:`~dessim.network.base.Network.family_route`: images of equal latency, each on
    one path, no ECMP choice). Checked before a run, so a collective whose images would be
    refused runs every instance instead. Routes are cached by the network."""
    if isinstance(schedule, CompactSchedule):
        plan = schedule.plan
        seen: set[tuple[int, int]] = set()
        pairs = []
        for s, pid in enumerate(plan.pattern):
            if (pid, plan.channel[s]) not in seen:
                seen.add((pid, plan.channel[s]))
                pat = plan.patterns[pid]
                pairs += [(a, b, key_base + plan.channel[s])
                          for a, b in zip(pat.src.tolist(), pat.dst.tolist())]
    elif isinstance(schedule, FluidSchedule):
        return "streamed schedules run every lane"
    else:
        pairs = list({(a, b, key_base + c) for a, b, c in
                      zip(schedule.src, schedule.dst, schedule.channel)})
    resolve = network.topology.resolve
    try:
        for a, b, key in pairs:
            if resolve(a) != resolve(b):
                network.family_route(a, b, key, family)
    except QuotientBroken as exc:
        return str(exc)
    return None


def run_schedule(network, schedule: Schedule, *, arrivals: dict[int, simpy.Event] | None = None,
                 protocol: Protocol = RAW, reduction_bw: float | None = None, key_base: int = 0,
                 bundles: bool = True, stream_rings: bool = False,
                 family: LaneFamily | None = None) -> ScheduleRun:
    """Start ``schedule`` on ``network`` (a :class:`~dessim.network.base.Network`) now.

    Returns at once with a :class:`ScheduleRun`; run the environment to make progress.
    ``protocol`` (:mod:`dessim.collectives.protocols`; default ``raw``, the textbook model)
    scales every transfer's bytes by its wire factor, delays every transfer by its software
    step latency and every rank's start by the call latency.
    ``bundles``: start whole steps of a compact schedule as network bundles where the network
    allows it (exact; ``False`` switches the shortcut off).

    ``stream_rings`` (off by default; an approximation, see :class:`_StreamRun`): a compact
    schedule whose channels are all forwarding pipelines (rings:
    :func:`~dessim.collectives.schedule.pipelines`) runs each channel as ONE coupled flow
    instead of step by step, when reductions are free and the network can couple the
    connections (:meth:`~dessim.network.base.Network.coupled_route`); otherwise the
    schedule runs step by step as usual.

    ``family`` (a :class:`~dessim.network.families.LaneFamily`; not with streamed or fluid
    schedules): every transfer also stands for its images in the family's other lanes — the
    same schedule on the lanes' images of the group, which the caller has checked
    (:func:`~dessim.collectives.schedule.is_relabelling`). The images must pay the same
    protocol software latency as the representative's transfers
    (:class:`~dessim.network.families.QuotientBroken` otherwise).
    """
    if reduction_bw is not None and not (isinstance(reduction_bw, (int, float))
                                         and reduction_bw > 0 and math.isfinite(reduction_bw)):
        raise CollectiveError(f"reduction bandwidth {reduction_bw!r} must be a finite number "
                              "> 0 bytes/second (or None for free reductions)")
    for name, value in (("bundles", bundles), ("stream_rings", stream_rings)):
        if not isinstance(value, bool):
            raise CollectiveError(f"{name} must be true or false, got {value!r}")
    if not isinstance(protocol, Protocol):
        raise CollectiveError(f"protocol must be a Protocol, got {protocol!r}")
    charges = _Charges(network, protocol, schedule, family)
    arrivals = _with_call_latency(network.env, schedule.group, arrivals,
                                  protocol.call_latency(schedule.algorithm))
    if family is not None and (isinstance(schedule, FluidSchedule) or stream_rings):
        raise CollectiveError("a lane family runs with step-by-step schedules only "
                              f"(got {type(schedule).__name__}, stream_rings={stream_rings})")
    if isinstance(schedule, FluidSchedule):
        return _FluidRun(network, schedule, arrivals, charges, key_base).run
    if isinstance(schedule, CompactSchedule):
        if stream_rings and reduction_bw is None:
            streams = _streams(network, schedule, key_base, charges)
            if streams is not None:
                return _StreamRun(network, schedule, streams, arrivals).run
        return _PlanRun(network, schedule, arrivals, reduction_bw, key_base, bundles, charges,
                        family).run
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

    # Per-rank bookkeeping: transfers left per rank, and its done event. A transfer of an
    # orbit schedule (orbit_plan) counts its arrival for the receiver's representative.
    acct = schedule.account
    dst_rank = dst if acct is None else array("l", (acct[d] for d in dst))
    left = dict.fromkeys(schedule.group, 0)
    for i in range(n):
        left[src[i]] += 1
        left[dst_rank[i]] += 1
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
    window = _Window.of(network, schedule, key_base, run.start_time)

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
        if window is not None:
            window.done_at[i] = env.now
        for k in range(out_count[i], out_count[i + 1]):
            j = out_index[k]
            waiting[j] -= 1
            if waiting[j] == 0:
                start(j)
        d = dst_rank[i]
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

    factor = charges.factor

    def send(i: int, head: float | None = None) -> None:
        ev = network.transfer(src[i], dst[i], nbytes[i] * factor, key=key_base + schedule.channel[i],
                              family=family, latency=head)
        ev.callbacks.append(lambda _e, i=i: finished(i))

    def start(i: int) -> None:
        run.transfer_start[i] = env.now
        extra = charges.extra(src[i], dst[i])
        if window is not None and window.pred[i] >= 0:
            extra, head = window.left(i, extra, env.now)
            if head is not None:
                send(i, head)
                return
        if extra > 0:
            env.timeout(extra).callbacks.append(lambda _e, i=i: send(i))
        else:
            send(i)

    def arrived(r: int) -> None:
        absent.discard(r)
        if window is not None:
            window.arrived_at[r] = env.now
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


#: Messages a connection keeps in flight unless the schedule says otherwise
#: (``params["window"]``): NCCL's ``NCCL_STEPS`` = 8 FIFO slots per connection (NVIDIA/nccl
#: ``src/device/prims_ll.h`` ``waitSend``, ``prims_simple.h``; module docstring, "Connections").
CONNECTION_SLOTS = 8


def connection_slots(schedule: Schedule) -> int:
    """``W``, the messages one connection of ``schedule`` keeps in flight (module docstring)."""
    return int(schedule.params.get("window", CONNECTION_SLOTS))


def _credit_left(issue: float, extra: float, route: float, now: float
                 ) -> tuple[float, float | None]:
    """What a transfer issued at ``issue`` with software latency ``extra`` and route latency
    ``route`` (s) still pays when its predecessor finishes ``now`` (> issue): of its latency
    the part after ``now``. ``(delay, None)``: wait ``delay`` s, then pay the full route
    latency (at least the route latency is left); ``(0, head)``: start now and pay ``head``
    s of the route latency."""
    remaining = issue + extra + route - now
    if remaining >= route:
        return remaining - route, None
    return 0.0, max(0.0, remaining)


class _Window:
    """The bookkeeping of a plain schedule's connections (module docstring, "Connections"):
    per transfer its predecessor on its connection (``pred``, -1: none or not among its
    dependencies) and the transfer ``W`` places back on it (``back``, -1: none) — built once
    per schedule and width; completion times of transfers (with reductions) and arrival
    times of ranks, filled by the replay."""

    def __init__(self, network, schedule: Schedule, key_base: int, start: float,
                 width: int) -> None:
        n = len(schedule)
        self.net, self.schedule, self.key_base = network, schedule, key_base
        self.pred, self.back = self._links(schedule, width)
        #: whether a transfer that waits for nothing but its predecessor is issued at once
        #: (an explicit window) or when its predecessor completes (module docstring)
        self.lone = "window" in schedule.params
        self.done_at = array("d", [0.0]) * n
        self.arrived_at = dict.fromkeys(schedule.group, start)
        self._route_latency: dict[tuple[int, int, int], float] = {}

    @staticmethod
    def _links(schedule: Schedule, width: int) -> tuple[array, array]:
        """``pred`` and ``back`` of every transfer, memoised on the schedule per width."""
        memo = schedule.__dict__.setdefault("_connection_links", {})
        got = memo.get(width)
        if got is not None:
            return got
        n = len(schedule)
        src, dst, chan = schedule.src, schedule.dst, schedule.channel
        dep_start, dep_index = schedule.dep_start, schedule.dep_index
        pred = array("l", [-1]) * n
        back = array("l", [-1]) * n
        on: dict[tuple[int, int, int], list[int]] = {}
        for i in range(n):
            seen = on.setdefault((src[i], dst[i], chan[i]), [])
            if seen and seen[-1] in dep_index[dep_start[i]:dep_start[i + 1]]:
                pred[i] = seen[-1]
            if len(seen) >= width:
                back[i] = seen[-width]
            seen.append(i)
        memo[width] = (pred, back)
        return pred, back

    @classmethod
    def of(cls, network, schedule: Schedule, key_base: int, start: float) -> "_Window | None":
        """The bookkeeping of ``schedule`` if its connections keep several messages in flight
        (:func:`connection_slots` > 1)."""
        width = connection_slots(schedule)
        return cls(network, schedule, key_base, start, width) if width > 1 else None

    def _latency(self, i: int) -> float:
        """Route latency of transfer ``i`` on its ECMP key (s), memoised per connection."""
        sch = self.schedule
        conn = (sch.src[i], sch.dst[i], sch.channel[i])
        got = self._route_latency.get(conn)
        if got is None:
            got = self._route_latency[conn] = _route_latency(self.net, conn[0], conn[1],
                                                             self.key_base + conn[2])
        return got

    def left(self, i: int, extra: float, now: float) -> tuple[float, float | None]:
        """What transfer ``i`` (with a predecessor, which completed at or before ``now``)
        still pays: its issue time is the latest completion of its other dependencies and of
        ``back[i]`` and its endpoints' arrivals; of its latency ``extra + route`` the part
        after ``now`` is left (:func:`_credit_left`). Issued ``now`` (its predecessor was not
        the last thing it waited for): ``(extra, None)``, its whole latency, as without
        credit."""
        sch = self.schedule
        issue = max(self.arrived_at[sch.src[i]], self.arrived_at[sch.dst[i]])
        p, done = self.pred[i], self.done_at
        deps = sch.dep_index[sch.dep_start[i]:sch.dep_start[i + 1]]
        if not self.lone and len(deps) == 1:
            return extra, None
        for d in deps:
            if d != p and done[d] > issue:
                issue = done[d]
        if self.back[i] >= 0 and done[self.back[i]] > issue:
            issue = done[self.back[i]]
        if issue >= now:
            return extra, None
        return _credit_left(issue, extra, self._latency(i), now)


def _route_latency(network, src: int | str, dst: int | str, key: int) -> float:
    """Route latency (s) of ``src -> dst`` on ECMP key ``key`` (0 for a local copy)."""
    resolve = network.topology.resolve
    a, b = resolve(src), resolve(dst)
    return 0.0 if a == b else network.route(a, b, key).latency


#: per network: (protocol name, algorithm, network overhead s, lane family or None) ->
#: {(source, destination): software step latency (s)} — see :class:`_Charges`
_STEP_EXTRAS: "weakref.WeakKeyDictionary[object, dict[tuple, dict]]" = weakref.WeakKeyDictionary()


class _Charges:
    """What a protocol adds to each transfer of a schedule: the wire factor of its bytes and
    its software step latency ``max(0, NCCL hop latency - route latency)`` (s), per
    (source, destination), memoised (:mod:`dessim.collectives.protocols`).

    The step latency is a function of the protocol's name, the algorithm, the ring's network
    overhead and the pair's route (key 0) on the network alone, so its memo is shared by
    every schedule run on one network with the same (protocol, algorithm, overhead): an
    all-to-all replayed thousands of times pays its link classes once per pair, not once per
    pair and run. With a lane family, a pair's value is kept in the family's own table only
    once every image of the pair was found to pay the same latency (a refusal is raised again
    on the next call, never memoised)."""

    def __init__(self, network, protocol: Protocol, schedule: Schedule,
                 family: LaneFamily | None = None) -> None:
        self.net = network
        self.family = family
        self.protocol = protocol
        self.algorithm = algorithm = schedule.algorithm
        self.factor = protocol.wire_factor
        self.overhead = 0.0
        if not protocol.is_raw and algorithm in ("ring", "dbtree"):
            topo = network.topology
            comm = schedule.communicator
            nodes = len(host_map(topo).split(comm))
            if algorithm == "dbtree":
                self.factor = wire_factor(protocol, algorithm, schedule.op.name,
                                          arch_of(topo, comm[0]), nodes)
            elif nodes > 1:
                self.overhead = net_overhead(protocol, algorithm,
                                             topo.meta.get("cpu_vendor") == "amd")
        tables = _STEP_EXTRAS.get(network)
        if tables is None:
            tables = _STEP_EXTRAS[network] = {}
        base = (protocol.name, algorithm, self.overhead)
        #: (src, dst) -> software latency, checked against ``family``'s images when it has one
        self._extra: dict[tuple, float] = tables.setdefault(base + (family,), {})
        #: (src, dst) -> software latency of the pair alone (shared with runs without family)
        self._plain: dict[tuple, float] = (self._extra if family is None
                                           else tables.setdefault(base + (None,), {}))

    def extra(self, src: int | str, dst: int | str) -> float:
        if self.protocol.is_raw or (isinstance(src, str) and isinstance(dst, str)):
            return 0.0          # raw model, or a step inside the network (switch to switch)
        got = self._extra.get((src, dst))
        if got is None:
            got = self._pair_extra(src, dst)
            if self.family is not None:
                for a, b, _ in self.family.images(src, dst, 0):
                    if self._pair_extra(a, b) != got:
                        raise QuotientBroken(f"{self.algorithm} transfer {src} -> {dst}: its lane "
                                             f"image {a} -> {b} pays another software latency")
                self._extra[(src, dst)] = got
        return got

    def _pair_extra(self, src: int | str, dst: int | str) -> float:
        """:meth:`_step_extra` of one pair, memoised in the shared table of pairs alone."""
        got = self._plain.get((src, dst))
        if got is None:
            got = self._plain[(src, dst)] = self._step_extra(src, dst)
        return got

    def _step_extra(self, src: int | str, dst: int | str) -> float:
        """The software latency of ``src -> dst``, computed (not memoised)."""
        resolve = self.net.topology.resolve
        a, b = resolve(src), resolve(dst)
        if a == b:
            return 0.0
        route = self.net.route(a, b)
        step = self.protocol.step_latency(
            self.algorithm, link_class(self.net.topology.graph, route.path), self.overhead)
        return max(0.0, step - route.latency)

    def hop_latency(self, src: int | str, dst: int | str) -> float:
        """Route latency plus software latency of one transfer ``src -> dst`` (s)."""
        resolve = self.net.topology.resolve
        a, b = resolve(src), resolve(dst)
        return (0.0 if a == b else self.net.route(a, b).latency) + self.extra(src, dst)

    def step_extras(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray | float:
        """Software latency of each member of a step (a float when they are all equal)."""
        out = np.fromiter((self.extra(a, b) for a, b in zip(src.tolist(), dst.tolist())),
                          dtype=float, count=len(src))
        return float(out[0]) if len(out) and (out == out[0]).all() else out


def _with_call_latency(env: simpy.Environment, group: tuple[int, ...],
                       arrivals: dict[int, simpy.Event] | None, latency: float
                       ) -> dict[int, simpy.Event] | None:
    """Arrivals delayed by the call latency: a rank takes part ``latency`` seconds after it
    arrives (now, for ranks without an arrival event).

    Ranks that share one arrival event (the images of one folded rank in a merged run) share
    one delayed event, and keep the order they have in ``arrivals``; ranks without a pending
    arrival follow, in rank order — the order in which the replay then calls them
    (:class:`_PlanRun`), the order one event per rank would have called them in."""
    if latency <= 0:
        return arrivals
    out: dict[int, simpy.Event] = {}
    now_ready = env.timeout(latency)
    members = set(group)
    delayed: dict[int, simpy.Event] = {}          # id(arrival event) -> its delayed event
    for r, ev in (arrivals or {}).items():
        if r not in members or (ev.triggered and ev.processed):
            continue
        late = delayed.get(id(ev))
        if late is None:
            late = delayed[id(ev)] = env.event()
            ev.callbacks.append(lambda _e, late=late: env.timeout(latency).callbacks.append(
                lambda _e2, late=late: late.succeed()))
        out[r] = late
    for r in sorted(members.difference(out)):
        out[r] = now_ready
    return out


#: Steps of at most this many members are accounted with a plain loop (speed only).
_SMALL_STEP = 32

#: Steps with fewer members than this start member by member when their routes depend on
#: the ECMP key: grouping a handful of transfers costs more than it saves (speed only).
MIN_GROUPED_STEP = 4


def _per_transfer(plan, of_step: Callable[[int], object]) -> array:
    """A per-transfer column of a compact plan from per-step values: ``of_step(s)`` is a
    number for every member of step ``s``, or one value per member."""
    out = np.empty(plan.transfers)
    for s, (a, b) in enumerate(zip(plan.offset, plan.offset[1:])):
        out[a:b] = of_step(s)
    col = array("d")
    col.frombytes(out.tobytes())
    return col


@dataclass
class _PlanStatic:
    """What every replay of one :class:`CompactSchedule` shares (built once per schedule:
    a training iteration replays the same collective thousands of times)."""

    sizes: list[int]                 #: members per step
    succ: list[list[int]]            #: steps that follow each step
    pos: dict[int, int]              #: rank -> position in the group
    src_pos: list[np.ndarray]        #: per pattern: group positions of the senders
    dst_pos: list[np.ndarray]        #: per pattern: group positions of the receivers
    left: np.ndarray                 #: per group position: transfers it takes part in
    pattern_ranks: list[frozenset]   #: per pattern: the ranks it touches
    roots: list[int]                 #: steps without a previous step, in order
    idle: list[int]                  #: ranks without a transfer, in group order
    #: per (network, protocol): software latency per pattern (filled lazily by the runs)
    delays: dict = field(default_factory=dict)
    #: per (pattern, previous step's pattern): each member's predecessor on its connection
    #: in the previous step (-1: none among its dependencies) and its other dependencies,
    #: filled lazily (connection credits)
    preds: dict = field(default_factory=dict)
    #: per (step, slots): what a credit reads for the step's members, filled lazily
    links: dict = field(default_factory=dict)
    #: per pattern: its arrays as lists (:class:`_PatternLists`), filled lazily by
    #: :meth:`lists`
    pattern_lists: dict = field(default_factory=dict)

    def lists(self, pid: int, pattern) -> "_PatternLists":
        """Pattern ``pid`` (``pattern``, its :class:`~dessim.collectives.schedule` arrays) as
        lists of ints, built at its first use."""
        got = self.pattern_lists.get(pid)
        if got is None:
            got = self.pattern_lists[pid] = _PatternLists(
                pattern.src.tolist(), pattern.dst.tolist(), self.src_pos[pid].tolist(),
                self.dst_pos[pid].tolist(), pattern.dep_count.tolist())
        return got


class _PatternLists(NamedTuple):
    """One pattern's per-member arrays as lists of ints: the per-member paths of a replay
    (starting, tracking, accounting a member) index them, which is cheaper than numpy
    scalars."""

    src: list[int]         #: senders (ranks)
    dst: list[int]         #: receivers (ranks)
    src_pos: list[int]     #: senders' group positions
    dst_pos: list[int]     #: receivers' group positions (an orbit's: its representative's)
    dep_count: list[int]   #: each member's dependency count


def _plan_static(schedule: CompactSchedule) -> _PlanStatic:
    got = schedule.__dict__.get("_run_static")
    if got is not None:
        return got
    plan, group = schedule.plan, schedule.group
    sizes = [len(plan.patterns[k]) for k in plan.pattern]
    succ: list[list[int]] = [[] for _ in range(len(plan))]
    for s, q in enumerate(plan.prev):
        if q >= 0:
            succ[q].append(s)
    pos_arr = np.full(max(group) + 1, -1, dtype=np.int64)
    pos_arr[list(group)] = np.arange(len(group))
    src_pos = [pos_arr[p.src] for p in plan.patterns]
    acct = pos_arr
    if schedule.account is not None:      # an orbit's receiver is counted for its representative
        acct = pos_arr.copy()
        for g, r in schedule.account.items():
            acct[g] = pos_arr[r]
    dst_pos = [acct[p.dst] for p in plan.patterns]
    left = np.zeros(len(group), dtype=np.int64)
    uses = np.bincount(np.asarray(plan.pattern, dtype=np.int64), minlength=len(plan.patterns))
    for k, times in enumerate(uses.tolist()):
        if times:
            left += times * (np.bincount(src_pos[k], minlength=len(group))
                             + np.bincount(dst_pos[k], minlength=len(group)))
    static = _PlanStatic(sizes, succ, {r: k for k, r in enumerate(group)}, src_pos, dst_pos,
                         left, [frozenset(p.src.tolist()) | frozenset(p.dst.tolist())
                                for p in plan.patterns],
                         [s for s, q in enumerate(plan.prev) if q < 0],
                         [r for k, r in enumerate(group) if left[k] == 0])
    schedule.__dict__["_run_static"] = static
    return static


class _PlanRun:
    """Replay of a :class:`CompactSchedule` step by step (see the module docstring)."""

    def __init__(self, network, schedule: CompactSchedule, arrivals: dict[int, simpy.Event] | None,
                 reduction_bw: float | None, key_base: int, bundles: bool,
                 charges: _Charges, family: LaneFamily | None = None) -> None:
        self.net = network
        self.family = family
        self.env: simpy.Environment = network.env
        self.plan = plan = schedule.plan
        self.charges = charges
        self.factor = charges.factor
        #: per pattern: software latency of its members (0.0, a float, or one per member)
        static = _plan_static(schedule)
        #: per pattern: software latency of its members (0.0, a float, or one per member);
        #: shared by the runs of this schedule with the same charges (same network and protocol)
        self.delays: dict[int, list[float] | float] = static.delays.setdefault(
            (network, charges.protocol), {})
        self.reduction_bw = reduction_bw
        self.key_base = key_base
        self.bundles = bundles
        self.static = static
        #: messages in flight per connection (module docstring, "Connections"); 1: no credit
        self.slots = connection_slots(schedule)
        env = self.env
        nsteps = len(plan)
        self.sizes = static.sizes
        self.succ = static.succ
        self.left_in_step = list(self.sizes)
        nan = math.nan
        self.step_start = [nan] * nsteps
        self.step_finish = [nan] * nsteps
        self.member_start: dict[int, array] = {}     # steps not started as a whole
        self.member_finish: dict[int, array] = {}    # steps not finished as a whole
        self.step_release = [nan] * nsteps            # completion with reduction (credits)
        self.member_release: dict[int, array] = {}    # steps not released as a whole
        self.route_latency: dict[tuple[int, int, int], float] = {}
        self.waiting: dict[int, list[int]] = {}      # steps tracked member by member
        self.templates: dict[int, object] = {}
        self.batch: dict[int, list[int]] = {}         # members ready at this instant
        self.flush_armed = False
        self.rdeps: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        # per-rank transfer counts, by position in the group
        group = schedule.group
        self.group = group
        self.pos = static.pos
        self.src_pos = static.src_pos
        self.dst_pos = static.dst_pos
        self.left = left = static.left.copy()
        #: the same counts as a memoryview (one buffer): per-member updates without numpy
        #: scalars
        self.left_mv = memoryview(left)
        self.pattern_ranks = static.pattern_ranks
        self.released = 0
        self.ranks_left = len(group)
        self.run = ScheduleRun(schedule, env.now, env.event(), self._transfer_times(True),
                               self._transfer_times(False))
        for r in group:
            self.run.rank_events[r] = env.event()
        self.absent: set[int] = set()
        if arrivals:
            self.absent = {r for r, ev in arrivals.items()
                           if r in self.pos and not (ev.triggered and ev.processed)}
        self.arrived_at: dict[int, float] = {}       # ranks absent at the start: when they came
        self.touching: dict[int, list[tuple[int, int]]] = {r: [] for r in self.absent}
        # in the order of ``arrivals``: ranks that share an event take part in that order
        # (with one event each, the order of their events decides, not this one)
        for r in [r for r in arrivals or () if r in self.absent]:
            arrivals[r].callbacks.append(lambda _e, r=r: self._arrived(r))
        for r in static.idle:
            if r not in self.absent:
                self._rank_finished(r)
        for s in static.roots:
            self._start_step(s)
        self._check_done()

    # ------------------------------------------------------------ records
    def _transfer_times(self, starts: bool) -> Callable[[], array]:
        whole = self.step_start if starts else self.step_finish
        parts = self.member_start if starts else self.member_finish
        return lambda: _per_transfer(self.plan, lambda s: parts[s] if s in parts else whole[s])

    # ------------------------------------------------------------ starting
    def _start_step(self, s: int) -> None:
        """Every member of step ``s`` is ready now, apart from ranks that have not arrived."""
        pid = self.plan.pattern[s]
        if self.absent and not self.absent.isdisjoint(self.pattern_ranks[pid]):
            w = self._track(s)
            for i, count in enumerate(w):
                if count == 0:
                    self._ready(s, i)
            return
        self._launch(s, None)

    def _delays(self, pid: int) -> list[float] | float:
        """Software latency (s) of pattern ``pid``'s members: one float when they are all
        equal, else a list (Python floats: the very values, cheaper to index per member)."""
        got = self.delays.get(pid)
        if got is None:
            pat = self.plan.patterns[pid]
            got = self.charges.step_extras(pat.src, pat.dst)
            if not isinstance(got, float):
                got = got.tolist()
            self.delays[pid] = got
        return got

    def _launch(self, s: int, members: list[int] | None) -> None:
        """Start ``members`` of step ``s`` (None: the whole step) after their software
        latency: at once when it is 0, else after one timeout per distinct latency."""
        d = self._delays(self.plan.pattern[s])
        if isinstance(d, float):
            if d <= 0:
                self._start_now(s, members)
            else:
                self.env.timeout(d).callbacks.append(lambda _e: self._start_now(s, members))
            return
        chosen = range(self.sizes[s]) if members is None else members
        parts: dict[float, list[int]] = {}
        for i in chosen:
            got = parts.get(d[i])
            if got is None:
                parts[d[i]] = [i]
            else:
                got.append(i)
        if s not in self.member_start:
            self.member_start[s] = array("d", [math.nan]) * self.sizes[s]
        for delay, part in sorted(parts.items()):
            if delay <= 0:
                self._start_now(s, part)
            else:
                self.env.timeout(delay).callbacks.append(
                    lambda _e, part=part: self._start_now(s, part))

    def _start_now(self, s: int, members: list[int] | None) -> None:
        if members is None:
            self._start_whole(s)
            return
        if s not in self.member_start:
            self.member_start[s] = array("d", [math.nan]) * self.sizes[s]
        self._start_grouped(s, members, self._groups(s, members))

    def _start_whole(self, s: int) -> None:
        """Start all members of step ``s`` now: one bundle if the network can carry them so."""
        self.step_start[s] = self.env.now
        template = self._template(self.plan.pattern[s]) if self.bundles else None
        if template is not None:
            self.run.bundles_started += 1
            self.net.start_bundle(template, self.plan.nbytes[s] * self.factor,
                                  _Done(self, s, None))
            return
        # routes depend on each transfer's ECMP key: exact bundle groups, the rest one by one
        members = range(self.sizes[s])
        groups = self._groups(s, None)
        if groups is not None:
            self.member_finish.setdefault(s, array("d", [math.nan]) * self.sizes[s])
        self._start_grouped(s, members, groups)

    def _groups(self, s: int, members: list[int] | None):
        """Exact bundle groups of ``members`` of step ``s`` (None: the whole step), each with
        its own ECMP route; None when bundles are
        off, the network has none, no group is one, or there are too few to gain."""
        count = self.sizes[s] if members is None else len(members)
        if not self.bundles or count < MIN_GROUPED_STEP:
            return None
        pat = self.plan.patterns[self.plan.pattern[s]]
        src, dst = (pat.src, pat.dst) if members is None else (pat.src[members], pat.dst[members])
        # cached per pair list by the network: the same members of the same step recur in
        # every run of this collective (their software latencies split steps the same way)
        groups = self.net.bundle_groups(src.tolist(), dst.tolist(),
                                        self.key_base + self.plan.channel[s], family=self.family)
        if groups is None or all(t is None for t, _ in groups):
            return None
        return groups

    def _start_grouped(self, s: int, members: Sequence[int], groups,
                       head: float | None = None) -> None:
        """Start ``members`` of step ``s`` now, paying ``head`` s of their route latency
        (None: all of it): by ``groups`` (indices into ``members``; template None: one by
        one) or, without groups, one by one."""
        if groups is None:
            for i in members:
                self._start_member(s, i, head)
            return
        now, starts = self.env.now, self.member_start.get(s)
        for template, idx in groups:
            mine = [members[k] for k in idx]
            if template is None:
                for i in mine:
                    self._start_member(s, i, head)
                continue
            if starts is not None:
                for i in mine:
                    starts[i] = now
            self.run.bundles_started += 1
            self.net.start_bundle(template, self.plan.nbytes[s] * self.factor,
                                  _Done(self, s, mine), latency=head)

    def _ready(self, s: int, i: int) -> None:
        """Member ``i`` of step ``s`` became ready now (member-by-member tracking). Starts are
        collected until the end of the instant (a wake-up after every ordinary event of this
        time, :data:`~dessim.network.flow.WAKE_PRIORITY`): if by then the whole step is ready
        — e.g. ranks that arrived one by one at the same time — it starts as a whole (a
        bundle) again. Every start still happens at this instant, so no time changes."""
        batch = self.batch.get(s)
        if batch is None:
            batch = self.batch[s] = []
        batch.append(i)
        if not self.flush_armed:
            self.flush_armed = True
            ev = simpy.Event(self.env)
            ev._ok, ev._value = True, None
            ev.callbacks.append(self._flush)
            self.env.schedule(ev, WAKE_PRIORITY, 0)

    def _flush(self, _event: simpy.Event) -> None:
        self.flush_armed = False
        batch, self.batch = self.batch, {}
        for s, members in batch.items():
            if self.slots > 1 and self.plan.prev[s] >= 0:
                members = self._credited(s, members)
                if not members:
                    continue
            if len(members) == self.sizes[s] and s not in self.member_start:
                self._launch(s, None)
                continue
            # members ready together, not the whole step: in a ring that fell out of
            # lockstep (connections of unequal latency), those at the same distance from
            # the slow connections — exact bundle groups where the network has them
            self._launch(s, members)


    # ------------------------------------------------------------ connection credits
    def _credited(self, s: int, members: list[int]) -> list[int]:
        """Start the members of step ``s`` that are ready now with a latency credit (module
        docstring, "Connections": their predecessor on the connection completed last, after
        the rest of what they wait for) as transfers of their own; return the others."""
        plan = self.plan
        q = plan.prev[s]
        if plan.channel[q] != plan.channel[s]:
            return members
        links = self._links(s)
        now = self.env.now
        rest = []
        d = None
        # members that pay the same: one start (exact bundle groups where the network has them)
        parts: dict[tuple[float, float | None], list[int]] = {}
        issued = self._issue_of(s, links)
        for i in members:
            issue = issued(i)
            if issue >= now:
                rest.append(i)
                continue
            if d is None:
                d = self._delays(plan.pattern[s])
            extra = d if isinstance(d, float) else d[i]
            route = self._route(links[1][i], links[2][i], plan.channel[s])
            parts.setdefault(_credit_left(issue, extra, route, now), []).append(i)
        if parts and s not in self.member_start:
            self.member_start[s] = array("d", [math.nan]) * self.sizes[s]
        for (delay, head), part in parts.items():
            if delay > 0:
                self.env.timeout(delay).callbacks.append(
                    lambda _e, part=part: self._start_grouped(s, part, self._groups(s, part)))
            else:
                self._start_grouped(s, part, self._groups(s, part), head)
        return rest

    def _pair(self, s: int) -> tuple[list[int], list[tuple[int, ...] | None]]:
        """Per member of step ``s`` (pattern pair with the previous step's, memoised for the
        schedule): its predecessor on its connection among its dependencies in the previous
        step (same source and destination; the caller checks the channel; -1: none) and its
        other dependencies (None: it gets no credit — it has no predecessor, or a predecessor
        and nothing else; module docstring)."""
        plan = self.plan
        key = (plan.pattern[s], plan.pattern[plan.prev[s]])
        got = self.static.preds.get(key)
        if got is None:
            pat, before = plan.patterns[key[0]], plan.patterns[key[1]]
            src, dst = pat.src.tolist(), pat.dst.tolist()
            bsrc, bdst = before.src.tolist(), before.dst.tolist()
            start, index = pat.dep_start.tolist(), pat.dep_index.tolist()
            preds, others = [], []
            for i in range(len(pat)):
                deps = index[start[i]:start[i + 1]]
                j = next((j for j in deps if bsrc[j] == src[i] and bdst[j] == dst[i]), -1)
                preds.append(j)
                rest = tuple(x for x in deps if x != j)
                others.append(rest if j >= 0 and rest else None)
            got = self.static.preds[key] = (preds, others)
        return got

    def _links(self, s: int):
        """What :meth:`_issue_of` reads for step ``s``: its members' other dependencies, their
        ranks, and the transfer ``slots`` places back on each member's connection as
        ``(step, member per member)`` (None when the chain of predecessors is shorter) —
        memoised for the schedule."""
        key = (s, self.slots)
        got = self.static.links.get(key)
        if got is None:
            plan = self.plan
            preds, others = self._pair(s)
            pat = plan.patterns[plan.pattern[s]]
            back = None
            q, kmap = plan.prev[s], list(preds)
            for _ in range(self.slots - 1):
                q2 = plan.prev[q]
                if q2 < 0 or plan.channel[q2] != plan.channel[q]:
                    break
                step = self._pair(q)[0]
                kmap = [step[k] if k >= 0 else -1 for k in kmap]
                q = q2
            else:
                back = (q, kmap)
            got = self.static.links[key] = (others, pat.src.tolist(), pat.dst.tolist(), back)
        return got

    def _issue_of(self, s: int, links) -> Callable[[int], float]:
        """When each member ``i`` of step ``s`` was issued (``links``: :meth:`_links` of
        ``s``), as a function of ``i``: the latest completion of its dependencies other than
        its predecessor, of the transfer ``slots`` places back on its connection and its
        endpoints' arrivals; now when it has no predecessor or waits for it alone (no
        credit: module docstring). What it reads for every member is looked up once per
        step (nothing of it changes while a batch of members is credited: releases and
        arrivals are recorded by completions and arrivals, not by starts)."""
        others, src, dst, back = links
        now = self.env.now
        q = self.plan.prev[s]
        start = self.run.start_time
        arrived = self.arrived_at
        rel = self.member_release.get(q)
        step_rel = self.step_release[q] if rel is None else None
        if back is not None:
            back_k = back[1]
            back_rel = self.member_release.get(back[0])
            back_step = self.step_release[back[0]] if back_rel is None else None

        def issued(i: int) -> float:
            mine = others[i]
            if mine is None:
                return now
            issue = max(arrived.get(src[i], start), arrived.get(dst[i], start))
            if rel is None:
                if step_rel > issue:
                    issue = step_rel
            else:
                for d in mine:
                    if rel[d] > issue:
                        issue = rel[d]
            if back is not None:
                k = back_k[i]
                if k >= 0:
                    t = back_step if back_rel is None else back_rel[k]
                    if t > issue:
                        issue = t
            return issue
        return issued

    def _route(self, src: int, dst: int, channel: int) -> float:
        """Route latency (s) of ``src -> dst`` on ``channel``'s ECMP key."""
        conn = (src, dst, self.key_base + channel)
        got = self.route_latency.get(conn)
        if got is None:
            got = self.route_latency[conn] = _route_latency(self.net, *conn)
        return got

    def _template(self, pid: int):
        if pid not in self.templates:
            pat = self.plan.patterns[pid]
            self.templates[pid] = self.net.bundle_template(pat.src.tolist(), pat.dst.tolist(),
                                                           family=self.family)
        return self.templates[pid]

    def _track(self, s: int) -> list[int]:
        """Per-member readiness counters of step ``s`` (dependencies + absent endpoints)."""
        w = self.waiting.get(s)
        if w is not None:
            return w
        pid = self.plan.pattern[s]
        pat = self.plan.patterns[pid]
        if self.plan.prev[s] >= 0:
            w = list(self.static.lists(pid, pat).dep_count)
        else:
            w = [0] * len(pat)
        if self.absent:
            for i, (a, b) in enumerate(zip(pat.src.tolist(), pat.dst.tolist())):
                for r in (a, b):
                    if r in self.absent:
                        w[i] += 1
                        self.touching[r].append((s, i))
        self.waiting[s] = w
        return w

    def _start_member(self, s: int, i: int, head: float | None = None) -> None:
        """Start member ``i`` of step ``s`` now, paying ``head`` s of its route latency
        (None: all of it)."""
        now = self.env.now
        starts = self.member_start.get(s)
        if starts is None:
            self.step_start[s] = now  # started whole, member by member
        else:
            starts[i] = now
        plan = self.plan
        pid = plan.pattern[s]
        lists = self.static.lists(pid, plan.patterns[pid])
        ev = self.net.transfer(lists.src[i], lists.dst[i], plan.nbytes[s] * self.factor,
                               key=self.key_base + plan.channel[s], family=self.family,
                               latency=head)
        one = (i,)
        ev.callbacks.append(lambda _e: self._transfer_done(s, one))

    # ------------------------------------------------------------ completion
    def _transfer_done(self, s: int, members: Sequence[int]) -> None:
        now = self.env.now
        m = self.sizes[s]
        whole = len(members) == m and s not in self.member_finish
        if whole:
            self.step_finish[s] = now
        else:
            fin = self.member_finish.get(s)
            if fin is None:
                fin = self.member_finish[s] = array("d", [math.nan]) * m
            for i in members:
                fin[i] = now
        if whole:
            self._account(self.src_pos[self.plan.pattern[s]])
        else:
            self._account_each(self._pos_list(self.plan.pattern[s], 0), members)
        red = self.plan.reduce_bytes[s]
        if self.reduction_bw and red > 0:
            self.env.timeout(red / self.reduction_bw).callbacks.append(
                lambda _e: self._release(s, members, whole))
        else:
            self._release(s, members, whole)

    def _done_each(self, s: int, members: Sequence[int]) -> None:
        """Members of step ``s`` finished now, reported one at a time in this order: the
        effect of ``self._transfer_done(s, (i,))`` for each ``i`` in turn (the members of a
        split bundle that finish together, :func:`~dessim.network.flow._report`), with the
        per-step lookups done once. Steps of one member and steps with a reduction cost
        take those calls themselves. Keep in step with :meth:`_transfer_done` and
        :meth:`_release` (tests/test_executor_each.py compares the two)."""
        plan = self.plan
        m = self.sizes[s]
        if m == 1 or (self.reduction_bw and plan.reduce_bytes[s] > 0):
            for i in members:
                self._transfer_done(s, (i,))
            return
        now = self.env.now
        fin = self.member_finish.get(s)
        if fin is None:
            fin = self.member_finish[s] = array("d", [math.nan]) * m
        pid = plan.pattern[s]
        src_pos, dst_pos = self._pos_list(pid, 0), self._pos_list(pid, 1)
        left, group = self.left_mv, self.group
        nexts = [(s2, self._track(s2)) + self._reverse(s2, s) for s2 in self.succ[s]]
        ready, finished, check = self._ready, self._rank_finished, self._check_done
        left_in_step = self.left_in_step
        rel = None                                   # _release's record for credits
        if self.slots > 1:
            rel = self.member_release.get(s)
            if rel is None:
                rel = self.member_release[s] = array("d", [math.nan]) * m
        for i in members:
            fin[i] = now
            k = src_pos[i]                           # _account of the sender
            left[k] -= 1
            if left[k] == 0:
                finished(group[k])
            if rel is not None:                      # _release
                rel[i] = now
            self.released += 1
            left_in_step[s] -= 1
            for s2, w, rstart, rindex in nexts:
                for x in range(rstart[i], rstart[i + 1]):
                    j = rindex[x]
                    w[j] -= 1
                    if w[j] == 0:
                        ready(s2, j)
            k = dst_pos[i]                           # _account of the receiver
            left[k] -= 1
            if left[k] == 0:
                finished(group[k])
            check()

    def _release(self, s: int, members: Sequence[int], whole: bool) -> None:
        """Members of step ``s`` (and their reductions) are complete: wake dependents."""
        if self.slots > 1:
            now = self.env.now
            if whole:
                self.step_release[s] = now
            else:
                rel = self.member_release.get(s)
                if rel is None:
                    rel = self.member_release[s] = array("d", [math.nan]) * self.sizes[s]
                for i in members:
                    rel[i] = now
        self.released += len(members)
        self.left_in_step[s] -= len(members)
        for s2 in self.succ[s]:
            if whole and s2 not in self.waiting:
                self._start_step(s2)
                continue
            w = self._track(s2)
            rstart, rindex = self._reverse(s2, s)
            for j in members:
                for k in range(rstart[j], rstart[j + 1]):
                    i = rindex[k]
                    w[i] -= 1
                    if w[i] == 0:
                        self._ready(s2, i)
        if whole:
            self._account(self.dst_pos[self.plan.pattern[s]])
        else:
            self._account_each(self._pos_list(self.plan.pattern[s], 1), members)
        self._check_done()

    def _reverse(self, s2: int, s: int) -> tuple[list[int], list[int]]:
        """For member j of step s (the previous step of s2): dependents in s2, as CSR."""
        key = (self.plan.pattern[s2], self.sizes[s])
        found = self.rdeps.get(key)
        if found is None:
            pat: StepPattern = self.plan.patterns[key[0]]
            owner = np.repeat(np.arange(len(pat)), pat.dep_count)
            order = np.argsort(pat.dep_index, kind="stable")
            counts = np.bincount(pat.dep_index, minlength=self.sizes[s])
            start = np.concatenate([[0], np.cumsum(counts)])
            found = self.rdeps[key] = (start.tolist(), owner[order].tolist())
        return found

    def _account(self, positions: np.ndarray) -> None:
        """One transfer fewer for the ranks at ``positions`` (a whole step; some members:
        :meth:`_account_each`); finish those at 0 (in position order)."""
        left = self.left
        if len(positions) <= _SMALL_STEP:      # plain loop: cheaper than numpy here
            pos = positions.tolist()
            for k in pos:
                left[k] -= 1
            done = sorted({k for k in pos if left[k] == 0})
        else:
            np.subtract.at(left, positions, 1)
            done = np.unique(positions[left[positions] == 0]).tolist()
        for k in done:
            self._rank_finished(self.group[k])

    def _pos_list(self, pid: int, side: int) -> list[int]:
        """``src_pos[pid]`` (``side`` 0) or ``dst_pos[pid]`` (1) as a list (memoised)."""
        lists = self.static.lists(pid, self.plan.patterns[pid])
        return lists.dst_pos if side else lists.src_pos

    def _account_each(self, positions: list[int], members: Sequence[int]) -> None:
        """:meth:`_account` of some members of a step (not the whole step): ``positions`` as a
        list; the ranks that reach 0 finish in member order."""
        left = self.left_mv
        done = []
        for i in members:
            k = positions[i]
            left[k] -= 1
            if left[k] == 0:
                done.append(k)
        for k in done:
            self._rank_finished(self.group[k])

    def _rank_finished(self, r: int) -> None:
        self.run.rank_finish[r] = self.env.now
        self.run.rank_events[r].succeed(self.env.now)
        self.ranks_left -= 1
        self._check_done()

    def _check_done(self) -> None:
        run = self.run
        if self.released == self.plan.transfers and self.ranks_left == 0 and not run.done.triggered:
            run.finish_time = self.env.now
            run.done.succeed(self.env.now)

    def _arrived(self, r: int) -> None:
        self.absent.discard(r)
        self.arrived_at[r] = self.env.now
        if self.left[self.pos[r]] == 0:
            self._rank_finished(r)
        for s, i in self.touching.pop(r):
            w = self.waiting[s]
            w[i] -= 1
            if w[i] == 0:
                self._ready(s, i)


class _Done:
    """What a bundle of step ``s`` reports to (``mine``: the step's members it carries, in
    its order; None: the whole step): ``run._transfer_done`` with those members, or one at a
    time through ``each`` (:meth:`_PlanRun._done_each`)."""

    __slots__ = ("run", "s", "mine")

    def __init__(self, run: "_PlanRun", s: int, mine: list[int] | None) -> None:
        self.run, self.s, self.mine = run, s, mine

    def __call__(self, done: Sequence[int]) -> None:
        mine = self.mine
        self.run._transfer_done(self.s, done if mine is None else [mine[k] for k in done])

    def each(self, done: Sequence[int]) -> None:
        mine = self.mine
        self.run._done_each(self.s, done if mine is None else [mine[k] for k in done])


class _Stream(NamedTuple):
    """One streamed channel of a pipelined schedule."""

    route: Route        #: the coupled route of its connections (latency: one hop's, s)
    nbytes: float       #: wire bytes per connection over all steps
    channel: int
    tail_s: float       #: latency of the remaining hops, paid after the last byte (s)
    head_s: float = 0.0  #: software latency of the first hop, before the bytes move (s)


def _streams(network, schedule: CompactSchedule, key_base: int,
             charges: "_Charges") -> list[_Stream] | None:
    """The streamed channels of a pipelined ``schedule``; None if it cannot be streamed.
    A hop's latency is the largest of the channel's connections' latencies, software step
    latency included (:meth:`_Charges.hop_latency`)."""
    found = pipelines(schedule.plan)
    if found is None:
        return None
    out = []
    for pipe in found:
        route = network.coupled_route(pipe.src.tolist(), pipe.dst.tolist(), key_base + pipe.channel)
        if route is None:
            return None
        step = max(charges.hop_latency(a, b) for a, b in zip(pipe.src.tolist(), pipe.dst.tolist()))
        out.append(_Stream(route, pipe.nbytes * charges.factor, pipe.channel,
                           (pipe.hops - 1) * step, step - route.latency))
    return out


class _Together:
    """A replay that starts once every member has arrived and ends for every member at
    once (streamed rings, fluid pipelines): the arrival bookkeeping and the finish."""

    def _wait_for_members(self, schedule: Schedule, arrivals: dict[int, simpy.Event] | None) -> None:
        for r in schedule.group:
            self.run.rank_events[r] = self.env.event()
        absent = sorted(r for r, ev in (arrivals or {}).items()
                        if r in self.run.rank_events and not (ev.triggered and ev.processed))
        self.absent = len(absent)
        for r in absent:
            arrivals[r].callbacks.append(self._arrived)  # type: ignore[index]
        if not absent:
            self._start()

    def _arrived(self, _event: simpy.Event) -> None:
        self.absent -= 1
        if self.absent == 0:
            self._start()

    def _start(self) -> None:
        raise NotImplementedError

    def _finish_all(self) -> None:
        now = self.env.now
        run = self.run
        for r in run.schedule.group:
            run.rank_finish[r] = now
            run.rank_events[r].succeed(now)
        run.finish_time = now
        run.done.succeed(now)


class _StreamRun(_Together):
    """A pipelined schedule (rings) replayed as one coupled flow per channel.

    Model (NCCL's ring is a pipeline of flow-controlled connections: a rank forwards each
    slice as soon as it arrives, and a connection's bounded FIFO keeps it from running ahead
    of its upstream, so in steady state every connection of a channel moves data at the pace
    of the slowest): once every member has arrived, each channel starts ONE flow over all its
    connections' channels (:meth:`~dessim.network.base.Network.coupled_route`) carrying the
    bytes of one connection (``hops`` steps' worth). Latency ``L`` = the largest connection
    latency: the flow pays one ``L`` before its bytes move (the first slices reach the next
    rank) and ``(hops - 1) × L`` after (the last slices still travel the remaining hops), so
    its bandwidth phase starts when the step-by-step ring's does. The network shares each
    channel between the coupled flow and other traffic as it would with one connection; the
    flow's rate is its max-min share at its tightest channel. Every member finishes when all
    channels have.

    Relation to the step-by-step replay (the default): on an idle network where every
    connection pays one latency and the slowest connection is the same for all — a switch,
    one DGX node, one GPU per node on one leaf — both take
    ``hops × (latency + step bytes / rate)`` exactly (tests/test_stream_rings.py). Where the
    connections' latencies differ (a ring across DGX nodes, one crossing a spine) the stream
    over-estimates the latency, by at most ``hops × (largest − smallest latency)``: the step
    replay's connection credits (module docstring, "Connections") make a ring pay only the
    latency of its data's path, a stream pays the largest every hop. They also differ by how a ring's connections share a
    link with other traffic: a stream holds every connection at the slowest one's rate, a
    step-by-step connection runs at its own rate and then idles while it waits for its
    upstream, and other flows take the gap. Per-transfer records: each transfer of a channel
    is recorded with its channel's flow interval (bytes moving, then the tail latency).
    """

    def __init__(self, network, schedule: CompactSchedule, streams: list[_Stream],
                 arrivals: dict[int, simpy.Event] | None) -> None:
        self.net = network
        self.env: simpy.Environment = network.env
        self.schedule = schedule
        self.streams = streams
        env = self.env
        n_chan = len(streams)
        self.flow_start = [math.nan] * n_chan
        self.flow_finish = [math.nan] * n_chan
        self.run = ScheduleRun(schedule, env.now, env.event(), self._times(self.flow_start),
                               self._times(self.flow_finish))
        self.run.streamed = True
        self.left = n_chan
        self._wait_for_members(schedule, arrivals)

    def _times(self, per_channel: list[float]) -> Callable[[], array]:
        plan = self.schedule.plan
        index = {stream.channel: k for k, stream in enumerate(self.streams)}
        return lambda: _per_transfer(plan, lambda s: per_channel[index[plan.channel[s]]])

    def _start(self) -> None:
        now = self.env.now
        for k, stream in enumerate(self.streams):
            self.flow_start[k] = now
            if stream.head_s > 0:
                self.env.timeout(stream.head_s).callbacks.append(
                    lambda _e, k=k, stream=stream: self._flow(k, stream))
            else:
                self._flow(k, stream)

    def _flow(self, k: int, stream: _Stream) -> None:
        self.net.transfer_on(stream.route, stream.nbytes).callbacks.append(
            lambda _e, k=k, tail=stream.tail_s: self.env.timeout(tail).callbacks.append(
                lambda _e2, k=k: self._finished(k)))

    def _finished(self, k: int) -> None:
        now = self.env.now
        self.flow_finish[k] = now
        self.left -= 1
        if not self.left:
            self._finish_all()


class _FluidRun(_Together):
    """Replay of a :class:`~dessim.collectives.schedule.FluidSchedule`: once every member has
    arrived, every flow starts (after its software step latency), and when the last one
    ends, after the tail latency, every member finishes (see FluidSchedule)."""

    def __init__(self, network, schedule: FluidSchedule, arrivals: dict[int, simpy.Event] | None,
                 charges: _Charges, key_base: int) -> None:
        self.net = network
        self.env: simpy.Environment = network.env
        self.schedule = schedule
        self.charges = charges
        self.key_base = key_base
        n = len(schedule.flows)
        nan = math.nan
        self.run = ScheduleRun(schedule, self.env.now, self.env.event(), array("d", [nan]) * n,
                               array("d", [nan]) * n)
        self.left = n
        self.paid = 0.0           #: the largest latency a flow paid (route + software)
        self._wait_for_members(schedule, arrivals)


    def _start(self) -> None:
        sched = self.schedule
        if not sched.flows:
            self._finish_all()
            return
        self.critical = sum(self.charges.hop_latency(a, b) for a, b in sched.critical)
        if not self.charges.protocol.is_raw:
            self.critical += sched.serial_s
        factor = self.charges.factor
        now = self.env.now
        for i, f in enumerate(sched.flows):
            self.run.transfer_start[i] = now
            self.paid = max(self.paid, self.charges.hop_latency(f.src, f.dst))
            extra = self.charges.extra(f.src, f.dst)
            go = (lambda i=i, f=f: self.net.transfer(f.src, f.dst, f.nbytes * factor,
                                                     key=self.key_base + f.channel)
                  .callbacks.append(lambda _e, i=i: self._done(i)))
            if extra > 0:
                self.env.timeout(extra).callbacks.append(lambda _e, go=go: go())
            else:
                go()

    def _done(self, i: int) -> None:
        self.run.transfer_finish[i] = self.env.now
        self.left -= 1
        if self.left == 0:
            tail = max(0.0, self.critical - self.paid)
            if tail > 0:
                self.env.timeout(tail).callbacks.append(lambda _e: self._finish_all())
            else:
                self._finish_all()
