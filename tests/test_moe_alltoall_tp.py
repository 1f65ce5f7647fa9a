"""NCCL's flat MoE layout with tensor and sequence parallelism (issue 18), as Megatron-core's
``MoEAlltoAllTokenDispatcher`` runs it (``megatron/core/transformer/moe/token_dispatcher.py``):
each rank permutes its ``T/tp`` sequence-parallel tokens, the EP all-to-all carries their
``top_k·T/tp`` copies, ``dispatch_postprocess`` all-gathers what arrived over the (expert)
TP group so the experts' TP slices see all ``top_k·T`` rows, ``combine_preprocess``
reduce-scatters their output back before the combine all-to-all, and the rank sums its
``T/tp`` tokens' copies. No TP all-gather before the router or reduce-scatter after the
MoE block; the shared experts keep theirs. Before, every TP rank permuted and dispatched all
``T`` tokens: ``tp`` times the all-to-all bytes.

The tiny case: 2 nodes × 8 H100s, TP 2 with SP, EP 8 (ranks 0, 2, …, 14), 32 experts, top-4,
hidden 512, T = 512 tokens per TP group (256 per rank), one shared expert."""

from __future__ import annotations

import pytest

from dessim.topology import load_topology
from dessim.workload.transformer.generator import build_taskgraph
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.memory import MemoryOptions, estimate_memory
from dessim.workload.transformer.passes import layer_points
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc

H, T, K, TP = 512, 512, 4, 2
SENT = K * T // TP                  # copies a rank sends: 1,024
ROWS = K * T                        # rows the experts' TP slices see: 2,048
FP8 = 1 + 4 / 128                   # bytes per element with 1x128 fp32 scales


def _graph(precision: str = "bf16"):
    doc = moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=8)
    doc["model"].update({"shared_experts": 1, "precision": precision})
    doc["parallelism"].update({"tp": TP, "sp": True})
    return build_taskgraph(parse_workload(doc, "t"), load_topology("dgx-h100:nodes=2"))


def _layer0(graph, phase: str) -> list:
    """Rank 0's layer-0 tasks of the first micro-batch's forward or backward, in order."""
    out, seen_bwd = [], False
    for t in graph:
        if t.rank != 0:
            continue
        if t.kind == "compute" and t.name.startswith("bwd"):
            seen_bwd = True
        if (phase == "bwd") != seen_bwd or t.name.split()[1] != "L0":
            continue
        if phase == "bwd" and t.name.endswith("mb1"):
            break
        out.append(t)
    return out


@pytest.mark.parametrize("precision, dispatched", [("bf16", 2.0), ("fp8-block", FP8)])
def test_forward_all_to_all_carries_the_sp_shard_and_tp_gathers_it(precision, dispatched):
    """Forward: all-to-all of 1,024 copies × 512 on the EP group (1,048,576 bytes bf16;
    540,672 FP8 with scales), then the TP all-gather of the 2,048 received rows (nccl-tests
    size: the gathered array) in the dispatch's precision; the reduce-scatter of the experts'
    2,048 bf16 rows, then the combine all-to-all of 1,024 bf16 copies. Each waits for the one
    before it; the experts wait for the all-gather, the weighted sum for the combine."""
    graph = _graph(precision)
    tasks = _layer0(graph, "fwd")
    comm = [(t.name.split()[2], t.op, t.size, t.group) for t in tasks if t.kind == "collective"]
    ep, tp = tuple(range(0, 16, 2)), (0, 1)
    assert comm == [("attn.f.ag", "allgather", T * H * 2, tp), ("attn.g.rs", "reducescatter", T * H * 2, tp),
                    ("moe.dispatch", "alltoall", SENT * H * dispatched, ep),
                    ("moe.dispatch.ag", "allgather", ROWS * H * dispatched, tp),
                    ("moe.shared.f.ag", "allgather", T * H * 2, tp),
                    ("moe.combine.rs", "reducescatter", ROWS * H * 2, tp),
                    ("moe.combine", "alltoall", SENT * H * 2, ep),
                    ("moe.shared.g.rs", "reducescatter", T * H * 2, tp)]
    by = {t.name.split()[2]: t for t in tasks}
    assert by["moe.dispatch"].id in graph.deps(by["moe.dispatch.ag"].id)
    assert by["moe.combine.rs"].id in graph.deps(by["moe.combine"].id)
    experts = next(t for name, t in by.items() if name.startswith("moe.expert"))
    assert by["moe.dispatch.ag"].id in graph.deps(experts.id)
    assert by["moe.combine"].id in graph.deps(by["moe.unpermute"].id)


