"""Per-GPU memory estimates of a training job, and whether they fit a device.

Categories (bytes per GPU, for the worst pipeline stage unless a stage is asked for):

weights, gradients, optimizer
    Mixed-precision Adam by ZeRO (Rajbhandari et al., SC20, §3.1; docs/references.md): per
    parameter ``param_bytes`` (2) of weights, ``grad_bytes`` of gradients (4 with the bf16
    recipes' fp32 gradients, 2 with fp16 or ``training.grad_precision: bf16``:
    :mod:`dessim.workload.common.precision`) and *K* (12) of optimizer state, i.e. 18 bytes
    (Megatron-LM's "bf16 parameters, fp32 gradients" row; 16 with 16-bit gradients, ZeRO's
    count); ZeRO stage 1 shards the optimizer state over the
    data-parallel group, stage 2 also the gradients, stage 3 (FSDP) also the weights.
    The sharding group is ``dp·cp`` for dense weights (CP ranks hold the same weights) and
    ``edp·cp`` for expert weights (``edp`` = world / (etp·ep·pp) with ``etp != tp``). Parameters
    per GPU are the layer parameters of the stage split over TP (norm weights, row-parallel
    biases and the MoE router are replicated) and the routed experts over expert TP × EP; the first stage adds the vocabulary-parallel embedding (learned position
    embeddings replicated), the last stage the final norm and the LM head (or, with tied
    embeddings and ``pp > 1``, Megatron-LM's copy of the embedding).
activations
    Stored activations per layer and micro-batch from the component model of Korthikanti et
    al. 2022 (Table 2; see :func:`layer_activation_bytes`), times the
    stage's layers, times the micro-batches in flight of the pipeline schedule
    (:meth:`~dessim.workload.transformer.layout.PipelineSchedule.in_flight`: GPipe ``m``, 1F1B ``p`` on
    the first stage, interleaved ``(p(v+1)-1)/v``, ZB-H1 ``p`` on every stage, ZB-H2 ``2p-1``,
    DualPipe ``p+1`` chunk passes), counted on the schedule's own pass order
    (:func:`~dessim.workload.transformer.schedules.peak_held`: a forward holds its chunk's
    activations until the pass that completes its weight gradients), each chunk weighed by
    its layers (uneven ``pipeline_layers``). Plus: the embedding dropout mask on the
    first stage, the final norm input and fp32 logits (``4·T·V/tp``, what Megatron-LM's
    vocabulary-parallel cross-entropy keeps) on the stage holding the last piece, times the
    micro-batches that piece's chunk alone holds on the pass order (1 with 1F1B, interleaved
    and DualPipe, ``min(p, m)`` with ZB-H1), and under full recompute the
    full activations of the one layer being recomputed.
comm_buffers (assumptions)
    Two gradient buckets of ``bucket_size`` when gradients are reduced over ``dp·cp > 1``
    (or expert gradients over ``edp > 1``; one being reduced while the next fills: PyTorch
    DDP); under ZeRO-3 the gathered weights of two layers (current + prefetched) — those it
    shards: dense weights when ``dp·cp > 1``, experts when ``edp > 1``; with ``pp > 1`` one send and one receive buffer per
    direction (4 activation messages of ``b·s·h/cp`` elements, ``/tp`` with SP); with
    ``tp > 1`` one all-gathered/all-reduced activation (``b·s·h/cp`` elements); with
    ``ep > 1`` the all-to-all dispatch and combine buffers (routed tokens × h each; with
    ``moe_dispatch: nccl`` and SP the routed copies of the rank's own ``T/tp`` tokens, as
    Megatron-core's ``MoEAlltoAllTokenDispatcher`` sends them; the dispatch buffer in the
    wire precision — FP8 rows and scales unless ``moe_dispatch_precision: bf16`` — the
    combine buffer 16-bit). NCCL's own internal buffers are not counted.
overhead
    ``MemoryOptions.overhead``: what the user reserves for the CUDA context, the framework
    and fragmentation (default 0: not modelled).

Offload (``offload_optimizer`` / ``offload_activations`` = ``host`` | ``cxl``) moves the
optimizer states, or all stored layer activations except two layers' worth of one
micro-batch (the one being computed and the one being prefetched), out of HBM; those bytes
are reported in ``offloaded`` per target. The transfers themselves are the generator's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import combinations
from math import ceil
from types import MappingProxyType
from typing import Callable, Mapping

from dessim.errors import MemoryFitError, WorkloadError
from dessim.units import format_size
from dessim.workload.common.gradsync import DEFAULT_BUCKET_SIZE
from dessim.workload.common.precision import Precision
from dessim.workload.transformer.kernels import expert_tokens, routed_tokens
from dessim.workload.transformer.layout import RECOMPUTE_POLICIES, ParallelLayout
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.schedules import peak_held

__all__ = [
    "OFFLOAD_TARGETS",
    "MemoryOptions",
    "ZeroStateBytes",
    "MemoryEstimate",
    "zero_state_bytes",
    "paper_activation_bytes",
    "layer_activation_bytes",
    "params_on_gpu",
    "layer_params_on_gpu",
    "mtp_params_on_gpu",
    "estimate_memory",
    "fitting_alternatives",
    "check_fit",
]

#: Bytes per element of FlashAttention's saved softmax log-sum-exp (fp32; one per query row
#: and head).
_LSE_BYTES = 4

#: Where offloaded bytes may go.
OFFLOAD_TARGETS: tuple[str, ...] = ("none", "host", "cxl")



@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """Knobs of the memory estimate that are not part of the parallel layout."""

    bucket_size: int = DEFAULT_BUCKET_SIZE   #: bytes per gradient bucket
    offload_optimizer: str = "none"          #: none | host | cxl
    offload_activations: str = "none"        #: none | host | cxl
    overhead: int = 0                        #: bytes reserved for context/framework/fragmentation

    def __post_init__(self) -> None:
        for name in ("offload_optimizer", "offload_activations"):
            if getattr(self, name) not in OFFLOAD_TARGETS:
                raise WorkloadError(f"memory options: {name}={getattr(self, name)!r} is unknown; "
                                    f"valid: {', '.join(OFFLOAD_TARGETS)}")
        for name in ("bucket_size", "overhead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"memory options: {name}={value!r} must be a whole number of bytes >= 0")


@dataclass(frozen=True, slots=True)
class ZeroStateBytes:
    """Model-state bytes per data-parallel rank."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def zero_state_bytes(params: float, dp: int, stage: int, precision: Precision) -> ZeroStateBytes:
    """Bytes of weights, gradients and optimizer state per rank for ``params`` parameters
    replicated over ``dp`` ranks under ZeRO ``stage`` (ZeRO §3.1 and Fig. 1;
    docs/references.md):
    stage 0 ``(2 + G + K)Ψ``, 1 ``2Ψ + GΨ + KΨ/N_d``, 2 ``2Ψ + (G + K)Ψ/N_d``,
    3 ``(2 + G + K)Ψ/N_d`` with ``G = precision.grad_bytes`` (ZeRO's G = 2; 4 for the bf16
    recipes' fp32 gradients: stage 1 is then Megatron-LM's distributed optimizer, ``6 + 12/d``)."""
    if stage not in (0, 1, 2, 3):
        raise WorkloadError(f"ZeRO stage {stage!r} is not 0, 1, 2 or 3")
    if dp < 1:
        raise WorkloadError(f"ZeRO: data-parallel size {dp!r} must be >= 1")
    return ZeroStateBytes(
        weights=precision.param_bytes * params / (dp if stage >= 3 else 1),
        gradients=precision.grad_bytes * params / (dp if stage >= 2 else 1),
        optimizer=precision.optimizer_bytes * params / (dp if stage >= 1 else 1),
    )


