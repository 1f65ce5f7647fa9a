"""Pass programs: what one rank does for one pass (forward or backward) of one micro-batch
through one model chunk, as a rank-independent list of :class:`Step` templates.

The task-graph generator (:mod:`dessim.workload.transformer.generator`) stamps these templates out for
every rank and micro-batch. A step is a compute segment (one or more kernels of
:mod:`dessim.workload.transformer.kernels`), a collective on a named rank group (``tp``, ``ep``,
``dp_cp``, ``edp``), a ring send/recv in the context-parallel group, or a memcpy to/from
far memory. ``deps`` are indices of earlier steps of the same pass; each step also waits for
the previous step of its stream (program order).

Where communication goes (Megatron-LM, Shoeybi et al. 2019 and Korthikanti et al. 2022)
    Tensor parallelism has two conjugate operators per sub-layer: ``f`` before a
    column-parallel GEMM (QKV, MLP up/gate, LM head) — identity forward, all-reduce of the
    input gradient backward — and ``g`` after a row-parallel GEMM (attention out-proj, MLP
    down, vocabulary-parallel embedding) — all-reduce forward, identity backward. Every
    layer thus has 2 all-reduces forward and 2 backward of ``T·h`` elements (``T`` tokens of
    the rank, :class:`~dessim.workload.transformer.kernels.TokenShard`). With sequence parallelism ``f``
    becomes an all-gather forward / reduce-scatter backward and ``g`` a reduce-scatter
    forward / all-gather backward (same ``T·h`` element arrays, nccl-tests sizes = the whole
    gathered/reduced array); the backward also re-gathers the sequence-sharded input of the
    column-parallel GEMM for its weight gradient (Megatron's ``sequence_parallel`` path of
    ``LinearWithGradAccumulationAndAsyncCommunication``), so SP has 4 collectives per layer
    forward and 6 backward. Cross-entropy's small all-reduces (max and sum over the
    vocabulary, ``T`` floats each) are not modelled.
Overlap in backward
    The all-reduce (or reduce-scatter) of an input gradient starts when the data-gradient
    GEMM is done and runs alongside the weight-gradient GEMM(s) that follow it (Megatron's
    asynchronous gradient all-reduce); the re-gather of SP inputs starts with the
    data-gradient GEMM and only the weight gradient waits for it.
Expert parallelism
    All-to-all of the routed tokens (``top_k·T·h`` elements, times the routing's load factor:
    the most loaded rank's share, :mod:`dessim.workload.transformer.routing`) after the
    permutation (dispatch) and before the un-permutation (combine), and the same two backward,
    where their directions swap: the dispatch's backward is a combine and the combine's a
    dispatch (:attr:`CommSpec.combine`). Sizes follow the direction: FP8 recipes send the
    dispatch direction in FP8 with its scales and the combine direction in 16 bits, in both
    passes (DeepSeek-V3 report, arXiv 2412.19437, §3.3.3 "Low-Precision Communication": the
    activation before the MoE up-projections is quantized to FP8 before the dispatch, "a
    similar strategy is applied to the activation gradient before MoE down-projections" —
    the combine's backward — and "for both the forward and backward combine components, we
    retain them in BF16"; deepseek-ai/DeepEP README: ``combine_backward`` dispatches an FP8
    ``(tensor, scales)`` tuple or a BF16 tensor, ``dispatch_backward`` combines a BF16 one).
    Shared experts (DeepSeekMoE) need no token exchange: they run while the dispatch is in
    flight, forward and backward (DeepSeek-V3 report §3.2.2 overlaps them likewise). With TP
    and sequence parallelism an MoE layer follows Megatron-core's dispatchers
    (:func:`layer_points`): the router and the dispatch take the rank's ``T/tp`` tokens, no
    ``f``/``g`` surrounds the routed experts (only the shared experts), and the flat layout's
    all-to-all is chained with a TP all-gather of the rows it delivered and, before the
    combine, a TP reduce-scatter of the experts' rows (``MoEAlltoAllTokenDispatcher``);
    DeepEP's runs on the TP × EP group instead (``MoEFlexTokenDispatcher``).
Context parallelism (ring attention, Liu et al. 2023; Megatron-core ``cp_comm_type=p2p``)
    The attention core is split into ``cp`` blocks; while block ``j`` computes, the K/V
    block needed by block ``j+1`` is received from the previous CP rank and forwarded to
    the next: ``cp - 1`` exchanges of ``2·T·kv_dim/tp`` elements per attention forward (and
    recomputation); the backward passes K/V and their gradients, twice the bytes.
Recomputation
    ``full``: the layer's forward (with its TP communication, as Megatron re-runs it) right
    before the layer's backward; ``selective``: the attention core right before its backward.
ZeRO-3 / FSDP
    The parameters of each block (layer, embedding, head) are all-gathered before its
    forward and again before its backward (``reshard_after_forward``), prefetched one block
    ahead (the gather of block ``i+1`` starts when block ``i`` starts computing); its gradients
    are reduce-scattered right after its backward, every micro-batch.
Activation offload
    After a layer's forward its stored activations are copied to far memory; they come back
    one layer ahead of the layer's backward (two layers' worth stay in HBM, as
    :mod:`dessim.workload.transformer.memory` assumes).

Tensor-parallel communication overlap (``training.tp_comm_overlap``)
    The TP collectives next to a GEMM are chunked and pipelined with the GEMM's row blocks
    (:mod:`dessim.workload.transformer.overlap`): forward, the all-gather before a
    column-parallel GEMM (SP) and the reduce-scatter or all-reduce after a row-parallel GEMM;
    backward, the all-gather of the output gradient before a row-parallel GEMM's data
    gradient (SP). Only GEMM neighbours are chunked (not the embedding lookup).

Merging (``granularity="layer"``): consecutive compute steps of one block and phase become
one task when nothing depends on the first and the second waits for nothing else; a block's
trailing segment (after its last communication) merges into the next block's first. Without
any communication inside, a layer's pass is therefore exactly one compute task.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from dessim.workload.common.kernels import ATTENTION, MATMUL, Kernel, KernelSet
from dessim.workload.transformer.kernels import expert_tokens, routed_tokens
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.overlap import OverlapMethod, OverlapOptions, chunk_kernel, method_for

__all__ = ["Step", "Block", "PassBuilder", "CommPoint", "CommSpec", "layer_points",
           "embedding_points", "head_points", "merge_steps", "describe_steps", "GRANULARITIES",
           "split_backward", "WGRAD"]

#: Task granularities of the generator (``stage``: one task per pass and DP bucket, see
#: :mod:`dessim.workload.transformer.tp_islands`; it falls back to ``layer`` where it would not be exact).
GRANULARITIES: tuple[str, ...] = ("layer", "kernel", "stage")


@dataclass(slots=True)
class Step:
    """One step template of a pass program (see the module docstring)."""

    kind: str                       #: compute | collective | send | recv | memcpy
    name: str
    category: str                   #: fwd/bwd/recompute (compute); tp/ep/cp/dp/offload
    stream: str
    deps: list[int] = field(default_factory=list)
    block: str = ""                 #: "embed", "L<i>", "head"
    kernels: list[Kernel] = field(default_factory=list)
    op: str = ""
    size: float = 0.0
    group: str = ""                 #: rank-group kind for collectives
    peer: str = ""                  #: "next" | "prev" (CP ring)
    ring: int = 0                   #: ring exchange index within its attention (1..cp-1)
    direction: str = ""             #: memcpy direction
    key: tuple = ()                 #: memcpy: identity of the offloaded data (cross-pass)
    after_key: tuple = ()           #: memcpy: wait for the memcpy with this key (any pass)
    completes: list[str] = field(default_factory=list)  #: blocks whose last kernel is here
    combine: bool = False           #: collective: an MoE all-to-all in the combine direction

    @property
    def is_compute(self) -> bool:
        return self.kind == "compute"


@dataclass(frozen=True, slots=True)
class CommSpec:
    """One collective at a point: ``op`` of ``size`` bytes on group kind ``group``.

    ``combine``: an MoE all-to-all in the combine direction — expert outputs (or, backward,
    the dispatch's input gradients) going back to their tokens' ranks and summed there. DeepEP
    runs it as the mirror image of the dispatch (NVLink first, then the network;
    :mod:`dessim.collectives.algorithms.rail` option ``nvlink_first``), and the backward of a
    dispatch is a combine and vice versa (deepseek-ai/DeepEP README: the dispatch's backward
    calls ``combine``, the combine's ``dispatch``)."""

    category: str
    op: str
    size: float
    group: str
    label: str
    combine: bool = False


@dataclass(frozen=True, slots=True)
class CommPoint:
    """A communication point *before* forward kernel ``before`` (``"<end>"``: after the
    block's last kernel), between ``before`` and the kernel that precedes it.

    ``fwd``/``bwd``: collectives at the point in forward and backward; ``regather``: SP's
    backward re-gather of the input of the ``consumers`` (column-parallel GEMMs).
    ``overlap``: the forward kernels from ``before`` on that do not need the collective and
    run while it is in flight (MoE shared experts during the dispatch all-to-all); the kernel
    after them waits for it. The backward mirrors it: the collective starts where it would
    without those kernels and their backward kernels run during it. ``chain``: the
    collectives of ``fwd`` (and of ``bwd``) run one after another, each waiting for the
    previous (Megatron's MoE all-to-all and the TP all-gather of what it delivered)."""

    before: str
    fwd: tuple[CommSpec, ...] = ()
    bwd: tuple[CommSpec, ...] = ()
    regather: tuple[CommSpec, ...] = ()
    consumers: tuple[str, ...] = ()
    overlap: int = 0
    chain: bool = False             #: the collectives run one after another (in tuple order)


END = "<end>"


def _tp_specs(kind: str, sp: bool, size: float, label: str) -> dict[str, tuple[CommSpec, ...]]:
    """Megatron's f / g operators (module docstring) as forward/backward/re-gather comms."""
    ar = (CommSpec("tp", "allreduce", size, "tp", f"{label}.ar"),)
    ag = (CommSpec("tp", "allgather", size, "tp", f"{label}.ag"),)
    rs = (CommSpec("tp", "reducescatter", size, "tp", f"{label}.rs"),)
    if kind == "f":
        if sp:
            return {"fwd": ag, "bwd": rs,
                    "regather": (CommSpec("tp", "allgather", size, "tp", f"{label}.ag_input"),)}
        return {"fwd": (), "bwd": ar, "regather": ()}
    return {"fwd": rs if sp else ar, "bwd": ag if sp else (), "regather": ()}


def _consumers(kernels: Sequence[Kernel], start: str) -> tuple[str, ...]:
    """The column-parallel GEMMs fed by an ``f`` point: the run of matmuls from ``start``."""
    names = [k.name for k in kernels]
    out = []
    for k in kernels[names.index(start):]:
        if k.kind != MATMUL:
            break
        out.append(k.name)
    return tuple(out)


def _points(kernels: Sequence[Kernel], raw: list[tuple[str, str, str]], layout: ParallelLayout,
            tp_size: float, ep_size: tuple[float, float] = (0.0, 0.0),
            overlap: int = 0, ep_group: str = "ep",
            tp_rows: tuple[float, float] | None = None) -> list[CommPoint]:
    """CommPoints from ``(before, operator, label)`` with operator f | g | a2a (``ep_size``:
    bytes of the dispatch and the combine; ``overlap``: of the dispatch, see
    :class:`CommPoint`; ``ep_group``: the all-to-all's group kind; ``tp_rows``: bytes of the
    TP all-gather of the received rows after the dispatch and of their reduce-scatter before
    the combine, in the dispatch and the combine direction — Megatron's flat layout with
    sequence parallelism, :func:`layer_points`)."""
    sp = layout.sequence_parallel
    names = {k.name for k in kernels} | {END}
    raw = [r for r in raw if r[0] in names]
    out = []
    for before, oper, label in raw:
        if oper == "a2a":
            dispatch = label == "moe.dispatch"
            a2a: tuple[tuple[CommSpec, ...], tuple[CommSpec, ...]] = ((), ())
            if layout.moe_all_to_all:
                # the backward runs the other direction, at that direction's size: the
                # dispatch's backward combines 16-bit gradients, the combine's backward
                # dispatches gradients in the dispatch's precision (module docstring)
                fwd = CommSpec("ep", "alltoall", ep_size[0 if dispatch else 1], ep_group, label,
                               combine=not dispatch)
                a2a = ((fwd,), (replace(fwd, size=ep_size[1 if dispatch else 0], combine=dispatch),))
            tp: tuple[tuple[CommSpec, ...], tuple[CommSpec, ...]] = ((), ())
            if tp_rows is not None and layout.expert_tp > 1:    # also with ep = 1: the gather alone
                etp = "etp" if layout.separate_expert_tp else "tp"      # the experts' TP group
                gather = CommSpec("tp", "allgather", tp_rows[0], etp, f"{label}.ag")
                scatter = CommSpec("tp", "reducescatter", tp_rows[1], etp, f"{label}.rs")
                tp = ((gather,), (scatter,)) if dispatch else ((scatter,), (gather,))
            # dispatch: all-to-all, then all-gather; backward reduce-scatter, all-to-all.
            # combine: reduce-scatter, then all-to-all; backward the reverse
            fwd_specs, bwd_specs = (a2a[0] + tp[0], tp[1] + a2a[1]) if dispatch else (tp[0] + a2a[0], a2a[1] + tp[1])
            if fwd_specs:
                out.append(CommPoint(before, fwd_specs, bwd_specs, overlap=overlap if dispatch else 0,
                                     chain=len(fwd_specs) > 1))
            continue
        if layout.tp == 1:
            continue
        specs = _tp_specs(oper, sp, tp_size, label)
        consumers = _consumers(kernels, before) if specs["regather"] else ()
        out.append(CommPoint(before, specs["fwd"], specs["bwd"], specs["regather"], consumers))
    return out


def _token_sizes(model: TransformerConfig, layout: ParallelLayout,
                 routed_from: int | None = None) -> tuple[float, tuple[float, float]]:
    """Bytes of one TP collective, and of the MoE all-to-alls in the dispatch and the combine
    direction (FP8 recipes dispatch FP8 tokens — forward — and FP8 output gradients —
    backward — with their scales, DeepSeek-V3 report §3.3.3, unless ``moe_dispatch_precision``
    is ``bf16``; the combine direction is 16-bit in both passes), the latter for the routed
    copies of ``routed_from`` tokens (default: the rank's ``T``)."""
    prec = model.precision_spec
    e = prec.activation_bytes
    tokens = layout.micro_batch * model.seq_len // layout.cp
    tp_size = tokens * model.hidden * e
    if not model.is_moe:
        return float(tp_size), (0.0, 0.0)
    routed = routed_tokens(model, layout, tokens if routed_from is None else routed_from) * model.hidden
    dispatch = prec.quantized_bytes(routed) if layout.fp8_dispatch(model) else routed * e
    return float(tp_size), (float(dispatch), float(routed * e))


def layer_points(model: TransformerConfig, layout: ParallelLayout, ks: KernelSet,
                 deepep: bool = False, ep_group: str = "ep") -> list[CommPoint]:
    """Communication points of a transformer layer (module docstring). ``deepep``: the kernels
    are DeepEP's layout (:func:`~dessim.workload.transformer.kernels.layer_kernels` with
    ``received``): the dispatch lands before the experts' GPU permutes what it received and
    the combine follows its weighted sum, right before the residual add.

    DeepEP with TP or expert TP (``ep_group`` ``tp_ep`` over the ``etp × ep`` ranks, sequence
    parallelism; Megatron-core's ``MoEFlexTokenDispatcher``, NVIDIA/Megatron-LM
    ``megatron/core/transformer/moe/token_dispatcher.py``): the router and the dispatch take the rank's ``T/tp``
    sequence-parallel tokens and the combine returns them, summing the experts' row-parallel
    partials on the way, so an MoE layer has no ``f``/``g`` around its routed experts. The
    shared experts are an ordinary TP MLP on the gathered tokens (Megatron-core's
    ``SharedExpertMLP.pre_forward_comm``/``post_forward_comm``: all-gather of the ``T·h``
    tokens before their first GEMM, reduce-scatter after, issued with the combine): an ``f``
    before their first GEMM and a ``g`` with the combine before the residual add. The
    all-to-all sizes are the flat ones of ``top_k·etp·T/tp`` copies — each rank sends the
    ``top_k`` copies of its ``T/tp`` tokens to every expert-TP rank of their EP ranks, ``etp``
    of them (:func:`~dessim.workload.transformer.kernels.expert_tokens`; ``top_k·T`` when
    ``etp = tp``) — which the rail algorithm's shares scale to the bytes sent
    (``_Generator._ep_attrs``).

    The flat layout with TP and sequence parallelism (Megatron-core's
    ``MoEAlltoAllTokenDispatcher``: ``dispatch_postprocess`` / ``combine_preprocess``): the
    EP all-to-all carries the copies of the rank's ``T/tp`` tokens, chained with a TP
    all-gather of the ``top_k·T·L`` rows it delivered (dispatch) or after a TP reduce-scatter
    of the experts' rows (combine) — with ``ep = 1`` the all-gather and reduce-scatter alone
    (the all-to-all over a one-rank EP group moves nothing; ``dispatch_postprocess`` still
    gathers); the shared experts' ``f``/``g`` as above. DeepEP with ``ep = 1`` and ``etp > 1``
    runs on the expert-TP group (``ep_group`` ``tp_ep``, :attr:`ParallelLayout.moe_all_to_all`). Without SP
    (which Megatron-core refuses for MoE training) the MLP's ``f``/``g`` surround the layer
    and every TP rank sends the copies of all ``T`` tokens."""
    tp_size, ep_size = _token_sizes(model, layout)
    first_attn = next(k.name for k in ks.forward if k.name.startswith("attn.") and k.kind == MATMUL)
    first_mlp = next(k.name for k in ks.forward if k.name.startswith(("mlp.gate", "mlp.up", "moe.router")))
    names = [k.name for k in ks.forward]
    first_expert = next((n for n in names if n.startswith("moe.expert")), "")
    shared = [n for n in names if n.startswith("moe.shared")]
    raw = [(first_attn, "f", "attn.f"), ("attn.residual", "g", "attn.g"),
           (first_mlp, "f", "mlp.f"), ("mlp.residual", "g", "mlp.g")]
    # with SP an MoE layer's TP collectives surround only its shared experts (an ordinary TP
    # MLP on the gathered tokens: SharedExpertMLP.pre_forward_comm / post_forward_comm)
    shared_tp = [(next(k.name for k in ks.forward if k.name.startswith("moe.shared") and k.kind == MATMUL),
                  "f", "moe.shared.f"), ("mlp.residual", "g", "moe.shared.g")] if shared else []
    tp_rows = None
    if first_expert and deepep and ep_group == "tp_ep":
        raw = raw[:2] + [(shared[0] if shared else "moe.permute", "a2a", "moe.dispatch"),
                         ("mlp.residual", "a2a", "moe.combine")] + shared_tp
        _, ep_size = _token_sizes(model, layout, expert_tokens(model, layout))
    elif first_expert and deepep:
        raw += [(shared[0] if shared else "moe.permute", "a2a", "moe.dispatch"),
                ("mlp.residual", "a2a", "moe.combine")]
    elif first_expert and (layout.sequence_parallel or layout.separate_expert_tp):
        # Megatron's MoEAlltoAllTokenDispatcher with TP: the all-to-all carries the copies of
        # the rank's T/tp tokens, expert TP gathers what it delivered and reduce-scatters
        # the experts' output before the combine
        raw = raw[:2] + [(shared[0] if shared else first_expert, "a2a", "moe.dispatch"),
                         ("moe.unpermute", "a2a", "moe.combine")] + shared_tp
        _, tp_rows = _token_sizes(model, layout, expert_tokens(model, layout))
        _, ep_size = _token_sizes(model, layout, layout.micro_batch * model.seq_len // layout.cp // layout.tp)
    elif first_expert:
        raw += [(shared[0] if shared else first_expert, "a2a", "moe.dispatch"),
                ("moe.unpermute", "a2a", "moe.combine")]
    return _points(ks.forward, raw, layout, tp_size, ep_size, len(shared), ep_group, tp_rows)


def embedding_points(model: TransformerConfig, layout: ParallelLayout, ks: KernelSet) -> list[CommPoint]:
    """Vocabulary-parallel embedding: a ``g`` operator after the lookup."""
    tp_size, ep_size = _token_sizes(model, layout)
    return _points(ks.forward, [(END, "g", "embed.g")], layout, tp_size, ep_size)


def head_points(model: TransformerConfig, layout: ParallelLayout, ks: KernelSet) -> list[CommPoint]:
    """LM head: an ``f`` operator before the vocabulary-parallel logits GEMM."""
    tp_size, ep_size = _token_sizes(model, layout)
    return _points(ks.forward, [("head.logits", "f", "head.f")], layout, tp_size, ep_size)


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a chunk: its kernels, communication points and parameters.

    ``params`` = (dense, expert) parameters the rank holds for the block (before ZeRO)."""

    name: str
    kernels: KernelSet
    points: tuple[CommPoint, ...]
    params: tuple[float, float]
    activation_bytes: float = 0.0   #: stored activations per micro-batch (offload)


def _first_bwd_name(k: Kernel) -> str:
    return f"{k.name}.dgrad" if k.kind == MATMUL else f"{k.name}.bwd"


class PassBuilder:
    """Builds the step list of one pass (see :meth:`forward` and :meth:`backward`)."""

    def __init__(self, model: TransformerConfig, layout: ParallelLayout, *,
                 zero3_param_bytes: float = 0.0, offload_activations: bool = False,
                 overlap: OverlapOptions | None = None) -> None:
        self.model = model
        self.overlap = overlap or OverlapOptions()
        self.layout = layout
        self.steps: list[Step] = []
        self.waits: list[int] = []          # deps for the next compute step
        self.last_compute = -1
        self.last_main = -1                 # last compute step that is not a weight gradient
        self.zero3_param_bytes = zero3_param_bytes  # bytes per parameter of ZeRO-3 gathers
        self.offload = offload_activations
        e = model.precision_spec.activation_bytes
        tokens = layout.micro_batch * model.seq_len // layout.cp
        self.kv_block = 2.0 * tokens * model.kv_dim / layout.tp * e  # type: ignore[operator]

    # -------------------------------------------------------------- primitives
    def _add(self, step: Step) -> int:
        self.steps.append(step)
        return len(self.steps) - 1

    def compute(self, kernel: Kernel, block: str, category: str, extra_deps: Sequence[int] = ()) -> int:
        deps = sorted(set(self.waits) | set(extra_deps))
        self.waits = []
        i = self._add(Step("compute", kernel.name, category, "compute", deps, block, [kernel]))
        self.last_compute = i
        if not kernel.name.endswith(".wgrad"):
            self.last_main = i
        return i

    def comm(self, spec: CommSpec, block: str, dep: int) -> int:
        return self._add(Step("collective", spec.label, spec.category, spec.category,
                              [dep] if dep >= 0 else [], block, op=spec.op, size=spec.size,
                              group=spec.group, combine=spec.combine))

    def comms(self, specs: Sequence[CommSpec], block: str, dep: int, chain: bool) -> list[int]:
        """The collectives of a point after step ``dep``: together, or with ``chain`` one
        after another (:class:`CommPoint`); returns what later steps wait for."""
        ids: list[int] = []
        for spec in specs:
            ids.append(self.comm(spec, block, ids[-1] if chain and ids else dep))
        return ids[-1:] if chain else ids

    def _dp_collective(self, op: str, size: float, group: str, label: str, block: str,
                       deps: list[int], stream: str) -> int:
        return self._add(Step("collective", label, "dp", stream, deps, block, op=op, size=size,
                              group=group))

    # -------------------------------------------------------------- TP comm overlap
    def _overlap_method(self, specs: Sequence[CommSpec], position: str,
                        kernels: Sequence[Kernel]) -> OverlapMethod | None:
        """The overlap method for ``specs`` next to ``kernels``, or None (not overlapped)."""
        if not self.overlap.tp_comm_overlap or len(specs) != 1 or not kernels:
            return None
        if any(k.kind != MATMUL for k in kernels):
            return None
        return method_for(position, specs[0].op)

    def _chunk_comm(self, spec: CommSpec, i: int, n: int, block: str, dep: int) -> int:
        return self.comm(replace(spec, size=spec.size / n, label=f"{spec.label}#{i}"), block, dep)

    def _overlap_pre(self, specs: Sequence[CommSpec], kernels: Sequence[Kernel], block: str,
                     category: str, dep: int) -> bool:
        """Chunked collective before ``kernels`` (GEMMs of one input): GEMM chunk ``i`` waits
        for communication chunk ``i``. False when not overlapped (nothing emitted)."""
        method = self._overlap_method(specs, "pre", kernels)
        if method is None:
            return False
        chunks = [chunk_kernel(k, method.chunks(self.layout.tp), method.reserved_sms) for k in kernels]
        n = len(chunks[0])
        comms = [self._chunk_comm(specs[0], i, n, block, dep) for i in range(n)]
        for i in range(n):
            self.waits.append(comms[i])
            for part in chunks:
                self.compute(part[i], block, category)
        return True

    def _overlap_post(self, specs: Sequence[CommSpec], kernel: Kernel, block: str, category: str) -> bool:
        """``kernel`` chunked with its collective after it: communication chunk ``i`` waits
        for GEMM chunk ``i``; the next step waits for every chunk."""
        method = self._overlap_method(specs, "post", [kernel])
        if method is None:
            return False
        chunks = chunk_kernel(kernel, method.chunks(self.layout.tp), method.reserved_sms)
        comms = [self._chunk_comm(specs[0], i, len(chunks), block, self.compute(c, block, category))
                 for i, c in enumerate(chunks)]
        self.waits += comms
        return True

    # -------------------------------------------------------------- ring attention
    def _ring_attention(self, kernel: Kernel, block: str, category: str, factor: float) -> None:
        cp = self.layout.cp
        # each step attends the local queries to ONE K/V block: s_k / cp keys. The device
        # model costs an attention kernel by its shape, so the shape must say so (a part
        # with the whole s_k would cost the whole attention cp times)
        shape = kernel.shape
        if len(shape) == 5:
            bh, s_q, s_k, d, causal = shape
            shape = (bh, s_q, s_k // cp if s_k % cp == 0 else s_k / cp, d, causal)
        part = replace(kernel, flops=kernel.flops / cp, bytes_read=kernel.bytes_read / cp,
                       bytes_written=kernel.bytes_written / cp, shape=shape)
        size = self.kv_block * factor
        produced = self.last_compute
        recv_prev = -1
        for j in range(cp):
            if j + 1 < cp:
                send_dep = produced if j == 0 else recv_prev
                self._add(Step("send", f"{kernel.name}.kv{j + 1}", "cp", "cp.send",
                               [send_dep] if send_dep >= 0 else [], block, size=size, peer="next",
                               ring=j + 1))
            deps = [recv_prev] if j > 0 else []
            self.compute(replace(part, name=f"{kernel.name}[{j}]"), block, category, deps)
            if j + 1 < cp:
                recv_prev = self._add(Step("recv", f"{kernel.name}.kv{j + 1}", "cp", "cp.recv", [],
                                           block, size=size, peer="prev", ring=j + 1))

    def _kernel(self, kernel: Kernel, block: str, category: str) -> None:
        if kernel.kind == ATTENTION and self.layout.cp > 1:
            self._ring_attention(kernel, block, category, 2.0 if kernel.phase == "bwd" else 1.0)
        else:
            self.compute(kernel, block, category)

    # -------------------------------------------------------------- ZeRO-3 and offload
    def _gather(self, block: Block, prefetch_dep: int) -> list[int]:
        """ZeRO-3 all-gathers of ``block``'s parameters; returns their step indices."""
        out = []
        dense, expert = block.params
        for params, group in ((dense, "dp_cp"), (expert, "edp")):
            if params and self._group_size(group) > 1:
                out.append(self._dp_collective("allgather", params * self.zero3_param_bytes, group,
                                               f"{block.name}.zero3.ag", block.name,
                                               [prefetch_dep] if prefetch_dep >= 0 else [], "dp.ag"))
        return out

    def _group_size(self, group: str) -> int:
        lo = self.layout
        return {"dp_cp": lo.dp * lo.cp, "edp": lo.edp}[group]

    # -------------------------------------------------------------- passes
    def forward_like(self, block: Block, kernels: Sequence[Kernel], category: str) -> None:
        """Forward (or recomputation) kernels of ``block`` with their forward comms."""
        points: dict[str, list[CommPoint]] = {}   # several points may share a kernel (DeepEP with TP)
        for p in block.points:
            points.setdefault(p.before, []).append(p)
        whole = len(kernels) == len(block.kernels.forward)
        names = [k.name for k in kernels]
        deferred: dict[str, list[int]] = {}       # kernel name -> collectives it waits for
        started = False
        done: set[str] = set()              # kernels and points already emitted by an overlap
        for i, k in enumerate(kernels):
            if k.name in done:
                continue
            chunked = False
            if started and f"point {k.name}" not in done:
                for p in points.get(k.name, ()):
                    consumers = [c for c in kernels if c.name in p.consumers]
                    if self._overlap_pre(p.fwd, consumers, block.name, category, self.last_compute):
                        done.update(p.consumers)
                        chunked = True
                        continue
                    ids = self.comms(p.fwd, block.name, self.last_compute, p.chain)
                    if p.overlap and i + p.overlap < len(kernels):
                        deferred.setdefault(names[i + p.overlap], []).extend(ids)
                    else:
                        self.waits += ids
            if chunked:
                continue
            self.waits += deferred.pop(k.name, [])
            after = kernels[i + 1].name if i + 1 < len(kernels) else (END if whole else "")
            q = points.get(after, ())
            if len(q) == 1 and self._overlap_post(q[0].fwd, k, block.name, category):
                done.add(f"point {after}")
            else:
                self._kernel(k, block.name, category)
            started = True
        if whole and f"point {END}" not in done:
            for p in points.get(END, ()):
                self.waits += self.comms(p.fwd, block.name, self.last_compute, p.chain)

    def forward(self, blocks: Sequence[Block], zero3: bool) -> list[Step]:
        """The forward pass through ``blocks`` (in order)."""
        self._run(blocks, zero3, backward=False)
        return self.steps

    def backward(self, blocks: Sequence[Block], zero3: bool) -> list[Step]:
        """The backward pass through ``blocks`` (given in forward order)."""
        self._run(list(reversed(blocks)), zero3, backward=True)
        return self.steps

    def _run(self, blocks: Sequence[Block], zero3: bool, backward: bool) -> None:
        completed_at: dict[str, int] = {}     # block name -> step that completes it
        gathers: dict[int, list[int]] = {}
        if zero3 and blocks:
            gathers[0] = self._gather(blocks[0], -1)
        for bi, block in enumerate(blocks):
            before = self.last_compute
            if zero3 and bi + 1 < len(blocks):
                # prefetch: the next block's gather starts when this block starts computing
                gathers[bi + 1] = self._gather(blocks[bi + 1], before)
            self.waits += gathers.get(bi, [])
            if backward:
                if self.offload and block.activation_bytes:
                    self._reload(blocks, bi, completed_at)
                self._backward_block(block)
                if zero3:
                    self._reduce_scatter(block)
            else:
                self.forward_like(block, block.kernels.forward, "fwd")
                if self.offload and block.activation_bytes:
                    self._add(Step("memcpy", f"{block.name}.act.offload", "offload", "mem.out",
                                   [self.last_compute], block.name, size=block.activation_bytes,
                                   direction="from_hbm", key=("act", block.name)))
            self.steps[self.last_compute].completes.append(block.name)
            completed_at[block.name] = self.last_compute

    def _reload(self, blocks: Sequence[Block], bi: int, completed_at: dict[str, int]) -> None:
        """Bring block ``bi``'s activations back, one block ahead: issued when block ``bi-2``
        of this pass is done, i.e. when block ``bi-1`` starts."""
        block = blocks[bi]
        issue = completed_at.get(blocks[bi - 2].name, -1) if bi >= 2 else -1
        i = self._add(Step("memcpy", f"{block.name}.act.reload", "offload", "mem.in",
                           [issue] if issue >= 0 else [], block.name, size=block.activation_bytes,
                           direction="to_hbm", after_key=("act", block.name)))
        self.waits.append(i)

    def _reduce_scatter(self, block: Block) -> None:
        dense, expert = block.params
        grad = self.model.precision_spec.grad_bytes
        for params, group in ((dense, "dp_cp"), (expert, "edp")):
            if params and self._group_size(group) > 1:
                self._dp_collective("reducescatter", params * grad, group, f"{block.name}.zero3.rs",
                                    block.name, [self.last_compute], "dp")

    def _backward_block(self, block: Block) -> None:
        ks = block.kernels
        lo = self.layout
        if lo.recompute == "full" and ks.recompute:
            self.forward_like(block, ks.recompute, "recompute")
        fwd_names = [k.name for k in ks.forward]
        # backward kernel issuing comms -> (point, the kernel that waits for an overlapped one)
        bwd_points: dict[str, list[tuple[CommPoint, str]]] = {}
        early: dict[str, CommPoint] = {}
        for p in block.points:
            idx = len(fwd_names) if p.before == END else fwd_names.index(p.before)
            if idx == 0:
                continue
            issue = _first_bwd_name(ks.forward[idx - 1 + p.overlap])
            bwd_points.setdefault(issue, []).append(
                (p, _first_bwd_name(ks.forward[idx - 1]) if p.overlap else ""))
            if p.regather and p.consumers:
                early[f"{p.consumers[-1]}.dgrad"] = p
        selective = {k.name: k for k in ks.recompute} if lo.recompute == "selective" else {}
        regather_wait: dict[str, list[int]] = {}
        for k in ks.backward:
            here = bwd_points.get(k.name, [])
            chunked = len(here) == 1 and self._overlap_pre(here[0][0].bwd, [k], block.name, "bwd",
                                                           self.last_main)
            for p, waiter in ([] if chunked else here):
                ids = self.comms(p.bwd, block.name, self.last_main, p.chain)
                if waiter:
                    regather_wait.setdefault(waiter, []).extend(ids)
                else:
                    self.waits += ids
            q = early.get(k.name)
            if q is not None:
                ids = [self.comm(spec, block.name, self.last_compute) for spec in q.regather]
                for c in q.consumers:
                    regather_wait[f"{c}.wgrad"] = ids
            base = k.name[:-4] if k.name.endswith(".bwd") else ""
            if base in selective:
                self._kernel(selective[base], block.name, "recompute")
            if k.name in regather_wait:
                self.waits += regather_wait[k.name]
            if not chunked:
                self._kernel(k, block.name, "bwd")


def merge_steps(steps: list[Step]) -> list[Step]:
    """Merge compute steps as described in the module docstring ("Merging"); returns a new
    list with dependencies renumbered."""
    dependents: dict[int, int] = {}
    for i, s in enumerate(steps):
        for d in s.deps:
            dependents[d] = dependents.get(d, 0) + 1
    blocks_with_comm = {s.block for s in steps if not s.is_compute}
    compute_idx = [i for i, s in enumerate(steps) if s.is_compute]
    last_of_block: dict[str, int] = {}
    for i in compute_idx:
        last_of_block[steps[i].block] = i
    target: dict[int, int] = {}          # old compute index -> old index it merges into
    prev = -1
    for i in compute_idx:
        s = steps[i]
        if prev >= 0:
            p = steps[prev]
            root = target.get(prev, prev)
            same_block = p.block == s.block
            tail = p.block in blocks_with_comm and last_of_block[p.block] == prev
            if (p.category == s.category and not s.deps and not dependents.get(prev)
                    and (same_block or tail)):
                target[i] = root
        prev = i
    new_index: dict[int, int] = {}
    out: list[Step] = []
    for i, s in enumerate(steps):
        if i in target:
            host = out[new_index[target[i]]]
            host.kernels = host.kernels + s.kernels
            host.completes = host.completes + s.completes
            host.name = host.name if host.block == s.block else f"{host.name}+{s.block}"
            new_index[i] = new_index[target[i]]
            continue
        new_index[i] = len(out)
        out.append(Step(s.kind, s.name, s.category, s.stream, list(s.deps), s.block, list(s.kernels),
                        s.op, s.size, s.group, s.peer, s.ring, s.direction, s.key, s.after_key,
                        list(s.completes), s.combine))
    for s in out:
        s.deps = sorted({new_index[d] for d in s.deps})
    return out


def describe_steps(steps: Sequence[Step], show: Callable[[Step], str] | None = None) -> str:
    """Readable one-line-per-step listing (debugging and docs)."""
    show = show or (lambda s: f"{s.kind:<10} {s.stream:<8} {s.name} deps={s.deps}")
    return "\n".join(f"{i:3d} {show(s)}" for i, s in enumerate(steps))


#: Category of the weight-gradient compute of a split backward (the zero-bubble ``W`` pass).
WGRAD = "wgrad"
#: Point-to-point steps of a pass (context parallelism's ring exchanges): a peer's pass waits
#: for each, so they stay in B (:func:`split_backward`).
_PEER_KINDS = frozenset({"send", "recv"})


def split_backward(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """A backward pass's steps (unmerged, as :meth:`PassBuilder.backward` made them) split into
    the input-gradient pass ``B`` and the weight-gradient pass ``W`` of zero-bubble schedules
    (Qi et al. 2024, §2: B computes what the previous stage needs, W only the ``.wgrad``
    GEMMs). A compute step goes to W when all its kernels are weight gradients (category
    :data:`WGRAD`); a communication step goes to W when every step that waits for it is in
    W (SP's re-gather of a GEMM input for its weight gradient), or, when nothing waits for
    it, when something it waits for is in W (ZeRO-3's gradient reduce-scatter). Sends and
    receives (context parallelism's K/V ring) always stay in B: the peer's input-gradient
    pass waits for them, and a rank's n-th send pairs with its peer's n-th receive, so both
    sides must keep them in the same pass. One that waited for a weight-gradient step waits
    for the last B compute step before it instead (where it was issued). Other dependencies
    across the two passes are dropped: W runs after its B in every schedule. ``completes``
    is recomputed per pass (a block's last compute step there)."""
    # a weight-gradient GEMM, whole or as row chunks ``<name>#i`` (tp_comm_overlap)
    in_w = [s.is_compute and bool(s.kernels) and all(k.name.split("#")[0].endswith(".wgrad") for k in s.kernels)
            for s in steps]
    dependents: dict[int, list[int]] = {}
    for i, s in enumerate(steps):
        for d in s.deps:
            dependents.setdefault(d, []).append(i)
    for i in range(len(steps) - 1, -1, -1):      # dependents come later: decide backwards
        s = steps[i]
        if s.is_compute:
            continue
        if s.kind in _PEER_KINDS:                # a peer's input gradient waits for it
            in_w[i] = False
            continue
        after = dependents.get(i, [])
        in_w[i] = all(in_w[j] for j in after) if after else any(in_w[d] for d in s.deps)

    def b_anchor(d: int) -> int | None:
        """The last B compute step at or before step ``d``: where a send or receive that
        followed a weight-gradient step is issued in B (the launch position it had)."""
        for j in range(d, -1, -1):
            if not in_w[j] and steps[j].is_compute:
                return j
        return None

    def part(flag: bool) -> list[Step]:
        index = {i: n for n, i in enumerate(i for i in range(len(steps)) if in_w[i] == flag)}
        out: list[Step] = []
        for i in index:
            s = steps[i]
            deps = [d for d in s.deps if d in index]
            if not flag and s.kind in _PEER_KINDS:
                moved = {b_anchor(d) for d in s.deps if d not in index} - {None}
                deps = sorted(set(deps) | moved)     # type: ignore[arg-type]
            out.append(replace(s, deps=[index[d] for d in deps], completes=[],
                               kernels=list(s.kernels),
                               category=WGRAD if (flag and s.is_compute) else s.category))
        last: dict[str, int] = {}
        for n, s in enumerate(out):
            if s.is_compute:
                last[s.block] = n
        for block, n in last.items():
            out[n].completes.append(block)
        return out

    return part(False), part(True)
