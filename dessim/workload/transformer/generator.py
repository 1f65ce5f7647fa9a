"""The workload generator: a model and its parallel layout become the task graph of ONE
training iteration on every rank.

Per rank, the graph holds (streams run their tasks in program order, see
:mod:`dessim.taskgraph.model`):

``compute``
    Forward, recomputation and backward passes of the rank's pipeline stage in the order of
    the pipeline schedule (:mod:`dessim.workload.transformer.schedules`), then the optimizer step.
    ``granularity="layer"``: one task per layer, micro-batch and phase, split only where a
    communication must happen in between (:mod:`dessim.workload.transformer.passes`); its ``duration``
    is the sum of the device model's costs of its kernels (so a saved graph replays with the
    same times), and it keeps the kernels' total ``flops`` and ``bytes`` and, in
    ``attrs["model_flops"]``, the part that counts as model FLOPs (forward/backward matmul and
    attention, not recomputation). ``granularity="kernel"``: one task per kernel, with its
    ``kernel`` class and GEMM ``shape``.
``tp`` / ``ep``
    Tensor/sequence-parallel collectives and MoE all-to-alls inside the layers.
``cp.send`` / ``cp.recv``
    Ring-attention K/V exchanges with the next/previous rank of the CP group.
``pp.send.fwd`` / ``pp.recv.fwd`` / ``pp.send.bwd`` / ``pp.recv.bwd``
    Pipeline point-to-point transfers: activations to the next virtual stage, gradients to
    the previous one (``b·s/cp·h`` elements, ``/tp`` with SP). One stream per direction and
    role, each with a single peer, so that no send waits behind an unrelated receive (NCCL's
    batched ``isend/irecv`` in Megatron's ``p2p_communication``); tags encode (direction,
    receiving virtual stage, micro-batch).
``dp`` / ``dp.ag``
    Data-parallel gradient reduction and ZeRO parameter gathers (below).
``mem.out`` / ``mem.in``
    Offload memcpys to/from the nearest far-memory node (``host_mem`` for ``host``,
    ``cxl_mem`` for ``cxl``; fewest hops from the GPU, then name order).

Categories: compute tasks ``fwd``, ``bwd``, ``recompute``, ``optimizer``; communication
``tp``, ``ep``, ``cp``, ``pp``, ``dp``, ``offload`` — the engine reports exposed
communication per category.

Data parallelism (gradients of dense weights over the ``dp·cp`` group, of expert weights
over ``edp·cp``)
    ZeRO 0 (DDP): the gradients of the last micro-batch's backward (per model chunk) are
    all-reduced in buckets of ``bucket_size`` bytes, filled in backward order; a bucket is
    reduced as soon as the layer that fills it is done (PyTorch DDP / Megatron
    ``overlap_grad_reduce``), so the reduction overlaps the rest of the backward.
    ``bucket_size=0``: one all-reduce per chunk after its backward. ZeRO 1: the same buckets
    reduce-scattered, and after the optimizer step (which updates ``1/(dp·cp)`` of the
    parameters) the updated 16-bit parameters all-gathered per bucket (Megatron's
    distributed optimizer; the gather is not overlapped with the next iteration here). ZeRO 2:
    as ZeRO 1, but sharded gradients cannot be accumulated locally, so the reduce-scatter
    runs after *every* micro-batch's backward (DeepSpeed stage 2 with gradient accumulation;
    an assumption). ZeRO 3 / FSDP: per-block gathers and reduce-scatters inside the passes
    (:mod:`dessim.workload.transformer.passes`), no final gather.
Optimizer step
    Memory-bound (``kernel="optimizer"``, :func:`~dessim.workload.common.kernels.optimizer_kernel`):
    the bytes of every pass of the mixed-precision step (unscale and inf check with fp16
    loss scaling, gradient norm, Adam over the gradient and the ``K`` bytes of state per
    parameter, copy of the fp32 master weights to the 16-bit weights), for the parameters
    the rank updates. With ``offload_optimizer`` the
    state of each block is loaded into HBM, updated and stored back, block by block (loads
    run ahead on ``mem.in``, stores follow on ``mem.out``).
Activation offload
    See :mod:`dessim.workload.transformer.passes`.
Free communication (``comm=False``)
    Every communication task becomes a zero-duration ``delay`` on the same stream that waits
    for what its peers' tasks would have waited for (collectives: all members' inputs; a
    receive: the matching send's input): the same dependencies, no transfer time. For
    studies, e.g. the pure pipeline bubble.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from math import ceil, inf, lcm

import numpy as np
from typing import Any, Generator, NamedTuple, Sequence

from dessim.catalog.devices import get_device
from dessim.engine.options import EngineOptions
from dessim.errors import CollectiveError, MemoryFitError, WorkloadError
from dessim.taskgraph.collector import collector_paused
from dessim.taskgraph.fold import Fold
from dessim.taskgraph.model import ALGO_OPTIONS, Task, TaskGraph, brief_ranks
from dessim.taskgraph.rows import Rows, RowTemplate
from dessim.topology.graph import Topology
from dessim.topology.routing import router_for
from dessim.units import format_size
from dessim.collectives.algorithms.rail import host_rows
from dessim.workload.common.emitter import TaskEmitter
from dessim.workload.common.gradsync import fill_buckets
from dessim.workload.common.kernels import Kernel, KernelSet, optimizer_kernel
from dessim.workload.common.placement import OFFLOAD_NODE_KINDS, nearest_node, resolve_devices
from dessim.workload.transformer.kernels import (embedding_kernels, expert_tokens, head_kernels,
                                                layer_kernels, mtp_kernels)
from dessim.workload.transformer.deepep import DEEPEP_APPROXIMATION, deepep_nvlink_efficiency, deepep_rail_options
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.memory import (MemoryEstimate, MemoryOptions, check_fit, estimate_memory,
                                                layer_activation_bytes, layer_params_on_gpu, mtp_params_on_gpu)
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.overlap import OverlapOptions
from dessim.workload.transformer.passes import (GRANULARITIES, WGRAD, Block, PassBuilder, Step, embedding_points,
                                                head_points, layer_points, merge_steps, split_backward)
from dessim.workload.transformer.routing import SKEWED_ROUTING_APPROXIMATION, UNMATCHED_ROUTING_APPROXIMATION
from dessim.workload.transformer.spread import Spread
from dessim.workload.transformer.stage_passes import PassTimeline, pass_timeline
from dessim.workload.transformer.tp_islands import TPIslands
from dessim.workload.transformer.schedules import PipeOp, next_virtual, prev_virtual, stage_program, virtual_stage

__all__ = ["GeneratorOptions", "WorkloadPlan", "make_plan", "build_taskgraph", "COMM_CATEGORIES"]

#: Communication categories of the generated tasks (exposed communication is reported by these).
COMM_CATEGORIES: tuple[str, ...] = ("tp", "dp", "pp", "ep", "cp", "offload")

#: Group kinds the passes and the DP reduction use (see ParallelLayout.groups).
_GROUP_KINDS: tuple[str, ...] = ("tp", "cp", "ep", "tp_ep", "dp_cp", "edp")
#: Group kinds of the MoE all-to-all: ``ep``, or ``tp_ep`` for DeepEP with TP (its
#: communication group spans the TP × EP ranks, :meth:`_Generator._ep_kind`).
_EP_KINDS: frozenset[str] = frozenset({"ep", "tp_ep"})


@dataclass(frozen=True)
class GeneratorOptions:
    """How to generate the task graph (beyond the layout and memory options).

    ``bucket_size``: gradient bucket in bytes; None = the memory options' bucket size
    (the workload's ``training.bucket_size``), 0 = no bucketing. ``comm=False``: communication
    free (module docstring). ``embedding_head=False``: leave out the embedding and LM-head
    kernels, their communication and their parameters, so that every pipeline stage does the
    same work (pipeline-bubble studies). ``optimizer=False``: no optimizer step.
    ``check_memory=False``: skip the memory fit check. ``tp_closed_form``: TP collectives of
    isolated NVSwitch islands become ``delay`` tasks of their idle-network time
    (:mod:`dessim.workload.transformer.tp_islands`); groups that share channels keep simulated
    collectives. ``granularity="stage"`` implies it and merges each pass into one compute task
    per DP-bucket segment (:mod:`dessim.workload.transformer.stage_passes`), falling back to ``layer``
    when a TP group is not isolated or a pass holds other communication.
    ``fold=True``: replica folding (:mod:`dessim.taskgraph.fold`) — emit the tasks of the ranks
    with TP index 0 and DP index 0 only; the engine carries every transfer and collective on
    all TP × DP lanes, so the network sees all the traffic. Falls back to an unfolded graph
    (reason in ``graph.meta["fold_fallback"]``) with mixed GPU models, per-rank slowdowns or
    offload routes that differ between ranks (:meth:`_offload_fold_refusal`; offload memcpys
    fold, each lane copying to its own memory node: :mod:`dessim.engine.memlanes`); expert
    and context parallelism fold (:func:`lane_permutations`).

    Defaults pick the fastest exact path (issue 17): ``granularity="auto"`` is ``stage`` and
    ``fold=None`` is on; both are exact where they apply (tests/test_tp_islands.py,
    tests/test_fold.py) and fall back by themselves, saying why, where they do not.
    :meth:`resolved` turns the automatic values into concrete ones and records which were
    automatic in ``auto``; ``granularity="layer", fold=False`` is the exact replay of every
    layer (``dessim simulate --exact``)."""

    granularity: str = "auto"
    bucket_size: int | None = None
    comm: bool = True
    embedding_head: bool = True
    optimizer: bool = True
    check_memory: bool = True
    tp_closed_form: bool = False
    fold: bool | None = None
    #: steady-state micro-batch extrapolation (:mod:`dessim.workload.transformer.steady`):
    #: None on where it applies (summary figures only, many micro-batches), False never,
    #: True asked for (still only where it applies); the generator itself ignores it
    extrapolate: bool | None = None
    #: the options :meth:`resolved` chose automatically (names of fields), for reports
    auto: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES + ("auto",):
            raise WorkloadError(f"granularity={self.granularity!r} is unknown; valid: auto, "
                                f"{', '.join(GRANULARITIES)}")
        if self.fold not in (None, True, False):
            raise WorkloadError(f"fold={self.fold!r} must be true, false or null (automatic)")
        if self.extrapolate not in (None, True, False):
            raise WorkloadError(f"extrapolate={self.extrapolate!r} must be true, false or null "
                                "(automatic)")
        b = self.bucket_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0):
            raise WorkloadError(f"bucket_size={b!r} must be a number of bytes >= 0 (0: no bucketing)")

    def resolved(self) -> "GeneratorOptions":
        """These options with the automatic values made concrete (class docstring)."""
        auto = tuple(name for name, is_auto in (("granularity", self.granularity == "auto"),
                                                ("fold", self.fold is None)) if is_auto)
        if not auto:
            return self
        return replace(self, granularity="stage" if self.granularity == "auto" else self.granularity,
                       fold=True if self.fold is None else self.fold, auto=self.auto + auto)


@dataclass(frozen=True)
class WorkloadPlan:
    """Everything the generator needs, resolved and validated: the model, the layout checked
    against the GPU count, memory options, the GPU model of every rank and the memory estimate
    (checked against the smallest HBM of the ranks unless ``options.check_memory`` is off)."""

    name: str
    model: TransformerConfig
    layout: ParallelLayout
    memory: MemoryOptions
    options: GeneratorOptions
    devices: tuple[str, ...]          #: catalog GPU name per rank
    estimate: MemoryEstimate
    capacity_bytes: float
    #: computation–communication overlap (``training.tp_comm_overlap`` / ``fuse_optimizer_allreduce``)
    overlap: OverlapOptions = OverlapOptions()

    @property
    def num_gpus(self) -> int:
        return self.layout.world_size

    @property
    def bucket_size(self) -> int:
        b = self.options.bucket_size
        return int(self.memory.bucket_size if b is None else b)

    def peak_flops(self) -> float:
        """Sum over ranks of the dense peak FLOP/s of the model's GEMM precision (FP8 recipes:
        the fp8 peak)."""
        prec = self.model.precision_spec.gemm_precision
        return sum(get_device(d).peak_flops(prec) for d in self.devices)


def make_plan(model: TransformerConfig, layout: ParallelLayout, topology: Topology, *,
              memory: MemoryOptions | None = None, options: GeneratorOptions | None = None,
              device: str | None = None, workload_device: str | None = None,
              name: str | None = None, overlap: OverlapOptions | None = None) -> WorkloadPlan:
    """Validate ``layout`` against ``model`` and the topology's GPU count, resolve the GPU
    model of each rank (topology, else ``device``, else ``workload_device``) and check the
    memory fit (raising :class:`~dessim.errors.MemoryFitError` with suggestions)."""
    options = (options or GeneratorOptions()).resolved()
    memory = memory or MemoryOptions()
    name = name or model.name
    layout.validate(model, topology.num_gpus)
    devices = resolve_devices(topology, (device, workload_device), f"workload {name!r}")
    estimate = estimate_memory(model, layout, memory)
    capacity = min(get_device(d).hbm_capacity for d in set(devices))
    if options.check_memory:
        check_fit(estimate, capacity)
    for target in (memory.offload_optimizer, memory.offload_activations):
        if target != "none" and not topology.nodes_of_kind(OFFLOAD_NODE_KINDS[target]):
            raise WorkloadError(f"workload {name!r}: offload to {target!r} needs a "
                                f"{OFFLOAD_NODE_KINDS[target]} node, but topology {topology.name!r} has none")
    if options.check_memory:
        _check_far_memory(model, layout, memory, topology, name)
    overlap = overlap or OverlapOptions()
    if overlap.fuse_optimizer_allreduce and (layout.zero_stage >= 3 or memory.offload_optimizer != "none"):
        raise WorkloadError(f"workload {name!r}: training.fuse_optimizer_allreduce needs zero_stage 0, 1 "
                            f"or 2 and no optimizer offload (got zero_stage={layout.zero_stage}, "
                            f"offload.optimizer={memory.offload_optimizer!r}): ZeRO 3 reduce-scatters per "
                            "block and an offloaded optimizer updates in far memory")
    return WorkloadPlan(name, model, layout, memory, options, devices, estimate, float(capacity), overlap)


def _check_far_memory(model: TransformerConfig, layout: ParallelLayout, memory: MemoryOptions,
                      topology: Topology, name: str) -> None:
    """Offloaded bytes must fit in the memory nodes they go to (a node's ``capacity``).

    Every GPU offloads to its nearest node of the target kind (as the generator's transfers
    do); the bytes of all GPUs sharing a node add up. Nodes without a ``capacity`` attribute
    are taken as unbounded."""
    if memory.offload_optimizer == "none" and memory.offload_activations == "none":
        return
    router = router_for(topology)
    per_stage: dict[int, MemoryEstimate] = {}
    used: dict[str, float] = {}
    sharers: dict[str, int] = {}
    for rank in range(topology.num_gpus):
        stage = layout.stage_of(rank)
        if stage not in per_stage:
            per_stage[stage] = estimate_memory(model, layout, memory, stage)
        for target, nbytes in per_stage[stage].offloaded.items():
            if not nbytes:
                continue
            node = nearest_node(router, topology, topology.node_of(rank), OFFLOAD_NODE_KINDS[target])
            used[node] = used.get(node, 0.0) + nbytes
            sharers[node] = sharers.get(node, 0) + 1
    for node, nbytes in sorted(used.items()):
        cap = topology.graph.nodes[node].get("capacity")
        if cap is not None and nbytes > cap:
            raise MemoryFitError(
                f"workload {name!r}: offloading puts {format_size(nbytes)} from {sharers[node]} "
                f"GPUs on {node!r}, which holds {format_size(cap)} ({format_size(nbytes - cap)} "
                "too much); offload less (e.g. only the optimizer states), add memory, or use "
                "more GPUs")


# ---------------------------------------------------------------------- templates
@dataclass
class _Template:
    """A pass program with per-step task fields precomputed."""

    steps: list[Step]
    labels: list[str]
    attrs: list[dict[str, Any]]
    first_compute: int
    last_compute: int
    completes: dict[str, int]          #: block name -> step completing it
    block_params: list[tuple[str, float, float]]  #: (block, dense, expert) in pass order


class _CollTemplate(NamedTuple):
    """A collective step on one rank (:meth:`_Generator._collective_template`): the checked
    task every micro-batch copies (``None``: one-rank group, nothing to emit), the group
    kind and group naming its ``coll_id``, the counter key numbering them, and whether it is
    a ``delay`` standing in for the collective (closed form or free communication)."""

    task: Task | None
    gkind: str
    group: tuple[int, ...]
    counter: str
    free: bool


class _RankRows(NamedTuple):
    """A pass template on one rank as a run of rows (:meth:`_Generator._rank_rows`): the
    row template, the emitter counter of each numbered slot (collectives, CP transfers), the
    last row of each stream, and per step of the pass the rows its ids are."""

    template: RowTemplate
    counters: tuple[str, ...]
    last: tuple[tuple[str, int], ...]
    refs: list[list[int]]


class _RunIds:
    """The ``ids`` of a pass emitted as rows (:meth:`_Generator._emit_rows`): ``ids[j]`` is
    the list of ids step ``j`` stands for, as :meth:`_Generator._pass_steps` returns them,
    made when asked (the generator reads a few of them per pass)."""

    __slots__ = ("rows", "refs")

    def __init__(self, rows: Rows, refs: list[list[int]]) -> None:
        self.rows = rows
        self.refs = refs

    def __getitem__(self, j: int) -> list[str]:
        prefix, first = self.rows.prefix, self.rows.first
        return [f"{prefix}{first + r}" for r in self.refs[j]]


def _kernel_label(kernels: Sequence[Kernel]) -> str:
    if len(kernels) == 1:
        return kernels[0].name
    return f"{kernels[0].name}..{kernels[-1].name}"


class _Generator:
    #: emit a pass whose copies are made of the rank's templates alone as one run of rows,
    #: and defer the graph's building to its first read (False: task by task, as before;
    #: tests/test_generation_rows.py compares the two)
    use_rows = True

    def __init__(self, plan: WorkloadPlan, topology: Topology, engine: EngineOptions | None = None) -> None:
        self.plan = plan
        self.topo = topology
        self.model = plan.model
        self.lo = plan.layout
        self.opts = plan.options
        self.comm = plan.options.comm
        lo = self.lo
        self.m = lo.num_micro_batches
        self.v = lo.chunks                 #: model chunks per stage
        self.bi = lo.pipeline.bidirectional
        #: template phases the schedule uses: F, B (whole backward), Bi (input gradient), W
        self.phases: tuple[str, ...] = ("F", "B")
        if lo.pipeline.split_backward:
            self.phases = ("F", "B", "Bi", "W") if self.bi else ("F", "Bi", "W")
        self.groups: dict[str, dict[int, tuple[int, ...]]] = {}
        for kind in _GROUP_KINDS + (("etp",) if lo.separate_expert_tp else ()):
            table: dict[int, tuple[int, ...]] = {}
            for g in lo.groups(kind):
                for r in g:
                    table[r] = g
            self.groups[kind] = table
        if self.bi:
            self._replica_groups()
        offload = plan.memory.offload_activations != "none"
        #: the kernels, points, parameters and offloaded bytes of a layer, by "dense layer?"
        self.layer_kinds: dict[bool, tuple[KernelSet, tuple, tuple[float, float], float]] = {}
        self.ep_kind = self._ep_kind()
        self.ep_algo = self._ep_algorithm()
        self.ep_shares: dict[tuple[tuple[int, ...], bool], dict] = {}  #: rail options per (group, combine)
        #: DeepEP's intranode kernels: the direct all-to-all de-duplicated per GPU
        self.ep_intranode = self._ep_on_one_host()
        if self.ep_kind == "tp_ep" and self.ep_algo != "rail" and not self.ep_intranode:
            self.ep_kind = "ep"     # groups uneven over hosts: the flat NCCL layout, as with TP 1
        received = self._deepep_received_rows()
        for dense in ({False, True} if self.model.dense_layers else {False}):
            ks = layer_kernels(self.model, lo, dense, received)
            self.layer_kinds[dense] = (ks, tuple(layer_points(self.model, lo, ks, received is not None,
                                                              self.ep_kind)),
                                       layer_params_on_gpu(self.model, lo, dense),
                                       layer_activation_bytes(self.model, lo, dense=dense)
                                       if offload else 0.0)
        self.embed_ks = embedding_kernels(self.model, lo)
        self.head_ks = head_kernels(self.model, lo)
        self.act_bytes = self.layer_kinds[False][3]
        self.templates: dict[tuple[int, int, str], _Template] = {}
        #: (id of a template, rank) -> (the template, its steps' task templates on the rank)
        self.rank_templates: dict[tuple[int, int], tuple[_Template, list[Any]]] = {}
        #: (id of a template, rank) -> (the template, its run of rows or None: _rank_rows)
        self.rank_rows: dict[tuple[int, int], tuple[_Template, _RankRows | None]] = {}
        calibration = engine.model_calibration if engine is not None else None
        #: ids, counters, last task per stream, kernel times, nearest memory nodes
        self.em = TaskEmitter(f"{plan.name} {lo.describe()}", topology, plan.devices, self.model.precision,
                              meta={"workload": plan.name, "layout": lo.describe(),
                                    "granularity": self.opts.granularity, "comm": self.comm,
                                    "generator": "dessim.workload.transformer.generator"},
                              calibration=calibration)
        for name in set(plan.devices):        # a precision or fused attention the GPU cannot run: say so now
            self.em.timer.model(name).check_precision()
            self.em.timer.model(name).check_attention(lo.attention)
        self.graph = self.em.graph
        if self.use_rows:
            self.graph.defer()      # made when first read: docs/performance.md, "Generation: pass runs"
        approximations = []                            # said in every summary (WorkloadResult)
        if self.comm and self.ep_algo == "rail":
            approximations.append(DEEPEP_APPROXIMATION)
        # a skewed routing's distinct targets size the de-duplicated all-to-all and DeepEP's
        # received rows (the latter also without communication)
        if (self.comm or received is not None) and (self.ep_algo == "rail" or self.ep_intranode) \
                and self.model.routing.distribution != "uniform":
            approximations.append(SKEWED_ROUTING_APPROXIMATION)
            if not self._ep_spread().loads_matched:
                approximations.append(UNMATCHED_ROUTING_APPROXIMATION)
        if approximations:
            self.graph.meta["approximations"] = approximations
        self.free_colls: dict[str, list[tuple[str, list[str]]]] = {}
        self.free_p2p: dict[tuple[int, int, int, str], dict[str, tuple[str, list[str]]]] = {}
        self.mem_tasks: dict[tuple[int, int, tuple], str] = {}
        self.islands: TPIslands | None = None
        self.stage_mode = False
        self.fallback: list[str] = []
        self.timelines: dict[tuple, PassTimeline | None] = {}
        self.tp_shapes: dict[tuple[int, int, str], tuple[Step, ...]] = {}
        self.pass_inputs: dict[tuple, list[tuple[str, list[str]]]] = {}
        self.graph.fold = self._make_fold(engine)
        self._setup_closed_form(engine)
        if self.graph.fold is not None and self.islands is not None:
            self._check_fold_tp_symmetry()

    def _replica_groups(self) -> None:
        """DualPipe: stage ``s`` and stage ``pp-1-s`` hold the same two pieces (``s`` and
        ``pp-1-s``), so each piece's gradients are reduced over the data-parallel groups of
        both stages (DualPipe's 2× parameters; DeepSeek-AI 2024 §3.2.1): group kinds
        ``dp_cp@j`` / ``edp@j`` for piece ``j``, each with its own collective sequence."""
        lo = self.lo
        for kind in ("dp_cp", "edp"):
            base = self.groups[kind]
            for rank in range(lo.world_size):
                stage = lo.stage_of(rank)
                merged = tuple(sorted(base[rank] + base[self._pp_rank(rank, lo.pp - 1 - stage)]))
                for chunk in range(self.v):
                    self.groups.setdefault(f"{kind}@{lo.piece_of(stage, chunk)}", {})[rank] = merged

    def _grad_kind(self, kind: str, stage: int, chunk: int) -> str:
        """The rank-group kind that reduces a chunk's gradients (``dp_cp`` or ``edp``; per
        piece with DualPipe, :meth:`_replica_groups`)."""
        return f"{kind}@{self.lo.piece_of(stage, chunk)}" if self.bi else kind

    # ------------------------------------------------------------------ replica folding
    def _make_fold(self, engine: EngineOptions | None) -> Fold | None:
        """The TP × CP × DP lanes of a folded graph, or None (with the reason in the meta)."""
        opts, lo = self.opts, self.lo
        if not opts.fold:
            return None
        why = None
        if lo.tp * lo.cp * lo.dp == 1:
            why = "tp = cp = dp = 1: nothing to fold"
        elif len(set(self.plan.devices)) != 1:
            why = "mixed GPU models"
        elif engine is not None and engine.noise.active:
            why = "per-rank compute slowdown: replicas are not identical"
        elif _digit_lanes(lo) is None and _stage_shift_period(lo) is None:
            why = "expert grid: the order leaves no lanes that map both the attention and the expert groups"
        elif self.comm:
            why = self._offload_fold_refusal()
        perms = lane_permutations(lo) if why is None else None
        if perms is not None and len(perms) == 1:
            why = ("expert grid (ep over cp × dp, or etp != tp): no lane other than the identity maps both the "
                   "attention and the expert groups onto themselves")
        if why is not None:
            self.graph.meta["fold_fallback"] = why
            return None
        fold = Fold(perms, ("tp", "cp", "dp") if lo.cp > 1 else ("tp", "dp"))
        self.graph.meta["fold_lanes"] = fold.lanes
        return fold

    def _offload_fold_refusal(self) -> str | None:
        """Why offload memcpys keep the graph unfolded, or None. A folded memcpy copies on
        every lane between the image's GPU and the image's own nearest memory node
        (:mod:`dessim.engine.memlanes`). That is the unfolded run when (1) no such route has
        an ECMP choice — the unfolded engine keys that choice by the task's position, which
        the images of a folded task do not have — and (2) every rank's copies see the same
        route: hop for hop the same capacity and latency, shared by as many ranks' copies
        (e.g. three CXL expanders for four PCIe switches give two GPUs a longer route).
        Otherwise the lanes would drift apart (the engine would report it as lane skew):
        stay unfolded, exact."""
        mem = self.plan.memory
        targets = sorted({mem.offload_optimizer, mem.offload_activations} - {"none"})
        if not targets:
            return None
        router, node, edges = self.em.router, self.topo.node_of, self.topo.graph.edges
        routes: dict[int, list[tuple[str, ...]]] = {}
        for target in targets:
            kind = OFFLOAD_NODE_KINDS[target]
            for r in range(self.lo.world_size):
                g, m = node(r), self.em.nearest(r, kind)
                if not (router.key_independent(g, m) and router.key_independent(m, g)):
                    return (f"offload memcpys of rank {r} to {m} have equal-cost paths (ECMP) "
                            "chosen per task: lanes are not images of one another")
                routes.setdefault(r, []).extend((router.path(g, m), router.path(m, g)))
        users: dict[tuple[str, str], int] = {}
        for paths in routes.values():
            for hop in {h for p in paths for h in zip(p, p[1:])}:
                users[hop] = users.get(hop, 0) + 1

        def alike(path: tuple[str, ...]) -> tuple:
            return tuple((edges[a, b]["bw"] * edges[a, b].get("efficiency", 1.0), edges[a, b]["lat"],
                          users[a, b]) for a, b in zip(path, path[1:]))

        first: tuple | None = None
        for r, paths in sorted(routes.items()):
            sig = tuple(alike(p) for p in paths)
            if first is None:
                first = (r, sig)
            elif sig != first[1]:
                return (f"offload routes differ: rank {r}'s copies to {paths[0][-1]} and rank "
                        f"{first[0]}'s to {routes[first[0]][0][-1]} cross unlike links or links "
                        "shared by unlike numbers of GPUs: lanes would not stay in step")
        return None

    def _check_fold_tp_symmetry(self) -> None:
        """Closed-form TP times are taken from the representative's TP group for all its
        images: fold only if every TP group of a stage has the same closed-form times (the
        engine cannot see a difference there, so it must be excluded up front)."""
        lo = self.lo
        by_stage: dict[int, list[tuple[int, ...]]] = {}
        for g in lo.groups("tp"):
            by_stage.setdefault(lo.stage_of(g[0]), []).append(g)
        for stage, groups in sorted(by_stage.items()):
            for chunk in range(self.v):
                for phase in self.phases:
                    # a step's time is a function of (op, size, group): one step per (op,
                    # size), in order of first appearance — the same first calls as step by
                    # step, so the same memos and reasons, and equal lists exactly when the
                    # step-by-step lists are equal
                    steps = self._tp_steps(stage, chunk, phase)
                    ref = [self._tp_time(s, groups[0]) for s in steps]
                    for g in groups[1:]:
                        if [self._tp_time(s, g) for s in steps] != ref:
                            self.graph.meta["fold_fallback"] = (
                                f"TP groups {list(groups[0])} and {list(g)} of stage {stage} have "
                                "different closed-form collective times: replicas are not identical")
                            self.graph.fold = None
                            self.graph.meta.pop("fold_lanes", None)
                            return

    def _is_representative(self, rank: int) -> bool:
        if self.graph.fold is None:
            return True
        digits = _digit_lanes(self.lo)
        if digits is None:
            return rank % (self.lo.tp * self.lo.cp * self.lo.dp) < _stage_shift_period(self.lo)  # type: ignore[operator]
        c = self.lo.coords(rank)
        return c.tp == 0 and c.cp < digits[0] and c.dp == 0

    # ------------------------------------------------------------------ closed-form TP
    def _setup_closed_form(self, engine: EngineOptions | None) -> None:
        """Decide which TP groups are timed in closed form and whether passes merge."""
        opts, lo = self.opts, self.lo
        want = opts.tp_closed_form or opts.granularity == "stage"
        if not want or not self.comm or lo.tp == 1:
            return
        if engine is not None and engine.noise.active:
            self.fallback.append("per-rank compute slowdown: TP members would not stay in step")
            self.graph.meta["closed_form_fallback"] = self.fallback[:8]
            return
        kinds = ("dp_cp", "edp", self.ep_kind, "cp") + (("etp",) if lo.separate_expert_tp else ())
        others = [g for kind in kinds for g in lo.groups(kind)]
        if self.bi:      # DualPipe reduces gradients over two stages' DP groups together
            others += sorted({g for kind, table in self.groups.items() if "@" in kind for g in table.values()})
        node = self.topo.node_of
        pairs = [(node(r), node(self._pp_rank(r, lo.stage_of(r) + 1))) for r in range(lo.world_size)
                 if lo.stage_of(r) + 1 < lo.pp]
        if lo.virtual_stages > 1:   # interleaved: the last stage also sends to the first
            pairs += [(node(r), node(self._pp_rank(r, 0))) for r in range(lo.world_size)
                      if lo.stage_of(r) == lo.pp - 1]
        if self.bi:                  # DualPipe: the reverse direction sends to the previous stage
            pairs += [(b, a) for a, b in pairs]
        for target in (self.plan.memory.offload_optimizer, self.plan.memory.offload_activations):
            if target != "none":
                pairs += [(node(r), self.em.nearest(r, OFFLOAD_NODE_KINDS[target])) for r in range(lo.world_size)]
        self.islands = TPIslands(self.topo, lo.groups("tp"), others, pairs, engine)
        for g, why in sorted(self.islands.fallbacks.items()):
            self.fallback.append(f"TP group {brief_ranks(g)}: {why}")
        if opts.granularity == "stage":
            self.stage_mode = self._stage_possible()
        self.graph.meta["tp_closed_form_groups"] = len(self.islands.isolated_groups)
        self.graph.meta["tp_simulated_groups"] = len(lo.groups("tp")) - len(self.islands.isolated_groups)
        self.graph.meta["stage_merged"] = self.stage_mode
        if self.fallback:
            self.graph.meta["closed_form_fallback"] = self.fallback[:8]

    def _tp_time(self, s: Step, group: tuple[int, ...]) -> float | None:
        if s.group != "tp" or self.islands is None or not self.islands.isolated(group):
            return None
        return self.islands.time(s.op, s.size, group)

    def _tp_steps(self, stage: int, chunk: int, phase: str) -> tuple[Step, ...]:
        """One TP collective step of each (op, size) of a pass, in step order (cached)."""
        shapes = self.tp_shapes.get((stage, chunk, phase))
        if shapes is None:
            seen: dict[tuple[str, float], Step] = {}
            for s in self._template(stage, chunk, phase).steps:
                if s.kind == "collective" and s.group == "tp":
                    seen.setdefault((s.op, s.size), s)
            shapes = self.tp_shapes[(stage, chunk, phase)] = tuple(seen.values())
        return shapes

    def _timeline(self, rank: int, stage: int, chunk: int, phase: str) -> PassTimeline | None:
        group = self.groups["tp"][rank]
        t = self._template(stage, chunk, phase)
        # a pass's timeline depends on its group only through the closed-form TP times: TP
        # groups with the same times (every isolated NVSwitch node) share it
        shapes = self._tp_steps(stage, chunk, phase)
        key = (stage, chunk, phase, self.plan.devices[rank], tuple(self._tp_time(s, group) for s in shapes))
        if key not in self.timelines:
            cuts: set[int] = set()
            if phase in ("B", "W") and self.lo.zero_stage < 3:
                grad = self.model.precision_spec.grad_bytes
                ready = ((b, {"dp_cp": d * grad, "edp": e * grad}) for b, d, e in t.block_params)
                cuts = {t.completes[b.after] for b in fill_buckets(ready, self.plan.bucket_size,
                                                                     ("dp_cp", "edp"))}
            self.timelines[key] = pass_timeline(t.steps, cuts, lambda k: self.em.kernel_time(rank, k),
                                                lambda s: self._tp_time(s, group))
        return self.timelines[key]

    def _stage_possible(self) -> bool:
        """Stage merging is exact here: every TP group closed-form, homogeneous GPUs, passes
        of compute + TP only, and no pass's TP tail can delay the next pass's first TP."""
        lo = self.lo
        if self.islands is None or len(self.islands.isolated_groups) != len(lo.groups("tp")):
            self.fallback.append("stage granularity needs every TP group in closed form: using layer")
            return False
        if len(set(self.plan.devices)) != 1:
            self.fallback.append("stage granularity needs one GPU model on every rank: using layer")
            return False
        # Merged passes are exact for a pass that runs alone on its rank's compute and TP
        # streams from its start. DualPipe runs a forward and a backward pass as a pair whose
        # TP collectives interleave (llama3-8b TP 8 PP 2 on 2 x DGX H100: 1.2303 s merged
        # against the exact 1.1092 s): it keeps layer granularity.
        if self.lo.pipeline.bidirectional:
            self.fallback.append(f"stage granularity with the {self.lo.pipeline.name} schedule's "
                                 "paired forward and backward passes is not exact: using layer")
            return False
        firsts, tails = [], []
        for g in lo.groups("tp"):
            stage = lo.stage_of(g[0])
            for chunk in range(self.v):
                for phase in self.phases:
                    tl = self._timeline(g[0], stage, chunk, phase)
                    if tl is None:
                        self.fallback.append(f"stage {stage} chunk {chunk} {phase}: a pass holds "
                                             "communication other than closed-form TP: using layer")
                        return False
                    if phase == "W" and tl.first_tp != inf:
                        # a weight-gradient pass's TP collectives (sequence parallelism's
                        # all-gathers of the inputs) depend on nothing of the pass: they start
                        # ahead of its compute, beside the previous pass, which a merged pass
                        # (all of it from its start) cannot show (ZB-H1, llama3-8b TP 8 PP 2:
                        # 19.2 us more per micro-batch on stage 0, 1.3e-4 of the iteration)
                        self.fallback.append(f"stage {stage} chunk {chunk}: the weight-gradient "
                                             "pass holds TP collectives that run ahead of its "
                                             "compute (sequence parallelism): using layer")
                        return False
                    firsts.append(tl.first_tp)
                    tails.append(tl.tail)
        if max(tails) > min(firsts):
            self.fallback.append("a TP collective outlasts its pass by more than the next pass "
                                 "computes before its first TP collective: using layer")
            return False
        return True

    def _emit_merged(self, rank: int, stage: int, chunk: int, phase: str, mb: int,
                     input_deps: list[str]) -> tuple[_Template, list[list[str]]]:
        """A pass as its merged segments (:mod:`dessim.workload.transformer.stage_passes`); ``ids`` maps
        every template step to the segment task that contains it."""
        t = self._template(stage, chunk, phase)
        tl = self._timeline(rank, stage, chunk, phase)
        assert tl is not None
        ids: list[list[str]] = [[] for _ in t.steps]
        prev: list[str] = []
        cat = {"F": "fwd", "W": WGRAD}.get(phase, "bwd")
        group = self.groups["tp"][rank]
        for n, seg in enumerate(tl.segments):
            tid = self.em.new_id(rank)
            label = f"{cat} stage{stage} c{chunk} mb{mb} seg{n} ({t.labels[seg.first]}..{t.labels[seg.last]})"
            self.em.add(Task(tid, rank, "compute", stream="compute", name=label, category=cat,
                             duration=seg.duration, flops=seg.flops, bytes=seg.bytes, kernel="layer",
                             attrs={"model_flops": seg.model_flops, "tp_comm_s": seg.tp_comm_s,
                                    "tp_exposed_s": seg.tp_exposed_s, "tp_exposed_iv": seg.tp_exposed_iv,
                                    "merged": True}),
                        prev + (input_deps if n == 0 else []))
            if seg.kernel_s:
                self.em.graph.set_kernel_mix(tid, seg.kernel_s)
            if n == 0 and input_deps:
                # members start together (their first TP collective would sync them)
                self.pass_inputs.setdefault((group, stage, chunk, phase, mb), []).append((tid, list(input_deps)))
            for i in range(seg.first, seg.last + 1):
                ids[i] = [tid]
            prev = [tid]
        if tl.tail > 0:
            tid = self.em.new_id(rank)
            self.em.add(Task(tid, rank, "delay", stream="tp", name=f"tp tail stage{stage} c{chunk} mb{mb}",
                             category="tp", duration=tl.tail, attrs={"closed_form": True}), prev)
        return t, ids

    # ------------------------------------------------------------------ blocks
    def _blocks(self, stage: int, chunk: int) -> list[Block]:
        lo, model = self.lo, self.model
        layers = lo.stage_layers(model.layers, stage)[chunk]
        blocks = [Block(f"L{i}", *self.layer_kinds[model.is_dense_layer(i) and model.is_moe])
                  for i in layers]
        if not self.opts.embedding_head:
            return blocks
        piece = lo.piece_of(stage, chunk)
        first, last = piece == 0, piece == lo.pipeline_pieces - 1
        vocab_shard = ceil(model.vocab / lo.tp) * model.hidden
        if first:
            embed = vocab_shard + model.embedding_params() - model.vocab * model.hidden
            blocks.insert(0, Block("embed", self.embed_ks,
                                   tuple(embedding_points(model, lo, self.embed_ks)), (embed, 0.0)))
        if last:
            head = model.norm_params() + (vocab_shard if not model.tied_embeddings or lo.pp > 1 else 0)
            head_pts = tuple(head_points(model, lo, self.head_ks))
            blocks.append(Block("head", self.head_ks, head_pts, (head, 0.0)))
            blocks += self._mtp_blocks(head_pts)
        return blocks

    def _mtp_blocks(self, head_pts: tuple) -> list[Block]:
        """The multi-token-prediction modules on the last stage: entry (projection), one MoE
        layer and the shared LM head each (:func:`mtp_kernels`); their parameters are
        :func:`mtp_params_on_gpu`'s (the head's are the main head's)."""
        model, lo = self.model, self.lo
        if not model.mtp_modules:
            return []
        ks, pts, params, act = self.layer_kinds[False]
        entry = mtp_kernels(model, lo)
        per = model.mtp_modules
        entry_params = mtp_params_on_gpu(model, lo)[0] / per - params[0]
        out = []
        for j in range(per):
            out += [Block(f"mtp{j}.in", entry, (), (entry_params, 0.0)),
                    Block(f"mtp{j}.L", ks, pts, params, act),
                    Block(f"mtp{j}.head", self.head_ks, head_pts, (0.0, 0.0))]
        return out

    def _template(self, stage: int, chunk: int, phase: str) -> _Template:
        key = (stage, chunk, phase)
        t = self.templates.get(key)
        if t is not None:
            return t
        blocks = self._blocks(stage, chunk)
        zero3 = self.lo.zero_stage >= 3
        builder = PassBuilder(self.model, self.lo, zero3_param_bytes=self.model.precision_spec.param_bytes,
                              offload_activations=self.act_bytes > 0, overlap=self.plan.overlap)
        if phase == "F":
            steps = builder.forward(blocks, zero3)
        else:
            steps = builder.backward(blocks, zero3)
            if phase != "B":                      # split: input-gradient or weight-gradient pass
                steps = split_backward(steps)[phase == "W"]
        if self.opts.granularity in ("layer", "stage"):
            steps = merge_steps(steps)
        labels, attrs = [], []
        completes: dict[str, int] = {}
        for i, s in enumerate(steps):
            if s.is_compute:
                labels.append(f"{s.category} {s.block} {_kernel_label(s.kernels)}")
                mf = sum(k.flops for k in s.kernels if k.is_model_flops)
                attrs.append({"model_flops": mf, "block": s.block})
                for b in s.completes:
                    completes[b] = i
            else:
                labels.append(f"{s.category} {s.block} {s.name}")
                attrs.append({})
        computes = [i for i, s in enumerate(steps) if s.is_compute]
        order = blocks if phase == "F" else list(reversed(blocks))
        for b in blocks:    # a block without weight-gradient GEMMs (embedding) is done when W starts
            completes.setdefault(b.name, computes[0])
        t = _Template(steps, labels, attrs, computes[0], computes[-1], completes,
                      [(b.name, b.params[0], b.params[1]) for b in order])
        self.templates[key] = t
        return t

    def _ep_kind(self) -> str:
        """The group kind of the MoE all-to-all: ``tp_ep`` for ``moe_dispatch: deepep`` with
        TP or expert TP (``tp > 1`` or ``etp > 1``), else ``ep``. Megatron-core runs DeepEP on
        one group over the expert-TP × EP ranks (``MoEFlexTokenDispatcher``:
        ``_DeepepManager(group=self.tp_ep_group, router_topk=etp·top_k,
        num_experts=etp·experts)``, where its ``tp_size`` is the size of
        ``pg_collection.expt_tp``, NVIDIA/Megatron-LM
        ``megatron/core/transformer/moe/token_dispatcher.py``; the group is
        ``parallel_state.get_expert_tensor_and_model_parallel_group()``, the expert grid's
        ``'tp-ep'`` ranks, ``megatron/core/transformer/moe/moe_utils.py`` and
        ``megatron/core/parallel_state.py``; nothing there refuses ``etp != tp``): each rank
        dispatches its sequence-parallel shard of ``T/tp`` tokens, and
        ``_initialize_metadata`` replicates a token's routing over the ``etp`` expert-TP ranks
        of every target EP rank, so each of them receives the token once and no TP all-gather
        or reduce-scatter surrounds the routed experts (their row-parallel partial sums are
        added by the combine). Megatron-core's ``MoELayer`` refuses TP without sequence
        parallelism in training, and the expert-TP ranks of an EP rank must share a host (the
        per-host layout below), so both are a WorkloadError here."""
        lo = self.lo
        if (lo.tp == 1 and lo.expert_tp == 1) or not lo.moe_all_to_all or lo.moe_dispatch != "deepep" \
                or not self.model.is_moe:
            return "ep"
        where = f"parallel layout {lo.describe()}"
        if lo.needs_sequence_parallel(self.model) and not lo.sequence_parallel:
            raise WorkloadError(f"{where}: moe_dispatch deepep with tp={lo.tp} needs sequence "
                                "parallelism (sp: true), as Megatron-core's MoE layer does in training")
        try:
            spread = any(len(host_rows(g, self.topo)) > 1 for g in lo.groups("etp"))
        except CollectiveError:
            spread = True
        if spread:
            what = f"etp={lo.expert_tp}" if lo.separate_expert_tp else f"tp={lo.tp}"
            raise WorkloadError(f"{where}: moe_dispatch deepep with {what} needs every expert-TP group "
                                "on one host; use moe_dispatch nccl or a smaller "
                                f"{'etp' if lo.separate_expert_tp else 'tp'}")
        return "tp_ep"

    def _ep_algorithm(self) -> str:
        """The MoE all-to-all's algorithm: with ``moe_dispatch: deepep``, ``rail`` (DeepEP's
        same-rail network phase, then NVLink; :mod:`dessim.collectives.algorithms.rail`) when
        the EP groups span hosts with equally many members on each; else ``auto`` (NCCL's
        direct sends)."""
        groups = self.lo.groups(self.ep_kind) if self.lo.ep > 1 and self.lo.moe_dispatch == "deepep" else []
        try:
            if groups and all(len(host_rows(g, self.topo)) > 1 for g in groups):
                return "rail"
        except CollectiveError:
            pass
        return "auto"

    def _ep_attrs(self, group: tuple[int, ...], combine: bool) -> dict:
        """Attributes of an MoE all-to-all task on ``group``: with ``rail`` (DeepEP), the
        algorithm's options from :func:`~dessim.workload.transformer.deepep.deepep_rail_options`
        (``combine``: the forward combine or the dispatch's backward)."""
        if self.ep_algo != "rail":
            return {}
        options = self.ep_shares.get((group, combine))
        if options is None:
            rows = host_rows(group, self.topo)
            etp = self.lo.expert_tp if self.ep_kind == "tp_ep" else 1
            tokens = expert_tokens(self.model, self.lo) / etp    # each member's (_deepep_received_rows)
            options = deepep_rail_options(self.model.routing, self.model.top_k, self.model.experts,
                                          len(rows), len(rows[0]), combine=combine, tokens=tokens, etp=etp,
                                          nvlink_efficiency=deepep_nvlink_efficiency(self.topo, group[0]))
            self.ep_shares[(group, combine)] = options
        return {ALGO_OPTIONS: dict(options)}

    def _ep_intranode_share(self, group: tuple[int, ...]) -> float:
        """The share of an MoE all-to-all's flat bytes that DeepEP's intranode kernels send
        when ``group`` lies on one host (``moe_dispatch: deepep``): a token goes once to each
        *GPU* that holds one of its experts (``is_token_in_rank``, deepseek-ai/DeepEP
        ``csrc/kernels/intranode.cu``; the combine sends each GPU's partial sum back once), so
        the direct all-to-all carries ``G/top_k`` of the flat fan-out, ``G`` the distinct
        GPUs per token (:meth:`MoERouting.nvlink_share` with one node: the same per-GPU
        de-duplication as the rail algorithm's NVLink phase). With ``ep = 1`` (DeepEP on the
        expert-TP group alone) every token reaches each expert-TP rank once: ``1/top_k``.
        Divided by DeepEP's NVLink efficiency (:func:`~dessim.workload.transformer.layout.
        deepep_nvlink_efficiency`, a wire factor as the rail's ``nvlink_efficiency``: its copies
        reach that fraction of the NVLink rate). 1.0 for ``nccl``, for the rail algorithm (its
        options carry the shares) and for groups across hosts."""
        if not self.ep_intranode:
            return 1.0
        if self.lo.ep == 1:
            share = 1.0 / self.model.top_k
        else:
            share = self.model.routing.nvlink_share(self.model.top_k, self.model.experts, 1, self.lo.ep)
        return share / deepep_nvlink_efficiency(self.topo, group[0])

    def _deepep_received_rows(self) -> int | None:
        """Rows DeepEP delivers per micro-batch to the most loaded GPU of an EP group — one per
        (token, GPU), :func:`~dessim.workload.transformer.kernels.layer_kernels`'s
        ``received`` — or None where the run keeps the flat layout: not ``deepep`` (or its
        groups span hosts unevenly). Each of the ``ep`` members sends its ``T`` tokens, a
        token reaching GPU ``g`` with probability ``P(g hit)`` (:meth:`MoERouting.spread`):
        ``R = ⌈T · ep · max_g P(g hit)⌉``, ``T·G`` for uniform routing. With TP or expert TP
        (group ``tp_ep``, :meth:`_ep_kind`) each of the ``etp·ep`` members sends its ``T/tp``
        sequence-parallel tokens and a GPU is hit with its EP rank's probability: ``T`` becomes
        the ``etp·T/tp`` tokens of :func:`~dessim.workload.transformer.kernels.expert_tokens`
        (the same ``R`` when ``etp = tp``)."""
        lo = self.lo
        if not (self.model.is_moe and (self.ep_algo == "rail" or self.ep_intranode)):
            return None
        spread = self._ep_spread()
        tokens = expert_tokens(self.model, lo)
        if self.model.routing.distribution == "uniform":
            return ceil(tokens * spread.gpus * (1 - 1e-12))
        return ceil(tokens * lo.ep * max(spread.gpu_hit) * (1 - 1e-12))

    def _ep_spread(self) -> Spread:
        """The routing's hit probabilities over the nodes and GPUs of an EP group (DeepEP:
        groups on one host, or equally many members on each of their hosts)."""
        rows = host_rows(self.lo.groups("ep")[0], self.topo)
        return self.model.routing.spread(self.model.top_k, self.model.experts, len(rows), len(rows[0]))

    def _ep_on_one_host(self) -> bool:
        """Whether ``moe_dispatch: deepep`` runs DeepEP's intranode kernels: every EP group
        of two or more ranks lies on one host."""
        if not self.lo.moe_all_to_all or self.lo.moe_dispatch != "deepep":
            return False
        try:
            return all(len(host_rows(g, self.topo)) == 1 for g in self.lo.groups(self.ep_kind))
        except CollectiveError:
            return False

    # ------------------------------------------------------------------ task emission
    def _collective(self, rank: int, name: str, category: str, stream: str, op: str, size: float,
                    group: tuple[int, ...], deps: list[str], gkind: str, combine: bool = False) -> list[str]:
        """A collective task (or its free stand-in); returns the ids later steps depend on
        (``combine``: an MoE all-to-all in the combine direction, :class:`~.passes.CommSpec`)."""
        return self._emit_collective(self._collective_template(rank, category, stream, op, size, group,
                                                               gkind, combine), name, deps)

    def _collective_template(self, rank: int, category: str, stream: str, op: str, size: float,
                             group: tuple[int, ...], gkind: str, combine: bool = False) -> _CollTemplate:
        """What a collective step emits on ``rank`` for every micro-batch: a checked task (its
        id, name and ``coll_id`` placeholders) — the collective, or the ``delay`` of an
        isolated TP island's closed-form time, or a free stand-in — or ``None`` for a one-rank
        group (nothing to do)."""
        if len(group) == 1:
            return _CollTemplate(None, gkind, group, f"coll.{gkind}", False)
        closed = (self.islands.time(op, size, group)
                  if gkind == "tp" and self.islands is not None and self.islands.isolated(group) else None)
        if closed is not None:
            # an isolated TP island: its idle-network time, starting when all members are ready
            task = Task("template", rank, "delay", stream=stream, category=category, duration=closed,
                        attrs={"op": op, "size": float(size), "closed_form": True})
        elif self.comm:
            ep = gkind in _EP_KINDS
            if ep:
                size *= self._ep_intranode_share(group)
            task = Task("template", rank, "collective", stream=stream, category=category,
                        op=op, size=float(size), group=group, coll_id="template",
                        algo=self.ep_algo if ep else "auto",
                        attrs=self._ep_attrs(group, combine) if ep else {})
        else:
            task = Task("template", rank, "delay", stream=stream, category=category,
                        duration=0.0, attrs={"op": op, "size": float(size)})
        return _CollTemplate(task, gkind, group, f"coll.{gkind}", task.kind == "delay")

    def _emit_collective(self, c: _CollTemplate, name: str, deps: list[str]) -> list[str]:
        """Emit one copy of a collective template (:meth:`_collective_template`) after
        ``deps``; the ids later steps depend on (``deps`` themselves for a one-rank group)."""
        proto = c.task
        if proto is None:
            return deps
        rank = proto.rank
        n = self.em.count(rank, c.counter)
        coll_id = f"{c.gkind}{c.group[0]}.{n}"
        task = self.em.add_like(proto, name, deps)
        task.attrs = dict(proto.attrs)          # each task its own, as when built one by one
        if c.free:
            self.free_colls.setdefault(coll_id, []).append((task.id, list(deps)))
        else:
            task.coll_id = coll_id
        return [task.id]

    def _p2p(self, rank: int, kind: str, peer: int, tag: int, size: float, name: str, category: str,
             stream: str, deps: list[str]) -> str:
        if self.comm:
            return self.em.p2p(rank, kind, peer, tag, size, name, category, stream, deps)
        tid = self.em.add(Task(self.em.new_id(rank), rank, "delay", stream=stream, name=name, category=category,
                               duration=0.0, attrs={"peer": peer, "size": float(size)}), deps)
        src, dst = (rank, peer) if kind == "send" else (peer, rank)
        if self.graph.fold is not None:
            # a ring exchange inside one orbit (CP): the other half is held by the orbit's
            # representative as the image of another pair, as the engine pairs transfers
            src, dst = self.graph.fold.canonical_pair(src, dst)
        self.free_p2p.setdefault((src, dst, tag, stream.split(".")[0]), {})[kind] = (tid, list(deps))
        return tid

    def _memcpy(self, rank: int, size: float, direction: str, target: str, name: str, stream: str,
                deps: list[str]) -> str:
        if self.comm:
            node = self.em.nearest(rank, OFFLOAD_NODE_KINDS[target])
            return self.em.memcpy(rank, size, node, direction, name, "offload", stream, deps)
        return self.em.add(Task(self.em.new_id(rank), rank, "delay", stream=stream, name=name,
                                category="offload", duration=0.0, attrs={"size": float(size)}), deps)

    def _compute(self, rank: int, step: Step, label: str, attrs: dict[str, Any], deps: list[str]) -> str:
        return self.em.compute(rank, step.kernels, label, step.category, deps, attrs=attrs,
                               reused=True)          # a template's step: the same list each time

    def _emit_pass(self, rank: int, stage: int, chunk: int, phase: str, mb: int,
                   input_deps: list[str]) -> tuple[_Template, Any]:
        if self.stage_mode:
            return self._emit_merged(rank, stage, chunk, phase, mb, input_deps)
        if self.use_rows:
            t = self._template(stage, chunk, phase)
            run = self._rank_rows(t, rank)
            if run is not None:
                return t, self._emit_rows(run, rank, mb, input_deps)
        steps = self._pass_steps(rank, stage, chunk, phase, mb, input_deps)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def _emit_pair(self, rank: int, first: tuple, second: tuple) -> tuple[tuple, tuple]:
        """Two passes of a DualPipe pair ``(stage, chunk, phase, mb, input_deps)`` emitted with
        their compute steps alternating — the first's k-th, then the second's k-th — so that
        while one pass waits for its communication (TP, EP all-to-all, CP) the compute stream
        runs the other's next kernels (DeepSeek-AI 2024, §3.2.1: overlapped forward and
        backward chunks). Merged passes (stage granularity) hold no such communication and
        run one after the other. Returns each pass's ``(template, ids)``."""
        if self.stage_mode:
            return self._emit_pass(rank, *first), self._emit_pass(rank, *second)
        runs = [self._pass_steps(rank, *first), self._pass_steps(rank, *second)]
        results: list[tuple | None] = [None, None]
        while any(r is None for r in results):
            for k in (0, 1):
                if results[k] is None:
                    try:
                        next(runs[k])
                    except StopIteration as done:
                        results[k] = done.value
        return results[0], results[1]  # type: ignore[return-value]

    def _rank_template(self, t: _Template, rank: int) -> list[Any]:
        """Per step of template ``t`` on ``rank``, what every micro-batch copies: for a compute
        step its checked task and kernel mix (:meth:`TaskEmitter.compute_template`), for a
        collective its :class:`_CollTemplate`, else ``None`` (built per micro-batch). Made
        once per (template, rank): a pass's tasks differ across micro-batches only in ids,
        names, counters and dependencies."""
        key = (id(t), rank)
        got = self.rank_templates.get(key)
        if got is not None:
            return got[1]
        out: list[Any] = []
        for i, s in enumerate(t.steps):
            if s.kind == "compute":
                out.append(self.em.compute_template(rank, s.kernels, s.category, attrs=t.attrs[i]))
            elif s.kind == "collective":
                out.append(self._collective_template(rank, s.category, s.stream, s.op, s.size,
                                                     self.groups[s.group][rank], s.group, s.combine))
            elif s.kind in ("send", "recv") and self.comm:
                cp_group = self.groups["cp"][rank]
                step = 1 if s.peer == "next" else -1
                peer = cp_group[(cp_group.index(rank) + step) % len(cp_group)]
                out.append(Task("template", rank, s.kind, stream=s.stream, category="cp", peer=peer,
                                size=float(s.size)))     # em.p2p's task; the tag is numbered per copy
            else:
                out.append(None)
        self.rank_templates[key] = (t, out)     # holds t: its id stays its own
        return out

    def _rank_rows(self, t: _Template, rank: int) -> _RankRows | None:
        """Template ``t`` on ``rank`` as a :class:`~dessim.taskgraph.rows.RowTemplate`
        (made once per (template, rank)), or None when a micro-batch's copy is not made of
        the rank's templates alone: a memcpy step (its key links micro-batches), or a free
        stand-in for a collective or a CP transfer (their members are linked afterwards).
        A CP transfer's tag counts on its stream, as :meth:`_pass_steps` numbers it."""
        key = (id(t), rank)
        got = self.rank_rows.get(key)
        if got is not None:
            return got[1]
        made = self._rank_template(t, rank)
        protos: list[Task] = []
        labels: list[str] = []
        deps: list[list[int]] = []
        colls: list[tuple[int, str] | None] = []
        mixes: list[tuple] = []
        counters: list[str] = []
        refs: list[list[int]] = []     # per step, the runs' tasks its ids are (_pass_steps)
        entry = -1
        run: _RankRows | None = None
        for i, s in enumerate(t.steps):
            d = list(dict.fromkeys(r for j in s.deps for r in refs[j]))    # as add() keeps them
            if s.kind == "compute":
                if i == t.first_compute:
                    entry = len(protos)
                proto, mix = made[i]
                colls.append(None)
                mixes.append(mix)
            elif s.kind == "collective":
                c = made[i]
                if c.task is None:          # one-rank group: its ids are its dependencies
                    refs.append(d)
                    continue
                if c.free:
                    break
                if c.counter not in counters:
                    counters.append(c.counter)
                proto = c.task
                colls.append((counters.index(c.counter), f"{c.gkind}{c.group[0]}."))
                mixes.append(())
            elif s.kind in ("send", "recv") and self.comm:
                proto = made[i]                 # the tag numbered below
                if s.stream not in counters:
                    counters.append(s.stream)
                colls.append((counters.index(s.stream), None))
                mixes.append(())
            else:
                break
            refs.append([len(protos)])
            protos.append(proto)
            labels.append(t.labels[i])
            deps.append(d)
        else:
            last = {p.stream: k for k, p in enumerate(protos)}
            run = _RankRows(RowTemplate(protos, labels, deps, entry, colls, mixes), tuple(counters),
                            tuple(last.items()), refs)
        self.rank_rows[key] = (t, run)      # holds t: its id stays its own
        return run

    def _emit_rows(self, run: _RankRows, rank: int, mb: int, input_deps: list[str]) -> "_RunIds":
        """One micro-batch's copy of a pass as one :class:`~dessim.taskgraph.rows.Rows`
        record (:meth:`TaskEmitter.add_rows`: the ids, counters and last task per stream the
        emitter would have after emitting it task by task, :meth:`_pass_steps`), and the
        steps' ids."""
        rows = self.em.add_rows(rank, run.template, run.counters, run.last, f" mb{mb}", input_deps)
        return _RunIds(rows, run.refs)

    def _pass_steps(self, rank: int, stage: int, chunk: int, phase: str, mb: int,
                    input_deps: list[str]) -> Generator[None, None, tuple[_Template, list[list[str]]]]:
        """Emit a pass's steps, pausing after each compute step; returns ``(template, ids)``.
        Compute and collective tasks are copies of the rank's templates (:meth:`_rank_template`)."""
        t = self._template(stage, chunk, phase)
        made = self._rank_template(t, rank)
        ids: list[list[str]] = []
        cp_group = self.groups["cp"][rank]
        suffix = f" mb{mb}"
        labels = t.labels
        add_like, p2p_like = self.em.add_like, self.em.p2p_like
        kernel_mix = self.graph.set_kernel_mix
        for i, s in enumerate(t.steps):
            deps = [d for j in s.deps for d in ids[j]]
            kind = s.kind
            if kind == "compute":
                if i == t.first_compute:
                    deps += input_deps
                proto, mix = made[i]
                tid = add_like(proto, labels[i] + suffix, deps).id
                if mix:
                    kernel_mix(tid, mix)
                ids.append([tid])
                yield
            elif kind == "collective":
                ids.append(self._emit_collective(made[i], labels[i] + suffix, deps))
            elif kind in ("send", "recv") and self.comm:
                ids.append([p2p_like(made[i], labels[i] + suffix, self.em.count(rank, s.stream), deps)])
            elif kind in ("send", "recv"):
                pos = cp_group.index(rank)
                step = 1 if s.peer == "next" else -1
                peer = cp_group[(pos + step) % len(cp_group)]
                tag = self.em.count(rank, s.stream)
                ids.append([self._p2p(rank, s.kind, peer, tag, s.size, labels[i] + suffix, "cp",
                                      s.stream, deps)])
            elif kind == "memcpy":
                if s.after_key:
                    deps.append(self.mem_tasks[(rank, mb, s.after_key)])
                tid = self._memcpy(rank, s.size, s.direction, self.plan.memory.offload_activations,
                                   labels[i] + suffix, s.stream, deps)
                if s.key:
                    self.mem_tasks[(rank, mb, s.key)] = tid
                ids.append([tid])
            else:  # pragma: no cover - PassBuilder makes only these kinds
                raise AssertionError(s.kind)
        return t, ids

    # ------------------------------------------------------------------ pipeline transfers
    def _pp_size(self) -> float:
        lo, model = self.lo, self.model
        tokens = lo.micro_batch * model.seq_len // lo.cp
        if lo.sequence_parallel:
            tokens //= lo.tp
        return float(tokens * model.hidden * model.precision_spec.activation_bytes)

    def _pp_rank(self, rank: int, stage: int) -> int:
        c = self.lo.coords(rank)
        return self.lo.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=stage)

    def _pp_tag(self, direction: int, recv_vstage: int, mb: int) -> int:
        return (direction * self.lo.pp * self.v + recv_vstage) * self.m + mb

    # ------------------------------------------------------------------ per rank
    def emit_rank(self, rank: int) -> None:
        lo = self.lo
        stage = lo.stage_of(rank)
        program = stage_program(lo.schedule, stage, lo.pp, self.m, lo.virtual_stages)
        last_grad = {}                  # chunk -> the op that completes its last weight gradients
        for n, op in enumerate(program):
            if op.phase == "W" or (op.phase == "B" and not op.split):
                last_grad[op.chunk] = n
        buckets: list[tuple[str, float, list[str]]] = []   # (group kind, gradient bytes, ids) of the final buckets
        last_compute = ""
        split_done: dict[tuple[int, int], str] = {}   # (chunk, mb) -> end of a split B
        n = 0
        while n < len(program):
            group = [n, n + 1] if n + 1 < len(program) and program[n + 1].paired else [n]
            passes = [self._pass_args(rank, stage, program[k], split_done) for k in group]
            if len(passes) == 2:
                # a pair starts when both inputs are there (DualPipe receives both, then computes)
                passes[0] = passes[0][:4] + (passes[0][4] + passes[1][4],)
                emitted = list(self._emit_pair(rank, passes[0], passes[1]))
            else:
                emitted = [self._emit_pass(rank, *passes[0])]
            for k, (t, ids) in zip(group, emitted):
                op = program[k]
                last_compute = ids[t.last_compute][-1]
                self._pass_outputs(rank, stage, op, ids[t.last_compute], split_done)
                if op.phase == "W" or (op.phase == "B" and not op.split):   # weight gradients done
                    final = last_grad[op.chunk] == k
                    if lo.zero_stage == 2 or (lo.zero_stage < 2 and final):
                        made = self._reduce_gradients(rank, t, ids, op.mb, stage, op.chunk)
                        if final:
                            buckets += made
            n += len(group)
        self._optimizer(rank, stage, last_compute, buckets)

    def _pp_stream(self, base: str, chunk: int) -> str:
        """Pipeline transfer stream; DualPipe's reverse direction has its own."""
        return base + (".rev" if self.bi and chunk == 1 else "")

    def _pass_args(self, rank: int, stage: int, op: PipeOp,
                   split_done: dict[tuple[int, int], str]) -> tuple[int, int, str, int, list[str]]:
        """Receive what pass ``op`` needs; its ``(stage, chunk, template phase, mb, inputs)``."""
        p, mb, chunk, bi = self.lo.pp, op.mb, op.chunk, self.bi
        here = virtual_stage(stage, chunk, p, bi)
        inputs: list[str] = []
        size = self._pp_size()
        if op.phase == "F":
            src = prev_virtual(stage, chunk, p, bi)
            if src is not None:
                inputs.append(self._p2p(rank, "recv", self._pp_rank(rank, src[0]), self._pp_tag(0, here, mb), size,
                                        f"pp recv act v{here} mb{mb}", "pp", self._pp_stream("pp.recv.fwd", chunk), []))
        elif op.phase == "B":
            src = next_virtual(stage, chunk, p, self.v, bi)
            if src is not None:
                inputs.append(self._p2p(rank, "recv", self._pp_rank(rank, src[0]), self._pp_tag(1, here, mb), size,
                                        f"pp recv grad v{here} mb{mb}", "pp", self._pp_stream("pp.recv.bwd", chunk), []))
        else:
            inputs.append(split_done.pop((chunk, mb)))
        phase = "Bi" if op.phase == "B" and op.split else op.phase
        return stage, chunk, phase, mb, inputs

    def _pass_outputs(self, rank: int, stage: int, op: PipeOp, out: list[str],
                      split_done: dict[tuple[int, int], str]) -> None:
        """Send what pass ``op`` produced to the neighbouring virtual stage."""
        p, mb, chunk, bi = self.lo.pp, op.mb, op.chunk, self.bi
        size = self._pp_size()
        if op.phase == "F":
            dst = next_virtual(stage, chunk, p, self.v, bi)
            if dst is not None:
                vs = virtual_stage(dst[0], dst[1], p, bi)
                self._p2p(rank, "send", self._pp_rank(rank, dst[0]), self._pp_tag(0, vs, mb), size,
                          f"pp send act v{vs} mb{mb}", "pp", self._pp_stream("pp.send.fwd", chunk), out)
        elif op.phase == "B":
            if op.split:
                split_done[(chunk, mb)] = out[-1]
            dst = prev_virtual(stage, chunk, p, bi)
            if dst is not None:
                vs = virtual_stage(dst[0], dst[1], p, bi)
                self._p2p(rank, "send", self._pp_rank(rank, dst[0]), self._pp_tag(1, vs, mb), size,
                          f"pp send grad v{vs} mb{mb}", "pp", self._pp_stream("pp.send.bwd", chunk), out)

    def _reduce_gradients(self, rank: int, t: _Template, ids: list[list[str]], mb: int, stage: int,
                          chunk: int) -> list[tuple[str, float, list[str]]]:
        """Bucketed gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1/2) of one backward."""
        lo = self.lo
        fused = self.plan.overlap.fuse_optimizer_allreduce
        op = "allreduce" if lo.zero_stage == 0 and not fused else "reducescatter"
        grad = self.model.precision_spec.grad_bytes
        limit = self.plan.bucket_size
        ready = ((block, {"dp_cp": dense * grad, "edp": expert * grad})
                 for block, dense, expert in t.block_params)
        made = [self._bucket(rank, self._grad_kind(b.group, stage, chunk), op, b.nbytes,
                             ids[t.completes[b.after]], mb)
                for b in fill_buckets(ready, limit, ("dp_cp", "edp"))]
        return [b for b in made if b[1] > 0]

    def _bucket(self, rank: int, gkind: str, op: str, nbytes: float, deps: list[str],
                mb: int) -> tuple[str, float, list[str]]:
        """One bucket's reduction: (group kind, gradient bytes, the ids that finish it)."""
        group = self.groups[gkind][rank]
        if len(group) == 1:
            return (gkind, 0.0, [])
        n = self.em.count(rank, f"bucket.{gkind}")
        done = self._collective(rank, f"dp {op} bucket{n} ({gkind}) mb{mb}", "dp", "dp", op, nbytes, group,
                                list(deps), gkind)
        return (gkind, nbytes, done)

    def _optimizer(self, rank: int, stage: int, last_compute: str,
                   buckets: list[tuple[str, float, list[str]]]) -> None:
        if not self.opts.optimizer:
            return
        if self.plan.overlap.fuse_optimizer_allreduce and buckets:
            self._fused_optimizer(rank, stage, last_compute, buckets)
            return
        lo, model = self.lo, self.model
        prec = model.precision_spec
        copies = 2 if self.bi else 1     # DualPipe: two stages hold each piece (_replica_groups)
        shard = {"dp_cp": lo.dp * lo.cp * copies, "edp": lo.edp * copies} if lo.zero_stage >= 1 else {
            "dp_cp": 1, "edp": 1}
        deps = [last_compute] if last_compute else []
        # every DP reduction of this rank must be done (FIFO streams: the last of each suffices)
        for stream in ("dp", "dp.ag"):
            last = self.em.last(rank, stream)
            if last:
                deps.append(last)
        blocks = [b for c in range(self.v) for b in self._blocks(stage, c)]
        updates = [(b.name, b.params[0] / shard["dp_cp"] + b.params[1] / shard["edp"]) for b in blocks]
        target = self.plan.memory.offload_optimizer
        if target == "none":
            total = sum(u for _, u in updates)
            k = optimizer_kernel("optimizer.step", total, prec)
            step = Step("compute", k.name, "optimizer", "compute", block="optimizer", kernels=[k])
            opt = self._compute(rank, step, "optimizer step", {"model_flops": 0.0}, deps)
            done = [opt]
        else:
            done = []
            for name, params in updates:
                state = params * prec.optimizer_bytes
                load = self._memcpy(rank, state, "to_hbm", target, f"optimizer load {name}", "mem.in", deps)
                k = optimizer_kernel(f"optimizer.{name}", params, prec)
                step = Step("compute", k.name, "optimizer", "compute", block=name, kernels=[k])
                opt = self._compute(rank, step, f"optimizer step {name}", {"model_flops": 0.0}, deps + [load])
                done.append(self._memcpy(rank, state, "from_hbm", target, f"optimizer store {name}",
                                         "mem.out", [opt]))
        if 1 <= lo.zero_stage <= 2:
            ratio = prec.param_bytes / prec.grad_bytes
            for n, (gkind, nbytes, _) in enumerate(buckets):
                group = self.groups[gkind][rank]
                self._collective(rank, f"dp allgather params bucket{n} ({gkind})", "dp", "dp", "allgather",
                                 nbytes * ratio, group, [done[-1]] if target == "none" else list(done), gkind)

    def _fused_optimizer(self, rank: int, stage: int, last_compute: str,
                         buckets: list[tuple[str, float, list[str]]]) -> None:
        """CoCoNet's fused reduction + optimizer (:mod:`dessim.workload.transformer.overlap`):
        per final bucket, the update of the rank's slice of its parameters as soon as the
        bucket is reduce-scattered, then the all-gather of the updated 16-bit parameters;
        parameters of a one-rank group (nothing to reduce) in one step after the backward."""
        lo, prec = self.lo, self.model.precision_spec
        copies = 2 if self.bi else 1     # DualPipe: two stages hold each piece (_replica_groups)
        shard = {"dp_cp": lo.dp * lo.cp * copies, "edp": lo.edp * copies}
        base = [last_compute] if last_compute else []
        for n, (gkind, nbytes, done) in enumerate(buckets):
            k = optimizer_kernel(f"optimizer.bucket{n}", nbytes / prec.grad_bytes / len(self.groups[gkind][rank]),
                                 prec)
            step = Step("compute", k.name, "optimizer", "compute", block=f"bucket{n}", kernels=[k])
            opt = self._compute(rank, step, f"optimizer step bucket{n} ({gkind})", {"model_flops": 0.0},
                                base + done)
            self._collective(rank, f"dp allgather params bucket{n} ({gkind})", "dp", "dp", "allgather",
                             nbytes * prec.param_bytes / prec.grad_bytes, self.groups[gkind][rank], [opt], gkind)
        blocks = [b for c in range(self.v) for b in self._blocks(stage, c)]
        rest = sum(b.params[i] for b in blocks for i, g in enumerate(("dp_cp", "edp")) if shard[g] == 1)
        if rest:
            k = optimizer_kernel("optimizer.step", rest, prec)
            step = Step("compute", k.name, "optimizer", "compute", block="optimizer", kernels=[k])
            self._compute(rank, step, "optimizer step (unreduced)", {"model_flops": 0.0}, base)

    # ------------------------------------------------------------------ free communication
    def _link_free(self) -> None:
        # members of a free collective, and of a merged pass, start together: each waits
        # for the inputs of all
        for members in chain(self.free_colls.values(), self.pass_inputs.values()):
            inputs = sorted({d for _, deps in members for d in deps})
            for tid, _ in members:
                for d in inputs:
                    if not self.graph.has_dependency(d, tid):
                        self.graph.depend(d, tid)
        for pair in self.free_p2p.values():
            send, recv = pair.get("send"), pair.get("recv")
            if send is None or recv is None:  # pragma: no cover - the generator pairs every transfer
                raise AssertionError(f"unpaired free transfer {pair}")
            self.graph.depend(send[0], recv[0])

    def run(self) -> TaskGraph:
        for rank in range(self.lo.world_size):
            if self._is_representative(rank):
                self.emit_rank(rank)
        if not self.comm or self.free_colls or self.pass_inputs:
            self._link_free()
        if self.islands is not None and self.islands.chosen:
            self.graph.meta["tp_closed_form_chosen"] = sorted(self.islands.chosen)
        return self.graph


