"""Workloads: models, parallel layouts, kernels, FLOPs and memory (the layer below the
task-graph generator).

* :mod:`~dessim.workload.model` — :class:`TransformerConfig` (dense and MoE) and parameter counts.
* :mod:`~dessim.workload.layout` — :class:`ParallelLayout`: validation, rank placement, groups.
* :mod:`~dessim.workload.kernels` — per-layer forward/backward kernels with FLOPs and bytes.
* :mod:`~dessim.workload.flops` — model/hardware FLOPs per iteration, closed forms, MFU.
* :mod:`~dessim.workload.memory` — per-GPU memory estimates and :func:`check_fit`.
* :mod:`~dessim.workload.spec` — YAML workload files and presets: :func:`load_workload`.

This package imports only from units, errors, resources and the standard library (no network,
collectives or engine). Everything is in SI units: bytes, FLOPs, seconds.
"""

from __future__ import annotations

from dessim.workload.flops import (
    closed_form_flops,
    hardware_flops_per_iteration,
    megatron_flops,
    mfu,
    model_flops_per_iteration,
    stage_flops,
)
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
from dessim.workload.spec import ParallelismSpec, TrainingSpec, WorkloadSpec, load_workload, shipped_workloads

__all__ = [
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