def paper_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                           recompute: str = "none") -> float:
    """Activation bytes per layer from Korthikanti et al. 2022, Table 2 (16-bit, GPT layer
    with dropout; arXiv:2205.05198): ``sbh(34 + 5as/h)`` without parallelism,
    ``sbh(10 + 24/t + 5as/(ht))`` with TP, ``sbh/t·(34 + 5as/h)`` with TP + SP; selective
    recompute drops the ``5as/h`` term (``sbh(10 + 24/t)``, and ``34·sbh/t`` with SP); full
    recompute keeps the layer input ``2sbh`` (``2sbh/t`` with SP — the input is then
    sequence-sharded)."""
    if recompute not in RECOMPUTE_POLICIES:
        raise WorkloadError(f"recompute={recompute!r} is unknown; valid: {', '.join(RECOMPUTE_POLICIES)}")
    sbh = s * b * h
    sp = sp and t > 1
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


def layer_activation_bytes(model: TransformerConfig, layout: ParallelLayout,
                           recompute: str | None = None, dense: bool = False) -> float:
    """Bytes of activations one layer stores for one micro-batch on one rank.

    Component model generalising Korthikanti et al.'s count (equal to
    :func:`paper_activation_bytes` for a GPT layer: ``kv_heads = heads``, GeLU,
    ``ffn = 4h``, dropout, 16-bit), with ``e`` bytes per activation element, 1 byte per
    dropout-mask element, ``T`` tokens per rank (``b·s/cp``), ``T_sp`` (``T/tp`` under SP):

    * ``T_sp·h·(4e + 2·mask)``: the two norm inputs, the QKV and MLP inputs (norm outputs),
      two dropout masks — replicated across TP unless SP shards them;
    * ``T·(2h + 2·kv_dim)/tp·e``: Q, K, V and the output-projection input;
    * the unfused attention core (``attention: unfused``, the paper's): ``b·(a/tp)·s_q·s·(2e +
      mask)`` with dropout (softmax output, its dropout mask and output), ``b·(a/tp)·s_q·s·e``
      without; FlashAttention (``flash2``/``flash3``) never writes the ``s_q × s`` scores: its
      forward keeps the output (counted above as the projection input) and the fp32 softmax
      log-sum-exp, ``b·(a/tp)·s_q·4`` (Dao 2023, FlashAttention-2, Algorithm 1;
      Dao-AILab/flash-attention ``flash_attn/flash_attn_interface.py``, ``FlashAttnFunc``:
      ``save_for_backward(q, k, v, out_padded, softmax_lse, rng_state)``) — either dropped by
      selective recompute;
    * dense MLP: ``mats·T·f/tp·e`` (GeLU: activation input and down-projection input;
      gated: gate and up outputs and down input); MoE: the same with ``top_k·T`` routed
      tokens and ``moe_ffn_hidden``, plus the routed expert inputs ``top_k·T·h·e``
      (tokens are all-gathered over TP before the experts, so not divided by ``tp``; with
      ``etp != tp`` the copies of the ``etp·T/tp`` tokens of the expert-TP group and the
      width ``moe_ffn_hidden/etp``, :func:`~dessim.workload.transformer.kernels.expert_tokens`); the
      routed tokens are those of the most loaded EP rank (routing load factor) and shared
      experts add ``mats·T·shared·moe_ffn_hidden/tp·e``; ``dense`` (one of an MoE model's
      ``dense_layers``) counts a dense MLP;
    * MLA: the latents, their norms, Q, K, V and O instead of the Q/K/V term
      (:meth:`~dessim.workload.transformer.mla.MLAConfig.stored_elements`).

    Full recompute keeps only the layer input, ``T_sp·h·e``.
    """
    policy = layout.recompute if recompute is None else recompute
    return _layer_activations(model, layout, policy, dense)


