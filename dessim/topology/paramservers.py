"""Parameter-server processes as nodes of a topology.

:func:`attach_parameter_servers` returns a *new* :class:`~dessim.topology.graph.Topology`
(graph copied; ranks, dims and meta kept) with ``count`` nodes ``ps0 .. ps<count-1>`` of kind
``param_server`` linked in. A worker's push (gradients) and pull (parameters) are transfers
between its GPU and these nodes (:mod:`dessim.workload.dataparallel.paramserver`), so they
cross the same links as every other flow and share them max-min fairly.

Placements (:data:`PLACEMENTS`)

``dedicated`` — servers on their own hosts (Li et al. 2014, "Scaling Distributed Machine
    Learning with the Parameter Server", OSDI: server nodes separate from worker nodes)
    Server ``i`` is a host with one NIC cabled to edge switch ``i mod E`` of the ``E`` edge
    switches (the switches that GPUs or NICs hang off, ordered by the lowest GPU rank behind
    them, so servers spread over the leaves). Its link has ``bw`` / ``lat``; default: the
    figures of the widest link between that switch and a NIC or GPU — a server host with the
    same NIC as the workers' hosts.
``colocated`` — a server process on a worker host (as in MXNet / BytePS deployments that run
    servers beside workers): server ``i`` sits beside the GPU of rank ``floor(i·W/count)``
    (spread evenly over the ``W`` GPUs): linked to that GPU's own NIC when it names one (the
    DGX presets), else to the GPU itself, with ``bw`` / ``lat`` (default: the widest link of
    that point, so the link to the process never limits). Its traffic enters and leaves the
    fabric through that NIC (or GPU link) and competes with the co-located worker's there.

``attach``: explicit node names, one per server, replacing the default points.
Units: bytes/second per direction, seconds.
"""

from __future__ import annotations

from typing import Sequence

import networkx as nx

from dessim.errors import TopologyError
from dessim.topology.builders import link_attrs
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["PLACEMENTS", "attach_parameter_servers", "edge_switches", "server_names"]

#: Where parameter servers may run (module docstring).
PLACEMENTS: tuple[str, ...] = ("dedicated", "colocated")


def server_names(count: int) -> list[str]:
    """Node names of ``count`` servers: ``ps0 .. ps<count-1>``."""
    return [f"ps{i}" for i in range(count)]


def edge_switches(topology: Topology) -> list[str]:
    """Switches that hosts hang off, ordered by the lowest GPU rank behind them: those adjacent
    to a NIC outside every host (the fabric's leaves) when the topology has NICs, else those
    adjacent to a GPU."""
    graph = topology.graph
    order: dict[str, int] = {}
    nics = topology.nodes_of_kind("nic")
    if nics:
        hosts = host_map(topology)
        for host in hosts.hosts:
            for nic in host.nics:
                for sw in graph.adj[nic]:
                    if graph.nodes[sw]["kind"] == "switch" and sw not in hosts.domain:
                        order.setdefault(sw, host.gpus[0] if host.gpus else 0)
    else:
        for rank in range(topology.num_gpus):
            for sw in graph.adj[topology.node_of(rank)]:
                if graph.nodes[sw]["kind"] == "switch":
                    order.setdefault(sw, rank)
    return sorted(order, key=lambda s: (order[s], s))


def _widest(topology: Topology, node: str, kinds: tuple[str, ...]) -> tuple[float, float] | None:
    """(bw, lat) of the widest link between ``node`` and a neighbour of one of ``kinds``."""
    graph = topology.graph
    best = None
    for nbr in graph.adj[node]:
        if graph.nodes[nbr]["kind"] in kinds:
            data = graph.edges[node, nbr]
            cand = (float(data["bw"]) * float(data.get("efficiency", 1.0)), float(data["lat"]))
            if best is None or cand[0] > best[0]:
                best = cand
    return best


def attach_parameter_servers(topology: Topology, count: int, placement: str = "dedicated", *,
                             bw: float | str | None = None, lat: float | str | None = None,
                             attach: Sequence[str] | None = None) -> Topology:
    """``topology`` plus ``count`` parameter-server nodes (module docstring); bad arguments
    raise :class:`~dessim.errors.TopologyError` naming them."""
    where = f"parameter servers ({placement})"
    if placement not in PLACEMENTS:
        raise TopologyError(f"parameter-server placement {placement!r} is unknown; valid: {', '.join(PLACEMENTS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TopologyError(f"{where}: count {count!r} must be a whole number >= 1")
    graph: nx.Graph = topology.graph.copy()
    names = server_names(count)
    for n in names:
        if n in graph:
            raise TopologyError(f"{where}: node {n!r} already exists in {topology.name!r}")
    if attach is not None:
        points = list(attach)
        if len(points) != count:
            raise TopologyError(f"{where}: attach names {len(points)} nodes for {count} servers")
        for p in points:
            if p not in graph:
                raise TopologyError(f"{where}: attach point {p!r} is not a node of {topology.name!r}")
    elif placement == "dedicated":
        edges = edge_switches(topology)
        if not edges:
            raise TopologyError(f"{where}: {topology.name!r} has no switch for a server host to hang off; "
                                "use placement colocated or name the attach points")
        points = [edges[i % len(edges)] for i in range(count)]
    else:
        W = topology.num_gpus
        points = []
        for i in range(count):
            gpu = topology.node_of(i * W // count)
            nic = graph.nodes[gpu].get("nic")
            points.append(nic if nic in graph else gpu)
    added = []
    for name, point in zip(names, points):
        default = (_widest(topology, point, ("gpu", "nic")) if placement == "dedicated" else None) \
            or _widest(topology, point, ("gpu", "nic", "switch", "cpu"))
        if default is None:
            raise TopologyError(f"{where}: attach point {point!r} has no link to copy figures from; give bw and lat")
        attrs = link_attrs(default[0] if bw is None else bw, default[1] if lat is None else lat, "custom",
                           where=f"{where} {name} bw/lat")
        graph.add_node(name, kind="param_server")
        graph.add_edge(name, point, **attrs)
        added.append({"name": name, "attach": point, "bw": attrs["bw"], "lat": attrs["lat"]})
    meta = dict(topology.meta)
    meta["parameter_servers"] = {"placement": placement, "servers": added}
    return Topology(graph, name=topology.name, dims=topology.dims, meta=meta)
