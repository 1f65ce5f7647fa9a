"""The outcome of simulating one iteration of a DLRM or CNN/ViT workload.

:meth:`DPResult.summary` has the keys of the transformer's
:meth:`~dessim.workload.transformer.result.WorkloadResult.summary` that apply (so ``dessim simulate`` and
sweeps read both alike) plus ``kind`` and ``details`` (kind-specific figures):

* ``iteration_s``, ``samples_per_s = global_batch / iteration_s``; ``tokens_per_s`` =
  samples/s × tokens per sample (ViT: patches + class token; 0 where tokens do not apply);
* ``model_flops`` (forward + backward GEMM/attention FLOPs of the iteration, as counted by the
  kernel lists), ``model_tflops_per_gpu``, ``mfu`` against the dense peak at the precision;
  ``hardware_flops`` adds every other kernel's FLOPs (compression, element-wise);
* ``exposed_comm_s`` by category (``dp``, ``a2a``, ``offload``, ``io``) and
  ``compute_s``: the engine's per-rank accounting, mean over ranks;
* ``gpu_busy_fraction`` = compute time / iteration time (mean over ranks): an I/O-bound or
  communication-bound job shows idle GPUs here and in the timeline;
* ``memory_per_gpu_bytes`` by category with ``total`` (largest rank).
* ``calibration``: the name of the calibration the run used (as the transformer's).

A graph of several iterations (parameter servers, :mod:`~dessim.workload.dataparallel.paramserver`)
reports the steady-state iteration time and every other figure per iteration (totals / iterations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dessim.catalog.devices import get_device
from dessim.engine.result import SimulationResult
from dessim.taskgraph.model import TaskGraph
from dessim.workload.common.figures import (IterationResult, exposed_comm, exposed_comm_total, rank_exposure,
                                            rate_figures)

__all__ = ["DPResult", "Generated"]


@dataclass
class DPResult(IterationResult):
    """One simulated iteration of a non-transformer workload."""

    kind: str
    name: str
    taskgraph: TaskGraph
    simulation: SimulationResult
    devices: tuple[str, ...]
    precision: str
    global_batch: int
    layout: dict[str, Any]
    memory: dict[str, float]
    tokens_per_sample: int = 0
    bucket_size: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    #: iterations the graph holds (parameter servers simulate several to reach steady state)
    iterations: int = 1
    #: steady-state seconds per iteration when ``iterations > 1`` (None: the makespan)
    steady_iteration_s: float | None = None

    @property
    def iteration_s(self) -> float:
        """Seconds per iteration: the makespan, or the steady state of a multi-iteration graph."""
        return self.simulation.makespan_s if self.steady_iteration_s is None else self.steady_iteration_s

    def summary(self) -> dict[str, Any]:
        sim, it = self.simulation, self.iteration_s
        n = len(sim.ranks) or 1
        k = self.iterations          # graph totals -> per iteration
        gpus = len(self.devices)
        f_model = sum(float(t.attrs.get("model_flops", 0.0)) for t in self.taskgraph if t.kind == "compute") / k
        f_hw = sum(t.flops for t in self.taskgraph if t.kind == "compute") / k
        peak = sum(get_device(d).peak_flops(self.precision) for d in self.devices)
        per_rank = rank_exposure(sim, self.taskgraph)
        per_graph = exposed_comm(sim, self.taskgraph, per_rank=per_rank)
        exposed = {c: v / k for c, v in per_graph.items()}
        compute = sum(r.compute_s for r in sim.ranks) / n / k
        return {
            "workload": self.name,
            "kind": self.kind,
            "gpus": gpus,
            "device": ",".join(sorted(set(self.devices))),
            **rate_figures(it, self.global_batch, self.tokens_per_sample, f_model, f_hw, gpus, peak),
            "bubble_fraction": 0.0,
            "exposed_comm_s": dict(sorted(exposed.items())),
            "exposed_comm_total_s": exposed_comm_total(sim, self.taskgraph, per_rank) / k,
            "compute_s": compute,
            "gpu_busy_fraction": compute / it if it > 0 else 0.0,
            "memory_per_gpu_bytes": dict(self.memory),
            "memory_capacity_bytes": min(get_device(d).hbm_capacity for d in set(self.devices)),
            "memory_stage": 0,
            "layout": dict(self.layout),
            "calibration": self.simulation.meta.get("collectives", {}).get("calibration"),
            "collectives": {**sim.collectives(), "closed_form": {}},
            "granularity": "layer",
            "comm": True,
            "bucket_size": self.bucket_size,
            "details": self.details,
            "tasks": len(self.taskgraph),
            "events": sim.events,
            "wall_s": sim.wall_s,
        }


@dataclass
class Generated:
    """A generated task graph waiting for its simulation: ``finish(sim)`` wraps the engine's
    result into the kind's result object (:class:`DPResult` or the transformer's
    :class:`~dessim.workload.transformer.result.WorkloadResult`). ``topology`` is the one the graph was
    generated for (with any storage tier the workload attached)."""

    name: str
    graph: TaskGraph
    topology: Any
    finish: Any            #: Callable[[SimulationResult], result]
    #: the options to simulate the graph with when the kind fixed some while generating it
    #: (a trace replay applies a forced algorithm per collective); None: the caller's
    options: Any = None
