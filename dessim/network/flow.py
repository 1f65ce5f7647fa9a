"""Flow-level network: transfers share channels max-min fairly (the SimGrid-style fluid model).

Semantics (SimGrid CM02 with ``network/crosstraffic:0``; "SimGrid CM02" and "SimGrid golden
values" in docs/references.md):

1. A transfer routed over path ``P`` first waits ``sum(lat of P)`` — the latency is paid
   *before* the flow joins bandwidth sharing, as in SimGrid — then
2. its bytes flow at the max-min fair rate of its channels (:mod:`dessim.network.maxmin`),
   recomputed whenever a flow joins or finishes. A lone message therefore takes exactly
   ``sum(lat) + n / bottleneck capacity``.

Mechanics (one network-wide wake-up, as SimGrid's lazy update: "SimGrid lazy update" in
docs/references.md):

* The network keeps its own min-heap of ``(time, kind, flow id, version)``: flows joining
  after their latency and flows' estimated finish times (ETAs). When a flow's rate changes its
  version is bumped and a new ETA is pushed; stale entries are dropped when popped. Exactly one
  simpy wake-up is armed, for the earliest entry. No interrupts, no per-flow timeouts.
* Wake-ups run at simpy priority :data:`WAKE_PRIORITY` (after every ordinary event of the same
  instant), so all changes at one timestamp — flows finishing and the transfers their waiters
  start in reaction, e.g. the next step of a ring — are batched into ONE rate solve.
* The rates are kept by a :class:`~dessim.network.maxmin.MaxMinSystem` (flows = variables,
  channels = constraints; this class is the event loop around it). A solve is incremental
  (``incremental=True``, default): it re-rates only the flows whose max-min rate can change —
  progressive filling on an affected set with the other rates fixed, grown until the max-min
  conditions hold for every flow around it — falling back to the connected component (flows
  coupled through shared channels) of the channels whose flow set changed, which
  ``incremental=False`` always solves. Same allocation, float rounding aside; recurring
  solves are answered from exact memos (docs/network.md).
* Flows due at the same instant (within a relative :data:`REL_EPS` of the time, so float noise
  never leaves a remnant of a few bytes) finish together, in flow-id (= start) order.

Flow bundles (exact shortcut, ``bundles=True`` by default; see docs/performance.md):

* :meth:`FlowNetwork.bundle_template` accepts transfers whose routes are key-independent, of
  equal latency, and either pairwise channel-disjoint with equal bottlenecks — e.g. the p
  sends of one ring step on a switch — or sharing channels *uniformly*: every member's
  smallest share ``capacity / members on the channel`` is the same ``R`` — e.g. the p(p-1)
  sends of a direct all-to-all on a switch, ``p-1`` per injection link. All members at ``R``
  is then the max-min allocation (each member's smallest-share channel is saturated by
  members at its own rate), so the bundle keeps exactly what a solve would give. :meth:`FlowNetwork.start_bundle` carries them as ONE entity: one heap
  entry, one join, one finish, no rate solve. While no other flow uses any of its channels
  (tracked per channel with numpy views: ``_occ`` counts individual flows, ``_owner`` names
  the bundle), every member's max-min rate is its own bottleneck, so the bundle's rate and
  finish time are computed with the very float operations a per-flow run would use.
* The moment another flow or bundle needs one of its channels — when it joins, or when the
  bundle itself joins onto a busy channel — the bundle splits into its members: ordinary
  flows with the bundle's progress, rate and ETA, whose ids were reserved at the start so
  they keep start order. From there the ordinary solver takes over: results are identical
  to the unbundled run (tests/test_scale_equivalence.py).
* Not used with ``record_links=True`` (utilisation change points are per channel).
"""

from __future__ import annotations

import heapq
import math
from array import array
from operator import attrgetter
from typing import Callable, Sequence

import numpy as np
import simpy

from dessim.network.base import (BundleTemplate, FamilyRoute, Network, Route, register_network,
                                 remaining_latency)
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.network.maxmin import SAT_TOL, MaxMinSystem, Solver, solve_maxmin
from dessim.network.quotient import ChannelQuotient, QuotientRoute
from dessim.topology.graph import Topology
from dessim.topology.routing import Router

__all__ = ["FlowNetwork", "REL_EPS", "WAKE_PRIORITY"]

#: Relative tolerance on times: an entry due at ``t <= now * (1 + REL_EPS)`` is processed now.
#: 1e-12 is ~4500 ulps of a double — far above accumulated rounding of ``remaining -= rate*dt``
#: over a few thousand rate changes, far below any physically meaningful duration.
REL_EPS: float = 1e-12

#: simpy priority of the network's wake-ups: simpy uses 0 (URGENT) and 1 (NORMAL); 2 runs after
#: all events scheduled for the same instant, which is what batches one timestamp into one solve.
WAKE_PRIORITY: int = 2

_FINISH, _JOIN = 0, 1
_cut_of = attrgetter("cut")

class _Flow:
    __slots__ = ("fid", "route", "channels", "mult", "weights", "cut", "quoted", "nbytes",
                 "remaining", "rate", "last", "version", "eta", "join_at", "event", "member")

    def __init__(self, fid: int, route: Route, nbytes: float, join_at: float,
                 event: simpy.Event | None, member: tuple | None = None):
        self.fid = fid
        self.route = route
        self.channels = route.channels   # a variable of the MaxMinSystem: its constraints
        family = type(route) is FamilyRoute
        self.mult = route.mult if family else None     # channels crossed twice or more
        self.cut = route.cut if family else None       # where the channels split into images
        self.weights = None       # per listing of `channels` (a channel quotient's blocks)
        self.quoted: QuotientRoute | None = None   # the route under the channel quotient
        self.nbytes = nbytes
        self.remaining = nbytes   # bytes left at time `last`
        self.rate = 0.0           # bytes/s since `last`
        self.last = join_at
        self.version = 0
        self.eta = join_at
        self.join_at = join_at
        self.event = event        # None for a member of a split bundle
        self.member = member      # (the bundle's on_done, member index, template) for those


