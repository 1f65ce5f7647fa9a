"""In-network reduction on InfiniBand switches (SHARP): which switches reduce, and the
reduction tree that joins a set of NICs.

A switch node may declare ``sharp: true`` (YAML), or a preset may set it on its fabric
(``dgx-h100:sharp=true``). Such a switch can reduce data sent to it by several ports and
send the result back down (NVIDIA Scalable Hierarchical Aggregation and Reduction Protocol,
SHARP; Graham et al. 2016, docs/references.md). NCCL reaches it through a CollNet plugin
(Mellanox/nccl-rdma-sharp-plugins): the GPUs of a node hand their data to NICs, each NIC sends
its part once to the switch it is cabled to, the switches of an aggregation tree reduce it on
the way up to the tree's root and multicast the result back down to every NIC.

:func:`sharp_tree` finds that tree for a set of NICs (one per node), as dessim's collectives
use it (:mod:`dessim.collectives.algorithms.collnet`):

* each NIC's *aggregation switch* is the switch it is cabled to outside its host (a fabric
  leaf); it must declare ``sharp``, else there is no tree;
* if all NICs share one aggregation switch (one rail leaf of a rail-optimised fabric), that
  switch is the root and the tree has no switch-to-switch edge;
* otherwise the root is a SHARP switch that every aggregation switch reaches through SHARP
  switches only, with the fewest hops to the farthest of them (then the fewest in total);
  ties are broken by ``salt`` (a collective passes its channel, so different rails use
  different spines, as SHARP's aggregation manager spreads trees over the spines); each
  aggregation switch joins the root along the breadth-first tree from the root (neighbours
  in name order).

This is a model of the aggregation manager's tree, not a transcription: SHARP builds trees
from its own configuration of the fabric, and a real tree may use other spines. What the
model keeps is what limits a reduction: every NIC sends its data once up its own link, every
tree edge carries the reduced data once each way, and the root is as close as the fabric
allows. Switch buffers and the number of concurrent trees SHARP supports are not modelled;
a SHARP switch reduces at its port rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["SharpTree", "is_sharp", "aggregation_switch", "sharp_tree", "has_sharp"]


@dataclass(frozen=True)
class SharpTree:
    """A SHARP reduction tree over NICs (see the module docstring)."""

    root: str                                  #: the switch where the reduction completes
    attach: tuple[str, ...]                    #: each NIC's aggregation switch (NIC order)
    edges: tuple[tuple[str, str], ...]         #: (child switch, parent switch), leaves first
    below: dict[str, int]                      #: NICs in the subtree of each tree switch

    @property
    def depth(self) -> int:
        """Switch-to-switch hops from the farthest aggregation switch to the root."""
        parent = dict(self.edges)
        best = 0
        for sw in set(self.attach):
            hops = 0
            while sw != self.root:
                sw = parent[sw]
                hops += 1
            best = max(best, hops)
        return best


def is_sharp(topology: Topology, node: str) -> bool:
    """Whether ``node`` is a switch that declares in-network reduction (``sharp: true``)."""
    data = topology.graph.nodes[node]
    return data["kind"] == "switch" and bool(data.get("sharp", False))


def aggregation_switch(topology: Topology, nic: str) -> str | None:
    """The SHARP switch ``nic`` is cabled to outside its host (the first by name if
    several), or None if none of its fabric switches reduces."""
    graph = topology.graph
    domain = host_map(topology).domain
    found = sorted(m for m in graph.adj[nic] if m not in domain and is_sharp(topology, m))
    return found[0] if found else None


def has_sharp(topology: Topology) -> bool:
    """Whether any switch of ``topology`` declares ``sharp``."""
    return topology.derived("has_sharp", lambda t: any(
        d["kind"] == "switch" and d.get("sharp") for _, d in t.graph.nodes(data=True)))


def _bfs(topology: Topology, start: str, allowed: set[str]) -> dict[str, str | None]:
    """Breadth-first parents from ``start`` over ``allowed`` nodes, neighbours by name."""
    graph = topology.graph
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in sorted(graph.adj[u]):
            if v in allowed and v not in parent:
                parent[v] = u
                queue.append(v)
    return parent


def _distances(topology: Topology, start: str, allowed: set[str]) -> dict[str, int]:
    parent = _bfs(topology, start, allowed)
    dist: dict[str, int] = {}
    for node in parent:                       # BFS order: a parent comes before its children
        p = parent[node]
        dist[node] = 0 if p is None else dist[p] + 1
    return dist


def sharp_tree(topology: Topology, nics: Sequence[str], salt: int = 0) -> SharpTree | None:
    """The SHARP reduction tree joining ``nics`` (see the module docstring), or None when a
    NIC's fabric switch does not reduce or no SHARP switch joins them all. Cached per
    topology."""
    nics = tuple(nics)
    memo = topology.derived("sharp_trees", lambda _t: {})
    key = (nics, salt)
    if key in memo:
        return memo[key]
    memo[key] = tree = _find_tree(topology, nics, salt)
    return tree


def _find_tree(topology: Topology, nics: tuple[str, ...], salt: int) -> SharpTree | None:
    attach = []
    for nic in nics:
        sw = aggregation_switch(topology, nic)
        if sw is None:
            return None
        attach.append(sw)
    targets = sorted(set(attach))
    below: dict[str, int] = {}
    if len(targets) == 1:
        below[targets[0]] = len(nics)
        return SharpTree(targets[0], tuple(attach), (), below)
    domain = host_map(topology).domain
    fabric = {n for n, d in topology.graph.nodes(data=True)
              if d["kind"] == "switch" and d.get("sharp") and n not in domain}
    dists = [_distances(topology, t, fabric) for t in targets]
    common = set(dists[0]).intersection(*dists[1:])
    if not common:
        return None
    score = {n: (max(d[n] for d in dists), sum(d[n] for d in dists)) for n in common}
    best = min(score.values())
    candidates = sorted(n for n in common if score[n] == best)
    root = candidates[salt % len(candidates)]
    parent = _bfs(topology, root, fabric)
    edges: dict[str, str] = {}
    count = {sw: attach.count(sw) for sw in targets}
    for t in targets:
        node = t
        while node != root:
            up = parent[node]
            assert up is not None
            edges[node] = up
            below[node] = below.get(node, 0) + count[t]
            node = up
        below[root] = below.get(root, 0) + count[t]
    ordered = sorted(edges.items(), key=lambda e: _depth_of(e[0], edges, root), reverse=True)
    return SharpTree(root, tuple(attach), tuple(ordered), below)


def _depth_of(node: str, parent: dict[str, str], root: str) -> int:
    hops = 0
    while node != root:
        node = parent[node]
        hops += 1
    return hops
