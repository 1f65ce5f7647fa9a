"""Sizes of the MoE all-to-alls (issue 18).

* Direction decides precision: the dispatch direction is FP8 with its scales in an FP8 recipe
  — the forward dispatch and the combine's backward, which dispatches output gradients — and
  the combine direction 16-bit — the forward combine and the dispatch's backward (DeepSeek-V3
  report §3.3.3; deepseek-ai/DeepEP README).
* DeepEP on one node (intranode kernels): a token is sent once per target GPU, not once per
  expert copy (``is_token_in_rank``), so the direct all-to-all carries ``G/top_k`` of the flat
  bytes, ``G`` the distinct GPUs a token's experts sit on.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from itertools import combinations
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives.algorithms import build_schedule
from dessim.topology import load_topology
from dessim.workload.transformer.generator import GeneratorOptions, build_taskgraph
from dessim.workload.transformer.kernels import layer_kernels, routed_tokens
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.passes import layer_points
from dessim.workload.transformer.routing import SKEWED_ROUTING_APPROXIMATION, MoERouting
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

ONE_NODE = load_topology("dgx-h100:nodes=1")
TWO_NODES = load_topology("dgx-h100:nodes=2")


def _model(precision: str) -> TransformerConfig:
    return TransformerConfig(name="tiny", layers=1, hidden=256, heads=4, ffn_hidden=512, vocab=1000, seq_len=128,
                             experts=8, top_k=2, moe_ffn_hidden=128, activation="swiglu",
                             norm="rmsnorm", position_embedding="rope", bias=False,
                             precision=precision)


def _a2a(precision: str) -> dict[str, tuple[float, float]]:
    """(forward, backward) bytes of each MoE all-to-all of one layer, micro-batch 1, EP 4."""
    m = _model(precision)
    lo = ParallelLayout(ep=4, dp=4).validate(m)
    points = layer_points(m, lo, layer_kernels(m, lo))
    return {p.fwd[0].label: (p.fwd[0].size, p.bwd[0].size) for p in points
            if p.fwd and p.fwd[0].op == "alltoall"}


def test_fp8_block_dispatch_direction_is_fp8_in_both_passes():
    """128 tokens × top-2 = 256 copies of 256 elements: 65,536 elements. FP8 with one fp32
    scale per 128 elements is 65,536 + 2,048 bytes; BF16 is 131,072 bytes."""
    assert routed_tokens(_model("fp8-block"), ParallelLayout(ep=4, dp=4), 128) == 256
    fp8, bf16 = 65_536 + 2_048, 131_072
    assert _a2a("fp8-block") == {"moe.dispatch": (fp8, bf16), "moe.combine": (bf16, fp8)}


def test_per_tensor_fp8_dispatch_direction_carries_one_scale():
    fp8, bf16 = 65_536 + 4, 131_072
    assert _a2a("fp8") == {"moe.dispatch": (fp8, bf16), "moe.combine": (bf16, fp8)}


def test_bf16_all_to_alls_are_the_same_both_ways():
    assert _a2a("bf16") == {"moe.dispatch": (131_072, 131_072), "moe.combine": (131_072, 131_072)}


def test_generated_tasks_size_by_direction():
    """In a DeepEP run (2 nodes, rail all-to-all, fp8-block) every combine-direction task
    (NVLink first) has the 16-bit size and every dispatch-direction one the FP8 size."""
    doc = moe_doc({}, "deepep", hidden=512, experts=32, top_k=4, ranks=16)
    doc["model"]["precision"] = "fp8-block"
    graph = build_taskgraph(parse_workload(doc, "test"), TWO_NODES)
    tokens, elements = 512, 512 * 4 * 512          # one sequence of 512 tokens, top-4, hidden 512
    fp8, bf16 = elements * (1 + 4 / 128), 2 * elements
    by_direction: dict[bool, set[float]] = {}
    for t in graph:
        if t.category == "ep":
            by_direction.setdefault(t.attrs["algo_options"]["nvlink_first"], set()).add(t.size)
    assert tokens * 4 * 512 == elements
    assert by_direction == {False: {fp8}, True: {bf16}}


# ------------------------------------------------------------------ DeepEP on one node
def _one_node(routing: dict, dispatch: str) -> list:
    doc = moe_doc(routing, dispatch, hidden=512, experts=32, top_k=4, ranks=8)
    return build_taskgraph(parse_workload(doc, "test"), ONE_NODE)


def _ep_tasks(graph) -> list:
    """The MoE all-to-all tasks, by rank and then in program order."""
    return sorted((t for t in graph if t.category == "ep"), key=lambda t: (t.rank, int(t.id.split(".")[1])))


def _distinct_gpus_closed_form(gpus: int, per_gpu: int, k: int) -> float:
    return gpus * (1 - comb((gpus - 1) * per_gpu, k) / comb(gpus * per_gpu, k))


def test_intranode_deepep_sends_once_per_target_gpu():
    """8 GPUs with 4 experts each, top-4: G = 8·(1 − C(28,4)/C(32,4)) = 3.4449 distinct GPUs
    per token, so DeepEP's direct all-to-all carries G/4 = 86 % of NCCL's."""
    g = _distinct_gpus_closed_form(8, 4, 4)
    assert g == pytest.approx(8 * (1 - 20475 / 35960)) and g == pytest.approx(3.44494, abs=1e-5)
    nccl = _ep_tasks(_one_node({}, "nccl"))
    deepep = _ep_tasks(_one_node({}, "deepep"))
    assert [t.name for t in nccl] == [t.name for t in deepep] and len(nccl) >= 8
    for t, flat in zip(deepep, nccl):
        assert t.group == tuple(range(8))
        assert t.size == pytest.approx(flat.size * g / 4, rel=1e-12)
        assert t.algo == "auto" == flat.algo and t.attrs == {}


def test_intranode_bytes_per_nvlink_link():
    """The forward dispatch of rank 0 (512 tokens × 512 elements of bf16, top-4) as the direct
    all-to-all runs it: 56 transfers, one per ordered GPU pair, each T·h·2·G/8 bytes — a
    token's vector once per target GPU, the target GPUs spread evenly."""
    g = _distinct_gpus_closed_form(8, 4, 4)
    task = next(t for t in _ep_tasks(_one_node({}, "deepep")) if t.rank == 0)
    sched = build_schedule("alltoall", "direct", task.group, task.size, topology=ONE_NODE)
    assert len(sched.transfers) == 56
    assert {(t.src, t.dst) for t in sched.transfers} == {(a, b) for a in range(8) for b in range(8) if a != b}
    assert [t.nbytes for t in sched.transfers] == pytest.approx([512 * 512 * 2 * g / 8] * 56, rel=1e-12)