class _Bundle:
    """Members of a :class:`BundleTemplate` travelling as one flow (same bytes, same rate)."""

    __slots__ = ("fid", "template", "nbytes", "remaining", "rate", "last", "version", "eta",
                 "join_at", "event", "on_done")

    def __init__(self, fid: int, template: BundleTemplate, nbytes: float, join_at: float,
                 event: simpy.Event, on_done: Callable[[Sequence[int]], None]):
        self.fid = fid            # members are fid + 1 .. fid + len(template)
        self.template = template
        self.nbytes = nbytes
        self.remaining = nbytes
        self.rate = 0.0
        self.last = join_at
        self.version = 0
        self.eta = join_at
        self.join_at = join_at
        self.event = event
        self.on_done = on_done


def _report(on_done: Callable[[Sequence[int]], None], members: list[int]) -> None:
    """Report bundle members one at a time, in order (see ``FlowNetwork._succeed``). A
    callback with an ``each`` method takes them in one call that promises the effect of
    ``on_done((k,))`` for each ``k`` in order (the collective executor's, which saves its
    per-member calls on split bundles of thousands of members)."""
    each = getattr(on_done, "each", None)
    if each is not None:
        each(members)
        return
    for k in members:
        on_done((k,))


def _add_in_order(acc: np.ndarray, dirs: list[np.ndarray], sizes: list[float]) -> None:
    """``acc[d] += sizes[k]`` for every ``d`` of ``dirs[k]``, k ascending, each ``dirs[k]``
    in its order: ``np.add.at`` is unbuffered (index by index, in order), so the very float
    sums of that loop, without its per-element cost."""
    if not dirs:
        return
    vals = np.repeat(np.array(sizes, dtype=np.float64),
                     np.fromiter(map(len, dirs), dtype=np.int64, count=len(dirs)))
    np.add.at(acc, np.concatenate(dirs), vals)


class _WakeUp(simpy.Event):
    """A Timeout-like event with a chosen priority; its value is the network's arm token."""

    def __init__(self, env: simpy.Environment, delay: float, token: int,
                 callback: Callable[[simpy.Event], None]) -> None:
        super().__init__(env)
        self._ok = True
        self._value = token
        self.callbacks.append(callback)
        env.schedule(self, WAKE_PRIORITY, delay)


#: Bound on cached bundle templates and groups (memory stays flat on huge runs).
_MAX_CACHED_GROUPS = 100_000

#: Under the channel quotient, a route of more channels than this has its per-channel
#: occupancy kept with numpy and its bytes added per route (speed only: the same counts,
#: the same sums up to the order of float additions).
_NUMPY_FROM = 32
#: Routes whose finished bytes wait to be added to ``_done_bytes`` (then added at once).
_MAX_ROUTE_BYTES = 4096
#: Finished flows whose bytes wait to be added to ``_done_bytes`` (FlowNetwork._settle_bytes).
_MAX_BYTES_DUE = 8192



