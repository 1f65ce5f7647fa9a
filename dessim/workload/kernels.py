"""Compute kernels of one transformer layer (and of the embedding and LM head) on one GPU.

For one micro-batch on one rank of a :class:`~dessim.workload.layout.ParallelLayout`, each
block (:func:`layer_kernels`, :func:`embedding_kernels`, :func:`head_kernels`) is a
:class:`KernelSet`: the forward kernels in execution order, the backward kernels in execution
order and the kernels re-run before the backward under activation recomputation. Each
:class:`Kernel` carries FLOPs, bytes read and written from HBM, and a ``kind``:

``matmul``
    ``shape = (m, n, k)``: ``C[m×n] = A[m×k] · B[k×n]``, FLOPs = ``2mnk``. Bytes: read A and
    B, write C. A *grouped* GEMM (MoE experts) holds ``groups`` weight matrices; its ``shape``
    is the sum of the groups' GEMMs along the token dimension (``m`` for forward and dgrad,
    ``k`` for wgrad) and FLOPs stay ``2mnk`` (balanced routing assumed).
``attention``
    Fused attention core (scores ``QKᵀ``, softmax, context ``·V``) FlashAttention-style: FLOPs
    ``4 · b · s_q · s_k · heads/tp · head_dim`` (two GEMMs of ``2·s_q·s_k·head_dim`` per
    head; the full ``s²``, no causal halving, as in Megatron-LM's FLOP formula, reference
    README §4); bytes: read Q, K, V, write O — the ``s²`` score matrix never touches HBM.
``elementwise`` / ``norm``
    Memory-bound kernels; FLOPs are rough estimates (see :mod:`dessim.workload.model`) and are
    not model FLOPs.

Tokens per rank
    ``T = micro_batch · seq_len / cp`` (context parallelism splits every sequence; each rank's
    queries attend to all ``seq_len`` keys). Norms, residual adds and the router run on
    ``T / tp`` tokens under sequence parallelism, otherwise on ``T`` (redundantly on every TP
    rank). GEMMs see all ``T`` tokens (after SP's all-gather). Communication (TP all-reduce /
    all-gather / reduce-scatter, CP K/V exchange, MoE all-to-all) is *not* here: the task-graph
    generator inserts it between these kernels.

Backward (documented factors)
    Each matmul becomes two kernels with the forward's FLOPs each: ``dgrad``
    (``dX = dY · Wᵀ``, shape ``(m, k, n)``) and ``wgrad`` (``dW = Xᵀ · dY``, shape
    ``(k, n, m)``). Attention backward has 2× the forward FLOPs (Megatron-LM's convention;
    FlashAttention's own score recomputation, +0.5×, is not counted), reads Q, K, V, O, dO and
    writes dQ, dK, dV. Other kernels: 2× FLOPs, read the forward inputs and the output
    gradient, write the input gradients.

Recomputation: ``selective`` re-runs the attention core before its backward; ``full`` re-runs
the whole layer forward (the embedding and LM head are never recomputed — Megatron-LM).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil
from typing import Iterable

from dessim.workload.layout import ParallelLayout
from dessim.workload.model import Precision, TransformerConfig

__all__ = [
    "MATMUL",
    "ATTENTION",
    "ELEMENTWISE",
    "NORM",
    "KINDS",
    "PHASES",
    "Kernel",
    "KernelSet",
    "TokenShard",
    "layer_kernels",
    "embedding_kernels",
    "head_kernels",
    "sum_flops",
    "KernelBuilder",
]

MATMUL = "matmul"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
NORM = "norm"
KINDS: tuple[str, ...] = (MATMUL, ATTENTION, ELEMENTWISE, NORM)
#: Kernel phases: forward, backward, and forward kernels re-run for recomputation.
PHASES: tuple[str, ...] = ("fwd", "bwd", "recompute")


@dataclass(frozen=True, slots=True)
class Kernel:
    """One GPU kernel (FLOPs, bytes) — see the module docstring for the conventions."""

    name: str
    kind: str
    phase: str
    flops: float
    bytes_read: float
    bytes_written: float
    shape: tuple[int, int, int] | None = None
    groups: int = 1

    @property
    def bytes(self) -> float:
        """Bytes moved to and from HBM (read + written)."""
        return self.bytes_read + self.bytes_written

    @property
    def is_model_flops(self) -> bool:
        """Whether the kernel's FLOPs count as *model* FLOPs: matmul and attention FLOPs of
        the forward and backward passes (not recomputation, not elementwise kernels)."""
        return self.phase != "recompute" and self.kind in (MATMUL, ATTENTION)


def sum_flops(kernels: Iterable[Kernel], model_only: bool = False) -> float:
    """Sum of FLOPs; with ``model_only`` only what counts as model FLOPs."""
    return sum(k.flops for k in kernels if k.is_model_flops or not model_only)


@dataclass(frozen=True, slots=True)
class KernelSet:
    """The kernels of one block for one micro-batch on one rank."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...] = ()

    @property
    def all(self) -> tuple[Kernel, ...]:
        """Forward, recompute and backward kernels, in that order."""
        return self.forward + self.recompute + self.backward

    def model_flops(self) -> float:
        return sum_flops(self.all, model_only=True)

    def hardware_flops(self) -> float:
        """Matmul and attention FLOPs actually executed, recomputation included."""
        return sum(k.flops for k in self.all if k.kind in (MATMUL, ATTENTION))


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


