"""Switches that declare in-network reduction (IB SHARP): the ``sharp`` attribute, the DGX
presets' ``sharp`` parameter, and the reduction trees of :mod:`dessim.topology.sharp`."""

from __future__ import annotations

import pytest

from dessim.errors import SpecError, TopologyError
from dessim.topology import load_topology
from dessim.topology.sharp import sharp_tree


def test_presets_declare_sharp_on_their_fabric_switches_only_when_asked():
    plain = load_topology("dgx-h100:nodes=2")
    sharp = load_topology("dgx-h100:nodes=2,sharp=true")
    fabric = [n for n in sharp.nodes_of_kind("switch") if n.startswith(("leaf", "spine"))]
    assert fabric and all(sharp.graph.nodes[n]["sharp"] for n in fabric)
    assert not any(d.get("sharp") for _, d in plain.graph.nodes(data=True))
    assert not any(sharp.graph.nodes[n].get("sharp") for n in sharp.nodes_of_kind("switch")
                   if n not in fabric)                       # NVSwitch and PCIe switches
    assert load_topology("dgx-a100:nodes=2,sharp=false").meta["params"]["sharp"] is False


def test_bad_sharp_values_name_the_key():
    with pytest.raises(SpecError, match="sharp"):
        load_topology("dgx-h100:nodes=2,sharp=maybe")
    base = {"nodes": [{"name": "g0", "kind": "gpu"}, {"name": "g1", "kind": "gpu"},
                      {"name": "sw", "kind": "switch", "sharp": True}],
            "links": [{"a": "g0", "b": "sw", "bw": "50GB/s", "lat": "1us"},
                      {"a": "g1", "b": "sw", "bw": "50GB/s", "lat": "1us"}]}
    assert load_topology(base).graph.nodes["sw"]["sharp"] is True
    for node, pattern in (({"name": "g0", "kind": "gpu", "sharp": True}, "only a switch"),
                          ({"name": "sw", "kind": "switch", "sharp": "yes"}, "true or false")):
        bad = {**base, "nodes": [n for n in base["nodes"] if n["name"] != node["name"]] + [node]}
        with pytest.raises(SpecError, match=f"sharp.*{pattern}"):
            load_topology(bad)


def test_the_graph_model_rejects_sharp_on_non_switches():
    import networkx as nx

    from dessim.topology.graph import Topology
    g = nx.Graph()
    g.add_node("g0", kind="gpu", sharp=True)
    g.add_node("g1", kind="gpu")
    g.add_edge("g0", "g1", type="custom", bw=1e9, lat=1e-6)
    with pytest.raises(TopologyError, match="sharp"):
        Topology(g)


def test_sharp_trees_stay_in_one_rail_leaf_and_spread_over_spines_across_units():
    one_su = load_topology("dgx-h100:nodes=4,sharp=true")
    tree = sharp_tree(one_su, [f"n{k}.nic3" for k in range(4)])
    assert tree.root == "leaf.su0.r3" and tree.edges == () and tree.depth == 0
    two_su = load_topology("dgx-h100:nodes=4,su_size=2,sharp=true")
    roots = {sharp_tree(two_su, [f"n{k}.nic{r}" for k in range(4)], salt=r).root
             for r in range(8)}
    assert len(roots) > 1 and all(r.startswith("spine") for r in roots)
    t = sharp_tree(two_su, [f"n{k}.nic0" for k in range(4)])
    assert t.depth == 1 and t.below[t.root] == 4
    assert sharp_tree(load_topology("dgx-h100:nodes=4"), [f"n{k}.nic0" for k in range(4)]) is None
