"""The channel quotient (issue 17, ``Shortcuts.channel_quotient``, :mod:`dessim.network.quotient`):
the max-min system rates flows on blocks of channels that no route tells apart, each flow
with its crossings of each of the block's channels as its weight. The same constraints
without copies: the same rates as the system on every channel, hence the same finish
times and bytes as without it, and as the images run one by one."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.engine import EngineOptions, Shortcuts
from dessim.network import make_network
from dessim.network.base import Route
from dessim.network.families import LaneFamily, QuotientBroken
from dessim.network.maxmin import MaxMinSystem, solve_maxmin
from dessim.network.quotient import ChannelQuotient
from dessim.topology import load_topology
from dessim.workload import simulate_workload
from test_lane_families import SYMMETRIC

RTOL = 1e-9


def _route(channels) -> Route:
    return Route(("a", "b"), tuple(channels), tuple(channels), 0.0, 1.0)


_routes = st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=6), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0]), min_size=12, max_size=12), _routes)
def test_blocks_are_the_coarsest_partition_that_every_route_crosses_evenly(caps, routes):
    split: list[tuple[int, list[int]]] = []
    q = ChannelQuotient(list(caps), lambda b, parts, keep: split.append((b, parts)))
    for chans in routes:
        q.of(_route(chans))
    seen = sorted({c for r in routes for c in r})
    rows = {c: (caps[c],) + tuple(Counter(r)[c] for r in routes) for c in seen}
    blocks: dict[int, list[int]] = {}
    for c in seen:
        blocks.setdefault(q.block_of[c], []).append(c)
    assert {b: sorted(m) for b, m in q.members.items()} == blocks
    for b, members in blocks.items():
        assert len({rows[c] for c in members}) == 1          # no route tells them apart
        assert q.capacity[b] == caps[members[0]]
    # coarsest: channels with one row share a block
    assert len(blocks) == len(set(rows.values()))
    assert all(q.block_of[c] == -1 for c in range(12) if c not in rows)


def _quoted_rates(flows: dict[int, list[int]], caps: list[float]) -> dict[int, float]:
    """The rates of ``flows`` solved on the blocks of a quotient refined by all of them."""
    q = ChannelQuotient(list(caps), lambda *a: None)
    routes = {f: _route(chans) for f, chans in flows.items()}
    for r in routes.values():
        q.of(r)
    got = {f: q.of(r) for f, r in routes.items()}
    return solve_maxmin({f: g.blocks for f, g in got.items()}, q.capacity,
                        {f: g.weights for f, g in got.items()})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.5, 3.0, 0.7]), min_size=12, max_size=12), _routes)
def test_weighted_solve_on_blocks_equals_the_solve_on_every_channel(caps, routes):
    flows = dict(enumerate(routes))
    reference = solve_maxmin(flows, caps)
    quoted = _quoted_rates(flows, caps)
    assert quoted.keys() == reference.keys()
    for f, r in reference.items():
        assert quoted[f] == pytest.approx(r, rel=1e-12)


def test_weights_are_listings():
    """A channel listed twice and the same channel listed once with weight 2 are one
    constraint."""
    assert solve_maxmin({"a": [0], "b": [0]}, [3.0], {"a": (2,)}) == \
        solve_maxmin({"a": [0, 0], "b": [0]}, [3.0]) == {"a": 1.0, "b": 1.0}


def _run(topo, fam: LaneFamily, flows, quotient: bool | None, checks: list | None = None):
    """Finish times of transfers (src, dst, bytes, start s, as a family?) and the bytes per
    link: ``quotient`` True/False runs families with/without the channel quotient; None runs
    every image as its own flow. A QuotientBroken certificate is returned as such."""
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    if quotient:
        assert net.use_channel_quotient()
    out: list[list[float]] = [[] for _ in flows]

    def start(k: int, src: int, dst: int, size: float, family: bool) -> None:
        if family and quotient is not None:
            net.transfer(src, dst, size, family=fam).callbacks.append(
                lambda e: out[k].extend([e.value] * (1 + len(fam))))
        else:
            pairs = [(src, dst, 0)] + (fam.images(src, dst, 0) if family else [])
            for a, b, _ in pairs:
                net.transfer(a, b, size).callbacks.append(lambda e: out[k].append(e.value))
        if checks is not None and net.quotient is not None:
            checks.append(_consistent(net))

    for k, (src, dst, size, at, family) in enumerate(flows):
        env.timeout(at).callbacks.append(
            lambda _e, k=k, s=src, d=dst, n=size, fa=family: start(k, s, d, n, fa))
    try:
        env.run()
    except QuotientBroken:
        return QuotientBroken
    return [t for times in out for t in sorted(times)], net.link_bytes()


def _consistent(net) -> bool:
    """Every flow sharing bandwidth is a variable on the blocks of its route, listed among
    each block's users, with its crossings of the block's channels as weights."""
    q, system = net.quotient, net._system
    for f in net._active.values():
        counts = Counter(f.route.channels)
        blocks = q.parts(f.route.channels)
        if list(f.channels) != blocks:
            return False
        for b, w in zip(f.channels, f.weights or (1,) * len(f.channels)):
            if f.fid not in system.users[b]:
                return False
            if {counts[c] for c in q.members[b] if c in counts} != {w}:
                return False
            if any(c not in counts for c in q.members[b]):
                return False
    return True


_mixed = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15),
                            st.sampled_from([1e5, 4e6, 3e7]), st.sampled_from([0.0, 1e-5, 3e-4]),
                            st.booleans()),
                  min_size=1, max_size=8).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(SYMMETRIC)), _mixed)
def test_the_quotient_equals_the_channels_and_the_images(spec, flows):
    """Families and plain flows at random on symmetric networks (plain ones split blocks
    while families run): with the quotient, the same finish times and link bytes as
    without it, and — when the certificate holds — as every image run as its own flow; a
    certificate that fails, fails with and without the quotient."""
    topo, fam = load_topology(spec), SYMMETRIC[spec]
    checks: list[bool] = []
    quoted = _run(topo, fam, flows, True, checks)
    plain = _run(topo, fam, flows, False)
    assert all(checks)
    if plain is QuotientBroken:
        assert quoted is QuotientBroken
        return
    assert quoted is not QuotientBroken
    unfolded = _run(topo, fam, flows, None)
    for got in (plain, unfolded):
        assert quoted[0] == pytest.approx(got[0], rel=RTOL)
        assert quoted[1].keys() == got[1].keys()
        for link, nbytes in got[1].items():
            assert quoted[1][link] == pytest.approx(nbytes, rel=RTOL, abs=1e-6)


def test_a_symmetric_family_falls_into_few_blocks():
    """The node swap of two DGX nodes: a cross-node family flow crosses each of its
    channels once per image, and the images' channels pair up into blocks."""
    topo, fam = load_topology("dgx-h100:nodes=2"), SYMMETRIC["dgx-h100:nodes=2"]
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    assert net.use_channel_quotient()
    net.transfer(0, 8, 1e8, family=fam)
    net.transfer(1, 9, 1e8, family=fam)
    env.run(until=1e-3)
    (a, b) = net._active.values()
    assert len(a.route.channels) == 2 * len(a.route.images[0].channels)
    assert len(a.channels) < len(a.route.channels) and a.weights is None
    assert net.quotient.blocks < net.quotient.channels_seen


