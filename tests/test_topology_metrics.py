"""Metrics against hand-computed values (B = one link's bandwidth per direction)."""

import pytest

from dessim.topology import load_topology
from dessim.topology.builders import leafspine, mesh2d, ring, switch, torus2d
from dessim.topology.metrics import (bisection_bandwidth, diameter, injection_bandwidth,
                                     topology_metrics)

B = 10e9


@pytest.mark.parametrize("topo,diam,inj_min,inj_max,bisect", [
    (ring(8, B, 0), 4, 2 * B, 2 * B, 2 * B),          # cut: 2 links
    (ring(2, B, 0), 1, B, B, B),                      # one link
    (ring(7, B, 0), 3, 2 * B, 2 * B, 2 * B),          # odd: halves 3 | 4
    (torus2d(4, 4, B, 0), 4, 4 * B, 4 * B, 8 * B),    # 4 rows x 2 cut links (one wrap)
    (mesh2d(4, 4, B, 0), 6, 2 * B, 4 * B, 4 * B),     # 4 columns cut once
    (switch(16, B, 0), 2, B, B, 8 * B),               # 8 GPUs' links
    (leafspine(64, 8, B, 0), 4, B, B, 32 * B),        # full bisection N/2 * B
    (leafspine(64, 8, B, 0, oversub=2), 4, B, B, 16 * B),   # 4 leaves x 8B/2 uplink
    (leafspine(64, 8, B, 0, oversub=4), 4, B, B, 8 * B),
])
def test_hand_computed_metrics(topo, diam, inj_min, inj_max, bisect):
    assert diameter(topo) == diam
    inj = injection_bandwidth(topo)
    assert inj["min"] == pytest.approx(inj_min) and inj["max"] == pytest.approx(inj_max)
    assert bisection_bandwidth(topo) == pytest.approx(bisect)


def test_efficiency_scales_capacities():
    t = ring(8, B, 0, efficiency=0.5)
    assert bisection_bandwidth(t) == pytest.approx(B)
    assert injection_bandwidth(t)["max"] == pytest.approx(B)


def test_memory_nodes_do_not_carry_bisection_traffic():
    # 4 GPUs on a 1 GB/s switch plus a fat g0 - mem - g2 path through a memory (non-transit)
    links = [{"a": f"g{i}", "b": "sw", "bw": "1GB/s", "lat": 0} for i in range(4)]
    links += [{"a": "g0", "b": "mem", "bw": "100GB/s", "lat": 0},
              {"a": "mem", "b": "g2", "bw": "100GB/s", "lat": 0}]
    t = load_topology({"nodes": [{"name": f"g{i}", "kind": "gpu"} for i in range(4)]
                       + [{"name": "sw", "kind": "switch"}, {"name": "mem", "kind": "host_mem"}],
                       "links": links})
    assert bisection_bandwidth(t) == pytest.approx(2e9)
    assert diameter(t) == 2


@pytest.mark.parametrize("transit,diam", [(False, 3), (True, 2)])
def test_diameter_routes_only_through_transit_nodes(transit, diam):
    # a - b - c directly, or a - s1 - s2 - c; b forwards only if transit
    nodes = [{"name": "a", "kind": "gpu"}, {"name": "b", "kind": "gpu", "transit": transit},
             {"name": "c", "kind": "gpu"}, {"name": "s1", "kind": "switch"},
             {"name": "s2", "kind": "switch"}]
    pairs = [("a", "b"), ("b", "c"), ("a", "s1"), ("s1", "s2"), ("s2", "c")]
    t = load_topology({"nodes": nodes,
                       "links": [{"a": x, "b": y, "bw": 1e9, "lat": 0} for x, y in pairs]})
    assert diameter(t) == diam


def test_dgx_cluster_metrics():
    m = topology_metrics(load_topology("dgx-h100:2"))
    assert m.gpus == 16 and m.dims == (8, 2)
    assert m.diameter == 8     # gpu-pcie-nic-leaf-spine-leaf-nic-pcie-gpu (cross rail)
    assert m.bisection_bw == pytest.approx(8 * 47e9)      # 8 NDR NICs per node at 47/50
    assert m.injection_bw["min"] == pytest.approx(370e9 + 63e9)   # NVLink4 eff + PCIe5
    single = topology_metrics(load_topology("dgx-h100"))
    assert single.diameter == 2


def test_to_dict_has_the_cli_keys():
    d = topology_metrics(ring(4, B, 0)).to_dict()
    assert d["gpus"] == 4 and d["diameter"] == 2 and d["dims"] == [4]
    assert d["bisection_bw_GBps"] == pytest.approx(20.0)
    assert d["injection_bw_GBps"]["min"] == pytest.approx(20.0)
    assert d["nodes"] == {"gpu": 4} and d["links"] == {"custom": 4}


@pytest.mark.parametrize("spec", ["dgx-a100:3", "cxl:gpus=4", "pcie:8", "mesh2d:5x3",
                                  "multidim:ring(4)xfc(3)xswitch(2)", "leafspine:12,3,spines=2"])
def test_vectorised_diameter_matches_plain_bfs(spec):
    from dessim.topology.metrics import hop_distances
    t = load_topology(spec)
    plain = max(hop_distances(t, a)[b] for a in t.gpus for b in t.gpus)
    assert diameter(t) == plain