def _classic_lanes(lo: ParallelLayout) -> bool:
    """Whether there is no expert grid, or it is EP carved out of DP (``etp = tp``, ``ep``
    divides ``dp``, and ``cp = 1`` or ``cp`` after ``dp`` in ``order``: ``dp = ep_index +
    ep·edp_index``), so the lanes may shift TP, CP and DP indices separately
    (:func:`lane_permutations`)."""
    return not lo.expert_grid or (not lo.separate_expert_tp and lo.dp % lo.ep == 0 and (
        lo.cp == 1 or lo.order.index("cp") > lo.order.index("dp")))


def _cp_lanes(lo: ParallelLayout) -> tuple[int, int] | None:
    """With ``etp = tp`` and EP over CP × DP (``cp`` before ``dp``; the expert grid splits
    ``m = cp_index + cp·dp_index`` into ``ep_index = m mod ep``, ``edp_index = m div ep``)
    and ``cp``, ``ep`` nested: ``(step, q)`` — the lanes shift TP freely, the CP ring by
    multiples of ``step`` and move the DP index as a pair of digits ``(j, g) = (dp mod q,
    dp div q)``, ``q = lcm(cp, ep)/cp`` (:func:`_digit_lane_permutations`). Every lane must move
    each all-to-all's members by a rotation of their positions (the direct all-to-all's send
    order): so the CP ring shifts only by multiples of ``ep`` when ``ep | cp`` (an EP group
    inside a CP group), not at all (``step = cp``) when ``ep > cp`` (an EP group holds the
    whole CP groups of ``q`` DP indices, whose shift would swap positions inside it); there
    a shift of ``j`` inside its EP group rotates the group's positions by multiples of
    ``cp`` — the classic lanes' digit shift of EP inside DP (:func:`lane_permutations`), with
    a CP group for each DP index. None otherwise."""
    if lo.separate_expert_tp or _classic_lanes(lo) or _stage_shift_period(lo) is None:
        return None
    if lo.ep % lo.cp and lo.cp % lo.ep:
        return None
    return (lo.ep if lo.cp % lo.ep == 0 else lo.cp), lcm(lo.cp, lo.ep) // lo.cp