def test_the_quotient_needs_a_fresh_network_with_the_default_solver():
    topo = load_topology("dgx-h100:nodes=1")
    env = simpy.Environment()
    assert make_network("flow", env, topo, record_links=True).use_channel_quotient()
    net = make_network("flow", env, topo)
    net.transfer(0, 1, 1e6)
    assert not net.use_channel_quotient()
    assert not make_network("analytical", env, topo).use_channel_quotient()


MIXTRAL = {"tp": 2, "pp": 1, "ep": 4, "global_batch": 16, "micro_batch": 1, "model": {"layers": 2}}


@pytest.mark.parametrize("spec", ["dgx-h100:nodes=2", "dgx-h100:nodes=4"])
def test_workloads_equal_with_and_without_the_quotient_and_exact(spec):
    overrides = {**MIXTRAL, "ep": 8 if spec.endswith("4") else 4}
    runs = {name: simulate_workload("mixtral-8x7b", spec, overrides=overrides,
                                    options=EngineOptions(record_links=False, shortcuts=cut))
            for name, cut in (("on", Shortcuts()), ("off", Shortcuts(channel_quotient=False)),
                              ("exact", Shortcuts.none()))}
    on = runs["on"]
    quotient = on.shortcuts()["channel_quotient"]
    assert quotient is not None and quotient["blocks"] < quotient["channels"]
    assert runs["off"].shortcuts()["channel_quotient"] is None
    assert runs["exact"].shortcuts()["channel_quotient"] is None
    for other in (runs["off"], runs["exact"]):
        assert on.iteration_s == pytest.approx(other.iteration_s, rel=RTOL)
        a, b = on.simulation.link_bytes, other.simulation.link_bytes
        assert a.keys() == b.keys()
        for link, nbytes in b.items():
            assert a[link] == pytest.approx(nbytes, rel=RTOL, abs=1e-3)


