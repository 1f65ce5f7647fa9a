"""DGX presets can swap the scale-out technology and port speed (for bandwidth sweeps)."""

from __future__ import annotations

import pytest

from dessim.catalog.links import get_link_tech
from dessim.errors import DessimError
from dessim.topology import load_topology


def test_nic_bw_changes_only_the_scale_out_links():
    base = load_topology("dgx-h100:nodes=2")
    slow = load_topology("dgx-h100:nodes=2,nic_bw=200Gb/s")
    link = slow.link("n0.nic0", "leaf.su0.r0")
    assert link.bw == 25e9 and link.efficiency == get_link_tech("ib_ndr").efficiency
    assert slow.link("n0.gpu0", "n0.nvsw") == base.link("n0.gpu0", "n0.nvsw")
    # leaf uplinks are sized from the NIC speed (non-blocking by default)
    assert slow.link("leaf.su0.r0", "spine0").bw == pytest.approx(
        base.link("leaf.su0.r0", "spine0").bw / 2)


def test_nic_picks_a_catalog_technology():
    t = load_topology("dgx-a100:nodes=2,nic=eth400")
    assert t.link("n1.nic3", "leaf.su0.r3").type == "ethernet"


@pytest.mark.parametrize("spec,message", [
    ("dgx-a100:nodes=2,nic=pcie4", "not a scale-out"),
    ("dgx-a100:nodes=2,nic=ib_hdx", "unknown link technology 'ib_hdx'"),
    ("dgx-h100:nodes=2,nic_bw=fast", "nic_bw"),
])
def test_bad_nic_options(spec, message):
    with pytest.raises(DessimError, match=message):
        load_topology(spec)


def test_small_clusters_get_port_speed_uplinks():
    # 2 nodes: each rail leaf has 2 NIC ports below it, so 2 spines at NIC speed; a single
    # cross-rail flow is limited by its NIC (50 GB/s x efficiency), not by a thin uplink.
    t = load_topology("dgx-h100:nodes=2")
    spines = sorted(n for n in t.graph.adj["leaf.su0.r0"] if n.startswith("spine"))
    assert spines == ["spine0", "spine1"]
    assert all(t.link("leaf.su0.r0", s).bw == get_link_tech("ib_ndr").bw for s in spines)
    from dessim.network import simulate_transfers

    res = simulate_transfers(t, [(7, 8, "1GB", 0.0)])   # n0.gpu7 -> n1.gpu0: rail 7 -> rail 0
    nic = get_link_tech("ib_ndr")
    assert 1e9 / (res.finish_times[0]) == pytest.approx(nic.bw * nic.efficiency, rel=1e-3)


def test_a_memory_pool_cabled_to_every_gpu_does_not_merge_the_servers():
    """A pooled memory node (sweeps' memory expansion) forwards no traffic, so it joins no two
    servers: the hosts stay the nodes, and a send between nodes is a simple path through the
    NICs (a merged host made PXN pick a proxy GPU on the receiver's node: a looping route)."""
    from dessim.sweep.memory import MemorySetup, with_expansion
    from dessim.topology.hosts import host_map
    from dessim.topology.routing import router_for

    base = load_topology("dgx-a100:nodes=2")
    topo = with_expansion(base, MemorySetup(hbm_capacity=None, expansion_capacity=256e9,
                                            expansion_bw=25e9, expansion_lat=1e-6, options={}))
    hosts = host_map(topo)
    assert [h.gpus for h in hosts.hosts] == [tuple(range(8)), tuple(range(8, 16))]
    router = router_for(topo)
    for src, dst in ((8, 0), (0, 9), (3, 12)):
        path = router.path(topo.node_of(src), topo.node_of(dst))
        assert len(set(path)) == len(path), path
    # the same route as without the pool
    base_router = router_for(base)
    assert router.path(topo.node_of(8), topo.node_of(0)) == base_router.path(base.node_of(8), base.node_of(0))
