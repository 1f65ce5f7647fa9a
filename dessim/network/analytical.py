"""Analytical (alpha-beta) network: no bandwidth sharing.

Every transfer takes ``sum(lat of its path) + n / bottleneck capacity`` regardless of other
traffic (the α + nβ model of Thakur et al. 2005, docs/references.md): a baseline that shows
what congestion costs in the flow model, and a fast mode (one simpy Timeout per transfer, no
rate solves). Because links are never shared, the recorded utilisation of a channel may exceed
1.0 — that is the congestion this model ignores.

Bundles: transfers started together whose routes have the same latency and bottleneck end
together, so they travel as one timeout (:meth:`AnalyticalNetwork.bundle_groups` groups a
step by those two figures) — the same times as one timeout each.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import simpy

from dessim.network.base import BundleTemplate, Network, Route, register_network, remaining_latency
from dessim.network.families import LaneFamily
from dessim.topology.graph import Topology
from dessim.topology.routing import Router

__all__ = ["AnalyticalNetwork"]


@register_network
class AnalyticalNetwork(Network):
    """Contention-free alpha-beta model on the routed path."""

    name = "analytical"

    def __init__(self, env: simpy.Environment, topology: Topology, *, router: Router | None = None,
                 record_links: bool = False, bundles: bool = True) -> None:
        super().__init__(env, topology, router=router, record_links=record_links, bundles=bundles)
        self._in_use = [0.0] * len(self.channels)   # bytes/s per channel (record_links=True only)

    def _start(self, route: Route, nbytes: float, latency: float) -> simpy.Event:
        now = self.env.now
        delay = latency + nbytes / route.bottleneck
        done = self.env.timeout(delay, value=now + delay)

        def finished(_: simpy.Event) -> None:
            self.flows_finished += 1
            for d in route.directions:
                self._done_bytes[d] += nbytes

        done.callbacks.append(finished)
        if self.record_links and nbytes > 0:
            rate = route.bottleneck
            begin = self.env.timeout(latency)
            begin.callbacks.append(lambda _: self._load(route, rate))
            done.callbacks.append(lambda _: self._load(route, -rate))
        return done

    def bundle_template(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                        family: LaneFamily | None = None) -> BundleTemplate | None:
        """One timeout for transfers with key-independent routes of equal latency and
        bottleneck (no sharing in this model, so channels may repeat); None otherwise (and
        with a lane ``family``, which this model does not certify)."""
        if family is not None or not self.bundles or self.record_links or not sources or len(sources) != len(destinations):
            return None
        routes = self.fixed_routes(sources, destinations)
        return None if routes is None else _same_timing(routes)

    def bundle_groups(self, sources: Sequence[str | int], destinations: Sequence[str | int],
                      key: int | Sequence[int] = 0, *, cache: bool = True,
                      family: LaneFamily | None = None
                      ) -> tuple[tuple[BundleTemplate | None, tuple[int, ...]], ...] | None:
        """Transfers grouped by (latency, bottleneck) of their routes with ``key`` (one for
        all or one per transfer): each group ends at one time. Local copies stay single.
        None with a lane ``family`` (not certified by this model)."""
        if family is not None or not self.bundles or self.record_links:
            return None
        routes = self.keyed_routes(sources, destinations, key)
        classes: dict[tuple[float, float], list[int]] = {}
        for i, r in enumerate(routes):
            classes.setdefault((-1.0, -1.0) if r is None else (r.latency, r.bottleneck), []).append(i)
        out = []
        for (lat, _), members in classes.items():
            if lat < 0:
                out.append((None, tuple(members)))
            else:
                out.append((_same_timing([routes[m] for m in members]), tuple(members)))
        return tuple(sorted(out, key=lambda g: g[1][0]))

    def start_bundle(self, template: BundleTemplate, nbytes: float,
                     on_done: Callable[[Sequence[int]], None], *,
                     latency: float | None = None) -> None:
        n = self._size(nbytes, "bundle", f"{len(template)} members")
        self.flows_started += len(template)
        done = self.env.timeout(remaining_latency(template.latency, latency) + n / template.bottleneck)
        members = range(len(template))

        def finished(_: simpy.Event) -> None:
            self.flows_finished += len(template)
            for d in template.directions.tolist():
                self._done_bytes[d] += n
            on_done(members)

        done.callbacks.append(finished)

    def link_bytes(self) -> dict[tuple[str, str], float]:
        """Bytes per direction of the transfers completed so far (a transfer counts whole
        when it finishes: this model has no notion of partial progress)."""
        return self._bytes_by_direction(list(self._done_bytes))

    def _load(self, route: Route, rate: float) -> None:
        now = self.env.now
        for c in route.channels:
            self._in_use[c] += rate
            ch = self.channels.channels[c]
            used = max(self._in_use[c], 0.0) / ch.capacity
            self.utilisation.append((now, (ch.a, ch.b), used))


def _same_timing(routes: Sequence[Route]) -> BundleTemplate | None:
    """A template when every route has the first one's latency and bottleneck."""
    first = routes[0]
    if any(r.latency != first.latency or r.bottleneck != first.bottleneck for r in routes):
        return None
    chans = np.fromiter((c for r in routes for c in r.channels), dtype=np.int64)
    dirs = np.fromiter((d for r in routes for d in r.directions), dtype=np.int64)
    return BundleTemplate(tuple(routes), chans, dirs, first.latency, first.bottleneck, first.bottleneck)