@register_network
class FlowNetwork(Network):
    """Max-min fair flow-level network. See the module docstring for the exact semantics.

    ``solver`` maps ``{flow id: channel ids}`` and per-channel capacities to rates; it defaults
    to :func:`~dessim.network.maxmin.solve_maxmin` and can be wrapped to inspect every solve.
    ``incremental`` (default True) re-rates only the flows whose rate can change; its check
    assumes max-min fairness, so swap in a solver of another allocation (weighted, equal
    share) only with ``incremental=False``, which water-fills the whole coupled component.
    Counters: ``incremental_solves`` and ``fallback_solves`` (incremental mode only).
    """

    name = "flow"
    certifies_families = True
    #: Check every family flow at every solve instead of what the solve changed (tests
    #: compare the two; same outcome, slower).
    certify_all = False

    def __init__(self, env: simpy.Environment, topology: Topology, *, router: Router | None = None,
                 record_links: bool = False, solver: Solver = solve_maxmin, bundles: bool = True,
                 incremental: bool = True) -> None:
        super().__init__(env, topology, router=router, record_links=record_links, bundles=bundles)
        #: The rates: flows are its variables, channels its constraints.
        self._system: MaxMinSystem[_Flow] = MaxMinSystem(self.channels.capacity, solver=solver,
                                                         incremental=incremental)
        n_chan = len(self.channels)
        self._pending: dict[int, _Flow] = {}   # in their latency phase
        self._active: dict[int, _Flow] = {}    # sharing bandwidth
        self._heap: list[tuple[float, int, int, int]] = []
        self._next_fid = 0
        self._token = 0
        self._armed_at: float | None = None
        self._last_util = [0.0] * n_chan
        #: channels whose load may differ from ``_last_util`` (``record_links``): a user joined,
        #: left or changed rate since the channel was last looked at
        self._util_dirty: set[int] = set()
        #: per channel, its ``(a, b)`` link name, one tuple shared by all its records (a long
        #: recorded run holds millions: a new tuple per record was a fifth of its memory)
        self._util_link = ([(ch.a, ch.b) for ch in self.channels.channels] if record_links else [])
        # flow bundles: pending (latency phase) and active ones by id; per channel the number
        # of individual flows on it and the bundle owning it (-1: none), with numpy views
        self._bpending: dict[int, _Bundle] = {}
        self._bundles: dict[int, _Bundle] = {}
        self._occ = array("l", [0]) * n_chan
        self._owner = array("l", [-1]) * n_chan
        self._occ_np = np.frombuffer(self._occ, dtype=np.int_ if self._occ.itemsize == 8 else np.int32)
        self._owner_np = np.frombuffer(self._owner, dtype=self._occ_np.dtype)
        self._bundle_bytes = np.zeros(len(self.channels.directions))
        self._templates: dict[tuple, BundleTemplate | None] = {}
        #: whether a lane-family flow has started: solves are certified from then on
        self.families_started = False
        #: per channel: (load, fastest rate) when last certified, and the epoch then
        self._chan_stats: dict[int, tuple[tuple[float, float], int]] = {}
        self._epoch = 0             # bumped by every state certified before (see _certify_state)
        self._witness: dict[int, list[int]] = {}   # per family flow: each image's bottleneck
        self._certified: set[tuple] = set()         # states certified (see _certify_state)
        self._certified_generation = 0              # the system's state_generation they are of
        #: lane-family flows sharing bandwidth now (in ``_active``): a solve with none has no
        #: certificate to check
        self._family_flows = 0
        #: the channel quotient (use_channel_quotient): flows are max-min variables on blocks
        #: of channels; bytes of finished family flows per route, added to _done_bytes lazily
        self.quotient: ChannelQuotient | None = None
        self._route_bytes: dict[int, list] = {}
        #: occupancy not yet in ``_occ``, per route (by id): ``[route, flows that joined on
        #: it minus flows that left]`` since ``_occ`` was last read (:meth:`_settle_occ`;
        #: only a bundle's join reads it, so the per-channel counts are brought up to date
        #: then, once per route instead of once per flow)
        self._occ_due: dict[int, list] = {}
        #: split bundles' members that left since ``_occ`` was last read, per template (by
        #: id): ``[template, member indices]`` (:meth:`_settle_occ`)
        self._occ_left: dict[int, list] = {}
        self._listings: dict[int, tuple[BundleTemplate, np.ndarray]] = {}
        #: finished flows whose bytes are not yet in ``_done_bytes``, in finishing order:
        #: their routes' directions (numpy, per route in ``_dirs``) and their bytes
        #: (:meth:`_settle_bytes` adds them in this order: the very sums, once per batch)
        self._bytes_due: list[np.ndarray] = []
        self._bytes_due_n: list[float] = []
        self._dirs: dict[int, tuple[Route, np.ndarray]] = {}
        #: bytes per direction of finished transfers: numpy here, so that the batches of
        #: :meth:`_settle_bytes` add into it in place (float64: the same sums as floats)
        self._done_bytes = np.zeros(len(self.channels.directions))

    def use_channel_quotient(self) -> bool:
        """Rate flows on blocks of channels that no route tells apart
        (:mod:`dessim.network.quotient`; exact: the same max-min allocation). Only before
        the first transfer and with the default solver; returns whether it is on. Utilisation
        records stay per channel: every channel of a block carries the block's load
        (:meth:`_record_utilisation`)."""
        system = self._system
        if self.quotient is None and self._next_fid == 0 and system.solver is solve_maxmin:
            system.capacity = list(self.channels.capacity)    # blocks append theirs
            self.quotient = ChannelQuotient(system.capacity, self._split_block)
        return self.quotient is not None

    def _split_block(self, b: int, parts: list[int], keep: bool) -> None:
        """Block ``b`` of the quotient becomes ``parts`` (besides itself when ``keep``): the
        max-min system's constraints follow (:meth:`MaxMinSystem.split`), and so does the
        utilisation records' dirty mark (the parts carry ``b``'s load)."""
        self._system.split(b, parts, keep)
        dirty = self._util_dirty
        if b in dirty:
            dirty.update(parts)
            if not keep:
                dirty.discard(b)

    def _quote(self, f: _Flow) -> None:
        """Make ``f`` a variable on the quotient's blocks (refining them by its route first;
        flows on a block that splits are quoted again: no rate or load changes)."""
        q = self.quotient
        got = q.of(f.route)
        if q.split_blocks:
            self._requote()
            got = q.of(f.route)
        f.quoted = got
        f.channels, f.weights, f.mult, f.cut = got.blocks, got.weights, got.mult, got.cut

    def _requote(self) -> None:
        """The flows on the blocks just split take their routes' new blocks (the max-min
        system already lists them on the parts: MaxMinSystem.split); image witnesses of the
        certificate name blocks, so they are forgotten."""
        q, users = self.quotient, self._system.users
        blocks, q.split_blocks = q.split_blocks, []
        redo: dict[int, _Flow] = {}
        for b in blocks:
            redo.update(users.get(b, {}))
        for f in redo.values():
            got = q.requote(f.route)
            f.quoted = got
            f.channels, f.weights, f.mult, f.cut = got.blocks, got.weights, got.mult, got.cut
        self._witness.clear()
        self._epoch += 1

    def _occupy(self, route: Route | BundleTemplate, k: int) -> None:
        """``k`` flows more (fewer, k < 0) on every channel listing of ``route`` (of a
        template: of each of its members' routes), in ``_occ`` by the next
        :meth:`_settle_occ`."""
        got = self._occ_due.get(id(route))
        if got is None:
            if len(self._occ_due) >= _MAX_ROUTE_BYTES:
                self._settle_occ()                  # the routes need not stay alive
            self._occ_due[id(route)] = [route, k]
        else:
            got[1] += k

    def _member_left(self, template: BundleTemplate, k: int) -> None:
        """Member ``k`` of a split bundle of ``template`` left: one flow fewer on every
        channel listing of its route, in ``_occ`` by the next :meth:`_settle_occ`."""
        if len(self._occ_left) >= _MAX_ROUTE_BYTES:
            self._settle_occ()                      # the templates need not stay alive
        self._occ_left[id(template)] = [template, [k]]

    def _listing_members(self, template: BundleTemplate) -> np.ndarray:
        """The member of each listing of ``template.channels`` (cached per template)."""
        got = self._listings.get(id(template))
        if got is None:
            if len(self._listings) >= _MAX_ROUTE_BYTES:
                self._listings.clear()
            lens = np.fromiter((len(r.channels) for r in template.routes), dtype=np.int64,
                               count=len(template.routes))
            got = self._listings[id(template)] = (template, np.repeat(np.arange(len(lens)), lens))
        return got[1]

    def _settle_occ(self) -> None:
        """Bring ``_occ`` up to date (integer counts: the order of the changes is immaterial).
        A template's listings (numpy, thousands of members' routes) are added with
        ``np.add.at``, a route's few in Python; split members that left are taken off their
        template's listings by member index."""
        occ, occ_np = self._occ, self._occ_np
        for route, k in self._occ_due.values():
            if k:
                chans = route.channels
                if type(chans) is np.ndarray:
                    np.add.at(occ_np, chans, k)
                else:
                    for c in chans:
                        occ[c] += k
        self._occ_due.clear()
        for template, ks in self._occ_left.values():
            left = np.bincount(np.array(ks, dtype=np.int64), minlength=len(template.routes))
            np.subtract.at(occ_np, template.channels, left[self._listing_members(template)])
        self._occ_left.clear()

    def _directions(self, route: Route) -> np.ndarray:
        """``route.directions`` as a numpy array (cached per route)."""
        got = self._dirs.get(id(route))
        if got is None:
            if len(self._dirs) >= _MAX_ROUTE_BYTES:
                self._dirs.clear()     # arrays waiting in _bytes_due stay alive there
            got = self._dirs[id(route)] = (route, np.array(route.directions, dtype=np.int64))
        return got[1]

    def _done_flow_bytes(self, route: Route, nbytes: float) -> None:
        """A flow of ``nbytes`` on ``route`` finished: its bytes join ``_done_bytes`` at the
        next :meth:`_settle_bytes`, in this order."""
        self._bytes_due.append(self._directions(route))
        self._bytes_due_n.append(nbytes)
        if len(self._bytes_due) >= _MAX_BYTES_DUE:
            self._settle_bytes()

    def _settle_bytes(self) -> None:
        """Add the finished flows' bytes waiting in ``_bytes_due`` to ``_done_bytes``. Each
        direction receives them in finishing order and, within a route, in its listing
        order — the additions ``done[d] += nbytes`` flow by flow made (``np.add.at`` is
        unbuffered: it adds index by index, in order), so the same floats."""
        if self._bytes_due:
            _add_in_order(self._done_bytes, self._bytes_due, self._bytes_due_n)
            self._bytes_due, self._bytes_due_n = [], []

    def _flush_route_bytes(self) -> None:
        """Add the bytes of finished family flows, kept per route, to ``_done_bytes`` (after
        those of the flows finished before, as when they were added at once)."""
        self._settle_bytes()
        routes = list(self._route_bytes.values())
        _add_in_order(self._done_bytes, [self._directions(r) for r, _ in routes],
                      [nbytes for _, nbytes in routes])
        self._route_bytes.clear()

    @property
    def incremental(self) -> bool:
        """Whether solves re-rate only the flows whose rate can change."""
        return self._system.incremental

    @property
    def incremental_solves(self) -> int:
        """Solves done on an affected set only (incremental mode)."""
        return self._system.incremental_solves

    @property
    def fallback_solves(self) -> int:
        """Solves that fell back to the whole coupled component (incremental mode)."""
        return self._system.fallback_solves

    @property
    def active_flows(self) -> int:
        """Flows currently sharing bandwidth (latency phase excluded; bundle members count)."""
        return len(self._active) + sum(len(b.template) for b in self._bundles.values())

    # ------------------------------------------------------------------ Network API
    def _start(self, route: Route, nbytes: float, latency: float) -> simpy.Event:
        now = self.env.now
        fid = self._next_fid
        self._next_fid += 1
        join_at = now + latency
        flow = _Flow(fid, route, nbytes, join_at, self.env.event())
        if type(route) is FamilyRoute:
            self.families_started = True
        self._pending[fid] = flow
        heapq.heappush(self._heap, (join_at, _JOIN, fid, 0))
        self._arm(join_at)
        return flow.event

    def bundle_template(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                        family: LaneFamily | None = None) -> BundleTemplate | None:
        """A template if the transfers ``sources[i] -> destinations[i]`` can travel as one
        exact bundle: routes independent of the ECMP key, no channel used twice (within or
        across members), all latencies equal and all bottlenecks equal. None otherwise, and
        always None when bundles are off or utilisation is recorded. Cached per pair list.
        With ``family`` every member stands for its lane images (:meth:`family_route`), and
        the template also holds for the images as separate flows."""
        if not self.bundles or self.record_links:
            return None
        memo = (tuple(sources), tuple(destinations), family)
        if memo in self._templates:
            return self._templates[memo]
        template = self._make_template(memo[0], memo[1], family)
        self._templates[memo] = template
        return template

    def _make_template(self, sources: tuple, destinations: tuple,
                       family: LaneFamily | None) -> BundleTemplate | None:
        if not sources or len(sources) != len(destinations):
            return None
        routes = (self.fixed_routes(sources, destinations) if family is None
                  else self.family_routes(sources, destinations, 0, family, fixed=True))
        return None if routes is None else self._template_of(routes)

    def _template_of(self, routes: Sequence[Route]) -> BundleTemplate | None:
        """The bundle of these routes if it is exact (module docstring), else None. Routes of
        lane families qualify only if their images, as separate routes, make a bundle of the
        same rate: then every image runs at the family's rate while the bundle holds."""
        template = self._plain_template(routes)
        if template is not None and type(routes[0]) is FamilyRoute:
            images = self._plain_template([image for r in routes for image in r.images])
            if images is None or images.rate != template.rate:
                return None
        return template

    def _plain_template(self, routes: Sequence[Route]) -> BundleTemplate | None:
        first = routes[0]
        if any(r.latency != first.latency for r in routes):
            return None
        chans = np.fromiter((c for r in routes for c in r.channels), dtype=self._occ_np.dtype)
        used, counts = np.unique(chans, return_counts=True)
        if len(used) == len(chans):                  # channel-disjoint: each its bottleneck
            if any(r.bottleneck != first.bottleneck for r in routes):
                return None
            rate = first.bottleneck
        else:
            # uniform share: members split shared channels equally; if every member's
            # smallest share cap/n is the same R, all at R is the max-min allocation (each
            # member's smallest-share channel is saturated by members at its rate)
            capacity = self.channels.capacity
            share = {c: capacity[c] / n for c, n in zip(used.tolist(), counts.tolist())}
            rate = min(share[c] for c in first.channels)
            if any(min(share[c] for c in r.channels) != rate for r in routes[1:]):
                return None
        dirs = np.fromiter((d for r in routes for d in r.directions), dtype=np.int64)
        return BundleTemplate(tuple(routes), chans, dirs, first.latency, first.bottleneck, rate,
                              len(np.unique(dirs)) == len(dirs))

    def bundle_groups(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                      key: int | Sequence[int] = 0, *, cache: bool = True,
                      family: LaneFamily | None = None
                      ) -> tuple[tuple[BundleTemplate | None, tuple[int, ...]], ...] | None:
        """Transfers ``sources[i] -> destinations[i]``, all started now with ECMP ``key``
        (one for all, or one per transfer), split into exact bundles: members that share
        channels form one group (transitively), groups touching nothing else with equal
        latency and bottleneck are merged, and each group gets a template (None: start its
        members as ordinary flows). Every transfer is in exactly one group; their routes are
        those ``transfer(..., key=...)`` takes, so the bundles carry exactly what the
        individual flows would. None when bundles are off or utilisation is recorded. Cached
        per pair list when one key serves all (unless ``cache=False``: one-off lists). With
        ``family``, each transfer stands for its lane images (:meth:`family_route`)."""
        if not self.bundles or self.record_links:
            return None
        single = cache and isinstance(key, int)
        memo = ("groups", tuple(sources), tuple(destinations), key, family) if single else None
        got = self._templates.get(memo) if single else None
        if got is not None:
            return got
        routes = (self.keyed_routes(sources, destinations, key) if family is None
                  else self.family_routes(sources, destinations, key, family))
        # members joined by shared channels (union-find over members)
        parent = list(range(len(routes)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        holder: dict[int, int] = {}
        for i, r in enumerate(routes):
            for c in (r.channels if r is not None else ()):
                j = holder.setdefault(c, i)
                if j != i:
                    parent[find(i)] = find(j)
        parts: dict[int, list[int]] = {}
        for i in range(len(routes)):
            parts.setdefault(find(i), []).append(i)
        groups: list[tuple[BundleTemplate | None, tuple[int, ...]]] = []
        alone: dict[tuple[float, float], list[int]] = {}
        for members in parts.values():
            if len(members) == 1 and routes[members[0]] is not None:
                r = routes[members[0]]
                alone.setdefault((r.latency, r.bottleneck), []).append(members[0])
            elif any(routes[m] is None for m in members):
                groups.append((None, tuple(members)))
            else:
                groups.append((self._template_of([routes[m] for m in members]), tuple(members)))
        for members in alone.values():
            groups.append((self._template_of([routes[m] for m in members]), tuple(members)))
        got = tuple(sorted(groups, key=lambda g: g[1][0]))
        if single:
            if len(self._templates) >= _MAX_CACHED_GROUPS:
                self._templates.clear()
            self._templates[memo] = got
        return got

    def start_bundle(self, template: BundleTemplate, nbytes: float,
                     on_done: Callable[[Sequence[int]], None], *,
                     latency: float | None = None) -> None:
        """Start ``nbytes`` on every member of ``template`` now (see the module docstring),
        paying ``latency`` s of the members' route latency (None: all of it;
        :meth:`~dessim.network.base.Network.start_bundle`)."""
        n = self._size(nbytes, "bundle", f"{len(template)} members")
        now = self.env.now
        fid = self._next_fid
        self._next_fid += len(template) + 1       # reserve the members' ids: start order
        self.flows_started += len(template)
        if type(template.routes[0]) is FamilyRoute:
            self.families_started = True
        join_at = now + remaining_latency(template.latency, latency)
        event = self.env.event()
        members = range(len(template))
        event.callbacks.append(lambda _e: on_done(members))
        self._bpending[fid] = _Bundle(fid, template, float(n), join_at, event, on_done)
        heapq.heappush(self._heap, (join_at, _JOIN, fid, 0))
        self._arm(join_at)

    def finished_bytes(self) -> np.ndarray:
        self._settle_bytes()
        if self._route_bytes:
            self._flush_route_bytes()
        return self._done_bytes + self._bundle_bytes

    def add_finished_bytes(self, delta: np.ndarray | tuple[list[int], list[float]]) -> None:
        # after the flows finished so far, as when their bytes were added at once (family
        # flows' per-route bytes stay pending, as they did)
        self._settle_bytes()
        super().add_finished_bytes(delta)

    def link_bytes(self) -> dict[tuple[str, str], float]:
        self._settle_bytes()
        if self._route_bytes:
            self._flush_route_bytes()
        carried = [a + b for a, b in zip(self._done_bytes.tolist(), self._bundle_bytes.tolist())]
        now = self.env.now
        for f in self._active.values():
            sent = f.nbytes - max(f.remaining - f.rate * (now - f.last), 0.0)
            for d in f.route.directions:
                carried[d] += sent
        for b in self._bundles.values():
            sent = b.nbytes - max(b.remaining - b.rate * (now - b.last), 0.0)
            for d in b.template.directions.tolist():
                carried[d] += sent
        return self._bytes_by_direction(carried)

    # ------------------------------------------------------------------ wake-ups
    def _arm(self, at: float) -> None:
        """Make sure a wake-up fires no later than ``at``."""
        if self._armed_at is not None and self._armed_at <= at:
            return
        self._token += 1
        self._armed_at = at
        _WakeUp(self.env, max(at - self.env.now, 0.0), self._token, self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event.value != self._token:
            return  # superseded by an earlier wake-up
        self._armed_at = None
        now = self.env.now
        finished = self._pop_due(now)
        if finished:
            finished.sort(key=lambda f: f.fid)
            self.flows_finished += sum(len(f.template) if type(f) is _Bundle else 1
                                       for f in finished)
            self._succeed(finished, now)
            # Solve after the waiters have run, so the transfers they start now join the batch.
            self._arm(now)
            return
        if self._system.modified:
            self._solve(now)
        nxt = self._next_time()
        if nxt is not None:
            self._arm(nxt)

    def _succeed(self, finished: list, now: float) -> None:
        """Trigger the completions of ``finished`` (in fid order). Members of one split
        bundle that finish together (consecutive fids) share one event whose callback
        reports them one by one: the same calls in the same order as one event each, since
        events triggered together run back to back, but one simpy event instead of many."""
        i, n = 0, len(finished)
        while i < n:
            f = finished[i]
            member = f.member if type(f) is _Flow else None
            if member is None:
                f.event.succeed(now)
                i += 1
                continue
            on_done, ks = member[0], [member[1]]
            i += 1
            while i < n:
                g = finished[i]
                if type(g) is not _Flow or g.member is None or g.member[0] is not on_done:
                    break
                ks.append(g.member[1])
                i += 1
            event = self.env.event()
            event.callbacks.append(lambda _e, on_done=on_done, ks=ks: _report(on_done, ks))
            event.succeed(now)

    def _pop_due(self, now: float) -> list:
        heap, system = self._heap, self._system
        occupy, done_bytes, occ_due = self._occupy, self._done_flow_bytes, self._occ_due
        occ_left = self._occ_left
        limit = now + REL_EPS * now
        finished: list = []
        while heap and heap[0][0] <= limit:
            _, kind, fid, version = heapq.heappop(heap)
            if kind == _JOIN:
                f = self._pending.pop(fid, None)
                if f is None:
                    self._join_bundle(self._bpending.pop(fid), now, finished)
                    continue
                if f.nbytes == 0:
                    finished.append(f)
                    continue
                self._join_flow(f, now)
            else:
                f = self._active.get(fid)
                if f is None:
                    b = self._bundles.get(fid)
                    if b is not None and b.version == version:
                        del self._bundles[fid]
                        self._owner_np[b.template.channels] = -1
                        if b.template.distinct_directions:    # what add.at adds, faster
                            self._bundle_bytes[b.template.directions] += b.nbytes
                        else:
                            np.add.at(self._bundle_bytes, b.template.directions, b.nbytes)
                        finished.append(b)
                    continue
                if f.version != version:
                    continue  # stale ETA
                del self._active[fid]
                route = f.route
                if type(route) is FamilyRoute:
                    self._witness.pop(fid, None)
                    self._family_flows -= 1
                system.remove(f)
                member = f.member
                if member is not None:              # a split bundle's: by member index
                    got = occ_left.get(id(member[2]))
                    if got is None:
                        self._member_left(member[2], member[1])
                    else:
                        got[1].append(member[1])
                else:
                    got = occ_due.get(id(route))    # occupy(route, -1), inline
                    if got is None:
                        occupy(route, -1)
                    else:
                        got[1] -= 1
                q = f.quoted
                if q is not None and len(q.channels) > _NUMPY_FROM:
                    # a family's hundreds of channels: its bytes kept per route
                    got = self._route_bytes.get(id(route))
                    if got is None:
                        if len(self._route_bytes) >= _MAX_ROUTE_BYTES:
                            self._flush_route_bytes()      # the routes need not stay alive
                        self._route_bytes[id(route)] = [route, f.nbytes]
                    else:
                        got[1] += f.nbytes
                else:
                    done_bytes(route, f.nbytes)
                finished.append(f)
        return finished

    def _join_flow(self, f: _Flow, now: float) -> None:
        """Flow ``f`` starts sharing bandwidth now (splitting any bundle in its way)."""
        owner = self._owner
        f.last = now
        self._active[f.fid] = f
        if type(f.route) is FamilyRoute:
            self._family_flows += 1
        # no active bundle: no channel has an owner (a bundle's channels are released
        # when it finishes or splits), so only the occupancy changes
        bundles = self._bundles
        route = f.route
        chans = route.channels
        if bundles:
            if self.quotient is not None and len(chans) > _NUMPY_FROM:
                q = self.quotient.of(route)            # its real channels, as numpy arrays
                if (self._owner_np[q.channels] >= 0).any():
                    for c in chans:                     # in route order, as without numpy
                        if owner[c] >= 0:
                            self._split(bundles[owner[c]])
            else:
                for c in chans:
                    if owner[c] >= 0:
                        self._split(bundles[owner[c]])
        self._occupy(route, 1)
        if self.quotient is not None:
            self._quote(f)            # after the splits: they may refine the blocks
        # after the splits: per channel, the members of a split bundle come before f (the
        # order of the system's sums), as when each channel was checked just before joining
        self._system.add(f)

    def _join_bundle(self, b: _Bundle, now: float, finished: list) -> None:
        """Bundle ``b`` ends its latency phase: it runs alone on its channels (rate = the
        bottleneck, exactly what a solve would give each member), or splits into flows."""
        if b.nbytes == 0:
            finished.append(b)
            return
        chans = b.template.channels
        if self._occ_due or self._occ_left:
            self._settle_occ()
        # (owners are >= -1 and counts >= 0: max and count_nonzero cost less than any())
        owned = bool(self._bundles) and len(chans) > 0 and self._owner_np.take(chans).max() >= 0
        if not owned and not np.count_nonzero(self._occ_np.take(chans)):
            self._owner_np[chans] = b.fid
            b.last = now
            b.rate = b.template.rate
            b.version += 1
            b.eta = now + b.nbytes / b.rate
            self._bundles[b.fid] = b
            heapq.heappush(self._heap, (b.eta, _FINISH, b.fid, b.version))
            return
        if owned:       # members split the bundles in their way, each at its turn
            for k, route in enumerate(b.template.routes):
                self._join_flow(self._member(b, k, route), now)
            return
        self._join_members(b, now)

    def _join_members(self, b: _Bundle, now: float) -> None:
        """Bundle ``b`` joins onto channels that individual flows use, none owned by an active
        bundle: its members join as ordinary flows, in member order — what
        ``_join_flow(_member(b, k, route), now)`` does for each ``k``, with its checks done
        once for the template: no channel of it has an owner (nothing here gives one), so no
        member splits a bundle, and the occupancy is recorded once for all members (integer
        counts, read only when a bundle joins)."""
        template = b.template
        routes = template.routes
        active, add = self._active, self._system.add
        quote = self._quote if self.quotient is not None else None
        fid0, on_done, nbytes, join_at = b.fid + 1, b.on_done, b.nbytes, b.join_at
        remaining, rate, eta = b.remaining, b.rate, b.eta
        for k, route in enumerate(routes):
            f = _Flow(fid0 + k, route, nbytes, join_at, None, (on_done, k, template))
            f.remaining, f.rate, f.eta = remaining, rate, eta
            f.last = now
            active[fid0 + k] = f
            if type(route) is FamilyRoute:
                self._family_flows += 1
            if quote is not None:
                quote(f)
            add(f)
        self._occupy(template, 1)

    def _member(self, b: _Bundle, k: int, route: Route) -> _Flow:
        """Member ``k`` of ``b`` as an ordinary flow (id reserved at the bundle's start)."""
        f = _Flow(b.fid + 1 + k, route, b.nbytes, b.join_at, None, (b.on_done, k, b.template))
        f.remaining, f.rate, f.last, f.eta = b.remaining, b.rate, b.last, b.eta
        return f

    def _split(self, b: _Bundle) -> None:
        """Another flow needs a channel of active bundle ``b``: its members become ordinary
        flows with the bundle's progress, rate and ETA (the re-solve then sees them)."""
        del self._bundles[b.fid]
        self._owner_np[b.template.channels] = -1
        heap, system = self._heap, self._system
        for k, route in enumerate(b.template.routes):
            f = self._member(b, k, route)
            fid = f.fid
            self._active[fid] = f
            if type(route) is FamilyRoute:
                self._family_flows += 1
            if self.quotient is not None:
                self._quote(f)
            system.insert(f)
            heapq.heappush(heap, (f.eta, _FINISH, fid, f.version))
        self._occupy(b.template, 1)

    def _next_time(self) -> float | None:
        heap, active, bundles = self._heap, self._active, self._bundles
        while heap:
            _, kind, fid, version = heap[0]
            if kind == _FINISH:
                f = active.get(fid)
                if f is None:
                    f = bundles.get(fid)
                if f is None or f.version != version:
                    heapq.heappop(heap)
                    continue
            return heap[0][0]
        return None

    # ------------------------------------------------------------------ rate solve
    def _solve(self, now: float) -> None:
        """Re-rate the flows the changes since the last solve can affect
        (:meth:`MaxMinSystem.solve`). A flow whose rate changes has its progress accounted
        at its old rate first; one the solve leaves at its rate keeps its last accounting
        point, so a flow's remaining bytes are a function of its rate history alone, not of
        which solves happened to re-rate it. A lane family's flow and its images' flows in
        the full replay are re-rated at unchanged rates by different solves (the affected
        sets differ); accounting progress at each of those rounded ``remaining``
        differently (a few ulps, which the ring's connection credits then amplified to
        1e-8 of a run; docs/performance.md step 34)."""
        self.solves += 1
        if self.record_links:     # the set the solve consumes (it starts a new one)
            self._util_dirty |= self._system.modified
        flows, rates, chans = self._system.solve()
        # no lane-family flow shares bandwidth now: nothing to certify (a new epoch makes the
        # channel figures remembered so far stale, so the next certificate checks afresh)
        certify = self.families_started and self._family_flows > 0
        old_rates = [f.rate for f in flows] if certify else ()
        self._apply(now, flows, rates)
        if certify:
            self._certify_state(flows, old_rates, chans)
        elif self.families_started:
            self._epoch += 1
        self._after_solve(now, chans)

    def _certify_state(self, flows: Sequence[_Flow], old_rates: Sequence[float],
                       chans: Sequence[int]) -> None:
        """:meth:`_certify`, once per system state: a solve answered from the max-min
        system's state memo reproduces an earlier state exactly — the same channel tuples,
        rates and order — so with the same family routes (their image cuts, compared here)
        its certificate is the one that state already passed."""
        system = self._system
        if self.certify_all:          # tests: every family flow, every solve
            active = list(self._active.values())
            self._certify(active, [math.nan] * len(active), [c for c, on in system.users.items() if on])
            return
        if system.state_generation != self._certified_generation:
            # the system forgot those states: a skip needs a state it answers from its memo,
            # and the keys would keep the forgotten states' tuples alive (hundreds of MiB on
            # the 16,384-GPU CP preset)
            self._certified.clear()
            self._certified_generation = system.state_generation
        key = None
        if system.last_state is not None:
            key = (system.last_state, tuple(map(_cut_of, system.variables.values())))
            if system.last_hit and key in self._certified:
                # the next computed certificate must not compare channel loads with figures
                # from before this state: a new epoch makes every remembered figure stale
                self._epoch += 1
                return
        self._certify(flows, old_rates, chans)
        if key is not None:
            if len(self._certified) >= _MAX_CACHED_GROUPS:
                self._certified.clear()
            self._certified.add(key)

    def _certify(self, flows: Sequence[_Flow], old_rates: Sequence[float],
                 chans: Sequence[int]) -> None:
        """Raise :class:`~dessim.network.families.QuotientBroken` unless every image route of
        every lane-family flow has a bottleneck: a channel loaded to its capacity on which no
        flow is faster (relative tolerance :data:`~dessim.network.maxmin.SAT_TOL`). Then the
        rates are the max-min rates of the unfolded network (:mod:`dessim.network.families`).

        Only what this solve can have changed is checked: the family flows among ``flows``
        whose rate moved from ``old_rates``, and the family flows on a channel of ``chans``
        (the constraints whose load may have changed) whose load or fastest rate did. Each
        image first tries the channel that was its bottleneck last time. Family flows never
        share a channel with a running bundle (bundles split first), so each channel's flows
        are its users in the max-min system."""
        system = self._system
        users, last, epoch, load = system.users, self._chan_stats, self._epoch, system.load
        check: dict[int, _Flow] = {f.fid: f for f, r in zip(flows, old_rates)
                                   if f.rate != r and type(f.route) is FamilyRoute}
        # the solve's own figures of its re-rated flows' channels (the floats load() gives)
        known = system.last_loads if not self.certify_all else None
        stats: dict[int, tuple[float, float]] = {} if known is None else dict(known)
        for c in chans:
            on = users.get(c)
            got = stats.get(c)
            if got is None:
                got = stats[c] = load(c) if on else (0.0, 0.0)
            if last.get(c) != (got, epoch):
                last[c] = (got, epoch)
                if on:
                    for fid, f in on.items():
                        if type(f.route) is FamilyRoute:
                            check[fid] = f
        if not check:
            return
        cap, witness = system.capacity, self._witness
        lo = 1.0 - SAT_TOL
        for fid in sorted(check):
            f = check[fid]
            most = f.rate * (1.0 + SAT_TOL)
            # each image's channels, or under the quotient each distinct tuple of the
            # images' blocks (a block's load and fastest flow are each of its channels')
            images = (f.quoted.checks if f.quoted is not None
                      else [(image.channels, image) for image in f.route.images])
            seen = witness.get(fid)
            if seen is None:
                seen = witness[fid] = [-1] * len(images)
            for k, (channels, image) in enumerate(images):
                w = seen[k]
                if w >= 0:                  # last time's bottleneck first
                    got = stats.get(w)
                    if got is None:
                        got = stats[w] = load(w)
                    if got[0] >= cap[w] * lo and got[1] <= most:
                        continue
                for c in channels:
                    got = stats.get(c)
                    if got is None:
                        got = stats[c] = load(c)
                    if got[0] >= cap[c] * lo and got[1] <= most:
                        seen[k] = c
                        break
                else:
                    raise QuotientBroken(
                        f"at t = {self.env.now:.9g} s the lane image {image.path[0]} -> "
                        f"{image.path[-1]} of a transfer {f.route.path[0]} -> {f.route.path[-1]} "
                        f"has no bottleneck at the family's rate {f.rate:.6g} B/s: the lanes are "
                        "not symmetric there")

    def _after_solve(self, now: float, chans: Sequence[int]) -> None:
        if self.record_links:
            self._record_utilisation(now, chans)
        if len(self._heap) > 4 * (len(self._active) + len(self._pending) + len(self._bundles)
                                  + len(self._bpending)) + 1024:
            self._compact_heap()

    def _apply(self, now: float, flows: list[_Flow], rates: Sequence[float]) -> None:
        """Give ``flows`` their new ``rates`` (bytes/s, in the same order): a flow whose rate
        changes has its progress brought to ``now`` at its old rate, then a new version and
        ETA (:meth:`_solve`: flows left at their rate keep their accounting point), and its
        channels are marked for the utilisation records (``record_links``)."""
        heap = self._heap
        push = heapq.heappush
        dirty = self._util_dirty if self.record_links else None
        for f, r in zip(flows, rates):
            if r != f.rate:
                if dirty is not None:
                    dirty.update(f.channels)
                if f.rate:
                    f.remaining -= f.rate * (now - f.last)
                f.last = now
                f.rate = r
                f.version += 1
                if r > 0.0:  # capacities are > 0, so max-min rates are too
                    f.eta = now + max(f.remaining, 0.0) / r
                    push(heap, (f.eta, _FINISH, f.fid, f.version))

    def _record_utilisation(self, now: float, chans: Sequence[int]) -> None:
        """Append a utilisation point for every channel of the constraints ``chans`` whose
        load changed, in channel order. Only dirty constraints are summed: one none of whose
        users joined, left or changed rate since it was last looked at has the load it had
        then (the same floats summed in the same order), so skipping it records exactly what
        summing it would. Under the channel quotient a constraint is a block, and every
        channel of a block carries the block's load (its constraint row, written once)."""
        system, dirty = self._system, self._util_dirty
        cap = system.capacity
        members = self.quotient.members if self.quotient is not None else None
        points: list[tuple[int, float]] = []
        for b in chans:
            if b not in dirty:
                continue
            dirty.discard(b)
            used = system.load(b)[0] / cap[b]
            if members is None:
                points.append((b, used))
            else:
                points.extend((c, used) for c in members.get(b, (b,)))
        points.sort()
        last, link, out = self._last_util, self._util_link, self.utilisation
        for c, used in points:
            if used != last[c]:
                last[c] = used
                out.append((now, link[c], used))

    def _compact_heap(self) -> None:
        entries = [(f.join_at, _JOIN, fid, 0) for fid, f in self._pending.items()]
        entries += [(f.eta, _FINISH, fid, f.version) for fid, f in self._active.items() if f.rate]
        entries += [(b.join_at, _JOIN, fid, 0) for fid, b in self._bpending.items()]
        entries += [(b.eta, _FINISH, fid, b.version) for fid, b in self._bundles.items()]
        heapq.heapify(entries)
        self._heap = entries

    def __repr__(self) -> str:
        return (f"FlowNetwork({self.topology.name!r}, active={len(self._active)}, "
                f"pending={len(self._pending)}, bundles={len(self._bundles)}, "
                f"solves={self.solves})")
