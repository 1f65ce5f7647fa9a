"""Workloads: what one training iteration of a model computes and communicates, as a task
graph for the engine — one subpackage per domain, this module and :mod:`~dessim.workload.api`
as the front.

* :mod:`~dessim.workload.transformer` — dense and MoE transformers with TP/PP/DP/CP/EP and
  ZeRO: model, layout, kernels, FLOPs, memory, workload files, planning, pipeline schedules,
  pass templates, the task-graph generator and :class:`WorkloadResult`;
* :mod:`~dessim.workload.recsys` — DLRM (``kind: dlrm``): sharded embedding tables and MLPs;
* :mod:`~dessim.workload.vision` — ResNet-50 and ViTs (``kind: cnn``);
* :mod:`~dessim.workload.dataparallel` — what recsys and vision share: data-parallel passes
  over a layer stack, gradient compression, the input pipeline, their file sections and
  :class:`~dessim.workload.dataparallel.result.DPResult`;
* :mod:`~dessim.workload.common` — what every kind uses: precisions, kernels and their
  timing, task emission, gradient buckets, device placement, workload documents, rates;
* :mod:`~dessim.workload.kinds` — the registry of kinds (a file's ``kind:`` key);
  :mod:`~dessim.workload.api` — :func:`simulate_workload` for any kind;
  :mod:`~dessim.workload.multijob` — several jobs of any kind on one cluster;
  :mod:`~dessim.workload.jobtrace`, :mod:`~dessim.workload.schedulers` and
  :mod:`~dessim.workload.sharedcluster` — jobs arriving over time under a scheduler.

Imports go one way: common ← dataparallel ← {recsys, vision}; common ← transformer ← vision
(a ViT is built from transformer layers); kinds, api, multijob and the shared-cluster
modules above them all
(tests/test_import_cycles.py). Everything is in SI units: bytes, FLOPs, seconds.
"""

from __future__ import annotations

from dessim.workload.api import simulate_workload
from dessim.workload.common.kernels import Kernel, KernelSet
from dessim.workload.common.precision import PRECISIONS
from dessim.workload.transformer.flops import (
    closed_form_flops,
    hardware_flops_per_iteration,
    megatron_flops,
    mfu,
    model_flops_per_iteration,
    stage_flops,
)
from dessim.workload.transformer.generator import GeneratorOptions, WorkloadPlan, build_taskgraph, make_plan
from dessim.workload.transformer.kernels import embedding_kernels, head_kernels, layer_kernels
from dessim.workload.transformer.layout import SCHEDULES, ParallelLayout, PipelineSchedule, RankCoords
from dessim.workload.transformer.memory import (
    MemoryEstimate,
    MemoryOptions,
    check_fit,
    estimate_memory,
    layer_activation_bytes,
    paper_activation_bytes,
    zero_state_bytes,
)
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.plan import enumerate_layouts, plan_workload
from dessim.workload.transformer.result import WorkloadResult, bubble_fraction
from dessim.workload.transformer.spec import ParallelismSpec, TrainingSpec, WorkloadSpec, load_workload, shipped_workloads

__all__ = [
    "GeneratorOptions",
    "WorkloadPlan",
    "WorkloadResult",
    "build_taskgraph",
    "bubble_fraction",
    "enumerate_layouts",
    "make_plan",
    "plan_workload",
    "simulate_workload",
    "PRECISIONS",
    "SCHEDULES",
    "Kernel",
    "KernelSet",
    "MemoryEstimate",
    "MemoryOptions",
    "ParallelLayout",
    "ParallelismSpec",
    "PipelineSchedule",
    "RankCoords",
    "TrainingSpec",
    "TransformerConfig",
    "WorkloadSpec",
    "check_fit",
    "closed_form_flops",
    "embedding_kernels",
    "estimate_memory",
    "hardware_flops_per_iteration",
    "head_kernels",
    "layer_activation_bytes",
    "layer_kernels",
    "load_workload",
    "megatron_flops",
    "mfu",
    "model_flops_per_iteration",
    "paper_activation_bytes",
    "shipped_workloads",
    "stage_flops",
    "zero_state_bytes",
]
