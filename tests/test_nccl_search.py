"""NCCL's ring search is bounded by every link a channel crosses inside a node (NCCL 2.30.7
``src/graph/search.cc``): the NICs and their PCIe links, the GPUs' PCIe links and the GPUs'
NVLinks — not by the NICs' line rate alone. A faster NIC therefore never makes NCCL (or
``auto``) slower."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import run_collective
from dessim.collectives.nccl import algo_time, nccl_system
from dessim.collectives.nccl.system import _NodeLinks, _ring_channels
from dessim.topology import load_topology

GiB = 2.0**30


def _system(spec: str):
    topo = load_topology(spec)
    return nccl_system(tuple(range(topo.num_gpus)), topo), topo


def _auto(spec: str) -> tuple[str, float]:
    """The algorithm ``auto`` picks for a 1 GiB all-reduce on every GPU, and its simulated time."""
    res = run_collective("allreduce", GiB, spec)
    return res.auto.algorithm, res.time_s


def test_an_800g_nic_does_not_make_auto_slower_than_a_400g_one():
    # The 800G NIC sits on the same PCIe Gen5 link (48 GB/s in NCCL's units) as the 400G
    # one, and 8 rings of 48 GB/s already fill the GPUs' NVLinks (7 x 48 <= 370.8): NCCL
    # finds the same 8 x 48 graph, so it picks the same algorithm, which runs as fast.
    fast, _ = _system("dgx-h100:nodes=2,nic_bw=800Gb/s")
    assert (fast.channels, fast.bw_intra, fast.execution_channels) == (8, 48, 16)
    (algo_fast, t_fast), (algo_slow, t_slow) = (_auto("dgx-h100:nodes=2,nic_bw=800Gb/s"),
                                                _auto("dgx-h100:nodes=2"))
    assert algo_fast == algo_slow and t_fast <= t_slow


def test_stock_dgx_searches_are_what_nccl_logs_show():
    # nccl-tests#100 / nccl#892 (DGX H100, 8 x NDR): 8 channels x 48 GB/s; DGX A100 8 x HDR:
    # 8 x 24 (one ring per NIC at the PCIe Gen4 figure, no duplication below 25 GB/s)
    h100, _ = _system("dgx-h100:nodes=2")
    a100, _ = _system("dgx-a100:nodes=2")
    assert (h100.channels, h100.bw_intra, h100.bw_inter) == (8, 48, 48)
    assert (a100.channels, a100.bw_intra, a100.bw_inter) == (8, 24, 24)


def test_nvlink_alone_caps_the_rings_when_the_pcie_links_do_not():
    # DGX H100 NVLinks (18 x 20.6 GB/s) with NICs and GPUs on links that admit 4 rings each:
    # every channel crosses 7 of the 8 GPUs' NVLinks, 7 x 48 <= 370.8 < 8 x 48 - the
    # NVLinks admit 8 rings of 48 GB/s whatever the NICs allow
    wide = _NodeLinks(nic_groups=(((192.0, 192.0), 2),) * 4, gpu_pcie=192.0,
                      gpu_intra=18 * 20.6, intra_nvlink=True, all_local=True, ppn=8)
    assert _ring_channels(wide, 48.0) == 8
    assert _ring_channels(wide, 45.0) == 9            # floor(8 * 8 / 7): 9 - 1 <= 8
    # a member GPU with no NIC on its PCIe switch never ends a channel: it sends in all
    assert _ring_channels(_NodeLinks(wide.nic_groups, 192.0, 18 * 20.6, True, False, 8), 45.0) == 8


def test_gb200_rings_cross_all_72_gpus_of_the_nvlink_domain():
    # 71 NVLink hops per ring: floor(721.8 / 48) = 15 rings of 48 (720 < totalBw 721.8),
    # then 16 x 45.1 = 721.6 is strictly better and the search keeps it
    s, _ = _system("gb200-nvl72:2")
    assert (s.ppn, s.channels, s.bw_intra) == (72, 16, 45.1)


def _admitted(spec: str) -> tuple[float, int, int, float]:
    """NCCL's modelled ring bandwidth per node (channels x GB/s), channels, GPUs per node and
    per-channel GB/s."""
    s, _ = _system(spec)
    return s.channels * s.bw_intra, s.channels, s.ppn, s.bw_intra


@settings(max_examples=25, deadline=None)
@given(base=st.sampled_from(["dgx-a100", "dgx-h100", "dgx-b200"]),
       nics=st.sampled_from([4, 8]), nodes=st.integers(2, 6),
       gbps=st.lists(st.sampled_from([50, 100, 150, 200, 250, 300, 400, 600, 800, 1600]),
                     min_size=2, max_size=2, unique=True))
def test_more_nic_bandwidth_never_lowers_the_ring_and_nvlinks_admit_every_channel(
        base, nics, nodes, gbps):
    slow, fast = sorted(gbps)
    spec = f"{base}:nodes={nodes},nics={nics}"
    bw_slow, *_ = _admitted(f"{spec},nic_bw={slow}Gb/s")
    bw_fast, channels, ppn, per_channel = _admitted(f"{spec},nic_bw={fast}Gb/s")
    assert bw_fast >= bw_slow
    nvlink = {"dgx-a100": 12 * 20.0, "dgx-h100": 18 * 20.6, "dgx-b200": 18 * 40.1}[base]
    # each channel costs per_channel on the NVLink of ppn - 1 of the ppn GPUs
    busiest = (channels - channels // ppn) * per_channel
    assert busiest <= nvlink + 1e-6


def test_the_tree_graphs_second_pass_raises_bw_intra_on_two_node_trees():
    # ncclTopoCompute pass 2 ("increase bwIntra for trees"): from the ring's speed up NCCL's
    # inter speed list while below twice bwInter and the NVLinks carry the 8 chains (each
    # GPU sends in 7): DGX A100 24 -> 28 -> 30 (7 x 30 <= 240 < 7 x 48); DGX H100 is
    # already at the top of the sm90 list (48)
    a100, _ = _system("dgx-a100:nodes=2")
    h100, _ = _system("dgx-h100:nodes=2")
    assert (a100.channels, a100.tree_bw_intra, a100.bw_inter) == (8, 30, 24)
    assert (h100.tree_bw_intra, h100.bw_inter) == (48, 48)
    # a ring over 200G NICs runs at 24 GB/s; its tree's chains may run at 48 on NVLink
    eth, _ = _system("dgx-h100:nodes=2,nic=eth200")
    assert (eth.bw_inter, eth.tree_bw_intra) == (24, 48)


def test_nccls_tree_estimate_reads_the_tree_graph_on_two_nodes_and_bw_inter_beyond():
    # tuning.cc: bw = nNodes <= 2 ? graphs[a]->bwIntra : graphs[a]->bwInter, per algorithm
    two, _ = _system("dgx-a100:nodes=2")
    four, _ = _system("dgx-a100:nodes=4")
    size = 2.0**32
    tree_two = algo_time("allreduce", "tree", "Simple", size, two)
    flat = algo_time("allreduce", "tree", "Simple", size, replace(two, tree_bw_intra=0.0))
    assert tree_two < flat                               # 8 x 30 (capped) beats 8 x 24
    assert algo_time("allreduce", "tree", "Simple", size, four) == algo_time(
        "allreduce", "tree", "Simple", size, replace(four, tree_bw_intra=four.bw_inter))
