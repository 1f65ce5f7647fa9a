"""A shared cluster over time: jobs arrive, a scheduler partitions the GPUs, jobs run on their
partitions and slow each other down on shared links (:func:`simulate_job_trace`).

How
    An event loop over arrivals and completions. At every event the policy
    (:mod:`dessim.workload.schedulers`) gives each active job a GPU count and :func:`place`
    turns counts into ranks. Each *distinct* set of running jobs (workload, overrides and
    ranks of each) is simulated once with :func:`~dessim.workload.multijob.simulate_cluster`
    — one iteration of every job, started together, sharing the network max-min fairly — and
    memoised; a job's iteration time on that set is its rate until the next event (a fluid
    model: progress in iterations, fractions carried over). A job whose partition is resized
    pauses for ``resize_overhead`` seconds. Each job is also simulated alone on its requested
    GPU count (ranks ``0..gpus−1``), which gives its *alone* completion time and, for
    ``tokens`` durations, its tokens per iteration.

Assumption: interference measured on one co-started iteration holds for the whole time the
set runs (the steady state of jobs whose phases drift relative to each other is not
simulated); start-up, data loading and checkpointing are not modelled beyond ``resize_overhead``.

Figures (:meth:`SharedClusterResult.summary`; seconds)

* per job: arrival, start (first GPUs), finish, ``jct_s = finish − arrival``, ``queue_s =
  start − arrival``, ``alone_jct_s = iterations × alone iteration time``, ``slowdown =
  jct_s / alone_jct_s`` (< 1: the job ran faster than alone on its request, e.g. expanded),
  GPU-seconds, mean GPUs while running, resizes;
* ``makespan_s``: last finish − first arrival;
* ``utilization``: GPU-seconds allocated / (GPUs × makespan);
* ``fairness_loss``: time average over the makespan of ``Σ_i |a_i − f_i| / (2·G)``, ``a_i`` the
  GPUs job ``i`` holds and ``f_i`` its max-min fair share of the ``G`` GPUs among the active jobs
  (demands ``max_gpus``; :func:`~dessim.workload.schedulers.fair_shares`): 0 when every
  active job holds its fair share, at most 1. Dorm (Sun et al. 2017) reports a fairness loss
  of this kind (deviation of the jobs' shares from their fair shares); its exact normalisation
  is ours.
* ``simulations``: distinct running sets this run needed (plus the alone runs), each simulated
  once (fewer were simulated when a shared ``memo`` already held some).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from dessim.engine import EngineOptions
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.topology.graph import Topology
from dessim.workload.jobtrace import JobTrace, TraceJob, load_job_trace
from dessim.workload.kinds import simulate_any
from dessim.workload.multijob import ClusterSpec, JobSpec, cluster_topology, job_view, simulate_cluster
from dessim.workload.schedulers import POLICIES, fair_shares, place

__all__ = ["JobOutcome", "Segment", "SharedClusterResult", "simulate_job_trace", "JOB_COLUMNS"]

#: Columns of the per-job table (:meth:`SharedClusterResult.job_table`), units in the names.
JOB_COLUMNS: tuple[str, ...] = ("name", "workload", "gpus_requested", "arrival_s", "start_s", "finish_s",
                                "queue_s", "jct_s", "alone_jct_s", "slowdown", "iterations",
                                "alone_iteration_s", "gpu_seconds", "mean_gpus", "resizes")
_EPS = 1e-12


@dataclass
class JobOutcome:
    """One job's course through the cluster (seconds, GPU counts)."""

    name: str
    workload: str
    gpus_requested: int
    arrival_s: float
    iterations: int
    alone_iteration_s: float
    start_s: float = math.nan
    finish_s: float = math.nan
    gpu_seconds: float = 0.0
    resizes: int = 0

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def alone_jct_s(self) -> float:
        return self.iterations * self.alone_iteration_s

    @property
    def slowdown(self) -> float:
        return self.jct_s / self.alone_jct_s if self.alone_jct_s > 0 else 1.0

    def summary(self) -> dict[str, Any]:
        run = self.finish_s - self.start_s
        values = {"name": self.name, "workload": self.workload, "gpus_requested": self.gpus_requested,
                  "arrival_s": self.arrival_s, "start_s": self.start_s, "finish_s": self.finish_s,
                  "queue_s": self.queue_s, "jct_s": self.jct_s, "alone_jct_s": self.alone_jct_s,
                  "slowdown": self.slowdown, "iterations": self.iterations,
                  "alone_iteration_s": self.alone_iteration_s, "gpu_seconds": self.gpu_seconds,
                  "mean_gpus": self.gpu_seconds / run if run > 0 else 0.0, "resizes": self.resizes}
        return {k: values[k] for k in JOB_COLUMNS}


@dataclass(frozen=True)
class Segment:
    """The interval between two events: each running job's GPU count and iteration time (s)."""

    start_s: float
    end_s: float
    gpus: dict[str, int]
    iteration_s: dict[str, float]


