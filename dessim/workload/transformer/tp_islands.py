"""Tensor-parallel collectives in closed form on isolated islands (issue 9).

In Megatron-LM the TP all-reduce / all-gather / reduce-scatter of a layer is blocking (the
next compute of the layer waits for it) and, with ``tp`` GPUs of one DGX node, its traffic
stays on the GPU↔NVSwitch links of that node. When

* no other communication of the iteration (pipeline sends, data-parallel and expert
  collectives, context-parallel exchanges, offload memcpys, other TP groups) can be routed
  over any channel a TP group's collectives use — checked conservatively over *every* ECMP
  choice of every ordered pair of the other groups' members, and
* every route inside the group is key-independent (so every instance of a collective takes
  the same paths whatever ECMP key the engine gives it), and
* the group's collectives never overlap each other (they run FIFO on one ``tp`` stream),

each TP collective of the group takes exactly its idle-network time, which depends only on
(op, size, group). :class:`TPIslands` decides which groups qualify and computes those times
once with the same plan (:func:`dessim.collectives.plan_collective`: ``auto`` resolved
as the engine does, the same protocol and calibration), network model and shortcuts as the
:class:`dessim.engine.EngineOptions` of the run. Per-rank finish times must coincide (a
symmetric collective); otherwise the group falls back to simulated collectives.

The result is exact when the members of a group arrive together — always true after the
first collective of a pass when the members run identical work, and at the pass start when
their inputs arrive together (symmetric routes). If members arrive at different times, the
closed form is a barrier (start = last arrival) while the engine's replay lets early ranks
send their first step early: an approximation, bounded by the arrival skew.

Units: seconds, bytes.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import simpy

from dessim.collectives import plan_collective, run_schedule
from dessim.collectives.auto import group_shape
from dessim.engine import EngineOptions
from dessim.network import make_network
from dessim.network.channels import ChannelMap, channel_map_for
from dessim.topology.graph import Topology
from dessim.taskgraph import brief_ranks
from dessim.topology.routing import Router, router_for

__all__ = ["TPIslands", "route_channels"]

_UNKNOWN = object()

#: Relative spread of per-rank finish times still considered "one finish time" (float noise).
_SAME_FINISH_RTOL = 1e-12


def route_channels(router: Router, chmap: ChannelMap, src: str, dst: str) -> set[int]:
    """Channel ids of every path ``router`` may choose from ``src`` to ``dst`` (the union over
    all ECMP keys, :meth:`Router.possible_hops`)."""
    return {chmap.channel(a, b) for a, b in router.possible_hops(src, dst)}


def _endpoint_regions(topology: Topology, chmap: ChannelMap, channels: set[int]) -> dict[str, set[int]] | None:
    """Which traffic can possibly touch ``channels``, from the topology alone.

    Every node inside a routed path is a transit node (the router forwards only through
    them; the NIC waypoints of GPU affinity are checked to be transit too). So a path can use
    the hop ``u -> v`` only if its source is ``u`` when ``u`` does not forward, or a neighbour
    of ``u`` when ``u`` forwards but all its neighbours are non-forwarding (an NVSwitch among
    GPUs) — and the same for ``v`` and the destination. For such a hop both ends of any path
    over it lie in its *region* (``u``, ``v`` and those neighbours). Returns, per node, the
    ids of the regions it lies in, or ``None`` when some channel has no bounded region (then
    every pair must be routed)."""
    graph = topology.graph
    transit = {n: bool(d["transit"]) for n, d in graph.nodes(data=True)}
    if any(not transit.get(d["nic"], False) for _, d in graph.nodes(data=True) if d.get("nic")):
        return None

    def ends(n: str) -> frozenset[str] | None:
        if not transit[n]:
            return frozenset((n,))
        nbrs = graph.adj[n]
        if all(not transit[m] for m in nbrs):
            return frozenset(nbrs) | {n}
        return None

    region_id: dict[frozenset[str], int] = {}
    of_node: dict[str, set[int]] = {}
    for c in channels:
        ch = chmap.channels[c]
        src_side, dst_side = ends(ch.a), ends(ch.b)
        if src_side is None or dst_side is None:
            return None
        # a half-duplex channel serves both directions: both ends bound either way
        region = src_side | dst_side
        rid = region_id.setdefault(region, len(region_id))
        for n in region:
            of_node.setdefault(n, set()).add(rid)
    return of_node


def _near(regions: dict[str, set[int]], x: str, y: str) -> bool:
    """Can a path ``x -> y`` touch a channel of the regions (do both ends share one)?"""
    rx = regions.get(x)
    return bool(rx) and not rx.isdisjoint(regions.get(y, ()))


def _group_pairs_near(groups: list[tuple[int, ...]], regions: dict[str, set[int]], node) -> Iterable:
    """The ordered member pairs ``(group, a, b)`` of ``groups`` whose routes could touch a
    region (both members' nodes in one region): O(members), not O(members²), when none can."""
    for grp in groups:
        by_region: dict[int, list[int]] = {}
        for r in grp:
            for rid in regions.get(node(r), ()):
                by_region.setdefault(rid, []).append(r)
        seen: set[tuple[int, int]] = set()
        for members in by_region.values():
            for a in members:
                for b in members:
                    if a != b and (a, b) not in seen:
                        seen.add((a, b))
                        yield grp, a, b


def _group_routes(topology: Topology, group: tuple[int, ...]) -> tuple[frozenset[int], bool]:
    """The channels every route between two members of ``group`` may use (:func:`route_channels`
    over all ordered pairs, on the topology's own router and channel map), and whether every
    one of those routes is key-independent. A pure function of the topology, kept with it
    (:meth:`Topology.derived`): the three short graphs of an extrapolation route once."""
    memo: dict[tuple[int, ...], tuple[frozenset[int], bool]] = topology.derived(
        "tp_islands_group_routes", lambda _t: {})
    got = memo.get(group)
    if got is None:
        router, chmap = router_for(topology), channel_map_for(topology)
        nodes = [topology.node_of(r) for r in group]
        chans: set[int] = set()
        unique = True
        for a in nodes:
            for b in nodes:
                if a != b:
                    chans |= route_channels(router, chmap, a, b)
                    unique &= router.key_independent(a, b)
        got = memo[group] = (frozenset(chans), unique)
    return got


def _shape_id(topology: Topology, group: tuple[int, ...]) -> int:
    """The number of ``group``'s :func:`~dessim.collectives.auto.group_shape` among the
    distinct shapes met on ``topology``: equal numbers, equal shapes. A pure function of the
    (immutable) topology, so kept with it (:meth:`Topology.derived`) for every generator that
    builds on it (extrapolation builds three short graphs on one topology): each group's
    routes are read once per topology, not once per (op, size) and per graph."""
    ids: tuple[dict[tuple[int, ...], int], dict[tuple, int]] = topology.derived(
        "tp_islands_shape_ids", lambda _t: ({}, {}))
    by_group, by_shape = ids
    got = by_group.get(group)
    if got is None:
        shape = group_shape(group, topology)
        got = by_group[group] = by_shape.setdefault(shape, len(by_shape))
    return got


class TPIslands:
    """Which TP groups are isolated islands, and the closed-form time of their collectives.

    ``tp_groups``: the TP groups (ranks); ``other_groups``: every other set of ranks that
    communicates among itself (DP, EP, CP groups: all ordered pairs are checked); ``pairs``:
    extra (src node, dst node) pairs (pipeline neighbours, offload targets), both directions
    are checked."""

    def __init__(self, topology: Topology, tp_groups: Iterable[Sequence[int]],
                 other_groups: Iterable[Sequence[int]] = (), pairs: Iterable[tuple[str, str]] = (),
                 options: EngineOptions | None = None) -> None:
        self.topology = topology
        self.options = options or EngineOptions(record_links=False)
        self.calibration = self.options.model_calibration     # merged once, not per collective
        self.router = router_for(topology)
        self.chmap = channel_map_for(topology)
        self._times: dict[tuple[str, float, tuple[int, ...]], float | None] = {}
        self._by_shape: dict[tuple, float | None] = {}
        self._by_shape_chosen: dict[tuple, str] = {}
        #: ``algorithm/protocol`` of every closed-form time given out (what ``auto`` chose)
        self.chosen: set[str] = set()
        self.reasons: dict[tuple[int, ...], str] = {}
        tp_groups = [tuple(g) for g in tp_groups if len(g) > 1]
        node = topology.node_of
        own: dict[tuple[int, ...], frozenset[int]] = {}
        for g in tp_groups:
            own[g], unique = _group_routes(topology, g)
            if not unique:
                self.reasons[g] = "a route inside the group has ECMP choices"
        # every channel someone else may use, with who uses it
        used: dict[int, str] = {}
        for g in tp_groups:
            for c in own[g]:
                used.setdefault(c, f"TP group {brief_ranks(g)}")
        foreign: dict[int, str] = {}
        all_own = set().union(*own.values()) if own else set()
        regions = _endpoint_regions(topology, self.chmap, all_own)
        others = [tuple(g) for g in other_groups if len(g) > 1]
        group_pairs = _group_pairs_near(others, regions, node) if regions is not None else (
            (grp, a, b) for grp in others for a in grp for b in grp if a != b)
        for grp, a, b in group_pairs:
            for c in route_channels(self.router, self.chmap, node(a), node(b)):
                foreign.setdefault(c, f"group {brief_ranks(grp)}")
        for s, d in pairs:
            for x, y in ((s, d), (d, s)):
                if regions is not None and not _near(regions, x, y):
                    continue
                for c in route_channels(self.router, self.chmap, x, y):
                    foreign.setdefault(c, f"transfer {x} -> {y}")
        for g in tp_groups:
            if g in self.reasons:
                continue
            hit = next((c for c in sorted(own[g]) if c in foreign), None)
            if hit is not None:
                ch = self.chmap.channels[hit]
                self.reasons[g] = f"channel {ch.a}->{ch.b} is also used by {foreign[hit]}"
                continue
            other_tp = next((c for c in sorted(own[g]) if used.get(c, "") != f"TP group {brief_ranks(g)}"), None)
            if other_tp is not None:
                ch = self.chmap.channels[other_tp]
                self.reasons[g] = f"channel {ch.a}->{ch.b} is shared with {used[other_tp]}"
        self.isolated_groups: frozenset[tuple[int, ...]] = frozenset(g for g in tp_groups
                                                                     if g not in self.reasons)

    def isolated(self, group: Sequence[int]) -> bool:
        """True when ``group``'s collectives may be timed in closed form."""
        return tuple(group) in self.isolated_groups

    @property
    def fallbacks(self) -> dict[tuple[int, ...], str]:
        """Groups that keep simulated collectives, with the reason."""
        return dict(self.reasons)

    def time(self, op: str, size: float, group: Sequence[int]) -> float | None:
        """Idle-network time (s) of ``op`` of ``size`` bytes on ``group``, the same for every
        member; ``None`` (fall back) when the members finish at different times."""
        key = (op, float(size), tuple(group))
        if key in self._times:
            return self._times[key]
        o = self.options
        cut = o.shortcuts
        memo = cut.shape_memo
        g = tuple(group)
        # groups of one shape (same routes up to renaming) have the same idle-network time
        shape_key = (op, float(size), _shape_id(self.topology, g)) if memo else None
        known = self._by_shape.get(shape_key, _UNKNOWN) if memo else _UNKNOWN
        if known is not _UNKNOWN:
            if known is None:
                self.reasons.setdefault(g, f"{op} of {size:g} B: members finish at different times")
            self._times[key] = known
            if known is not None:
                self.chosen.add(self._by_shape_chosen[shape_key])
            return known
        plan = plan_collective(op, g, float(size), self.topology, o.collectives,
                               compact_schedules=cut.compact_schedules, calibration=self.calibration)
        env = simpy.Environment()
        net = make_network(o.network, env, self.topology, record_links=False, bundles=cut.bundles)
        run = run_schedule(net, plan.schedule, protocol=plan.protocol,
                           reduction_bw=o.collectives.reduction_bw, bundles=cut.bundles)
        env.run(run.done)
        finishes = [run.rank_finish[r] for r in g]
        hi, lo = max(finishes), min(finishes)
        value: float | None = hi
        if hi - lo > _SAME_FINISH_RTOL * hi:
            value = None
            self.reasons.setdefault(g, f"{op} of {size:g} B: members finish at different times")
        self._times[key] = value
        chosen = f"{plan.schedule.algorithm}/{plan.protocol.name}"
        if value is not None:
            self.chosen.add(chosen)
        if memo:
            self._by_shape[shape_key] = value
            self._by_shape_chosen[shape_key] = chosen
        return value