def test_backward_runs_each_chain_in_reverse_in_its_directions_precision():
    """Backward (FP8): the combine's backward dispatches the output gradients — all-to-all of
    1,024 FP8 copies, then the all-gather of 2,048 FP8 rows — and the dispatch's backward
    combines the experts' input gradients — reduce-scatter of 2,048 bf16 rows, then the
    all-to-all of 1,024 bf16 copies."""
    tasks = _layer0(_graph("fp8-block"), "bwd")
    comm = [(t.name.split()[2], t.op, t.size) for t in tasks
            if t.kind == "collective" and t.name.split()[2].startswith(("moe.dispatch", "moe.combine"))]
    assert comm == [("moe.combine", "alltoall", SENT * H * FP8), ("moe.combine.ag", "allgather", ROWS * H * FP8),
                    ("moe.dispatch.rs", "reducescatter", ROWS * H * 2), ("moe.dispatch", "alltoall", SENT * H * 2)]


def test_token_side_kernels_run_on_the_sp_shard():
    """The permutation reads the 256 tokens and writes 1,024 copies, the weighted sum reads
    1,024 copies and writes 256 tokens (2 FLOPs per copy element); the experts' grouped GEMMs
    still run on 2,048 rows, and the router on the 256 tokens."""
    doc = moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=8)
    spec = parse_workload(doc, "t")
    lo = ParallelLayout(tp=TP, dp=8, ep=8, sp=True)
    by = {k.name: k for k in layer_kernels(spec.model, lo).forward}
    p, u = by["moe.permute"], by["moe.unpermute"]
    assert (p.bytes_read, p.bytes_written) == (T // TP * H * 2, SENT * H * 2)
    assert (u.bytes_read, u.bytes_written, u.flops) == (SENT * H * 2, T // TP * H * 2, 2 * SENT * H)
    assert by["moe.expert.up"].shape[0] == ROWS and by["moe.router"].shape[0] == T // TP


def test_without_sequence_parallelism_the_layer_keeps_tps_operators():
    """TP without SP (which Megatron-core refuses for MoE training) keeps the previous layout:
    every TP rank dispatches the copies of all T tokens, inside the MLP's f/g operators."""
    spec = parse_workload(moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=8), "t")
    lo = ParallelLayout(tp=TP, dp=8, ep=8, sp=False)
    ks = layer_kernels(spec.model, lo)
    points = layer_points(spec.model, lo, ks)
    assert [(p.before, [s.label for s in p.fwd + p.bwd]) for p in points] == [
        ("attn.qkv", ["attn.f.ar"]), ("attn.residual", ["attn.g.ar"]),
        ("moe.router", ["mlp.f.ar"]), ("mlp.residual", ["mlp.g.ar"]),
        ("moe.expert.up", ["moe.dispatch", "moe.dispatch"]), ("moe.unpermute", ["moe.combine", "moe.combine"])]
    assert points[4].fwd[0].size == ROWS * H * 2


@pytest.mark.parametrize("sp, sent", [(True, SENT), (False, ROWS)])
def test_memory_counts_the_all_to_all_buffers_of_the_copies_a_rank_sends(sp, sent):
    """The memory model's dispatch and combine buffers hold the copies the rank sends: with
    SP the 1,024 copies of its 256 tokens (2 × 1,024 × 512 × 2 bytes), without SP those of
    all 512 tokens — besides the TP term (one gathered activation, T × h × 2) and DP's two
    gradient buckets."""
    spec = parse_workload(moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=8), "t")
    lo = ParallelLayout(tp=TP, dp=8, ep=8, sp=sp)
    est = estimate_memory(spec.model, lo)
    assert est.comm_buffers == 2 * sent * H * 2 + T * H * 2 + 2 * MemoryOptions().bucket_size


def test_ep1_gathers_the_copies_over_tp_without_an_all_to_all():
    """EP 1, TP 2 with SP (Megatron-core's alltoall dispatcher: the all-to-all over a one-rank
    EP group moves nothing, ``dispatch_postprocess`` still all-gathers over the TP group): each
    rank permutes its T/tp tokens, the TP all-gather joins the top_k·T copies (2,048 rows of
    1,024 bytes) for the experts' TP slices and the reduce-scatter returns their output,
    the reverse backward. Before, no TP collective surrounded the routed experts."""
    doc = moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=4)
    doc["parallelism"].update({"tp": TP, "sp": True, "ep": 1})
    graph = build_taskgraph(parse_workload(doc, "t"), load_topology("dgx-h100:nodes=1"))
    fwd, bwd = _layer0(graph, "fwd"), _layer0(graph, "bwd")
    moe = lambda tasks: [(t.name.split()[2], t.group, t.size) for t in tasks
                         if t.kind == "collective" and t.name.split()[2].startswith("moe.")]
    assert moe(fwd) == [("moe.dispatch.ag", (0, 1), ROWS * H * 2), ("moe.combine.rs", (0, 1), ROWS * H * 2)]
    assert sorted(moe(bwd)) == [("moe.combine.ag", (0, 1), ROWS * H * 2), ("moe.dispatch.rs", (0, 1), ROWS * H * 2)]
    assert not [t for t in fwd + bwd if t.category == "ep"]
