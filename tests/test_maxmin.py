"""solve_maxmin: progressive filling on hand-computed cases and the max-min conditions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.network.maxmin import solve_maxmin

TOL = 1e-9


def assert_maxmin(flow_channels, capacity, rates):
    """Feasible (no channel above capacity) and every flow has a bottleneck: a saturated
    channel on its path on which no other flow gets more (the max-min fairness condition)."""
    load: dict[int, float] = {}
    for f, chans in flow_channels.items():
        for c in chans:
            load[c] = load.get(c, 0.0) + rates[f]
    for c, used in load.items():
        assert used <= capacity[c] * (1 + TOL), f"channel {c} carries {used} > {capacity[c]}"
    for f, chans in flow_channels.items():
        if not chans:
            assert rates[f] == math.inf
            continue
        assert rates[f] > 0

        def is_bottleneck(c):
            saturated = load[c] >= capacity[c] * (1 - TOL)
            top = all(rates[g] <= rates[f] * (1 + TOL) for g, gc in flow_channels.items() if c in gc)
            return saturated and top
        assert any(is_bottleneck(c) for c in chans), f"flow {f} has no bottleneck"


def test_dumbbell_phase_one_of_simulation_notes():
    # Channels (MB/s): 0 = A1 access 250, 1 = A2 access, 2 = A3 access (10 GB/s), 3 = L (1 GB/s).
    caps = [250e6, 10e9, 10e9, 1e9]
    rates = solve_maxmin({"A1": [0, 3], "A2": [1, 3], "A3": [2, 3]}, caps)
    assert rates == pytest.approx({"A1": 250e6, "A2": 375e6, "A3": 375e6}, rel=1e-15)


def test_parking_lot_gives_everyone_half():
    caps = [1.0, 1.0, 1.0]
    flows = {"long": [0, 1, 2], "s0": [0], "s1": [1], "s2": [2]}
    assert solve_maxmin(flows, caps) == {"long": 0.5, "s0": 0.5, "s1": 0.5, "s2": 0.5}


def test_parking_lot_with_a_wider_second_hop_gives_the_short_flow_the_rest():
    rates = solve_maxmin({"long": [0, 1], "s0": [0], "s1": [1]}, [1.0, 2.0])
    assert rates == {"long": 0.5, "s0": 0.5, "s1": 1.5}


def test_triangle_of_two_hop_flows_shares_equally():
    rates = solve_maxmin({"ab": [0, 1], "bc": [1, 2], "ca": [2, 0]}, {0: 3.0, 1: 3.0, 2: 3.0})
    assert rates == {"ab": 1.5, "bc": 1.5, "ca": 1.5}


def test_single_flow_gets_its_bottleneck_and_no_channel_means_unconstrained():
    assert solve_maxmin({7: [0, 1, 2]}, [5.0, 2.0, 9.0]) == {7: 2.0}
    assert solve_maxmin({"local": []}, []) == {"local": math.inf}
    assert solve_maxmin({}, [1.0]) == {}


def test_a_channel_crossed_twice_carries_the_flow_twice():
    # a crosses channel 0 twice: 2r + r = 3 -> r = 1.
    assert solve_maxmin({"a": [0, 0], "b": [0]}, [3.0]) == {"a": 1.0, "b": 1.0}
    assert solve_maxmin({"a": [0, 1, 0], "b": [1]}, [3.0, 10.0]) == {"a": 1.5, "b": 8.5}


def test_result_keeps_input_order_and_is_deterministic():
    flows = {f"f{i}": [i % 3, 3 + i % 2] for i in range(10)}
    caps = [1.0, 2.0, 3.0, 1.5, 4.0]
    first = solve_maxmin(flows, caps)
    assert list(first) == list(flows)
    assert solve_maxmin(flows, caps) == first
    assert_maxmin(flows, caps, first)


@st.composite
def problems(draw):
    n_chan = draw(st.integers(1, 8))
    caps = draw(st.lists(st.floats(0.1, 100.0), min_size=n_chan, max_size=n_chan))
    flows = draw(st.dictionaries(st.integers(0, 50),
                                 st.lists(st.integers(0, n_chan - 1), min_size=1, max_size=4),
                                 min_size=1, max_size=12))
    return flows, caps


@settings(max_examples=150, deadline=None)
@given(problems())
def test_property_feasible_and_every_flow_bottlenecked(problem):
    flows, caps = problem
    assert_maxmin(flows, caps, solve_maxmin(flows, caps))


def test_thousand_coupled_flows_are_valid():
    import random
    rng = random.Random(1)
    caps = [rng.uniform(1.0, 10.0) for _ in range(250)]
    flows = {i: rng.sample(range(250), 4) for i in range(1000)}
    assert_maxmin(flows, caps, solve_maxmin(flows, caps))


# ------------------------------------------------------------------ MaxMinSystem (incremental)

class Var:
    """A variable of MaxMinSystem: id, channels, rate (what FlowNetwork's flows carry), and
    the channels it crosses more than once (a lane family's images on a shared uplink)."""

    __slots__ = ("fid", "channels", "rate", "mult", "weights")

    def __init__(self, fid, channels):
        self.fid, self.channels, self.rate, self.weights = fid, tuple(channels), 0.0, None
        counts = {c: self.channels.count(c) for c in self.channels}
        self.mult = {c: k for c, k in counts.items() if k > 1} or None


def _not_default(flows, caps):
    """solve_maxmin behind another name: MaxMinSystem then keeps no memo."""
    return solve_maxmin(flows, caps)


def drive(system, caps, batches, check=None):
    """Apply batches of ("add", fid, channels) / ("remove", fid) ops, solving after each and
    setting the answered rates; after each solve, the rates of all variables (by id).
    ``check(system, live, chans)``: called after each batch (``chans``: the solve's
    constraints, None without a solve), the live variables by id in order of addition."""
    live, trace = {}, []
    for batch in batches:
        for op in batch:
            if op[0] == "add" and op[1] not in live:
                live[op[1]] = v = Var(op[1], op[2])
                system.add(v)
            elif op[0] == "remove" and op[1] in live:
                system.remove(live.pop(op[1]))
        chans = None
        if system.modified:
            solved, rates, chans = system.solve()
            assert len(rates) == len(solved)
            for v, r in zip(solved, rates):
                v.rate = r
        if check is not None:
            check(system, live, chans)
        trace.append({fid: v.rate for fid, v in sorted(live.items())})
    return trace


@st.composite
def histories(draw):
    n_chan = draw(st.integers(1, 8))
    caps = draw(st.lists(st.sampled_from([1.0, 2.5, 3.0, 10.0, 0.7]), min_size=n_chan,
                         max_size=n_chan))
    ops = st.one_of(
        # channels may repeat: a variable crossing a channel twice loads it twice
        st.tuples(st.just("add"), st.integers(0, 30),
                  st.lists(st.integers(0, n_chan - 1), min_size=1, max_size=4)),
        st.tuples(st.just("remove"), st.integers(0, 30)))
    batches = draw(st.lists(st.lists(ops, min_size=1, max_size=6), min_size=1, max_size=12))
    return caps, batches


@settings(max_examples=150, deadline=None)
@given(histories())
def test_system_matches_the_reference_full_solve_after_every_change(history):
    from dessim.network.maxmin import MaxMinSystem
    caps, batches = history
    trace = drive(MaxMinSystem(caps), caps, batches)
    full = drive(MaxMinSystem(caps, incremental=False), caps, batches)
    live: dict[int, tuple] = {}
    for batch, rates, full_rates in zip(batches, trace, full):
        for op in batch:
            if op[0] == "add":
                live.setdefault(op[1], tuple(op[2]))
            else:
                live.pop(op[1], None)
        flows = {fid: live[fid] for fid in sorted(live)}
        reference = solve_maxmin(flows, caps)
        assert rates.keys() == reference.keys() == full_rates.keys()
        for fid, r in reference.items():
            assert rates[fid] == pytest.approx(r, rel=1e-12, abs=0)
        assert full_rates == reference      # the full mode IS the reference solve
        if flows:
            assert_maxmin(flows, caps, rates)


@settings(max_examples=100, deadline=None)
@given(histories())
def test_system_memos_return_the_floats_of_a_recomputation(history):
    from dessim.network.maxmin import MaxMinSystem
    caps, batches = history
    repeated = batches * 3          # the same changes again: states recur, memos answer
    memo = MaxMinSystem(caps)
    plain = MaxMinSystem(caps, solver=_not_default)
    assert drive(memo, caps, repeated) == drive(plain, caps, repeated)
    assert (memo.incremental_solves, memo.fallback_solves) == (plain.incremental_solves,
                                                               plain.fallback_solves)
    assert plain.state_hits == plain.memo_hits == 0


@settings(max_examples=150, deadline=None)
@given(histories())
def test_the_loads_a_solve_reports_are_the_loads_after_it(history):
    """``last_loads`` (the incremental solve's figures of its channels, which the flow
    network's family certificate reads instead of recomputing them) are the very floats
    ``load`` gives once the answered rates are applied; every variable stays listed exactly
    on its channels, in order of addition."""
    from dessim.network.maxmin import MaxMinSystem
    caps, batches = history

    def check(system, live, chans):
        loads = system.last_loads
        if chans is not None and loads is not None:
            assert set(loads) <= set(chans)
            for c, got in loads.items():
                assert system.load(c) == got      # bit for bit
        for c, on in system.users.items():
            assert list(on) == [fid for fid, v in live.items() if c in v.channels]

    drive(MaxMinSystem(caps), caps, batches, check)


def test_system_state_memo_answers_a_recurring_step():
    from dessim.network.maxmin import MaxMinSystem
    caps = [1.0, 2.0, 3.0]
    step = [[("add", 0, [0, 1]), ("add", 1, [1, 2]), ("add", 2, [2])],
            [("remove", 0)], [("remove", 1), ("remove", 2)]]
    memo = MaxMinSystem(caps)
    first = drive(memo, caps, step)
    hits = memo.state_hits
    assert drive(memo, caps, step) == first
    assert memo.state_hits == hits + 3
    assert first[0] == {0: 1.0, 1: 1.0, 2: 2.0}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3),
       st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=3, max_size=3))
