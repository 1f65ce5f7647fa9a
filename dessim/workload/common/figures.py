"""The figures every workload kind's summary reports the same way: throughput and utilisation
of one simulated iteration (MFU and HFU: Chowdhery et al. 2022 / Korthikanti et al. 2022, as in
:mod:`dessim.workload.transformer.flops`) and communication not overlapped by compute.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from dessim.engine.intervals import length, subtract, union
from dessim.engine.result import SimulationResult
from dessim.taskgraph.model import TaskGraph

__all__ = ["IterationResult", "rate_figures", "closed_form_tp_by_rank", "closed_form_tp_exposed",
           "closed_form_share", "exposed_comm", "exposed_comm_total", "ITERATION_MARKS",
           "steady_iteration_s"]

#: Task-graph meta key of a graph holding several iterations: for each iteration, the ids of
#: the tasks whose end closes it (:func:`steady_iteration_s`).
ITERATION_MARKS = "iteration_marks"


class IterationResult:
    """What every workload kind's result has: the task graph it ran, the engine's result and
    the iteration time (the makespan, seconds). A base of the kinds' result dataclasses."""

    taskgraph: TaskGraph
    simulation: SimulationResult

    @property
    def iteration_s(self) -> float:
        return self.simulation.makespan_s


def rate_figures(iteration_s: float, samples: float, tokens_per_sample: float,
                 model_flops: float, hardware_flops: float, gpus: int,
                 peak_flops: float) -> dict[str, float]:
    """Throughput and utilisation of one iteration, shared by every workload kind.

    ``samples`` per iteration (the global batch), ``model_flops``/``hardware_flops`` per
    iteration for the whole cluster, ``peak_flops`` the summed dense peak of all GPUs (FLOP/s).
    MFU = model FLOP/s / peak; HFU counts recomputation too. Zero when the iteration is empty.
    """
    def rate(x: float) -> float:
        return x / iteration_s if iteration_s > 0 else 0.0

    return {
        "iteration_s": iteration_s,
        "tokens_per_s": rate(samples * tokens_per_sample),
        "samples_per_s": rate(samples),
        "model_flops": model_flops,
        "hardware_flops": hardware_flops,
        "model_tflops_per_gpu": rate(model_flops) / gpus / 1e12,
        "hardware_tflops_per_gpu": rate(hardware_flops) / gpus / 1e12,
        "mfu": rate(model_flops) / peak_flops if peak_flops else 0.0,
        "hfu": rate(hardware_flops) / peak_flops if peak_flops else 0.0,
    }


def closed_form_tp_by_rank(sim: SimulationResult, graph: TaskGraph,
                           ranks: Collection[int] | None = None) -> dict[int, float]:
    """Exposed TP communication timed in closed form (:mod:`dessim.workload.transformer.tp_islands`)
    per rank of ``ranks`` (default: every rank with such time), seconds: ``delay`` tasks of
    category ``tp`` not overlapped by the rank's compute tasks, plus ``attrs["tp_exposed_s"]``
    of merged stage tasks. The engine counts delays and merged tasks as compute, so this time
    is in its ``compute_s`` and invisible to its per-category accounting. ``graph`` is the
    graph ``sim`` ran (a cluster's merged graph for its jobs)."""
    delays: dict[int, list[tuple[float, float]]] = {}
    compute: dict[int, list[tuple[float, float]]] = {}
    out: dict[int, float] = {}
    merged = bool(graph.meta.get("stage_merged"))
    for rec in sim.span_records:
        rank, _stream, tid, _name, kind, category, start, _active, end = rec[:9]
        if ranks is not None and rank not in ranks:
            continue
        if kind == "delay" and category == "tp" and end > start:
            delays.setdefault(rank, []).append((start, end))
        elif kind == "compute":
            compute.setdefault(rank, []).append((start, end))
            if merged:
                inside = float(graph.task(tid).attrs.get("tp_exposed_s", 0.0))
                if inside:
                    out[rank] = out.get(rank, 0.0) + inside
    for r, iv in delays.items():
        out[r] = out.get(r, 0.0) + length(subtract(union(iv), union(compute.get(r, []))))
    return out


