"""H800, B200 and GB200 devices and the dgx-b200 / gb200-nvl72 topology presets (issue 18)."""

import networkx as nx
import pytest

from dessim.catalog import get_device
from dessim.catalog.calibration import default_calibration
from dessim.engine.device import SM_COUNT, DeviceModel
from dessim.errors import DessimError
from dessim.topology import load_topology
from dessim.topology.hosts import host_map


def test_h800_is_h100_compute_with_the_cut_nvlink():
    h800, h100 = get_device("h800-sxm"), get_device("H100")
    assert h800.flops == h100.flops and h800.hbm_bw == h100.hbm_bw
    assert h800.scaleup_bw == pytest.approx(200e9)      # 400 GB/s bidirectional
    assert h800.generation == "hopper" and SM_COUNT["H800"] == 132


def test_gb200_figures_are_the_nvl72_datasheet_per_gpu():
    gb = get_device("GB200")
    assert gb.flops["bf16"] * 72 * 2 == pytest.approx(360e15)   # rack, with sparsity
    assert gb.flops["fp8"] * 72 * 2 == pytest.approx(720e15)
    assert gb.hbm_bw * 72 == pytest.approx(576e12)
    assert gb.scaleup_bw * 2 * 72 == pytest.approx(129.6e12)    # "130 TB/s"
    assert gb.generation == "blackwell"


@pytest.mark.parametrize("device", ["H800", "GB200", "B200"])
def test_new_devices_have_kernel_constants(device):
    cal = default_calibration().device(device)
    assert cal.gemm is not None and cal.gemm.peak_efficiency
    m = DeviceModel.for_device(device, "fp8")
    # an 8192^3 FP8 GEMM runs at most at the FP8 peak and at least at half the bf16 one
    t = m.kernel_time("matmul", (8192, 8192, 8192), 2 * 8192 ** 3, 0)
    assert 2 * 8192 ** 3 / get_device(device).flops["fp8"] < t < 2 * 8192 ** 3 / (
        0.5 * get_device(device).flops["bf16"])


def test_gb200_scaled_proxy_is_faster_than_b200_by_the_peak_ratio():
    b, g = DeviceModel.for_device("B200"), DeviceModel.for_device("GB200")
    shape = (16384, 16384, 16384)
    tb = b.kernel_time("matmul", shape, 2 * 16384 ** 3, 0) - b.launch_overhead
    tg = g.kernel_time("matmul", shape, 2 * 16384 ** 3, 0) - g.launch_overhead
    assert tb / tg == pytest.approx(2500 / 2250, rel=0.02)


def test_dgx_b200_nodes():
    topo = load_topology("dgx-b200:nodes=2")
    assert topo.num_gpus == 16 and topo.dims == (8, 2)
    assert {topo.device(r) for r in range(16)} == {"B200"}
    assert topo.graph.edges["n0.gpu0", "n0.nvsw"]["bw"] == pytest.approx(900e9)
    assert topo.graph.edges["n0.nic3", "leaf.su0.r3"]["bw"] == pytest.approx(50e9)


def test_dgx_h100_takes_h800():
    topo = load_topology("dgx-h100:nodes=1,gpu=H800")
    assert topo.graph.edges["n0.gpu0", "n0.nvsw"]["bw"] == pytest.approx(200e9)


def test_gb200_nvl72_is_one_nvlink_domain_per_rack():
    topo = load_topology("gb200-nvl72:racks=2")
    g = topo.graph
    assert topo.num_gpus == 144 and topo.dims == (72, 2)
    hosts = host_map(topo)
    assert [len(h.gpus) for h in hosts.hosts] == [72, 72]
    # any two GPUs of a rack: GPU -> NVSwitch -> GPU at 900 GB/s per direction
    assert nx.shortest_path(g, "n0.gpu0", "n0.gpu71") == ["n0.gpu0", "n0.nvsw", "n0.gpu71"]
    assert g.edges["n0.gpu5", "n0.nvsw"]["bw"] == pytest.approx(900e9)
    # a Grace CPU per 2 GPUs over NVLink-C2C, one 400G NIC per GPU on its own rail
    assert g.edges["n0.gpu5", "n0.cpu2"]["tech"] == "nvlink_c2c"
    assert sum(1 for n, d in g.nodes(data=True) if d.get("kind") == "cpu") == 72
    assert g.nodes["n1.nic5"]["rail"] == 5 and g.nodes["n1.gpu5"]["nic"] == "n1.nic5"
    assert g.has_edge("n1.nic5", "leaf.su0.r5")


def test_gb200_nvl72_errors_name_the_key():
    with pytest.raises(DessimError, match="racks"):
        load_topology("gb200-nvl72:racks=0")
    with pytest.raises(DessimError, match="not a scale-out"):
        load_topology("gb200-nvl72:nic=nvlink5")
