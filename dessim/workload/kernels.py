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
    the fused bias-GeLU / SwiGLU; FLOPs are rough estimates (:mod:`dessim.workload.model`)
    and are not model FLOPs.

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
    ``(k, n, m)``); a batched GEMM of two activations (unfused attention) likewise, both
    gradients being activations. Fused attention backward has 2× the forward FLOPs
    (Megatron-LM's convention for model FLOPs; its time comes from the implementation's
    measured forward + backward rate), reads Q, K, V, O, dO and writes dQ, dK, dV. Dropout
    backward reads the output gradient and the mask, writes the input gradient; softmax
    backward reads its output and the output gradient. Other kernels: 2× FLOPs, read the
    forward inputs and the output gradient, write the input gradients.

Optimizer step (:func:`optimizer_kernel`)
    One memory-bound kernel for the passes of Megatron-LM's mixed-precision optimizer step
    over the parameters a rank updates (``MixedPrecisionOptimizer.step`` in
    megatron/core/optimizer/optimizer.py; apex ``multi_tensor_adam``): with loss scaling
    (fp16) unscale the gradients and check them for inf/NaN (read and write them); the
    gradient norm for clipping (read them); Adam (read gradient, master weight, momentum and
    variance, write the three); with master weights, copy them to the 16-bit model weights
    (read fp32, write 16-bit). Clipping's rescale runs only when the norm exceeds the
    threshold and is not counted.

Recomputation: ``selective`` re-runs the attention core before its backward; ``full`` re-runs
the whole layer forward (the embedding and LM head are never recomputed — Megatron-LM).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil
from typing import Iterable

from dessim.catalog.calibration import Calibration, load_calibration
from dessim.engine.device import DeviceModel
from dessim.workload.layout import ParallelLayout
from dessim.workload.model import Precision, TransformerConfig

__all__ = [
    "MATMUL",
    "ATTENTION",
    "ELEMENTWISE",
    "NORM",
    "SOFTMAX",
    "DROPOUT",
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
    "KernelTimer",
    "optimizer_kernel",
]

