"""The :class:`Topology`: a validated networkx graph of a cluster.

Nodes
    Every node has a ``kind`` (one of :data:`NODE_KINDS`). GPU nodes also carry ``rank``
    (int, 0..N-1) and ``device`` (a GPU name from :mod:`dessim.catalog.devices`, or ``None``).
    Memory nodes (``host_mem``, ``cxl_mem``) may carry ``capacity`` (bytes).
    ``transit`` (bool) says whether traffic between two *other* nodes may be routed through
    this node. Defaults: switches, NICs and CPUs forward; memory, storage and parameter-server
    nodes (``param_server``, :mod:`dessim.topology.paramservers`) never do;
    GPUs forward (direct topologies such as rings and tori need it) unless the builder or the
    YAML file says ``transit: false`` (the DGX presets do: GPUs there do not route IB traffic).
    A GPU may name its own NIC with ``nic`` (a node of kind ``nic``): routing then sends the
    GPU's traffic that leaves the host through that NIC (see :mod:`dessim.topology.routing`).
    A NIC may name its ``rail`` (an int or a string): NICs of one rail in different hosts are
    cabled to the same rail switch, and routing keeps traffic between GPUs on the receiver's
    rail (PXN, :mod:`dessim.topology.hosts`) unless the topology's ``meta["pxn"]`` is False.
    A switch may declare ``sharp`` (bool, default False): it can reduce data in the network
    (InfiniBand SHARP), which NCCL's CollNet algorithms use (:mod:`dessim.topology.sharp`).

Links
    An undirected edge ``a — b`` with ``type`` (a link type from :mod:`dessim.catalog.links`),
    ``bw`` (bytes/second **per direction**), ``lat`` (seconds, one way), ``duplex``
    (True: each direction has its own ``bw``; False: both directions share one ``bw``) and
    ``efficiency`` (0 < e <= 1, the fraction of ``bw`` that payload can use, e.g. a protocol
    overhead; 1.0 for links given with explicit figures). The network model uses
    ``bw * efficiency`` as capacity.

Ranks
    GPU ranks are 0..N-1. Builders assign them explicitly (documented per builder). A graph
    whose GPUs carry no ``rank`` gets them in node insertion order (the order of ``nodes:``
    in a YAML file). Mixing ranked and unranked GPUs is an error.

Dimensions
    ``dims`` describes the rank space as a multi-dimensional grid (ASTRA-sim style), fastest
    varying first: ``dims=(8, 4)`` means rank = i0 + 8 * i1 (8 GPUs per node, 4 nodes).
    Hierarchical collectives and Chakra ``involved_dim`` use it. Default: ``(N,)``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod
from typing import Any, Callable, Iterator, TypeVar

import networkx as nx

from dessim.errors import TopologyError

_T = TypeVar("_T")

__all__ = ["NODE_KINDS", "TRANSIT_DEFAULT", "Link", "Topology"]

#: Node kinds a topology may contain.
NODE_KINDS: tuple[str, ...] = ("gpu", "cpu", "switch", "nic", "host_mem", "cxl_mem", "storage",
                               "param_server")

#: Whether a node of each kind forwards traffic, unless the node says otherwise.
TRANSIT_DEFAULT: dict[str, bool] = {
    "gpu": True, "cpu": True, "switch": True, "nic": True,
    "host_mem": False, "cxl_mem": False, "storage": False, "param_server": False,
}


@dataclass(frozen=True, slots=True)
class Link:
    """One physical link between nodes ``a`` and ``b`` (figures per direction)."""

    a: str
    b: str
    type: str
    bw: float            #: bytes/second per direction (shared by both directions if not duplex)
    lat: float           #: seconds, one way
    duplex: bool = True
    efficiency: float = 1.0

    @property
    def capacity(self) -> float:
        """Bytes/second usable by payload in one direction: ``bw * efficiency``."""
        return self.bw * self.efficiency


class Topology:
    """A validated, immutable view of a cluster graph.

    Build one with a builder (:mod:`dessim.topology.builders`), a preset, an inline spec or a
    YAML file (:func:`dessim.topology.load_topology`), or directly from an ``nx.Graph`` whose
    attributes follow the module docstring. The constructor validates and raises
    :class:`~dessim.errors.TopologyError` with a message naming the node or link at fault.
    The graph must not be modified afterwards.
    """

    def __init__(self, graph: nx.Graph, name: str = "topology",
                 dims: tuple[int, ...] | list[int] | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        if graph.is_directed() or graph.is_multigraph():
            raise TopologyError(f"{name}: the topology graph must be an undirected nx.Graph "
                                "(one edge per link; a link's bw is per direction)")
        self._graph = graph
        self.name = name
        #: Free-form facts about how the topology was built (builder, parameters, sources).
        self.meta: dict[str, Any] = dict(meta or {})
        self._validate_nodes()
        self._gpus = self._assign_ranks()
        self._rank = {node: r for r, node in enumerate(self._gpus)}
        self._validate_links()
        self._validate_connectivity()
        self.dims: tuple[int, ...] = self._check_dims(dims)
        self._derived: dict[str, Any] = {}

    # ------------------------------------------------------------------ validation
    def derived(self, key: str, make: Callable[["Topology"], _T]) -> _T:
        """``make(self)``, computed once and shared by every caller that asks for ``key``.

        For data that is a pure function of the (immutable) topology — its router, its channel
        map — so that every network and generator on one topology shares one copy. The cache
        lives and dies with the topology and is not pickled (workers rebuild it)."""
        got = self._derived.get(key)
        if got is None:
            got = self._derived[key] = make(self)
        return got

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_derived"] = {}
        return state

    def _validate_nodes(self) -> None:
        for node, data in self._graph.nodes(data=True):
            if not isinstance(node, str) or not node:
                raise TopologyError(f"{self.name}: node names must be non-empty strings, got {node!r}")
            kind = data.get("kind")
            if kind not in NODE_KINDS:
                raise TopologyError(f"{self.name}: node {node!r} has kind {kind!r}; "
                                    f"valid kinds: {', '.join(NODE_KINDS)}")
            data.setdefault("transit", TRANSIT_DEFAULT[kind])
            sharp = data.get("sharp")
            if sharp is not None:
                if not isinstance(sharp, bool):
                    raise TopologyError(f"{self.name}: node {node!r} has sharp={sharp!r}; it "
                                        "must be true or false")
                if sharp and kind != "switch":
                    raise TopologyError(f"{self.name}: node {node!r} has sharp=true but is a "
                                        f"{kind}; only a switch can reduce in the network")
        for node, data in self._graph.nodes(data=True):
            nic = data.get("nic")
            if nic is not None and (nic not in self._graph or self._graph.nodes[nic]["kind"] != "nic"):
                raise TopologyError(f"{self.name}: node {node!r} names {nic!r} as its NIC, but "
                                    "there is no node of kind nic with that name")

    def _assign_ranks(self) -> tuple[str, ...]:
        gpus = [n for n, d in self._graph.nodes(data=True) if d["kind"] == "gpu"]
        if not gpus:
            raise TopologyError(f"{self.name}: the topology has no GPU (node with kind: gpu)")
        ranked = [n for n in gpus if self._graph.nodes[n].get("rank") is not None]
        if not ranked:
            for r, n in enumerate(gpus):
                self._graph.nodes[n]["rank"] = r
            return tuple(gpus)
        if len(ranked) != len(gpus):
            missing = sorted(set(gpus) - set(ranked))[:5]
            raise TopologyError(f"{self.name}: some GPUs have a rank and some do not "
                                f"(e.g. {', '.join(missing)}); give every GPU a rank or none")
        by_rank: dict[int, str] = {}
        for n in gpus:
            r = self._graph.nodes[n]["rank"]
            if not isinstance(r, int) or isinstance(r, bool) or r < 0 or r >= len(gpus):
                raise TopologyError(f"{self.name}: GPU {n!r} has rank {r!r}; ranks must be "
                                    f"integers 0..{len(gpus) - 1}")
            if r in by_rank:
                raise TopologyError(f"{self.name}: GPUs {by_rank[r]!r} and {n!r} both have rank {r}")
            by_rank[r] = n
        return tuple(by_rank[r] for r in range(len(gpus)))

    def _validate_links(self) -> None:
        for a, b, data in self._graph.edges(data=True):
            where = f"{self.name}: link {a} -- {b}"
            if a == b:
                raise TopologyError(f"{where} connects a node to itself")
            for key in ("type", "bw", "lat"):
                if key not in data:
                    raise TopologyError(f"{where} has no {key!r}")
            bw, lat = data["bw"], data["lat"]
            if not isinstance(bw, (int, float)) or not bw > 0 or bw == float("inf"):
                raise TopologyError(f"{where} has bandwidth {bw!r}; it must be a finite number > 0 "
                                    "(bytes/second per direction)")
            if not isinstance(lat, (int, float)) or not lat >= 0 or lat == float("inf"):
                raise TopologyError(f"{where} has latency {lat!r}; it must be a finite number >= 0 "
                                    "(seconds)")
            data.setdefault("duplex", True)
            eff = data.setdefault("efficiency", 1.0)
            if not isinstance(eff, (int, float)) or not 0 < eff <= 1:
                raise TopologyError(f"{where} has efficiency {eff!r}; it must be in (0, 1]")

    def _validate_connectivity(self) -> None:
        # Connectivity as routing sees it: through transit nodes only.
        transit = {n for n, d in self._graph.nodes(data=True) if d["transit"]}
        first = self._gpus[0]
        seen = {first}
        frontier = [first]
        while frontier:
            nxt = []
            for u in frontier:
                if u != first and u not in transit:
                    continue  # reachable as an endpoint, but forwards nothing
                for v in self._graph.adj[u]:
                    if v not in seen:
                        seen.add(v)
                        nxt.append(v)
            frontier = nxt
        cut = [g for g in self._gpus if g not in seen]
        if cut:
            shown = ", ".join(f"{g!r} (rank {self._rank[g]})" for g in cut[:5])
            more = f" and {len(cut) - 5} more" if len(cut) > 5 else ""
            raise TopologyError(f"{self.name}: GPU {shown}{more} cannot be reached from "
                                f"{first!r} (rank 0): the topology is disconnected")
        isolated = [n for n in self._graph.nodes if self._graph.degree(n) == 0]
        if isolated and self._graph.number_of_nodes() > 1:
            raise TopologyError(f"{self.name}: node {isolated[0]!r} has no link")

    def _check_dims(self, dims: tuple[int, ...] | list[int] | None) -> tuple[int, ...]:
        n = len(self._gpus)
        if dims is None:
            return (n,)
        dims = tuple(int(d) for d in dims)
        if any(d < 1 for d in dims) or prod(dims) != n:
            raise TopologyError(f"{self.name}: dims {list(dims)} do not multiply to the "
                                f"{n} GPUs of the topology")
        return dims

    # ------------------------------------------------------------------ queries
    @property
    def graph(self) -> nx.Graph:
        """The underlying networkx graph (read-only by convention)."""
        return self._graph

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPU node names in rank order."""
        return self._gpus

    @property
    def num_gpus(self) -> int:
        return len(self._gpus)

    def rank_of(self, node: str) -> int:
        try:
            return self._rank[node]
        except KeyError:
            raise TopologyError(f"{self.name}: {node!r} is not a GPU of this topology") from None

    def node_of(self, rank: int) -> str:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < len(self._gpus):
            raise TopologyError(f"{self.name}: rank {rank!r} does not exist "
                                f"(ranks are 0..{len(self._gpus) - 1})")
        return self._gpus[rank]

    def resolve(self, endpoint: str | int) -> str:
        """Node name for a GPU rank (int) or a node name (str); a clear error otherwise."""
        if isinstance(endpoint, int) and not isinstance(endpoint, bool):
            return self.node_of(endpoint)
        if isinstance(endpoint, str) and endpoint in self._graph:
            return endpoint
        hint = ""
        if isinstance(endpoint, str):
            close = [n for n in self._graph.nodes if endpoint.lower() in n.lower()][:5]
            if close:
                hint = f"; similar names: {', '.join(close)}"
        raise TopologyError(f"{self.name}: unknown endpoint {endpoint!r} (give a GPU rank "
                            f"0..{len(self._gpus) - 1} or a node name{hint})")

    def kind(self, node: str) -> str:
        return self._graph.nodes[node]["kind"]

    def nodes_of_kind(self, kind: str) -> list[str]:
        return [n for n, d in self._graph.nodes(data=True) if d["kind"] == kind]

    def device(self, rank: int) -> str | None:
        """GPU model name of a rank (catalog key), or None if the topology does not say."""
        return self._graph.nodes[self.node_of(rank)].get("device")

    def link(self, a: str, b: str) -> Link:
        try:
            d = self._graph.edges[a, b]
        except KeyError:
            raise TopologyError(f"{self.name}: there is no link {a} -- {b}") from None
        return Link(a, b, d["type"], float(d["bw"]), float(d["lat"]), bool(d["duplex"]),
                    float(d["efficiency"]))

    def links(self) -> Iterator[Link]:
        """Every link once, in graph edge order."""
        for a, b in self._graph.edges:
            yield self.link(a, b)

    def counts(self) -> dict[str, dict[str, int]]:
        """Node counts by kind and link counts by type."""
        kinds = Counter(d["kind"] for _, d in self._graph.nodes(data=True))
        types = Counter(d["type"] for _, _, d in self._graph.edges(data=True))
        return {"nodes": dict(sorted(kinds.items())), "links": dict(sorted(types.items()))}

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of ``rank`` in :attr:`dims` (fastest-varying first)."""
        self.node_of(rank)
        out = []
        for d in self.dims:
            out.append(rank % d)
            rank //= d
        return tuple(out)

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, gpus={self.num_gpus}, nodes={self._graph.number_of_nodes()}, "
                f"links={self._graph.number_of_edges()}, dims={list(self.dims)})")
