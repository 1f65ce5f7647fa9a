"""Among equal-hop paths the router takes the widest: NVLink over PCIe inside a DGX node."""

from __future__ import annotations

import networkx as nx
import pytest

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


def test_nearest_skips_memory_nodes_it_cannot_reach():
    # Two GPUs on a switch that do not forward traffic, each with its own CXL memory:
    # from gpu0 only its own expander is reachable (gpu1 is not a transit node).
    g = nx.Graph()
    g.add_node("sw", kind="switch")
    for i in (0, 1):
        g.add_node(f"gpu{i}", kind="gpu", transit=False)
        g.add_node(f"cxl{i}", kind="cxl_mem")
        g.add_edge(f"gpu{i}", "sw", type="custom", bw=1.0, lat=0.0)
        g.add_edge(f"gpu{i}", f"cxl{i}", type="cxl", bw=1.0, lat=0.0)
    router = Router(Topology(g))
    assert router.nearest("gpu0", ["cxl_mem"]) == "cxl0"
    assert router.nearest("gpu1", ["cxl_mem"]) == "cxl1"
    assert router.nearest("gpu0", ["host_mem"]) is None


def test_dgx_gpus_leave_the_node_through_their_own_nic():
    topo = load_topology("dgx-h100:nodes=2")
    router = Router(topo)
    for key in range(16):
        # GPU 0 and NIC 1 share a PCIe switch: without affinity, half the keys would use NIC 1
        path = router.path("n0.gpu0", "n1.gpu0", key)
        assert path == ("n0.gpu0", "n0.pcie0", "n0.nic0", "leaf.su0.r0", "n1.nic0",
                        "n1.pcie0", "n1.gpu0")
        # cross-rail with PXN (default): the sender uses the receiver's rail (NIC 1 is one
        # PCIe switch away from GPU 0); the receiver its own NIC
        cross = router.path("n0.gpu0", "n1.gpu1", key)
        assert cross == ("n0.gpu0", "n0.pcie0", "n0.nic1", "leaf.su0.r1", "n1.nic1",
                         "n1.pcie0", "n1.gpu1")
        # a rail farther away: over NVLink to the NIC's local GPU, which forwards (PATH_PXN)
        far = router.path("n0.gpu0", "n1.gpu5", key)
        assert far == ("n0.gpu0", "n0.nvsw", "n0.gpu5", "n0.pcie2", "n0.nic5", "leaf.su0.r5",
                       "n1.nic5", "n1.pcie2", "n1.gpu5")
    # without PXN: own NICs at both ends, crossing rails through a spine
    plain = Router(load_topology("dgx-h100:nodes=2,pxn=false"))
    cross = plain.path("n0.gpu0", "n1.gpu1")
    assert cross[2] == "n0.nic0" and cross[-3] == "n1.nic1" and cross[4].startswith("spine")
    assert router.key_independent("n0.gpu0", "n1.gpu0")
    # traffic that stays in the node is untouched
    assert router.path("n0.gpu0", "n0.gpu1") == ("n0.gpu0", "n0.nvsw", "n0.gpu1")


def test_a_gpu_naming_a_missing_nic_is_an_error():
    import pytest

    from dessim.errors import TopologyError

    g = nx.Graph()
    g.add_node("g0", kind="gpu", nic="nic9")
    g.add_node("g1", kind="gpu")
    g.add_edge("g0", "g1", type="custom", bw=1.0, lat=0.0)
    with pytest.raises(TopologyError, match="names 'nic9' as its NIC"):
        Topology(g)


