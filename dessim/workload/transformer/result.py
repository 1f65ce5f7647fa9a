"""The outcome of simulating one training iteration: :class:`WorkloadResult`.

Figures (SI units; FLOPs per iteration from :mod:`dessim.workload.transformer.flops`):

* ``iteration_s`` — the simulated makespan of the iteration's task graph.
* ``tokens_per_s = global_batch · seq_len / iteration_s``; ``samples_per_s = global_batch / iteration_s``.
* ``model_tflops_per_gpu = F_model / (iteration_s · gpus) / 1e12`` with ``F_model`` the
  model FLOPs of Megatron-LM's formula (72·B·s·l·h²·(1 + s/6h + V/12lh) for GPT models,
  generalised to GQA/SwiGLU/MoE: :func:`~dessim.workload.transformer.flops.model_flops_per_iteration`,
  "Megatron-LM FLOPs" in docs/references.md); ``hardware_tflops_per_gpu`` the same with
  recomputation (:func:`~dessim.workload.transformer.flops.hardware_flops_per_iteration`: the
  96·B·s·l·h²·(...) form of Narayanan et al. 2021, Eq. 3, under full recomputation).
* ``mfu = F_model / (iteration_s · Σ_ranks dense peak)`` (the peak at the model's precision,
  :mod:`dessim.catalog.devices`); ``hfu`` likewise with hardware FLOPs. ``precision`` is that
  model precision (bf16, fp16, fp8, fp8-block, fp32).
* ``bubble_fraction`` — see :func:`bubble_fraction`.
* ``exposed_comm_s`` — per category (tp, dp, pp, ep, cp, offload): communication time not
  overlapped by any compute of the rank, mean over ranks. ``exposed_comm_total_s`` — the
  time in which communication of any category is exposed: categories exposed at once count
  once, so it can be less than their sum.
* ``compute_s`` — compute time per rank, mean over ranks. TP collectives timed in closed
  form (delays, merged stage tasks: :mod:`dessim.workload.transformer.tp_islands`) run as
  compute tasks in the engine; these three figures count that time as TP communication and
  measure every category's exposure against the compute that remains, so the shortcut
  reports the exact replay's figures (:func:`~dessim.workload.common.figures.rank_exposure`).
* ``overlap`` — ``tp_comm_overlap`` and ``fuse_optimizer_allreduce`` of the run
  (:mod:`dessim.workload.transformer.overlap`).
* ``memory_per_gpu_bytes`` — the memory estimate of the worst pipeline stage by category
  (:meth:`~dessim.workload.transformer.memory.MemoryEstimate.breakdown`), with ``total``.
* ``collectives`` — the run's collective ``settings`` and, per group category, the collective
  runs per ``algorithm/protocol`` that ``auto`` (NCCL's tuner) chose or the settings forced
  (``chosen``), and the choices of collectives timed in closed form (``closed_form``).
* ``approximations`` — what the run models only approximately, one sentence each (the task
  graph's ``meta["approximations"]``; e.g. DeepEP's pipelined all-to-all phases); empty
  when none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dessim.engine.intervals import length, union
from dessim.engine.result import SimulationResult
from dessim.taskgraph.model import TaskGraph
from dessim.workload.common.figures import (IterationResult, compute_time, exposed_comm,
                                            exposed_comm_total, rank_exposure, rate_figures)
from dessim.workload.transformer.flops import hardware_flops_per_iteration, model_flops_per_iteration
from dessim.workload.transformer.generator import COMM_CATEGORIES, WorkloadPlan

__all__ = ["WorkloadResult", "bubble_fraction", "bubble_figures", "BubbleFigures", "PIPELINE_WORK", "STAGE_COMM", "SHORTCUT_NAMES", "layout_summary"]

#: Compute categories that are pipeline-stage work.
PIPELINE_WORK: tuple[str, ...] = ("fwd", "bwd", "wgrad", "recompute")
#: Communication inside a stage's passes (counted as work, not bubble, while active).
STAGE_COMM: tuple[str, ...] = ("tp", "ep", "cp")
#: The shortcuts for reports: key of :meth:`WorkloadResult.shortcuts` (true, non-zero or
#: present when the run took it; exact) or, for ``extrapolation``, of the summary (present
#: when the figures were extrapolated: :mod:`dessim.workload.transformer.steady`) → name.
SHORTCUT_NAMES: dict[str, str] = {"stage_merged": "stage tasks",
                                  "tp_closed_form_groups": "closed-form TP",
                                  "folded": "replica folding",
                                  "merged_image_runs": "merged images",
                                  "lane_family_runs": "lane families",
                                  "channel_quotient": "channel quotient",
                                  "collective_memo": "collective memo",
                                  "extrapolation": "micro-batch extrapolation"}


@dataclass(frozen=True)
class BubbleFigures:
    """What :func:`bubble_fraction` is made of: ``busy_s``, the working time inside the
    pipeline window summed over ranks; ``window_s``, the window's length (seconds); ``ranks``
    the ranks averaged over (0: no pipeline work, fraction 0)."""

    busy_s: float
    window_s: float
    ranks: int

    @property
    def fraction(self) -> float:
        """``1 − busy / (ranks · window)``, at least 0 (0 when there is no window)."""
        if not self.ranks or self.window_s <= 0:
            return 0.0
        return max(0.0, 1.0 - self.busy_s / (self.ranks * self.window_s))


def layout_summary(plan: WorkloadPlan) -> dict[str, Any]:
    """The ``layout`` entry of a summary: the plan's parallel layout and batch (JSON-ready)."""
    lo, model = plan.layout, plan.model
    return {
        "tp": lo.tp, "pp": lo.pp, "dp": lo.dp, "cp": lo.cp, "ep": lo.ep,
        **({"etp": lo.expert_tp} if lo.separate_expert_tp else {}),
        "sp": lo.sequence_parallel, "zero_stage": lo.zero_stage, "schedule": lo.schedule,
        "virtual_stages": lo.virtual_stages,
        "pipeline_layers": list(lo.layer_counts(model.layers)), "micro_batch": lo.micro_batch,
        "global_batch": lo.global_batch, "num_micro_batches": lo.num_micro_batches,
        "recompute": lo.recompute, "attention": lo.attention, "order": "-".join(lo.order),
        "describe": lo.describe(),
    }