def test_intranode_bytes_per_link_match_enumeration():
    """Enumerate every top-2 choice of 8 experts on 4 GPUs (2 each) and every home GPU: the
    bytes DeepEP sends from a home GPU to each other GPU — one hidden vector per target GPU
    that is not the home — average to what the de-duplicated direct all-to-all puts on each
    link: size·share/p."""
    gpus, per_gpu, k = 4, 2, 2
    choices = list(combinations(range(gpus * per_gpu), k))
    per_link = Fraction(0)                   # expected vectors home -> one other GPU, per token
    for home in range(gpus):
        for chosen in choices:
            targets = {e // per_gpu for e in chosen} - {home}
            per_link += Fraction(len(targets), len(choices) * gpus * (gpus - 1))
    share = MoERouting().nvlink_share(k, gpus * per_gpu, 1, gpus)
    flat_per_link = Fraction(k, gpus)        # a direct all-to-all of k vectors per token: k/p per pair
    assert float(flat_per_link) * share == pytest.approx(float(per_link), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(gpus=st.integers(2, 8), per_gpu=st.integers(1, 6), k=st.integers(1, 8))
def test_intranode_share_is_distinct_gpus_over_top_k(gpus, per_gpu, k):
    """Uniform routing on one node: the share is G/k with G the closed form, at most 1 and
    at least 1/k (a token reaches at least one GPU), 1 exactly when k = 1."""
    if k > gpus * per_gpu:
        return
    share = MoERouting().nvlink_share(k, gpus * per_gpu, 1, gpus)
    assert share == pytest.approx(_distinct_gpus_closed_form(gpus, per_gpu, k) / k, rel=1e-12)
    assert 1 / k - 1e-12 <= share <= 1 + 1e-12
    if k == 1:
        assert share == pytest.approx(1.0)


def test_intranode_skewed_routing_names_its_model():
    """A skewed routing's share comes from the maximum-entropy router, and the run says so;
    uniform routing on one node approximates nothing (no pipelining, closed form)."""
    zipf = {"distribution": "zipf", "exponent": 1.0}
    graph = _one_node(zipf, "deepep")
    assert graph.meta["approximations"] == [SKEWED_ROUTING_APPROXIMATION]
    assert "approximations" not in _one_node({}, "deepep").meta
    assert "approximations" not in _one_node(zipf, "nccl").meta
    share = MoERouting(**zipf).nvlink_share(4, 32, 1, 8)
    assert 0 < share < 1
    for t, flat in zip(_ep_tasks(graph), _ep_tasks(_one_node(zipf, "nccl"))):
        assert t.name == flat.name and t.size == pytest.approx(flat.size * share, rel=1e-12)


def test_no_comm_runs_keep_the_flat_size_attribute():
    """Communication-free runs replace each all-to-all by a zero delay; nothing to scale."""
    doc = copy.deepcopy(moe_doc({}, "deepep", hidden=512, experts=32, top_k=4, ranks=8))
    free = build_taskgraph(parse_workload(doc, "test"), ONE_NODE, options=GeneratorOptions(comm=False))
    assert all(t.kind == "delay" and t.duration == 0.0 for t in free if t.category == "ep")
