"""The combine's reduction work (issue 18).

After the combine every token is the weighted sum of its ``top_k`` expert outputs, a
memory-bound kernel. Where it runs depends on the dispatch:

* flat all-to-all (NCCL, Megatron-LM): on the token's GPU after the combine, reading the
  ``top_k`` copies of each token and writing the token (``moe.unpermute``);
* DeepEP: the dispatch delivers one row per (token, GPU), so the experts' GPU permutes the
  ``R`` rows it received into its expert copies and, before the combine, sums each row's
  copies (weighted) back into rows; the combine's own unweighted sum over GPUs runs inside
  the all-to-all kernel (deepseek-ai/DeepEP ``csrc/kernels/intranode.cu``), at the link rate
  the README measures for it.
"""

from __future__ import annotations

from math import ceil, comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.topology import load_topology
from dessim.workload.common.kernels import KernelSet
from dessim.workload.transformer.generator import GeneratorOptions, _Generator, make_plan
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.passes import Block, PassBuilder, layer_points
from dessim.workload.transformer.routing import SKEWED_ROUTING_APPROXIMATION, MoERouting
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

H, T, K = 256, 128, 2           # hidden, tokens per rank, top-k of the tiny model
COPIES = T * K                  # 256 routed copies per rank (uniform routing: load factor 1)


def _model(precision: str = "bf16", shared: int = 0) -> TransformerConfig:
    return TransformerConfig(name="tiny", layers=1, hidden=H, heads=4, ffn_hidden=512, vocab=1000,
                             seq_len=T, experts=8, top_k=K, moe_ffn_hidden=128, activation="swiglu",
                             norm="rmsnorm", position_embedding="rope", bias=False,
                             shared_experts=shared, precision=precision)


LO = ParallelLayout(ep=4, dp=4)


def _by_name(ks: KernelSet) -> dict:
    return {k.name: k for k in ks.forward + ks.backward}


def test_flat_dispatch_sums_top_k_copies_per_token_after_the_combine():
    """NCCL: 256 copies of 256 bf16 elements read, 128 tokens written, one add and one
    multiply per copy element; backward reads the copies and the output gradient and writes
    the copies' gradients."""
    ks = _by_name(layer_kernels(_model(), LO))
    u = ks["moe.unpermute"]
    assert (u.bytes_read, u.bytes_written, u.flops) == (COPIES * H * 2, T * H * 2, 2 * COPIES * H)
    ub = ks["moe.unpermute.bwd"]
    assert (ub.bytes_read, ub.bytes_written) == ((COPIES + T) * H * 2, COPIES * H * 2)


@pytest.mark.parametrize("precision, tokens, copies", [
    ("bf16", T * H * 2.0, COPIES * H * 2.0),
    ("fp8-block", T * H * (1 + 4 / 128), COPIES * H * (1 + 4 / 128)),   # 1x128 tiles, fp32 scales
    ("fp8", T * H + 4.0, COPIES * H + 4.0)])                            # one per-tensor scale
def test_flat_permutation_moves_the_dispatchs_precision(precision, tokens, copies):
    """NCCL with an FP8 recipe: the 128 tokens are cast once (``moe.quant_in``, before the
    permutation) and the permutation gathers FP8 rows and scales into the 256 copies: 33,792
    bytes read and 67,584 written with 1x128 block scales, 32,772 / 65,540 per-tensor. Its
    backward sums 16-bit gradients whatever the recipe: it reads the tokens and the copies'
    gradients (the bf16 kernel's 196,608 bytes) and writes the tokens' 65,536."""
    ks = layer_kernels(_model(precision), LO)
    names = [k.name for k in ks.forward]
    assert names.index("moe.permute") > names.index("moe.quant_in") if precision != "bf16" \
        else "moe.quant_in" not in names
    by = _by_name(ks)
    p, pb = by["moe.permute"], by["moe.permute.bwd"]
    assert (p.bytes_read, p.bytes_written) == pytest.approx((tokens, copies), rel=1e-15)
    assert (pb.bytes_read, pb.bytes_written) == ((T + COPIES) * H * 2, T * H * 2) == (196608, 65536)
    assert (p.flops, pb.flops) == (0.0, 0.0)


@pytest.mark.parametrize("precision, moved", [("bf16", 2.0), ("fp8-block", 1 + 4 / 128)])
def test_deepep_permutes_and_sums_on_the_experts_gpu(precision, moved):
    """DeepEP with R = 200 received rows: the permutation reads the rows and writes the 256
    copies in the dispatch's precision (FP8 with a scale per 128 elements), its backward
    sums the copies' bf16 gradients into rows; the weighted sum reads the 256 bf16 copies
    and writes the 200 rows."""
    r = 200
    ks = _by_name(layer_kernels(_model(precision), LO, received=r))
    p, pb = ks["moe.permute"], ks["moe.permute.bwd"]
    assert (p.bytes_read, p.bytes_written) == pytest.approx((r * H * moved, COPIES * H * moved), rel=1e-15)
    assert (pb.bytes_read, pb.bytes_written) == (COPIES * H * 2, r * H * 2)
    u = ks["moe.unpermute"]
    assert (u.bytes_read, u.bytes_written, u.flops) == (COPIES * H * 2, r * H * 2, 2 * COPIES * H)


