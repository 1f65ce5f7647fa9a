"""The figures every workload kind's summary reports the same way: throughput and utilisation
of one simulated iteration (MFU and HFU: Chowdhery et al. 2022 / Korthikanti et al. 2022, as in
:mod:`dessim.workload.transformer.flops`) and communication not overlapped by compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from dessim.engine.intervals import length, subtract, union
from dessim.engine.result import SimulationResult
from dessim.taskgraph.model import COMM_KINDS, TaskGraph

__all__ = ["IterationResult", "rate_figures", "Exposure", "rank_exposure", "closed_form_tp_by_rank",
           "exposed_comm", "exposed_comm_total", "compute_time", "ITERATION_MARKS",
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


@dataclass(frozen=True)
class Exposure:
    """One rank's time as the exact replay counts it (seconds): ``compute_s`` its compute,
    ``by_category`` its communication not overlapped by compute per category, ``total_s``
    the time in which communication of any category is exposed (kinds exposed at once count
    once), ``closed_form_tp_s`` the part of ``by_category["tp"]`` timed in closed form."""

    compute_s: float
    by_category: dict[str, float]
    total_s: float
    closed_form_tp_s: float = 0.0


def rank_exposure(sim: SimulationResult, graph: TaskGraph,
                  ranks: Collection[int] | None = None) -> dict[int, Exposure]:
    """Per rank of ``ranks`` (default: every rank of ``sim``), its :class:`Exposure`.

    Without TP collectives timed in closed form (:mod:`dessim.workload.transformer.tp_islands`)
    these are the engine's own figures. With them, the engine ran that TP time as compute —
    ``delay`` tasks of category ``tp``, and the TP time inside merged stage tasks
    (``attrs["tp_exposed_iv"]``: the intervals, from the task's start, in which the pass
    computes nothing) — so its compute covered communication the exact replay shows
    exposed: a pipeline send during a closed-form all-reduce was counted hidden. Here the
    compute is the rank's compute tasks without the merged passes' gaps, the closed-form TP
    time (delays and gaps) is TP communication, and every category's exposure is measured
    against that compute: the exact replay's figures (the same intervals, to float rounding
    of the offsets). ``graph`` is the graph ``sim`` ran
    (a cluster's merged graph for its jobs)."""
    wanted = None if ranks is None else set(ranks)
    if not graph.meta.get("tp_closed_form_groups"):
        return {r.rank: Exposure(r.compute_s, dict(r.exposed_by_category), r.exposed_comm_s)
                for r in sim.ranks if wanted is None or r.rank in wanted}
    compute: dict[int, list[tuple[float, float]]] = {}
    closed: dict[int, list[tuple[float, float]]] = {}
    comm: dict[int, dict[str, list[tuple[float, float]]]] = {}
    merged = bool(graph.meta.get("stage_merged"))       # only merged passes carry gaps
    for rec in sim.span_records:
        rank, _stream, tid, _name, kind, category, start, active, end = rec[:9]
        if wanted is not None and rank not in wanted:
            continue
        if kind in COMM_KINDS:
            comm.setdefault(rank, {}).setdefault(category or kind, []).append((active, end))
        elif kind == "delay" and category == "tp":
            if end > start:
                closed.setdefault(rank, []).append((start, end))
        else:
            gaps = graph.task(tid).attrs.get("tp_exposed_iv") if merged and kind == "compute" else None
            if gaps:                      # a merged pass: its kernels run outside its gaps
                gaps = [(start + a, start + b) for a, b in gaps]
                closed.setdefault(rank, []).extend(gaps)
                compute.setdefault(rank, []).extend(subtract([(start, end)], gaps))
            else:
                compute.setdefault(rank, []).append((start, end))
    out: dict[int, Exposure] = {}
    for r in sim.ranks:
        if wanted is not None and r.rank not in wanted:
            continue
        work = union(compute.get(r.rank, []))
        kinds = comm.get(r.rank, {})
        by_cat = {c: length(subtract(union(iv), work)) for c, iv in sorted(kinds.items())}
        tp_closed = union(closed.get(r.rank, []))
        closed_s = length(subtract(tp_closed, work))
        if closed_s:
            by_cat["tp"] = by_cat.get("tp", 0.0) + closed_s
        every = [iv for ivs in kinds.values() for iv in ivs] + tp_closed
        out[r.rank] = Exposure(length(work), by_cat, length(subtract(union(every), work)), closed_s)
    return out


def closed_form_tp_by_rank(sim: SimulationResult, graph: TaskGraph,
                           ranks: Collection[int] | None = None) -> dict[int, float]:
    """Exposed TP communication timed in closed form per rank of ``ranks`` (default: every
    rank with such time), seconds (:func:`rank_exposure`): time the engine counted as compute,
    which a training run's energy charges as communication."""
    return {r: e.closed_form_tp_s for r, e in rank_exposure(sim, graph, ranks).items()
            if e.closed_form_tp_s}


def exposed_comm(sim: SimulationResult, graph: TaskGraph, ranks: Sequence[int] | None = None,
                 categories: Sequence[str] = (), per_rank: Mapping[int, Exposure] | None = None
                 ) -> dict[str, float]:
    """Communication time not overlapped by compute, per category, mean over ``ranks``
    (default: every rank of ``sim``), as the exact replay counts it (:func:`rank_exposure`;
    ``per_rank``: its result for those ranks, when the caller has it). Every workload kind's
    summary and each job of a cluster (:mod:`dessim.workload.multijob`) report this figure;
    ``categories`` are listed even when nothing is exposed in them."""
    if per_rank is None:
        per_rank = rank_exposure(sim, graph, ranks)
    n = len(per_rank) or 1
    out = {c: 0.0 for c in categories}
    for e in per_rank.values():
        for cat, v in e.by_category.items():
            out[cat] = out.get(cat, 0.0) + v / n
    return out


def exposed_comm_total(sim: SimulationResult, graph: TaskGraph,
                       per_rank: Mapping[int, Exposure] | None = None) -> float:
    """Seconds per rank in which communication of any category is exposed (mean over every
    rank of ``sim``; :func:`rank_exposure`, or ``per_rank`` its result). Categories exposed
    at the same time (an expert all-to-all beside a data-parallel all-reduce) count once, so
    the total can be less than the sum of :func:`exposed_comm`, and compute plus the total
    never exceeds the iteration."""
    if per_rank is None:
        per_rank = rank_exposure(sim, graph)
    return sum(e.total_s for e in per_rank.values()) / (len(per_rank) or 1)


def compute_time(sim: SimulationResult, graph: TaskGraph,
                 per_rank: Mapping[int, Exposure] | None = None) -> float:
    """Compute seconds per rank, mean over every rank of ``sim``, as the exact replay counts
    them: TP time timed in closed form is communication (:func:`rank_exposure`, or
    ``per_rank`` its result)."""
    if per_rank is None:
        per_rank = rank_exposure(sim, graph)
    return sum(e.compute_s for e in per_rank.values()) / (len(per_rank) or 1)


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
