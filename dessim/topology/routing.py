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
endpoints.

Most pairs have a single widest shortest path (every GPU pair on one switch, every pair inside
a DGX island, ...): there the key cannot change the answer, so the path is memoised per
``(src, dst)`` and :meth:`Router.key_independent` says so — callers (the network's route
cache, flow bundles) then skip per-key work entirely. The answer is the same either way.

NIC affinity: a GPU node may name its own NIC (attribute ``nic``, set by the DGX presets: GPU i
↔ NIC i). A path that leaves the host through a NIC then leaves (and enters) through that NIC,
as NCCL pins each GPU to its nearest NIC, instead of hashing over both NICs of a PCIe switch.

Cost: one breadth-first search per *destination anchor*, cached — no all-pairs enumeration up
front. A destination with a single link (a GPU or host under a leaf switch) reuses the map of
its only neighbour, so a leaf-spine of thousands of GPUs needs one map per leaf switch.
The number of cached maps is bounded (:data:`MAX_CACHED_MAPS`, least recently used dropped).
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Mapping

from dessim.errors import TopologyError
from dessim.topology.graph import Topology

__all__ = ["Router", "router_for", "MAX_CACHED_MAPS", "MAX_CACHED_PATHS"]

#: Next-hop maps kept per router (one per destination anchor). Each map holds one entry per
#: node, so memory is about ``MAX_CACHED_MAPS * nodes`` dict entries at worst.
MAX_CACHED_MAPS: int = 2048

#: Paths memoised per router before the memo is cleared (bounded memory, same answers).
MAX_CACHED_PATHS: int = 200_000


class _LevelSearch:
    """A breadth-first search from ``target`` settled up to ``depth`` hops: ``hops`` holds the
    next hops of every settled node, ``frontier`` the nodes of the last settled level."""

    __slots__ = ("target", "dist", "nxt", "width", "hops", "frontier", "depth")

    def __init__(self, target: str) -> None:
        self.target = target
        self.dist: dict[str, int] = {target: 0}
        self.nxt: dict[str, list[str]] = {}
        self.width: dict[str, float] = {target: float("inf")}
        self.hops: dict[str, tuple[str, ...]] = {target: ()}
        self.frontier: list[str] = [target]
        self.depth = 0