def _layer_activations(model: TransformerConfig, layout: ParallelLayout, policy: str,
                       dense: bool) -> float:
    prec = model.precision_spec
    if policy == "none" and prec.low_precision_storage:
        return _low_precision_activations(model, layout, dense)
    e = prec.activation_bytes
    mask = 1 if model.dropout else 0
    t, h = layout.tp, model.hidden
    b = layout.micro_batch
    s_q = model.seq_len // layout.cp
    T = b * s_q
    T_sp = T // t if layout.sequence_parallel else T
    if policy == "full":
        return float(T_sp * h * e)
    replicated = T_sp * h * (4 * e + 2 * mask)
    if model.mla is not None:
        attention = model.mla.stored_elements(T, model.heads, t) * e
    else:
        attention = T * (2 * h + 2 * model.kv_dim) / t * e
    scores = 0.0
    if policy == "none" and layout.attention == "unfused":
        scores = b * (model.heads / t) * s_q * model.seq_len * ((2 * e + mask) if model.dropout else e)
    elif policy == "none":          # FlashAttention: the fp32 softmax log-sum-exp, no s² tensor
        scores = b * (model.heads / t) * s_q * _LSE_BYTES
    mats = model.activation_spec.matrices
    if model.is_moe and not dense:
        routed = routed_tokens(model, layout, expert_tokens(model, layout))
        shared = model.shared_experts * model.moe_ffn_hidden  # type: ignore[operator]
        # routed experts' width per rank moe_ffn_hidden/etp, written over the common /tp
        routed_width = model.moe_ffn_hidden // layout.expert_tp * t  # type: ignore[operator]
        mlp = mats * (routed * routed_width + T * shared) / t * e + routed * h * e
    else:
        mlp = mats * T * model.ffn_hidden / t * e
    return float(replicated + attention + scores + mlp)


