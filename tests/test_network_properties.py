"""Property tests of the flow model on random small topologies and random transfer sets."""

from __future__ import annotations

import networkx as nx
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.network import FlowNetwork, simulate_transfers
from dessim.topology.graph import Topology
from dessim.topology.routing import Router
from test_maxmin import assert_maxmin
from test_network_graphs import topo

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 7))
    g = nx.Graph()
    for i in range(n):
        g.add_node(f"n{i}", kind="gpu")
    bws = st.sampled_from([1e9, 2.5e9, 10e9, 25e9])
    lats = st.sampled_from([0.0, 1e-6, 5e-6])

    def add(a, b):
        g.add_edge(f"n{a}", f"n{b}", type="x", bw=draw(bws), lat=draw(lats),
                   duplex=draw(st.booleans()), efficiency=draw(st.sampled_from([1.0, 0.8])))
    for i in range(1, n):                       # random spanning tree: connected
        add(i, draw(st.integers(0, i - 1)))
    for a, b in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=n)):
        if a != b:
            add(a, b)
    topology = Topology(g, name="random")
    transfers = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                                        st.sampled_from([0, 1, 1e3, 1e6, 3e6, 1e7, 3e7]),
                                        st.sampled_from([0.0, 1e-6, 1e-4, 1e-3, 2.5e-3, 6e-3])),
                              min_size=1, max_size=12))
    return topology, transfers


class CheckedFlowNetwork(FlowNetwork):
    """After every solve, check the max-min conditions over ALL active flows (not only the
    component that was re-solved): the component restriction must not break global fairness."""

    checked = 0

    def _solve(self, now):
        super()._solve(now)
        active = self._active
        flows = {fid: f.route.channels for fid, f in active.items()}
        assert_maxmin(flows, self.channels.capacity, {fid: f.rate for fid, f in active.items()})
        self.checked += 1


def run_checked(topology, transfers):
    env = simpy.Environment()
    net = CheckedFlowNetwork(env, topology)
    done = []

    def send(s, d, n, start, key):
        yield env.timeout(start)
        done.append((yield net.transfer(s, d, n, key=key)))
    for key, (s, d, n, start) in enumerate(transfers):
        env.process(send(s, d, n, start, key))
    env.run()
    assert len(done) == len(transfers)
    assert net.checked == net.solves
    return done


@SETTINGS
@given(scenarios())
def test_every_solve_is_feasible_and_max_min_fair(scenario):
    run_checked(*scenario)


def test_a_solve_covers_flows_coupled_through_a_chain_of_channels():
    # b->d shares c with a->c, which shares a->b with the last flow: a join at one end of the
    # chain re-rates the flow at the other end.
    chain = topo([("a", "b", 1e9, 0), ("b", "c", 1e9, 0), ("c", "d", 1e9, 0)], ["a", "b", "c", "d"])
    done = run_checked(chain, [("b", "d", 1e9, 0), ("a", "c", 1e9, 0.1), ("a", "b", 1e9, 0.2)])
    assert len(done) == 3


@SETTINGS
@given(scenarios())
def test_bytes_delivered_equal_bytes_sent_on_every_hop(scenario):
    topology, transfers = scenario
    res = simulate_transfers(topology, transfers)
    router = Router(topology)
    expected = sum((len(router.path(f"n{s}", f"n{d}", key=i)) - 1) * n
                   for i, (s, d, n, _) in enumerate(transfers))
    assert sum(res.link_bytes.values()) == pytest.approx(expected, rel=1e-12, abs=1e-6)


@SETTINGS
@given(scenarios())
def test_identical_runs_give_identical_results(scenario):
    topology, transfers = scenario
    a, b = simulate_transfers(topology, transfers), simulate_transfers(topology, transfers)
    assert (a.finish_times, a.link_bytes, a.events) == (b.finish_times, b.link_bytes, b.events)


@SETTINGS
@given(scenarios())
def test_flow_model_never_beats_the_contention_free_model(scenario):
    topology, transfers = scenario
    flow = simulate_transfers(topology, transfers)
    alone = simulate_transfers(topology, transfers, network="analytical")
    for (_, _, _, start), f, a in zip(transfers, flow.finish_times, alone.finish_times):
        assert f >= start
        assert f >= a * (1 - 1e-12)