def test_possible_hops_cover_every_ecmp_choice_and_respect_nic_affinity():
    ls = load_topology("leafspine:hosts=8,leaves=2,spines=3,bw=10GB/s,lat=1us")
    router = Router(ls)
    hops = router.possible_hops("gpu0", "gpu4")
    assert {b for a, b in hops if a == "leaf0"} == {"spine0", "spine1", "spine2"}
    for key in range(20):   # every chosen path lies inside the union
        p = router.path("gpu0", "gpu4", key)
        assert set(zip(p, p[1:])) <= hops
    dgx = Router(load_topology("dgx-h100:nodes=2,pxn=false"))
    cross = dgx.possible_hops("n0.gpu0", "n1.gpu1")
    for key in range(20):   # affinity: every choice leaves and enters through the GPUs' own NICs
        p = dgx.path("n0.gpu0", "n1.gpu1", key)
        assert p[2] == "n0.nic0" and p[-3] == "n1.nic1" and set(zip(p, p[1:])) <= cross
    pxn = Router(load_topology("dgx-h100:nodes=2"))
    far = pxn.possible_hops("n0.gpu0", "n1.gpu5")   # PXN: through the proxy GPU, one rail
    for key in range(20):
        p = pxn.path("n0.gpu0", "n1.gpu5", key)
        assert p[2] == "n0.gpu5" and set(zip(p, p[1:])) <= far


def _reference_next_hops(topo, target):
    """The routing rule written as one complete breadth-first search in plain Python (the
    definition the router's on-demand searches must reproduce)."""
    g = topo.graph
    transit = {n: bool(d["transit"]) for n, d in g.nodes(data=True)}
    cap = {}
    for a, b, d in g.edges(data=True):
        cap[a, b] = cap[b, a] = float(d["bw"]) * float(d.get("efficiency", 1.0))
    dist, nxt, width, frontier, depth = {target: 0}, {target: []}, {target: float("inf")}, [target], 0
    while frontier:
        depth += 1
        new = []
        for u in frontier:
            if u != target and not transit[u]:
                continue
            for v in sorted(g.adj[u]):
                if v not in dist:
                    dist[v] = depth
                    nxt[v] = [u]
                    new.append(v)
                elif dist[v] == depth:
                    nxt[v].append(u)
        for v in new:
            ws = [min(cap[v, u], width[u]) for u in nxt[v]]
            width[v] = max(ws)
            nxt[v] = [u for u, w in zip(nxt[v], ws) if w >= width[v] * (1 - 1e-9)]
        frontier = new
    return {v: tuple(sorted(h)) for v, h in nxt.items()}


@pytest.mark.parametrize("spec", ["dgx-a100:nodes=8", "leafspine:hosts=32,leaves=4,spines=4",
                                  "torus2d:4x4"])