# ---------------------------------------------------------------------- kernel constructors
class _Builder:
    """Makes kernels with the byte sizes of one model's precision."""

    def __init__(self, model: TransformerConfig | Precision):
        p = model if isinstance(model, Precision) else model.precision_spec
        self.operand = p.element_bytes
        self.act = p.activation_bytes
        self.grad = p.grad_bytes

    def matmul(self, name: str, m: int, n: int, k: int, groups: int = 1) -> Kernel:
        read = (m * k + groups * k * n) * self.operand
        return Kernel(name, MATMUL, "fwd", 2 * m * n * k, read, m * n * self.act, (m, n, k), groups)

    def elementwise(self, name: str, elements_in: int, elements_out: int, flops: float,
                    kind: str = ELEMENTWISE, extra_read: float = 0.0) -> Kernel:
        return Kernel(name, kind, "fwd", flops, elements_in * self.act + extra_read, elements_out * self.act)

    def backward(self, fwd: Kernel) -> tuple[Kernel, ...]:
        """The backward kernels of a forward kernel (module docstring, "Backward")."""
        if fwd.kind == MATMUL:
            assert fwd.shape is not None
            m, n, k = fwd.shape
            g = fwd.groups
            dgrad = Kernel(f"{fwd.name}.dgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * n + g * k * n) * self.operand, m * k * self.act, (m, k, n), g)
            wgrad = Kernel(f"{fwd.name}.wgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * k + m * n) * self.operand, g * k * n * self.grad, (k, n, m), g)
            return (dgrad, wgrad)
        read = fwd.bytes_read + fwd.bytes_written  # forward inputs (and O) + output gradient
        if fwd.kind == ATTENTION:
            read += fwd.bytes_written              # attention also re-reads O
        return (Kernel(f"{fwd.name}.bwd", fwd.kind, "bwd", 2 * fwd.flops, read, fwd.bytes_read),)


#: Public name of the kernel constructor, for the other model families (DLRM MLPs, ViT heads)
#: that build their GEMMs and backward kernels with the same conventions; takes a
#: TransformerConfig or a :class:`~dessim.workload.model.Precision`.
KernelBuilder = _Builder


def _assemble(b: _Builder, forward: list[Kernel], recompute: Iterable[Kernel] = ()) -> KernelSet:
    backward = tuple(k for fwd in reversed(forward) for k in b.backward(fwd))
    return KernelSet(tuple(forward), backward, tuple(replace(k, phase="recompute") for k in recompute))


def _mlp(b: _Builder, model: TransformerConfig, prefix: str, tokens: int, ffn_t: int,
         groups: int = 1) -> list[Kernel]:
    """An MLP (or ``groups`` local experts) on ``tokens`` rows, width ``ffn_t`` per TP rank."""
    act = model.activation_spec
    h = model.hidden
    ks = []
    if act.gated:
        ks.append(b.matmul(f"{prefix}.gate", tokens, ffn_t, h, groups))
    ks.append(b.matmul(f"{prefix}.up", tokens, ffn_t, h, groups))
    inputs = (2 if act.gated else 1) * tokens * ffn_t
    ks.append(b.elementwise(f"{prefix}.act", inputs, tokens * ffn_t, act.flops_per_element * tokens * ffn_t))
    ks.append(b.matmul(f"{prefix}.down", tokens, h, ffn_t, groups))
    return ks


def layer_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Kernels of one transformer layer for one micro-batch on one rank of ``layout``."""
    b = _Builder(model)
    sh = TokenShard.of(model, layout)
    t, h = layout.tp, model.hidden
    T, Tsp = sh.tokens, sh.tokens_sp
    q_t, kv_t = h // t, model.kv_dim // t
    norm = model.norm_spec
    norm_params = model.norm_params() * model.precision_spec.param_bytes

    def norm_kernel(name: str) -> Kernel:
        return b.elementwise(name, Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM, norm_params)

    attn_read = (T * q_t + 2 * layout.micro_batch * sh.seq_len * kv_t) * b.act
    attention = Kernel("attn.core", ATTENTION, "fwd",
                       4 * layout.micro_batch * sh.seq_local * sh.seq_len * q_t,
                       attn_read, T * q_t * b.act)
    fwd = [
        norm_kernel("attn.norm"),
        b.matmul("attn.qkv", T, q_t + 2 * kv_t, h),
        attention,
        b.matmul("attn.proj", T, h, q_t),
        b.elementwise("attn.residual", 2 * Tsp * h, Tsp * h, Tsp * h),
        norm_kernel("mlp.norm"),
    ]
    if model.is_moe:
        k, local = model.top_k, model.experts // layout.ep
        routed = T * k  # tokens this rank's experts process (balanced routing)
        fwd.append(b.matmul("moe.router", Tsp, model.experts, h))
        fwd.append(b.elementwise("moe.permute", T * h, routed * h, 0.0))
        fwd += _mlp(b, model, "moe.expert", routed, model.moe_ffn_hidden // t, local)  # type: ignore[operator]
        fwd.append(b.elementwise("moe.unpermute", routed * h, T * h, 2 * routed * h))
    else:
        fwd += _mlp(b, model, "mlp", T, model.ffn_hidden // t)
    fwd.append(b.elementwise("mlp.residual", 2 * Tsp * h, Tsp * h, Tsp * h))

    if layout.recompute == "full":
        recompute = fwd
    elif layout.recompute == "selective":
        recompute = [attention]
    else:
        recompute = []
    return _assemble(b, fwd, recompute)


def embedding_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Token (+ learned position) embedding lookup on the first pipeline stage.

    Vocabulary-parallel: every TP rank looks up the rows of its vocabulary slice for all
    ``T`` tokens (the partial results are then all-reduced, or reduce-scattered under SP)."""
    b = _Builder(model)
    sh = TokenShard.of(model, layout)
    h, T = model.hidden, sh.tokens
    learned = model.position_embedding == "learned"
    inputs = (2 if learned else 1) * T * h
    fwd = [b.elementwise("embed.lookup", inputs, T * h, T * h if learned else 0.0)]
    return _assemble(b, fwd)


def head_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Final norm, LM head (vocabulary-parallel GEMM) and softmax cross-entropy on the last
    stage. The loss kernel's FLOPs (≈ 5 per logit: max, subtract, exp, sum, log — our
    estimate) are not model FLOPs; it writes one fp32 loss per token."""
    b = _Builder(model)
    sh = TokenShard.of(model, layout)
    h, T, Tsp = model.hidden, sh.tokens, sh.tokens_sp
    v_t = ceil(model.vocab / layout.tp)
    norm = model.norm_spec
    fwd = [
        b.elementwise("head.norm", Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM,
                      model.norm_params() * model.precision_spec.param_bytes),
        b.matmul("head.logits", T, v_t, h),
        Kernel("head.loss", ELEMENTWISE, "fwd", 5.0 * T * v_t, T * v_t * b.act, 4.0 * T),
    ]
    return _assemble(b, fwd)
