"""The workload generator's graphs: structure, sizes and counts (no simulation here)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from dessim.errors import WorkloadError
from dessim.taskgraph.io import taskgraph_to_dict
from dessim.topology import load_topology
from dessim.workload import (GeneratorOptions, ParallelLayout, TransformerConfig, build_taskgraph,
                             closed_form_flops, megatron_flops)
from dessim.workload.transformer.plan import plan_workload
from dessim.workload.transformer.memory import MemoryOptions, layer_activation_bytes
from dessim.workload.transformer.schedules import stage_program

GPT = TransformerConfig("tiny-gpt", layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=4096, seq_len=256)
MOE = TransformerConfig("tiny-moe", layers=2, hidden=512, heads=8, kv_heads=2, ffn_hidden=1024, vocab=4096,
                        seq_len=256, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                        bias=False, dropout=False, tied_embeddings=False, experts=4, top_k=2)
E = 2  # bf16 bytes per activation element
G = 4  # bytes per gradient element: the bf16 recipe reduces fp32 gradients (precision.py)


def topo(n: int):
    return load_topology(f"dgx-h100:nodes={n // 8}") if n >= 8 else load_topology(f"ring:{n},device=H100")


def exact(options: GeneratorOptions | None = None) -> GeneratorOptions:
    """``options`` with the automatic shortcuts off: every rank, one task per layer pass (these
    tests read the structure of the full graph)."""
    o = options or GeneratorOptions()
    return replace(o, granularity="layer" if o.granularity == "auto" else o.granularity,
                   fold=False if o.fold is None else o.fold)


def graph(model, n=8, options=None, memory=None, **layout):
    return build_taskgraph((model, ParallelLayout(**layout)), topo(n), options=exact(options), memory=memory)


def tasks(g, rank=None, **match):
    return [t for t in g if (rank is None or t.rank == rank)
            and all(getattr(t, k) == v for k, v in match.items())]


# ---------------------------------------------------------------- schedules
@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_every_stage_runs_each_pass_once_forward_before_backward(schedule, v):
    p, m = 4, 8
    for stage in range(p):
        ops = [op[:3] for op in stage_program(schedule, stage, p, m, v)]
        assert Counter(ops) == Counter({(ph, mb, c): 1 for ph in "FB" for mb in range(m) for c in range(v)})
        pos = {op: i for i, op in enumerate(ops)}
        assert all(pos[("F", mb, c)] < pos[("B", mb, c)] for mb in range(m) for c in range(v))


def test_1f1b_warms_up_with_p_minus_stage_minus_1_forwards():
    ops = stage_program("1f1b", 1, 4, 8)
    assert [o.phase for o in ops[:4]] == ["F", "F", "F", "B"]
    assert [o.phase for o in stage_program("1f1b", 3, 4, 8)[:2]] == ["F", "B"]


def test_interleaved_uses_megatron_chunk_order():
    ops = stage_program("interleaved", 0, 2, 4, 2)
    # warm-up 2(p-1) + (v-1)p = 4 forwards: mb 0,1 of chunk 0 then mb 0,1 of chunk 1
    assert [(o.phase, o.mb, o.chunk) for o in ops[:5]] == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0)]
    assert (ops[5].phase, ops[5].mb, ops[5].chunk) == ("B", 0, 1)  # backward starts at the last chunk


# ---------------------------------------------------------------- defaults
def test_defaults_pick_stage_granularity_and_folding_and_say_they_did():
    o = GeneratorOptions().resolved()
    assert (o.granularity, o.fold, o.auto) == ("stage", True, ("granularity", "fold"))
    explicit = GeneratorOptions(granularity="layer", fold=False).resolved()
    assert (explicit.granularity, explicit.fold, explicit.auto) == ("layer", False, ())


@pytest.mark.parametrize("hbm", ["48GB", "80GB"])   # the run needs 46.1 GB (fp32 gradients)
def test_an_hbm_override_keeps_the_automatic_shortcuts(hbm):
    """``--hbm`` (the override ``hbm_capacity``) changes the capacity checked, not the
    generator's options: it once put back the unresolved options, so a run given ``--hbm``
    fell back to layer granularity without folding (36 s instead of 0.8 s for llama3-8b on
    64 GPUs)."""
    plain, _ = plan_workload("llama3-8b", "dgx-h100:nodes=8")
    given, _ = plan_workload("llama3-8b", "dgx-h100:nodes=8", overrides={"hbm_capacity": hbm})
    assert given.options == plain.options
    assert (given.options.granularity, given.options.fold) == ("stage", True)
    assert given.capacity_bytes == float(hbm[:-2]) * 1e9
    unchecked, _ = plan_workload("llama3-8b", "dgx-h100:nodes=8",
                                 overrides={"hbm_capacity": "1GB", "generator": {"check_memory": False}})
    assert unchecked.options == replace(plain.options, check_memory=False)


@pytest.mark.parametrize("bucket", [-1, "25MB", True])
def test_a_bad_bucket_size_is_refused_when_the_options_are_made(bucket):
    with pytest.raises(WorkloadError, match="bucket_size"):
        GeneratorOptions(bucket_size=bucket)


def test_default_graph_is_folded_and_merged_where_exact():
    g = build_taskgraph((GPT, ParallelLayout(tp=2, pp=2, dp=2, global_batch=8)), topo(8))
    assert g.fold is not None and g.meta["granularity"] == "stage"
    full = graph(GPT, tp=2, pp=2, dp=2, global_batch=8)
    assert len(g) <= len(full) / 4      # 2 of 8 ranks (TP x DP folded), merged passes


@pytest.mark.parametrize("bad", [{"granularity": "fast"}, {"fold": "yes"}])
def test_bad_generator_options_are_refused(bad):
    with pytest.raises(WorkloadError):
        GeneratorOptions(**bad)


# ---------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("layout", [
    dict(tp=2, pp=2, dp=2, global_batch=8),
    dict(tp=2, pp=1, dp=2, cp=2, sp=True, global_batch=4, recompute="full"),
    dict(tp=1, pp=2, dp=4, global_batch=16, schedule="interleaved", virtual_stages=2, recompute="selective"),
])
def test_model_flops_of_the_graph_equal_the_closed_form(layout):
    g = graph(GPT, **layout)
    total = sum(t.attrs["model_flops"] for t in g if t.kind == "compute")
    gb = layout["global_batch"]
    assert total == pytest.approx(closed_form_flops(GPT, gb), rel=1e-12)
    assert total == pytest.approx(megatron_flops(gb, GPT.seq_len, GPT.layers, GPT.hidden, GPT.vocab), rel=1e-12)


def test_layer_granularity_is_one_task_per_layer_pass_without_communication_inside():
    g = graph(GPT, n=2, dp=2, global_batch=4, options=GeneratorOptions(embedding_head=False))
    fwd = tasks(g, rank=0, category="fwd")
    assert len(fwd) == GPT.layers * 2                 # 8 layers x 2 micro-batches
    assert all(t.kernel == "layer" and t.duration > 0 for t in fwd)


def test_kernel_granularity_gives_each_kernel_its_own_task_with_shape():
    g = graph(GPT, n=2, tp=2, global_batch=1, options=GeneratorOptions(granularity="kernel"))
    qkv = [t for t in tasks(g, rank=0, category="fwd") if t.name.split()[2] == "attn.qkv"]
    assert len(qkv) == GPT.layers
    assert qkv[0].kernel == "matmul" and qkv[0].shape == (256, (512 + 2 * 512) // 2, 512)


# ---------------------------------------------------------------- tensor / sequence parallel
def test_tp_all_reduces_two_forward_two_backward_per_layer_and_micro_batch():
    m = 2
    g = graph(GPT, n=2, tp=2, global_batch=m, options=GeneratorOptions(embedding_head=False))
    tp = tasks(g, rank=0, category="tp")
    assert Counter(t.op for t in tp) == {"allreduce": 4 * GPT.layers * m}
    assert {t.size for t in tp} == {256 * 512 * E}            # b·s·h·bytes
    assert {t.group for t in tp} == {(0, 1)}
    names = Counter(t.name.split()[2] for t in tp)
    assert names == {"attn.g.ar": 16, "mlp.g.ar": 16, "mlp.f.ar": 16, "attn.f.ar": 16}


def test_sequence_parallel_turns_them_into_gathers_and_reduce_scatters():
    g = graph(GPT, n=2, tp=2, sp=True, global_batch=1, options=GeneratorOptions(embedding_head=False))
    ops = Counter(t.op for t in tasks(g, rank=0, category="tp"))
    # forward: AG + RS per sub-layer; backward: RS + AG, and AG of the sharded input for wgrad
    assert ops == {"allgather": 6 * GPT.layers, "reducescatter": 4 * GPT.layers}
    assert {t.size for t in tasks(g, category="tp")} == {256 * 512 * E}


def test_embedding_and_head_add_their_vocabulary_parallel_all_reduces():
    g = graph(GPT, n=2, tp=2, global_batch=1)
    names = Counter(t.name.split()[1] for t in tasks(g, rank=0, category="tp"))
    assert names["embed"] == 1 and names["head"] == 1


# ---------------------------------------------------------------- pipeline
@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_pipeline_sends_match_receives_with_activation_sizes(schedule, v):
    p, m = 4, 8
    g = graph(GPT, n=4, pp=p, global_batch=m, schedule=schedule, virtual_stages=v)
    g.validate(num_ranks=4)                                    # every send has its recv
    sends = tasks(g, kind="send", category="pp")
    assert len(sends) == 2 * m * (p * v - 1)                   # acts forward + grads backward
    assert {t.size for t in sends} == {256 * 512 * E}
    assert len(tasks(g, kind="recv", category="pp")) == len(sends)


def test_pipeline_messages_are_sharded_over_tp_with_sequence_parallelism():
    g = graph(GPT, n=8, tp=2, pp=4, sp=True, global_batch=4)
    assert {t.size for t in tasks(g, kind="send", category="pp")} == {256 * 512 * E / 2}


# ---------------------------------------------------------------- data parallel and ZeRO
def test_dp_buckets_cover_every_gradient_once():
    g = graph(GPT, n=8, dp=8, global_batch=8, options=GeneratorOptions(bucket_size=4 * 2**20))
    ar = tasks(g, rank=0, category="dp")
    assert len(ar) > 1 and {t.op for t in ar} == {"allreduce"}
    assert sum(t.size for t in ar) == pytest.approx(GPT.num_params() * G)
    one = graph(GPT, n=8, dp=8, global_batch=8, options=GeneratorOptions(bucket_size=0))
    assert [t.size for t in tasks(one, rank=0, category="dp")] == [pytest.approx(GPT.num_params() * G)]


def test_zero1_reduce_scatters_then_gathers_updated_parameters():
    g = graph(GPT, n=8, dp=8, global_batch=8, zero_stage=1, options=GeneratorOptions(bucket_size=0))
    ops = [(t.op, t.size) for t in tasks(g, rank=0, category="dp")]
    assert ops == [("reducescatter", pytest.approx(GPT.num_params() * G)),
                   ("allgather", pytest.approx(GPT.num_params() * 2))]    # bf16 weights


def test_zero3_gathers_every_block_before_forward_and_backward():
    m = 2
    g = graph(GPT, n=8, dp=8, global_batch=8 * m, zero_stage=3)
    ag = tasks(g, rank=0, category="dp", op="allgather")
    rs = tasks(g, rank=0, category="dp", op="reducescatter")
    blocks = GPT.layers + 2                                    # layers + embedding + head
    assert len(ag) == 2 * blocks * m and len(rs) == blocks * m
    assert {t.stream for t in ag} == {"dp.ag"}
    assert sum(t.size for t in rs) == pytest.approx(m * GPT.num_params() * G)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_fp32_gradient_reduction_moves_twice_the_bf16_option(zero):
    """The bf16 recipe's data-parallel gradient reduction is fp32 (Megatron-LM, Llama 3 §3.3.2):
    twice the bytes of ``training.grad_precision: bf16`` (Megatron's --grad-reduce-in-bf16),
    whatever the ZeRO stage; ZeRO's parameter all-gathers stay bf16."""
    def dp_bytes(model):
        g = graph(model, n=8, dp=8, global_batch=8, zero_stage=zero, options=GeneratorOptions(bucket_size=0))
        ts = tasks(g, rank=0, category="dp")
        return ({op: sum(t.size for t in ts if t.op == op) for op in ("allreduce", "reducescatter")},
                sum(t.size for t in ts if t.op == "allgather"))
    (fp32, gathered), (bf16, gathered16) = dp_bytes(GPT), dp_bytes(replace(GPT, grad_precision="bf16"))
    assert sum(fp32.values()) == pytest.approx(GPT.num_params() * 4) and sum(bf16.values()) > 0
    assert fp32 == {op: 2 * b for op, b in bf16.items()} and gathered == gathered16


# ---------------------------------------------------------------- experts, context, offload
def test_mixtral_has_expert_all_to_alls():
    plan, tp = plan_workload("mixtral-8x7b", "dgx-h100:nodes=1", overrides={
        "model": {"layers": 2}, "training": {"global_batch": 8, "seq_len": 512}, "tp": 1, "ep": 8})
    g = build_taskgraph(plan, tp)
    a2a = tasks(g, rank=0, category="ep")
    assert {t.op for t in a2a} == {"alltoall"} and len(a2a) == 4 * 2 * 1   # 2 fwd + 2 bwd per layer
    assert {t.group for t in a2a} == {tuple(range(8))}
    assert {t.size for t in a2a} == {2 * 512 * 4096 * E}      # top_k · tokens · h · bytes


def test_expert_parallel_inside_data_parallel_groups():
    g = graph(MOE, n=8, tp=2, dp=4, ep=2, sp=True, global_batch=4)
    a2a = tasks(g, rank=0, category="ep")
    assert len(a2a) == 4 * MOE.layers and {len(t.group) for t in a2a} == {2}


def test_context_parallel_ring_passes_kv_blocks():
    cp, m = 4, 1
    g = graph(GPT, n=4, cp=cp, global_batch=m, recompute="selective")
    sends = tasks(g, rank=0, kind="send", category="cp")
    kv = 2 * 256 // cp * 512 * E                               # K and V of the local chunk
    per_layer = Counter(t.size for t in sends)
    # cp-1 exchanges per attention: forward, recomputation (selective), backward (K/V + their grads)
    assert per_layer == {kv: 2 * (cp - 1) * GPT.layers, 2 * kv: (cp - 1) * GPT.layers}
    assert {t.peer for t in sends} == {1} and {t.peer for t in tasks(g, rank=0, kind="recv")} == {3}
    g.validate(num_ranks=4)


def test_context_parallel_attention_blocks_cost_one_kv_block_each():
    """Each ring step attends the local queries to ONE K/V block (s/cp keys): its shape says
    so, and the cp blocks' FLOPs by shape (what the device model costs) add up to the whole
    attention's — not cp times it."""
    from dessim.engine.kernel_model import attention_flops_fa

    cp, kernels = 4, GeneratorOptions(granularity="kernel")
    whole = [t for t in tasks(graph(GPT, n=2, dp=2, global_batch=2, options=kernels), rank=0,
                              kind="compute")
             if t.kernel.startswith("attention") and t.category == "fwd"]
    parts = [t for t in tasks(graph(GPT, n=cp, cp=cp, global_batch=1, options=kernels), rank=0,
                              kind="compute")
             if t.kernel.startswith("attention") and t.category == "fwd"]
    assert len(parts) == cp * len(whole)
    by_shape = lambda t: attention_flops_fa(*t.shape[:4], bool(t.shape[4]), "fwd")  # noqa: E731
    bh, s_q, s_k, d, causal = whole[0].shape
    assert {t.shape for t in parts} == {(bh, s_q // cp, s_k // cp, d, causal)}
    assert sum(map(by_shape, parts)) == pytest.approx(sum(map(by_shape, whole)) / cp)
    assert sum(t.flops for t in parts) == pytest.approx(sum(t.flops for t in whole) / cp)


def test_offload_moves_optimizer_state_and_activations_to_the_nearest_host_memory():
    mem = MemoryOptions(offload_optimizer="host", offload_activations="host")
    g = graph(GPT, n=8, dp=8, global_batch=16, zero_stage=1, memory=mem)
    copies = tasks(g, rank=0, kind="memcpy")
    assert {t.category for t in copies} == {"offload"}
    assert {t.mem_node for t in copies} == {"n0.mem0"}
    act = [t for t in copies if ".act." in t.name]
    lo = ParallelLayout(dp=8, global_batch=16)
    assert len(act) == 2 * GPT.layers * 2                     # out and back, per layer and micro-batch
    assert {t.size for t in act} == {layer_activation_bytes(GPT, lo)}
    opt = [t for t in copies if "optimizer" in t.name]
    assert {t.direction for t in opt} == {"to_hbm", "from_hbm"}
    assert sum(t.size for t in opt if t.direction == "to_hbm") == pytest.approx(GPT.num_params() * 12 / 8)


def test_free_communication_keeps_the_structure_with_zero_time_stand_ins():
    g = graph(GPT, n=8, tp=2, pp=2, dp=2, global_batch=4, options=GeneratorOptions(comm=False))
    assert not [t for t in g if t.is_comm]
    stand_ins = [t for t in g if t.kind == "delay"]
    assert stand_ins and {t.duration for t in stand_ins} == {0.0}
    assert {t.category for t in stand_ins} == {"tp", "pp", "dp"}


def test_generation_is_deterministic():
    a = graph(GPT, n=8, tp=2, pp=2, dp=2, global_batch=4, sp=True, zero_stage=1)
    b = graph(GPT, n=8, tp=2, pp=2, dp=2, global_batch=4, sp=True, zero_stage=1)
    assert taskgraph_to_dict(a) == taskgraph_to_dict(b)


@pytest.mark.parametrize("fold", [False, True])
def test_context_parallel_transfers_copied_from_templates_equal_checked_ones(monkeypatch, fold):
    """A CP ring's sends and receives are copies of a per-rank template
    (TaskEmitter.p2p_like): the graph equals the one whose transfers are each built and
    checked by TaskEmitter.p2p, task for task and edge for edge."""
    from dessim.workload.common.emitter import TaskEmitter

    def build():
        plan, topo = plan_workload("llama3-8b", "dgx-h100:nodes=2", overrides={
            "tp": 2, "pp": 2, "cp": 4, "global_batch": 4, "micro_batch": 1, "model": {"layers": 2},
            "generator": {"granularity": "layer", "fold": fold}})
        return taskgraph_to_dict(build_taskgraph(plan, topo))

    copied = build()
    assert sum(t["kind"] == "send" and t.get("category") == "cp" for t in copied["tasks"]) > 0
    monkeypatch.setattr(TaskEmitter, "p2p_like", lambda em, proto, name, tag, deps=(): em.p2p(
        proto.rank, proto.kind, proto.peer, tag, proto.size, name, proto.category, proto.stream, deps))
    assert build() == copied