MATMUL = "matmul"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
NORM = "norm"
SOFTMAX = "softmax"
DROPOUT = "dropout"
KINDS: tuple[str, ...] = (MATMUL, ATTENTION, ELEMENTWISE, NORM, SOFTMAX, DROPOUT)
#: Bytes of a dropout mask element (PyTorch keeps a bool per element).
MASK_BYTES = 1
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
    shape: tuple[int, ...] | None = None
    groups: int = 1
    impl: str = ""                  #: attention implementation (flash2, flash3)
    #: (read, written) bytes of the backward kernel when the generic rule does not apply
    backward_bytes: tuple[float, float] | None = None

    @property
    def bytes(self) -> float:
        """Bytes moved to and from HBM (read + written)."""
        return self.bytes_read + self.bytes_written

    @property
    def device_kind(self) -> str:
        """The kind the device model costs it as: ``attention.<impl>.<fwd|bwd>`` for an
        attention block (recomputation is a forward), the kind otherwise."""
        if self.kind == ATTENTION and self.impl:
            return f"{ATTENTION}.{self.impl}.{'bwd' if self.phase == 'bwd' else 'fwd'}"
        return self.kind

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

    def bmm(self, name: str, batch: int, m: int, n: int, k: int) -> Kernel:
        """``batch`` products of two activations ``[m×k]·[k×n]`` (unfused attention)."""
        read = batch * (m * k + k * n) * self.act
        return Kernel(name, MATMUL, "fwd", 2.0 * batch * m * n * k, read, batch * m * n * self.act,
                      (m, n, k, batch))

    def elementwise(self, name: str, elements_in: int, elements_out: int, flops: float,
                    kind: str = ELEMENTWISE, extra_read: float = 0.0) -> Kernel:
        return Kernel(name, kind, "fwd", flops, elements_in * self.act + extra_read, elements_out * self.act)

    def dropout(self, name: str, elements: int) -> Kernel:
        """Dropout: read x, write y and a 1-byte mask; backward reads dy and the mask."""
        n = float(elements)
        return Kernel(name, DROPOUT, "fwd", n, n * self.act, n * (self.act + MASK_BYTES),
                      backward_bytes=(n * (self.act + MASK_BYTES), n * self.act))

    def bias_dropout_add(self, name: str, elements: int, bias: float, dropout: bool) -> Kernel:
        """Megatron-LM's fused residual: out = residual + dropout(x + bias). Reads x, the
        residual and the bias; writes out (and the mask); backward reads d_out (and the mask)
        and writes dx (the residual's gradient is d_out itself)."""
        n = float(elements)
        mask = n * MASK_BYTES if dropout else 0.0
        return Kernel(name, ELEMENTWISE, "fwd", n * (3 if dropout else 2), 2 * n * self.act + bias,
                      n * self.act + mask, backward_bytes=(n * self.act + mask, n * self.act))

    def backward(self, fwd: Kernel) -> tuple[Kernel, ...]:
        """The backward kernels of a forward kernel (module docstring, "Backward")."""
        if fwd.kind == MATMUL:
            assert fwd.shape is not None
            m, n, k = fwd.shape[:3]
            if len(fwd.shape) == 4:          # two activations: both gradients are activations
                b = fwd.shape[3]
                dgrad = Kernel(f"{fwd.name}.dgrad", MATMUL, "bwd", fwd.flops,
                               b * (m * n + k * n) * self.act, b * m * k * self.act, (m, k, n, b))
                wgrad = Kernel(f"{fwd.name}.wgrad", MATMUL, "bwd", fwd.flops,
                               b * (m * k + m * n) * self.act, b * k * n * self.act, (k, n, m, b))
                return (dgrad, wgrad)
            g = fwd.groups
            dgrad = Kernel(f"{fwd.name}.dgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * n + g * k * n) * self.operand, m * k * self.act, (m, k, n), g)
            wgrad = Kernel(f"{fwd.name}.wgrad", MATMUL, "bwd", 2 * m * n * k,
                           (m * k + m * n) * self.operand, g * k * n * self.grad, (k, n, m), g)
            return (dgrad, wgrad)
        if fwd.backward_bytes is not None:
            read, written = fwd.backward_bytes
        else:
            read = fwd.bytes_read + fwd.bytes_written  # forward inputs (and O) + output gradient
            written = fwd.bytes_read
            if fwd.kind == ATTENTION:
                read += fwd.bytes_written              # attention also re-reads O
            elif fwd.kind == SOFTMAX:
                read, written = 2 * fwd.bytes_written, fwd.bytes_read   # reads y and dy
        return (Kernel(f"{fwd.name}.bwd", fwd.kind, "bwd", 2 * fwd.flops, read, written,
                       fwd.shape, fwd.groups, fwd.impl),)


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


def _attention_core(b: _Builder, model: TransformerConfig, layout: ParallelLayout,
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
    read = (sh.tokens * q_t + 2 * mb * s_k * kv_t) * b.act
    return [Kernel("attn.core", ATTENTION, "fwd", 4.0 * mb * s_q * s_k * q_t, read,
                   sh.tokens * q_t * b.act, (bh, s_q, s_k, d, 1), impl=layout.attention)]


def layer_kernels(model: TransformerConfig, layout: ParallelLayout) -> KernelSet:
    """Kernels of one transformer layer for one micro-batch on one rank of ``layout``."""
    b = _Builder(model)
    sh = TokenShard.of(model, layout)
    t, h = layout.tp, model.hidden
    T, Tsp = sh.tokens, sh.tokens_sp
    q_t, kv_t = h // t, model.kv_dim // t
    norm = model.norm_spec
    prec = model.precision_spec
    norm_params = model.norm_params() * prec.param_bytes
    bias = h * prec.param_bytes if model.bias else 0.0

    def norm_kernel(name: str) -> Kernel:
        return b.elementwise(name, Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM, norm_params)

    core = _attention_core(b, model, layout, sh)
    fwd = [
        norm_kernel("attn.norm"),
        b.matmul("attn.qkv", T, q_t + 2 * kv_t, h),
        *core,
        b.matmul("attn.proj", T, h, q_t),
        b.bias_dropout_add("attn.residual", Tsp * h, bias, model.dropout),
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
    fwd.append(b.bias_dropout_add("mlp.residual", Tsp * h, bias, model.dropout))

    if layout.recompute == "full":
        recompute = fwd
    elif layout.recompute == "selective":
        recompute = core
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
    estimate) are not model FLOPs."""
    b = _Builder(model)
    sh = TokenShard.of(model, layout)
    h, T, Tsp = model.hidden, sh.tokens, sh.tokens_sp
    v_t = ceil(model.vocab / layout.tp)
    norm = model.norm_spec
    fwd = [
        b.elementwise("head.norm", Tsp * h, Tsp * h, norm.flops_per_element * Tsp * h, NORM,
                      model.norm_params() * model.precision_spec.param_bytes),
        b.matmul("head.logits", T, v_t, h),
        # vocabulary-parallel cross-entropy (Megatron-LM): reads the logits, keeps the fp32
        # softmax for the backward and writes one fp32 loss per token; the backward reads
        # the softmax and writes the logits' gradient
        Kernel("head.loss", SOFTMAX, "fwd", 5.0 * T * v_t, T * v_t * b.act, T * v_t * 4.0 + 4.0 * T,
               backward_bytes=(T * v_t * 4.0, T * v_t * b.act)),
    ]
    return _assemble(b, fwd)


def optimizer_kernel(name: str, params: float, precision: Precision) -> Kernel:
    """The optimizer step over ``params`` parameters as one memory-bound kernel with the
    bytes of every pass (module docstring, "Optimizer step")."""
    g, k, p = precision.grad_bytes, precision.optimizer_bytes, precision.param_bytes
    scale = 1 if precision.loss_scaling else 0
    master = 4 if precision.master_weights else 0
    # Adam: without master weights the parameters themselves are read and written
    adam_read, adam_write = g + k + (0 if master else p), k + (0 if master else p)
    read = scale * g + g + adam_read + master
    written = scale * g + adam_write + (p if master else 0)
    return Kernel(name, "optimizer", "optimizer", 0.0, params * read, params * written)


class KernelTimer:
    """Seconds a kernel takes on a named GPU: one :class:`~dessim.engine.device.DeviceModel`
    per GPU model (with the run's calibration), each kernel costed once (memoised)."""

    def __init__(self, precision: str, calibration: Calibration | None = None) -> None:
        self.precision = precision
        self.calibration = calibration if calibration is not None else load_calibration()
        self._models: dict[str, DeviceModel] = {}
        self._times: dict[tuple[str, Kernel], float] = {}

    def model(self, device: str) -> DeviceModel:
        got = self._models.get(device)
        if got is None:
            got = self._models[device] = DeviceModel.for_device(device, self.precision,
                                                                self.calibration)
        return got

    def __call__(self, device: str, kernel: Kernel) -> float:
        key = (device, kernel)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = self.model(device).kernel_time(
                kernel.device_kind, kernel.shape or (), kernel.flops, kernel.bytes)
        return t
