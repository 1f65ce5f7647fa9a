"""Router: shortest paths through transit nodes, deterministic per-flow ECMP."""

from __future__ import annotations

from collections import Counter

import pytest

from dessim.errors import TopologyError
from dessim.topology.routing import Router, router_for
from test_network_graphs import leafspine, ring, topo


def test_shortest_path_on_a_ring_goes_the_short_way():
    r = Router(ring(8, 1e9, 0.0))
    assert r.path("g0", "g2") == ("g0", "g1", "g2")
    assert r.path("g0", "g6") == ("g0", "g7", "g6")
    assert r.path("g3", "g3") == ("g3",)
    assert r.hops("g0", "g4") == 4


def test_every_path_is_shortest_and_uses_existing_links():
    t = leafspine(4, 4, 3)
    r = Router(t)
    for src in t.gpus:
        for dst in t.gpus:
            p = r.path(src, dst, key=7)
            assert p[0] == src and p[-1] == dst
            assert all(t.graph.has_edge(a, b) for a, b in zip(p, p[1:]))
            same_leaf = t.graph.has_edge(src, next(iter(t.graph.adj[dst])))
            assert len(p) - 1 == (0 if src == dst else 2 if same_leaf else 4)


def test_ecmp_is_deterministic_per_flow():
    t = leafspine(2, 2, 4)
    a, b = Router(t), Router(t)
    for key in range(50):
        assert a.path("h0", "h3", key) == b.path("h0", "h3", key) == a.path("h0", "h3", key)


def test_ecmp_spreads_flows_over_all_spines():
    t = leafspine(2, 2, 4)
    r = Router(t)
    spines = Counter(r.path("h0", "h3", key)[2] for key in range(400))
    assert set(spines) == {"spine0", "spine1", "spine2", "spine3"}
    assert min(spines.values()) > 400 / 4 * 0.6  # roughly even: no spine starved


def test_ecmp_spreads_different_endpoint_pairs_with_the_same_key():
    t = leafspine(8, 2, 4)
    r = Router(t)
    spines = {r.path(f"h{i}", f"h{8 + i}")[2] for i in range(8)}
    assert len(spines) > 1


def test_non_transit_nodes_are_only_endpoints():
    # g0 - g1 - g2 is the short way, but g1 does not forward; the long way is g0 - s - t - g2.
    t = topo([("g0", "g1", 1e9, 0), ("g1", "g2", 1e9, 0), ("g0", "s", 1e9, 0), ("s", "u", 1e9, 0),
              ("u", "g2", 1e9, 0)], ["g0", "g1", "g2"], switches=["s", "u"],
             transit={"g1": False})
    r = Router(t)
    assert r.path("g0", "g2") == ("g0", "s", "u", "g2")
    assert r.path("g0", "g1") == ("g0", "g1")   # as an endpoint it is fine
    assert r.path("g1", "g2") == ("g1", "g2")


def test_leaf_gpus_without_transit_are_routed_through_their_switch():
    t = leafspine(2, 2, 2, gpu_transit=False)
    r = Router(t)
    assert r.path("h0", "h1") == ("h0", "leaf0", "h1")
    p = r.path("h0", "h2")
    assert p[1] == "leaf0" and p[3] == "leaf1" and p[2].startswith("spine")


def test_no_route_names_both_ends():
    # Memory node reachable only through a non-transit GPU.
    import networkx as nx
    from dessim.topology.graph import Topology
    g = nx.Graph()
    g.add_node("g0", kind="gpu", transit=False)
    g.add_node("g1", kind="gpu")
    g.add_node("mem", kind="host_mem")
    g.add_edge("g0", "g1", type="x", bw=1e9, lat=0)
    g.add_edge("g0", "mem", type="x", bw=1e9, lat=0)
    r = Router(Topology(g))
    with pytest.raises(TopologyError, match=r"'g1'.*'mem'"):
        r.path("g1", "mem")
    assert r.path("g0", "mem") == ("g0", "mem")


def test_unknown_node_is_a_topology_error():
    r = Router(ring(4, 1e9, 0))
    with pytest.raises(TopologyError, match="nope"):
        r.path("g0", "nope")


