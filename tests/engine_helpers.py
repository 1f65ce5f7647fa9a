"""Small topologies and graphs shared by the engine tests (built by hand, no builders)."""

from __future__ import annotations

import networkx as nx

from dessim.topology.graph import Topology

BW = 1e9      # bytes/s per direction
LAT = 1e-6    # s


def line(n: int, bw: float = BW, lat: float = LAT, mem: bool = False) -> Topology:
    """gpu0 - gpu1 - ... - gpu{n-1}; with ``mem``, a host memory node on gpu0 via a 10 GB/s link."""
    g = nx.Graph()
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", device="H100")
    for i in range(n - 1):
        g.add_edge(f"gpu{i}", f"gpu{i + 1}", type="custom", bw=bw, lat=lat)
    if mem:
        g.add_node("host", kind="host_mem")
        g.add_edge("gpu0", "host", type="pcie", bw=10e9, lat=0.0)
    return Topology(g, f"line{n}")


def star(n: int, bw: float = BW, lat: float = LAT) -> Topology:
    """n GPUs on one switch."""
    g = nx.Graph()
    g.add_node("sw", kind="switch")
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", device="H100")
        g.add_edge(f"gpu{i}", "sw", type="custom", bw=bw, lat=lat)
    return Topology(g, f"star{n}")