def test_state_key_is_equal_exactly_when_its_parts_are(chans_a, chans_b, rates):
    """The state memo's key hashes without the channel tuples, yet equal keys are equal
    states: a hash shared by states that differ in channels only never makes them equal."""
    from dessim.network.maxmin import StateKey

    def key(chans):
        n = len(chans)
        return StateKey((tuple(map(tuple, chans)), (None,) * n, tuple(rates[:n]),
                         tuple(range(n)), (), (), frozenset({0})))

    a, b = key(chans_a), key(chans_b)
    assert (a == b) == (a.parts == b.parts)
    if a.parts == b.parts:
        assert hash(a) == hash(b)
    assert {a: 1}.get(b) == (1 if a.parts == b.parts else None)


def test_state_memo_tells_apart_states_that_differ_in_channels_only():
    from dessim.network.maxmin import MaxMinSystem
    caps = [1.0, 2.0]
    memo = MaxMinSystem(caps)
    assert drive(memo, caps, [[("add", 0, [0, 1])], [("remove", 0)]]) == [{0: 1.0}, {}]
    v = Var(1, [1, 0])
    memo.add(v)
    solved, rates, _ = memo.solve()
    assert memo.state_hits == 0           # same rates, ids and marks; other channel order
    assert solved == [v] and list(rates) == [1.0]
    v.rate = 1.0
    memo.remove(v)
    memo.solve()
    assert memo.state_hits == 1           # the empty state after the removal does recur


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 10**6), st.sampled_from([0.0, 0.5, 1.0, 2.5e9, 1e-300]),
                       max_size=12),
       st.dictionaries(st.integers(0, 10**6), st.sampled_from([0.0, 0.5, 1.0, 2.5e9, 1e-300]),
                       max_size=12))
