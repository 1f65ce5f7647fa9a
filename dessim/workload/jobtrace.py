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

from pydantic import Field

from dessim.errors import SpecError
from dessim.resources import read_yaml
from dessim.schema import PositiveCount, SpecModel, Text, Time, choice, converted, tagged, validate
from dessim.workload.multijob import (ClusterFile, ClusterHead, JobWorkload, check_cluster_sections,
                                     resolve_workload)
from dessim.workload.schedulers import POLICIES, Demand

__all__ = ["TraceJob", "Scheduler", "JobTrace", "JobTraceFile", "ClusterDocument", "parse_job_trace",
           "load_job_trace", "is_job_trace"]



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


def _tokens(value: Any, what: str) -> float:
    try:
        tokens = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{what}: {value!r} is not a number") from None
    if isinstance(value, bool) or not tokens > 0:
        raise SpecError(f"{what}: {value!r} must be > 0")
    return tokens


class SchedulerSection(SpecModel):
    """``scheduler:``: the policy and the pause of a resize."""

    policy: choice(POLICIES) = "fifo"
    resize_overhead: Time = Field(0.0, description="seconds a job pauses when resized")


class TraceJobSection(SpecModel):
    """One submitted job of a job trace (module docstring)."""

    name: Text | None = Field(None, description="default: job<index>")
    workload: JobWorkload
    arrival: Time = Field(0.0, description="seconds after the start")
    gpus: PositiveCount = Field(description="GPUs asked for")
    min_gpus: PositiveCount | None = Field(None, description="elastic lower bound (default: gpus)")
    max_gpus: PositiveCount | None = Field(None, description="elastic upper bound (default: gpus)")
    iterations: PositiveCount | None = Field(None, description="duration in iterations (or tokens)")
    tokens: converted(_tokens, {"type": "number", "exclusiveMinimum": 0}, float) | None = Field(
        None, description="duration in tokens (or iterations)")
    overrides: dict[str, Any] = Field({}, description="shaped like the workload file's sections")


class JobTraceFile(ClusterHead):
    """A cluster file with a ``scheduler:`` and jobs arriving over time."""

    scheduler: SchedulerSection
    jobs: list[TraceJobSection] = Field(min_length=1)


#: A cluster file of either form (``scheduler:`` makes it a trace): what ``dessim schema
#: cluster`` exports. Loading validates a file with its own form's model.
ClusterDocument = tagged({"jobs": ClusterFile, "trace": JobTraceFile},
                         lambda doc: "trace" if is_job_trace(doc) else "jobs", "a cluster file")


def _job(item: TraceJobSection, i: int, origin: str) -> TraceJob:
    where = f"{origin}: jobs[{i}]"
    if (item.iterations is None) == (item.tokens is None):
        raise SpecError(f"{where}: give the duration as exactly one of 'iterations' or 'tokens'")
    lo, hi = item.min_gpus or item.gpus, item.max_gpus or item.gpus
    if not lo <= item.gpus <= hi:
        raise SpecError(f"{where}: need min_gpus <= gpus <= max_gpus, got {lo} <= {item.gpus} <= {hi}")
    return TraceJob(item.name or f"job{i}", resolve_workload(item.workload, origin), item.gpus, item.arrival,
                    lo, hi, item.iterations, item.tokens, item.overrides)


def parse_job_trace(data: Any, origin: str = "<cluster>") -> JobTrace:
    """A :class:`JobTrace` from a parsed cluster file with a ``scheduler:`` section (validated
    by :class:`JobTraceFile`)."""
    doc = validate(JobTraceFile, data, origin)
    scheduler = Scheduler(doc.scheduler.policy, doc.scheduler.resize_overhead)
    jobs = tuple(_job(item, i, origin) for i, item in enumerate(doc.jobs))
    check_cluster_sections(doc, [j.name for j in jobs], origin)
    return JobTrace(doc.name or Path(origin).stem, doc.topology, scheduler, jobs, doc.engine,
                    doc.storage.kwargs() if doc.storage else None, doc.description)


def load_job_trace(path: str | Path) -> JobTrace:
    """Load a cluster file with a ``scheduler:`` section."""
    return parse_job_trace(read_yaml(path, "cluster file"), str(path))
