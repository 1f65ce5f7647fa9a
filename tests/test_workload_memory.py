"""Per-GPU memory: ZeRO model states, activation formulas, pipeline in-flight, offload, fit check."""

from __future__ import annotations

import dataclasses

import pytest

from dessim.errors import MemoryFitError, WorkloadError
from dessim.workload import (
    PRECISIONS,
    MemoryOptions,
    ParallelLayout,
    TransformerConfig,
    check_fit,
    estimate_memory,
    layer_activation_bytes,
    load_workload,
    paper_activation_bytes,
    shipped_workloads,
    zero_state_bytes,
)
from dessim.workload.transformer.memory import layer_params_on_gpu, params_on_gpu

GB = 1e9
BF16 = PRECISIONS["bf16"]


# ---------------------------------------------------------------------- ZeRO
@pytest.mark.parametrize("stage,expected,paper", [
    (0, 120e9, 120.0),         # (2 + 2 + 12)Ψ
    (1, 31.40625e9, 31.4),     # 2Ψ + 2Ψ + 12Ψ/64
    (2, 16.640625e9, 16.6),    # 2Ψ + 14Ψ/64
    (3, 1.875e9, 1.9),         # 16Ψ/64
])
def test_zero_paper_figure_1(stage, expected, paper):
    # ZeRO (Rajbhandari et al. SC20) Fig. 1: Ψ = 7.5B, N_d = 64 (docs/references.md); the
    # paper's mixed precision keeps fp16 gradients (K = 12)
    b = zero_state_bytes(7.5e9, 64, stage, PRECISIONS["fp16"])
    assert b.total == pytest.approx(expected, rel=1e-12)
    assert round(b.total / GB, 1) == paper


@pytest.mark.parametrize("stage, per_param", [
    (0, 18.0),                  # Megatron-LM: "bf16 parameters, fp32 gradients": 18
    (1, 6 + 12 / 8),            # distributed optimizer: 6 + 12/d
    (2, 2 + (4 + 12) / 8),      # ZeRO-2 also shards the fp32 gradients
    (3, (2 + 4 + 12) / 8),
])
def test_bf16_bytes_per_parameter_are_megatrons_table(stage, per_param):
    """The bf16 recipe keeps fp32 gradients, as Megatron-LM (arguments.py sets
    accumulate_allreduce_grads_in_fp32 for --bf16) and Llama 3 (§3.3.2) do: per parameter
    Megatron-LM's distributed-optimizer table (docs/user-guide/features/dist_optimizer.md),
    18 bytes without sharding and 6 + 12/d with the distributed optimizer (ZeRO-1), d = 8."""
    b = zero_state_bytes(1.0, 8, stage, BF16)
    assert b.total == pytest.approx(per_param, rel=1e-12)
    assert b.gradients == pytest.approx(4.0 / (8 if stage >= 2 else 1), rel=1e-12)
    bf16_grads = zero_state_bytes(1.0, 8, stage, BF16.with_grad_precision("bf16"))
    assert b.gradients == 2 * bf16_grads.gradients
    assert (b.weights, b.optimizer) == (bf16_grads.weights, bf16_grads.optimizer)


def test_fp16_keeps_fp16_gradients_and_bf16_gradients_need_bf16_weights():
    """Megatron-LM leaves accumulate_allreduce_grads_in_fp32 off for --fp16 (fp16 gradients,
    its table's "fp16 parameters, fp16 gradients" row) and turns it on with
    --accumulate-allreduce-grads-in-fp32; bf16 gradients of fp16 weights are no recipe."""
    fp16 = PRECISIONS["fp16"]
    assert fp16.grad_bytes == 2 and fp16.with_grad_precision("fp32").grad_bytes == 4
    assert PRECISIONS["fp8"].grad_bytes == PRECISIONS["fp8-block"].grad_bytes == 4
    with pytest.raises(WorkloadError, match="training.grad_precision: bf16 gradients need bf16 weights"):
        fp16.with_grad_precision("bf16")
    with pytest.raises(WorkloadError, match="fp16 gradients need fp16 weights"):
        PRECISIONS["fp32"].with_grad_precision("fp16")


def test_zero_fp32_has_no_master_copy():
    b = zero_state_bytes(1e9, 1, 0, PRECISIONS["fp32"])
    assert (b.weights, b.gradients, b.optimizer) == (4e9, 4e9, 8e9)