def test_freed_key_is_equal_exactly_when_the_sorted_items_are(a, b):
    """The freed rates' part of a state key (bytes, built in numpy) tells states apart exactly
    as the sorted (constraint, rate) pairs it replaced did, whatever the order of insertion."""
    from dessim.network.maxmin import _freed_key
    assert (_freed_key(a) == _freed_key(b)) == (sorted(a.items()) == sorted(b.items()))
    assert _freed_key(dict(reversed(list(a.items())))) == _freed_key(a)


# ------------------------------------------------------------------ grouped filling

def _flow_by_flow(flow_channels, capacity):
    """The unweighted progressive filling one flow at a time (solve_maxmin before flows of
    one channel tuple were filled as a group): the reference of the grouped solve."""
    import heapq
    rates, users = {}, {}
    for f, chans in flow_channels.items():
        if not chans:
            rates[f] = float("inf")
        for c in chans:
            users.setdefault(c, []).append(f)
    remaining, unfixed, heap = {}, {}, []
    for c, fs in users.items():
        remaining[c] = float(capacity[c])
        unfixed[c] = len(fs)
        heap.append((remaining[c] / len(fs), c))
    heapq.heapify(heap)
    left = len(flow_channels) - len(rates)
    while left:
        share, c = heapq.heappop(heap)
        n = unfixed[c]
        if n == 0 or remaining[c] / n != share:
            continue
        touched = set()
        for f in users[c]:
            if f in rates:
                continue
            rates[f] = share
            left -= 1
            for d in flow_channels[f]:
                unfixed[d] -= 1
                remaining[d] -= share
                touched.add(d)
        remaining[c] = 0.0
        for d in touched:
            if d != c and unfixed[d] > 0:
                remaining[d] = max(remaining[d], 0.0)
                heapq.heappush(heap, (remaining[d] / unfixed[d], d))
    return {f: rates[f] for f in flow_channels}


