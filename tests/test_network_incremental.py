"""Incremental max-min solves give the rates of a full solve (FlowNetwork(incremental=...)).

The incremental mode re-rates only the flows whose bottleneck can change and checks the
max-min conditions around them (docs/network.md, "Cost"). Here every solve of an incremental
network is compared with a full water-filling of ALL active flows, and whole runs are compared
with ``incremental=False``. Rates agree up to float rounding (the affected flows are summed in
a different order): 1e-12 relative on rates, 1e-9 on finish times.
"""

from __future__ import annotations

import random

import networkx as nx
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dessim.network.maxmin as maxmin_module
from dessim.network import FlowNetwork
from dessim.network.maxmin import solve_maxmin
from dessim.topology.graph import Topology
from test_maxmin import assert_maxmin
from test_network_graphs import leafspine, topo
from test_network_properties import scenarios

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RATE_REL = 1e-12
TIME_REL = 1e-9


class ComparedFlowNetwork(FlowNetwork):
    """After every solve: every active flow has the rate a full solve of all flows gives."""

    def __init__(self, *args, **kwargs):
        self.solver_calls = 0

        def counting(flows, caps):
            self.solver_calls += 1
            return solve_maxmin(flows, caps)
        super().__init__(*args, solver=counting, **kwargs)
        self.compared = 0

    def _solve(self, now):
        super()._solve(now)
        flows = {fid: f.route.channels for fid, f in sorted(self._active.items())}
        rates = {fid: f.rate for fid, f in self._active.items()}
        full = solve_maxmin(flows, self.channels.capacity)
        for fid, r in full.items():
            assert rates[fid] == pytest.approx(r, rel=RATE_REL, abs=0), f"flow {fid} at t={now}"
        assert_maxmin(flows, self.channels.capacity, rates)
        self.compared += 1


def run(topology, transfers, net_cls=FlowNetwork, **options):
    """Finish times of ``(src, dst, bytes, start)`` transfers, and the network."""
    env = simpy.Environment()
    net = net_cls(env, topology, **options)
    done = [None] * len(transfers)

    def send(i, s, d, n, start):
        yield env.timeout(start)
        done[i] = yield net.transfer(s, d, n, key=i)
    for i, t in enumerate(transfers):
        env.process(send(i, *t))
    env.run()
    assert None not in done
    return done, net


def assert_same_run(topology, transfers, **options):
    inc, net = run(topology, transfers, ComparedFlowNetwork, **options)
    full, ref = run(topology, transfers, incremental=False, **options)
    assert inc == pytest.approx(full, rel=TIME_REL, abs=0)
    assert net.compared == net.solves == ref.solves
    assert ref.incremental_solves == ref.fallback_solves == 0
    return net


