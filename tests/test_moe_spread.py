"""Distinct target nodes and GPUs per token under skewed MoE routing
(:mod:`dessim.workload.transformer.spread`), checked against brute-force enumeration of the
stated routing model, the uniform closed forms, and their bounds; and the DeepEP shares
(:meth:`MoERouting.network_share`, :meth:`MoERouting.nvlink_share`) against the hottest link
of an enumerated dispatch."""

from __future__ import annotations

from itertools import combinations
from math import comb, prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.errors import WorkloadError
from dessim.workload.transformer.routing import MoERouting
from dessim.workload.transformer.spread import (hit_probabilities, inclusion, limited_inclusion,
                                                solve_limited_weights, solve_weights)


def _enumerate(weights, certain, k, hosts, per_host, max_nodes):
    """The routing model by brute force: every node set N of M' nodes and every k-subset S of
    N's experts (containing the certain ones), weighted Π_{e∈S} w_e. Returns per-node and
    per-GPU hit probabilities and per-expert inclusion probabilities."""
    experts = len(weights)
    per_gpu = experts // (hosts * per_host)
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    node_hit = [0.0] * hosts
    gpu_hit = [0.0] * (hosts * per_host)
    incl = [0.0] * experts
    total = 0.0
    for chosen in combinations(range(hosts), reach):
        pool = [e for e in range(experts) if e // (per_gpu * per_host) in chosen]
        for s in combinations(pool, k):
            if any(certain[e] and e not in s for e in range(experts)):
                continue
            w = prod(1.0 if certain[e] else weights[e] for e in s)
            total += w
            for h in {e // (per_gpu * per_host) for e in s}:
                node_hit[h] += w
            for g in {e // per_gpu for e in s}:
                gpu_hit[g] += w
            for e in s:
                incl[e] += w
    return ([x / total for x in node_hit], [x / total for x in gpu_hit], [x / total for x in incl])


def _shares(raw):
    total = sum(raw)
    return [x / total for x in raw]


_LAYOUT = st.sampled_from([(1, 2), (2, 1), (2, 2), (4, 1), (2, 4), (4, 2)])    # (hosts, GPUs per host)


@settings(max_examples=60, deadline=None)
@given(layout=_LAYOUT, per_gpu=st.integers(1, 2), k=st.integers(1, 3),
       max_nodes=st.one_of(st.none(), st.integers(1, 3)),
       raw=st.lists(st.integers(0, 20), min_size=16, max_size=16))
def test_skewed_hits_equal_enumeration(layout, per_gpu, k, max_nodes, raw):
    """Exact: the dynamic programme's node and GPU hit probabilities equal the enumerated
    model's, and (no node limit) each expert's inclusion probability is k × its share, or 1
    for an expert wanted by every token."""
    hosts, per_host = layout
    experts = hosts * per_host * per_gpu
    shares = _shares([x + 1e-3 for x in raw[:experts]])     # > 0: any k experts possible
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    if k > experts or reach * per_host * per_gpu < k:
        return
    weights, certain = solve_weights(shares, k)
    got = hit_probabilities(weights, certain, k, hosts, per_host, max_nodes)
    node_hit, gpu_hit, incl = _enumerate(weights, certain, k, hosts, per_host, max_nodes)
    assert got.node_hit == pytest.approx(node_hit, abs=1e-12)
    assert got.gpu_hit == pytest.approx(gpu_hit, abs=1e-12)
    assert got.nodes == pytest.approx(sum(node_hit), abs=1e-12)
    assert got.gpus == pytest.approx(sum(gpu_hit), abs=1e-12)
    free = _enumerate(weights, certain, k, hosts, per_host, None)[2]
    assert inclusion(weights, certain, k) == pytest.approx(free, abs=1e-12)
    rest = sum(s for s, c in zip(shares, certain) if not c)
    assert free == pytest.approx([1.0 if c else (k - sum(certain)) * s / rest
                                  for s, c in zip(shares, certain)], abs=1e-9)
    if not any(certain):
        assert free == pytest.approx([k * s for s in shares], abs=1e-9)
    assert any(certain) == any(k * s >= 1 for s in shares)


@settings(max_examples=60, deadline=None)
@given(hosts=st.integers(1, 6), per_host=st.sampled_from([1, 2, 4, 8]), per_gpu=st.integers(1, 4),
       k=st.integers(1, 8), max_nodes=st.one_of(st.none(), st.integers(1, 6)))
def test_uniform_weights_reduce_to_the_closed_forms(hosts, per_host, per_gpu, k, max_nodes):
    """Equal weights: the dynamic programme gives the uniform closed forms D and G of
    :mod:`dessim.workload.transformer.routing`, and equal measured counts do too."""
    experts = hosts * per_host * per_gpu
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    if reach * per_host * per_gpu < k:
        return
    uniform = MoERouting(max_nodes=max_nodes)
    d = reach * (1 - comb((reach - 1) * per_host * per_gpu, k) / comb(reach * per_host * per_gpu, k))
    g = reach * per_host * (1 - comb((reach * per_host - 1) * per_gpu, k) / comb(reach * per_host * per_gpu, k))
    assert uniform.nodes_per_token(k, experts, hosts) == d
    assert uniform.gpus_per_token(k, experts, hosts, per_host) == g
    got = hit_probabilities([1.0] * experts, [False] * experts, k, hosts, per_host, max_nodes)
    assert got.nodes == pytest.approx(d, rel=1e-12)
    assert got.gpus == pytest.approx(g, rel=1e-12)
    counts = MoERouting("counts", counts=(7.0,) * experts, max_nodes=max_nodes)
    assert counts.nodes_per_token(k, experts, hosts) == pytest.approx(d, rel=1e-9)
    assert counts.gpus_per_token(k, experts, hosts, per_host) == pytest.approx(g, rel=1e-9)
    if hosts > 1:
        assert counts.network_share(k, experts, hosts, per_host) == pytest.approx(d / k, rel=1e-9)
    if per_host > 1:
        assert counts.nvlink_share(k, experts, hosts, per_host) == pytest.approx(g / k, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(hosts=st.integers(1, 4), per_host=st.sampled_from([1, 2, 4]), per_gpu=st.integers(1, 4),
       k=st.integers(1, 6), exponent=st.floats(0, 3), max_nodes=st.one_of(st.none(), st.integers(1, 4)))
def test_zipf_distinct_targets_are_bounded(hosts, per_host, per_gpu, k, exponent, max_nodes):
    """1 ≤ D ≤ min(top_k, M, nodes), D ≤ G ≤ min(top_k, M·n), both shares in (0, 1]; D and G
    do not fall when M or top_k grows."""
    experts = hosts * per_host * per_gpu
    reach = hosts if max_nodes is None else min(max_nodes, hosts)
    if reach * per_host * per_gpu < k:
        return
    routing = MoERouting("zipf", exponent=exponent, max_nodes=max_nodes)
    d = routing.nodes_per_token(k, experts, hosts)
    g = routing.gpus_per_token(k, experts, hosts, per_host)
    assert 1 - 1e-9 <= d <= min(k, reach) + 1e-9
    assert d - 1e-9 <= g <= min(k, reach * per_host) + 1e-9
    assert 0 < routing.network_share(k, experts, hosts, per_host) <= 1
    assert 0 < routing.nvlink_share(k, experts, hosts, per_host) <= 1
    if k < experts and min(max_nodes or hosts, hosts) * per_host * per_gpu > k:
        assert routing.nodes_per_token(k + 1, experts, hosts) >= d - 1e-9
        assert routing.gpus_per_token(k + 1, experts, hosts, per_host) >= g - 1e-9
    if max_nodes is not None:
        wider = MoERouting("zipf", exponent=exponent, max_nodes=max_nodes + 1)
        assert wider.nodes_per_token(k, experts, hosts) >= d - 1e-9
        assert wider.gpus_per_token(k, experts, hosts, per_host) >= g - 1e-9


def test_skew_concentrates_tokens_on_fewer_nodes():
    """DeepSeek-V3's shape (256 experts, top-8, 8 nodes of 8 GPUs): Zipf-1 popularity reaches
    fewer distinct nodes and GPUs than uniform, with and without the 4-node limit."""
    for m in (None, 4):
        uni, zipf = MoERouting(max_nodes=m), MoERouting("zipf", exponent=1.0, max_nodes=m)
        assert zipf.nodes_per_token(8, 256, 8) < uni.nodes_per_token(8, 256, 8)
        assert zipf.gpus_per_token(8, 256, 8, 8) < uni.gpus_per_token(8, 256, 8, 8)


@pytest.mark.parametrize("routing", [MoERouting("zipf", exponent=1.2),
                                     MoERouting("counts", counts=(9, 1, 1, 1, 4, 4, 0, 2, 1, 1, 3, 5, 2, 2, 1, 1)),
                                     MoERouting("zipf", exponent=0.7, max_nodes=2)])
def test_shares_scale_the_hot_ranks_flat_bytes_to_the_hottest_link(routing):
    """Bulk-synchronous costing: every rank's all-to-all is sized for the hottest EP rank
    (T·k·max_g s_g hidden vectors to each rank). Scaled by the shares, a rail flow carries what
    the most often hit node receives over it (T·max_h P(h hit)) and an NVLink flow what the
    most often hit GPU receives (per source node, T·max_g P(g hit)), by enumeration."""
    k, hosts, per_host, experts, tokens = 2, 4, 2, 16, 100.0
    gpus = hosts * per_host
    weights, certain = solve_weights(routing.shares(experts), k)
    if routing.max_nodes is not None:       # the router's weights are solved under the limit
        limited = solve_limited_weights(routing.shares(experts), k, hosts, routing.max_nodes)
        assert limited is not None and routing.spread(k, experts, hosts, per_host).loads_matched
        weights, certain = limited
    node_hit, gpu_hit, _ = _enumerate(weights, certain, k, hosts, per_host, routing.max_nodes)
    per_pair = tokens * k * max(routing.gpu_shares(experts, gpus))     # flat bytes to each rank
    assert routing.load_factor(experts, gpus) / gpus == pytest.approx(max(routing.gpu_shares(experts, gpus)))
    net = routing.network_share(k, experts, hosts, per_host) * per_host * per_pair
    nvl = routing.nvlink_share(k, experts, hosts, per_host) * per_pair
    assert net == pytest.approx(tokens * max(node_hit), rel=1e-9)
    assert nvl == pytest.approx(tokens * max(gpu_hit), rel=1e-9)


def test_too_few_popular_experts_is_refused():
    with pytest.raises(WorkloadError, match="only 1 experts have a share > 0, fewer than top_k=2"):
        MoERouting("counts", counts=(5, 0, 0, 0)).nodes_per_token(2, 4, 2)
    with pytest.raises(WorkloadError, match="do not split evenly over 2 nodes x 3 GPUs"):
        MoERouting("zipf").gpus_per_token(2, 8, 2, 3)


# ------------------------------------------------------------------ weights under the node limit
@settings(max_examples=60, deadline=None)
@given(layout=_LAYOUT, per_gpu=st.integers(1, 2), k=st.integers(1, 3), max_nodes=st.integers(1, 3),
       raw=st.lists(st.integers(0, 20), min_size=16, max_size=16))
def test_limited_inclusion_equals_enumeration(layout, per_gpu, k, max_nodes, raw):
    """The node-limited router's per-expert inclusion probabilities by the dynamic programme
    equal the enumerated model's, for any weights (here: the unlimited ones)."""
    hosts, per_host = layout
    experts = hosts * per_host * per_gpu
    shares = _shares([x + 1e-3 for x in raw[:experts]])
    if k > experts or min(max_nodes, hosts) * per_host * per_gpu < k:
        return
    weights, certain = solve_weights(shares, k)
    incl = _enumerate(weights, certain, k, hosts, per_host, max_nodes)[2]
    assert limited_inclusion(weights, certain, k, hosts, max_nodes) == pytest.approx(incl, abs=1e-12)
    if max_nodes >= hosts:
        assert limited_inclusion(weights, certain, k, hosts, None) == pytest.approx(
            inclusion(weights, certain, k), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(layout=_LAYOUT, per_gpu=st.integers(1, 2), k=st.integers(1, 3), max_nodes=st.integers(1, 3),
       raw=st.lists(st.integers(0, 20), min_size=16, max_size=16))
def test_weights_under_the_limit_give_the_loads_or_say_they_cannot(layout, per_gpu, k, max_nodes, raw):
    """Either the limited router's enumerated loads are the targets (k × share, or 1 for an
    expert every token takes, the rest rescaled) — and the spread is the enumerated one with
    those weights — or the spread says the loads are not matched."""
    hosts, per_host = layout
    experts = hosts * per_host * per_gpu
    reach = min(max_nodes, hosts)
    counts = tuple(x + 1e-3 for x in raw[:experts])
    if k > experts or reach * per_host * per_gpu < k or reach == hosts:
        return
    routing = MoERouting("counts", counts=counts, max_nodes=max_nodes)
    shares = routing.shares(experts)
    try:
        spread = routing.spread(k, experts, hosts, per_host)
    except WorkloadError as e:
        # only when the experts every token must take (the certain ones) sit on more nodes
        # than the limit allows
        assert "more than max_nodes" in str(e)
        certain = solve_weights(shares, k)[1]
        assert len({i // (per_host * per_gpu) for i, c in enumerate(certain) if c}) > reach
        return
    limited = solve_limited_weights(shares, k, hosts, max_nodes)
    assert spread.loads_matched == (limited is not None)
    if limited is None:
        return
    weights, certain = limited
    node_hit, gpu_hit, incl = _enumerate(weights, certain, k, hosts, per_host, max_nodes)
    rest = sum(s for s, c in zip(shares, certain) if not c)
    assert incl == pytest.approx([1.0 if c else (k - sum(certain)) * s / rest
                                  for s, c in zip(shares, certain)], abs=1e-9)
    assert spread.node_hit == pytest.approx(node_hit, abs=1e-12)
    assert spread.gpu_hit == pytest.approx(gpu_hit, abs=1e-12)


def test_dominant_experts_on_more_nodes_than_the_limit_are_refused_clearly():
    """Two experts that each need half the tokens (top-3 of 8, on two nodes) must both be in
    every token's choice, but with max_nodes=1 a token reaches one node: no router serves it,
    and the spread says so as a WorkloadError instead of dividing by zero (found by the
    hypothesis test above: counts (0, 0, 0, 1, 0, 0, 0, 1) + 1e-3)."""
    routing = MoERouting("counts", counts=tuple(x + 1e-3 for x in (0, 0, 0, 1, 0, 0, 0, 1)),
                         max_nodes=1)
    with pytest.raises(WorkloadError, match=r"sit on 2 nodes \[0, 1\], more than max_nodes=1"):
        routing.spread(3, 8, 2, 2)


def test_one_node_per_token_cannot_serve_a_dominant_expert():
    """M = 1: every pick of a token falls on one node, so an expert takes at most 1/k of its
    node's load. Shares (0.5, 0.1, 0.1, 0.1, 0.1, 0.1) on 3 nodes of 2 experts, top-2: the
    hot expert's target 2·0.5 = 1 makes it certain, and its node (0.6 of the load) would have
    to be chosen by every token while the other nodes need 0.8 of the picks — impossible, so
    the spread says so. Zipf exponent 0.5 on DeepSeek-V3's shape (256 experts, top-8, 8 nodes)
    is matched, with M = 4 and even with M = 1."""
    bad = MoERouting("counts", counts=(5, 1, 1, 1, 1, 1), max_nodes=1)
    assert not bad.spread(2, 6, 3, 1).loads_matched
    assert solve_limited_weights(bad.shares(6), 2, 3, 1) is None
    for m in (4, 1):
        zipf = MoERouting("zipf", exponent=0.5, max_nodes=m)
        spread = zipf.spread(8, 256, 8, 8)
        assert spread.loads_matched
        weights, certain = solve_limited_weights(zipf.shares(256), 8, 8, m)
        assert limited_inclusion(weights, certain, 8, 8, m) == pytest.approx(
            [8 * s for s in zipf.shares(256)], abs=1e-12)
