"""Vision workloads (``kind: cnn``): ResNet-50 or a ViT trained data-parallel over every GPU.

File schema (the shared sections are in :mod:`dessim.workload.dataparallel.spec`)::

    kind: cnn
    model:
      arch: resnet50            # *required*: resnet50 | vit-b16 | vit-l16 (cnn_models.ARCHS)
      image_size: 224
      classes: 1000
      precision: bf16           # bf16 | fp16 | fp8 | fp32 (dessim.workload.common.precision.PRECISIONS)

One iteration on every rank (:mod:`dessim.workload.dataparallel.graph`): the input reads
(:mod:`dessim.workload.dataparallel.io`), for each micro-batch the forward and backward of every layer
(:mod:`dessim.workload.vision.cnn_models`), the last backward's gradients all-reduced in DDP buckets
(optionally compressed, :mod:`dessim.workload.dataparallel.compression`) overlapping the backward, then
the optimizer step. With ``training.gradient_sync: parameter_server`` the buckets are pushed to
and pulled from parameter servers instead, over several iterations
(:mod:`dessim.workload.dataparallel.paramserver`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pydantic import Field

from dessim.catalog.calibration import Calibration
from dessim.errors import MemoryFitError
from dessim.catalog.devices import get_device
from dessim.topology.graph import Topology
from dessim.schema import PositiveCount, SpecModel, choice, validate
from dessim.units import format_size
from dessim.workload.vision.cnn_models import ARCHS, total_params
from dessim.workload.dataparallel.compression import GradSync
from dessim.workload.dataparallel.graph import emit_backward, emit_forward, emit_training, memory_breakdown
from dessim.workload.dataparallel.paramserver import iteration_figures
from dessim.workload.dataparallel.result import DPResult, Generated
from dessim.workload.dataparallel.spec import (CommonSpec, DPFile, apply_overrides, dp_sync, parse_common,
                                               sync_details)
from dessim.workload.common.emitter import TaskEmitter
from dessim.workload.common.placement import resolve_devices
from dessim.workload.common.precision import PRECISIONS

__all__ = ["CNNSpec", "CNNFile", "parse_cnn", "generate_cnn"]



class CNNModelSection(SpecModel):
    """``model:`` of a CNN / ViT file."""

    arch: choice(ARCHS)
    image_size: PositiveCount = Field(224, description="pixels per side")
    classes: PositiveCount = 1000
    precision: choice(PRECISIONS) = "bf16"


class CNNFile(DPFile):
    """A ``kind: cnn`` workload file."""

    kind: Literal["cnn"]
    model: CNNModelSection


@dataclass(frozen=True)
class CNNSpec:
    """A parsed ``kind: cnn`` file."""

    common: CommonSpec
    arch: str
    image_size: int = 224
    classes: int = 1000
    precision: str = "bf16"

    @property
    def name(self) -> str:
        return self.common.name


def parse_cnn(data: Any, origin: str, default_name: str) -> CNNSpec:
    """A :class:`CNNSpec` from a parsed YAML document (validated by :class:`CNNFile`); errors
    name ``origin``."""
    doc = validate(CNNFile, data, origin)
    common = parse_common(doc, data, origin, default_name)
    m = doc.model
    return CNNSpec(common, m.arch, m.image_size, m.classes, m.precision)


#: The document sections an override may set (besides the shared training, compression, input).
OVERRIDE_SECTIONS: tuple[str, ...] = ("model",)


def generate_cnn(spec: CNNSpec, topology: Topology, overrides: Mapping[str, Any] | None = None,
                 device: str | None = None, calibration: Calibration | None = None) -> Generated:
    """The task graph of one iteration of ``spec`` on ``topology`` (module docstring)."""
    W = topology.num_gpus
    doc, flags = apply_overrides(spec.common, overrides, OVERRIDE_SECTIONS, W)
    spec = parse_cnn(doc, f"workload {spec.name!r}", spec.name)
    c = spec.common
    where = f"workload {spec.name!r}"
    if c.input is not None:
        topology = c.input.prepare(topology)
    devices = resolve_devices(topology, (device, c.training.device), where)
    precision = PRECISIONS[spec.precision]
    mb, steps = c.training.per_gpu(W, where)
    layers = ARCHS[spec.arch](mb, precision, spec.image_size, spec.classes)
    params = total_params(layers)
    if c.training.ps is not None:
        topology = c.training.ps.prepare(topology)
    memory = memory_breakdown(params, precision, layers, c.training.bucket_size,
                              servers=c.training.ps is not None)
    capacity = min(get_device(d).hbm_capacity for d in set(devices))
    if flags.check_memory and memory["total"] > capacity:
        raise MemoryFitError(f"{where}: {format_size(memory['total'])} per GPU do not fit in "
                             f"{format_size(capacity)} of HBM; lower training.micro_batch ({mb})")
    em = TaskEmitter(f"{spec.name} dp={W}", topology, devices, spec.precision,
                     meta={"workload": spec.name, "kind": "cnn", "generator": "dessim.workload.vision.cnn"},
                     calibration=calibration)
    group = tuple(range(W))
    sync = GradSync({r: group for r in range(W)}, precision.grad_bytes, c.compression)
    hit = c.input.effective_hit_ratio(topology) if c.input else 0.0
    ps = dp_sync(c, em, precision, W, where)

    def iteration(rank: int, start: list[str], extra: dict[str, list[str]]) -> str:
        reads = c.input.emit(em, rank, mb * steps, hit) if c.input else []
        waits = [] if (c.input is None or c.input.prefetch) else reads
        last = ""
        for step in range(steps):
            first = step == 0
            last = emit_forward(em, rank, layers, [last] + (waits + start if first else []), step,
                                extra_deps=extra if first else None)
            final = step == steps - 1
            last = emit_backward(em, rank, layers, [last], step, (ps or sync) if final else None,
                                 c.training.bucket_size)
        return last

    emit_training(em, W, layers, params, precision, c.training.bucket_size, ps, iteration)
    tokens = (spec.image_size // 16) ** 2 + 1 if spec.arch.startswith("vit") else 0
    details = {"arch": spec.arch, "params": params, "micro_batch": mb, "micro_batches": steps,
               "compression": c.compression.method, **sync_details(c.training),
               "input_hit_ratio": hit if c.input else None,
               "input_bytes_per_gpu": mb * steps * c.input.sample_bytes if c.input else 0.0}
    layout = {"dp": W, "micro_batch": mb, "global_batch": c.training.global_batch,
              "num_micro_batches": steps, "describe": f"dp={W} micro_batch={mb} x{steps} ({spec.arch})"}

    def finish(sim):
        return DPResult("cnn", spec.name, em.graph, sim, devices, spec.precision, c.training.global_batch,
                        layout, memory, tokens, c.training.bucket_size, details,
                        *iteration_figures(ps, sim, em.graph))

    return Generated(spec.name, em.graph, topology, finish)
