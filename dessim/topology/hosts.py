"""Hosts, NICs and rails of a topology: the facts NCCL's topology search works from.

A *host* is a connected part of the topology graph once its NICs (and the nodes that forward
no traffic, other than GPUs: memory pools, storage) are taken out that holds at least one GPU:
one server, with its GPUs, PCIe switches, CPUs and NVSwitch. Two GPUs
of different hosts can only talk through NICs and the fabric between them.

For every host, :class:`HostMap` knows:

* its GPUs (ranks, ascending) and its NICs (names, sorted);
* each GPU's own NIC (node attribute ``nic``, set by the DGX presets: GPU i ↔ NIC i) and each
  NIC's *local GPU* (the GPU that names it);
* each NIC's *rail* (node attribute ``rail``): NICs with equal rails in different hosts are
  cabled to the same rail switch of a rail-optimised fabric (DGX SuperPOD reference
  architecture, "Network Fabrics": NIC i of every node goes to leaf i), so traffic between
  them needs one leaf hop and no spine;
* which GPUs reach a NIC through one PCIe switch without crossing a CPU (NCCL's path type
  ``PIX``, ``src/include/graph.h``).

NCCL builds each ring channel to enter and leave every node through NICs of one rail and,
with PXN (``src/graph/paths.cc``, ``ncclTopoComputePaths``), lets a GPU send through the NIC
of another GPU's rail by forwarding over NVLink to that NIC's local GPU (docs/collectives.md;
sources in docs/references.md). :class:`~dessim.topology.routing.Router` and the ring builder
of :mod:`dessim.collectives` read these facts from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import networkx as nx

from dessim.topology.graph import Topology

__all__ = ["Host", "HostMap", "host_map"]


@dataclass(frozen=True)
class Host:
    """One server of a topology (see the module docstring)."""

    index: int
    gpus: tuple[int, ...]                 #: ranks, ascending
    nics: tuple[str, ...]                 #: NIC node names, sorted
    nic_of: Mapping[int, str]             #: rank -> its own NIC (absent: none declared)
    local_gpu: Mapping[str, int]          #: NIC -> the rank that names it as its NIC
    rail: Mapping[str, object]            #: NIC -> its rail (absent: none declared)
    pix: Mapping[str, frozenset[int]] = field(default_factory=dict)  #: NIC -> ranks one PCIe switch away

    def nic_on_rail(self, rail: object) -> str | None:
        """This host's NIC on ``rail`` (the first by name if several), or None."""
        for nic in self.nics:
            if self.rail.get(nic) == rail:
                return nic
        return None


class HostMap:
    """The hosts of a topology and the host of every rank (see the module docstring)."""

    def __init__(self, topology: Topology) -> None:
        graph = topology.graph
        nics = {n for n, d in graph.nodes(data=True) if d["kind"] == "nic"}
        # a node that forwards nothing (a memory pool cabled to GPUs of several servers,
        # a storage node) joins no two servers: only GPUs and forwarding nodes make a host
        inner = graph.subgraph(n for n, d in graph.nodes(data=True)
                               if n not in nics and (d["kind"] == "gpu" or d["transit"]))
        parts = [part for part in nx.connected_components(inner)
                 if any(graph.nodes[n]["kind"] == "gpu" for n in part)]
        parts.sort(key=lambda part: min(graph.nodes[n]["rank"] for n in part
                                        if graph.nodes[n]["kind"] == "gpu"))
        self._host_of: dict[int, int] = {}
        #: node name -> host index, for every node inside a host (NICs excluded)
        self.domain: dict[str, int] = {}
        hosts = []
        for i, part in enumerate(parts):
            for n in part:
                self.domain[n] = i
            ranks = sorted(graph.nodes[n]["rank"] for n in part if graph.nodes[n]["kind"] == "gpu")
            own_nics = sorted({m for n in part for m in graph.adj[n] if m in nics})
            nic_of = {graph.nodes[topology.node_of(r)]["rank"]: graph.nodes[topology.node_of(r)]["nic"]
                      for r in ranks if graph.nodes[topology.node_of(r)].get("nic")}
            local = {nic: r for r, nic in sorted(nic_of.items(), reverse=True)}
            rail = {nic: graph.nodes[nic]["rail"] for nic in own_nics
                    if graph.nodes[nic].get("rail") is not None}
            pix = {}
            for nic in own_nics:
                near = set()
                for sw in graph.adj[nic]:
                    if graph.nodes[sw]["kind"] != "switch" or sw not in part:
                        continue
                    near.update(graph.nodes[g]["rank"] for g in graph.adj[sw]
                                if graph.nodes[g]["kind"] == "gpu")
                pix[nic] = frozenset(near)
            hosts.append(Host(i, tuple(ranks), tuple(own_nics), MappingProxyType(nic_of),
                              MappingProxyType(local), MappingProxyType(rail),
                              MappingProxyType(pix)))
            for r in ranks:
                self._host_of[r] = i
        self.hosts: tuple[Host, ...] = tuple(hosts)

    def host_of(self, rank: int) -> Host:
        """The host of GPU ``rank``."""
        return self.hosts[self._host_of[rank]]

    def rail_of(self, rank: int) -> object | None:
        """The rail of the NIC of GPU ``rank`` (None: no NIC or no rail declared)."""
        host = self.host_of(rank)
        nic = host.nic_of.get(rank)
        return None if nic is None else host.rail.get(nic)

    def split(self, group: tuple[int, ...] | list[int]) -> list[tuple[int, ...]]:
        """The members of ``group`` per host, hosts in order of their first member in
        ``group`` and members in group order."""
        out: dict[int, list[int]] = {}
        for r in group:
            out.setdefault(self._host_of[r], []).append(r)
        return [tuple(v) for v in out.values()]


def host_map(topology: Topology) -> HostMap:
    """The shared :class:`HostMap` of ``topology`` (computed once, :meth:`Topology.derived`)."""
    return topology.derived("host_map", HostMap)
