"""Structural metrics of a topology: counts, diameter, injection and bisection bandwidth.

Definitions (all bandwidths per direction, bytes/second, using each link's payload capacity
``bw * efficiency``):

* **Diameter** — the largest, over all pairs of GPUs, of the fewest links on a path between
  them that passes only through *transit* nodes (a node with ``transit=False`` can start or
  end a path but never forward; the same rule as routing). Counted in hops (links).
* **Injection bandwidth** of a GPU — the sum of the capacities of the links attached to it:
  how fast it could push bytes out if every link were used at once. Reported min/max/mean
  over GPUs.
* **Bisection bandwidth** — split the GPUs into rank halves, A = ranks 0..⌊N/2⌋-1 and B = the
  rest; the bisection bandwidth is the maximum flow from A to B (= the minimum cut) in the
  directed graph that gives every link one arc per direction of capacity ``bw * efficiency``
  and lets traffic cross only transit nodes (non-transit nodes other than the GPUs of A and B,
  e.g. memories, are left out). Since every link has the same capacity in both directions,
  the value is the same from B to A. It is the rank-halves cut, which equals the textbook
  minimum bisection for rings, tori, meshes, switches and leaf-spine with contiguous ranks
  per leaf; for other rank orders it may exceed the true minimum bisection.
  Examples: ring of N links of bw → 2 bw; k x k torus → 2k bw; switch of N → N/2 bw;
  leaf-spine with L leaves of h hosts and oversubscription o → min(N/2 bw, L/2 · h bw / o).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from dessim.topology.graph import Topology

__all__ = ["TopologyMetrics", "topology_metrics", "diameter", "injection_bandwidth",
           "bisection_bandwidth", "hop_distances"]


def _capacity(data: dict[str, Any]) -> float:
    return float(data["bw"]) * float(data["efficiency"])


def hop_distances(topo: Topology, source: str) -> dict[str, int]:
    """Hops from ``source`` to every reachable node, forwarding only through transit nodes."""
    g = topo.graph
    dist = {source: 0}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        if u != source and not g.nodes[u]["transit"]:
            continue
        for v in g.adj[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


#: Sources per batch of the vectorised BFS in :func:`diameter` (memory ~ arcs x batch / 8 bytes).
_BFS_BATCH = 1024


def diameter(topo: Topology) -> int:
    """Largest GPU-to-GPU hop distance (see module docstring); 0 for a single GPU.

    A breadth-first search from every GPU, vectorised with numpy over batches of sources
    (one bit per source): level by level, a node is reached from a source if a neighbour
    was reached at the previous level and that neighbour may forward (it is transit, or it
    is the source itself). Nodes are grouped by degree so each group's neighbour lists form
    a rectangular index array. A 4,096-GPU 3-D torus takes about a second.
    """
    g = topo.graph
    nodes = list(g.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    by_degree: dict[int, tuple[list[int], list[list[int]]]] = {}
    for i, n in enumerate(nodes):
        ids, adj = by_degree.setdefault(g.degree(n), ([], []))
        ids.append(i)
        adj.append([index[m] for m in g.adj[n]])
    groups = [(np.asarray(ids), np.asarray(adj, dtype=np.int64))
              for _, (ids, adj) in sorted(by_degree.items()) if adj and adj[0]]
    stops = ~np.array([bool(g.nodes[n]["transit"]) for n in nodes])
    gpus = np.array([index[n] for n in topo.gpus], dtype=np.int64)
    worst = 0
    for start in range(0, len(gpus), _BFS_BATCH):
        src = gpus[start:start + _BFS_BATCH]
        seed = np.zeros((len(nodes), len(src)), dtype=bool)
        seed[src, np.arange(len(src))] = True
        frontier = np.packbits(seed, axis=1)   # bit j of a row: reached from source j
        visited = frontier.copy()
        level = 0
        while frontier.any():
            reached = np.zeros_like(frontier)
            for ids, adj in groups:
                reached[ids] = np.bitwise_or.reduce(frontier[adj], axis=1)
            frontier = reached & ~visited
            level += 1
            if frontier[gpus].any():
                worst = level
            visited |= frontier
            frontier[stops] = 0  # reached as endpoints, but they forward nothing
    return worst


def injection_bandwidth(topo: Topology) -> dict[str, float]:
    """Per-GPU injection bandwidth (B/s per direction): ``{"min", "max", "mean"}``."""
    g = topo.graph
    per_gpu = [sum(_capacity(d) for _, _, d in g.edges(gpu, data=True)) for gpu in topo.gpus]
    return {"min": min(per_gpu), "max": max(per_gpu), "mean": sum(per_gpu) / len(per_gpu)}


def bisection_bandwidth(topo: Topology) -> float:
    """Bisection bandwidth between rank halves (B/s per direction); 0.0 for one GPU."""
    n = topo.num_gpus
    if n < 2:
        return 0.0
    side_a = set(topo.gpus[: n // 2])
    side_b = set(topo.gpus[n // 2:])
    g = topo.graph
    usable = {v for v, d in g.nodes(data=True) if d["transit"] or v in side_a or v in side_b}
    flow = nx.DiGraph()
    for u, v, d in g.edges(data=True):
        if u not in usable or v not in usable:
            continue
        cap = _capacity(d)
        for x, y in ((u, v), (v, u)):
            # Traffic may leave a non-transit GPU of A and enter one of B, never cross them.
            if (x in side_b and not g.nodes[x]["transit"]) or \
                    (y in side_a and not g.nodes[y]["transit"]):
                continue
            flow.add_edge(x, y, capacity=cap)
    src, dst = ("__bisect_src__",), ("__bisect_dst__",)
    for a in side_a:
        flow.add_edge(src, a)  # no capacity attribute = infinite
    for b in side_b:
        flow.add_edge(b, dst)
    value, _ = nx.maximum_flow(flow, src, dst)
    return float(value)


@dataclass(frozen=True, slots=True)
class TopologyMetrics:
    """Summary figures of a topology (SI units; see module docstring for definitions)."""

    name: str
    gpus: int
    dims: tuple[int, ...]
    nodes: dict[str, int]
    links: dict[str, int]
    diameter: int
    injection_bw: dict[str, float]
    bisection_bw: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: counts, diameter, bandwidths in B/s and GB/s."""
        return {
            "name": self.name,
            "gpus": self.gpus,
            "dims": list(self.dims),
            "nodes": dict(self.nodes),
            "links": dict(self.links),
            "num_nodes": sum(self.nodes.values()),
            "num_links": sum(self.links.values()),
            "diameter": self.diameter,
            "injection_bw": dict(self.injection_bw),
            "injection_bw_GBps": {k: v / 1e9 for k, v in self.injection_bw.items()},
            "bisection_bw": self.bisection_bw,
            "bisection_bw_GBps": self.bisection_bw / 1e9,
        }


def topology_metrics(topo: Topology) -> TopologyMetrics:
    """All metrics of ``topo``."""
    counts = topo.counts()
    return TopologyMetrics(topo.name, topo.num_gpus, tuple(topo.dims), counts["nodes"],
                           counts["links"], diameter(topo), injection_bandwidth(topo),
                           bisection_bandwidth(topo))
