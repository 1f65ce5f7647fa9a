"""Exact batch paths of the 16,384-GPU CP preset's run (docs/performance.md step 38), each
compared with the per-item code it replaces:

* a bundle joining onto channels that plain flows use splits into member flows in one pass
  (``FlowNetwork._join_members``): the same completion times, bytes, occupancy and rate
  solves as joining every member through ``_join_flow`` (with and without the channel
  quotient);
* a fold's orbit family kept as factors (``ComposedLaneFamily``) gives the images of the
  family of the composed maps;
* orbit maps inverted by a scatter (``_inverse_permutation``) equal ``np.argsort``;
* a p2p join told of several lane completions at once ends as when told one by one."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.collectives.schedule import _inverse_permutation
from dessim.engine.engine import _Join
from dessim.network import flow as flow_mod
from dessim.network import make_network
from dessim.network.families import ComposedLaneFamily, LaneFamily
from dessim.topology import load_topology

_SIZES = [1e5 / 3, 4.1e6 / 7, 3e7 + 0.1, 2.5e8 / 3]

#: plain transfers (src, dst, bytes, start time) and bundles (first source GPU, members,
#: destination offset, bytes, start time) on 2 x DGX H100
_plain = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.sampled_from(_SIZES),
                            st.sampled_from([0.0, 1e-6, 2e-5, 3e-4])),
                  min_size=1, max_size=8).map(lambda fs: [f for f in fs if f[0] != f[1]])
_bundles = st.lists(st.tuples(st.integers(0, 3), st.integers(2, 4), st.sampled_from([8, 9]),
                              st.sampled_from(_SIZES), st.sampled_from([0.0, 1e-6, 2e-5, 3e-4])),
                    min_size=1, max_size=4)


def _per_member(self, b, now):
    """The code before the batch: every member through ``_join_flow``."""
    for k, route in enumerate(b.template.routes):
        self._join_flow(self._member(b, k, route), now)


def _run(plain, bundles, quotient: bool, batched: bool, monkeypatch):
    if not batched:
        monkeypatch.setattr(flow_mod.FlowNetwork, "_join_members", _per_member)
    topo = load_topology("dgx-h100:nodes=2")
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    if quotient:
        assert net.use_channel_quotient()
    done: list[tuple] = []
    occupancy_ok: list[bool] = []

    def check() -> None:
        net._settle_occ()
        listed = Counter(c for f in net._active.values() for c in f.route.channels)
        occupancy_ok.append(all(net._occ[c] == listed.get(c, 0) for c in range(len(net._occ))))

    def start_plain(k: int) -> None:
        src, dst, size, _ = plain[k]
        net.transfer(src, dst, size).callbacks.append(
            lambda _e: (done.append(("p", k, env.now)), check()))

    def start_bundle(k: int) -> None:
        first, n, off, size, _ = bundles[k]
        srcs = [first + i for i in range(n)]
        dsts = [s + off for s in srcs]
        template = net.bundle_template(srcs, dsts)
        if template is None:
            for i, (s, d) in enumerate(zip(srcs, dsts)):
                net.transfer(s, d, size).callbacks.append(
                    lambda _e, i=i: done.append(("b", k, i, env.now)))
            return
        net.start_bundle(template, size, lambda ms: (done.extend(("b", k, m, env.now) for m in ms),
                                                     check()))

    for k, (*_, at) in enumerate(plain):
        env.timeout(at).callbacks.append(lambda _e, k=k: start_plain(k))
    for k, (*_, at) in enumerate(bundles):
        env.timeout(at).callbacks.append(lambda _e, k=k: start_bundle(k))
    env.run()
    return done, net.finished_bytes().tolist(), occupancy_ok, net.solves


@settings(max_examples=40, deadline=None)
@given(plain=_plain, bundles=_bundles, quotient=st.booleans())
def test_members_joining_in_one_pass_change_nothing(plain, bundles, quotient):
    with pytest.MonkeyPatch.context() as mp:
        batched = _run(plain, bundles, quotient, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        reference = _run(plain, bundles, quotient, False, mp)
    assert batched[0] == reference[0]          # the same completions, times bit for bit
    assert batched[1] == reference[1]          # the same bytes per direction
    assert batched[3] == reference[3]
    assert all(batched[2])


def test_a_bundle_onto_busy_channels_takes_the_batch_path(monkeypatch):
    calls = []
    real = flow_mod.FlowNetwork._join_members
    monkeypatch.setattr(flow_mod.FlowNetwork, "_join_members",
                        lambda self, b, now: (calls.append(len(b.template)), real(self, b, now)))
    done, _, occupancy_ok, _ = _run([(0, 8, 3e7 + 0.1, 0.0)], [(0, 4, 8, 1e5 / 3, 1e-6)],
                                    True, True, monkeypatch)
    assert calls == [4] and all(occupancy_ok)
    assert sorted(d[2] for d in done if d[0] == "b") == [0, 1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 4), st.integers(1, 5), st.randoms(use_true_random=False))
def test_composed_family_has_the_images_of_the_composed_maps(n, lanes, syms, rnd):
    rng = np.random.default_rng(rnd.randrange(2**32))
    lane_maps = [np.arange(n)] + [rng.permutation(n) for _ in range(lanes - 1)]
    sym_maps = [np.arange(n)] + [rng.permutation(n) for _ in range(syms - 1)]
    offsets = [int(x) for x in rng.integers(0, 100, lanes)]
    maps, offs = [], []
    for i, lane in enumerate(lane_maps):
        for k, m in enumerate(sym_maps):
            if i or k:
                maps.append(lane[m])
                offs.append(offsets[i])
    if not maps:
        return
    reference = LaneFamily(tuple(maps), tuple(offs))
    family = ComposedLaneFamily.compose(lane_maps, offsets, sym_maps)
    assert len(family) == len(reference) and family.key_offsets == reference.key_offsets
    assert all(np.array_equal(a, b) for a, b in zip(family.perms, reference.perms))
    for src in range(n):
        dst = (src * 7 + 3) % n
        assert family.images(src, dst, 5) == reference.images(src, dst, 5)


@given(st.integers(0, 300).flatmap(lambda n: st.permutations(list(range(n)))))
def test_inverse_permutation_is_argsort(perm):
    m = np.asarray(perm, dtype=np.int64)
    assert np.array_equal(_inverse_permutation(m), np.argsort(m))


@given(st.lists(st.integers(-3, 12), min_size=1, max_size=12))
def test_inverse_of_a_non_permutation_is_still_argsort(values):
    m = np.asarray(values, dtype=np.int64)
    if sorted(values) != list(range(len(values))):
        assert np.array_equal(_inverse_permutation(m), np.argsort(m))


class _Env:
    now = 0.0


class _RunStub:
    def __init__(self) -> None:
        self.env, self.skewed_tasks, self.lane_skew = _Env(), 0, 0.0


@given(st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_join_told_of_completions_at_once_ends_as_one_by_one(batches):
    n = sum(batches)
    ends = []
    for at_once in (True, False):
        run = _RunStub()
        fired = []
        join = _Join(run, n, lambda: fired.append(run.env.now))
        for t, k in enumerate(batches):
            run.env.now = float(t)
            if at_once:
                join.each(list(range(k)))
            else:
                for m in range(k):
                    join((m,))
        ends.append((fired, run.skewed_tasks, run.lane_skew))
    assert ends[0] == ends[1] and len(ends[0][0]) == 1
