"""Compute kernels of one transformer layer (and of the embedding and LM head) on one GPU.

For one micro-batch on one rank of a :class:`~dessim.workload.transformer.layout.ParallelLayout`, each
block (:func:`layer_kernels`, :func:`embedding_kernels`, :func:`head_kernels`) is a
:class:`~dessim.workload.common.kernels.KernelSet`: the forward kernels in execution order, the backward kernels in execution
order and the kernels re-run before the backward under activation recomputation. Each
:class:`~dessim.workload.common.kernels.Kernel` carries FLOPs, bytes read and written from HBM, and a ``kind``:

``matmul``
    ``shape = (m, n, k)`` (:mod:`dessim.workload.common.kernels` has the GEMM, backward and
    optimizer-step conventions every workload kind shares).
``attention``
    The attention core by ``layout.attention`` (``training.attention``):

    * ``flash2`` / ``flash3`` — one fused kernel (FlashAttention-2/3): FLOPs
      ``4 · b · s_q · s_k · heads/tp · head_dim`` (two GEMMs of ``2·s_q·s_k·head_dim`` per
      head; the full ``s²``, no causal halving, as in Megatron-LM's FLOP formula, Narayanan et
      al. 2021 Eq. 3); bytes: read Q, K, V, write O — the ``s²`` score matrix never touches
      HBM. ``shape = (b·heads/tp, s_q, s_k, head_dim, causal)``; the device model costs it at
      the implementation's measured rate (causal: decoder language models).
    * ``unfused`` — Megatron-LM before FlashAttention (its ``CoreAttention``, 2021-2022):
      ``QKᵀ`` as a batched GEMM writing ``b·heads/tp·s_q·s_k`` scores, a fused
      scale-mask-softmax kernel reading and writing them and ``·V`` as a batched GEMM reading
      them — one ``attn.core`` kernel of the same FLOPs with the ``s²``-sized HBM bytes of
      those three kernels (and of their backward), ``shape = (b·heads/tp, s_q, s_k,
      head_dim, 0)``: the full ``s²`` is computed and the causal mask is fused into the
      softmax, so the block is costed at the measured rate of unfused non-causal attention
      (PyTorch's matmul-softmax-matmul in FlashAttention's benchmark). Dropout on the
      probabilities (when the model has dropout: reads them, writes them and a 1-byte mask)
      is its own kernel: the measured block ran without it.
``elementwise`` / ``norm`` / ``softmax`` / ``dropout``
    Memory-bound kernels with their real bytes: norms read and write ``T·h`` and read their
    weights; the residual adds are Megatron's fused bias-dropout-add (read the branch output
    and the residual, write the sum and, with dropout, a 1-byte mask); the MLP activation is
    the fused bias-GeLU / SwiGLU; FLOPs are rough estimates (:mod:`dessim.workload.transformer.model`)
    and are not model FLOPs.

Tokens per rank
    ``T = micro_batch · seq_len / cp`` (context parallelism splits every sequence; each rank's
    queries attend to all ``seq_len`` keys). Norms, residual adds and the router run on
    ``T / tp`` tokens under sequence parallelism, otherwise on ``T`` (redundantly on every TP
    rank). GEMMs see all ``T`` tokens (after SP's all-gather). Communication (TP all-reduce /
    all-gather / reduce-scatter, CP K/V exchange, MoE all-to-all) is *not* here: the task-graph
    generator inserts it between these kernels.

Backward
    By :meth:`~dessim.workload.common.kernels.KernelBuilder.backward` (that module's
    "Backward": dgrad and wgrad per GEMM, fused attention at 2× the forward FLOPs).

Recomputation: ``selective`` re-runs the attention core before its backward; ``full`` re-runs
the whole layer forward (the embedding and LM head are never recomputed — Megatron-LM).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil
from typing import Iterable

from dessim.workload.common.kernels import ATTENTION, ELEMENTWISE, MATMUL, NORM, SOFTMAX, Kernel, KernelBuilder, KernelSet
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import Norm, TransformerConfig

__all__ = ["TokenShard", "layer_kernels", "embedding_kernels", "head_kernels", "routed_tokens", "expert_tokens",
           "mtp_kernels"]


@dataclass(frozen=True, slots=True)
class TokenShard:
    """What one rank sees of one micro-batch (see "Tokens per rank" above)."""

    micro_batch: int
    seq_len: int        #: full sequence length (keys per query)
    seq_local: int      #: queries per rank: seq_len / cp
    tokens: int         #: T = micro_batch · seq_local
    tokens_sp: int      #: tokens of norms/residuals: T / tp with SP, else T
    tp: int
    ep: int

    @classmethod
    def of(cls, model: TransformerConfig, layout: ParallelLayout) -> "TokenShard":
        """The shard of ``layout`` (validated against ``model``: whole heads, tokens, experts)."""
        layout.validate(model)
        s_local = model.seq_len // layout.cp
        tokens = layout.micro_batch * s_local
        tokens_sp = tokens // layout.tp if layout.sequence_parallel else tokens
        return cls(layout.micro_batch, model.seq_len, s_local, tokens, tokens_sp, layout.tp, layout.ep)


def _assemble(b: KernelBuilder, forward: list[Kernel], recompute: Iterable[Kernel] = ()) -> KernelSet:
    backward = tuple(k for fwd in reversed(forward) for k in b.backward(fwd))
    return KernelSet(tuple(forward), backward, tuple(replace(k, phase="recompute") for k in recompute))


def _mlp(b: KernelBuilder, model: TransformerConfig, prefix: str, tokens: int, ffn_t: int,
         groups: int = 1, quantize_input: bool = True) -> list[Kernel]:
    """An MLP (or ``groups`` local experts) on ``tokens`` rows, width ``ffn_t`` per TP rank
    (FP8: the casts of its GEMM inputs, the first unless ``quantize_input``)."""
    act = model.activation_spec
    h = model.hidden
    mats_in = 2 if act.gated else 1
    ks = b.quantize(f"{prefix}.quant_in", tokens * h, mats_in * tokens * ffn_t) if quantize_input else []
    if act.gated:
        ks.append(b.matmul(f"{prefix}.gate", tokens, ffn_t, h, groups))
    ks.append(b.matmul(f"{prefix}.up", tokens, ffn_t, h, groups))
    inputs = (2 if act.gated else 1) * tokens * ffn_t
    ks.append(b.elementwise(f"{prefix}.act", inputs, tokens * ffn_t, act.flops_per_element * tokens * ffn_t))
    ks += b.quantize(f"{prefix}.quant_down", tokens * ffn_t, tokens * h)
    ks.append(b.matmul(f"{prefix}.down", tokens, h, ffn_t, groups))
    return ks


def _attention_core(b: KernelBuilder, model: TransformerConfig, layout: ParallelLayout,
                    sh: "TokenShard") -> list[Kernel]:
    """The attention core of one layer by ``layout.attention`` (module docstring)."""
    t = layout.tp
    heads = model.heads // t
    d = model.head_dim
    q_t, kv_t = model.hidden // t, model.kv_dim // t
    s_q, s_k, mb = sh.seq_local, sh.seq_len, layout.micro_batch
    bh = mb * heads
    if layout.attention == "unfused":
        scores = bh * s_q * s_k
        # The kernels the measured block runs: QKᵀ (K expanded to every head), the
        # scale(-mask)-softmax, probabilities · V; their HBM bytes, forward and backward.
        parts = [b.bmm("attn.scores", bh, s_q, s_k, d),
                 Kernel("attn.softmax", SOFTMAX, "fwd", 5.0 * scores, scores * b.act, scores * b.act),
                 b.bmm("attn.context", bh, s_q, d, s_k)]
        back = [k for part in parts for k in b.backward(part)]
        ks = [Kernel("attn.core", ATTENTION, "fwd", sum(k.flops for k in parts if k.kind == MATMUL),
                     sum(k.bytes_read for k in parts), sum(k.bytes_written for k in parts),
                     (bh, s_q, s_k, d, 0), impl="unfused",
                     backward_bytes=(sum(k.bytes_read for k in back),
                                     sum(k.bytes_written for k in back)))]
        if model.dropout:           # not in the measured block (dropout 0 there): its own kernel
            ks.append(b.dropout("attn.dropout", scores))
        return ks
    if model.mla is not None:
        mla = model.mla
        q_w, v_w = heads * mla.qk_head_dim, heads * mla.v_head_dim
        read = (sh.tokens * q_w + mb * s_k * (q_w + v_w)) * b.act
        # FlashAttention's FLOP convention 4·s_q·s_k·d per head: d = (d_qk + d_v) / 2
        d_eff = -(-(mla.qk_head_dim + mla.v_head_dim) // 2)
        return [Kernel("attn.core", ATTENTION, "fwd", 2.0 * mb * s_q * s_k * (q_w + v_w), read,
                       sh.tokens * v_w * b.act, (bh, s_q, s_k, d_eff, 1), impl=layout.attention)]
    read = (sh.tokens * q_t + 2 * mb * s_k * kv_t) * b.act
    return [Kernel("attn.core", ATTENTION, "fwd", 4.0 * mb * s_q * s_k * q_t, read,
                   sh.tokens * q_t * b.act, (bh, s_q, s_k, d, 1), impl=layout.attention)]


def _attention_projections(b: KernelBuilder, model: TransformerConfig, layout: ParallelLayout,
                           sh: "TokenShard", norm: Norm) -> list[Kernel]:
    """The GEMMs (and latent norms) that make Q, K and V from the normed layer input: one
    fused QKV GEMM, or MLA's down-projections (replicated over TP), latent RMSNorms and
    up-projections (split by heads; :mod:`dessim.workload.transformer.mla`)."""
    t, h, T = layout.tp, model.hidden, sh.tokens
    if model.mla is None:
        width = h // t + 2 * (model.kv_dim // t)
        return [*b.quantize("attn.quant_in", T * h, T * width), b.matmul("attn.qkv", T, width, h)]
    mla, heads = model.mla, model.heads // t
    ks = b.quantize("attn.quant_in", T * h, T * (mla.q_lora_rank + mla.kv_lora_rank))
    if mla.q_lora_rank:
        ks.append(b.matmul("attn.q_a", T, mla.q_lora_rank, h))
    ks.append(b.matmul("attn.kv_a", T, mla.kv_lora_rank + mla.qk_rope_head_dim, h))
    for name, width in (("attn.q_norm", mla.q_lora_rank), ("attn.kv_norm", mla.kv_lora_rank)):
        if width:
            ks.append(b.elementwise(name, T * width, T * width, norm.flops_per_element * T * width,
                                    NORM, width * model.precision_spec.param_bytes))
    q_b = heads * mla.qk_head_dim
    kv_b = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    ks += b.quantize("attn.quant_latent", T * (mla.q_lora_rank + mla.kv_lora_rank), T * (q_b + kv_b))
    ks.append(b.matmul("attn.q_b", T, q_b, mla.q_lora_rank or h))
    ks.append(b.matmul("attn.kv_b", T, kv_b, mla.kv_lora_rank))
    return ks


def layer_kernels(model: TransformerConfig, layout: ParallelLayout, dense: bool = False,
                  received: int | None = None) -> KernelSet:
    """Kernels of one transformer layer for one micro-batch on one rank of ``layout``: an MoE
    layer of an MoE model unless ``dense`` (one of its ``dense_layers``).

    MoE (routed experts, :mod:`dessim.workload.transformer.routing`): the router, the
    permutation, the shared experts (one MLP of width ``shared_experts · moe_ffn_hidden``,
    DeepSeekMoE; they run while the dispatch all-to-all is in flight, see
    :mod:`dessim.workload.transformer.passes`), the local experts as grouped GEMMs over the
    routed token copies of the most loaded EP rank (``top_k · T · load_factor``) and the
    un-permutation (the combine's reduction: weighted sum of copies, memory-bound).

    Where the (un)permutation runs depends on the dispatch:

    * ``received`` None — a flat all-to-all of expert copies (NCCL, Megatron-LM's
      ``MoEAlltoAllTokenDispatcher``): the token's rank permutes its ``T`` tokens into
      ``top_k·T`` copies before the dispatch (FP8 rows and scales in an FP8 recipe, which
      casts the tokens before the permutation, :func:`_token_permute`) and, after the combine, sums the ``top_k`` copies
      of each token, weighted by the router (``moe.unpermute`` reads ``top_k·T·L·h``, writes
      ``T·h``). With TP and sequence parallelism the rank permutes, dispatches and sums
      only its ``T/tp`` tokens (Megatron-core's dispatcher takes the sequence-parallel
      shard and all-gathers over TP what the all-to-all delivered, so the experts still see
      ``top_k·T·L`` rows, :func:`~dessim.workload.transformer.passes.layer_points`).
    * ``received`` = R — DeepEP (deepseek-ai/DeepEP ``Buffer.dispatch``/``combine``): the
      dispatch delivers one row per (token, GPU) and the combine sums one row per (token,
      GPU) back, *unweighted*, in its receiving warps (``csrc/kernels/intranode.cu``
      ``combine``; internode the forwarding GPU sums a node's rows first). So the experts'
      GPU permutes the ``R`` rows it received (the most loaded GPU's, per micro-batch) into its
      expert copies after the dispatch (``moe.permute``: FP8 rows and scales in an FP8 recipe,
      which dispatches FP8; its backward sums the copies' 16-bit gradients into rows) and
      sums each row's copies, weighted, before the combine (``moe.unpermute`` reads the copies
      and writes the ``R`` rows). The combine's own sum runs inside the all-to-all kernel at
      its link rate: DeepEP's README measures the combine at the dispatch's bottleneck
      bandwidth (158 against 153 GB/s over NVLink with EP 8, 43–57 GB/s RDMA both ways), so
      it costs no time beyond the transfer. With TP or expert TP (sequence parallelism;
      Megatron-core's ``MoEFlexTokenDispatcher`` on the expert-TP × EP group) each of the
      ``etp`` expert-TP ranks of an EP rank receives the same ``R`` rows — the tokens of all
      ``etp·ep`` members routed to its EP rank — and runs its ``1/etp`` slice of the experts on
      them (``moe_ffn_hidden/etp`` wide, :func:`expert_tokens`); the dispatch casts
      (FP8) only the rank's ``T/tp`` sequence-parallel tokens, and the shared experts cast the
      ``T`` tokens gathered for them (``moe.shared.quant_in``)."""
    b = KernelBuilder(model)
    sh = TokenShard.of(model, layout)
    t, h = layout.tp, model.hidden
    T, Tsp = sh.tokens, sh.tokens_sp
    q_t = h // t
    norm = model.norm_spec
    prec = model.precision_spec
    norm_params = model.norm_params() * prec.param_bytes
    bias = h * prec.param_bytes if model.bias else 0.0

    def norm_kernel(name: str) -> Kernel:
        return b.elementwise(name, Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM, norm_params)

    core = _attention_core(b, model, layout, sh)
    o_in = model.heads * model.mla.v_head_dim // t if model.mla is not None else q_t
    fwd = [
        norm_kernel("attn.norm"),
        *_attention_projections(b, model, layout, sh, norm),
        *core,
        *b.quantize("attn.quant_proj", T * o_in, T * h),
        b.matmul("attn.proj", T, h, o_in),
        b.bias_dropout_add("attn.residual", Tsp * h, bias, model.dropout),
        norm_kernel("mlp.norm"),
    ]
    if model.is_moe and not dense:
        k, local = model.top_k, model.experts // layout.ep
        routed = routed_tokens(model, layout, expert_tokens(model, layout))
        ffn_t = model.moe_ffn_hidden // t  # type: ignore[operator]
        ffn_e = model.moe_ffn_hidden // layout.expert_tp  # type: ignore[operator]
        fwd.append(b.matmul("moe.router", Tsp, model.experts, h, precise=True))
        # TP with SP (either dispatch): the dispatch sends the rank's T/tp tokens, the shared
        # experts run on the T tokens TP gathers for them (their own cast)
        split = Tsp < T
        gated = 2 if model.activation_spec.gated else 1
        # FP8 on the wire: tokens are cast once, before the permutation, and dispatched in
        # FP8; a 16-bit dispatch leaves the cast to the experts, after the all-to-all
        fp8_wire = layout.fp8_dispatch(model)
        shared_cast = 0 if split else model.shared_experts * T * ffn_t
        if fp8_wire or shared_cast:
            fwd += b.quantize("moe.quant_in", Tsp * h, gated * ((routed * ffn_e if fp8_wire else 0) + shared_cast))
        sent = routed_tokens(model, layout, Tsp)     # copies the token's rank sends (flat layout)
        if received is None:
            fwd.append(_token_permute(b, Tsp * h, sent * h, fp8_wire))
        if model.shared_experts:
            fwd += _mlp(b, model, "moe.shared", T, model.shared_experts * ffn_t, quantize_input=split)
        if received is not None:
            fwd.append(_received_permute(b, received * h, routed * h, fp8_wire))
        fwd += _mlp(b, model, "moe.expert", routed, ffn_e, local, quantize_input=not fp8_wire)
        copies, rows = (sent, Tsp) if received is None else (routed, received)
        fwd.append(b.elementwise("moe.unpermute", copies * h, rows * h, 2 * copies * h))
    else:
        fwd += _mlp(b, model, "mlp", T, model.ffn_hidden // t)
    fwd.append(b.bias_dropout_add("mlp.residual", Tsp * h, bias, model.dropout))

    if layout.recompute == "full":
        recompute = fwd
    elif layout.recompute == "selective":
        recompute = core
    elif prec.low_precision_storage:
        # DeepSeek-V3 §3.2.3 / §3.3.3: norms, MLA up-projections and the SwiGLU are re-run
        # from their cached inputs before the backward instead of keeping their outputs
        recompute = [k for k in fwd if k.kind == NORM or k.name in _RECOMPUTED_LOW_PRECISION
                     or k.name.endswith(".act")]
    else:
        recompute = []
    return _assemble(b, fwd, recompute)


def _received_permute(b: KernelBuilder, rows: int, copies: int, fp8_wire: bool) -> Kernel:
    """DeepEP's permutation on the experts' GPU (:func:`layer_kernels`): ``rows`` received
    elements gathered into ``copies`` expert-copy elements, in the dispatch's precision (FP8
    with its scales when ``fp8_wire``); backward, the copies' 16-bit gradients summed into the
    rows' (read the copies, write the rows)."""
    p = b.precision

    def moved(n: int) -> float:
        return p.quantized_bytes(n) if fp8_wire else n * b.act

    return Kernel("moe.permute", ELEMENTWISE, "fwd", 0.0, moved(rows), moved(copies),
                  backward_bytes=(copies * b.act, rows * b.act))


def _token_permute(b: KernelBuilder, tokens: int, copies: int, fp8_wire: bool) -> Kernel:
    """The flat layout's permutation on the token's GPU (:func:`layer_kernels`, ``received``
    None): ``tokens`` elements gathered into ``copies`` expert-copy elements, backward the
    copies' 16-bit gradients summed into the tokens'.

    An FP8 recipe casts the tokens once, before the permutation (``moe.quant_in``), and
    dispatches FP8 (DeepSeek-V3 report §3.3.3: the activation before the MoE up-projections is
    quantized to FP8 before the dispatch; Megatron-core's FP8 dispatch likewise quantizes the
    payload before the all-to-all — ``moe_dispatch_fwd_dtype='mxfp8'``, NVIDIA/Megatron-LM
    ``megatron/core/transformer/transformer_config.py`` — whereas its ``alltoall`` dispatcher
    permutes and sends the 16-bit hidden states, ``MoEAlltoAllTokenDispatcher.
    dispatch_preprocess`` in ``megatron/core/transformer/moe/token_dispatcher.py``). Casting
    before the row gather casts ``T`` rows instead of ``top_k·T`` copies, so the gather moves
    FP8 rows and their scales (``Precision.quantized_bytes``) forward; its backward is the
    16-bit one of a bf16 run (the dispatch's backward combines 16-bit gradients). Without
    ``fp8_wire`` (``moe_dispatch_precision: bf16``) it moves the 16-bit rows, as Megatron-core's
    ``alltoall`` dispatcher does, and the experts cast the copies they receive."""
    k = b.elementwise("moe.permute", tokens, copies, 0.0)
    p = b.precision
    if not fp8_wire:
        return k
    (bwd,) = b.backward(k)
    return replace(k, bytes_read=p.quantized_bytes(tokens), bytes_written=p.quantized_bytes(copies),
                   backward_bytes=(bwd.bytes_read, bwd.bytes_written))


#: GEMMs an FP8 recipe with low-precision storage re-runs (MLA's up-projections).
_RECOMPUTED_LOW_PRECISION = frozenset({"attn.q_b", "attn.kv_b"})


def expert_tokens(model: TransformerConfig, layout: ParallelLayout) -> int:
    """Tokens whose copies reach the experts of one expert-TP group per micro-batch: the
    rank's ``T`` (``b·s/cp``) when ``etp = tp`` (TP all-gathers the sequence-parallel shards,
    or every TP rank holds all ``T`` without SP); with ``etp != tp`` (sequence parallelism or
    ``tp = 1``: each rank dispatches its own ``T/tp``) the ``etp`` ranks' ``etp·T/tp``, which
    the expert-TP all-gather after the dispatch joins (Megatron-core's
    ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` over the expert-TP group)."""
    tokens = layout.micro_batch * model.seq_len // layout.cp
    if not layout.separate_expert_tp:
        return tokens
    return tokens // layout.tp * layout.expert_tp


def routed_tokens(model: TransformerConfig, layout: ParallelLayout, tokens: int) -> int:
    """Token copies the most loaded EP rank's experts process per micro-batch: ``top_k ·
    tokens · load_factor`` (rounded up; ``tokens`` = T of :class:`TokenShard`). The load
    factor is a sum of floating-point shares (zipf's 8 shares sum to 1 + 2.2e-16), so a
    product within a relative 1e-12 above a whole number is that number, not one copy more."""
    copies = tokens * model.top_k * model.routing.load_factor(model.experts, layout.ep)
    return ceil(copies * (1.0 - 1e-12))


def embedding_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Token (+ learned position) embedding lookup on the first pipeline stage.

    Vocabulary-parallel: every TP rank looks up the rows of its vocabulary slice for all
    ``T`` tokens (the partial results are then all-reduced, or reduce-scattered under SP)."""
    b = KernelBuilder(model)
    sh = TokenShard.of(model, layout)
    h, T = model.hidden, sh.tokens
    learned = model.position_embedding == "learned"
    inputs = (2 if learned else 1) * T * h
    fwd = [b.elementwise("embed.lookup", inputs, T * h, T * h if learned else 0.0)]
    return _assemble(b, fwd)


def mtp_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """The entry of one multi-token-prediction module (DeepSeek-V3 report §2.2), on the last
    stage: the (shared) embedding lookup of the shifted tokens, RMSNorms of it and of the main
    model's last hidden state, and the projection of their concatenation ``[T × 2h] · [2h ×
    h/tp]``. Its transformer layer and the (shared) LM head are the ordinary
    :func:`layer_kernels` and :func:`head_kernels`."""
    b = KernelBuilder(model)
    sh = TokenShard.of(model, layout)
    h, T, Tsp = model.hidden, sh.tokens, sh.tokens_sp
    norm = model.norm_spec
    weights = model.norm_params() * model.precision_spec.param_bytes
    fwd = [b.elementwise("mtp.embed", T * h, T * h, 0.0),
           b.elementwise("mtp.norm_h", Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM, weights),
           b.elementwise("mtp.norm_e", Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM, weights),
           *b.quantize("mtp.quant_in", T * 2 * h, T * h // layout.tp),
           b.matmul("mtp.proj", T, h // layout.tp, 2 * h)]
    return _assemble(b, fwd)


def head_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Final norm, LM head (vocabulary-parallel GEMM) and softmax cross-entropy on the last
    stage. The loss kernel's FLOPs (≈ 5 per logit: max, subtract, exp, sum, log — our
    estimate) are not model FLOPs."""
    b = KernelBuilder(model)
    sh = TokenShard.of(model, layout)
    h, T, Tsp = model.hidden, sh.tokens, sh.tokens_sp
    v_t = ceil(model.vocab / layout.tp)
    norm = model.norm_spec
    fwd = [
        b.elementwise("head.norm", Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM,
                      model.norm_params() * model.precision_spec.param_bytes),
        b.matmul("head.logits", T, v_t, h, precise=True),
        # vocabulary-parallel cross-entropy (Megatron-LM): reads the logits, keeps the fp32
        # softmax for the backward and writes one fp32 loss per token; the backward reads
        # the softmax and writes the logits' gradient
        Kernel("head.loss", SOFTMAX, "fwd", 5.0 * T * v_t, T * v_t * b.act, T * v_t * 4.0 + 4.0 * T,
               backward_bytes=(T * v_t * 4.0, T * v_t * b.act)),
    ]
    return _assemble(b, fwd)