def test_deepep_kernel_order_and_communication_points():
    """Forward: router, FP8 casts, shared experts, [dispatch lands] permute, experts, weighted
    sum, [combine], residual. The shared experts run during the dispatch; the residual add
    waits for the combine, which waits for the weighted sum."""
    m = _model(shared=1)
    ks = layer_kernels(m, LO, received=200)
    names = [k.name for k in ks.forward]
    moe = names[names.index("moe.router"):]
    assert moe[-3:] == ["moe.expert.down", "moe.unpermute", "mlp.residual"]
    assert moe.index("moe.shared.down") < moe.index("moe.permute") < moe.index("moe.expert.gate")
    points = layer_points(m, LO, ks, deepep=True)
    assert [(p.before, p.fwd[0].label, p.overlap) for p in points] == [
        ("moe.shared.gate", "moe.dispatch", 4), ("mlp.residual", "moe.combine", 0)]   # gate, up, act, down
    block = Block("L0", ks, tuple(points), (0.0, 0.0))
    steps = PassBuilder(m, LO).forward([block], False)
    idx = {s.name: i for i, s in enumerate(steps)}
    assert idx["moe.dispatch"] not in steps[idx["moe.shared.gate"]].deps
    assert idx["moe.dispatch"] in steps[idx["moe.permute"]].deps
    assert steps[idx["moe.combine"]].deps == [idx["moe.unpermute"]]
    assert idx["moe.combine"] in steps[idx["mlp.residual"]].deps


def test_deepep_backward_mirrors_it():
    """Backward: the combine's backward (a dispatch of the output gradients) lands before the
    weighted sum's backward; the dispatch's backward (a combine of the rows' gradients)
    starts after the permutation's backward summed the copies' gradients into rows."""
    m = _model(shared=1)
    ks = layer_kernels(m, LO, received=200)
    block = Block("L0", ks, tuple(layer_points(m, LO, ks, deepep=True)), (0.0, 0.0))
    back = PassBuilder(m, LO).backward([block], False)
    idx = {s.name: i for i, s in enumerate(back)}
    assert idx["mlp.residual.bwd"] < idx["moe.combine"] < idx["moe.unpermute.bwd"]
    assert idx["moe.combine"] in back[idx["moe.unpermute.bwd"]].deps
    assert idx["moe.permute.bwd"] < idx["moe.dispatch"]
    assert back[idx["moe.dispatch"]].combine and not back[idx["moe.combine"]].combine


@pytest.mark.parametrize("nodes, dispatch", [(2, "deepep"), (1, "deepep"), (2, "nccl")])
def test_generator_sizes_the_received_rows(nodes, dispatch):
    """One sequence of 512 tokens per rank, 32 experts on 8·nodes GPUs, top-4, uniform: each
    GPU receives R = ⌈T·G⌉ rows, G = P(1 − C((P−1)g, 4)/C(P·g, 4)) the distinct GPUs per
    token over the P GPUs of the EP group with g experts each (2 nodes: G = 3.8065, R =
    1,949; 1 node: G = 3.4449, R = 1,764). NCCL keeps the flat layout."""
    topo = load_topology(f"dgx-h100:nodes={nodes}")
    spec = parse_workload(moe_doc({}, dispatch, hidden=512, experts=32, top_k=4, ranks=8 * nodes), "t")
    plan = make_plan(spec.model, spec.layout(8 * nodes), topo, device="H100")
    gen = _Generator(plan, topo)
    ks = gen.layer_kinds[False][0]
    lo = plan.layout
    if dispatch == "nccl":
        assert ks == layer_kernels(plan.model, lo)
        return
    gpus, per_gpu = 8 * nodes, 32 // (8 * nodes)
    g = gpus * (1 - comb((gpus - 1) * per_gpu, 4) / comb(gpus * per_gpu, 4))
    r = ceil(512 * g)
    assert r == {2: 1949, 1: 1764}[nodes]
    assert ks == layer_kernels(plan.model, lo, received=r)


def test_skewed_routing_sizes_the_hottest_gpus_rows_and_says_so():
    """Zipf exponent 1 over 32 experts on 2 nodes: R = ⌈T·ep·max_g P(g hit)⌉ from the
    maximum-entropy router, named among the approximations even without communication (it
    sizes compute)."""
    topo = load_topology("dgx-h100:nodes=2")
    zipf = {"distribution": "zipf", "exponent": 1.0}
    spec = parse_workload(moe_doc(zipf, "deepep", hidden=512, experts=32, top_k=4, ranks=16), "t")
    plan = make_plan(spec.model, spec.layout(16), topo, device="H100",
                     options=GeneratorOptions(comm=False))
    gen = _Generator(plan, topo)
    hot = max(MoERouting(**zipf).spread(4, 32, 2, 8).gpu_hit)
    r = ceil(512 * 16 * hot)
    assert gen.layer_kinds[False][0] == layer_kernels(plan.model, plan.layout, received=r)
    assert gen.graph.meta["approximations"] == [SKEWED_ROUTING_APPROXIMATION]


@settings(max_examples=40, deadline=None)
@given(exponent=st.floats(0.0, 2.0), k=st.integers(1, 6), nodes=st.sampled_from([1, 2, 4]),
       per_node=st.sampled_from([1, 2, 4]), per_gpu=st.integers(1, 4))
def test_a_gpu_never_receives_more_rows_than_copies(exponent, k, nodes, per_node, per_gpu):
    """The weighted sum writes at most what it reads: a token reaches a GPU at most once, so
    the hottest GPU's rows per source token, ep·max_g P(g hit), are at most its copies,
    top_k·load_factor (dropless)."""
    gpus = nodes * per_node
    experts = gpus * per_gpu
    if k > experts:
        return
    routing = MoERouting("zipf", exponent=exponent)
    rows = gpus * max(routing.spread(k, experts, nodes, per_node).gpu_hit)
    assert rows <= k * routing.load_factor(experts, gpus) * (1 + 1e-9)