def _low_precision_activations(model: TransformerConfig, layout: ParallelLayout,
                               dense: bool) -> float:
    """Stored activations of one layer under an FP8 recipe with low-precision storage
    (DeepSeek-V3 report §3.2.3 and §3.3.3), no other recomputation: the two residual-stream
    inputs (16-bit; norm outputs are recomputed); attention: MLA's latents and RoPE key
    (16-bit; Q, K, V are recomputed by the up-projections) — or Q, K, V without MLA — and
    the attention output cached in FP8 with its scales; MLP: its input (routed copies for
    experts) and the SwiGLU input cached in FP8 (the SwiGLU output is recomputed)."""
    prec = model.precision_spec
    e, q = prec.activation_bytes, prec.quantized_bytes
    t, h = layout.tp, model.hidden
    T = layout.micro_batch * model.seq_len // layout.cp
    T_sp = T // t if layout.sequence_parallel else T
    residual = 2 * T_sp * h * e
    if model.mla is not None:
        mla = model.mla
        attention = T * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim) * e
        o_width = model.heads * mla.v_head_dim / t
    else:
        attention = T * (h + 2 * model.kv_dim) / t * e
        o_width = h / t
    attention += q(T * o_width)
    gate = model.activation_spec.matrices - 1          # SwiGLU input: gate and up outputs
    if model.is_moe and not dense:
        routed = routed_tokens(model, layout, expert_tokens(model, layout))
        f, f_e = model.moe_ffn_hidden // t, model.moe_ffn_hidden // layout.expert_tp  # type: ignore[operator]
        swiglu_in = gate * (routed * f_e + model.shared_experts * T * f)
        mlp = q(routed * h) + q(T * h) * bool(model.shared_experts) + q(swiglu_in)
    else:
        mlp = q(T * h) + q(gate * T * model.ffn_hidden / t)
    return float(residual + attention + mlp)


def _layer_params_on_gpu(model: TransformerConfig, layout: ParallelLayout,
                         dense_layer: bool = False) -> tuple[float, float]:
    """(dense, expert) parameters of one layer held by one GPU (see module docstring); an MoE
    model's MoE layer unless ``dense_layer``. Shared experts are split over TP like a dense
    MLP and replicated over EP (dense parameters)."""
    t, h, kv = layout.tp, model.hidden, model.kv_dim
    bias = model.bias
    if model.mla is not None:
        mla = model.mla
        attn = mla.replicated_weights(h) + mla.norm_params() + mla.split_weights(h, model.heads) / t
    else:
        attn = (h * (h + 2 * kv) + h * h) / t + (((h + 2 * kv) / t + h) if bias else 0)
    dense = attn + 2 * model.norm_params()
    mats = model.activation_spec.matrices

    def mlp(f: int, t: int = t) -> float:
        return mats * h * f / t + (((mats - 1) * f / t + h) if bias else 0)

    if model.is_moe and not dense_layer:
        dense += model.router_params() + model.shared_experts * mlp(model.moe_ffn_hidden)  # type: ignore[arg-type]
        # routed experts: split over expert TP (etp, default tp) and EP
        expert = model.experts / layout.ep * mlp(model.moe_ffn_hidden, layout.expert_tp)  # type: ignore[arg-type]
        return dense, expert
    return dense + mlp(model.ffn_hidden), 0.0


