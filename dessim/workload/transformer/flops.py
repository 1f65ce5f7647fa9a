"""FLOPs per training iteration: model FLOPs, hardware FLOPs, MFU.

*Model FLOPs* are the matmul and attention FLOPs of one forward and one backward pass over
the global batch, independent of how the work is parallelised or recomputed (the numerator
of MFU, Chowdhery et al. 2022 / Korthikanti et al. 2022). *Hardware FLOPs* add what
activation recomputation re-executes (the numerator of HFU).

:func:`model_flops_per_iteration` sums the kernel list of :mod:`dessim.workload.transformer.kernels`
(unsharded), so it holds for any architecture the kernels describe (GQA, SwiGLU, MoE with
``top_k`` active experts, router included). The closed forms below reproduce the published
formulas and are what the tests hold the kernel sums to.
"""

from __future__ import annotations

from typing import Iterable

from dessim.errors import WorkloadError
from dessim.workload.common.kernels import KernelSet, sum_flops
from dessim.workload.transformer.kernels import (embedding_kernels, head_kernels, layer_kernels,
                                                mtp_kernels)
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig

__all__ = [
    "megatron_flops",
    "closed_form_flops",
    "model_flops_per_iteration",
    "hardware_flops_per_iteration",
    "stage_flops",
    "mfu",
]


def megatron_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int,
                   full_recompute: bool = False) -> float:
    """FLOPs per iteration of a GPT model by Narayanan et al. (SC21) Eq. 3 (reference
    README §4): ``72·B·s·l·h²·(1 + s/(6h) + V/(12lh))`` without recomputation and
    ``96·B·s·l·h²·(1 + s/(6h) + V/(16lh))`` with full recomputation (an extra forward of
    every layer, not of the LM head). Assumes ``ffn = 4h``, multi-head attention, GeLU."""
    B, s, l, h, V = batch, seq_len, layers, hidden, vocab
    if full_recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def closed_form_flops(model: TransformerConfig, batch: int, seq_len: int | None = None) -> float:
    """Model FLOPs per iteration in closed form, generalised to GQA, gated MLPs and MoE.

    Per token and layer, forward + backward (3× the forward's ``2·params`` FLOPs):
    ``6·(2h² + 2h·kv_dim)`` (Q, K, V, output projections; MLA: 6 × its projection weights)
    ``+ 12·s·h`` (attention scores and context, full ``s²``; MLA: ``6·s·H·(d_qk + d_v)``)
    ``+ 6·k·mats·h·f`` (``k`` active MLPs of ``mats`` matrices, width ``f``: ``top_k +
    shared_experts`` of width ``moe_ffn_hidden`` in MoE layers, one of ``ffn_hidden`` in the
    dense ones) ``+ 6·h·E`` (MoE router), plus ``6·h·V`` per token for the LM head, and per
    multi-token-prediction module ``6·2h²`` (projection), one MoE layer and the head. For a
    GPT model (``kv_dim = h``, ``f = 4h``, 2 matrices, dense) this is exactly
    :func:`megatron_flops` without recomputation; it is also Megatron-LM's
    ``num_floating_point_operations`` except that the router is counted here.
    """
    s = model.seq_len if seq_len is None else seq_len
    h, V = model.hidden, model.vocab
    mats = model.activation_spec.matrices
    # attention projections (MLA: its down- and up-projections) and core (2·h per query-key
    # pair for standard attention, H·(d_qk + d_v) for MLA)
    attention = 6 * model.attention_matmul_params() + 6 * s * model.attention_core_width
    dense_layer = attention + 6 * mats * h * model.ffn_hidden
    moe_layer = (attention + 6 * (model.top_k + model.shared_experts) * mats * h
                 * model.moe_ffn_hidden + 6 * h * model.experts)  # type: ignore[operator]
    dense = model.layers - model.moe_layers
    per_token = (dense * dense_layer + model.moe_layers * moe_layer + 6 * h * V
                 # MTP: projection 2h -> h, one MoE layer, the shared LM head
                 + model.mtp_modules * (6 * 2 * h * h + moe_layer + 6 * h * V))
    return float(batch * s * per_token)


def _whole_model_sets(model: TransformerConfig, batch: int, recompute: str) -> list[KernelSet]:
    """Every kernel set of one pass over the whole (unsharded) model, once per occurrence."""
    layout = ParallelLayout(micro_batch=batch, recompute=recompute)
    return _sets(model, layout, range(model.layers), True, True)


def _sets(model: TransformerConfig, layout: ParallelLayout, layers: Iterable[int], first: bool,
          last: bool) -> list[KernelSet]:
    """The kernel sets of ``layers`` (+ the embedding when ``first``; the LM head and the MTP
    modules when ``last``)."""
    kinds = {d: layer_kernels(model, layout, d) for d in {False, model.is_moe and bool(model.dense_layers)}}
    out = [kinds[model.is_moe and model.is_dense_layer(i)] for i in layers]
    if first:
        out.append(embedding_kernels(model, layout))
    if last:
        head = head_kernels(model, layout)
        out.append(head)
        out += [mtp_kernels(model, layout), kinds[False], head] * model.mtp_modules
    return out


def _check_batch(batch: int, what: str) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkloadError(f"{what}: batch={batch!r} must be a whole number >= 1")


def model_flops_per_iteration(model: TransformerConfig, global_batch: int) -> float:
    """Model FLOPs of one iteration over ``global_batch`` sequences of ``model.seq_len``
    tokens: the sum of the (unsharded) kernel list's matmul and attention FLOPs."""
    _check_batch(global_batch, "model FLOPs")
    return float(sum(ks.model_flops() for ks in _whole_model_sets(model, global_batch, "none")))


def hardware_flops_per_iteration(model: TransformerConfig, global_batch: int,
                                 recompute: str = "none") -> float:
    """Matmul and attention FLOPs executed per iteration, including the forward work that
    ``recompute`` (none | selective | full) re-runs. With ``full`` on a GPT model this is
    Narayanan et al.'s Eq. 3 (96·B·s·l·h²·(...))."""
    _check_batch(global_batch, "hardware FLOPs")
    return float(sum(ks.hardware_flops() for ks in _whole_model_sets(model, global_batch, recompute)))


def stage_flops(model: TransformerConfig, layout: ParallelLayout, stage: int,
                hardware: bool = True) -> float:
    """FLOPs one GPU of pipeline stage ``stage`` executes per iteration (all its
    micro-batches): every kernel with ``hardware=True`` (elementwise estimates and
    recomputation included), else only model FLOPs."""
    layout.validate(model)
    layers = [i for chunk in layout.stage_layers(model.layers, stage) for i in chunk]
    pieces = {layout.piece_of(stage, c) for c in range(layout.chunks)}
    sets = _sets(model, layout, layers, 0 in pieces, layout.pipeline_pieces - 1 in pieces)
    per_micro_batch = sum(sum_flops(ks.all, model_only=not hardware) for ks in sets)
    return per_micro_batch * layout.num_micro_batches


def mfu(model_flops: float, iteration_time: float, num_gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``model_flops / (iteration_time · num_gpus · peak_flops)``
    (seconds, GPUs, FLOP/s per GPU). Pass hardware FLOPs instead to get HFU."""
    if iteration_time <= 0 or num_gpus < 1 or peak_flops <= 0:
        raise WorkloadError(f"MFU: iteration_time={iteration_time!r} s, num_gpus={num_gpus!r} and "
                            f"peak_flops={peak_flops!r} FLOP/s must all be positive")
    return model_flops / (iteration_time * num_gpus * peak_flops)
