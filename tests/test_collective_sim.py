"""Collectives simulated on the network models: textbook costs on idle networks, congestion,
qualitative behaviour, executor semantics (arrivals, reductions, per-rank times).

Everything here runs with ``protocol="raw"``, the textbook model (no NCCL protocol latency
or framing): the closed forms hold exactly. NCCL's protocols: tests/test_nccl_collectives.py.

Closed forms (short names of docs/references.md): Thakur et al. 2005 (Thakur–Rabenseifner–
Gropp), "Pipelined chain and tree", nccl-tests PERFORMANCE.md (busbw). α is a path's latency
(ring/fully connected: 1 link = lat; switch: 2 links = 2·lat), β = 1/bw per direction.
"""

from __future__ import annotations

import math

import pytest
import simpy

from dessim.collectives import (ALGORITHMS, build_schedule, get_op, run_collective,
                                run_schedule)
from dessim.network import make_network
from dessim.topology.builders import fully_connected, leafspine, ring, switch
from dessim.topology.presets import dgx_h100

BW = 50e9        # bytes/s per direction
LAT = 500e-9     # s per link
S = float(1 << 28)
REL = 1e-3       # "within 0.1 %"


def lg(p: int) -> int:
    return p.bit_length() - 1


def raw_collective(op, size, topo, **kw):
    """run_collective with the textbook model (protocol raw)."""
    return run_collective(op, size, topo, protocol="raw", **kw)


def sim(op, algo, topo, size=S, **kw) -> float:
    return raw_collective(op, size, topo, algo=algo, **kw).time_s


# --------------------------------------------------------------------------- textbook costs
@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("builder,alpha", [(ring, LAT), (switch, 2 * LAT)])
def test_ring_allreduce_reducescatter_allgather_match_alpha_beta(p, builder, alpha):
    topo = builder(p, BW, LAT)
    beta = 1 / BW
    # §2.1: allreduce 2(p-1)α + 2n(p-1)/p β ; RS and AG (n = whole array) (p-1)α + n(p-1)/p β
    assert sim("allreduce", "ring", topo) == pytest.approx(
        2 * (p - 1) * alpha + 2 * S * (p - 1) / p * beta, rel=REL)
    for op in ("reducescatter", "allgather"):
        assert sim(op, "ring", topo) == pytest.approx(
            (p - 1) * alpha + S * (p - 1) / p * beta, rel=REL)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_halving_doubling_allreduce_on_switch_power_of_two(p):
    # §2.1 Rabenseifner: 2 lg p α + 2n(p-1)/p β
    expected = 2 * lg(p) * 2 * LAT + 2 * S * (p - 1) / p / BW
    assert sim("allreduce", "hd", switch(p, BW, LAT)) == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("p", [6, 12])
def test_halving_doubling_allreduce_on_switch_non_power_of_two(p):
    # §2.1 non-pow2: (2⌊lg p⌋+2)α + (2(p'-1)/p' + 2)nβ with p' = 2^⌊lg p⌋ the core ranks
    # (MPICH's comment writes (p-1)/p, which is exact only when p' = p).
    q = 1 << lg(p)
    expected = (2 * lg(p) + 2) * 2 * LAT + (2 * (q - 1) / q + 2) * S / BW
    assert sim("allreduce", "hd", switch(p, BW, LAT)) == pytest.approx(expected, rel=REL)


def test_direct_allgather_fully_connected_uses_every_pair_link():
    p = 8
    # one step; each pair has its own link: α + (n/p)β
    assert sim("allgather", "direct", fully_connected(p, BW, LAT)) == pytest.approx(
        LAT + S / p / BW, rel=REL)


def test_direct_allgather_on_switch_is_limited_by_injection_link():
    p = 8
    # each GPU pushes p-1 blocks of n/p through its single uplink: 2 lat + (p-1)/p · n / bw
    assert sim("allgather", "direct", switch(p, BW, LAT)) == pytest.approx(
        2 * LAT + (p - 1) / p * S / BW, rel=REL)


def test_pairwise_alltoall_on_switch():
    p = 8   # §2.1: (p-1)α + nβ with n = bytes a rank sends = (p-1)/p of its buffer
    assert sim("alltoall", "pairwise", switch(p, BW, LAT)) == pytest.approx(
        (p - 1) * 2 * LAT + (p - 1) / p * S / BW, rel=REL)


