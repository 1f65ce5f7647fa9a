"""DeepEP with tensor parallelism (issue 18), as Megatron-core's ``MoEFlexTokenDispatcher``
runs it: one communication group over the TP × EP ranks, each rank dispatching its
sequence-parallel ``T/tp`` tokens, a token's routing replicated over the TP ranks of every
target EP rank (``_initialize_metadata``), so each TP rank of an EP rank receives the same
rows, runs its ``1/tp`` slice of the experts on them, and the combine adds the row-parallel
partials; no TP all-gather/reduce-scatter around the routed experts, only around the shared
experts (``SharedExpertMLP.pre_forward_comm``/``post_forward_comm``).

The tiny case: 2 nodes × 8 H100s, TP 2 with SP, EP 8 (4 EP ranks per node), 32 experts (4 per
EP rank), top-4, hidden 512, one sequence of T = 512 tokens per TP group (256 per rank)."""

from __future__ import annotations

from math import ceil, comb

import pytest

from dessim.errors import WorkloadError
from dessim.topology import load_topology
from dessim.workload.transformer.generator import _Generator, build_taskgraph, make_plan
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

H, T, K, E, TP = 512, 512, 4, 32, 2
FFN_T = H // 2 // TP                # moe_ffn_hidden / tp
COPIES = T * K                      # the flat all-to-all's routed copies per TP group (uniform)