def layer_params_on_gpu(model: TransformerConfig, layout: ParallelLayout,
                        dense: bool = False) -> tuple[float, float]:
    """(dense, expert) parameters of one transformer layer held by one GPU (before ZeRO);
    ``dense``: one of an MoE model's ``dense_layers``."""
    return _layer_params_on_gpu(model, layout, dense)


def mtp_params_on_gpu(model: TransformerConfig, layout: ParallelLayout) -> tuple[float, float]:
    """(dense, expert) parameters of the multi-token-prediction modules on the last stage
    (before ZeRO): per module its projection (split over TP), 3 norms and one MoE layer; with
    ``pp > 1`` the last stage also keeps a copy of the embedding they share (as Megatron-LM
    does for a tied embedding)."""
    if not model.mtp_modules:
        return 0.0, 0.0
    h = model.hidden
    dense, expert = _layer_params_on_gpu(model, layout)
    dense += 2 * h * h / layout.tp + 3 * model.norm_params()
    copy = ceil(model.vocab / layout.tp) * h if layout.pp > 1 else 0
    return model.mtp_modules * dense + copy, model.mtp_modules * expert


def params_on_gpu(model: TransformerConfig, layout: ParallelLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one GPU of pipeline stage ``stage`` (before ZeRO)."""
    dense = expert = 0.0
    for chunk in layout.stage_layers(model.layers, stage):
        for i in chunk:
            d, x = _layer_params_on_gpu(model, layout, model.is_dense_layer(i))
            dense, expert = dense + d, expert + x
    vocab_shard = ceil(model.vocab / layout.tp) * model.hidden
    pieces = {layout.piece_of(stage, c) for c in range(layout.chunks)}
    if 0 in pieces:                                   # the embedding (DualPipe: two stages hold it)
        dense += vocab_shard + (model.embedding_params() - model.vocab * model.hidden)
    if layout.pipeline_pieces - 1 in pieces:          # final norm and LM head
        dense += model.norm_params()
        if not model.tied_embeddings or layout.pp > 1:
            dense += vocab_shard
        d, x = mtp_params_on_gpu(model, layout)
        dense, expert = dense + d, expert + x
    return dense, expert


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one pipeline stage; ``total`` is what must fit in HBM."""

    model: TransformerConfig
    layout: ParallelLayout
    options: MemoryOptions
    stage: int
    params: float            #: parameters held by the GPU before ZeRO sharding
    in_flight: float         #: micro-batches whose activations the stage holds at its peak
    weights: float
    gradients: float
    optimizer: float
    activations: float
    comm_buffers: float
    overhead: float
    offloaded: Mapping[str, float] = field(default_factory=dict)  #: target → bytes moved out of HBM

    @property
    def total(self) -> float:
        """Bytes in HBM."""
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.comm_buffers + self.overhead)

    def breakdown(self) -> dict[str, float]:
        """HBM bytes per category (plus ``offloaded:<target>`` entries)."""
        out = {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
               "activations": self.activations, "comm_buffers": self.comm_buffers,
               "overhead": self.overhead, "total": self.total}
        out.update({f"offloaded:{k}": v for k, v in self.offloaded.items()})
        return out

    def describe(self) -> str:
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in self.breakdown().items()
                          if k != "total" and v)
        return f"stage {self.stage}: {format_size(self.total)} per GPU ({parts})"