@pytest.mark.parametrize("k", [1, 8])
def test_chunked_chain_broadcast_on_ring(k):
    p = 8   # §2.3: (p - 2 + k)(α + (n/k)β)
    assert sim("broadcast", "ring", ring(p, BW, LAT), chunks=k) == pytest.approx(
        (p - 2 + k) * (LAT + S / k / BW), rel=REL)


def test_reduction_cost_adds_the_gamma_term():
    p, gamma_bw = 8, 100e9   # §2.1 ring allreduce + n(p-1)/p γ
    expected = 2 * (p - 1) * LAT + 2 * S * (p - 1) / p / BW + S * (p - 1) / p / gamma_bw
    assert sim("allreduce", "ring", ring(p, BW, LAT), reduction_bw="100GB/s") == pytest.approx(
        expected, rel=REL)


def test_two_bidirectional_ring_channels_halve_the_bandwidth_term():
    p = 8
    expected = 2 * (p - 1) * LAT + S * (p - 1) / p / BW   # both directions carry half
    assert sim("allreduce", "ring", ring(p, BW, LAT), channels=2) == pytest.approx(
        expected, rel=REL)


# --------------------------------------------------------------------------- congestion
def test_halving_doubling_on_physical_ring_is_slower_than_on_switch():
    p = 8
    on_ring = raw_collective("allreduce", S, ring(p, BW, LAT), algo="hd")
    on_switch = raw_collective("allreduce", S, switch(p, BW, LAT), algo="hd")
    assert on_ring.time_s > 1.5 * on_switch.time_s
    # First halving step: 8 flows of n/2 to the rank 4 hops away. 8 flows x 4 hops = 32
    # channel-loads on the ring's 16 directed channels, so the busiest carries >= 2 flows:
    # the step takes >= 4 lat + (n/2)/(bw/2). On the switch: 2 lat + (n/2)/bw.
    first_ring = max(on_ring.run.transfer_finish[i] for i in range(p))
    first_switch = max(on_switch.run.transfer_finish[i] for i in range(p))
    assert first_switch == pytest.approx(2 * LAT + S / 2 / BW, rel=REL)
    assert first_ring >= (4 * LAT + S / BW) * (1 - 1e-9)


def test_disjoint_allreduces_sharing_an_oversubscribed_uplink_slow_each_other():
    # 2 leaves x 2 hosts, 2:1 oversubscribed: one spine, each leaf uplink = bw.
    topo = leafspine(4, 2, BW, LAT, oversub=2.0)
    groups = [(0, 2), (1, 3)]          # each group spans both leaves
    path_lat = 4 * LAT                 # gpu-leaf-spine-leaf-gpu

    def together(gs):
        env = simpy.Environment()
        net = make_network("flow", env, topo)
        runs = [run_schedule(net, build_schedule("allreduce", "ring", g, S), key_base=1000 * k)
                for k, g in enumerate(gs)]
        env.run()
        return [r.finish_time for r in runs]

    alone = together(groups[:1])[0]
    # p = 2 ring allreduce: RS step + AG step of n/2 each
    assert alone == pytest.approx(2 * (path_lat + S / 2 / BW), rel=REL)
    both = together(groups)
    # both groups' flows cross each leaf->spine uplink: each gets bw/2
    for t in both:
        assert t == pytest.approx(2 * (path_lat + S / 2 / (BW / 2)), rel=REL)


# --------------------------------------------------------------------------- qualitative
def test_tree_beats_ring_for_small_messages_at_many_ranks():
    topo = switch(64, BW, LAT)
    assert sim("allreduce", "tree", topo, size=1024) < sim("allreduce", "ring", topo, size=1024) / 3


def test_ring_reaches_the_bandwidth_bound_for_large_messages():
    res = raw_collective("allreduce", 4 * 2**30, switch(8, BW, LAT), algo="ring")
    assert res.busbw_GBps == pytest.approx(BW / 1e9, rel=1e-3)
    assert res.busbw_GBps <= BW / 1e9
    assert res.link_util_max == pytest.approx(1.0, rel=1e-3)


