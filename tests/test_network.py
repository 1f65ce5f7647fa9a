"""Flow-level and analytical network models: closed forms, golden values, sharing rules, errors."""

from __future__ import annotations

import pytest
import simpy

from dessim.errors import NetworkError
from dessim.network import (NETWORK_MODELS, AnalyticalNetwork, FlowNetwork, Network, make_network,
                            simulate_transfers)
from test_network_graphs import dumbbell, leafspine, ring, topo


def run_one(net_cls, topology, src, dst, nbytes, start=0.0):
    env = simpy.Environment()
    net = net_cls(env, topology)
    out = {}

    def proc():
        yield env.timeout(start)
        out["t"] = yield net.transfer(src, dst, nbytes)
        out["now"] = env.now
    env.process(proc())
    env.run()
    assert out["t"] == out["now"]
    return out["t"], net


def closed_form(topology, path, nbytes, start=0.0):
    links = [topology.link(a, b) for a, b in zip(path, path[1:])]
    return start + sum(l.lat for l in links) + nbytes / min(l.capacity for l in links)


# ---------------------------------------------------------------- lone messages
CHAIN = topo([("g0", "s0", 25e9, 1e-6), ("s0", "s1", 12.5e9, 2.5e-6, {"efficiency": 0.8}),
              ("s1", "g1", 50e9, 0.5e-6)], ["g0", "g1"], switches=["s0", "s1"], name="chain")


@pytest.mark.parametrize("model", [FlowNetwork, AnalyticalNetwork])
@pytest.mark.parametrize("topology,src,dst,path", [
    (CHAIN, "g0", "g1", ("g0", "s0", "s1", "g1")),
    (CHAIN, 1, 0, ("g1", "s1", "s0", "g0")),
    (dumbbell(), "A1", "B", ("A1", "s1", "s2", "B")),
    (ring(8, 1e9, 10e-6), "g0", "g3", ("g0", "g1", "g2", "g3")),
])
@pytest.mark.parametrize("nbytes", [0, 1, 4096, 10e6, 3.3e9])
@pytest.mark.parametrize("start", [0.0, 0.123])
def test_lone_message_takes_latency_plus_size_over_bottleneck(model, topology, src, dst, path,
                                                              nbytes, start):
    t, net = run_one(model, topology, src, dst, nbytes, start)
    assert net.route(topology.resolve(src), topology.resolve(dst)).path == path
    # Exact up to float rounding (a few ulps: the simulator adds the delays in its own order).
    assert t == pytest.approx(closed_form(topology, path, nbytes, start), rel=1e-15, abs=0)


def test_local_copy_finishes_immediately():
    t, net = run_one(FlowNetwork, CHAIN, "g0", 0, 1e9, start=2.0)
    assert t == 2.0
    assert sum(net.link_bytes().values()) == 0


# ---------------------------------------------------------------- sharing
def test_n_and_2n_bytes_on_one_bottleneck_finish_at_2n_and_3n_over_b():
    b, lat, n = 1e9, 5e-6, 1e8
    t = topo([("a0", "s", 100e9, lat), ("a1", "s", 100e9, 0.0), ("s", "z", b, 0.0)],
             ["a0", "a1", "z"], switches=["s"])
    # Pad a1's route latency so both join sharing at the same instant.
    t.graph.edges["a1", "s"]["lat"] = lat
    res = simulate_transfers(t, [("a0", "z", n, 0), ("a1", "z", 2 * n, 0)])
    assert res.finish_times == pytest.approx([lat + 2 * n / b, lat + 3 * n / b], rel=1e-12)


def test_simgrid_dumbbell_golden_values():
    # "SimGrid golden values" (docs/references.md): SimGrid CM02 without cross traffic = hand max-min.
    res = simulate_transfers(dumbbell(), [("A1", "B", 100e6, 0), ("A2", "B", 100e6, 0),
                                          ("A3", "B", 50e6, 0)])
    a1, a2, a3 = res.finish_times
    assert round(a3, 6) == 0.133343
    assert round(a2, 6) == 0.200010
    assert round(a1, 6) == 0.400010
    # Exact hand values: phase rates 0.25/0.375/0.375 GB/s, then 0.25/0.75, then A1 alone.
    assert a3 == pytest.approx(10e-6 + 50e6 / 375e6, rel=1e-12)
    assert a2 == pytest.approx(10e-6 + 0.2, rel=1e-12)
    assert a1 == pytest.approx(10e-6 + 0.4, rel=1e-12)


