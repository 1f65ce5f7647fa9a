"""Shortest-path routing with deterministic ECMP.

:class:`Router` answers ``path(src, dst, key)``: a shortest path in hops from ``src`` to
``dst`` whose *intermediate* nodes all have ``transit=True`` (a node with ``transit=False``,
e.g. a memory node or a DGX GPU, may only be an endpoint). Among the shortest paths only the
*widest* ones are used — those whose bottleneck capacity (``bw * efficiency`` of the
narrowest link) is the largest — so that two GPUs joined both through an NVSwitch and
through a PCIe switch (two hops either way) talk over NVLink, as NCCL's peer-to-peer
transport does. When several shortest paths of that width remain (equal-cost multi-path,
ECMP), every hop picks one of the equal next hops with a hash of
the flow identity — ``zlib.crc32`` of ``(key, src, dst, current node)`` — the way a switch
hashes a packet's 5-tuple: different flows spread over the paths, the same flow (same
endpoints and ``key``) always takes the same path, and the choice never depends on Python's
per-process string hashing (``hash()``) or on set order. Pass a different ``key`` per flow
(e.g. a collective step, a channel or a queue-pair number) to spread flows between the same
endpoints. This is ``routing: ecmp`` (the default of generic topologies; Ethernet/RoCE
fabrics hash the UDP source port a NIC sets per queue pair).

``routing: dmodk`` (the default of the DGX and NVL72 presets, whose fabrics are InfiniBand) is
InfiniBand's destination-based static routing as OpenSM's fat-tree engine (``ftree``) sets up
the switches' forwarding tables: a switch forwards by destination LID alone, so every flow
to one destination takes one path whatever its queue pair (the key is ignored), and the up
port towards destination ``d`` is chosen *D-mod-K*: at the i-th choice on the way,
``floor(d / (k_1 ... k_{i-1})) mod k_i`` of the ``k_i`` equal next hops (sorted by name),
where ``d`` is the destination's index with the endpoints numbered leaf by leaf (each leaf's
ports in cabling order). Destinations under one leaf thus come down through different
spines, which makes shift permutations contention-free on a full fat tree (Zahavi et al.,
"Optimized InfiniBand fat-tree routing for shift all-to-all communication patterns",
Concurrency and Computation 22(2), 2010; OpenSM's ``ftree`` routing engine, opensm
``doc/current-routing.txt``). Adaptive routing (per-packet choice by port load, which
NVIDIA's subnet manager can enable) is not modelled; D-mod-K is its static counterpart.

Most pairs have a single widest shortest path (every GPU pair on one switch, every pair inside
a DGX island, ...): there the key cannot change the answer, so the path is memoised per
``(src, dst)`` and :meth:`Router.key_independent` says so — callers (the network's route
cache, flow bundles) then skip per-key work entirely. The answer is the same either way.

NIC affinity: a GPU node may name its own NIC (attribute ``nic``, set by the DGX presets: GPU i
↔ NIC i). A path that leaves the host through a NIC then leaves (and enters) through that NIC,
as NCCL pins each GPU to its nearest NIC, instead of hashing over both NICs of a PCIe switch.

Cost: one breadth-first search per *destination anchor* (numpy over the adjacency arrays,
level by level, only as far as a lookup needs), cached — no all-pairs enumeration up front;
next hops and path widths are then evaluated only at the nodes a walk visits. A destination
with a single link (a GPU or host under a leaf switch) reuses the search of its only
neighbour, so a leaf-spine of thousands of GPUs needs one search per leaf switch; two ends
joined through a single widest common forwarding neighbour (two GPUs on an NVSwitch, a GPU
and the NIC on its PCIe switch) need none (:meth:`Router._only_middle`). The number
of cached searches is bounded (:data:`MAX_CACHED_MAPS`, least recently used dropped).
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict

import networkx as nx
import numpy as np

from dessim.errors import TopologyError
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["Router", "router_for", "ROUTINGS", "MAX_CACHED_MAPS", "MAX_CACHED_PATHS"]

#: How a switch chooses among equal-cost next hops (topology ``meta["routing"]``; see the
#: module docstring): per-flow hashing, or InfiniBand's destination-mod-k static routing.
ROUTINGS: dict[str, str] = {
    "ecmp": "per-flow hash of (key, source, destination) at every choice (Ethernet ECMP)",
    "dmodk": "destination-based D-mod-K static routing (InfiniBand, OpenSM ftree)",
}

#: Route searches kept per router (one per destination anchor). Each holds a one-byte hop
#: distance per node (four bytes past 127 hops), so memory is about
#: ``MAX_CACHED_MAPS * nodes`` bytes. Found paths are memoised apart (MAX_CACHED_PATHS), so
#: a dropped search costs only the first lookups of new destinations again.
MAX_CACHED_MAPS: int = 512

#: Paths memoised per router before the memo is cleared (bounded memory, same answers).
MAX_CACHED_PATHS: int = 200_000


class _Search:
    """Routing state towards one ``target``: hop distances from a breadth-first search
    through forwarding nodes (numpy, level by level, resumed on demand), and the widest
    equal-cost next hops of the nodes that are asked for (computed on demand, memoised).

    Behaves as a read-only mapping ``node -> next hops`` (sorted names) over the nodes that
    can reach ``target``; the target maps to ``()``. A node's next hops are its neighbours
    one hop closer that forward traffic (or are the target), restricted to those on a widest
    path — exactly the rule of a full search, evaluated only where a walk goes."""

    __slots__ = ("router", "target", "forwards", "dist", "frontier", "depth", "memo", "width")

    def __init__(self, router: "Router", target: str, forwards: np.ndarray,
                 last: float = math.inf) -> None:
        self.router = router
        self.target = target
        self.forwards = forwards               #: which nodes may be inner nodes of a path
        t = router._index[target]
        # hop counts stay small (a fabric's diameter); int8 until a search goes deeper
        self.dist = np.full(len(router._names), -1, dtype=np.int8)
        self.dist[t] = 0
        self.frontier = np.array([t], dtype=np.int64)
        self.depth = 0
        self.memo: dict[str, tuple[str, ...]] = {target: ()}
        #: widest bottleneck to the target; ``last`` caps it (the capacity of a hop beyond
        #: the target that every path takes, so that widths compare exactly as to the end)
        self.width: dict[str, float] = {target: last}

    def _level(self) -> None:
        """Settle the next level of the search."""
        r = self.router
        f = self.frontier
        if self.depth > 0:                       # only the target and forwarding nodes expand
            f = f[self.forwards[f]]
        starts = r._indptr[f]
        lens = r._indptr[f + 1] - starts
        total = int(lens.sum())
        self.depth += 1
        if total == 0:
            self.frontier = f[:0]
            return
        offsets = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)
        nb = r._indices[offsets]
        if self.depth > np.iinfo(self.dist.dtype).max:
            self.dist = self.dist.astype(np.int32)
        nb = nb[self.dist[nb] < 0]
        if len(nb) > 1:                          # distinct, ascending (a mark per node, no sort)
            mark = np.zeros(len(self.dist), dtype=bool)
            mark[nb] = True
            nb = np.flatnonzero(mark)
        self.dist[nb] = self.depth
        self.frontier = nb

    def _distance(self, node: str) -> int:
        """Hops from ``node`` to the target (-1: unreachable), searching as far as needed."""
        i = self.router._index[node]
        while self.dist[i] < 0 and len(self.frontier):
            self._level()
        return int(self.dist[i])

    def __contains__(self, node: object) -> bool:
        return isinstance(node, str) and node in self.router._index and self._distance(node) >= 0

    def get(self, node: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        return self[node] if node in self else default

    def __getitem__(self, node: str) -> tuple[str, ...]:
        got = self.memo.get(node)
        if got is not None:
            return got
        r = self.router
        d = self._distance(node)
        if d < 0:
            raise KeyError(node)
        i = r._index[node]
        nb = r._indices[r._indptr[i]:r._indptr[i + 1]]
        ok = self.dist[nb] == d - 1
        if d > 1:                                # a next hop other than the target must forward
            ok &= self.forwards[nb]
        names, cap = r._names, r._capacity
        cands = [names[j] for j in nb[ok].tolist()]
        widths = [min(cap[node, u], self._width(u)) for u in cands]
        best = max(widths)
        if len(cands) > 1:
            cands = [u for u, w in zip(cands, widths) if w >= best * (1 - 1e-9)]
        got = tuple(sorted(cands))
        self.memo[node] = got
        self.width[node] = best
        return got

    def _width(self, node: str) -> float:
        """Bottleneck capacity of the widest shortest path from ``node`` to the target."""
        w = self.width.get(node)
        if w is None:
            self[node]
            w = self.width[node]
        return w


class Router:
    """Widest hop-count shortest paths with deterministic per-flow ECMP on a :class:`Topology`."""

    #: a pair with one forwarding common neighbour is routed through it without a search
    #: (:meth:`_only_middle`; the same paths — tests/test_routing.py compares both ways)
    two_hop_shortcut = True

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        graph = topology.graph
        #: Neighbours of every node, sorted by name (determinism independent of insertion).
        self._adj: dict[str, tuple[str, ...]] = {n: tuple(sorted(graph.adj[n])) for n in graph.nodes}
        routing = topology.meta.get("routing", "ecmp")
        if routing not in ROUTINGS:
            raise TopologyError(f"{topology.name}: routing {routing!r} is not known (valid: "
                                f"{', '.join(ROUTINGS)})")
        #: D-mod-K: the destination index of every node (None: per-flow ECMP hashing)
        self._ordinal: dict[str, int] | None = None
        self._transit: dict[str, bool] = {n: bool(d["transit"]) for n, d in graph.nodes(data=True)}
        #: Per-direction payload capacity of every link, both orientations (bytes/s).
        self._capacity: dict[tuple[str, str], float] = {}
        for a, b, d in graph.edges(data=True):
            c = float(d["bw"]) * float(d.get("efficiency", 1.0))
            self._capacity[a, b] = self._capacity[b, a] = c
        #: Per target: its routing state (distances, next hops asked for so far), LRU first.
        self._maps: OrderedDict[tuple[str, bool], _Search] = OrderedDict()
        self._paths: dict[tuple[str, str, int], tuple[str, ...]] = {}
        #: Paths that no ECMP choice can change, by (src, dst): the key is irrelevant there.
        self._unique: dict[tuple[str, str], tuple[str, ...]] = {}
        #: Nodes of each tuple of kinds (:meth:`nearest`).
        self._kinds: dict[tuple[str, ...], frozenset[str]] = {}
        #: Key-independent waypoint segments (see :meth:`_route`), by (from, to).
        self._segments: dict[tuple[str, str], tuple[str, ...]] = {}
        #: GPU -> its own NIC (node attribute ``nic``): traffic that leaves the host does so there.
        self._affinity: dict[str, str] = {n: d["nic"] for n, d in graph.nodes(data=True)
                                          if d.get("nic")}
        self._nics = frozenset(n for n, d in graph.nodes(data=True) if d["kind"] == "nic")
        #: NIC -> rail (node attribute ``rail``), GPU -> rank, and whether PXN is on
        self._rail: dict[str, object] = {n: d["rail"] for n, d in graph.nodes(data=True)
                                          if d["kind"] == "nic" and d.get("rail") is not None}
        self._gpu_rank: dict[str, int] = {n: d["rank"] for n, d in graph.nodes(data=True)
                                          if d["kind"] == "gpu"}
        self._pxn = bool(topology.meta.get("pxn", True)) and bool(self._rail)
        self._hosts = host_map(topology) if self._pxn else None
        #: Host domains: the connected parts of the graph without its NICs (one per server, one
        #: per fabric). Two nodes in different domains can only be joined through a NIC.
        self._domain: dict[str, int] = {}
        if self._affinity:
            inner = graph.subgraph(n for n in graph.nodes if n not in self._nics)
            for i, part in enumerate(sorted(nx.connected_components(inner), key=min)):
                for n in part:
                    self._domain[n] = i
        # the adjacency as arrays (CSR) for the breadth-first searches
        self._names: list[str] = list(self._adj)
        self._index: dict[str, int] = {n: i for i, n in enumerate(self._names)}
        counts = np.fromiter((len(self._adj[n]) for n in self._names), dtype=np.int64,
                             count=len(self._names))
        self._indptr = np.concatenate(([0], np.cumsum(counts)))
        self._indices = np.fromiter((self._index[m] for n in self._names for m in self._adj[n]),
                                    dtype=np.int64, count=int(self._indptr[-1]))
        self._forwards = np.fromiter((self._transit[n] for n in self._names), dtype=bool,
                                     count=len(self._names))
        #: Forwarding between two NICs: only outside the hosts (domains holding a GPU). A NIC
        #: does not hand traffic to its host's PCIe switch for another NIC.
        host_domains = {self._domain[n] for n, d in graph.nodes(data=True)
                        if d["kind"] == "gpu" and n in self._domain}
        self._host_domains = frozenset(host_domains)
        self._fabric_forwards = self._forwards & np.fromiter(
            (self._domain.get(n) not in host_domains for n in self._names), dtype=bool,
            count=len(self._names))
        if routing == "dmodk":
            self._ordinal = self._destination_indices()

    def _destination_indices(self) -> dict[str, int]:
        """D-mod-K destination index of every node: the endpoints hanging off one switch (a
        leaf; :meth:`_anchor`, through the fabric for a NIC) are numbered consecutively in
        the order they were cabled, leaf after leaf in the order the leaves were declared, as
        OpenSM's ftree engine orders compute nodes; every other node follows in declaration
        order."""
        graph = self.topology.graph
        members: dict[str, list[str]] = {}
        rest: list[str] = []
        for n in graph.nodes:
            anchor, hangs = self._anchor(n, n in self._nics)
            if hangs:
                members.setdefault(anchor, []).append(n)
            else:
                rest.append(n)
        order = {n: i for i, n in enumerate(graph.nodes)}
        out: dict[str, int] = {}
        for anchor in sorted(members, key=order.__getitem__):
            cabled = {m: i for i, m in enumerate(graph.adj[anchor])}
            for n in sorted(members[anchor], key=cabled.__getitem__):
                out[n] = len(out)
        for n in rest:
            out[n] = len(out)
        return out

    # ------------------------------------------------------------------ public
    def path(self, src: str, dst: str, key: int = 0) -> tuple[str, ...]:
        """Node names from ``src`` to ``dst`` inclusive (``(src,)`` when they are equal).

        Raises :class:`~dessim.errors.TopologyError` for an unknown node or when no path
        through transit nodes exists, naming both ends.
        """
        found = self._unique.get((src, dst))
        if found is not None:
            return found
        memo_key = (src, dst, key)
        found = self._paths.get(memo_key)
        if found is not None:
            return found
        for node in (src, dst):
            if node not in self._adj:
                self.topology.resolve(node)  # raises a TopologyError with suggestions
        if src == dst:
            result: tuple[str, ...] = (src,)
            unique = True
        else:
            result, unique = self._route(src, dst, key)
        memo = self._unique if unique else self._paths
        if len(memo) >= MAX_CACHED_PATHS:
            memo.clear()
        if unique:
            self._unique[src, dst] = result
        else:
            self._paths[memo_key] = result
        return result

    def key_independent(self, src: str, dst: str) -> bool:
        """True when ``path(src, dst, key)`` is the same for every ``key`` (one widest
        shortest path: no hop has an ECMP choice)."""
        if (src, dst) not in self._unique:
            self.path(src, dst)
        return (src, dst) in self._unique

    def nearest(self, src: str, kinds: tuple[str, ...] | list[str]) -> str | None:
        """The node of one of ``kinds`` nearest to ``src``: fewest hops, then lowest sum of
        link latencies along the routed path, then name. Nodes that cannot be reached through
        transit nodes are skipped; ``None`` if no node of those kinds is reachable.

        Routed only where it can win: a breadth-first search from ``src`` over every link
        (transit or not) gives each candidate a lower bound of its routed hop count, so the
        search visits candidates layer by layer and stops past the best routed hop count
        found — the same answer as routing to every candidate (tests/test_routing.py), at the
        cost of the neighbourhood instead of one route per candidate (a 2,048-GPU cluster's
        512 host memories: 0.2 s per GPU)."""
        if src not in self._adj:
            self.topology.resolve(src)     # raises a TopologyError with suggestions
        wanted = self._kind_nodes(tuple(kinds))
        graph = self.topology.graph
        best: tuple[int, float, str] | None = None
        seen, layer, depth = {src}, [src], 0
        while layer and (best is None or depth <= best[0] - 1):
            for node in sorted(n for n in layer if n in wanted):
                try:
                    path = self.path(src, node)
                except TopologyError:
                    continue
                lat = sum(graph.edges[a, b]["lat"] for a, b in zip(path, path[1:]))
                key = (len(path), lat, node)
                if best is None or key < best:
                    best = key
            nxt = []
            for n in layer:
                for m in self._adj[n]:
                    if m not in seen:
                        seen.add(m)
                        nxt.append(m)
            layer, depth = nxt, depth + 1
        return None if best is None else best[2]

    def _kind_nodes(self, kinds: tuple[str, ...]) -> frozenset[str]:
        """The nodes of ``kinds`` (cached per tuple)."""
        got = self._kinds.get(kinds)
        if got is None:
            got = self._kinds[kinds] = frozenset(n for k in kinds for n in self.topology.nodes_of_kind(k))
        return got

    def hops(self, src: str, dst: str) -> int:
        """Number of links on a shortest path (the same for every ECMP choice)."""
        return len(self.path(src, dst)) - 1

    # ------------------------------------------------------------------ internals
    def _anchor(self, dst: str, fabric: bool = False) -> tuple[str, bool]:
        """The node whose next-hop map routes to ``dst``, and whether ``dst`` hangs off it.

        A single-link destination ``d`` with a transit neighbour ``p`` is reached through ``p``
        from every other node, so routing to ``d`` = routing to ``p`` plus the last hop. Through
        the fabric (``fabric``), a NIC with one fabric neighbour (its leaf) is reached through
        that neighbour alone: one search per leaf serves all the NICs under it.
        """
        nbrs = self._adj[dst]
        if fabric:
            forwards, index = self._fabric_forwards, self._index
            inner = [n for n in nbrs if forwards[index[n]]]
            if len(inner) == 1:
                return inner[0], True
            return dst, False
        if len(nbrs) == 1 and self._transit[nbrs[0]]:
            return nbrs[0], True
        return dst, False

    def _next_hops(self, target: str, fabric: bool = False, last: float = math.inf) -> _Search:
        """The routing state towards ``target`` (a mapping node -> widest equal-cost next
        hops, evaluated on demand — the search extends itself as far as a lookup needs; see
        :class:`_Search`), cached per target, least recently used dropped beyond
        :data:`MAX_CACHED_MAPS`. ``fabric``: only nodes outside the hosts forward (the
        NIC-to-NIC part of a route). ``last``: capacity of the hop every path takes after
        ``target`` (bytes/s; an anchored destination, see :meth:`_anchor`)."""
        memo = (target, fabric, last)
        search = self._maps.get(memo)
        if search is None:
            search = _Search(self, target, self._fabric_forwards if fabric else self._forwards, last)
            self._maps[memo] = search
            if len(self._maps) > MAX_CACHED_MAPS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(memo)
        return search

    def _route(self, src: str, dst: str, key: int) -> tuple[tuple[str, ...], bool]:
        """:meth:`_walk`, then NIC affinity: a path that crosses a NIC and starts (ends) at a
        GPU with a ``nic`` attribute leaves (enters) through that NIC, as NCCL pins each GPU
        to its nearest NIC instead of hashing over the NICs of its PCIe switch."""
        domain = self._domain
        a, b = domain.get(src), domain.get(dst)
        if a is not None and b is not None and a != b and (src in self._affinity or dst in self._affinity):
            # different hosts: every path crosses a NIC, so the waypoints are known unwalked
            waypoints = self._pinned(src, dst)
        else:
            path, unique = self._walk(src, dst, key)
            waypoints = self._waypoints(src, dst, path)
            if len(waypoints) == 2:
                return path, unique
        out: list[str] = [src]
        unique = True
        segments = self._segments
        for u, v in zip(waypoints, waypoints[1:]):
            seg = segments.get((u, v))
            if seg is None:
                seg, seg_unique = self._walk(u, v, key, fabric=self._fabric_segment(u, v))
                if seg_unique:          # e.g. GPU -> its NIC: the same for every key
                    if len(segments) >= MAX_CACHED_PATHS:
                        segments.clear()
                    segments[u, v] = seg
                unique = unique and seg_unique
            out.extend(seg[1:])
        return tuple(out), unique

    def _waypoints(self, src: str, dst: str, path: tuple[str, ...]) -> list[str]:
        """[src, (src's NIC), (dst's NIC), dst] when ``path`` leaves the host through a NIC
        and an end has a NIC affinity; else [src, dst]."""
        pinned = src in self._affinity or dst in self._affinity
        if not pinned or not any(n in self._nics for n in path[1:-1]):
            return [src, dst]
        return self._pinned(src, dst)

    def _pinned(self, src: str, dst: str) -> list[str]:
        """[src, (proxy GPU), (src NIC), (dst's NIC), dst] for a path that leaves the host.

        The receiver takes traffic through its own NIC. The sender sends through its own NIC
        unless PXN applies (see :meth:`_exit_nic`): then through the NIC of the receiver's
        rail, forwarded over NVLink by that NIC's local GPU (the *proxy*) when the sender is
        not one PCIe switch away from the NIC."""
        src_nic, proxy = self._exit_nic(src, dst)
        pins = [w for w in (proxy, src_nic, self._affinity.get(dst)) if w is not None]
        waypoints = [src]
        for w in (*pins, dst):
            if w != waypoints[-1]:
                waypoints.append(w)
        return waypoints

    def _exit_nic(self, src: str, dst: str) -> tuple[str | None, str | None]:
        """(NIC the traffic of ``src`` leaves its host through, proxy GPU or None).

        PXN (NCCL ``src/graph/paths.cc``, ``ncclTopoComputePaths``; on unless the topology
        says ``pxn: false``): when ``dst``'s own NIC is on a rail and ``src``'s host has a
        NIC on that rail, the traffic leaves through it, so it stays on one rail of a
        rail-optimised fabric (one leaf hop, no spine). A sender one PCIe switch away from
        that NIC (NCCL's ``PIX``) uses it directly; any other sender hands the data over
        NVLink to the NIC's local GPU, which forwards it (NCCL's ``PATH_PXN``). Otherwise
        the sender's own NIC (None if it names none)."""
        own = self._affinity.get(src)
        dst_nic = self._affinity.get(dst)
        if not self._pxn or dst_nic is None or src not in self._gpu_rank:
            return own, None
        rail = self._rail.get(dst_nic)
        if rail is None:
            return own, None
        hosts = self._hosts
        host = hosts.host_of(self._gpu_rank[src])
        nic = host.nic_on_rail(rail)
        if nic is None or nic == own:
            return own, None
        if self._gpu_rank[src] in host.pix.get(nic, ()):
            return nic, None
        proxy = host.local_gpu.get(nic)
        if proxy is None:
            return own, None
        return nic, self.topology.node_of(proxy)

    def possible_hops(self, src: str, dst: str) -> set[tuple[str, str]]:
        """Every hop ``(u, v)`` that ``path(src, dst, key)`` takes for some ``key``: the union
        over all ECMP choices (the hops of the equal-cost next-hop graph reachable from each
        waypoint). Used to prove that two traffic patterns can never share a link."""
        if src == dst:
            return set()
        path = self.path(src, dst)
        if self.key_independent(src, dst):
            return set(zip(path, path[1:]))
        out: set[tuple[str, str]] = set()
        waypoints = self._waypoints(src, dst, path)
        for u, v in zip(waypoints, waypoints[1:]):
            target, via_anchor, hops = self._segment_search(u, v, self._fabric_segment(u, v))
            seen, stack = {u}, [u]
            while stack:
                a = stack.pop()
                for b in hops.get(a, ()):
                    out.add((a, b))
                    if b not in seen and b != target:
                        seen.add(b)
                        stack.append(b)
            if via_anchor:
                out.add((target, v))
        return out

    def _only_middle(self, src: str, dst: str) -> str | None:
        """The forwarding node ``m`` when ``src`` and ``dst`` are not neighbours and ``m`` is
        the one widest of their common forwarding neighbours (two GPUs on one NVSwitch and one
        PCIe switch: the NVSwitch; a GPU and the NIC on its PCIe switch): then ``(src, m,
        dst)`` is the one path the search's rule gives, found without a search. Why: the
        shortest paths have two hops (no link joins the ends, a common forwarding neighbour
        joins them); the next hops of ``src`` are its forwarding neighbours one hop from
        ``dst`` — the common ones (or the node ``dst`` hangs off, :meth:`_anchor`, which is
        then the only one) — kept if their width ``min(cap(src, m), cap(m, dst))`` is within
        the search's tolerance of the widest, the same expressions as :class:`_Search`; with
        one left and the hop to ``dst`` after it, no ECMP hash or D-mod-K choice acts. None
        otherwise (then the search decides)."""
        near = self._adj[dst]
        if len(near) > 16:
            near = frozenset(near)
        if src in near:
            return None
        transit = self._transit
        common = [m for m in self._adj[src] if m in near and transit[m]]
        if len(common) != 1:
            if not common:
                return None
            cap = self._capacity
            widths = [min(cap[src, m], min(cap[m, dst], math.inf)) for m in common]
            best = max(widths)
            common = [m for m, w in zip(common, widths) if w >= best * (1 - 1e-9)]
            if len(common) != 1:
                return None
        return common[0]

    def _fabric_segment(self, u: str, v: str) -> bool:
        """Whether the waypoint segment ``u -> v`` runs through the fabric alone: both ends are
        NICs or nodes outside every host (a file system, a switch), so no host forwards it."""
        hosts = self._host_domains
        return ((u in self._nics or self._domain.get(u) not in hosts)
                and (v in self._nics or self._domain.get(v) not in hosts))

    def _segment_search(self, src: str, dst: str, fabric: bool) -> tuple[str, bool, _Search]:
        """The search a walk from ``src`` to ``dst`` uses — through the fabric only between two
        NICs, unless no such path exists (then through any forwarding node, as elsewhere) —
        with its target and whether ``dst`` hangs off the target (:meth:`_anchor`)."""
        def search(through_fabric: bool) -> tuple[str, bool, _Search]:
            target, via_anchor = self._anchor(dst, through_fabric)
            last = self._capacity[target, dst] if via_anchor else math.inf
            return target, via_anchor, self._next_hops(target, through_fabric, last)

        if fabric:
            target, via_anchor, hops = search(True)
            if src in hops and not (via_anchor and src == target):
                return target, via_anchor, hops
        return search(False)

    def _walk(self, src: str, dst: str, key: int, fabric: bool = False) -> tuple[tuple[str, ...], bool]:
        """The path for ``key``, and whether no hop had a choice (key-independent)."""
        if not fabric and self.two_hop_shortcut:
            via = self._only_middle(src, dst)
            if via is not None:
                return (src, via, dst), True
        target, via_anchor, hops = self._segment_search(src, dst, fabric)
        if via_anchor and src == target:
            return (src, dst), True
        if src not in hops:
            raise TopologyError(f"{self.topology.name}: no route from {src!r} to {dst!r} "
                                "through transit nodes (check the links and transit flags)")
        path = [src]
        cur = src
        if self._ordinal is not None:          # D-mod-K: a function of the destination alone
            d = self._ordinal[dst]
            while cur != target:
                choices = hops[cur]
                if len(choices) > 1:
                    cur = choices[d % len(choices)]
                    d //= len(choices)
                else:
                    cur = choices[0]
                path.append(cur)
            if via_anchor:
                path.append(dst)
            return tuple(path), True
        salt = f"{key}|{src}|{dst}|".encode()
        unique = True
        while cur != target:
            choices = hops[cur]
            if len(choices) == 1:
                cur = choices[0]
            else:
                unique = False
                cur = choices[zlib.crc32(salt + cur.encode()) % len(choices)]
            path.append(cur)
        if via_anchor:
            path.append(dst)
        return tuple(path), unique


def router_for(topology: Topology) -> Router:
    """The shared :class:`Router` of ``topology`` (created on first use): routes are a pure
    function of the (immutable) topology, so every network and generator that routes on it
    shares one router and its caches (:meth:`Topology.derived`)."""
    return topology.derived("router", Router)
