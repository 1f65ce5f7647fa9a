"""Parallel layouts: how a model is split over GPUs, validation, and placement on ranks.

A :class:`ParallelLayout` combines tensor (``tp``), pipeline (``pp``), data (``dp``) and
context (``cp``) parallelism, with expert parallelism (``ep``) on the expert grid below,
sequence parallelism (``sp``, a flag on top of TP), the ZeRO stage, the pipeline
schedule, the batch sizes and the activation-recomputation policy.

Placement
    The world of ``tp·cp·dp·pp`` ranks is a 4-D grid. ``order`` lists the dimensions from the
    fastest-varying to the slowest; the default ``("tp", "cp", "dp", "pp")`` is Megatron-core's
    default order (``"tp-cp-ep-dp-pp"`` in ``megatron/core/parallel_state.py``): TP innermost
    because its all-reduces/all-gathers run in every layer, forward and backward, and must stay
    on the fast intra-node links (NVLink); CP next (per-layer K/V exchange); then DP (one
    gradient reduction per iteration, overlappable); PP outermost because its point-to-point
    activation transfers are the smallest and tolerate crossing nodes. So with 8 GPUs per node
    and ``tp=8``, every TP group is exactly one node.

    Rank = Σ index(dim) · stride(dim), stride(first) = 1, stride(next) = stride · size.

Expert grid (Megatron-core's "MoE parallel folding", NVIDIA/Megatron-LM
``megatron/core/parallel_state.py``: ``expert_decoder_rank_generator = RankGenerator(
tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size,
pp=..., cp=1, ...)``, ``expert_data_parallel_size = world_size // (etp · ep · pp)``)
    The expert layers split the same ranks by their own grid, built for every layout with
    ``ep > 1`` or ``etp != tp`` (``etp``, Megatron-core's ``expert_tensor_parallel_size``,
    defaults to ``tp``): the grid of ``order`` with ``tp`` replaced by ``etp``, ``cp``
    dropped and ``dp`` replaced by ``ep`` then ``edp`` (EP varies faster, as in
    Megatron-core's default order ``"tp-cp-ep-dp-pp"``), ``edp = tp·cp·dp / (etp·ep)``.
    With the default order: ``etp_index = l mod etp``, ``ep_index = (l div etp) mod ep``,
    ``edp_index = l div (etp·ep)`` for the stage-local index ``l = rank mod tp·cp·dp``.
    So expert parallelism spans CP × DP: EP may exceed DP (TP 2, CP 2, DP 2, EP 4), or
    TP × CP × DP with ``etp != tp`` (TP 8, EP 8, ETP 1 on one node), and the expert
    gradients are reduced over the ``edp`` group (:attr:`ParallelLayout.edp`). With
    ``cp = 1`` (or ``cp`` after ``dp`` in ``order``) and ``etp = tp`` this is EP carved out
    of DP: ``dp_index = ep_index + ep · edp_index``. Layouts Megatron-core refuses are
    refused: ``etp·ep`` not dividing ``tp·cp·dp``; ``pp`` not the slowest dimension unless
    ``edp = dp``; expert pipeline groups differing from the attention's. With ``ep = 1``
    and ``etp = tp`` the experts are split like the dense weights (expert TP = TP, expert
    DP = DP × CP) and no expert grid is built.

Group names accepted by :meth:`ParallelLayout.groups`: ``tp``, ``cp``, ``dp``, ``pp`` (the
pipeline chains, in stage order), ``dp_cp`` (gradient reduction of dense weights when ``cp > 1``: CP ranks hold the same
weights) and ``mp`` (model parallel: ``tp × pp``) on the attention grid; ``ep``, ``edp`` (expert
data parallel, also the gradient reduction of expert weights: Megatron-core's expert DP
group already spans CP, so there is no separate ``_cp`` kind), ``etp`` (expert TP) and ``tp_ep``
(expert TP × EP) on the expert grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, NamedTuple

from dessim.errors import WorkloadError

if TYPE_CHECKING:  # only for type hints: model.py does not depend on layout.py
    from dessim.workload.transformer.model import TransformerConfig

__all__ = [
    "BASE_DIMS",
    "DEFAULT_ORDER",
    "GROUP_DIMS",
    "RECOMPUTE_POLICIES",
    "ATTENTION_IMPLS",
    "MOE_DISPATCH",
    "MOE_DISPATCH_PRECISIONS",
    "SCHEDULES",
    "PipelineSchedule",
    "RankCoords",
    "ParallelLayout",
    "parse_zero_stage",
    "parse_pipeline_layers",
    "PIPELINE_LAYER_RULES",
    "uneven_stage_layers",
]

#: The four grid dimensions of the rank space.
BASE_DIMS: tuple[str, ...] = ("tp", "cp", "dp", "pp")

#: Default placement order, fastest-varying first (Megatron-core's default; see module doc).
DEFAULT_ORDER: tuple[str, ...] = ("tp", "cp", "dp", "pp")

#: Named rank groups → the grid (``attention``: tp, cp, dp, pp; ``expert``: etp, ep, edp,
#: pp) and its coordinates that vary inside one group (module docstring).
GROUP_DIMS: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType({
    "tp": ("attention", ("tp",)),
    "cp": ("attention", ("cp",)),
    "dp": ("attention", ("dp",)),
    "pp": ("attention", ("pp",)),
    "dp_cp": ("attention", ("dp", "cp")),
    "mp": ("attention", ("tp", "pp")),
    "ep": ("expert", ("ep",)),
    "tp_ep": ("expert", ("etp", "ep")),   # DeepEP's communication group with TP (Megatron-core ``tp_ep``)
    "etp": ("expert", ("etp",)),
    "edp": ("expert", ("edp",)),      # also the expert weights' gradient reduction: it spans CP
})

#: Activation-recomputation policies (Korthikanti et al. 2022, arXiv:2205.05198, §4):
#: none; selective = recompute the attention core (QKᵀ, softmax, dropout, ·V) in backward;
#: full = keep only each layer's input and recompute the whole layer forward in backward.
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")
#: Attention implementations (dessim.workload.transformer.kernels): Megatron-LM's unfused core, or
#: FlashAttention-2 / -3 (fused; -3 on Hopper only).
ATTENTION_IMPLS: tuple[str, ...] = ("unfused", "flash2", "flash3")
#: How the MoE all-to-all is implemented (``training.moe_dispatch``): ``nccl`` — NCCL's
#: all-to-all (peer-to-peer sends to every member, Megatron-LM); ``deepep`` — DeepSeek's
#: DeepEP kernels: same-rail network sends, then NVLink forwarding
#: (:mod:`dessim.collectives.algorithms.rail`) when the EP group spans nodes.
MOE_DISPATCH: tuple[str, ...] = ("nccl", "deepep")
#: Wire precision of the MoE dispatch direction (``training.moe_dispatch_precision``: the
#: forward dispatch and the backward of the combine, the activation gradient before the
#: down-projections): ``fp8`` — FP8 rows and their scales (DeepSeek-V3 report §3.3.3, the
#: default of FP8 recipes); ``bf16`` — the 16-bit activations, cast to FP8 by the experts after
#: the all-to-all (Megatron-core's ``alltoall`` dispatcher, and its flex dispatcher's
#: ``moe_dispatch_fwd_dtype`` / ``moe_combine_bwd_dtype`` default ``'bf16'``). The combine
#: direction is 16-bit either way.
MOE_DISPATCH_PRECISIONS: tuple[str, ...] = ("fp8", "bf16")
class RankCoords(NamedTuple):
    """Coordinates of one rank in the attention grid (``tp, cp, dp, pp``) and its ``ep`` and
    ``edp`` indices in the expert grid (module docstring)."""

    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    edp: int


@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """A pipeline schedule's properties and closed forms (GPipe (Huang et al. 2019);
    Narayanan et al. 2021, §2.2.1-2.2.2; Qi et al. 2024, §3; DeepSeek-AI 2024, §3.2.1;
    docs/references.md, "Parallelism and memory").

    ``interleaved``: every stage holds ``v`` model chunks (virtual stages, ``v >= 2``).
    ``split_backward``: the backward of a chunk is two passes, ``B`` (input gradient) and
    ``W`` (weight gradient), scheduled separately (zero-bubble schedules).
    ``bidirectional``: every stage holds two chunks, stage ``s`` and stage ``p-1-s`` of the
    model, and half the micro-batches enter the pipeline at each end (DualPipe).
    The order of the passes of each schedule is in :mod:`dessim.workload.transformer.schedules`.
    """

    name: str
    interleaved: bool
    description: str
    split_backward: bool = False
    bidirectional: bool = False

    def chunks(self, v: int = 1) -> int:
        """Model chunks per pipeline stage: ``v`` interleaved, 2 bidirectional, else 1."""
        return 2 if self.bidirectional else (v if self.interleaved else 1)

    def in_flight(self, stage: int, p: int, m: int, v: int = 1) -> float:
        """Micro-batches whose activations stage ``stage`` holds at its peak, in units of one
        micro-batch through *all* the stage's layers (chunks assumed equal here; the memory
        model weighs them by their layers, :func:`~dessim.workload.transformer.schedules.peak_held`).

        GPipe: all ``m`` forwards run before any backward → ``m``. 1F1B (Megatron
        ``forward_backward_pipelining_without_interleaving``): ``p - stage - 1`` warm-up
        forwards (at most ``m``) plus one → ``min(p - stage, m)``; the first stage holds ``p``.
        Interleaved (Megatron ``..._with_interleaving``): ``2(p - stage - 1) + (v - 1)p``
        warm-up chunk-forwards plus one, at most ``m·v``, each chunk being ``1/v`` of the
        stage's layers → the first stage holds ``(p(v+1) - 1)/v`` ≈ ``p(1 + 1/v)``
        micro-batches' worth: slightly more than 1F1B. Zero-bubble and DualPipe, counting a
        micro-batch's activations as held from its forward to its weight-gradient pass (as
        :func:`~dessim.workload.transformer.schedules.peak_held` does on the pass order; equal
        for every ``p`` and ``m``, tests/test_pipeline_schedules.py): ``min(p, m)`` on every
        stage for ZB-H1 (1F1B's first-stage peak, Qi et al. 2024 §3.1), ``min(2p - 1, m)``
        for ZB-H2 (§3.1) and ``p + 1`` chunk passes (``(p + 1)/2`` stage-worths) for DualPipe
        (its README's "PP+1").
        """
        if self.name == "gpipe":
            return float(m)
        if self.bidirectional:
            return (p + 1) / 2
        if self.split_backward:
            return float(min(2 * p - 1 if self.name == "zb-h2" else p, m))
        if not self.interleaved:
            return float(min(p - stage, m))
        warmup = 2 * (p - stage - 1) + (v - 1) * p
        return min(warmup + 1, m * v) / v

    def bubble_fraction(self, p: int, m: int, v: int = 1) -> float:
        """Idle time of the pipeline relative to the ideal (bubble-free) time, with free
        communication and equal stages: ``(p-1)/m`` for GPipe and 1F1B, ``(p-1)/(v·m)``
        interleaved (Narayanan et al. SC21). Split-backward schedules with forward,
        input-gradient and weight-gradient passes of equal length (``F = B = W``, ideal
        ``3m`` per stage): ZB-H1 idles ``(p-1)(F + B - W)`` per stage (Qi et al. 2024 §3.1)
        → ``(p-1)/(3m)``, a third of 1F1B's; ZB-H2 only the pipeline fill ``(p-1)F`` between
        the first stage's start and the last stage's end (no stage idles in between; the
        paper hides the fill across iterations by post-validating the optimizer step, which
        dessim does not model) → also ``(p-1)/(3m)``. Both assume ``m >= p``: stage 0's first
        B starts at ``2p - 1`` (the first micro-batch's F through p stages, its B back
        through p - 1) and only ``min(p, m)`` forwards can fill that wait, after which it
        runs without a gap; with fewer micro-batches than stages it idles ``p - m`` more, so
        the split-backward bubble is ``(p - 1 + max(0, p - m))/(3m)`` (equal to
        :func:`~dessim.workload.transformer.schedules.unit_bubble` for every p, m:
        tests/test_pipeline_schedules.py). DualPipe ``(p/2 - 1)(F&B + B' - 3W)`` per
        rank (deepseek-ai/DualPipe README; ``B'`` a whole backward, ``F&B = F + B'`` when the
        pair's overlap hides communication, not compute) → ``(p/2 - 1)·2`` units of ``3m``:
        ``(p-2)/(3m)``, checked on :func:`~dessim.workload.transformer.schedules.unit_timeline`."""
        if self.bidirectional:
            return (p - 2) / (3 * m)
        if self.split_backward:
            return (p - 1 + max(0, p - m)) / (3 * m)
        return (p - 1) / (m * (v if self.interleaved else 1))


SCHEDULES: Mapping[str, PipelineSchedule] = MappingProxyType({
    "gpipe": PipelineSchedule("gpipe", False, "all forwards, then all backwards (Huang et al. 2019)"),
    "1f1b": PipelineSchedule("1f1b", False, "one-forward-one-backward / PipeDream-Flush"),
    "interleaved": PipelineSchedule("interleaved", True, "interleaved 1F1B with v virtual stages"),
    "zb-h1": PipelineSchedule("zb-h1", False, "zero-bubble ZB-H1: 1F1B's memory, split backward "
                              "(Qi et al. 2024)", split_backward=True),
    "zb-h2": PipelineSchedule("zb-h2", False, "zero-bubble ZB-H2: no bubble, twice 1F1B's activation "
                              "memory, split backward (Qi et al. 2024)", split_backward=True),
    "dualpipe": PipelineSchedule("dualpipe", False, "DualPipe: bidirectional, overlapped forward and "
                                 "backward chunks, split backward (DeepSeek-AI 2024)",
                                 split_backward=True, bidirectional=True),
})

#: Named rules for ``pipeline_layers`` (see :func:`uneven_stage_layers`).
PIPELINE_LAYER_RULES: tuple[str, ...] = ("balanced",)


def uneven_stage_layers(num_layers: int, pieces: int) -> list[int]:
    """The ``balanced`` rule: layers per pipeline piece (stage, or virtual stage when the
    stages hold several chunks) in model order: ``ceil(L/n)`` each, minus one on
    ``ceil(L/n)·n − L`` pieces taken alternately from the first and the last end inwards.

    The first piece also holds the embedding and the last the output layer and the loss, so
    they are the ones made lighter: with 126 layers on 16 stages (Llama 3 405B) the first and
    the last stage hold 7 layers and the others 8 (Dubey et al. 2024, §3.3.2); on 32 virtual
    stages (16 stages × 2 chunks) the first and the last chunk hold 3 and the others 4, which
    is Megatron-core's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split`` (the embedding and the loss each counted as one
    layer: 126 + 2 = 128 = 32 × 4)."""
    base = -(-num_layers // pieces)
    counts = [base] * pieces
    deficit = base * pieces - num_layers
    order = [i // 2 if i % 2 == 0 else pieces - 1 - i // 2 for i in range(pieces)]
    for s in order[:deficit]:
        counts[s] -= 1
    return counts


def parse_pipeline_layers(value: object, what: str = "pipeline_layers") -> tuple[int, ...] | str:
    """``pipeline_layers``: a rule name (:data:`PIPELINE_LAYER_RULES`) or a list of layer counts
    per pipeline piece in model order (whole numbers >= 1)."""
    if isinstance(value, str):
        if value not in PIPELINE_LAYER_RULES:
            raise WorkloadError(f"{what}={value!r} is not a rule; valid: {', '.join(PIPELINE_LAYER_RULES)} "
                                "or a list of layer counts per stage")
        return value
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value):
        return tuple(value)
    raise WorkloadError(f"{what}={value!r} must be {' or '.join(PIPELINE_LAYER_RULES)} or a non-empty "
                        "list of whole numbers >= 1 (layers per stage, first stage first)")


def parse_zero_stage(value: object, what: str = "zero_stage") -> int:
    """A ZeRO stage: 0, 1, 2, 3 or ``"fsdp"`` (= 3: parameters, gradients and optimizer
    states all sharded, which is what PyTorch FSDP's FULL_SHARD does)."""
    if value == "fsdp":
        return 3
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, 2, 3):
        raise WorkloadError(f"{what}={value!r} is not a ZeRO stage; valid: 0, 1, 2, 3, 'fsdp'")
    return value


def _positive(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"parallel layout: {what}={value!r} must be a whole number >= 1")


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """How one training job is parallelised (see the module docstring).

    The number of micro-batches per iteration and per pipeline is
    ``m = global_batch / (micro_batch · dp)`` (CP splits each sequence, not the batch).
    The constructor checks what the layout alone determines; :meth:`validate` checks it
    against a model and a GPU count. ``pipeline_layers``: how the layers are split over the
    pipeline pieces (:attr:`pipeline_pieces`, model order) — a tuple of layer counts, or the
    rule ``"balanced"`` (:func:`uneven_stage_layers`).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    zero_stage: int = 0
    schedule: str = "1f1b"
    virtual_stages: int = 1
    micro_batch: int = 1
    global_batch: int | None = None
    recompute: str = "none"
    order: tuple[str, ...] = DEFAULT_ORDER
    attention: str = "flash2"
    pipeline_layers: tuple[int, ...] | str = "balanced"
    moe_dispatch: str = "nccl"
    etp: int | None = None
    moe_dispatch_precision: str | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "virtual_stages", "micro_batch"):
            _positive(getattr(self, name), name)
        if self.etp is not None:
            _positive(self.etp, "etp")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.micro_batch * self.dp)
        _positive(self.global_batch, "global_batch")
        if not isinstance(self.sp, bool):
            raise WorkloadError(f"parallel layout: sp={self.sp!r} must be true or false")
        object.__setattr__(self, "zero_stage", parse_zero_stage(self.zero_stage, "parallel layout: zero_stage"))
        if self.schedule not in SCHEDULES:
            raise WorkloadError(f"parallel layout: schedule={self.schedule!r} is unknown; "
                                f"valid: {', '.join(SCHEDULES)}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise WorkloadError(f"parallel layout: recompute={self.recompute!r} is unknown; "
                                f"valid: {', '.join(RECOMPUTE_POLICIES)}")
        if self.moe_dispatch not in MOE_DISPATCH:
            raise WorkloadError(f"parallel layout: moe_dispatch={self.moe_dispatch!r} is unknown; "
                                f"valid: {', '.join(MOE_DISPATCH)}")
        if self.moe_dispatch_precision not in (None, *MOE_DISPATCH_PRECISIONS):
            raise WorkloadError(f"parallel layout: moe_dispatch_precision={self.moe_dispatch_precision!r} is "
                                f"unknown; valid: {', '.join(MOE_DISPATCH_PRECISIONS)}")
        if self.attention not in ATTENTION_IMPLS:
            raise WorkloadError(f"parallel layout: attention={self.attention!r} is unknown; "
                                f"valid: {', '.join(ATTENTION_IMPLS)}")
        if SCHEDULES[self.schedule].interleaved:
            if self.virtual_stages < 2:
                raise WorkloadError(f"parallel layout: schedule 'interleaved' needs virtual_stages >= 2 "
                                    f"(got {self.virtual_stages}): give the chunks per stage "
                                    "(--interleave V, training.virtual_stages), or use '1f1b' for one "
                                    "chunk per stage")
            if self.pp < 2:
                raise WorkloadError("parallel layout: schedule 'interleaved' needs pp >= 2 "
                                    f"(got pp={self.pp})")
        elif self.virtual_stages != 1:
            raise WorkloadError(f"parallel layout: virtual_stages={self.virtual_stages} needs "
                                f"schedule 'interleaved' (got {self.schedule!r})")
        if self.pipeline.bidirectional:
            if self.pp < 2 or self.pp % 2:
                raise WorkloadError(f"parallel layout: schedule 'dualpipe' needs an even pp >= 2 (got pp={self.pp})")
            m = self.global_batch // (self.micro_batch * self.dp)  # type: ignore[operator]
            if m % 2 or m < 2 * self.pp:
                raise WorkloadError(f"parallel layout: schedule 'dualpipe' needs an even number of micro-batches "
                                    f">= 2·pp = {2 * self.pp} (got {m} = global_batch / (micro_batch × dp)), "
                                    "as deepseek-ai/DualPipe requires")
        if self.pipeline.bidirectional and self.zero_stage == 3:
            raise WorkloadError("parallel layout: schedule 'dualpipe' with zero_stage 3 is not modelled "
                                "(its per-block gathers would span the two stages holding each piece); "
                                "use zero_stage 0, 1 or 2")
        object.__setattr__(self, "pipeline_layers",
                           parse_pipeline_layers(self.pipeline_layers, "parallel layout: pipeline_layers"))
        order = tuple(self.order)
        object.__setattr__(self, "order", order)
        if sorted(order) != sorted(BASE_DIMS):
            raise WorkloadError(f"parallel layout: order={list(order)!r} must list each of "
                                f"{', '.join(BASE_DIMS)} exactly once (fastest-varying first)")
        if self.expert_grid:
            self._check_expert_grid()
        batch_unit = self.micro_batch * self.dp
        if self.global_batch % batch_unit:
            raise WorkloadError(f"parallel layout: global_batch={self.global_batch} is not divisible by "
                                f"micro_batch × dp = {self.micro_batch} × {self.dp} = {batch_unit}")
        if SCHEDULES[self.schedule].interleaved and self.num_micro_batches % self.pp:
            raise WorkloadError(f"parallel layout: the interleaved schedule needs the number of "
                                f"micro-batches ({self.num_micro_batches} = global_batch / (micro_batch × dp)) "
                                f"to be divisible by pp={self.pp} (as Megatron-LM requires)")

    def _check_expert_grid(self) -> None:
        """The expert grid (module docstring) as Megatron-core builds it, refusing the layouts
        its ``initialize_model_parallel`` refuses."""
        stage = self.tp * self.cp * self.dp
        if self.separate_expert_tp and stage % (self.expert_tp * self.ep):
            raise WorkloadError(f"parallel layout: etp × ep = {self.expert_tp} × {self.ep} does not divide "
                                f"tp × cp × dp = {self.tp} × {self.cp} × {self.dp} = {stage} (the expert layers "
                                "refold the ranks of each pipeline stage into etp × ep × edp, Megatron-core's MoE "
                                "parallel folding)")
        if not self.separate_expert_tp and (self.cp * self.dp) % self.ep:
            where = f"dp={self.dp}" if self.cp == 1 else f"cp × dp = {self.cp} × {self.dp} = {self.cp * self.dp}"
            raise WorkloadError(f"parallel layout: ep={self.ep} does not divide {where} (with etp = tp expert "
                                "parallelism spans the context- and data-parallel ranks, Megatron-core's expert "
                                "grid; with etp != tp it may span tp × cp × dp): give an ep that divides it "
                                "(--ep, parallelism.ep)")
        strides, estrides = self._strides(), self._expert_strides()
        if self.pp > 1 and strides["pp"] * self.pp != self.world_size and self.edp != self.dp:
            raise WorkloadError(f"parallel layout: ep={self.ep}, etp={self.expert_tp} needs pp last in order (got "
                                f"{list(self.order)}): the expert data-parallel size tp·cp·dp / (etp·ep) = "
                                f"{self.edp} differs from dp={self.dp}, which Megatron-core refuses unless "
                                "the pipeline dimension is the slowest")
        if self.pp > 1 and estrides["pp"] != strides["pp"]:
            raise WorkloadError(f"parallel layout: with order {list(self.order)} the expert layers' pipeline "
                                "groups would differ from the attention's (Megatron-core requires them equal); "
                                "put pp after tp, cp and dp")
        if not self.separate_expert_tp and self.tp > 1 and estrides["etp"] != strides["tp"]:
            raise WorkloadError(f"parallel layout: order {list(self.order)} puts cp before tp: Megatron-core's "
                                "expert grid drops cp, so its expert-TP groups would not be the TP groups "
                                "(not modelled); put tp before cp")

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        """GPUs used: ``tp · cp · dp · pp``."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size: ``etp``, or ``tp`` when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def separate_expert_tp(self) -> bool:
        """Whether the experts have their own tensor-parallel size (``etp != tp``)."""
        return self.expert_tp != self.tp

    @property
    def expert_grid(self) -> bool:
        """Whether the expert layers use their own rank grid (``ep > 1`` or ``etp != tp``,
        module docstring); else they are split like the dense weights."""
        return self.ep > 1 or self.separate_expert_tp

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: replicas of each expert shard, the ranks that reduce (and
        ZeRO-shard) each expert weight's gradients, ``tp·cp·dp / (etp·ep)`` (Megatron-core's
        ``expert_data_parallel_size = world / (etp·ep·pp)``; it spans CP)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def moe_all_to_all(self) -> bool:
        """Whether an MoE layer exchanges its tokens by an all-to-all: ``ep > 1``, or
        ``moe_dispatch: deepep`` with expert TP (``etp > 1``) — Megatron-core's flex dispatcher
        runs DeepEP on the expert-TP × EP group whenever ``etp·ep > 1``
        (``MoEFlexTokenDispatcher``, NVIDIA/Megatron-LM
        ``megatron/core/transformer/moe/token_dispatcher.py``), with ``ep = 1`` too."""
        return self.ep > 1 or (self.moe_dispatch == "deepep" and self.expert_tp > 1)

    def needs_sequence_parallel(self, model: "TransformerConfig") -> bool:
        """Whether this layout is refused without sequence parallelism: TP (``tp > 1``) with
        an MoE all-to-all through DeepEP (the generator's ``_ep_kind`` refuses it, as
        Megatron-core's MoE layer refuses TP without SP in training), or expert TP that differs
        from ``tp`` (:meth:`validate`). ``sp`` itself is not looked at."""
        if self.tp == 1 or not model.is_moe:
            return False
        return self.separate_expert_tp or (self.moe_dispatch == "deepep" and self.moe_all_to_all)

    def fp8_dispatch(self, model: "TransformerConfig") -> bool:
        """Whether the MoE dispatch direction goes on the wire in FP8 with its scales
        (:data:`MOE_DISPATCH_PRECISIONS`): FP8 recipes unless ``moe_dispatch_precision: bf16``."""
        return model.precision_spec.is_fp8 and self.moe_dispatch_precision != "bf16"

    @property
    def num_micro_batches(self) -> int:
        """``m = global_batch / (micro_batch · dp)``: micro-batches per pipeline per iteration."""
        return self.global_batch // (self.micro_batch * self.dp)  # type: ignore[operator]

    @property
    def pipeline(self) -> PipelineSchedule:
        return SCHEDULES[self.schedule]

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline stage (:meth:`PipelineSchedule.chunks`)."""
        return self.pipeline.chunks(self.virtual_stages)

    @property
    def pipeline_pieces(self) -> int:
        """Pieces the model's layers are split into: ``pp·v`` interleaved, else ``pp`` (DualPipe's
        two chunks per stage are pieces ``s`` and ``p-1-s`` of the same ``pp``)."""
        return self.pp * (self.chunks if not self.pipeline.bidirectional else 1)

    def piece_of(self, stage: int, chunk: int) -> int:
        """The pipeline piece (model order) that chunk ``chunk`` of stage ``stage`` holds."""
        if self.pipeline.bidirectional:
            return stage if chunk == 0 else self.pp - 1 - stage
        return chunk * self.pp + stage

    def _pieces_text(self) -> str:
        if self.pipeline.interleaved:
            return f"pp × virtual_stages = {self.pp} × {self.virtual_stages}, in virtual-stage order"
        return f"pp = {self.pp}"

    def layer_counts(self, num_layers: int) -> tuple[int, ...]:
        """Layers of each pipeline piece in model order (``pipeline_layers``, or its rule)."""
        if isinstance(self.pipeline_layers, tuple):
            return self.pipeline_layers
        return tuple(uneven_stage_layers(num_layers, self.pipeline_pieces))

    @property
    def sequence_parallel(self) -> bool:
        """Whether sequence parallelism is in effect (it needs ``tp > 1`` to do anything)."""
        return self.sp and self.tp > 1

    def size(self, dim: str) -> int:
        """Size of a grid dimension (``tp, cp, dp, pp``; expert grid ``etp, ep, edp``)."""
        if dim not in ("tp", "cp", "dp", "pp", "ep", "edp", "etp"):
            raise WorkloadError(f"unknown parallel dimension {dim!r}; valid: tp, cp, dp, pp, ep, edp, etp")
        return self.expert_tp if dim == "etp" else getattr(self, dim)

    # ------------------------------------------------------------------ validation
    def validate(self, model: "TransformerConfig", num_gpus: int | None = None) -> "ParallelLayout":
        """Check the layout against ``model`` (and a GPU count); returns ``self``.

        Raises :class:`~dessim.errors.WorkloadError` naming the numbers at fault.
        """
        where = f"layout for model {model.name!r}"
        if num_gpus is not None and self.world_size != num_gpus:
            raise WorkloadError(f"{where}: tp × pp × dp × cp = {self.tp} × {self.pp} × {self.dp} × {self.cp} "
                                f"= {self.world_size} but there are {num_gpus} GPUs")
        if model.heads % self.tp:
            raise WorkloadError(f"{where}: heads={model.heads} is not divisible by tp={self.tp}")
        if model.kv_heads % self.tp:  # type: ignore[operator]
            raise WorkloadError(f"{where}: kv_heads={model.kv_heads} is not divisible by tp={self.tp} "
                                "(each TP rank needs whole key/value heads)")
        if model.ffn_hidden % self.tp or model.moe_ffn_hidden % self.tp:  # type: ignore[operator]
            raise WorkloadError(f"{where}: ffn_hidden={model.ffn_hidden} (moe_ffn_hidden="
                                f"{model.moe_ffn_hidden}) is not divisible by tp={self.tp}")
        pieces = self.pipeline_pieces
        if isinstance(self.pipeline_layers, tuple):
            if len(self.pipeline_layers) != pieces:
                raise WorkloadError(f"{where}: pipeline_layers has {len(self.pipeline_layers)} entries but the "
                                    f"schedule {self.schedule!r} splits the model into {pieces} pieces "
                                    f"({self._pieces_text()})")
            if sum(self.pipeline_layers) != model.layers:
                raise WorkloadError(f"{where}: pipeline_layers={list(self.pipeline_layers)} add up to "
                                    f"{sum(self.pipeline_layers)} layers but the model has layers={model.layers}")
        elif model.layers < pieces:
            raise WorkloadError(f"{where}: layers={model.layers} is fewer than the {pieces} pipeline pieces "
                                f"({self._pieces_text()})")
        if self.cp > 1 and model.seq_len % (2 * self.cp):
            raise WorkloadError(f"{where}: seq_len={model.seq_len} is not divisible by 2 × cp = {2 * self.cp} "
                                "(context parallelism splits each sequence into 2·cp load-balanced chunks)")
        if self.sequence_parallel and (model.seq_len // self.cp) % self.tp:
            raise WorkloadError(f"{where}: sequence parallelism needs seq_len / cp = {model.seq_len // self.cp} "
                                f"divisible by tp={self.tp}")
        if self.ep > 1 and not model.is_moe:
            raise WorkloadError(f"{where}: ep={self.ep} but the model is dense (experts=1)")
        if model.experts % self.ep:
            raise WorkloadError(f"{where}: ep={self.ep} does not divide experts={model.experts}")
        self._validate_experts(model, where)
        return self

    def _validate_experts(self, model: "TransformerConfig", where: str) -> None:
        """``etp`` and ``moe_dispatch_precision`` against the model."""
        prec = model.precision_spec
        if self.moe_dispatch_precision == "fp8" and not prec.is_fp8:
            raise WorkloadError(f"{where}: moe_dispatch_precision fp8 needs an FP8 recipe "
                                f"(precision={prec.name!r})")
        if self.moe_dispatch_precision == "bf16" and not (prec.is_fp8 or prec.name == "bf16"):
            raise WorkloadError(f"{where}: moe_dispatch_precision bf16 with precision={prec.name!r}: "
                                "the dispatch goes in the activations' precision; leave it unset")
        if not self.separate_expert_tp:
            return
        if not model.is_moe:
            raise WorkloadError(f"{where}: etp={self.etp} but the model is dense (experts=1)")
        if model.moe_ffn_hidden % self.expert_tp:  # type: ignore[operator]
            raise WorkloadError(f"{where}: moe_ffn_hidden={model.moe_ffn_hidden} is not divisible by "
                                f"etp={self.expert_tp}")
        if self.tp > 1 and not self.sequence_parallel:
            raise WorkloadError(f"{where}: etp={self.etp} != tp={self.tp} needs sequence parallelism "
                                "(sp: true): each rank dispatches its own T/tp tokens, and Megatron-core "
                                "refuses MoE with TP but without SP in training")

    # ------------------------------------------------------------------ placement
    def _strides(self) -> dict[str, int]:
        strides, step = {}, 1
        for dim in self.order:
            strides[dim] = step
            step *= getattr(self, dim)
        return strides

    def strides(self) -> dict[str, int]:
        """Rank stride of each base dimension: rank = Σ coordinate × stride (``order``)."""
        return self._strides()

    def _expert_strides(self) -> dict[str, int]:
        """Rank stride of each expert-grid dimension (``etp, ep, edp, pp``; module docstring):
        ``order`` with tp → etp, cp dropped, dp → ep then edp."""
        strides, step = {}, 1
        for dim in self.order:
            for sub in {"tp": ("etp",), "cp": (), "dp": ("ep", "edp"), "pp": ("pp",)}[dim]:
                strides[sub] = step
                step *= self.size(sub)
        return strides

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Global rank of grid coordinates (each 0-based)."""
        coords = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        for dim, idx in coords.items():
            if not 0 <= idx < getattr(self, dim):
                raise WorkloadError(f"{dim} index {idx} is out of range 0..{getattr(self, dim) - 1}")
        strides = self._strides()
        return sum(coords[d] * strides[d] for d in BASE_DIMS)

    def coords(self, rank: int) -> RankCoords:
        """Grid coordinates of a global rank."""
        return RankCoords(*_coords(self, rank)[:6])

    def stage_of(self, rank: int) -> int:
        """Pipeline stage (0-based) of a rank."""
        return self.coords(rank).pp

    def group_of(self, rank: int, name: str) -> tuple[int, ...]:
        """The group ``name`` (e.g. ``"tp"``) that ``rank`` belongs to, ranks ascending
        (for ``pp`` that is stage order). O(world) once per kind, then O(1)."""
        if not 0 <= rank < self.world_size:
            raise WorkloadError(f"rank {rank} is out of range 0..{self.world_size - 1}")
        self.groups(name)
        return _group_index(self, name)[rank]

    def groups(self, name: str) -> tuple[tuple[int, ...], ...]:
        """Every group of kind ``name`` (``tp``, ``dp``, ``pp``, ``ep``, ...), each a tuple of
        ascending ranks, the groups ordered by their first rank. Every rank is in exactly one
        group of each kind."""
        if name not in GROUP_DIMS:
            raise WorkloadError(f"unknown rank group {name!r}; valid: {', '.join(GROUP_DIMS)}")
        return _groups(self, name)

    def stage_layers(self, num_layers: int, stage: int) -> tuple[range, ...]:
        """The layer indices held by pipeline stage ``stage``: one range per model chunk.

        The model's layers are split into :attr:`pipeline_pieces` contiguous pieces of
        :meth:`layer_counts` layers (``pipeline_layers``; by default the ``balanced`` rule of
        :func:`uneven_stage_layers`: equal pieces when they divide, else one layer fewer on
        the first and last pieces, which hold the embedding and the LM head, then inwards —
        Llama 3 405B's 7 + 14 × 8 + 7, Dubey et al. 2024, §3.3.2). Chunk ``c`` of stage ``i``
        is piece ``c·pp + i`` when interleaved (Megatron's interleaved schedule); with
        DualPipe, chunk 0 is piece ``i`` and chunk 1 piece ``pp - 1 - i``."""
        if not 0 <= stage < self.pp:
            raise WorkloadError(f"pipeline stage {stage} is out of range 0..{self.pp - 1}")
        counts = self.layer_counts(num_layers)
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        return tuple(range(starts[j], starts[j + 1])
                     for j in (self.piece_of(stage, c) for c in range(self.chunks)))

    def describe(self) -> str:
        """One-line summary, e.g. ``tp=8 pp=8 dp=16 (1024 GPUs) sp 1f1b m=96 zero=1``."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        parts += [f"cp={self.cp}"] if self.cp > 1 else []
        parts += [f"ep={self.ep}"] if self.ep > 1 else []
        parts += [f"etp={self.expert_tp}"] if self.separate_expert_tp else []
        parts.append(f"({self.world_size} GPUs)")
        parts += ["sp"] if self.sequence_parallel else []
        sched = self.schedule + (f"(v={self.virtual_stages})" if self.virtual_stages > 1 else "")
        if isinstance(self.pipeline_layers, tuple):
            sched += f" layers={'/'.join(map(str, self.pipeline_layers))}"
        parts += [sched, f"mb={self.micro_batch}", f"gb={self.global_batch}", f"m={self.num_micro_batches}",
                  f"zero={self.zero_stage}", f"recompute={self.recompute}",
                  f"attention={self.attention}"]
        parts += [f"moe_dispatch_precision={self.moe_dispatch_precision}"] if self.moe_dispatch_precision else []
        return " ".join(parts)



def _coords(layout: ParallelLayout, rank: int) -> tuple[int, ...]:
    """``(tp, cp, dp, pp, ep, edp, etp)`` indices of ``rank``: attention grid, then expert
    grid (without one, ``ep = 0``, ``etp = tp`` and ``edp`` the index in ``dp × cp``)."""
    if not 0 <= rank < layout.world_size:
        raise WorkloadError(f"rank {rank} is out of range 0..{layout.world_size - 1}")
    idx, rest = {}, rank
    for dim in layout.order:
        idx[dim] = rest % getattr(layout, dim)
        rest //= getattr(layout, dim)
    if layout.expert_grid:
        e = {d: rank // s % layout.size(d) for d, s in layout._expert_strides().items()}
        expert = (e["ep"], e["edp"], e["etp"])
    else:
        expert = (0, idx["dp"] + layout.dp * idx["cp"], idx["tp"])
    return (idx["tp"], idx["cp"], idx["dp"], idx["pp"]) + expert


_COORD_INDEX: Mapping[str, int] = MappingProxyType({"tp": 0, "cp": 1, "dp": 2, "pp": 3, "ep": 4, "edp": 5, "etp": 6})


@lru_cache(maxsize=128)
def _groups(layout: ParallelLayout, name: str) -> tuple[tuple[int, ...], ...]:
    """:meth:`ParallelLayout.groups`: the ranks partitioned by the coordinates of their
    grid that do not vary in a group of kind ``name`` (:data:`GROUP_DIMS`)."""
    grid, varying = GROUP_DIMS[name]
    dims = ("tp", "cp", "dp", "pp") if grid == "attention" else ("etp", "ep", "edp", "pp")
    key = [_COORD_INDEX[d] for d in dims if d not in varying]
    parts: dict[tuple[int, ...], list[int]] = {}
    for rank in range(layout.world_size):
        c = _coords(layout, rank)
        parts.setdefault(tuple(c[i] for i in key), []).append(rank)
    return tuple(sorted(tuple(g) for g in parts.values()))


@lru_cache(maxsize=128)
def _group_index(layout: ParallelLayout, name: str) -> tuple[tuple[int, ...], ...]:
    """Each rank's group of kind ``name`` (index = rank)."""
    out: list[tuple[int, ...]] = [()] * layout.world_size
    for g in layout.groups(name):
        for r in g:
            out[r] = g
    return tuple(out)