def _digit_lanes(lo: ParallelLayout) -> tuple[int, int] | None:
    """``(step, q)`` of the lanes that shift TP, the CP ring by multiples of ``step`` and the
    DP index's digits ``(dp mod q, dp div q)`` (:func:`_digit_lane_permutations`): ``(1,
    ep)`` for the classic lanes (:func:`_classic_lanes`; ``q = 1`` without expert
    parallelism), :func:`_cp_lanes` for EP over CP × DP; None when neither applies (the
    stage-local shifts of :func:`_stage_shift_period`)."""
    return (1, lo.ep) if _classic_lanes(lo) else _cp_lanes(lo)


def _stage_shift_period(lo: ParallelLayout) -> int | None:
    """Otherwise: the smallest stage-local shift under which both the attention grid
    (``tp·cp`` blocks) and the expert grid (``etp·ep`` blocks) map onto themselves, or None
    when the order makes neither a block grid (``pp`` not last, or ``tp``, ``cp``, ``dp``
    resp. ``etp``, ``ep``, ``edp`` not fastest-first)."""
    def blocks(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
        step = 1
        for size, stride in zip(sizes, strides):
            if size > 1 and stride != step:
                return False
            step *= size
        return True
    st, est = lo.strides(), lo._expert_strides()
    if not (blocks((lo.tp, lo.cp, lo.dp, lo.pp), tuple(st[d] for d in ("tp", "cp", "dp", "pp")))
            and blocks((lo.expert_tp, lo.ep, lo.edp), tuple(est[d] for d in ("etp", "ep", "edp")))):
        return None
    return lcm(lo.tp * lo.cp, lo.expert_tp * lo.ep)


def lane_permutations(lo: ParallelLayout) -> np.ndarray:
    """The ``(tp·cp·dp, world)`` rank permutations of TP × CP × DP replica folding: lane
    ``(a·CP + c)·DP + b`` maps the rank at (tp, cp, dp, pp) to the rank at ((tp + a) mod TP,
    (cp + c) mod CP, dp', pp) — a cyclic shift of the CP ring, under which ring attention's
    sends to the next rank map onto sends to the next rank. Without expert parallelism
    ``dp' = (dp + b) mod DP``. With it, a DP index is (e, r) — position ``e = dp mod EP`` in
    its expert-parallel group and group ``r = dp div EP`` — and the lane shifts each separately, ``dp' = (e + b mod EP) mod EP + EP·((r + b
    div EP) mod DP/EP)``, so every EP group (and every expert-data-parallel group) maps onto
    one. Lane 0 is the identity.

    When the expert grid is not EP carved out of DP (``etp != tp``, or EP spanning CP × DP;
    :func:`_classic_lanes`, :mod:`~dessim.workload.transformer.layout`) the lanes are the
    shifts of the stage-local index ``l`` (``rank mod tp·cp·dp``, ``pp`` last) by
    multiples of ``M = lcm(tp·cp, etp·ep)`` (:func:`_stage_shift_period`): a shift by a multiple of
    ``tp·cp`` maps TP, CP and DP groups onto TP, CP and DP groups (and CP's ring order onto
    itself), one by a multiple of ``etp·ep`` ETP, EP and expert-DP groups onto their kind.
    With ``etp = tp`` and EP over CP × DP, :func:`_cp_lanes` (TP, CP and DP-digit lanes)."""
    digits = _digit_lanes(lo)
    if digits is not None:
        return _digit_lane_permutations(lo, *digits)
    local, period = lo.tp * lo.cp * lo.dp, _stage_shift_period(lo)
    if period is None:
        raise WorkloadError(f"replica folding: no lanes for the expert grid of {lo.describe()}")
    ranks = np.arange(lo.world_size, dtype=np.int64)
    base, idx = ranks - ranks % local, ranks % local
    return np.stack([base + (idx + k * period) % local for k in range(local // period)])


def _digit_lane_permutations(lo: ParallelLayout, step: int, q: int) -> np.ndarray:
    """:func:`lane_permutations` of :func:`_digit_lanes`: lane ``(a·CP/step + c)·DP + b`` maps
    (tp, cp, dp, pp) to ((tp + a) mod TP, (cp + c·step) mod CP, dp', pp) with the DP index's
    digits ``j = dp mod q``, ``g = dp div q`` shifted separately: ``dp' = (j + b mod q) mod q
    + q·((g + b div q) mod DP/q)`` (a plain rotation when ``q = 1``); lane 0 is the identity."""
    n, strides = lo.world_size, lo.strides()
    coord, rest = {}, np.arange(n, dtype=np.int64)
    for dim in lo.order:              # ParallelLayout.coords of every rank at once
        size = getattr(lo, dim)
        coord[dim], rest = rest % size, rest // size
    tp, cp, dp, pp = (coord[d] for d in ("tp", "cp", "dp", "pp"))
    j, g = dp % q, dp // q
    shifts = lo.cp // step
    # every DP shift b at once: row b holds moved · stride
    b = np.arange(lo.dp, dtype=np.int64)[:, None]
    dp_part = ((j + b % q) % q + q * ((g + b // q) % (lo.dp // q))) * strides["dp"]
    perm = np.empty((lo.tp * shifts * lo.dp, n), dtype=np.int64)
    for a in range(lo.tp):
        for c in range(shifts):
            row = (a * shifts + c) * lo.dp
            perm[row:row + lo.dp] = (pp * strides["pp"] + (tp + a) % lo.tp * strides["tp"]
                                     + (cp + c * step) % lo.cp * strides["cp"]) + dp_part
    return perm


def build_taskgraph(workload: WorkloadPlan | Any, topology: Topology, *,
                    layout: ParallelLayout | None = None, memory: MemoryOptions | None = None,
                    options: GeneratorOptions | None = None, device: str | None = None,
                    engine: EngineOptions | None = None) -> TaskGraph:
    """The task graph of one training iteration of ``workload`` on ``topology``.

    ``workload``: a :class:`WorkloadPlan` (from :func:`make_plan`), a
    :class:`~dessim.workload.transformer.spec.WorkloadSpec` (its layout scaled to the topology's GPU count
    unless ``layout`` is given; its memory options and device), or a
    ``(TransformerConfig, ParallelLayout)`` pair. ``engine``: the :class:`~dessim.engine.EngineOptions` the graph will be replayed
    with (closed-form TP times use its network model, algorithm and chunking). Raises
    :class:`~dessim.errors.WorkloadError` for invalid layouts and
    :class:`~dessim.errors.MemoryFitError` when the layout does not fit.
    """
    if not isinstance(workload, WorkloadPlan):
        workload = plan_for(workload, topology, layout=layout, memory=memory, options=options, device=device)
    with collector_paused():     # the graph grows by 10^5-10^6 objects (dessim.taskgraph.collector)
        return _Generator(workload, topology, engine).run()


def plan_for(workload: Any, topology: Topology, *, layout: ParallelLayout | None = None,
             memory: MemoryOptions | None = None, options: GeneratorOptions | None = None,
             device: str | None = None) -> WorkloadPlan:
    """A :class:`WorkloadPlan` from a WorkloadSpec or a (model, layout) pair."""
    from dessim.workload.transformer.spec import WorkloadSpec

    if isinstance(workload, WorkloadSpec):
        lay = layout or workload.layout(topology.num_gpus)
        mem = memory or workload.memory_options()
        return make_plan(workload.model, lay, topology, memory=mem, options=options, device=device,
                         workload_device=workload.training.device, name=workload.name,
                         overlap=workload.overlap_options())
    if isinstance(workload, tuple) and len(workload) == 2:
        model, lay = workload
        if not isinstance(model, TransformerConfig) or not isinstance(lay, ParallelLayout):
            raise WorkloadError("build_taskgraph: expected (TransformerConfig, ParallelLayout), got "
                                f"({type(model).__name__}, {type(lay).__name__})")
        return make_plan(model, layout or lay, topology, memory=memory, options=options, device=device)
    raise WorkloadError(f"build_taskgraph: expected a WorkloadSpec, a WorkloadPlan or a (model, layout) "
                        f"pair, got {type(workload).__name__}")
