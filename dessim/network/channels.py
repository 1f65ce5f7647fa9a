"""Directed channels: the resources that flows share.

A topology link ``a — b`` (see :mod:`dessim.topology.graph`) becomes

* two channels ``a→b`` and ``b→a`` when it is full duplex (each direction has its own
  ``bw``), or
* one channel shared by both directions when ``duplex=False``,

each with capacity ``bw * efficiency`` bytes/second. Channel ids are integers
``0..len-1`` in graph edge order (``a→b`` before ``b→a``), so solvers can use plain lists.

Bytes are accounted per *direction* ``(a, b)`` even on a half-duplex link, so a
:class:`ChannelMap` also numbers directions: direction ``i`` is a hop ``(a, b)`` and
``channel_of_direction[i]`` is the channel it loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dessim.errors import TopologyError
from dessim.topology.graph import Topology

__all__ = ["Channel", "ChannelMap", "channel_map_for"]


@dataclass(frozen=True, slots=True)
class Channel:
    """A shared transmission resource. ``(a, b)`` is its direction, or the link's
    orientation in the graph when it is a half-duplex channel serving both directions."""

    id: int
    a: str
    b: str
    capacity: float  #: bytes/second usable by payload (``bw * efficiency``)
    lat: float       #: seconds, one way
    duplex: bool


class ChannelMap:
    """The channels and directions of a topology, with O(1) lookups by node pair."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.channels: list[Channel] = []
        #: Directed hops ``(a, b)``; index = direction id.
        self.directions: list[tuple[str, str]] = []
        #: Channel id loaded by each direction id.
        self.channel_of_direction: list[int] = []
        #: One-way latency (s) of each direction id.
        self.direction_latency: list[float] = []
        self._direction: dict[tuple[str, str], int] = {}
        for link in topology.links():
            cap = link.capacity
            if link.duplex:
                ids = (self._add_channel(link.a, link.b, cap, link.lat, True),
                       self._add_channel(link.b, link.a, cap, link.lat, True))
            else:
                shared = self._add_channel(link.a, link.b, cap, link.lat, False)
                ids = (shared, shared)
            for (a, b), cid in zip(((link.a, link.b), (link.b, link.a)), ids):
                self._direction[(a, b)] = len(self.directions)
                self.directions.append((a, b))
                self.channel_of_direction.append(cid)
                self.direction_latency.append(link.lat)
        #: Capacity (bytes/s) indexed by channel id, for solvers.
        self.capacity: list[float] = [c.capacity for c in self.channels]

    def _add_channel(self, a: str, b: str, cap: float, lat: float, duplex: bool) -> int:
        cid = len(self.channels)
        self.channels.append(Channel(cid, a, b, cap, lat, duplex))
        return cid

    def __len__(self) -> int:
        return len(self.channels)

    def direction(self, a: str, b: str) -> int:
        """Direction id of the hop ``a → b``."""
        try:
            return self._direction[(a, b)]
        except KeyError:
            raise TopologyError(f"{self.topology.name}: there is no link {a} -- {b}") from None

    def channel(self, a: str, b: str) -> int:
        """Channel id loaded by the hop ``a → b`` (the same id both ways if half duplex)."""
        return self.channel_of_direction[self.direction(a, b)]

    def path_directions(self, path: Sequence[str]) -> tuple[int, ...]:
        """Direction ids of the hops of a node path."""
        return tuple(self.direction(a, b) for a, b in zip(path, path[1:]))


def channel_map_for(topology: Topology) -> ChannelMap:
    """The shared (read-only) :class:`ChannelMap` of ``topology``, built on first use: every
    network on one topology numbers its channels the same way, so they can share one map
    (building it costs ~0.2 s for a 1,024-GPU fabric)."""
    return topology.derived("channel_map", ChannelMap)
