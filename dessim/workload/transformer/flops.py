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

from dessim.errors import WorkloadError
from dessim.workload.common.kernels import KernelSet, sum_flops
from dessim.workload.transformer.kernels import embedding_kernels, head_kernels, layer_kernels
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
    ``6·(2h² + 2h·kv_dim)`` (Q, K, V, output projections) ``+ 12·s·h`` (attention scores and
    context, full ``s²``) ``+ 6·k·mats·h·f`` (``k`` active MLPs of ``mats`` matrices, width
    ``f``) ``+ 6·h·E`` (MoE router, if any), plus ``6·h·V`` per token for the LM head. For a
    GPT model (``kv_dim = h``, ``f = 4h``, 2 matrices, dense) this is exactly
    :func:`megatron_flops` without recomputation; it is also Megatron-LM's
    ``num_floating_point_operations`` except that the router is counted here.
    """
    s = model.seq_len if seq_len is None else seq_len
    h, l, V = model.hidden, model.layers, model.vocab
    k = model.top_k if model.is_moe else 1
    f = model.moe_ffn_hidden if model.is_moe else model.ffn_hidden
    per_token_layer = (6 * (2 * h * h + 2 * h * model.kv_dim) + 12 * s * h
                       + 6 * k * model.activation_spec.matrices * h * f  # type: ignore[operator]
                       + (6 * h * model.experts if model.is_moe else 0))
    return float(batch * s * (l * per_token_layer + 6 * h * V))


def _whole_model_sets(model: TransformerConfig, batch: int, recompute: str) -> tuple[KernelSet, ...]:
    layout = ParallelLayout(micro_batch=batch, recompute=recompute)
    return layer_kernels(model, layout), embedding_kernels(model, layout), head_kernels(model, layout)


def _check_batch(batch: int, what: str) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkloadError(f"{what}: batch={batch!r} must be a whole number >= 1")


def model_flops_per_iteration(model: TransformerConfig, global_batch: int) -> float:
    """Model FLOPs of one iteration over ``global_batch`` sequences of ``model.seq_len``
    tokens: the sum of the (unsharded) kernel list's matmul and attention FLOPs."""
    _check_batch(global_batch, "model FLOPs")
    layer, embed, head = _whole_model_sets(model, global_batch, "none")
    return float(model.layers * layer.model_flops() + embed.model_flops() + head.model_flops())


def hardware_flops_per_iteration(model: TransformerConfig, global_batch: int,
                                 recompute: str = "none") -> float:
    """Matmul and attention FLOPs executed per iteration, including the forward work that
    ``recompute`` (none | selective | full) re-runs. With ``full`` on a GPT model this is
    Narayanan et al.'s Eq. 3 (96·B·s·l·h²·(...))."""
    _check_batch(global_batch, "hardware FLOPs")
    layer, embed, head = _whole_model_sets(model, global_batch, recompute)
    return float(model.layers * layer.hardware_flops() + embed.hardware_flops() + head.hardware_flops())


def stage_flops(model: TransformerConfig, layout: ParallelLayout, stage: int,
                hardware: bool = True) -> float:
    """FLOPs one GPU of pipeline stage ``stage`` executes per iteration (all its
    micro-batches): every kernel with ``hardware=True`` (elementwise estimates and
    recomputation included), else only model FLOPs."""
    layout.validate(model)
    layers = sum(len(r) for r in layout.stage_layers(model.layers, stage))
    sets = [layer_kernels(model, layout)] * layers
    pieces = {layout.piece_of(stage, c) for c in range(layout.chunks)}
    if 0 in pieces:
        sets.append(embedding_kernels(model, layout))
    if layout.pipeline_pieces - 1 in pieces:
        sets.append(head_kernels(model, layout))
    per_micro_batch = sum(sum_flops(ks.all, model_only=not hardware) for ks in sets)
    return per_micro_batch * layout.num_micro_batches


def mfu(model_flops: float, iteration_time: float, num_gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``model_flops / (iteration_time · num_gpus · peak_flops)``
    (seconds, GPUs, FLOP/s per GPU). Pass hardware FLOPs instead to get HFU."""
    if iteration_time <= 0 or num_gpus < 1 or peak_flops <= 0:
        raise WorkloadError(f"MFU: iteration_time={iteration_time!r} s, num_gpus={num_gpus!r} and "
                            f"peak_flops={peak_flops!r} FLOP/s must all be positive")
    return model_flops / (iteration_time * num_gpus * peak_flops)
