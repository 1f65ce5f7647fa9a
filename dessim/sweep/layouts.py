"""``parallelism: auto``: every valid parallel layout of a workload point, as sweep points.

For each point of the axes (its topology, workload overrides and memory section applied):

1. the GPU count is the topology's; the HBM capacity per GPU is ``memory.hbm_capacity`` or
   the smallest catalog figure of the topology's GPUs (as the workload layer does);
2. :func:`dessim.workload.enumerate_layouts` lists the layouts that are *valid* for the model
   and GPU count (divisibility of heads, layers, batch, ...; capacity unbounded) — layouts
   that violate divisibility never become points;
3. each valid layout becomes one point per **offload policy** it needs: without memory
   expansion the workload's own memory options; with it (``memory.expansion_capacity > 0``)
   the fewest parts (optimizer state, activations) moved to the expansion memory that make
   the layout fit HBM and the expansion capacity — ``none`` when it fits as is. A layout
   that needs more offload than a fitting alternative is not simulated: for a fixed layout,
   offloading only adds transfers (same compute, same collectives), so it cannot be faster.
   When no policy fits, the layout still becomes one point — with the fewest parts that fit
   HBM (the expansion capacity is what fails), else with the most offload — whose evaluation
   fails with a :class:`~dessim.errors.MemoryFitError` recorded as the reason (by how much it
   does not fit; for HBM, which changes would fit).

Columns added to the table: ``layout`` (``tp2-pp4-dp2``, plus ``cpN``/``epN`` when > 1),
``workload.parallelism.tp|pp|dp|cp|ep``, ``offload`` (``none``, ``optimizer``,
``activations``, ``optimizer+activations``) and, when the workload does not set sequence
parallelism but some layouts are refused without it (TP with DeepEP's MoE dispatch; they get
it), ``workload.parallelism.sp``. An explicit ``sp: false`` is kept: those layouts are
refused, with the reason. Points are numbered in the order of the axes,
then of :func:`~dessim.workload.enumerate_layouts` (tp, pp, cp, ep), then of the policies.
"""

from __future__ import annotations

import json
import math
from itertools import combinations
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from dessim.errors import DessimError, SpecError
from dessim.sweep.memory import EXPANSION_TARGET, MemorySetup, memory_setup, offloaded_per_gpu
from dessim.sweep.axes import Point, point_key

__all__ = ["LAYOUT_KEYS", "OFFLOAD_PARTS", "Policy", "SP_COLUMN", "expand_layouts", "forced_sp_note",
           "layout_label", "policies_for"]

#: Layout fields that ``parallelism: auto`` sets (and that axes must therefore not set).
LAYOUT_KEYS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep")
#: What can be offloaded: policy part → MemoryOptions field.
OFFLOAD_PARTS: dict[str, str] = {"optimizer": "offload_optimizer", "activations": "offload_activations"}


@dataclass(frozen=True)
class Policy:
    """An offload policy: the parts moved to the expansion memory, and the memory options."""

    parts: frozenset[str]
    options: Any   #: dessim.workload.transformer.memory.MemoryOptions

    @property
    def label(self) -> str:
        return "+".join(p for p in OFFLOAD_PARTS if p in self.parts) or "none"


def layout_label(layout) -> str:
    """Short name of a layout for tables and plot legends: ``tp2-pp4-dp2`` (+ ``-cpN``, ``-epN``)."""
    extra = "".join(f"-{k}{getattr(layout, k)}" for k in ("cp", "ep") if getattr(layout, k) > 1)
    return f"tp{layout.tp}-pp{layout.pp}-dp{layout.dp}{extra}"


def policies_for(options, setup: MemorySetup) -> list[Policy]:
    """Offload policies to try, fewest parts first: the workload's own options alone without
    expansion; with it, every subset of the parts the options do not offload already."""
    if not setup.has_expansion:
        return [Policy(frozenset(), options)]
    free = [p for p, f in OFFLOAD_PARTS.items() if getattr(options, f) == "none"]
    subsets = [frozenset(c) for n in range(len(free) + 1) for c in combinations(free, n)]
    return [Policy(s, replace(options, **{OFFLOAD_PARTS[p]: EXPANSION_TARGET for p in s}))
            for s in subsets]


@dataclass(frozen=True)
class _Problem:
    """What the enumeration depends on (so equal problems are enumerated once)."""

    model: Any
    num_gpus: int
    hbm: float
    base: Any
    options: Any
    setup: MemorySetup
    sp_where_needed: bool = True    #: the workload leaves sp unset (explicit false: kept off)


