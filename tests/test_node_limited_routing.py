"""Node-limited MoE routing (DeepSeek-V3 report §2.1.2: each token to at most M nodes) and
its effect on DeepEP's all-to-all: a token crosses the network once per target node, so its
cross-node bytes are bounded by M hidden vectors."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives.algorithms import build_schedule
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.topology import load_topology
from dessim.workload import load_workload
from dessim.workload.transformer.deepep import DEEPEP_APPROXIMATION, DEEPEP_PIPELINE_CHUNKS
from dessim.workload.transformer.routing import MoERouting
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

TOPO4 = load_topology("dgx-h100:nodes=4")


def _enumerated_nodes_per_token(top_k: int, per_node: int, nodes: int, max_nodes: int | None) -> float:
    """Mean distinct nodes over every equally likely choice: each set of min(M, H) nodes,
    then each set of top_k experts among their experts."""
    reach = nodes if max_nodes is None else min(max_nodes, nodes)
    total = count = 0
    for chosen in combinations(range(nodes), reach):
        experts = [n for n in chosen for _ in range(per_node)]   # expert -> its node
        for pick in combinations(range(len(experts)), top_k):
            total += len({experts[i] for i in pick})
            count += 1
    return total / count


@settings(max_examples=30, deadline=None)
@given(nodes=st.integers(1, 5), per_node=st.integers(1, 3), top_k=st.integers(1, 4),
       max_nodes=st.one_of(st.none(), st.integers(1, 5)))
def test_closed_form_is_the_mean_over_every_routing_choice(nodes, per_node, top_k, max_nodes):
    reach = nodes if max_nodes is None else min(max_nodes, nodes)
    routing = MoERouting(max_nodes=max_nodes)
    if reach * per_node < top_k:
        with pytest.raises(WorkloadError, match="fewer than top_k"):
            routing.nodes_per_token(top_k, per_node * nodes, nodes)
        return
    assert routing.nodes_per_token(top_k, per_node * nodes, nodes) == pytest.approx(
        _enumerated_nodes_per_token(top_k, per_node, nodes, max_nodes), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 64), per_node=st.integers(1, 64), top_k=st.integers(1, 16),
       max_nodes=st.integers(1, 16))
def test_distinct_nodes_bounded_by_m_and_growing_with_it(nodes, per_node, top_k, max_nodes):
    experts = nodes * per_node
    limited, free = MoERouting(max_nodes=max_nodes), MoERouting()
    if min(max_nodes, nodes) * per_node < top_k:
        return
    d = limited.nodes_per_token(top_k, experts, nodes)
    assert 1 - 1e-12 <= d <= min(max_nodes, nodes, top_k) + 1e-12
    assert limited.network_share(top_k, experts, nodes) <= max_nodes / top_k + 1e-12
    assert d <= free.nodes_per_token(top_k, experts, nodes) + 1e-12
    if max_nodes + 1 <= nodes:
        assert d <= MoERouting(max_nodes=max_nodes + 1).nodes_per_token(top_k, experts, nodes) + 1e-12
    if max_nodes >= nodes:
        assert d == free.nodes_per_token(top_k, experts, nodes)


@settings(max_examples=25, deadline=None)
@given(top_k=st.integers(1, 8), max_nodes=st.one_of(st.none(), st.integers(1, 4)),
       per_node=st.sampled_from([2, 4, 8, 16]), tokens=st.integers(1, 64))
def test_rail_all_to_all_sends_each_token_once_per_node(top_k, max_nodes, per_node, tokens):
    """A dispatch of ``tokens`` tokens per rank with top_k copies each (hidden vectors of
    1 kB) over 4 DGX nodes: the bytes crossing nodes per token are the expected remote
    target nodes (D·(H−1)/H) hidden vectors — at most M — and NVLink still carries every copy."""
    routing = MoERouting(max_nodes=max_nodes)
    nodes, hidden_bytes = 4, 1000.0
    if min(max_nodes or nodes, nodes) * per_node < top_k:
        return
    share = routing.network_share(top_k, per_node * nodes, nodes)
    group = tuple(range(32))
    size = top_k * tokens * hidden_bytes                 # one rank's routed copies
    sched = build_schedule("alltoall", "rail", group, size, topology=TOPO4, network_share=share)
    cross = sum(t.nbytes for t in sched.transfers if t.src // 8 != t.dst // 8) / len(group)
    per_token = cross / tokens / hidden_bytes
    assert per_token == pytest.approx(routing.nodes_per_token(top_k, per_node * nodes, nodes) * 3 / 4)
    assert per_token <= min(max_nodes or nodes, nodes - 1 if max_nodes is None else max_nodes) + 1e-9
    inside = sum(t.nbytes for t in sched.transfers if t.src // 8 == t.dst // 8) / len(group)
    flat = build_schedule("alltoall", "rail", group, size, topology=TOPO4)
    assert inside == pytest.approx(
        sum(t.nbytes for t in flat.transfers if t.src // 8 == t.dst // 8) / len(group))


def test_deepseek_v3_numbers():
    """DeepSeek-V3: 256 experts, top-8, EP 64 over 8 nodes (32 experts a node), M = 4:
    3.63 distinct nodes per token instead of 5.29 unlimited, 45 % of the flat all-to-all's
    cross-node bytes instead of 66 %."""
    ds = load_workload("deepseek-v3").model
    assert ds.routing.max_nodes == 4
    assert ds.routing.nodes_per_token(8, 256, 8) == pytest.approx(3.629, abs=1e-3)
    assert MoERouting().nodes_per_token(8, 256, 8) == pytest.approx(5.295, abs=1e-3)
    assert ds.routing.network_share(8, 256, 8) == pytest.approx(0.4536, abs=1e-4)
    assert ds.routing.network_share(8, 256, 1) == 1.0


def _moe_simulation(routing: dict, dispatch: str = "deepep"):
    from dessim.engine import EngineOptions
    from dessim.workload import simulate_workload

    doc = moe_doc(routing, dispatch)
    return simulate_workload(parse_workload(doc, "test"), TOPO4, options=EngineOptions(record_links=False))


def _ep_seconds(result) -> float:
    """Total time of rank 0's all-to-all tasks (s)."""
    return sum(r[8] - r[6] for r in result.simulation.span_records if r[0] == 0 and r[5] == "ep")