def bubble_fraction(sim: SimulationResult) -> float:
    """Pipeline bubble measured on the simulated timeline (:func:`bubble_figures`).

    Let ``W`` be the pipeline window: from the earliest start to the latest end of any
    forward/backward/recomputation compute task over all ranks (the optimizer step and the
    gradient reduction after the last backward are outside it). A rank is *working* while it
    runs such a compute task or while one of its intra-stage collectives/transfers (TP, EP,
    CP) is moving data. The bubble fraction is the mean over ranks of the time in ``W`` when
    the rank is not working, divided by ``|W|``; it includes waiting for pipeline neighbours
    and exposed pipeline transfers. With free communication and identical stages it is
    ``(p-1)/(m+p-1)`` for GPipe and 1F1B and ``(p-1)/(v·m+p-1)`` for interleaved 1F1B
    (GPipe (Huang et al. 2019), Narayanan et al. 2021 §2.2 in docs/references.md); 0 without
    pipelining when nothing else idles the GPU.
    """
    return bubble_figures(sim).fraction


def bubble_figures(sim: SimulationResult) -> BubbleFigures:
    """The working time and the window of :func:`bubble_fraction`, each affine in the
    micro-batch count in a pipeline's steady state (:mod:`dessim.workload.transformer.steady`)."""
    per_rank: dict[int, list[tuple[float, float]]] = {}
    lo, hi = float("inf"), float("-inf")
    for rec in sim.span_records:      # (rank, stream, id, name, kind, category, start, active, end, ...)
        category = rec[5]
        if rec[4] == "compute" and category in PIPELINE_WORK:
            start, end = rec[6], rec[8]
            per_rank.setdefault(rec[0], []).append((start, end))
            lo, hi = min(lo, start), max(hi, end)
        elif category in STAGE_COMM and rec[8] > rec[7]:   # incl. closed-form TP delays
            per_rank.setdefault(rec[0], []).append((rec[7], rec[8]))
    window = hi - lo
    if not per_rank or window <= 0:
        return BubbleFigures(0.0, 0.0, 0)
    ranks = len(sim.ranks) or len(per_rank)
    busy = 0.0
    for spans in per_rank.values():
        # (max(a, lo), min(b, hi)) as max and min choose, without their calls
        clipped = [(lo if lo > a else a, hi if hi < b else b) for a, b in spans if b > lo and a < hi]
        busy += length(union(clipped))
    return BubbleFigures(busy, window, ranks)