def random_leafspine_traffic(seed: int, n: int, hosts: int = 16):
    """Random pairs, sizes and staggered starts; half of them at the same few instants."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = rng.randrange(hosts)
        d = rng.randrange(hosts - 1)
        d += d >= s
        start = rng.choice([0.0, 1e-3, 2e-3]) if rng.random() < 0.5 else rng.uniform(0, 5e-3)
        out.append((s, d, rng.choice([1e5, 1e6, 3e6, 1e7]), start))
    return out


def uneven_leafspine() -> Topology:
    """4 leaves x 4 GPUs, 2 spines; links of different capacities so flows have bottlenecks
    at several levels (access, uplink, spine) and rate changes propagate along chains."""
    rng = random.Random(7)
    g = nx.Graph()
    for s in range(2):
        g.add_node(f"spine{s}", kind="switch")
    rank = 0
    for leaf in range(4):
        g.add_node(f"leaf{leaf}", kind="switch")
        for _ in range(4):
            g.add_node(f"gpu{rank}", kind="gpu", rank=rank)
            g.add_edge(f"gpu{rank}", f"leaf{leaf}", type="x", bw=rng.choice([1e9, 2e9, 4e9]), lat=1e-6)
            rank += 1
        for s in range(2):
            g.add_edge(f"leaf{leaf}", f"spine{s}", type="x", bw=rng.choice([1.5e9, 3e9, 5e9]), lat=1e-6)
    return Topology(g, name="uneven-leafspine")


# ------------------------------------------------------------------ every solve
@SETTINGS
@given(scenarios())
def test_every_incremental_solve_equals_a_full_solve_on_random_graphs(scenario):
    assert_same_run(*scenario)


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_on_an_uneven_leafspine_matches_the_full_solve(seed):
    net = assert_same_run(uneven_leafspine(), random_leafspine_traffic(seed, 60))
    assert net.incremental_solves > 0


def test_the_affected_set_grows_when_a_rate_change_propagates():
    # Across the seeds some solve needs more than one restricted solve: an outside flow lost
    # its bottleneck or held a flow of the affected set down, and joined the set.
    calls = solves = 0
    for seed in range(6):
        _, net = run(uneven_leafspine(), random_leafspine_traffic(seed, 60), ComparedFlowNetwork)
        calls, solves = calls + net.solver_calls, solves + net.solves
    assert calls > solves


def test_freed_capacity_propagates_along_a_chain():
    # a->b (1 GB/s), b->c (1 GB/s), c->d (3 GB/s). "long" a->d and "ab" share a->b (0.5 each);
    # "cd" gets the rest of c->d: 2.5. When "ab" ends, "long" rises to 1 GB/s, which is not
    # on any channel "ab" used: "cd" (outside the first affected set) must drop to 2 GB/s.
    chain = topo([("a", "b", 1e9, 0), ("b", "c", 1e9, 0), ("c", "d", 3e9, 0)], ["a", "b", "c", "d"])
    transfers = [("a", "d", 2e9, 0.0), ("a", "b", 1e8, 0.0), ("c", "d", 1e10, 0.0)]
    inc, net = run(chain, transfers, ComparedFlowNetwork)
    full, _ = run(chain, transfers, incremental=False)
    assert inc == pytest.approx(full, rel=TIME_REL)
    # hand computation: "ab" 1e8 B at 0.5 GB/s ends at 0.2 s; "long" has 1.9e9 B left at
    # 1 GB/s -> 2.1 s; "cd" sent 0.5e9 by 0.2 s, then 2 GB/s until 2.1 s (3.8e9), then 3 GB/s.
    assert inc[1] == pytest.approx(0.2, rel=1e-12)
    assert inc[0] == pytest.approx(2.1, rel=1e-12)
    assert inc[2] == pytest.approx(2.1 + (1e10 - 0.5e9 - 3.8e9) / 3e9, rel=1e-12)


def test_a_new_flow_on_a_saturated_channel_slows_flows_beyond_it():
    # "long" a->d alone gets 1 GB/s; "cd" gets 2 GB/s of c->d. A new flow on b->c halves
    # "long", which frees c->d capacity for "cd" (two channels away from the new flow).
    chain = topo([("a", "b", 4e9, 0), ("b", "c", 1e9, 0), ("c", "d", 3e9, 0)], ["a", "b", "c", "d"])
    transfers = [("a", "d", 1e9, 0.0), ("c", "d", 1e10, 0.0), ("b", "c", 1e8, 0.1)]
    inc, _ = run(chain, transfers, ComparedFlowNetwork)
    full, _ = run(chain, transfers, incremental=False)
    assert inc == pytest.approx(full, rel=TIME_REL)
    assert inc[2] == pytest.approx(0.1 + 1e8 / 0.5e9, rel=1e-12)


def test_falling_back_to_the_full_solve_gives_the_same_times(monkeypatch):
    topology, transfers = uneven_leafspine(), random_leafspine_traffic(3, 60)
    reference, _ = run(topology, transfers, incremental=False)
    monkeypatch.setattr(maxmin_module, "INCREMENTAL_MIN_LIMIT", 0)
    monkeypatch.setattr(maxmin_module, "INCREMENTAL_MAX_FRACTION", 0.0)
    times, net = run(topology, transfers, ComparedFlowNetwork)
    # every solve with a flow to re-rate fell back (the others: the last flows had left)
    assert net.fallback_solves > 0.9 * net.solves
    assert times == reference  # the fallback IS the full solve: identical floats


@pytest.mark.parametrize("bundles", [True, False])
def test_leafspine_with_many_concurrent_flows_and_recorded_utilisation(bundles):
    topology = leafspine(4, 4, 2)
    transfers = random_leafspine_traffic(11, 120)
    assert_same_run(topology, transfers, record_links=not bundles, bundles=bundles)
    _, inc = run(topology, transfers, record_links=True)
    _, full = run(topology, transfers, record_links=True, incremental=False)
    # the same utilisation step function per channel, up to float rounding of the fractions
    for one, other in ((inc, full), (full, inc)):
        for t, ch, used in one.utilisation:
            assert used_at(other.utilisation, ch, t) == pytest.approx(used, abs=1e-9), (t, ch)


def used_at(points, ch, t):
    """Used fraction of channel ``ch`` at time ``t`` from utilisation change points."""
    used = 0.0
    for when, c, u in points:
        if when > t * (1 + 1e-12):
            break
        if c == ch:
            used = u
    return used


# ------------------------------------------------------------------ memos (exact)
def _plain(flows, caps):
    """solve_maxmin under another name: the network's MaxMinSystem keeps no memo."""
    return solve_maxmin(flows, caps)


