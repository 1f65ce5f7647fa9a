"""Kernel lists and FLOPs per iteration: the closed forms of Narayanan et al. 2021 and
Megatron-LM (docs/references.md)."""

from __future__ import annotations

import dataclasses

import pytest

from dessim.errors import WorkloadError
from dessim.workload import (
    ParallelLayout,
    TransformerConfig,
    closed_form_flops,
    embedding_kernels,
    hardware_flops_per_iteration,
    head_kernels,
    layer_kernels,
    load_workload,
    megatron_flops,
    mfu,
    model_flops_per_iteration,
    stage_flops,
)
from dessim.workload.common.kernels import ATTENTION, KINDS, MATMUL, sum_flops

# The 1T-parameter GPT of Narayanan et al. (SC21), the check example of its Eq. 3.
GPT_1T = TransformerConfig("gpt-1t", layers=128, hidden=25600, heads=160, ffn_hidden=4 * 25600,
                           vocab=51200, seq_len=2048)


def test_reference_check_value_5_1e19():
    # Narayanan et al. 2021, Eq. 3: B=3072, s=2048, l=128, h=25600, V=51200 → ≈ 5.1e19 FLOPs.
    f = megatron_flops(3072, 2048, 128, 25600, 51200, full_recompute=True)
    assert f == pytest.approx(5.1e19, rel=0.01)
    # Eq. 3 by hand: 96·B·s·l·h² = 5.0665e19, times (1 + 2048/153600 + 51200/52428800).
    assert f == pytest.approx(96 * 3072 * 2048 * 128 * 25600**2 * (1 + 1 / 75 + 1 / 1024), rel=1e-12)


def test_kernel_sum_equals_megatron_closed_forms_for_gpt():
    # Model FLOPs (no recompute): 72·B·s·l·h²·(1 + s/6h + V/12lh); full recompute: 96·...(V/16lh).
    B = 3072
    assert model_flops_per_iteration(GPT_1T, B) == pytest.approx(
        megatron_flops(B, 2048, 128, 25600, 51200), rel=1e-12)
    assert hardware_flops_per_iteration(GPT_1T, B, "full") == pytest.approx(
        megatron_flops(B, 2048, 128, 25600, 51200, full_recompute=True), rel=1e-12)
    assert hardware_flops_per_iteration(GPT_1T, B, "none") == model_flops_per_iteration(GPT_1T, B)


def test_selective_recompute_adds_one_attention_forward_per_layer():
    m, B = load_workload("gpt3-175b").model, 8
    extra = hardware_flops_per_iteration(m, B, "selective") - model_flops_per_iteration(m, B)
    assert extra == pytest.approx(m.layers * 4 * B * m.seq_len**2 * m.hidden, rel=1e-12)


@pytest.mark.parametrize("preset", ["gpt3-175b", "llama2-70b", "llama3-8b", "mixtral-8x7b"])
def test_generalised_closed_form_equals_kernel_sum(preset):
    model = load_workload(preset).model
    assert model_flops_per_iteration(model, 16) == pytest.approx(closed_form_flops(model, 16), rel=1e-12)


def test_generalised_closed_form_reduces_to_megatron_for_gpt():
    assert closed_form_flops(GPT_1T, 64) == pytest.approx(megatron_flops(64, 2048, 128, 25600, 51200), rel=1e-12)


def test_moe_flops_count_active_experts_only():
    moe = load_workload("mixtral-8x7b").model
    dense_like = dataclasses.replace(moe, experts=1, top_k=1, ffn_hidden=2 * moe.ffn_hidden,
                                     moe_ffn_hidden=None)
    router = 6 * moe.hidden * moe.experts * moe.layers * 4 * moe.seq_len
    # Two experts of width f per token cost the same GEMM FLOPs as one MLP of width 2f.
    assert model_flops_per_iteration(moe, 4) - router == pytest.approx(
        model_flops_per_iteration(dense_like, 4), rel=1e-12)


def test_model_flops_close_to_six_n_d_rule():
    # 6·N·D (Kaplan et al. 2020) ignores attention s² and embeddings: within a few % for GPT-3.
    m = load_workload("gpt3-175b").model
    tokens = 1536 * m.seq_len
    assert model_flops_per_iteration(m, 1536) == pytest.approx(6 * m.num_params() * tokens, rel=0.05)


