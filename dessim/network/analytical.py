"""Analytical (alpha-beta) network: no bandwidth sharing.

Every transfer takes ``sum(lat of its path) + n / bottleneck capacity`` regardless of other
traffic (simulation-notes §1c, first row): a baseline that shows what congestion costs in the
flow model, and a fast mode (one simpy Timeout per transfer, no rate solves). Because links are
never shared, the recorded utilisation of a channel may exceed 1.0 — that is the congestion
this model ignores.
"""

from __future__ import annotations

import simpy

from dessim.network.base import Network, Route, register_network
from dessim.topology.graph import Topology
from dessim.topology.routing import Router

__all__ = ["AnalyticalNetwork"]


@register_network
class AnalyticalNetwork(Network):
    """Contention-free alpha-beta model on the routed path."""

    name = "analytical"

    def __init__(self, env: simpy.Environment, topology: Topology, *, router: Router | None = None,
                 record: bool = False, bundles: bool = True) -> None:
        super().__init__(env, topology, router=router, record=record, bundles=bundles)
        self._done_bytes = [0.0] * len(self.channels.directions)
        self._in_use = [0.0] * len(self.channels)   # bytes/s per channel (record=True only)

    def _start(self, route: Route, nbytes: float) -> simpy.Event:
        now = self.env.now
        delay = route.latency + nbytes / route.bottleneck
        done = self.env.timeout(delay, value=now + delay)

        def finished(_: simpy.Event) -> None:
            self.flows_finished += 1
            for d in route.directions:
                self._done_bytes[d] += nbytes

        done.callbacks.append(finished)
        if self.record and nbytes > 0:
            rate = route.bottleneck
            begin = self.env.timeout(route.latency)
            begin.callbacks.append(lambda _: self._load(route, rate))
            done.callbacks.append(lambda _: self._load(route, -rate))
        return done

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