def repeated(transfers, times: int, period: float):
    """The same transfers again every ``period`` seconds: recurring solves."""
    return [(s, d, n, start + k * period) for k in range(times) for s, d, n, start in transfers]


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_memoised_solves_give_the_floats_of_recomputed_ones(seed, incremental):
    transfers = repeated(random_leafspine_traffic(seed, 30), 4, 1.0)
    memo, net = run(uneven_leafspine(), transfers, incremental=incremental)
    plain, ref = run(uneven_leafspine(), transfers, solver=_plain, incremental=incremental)
    assert memo == plain                 # identical floats, not approximately
    assert (net.solves, net.incremental_solves, net.fallback_solves) == (
        ref.solves, ref.incremental_solves, ref.fallback_solves)
    assert net._system.state_hits > 0 and ref._system.state_hits == 0


# ------------------------------------------------------------------ utilisation records
class EveryChannelRecorded(FlowNetwork):
    """Utilisation recorded by summing the load of every channel a solve names (the rule
    before the dirty set): what the dirty-channel records must equal exactly."""

    def _record_utilisation(self, now, chans):
        cap = self.channels.capacity
        for c in sorted(chans):
            used = self._system.load(c)[0] / cap[c]
            if used != self._last_util[c]:
                self._last_util[c] = used
                ch = self.channels.channels[c]
                self.utilisation.append((now, (ch.a, ch.b), used))


@SETTINGS
@given(scenarios())
def test_utilisation_records_sum_only_changed_channels_and_equal_summing_all(scenario):
    topology, transfers = scenario[0], scenario[1]
    _, net = run(topology, transfers, record_links=True)
    _, ref = run(topology, transfers, EveryChannelRecorded, record_links=True)
    assert net.utilisation == ref.utilisation


@pytest.mark.parametrize("seed", range(4))
def test_utilisation_records_on_an_uneven_leafspine_equal_summing_all(seed):
    traffic = random_leafspine_traffic(seed, 80)
    _, net = run(uneven_leafspine(), traffic, record_links=True)
    _, ref = run(uneven_leafspine(), traffic, EveryChannelRecorded, record_links=True)
    assert net.utilisation == ref.utilisation and len(net.utilisation) > 100