def _stage_activations(model: TransformerConfig, layout: ParallelLayout, stage: int,
                       options: MemoryOptions) -> tuple[float, float, float]:
    """(HBM activation bytes, offloaded bytes, in-flight micro-batches) of one stage."""
    e = model.precision_spec.activation_bytes
    ranges = layout.stage_layers(model.layers, stage)
    indices = [i for r in ranges for i in r]
    p, m, v = layout.pp, layout.num_micro_batches, layout.virtual_stages
    if layout.pipeline.name == "gpipe":
        in_flight = layout.pipeline.in_flight(stage, p, m, v)
    else:   # counted on the schedule's pass order, each chunk weighed by its layers
        in_flight = peak_held(layout.schedule, stage, p, m, v, tuple(float(len(r)) for r in ranges))
    per_layer = [layer_activation_bytes(model, layout, dense=model.is_dense_layer(i)) for i in indices]
    stored = in_flight * sum(per_layer)
    offloaded = 0.0
    if options.offload_activations != "none":
        keep = min(stored, 2 * max(per_layer))
        offloaded, stored = stored - keep, keep
    T = layout.micro_batch * model.seq_len // layout.cp
    T_sp = T // layout.tp if layout.sequence_parallel else T
    if stage == 0 and model.dropout:
        stored += in_flight * T_sp * model.hidden          # embedding dropout mask
    last_flight = _last_piece_in_flight(layout, stage)
    if last_flight:
        logits = T_sp * model.hidden * e + 4 * T * ceil(model.vocab / layout.tp)
        # each MTP module: its two normed inputs and projection input, one layer, its logits
        mtp = model.mtp_modules * (3 * T * model.hidden * e + logits
                                   + layer_activation_bytes(model, layout))
        stored += last_flight * (logits + mtp)
    if layout.recompute == "full":                            # the layer being recomputed
        stored += layer_activation_bytes(model, layout, recompute="none")
    return stored, offloaded, in_flight


def _last_piece_in_flight(layout: ParallelLayout, stage: int) -> float:
    """Micro-batches whose output-layer activations (logits, MTP modules) stage ``stage``
    holds at its peak: 0 unless one of its chunks is the model's last piece. Counted on the
    schedule's pass order for that chunk alone (a forward of the last piece adds one, the pass
    that completes its backward frees it): 1 on 1F1B's and the interleaved schedule's last
    stage (its last chunk's forward is followed by that chunk's backward), ``min(p, m)`` on
    ZB-H1's (W deferred), 1 on the DualPipe stage whose reverse chunk is the last piece —
    not the stage's whole in-flight count, which its other chunk and pieces make up."""
    last = layout.pipeline_pieces - 1
    weights = tuple(float(layout.piece_of(stage, c) == last) for c in range(layout.chunks))
    if not any(weights):
        return 0.0
    p, m, v = layout.pp, layout.num_micro_batches, layout.virtual_stages
    if layout.pipeline.name == "gpipe":
        return layout.pipeline.in_flight(stage, p, m, v)
    return peak_held(layout.schedule, stage, p, m, v, weights) * sum(weights)


def _comm_buffers(model: TransformerConfig, layout: ParallelLayout, options: MemoryOptions) -> float:
    e = model.precision_spec.activation_bytes
    T = layout.micro_batch * model.seq_len // layout.cp
    T_sp = T // layout.tp if layout.sequence_parallel else T
    h = model.hidden
    total = 0.0
    # the sharding (and gradient-reduction) groups of _estimate_stage: DualPipe also between
    # its two copies of a piece
    copies = 2 if layout.pipeline.bidirectional else 1
    dense_group, expert_group = layout.dp * layout.cp * copies, layout.edp * copies
    if dense_group > 1 or (model.is_moe and expert_group > 1):
        total += 2 * options.bucket_size
    if layout.zero_stage >= 3:      # ZeRO-3 gathers the weights it shards (a group of 1 holds them whole)
        dense, expert = _layer_params_on_gpu(model, layout)
        gathered = dense * (dense_group > 1) + expert * (expert_group > 1)
        total += 2 * gathered * model.precision_spec.param_bytes
    if layout.pp > 1:
        total += 4 * T_sp * h * e
    if layout.tp > 1:
        total += T * h * e
    if model.is_moe and layout.moe_all_to_all:
        # NCCL's flat dispatch under SP sends the copies of the rank's own T/tp tokens
        # (Megatron-core's MoEAlltoAllTokenDispatcher); DeepEP's expert-TP x EP dispatch sends
        # them to each of the etp ranks of an EP rank, top_k·etp·T/tp (top_k·T when etp = tp).
        # The dispatch buffer holds the wire format (FP8 rows + scales, or 16-bit), the
        # combine buffer 16-bit rows
        sent = T_sp if layout.moe_dispatch == "nccl" else expert_tokens(model, layout)
        rows = routed_tokens(model, layout, sent) * h
        prec = model.precision_spec
        total += (prec.quantized_bytes(rows) if layout.fp8_dispatch(model) else rows * e) + rows * e
    return total


