"""DGX / PCIe / CXL presets: structure, catalog figures, ideal mode and rail wiring."""

import pytest

from dessim.catalog import get_link_tech
from dessim.errors import DessimError
from dessim.topology.presets import cxl_node, dgx_a100, dgx_h100, pcie_server


def test_dgx_h100_node_structure():
    t = dgx_h100()
    assert t.num_gpus == 8 and t.dims == (8, 1)
    assert t.counts()["nodes"] == {"cpu": 2, "gpu": 8, "host_mem": 2, "nic": 8, "switch": 5}
    assert t.gpus == tuple(f"n0.gpu{i}" for i in range(8))
    assert all(t.graph.nodes[g]["transit"] is False for g in t.gpus)
    assert all(t.device(r) == "H100" for r in range(8))
    # each PCIe switch holds 2 GPUs and 2 NICs and hangs off CPU j // 2
    assert set(t.graph.adj["n0.pcie1"]) == {"n0.gpu2", "n0.gpu3", "n0.nic2", "n0.nic3", "n0.cpu0"}
    assert t.graph.has_edge("n0.pcie3", "n0.cpu1") and t.graph.has_edge("n0.cpu0", "n0.cpu1")
    assert t.graph.nodes["n0.mem0"]["capacity"] == pytest.approx(1e12)


def test_dgx_figures_come_from_the_catalog():
    h = dgx_h100()
    nv, pcie = get_link_tech("nvlink4"), get_link_tech("pcie5")
    link = h.link("n0.gpu3", "n0.nvsw")
    assert (link.type, link.bw, link.efficiency, link.lat) == ("nvlink", nv.bw, nv.efficiency, nv.lat)
    assert h.link("n0.gpu3", "n0.pcie1").bw == pcie.bw
    a = dgx_a100(2)
    assert a.link("n0.gpu0", "n0.nvsw").capacity == pytest.approx(230e9)
    assert a.link("n0.gpu0", "n0.pcie0").bw == get_link_tech("pcie4").bw
    assert a.link("n1.nic5", "leaf.su0.r5").bw == get_link_tech("ib_hdr").bw
    assert a.device(0) == "A100-80GB" and dgx_a100(gpu="a100-40gb").device(0) == "A100-40GB"


def test_ideal_sets_every_efficiency_to_one():
    t = dgx_h100(2, ideal=True)
    assert {link.efficiency for link in t.links()} == {1.0}
    assert t.link("n0.gpu0", "n0.nvsw").capacity == pytest.approx(450e9)


def test_rail_wiring_nic_i_of_every_node_on_rail_i():
    t = dgx_h100(4)
    assert t.dims == (8, 4) and t.node_of(8 * 2 + 5) == "n2.gpu5"
    for i in range(8):
        leaf = f"leaf.su0.r{i}"
        nics = {n for n in t.graph.adj[leaf] if t.kind(n) == "nic"}
        assert nics == {f"n{k}.nic{i}" for k in range(4)}
    spines = [n for n in t.nodes_of_kind("switch") if n.startswith("spine")]
    assert len(spines) == 4                       # default: 8 leaves / 2
    # non-blocking: each leaf's uplinks add up to its downlinks
    up = sum(t.link("leaf.su0.r0", s).bw for s in spines)
    assert up == pytest.approx(4 * get_link_tech("ib_ndr").bw)


def test_scalable_units_and_oversubscription():
    t = dgx_a100(34, oversub=2)
    assert "leaf.su1.r7" in t.graph and t.graph.has_edge("n33.nic7", "leaf.su1.r7")
    assert not t.graph.has_edge("n33.nic7", "leaf.su0.r7")
    spines = [n for n in t.graph.adj["leaf.su0.r0"] if n.startswith("spine")]
    assert len(spines) == 8                       # 16 leaves / 2
    up = sum(t.link("leaf.su0.r0", s).bw for s in spines)
    assert up == pytest.approx(32 * 25e9 / 2)
    up1 = sum(t.link("leaf.su1.r0", s).bw for s in spines)   # partial SU: 2 nodes
    assert up1 == pytest.approx(2 * 25e9 / 2)


def test_pcie_server():
    t = pcie_server(8, 5)
    assert t.counts()["nodes"] == {"cpu": 2, "gpu": 8, "host_mem": 2, "switch": 4}
    assert {link.type for link in t.links()} == {"pcie", "ddr", "custom"}
    assert t.link("gpu0", "pcie0").bw == get_link_tech("pcie5").bw
    assert t.graph.has_edge("pcie1", "cpu0") and t.graph.has_edge("pcie2", "cpu1")
    assert not t.link("cpu0", "mem0").duplex      # memory channels are half duplex


def test_cxl_node_expanders_behind_pcie():
    t = cxl_node("H100", 8, expanders=4, capacity="512GB")
    cxl = t.nodes_of_kind("cxl_mem")
    assert len(cxl) == 4 and all(t.graph.nodes[c]["capacity"] == 512e9 for c in cxl)
    assert t.graph.has_edge("cxl2", "pcie2") and t.link("cxl2", "pcie2").type == "cxl"
    assert t.graph.nodes["cxl0"]["transit"] is False
    cpu = cxl_node(attach="cpu", expanders=2)
    assert cpu.graph.has_edge("cxl1", "cpu1")
    amd = cxl_node("mi300x", expanders=1)
    assert amd.counts()["links"]["infinity_fabric"] == 28   # fully connected, 8 GPUs


@pytest.mark.parametrize("call,match", [
    (lambda: dgx_a100(gpu="h100"), "not a dgx_a100 GPU"),
    (lambda: dgx_h100(0), "nodes: 0 must be >= 1"),
    (lambda: dgx_h100(2, oversub=0), "oversub 0.0 must be"),
    (lambda: pcie_server(8, 7), "unknown link technology 'pcie7'"),
    (lambda: pcie_server(6, 4, gpus_per_switch=4), "cannot be split evenly"),
    (lambda: cxl_node(cxl="pcie5"), "not a CXL one"),
    (lambda: cxl_node(attach="disk"), "attach='disk'"),
])
def test_preset_errors(call, match):
    with pytest.raises(DessimError, match=match):
        call()


@pytest.mark.parametrize("gpus, device, spec", [
    (64, "A100-80GB", "dgx-a100:nodes=8"),
    (16, "A100-40GB", "dgx-a100:nodes=2,gpu=A100-40GB"),
    (8192, None, "dgx-h100:nodes=1024"),          # no device: H100 nodes
    (12, "H200", "dgx-h100:nodes=2,gpu=H200"),     # a partial node rounds up
    (2048, "H800", "dgx-h100:nodes=256,gpu=H800"),
    (16, "B200", "dgx-b200:nodes=2"),
    (144, "GB200", "gb200-nvl72:racks=2"),
])
def test_suggested_topology_is_dgx_nodes_of_the_device(gpus, device, spec):
    from dessim.topology import load_topology
    from dessim.topology.presets import suggested_topology
    assert suggested_topology(gpus, device) == spec
    assert load_topology(spec).num_gpus >= gpus


@pytest.mark.parametrize("device", ["MI300X", "V100"])
def test_no_topology_is_suggested_for_a_gpu_without_a_dgx_preset(device):
    from dessim.topology.presets import suggested_topology
    assert suggested_topology(8, device) is None