def test_eight_host_ring_allreduce_matches_alpha_beta():
    # "SimGrid golden values": 8 hosts, 1 GB/s, 10 us, D = 80 MB, 2(N-1) steps of D/N -> 0.140140 s.
    n, d, alpha, beta = 8, 80e6, 10e-6, 1e9
    env = simpy.Environment()
    net = FlowNetwork(env, ring(n, beta, alpha))
    arrived = {(i, s): env.event() for i in range(n) for s in range(2 * (n - 1))}
    finish = []

    def host(i):
        for s in range(2 * (n - 1)):
            sent = net.transfer(i, (i + 1) % n, d / n, key=s)
            sent.callbacks.append(lambda ev, i=i, s=s: arrived[((i + 1) % n, s)].succeed())
            yield sent & arrived[(i, s)]
        finish.append(env.now)

    for i in range(n):
        env.process(host(i))
    env.run()
    assert max(finish) == pytest.approx(2 * (n - 1) * (alpha + d / (n * beta)), rel=1e-12)
    assert round(max(finish), 6) == 0.140140
    # Each step's 8 flows start together and are batched into one solve (+1 after they end).
    assert net.solves == 2 * (n - 1) * 2


def test_half_duplex_link_is_shared_by_both_directions():
    b, n = 1e9, 1e8
    half = topo([("a", "b", b, 0.0, {"duplex": False})], ["a", "b"])
    full = topo([("a", "b", b, 0.0)], ["a", "b"])
    both = [("a", "b", n, 0), ("b", "a", n, 0)]
    assert simulate_transfers(half, both).finish_times == pytest.approx([2 * n / b, 2 * n / b])
    assert simulate_transfers(full, both).finish_times == pytest.approx([n / b, n / b])
    lb = simulate_transfers(half, both).link_bytes
    assert lb == {("a", "b"): n, ("b", "a"): n}


def test_late_joiner_slows_the_running_flow_down():
    # 1 GB/s link, flow A 1 GB from 0; flow B 0.25 GB from 0.5 s: share 0.5 s..1.0 s, then A alone.
    t = topo([("a", "b", 1e9, 0.0)], ["a", "b"])
    res = simulate_transfers(t, [("a", "b", "1GB", 0), ("a", "b", "250MB", "500ms")])
    assert res.finish_times == pytest.approx([1.25, 1.0], rel=1e-12)
    assert res.makespan == pytest.approx(1.25)


def test_transfers_never_cross_a_non_transit_node():
    t = topo([("g0", "g1", 1e9, 0), ("g1", "g2", 1e9, 0), ("g0", "s", 1e9, 0), ("s", "u", 1e9, 0),
              ("u", "g2", 1e9, 0)], ["g0", "g1", "g2"], switches=["s", "u"], transit={"g1": False})
    res = simulate_transfers(t, [("g0", "g2", 1e6, 0), ("g2", "g0", 1e6, 0)])
    assert res.link_bytes[("g0", "g1")] == res.link_bytes[("g1", "g2")] == 0
    assert res.link_bytes[("g0", "s")] == res.link_bytes[("u", "s")] == 1e6


def test_ecmp_spreads_parallel_flows_and_is_deterministic():
    t = leafspine(4, 2, 4)
    flows = [(f"h{i}", f"h{4 + i}", 1e8, 0) for i in range(4)] * 4
    first = simulate_transfers(t, flows)
    used = {s for s in range(4) if first.link_bytes[("leaf0", f"spine{s}")] > 0}
    assert len(used) >= 3
    again = simulate_transfers(t, flows)
    assert again.finish_times == first.finish_times and again.link_bytes == first.link_bytes