@dataclass
class WorkloadResult(IterationResult):
    """One simulated training iteration: the plan, the task graph and the engine result."""

    plan: WorkloadPlan
    taskgraph: TaskGraph
    simulation: SimulationResult

    def groups_summary(self, shown: int = 2) -> dict[str, dict[str, Any]]:
        """Rank groups per kind: how many, their size, and the first ``shown`` groups."""
        out = {}
        lo = self.plan.layout
        for kind in ("tp", "cp", "dp", "pp", "ep") + (("etp",) if lo.separate_expert_tp else ()):
            gs = lo.groups(kind)
            out[kind] = {"count": len(gs), "size": len(gs[0]), "first": [list(g) for g in gs[:shown]]}
        return out

    def shortcuts(self) -> dict[str, Any]:
        """Which exact shortcuts this run took (issue 17): ``auto`` lists the generator options
        chosen automatically; ``stage_merged`` whether passes were merged into stage tasks;
        ``tp_closed_form_groups`` TP groups timed in closed form; ``folded`` whether replicas
        were folded; ``merged_image_runs`` how many folded collectives ran their images as
        one schedule (0 when none did); ``lane_family_runs`` how many folded transfers and
        collectives ran on one lane for all (:mod:`dessim.network.families`; 0 when none
        did), ``lane_orbit_runs`` how many of those kept one transfer per orbit of a symmetry
        (0 when none did); ``channel_quotient`` the channels those flows crossed and the
        blocks of channels no route tells apart that the rate solves saw instead
        (:mod:`dessim.network.quotient`; None when off); ``collective_memo`` how many exclusive collectives the engine simulated once and
        replayed (None when it did not apply); ``refused`` the reasons a shortcut was
        refused."""
        meta = self.taskgraph.meta
        fold = self.simulation.meta.get("fold") or {}
        refused = list(meta.get("closed_form_fallback", []))
        if meta.get("fold_fallback"):
            refused.append(f"folding: {meta['fold_fallback']}")
        if meta.get("extrapolation_fallback"):
            refused.append(f"micro-batch extrapolation: {meta['extrapolation_fallback']}")
        if fold.get("lane_rank_rotations_refused"):
            refused.append(f"lane orbits rotating GPUs inside hosts: "
                           f"{fold['lane_rank_rotations_refused']}")
        if fold.get("lane_orbits_refused"):
            refused.append(f"lane orbits: {fold['lane_orbits_refused']}")
        if fold.get("lane_families_refused"):
            refused.append(f"lane families: {fold['lane_families_refused']}")
        return {"auto": list(self.plan.options.auto),
                "stage_merged": bool(meta.get("stage_merged", False)),
                "tp_closed_form_groups": int(meta.get("tp_closed_form_groups", 0)),
                "folded": self.taskgraph.fold is not None,
                "merged_image_runs": int(fold.get("merged_image_runs", 0)),
                "lane_family_runs": int(fold.get("lane_family_runs", 0)),
                "lane_orbit_runs": int(fold.get("lane_orbit_runs", 0)),
                "channel_quotient": fold.get("channel_quotient"),
                "collective_memo": self.simulation.meta.get("collective_memo"),
                "refused": refused}

    def collectives(self) -> dict[str, Any]:
        """:meth:`SimulationResult.collectives` of the run, with ``closed_form``: per group
        category, the ``algorithm/protocol`` of the collectives timed in closed form (isolated
        TP islands, :mod:`~dessim.workload.transformer.tp_islands`; not counted as runs)."""
        out = self.simulation.collectives()
        closed = self.taskgraph.meta.get("tp_closed_form_chosen")
        out["closed_form"] = {"tp": list(closed)} if closed else {}
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready headline figures (module docstring)."""
        plan, lo, model = self.plan, self.plan.layout, self.plan.model
        it = self.iteration_s
        gpus = plan.num_gpus
        gb = lo.global_batch
        f_model = model_flops_per_iteration(model, gb)
        f_hw = hardware_flops_per_iteration(model, gb, lo.recompute)
        peak = plan.peak_flops()
        sim = self.simulation
        per_rank = rank_exposure(sim, self.taskgraph)       # one pass over the spans for three figures
        exposed = exposed_comm(sim, self.taskgraph, categories=COMM_CATEGORIES, per_rank=per_rank)
        return {
            "workload": plan.name,
            "gpus": gpus,
            "device": ",".join(sorted(set(plan.devices))),
            **rate_figures(it, gb, model.seq_len, f_model, f_hw, gpus, peak),
            "bubble_fraction": bubble_fraction(sim),
            "exposed_comm_s": exposed,
            "exposed_comm_total_s": exposed_comm_total(sim, self.taskgraph, per_rank),
            "compute_s": compute_time(sim, self.taskgraph, per_rank),
            "memory_per_gpu_bytes": dict(plan.estimate.breakdown()),
            "memory_capacity_bytes": plan.capacity_bytes,
            "memory_stage": plan.estimate.stage,
            "layout": layout_summary(plan),
            "precision": model.precision,
            "grad_precision": model.precision_spec.grad_dtype,
            "overlap": {"tp_comm_overlap": plan.overlap.tp_comm_overlap,
                        "fuse_optimizer_allreduce": plan.overlap.fuse_optimizer_allreduce},
            "groups": self.groups_summary(),
            "calibration": sim.meta.get("collectives", {}).get("calibration"),
            "collectives": self.collectives(),
            "granularity": plan.options.granularity,
            "shortcuts": self.shortcuts(),
            "approximations": list(self.taskgraph.meta.get("approximations", [])),
            "comm": plan.options.comm,
            "bucket_size": plan.bucket_size,
            "tasks": len(self.taskgraph),
            "fold": sim.meta.get("fold"),
            "fold_fallback": self.taskgraph.meta.get("fold_fallback"),
            "stream_rings": sim.meta.get("stream_rings"),
            "events": sim.events,
            "wall_s": sim.wall_s,
        }