class Router:
    """Widest hop-count shortest paths with deterministic per-flow ECMP on a :class:`Topology`."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        graph = topology.graph
        #: Neighbours of every node, sorted by name (determinism independent of insertion).
        self._adj: dict[str, tuple[str, ...]] = {n: tuple(sorted(graph.adj[n])) for n in graph.nodes}
        self._transit: dict[str, bool] = {n: bool(d["transit"]) for n, d in graph.nodes(data=True)}
        #: Per-direction payload capacity of every link, both orientations (bytes/s).
        self._capacity: dict[tuple[str, str], float] = {}
        for a, b, d in graph.edges(data=True):
            c = float(d["bw"]) * float(d.get("efficiency", 1.0))
            self._capacity[a, b] = self._capacity[b, a] = c
        #: Per target: its (possibly partial) level-by-level search, least recently used first.
        self._maps: OrderedDict[str, _LevelSearch] = OrderedDict()
        self._paths: dict[tuple[str, str, int], tuple[str, ...]] = {}
        #: Paths that no ECMP choice can change, by (src, dst): the key is irrelevant there.
        self._unique: dict[tuple[str, str], tuple[str, ...]] = {}
        #: GPU -> its own NIC (node attribute ``nic``): traffic that leaves the host does so there.
        self._affinity: dict[str, str] = {n: d["nic"] for n, d in graph.nodes(data=True)
                                          if d.get("nic")}
        self._nics = frozenset(n for n, d in graph.nodes(data=True) if d["kind"] == "nic")

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
        transit nodes are skipped; ``None`` if no node of those kinds is reachable."""
        graph = self.topology.graph
        best: tuple[int, float, str] | None = None
        for node in sorted(n for k in kinds for n in self.topology.nodes_of_kind(k)):
            try:
                path = self.path(src, node)
            except TopologyError:
                continue
            lat = sum(graph.edges[a, b]["lat"] for a, b in zip(path, path[1:]))
            key = (len(path), lat, node)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def hops(self, src: str, dst: str) -> int:
        """Number of links on a shortest path (the same for every ECMP choice)."""
        return len(self.path(src, dst)) - 1

    # ------------------------------------------------------------------ internals
    def _anchor(self, dst: str) -> tuple[str, bool]:
        """The node whose next-hop map routes to ``dst``, and whether ``dst`` hangs off it.

        A single-link destination ``d`` with a transit neighbour ``p`` is reached through ``p``
        from every other node, so routing to ``d`` = routing to ``p`` plus the last hop.
        """
        nbrs = self._adj[dst]
        if len(nbrs) == 1 and self._transit[nbrs[0]]:
            return nbrs[0], True
        return dst, False

    def _next_hops(self, target: str, need: str | None = None) -> Mapping[str, tuple[str, ...]]:
        """For nodes that can reach ``target``: their equal-cost widest next hops (sorted).

        The breadth-first search from ``target`` runs level by level and stops as soon as
        ``need`` is settled (its level done); a later call continues it. A node's next hops
        depend only on the levels below it, so a partial map is exact for every node it holds,
        and every node of a walk from ``need`` is in it. ``need=None``: the whole map.
        A node missing from the returned map after the search is exhausted cannot reach
        ``target``."""
        bfs = self._maps.get(target)
        if bfs is None:
            bfs = _LevelSearch(target)
            self._maps[target] = bfs
            if len(self._maps) > MAX_CACHED_MAPS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(target)
        while bfs.frontier and (need is None or need not in bfs.hops):
            self._next_level(bfs)
        return bfs.hops

    def _next_level(self, bfs: "_LevelSearch") -> None:
        """Settle one more level of ``bfs`` (nodes one hop further from its target)."""
        adj, transit, cap = self._adj, self._transit, self._capacity
        target, dist, nxt, width, hops = bfs.target, bfs.dist, bfs.nxt, bfs.width, bfs.hops
        bfs.depth += 1
        depth = bfs.depth
        new: list[str] = []
        for u in bfs.frontier:
            # u is an intermediate node for anything reached through it (unless it is the
            # target), so it must forward traffic.
            if u != target and not transit[u]:
                continue
            for v in adj[u]:
                d = dist.get(v)
                if d is None:
                    dist[v] = depth
                    nxt[v] = [u]
                    new.append(v)
                elif d == depth:
                    nxt[v].append(u)
        # keep only the next hops on a widest path (nodes of this depth are final now)
        for v in new:
            cand = nxt.pop(v)
            widths = [min(cap[v, u], width[u]) for u in cand]
            best = max(widths)
            width[v] = best
            if len(cand) > 1:
                cand = [u for u, w in zip(cand, widths) if w >= best * (1 - 1e-9)]
            hops[v] = tuple(sorted(cand))
        bfs.frontier = new

    def _route(self, src: str, dst: str, key: int) -> tuple[tuple[str, ...], bool]:
        """:meth:`_walk`, then NIC affinity: a path that crosses a NIC and starts (ends) at a
        GPU with a ``nic`` attribute leaves (enters) through that NIC, as NCCL pins each GPU
        to its nearest NIC instead of hashing over the NICs of its PCIe switch."""
        path, unique = self._walk(src, dst, key)
        waypoints = self._waypoints(src, dst, path)
        if len(waypoints) == 2:
            return path, unique
        out: list[str] = [src]
        unique = True
        for u, v in zip(waypoints, waypoints[1:]):
            seg, seg_unique = self._walk(u, v, key)
            out.extend(seg[1:])
            unique = unique and seg_unique
        return tuple(out), unique

    def _waypoints(self, src: str, dst: str, path: tuple[str, ...]) -> list[str]:
        """[src, (src's NIC), (dst's NIC), dst] when ``path`` leaves the host through a NIC
        and an end has a NIC affinity; else [src, dst]."""
        pins = [w for w in (self._affinity.get(src), self._affinity.get(dst)) if w is not None]
        if not pins or not any(n in self._nics for n in path[1:-1]):
            return [src, dst]
        waypoints = [src]
        for w in (*pins, dst):
            if w != waypoints[-1]:
                waypoints.append(w)
        return waypoints

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
            target, via_anchor = self._anchor(v)
            hops = self._next_hops(target, u)
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

    def _walk(self, src: str, dst: str, key: int) -> tuple[tuple[str, ...], bool]:
        """The path for ``key``, and whether no hop had a choice (key-independent)."""
        target, via_anchor = self._anchor(dst)
        if via_anchor and src == target:
            return (src, dst), True
        hops = self._next_hops(target, src)
        if src not in hops:
            raise TopologyError(f"{self.topology.name}: no route from {src!r} to {dst!r} "
                                "through transit nodes (check the links and transit flags)")
        salt = f"{key}|{src}|{dst}|".encode()
        path = [src]
        cur = src
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