def _doc(nodes: int = 2, tp: int = TP, sp: bool = True, shared: int = 1, precision: str = "bf16",
         heads: int = 8) -> dict:
    doc = moe_doc({}, "deepep", hidden=H, experts=E, top_k=K, ranks=8 * nodes // tp)
    doc["model"].update({"shared_experts": shared, "precision": precision, "heads": heads})
    doc["parallelism"].update({"tp": tp, "sp": sp})
    return doc


def _generator(nodes: int = 2, **kw) -> _Generator:
    topo = load_topology(f"dgx-h100:nodes={nodes}")
    spec = parse_workload(_doc(nodes, **kw), "t")
    return _Generator(make_plan(spec.model, spec.layout(8 * nodes), topo, device="H100"), topo)


def _rank0_forward_l0(nodes: int = 2, graph=None, **kw) -> list:
    """Rank 0's tasks of layer 0 in the first micro-batch's forward (of ``graph`` if given)."""
    if graph is None:
        graph = build_taskgraph(parse_workload(_doc(nodes, **kw), "t"), load_topology(f"dgx-h100:nodes={nodes}"))
    out = []
    for t in graph:         # emission order: the first micro-batch's forward comes first
        if t.rank == 0 and t.kind == "compute" and t.name.startswith("bwd"):
            break
        if t.rank == 0 and t.name.split()[1] == "L0":
            out.append(t)
    return out


def _distinct(blocks: int, size: int) -> float:
    """Expected distinct blocks hit by K uniform experts of ``blocks`` blocks of ``size``."""
    return blocks * (1 - comb((blocks - 1) * size, K) / comb(blocks * size, K))


def test_all_to_alls_run_on_the_tp_ep_group_with_the_routings_shares():
    """The dispatch and combine run on all 16 GPUs (the TP × EP group), the rail algorithm,
    at the flat size of K·T copies (each rank sends K·T/tp copies, each to the tp TP ranks of
    its EP rank): 512·4·512·2 = 2,097,152 bytes. Shares: a rank's token crosses to each target
    node once, D = 2(1 − C(16,4)/C(32,4)) = 1.8988 nodes out of the flat tp·K = 8 copies; over
    NVLink it reaches each target GPU once, tp·G of tp·K, G = 8(1 − C(28,4)/C(32,4)) = 3.4449
    EP ranks. So per rail pair the network carries T/tp · P(node hit) hidden vectors."""
    ep = [t for t in _rank0_forward_l0() if t.category == "ep"]
    assert [t.name.split()[2] for t in ep] == ["moe.dispatch", "moe.combine"]
    d, g = _distinct(2, 16), _distinct(8, 4)
    assert (round(d, 4), round(g, 4)) == (1.8988, 3.4449)
    for t in ep:
        assert t.group == tuple(range(16)) and t.algo == "rail"
        assert t.size == COPIES * H * 2 == 2_097_152
        opts = t.attrs["algo_options"]
        assert opts["network_share"] == pytest.approx(d / (TP * K), rel=1e-12)
        assert opts["nvlink_share"] == pytest.approx(g / K, rel=1e-12)
        # rail phase 1: n·S/p per same-rail pair, n = 8 GPUs per host, p = 16
        per_pair = opts["network_share"] * 8 * t.size / 16
        assert per_pair == pytest.approx(T / TP * (d / 2) * H * 2, rel=1e-12)


def test_experts_gpu_receives_the_rows_of_all_tp_ep_ranks():
    """R = ⌈T·G⌉ = ⌈512 · 3.4449⌉ = 1,764 rows per GPU — 16 sources of 256 tokens, each
    token hitting the GPU's EP rank with probability G/8 — the same as without TP. The layer's
    kernels are DeepEP's layout with them: the router on the 256 SP tokens, the permutation
    of R rows into 2,048 copies, the local experts' slice (4 experts, width 128) on all
    copies, the weighted sum of the copies into R rows."""
    gen = _generator()
    r = ceil(T * _distinct(8, 4))
    assert r == 1764
    ks = gen.layer_kinds[False][0]
    assert ks == layer_kernels(gen.model, gen.lo, received=r)
    by = {k.name: k for k in ks.forward}
    assert by["moe.router"].shape == (T // TP, E, H)
    assert (by["moe.permute"].bytes_read, by["moe.permute"].bytes_written) == (r * H * 2, COPIES * H * 2)
    assert (by["moe.expert.up"].shape, by["moe.expert.up"].groups) == ((COPIES, FFN_T, H), E // 8)
    u = by["moe.unpermute"]
    assert (u.bytes_read, u.bytes_written, u.flops) == (COPIES * H * 2, r * H * 2, 2 * COPIES * H)


def test_tp_collectives_surround_only_attention_and_the_shared_experts():
    """Forward on rank 0: attention's all-gather and reduce-scatter, then the dispatch, the
    shared experts' all-gather of the T·h tokens (524,288 bytes) before their first GEMM, and
    with the combine the reduce-scatter of their output; no all-gather before the router and no
    reduce-scatter of the routed experts' output (the combine sums their partials). The shared
    experts wait for their all-gather but not for the dispatch; the permutation waits for the
    dispatch; the residual add for the combine and the shared reduce-scatter."""
    graph = build_taskgraph(parse_workload(_doc(), "t"), load_topology("dgx-h100:nodes=2"))
    tasks = _rank0_forward_l0(graph=graph)
    comm = [(t.name.split()[2], t.size) for t in tasks if t.kind == "collective" and t.category == "tp"]
    assert comm == [("attn.f.ag", T * H * 2), ("attn.g.rs", T * H * 2),
                    ("moe.shared.f.ag", T * H * 2), ("moe.shared.g.rs", T * H * 2)]

    def label(task) -> str:     # "fwd L0 moe.permute..moe.unpermute mb0" -> "moe.permute..moe.unpermute"
        return task.name.split()[2]

    by = {label(t): t for t in _rank0_forward_l0(graph=graph)}
    deps = {name: {label(graph.task(d)) for d in graph.deps(t.id)} for name, t in by.items()}
    shared = next(n for n in by if n.startswith("moe.shared.up"))
    assert "moe.shared.f.ag" in deps[shared] and "moe.dispatch" not in deps[shared]
    permute = next(n for n in by if n.startswith("moe.permute"))
    assert "moe.dispatch" in deps[permute]
    residual = next(n for n in by if n.startswith("mlp.residual"))
    assert {"moe.combine", "moe.shared.g.rs"} <= deps[residual]


def test_fp8_casts_the_sp_shard_for_the_dispatch_and_the_gathered_tokens_for_the_shared_experts():
    """FP8 (1x128 tiles): the dispatch sends the rank's 256 tokens, so ``moe.quant_in`` casts
    256·512 elements (262,144 bytes read, 135,168 written); the shared experts cast the 512
    gathered tokens themselves (``moe.shared.quant_in``). The output-gradient casts split the
    same way and add up to the TP-1 formula's K·T + T rows of width 128 (non-gated MLP)."""
    ks = _generator(precision="fp8-block").layer_kinds[False][0]
    by = {k.name: k for k in ks.forward + ks.backward}
    q, qs = by["moe.quant_in"], by["moe.shared.quant_in"]
    assert (q.bytes_read, q.bytes_written) == (T // TP * H * 2, T // TP * H * (1 + 4 / 128))
    assert (qs.bytes_read, qs.bytes_written) == (T * H * 2, T * H * (1 + 4 / 128))
    grads = by["moe.quant_in.bwd"].bytes_read + by["moe.shared.quant_in.bwd"].bytes_read
    assert grads == (COPIES + T) * FFN_T * 2


def test_one_host_runs_the_direct_all_to_all_deduplicated_per_gpu():
    """1 node, TP 2 × EP 4: the direct all-to-all on the 8 GPUs carries the flat bytes times
    G/K, G = 4(1 − C(24,4)/C(32,4)) distinct EP ranks per token (each sent to both TP ranks of
    each, out of tp·K flat copies); R = ⌈T·G⌉."""
    g = _distinct(4, 8)
    ep = [t for t in _rank0_forward_l0(nodes=1) if t.category == "ep"]
    assert all(t.group == tuple(range(8)) and t.algo == "auto" for t in ep)
    assert [t.size for t in ep] == pytest.approx([COPIES * H * 2 * g / K] * 2, rel=1e-12)
    gen = _generator(nodes=1)
    assert gen.layer_kinds[False][0] == layer_kernels(gen.model, gen.lo, received=ceil(T * g))


def test_tp_without_sequence_parallelism_or_across_hosts_is_refused():
    """Megatron-core's MoE layer refuses TP without SP in training; a TP group across hosts
    has no per-host layout of the expanded routing: both are one clear WorkloadError."""
    with pytest.raises(WorkloadError, match="needs sequence parallelism"):
        _generator(sp=False)
    with pytest.raises(WorkloadError, match="tp=16 needs every expert-TP group on one host"):
        _generator(nodes=4, tp=16, heads=16)


def test_groups_uneven_over_hosts_keep_the_flat_layout():
    """TP 2 × EP 6 on 3 nodes: a TP × EP group of 12 GPUs has 8 on one host and 4 on the next,
    so (as with TP 1) the run keeps NCCL's flat layout on the EP group — with SP Megatron's:
    all-to-all then TP all-gather, TP reduce-scatter then all-to-all, flat kernels."""
    doc = moe_doc({}, "deepep", hidden=H, experts=12, top_k=K, ranks=12)
    doc["parallelism"].update({"tp": 2, "sp": True, "ep": 6})
    topo = load_topology("dgx-h100:nodes=3")
    spec = parse_workload(doc, "t")
    gen = _Generator(make_plan(spec.model, spec.layout(24), topo, device="H100"), topo)
    ks, points = gen.layer_kinds[False][0], gen.layer_kinds[False][1]
    assert (gen.ep_kind, gen.ep_algo) == ("ep", "auto")
    assert ks == layer_kernels(gen.model, gen.lo)
    assert [(p.before, [(f.label, f.group) for f in p.fwd]) for p in points][2:] == [
        ("moe.expert.up", [("moe.dispatch", "ep"), ("moe.dispatch.ag", "tp")]),
        ("moe.unpermute", [("moe.combine.rs", "tp"), ("moe.combine", "ep")])]
