"""The flow network's per-channel occupancy and finished bytes are brought up to date in
batches (``FlowNetwork._settle_occ`` / ``_settle_bytes``, docs/performance.md step 37), not
flow by flow: the occupancy is an integer count (order immaterial), the bytes are added with
``np.add.at`` in finishing order — the very float sums of adding each finished flow's bytes
to each direction of its route at once. Both are checked here against that per-flow
bookkeeping, with sizes whose sums round (so an order change would show)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.network import flow as flow_mod
from dessim.network import make_network
from dessim.topology import load_topology
from test_channel_quotient import _run
from test_lane_families import SYMMETRIC

#: sizes whose sums are not exact in float64 (thirds, tenths, large and small together)
_SIZES = [1e5 / 3, 4.1e6 / 7, 3e7 + 0.1, 0.3, 2.5e9 / 3]

_transfers = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.sampled_from(_SIZES),
                                st.sampled_from([0.0, 1e-6, 1e-5, 3e-4])),
                      min_size=1, max_size=14).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)


def _plain_run(flows):
    """Plain transfers on 2 × DGX H100, with replayed bytes added at some completions: the
    network's finished bytes per direction, the same bytes summed flow by flow in the order
    the completions are reported, and whether the settled occupancy matched the active
    flows' channel listings at every completion."""
    topo = load_topology("dgx-h100:nodes=2")
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    gpus = topo.gpus
    reference = [0.0] * len(net.channels.directions)
    occupancy_ok: list[bool] = []

    def done(k: int) -> None:
        src, dst, size, _ = flows[k]
        for d in net.route(gpus[src], gpus[dst], 0).directions:
            reference[d] += size
        if k % 2:       # a memoised collective's traffic added meanwhile (the engine's replay)
            replay = ([0, 3, 5], [size / 3, 7.1, size])
            net.add_finished_bytes(replay)
            for d, v in zip(*replay):
                reference[d] += v
        net._settle_occ()
        listed = Counter(c for f in net._active.values() for c in f.route.channels)
        occupancy_ok.append(all(net._occ[c] == listed.get(c, 0) for c in range(len(net._occ))))

    def start(k: int) -> None:
        src, dst, size, _ = flows[k]
        net.transfer(src, dst, size).callbacks.append(lambda _e: done(k))

    for k, (_, _, _, at) in enumerate(flows):
        env.timeout(at).callbacks.append(lambda _e, k=k: start(k))
    env.run()
    return net.finished_bytes().tolist(), reference, occupancy_ok


@settings(max_examples=60, deadline=None)
@given(_transfers)
def test_finished_bytes_are_the_per_flow_sums(flows):
    """Batched, the bytes equal adding each flow's at its finish (settling after every
    flow) bit for bit, replays between completions included; both are the per-flow sums (up
    to the order of flows finishing in one instant, which the network adds as it pops them
    and reports in id order)."""
    got, reference, occupancy_ok = _plain_run(flows)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flow_mod, "_MAX_BYTES_DUE", 1)
        at_once, _, _ = _plain_run(flows)
    assert got == at_once                       # bit for bit, not approximately
    assert got == pytest.approx(reference, rel=1e-12)
    assert occupancy_ok and all(occupancy_ok)


_mixed = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.sampled_from(_SIZES),
                            st.sampled_from([0.0, 1e-5, 3e-4]), st.booleans()),
                  min_size=1, max_size=10).map(lambda fs: [f for f in fs if f[0] != f[1]]).filter(bool)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(SYMMETRIC)), _mixed, st.sampled_from([True, None]))
def test_batched_bytes_equal_settling_after_every_flow(spec, flows, quotient):
    """Lane families (their bytes kept per route until read) beside plain flows, with the
    channel quotient or every image as its own flow: settling the bytes after every finished
    flow (what adding them at once did) and in batches give the same link bytes and finish
    times, bit for bit."""
    topo, fam = load_topology(spec), SYMMETRIC[spec]
    batched = _run(topo, fam, flows, quotient)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flow_mod, "_MAX_BYTES_DUE", 1)
        at_once = _run(topo, fam, flows, quotient)
    assert batched == at_once


def test_add_in_order_is_the_sequential_loop():
    rng = np.random.default_rng(7)
    acc = rng.random(20) * 1e9
    dirs = [rng.integers(0, 20, size=int(rng.integers(0, 30))) for _ in range(200)]
    sizes = (rng.random(200) * 1e7).tolist()
    expected = acc.tolist()
    for ds, n in zip(dirs, sizes):
        for d in ds.tolist():
            expected[d] += n
    flow_mod._add_in_order(acc, dirs, sizes)
    assert acc.tolist() == expected
