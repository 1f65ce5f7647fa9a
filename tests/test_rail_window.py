"""Windowed connections (:mod:`dessim.collectives.executor`, "Windowed connections"; the rail
all-to-all's ``window`` option, DeepEP's in-flight RDMA chunks): on an idle network the
replay equals the hand-computed arrival times of a pipelined connection whose messages'
bytes follow each other but whose latencies overlap, up to ``window`` messages in flight."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.collectives import build_schedule, run_collective, run_schedule
from dessim.errors import CollectiveError
from dessim.network import make_network
from dessim.topology import load_topology
from dessim.workload.transformer.deepep import (DEEPEP_PIPELINE_CHUNKS, deepep_pipeline_chunks,
                                                deepep_rail_options, deepep_window)
from dessim.workload.transformer.routing import MoERouting

TOPO2 = load_topology("dgx-h100:nodes=2")
PAIR = (0, 8)                       # one GPU on each host, same rail: the network phase only


def _replay(group, size: float, **options) -> tuple[float, float, float]:
    """(finish time, route latency, bottleneck) of the rail all-to-all on an idle flow network
    with the raw protocol (no software latency)."""
    env = simpy.Environment()
    net = make_network("flow", env, TOPO2)
    sched = build_schedule("alltoall", "rail", group, size, topology=TOPO2, **options)
    run = run_schedule(net, sched)
    env.run()
    route = net.route(TOPO2.resolve(PAIR[0]), TOPO2.resolve(PAIR[1]))
    return run.finish_time, route.latency, route.bottleneck


def _pipelined(k: int, w: int, lat: float, tau: float) -> float:
    """Arrival of the last of ``k`` messages of ``tau`` seconds each on one connection of
    latency ``lat`` keeping ``w`` in flight: ``f_c = max(f_{c-1}, i_c + lat) + tau``, issued at
    ``i_c = f_{c-w}`` (0 for c < w)."""
    f: list[float] = []
    for c in range(k):
        issue = f[c - w] if c >= w else 0.0
        f.append(max(f[-1] if f else -math.inf, issue + lat) + tau)
    return f[-1]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_closed_forms_of_the_two_limits(k):
    """W = 1: each message pays the latency after the previous arrives, ``K·(L + τ)``; W >= K:
    the latency once, ``L + K·τ`` (each direction of the pair is its own connection)."""
    size = 4e6                                       # 2 MB each way, K messages of 2/K MB
    serial, lat, bw = _replay(PAIR, size, pipeline_chunks=k)
    tau = size / 2 / k / bw
    assert serial == pytest.approx(k * (lat + tau), rel=1e-12)
    windowed, _, _ = _replay(PAIR, size, pipeline_chunks=k, window=k)
    assert windowed == pytest.approx(lat + k * tau, rel=1e-12)
    assert _replay(PAIR, size, pipeline_chunks=k, window=k + 5)[0] == windowed


def test_a_small_window_waits_for_a_free_slot():
    """K = 6 messages of τ = L/3 (the latency is three messages long) with W = 2: message
    c >= 2 is issued when message c - 2 arrives and pays the full latency again:
    f = L + τ, L + 2τ, 2L + 2τ, 2L + 3τ, 3L + 3τ, 3L + 4τ."""
    _, lat, bw = _replay(PAIR, 1e3)
    tau = lat / 3
    size = 2 * 6 * tau * bw
    got, _, _ = _replay(PAIR, size, pipeline_chunks=6, window=2)
    assert got == pytest.approx(3 * lat + 4 * tau, rel=1e-9)
    assert got == pytest.approx(_pipelined(6, 2, lat, tau), rel=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 12), w=st.integers(1, 16), size=st.floats(1e3, 5e7))
def test_replay_matches_the_recurrence(k, w, size):
    """Any K, W and size: the replay's finish is the pipelined connection's last arrival."""
    got, lat, bw = _replay(PAIR, size, pipeline_chunks=k, window=w)
    assert got == pytest.approx(_pipelined(k, w, lat, size / 2 / k / bw), rel=1e-12)


@pytest.mark.parametrize("first", [False, True])
def test_window_one_is_the_fifo_chain_and_wider_windows_are_never_slower(first):
    """On 2 hosts × 8 GPUs with both phases: ``window=1`` is the replay without the option
    (bit for bit), and the time never grows with the window."""
    group = tuple(range(16))
    opts = {"pipeline_chunks": 6, "nvlink_first": first, "network_share": 0.6, "nvlink_share": 0.8}
    plain = _replay(group, 32e6, **opts)[0]
    assert _replay(group, 32e6, window=1, **opts)[0] == plain
    times = [_replay(group, 32e6, window=w, **opts)[0] for w in (1, 2, 3, 6)]
    assert all(b <= a for a, b in zip(times, times[1:]))
    assert times[-1] < plain


def test_window_pays_the_software_latency_once_with_nccl_protocols():
    """With the Simple protocol's step latency (run_collective's default): K = 4 chunks with
    W = 4 take what one chunk of all the bytes takes — the step latency once, the bytes
    back to back."""
    one = run_collective("alltoall", 4e6, TOPO2, algo="rail", ranks=list(PAIR))
    four = run_collective("alltoall", 4e6, TOPO2, algo="rail", ranks=list(PAIR),
                          pipeline_chunks=4, window=4)
    serial = run_collective("alltoall", 4e6, TOPO2, algo="rail", ranks=list(PAIR), pipeline_chunks=4)
    assert four.time_s == pytest.approx(one.time_s, rel=1e-12)
    assert serial.time_s > one.time_s


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_window_is_one_clear_error(bad):
    with pytest.raises(CollectiveError, match="window="):
        build_schedule("alltoall", "rail", PAIR, 1e6, topology=TOPO2, window=bad)


def test_network_transfer_pays_the_latency_it_is_given():
    """``Network.transfer(latency=x)``: ``x`` (clamped to [0, route latency]) before the bytes."""
    for kind in ("flow", "analytical"):
        times = []
        for head in (None, 0.0, 1e-7, -1.0, 1.0):
            env = simpy.Environment()
            net = make_network(kind, env, TOPO2)
            ev = net.transfer(0, 8, 1e6, latency=head)
            env.run()
            times.append(ev.value)
        route = make_network(kind, simpy.Environment(), TOPO2).route(TOPO2.resolve(0), TOPO2.resolve(8))
        rest = 1e6 / route.bottleneck
        full, zero, some, neg, big = times
        assert full == pytest.approx(route.latency + rest, rel=1e-12)
        assert zero == neg == pytest.approx(rest, rel=1e-12)
        assert some == pytest.approx(min(1e-7, route.latency) + rest, rel=1e-12)
        assert big == full


def test_deepep_windows_and_chunks_from_its_configs():
    """``align_up(128, send) / send`` chunks in flight (deepseek-ai/DeepEP @567632dd
    ``get_dispatch_config`` / ``get_combine_config``, ``csrc/config.hpp``); DeepSeek-V3's 4,096
    tokens over EP 64, a node hit by 45.4 % of them: 409.6 · 0.454 / 8 = 23.2 -> 24 chunks of
    DeepEP's, capped at DEEPEP_PIPELINE_CHUNKS = 8 (replay cost)."""
    assert [deepep_window(r, False) for r in (8, 16, 32, 64, 128, 256)] == [22, 7, 16, 16, 11, 11]
    assert [deepep_window(r, True) for r in (8, 16, 32, 64, 128, 256)] == [22, 11, 16, 16, 16, 16]
    assert DEEPEP_PIPELINE_CHUNKS == 8 == deepep_pipeline_chunks(4096, 64, 0.454, False)
    assert deepep_pipeline_chunks(4096, 64, 0.454 * 7 / 24, False) == 7
    opts = deepep_rail_options(MoERouting(max_nodes=4), 8, 256, 8, 8, combine=True, tokens=4096)
    assert opts["window"] == 16 and opts["nvlink_first"]
