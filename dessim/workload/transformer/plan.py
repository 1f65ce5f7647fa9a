"""A transformer workload planned on a topology: overrides, validation, memory fit; the
layouts that fit.

:func:`plan_workload` loads the workload, applies the overrides, derives ``dp`` from the GPU
count, validates the layout and checks that the memory estimate fits; the result
(:class:`~dessim.workload.transformer.generator.WorkloadPlan`) is what the generator turns into a task
graph. :func:`enumerate_layouts` lists every layout of a model that fits a GPU count and an
HBM capacity.

Overrides (a mapping; every key is checked)
    * sections shaped like the workload file — ``model``, ``parallelism``, ``training`` —
      merged into the document before it is parsed again (so they get the file's validation
      and unit parsing: ``{"training": {"micro_batch": 2, "bucket_size": "50MB"}}``);
    * ``memory``: :class:`~dessim.workload.transformer.memory.MemoryOptions` fields (``bucket_size``,
      ``offload_optimizer``, ``offload_activations``, ``overhead``);
    * ``generator``: :class:`~dessim.workload.transformer.generator.GeneratorOptions` fields;
    * flat keys: any :class:`~dessim.workload.transformer.layout.ParallelLayout` field (``tp``, ``dp``,
      ``schedule``, ``virtual_stages``, ...), any GeneratorOptions or MemoryOptions field, and
      ``device``;
    * ``hbm_capacity`` (flat or in ``memory``): HBM bytes per GPU (a number or a size such as
      ``"40GB"``) that replace the catalog capacity of the topology's GPUs for the memory fit
      and ``memory_capacity_bytes``; everything else about the device is unchanged (a
      memory-capacity study, e.g. an A100 with 40 instead of 80 GB).

Data parallelism follows the topology: unless ``dp`` is given (flat or in
``parallelism``), ``dp = GPUs / (tp·pp·cp)``; a given ``dp`` that does not match the GPU count
is an error."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from itertools import product
from pathlib import Path
from typing import Any, Iterable, Mapping

from dessim.engine import EngineOptions
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.topology import load_topology
from dessim.topology.calibrate import calibrated_topology
from dessim.topology.graph import Topology
from dessim.resources import data_dir, read_yaml
from dessim.schema import did_you_mean
from dessim.units import parse_capacity
from dessim.workload.transformer.generator import GeneratorOptions, WorkloadPlan, make_plan
from dessim.workload.transformer.layout import SCHEDULES, ParallelLayout
from dessim.workload.transformer.memory import MemoryOptions, check_fit, estimate_memory
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.routing import MoERouting
from dessim.workload.common.document import merge_document
from dessim.workload.transformer.spec import WorkloadSpec, load_workload, parse_workload

__all__ = ["plan_workload", "enumerate_layouts", "resolve_workload", "workload_document", "check_override_keys"]

_LAYOUT_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelLayout))
_GEN_FIELDS = tuple(f.name for f in dataclasses.fields(GeneratorOptions))
_MEM_FIELDS = tuple(f.name for f in dataclasses.fields(MemoryOptions))
_SECTIONS = ("model", "parallelism", "training")
#: Override of the hardware rather than the job: HBM bytes per GPU (see module docstring).
_HBM_KEY = "hbm_capacity"


def workload_document(spec: WorkloadSpec) -> dict[str, Any]:
    """The workload file document equivalent to ``spec`` (SI units)."""
    model = {f.name: getattr(spec.model, f.name) for f in dataclasses.fields(TransformerConfig)
             if f.name not in ("name", "grad_precision")}     # grad_precision: in training
    # defaults derived from other fields stay derived (an override of heads keeps MHA)
    if not model["description"]:        # a model note (e.g. from a Hugging Face config) survives
        del model["description"]
    if model["kv_heads"] == model["heads"]:
        del model["kv_heads"]
    if model["moe_ffn_hidden"] == model["ffn_hidden"]:
        del model["moe_ffn_hidden"]
    for key in ("dense_layers", "shared_experts", "mtp_modules"):
        if not model[key]:
            del model[key]
    if model["mla"] is None:
        del model["mla"]
    else:
        model["mla"] = dataclasses.asdict(model["mla"])
    if model["routing"] == MoERouting():
        del model["routing"]
    else:
        routing = {k: v for k, v in dataclasses.asdict(model["routing"]).items() if v not in (None, ())}
        if "counts" in routing:
            routing["counts"] = list(routing["counts"])
        model["routing"] = routing
    par = dataclasses.asdict(spec.parallelism)
    par["order"] = list(par["order"])
    tr = dataclasses.asdict(spec.training)
    tr = {k: v for k, v in tr.items() if v is not None}
    if isinstance(tr["pipeline_layers"], tuple):
        tr["pipeline_layers"] = list(tr["pipeline_layers"])
    tr["offload"] = {"optimizer": tr.pop("offload_optimizer"), "activations": tr.pop("offload_activations")}
    tr.pop("seq_len", None)  # already in the model
    return {"name": spec.name, "description": spec.description, "source": spec.source,
            "model": model, "parallelism": par, "training": tr}



#: Flat override keys that live in the workload document, by section.
_DOC_KEYS: dict[str, str] = {
    "tp": "parallelism", "pp": "parallelism", "dp": "parallelism", "cp": "parallelism",
    "ep": "parallelism", "etp": "parallelism", "sp": "parallelism", "order": "parallelism",
    "micro_batch": "training", "global_batch": "training", "schedule": "training",
    "virtual_stages": "training", "pipeline_layers": "training", "recompute": "training",
    "attention": "training", "moe_dispatch": "training", "moe_dispatch_precision": "training",
    "grad_precision": "training", "zero_stage": "training",
    "bucket_size": "training", "tp_comm_overlap": "training", "fuse_optimizer_allreduce": "training",
}
_OFFLOAD_KEYS = {"offload_optimizer": "optimizer", "offload_activations": "activations"}


def _file_sets_dp(spec: WorkloadSpec) -> bool:
    """Whether the user's own workload file writes ``parallelism.dp``: then it is meant, and
    a GPU count it does not match is an error instead of being silently refilled. A shipped
    preset's ``dp`` is only its default size, which the topology's GPU count replaces."""
    if spec.path is None:
        return False
    path = Path(spec.path).resolve()
    shipped = data_dir("workloads")
    if shipped is not None and path.parent == shipped.resolve():
        return False
    doc = read_yaml(path, "workload file")
    par = doc.get("parallelism") if isinstance(doc, dict) else None
    return isinstance(par, dict) and "dp" in par


#: Overrides of data-parallel workloads (:mod:`dessim.workload.dataparallel`: gradient
#: synchronisation and parameter servers) that a transformer has no use for.
_DATA_PARALLEL_ONLY = frozenset({"gradient_sync", "parameter_servers", "ps_placement", "ps_mode", "ps_staleness"})


def check_override_keys(spec: WorkloadSpec, overrides: Mapping[str, Any] | None) -> None:
    """Raise a :class:`WorkloadError` naming the first top-level key of ``overrides`` that
    is no override of a transformer (a sweep checks its overrides with it before any point
    runs)."""
    valid = (set(_SECTIONS) | {"memory", "generator", "device"} | set(_LAYOUT_FIELDS) | set(_GEN_FIELDS)
             | set(_MEM_FIELDS) | set(_DOC_KEYS) | {_HBM_KEY})
    for key in overrides or {}:
        if key in _DATA_PARALLEL_ONLY:
            raise WorkloadError(f"workload {spec.name!r} is a transformer: {key} (--{key.replace('_', '-')}) "
                                "applies to data-parallel workloads only (kind: dlrm or cnn files, e.g. "
                                "dlrm-small, resnet50)")
        if key not in valid:
            raise WorkloadError(f"workload {spec.name!r}: unknown override {key!r}{did_you_mean(key, valid)}; "
                                "valid: sections "
                                f"{', '.join(_SECTIONS)}, memory, generator, device, or a field of "
                                f"ParallelLayout ({', '.join(_LAYOUT_FIELDS)}), GeneratorOptions "
                                f"({', '.join(_GEN_FIELDS)}) or MemoryOptions ({', '.join(_MEM_FIELDS)}), "
                                f"a training flag (tp_comm_overlap, fuse_optimizer_allreduce) or {_HBM_KEY}")


def resolve_workload(workload: str | Path | WorkloadSpec, overrides: Mapping[str, Any] | None = None,
                     num_gpus: int | None = None) -> tuple[WorkloadSpec, dict[str, Any], bool]:
    """Load ``workload`` and apply the overrides that belong to its document (sections and
    flat layout/batch/offload keys); with ``num_gpus``, set ``dp`` to fill them unless it is
    given. Returns the spec, the remaining overrides (``memory``, ``generator``, ``device``
    and their flat fields) and whether ``dp`` was given explicitly."""
    spec = workload if isinstance(workload, WorkloadSpec) else load_workload(workload)
    overrides = dict(overrides or {})
    check_override_keys(spec, overrides)
    moe_keys = [k for k in ("moe_dispatch", "moe_dispatch_precision") if k in overrides]
    doc = workload_document(spec)
    sections: dict[str, Any] = {}
    for name in _SECTIONS:
        if name in overrides:
            values = overrides.pop(name)
            if not isinstance(values, Mapping):
                raise WorkloadError(f"workload {spec.name!r}: override {name!r} must be a mapping of keys "
                                    f"to values, got {values!r}")
            sections[name] = values
    for key in list(overrides):
        if key in _DOC_KEYS:
            sections.setdefault(_DOC_KEYS[key], {})[key] = overrides.pop(key)
        elif key in _OFFLOAD_KEYS:
            sections.setdefault("training", {}).setdefault("offload", {})[_OFFLOAD_KEYS[key]] = overrides.pop(key)
    _one_chunk_for(sections.get("training", {}), doc)
    merge_document(doc, sections)
    given_dp = "dp" in sections.get("parallelism", {})
    explicit_dp = given_dp or _file_sets_dp(spec)
    if explicit_dp and num_gpus is not None:    # before the layout's batch checks: the real fault
        par = doc["parallelism"]
        sizes = [par.get(k, 1) for k in ("tp", "pp", "dp", "cp")]
        if all(isinstance(v, int) for v in sizes) and math.prod(sizes) != num_gpus:
            fill = "to let data parallelism fill them"
            where, fix = ((f"workload {spec.name!r}: dp={par['dp']}", f"leave dp out {fill}") if given_dp
                          else (f"workload file {str(spec.path)!r}: parallelism.dp {par['dp']}",
                                f"remove dp from the file {fill}, or give --dp or a topology of that size"))
            raise WorkloadError(
                f"{where} makes tp × pp × dp × cp = {' × '.join(map(str, sizes))} = "
                f"{math.prod(sizes)} GPUs, but there are {num_gpus} GPUs in the topology; {fix}")
    if num_gpus is not None and not explicit_dp:
        par = doc["parallelism"]
        model_par = par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
        if isinstance(model_par, int) and model_par > 0 and num_gpus % model_par == 0:
            par["dp"] = num_gpus // model_par
            _check_filled_batch(spec.name, doc, num_gpus, model_par)
    origin = str(spec.path or spec.name) + (" (with overrides)" if sections else "")
    new = parse_workload(doc, origin=origin, default_name=spec.name)
    if moe_keys and not new.model.is_moe:       # asked for, and it would change nothing
        raise WorkloadError(f"workload {spec.name!r} is a dense model (experts={new.model.experts}): "
                            f"{', '.join(moe_keys)} (--{moe_keys[0].replace('_', '-')}) applies to "
                            "mixture-of-experts models only (e.g. mixtral-8x7b, deepseek-v3)")
    return dataclasses.replace(new, path=spec.path), overrides, explicit_dp


def _one_chunk_for(training: dict[str, Any], doc: Mapping[str, Any]) -> None:
    """An overridden schedule that runs one chunk per stage (1f1b, zb-h1, dualpipe, ...) sets
    ``virtual_stages`` to 1 unless the overrides give it: ``--schedule zb-h1`` on an
    interleaved preset (llama3-405b, v = 2) means that schedule, not the error "virtual_stages=2
    needs schedule 'interleaved'"."""
    schedule = training.get("schedule")
    if ("virtual_stages" not in training and isinstance(schedule, str) and schedule in SCHEDULES
            and not SCHEDULES[schedule].interleaved
            and (doc.get("training") or {}).get("virtual_stages", 1) != 1):
        training["virtual_stages"] = 1


