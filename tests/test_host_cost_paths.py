"""Speed-only paths added for llama3-405b-cp16's host cost (issue 17, docs/performance.md
step 20): each gives exactly what the path it replaces gives.

* the state memo's id order with numpy (``maxmin._id_order``);
* the channel quotient's cached quote reused when no block split since (``ChannelQuotient.of``);
* finished bundle bytes added with one fancy-index add when no direction repeats;
* the engine's per-pair lane images and bundle groups of folded sends, and per-group
  instance-0 arrivals of lane-family collectives, computed once.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dessim.engine import EngineOptions
from dessim.engine import engine as engine_mod
from dessim.network import flow as flow_mod
from dessim.network.base import Route
from dessim.network.maxmin import _NUMPY_ORDER_FROM, _id_order
from dessim.network.quotient import ChannelQuotient
from dessim.workload import simulate_workload


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**9), unique=True, max_size=3 * _NUMPY_ORDER_FROM))
def test_id_order_is_the_ascending_id_permutation(fids):
    assert _id_order(fids) == tuple(sorted(range(len(fids)), key=fids.__getitem__))


def _route(channels) -> Route:
    return Route(("a", "b"), tuple(channels), tuple(channels), 0.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=6), min_size=1, max_size=12),
       st.lists(st.integers(0, 11), min_size=1, max_size=30))
def test_quote_reused_across_splits_equals_a_fresh_quote(shapes, order):
    """Routes quoted, then others refining the blocks, then the first ones quoted again (as
    joins and re-joins do): every answer of ``of`` is what quoting the route afresh at that
    moment gives (blocks, weights, multiplicities, image checks)."""
    q = ChannelQuotient([1.0] * 16, lambda *a: None)
    routes = [_route(chans) for chans in shapes]
    for i in order:
        r = routes[i % len(routes)]
        got = q.of(r)
        fresh = q._quotient(r)
        assert got.route is r
        assert got.blocks == fresh.blocks
        assert got.weights == fresh.weights
        assert got.mult == fresh.mult
        assert [c for c, _ in got.checks] == [c for c, _ in fresh.checks]
        assert got.version == q.version
        assert Counter(dict(zip(got.channels.tolist(), got.counts.tolist()))) == Counter(r.channels)


def _run(monkeypatch, workload: str, topology: str, overrides: dict, slow: bool):
    if slow:     # the paths these speed-ups replace
        def lanes_of(self, src, dst):
            fold = self.fold
            srcs, dsts = fold.images(src), fold.images(dst)
            groups = self.net.bundle_groups(srcs, dsts, 0) if self.shortcuts.bundles else None
            return srcs, dsts, groups

        def where_in_first(self, group, where):
            return {r: [(k, x) for k, x in pairs if k == 0] for r, pairs in where.items()}

        plain = flow_mod.FlowNetwork._plain_template

        def plain_template(self, routes):
            t = plain(self, routes)
            if t is not None:
                object.__setattr__(t, "distinct_directions", False)   # always np.add.at
            return t

        monkeypatch.setattr(engine_mod._Run, "_lanes_of", lanes_of)
        monkeypatch.setattr(engine_mod._Run, "_where_in_first", where_in_first)
        monkeypatch.setattr(flow_mod.FlowNetwork, "_plain_template", plain_template)
        monkeypatch.setattr(flow_mod, "_MAX_CACHED_GROUPS", 1)   # every group list anew
    try:
        return simulate_workload(workload, topology, overrides=overrides,
                                 options=EngineOptions(record_links=False))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("workload, topology, overrides", [
    pytest.param("llama3-8b", "dgx-h100:nodes=2", {"tp": 2, "pp": 2, "cp": 2, "global_batch": 8,
                                                   "micro_batch": 1, "model": {"layers": 4}},
                 id="cp2-pp2"),
    pytest.param("gpt3-1.3b", "dgx-a100:nodes=4", {"tp": 8, "pp": 2, "dp": 2, "global_batch": 8,
                                                   "micro_batch": 1, "schedule": "1f1b"},
                 id="tp8-pp2-dp2"),
    pytest.param("mixtral-8x7b", "dgx-h100:nodes=2", {"tp": 1, "pp": 2, "ep": 8, "global_batch": 16,
                                                      "micro_batch": 1, "model": {"layers": 2}},
                 id="ep8-pp2"),
])
def test_cached_paths_replay_bit_for_bit(monkeypatch, workload, topology, overrides):
    fast = _run(monkeypatch, workload, topology, overrides, slow=False)
    slow = _run(monkeypatch, workload, topology, overrides, slow=True)
    assert fast.taskgraph.fold is not None
    a, b = fast.simulation, slow.simulation
    assert a.makespan_s == b.makespan_s
    assert a.events == b.events
    assert a.span_records == b.span_records
    assert a.link_bytes == b.link_bytes
    assert [repr(r) for r in a.ranks] == [repr(r) for r in b.ranks]
    assert a.meta["fold"] == b.meta["fold"]


def test_distinct_directions_flag_matches_the_template():
    """The flag is set exactly when no direction repeats, and then the fancy add adds what
    ``np.add.at`` adds."""
    from dessim.network import make_network
    from dessim.topology import load_topology
    import simpy

    topo = load_topology("dgx-h100:nodes=2")
    net = make_network("flow", simpy.Environment(), topo)
    gpus = [f"n{h}.gpu{g}" for h in range(2) for g in range(8)]
    cases = [(gpus[:8], gpus[8:]), (gpus[:4], [gpus[8]] * 4), (gpus[:1], gpus[9:10])]
    seen = set()
    for srcs, dsts in cases:
        for template, _ in net.bundle_groups(srcs, dsts) or ():
            if template is None:
                continue
            dirs = template.directions
            seen.add(template.distinct_directions)
            assert template.distinct_directions == (len(set(dirs.tolist())) == len(dirs))
            a = np.zeros(len(net.channels.directions))
            b = a.copy()
            np.add.at(a, dirs, 3.25)
            if template.distinct_directions:
                b[dirs] += 3.25
                assert a.tolist() == b.tolist()
    assert True in seen
