"""Shared topologies for the routing and network tests (no tests here), built directly as networkx graphs
(independent of dessim.topology.builders so these tests pin the network layer alone)."""

from __future__ import annotations

import networkx as nx

from dessim.topology.graph import Topology


def link(g: nx.Graph, a: str, b: str, bw: float, lat: float = 0.0, **extra) -> None:
    g.add_edge(a, b, type="custom", bw=bw, lat=lat, **extra)


def topo(edges, gpus, *, switches=(), transit=None, name="t") -> Topology:
    """``edges``: (a, b, bw, lat[, extra dict]); GPUs ranked in the order given."""
    g = nx.Graph()
    for r, n in enumerate(gpus):
        g.add_node(n, kind="gpu", rank=r, **({"transit": transit[n]} if transit and n in transit else {}))
    for s in switches:
        g.add_node(s, kind="switch")
    for e in edges:
        a, b, bw, lat = e[:4]
        link(g, a, b, bw, lat, **(e[4] if len(e) > 4 else {}))
    return Topology(g, name=name)


def dumbbell() -> Topology:
    """The dumbbell of "SimGrid golden values" (docs/references.md): A1, A2, A3 -> B through L
    (1 GB/s, 10 us); A1's access 250 MB/s."""
    return topo([("A1", "s1", 250e6, 0.0), ("A2", "s1", 10e9, 0.0), ("A3", "s1", 10e9, 0.0),
                 ("s1", "s2", 1e9, 10e-6), ("s2", "B", 10e9, 0.0)],
                ["A1", "A2", "A3", "B"], switches=["s1", "s2"], name="dumbbell")


def ring(n: int, bw: float, lat: float) -> Topology:
    return topo([(f"g{i}", f"g{(i + 1) % n}", bw, lat) for i in range(n)],
                [f"g{i}" for i in range(n)], name=f"ring{n}")


def leafspine(hosts_per_leaf: int, leaves: int, spines: int, bw: float = 1e9, lat: float = 1e-6,
              gpu_transit: bool = False) -> Topology:
    g = nx.Graph()
    r = 0
    for l in range(leaves):
        g.add_node(f"leaf{l}", kind="switch")
        for h in range(hosts_per_leaf):
            g.add_node(f"h{r}", kind="gpu", rank=r, transit=gpu_transit)
            link(g, f"h{r}", f"leaf{l}", bw, lat)
            r += 1
    for s in range(spines):
        g.add_node(f"spine{s}", kind="switch")
        for l in range(leaves):
            link(g, f"leaf{l}", f"spine{s}", bw, lat)
    return Topology(g, name="leafspine")
