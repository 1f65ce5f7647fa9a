"""Among equal-hop paths the router takes the widest: NVLink over PCIe inside a DGX node."""

from __future__ import annotations

import networkx as nx

from dessim.topology import load_topology
from dessim.topology.graph import Topology
from dessim.topology.routing import Router


def test_dgx_gpus_talk_over_nvswitch_not_pcie():
    topo = load_topology("dgx-h100:nodes=1")
    router = Router(topo)
    for key in range(16):  # every ECMP hash lands on the NVSwitch
        assert router.path("n0.gpu2", "n0.gpu3", key) == ("n0.gpu2", "n0.nvsw", "n0.gpu3")


def test_ecmp_still_spreads_over_equally_wide_paths():
    g = nx.Graph()
    for n in ("a", "b"):
        g.add_node(n, kind="gpu")
    for s in ("s1", "s2", "narrow"):
        g.add_node(s, kind="switch")
    for s, bw in (("s1", 10.0), ("s2", 10.0), ("narrow", 1.0)):
        g.add_edge("a", s, type="custom", bw=bw, lat=0.0)
        g.add_edge(s, "b", type="custom", bw=bw, lat=0.0)
    router = Router(Topology(g))
    middles = {router.path("a", "b", key)[1] for key in range(64)}
    assert middles == {"s1", "s2"}
