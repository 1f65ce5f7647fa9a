"""A shared cluster over time: the cluster file with a ``scheduler:`` section and a trace of
job arrivals (:func:`load_job_trace`; simulated by :mod:`dessim.workload.sharedcluster`).

::

    kind: cluster
    name: dorm-trace
    topology: "leafspine:hosts=16,leaves=2,bw=25GB/s"    # any topology spec
    storage: {kind: pfs, bw: 20GB/s}                     # optional, as in a static cluster file
    engine: {network: flow}                              # optional EngineOptions
    scheduler:
      policy: dorm                 # fifo | fair | dorm (dessim.workload.schedulers.POLICIES)
      resize_overhead: 0s          # pause of a job whose partition is resized (seconds)
    jobs:
      - name: a                    # default job<i>
        workload: resnet50         # any kind: preset or workload file
        arrival: 0s                # when the job is submitted (default 0)
        gpus: 8                    # requested GPU count
        min_gpus: 4                # smallest partition it may run on (default gpus)
        max_gpus: 16               # largest (default gpus)
        iterations: 2000           # duration: training iterations ...
        # tokens: 2.0e9            # ... or tokens (converted with the job's tokens/iteration)
        overrides: {training: {global_batch: 512}}

A job's global batch stays fixed whatever its partition (strong scaling): its work is its
``iterations``, and its rate is one iteration per simulated iteration time on its current
partition next to the other running jobs. ``gpus`` is a count here (the scheduler places
jobs); the static form with rank lists is :mod:`dessim.workload.multijob`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dessim.errors import DessimError, SpecError
from dessim.resources import read_yaml
from dessim.units import parse_count, parse_time
from dessim.workload.common.document import check_keys
from dessim.workload.multijob import check_cluster_head, check_cluster_sections, resolve_workload
from dessim.workload.schedulers import POLICIES, Demand

__all__ = ["TraceJob", "Scheduler", "JobTrace", "parse_job_trace", "load_job_trace", "is_job_trace"]

_TOP = ("kind", "name", "description", "topology", "storage", "engine", "scheduler", "jobs")
_JOB = ("name", "workload", "arrival", "gpus", "min_gpus", "max_gpus", "iterations", "tokens", "overrides")
_SCHEDULER = ("policy", "resize_overhead")


@dataclass(frozen=True)
class TraceJob:
    """One submitted job (module docstring); seconds, GPU counts."""

    name: str
    workload: Any
    gpus: int
    arrival: float = 0.0
    min_gpus: int | None = None
    max_gpus: int | None = None
    iterations: int | None = None
    tokens: float | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def demand(self, current: int = 0) -> Demand:
        """The job as a policy sees it."""
        return Demand(self.name, self.gpus, self.min_gpus or self.gpus, self.max_gpus or self.gpus, current)


@dataclass(frozen=True)
class Scheduler:
    """The ``scheduler:`` section: the policy and the pause of a resize (seconds)."""

    policy: str = "fifo"
    resize_overhead: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SpecError(f"scheduler.policy: {self.policy!r} is unknown; valid: {', '.join(POLICIES)}")
        if not self.resize_overhead >= 0:
            raise SpecError(f"scheduler.resize_overhead: {self.resize_overhead!r} must be >= 0 seconds")


@dataclass(frozen=True)
class JobTrace:
    """A cluster with a scheduler and jobs arriving over time."""

    name: str
    topology: Any
    scheduler: Scheduler
    jobs: tuple[TraceJob, ...]
    engine: Mapping[str, Any] = field(default_factory=dict)
    storage: Mapping[str, Any] | None = None
    description: str = ""


def is_job_trace(data: Any) -> bool:
    """Whether a parsed cluster file is a trace over time (it has a ``scheduler:`` section)."""
    return isinstance(data, dict) and "scheduler" in data


def _job(item: Any, i: int, origin: str) -> TraceJob:
    where = f"{origin}: jobs[{i}]"
    check_keys(item, _JOB, where)
    for key in ("workload", "gpus"):
        if key not in item:
            raise SpecError(f"{where}: missing {key!r}")
    if ("iterations" in item) == ("tokens" in item):
        raise SpecError(f"{where}: give the duration as exactly one of 'iterations' or 'tokens'")
    name = str(item.get("name", f"job{i}"))
    try:
        gpus = parse_count(item["gpus"], f"{where}.gpus (a GPU count)", minimum=1)
        lo = parse_count(item.get("min_gpus", gpus), f"{where}.min_gpus", minimum=1)
        hi = parse_count(item.get("max_gpus", gpus), f"{where}.max_gpus", minimum=1)
        arrival = parse_time(item.get("arrival", 0), f"{where}.arrival")
        iterations = parse_count(item["iterations"], f"{where}.iterations", minimum=1) if "iterations" in item else None
    except DessimError as exc:
        raise SpecError(str(exc)) from None
    tokens = None
    if "tokens" in item:
        try:
            tokens = float(item["tokens"])
        except (TypeError, ValueError):
            raise SpecError(f"{where}.tokens: {item['tokens']!r} is not a number") from None
    if tokens is not None and not tokens > 0:
        raise SpecError(f"{where}.tokens: {tokens!r} must be > 0")
    if not lo <= gpus <= hi:
        raise SpecError(f"{where}: need min_gpus <= gpus <= max_gpus, got {lo} <= {gpus} <= {hi}")
    overrides = item.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise SpecError(f"{where}.overrides must be a mapping")
    return TraceJob(name, resolve_workload(item["workload"], origin), gpus, arrival, lo, hi, iterations, tokens,
                    overrides)


def parse_job_trace(data: Any, origin: str = "<cluster>") -> JobTrace:
    """A :class:`JobTrace` from a parsed cluster file with a ``scheduler:`` section."""
    check_cluster_head(data, _TOP, origin)
    sched = check_keys(data.get("scheduler") or {}, _SCHEDULER, f"{origin}: scheduler")
    try:
        scheduler = Scheduler(str(sched.get("policy", "fifo")),
                              parse_time(sched.get("resize_overhead", 0), f"{origin}: scheduler.resize_overhead"))
    except SpecError as exc:
        msg = str(exc)
        raise SpecError(msg if msg.startswith(origin) else f"{origin}: {msg}") from None
    raw = data.get("jobs")
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{origin}: 'jobs' must be a non-empty list of mappings with keys {', '.join(_JOB)}")
    jobs = tuple(_job(item, i, origin) for i, item in enumerate(raw))
    check_cluster_sections(data, [j.name for j in jobs], origin)
    return JobTrace(str(data.get("name", Path(origin).stem)), data["topology"], scheduler, jobs,
                    dict(data.get("engine") or {}), data.get("storage"), str(data.get("description", "")))


def load_job_trace(path: str | Path) -> JobTrace:
    """Load a cluster file with a ``scheduler:`` section."""
    return parse_job_trace(read_yaml(path, "cluster file"), str(path))