# ---------------------------------------------------------------------- kernels
def test_layer_kernel_shapes_gpt_tp8_sp():
    m = load_workload("gpt3-175b").model
    layout = ParallelLayout(tp=8, sp=True, micro_batch=2)
    ks = layer_kernels(m, layout)
    by_name = {k.name: k for k in ks.forward}
    T, h = 2 * 2048, 12288
    assert by_name["attn.qkv"].shape == (T, 3 * h // 8, h)
    assert by_name["attn.proj"].shape == (T, h, h // 8)
    assert by_name["mlp.up"].shape == (T, 4 * h // 8, h)
    assert by_name["mlp.down"].shape == (T, h, 4 * h // 8)
    assert by_name["attn.core"].flops == 4 * 2 * 2048 * 2048 * h / 8
    # FlashAttention-style bytes: Q, K, V in, O out — no s² term.
    assert by_name["attn.core"].bytes == 2 * (4 * T * h // 8)
    # Sequence parallelism: norms on T / tp tokens.
    assert by_name["attn.norm"].bytes_written == 2 * (T // 8) * h
    assert by_name["attn.qkv"].bytes_read == 2 * (T * h + h * 3 * h // 8)
    assert {k.kind for k in ks.all} <= set(KINDS)


def test_backward_is_dgrad_and_wgrad_with_forward_flops_each():
    m = load_workload("llama3-8b").model
    ks = layer_kernels(m, ParallelLayout(tp=2))
    fwd_mm = [k for k in ks.forward if k.kind == MATMUL]
    for k in fwd_mm:
        dgrad = next(b for b in ks.backward if b.name == k.name + ".dgrad")
        wgrad = next(b for b in ks.backward if b.name == k.name + ".wgrad")
        mm, n, kk = k.shape
        assert dgrad.shape == (mm, kk, n) and wgrad.shape == (kk, n, mm)
        assert dgrad.flops == wgrad.flops == k.flops
    att_f = sum(k.flops for k in ks.forward if k.kind == ATTENTION)
    att_b = sum(k.flops for k in ks.backward if k.kind == ATTENTION)
    assert att_b == 2 * att_f
    assert sum_flops(ks.backward, model_only=True) == 2 * sum_flops(ks.forward, model_only=True)
    assert ks.backward[0].name.startswith("mlp.residual")      # reverse order


def test_recompute_kernels_follow_policy():
    m = load_workload("gpt3-13b").model
    none = layer_kernels(m, ParallelLayout(recompute="none"))
    sel = layer_kernels(m, ParallelLayout(recompute="selective"))
    full = layer_kernels(m, ParallelLayout(recompute="full"))
    assert none.recompute == ()
    assert [k.name for k in sel.recompute] == ["attn.core"]
    assert [k.name for k in full.recompute] == [k.name for k in full.forward]
    assert all(k.phase == "recompute" and not k.is_model_flops for k in full.recompute)
    assert full.model_flops() == none.model_flops()


@pytest.mark.parametrize("preset,tp,cp,ep", [("gpt3-175b", 8, 2, 1), ("llama3-70b", 8, 1, 1),
                                             ("mixtral-8x7b", 2, 1, 4)])
def test_sharding_conserves_model_flops(preset, tp, cp, ep):
    # With SP every rank does 1/(tp·cp) of a micro-batch's matmul+attention work; under EP each
    # rank still runs top_k expert MLPs' worth of its own tokens (balanced routing).
    m = load_workload(preset).model
    whole = ParallelLayout(micro_batch=2)
    shard = ParallelLayout(tp=tp, cp=cp, dp=ep, ep=ep, sp=True, micro_batch=2)
    per_rank = layer_kernels(m, shard).model_flops()
    assert per_rank * tp * cp == pytest.approx(layer_kernels(m, whole).model_flops(), rel=1e-12)
    assert head_kernels(m, shard).model_flops() * tp * cp == pytest.approx(
        head_kernels(m, whole).model_flops(), rel=1e-12)


def test_moe_grouped_gemm_holds_local_experts():
    m = load_workload("mixtral-8x7b").model
    ks = layer_kernels(m, ParallelLayout(tp=2, dp=4, ep=4))
    up = next(k for k in ks.forward if k.name == "moe.expert.up")
    assert up.groups == 2                                    # 8 experts / ep 4
    assert up.shape == (2 * 4096, 14336 // 2, 4096)          # top-2 × T tokens routed to this rank
    assert up.bytes_read == 2 * (2 * 4096 * 4096 + 2 * 4096 * 7168)


def test_embedding_kernel_is_not_model_flops():
    m = load_workload("gpt3-1.3b").model
    assert embedding_kernels(m, ParallelLayout()).model_flops() == 0


def test_stage_flops_sum_to_cluster_model_flops():
    m = load_workload("gpt3-175b").model
    layout = ParallelLayout(tp=8, pp=8, dp=2, sp=True, global_batch=16)
    total = sum(stage_flops(m, layout, s, hardware=False) for s in range(layout.pp)) * layout.tp * layout.dp
    assert total == pytest.approx(model_flops_per_iteration(m, 16), rel=1e-12)


def test_mfu():
    assert mfu(1e18, 2.0, 1000, 1e15) == pytest.approx(0.5)
    with pytest.raises(WorkloadError, match="iteration_time=0"):
        mfu(1e18, 0, 8, 1e15)


def test_kernels_reject_a_layout_that_does_not_fit_the_model():
    with pytest.raises(WorkloadError, match="heads=16 is not divisible by tp=3"):
        layer_kernels(load_workload("gpt3-1.3b").model, ParallelLayout(tp=3))