#: Keys of :meth:`SharedClusterResult.summary` (sweeps check metric names against them before
#: running; tests/test_sharedcluster.py checks they are the summary's keys).
SUMMARY_KEYS: tuple[str, ...] = (
    "cluster", "topology", "gpus", "policy", "resize_overhead_s", "makespan_s", "utilization",
    "fairness_loss", "mean_slowdown", "max_slowdown", "mean_jct_s", "simulations", "jobs",
    "allocations")


@dataclass
class SharedClusterResult:
    """Every job's outcome, the allocation timeline and the cluster figures (module docstring)."""

    name: str
    topology: Topology
    policy: str
    resize_overhead_s: float
    jobs: list[JobOutcome]
    segments: list[Segment]
    fairness_loss: float
    simulations: int

    @property
    def makespan_s(self) -> float:
        return max(j.finish_s for j in self.jobs) - min(j.arrival_s for j in self.jobs)

    @property
    def utilization(self) -> float:
        span = self.makespan_s
        used = sum(j.gpu_seconds for j in self.jobs)
        return used / (self.topology.num_gpus * span) if span > 0 else 0.0

    def job_table(self) -> Any:
        """One row per job (:data:`JOB_COLUMNS`) as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([j.summary() for j in self.jobs], columns=list(JOB_COLUMNS))

    def summary(self) -> dict[str, Any]:
        slow = [j.slowdown for j in self.jobs]
        return {"cluster": self.name, "topology": self.topology.name, "gpus": self.topology.num_gpus,
                "policy": self.policy, "resize_overhead_s": self.resize_overhead_s,
                "makespan_s": self.makespan_s, "utilization": self.utilization,
                "fairness_loss": self.fairness_loss, "mean_slowdown": sum(slow) / len(slow),
                "max_slowdown": max(slow), "mean_jct_s": sum(j.jct_s for j in self.jobs) / len(self.jobs),
                "simulations": self.simulations, "jobs": [j.summary() for j in self.jobs],
                "allocations": [{"start_s": g.start_s, "end_s": g.end_s, "gpus": dict(g.gpus),
                                 "iteration_s": dict(g.iteration_s)} for g in self.segments]}


def _workload_name(job: TraceJob) -> str:
    w = job.workload
    return str(w) if isinstance(w, (str, Path)) else str(getattr(w, "name", repr(w)))


def _workload_key(job: TraceJob) -> str:
    """What makes two jobs simulate alike: workload and overrides."""
    return json.dumps([_workload_name(job), job.overrides], sort_keys=True, default=repr)


class _Rates:
    """Iteration times of running sets and of jobs alone, each simulated once."""

    def __init__(self, trace: JobTrace, topo: Topology, options: EngineOptions,
                 memo: dict[Any, Any] | None = None) -> None:
        self.trace, self.topo, self.options = trace, topo, options
        # one store per cluster and engine settings, shareable between runs (other policies)
        store = memo if memo is not None else {}
        where = (topo.name, topo.num_gpus, topo.graph.number_of_edges(), repr(options))
        self.sets: dict[tuple, dict[int, float]] = store.setdefault(("sets", where), {})
        self.alone: dict[tuple[str, int], tuple[float, float]] = store.setdefault(("alone", where), {})
        self.used: set[Any] = set()

    def shared(self, jobs: Mapping[str, TraceJob], ranks: Mapping[str, tuple[int, ...]]) -> dict[str, float]:
        """Iteration time (s) of every running job next to the others."""
        names = sorted(ranks, key=lambda n: ranks[n])
        key = tuple((_workload_key(jobs[n]), ranks[n]) for n in names)
        self.used.add(key)
        got = self.sets.get(key)
        if got is None:
            spec = ClusterSpec(self.trace.name, self.topo, tuple(
                JobSpec(n, jobs[n].workload, ranks[n], jobs[n].overrides) for n in names),
                self.trace.engine, None)
            try:
                res = simulate_cluster(spec, topology=self.topo, options=self.options, alone=False)
            except DessimError as exc:
                raise type(exc)(f"{exc} (running {', '.join(f'{n} on {len(ranks[n])} GPUs' for n in names)})") \
                    from None
            got = {i: j.shared_s for i, j in enumerate(res.jobs)}
            self.sets[key] = got
        return {n: got[i] for i, n in enumerate(names)}

    def alone_figures(self, job: TraceJob) -> tuple[float, float]:
        """(iteration s, tokens per iteration) of ``job`` alone on ranks 0..gpus−1."""
        key = (_workload_key(job), job.gpus)
        self.used.add(key)
        got = self.alone.get(key)
        if got is None:
            view = job_view(self.topo, range(job.gpus), job.name)
            overrides = {**job.overrides, "fold": False} if "fold" not in job.overrides else dict(job.overrides)
            try:
                s = simulate_any(job.workload, view, overrides=overrides, options=self.options).summary()
            except DessimError as exc:
                raise type(exc)(f"cluster {self.trace.name!r}: job {job.name!r}: {exc}") from None
            got = (s["iteration_s"], s["tokens_per_s"] * s["iteration_s"])
            self.alone[key] = got
        return got


def _iterations(job: TraceJob, tokens_per_iteration: float, where: str) -> int:
    if job.iterations is not None:
        return job.iterations
    if tokens_per_iteration <= 0:
        raise WorkloadError(f"{where}: job {job.name!r} gives tokens, but its workload has no tokens per "
                            "iteration (give iterations)")
    return max(1, math.ceil(job.tokens / tokens_per_iteration - 1e-9))  # type: ignore[operator]


def _fairness_term(active: list[TraceJob], alloc: Mapping[str, int], total: int) -> float:
    """``Σ |a_i − f_i| / (2G)`` at one moment (module docstring)."""
    if not active:
        return 0.0
    shares = fair_shares([j.max_gpus or j.gpus for j in active], total)
    return sum(abs(alloc.get(j.name, 0) - f) for j, f in zip(active, shares)) / (2 * total)


def simulate_job_trace(trace: JobTrace | str | Path, *, topology: Topology | str | None = None,
                       options: EngineOptions | None = None, policy: str | None = None,
                       resize_overhead: float | None = None,
                       memo: dict[Any, Any] | None = None) -> SharedClusterResult:
    """Run the jobs of ``trace`` through its scheduler (module docstring); ``topology``,
    ``options``, ``policy`` and ``resize_overhead`` (seconds) replace the file's. ``memo``: a
    dict kept between calls so that runs of the same cluster (e.g. under other policies)
    simulate each running set only once."""
    spec = trace if isinstance(trace, JobTrace) else load_job_trace(trace)
    if policy is not None or resize_overhead is not None:
        spec = replace(spec, scheduler=replace(spec.scheduler, **{k: v for k, v in (
            ("policy", policy), ("resize_overhead", resize_overhead)) if v is not None}))
    where = f"cluster {spec.name!r}"
    if options is None:
        options = EngineOptions.of(spec.engine, where, record_links=False)
    topo = cluster_topology(topology if topology is not None else spec.topology, spec.storage, options, where)
    G = topo.num_gpus
    for j in spec.jobs:
        if j.gpus > G or (j.min_gpus or j.gpus) > G:
            raise SpecError(f"{where}: job {j.name!r} asks for {j.gpus} GPUs (min {j.min_gpus}) but the cluster "
                            f"has {G}")
    rule = POLICIES[spec.scheduler.policy]
    rates = _Rates(spec, topo, options, memo)
    order = sorted(range(len(spec.jobs)), key=lambda i: (spec.jobs[i].arrival, i))
    jobs = {spec.jobs[i].name: spec.jobs[i] for i in order}
    outcomes: dict[str, JobOutcome] = {}
    for name, j in jobs.items():
        it_s, tokens = rates.alone_figures(j)
        outcomes[name] = JobOutcome(name, _workload_name(j), j.gpus, j.arrival,
                                    _iterations(j, tokens, where), it_s)
    pending = list(jobs)                       # not yet arrived, in arrival order
    active: list[str] = []                     # arrived, unfinished, in arrival order
    remaining = {n: float(outcomes[n].iterations) for n in jobs}
    paused_until: dict[str, float] = {}
    ranks: dict[str, tuple[int, ...]] = {}
    segments: list[Segment] = []
    fairness = 0.0
    now = jobs[pending[0]].arrival
    start = now
    while pending or active:
        while pending and jobs[pending[0]].arrival <= now + _EPS:
            active.append(pending.pop(0))
        counts = rule([jobs[n].demand(len(ranks.get(n, ()))) for n in active], G)
        new = place(ranks, counts, G)
        for n, r in new.items():
            out = outcomes[n]
            if math.isnan(out.start_s):
                out.start_s = now
            elif len(r) != len(ranks.get(n, ())):
                out.resizes += 1
                paused_until[n] = now + spec.scheduler.resize_overhead
        ranks = new
        times = rates.shared(jobs, ranks) if ranks else {}
        finish = {n: max(now, paused_until.get(n, now)) + remaining[n] * times[n] for n in ranks}
        nxt = min([*finish.values(), *(jobs[p].arrival for p in pending[:1])], default=math.inf)
        if nxt == math.inf:
            raise SpecError(f"{where}: jobs {', '.join(active)} can never run under policy "
                            f"{spec.scheduler.policy!r} (not enough GPUs)")
        dt = nxt - now
        alloc = {n: len(r) for n, r in ranks.items()}
        segments.append(Segment(now, nxt, alloc, dict(times)))
        fairness += dt * _fairness_term([jobs[n] for n in active], alloc, G)
        for n, r in ranks.items():
            outcomes[n].gpu_seconds += dt * len(r)
            running = nxt - max(now, paused_until.get(n, now))
            if running > 0:
                remaining[n] -= running / times[n]
        now = nxt
        for n in list(ranks):
            if finish[n] <= now + _EPS * max(1.0, now) or remaining[n] <= 1e-9:
                outcomes[n].finish_s = now
                active.remove(n)
                del ranks[n]
    span = now - start
    result = SharedClusterResult(spec.name, topo, spec.scheduler.policy, spec.scheduler.resize_overhead,
                                 [outcomes[n] for n in jobs], segments, fairness / span if span > 0 else 0.0,
                                 len(rates.used))
    return result