def _problem(cfg: Mapping[str, Any], load_topology: Callable[[Any, MemorySetup], Any],
             where: str) -> _Problem:
    from dessim.catalog.devices import get_device
    from dessim.workload.common.placement import resolve_devices
    from dessim.workload.transformer.layout import ParallelLayout

    setup = memory_setup(cfg.get("memory"), f"{where}: memory")
    topo = load_topology(cfg["topology"], setup)
    overrides = setup.overrides(cfg.get("overrides"))
    overrides.pop("hbm_capacity", None)
    spec, rest = _resolve(cfg["workload"], overrides, topo.num_gpus)
    options = spec.memory_options(**dict(rest.get("memory") or {}))
    device = rest.get("device") or (cfg.get("engine") or {}).get("device")
    hbm = setup.hbm_capacity
    if hbm is None:
        devices = resolve_devices(topo, (device, spec.training.device), f"workload {spec.name!r}")
        hbm = min(get_device(d).hbm_capacity for d in set(devices))
    par, tr = spec.parallelism, spec.training
    if tr.global_batch is None:     # micro_batch × dp would change with every layout's dp
        raise NoGlobalBatch(f"workload {spec.name!r} gives no training.global_batch: layouts with "
                        "different dp need one fixed global batch (overrides: {training: "
                        "{global_batch: N}}; dessim explore --global-batch N)")
    base = ParallelLayout(pp=par.pp, sp=bool(par.sp), order=par.order, zero_stage=tr.zero_stage,
                          schedule=tr.schedule, virtual_stages=tr.virtual_stages,
                          micro_batch=tr.micro_batch, global_batch=tr.global_batch,
                          recompute=tr.recompute, moe_dispatch=tr.moe_dispatch)
    return _Problem(spec.model, topo.num_gpus, float(hbm), base, options, setup, par.sp is None)


#: Layout of one GPU: resolving the workload with it checks the model and batch without
#: tying them to the workload file's own layout (which the enumeration replaces).
class NoGlobalBatch(SpecError):
    """The workload leaves the global batch to micro_batch × dp, which differs between the
    layouts enumerated: a spec error of the whole sweep, not of one point."""


_NEUTRAL = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 1}


def _resolve(workload: Any, overrides: Mapping[str, Any], num_gpus: int):
    """(spec, remaining overrides) of the point's workload: first on one GPU (so that a
    file layout that does not suit this GPU count is no obstacle), else as the point says
    (an interleaved schedule needs its pp; the error then is the point's own)."""
    from dessim.workload.transformer.plan import resolve_workload

    given = dict(overrides.get("parallelism") or {})
    neutral = {**overrides, "parallelism": {**given, **_NEUTRAL}}
    try:
        spec, rest, _ = resolve_workload(workload, neutral)
    except DessimError:
        # a schedule that needs several stages (dualpipe: an even pp; interleaved): one GPU
        # per stage of the file's pipeline, the rest of its layout still neutral
        keep_pp = {**overrides, "parallelism": {**given, **{k: v for k, v in _NEUTRAL.items() if k != "pp"}}}
        try:
            spec, rest, _ = resolve_workload(workload, keep_pp)
        except DessimError:
            spec, rest, _ = resolve_workload(workload, overrides, num_gpus)
    return spec, rest


def _choices(problem: _Problem) -> list[tuple[Any, Policy]]:
    """(layout, policy) pairs of one problem (module doc, step 2-3)."""
    from dessim.workload import enumerate_layouts

    m, n, base = problem.model, problem.num_gpus, problem.base
    forced = problem.sp_where_needed
    valid = enumerate_layouts(m, n, math.inf, base=base, memory=problem.options, sp_where_needed=forced)
    policies = policies_for(problem.options, problem.setup)
    fits = {p.parts: set(enumerate_layouts(m, n, problem.hbm, base=base, memory=p.options, sp_where_needed=forced))
            for p in policies}
    out = []
    for layout in valid:
        in_hbm = [p for p in policies if layout in fits[p.parts]]
        ok = [p for p in in_hbm
              if not p.parts or offloaded_per_gpu(m, layout, p.options) <= problem.setup.expansion_capacity]
        # nothing fits: the first policy that fits HBM (its expansion capacity is what fails),
        # else the most offload — the recorded reason then names the binding constraint
        chosen = _minimal(ok) or _minimal(in_hbm)[:1] or policies[-1:]
        out.extend((layout, p) for p in chosen)
    return out


def _minimal(policies: list[Policy]) -> list[Policy]:
    """The policies no other of the list offloads a subset of."""
    return [p for p in policies if not any(q.parts < p.parts for q in policies)]