def _estimate_stage(model: TransformerConfig, layout: ParallelLayout, options: MemoryOptions,
                    stage: int) -> MemoryEstimate:
    prec = model.precision_spec
    dense, expert = params_on_gpu(model, layout, stage)
    copies = 2 if layout.pipeline.bidirectional else 1   # DualPipe: two stages hold each piece
    ds = zero_state_bytes(dense, layout.dp * layout.cp * copies, layout.zero_stage, prec)
    es = zero_state_bytes(expert, layout.edp * copies, layout.zero_stage, prec)
    optimizer = ds.optimizer + es.optimizer
    offloaded: dict[str, float] = {}
    if options.offload_optimizer != "none":
        offloaded[options.offload_optimizer] = optimizer
        optimizer = 0.0
    activations, act_off, in_flight = _stage_activations(model, layout, stage, options)
    if act_off:
        offloaded[options.offload_activations] = offloaded.get(options.offload_activations, 0.0) + act_off
    return MemoryEstimate(
        model=model, layout=layout, options=options, stage=stage, params=dense + expert,
        in_flight=in_flight, weights=ds.weights + es.weights, gradients=ds.gradients + es.gradients,
        optimizer=optimizer, activations=activations,
        comm_buffers=_comm_buffers(model, layout, options), overhead=float(options.overhead),
        offloaded=MappingProxyType(offloaded),
    )


def estimate_memory(model: TransformerConfig, layout: ParallelLayout,
                    options: MemoryOptions | None = None, stage: int | None = None) -> MemoryEstimate:
    """Memory per GPU of pipeline stage ``stage``, or of the stage that needs the most
    (lowest index on ties) when ``stage`` is None. Validates the layout against the model."""
    layout.validate(model)
    options = options or MemoryOptions()
    if stage is not None:
        if not 0 <= stage < layout.pp:
            raise WorkloadError(f"pipeline stage {stage} is out of range 0..{layout.pp - 1}")
        return _estimate_stage(model, layout, options, stage)
    estimates = [_estimate_stage(model, layout, options, s) for s in range(layout.pp)]
    return max(estimates, key=lambda est: (est.total, -est.stage))


# ---------------------------------------------------------------------- fit check
_Change = tuple[str, Callable[[ParallelLayout, MemoryOptions], tuple[ParallelLayout, MemoryOptions]]]