def test_on_demand_searches_reproduce_a_complete_search(spec):
    """Next hops evaluated lazily from numpy distances equal a complete search's, node by
    node, so every path and every ECMP choice is unchanged."""
    from dessim.topology import load_topology
    from dessim.topology.routing import Router

    topo = load_topology(spec)
    router = Router(topo)
    nodes = sorted(topo.graph.nodes)
    targets = nodes[:: max(1, len(nodes) // 12)]
    for target in targets:
        ref = _reference_next_hops(topo, target)
        search = router._next_hops(target)
        for node in nodes:
            assert (node in search) == (node in ref), (target, node)
            if node in ref:
                assert search[node] == ref[node], (target, node)


def test_paths_between_hosts_skip_the_probe_walk_with_identical_results():
    """Between two DGX hosts every path crosses a NIC, so the router pins the NICs without
    first walking the whole path; paths and ECMP choices are those of the probing route."""
    from dessim.topology import load_topology
    from dessim.topology.routing import Router

    topo = load_topology("dgx-a100:nodes=8")
    fast, probing = Router(topo), Router(topo)
    probing._domain = {}                     # forces the probe walk for every pair
    gpus = [topo.node_of(r) for r in range(0, 64, 5)]
    for src in gpus:
        for dst in gpus:
            if src != dst:
                for key in (0, 3):
                    assert fast.path(src, dst, key) == probing.path(src, dst, key)
                assert fast.key_independent(src, dst) == probing.key_independent(src, dst)


def test_traffic_between_nics_stays_in_the_fabric():
    """GPU 0 of node 0 to GPU 1 of node 1 (different rails): whatever the ECMP key, the route
    leaves through NIC 0, crosses the spines and enters through NIC 1 — it never goes back
    into a host to reach a sibling NIC through a PCIe switch."""
    from dessim.topology import load_topology
    from dessim.topology.routing import Router

    topo = load_topology("dgx-a100:nodes=8,pxn=false")   # PXN would keep it on rail 1
    router = Router(topo)
    src, dst = topo.node_of(0), topo.node_of(9)
    hops = router.possible_hops(src, dst)
    nics = {n for n in topo.graph if topo.graph.nodes[n]["kind"] == "nic"}
    into_host = {(a, b) for a, b in hops if a in nics and not b.startswith(("leaf", "spine"))}
    assert into_host == {("n1.nic1", "n1.pcie0")}
    assert any(b.startswith("spine") for _, b in hops)
    for key in range(8):
        path = router.path(src, dst, key)
        assert [n for n in path if n in nics] == ["n0.nic0", "n1.nic1"]


def test_a_narrow_last_hop_makes_every_path_to_it_equally_wide():
    # "b" hangs off "p" by one narrow link (the router searches towards "p"); through "s1"
    # or "s2" both paths are 1.0 wide end to end, so ECMP uses both although s2 -> p is narrower.
    g = nx.Graph()
    g.add_node("a", kind="gpu")
    g.add_node("b", kind="gpu")
    for s in ("s1", "s2", "p"):
        g.add_node(s, kind="switch")
    for u, v, bw in (("a", "s1", 10.0), ("s1", "p", 10.0), ("a", "s2", 10.0), ("s2", "p", 5.0),
                     ("p", "b", 1.0)):
        g.add_edge(u, v, type="custom", bw=bw, lat=0.0)
    router = Router(Topology(g))
    assert {router.path("a", "b", key)[1] for key in range(64)} == {"s1", "s2"}
    assert router.possible_hops("a", "b") >= {("a", "s1"), ("a", "s2")}


def test_routes_between_nics_search_once_per_leaf():
    # The fabric search towards a NIC's leaf serves every NIC under that leaf, and its ECMP
    # choices are exactly the widest shortest NIC-to-NIC paths through the fabric (networkx).
    topo = load_topology("dgx-h100:nodes=64,routing=ecmp")
    router = Router(topo)
    for n in range(0, 32, 3):                  # scalable unit 0 -> scalable unit 1
        for key in (0, 5, 77):
            path = router.path(f"n{n}.gpu3", f"n{n + 33}.gpu3", key)
            assert path[2:7] == (f"n{n}.nic3", "leaf.su0.r3", path[4], "leaf.su1.r3", f"n{n + 33}.nic3")
            assert path[4].startswith("spine")
    targets = {memo[0] for memo in router._maps if memo[1]}
    assert targets and all(t.startswith("leaf.") for t in targets)
    fabric = topo.graph.subgraph(n for n, d in topo.graph.nodes(data=True)
                                 if d["kind"] in ("switch", "nic"))
    for src, dst in (("n0.nic3", "n40.nic3"), ("n5.nic1", "n6.nic1"), ("n2.nic0", "n50.nic7")):
        def width(p):
            return min(fabric.edges[a, b]["bw"] for a, b in zip(p, p[1:]))
        paths = [tuple(p) for p in nx.all_shortest_paths(fabric, src, dst)]
        best = max(width(p) for p in paths)
        widest = {p for p in paths if width(p) == best}
        walked = {router._walk(src, dst, key, fabric=True)[0] for key in range(512)}
        assert walked == widest


def test_searches_deeper_than_127_hops_still_route():
    """Hop distances are stored in one byte until a search goes past 127 hops: a ring of 300
    GPUs (150 hops across) routes as networkx does."""
    topo = load_topology("ring:300")
    router = Router(topo)
    path = router.path("gpu0", "gpu150")
    assert len(path) - 1 == 150 == nx.shortest_path_length(topo.graph, "gpu0", "gpu150")
    assert router.hops("gpu10", "gpu200") == nx.shortest_path_length(topo.graph, "gpu10", "gpu200")