def closed_form_tp_exposed(sim: SimulationResult, graph: TaskGraph,
                           ranks: Collection[int] | None = None) -> float:
    """:func:`closed_form_tp_by_rank` as a mean over ``ranks`` (default: every rank of
    ``sim``)."""
    per_rank = closed_form_tp_by_rank(sim, graph, ranks)
    return sum(per_rank.values()) / ((len(sim.ranks) if ranks is None else len(ranks)) or 1)


def exposed_comm(sim: SimulationResult, graph: TaskGraph, ranks: Sequence[int] | None = None,
                 categories: Sequence[str] = ()) -> dict[str, float]:
    """Communication time not overlapped by compute, per category, mean over ``ranks``
    (default: every rank of ``sim``): the engine's per-rank accounting plus the TP time timed
    in closed form (:func:`closed_form_tp_exposed`). Every workload kind's summary and each
    job of a cluster (:mod:`dessim.workload.multijob`) report this figure; ``categories`` are
    listed even when nothing is exposed in them."""
    selected = sim.ranks if ranks is None else [sim.ranks[r] for r in ranks]
    n = len(selected) or 1
    out = {c: 0.0 for c in categories}
    for r in selected:
        for cat, v in r.exposed_by_category.items():
            out[cat] = out.get(cat, 0.0) + v / n
    if graph.meta.get("tp_closed_form_groups"):
        out["tp"] = out.get("tp", 0.0) + closed_form_tp_exposed(
            sim, graph, None if ranks is None else frozenset(ranks))
    return out


def closed_form_share(sim: SimulationResult, exposed: Mapping[str, float]) -> float:
    """Of ``exposed`` (:func:`exposed_comm` over every rank of ``sim``), the TP seconds timed
    in closed form, mean per rank: time the engine ran as compute tasks (delays, merged
    stage tasks), so it is in the ranks' ``compute_s`` and not in their ``exposed_comm_s``."""
    n = len(sim.ranks) or 1
    return exposed.get("tp", 0.0) - sum(r.exposed_by_category.get("tp", 0.0) / n for r in sim.ranks)


def exposed_comm_total(sim: SimulationResult, exposed: Mapping[str, float]) -> float:
    """Seconds per rank in which communication of any category is exposed (mean over every
    rank of ``sim``): the union of the categories' exposed intervals (the engine's
    ``exposed_comm_s``) plus the closed-form TP time (:func:`closed_form_share`). Categories
    exposed at the same time (an expert all-to-all beside a data-parallel all-reduce) count
    once, so the total can be less than the sum of ``exposed``, and compute plus the total
    never exceeds the iteration."""
    n = len(sim.ranks) or 1
    return sum(r.exposed_comm_s / n for r in sim.ranks) + closed_form_share(sim, exposed)


def steady_iteration_s(sim: SimulationResult, graph: TaskGraph, prefix: str = "") -> float | None:
    """Seconds per iteration in the steady state of a graph holding ``K ≥ 2`` iterations
    (``graph.meta[ITERATION_MARKS]``): ``(T_K − T_1) / (K − 1)``, ``T_k`` the latest end of
    iteration ``k``'s marked tasks — the first iteration, which overlaps nothing before it, is
    left out. ``prefix``: prepended to the marked ids (a job's ``<job>/`` in a merged
    cluster graph). None for a graph without marks."""
    marks = graph.meta.get(ITERATION_MARKS)
    if not marks:
        return None
    end = {rec[2]: rec[8] for rec in sim.span_records}
    times = [max(end[prefix + t] for t in ids) for ids in marks]
    if len(times) < 2:
        return times[0]
    return (times[-1] - times[0]) / (len(times) - 1)