def test_node_limit_shrinks_the_simulated_dispatch():
    """EP 32 over 4 DGX nodes with DeepEP: the all-to-all tasks carry the routing's network
    and NVLink shares (dispatch and combine directions) and take less time with M = 1 than
    unlimited; NCCL's all-to-all sends every copy whatever M is. With M = 1 a token's 8 copies
    land on one node: D = 1, and G = 8·(1 − C(14, 8)/C(16, 8)) = 92/15 of its 8 GPUs (2
    experts each)."""
    free, limited = _moe_simulation({}), _moe_simulation({"max_nodes": 1})
    options = {tuple(sorted(t.attrs["algo_options"].items())) for t in limited.taskgraph if t.category == "ep"}
    assert {o[1] for o in options} == {("nvlink_first", False), ("nvlink_first", True)}
    # DeepEP's pipeline: 1,024 tokens over 10 channels, 1/4 of them to a node, RDMA chunks of
    # 8 tokens (32 ranks): 4 chunks, fewer than the cap, up to 128 / 8 = 16 of them in flight
    assert {(o[0], o[3], o[4]) for o in options} == \
        {(("network_share", 1 / 8), ("pipeline_chunks", 4), ("window", 16))}
    assert 4 < DEEPEP_PIPELINE_CHUNKS
    assert [o[2][1] for o in options] == pytest.approx([92 / 15 / 8] * 2, rel=1e-12)
    # the pipelined phases are an approximation, and every summary says so
    assert limited.summary()["approximations"] == [DEEPEP_APPROXIMATION]
    assert 0 < _ep_seconds(limited) < _ep_seconds(free)
    nccl = _moe_simulation({"max_nodes": 1}, dispatch="nccl")
    assert all("algo_options" not in t.attrs for t in nccl.taskgraph if t.category == "ep")
    assert nccl.summary()["approximations"] == []


def test_cli_names_the_deepep_approximation(tmp_path):
    import yaml
    from click.testing import CliRunner

    from dessim.cli.main import cli

    doc = {"name": "moe", "model": {"layers": 2, "hidden": 512, "heads": 8, "ffn_hidden": 2048,
                                    "vocab": 2048, "seq_len": 512, "experts": 16, "top_k": 2,
                                    "moe_ffn_hidden": 256},
           "parallelism": {"dp": 16, "ep": 16}, "training": {"global_batch": 16, "moe_dispatch": "deepep"}}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(cli, ["simulate", str(path), "-t", "dgx-h100:nodes=2"])
    assert res.exit_code == 0, res.output
    assert f"approximation       {DEEPEP_APPROXIMATION}" in res.output


@pytest.mark.parametrize("value, message", [
    (0, "max_nodes"), ("four", "max_nodes"), (True, "max_nodes")])
def test_bad_max_nodes_is_refused_naming_the_key(value, message):
    doc = {"name": "m", "model": {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 128,
                                  "seq_len": 64, "experts": 8, "top_k": 2, "routing": {"max_nodes": value}}}
    with pytest.raises(DessimError, match=message):
        parse_workload(doc, "w.yaml")


def test_too_few_experts_on_m_nodes_is_refused():
    with pytest.raises(WorkloadError, match="max_nodes=1 nodes hold 2 experts"):
        MoERouting(max_nodes=1).network_share(4, 8, 4)
    with pytest.raises(WorkloadError, match="do not split evenly"):
        MoERouting().nodes_per_token(2, 10, 4)


def test_deepep_pipeline_follows_deepeps_chunks():
    """The rail pipeline has DeepEP's RDMA chunks per channel and node (10 channels; 8-token
    chunks at 32-64 ranks, 20/12 at 16 for dispatch/combine; the 160-rank config above),
    at most DEEPEP_PIPELINE_CHUNKS (a replay-cost cap: their latencies overlap)."""
    from dessim.workload.transformer.deepep import deepep_pipeline_chunks

    assert deepep_pipeline_chunks(4096, 64, 0.454, False) == DEEPEP_PIPELINE_CHUNKS   # DeepSeek-V3
    assert deepep_pipeline_chunks(17, 32, 0.9, False) == 1         # a tiny dispatch: one chunk
    assert deepep_pipeline_chunks(400, 16, 1.0, False) == 2        # 40 tokens / 20
    assert deepep_pipeline_chunks(400, 16, 1.0, True) == 4         # 40 tokens / 12
    assert deepep_pipeline_chunks(480, 256, 1.0, False) == 4       # 48 tokens / 12
    assert deepep_pipeline_chunks(160, 8, 1.0, False) == 3         # 16 tokens / 6
