"""Workloads: models, parallel layouts, kernels, FLOPs and memory (the layer below the
task-graph generator).

* :mod:`~dessim.workload.model` — :class:`TransformerConfig` (dense and MoE) and parameter counts.
* :mod:`~dessim.workload.layout` — :class:`ParallelLayout`: validation, rank placement, groups.
* :mod:`~dessim.workload.kernels` — per-layer forward/backward kernels with FLOPs and bytes.
* :mod:`~dessim.workload.flops` — model/hardware FLOPs per iteration, closed forms, MFU.
* :mod:`~dessim.workload.memory` — per-GPU memory estimates and :func:`check_fit`.
* :mod:`~dessim.workload.spec` — YAML workload files and presets: :func:`load_workload`.
* :mod:`~dessim.workload.schedules` — pipeline orderings (GPipe, 1F1B, interleaved 1F1B).
* :mod:`~dessim.workload.passes` — per-pass step templates (where TP/SP/EP/CP/ZeRO-3
  communication and offload go).
* :mod:`~dessim.workload.generator` — :func:`build_taskgraph`: the task graph of one iteration.
* :mod:`~dessim.workload.result` — :class:`WorkloadResult` and the measured pipeline bubble.
* :mod:`~dessim.workload.plan` — :func:`plan_workload` (overrides, validation, memory fit),
  :func:`enumerate_layouts`.
* :mod:`~dessim.workload.api` — :func:`simulate_workload`.

The model/layout/kernels/FLOPs/memory/spec modules import only from units, errors, resources
and the standard library; the generator, result and api modules also use the layers below
workload (catalog, topology, taskgraph, engine). Everything is in SI units: bytes, FLOPs, seconds.
"""

from __future__ import annotations

from dessim.workload.api import simulate_workload
from dessim.workload.flops import (
    closed_form_flops,
    hardware_flops_per_iteration,
    megatron_flops,
    mfu,
    model_flops_per_iteration,
    stage_flops,
)
from dessim.workload.generator import GeneratorOptions, WorkloadPlan, build_taskgraph, make_plan
from dessim.workload.kernels import Kernel, KernelSet, embedding_kernels, head_kernels, layer_kernels
from dessim.workload.layout import SCHEDULES, ParallelLayout, PipelineSchedule, RankCoords
from dessim.workload.memory import (
    MemoryEstimate,
    MemoryOptions,
    check_fit,
    estimate_memory,
    layer_activation_bytes,
    paper_activation_bytes,
    zero_state_bytes,
)
from dessim.workload.model import PRECISIONS, TransformerConfig
from dessim.workload.plan import enumerate_layouts, plan_workload
from dessim.workload.result import WorkloadResult, bubble_fraction
from dessim.workload.spec import ParallelismSpec, TrainingSpec, WorkloadSpec, load_workload, shipped_workloads

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