def test_exact_turns_the_quotient_off():
    assert Shortcuts().channel_quotient and not Shortcuts.none().channel_quotient


def test_a_block_split_under_a_running_family_keeps_its_rates():
    """A family 0 -> 8 (with its image 8 -> 0) runs; then the same transfers start as plain
    flows, which tell the representative's channels from the image's: the blocks under the
    running family split, it is quoted again, and every finish time is the unfolded one."""
    topo, fam = load_topology("dgx-h100:nodes=2"), SYMMETRIC["dgx-h100:nodes=2"]
    flows = [(0, 8, 3e7, 0.0, True), (0, 8, 4e6, 1e-5, False), (8, 0, 4e6, 1e-5, False)]
    checks: list[bool] = []
    env_runs = _run(topo, fam, flows, True, checks)
    assert all(checks) and len(checks) == 3
    unfolded = _run(topo, fam, flows, None)
    assert env_runs[0] == pytest.approx(unfolded[0], rel=RTOL)
    # the split happened: count it on a fresh network driven the same way
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    net.use_channel_quotient()
    net.transfer(0, 8, 3e7, family=fam)
    env.run(until=1e-5)
    before = net.quotient.splits
    net.transfer(0, 8, 4e6)
    net.transfer(8, 0, 4e6)
    env.run(until=2e-5)                  # past their latency: they share bandwidth
    assert len(net._active) == 3
    assert net.quotient.splits > before and _consistent(net)


def test_simulate_names_the_channel_quotient_and_exact_turns_it_off(capsys):
    from dessim.cli.simulate_cmd import print_summary

    run = simulate_workload("mixtral-8x7b", "dgx-h100:nodes=2", overrides=MIXTRAL)
    s = run.summary()
    q = s["shortcuts"]["channel_quotient"]
    print_summary(s)
    shown = capsys.readouterr().out
    assert f"channel quotient ({q['channels']} channels rated as {q['blocks']} blocks)" in shown
    exact = simulate_workload("mixtral-8x7b", "dgx-h100:nodes=2", overrides=MIXTRAL,
                              options=EngineOptions(record_links=False, shortcuts=Shortcuts.none()))
    s = exact.summary()
    assert s["shortcuts"]["channel_quotient"] is None
    print_summary(s)
    assert "channel quotient" not in capsys.readouterr().out


def _step_functions(series):
    """Per link, its utilisation as a step function: sorted change times and values."""
    out: dict = {}
    for t, link, used in series:
        times, values = out.setdefault(link, ([], []))
        times.append(t)
        values.append(used)
    return out


def _value_at(step, t):
    times, values = step
    k = int(np.searchsorted(times, t, side="right")) - 1
    return values[k] if k >= 0 else 0.0


@pytest.mark.parametrize("spec", ["dgx-h100:nodes=2", "dgx-h100:nodes=4"])
def test_utilisation_records_under_the_quotient_are_each_channels_load(spec):
    """A recorded run (timelines) rates flows on blocks too: every channel of a block is
    recorded with the block's load, so each link's utilisation over time is the one the run
    without the quotient records, and so are the run's results — to float rounding: a load
    summed in another order can read 0.9999999999999999 for 1.0, a change point of its own,
    so the step functions are compared between all change points of both, not point by
    point."""
    overrides = {**MIXTRAL, "ep": 8 if spec.endswith("4") else 4}
    runs = {name: simulate_workload("mixtral-8x7b", spec, overrides=overrides,
                                    options=EngineOptions(record_links=True, shortcuts=cut))
            for name, cut in (("on", Shortcuts()), ("off", Shortcuts(channel_quotient=False)))}
    on, off = runs["on"], runs["off"]
    quotient = on.shortcuts()["channel_quotient"]
    assert quotient is not None and quotient["blocks"] < quotient["channels"]
    assert on.iteration_s == pytest.approx(off.iteration_s, rel=RTOL)
    a, b = _step_functions(on.simulation.link_series), _step_functions(off.simulation.link_series)
    assert a.keys() == b.keys() and len(a) > 10
    for link in b:
        times = sorted(set(a[link][0]) | set(b[link][0]))
        for t0, t1 in zip(times, times[1:]):
            if t1 - t0 <= RTOL * t1:
                continue                      # the same change point, rounded apart
            mid = (t0 + t1) / 2
            assert _value_at(a[link], mid) == pytest.approx(_value_at(b[link], mid), abs=1e-12), (link, mid)