def _alternatives(layout: ParallelLayout, options: MemoryOptions) -> list[_Change]:
    """Single changes that reduce memory, keeping the GPU count and the global batch, listed
    roughly from the cheapest in iteration time to the costliest (our judgement: SP and
    selective recompute cost little, ZeRO-1/2 add no traffic over DP's reduce-scatter +
    all-gather, a smaller micro-batch or a larger TP/PP lowers efficiency, ZeRO-3 adds a
    parameter all-gather, full recompute ~33 % more compute, offload host-link traffic)."""
    changes: list[_Change] = []
    if layout.tp > 1 and not layout.sp:
        changes.append(("sp=true", lambda lo, op: (replace(lo, sp=True), op)))
    if layout.recompute == "none":
        changes.append(("recompute=selective", lambda lo, op: (replace(lo, recompute="selective"), op)))
    for stage in range(layout.zero_stage + 1, 3):
        changes.append((f"zero_stage={stage}", lambda lo, op, z=stage: (replace(lo, zero_stage=z), op)))
    if layout.micro_batch > 1:
        changes.append(("micro_batch÷2", lambda lo, op: (
            replace(lo, micro_batch=lo.micro_batch // 2) if lo.micro_batch % 2 == 0 else None, op)))
    for dim in ("tp", "pp"):
        changes.append((f"{dim}×2 (dp÷2)", lambda lo, op, d=dim: (
            replace(lo, **{d: getattr(lo, d) * 2, "dp": lo.dp // 2}) if lo.dp % 2 == 0 else None, op)))
    if layout.zero_stage < 3:
        changes.append(("zero_stage=3", lambda lo, op: (replace(lo, zero_stage=3), op)))
    if layout.recompute != "full":
        changes.append(("recompute=full", lambda lo, op: (replace(lo, recompute="full"), op)))
    if options.offload_optimizer == "none":
        changes.append(("offload_optimizer=host", lambda lo, op: (lo, replace(op, offload_optimizer="host"))))
    if options.offload_activations == "none":
        changes.append(("offload_activations=host", lambda lo, op: (lo, replace(op, offload_activations="host"))))
    return changes


def _try(model: TransformerConfig, layout: ParallelLayout | None, options: MemoryOptions,
         capacity: float) -> float | None:
    """Total of the worst stage if the layout is valid and fits, else None."""
    if layout is None:
        return None
    try:
        total = estimate_memory(model, layout, options).total
    except WorkloadError:
        return None
    return total if total <= capacity else None


def _apply(changes: tuple[_Change, ...], layout: ParallelLayout,
           options: MemoryOptions) -> tuple[ParallelLayout | None, MemoryOptions]:
    lo: ParallelLayout | None = layout
    op = options
    for _, fn in changes:
        if lo is None:
            break
        try:
            lo, op = fn(lo, op)
        except WorkloadError:  # the changed layout is invalid (e.g. interleaving constraint)
            return None, op
    return lo, op


def fitting_alternatives(estimate: MemoryEstimate, capacity_bytes: float,
                         limit: int = 4) -> list[tuple[str, float]]:
    """Up to ``limit`` single changes (else pairs of changes) to the layout or the offload
    options that make the job fit: ``(description, total bytes)``, in the order of
    :func:`_alternatives` (cheapest first)."""
    model, layout, options = estimate.model, estimate.layout, estimate.options
    alts = _alternatives(layout, options)
    for size in (1, 2):
        found = []
        for combo in combinations(alts, size):
            lo, op = _apply(combo, layout, options)
            total = _try(model, lo, op, capacity_bytes)
            if total is not None:
                found.append((" + ".join(name for name, _ in combo), total))
        if found:
            return found[:limit]
    return []


def check_fit(estimate: MemoryEstimate, capacity_bytes: float) -> MemoryEstimate:
    """Return ``estimate`` if its ``total`` fits in ``capacity_bytes`` of device memory;
    otherwise raise :class:`~dessim.errors.MemoryFitError` saying by how much it does not fit
    and which changes would make it fit (computed by re-estimating alternatives). The error
    carries ``shortfall`` (bytes) and ``suggestions`` (list of (change, total bytes))."""
    if capacity_bytes <= 0:
        raise WorkloadError(f"device memory capacity {capacity_bytes!r} bytes must be > 0")
    if estimate.total <= capacity_bytes:
        return estimate
    shortfall = estimate.total - capacity_bytes
    suggestions = fitting_alternatives(estimate, capacity_bytes)
    if suggestions:
        hint = "would fit with: " + "; ".join(f"{name} ({format_size(total)})" for name, total in suggestions)
    else:
        hint = ("no single or paired change of recompute, ZeRO stage, sp, tp/pp (at the same GPU count), "
                "micro-batch or offload fits: use more GPUs or a device with more memory")
    err = MemoryFitError(
        f"model {estimate.model.name!r} with {estimate.layout.describe()} does not fit: "
        f"{estimate.describe()} exceeds the capacity of {capacity_bytes / 1e9:.4g} GB "
        f"({format_size(capacity_bytes)}) by "
        f"{format_size(shortfall)}; {hint}")
    err.shortfall = shortfall  # type: ignore[attr-defined]
    err.suggestions = suggestions  # type: ignore[attr-defined]
    raise err