def test_storage_traffic_runs_through_the_fabric_alone():
    """A file system outside the hosts reaches a GPU through the fabric, then the GPU's own NIC
    (no host forwards it), and the searches towards NICs are shared per leaf switch."""
    from dessim.topology import load_topology
    from dessim.topology.hosts import host_map
    from dessim.topology.storage import attach_storage

    topo = attach_storage(load_topology("dgx-h100:nodes=4"), "pfs", 1e12)
    router = router_for(topo)
    inside = set(host_map(topo).domain)
    for gpu in topo.gpus:
        nic = topo.graph.nodes[gpu]["nic"]
        for path in (router.path("pfs", gpu), tuple(reversed(router.path(gpu, "pfs")))):
            assert len(set(path)) == len(path)
            k = path.index(nic)
            assert not inside & set(path[:k])               # fabric up to the GPU's own NIC
            assert set(path[k + 1:]) <= inside              # then inside its host
    searches = {target for target, fabric, _ in router._maps if fabric}
    assert all(topo.graph.nodes[t]["kind"] != "nic" for t in searches)


def _nearest_by_routing_every_candidate(router: Router, src: str, kinds: tuple[str, ...]) -> str | None:
    """Router.nearest's definition, literally: route to every node of ``kinds``."""
    topology = router.topology
    graph = topology.graph
    best = None
    for node in sorted(n for k in kinds for n in topology.nodes_of_kind(k)):
        try:
            path = router.path(src, node)
        except TopologyError:
            continue
        key = (len(path), sum(graph.edges[a, b]["lat"] for a, b in zip(path, path[1:])), node)
        best = key if best is None or key < best else best
    return None if best is None else best[2]


@pytest.mark.parametrize("spec,kinds", [
    ("dgx-h100:nodes=4", ("host_mem",)), ("dgx-a100:nodes=2", ("host_mem",)),
    ("cxl:expanders=3", ("cxl_mem",)), ("cxl:expanders=3,attach=cpu", ("cxl_mem",)),
    ("cxl:expanders=0", ("cxl_mem",)), ("cxl", ("cxl_mem", "host_mem")), ("pcie:8", ("host_mem",)),
    ("gb200-nvl72", ("host_mem",)), ("switch16", ("storage",)),
])
def test_nearest_searches_the_neighbourhood_and_finds_what_routing_every_candidate_finds(spec, kinds):
    """Router.nearest stops its breadth-first search past the best routed hop count: the
    same node for every GPU as routing to every candidate (none where there is none)."""
    from dessim.topology import load_topology

    topology = load_topology(spec)
    fast, slow = Router(topology), Router(topology)
    for gpu in topology.gpus:
        assert fast.nearest(gpu, kinds) == _nearest_by_routing_every_candidate(slow, gpu, kinds), gpu


def _routes(router: Router, pairs, keys=(0, 1, 7)) -> list:
    """Every answer the router gives about ``pairs`` (or the error it raises)."""
    out = []
    for a, b in pairs:
        try:
            out.append((a, b, [router.path(a, b, k) for k in keys], router.key_independent(a, b),
                        sorted(router.possible_hops(a, b))))
        except TopologyError as exc:
            out.append((a, b, str(exc)))
    return out


def _storage_dgx():
    from dessim.topology import load_topology
    from dessim.topology.storage import attach_storage

    return attach_storage(load_topology("dgx-h100:nodes=2"), "pfs", 1e12)


@pytest.mark.parametrize("make", [
    lambda: _load("dgx-h100:nodes=3"), lambda: _load("dgx-a100:nodes=2"), lambda: _load("dgx-b200:nodes=2"),
    lambda: _load("gb200-nvl72"), lambda: _load("pcie:8"), lambda: _load("cxl:expanders=3"),
    lambda: _load("cxl:expanders=3,attach=cpu"), lambda: _load("switch16"), _storage_dgx,
    lambda: leafspine(4, 4, 3), lambda: ring(6, 1e9, 1e-6),
])
def test_a_pair_through_its_only_common_forwarding_neighbour_is_routed_as_the_search_routes_it(make):
    """Router.two_hop_shortcut (two ends joined through one forwarding node, e.g. two GPUs on
    an NVSwitch, are routed through it without a search) changes no answer: every path for
    several keys, key independence and the possible hops of every ordered pair of nodes
    (every third pair on the larger presets), ECMP and D-mod-K fabrics alike."""
    topology = make()
    nodes = sorted(topology.graph.nodes)
    pairs = [(a, b) for a in nodes for b in nodes if a != b]
    if len(pairs) > 20_000:
        pairs = pairs[::3]
    fast, slow = Router(topology), Router(topology)
    slow.two_hop_shortcut = False
    got = _routes(fast, pairs)
    assert got == _routes(slow, pairs)
    assert sum(1 for r in got if len(r) == 5 and len(r[2][0]) == 3) > 0     # the shortcut had work


def _load(spec: str):
    from dessim.topology import load_topology

    return load_topology(spec)
