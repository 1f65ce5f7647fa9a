"""Collectives as NCCL runs them (issue 16): NCCL's tuning model transcribed, what its
topology search finds on DGX systems, rail-aligned rings, protocols, NVLS, trees across
nodes, pipelined hierarchy, and the published nccl-tests figures (validation/)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives import CollectiveSettings, get_op, plan_collective, run_collective
from dessim.collectives.algorithms.ring import ring_lanes
from dessim.collectives.auto import choose
from dessim.collectives.nccl import algo_time, allowed, nccl_system
from dessim.collectives.nccl.tuning import NcclSystem
from dessim.errors import CollectiveError
from dessim.topology import load_topology

US = 1e-6


# --------------------------------------------------------------------- NCCL's tuning model
def test_ring_ll_latency_is_nccls_formula():
    # NCCL 2.30.7: baseLat[Ring][LL] 6.6 + 2(n-1) hops x hwLat[NVLink][Ring][LL] 0.6 us
    system = nccl_system(tuple(range(8)), load_topology("dgx-a100:nodes=1"))
    t = algo_time("allreduce", "ring", "LL", 8, system)
    assert t == pytest.approx((6.6 + 14 * 0.6) * US + 8 / (1000 * min(87.7, 12 * 20 * 0.5)
                                                          * 8 / 14) * US)


def test_nvls_bus_bandwidth_on_a_dgx_h100_is_476():
    # 8 heads x 40 GB/s x nvlsEfficiency 0.85 x 7/8 x 2 = 476 GB/s busBw (measured: ~480)
    system = nccl_system(tuple(range(8)), load_topology("dgx-h100:nodes=1"))
    assert (system.nvls, system.nvls_channels, system.nvls_bw_intra) == (True, 8, 40)
    t = algo_time("allreduce", "nvls", "Simple", 2**30, system)
    bus = 2**30 / ((t / US - 25.0) * 1000) * 14 / 8
    assert bus == pytest.approx(8 * 40 * 0.85 * 7 / 8 * 2)


@pytest.mark.parametrize("spec,search,bw,executed", [
    ("dgx-a100:nodes=1", 12, 20, 24),      # 6 rings at 40 GB/s, duplicated, Postset x2
    ("dgx-h100:nodes=1", 12, 30, 24),
    ("dgx-a100:nodes=4", 8, 24, 16),       # one ring per HDR NIC at 24 GB/s, no duplication
    ("dgx-h100:nodes=4", 8, 48, 16),       # one per NDR NIC at 48 GB/s (PXN), NCCL >= 2.20
    ("dgx-a100:nodes=2,nics=4", 4, 24, 8),
])
def test_the_search_finds_what_nccl_finds_on_dgx_systems(spec, search, bw, executed):
    topo = load_topology(spec)
    s = nccl_system(tuple(range(topo.num_gpus)), topo)
    assert (s.channels, s.bw_intra, s.execution_channels) == (search, bw, executed)


def test_nvls_and_pat_follow_nccls_enable_rules():
    h100 = nccl_system(tuple(range(16)), load_topology("dgx-h100:nodes=2"))
    algos = {a for a, _ in allowed("allreduce", h100)}
    assert "nvls_tree" in algos and "nvls" not in algos     # multi-node NVLS needs CollNet
    assert all(p == "Simple" for a, p in allowed("allreduce", h100) if a.startswith("nvls"))
    a100 = nccl_system(tuple(range(8)), load_topology("dgx-a100:nodes=1"))
    assert not a100.nvls and not {a for a, _ in allowed("allreduce", a100)} & {"nvls", "nvls_tree"}
    one_per_node = nccl_system((0, 8, 16, 24), load_topology("dgx-a100:nodes=4"))
    assert "pat" in {a for a, _ in allowed("allgather", one_per_node)}


# --------------------------------------------------------------------- auto
@pytest.mark.parametrize("spec", ["dgx-a100:nodes=1", "dgx-h100:nodes=1", "dgx-h100:nodes=4"])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("size", [8.0, 2.0**20, 2.0**26, 2.0**32])
def test_auto_takes_the_cheapest_simulated_candidate_of_nccls_model(spec, op, size):
    topo = load_topology(spec)
    group = tuple(range(topo.num_gpus))
    c = choose(get_op(op), group, size, topo)
    timed = [e for e in c.estimates if e.time_s is not None]
    assert timed and (c.algorithm, c.protocol) == (timed[0].algorithm, timed[0].protocol)
    assert timed[0].time_s == min(e.time_s for e in timed)
    assert c.algorithm in ("ring", "dbtree", "nvls", "nvlstree")


def test_auto_never_picks_direct_for_data_parallel_reduce_scatters_at_scale():
    # issue 16: a 64-rank reduce-scatter across 64 nodes (one GPU per node)
    topo = load_topology("dgx-h100:nodes=64")
    group = tuple(range(3, 512, 8))
    for size in (2.0**20, 2.0**28, 2.0**32):
        assert choose(get_op("reducescatter"), group, size, topo).algorithm == "ring"


def test_a_forced_protocol_restricts_the_choice():
    topo = load_topology("dgx-h100:nodes=1")
    c = choose(get_op("allreduce"), tuple(range(8)), 2.0**30, topo, CollectiveSettings(protocol="LL"))
    assert c.protocol == "LL" and c.algorithm in ("ring", "dbtree")


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather"])
def test_the_raw_protocol_runs_nccls_choice_of_algorithm_not_an_empty_refusal(op):
    # raw is no NCCL protocol: it used to filter out every candidate and end in
    # "no algorithm can run ... on this group: " with an empty list (--protocol raw alone)
    topo = load_topology("dgx-h100:nodes=2")
    group = tuple(range(16))
    nccl = choose(get_op(op), group, 2.0**30, topo)
    raw = choose(get_op(op), group, 2.0**30, topo, CollectiveSettings(protocol="raw"))
    assert (raw.algorithm, raw.protocol) == (nccl.algorithm, "raw")
    assert f"chooses {nccl.algorithm} ({nccl.protocol})" in raw.note
    t_raw = run_collective(op, 2.0**30, topo, protocol="raw").time_s
    t_nccl = run_collective(op, 2.0**30, topo).time_s
    assert 0 < t_raw < t_nccl        # no framing, no software latency


# --------------------------------------------------------------------- rail-aligned rings
@settings(max_examples=12, deadline=None)
@given(nodes=st.integers(2, 6), kind=st.sampled_from(["dgx-a100", "dgx-h100"]),
       nics=st.sampled_from([4, 8]))
def test_rail_aligned_rings_load_every_nic_of_a_node_equally(nodes, kind, nics):
    topo = load_topology(f"{kind}:nodes={nodes},nics={nics}")
    group = tuple(range(topo.num_gpus))
    lanes = ring_lanes(group, topo, None)
    assert len(lanes) == nics
    res = run_collective("reducescatter", 2.0**24, topo, algo="ring", protocol="Simple")
    for k in range(nodes):
        out = [_bytes(res, f"n{k}.nic{i}", "leaf") for i in range(nics)]
        into = [_bytes(res, f"leaf", f"n{k}.nic{i}") for i in range(nics)]
        assert max(out) == pytest.approx(min(out), rel=1e-9) and min(out) > 0
        assert max(into) == pytest.approx(min(into), rel=1e-9)
    # every network hop of a ring stays on one rail: no spine is ever used
    assert not [r for r in res.link_util if "spine" in r["link"]]


def _bytes(res, a_prefix: str, b_prefix: str) -> float:
    return sum(r["bytes"] for r in res.link_util
               if r["link"].split("->")[0].startswith(a_prefix)
               and r["link"].split("->")[1].startswith(b_prefix))


def test_each_ring_enters_and_leaves_a_node_on_one_rail():
    topo = load_topology("dgx-a100:nodes=3")
    for lane, rail in zip(ring_lanes(tuple(range(24)), topo, None), range(8)):
        for k in range(3):
            seg = lane[8 * k:8 * k + 8]
            assert seg[0] == 8 * k + rail                 # enters at the GPU owning NIC <rail>
            assert seg[-1] == 8 * k + (rail ^ 1)          # leaves from its PCIe sibling (PIX)


# --------------------------------------------------------------------- protocols
def test_protocol_charges_on_an_idle_node_are_nccls_latency_plus_the_bytes():
    topo = load_topology("dgx-h100:nodes=1")
    plan = plan_collective("allreduce", tuple(range(8)), 8.0, topo,
                           CollectiveSettings(algo="ring", protocol="LL"))
    res = run_collective("allreduce", 8, topo, algo="ring", protocol="LL")
    call = plan.protocol.call_latency("ring")
    assert call == pytest.approx(6.6 * US)                 # baseLat (+ call_overhead 0 on a host)
    block_wire = 2 * 8 / 8                                # LL doubles the bytes on the wire
    link = 450e9 * 370 / 450
    # 14 steps, each NCCL's NVLink LL hop (0.6 us > the 0.5 us route) + one block
    assert res.time_s == pytest.approx(call + 14 * (0.6 * US + block_wire / link), rel=1e-12)


@pytest.mark.parametrize("proto,factor", [("LL", 2.0), ("LL128", 1 / 0.92), ("Simple", 1.0)])
def test_protocols_put_their_framing_on_the_wire(proto, factor):
    res = run_collective("allgather", 2.0**24, "dgx-h100:nodes=1", algo="ring", protocol=proto)
    raw = run_collective("allgather", 2.0**24, "dgx-h100:nodes=1", algo="ring", protocol="raw")
    carried = sum(r["bytes"] for r in res.link_util)
    assert carried == pytest.approx(factor * sum(r["bytes"] for r in raw.link_util))


def test_ring_steps_across_nodes_pay_the_network_proxy_overhead():
    # NCCL: intra-node steps of a ring crossing nodes cost at least getNetOverhead (AMD: 2 us)
    small = run_collective("allreduce", 8, "dgx-a100:nodes=2", algo="ring", protocol="LL")
    assert small.time_s > (6.6 + 20 + 30 * 2.0) * US


# --------------------------------------------------------------------- NVLS and trees
def test_nvls_on_an_idle_dgx_h100_is_its_closed_form():
    size = 2.0**30
    res = run_collective("allreduce", size, "dgx-h100:nodes=1", algo="nvls")
    assert res.protocol == "Simple"
    link = 450e9 * 370 / 450
    # pipeline fill: 2 loops of 16 channels x 8 heads x 128 KiB chunks (1 GiB is not below
    # 64 x 128 x 128 KiB, so NCCL keeps its largest chunk)
    fill = 2 * 16 * 8 * 128 * 1024
    bytes_per_link = (1 + 1 / 8) * (size + fill) / 0.85   # nvlsEfficiency on Hopper
    expect = 25 * US + bytes_per_link / link              # NVLS hop, bytes (one host: no call overhead)
    assert res.time_s == pytest.approx(expect, rel=1e-9)
    assert 470 < res.busbw_GBps < 490                     # nccl-tests: ~480 (#212)


@pytest.mark.parametrize("size,chunk", [(2**30, 128 * 1024), (2**30 - 1, 65536),
                                        (2**26, 65536), (2**26 - 1, 32768),
                                        (2**23, 32768), (2**23 - 1, 16384), (8, 16384)])
def test_nvls_chunks_shrink_with_the_message_as_nccls(size, chunk):
    from dessim.collectives.algorithms.nvls import nvls_chunk_bytes

    assert nvls_chunk_bytes(size, 16 * 8) == chunk        # 16 channels x 8 heads (8 x H100)


def test_nvls_pipeline_fill_is_two_loops_or_two_messages():
    from dessim.collectives.algorithms.nvls import nvls_fill_bytes

    assert nvls_fill_bytes(2**33, 8, 16) == 2 * 128 * 128 * 1024
    assert nvls_fill_bytes(2**24, 8, 16) == 2 * 128 * 32 * 1024
    assert nvls_fill_bytes(2**20, 8, 16) == 2 * 2**20     # below one loop: 3 stages in a row
    topo = "dgx-h100:nodes=1"
    small = run_collective("allreduce", 2**20, topo, algo="nvls")
    tiny = run_collective("allreduce", 8, topo, algo="nvls")
    rate = 450e9 * 370 / 450 * 0.85 / (1 + 1 / 8)         # algbw of NVLS's links
    assert small.time_s - tiny.time_s == pytest.approx(3 * (2**20 - 8) / rate, rel=1e-9)
    # reduce-scatter and all-gather run other kernels: no fill charged
    rs = run_collective("reducescatter", 2**30, topo, algo="nvls")
    assert rs.time_s == pytest.approx(25 * US + 2**30 / (450e9 * 370 / 450 * 0.85), rel=1e-9)


def test_nvls_needs_an_nvswitch_of_hopper_or_later():
    with pytest.raises(CollectiveError, match="Hopper or Blackwell"):
        run_collective("allreduce", 2.0**20, "dgx-a100:nodes=1", algo="nvls")
    with pytest.raises(CollectiveError, match="one NVSwitch"):
        run_collective("allreduce", 2.0**20, "dgx-h100:nodes=2", algo="nvls")


def test_tree_across_nodes_has_nccls_latency():
    # 2 nodes: 2((ppn-1) NVLink hops + log2(2) network hops) on the critical path
    res = run_collective("allreduce", 8, "dgx-h100:nodes=2", algo="dbtree", protocol="LL")
    route_net = 6 * 0.5 * US                              # GPU-PCIe-NIC-leaf-NIC-PCIe-GPU
    expect = 20 * US + 6.8 * US + 2 * (7 * 0.6 * US + max(5.0 * US, route_net))  # net_call_overhead
    assert res.time_s == pytest.approx(expect, rel=1e-3)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 8), size=st.floats(8.0, 2.0**30), lanes=st.sampled_from((None, 1, 3)))
def test_tree_on_one_node_is_nccls_chain(p, size, lanes):
    # ncclTopoPreset on one node: tree.up = intra[i-1], tree.down[0] = intra[i+1] (no node
    # trees); runTreeSplit reduces up and broadcasts down at once. On an idle switch of
    # B = 50 GB/s links (500 ns each) every inner rank sends up and down, so each flow gets
    # B/2 (p = 2: B), and the critical path is 2(p-1) hops of 2 links each.
    group = tuple(range(p))
    topo = load_topology("switch:8,bw=50GB/s,lat=500ns")
    sched = plan_collective("allreduce", group, size, topo, CollectiveSettings(
        algo="dbtree", protocol="raw", channels=lanes)).schedule
    n = lanes or 1
    chain = {(a, b) for a, b in zip(group, group[1:])}
    assert {(f.src, f.dst) for f in sched.flows} == chain | {(b, a) for a, b in chain}
    assert len(sched.flows) == 2 * (p - 1) * n and sum(f.nbytes for f in sched.flows) == \
        pytest.approx(2 * (p - 1) * size)
    res = run_collective("allreduce", size, topo, algo="dbtree", protocol="raw",
                         ranks=f"0-{p - 1}", channels=lanes)
    rate = 50e9 if p == 2 else 25e9
    assert res.time_s == pytest.approx(2 * (p - 1) * 1 * US + size / rate, rel=1e-9)


@pytest.mark.parametrize("size", [8.0, 2.0**20, 2.0**26])
def test_tree_on_one_a100_node_has_nccls_latency_and_ll128_fraction(size):
    # baseLat[Tree][LL128] 14 us + 2(ppn-1) hops x hwLat[NVLink][Tree][LL128] 1.25 us (above the
    # 0.5 us GPU-NVSwitch-GPU route); bytes at 7/9 x .92 of the flows' share of the 230 GB/s
    # GPU links (two flows each); no call overhead inside a host
    link = load_topology("dgx-a100").graph.edges["n0.gpu3", "n0.nvsw"]
    share = link["bw"] * link["efficiency"] / 2
    res = run_collective("allreduce", size, "dgx-a100", algo="dbtree", protocol="LL128")
    expect = 14 * US + 14 * 1.25 * US + size * (9 / 7 / 0.92) / share
    assert res.time_s == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("spec", ["dgx-a100", "dgx-h100", "dgx-a100:nodes=2"])
def test_auto_runs_the_tree_only_where_nccls_model_ranks_it_first(spec):
    from dessim.collectives.auto import NCCL_TO_DESSIM

    topo = load_topology(spec)
    group = tuple(range(topo.num_gpus))
    system = nccl_system(group, topo)
    for k in range(3, 34, 2):
        size = 2.0**k
        best = min((t, a, pr) for a, pr in allowed("allreduce", system)
                   if (t := algo_time("allreduce", a, pr, size, system)) is not None)
        got = choose(get_op("allreduce"), group, size, topo)
        assert (got.algorithm == "dbtree") == (best[1] == "tree")
        assert (got.algorithm, got.protocol) == (NCCL_TO_DESSIM[best[1]], best[2])


def test_two_node_nvlstree_crosses_the_network_once_per_byte():
    # 2 nodes: every head exchanges its shard once each way, so busbw exceeds 8 NICs' rate
    res = run_collective("allreduce", 2.0**32, "dgx-h100:nodes=2", algo="nvlstree")
    assert res.busbw_GBps > 8 * 47


def test_hierarchical_chunks_pipeline_the_phases():
    topo = "dgx-h100:nodes=4"
    one = run_collective("allreduce", "256MiB", topo, algo="hierarchical", protocol="raw")
    eight = run_collective("allreduce", "256MiB", topo, algo="hierarchical", protocol="raw",
                           chunks=8)
    assert eight.time_s < one.time_s / 1.5


# ------------------------------------------------------------------- per-call overheads
def test_one_thread_driving_g_gpus_pays_g_minus_1_host_issues():
    # an isolated call from a thread driving G GPUs (nccl-tests -g G): its kernels start one
    # host issue (nccl.host_overhead, 5 us: sjeaugey, nccl-tests#123) apart
    topo = "dgx-a100:nodes=1"
    one = run_collective("allreduce", 8, topo, algo="ring")
    for g in (2, 4, 8):
        many = run_collective("allreduce", 8, topo, algo="ring", gpus_per_process=g)
        assert many.time_s - one.time_s == pytest.approx((g - 1) * 5 * US, rel=1e-9)
    # one process per GPU pays NCCL's model alone on one host: baseLat 6.6 + 14 x 0.6 us
    assert one.time_s == pytest.approx((6.6 + 14 * 0.6) * US, rel=1e-3)


def test_nccl_tests_loop_is_host_bound_or_gpu_bound():
    from dessim.collectives.loop import nccl_tests_iteration_time as loop

    call, host = 15 * US, 5 * US
    # host-bound (8 GPUs x 5 us > 15 us): a call every 40 us, the first ends at 35 + 15 us
    assert loop(call, 8, host, 100) == pytest.approx((50 + 99 * 40) / 100 * US, rel=1e-12)
    # GPU-bound (2 x 5 us < 15 us): the launches hide behind the previous call
    assert loop(call, 2, host, 20) == pytest.approx((20 + 19 * 15) / 20 * US, rel=1e-12)
    # one iteration is one isolated call: what run_collective reports with gpus_per_process
    topo = "dgx-a100:nodes=1"
    one = run_collective("allreduce", 8, topo, algo="ring")
    eight = run_collective("allreduce", 8, topo, algo="ring", gpus_per_process=8)
    assert loop(one.time_s, 8, host, 1) == pytest.approx(eight.time_s, rel=1e-12)
    # one GPU per thread (MPI -g 1) and a call longer than its issue: the call's own time
    assert loop(call, 1, host, 40) == call
    for bad in ({"gpus_per_process": 0}, {"iters": 0}, {"host": -1.0}):
        args = {"call": call, "gpus_per_process": 8, "host": host, "iters": 20} | bad
        with pytest.raises(CollectiveError):
            loop(**args)


def test_calls_across_hosts_pay_the_network_call_overhead():
    from dessim.catalog.calibration import Calibration

    cal = Calibration.model_validate({"nccl": {"call_overhead": "1us",
                                               "net_call_overhead": "30us"}})
    base = Calibration.model_validate({"nccl": {"call_overhead": "1us",
                                                "net_call_overhead": "1us"}})
    topo = "dgx-a100:nodes=2"
    for ranks, extra in (("0-7", 0.0), ("0-15", 29 * US)):
        a = run_collective("allreduce", 8, topo, ranks=ranks, calibration=cal)
        b = run_collective("allreduce", 8, topo, ranks=ranks, calibration=base)
        assert a.time_s - b.time_s == pytest.approx(extra, abs=1e-12)


def test_gpus_per_process_is_a_whole_number_of_gpus():
    assert CollectiveSettings(gpus_per_process=8).gpus_per_process == 8
    assert "8 GPUs per process" in CollectiveSettings(gpus_per_process=8).describe()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CollectiveError, match="gpus_per_process"):
            CollectiveSettings(gpus_per_process=bad)


def test_the_tree_runs_at_nccls_own_tree_efficiency():
    from dessim.collectives.nccl.tuning import AMPERE, HOPPER, tree_efficiency
    from dessim.collectives.protocols import Protocol, wire_factor

    simple, ll, ll128, raw = (Protocol(n) for n in ("Simple", "LL", "LL128", "raw"))
    # ncclTopoTuneModel: all-reduce busBw * .92, x 0.85 on sm90, LL / 3.8, LL128 120/128 across nodes
    assert wire_factor(simple, "dbtree", "allreduce", AMPERE, 4) == pytest.approx(1 / 0.92)
    assert wire_factor(simple, "dbtree", "allreduce", HOPPER, 4) == pytest.approx(1 / (0.92 * 0.85))
    assert wire_factor(ll, "dbtree", "allreduce", AMPERE, 4) == pytest.approx(3.8 / 0.92)
    assert wire_factor(ll128, "dbtree", "allreduce", AMPERE, 4) == pytest.approx(128 / 120 / 0.92)
    assert wire_factor(ll128, "dbtree", "allreduce", AMPERE, 1) == pytest.approx(9 / 7 / 0.92)
    assert tree_efficiency("allreduce", "Simple", HOPPER, 5) == pytest.approx(0.782)
    # other algorithms keep the protocol's framing; the textbook model has none
    assert wire_factor(ll, "ring", "allreduce", HOPPER, 4) == 2.0
    assert wire_factor(raw, "dbtree", "allreduce", HOPPER, 4) == 1.0
    # on idle links the simulated Tree's bandwidth term shrinks by exactly that factor
    topo = "dgx-h100:nodes=4"
    big = [run_collective("allreduce", s, topo, algo="dbtree", protocol="simple").time_s
           for s in (2**30, 2**31)]
    raw_big = [run_collective("allreduce", s, topo, algo="dbtree", protocol="raw").time_s
               for s in (2**30, 2**31)]
    assert (big[1] - big[0]) / (raw_big[1] - raw_big[0]) == pytest.approx(1 / (0.92 * 0.85), rel=1e-6)


# --------------------------------------------------------------------- published figures
@pytest.fixture(scope="module")
def validation():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import validate_collectives

    return validate_collectives


# All four are nccl-tests -g 8 tables, timed as nccl-tests' unsynchronised loop times them
# (dessim.collectives.loop): host-bound at small sizes, 8 x nccl.host_overhead.
@pytest.mark.parametrize("dataset", ["together_h100_1n_allreduce_ring",
                                     "together_h100_1n_allreduce_nvls",
                                     "together_h100_1n_allgather_ring",
                                     "azure_ND_A100_v4_allreduce"])
def test_single_node_curves_match_nccl_tests(validation, dataset):
    import pandas as pd

    curves = pd.read_csv(validation.ROOT / "validation" / "nccl_tests_curves.csv")
    r = validation.validate_dataset(dataset, curves[curves.dataset == dataset], quick=True)
    assert r["gpus_per_process"] == 8                     # all run with nccl-tests -g 8
    assert r["iters"] == (40 if dataset.startswith("azure") else 20)   # -n 40, default 20
    assert abs(r["plateau_err"]) <= 0.10                  # plateau within 10 %
    assert abs(r["lat_err"]) <= 0.25                      # small-message latency within 25 %


# NVLS all-reduce on one node, every published size: the knee within 2x (issue 16's target)
# and the busbw within 12 % on average, with NVLS's pipeline fill (docs/collectives.md).
@pytest.mark.parametrize("dataset", ["azure_ND_H100_v5_allreduce", "azure_ND_H200_v5_allreduce",
                                     "together_h100_1n_allreduce_nvls",
                                     "xxrjun_h100_1n_all_reduce_perf"])
def test_nvls_curves_have_the_measured_knee(validation, dataset):
    import pandas as pd

    curves = pd.read_csv(validation.ROOT / "validation" / "nccl_tests_curves.csv")
    r = validation.validate_dataset(dataset, curves[curves.dataset == dataset], quick=False)
    assert "nvls/Simple" in r["choices"]
    assert r["mape_busbw"] <= 0.12
    if "knee_ratio" in r:                                 # xxrjun's table starts at 1 MiB
        assert 0.5 <= r["knee_ratio"] <= 2.0


def test_multi_node_plateaus_match_published_figures(validation):
    import pandas as pd

    points = pd.read_csv(validation.ROOT / "validation" / "nccl_tests_points.csv")
    keep = ["h100_ndr_ring_per_nic", "dgxa100_8hdr_ring", "a100_4hdr_2node", "a100_4hdr_3node",
            "a100_8gpu_plateau", "h100_8gpu_ring_plateau", "h100_8gpu_nvls_plateau",
            "a100_8gpu_ring_1ch_8B", "a100_2gpu_ring_1ch_8B", "a100_4gpu_ring_1ch_8B",
            "h100_4x400roce_5node_ring", "h100_4x400roce_5node_tree", "h800_8gpu_nvls_plateau"]
    for p in validation.validate_points(points[points.id.isin(keep)]):
        limit = 0.25 if p["metric"] == "time_us" else 0.10
        assert abs(p["error"]) <= limit, p