def test_rail_aligned_rings_and_pipelined_hierarchy_on_multi_node_dgx():
    topo = dgx_h100(4)                 # NVLink 450 GB/s in node, 400 Gb/s NICs across
    one = raw_collective("allreduce", "256MiB", topo, algo="ring", channels=1)
    rails = raw_collective("allreduce", "256MiB", topo, algo="ring")      # one lane per rail
    assert rails.channels == 8 and rails.time_s < one.time_s / 5
    # hierarchical phases run one after another; chunks pipeline them (NICs stay busy)
    flat_phases = raw_collective("allreduce", "256MiB", topo, algo="hierarchical")
    piped = raw_collective("allreduce", "256MiB", topo, algo="hierarchical", chunks=8)
    assert piped.time_s < flat_phases.time_s / 1.5
    assert piped.time_s < 1.1 * rails.time_s


# --------------------------------------------------------------------------- every algorithm runs
def _runnable():
    for name, alg in ALGORITHMS.items():
        if name in ("nvls", "nvlstree", "collnet", "collnetdirect"):
            continue    # need an NVSwitch or SHARP: tests/test_nccl_collectives.py, test_collnet.py
        for op in sorted(alg.ops):
            for p in ([2] if op == "sendrecv" else [3, 5, 8]):
                yield name, op, p


@pytest.mark.parametrize("algo,op,p", list(_runnable()))
def test_every_algorithm_completes_within_the_bandwidth_bound(algo, op, p):
    topo = switch(p, BW, LAT)
    res = raw_collective(op, 1 << 20, topo, algo=algo, chunks=2, channels=2)
    assert res.time_s > 0 and res.events > 0 and res.transfers > 0
    # busbw is normalised so that no algorithm can beat the per-rank link bandwidth (§2.4)
    assert res.busbw_GBps <= BW / 1e9 * (1 + 1e-9)
    finish = res.run.transfer_finish
    assert all(not math.isnan(t) for t in finish)
    assert max(res.run.rank_finish.values()) == pytest.approx(res.time_s)


# --------------------------------------------------------------------------- executor semantics
def test_arrivals_delay_only_what_needs_the_late_rank():
    topo = ring(4, BW, LAT)
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    hop = LAT + S / BW
    late = 3 * hop
    sched = build_schedule("broadcast", "ring", range(4), S)        # chain 0->1->2->3
    run = run_schedule(net, sched, arrivals={2: env.timeout(late)})
    env.run(run.done)
    assert run.transfer_finish[0] == pytest.approx(hop, rel=REL)        # 0->1 not delayed
    assert run.transfer_start[1] == pytest.approx(late)                  # 1->2 waits for rank 2
    assert run.rank_finish[1] == pytest.approx(late + hop, rel=REL)      # its send ends its part
    assert run.finish_time == pytest.approx(late + 2 * hop, rel=REL)


def test_per_rank_completion_follows_the_chain():
    run = raw_collective("broadcast", S, ring(5, BW, LAT), algo="ring").run
    hop = LAT + S / BW
    # a rank's part ends with its last transfer: its forward to the next rank of the chain
    expected = {0: hop, 1: 2 * hop, 2: 3 * hop, 3: 4 * hop, 4: 4 * hop}
    for r, t in expected.items():
        assert run.rank_finish[r] == pytest.approx(t, rel=REL)


def test_schedule_starts_at_env_now_and_keys_are_distinct():
    topo = switch(4, BW, LAT)
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    env.run(until=1.0)
    run = run_schedule(net, build_schedule("allgather", "ring", range(4), S))
    env.run(run.done)
    assert run.start_time == 1.0
    assert run.duration == pytest.approx(3 * 2 * LAT + 3 / 4 * S / BW, rel=REL)


def test_analytical_network_gives_the_same_idle_ring_time():
    topo = switch(8, BW, LAT)
    assert sim("allreduce", "ring", topo, network="analytical") == pytest.approx(
        sim("allreduce", "ring", topo), rel=1e-9)


def test_results_are_deterministic():
    topo = leafspine(8, 2, BW, LAT, oversub=2.0)
    a = raw_collective("allreduce", S, topo, algo="hd").run
    b = raw_collective("allreduce", S, topo, algo="hd").run
    assert list(a.transfer_finish) == list(b.transfer_finish)


def test_busbw_uses_op_factor():
    res = raw_collective("allgather", S, switch(8, BW, LAT), algo="ring")
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * get_op("allgather").busbw_factor(8))
