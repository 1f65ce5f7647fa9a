"""A storage tier for a topology: a parallel file system or node-local NVMe drives.

:func:`attach_storage` returns a *new* :class:`~dessim.topology.graph.Topology` (the graph is
copied; ranks, dims and meta are kept) with nodes of kind ``storage`` linked in. Input
pipelines (:mod:`dessim.workload.dataparallel.io`) read samples from the storage node nearest to each GPU.

``kind="pfs"`` — a parallel file system (Lustre, GPFS, ...) shared by every client
    One ``storage`` node ``<name>`` (default ``pfs``) behind a switch ``<name>.sw``: the link
    ``<name> — <name>.sw`` carries the file system's aggregate bandwidth ``bw``; the switch
    links to every attachment point with ``client_bw`` (default ``bw``: the clients' links
    do not limit). So ``W`` GPUs reading at once share ``bw`` max-min fairly. Default
    attachment points: the top tier of switches (the switches farthest from the GPUs) when
    the network has at least two tiers — where a storage fabric meets a cluster fabric, and
    where the extra switch creates no shortcut between GPUs — otherwise the CPUs (storage
    NICs hang off the host), otherwise the single tier of switches.
``kind="nvme"`` — node-local drives
    One ``storage`` node ``<name><i>`` (default ``nvme<i>``) per attachment point, each
    linked with ``bw`` (the drive's or RAID's read bandwidth). Default attachment points: the
    CPUs (DGX: the data-cache drives sit behind the host's PCIe), otherwise every GPU.

``attach``: node names (a list) or an :mod:`fnmatch` pattern (``"spine*"``, ``"n*.cpu0"``)
overrides the default. Latency ``lat`` is per storage link; defaults (both [U], order of
magnitude only): 100 us for a PFS (a small read's round trip through the file-system
client and servers) and 80 us for NVMe (4 KiB random-read latency of data-centre SSDs).
Units: bytes/second per direction, seconds.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

import networkx as nx

from dessim.errors import TopologyError
from dessim.topology.builders import link_attrs
from dessim.topology.graph import Topology

__all__ = ["attach_storage", "STORAGE_KINDS", "DEFAULT_LAT", "default_attach_points"]

#: Storage tiers :func:`attach_storage` knows.
STORAGE_KINDS: tuple[str, ...] = ("pfs", "nvme")
#: Default latency of a storage link per kind, seconds ([U], module docstring).
DEFAULT_LAT: dict[str, float] = {"pfs": 100e-6, "nvme": 80e-6}


def _distance_from_gpus(topology: Topology) -> dict[str, int]:
    graph = topology.graph
    dist = {g: 0 for g in topology.gpus}
    frontier = list(topology.gpus)
    while frontier:
        nxt = []
        for u in frontier:
            for v in graph.adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    nxt.append(v)
        frontier = nxt
    return dist


def default_attach_points(topology: Topology, kind: str) -> list[str]:
    """Where :func:`attach_storage` attaches ``kind`` storage unless told (module docstring)."""
    cpus = sorted(topology.nodes_of_kind("cpu"))
    if kind == "nvme":
        return cpus or list(topology.gpus)
    dist = _distance_from_gpus(topology)
    switches = [n for n in topology.nodes_of_kind("switch") if n in dist]
    if switches:
        top = max(dist[s] for s in switches)
        tier = sorted(s for s in switches if dist[s] == top)
        if top >= 2 or not cpus:
            return tier
    return cpus or list(topology.gpus)


def _resolve_attach(topology: Topology, attach: str | Sequence[str], where: str) -> list[str]:
    graph = topology.graph
    if isinstance(attach, str):
        names = sorted(n for n in graph.nodes if fnmatch.fnmatchcase(n, attach))
        if not names:
            raise TopologyError(f"{where}: attach pattern {attach!r} matches no node of {topology.name!r}")
        return names
    names = list(attach)
    for n in names:
        if n not in graph:
            raise TopologyError(f"{where}: attach point {n!r} is not a node of {topology.name!r}")
    if not names:
        raise TopologyError(f"{where}: attach must name at least one node")
    return names


def attach_storage(topology: Topology, kind: str = "pfs", bw: float | str = "10GB/s", *,
                   lat: float | str | None = None, attach: str | Sequence[str] | None = None,
                   client_bw: float | str | None = None, name: str | None = None) -> Topology:
    """``topology`` plus a storage tier (module docstring); bad arguments raise
    :class:`~dessim.errors.TopologyError` naming them."""
    where = f"storage ({kind})"
    if kind not in STORAGE_KINDS:
        raise TopologyError(f"storage kind {kind!r} is unknown; valid: {', '.join(STORAGE_KINDS)}")
    lat = DEFAULT_LAT[kind] if lat is None else lat
    attrs = link_attrs(bw, lat, "storage", where=f"{where} bw/lat")
    points = (default_attach_points(topology, kind) if attach is None
              else _resolve_attach(topology, attach, where))
    graph: nx.Graph = topology.graph.copy()
    base = name or kind
    if kind == "pfs":
        if base in graph or f"{base}.sw" in graph:
            raise TopologyError(f"{where}: node {base!r} already exists in {topology.name!r}; give another name")
        client = link_attrs(bw if client_bw is None else client_bw, lat, "storage",
                            where=f"{where} client_bw")
        graph.add_node(base, kind="storage")
        graph.add_node(f"{base}.sw", kind="switch")
        graph.add_edge(base, f"{base}.sw", **attrs)
        for p in points:
            graph.add_edge(f"{base}.sw", p, **client)
        added = [base]
    else:
        added = []
        for i, p in enumerate(points):
            node = f"{base}{i}"
            if node in graph:
                raise TopologyError(f"{where}: node {node!r} already exists in {topology.name!r}")
            graph.add_node(node, kind="storage")
            graph.add_edge(node, p, **attrs)
            added.append(node)
    meta = dict(topology.meta)
    meta["storage"] = list(meta.get("storage", [])) + [
        {"kind": kind, "nodes": added, "bw": attrs["bw"], "lat": attrs["lat"], "attach": points}]
    return Topology(graph, name=topology.name, dims=topology.dims, meta=meta)
