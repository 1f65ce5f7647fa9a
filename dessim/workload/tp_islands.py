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
once with the same schedule, algorithm choice (``auto`` resolved by
:func:`dessim.collectives.choose` as the engine does), network model and options as
:class:`dessim.engine.EngineOptions` would use. Per-rank finish times must coincide (a
symmetric collective); otherwise the group falls back to simulated collectives.

The result is exact when the members of a group arrive together — always true after the
first collective of a pass when the members run identical work, and at the pass start when
their inputs arrive together (symmetric routes). If members arrive at different times, the
closed form is a barrier (start = last arrival) while the engine's replay lets early ranks
send their first step early: an approximation, bounded by the arrival skew.

Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import simpy

from dessim.collectives import build_schedule, choose, get_op, run_schedule
from dessim.network import make_network
from dessim.network.channels import ChannelMap
from dessim.topology.graph import Topology
from dessim.topology.routing import Router, router_for

__all__ = ["CollectiveTiming", "TPIslands", "route_channels"]

#: Relative spread of per-rank finish times still considered "one finish time" (float noise).
_SAME_FINISH_RTOL = 1e-12


@dataclass(frozen=True)
class CollectiveTiming:
    """The engine options that decide a collective's time (mirror of the fields of
    :class:`dessim.engine.EngineOptions` that :meth:`Engine._schedule` and
    :func:`run_schedule` use)."""

    network: str = "flow"
    algo: str | None = None
    chunks: int = 1
    channels: int = 1
    reduction_bw: float | None = None
    compact: bool = True
    bundles: bool = True

    @classmethod
    def from_engine(cls, options: object | None) -> "CollectiveTiming":
        if options is None:
            return cls()
        return cls(network=options.network, algo=options.algo, chunks=options.chunks,  # type: ignore[attr-defined]
                   channels=options.channels, reduction_bw=options.reduction_bw,  # type: ignore[attr-defined]
                   compact=options.compact_schedules, bundles=options.bundles)  # type: ignore[attr-defined]


def route_channels(router: Router, chmap: ChannelMap, src: str, dst: str) -> set[int]:
    """Channel ids of every path ``router`` may choose from ``src`` to ``dst`` (the union over
    all ECMP keys, :meth:`Router.possible_hops`)."""
    return {chmap.channel(a, b) for a, b in router.possible_hops(src, dst)}


class TPIslands:
    """Which TP groups are isolated islands, and the closed-form time of their collectives.

    ``tp_groups``: the TP groups (ranks); ``other_groups``: every other set of ranks that
    communicates among itself (DP, EP, CP groups: all ordered pairs are checked); ``pairs``:
    extra (src node, dst node) pairs (pipeline neighbours, offload targets), both directions
    are checked."""

    def __init__(self, topology: Topology, tp_groups: Iterable[Sequence[int]],
                 other_groups: Iterable[Sequence[int]] = (), pairs: Iterable[tuple[str, str]] = (),
                 timing: CollectiveTiming | None = None) -> None:
        self.topology = topology
        self.timing = timing or CollectiveTiming()
        self.router = router_for(topology)
        self.chmap = ChannelMap(topology)
        self._times: dict[tuple[str, float, tuple[int, ...]], float | None] = {}
        self.reasons: dict[tuple[int, ...], str] = {}
        tp_groups = [tuple(g) for g in tp_groups if len(g) > 1]
        node = topology.node_of
        own: dict[tuple[int, ...], set[int]] = {}
        for g in tp_groups:
            chans: set[int] = set()
            unique = True
            for a in g:
                for b in g:
                    if a != b:
                        chans |= route_channels(self.router, self.chmap, node(a), node(b))
                        unique &= self.router.key_independent(node(a), node(b))
            own[g] = chans
            if not unique:
                self.reasons[g] = "a route inside the group has ECMP choices"
        # every channel someone else may use, with who uses it
        used: dict[int, str] = {}
        for g in tp_groups:
            for c in own[g]:
                used.setdefault(c, f"TP group {list(g)}")
        foreign: dict[int, str] = {}
        for grp in other_groups:
            grp = tuple(grp)
            if len(grp) < 2:
                continue
            for a in grp:
                for b in grp:
                    if a != b:
                        for c in route_channels(self.router, self.chmap, node(a), node(b)):
                            foreign.setdefault(c, f"group {list(grp)}")
        for s, d in pairs:
            for x, y in ((s, d), (d, s)):
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
            other_tp = next((c for c in sorted(own[g]) if used.get(c, "") != f"TP group {list(g)}"), None)
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
        t = self.timing
        g = tuple(group)
        opx = get_op(op)
        algo = t.algo or "auto"       # the generator's tasks use the Task default, "auto"
        if algo == "auto":
            algo = choose(opx, g, float(size), self.topology, chunks=t.chunks, channels=t.channels,
                          reduction_bw=t.reduction_bw).algorithm
        sched = build_schedule(opx, algo, g, float(size), chunks=t.chunks, channels=t.channels,
                               topology=self.topology, compact=t.compact)
        env = simpy.Environment()
        net = make_network(t.network, env, self.topology, record=False, bundles=t.bundles)
        run = run_schedule(net, sched, reduction_bw=t.reduction_bw, bundles=t.bundles)
        env.run(run.done)
        finishes = [run.rank_finish[r] for r in g]
        hi, lo = max(finishes), min(finishes)
        value: float | None = hi
        if hi - lo > _SAME_FINISH_RTOL * hi:
            value = None
            self.reasons.setdefault(g, f"{op} of {size:g} B: members finish at different times")
        self._times[key] = value
        return value