def _check_filled_batch(name: str, doc: Mapping[str, Any], num_gpus: int, model_par: int) -> None:
    """Refuse, naming where dp came from, a global batch that the dp filling the topology does
    not divide (the layout's own check would only say "not divisible by micro_batch × dp")."""
    train, dp = doc.get("training") or {}, doc["parallelism"]["dp"]
    batch, micro = train.get("global_batch"), train.get("micro_batch", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (batch, micro)):
        return                            # absent or malformed: the layout's checks say so
    unit = micro * dp
    if batch % unit:
        near = sorted({m for m in (batch // unit * unit, (batch // unit + 1) * unit) if m > 0})
        raise WorkloadError(
            f"workload {name!r}: global_batch={batch} is not divisible by micro_batch × dp = "
            f"{micro} × {dp} = {unit}, where dp={dp} fills the topology's {num_gpus} GPUs "
            f"(tp × pp × cp = {model_par}); give --global-batch a multiple of {unit} "
            f"(e.g. {' or '.join(map(str, near))}) or a topology "
            f"whose GPU count suits the batch")


def plan_workload(workload: str | Path | WorkloadSpec, topology: Topology | str, *,
                  overrides: Mapping[str, Any] | None = None,
                  engine: EngineOptions | None = None) -> tuple[WorkloadPlan, Topology]:
    """Resolve, validate and memory-check ``workload`` on ``topology`` (no simulation)."""
    # the engine applies the calibration's links too; doing it here gives the generator
    # (routes, closed-form TP collectives) the very topology the engine will run on
    topo = calibrated_topology(load_topology(topology), engine.calibration if engine else None)
    spec, rest, explicit_dp = resolve_workload(workload, overrides, topo.num_gpus)
    mem_kw = dict(rest.pop("memory", None) or {})
    gen_kw = dict(rest.pop("generator", None) or {})
    device = rest.pop("device", None) or (engine.device if engine else None)
    for k in list(rest):
        (gen_kw if k in _GEN_FIELDS else mem_kw)[k] = rest.pop(k)
    hbm = mem_kw.pop(_HBM_KEY, None)
    for name, kw, fields in (("memory", mem_kw, _MEM_FIELDS), ("generator", gen_kw, _GEN_FIELDS)):
        bad = [k for k in kw if k not in fields]
        if bad:
            raise WorkloadError(f"workload {spec.name!r}: unknown {name} option {bad[0]!r}; "
                                f"valid: {', '.join(fields)}")
    layout = spec.layout(topo.num_gpus, **({"dp": spec.parallelism.dp} if explicit_dp else {}))
    memory = spec.memory_options(**mem_kw)
    options = GeneratorOptions(**gen_kw)
    capacity = None if hbm is None else parse_capacity(hbm, f"workload {spec.name!r}: override {_HBM_KEY}",
                                                   allow_zero=False)
    plan = make_plan(spec.model, layout, topo, memory=memory, device=device, overlap=spec.overlap_options(),
                     options=options if capacity is None else replace(options, check_memory=False),
                     workload_device=spec.training.device, name=spec.name)
    if capacity is not None:
        if options.check_memory:
            check_fit(plan.estimate, capacity)
        # the plan's own options are the resolved ones (automatic granularity and folding
        # made concrete); only the memory check is given back
        plan = replace(plan, options=replace(plan.options, check_memory=options.check_memory),
                       capacity_bytes=float(capacity))
    return plan, topo


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(model: TransformerConfig, num_gpus: int, capacity_bytes: float, *,
                      base: ParallelLayout | None = None, memory: MemoryOptions | None = None,
                      max_tp: int | None = 8, cps: Iterable[int] = (1,),
                      micro_batches: Iterable[int] | None = None,
                      sp_where_needed: bool = True) -> list[ParallelLayout]:
    """Every valid layout of ``model`` on ``num_gpus`` GPUs whose memory estimate fits in
    ``capacity_bytes`` per GPU.

    Varies ``tp`` (divisors of the GPU count up to ``max_tp``, default 8: one NVLink domain of
    a DGX node), ``pp``, ``cp`` (``cps``), ``ep`` (MoE: divisors of experts and dp) and the
    micro-batch (``micro_batches``, default the base's); ``dp = num_gpus / (tp·pp·cp)``. Other
    fields (global batch, ZeRO stage, schedule, recompute, SP, MoE dispatch, order) come from
    ``base`` (default ``ParallelLayout()``); SP is on whenever ``tp > 1`` if the base has it,
    and also, with ``sp_where_needed`` (the workload leaves ``sp`` unset), where the layout is
    refused without it
    (:meth:`~dessim.workload.transformer.layout.ParallelLayout.needs_sequence_parallel`: TP
    with DeepEP's MoE dispatch; with an explicit ``sp: false`` such a layout stays without SP
    and its simulation refuses it with the reason), and an
    interleaved base schedule falls back to 1f1b where it cannot apply (pp = 1 or m % pp).
    Sorted by (tp, pp, cp, ep, micro_batch). Invalid combinations are skipped silently;
    an empty list means nothing fits.
    """
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise WorkloadError(f"enumerate_layouts: num_gpus={num_gpus!r} must be a whole number >= 1")
    base = base or ParallelLayout()
    memory = memory or MemoryOptions()
    mbs = sorted(set(micro_batches)) if micro_batches is not None else [base.micro_batch]
    out: list[ParallelLayout] = []
    for tp, pp, cp, mb in product(_divisors(num_gpus), _divisors(num_gpus), sorted(set(cps)), mbs):
        if (max_tp and tp > max_tp) or num_gpus % (tp * pp * cp):
            continue
        dp = num_gpus // (tp * pp * cp)
        eps = [e for e in _divisors(dp) if model.experts % e == 0] if model.is_moe else [1]
        for ep in eps:
            kw = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=mb, sp=base.sp and tp > 1)
            layout = _try_layout(base, kw)
            if layout is None:
                continue
            if sp_where_needed and not layout.sp and layout.needs_sequence_parallel(model):
                layout = replace(layout, sp=True)
            try:
                layout.validate(model, num_gpus)
                if estimate_memory(model, layout, memory).total > capacity_bytes:
                    continue
            except DessimError:
                continue
            out.append(layout)
    return out


def _try_layout(base: ParallelLayout, kw: dict[str, Any]) -> ParallelLayout | None:
    for extra in ({}, {"schedule": "1f1b", "virtual_stages": 1}):
        try:
            return replace(base, **kw, **extra)
        except (WorkloadError, SpecError):
            continue
    return None