# ---------------------------------------------------------------- accounting and recording
def test_link_bytes_count_partial_progress():
    env = simpy.Environment()
    net = FlowNetwork(env, topo([("a", "b", 1e9, 0.0)], ["a", "b"]))
    net.transfer("a", "b", 1e9)
    env.run(until=0.25)
    assert net.link_bytes()[("a", "b")] == pytest.approx(0.25e9)
    env.run()
    assert net.link_bytes()[("a", "b")] == 1e9


def test_counters_and_utilisation_record():
    env = simpy.Environment()
    net = FlowNetwork(env, dumbbell(), record_links=True)
    for src, n in (("A1", 100e6), ("A2", 100e6), ("A3", 50e6)):
        net.transfer(src, "B", n)
    env.run()
    assert (net.flows_started, net.flows_finished) == (3, 3)
    assert net.events == 3 + 3 + net.solves
    shared = [(t, u) for t, ab, u in net.utilisation if ab == ("s1", "s2")]
    assert shared[0] == (pytest.approx(10e-6), pytest.approx(1.0))
    assert shared[-1][1] == 0.0
    a1 = [u for _, ab, u in net.utilisation if ab == ("A1", "s1")]
    assert a1 == [1.0, 0.0]  # A1 is limited by its own access link throughout


def test_analytical_model_ignores_sharing():
    res = simulate_transfers(dumbbell(), [("A2", "B", 100e6, 0), ("A3", "B", 100e6, 0)],
                             network="analytical")
    assert res.finish_times == pytest.approx([10e-6 + 0.1] * 2)
    assert res.link_bytes[("s1", "s2")] == 200e6


def test_simulate_transfers_frame_and_ranks():
    res = simulate_transfers(ring(4, 1e9, 0.0), [(0, 1, "1MB", 0), (2, "g2", 5, "1us")])
    df = res.to_frame()
    assert list(df.columns) == ["src", "dst", "bytes", "start_s", "finish_s", "duration_s", "rate_Bps"]
    assert df["src"].tolist() == ["g0", "g2"]
    assert df["finish_s"].tolist() == res.finish_times == [1e-3, 1e-6]
    assert res.events > 0 and res.wall_s >= 0


# ---------------------------------------------------------------- registry and errors
def test_registry_and_factory():
    assert NETWORK_MODELS == {"flow": FlowNetwork, "analytical": AnalyticalNetwork}
    net = make_network("analytical", simpy.Environment(), ring(4, 1e9, 0))
    assert isinstance(net, Network) and isinstance(net, AnalyticalNetwork)


def test_unknown_model_lists_valid_names():
    with pytest.raises(NetworkError, match=r"'packet'.*analytical, flow"):
        make_network("packet", simpy.Environment(), ring(4, 1e9, 0))


@pytest.mark.parametrize("src,dst,match", [("g0", "gpu9", "gpu9"), (7, 0, "rank 7"), ("g0", None, "None")])
def test_unknown_endpoint_is_named(src, dst, match):
    net = FlowNetwork(simpy.Environment(), ring(4, 1e9, 0))
    with pytest.raises(NetworkError, match=match):
        net.transfer(src, dst, 10)


@pytest.mark.parametrize("size", [-1, float("nan"), float("inf"), "1MB", True])
def test_bad_size_is_named(size):
    net = FlowNetwork(simpy.Environment(), ring(4, 1e9, 0))
    with pytest.raises(NetworkError, match="size"):
        net.transfer(0, 1, size)


def test_simulate_transfers_names_the_bad_transfer():
    with pytest.raises(NetworkError, match=r"transfer #1.*-5"):
        simulate_transfers(ring(4, 1e9, 0), [(0, 1, 10, 0), (1, 2, -5, 0)])
    with pytest.raises(NetworkError, match=r"transfer #0.*'x'"):
        simulate_transfers(ring(4, 1e9, 0), [("x", 1, 10, 0)])
    with pytest.raises(NetworkError, match=r"transfer #0.*expected"):
        simulate_transfers(ring(4, 1e9, 0), [(0, 1, 10)])