def expand_layouts(spec, points: list[Point], config: Callable[[Mapping[str, Any], Mapping[str, Any]], dict],
                   load_topology: Callable[[Any, MemorySetup], Any]) -> list[Point]:
    """The points of a ``parallelism: auto`` sweep (module doc). ``config(base, params)`` is
    the evaluator's point configuration, ``load_topology(spec, setup)`` the (cached) topology
    of a point with its memory expansion."""
    for path in spec.axis_paths:
        head, _, key = path.partition(".")
        if head == "workload" and key.startswith("parallelism.") and key.split(".")[1] in LAYOUT_KEYS:
            raise SpecError(f"{spec.source}: axes.{path}: parallelism: auto chooses "
                            f"{', '.join(LAYOUT_KEYS)}; remove this axis or 'parallelism: auto'")
    cache: dict[str, tuple[Any, bool, list[tuple[Any, Policy]]] | DessimError] = {}
    out: list[Point] = []
    for point in points:
        cfg = config(spec.base, point.config_params)
        key = json.dumps({k: cfg.get(k) for k in ("workload", "topology", "overrides", "memory", "engine")},
                         sort_keys=True, default=repr)
        if key not in cache:
            try:
                problem = _problem(cfg, load_topology, spec.source)
                cache[key] = (problem.model, problem.base.sp, _choices(problem))
            except NoGlobalBatch:
                raise
            except DessimError as exc:   # the point itself is invalid: evaluate it as is, so
                cache[key] = exc         # that it is recorded as failed with this reason
        choices = cache[key]
        if isinstance(choices, DessimError):
            out.append(Point(len(out), dict(point.params), point.key, dict(point.config_params)))
            continue
        model, base_sp, choices = choices
        # SP turned on where a layout needs it although the workload leaves it off: a column
        # says which layouts run with it (explore's note, :func:`forced_sp_note`)
        shown = (*LAYOUT_KEYS, "sp") if any(lo.sp for lo, _ in choices) and not base_sp \
            else LAYOUT_KEYS
        for layout, policy in choices:
            params = {**point.params, "layout": layout_label(layout),
                      **{f"workload.parallelism.{k}": getattr(layout, k) for k in shown},
                      "offload": policy.label}
            inputs = {**point.config_params,
                      **{f"workload.parallelism.{k}": getattr(layout, k) for k in (*LAYOUT_KEYS, "sp")},
                      **{f"workload.training.{k}": getattr(layout, k)
                         for k in ("micro_batch", "schedule", "virtual_stages")},
                      **{f"memory.{f}": getattr(policy.options, f) for f in OFFLOAD_PARTS.values()}}
            out.append(Point(len(out), params, point_key(spec.kind, spec.base, params), inputs,
                             cost=layout_cost(model, layout)))
    return out


#: Column of a ``parallelism: auto`` table whose workload leaves SP off while some of its
#: layouts need it: whether each layout ran with sequence parallelism.
SP_COLUMN = "workload.parallelism.sp"


def forced_sp_note(table) -> str | None:
    """One line for the layouts that run with sequence parallelism although the workload
    does not set it (:meth:`~dessim.workload.transformer.layout.ParallelLayout.needs_sequence_parallel`),
    None when there are none."""
    if SP_COLUMN not in table:
        return None
    on = table[table[SP_COLUMN] == True]   # noqa: E712 (a column of booleans and nulls)
    if not len(on):
        return None
    return (f"sequence parallelism: on in the {len(on)} layouts with tp > 1, which the workload does "
            "not set — tensor parallelism with DeepEP's MoE dispatch needs it (Megatron-core's MoE layer "
            "refuses TP without SP in training; sp: false keeps it off and refuses those layouts); "
            "column workload.parallelism.sp")


#: Tasks per layer and micro-batch that a layout's replay handles, roughly: the forward and
#: backward compute steps, and with tensor parallelism its collectives (with sequence
#: parallelism an all-gather and a reduce-scatter around attention and MLP in each pass).
_COMPUTE_STEPS, _TP_STEPS = 2, 4


def layout_cost(model: Any, layout: Any) -> float:
    """A rough estimate of the work of simulating ``layout``: the tasks of one pipeline
    (micro-batches × layers × steps per layer and micro-batch; a folded graph holds one rank
    per stage, so dp and the TP lanes do not multiply it). Only the order matters: a sweep
    starts its costliest points first, so that no worker is left with a long one at the end
    (results do not depend on it). Measured on ``dessim explore gpt3-13b --topology
    dgx-a100:nodes=4`` it puts the four layouts that take three quarters of the CPU time
    among its first five (docs/performance.md, step 20)."""
    steps = _COMPUTE_STEPS + (_TP_STEPS if layout.tp > 1 else 0)
    return float(layout.num_micro_batches * model.layers * steps)