# ---------------------------------------------------------------------- activations
S, B, H, A = 2048, 1, 12288, 96           # GPT-3 175B layer
GPT = TransformerConfig("gpt", layers=96, hidden=H, heads=A, ffn_hidden=4 * H, vocab=51200, seq_len=S)


def test_paper_formula_by_hand():
    # sbh(34 + 5as/h) = 2048·12288·(34 + 5·96·2048/12288) = 25,165,824 · 114
    assert paper_activation_bytes(S, B, H, A) == 25_165_824 * 114
    # TP 8: sbh(10 + 24/8 + 5as/(8h)) = 25,165,824 · (13 + 10)
    assert paper_activation_bytes(S, B, H, A, t=8) == 25_165_824 * 23
    assert paper_activation_bytes(S, B, H, A, t=8, sp=True) == 25_165_824 * 114 / 8
    assert paper_activation_bytes(S, B, H, A, t=8, sp=True, recompute="selective") == 25_165_824 * 34 / 8
    assert paper_activation_bytes(S, B, H, A, t=8, recompute="selective") == 25_165_824 * 13
    assert paper_activation_bytes(S, B, H, A, recompute="full") == 2 * 25_165_824


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (8, False), (8, True), (4, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("b", [1, 4])
def test_component_model_reproduces_korthikanti_table(tp, sp, recompute, b):
    # the paper's layer runs the unfused attention core (its softmax and dropout outputs are
    # the 5as/h term)
    layout = ParallelLayout(tp=tp, sp=sp, micro_batch=b, recompute=recompute, attention="unfused")
    assert layer_activation_bytes(GPT, layout) == pytest.approx(
        paper_activation_bytes(S, b, H, A, t=tp, sp=sp, recompute=recompute), rel=1e-12)


def test_activations_without_dropout_and_with_gqa_swiglu():
    llama = load_workload("llama2-70b").model
    s, h, a, f, kv = 4096, 8192, 64, 28672, 1024
    layout = ParallelLayout(tp=8, sp=True, attention="unfused")
    e = 2
    rest = (s * h // 8 * 4 * e                # 2 norm inputs, QKV input, MLP input (SP-sharded)
            + s * (2 * h + 2 * kv) / 8 * e      # Q, K, V, projection input
            + 3 * s * f / 8 * e)                # gate, up outputs and down input
    softmax = (a / 8) * s * s * e               # softmax output (no dropout)
    assert layer_activation_bytes(llama, layout) == pytest.approx(rest + softmax, rel=1e-12)
    # FlashAttention keeps the fp32 log-sum-exp of each query row and head instead
    for attention in ("flash2", "flash3"):
        flash = dataclasses.replace(layout, attention=attention)
        assert layer_activation_bytes(llama, flash) == pytest.approx(rest + (a / 8) * s * 4, rel=1e-12)


@pytest.mark.parametrize("model", ["gpt3-1.3b", "llama3-8b", "mixtral-8x7b"])
def test_flash_attention_stores_no_score_matrix(model):
    """FlashAttention never writes the s x s scores to HBM: its forward saves Q, K, V, the
    output and the fp32 softmax log-sum-exp per query row and head for the backward
    (Dao 2023, FlashAttention-2, Algorithm 1; Dao-AILab/flash-attention
    ``flash_attn/flash_attn_interface.py``, ``FlashAttnFunc.forward``: ``save_for_backward(q,
    k, v, out_padded, softmax_lse, rng_state)``). Without recomputation a layer then stores
    what selective recompute keeps plus the log-sum-exp: ``b·(a/t)·s_q·4`` bytes. Before the
    sanity3 hunt the s² softmax term of the unfused core was counted for every attention
    implementation: llama3-8b on 8 H100 (tp 1, mb 1, s 8192) showed 89.1 GB of activations
    with recompute none against 20.4 GB with selective."""
    spec = load_workload(model)
    m = spec.model
    for tp, sp, cp in ((1, False, 1), (2, True, 1), (4, False, 2)):
        lo = dataclasses.replace(spec.layout(), tp=tp, sp=sp, cp=cp, dp=1, ep=1, etp=None,
                                 attention="flash2", recompute="none").validate(m)
        selective = layer_activation_bytes(m, lo, recompute="selective")
        lse = lo.micro_batch * (m.heads / tp) * (m.seq_len // cp) * 4
        assert layer_activation_bytes(m, lo) == pytest.approx(selective + lse, rel=1e-12)
        unfused = dataclasses.replace(lo, attention="unfused")
        assert layer_activation_bytes(m, unfused) > layer_activation_bytes(m, lo)


def test_context_parallel_divides_tokens():
    base = ParallelLayout(tp=8, sp=True, recompute="selective")
    cp2 = dataclasses.replace(base, cp=2)
    assert layer_activation_bytes(GPT, cp2) == pytest.approx(layer_activation_bytes(GPT, base) / 2)


# ---------------------------------------------------------------------- pipeline and totals
def test_first_stage_holds_p_micro_batches_with_1f1b_and_m_with_gpipe():
    layout = ParallelLayout(tp=8, pp=8, dp=1, sp=True, recompute="selective", global_batch=32)
    est = [estimate_memory(GPT, layout, stage=s) for s in range(8)]
    per_layer = layer_activation_bytes(GPT, layout)
    assert [e.in_flight for e in est] == [8, 7, 6, 5, 4, 3, 2, 1]
    # First stage: p micro-batches × L/p layers = L layers' worth (Narayanan et al. 2021 §2.2) + embedding mask.
    mask = 2048 * 12288 // 8
    assert est[0].activations == pytest.approx(96 * per_layer + 8 * mask)
    gpipe = dataclasses.replace(layout, schedule="gpipe")
    assert estimate_memory(GPT, gpipe, stage=0).activations == pytest.approx(32 * 12 * per_layer + 32 * mask)
    inter = dataclasses.replace(layout, schedule="interleaved", virtual_stages=2)
    assert estimate_memory(GPT, inter, stage=0).activations > est[0].activations


@pytest.mark.parametrize("schedule,v,expected", [
    # (schedule, virtual stages, {stage: micro-batches of logits held at the peak})
    ("1f1b", 1, {3: 1}),                 # last stage: F then B of each micro-batch
    ("interleaved", 2, {3: 1}),          # last stage, last chunk: its F is followed by its B
    ("gpipe", 1, {3: 8}),                # every forward before any backward
    ("zb-h1", 1, {3: 4}),                # W deferred: held until W, min(p, m) (Qi et al. 2024)
    ("dualpipe", 1, {0: 1, 3: 1}),       # stage 0's reverse chunk and stage p-1's forward chunk
])
def test_output_layer_activations_count_the_last_piece_only(schedule, v, expected):
    """The logits (fp32, ``4·T·V/tp`` bytes, Megatron-LM's vocabulary-parallel cross-entropy)
    are held by the chunk that is the model's last piece, for as many micro-batches as the
    schedule's pass order keeps that chunk's forwards open — not the stage's whole in-flight
    count (DualPipe's stage 0 holds p+1 chunk passes, of which one is the last piece's)."""
    layout = ParallelLayout(tp=2, pp=4, dp=1, sp=True, recompute="selective", global_batch=8,
                            schedule=schedule, virtual_stages=v)
    small = dataclasses.replace(GPT, layers=16, vocab=51200)
    large = dataclasses.replace(small, vocab=51200 + 2 * 1000)
    T = S                                       # micro-batch 1, no CP
    for stage in range(4):
        delta = (estimate_memory(large, layout, stage=stage).activations
                 - estimate_memory(small, layout, stage=stage).activations)
        assert delta == pytest.approx(expected.get(stage, 0) * 4 * T * 1000, rel=1e-12, abs=1e-3), stage


def test_params_on_gpu_cover_the_model():
    for name in ("gpt3-175b", "llama3-70b", "mixtral-8x7b"):
        m = load_workload(name).model
        layout = ParallelLayout(pp=4 if m.layers % 4 == 0 else 1, global_batch=4)
        assert sum(sum(params_on_gpu(m, layout, s)) for s in range(layout.pp)) == m.num_params() + (
            m.vocab * m.hidden if m.tied_embeddings and layout.pp > 1 else 0)   # Megatron's head copy


def test_weights_gradients_optimizer_follow_zero_sharding_over_dp():
    m = load_workload("gpt3-13b").model
    layout = ParallelLayout(tp=4, dp=16, sp=True, zero_stage=1, global_batch=16)
    est = estimate_memory(m, layout)
    dense, expert = params_on_gpu(m, layout, 0)
    assert expert == 0 and est.params == dense
    assert est.weights == 2 * dense and est.gradients == 4 * dense     # bf16: fp32 gradients
    assert est.optimizer == pytest.approx(12 * dense / 16)
    z3 = estimate_memory(m, dataclasses.replace(layout, zero_stage=3))
    assert z3.weights == pytest.approx(2 * dense / 16)


def test_offload_moves_bytes_out_of_hbm():
    spec = load_workload("llama3-70b")
    m, layout = spec.model, spec.layout()
    base = estimate_memory(m, layout, stage=0)
    off = estimate_memory(m, layout, MemoryOptions(offload_optimizer="host", offload_activations="cxl"), stage=0)
    assert off.optimizer == 0
    assert off.offloaded["host"] == pytest.approx(base.optimizer)
    assert off.offloaded["cxl"] > 0
    assert off.total + off.offloaded["host"] + off.offloaded["cxl"] == pytest.approx(base.total)


@pytest.mark.parametrize("name", sorted(shipped_workloads()))
def test_every_preset_fits_80_gb(name):
    # 80 GB = the HBM of A100-80GB / H100 SXM (glennklockwood A100/H100), the presets' devices.
    spec = load_workload(name)
    est = estimate_memory(spec.model, spec.layout(), spec.memory_options())
    assert check_fit(est, 80e9) is est


def test_check_fit_reports_shortfall_and_computed_alternatives():
    m = load_workload("gpt3-175b").model
    layout = ParallelLayout(tp=8, pp=8, dp=2, sp=False, global_batch=16, recompute="none",
                            attention="unfused")      # the preset's (Megatron-LM 2021-22)
    est = estimate_memory(m, layout)
    with pytest.raises(MemoryFitError) as info:
        check_fit(est, 80e9)
    err = info.value
    assert err.shortfall == pytest.approx(est.total - 80e9)
    assert "exceeds the capacity of 80 GB (74.51GiB) by" in str(err)
    assert "would fit with:" in str(err)
    # Every suggestion really fits: re-derive one.
    assert err.suggestions and all(total <= 80e9 for _, total in err.suggestions)
    names = [n for n, _ in err.suggestions]
    assert any("recompute" in n or "sp=true" in n for n in names)


def test_check_fit_when_nothing_helps():
    m = load_workload("llama3-405b").model
    est = estimate_memory(m, ParallelLayout(tp=8, dp=1, recompute="full", zero_stage=3))
    with pytest.raises(MemoryFitError, match="use more GPUs or a device with more memory"):
        check_fit(est, 80e9)


def test_bad_memory_options():
    with pytest.raises(WorkloadError, match="offload_optimizer='disk' is unknown; valid: none, host, cxl"):
        MemoryOptions(offload_optimizer="disk")


def test_zero3_gathers_only_the_weights_it_shards():
    """ZeRO-3 all-gathers a layer's weights from their sharding group before using them: the
    dense weights over ``dp·cp``, the experts over ``edp``. With ``ep = dp`` (``edp = 1``)
    every rank holds its experts whole, so nothing of them is gathered and ZeRO-3's buffer
    holds two layers' dense weights only. Before the sanity3 hunt the buffer counted the
    experts too, and ZeRO-3 came out larger than ZeRO-2 (deepseek-v3, tp 1 pp 4 dp 2 ep 2,
    full recompute: 1315.3 GB -> 1333.1 GB per GPU)."""
    spec = load_workload("mixtral-8x7b")
    m = spec.model
    z2 = spec.layout(8, tp=1, dp=8, ep=8, zero_stage=2)
    assert z2.edp == 1
    z3 = dataclasses.replace(z2, zero_stage=3)
    dense, expert = layer_params_on_gpu(m, z3)
    e2, e3 = estimate_memory(m, z2), estimate_memory(m, z3)
    assert e3.comm_buffers - e2.comm_buffers == 2 * dense * 2      # bf16 weights, 2 layers
    assert e3.total <= e2.total
    # with edp = 2 the experts are sharded, and gathered
    z3_edp2 = spec.layout(8, tp=1, dp=8, ep=4, zero_stage=3)
    dense4, expert4 = layer_params_on_gpu(m, z3_edp2)
    z2_edp2 = dataclasses.replace(z3_edp2, zero_stage=2)
    assert (estimate_memory(m, z3_edp2).comm_buffers - estimate_memory(m, z2_edp2).comm_buffers
            == 2 * (dense4 + expert4) * 2)