@st.composite
def routed_problems(draw):
    """Flows drawn from a few routes (many flows per route, as ring lanes make), some routes
    crossing a channel twice, with capacities that make shares round differently."""
    n_chan = draw(st.integers(1, 10))
    caps = draw(st.lists(st.sampled_from([1.0, 3.0, 7.0, 0.1, 900e9, 47e9, 1e11 / 3])
                         | st.floats(0.1, 100.0), min_size=n_chan, max_size=n_chan))
    routes = draw(st.lists(st.lists(st.integers(0, n_chan - 1), min_size=0, max_size=4),
                           min_size=1, max_size=6))
    picks = draw(st.lists(st.integers(0, len(routes) - 1), min_size=1, max_size=60))
    return {i: tuple(routes[k]) for i, k in enumerate(picks)}, caps


@settings(max_examples=400, deadline=None)
@given(routed_problems())
def test_grouped_filling_gives_the_floats_of_the_flow_by_flow_filling(problem):
    flows, caps = problem
    assert list(solve_maxmin(flows, caps).items()) == list(_flow_by_flow(flows, caps).items())


def test_grouped_filling_on_ring_lanes():
    """72 lanes of a 12-GPU ring over one switch whose lanes skip different GPUs (rotated
    rings), with per-lane residual capacities: equal to the flow-by-flow filling, bit for bit."""
    import random
    rng = random.Random(7)
    gpus, lanes = 12, 72
    caps = {c: rng.choice([900e9, 900e9 - rng.uniform(0, 5e11)]) for c in range(2 * gpus)}
    flows, fid = {}, 0
    for lane in range(lanes):
        skip = lane % gpus
        order = [g for g in range(gpus) if g != skip] + [skip]
        for a, b in zip(order, order[1:] + order[:1]):
            flows[fid] = (a, gpus + b)          # egress of a, ingress of b
            fid += 1
    assert list(solve_maxmin(flows, caps).items()) == list(_flow_by_flow(flows, caps).items())
