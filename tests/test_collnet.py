"""In-network reduction on InfiniBand switches (issue 16): switches that declare SHARP,
NCCL's CollNet algorithms (collnet = CollNetChain, collnetdirect = CollNetDirect) and NVLS
across nodes, NCCL's model of them in ``auto``, and the CoreWeave SHARP measurement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import get_op, run_collective
from dessim.collectives.auto import choose, group_shape
from dessim.collectives.nccl import algo_time, allowed, nccl_system
from dessim.errors import CollectiveError
from dessim.topology import load_topology

US = 1e-6
CALL = 20 * US          # calibration/default.yaml nccl.call_overhead


# --------------------------------------------------------------------- closed forms
B_NIC, L_PCI, L_NIC, L_UP = 25e9, 0.3e-6, 0.7e-6, 0.4e-6


def _one_node_per_leaf(hosts: int = 4) -> dict:
    """``hosts`` one-GPU hosts, each NIC on its own SHARP leaf, the leaves on one SHARP
    spine; the NIC link (25 GB/s) is the narrowest, the uplinks twice as fast."""
    nodes = [{"name": "spine", "kind": "switch", "sharp": True}]
    links = []
    for k in range(hosts):
        nodes += [{"name": f"g{k}", "kind": "gpu", "transit": False, "nic": f"nic{k}"},
                  {"name": f"nic{k}", "kind": "nic", "rail": 0},
                  {"name": f"leaf{k}", "kind": "switch", "sharp": True}]
        links += [{"a": f"g{k}", "b": f"nic{k}", "bw": "64GB/s", "lat": f"{L_PCI}s", "type": "pcie"},
                  {"a": f"nic{k}", "b": f"leaf{k}", "bw": f"{B_NIC}B/s", "lat": f"{L_NIC}s",
                   "type": "ib"},
                  {"a": f"leaf{k}", "b": "spine", "bw": f"{2 * B_NIC}B/s", "lat": f"{L_UP}s",
                   "type": "ib"}]
    return {"name": "sharp-star", "nodes": nodes, "links": links}


@pytest.mark.parametrize("size", [8.0, 2.0**20, 2.0**30])
def test_collnet_on_an_idle_sharp_fabric_is_its_closed_form(size):
    # Every NIC sends its buffer once up to its leaf and gets the sum back; the leaves and the
    # spine reduce. Raw: the critical path is one round trip GPU-leaf-spine-leaf-GPU, and the
    # NIC flows are the slowest and paid the most latency, so
    #   t = 2 (L_pci + L_nic + L_up) + S / B_nic.
    topo = load_topology(_one_node_per_leaf())
    for algo in ("collnet", "collnetdirect"):
        if algo == "collnetdirect":          # no NVSwitch: NCCL does not run CollNetDirect
            with pytest.raises(CollectiveError, match="NVSwitch"):
                run_collective("allreduce", size, topo, algo=algo, protocol="raw")
            continue
        raw = run_collective("allreduce", size, topo, algo=algo, protocol="raw")
        assert raw.time_s == pytest.approx(2 * (L_PCI + L_NIC + L_UP) + size / B_NIC, rel=1e-9)
        # Simple: NCCL's latency, 2(ppn-1) intra + hwLat[NET][CollNetChain][Simple] = 30 us
        simple = run_collective("allreduce", size, topo, algo=algo, protocol="Simple")
        assert simple.time_s == pytest.approx(CALL + 30 * US + size / B_NIC, rel=1e-9)
        for nic in range(4):                 # each NIC carries the buffer once each way
            links = {r["link"]: r["bytes"] for r in raw.link_util}
            assert links[f"nic{nic}->leaf{nic}"] == pytest.approx(size)
            assert links[f"leaf{nic}->spine"] == pytest.approx(size)


def test_small_messages_pay_nccls_collnet_and_nvls_latencies_on_a_dgx_h100_cluster():
    topo = "dgx-h100:nodes=4,sharp=true"
    for algo, lat in (("collnet", 2 * 7 * 2.8 + 30),       # 2(ppn-1) NVLink + network
                      ("collnetdirect", 2 * (3.7 + 7 * 0.4) + 31),
                      ("nvls", 25 + 18)):                    # NVLS hop + network
        res = run_collective("allreduce", 8, topo, algo=algo)
        assert res.protocol == "Simple"
        assert res.time_s == pytest.approx(CALL + lat * US, rel=1e-3), algo


def test_collnet_on_a_dgx_h100_cluster_is_bound_by_nvlink_not_the_nics():
    # Every GPU's NVLink carries 2(p-1)/p S each way (chains rotate their heads), each NIC
    # S/8: at 369 GB/s of NVLink, busbw = 2(n-1)/n * 369 / 1.75 = 416 GB/s for 64 ranks.
    res = run_collective("allreduce", 2.0**33, "dgx-h100:nodes=8,sharp=true", algo="collnet",
                         protocol="raw")
    assert res.busbw_GBps == pytest.approx(2 * 63 / 64 * 450 * 370 / 450 / 1.75, rel=0.01)
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * 2 * 63 / 64)
    assert get_op("allreduce").busbw_factor(64) == 2 * 63 / 64     # nccl-tests' definitions
    assert get_op("allgather").busbw_factor(64) == 63 / 64
    assert get_op("reducescatter").busbw_factor(64) == 63 / 64


@settings(max_examples=8, deadline=None)
@given(nodes=st.integers(2, 5), nics=st.sampled_from([4, 8]),
       algo=st.sampled_from(["collnet", "collnetdirect", "nvls"]))
def test_every_nic_carries_the_same_bytes(nodes, nics, algo):
    topo = load_topology(f"dgx-h100:nodes={nodes},nics={nics},sharp=true")
    size = 2.0**26
    res = run_collective("allreduce", size, topo, algo=algo, protocol="raw")
    links = {r["link"]: r["bytes"] for r in res.link_util}
    up = [b for link, b in links.items() if ".nic" in link.split("->")[0] and "leaf" in link]
    down = [b for link, b in links.items() if "leaf" in link.split("->")[0] and ".nic" in link]
    assert len(up) == len(down) == nodes * nics
    assert max(up) == pytest.approx(min(up)) == pytest.approx(size / nics)
    assert max(down) == pytest.approx(min(down)) == pytest.approx(size / nics)


def test_in_network_reduction_beats_the_ring_for_large_messages():
    for algo in ("collnet", "collnetdirect", "nvls"):
        sharp = run_collective("allreduce", 2.0**30, "dgx-h100:nodes=4,sharp=true", algo=algo,
                               protocol="raw")
        ring = run_collective("allreduce", 2.0**30, "dgx-h100:nodes=4,sharp=true", algo="ring",
                              protocol="raw")
        assert sharp.time_s < ring.time_s, algo


def test_allgather_and_reducescatter_go_through_one_head_per_nic():
    topo = "dgx-h100:nodes=4,sharp=true"
    for op in ("allgather", "reducescatter"):
        res = run_collective(op, 2.0**30, topo, algo="collnetdirect", protocol="raw")
        links = {r["link"]: r["bytes"] for r in res.link_util}
        # all-gather: a NIC sends its GPU's block and receives the rail's blocks of every node
        block = 2.0**30 / 32
        up, down = (block, 4 * block) if op == "allgather" else (4 * block, block)
        assert links["n0.nic0->leaf.su0.r0"] == pytest.approx(up)
        assert links["leaf.su0.r0->n0.nic0"] == pytest.approx(down)
    with pytest.raises(CollectiveError, match="one NIC per GPU"):
        run_collective("allgather", 2.0**20, "dgx-h100:nodes=2,nics=4,sharp=true",
                       algo="collnetdirect")


@pytest.mark.parametrize("algo,op", [("collnet", "allreduce"), ("collnetdirect", "allreduce"),
                                     ("collnetdirect", "allgather"),
                                     ("collnetdirect", "reducescatter"), ("nvls", "allreduce"),
                                     ("nvls", "allgather"), ("nvls", "reducescatter")])
def test_schedules_conserve_bytes(algo, op):
    from dessim.collectives import build_schedule

    topo = load_topology("dgx-h100:nodes=3,sharp=true")
    build_schedule(op, algo, tuple(range(24)), 2.0**24, topology=topo).validate()


# --------------------------------------------------------------------- refusals
def test_collnet_refuses_without_sharp_or_outside_nccls_rules():
    with pytest.raises(CollectiveError, match="sharp"):
        run_collective("allreduce", 2.0**20, "dgx-h100:nodes=2", algo="collnet")
    with pytest.raises(CollectiveError, match="across nodes"):
        run_collective("allreduce", 2.0**20, "dgx-h100:nodes=1", algo="collnetdirect")
    with pytest.raises(CollectiveError, match="same number of ranks"):
        run_collective("allreduce", 2.0**20, "dgx-h100:nodes=2,sharp=true", algo="collnet",
                       ranks="0-9")
    with pytest.raises(CollectiveError, match="cannot run allgather"):
        run_collective("allgather", 2.0**20, "dgx-h100:nodes=2,sharp=true", algo="collnet")
    with pytest.raises(CollectiveError, match="IB SHARP"):
        run_collective("allreduce", 2.0**20, "dgx-h100:nodes=2", algo="nvls")
    yaml_half = _one_node_per_leaf()
    for node in yaml_half["nodes"]:
        if node["name"] == "leaf2":
            node["sharp"] = False
    with pytest.raises(CollectiveError, match="nic2 is not cabled to a switch that declares"):
        run_collective("allreduce", 2.0**20, load_topology(yaml_half), algo="collnet")


# --------------------------------------------------------------------- NCCL's model
def test_nccls_collnet_bandwidths_and_latencies_on_dgx_h100_with_sharp():
    s = nccl_system(tuple(range(64)), load_topology("dgx-h100:nodes=8,sharp=true"))
    assert s.collnet and (s.collnet_chain_channels, s.collnet_chain_bw_intra) == (8, 48)
    size = 2**30
    # CollNetChain: 8 x 48 GB/s busBw, x 0.5 to algBw; latency 2 (ppn-1) 2.8 + 30 us
    chain = algo_time("allreduce", "collnet_chain", "Simple", size, s)
    assert chain == pytest.approx((2 * 7 * 2.8 + 30) * US + size / (1000 * 8 * 48 * 0.5) * US)
    # CollNetDirect: x 0.85 on Hopper; 2 (3.7 + 7 x 0.4) + 31 us
    direct = algo_time("allreduce", "collnet_direct", "Simple", size, s)
    assert direct == pytest.approx((2 * (3.7 + 2.8) + 31) * US
                                   + size / (1000 * 8 * 48 * 0.85 * 0.5) * US)
    assert algo_time("allreduce", "collnet_chain", "LL", size, s) is None


def test_auto_offers_collnet_only_where_sharp_is_declared():
    group = tuple(range(64))
    for spec, expect in (("dgx-h100:nodes=8", False), ("dgx-h100:nodes=8,sharp=true", True),
                         ("dgx-a100:nodes=8,sharp=true", True)):
        topo = load_topology(spec)
        s = nccl_system(group, topo)
        names = {a for a, _ in allowed("allreduce", s)}
        assert ({"collnet_chain", "collnet_direct"} <= names) is expect, spec
        assert ("nvls" in names) is (expect and s.nvls), spec
        c = choose(get_op("allreduce"), group, 2.0**30, topo)
        used = {e.algorithm for e in c.estimates}
        assert ({"collnet", "collnetdirect"} <= used) is expect
        if expect:
            assert c.algorithm in ("nvls", "collnet", "collnetdirect") and "CollNet" in c.explanation()
        else:
            assert not {"collnet", "collnetdirect"} & used
    a100 = load_topology("dgx-a100:nodes=4,sharp=true")
    assert choose(get_op("allreduce"), tuple(range(32)), 2.0**30, a100).algorithm == "collnetdirect"
    res = run_collective("allreduce", 2.0**30, a100)
    assert res.algorithm == "collnetdirect" and res.auto is not None


def test_group_shapes_tell_sharp_fabrics_apart():
    group = tuple(range(0, 32, 8))
    plain, sharp = load_topology("dgx-h100:nodes=4"), load_topology("dgx-h100:nodes=4,sharp=true")
    assert group_shape(group, plain) != group_shape(group, sharp)
    other = tuple(range(1, 32, 8))                 # the same shape on another rail
    assert group_shape(group, sharp) == group_shape(other, sharp)


# --------------------------------------------------------------------- published
def test_the_coreweave_sharp_plateau_is_within_ten_percent():
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import validate_collectives as v

    name = "coreweave_h100_8n_allreduce_sharp"
    assert name not in v.SKIPPED and v.CASES[name].algo == "collnet"
    curves = pd.read_csv(v.ROOT / "validation" / "nccl_tests_curves.csv")
    r = v.validate_dataset(name, curves[curves.dataset == name], quick=True)
    assert abs(r["plateau_err"]) <= 0.10
