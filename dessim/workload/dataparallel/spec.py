"""The sections every non-transformer workload file shares, and how overrides reach them.

A file of kind ``dlrm`` or ``cnn`` (:mod:`dessim.workload.kinds`) has, besides its
``model:`` (and DLRM's ``embeddings:``) section::

    kind: cnn                      # required for these kinds
    name: resnet50                 # default: the file name
    description: "..."
    source: "..."
    training:
      global_batch: 1024           # *required*: samples per iteration
      micro_batch: 64              # samples per GPU per step (default global_batch / GPUs)
      bucket_size: 25MiB           # DDP gradient bucket (0: one all-reduce after the backward)
      device: H100                 # GPU model when the topology names none
    compression: {method: topk, density: 0.01}      # dessim.workload.dataparallel.compression
    input: {sample_bytes: 110KB, cache: host, ...}   # dessim.workload.dataparallel.io

Data parallelism spans every GPU of the topology. Overrides (``simulate_workload``'s mapping
or ``dessim simulate`` flags): sections shaped like the file (merged, then the document is
parsed again — same validation and units), flat ``global_batch``, ``micro_batch``,
``bucket_size``, ``device``; ``dp`` must equal the GPU count; the transformer generator's
flags are accepted only at values that change nothing here (``granularity: layer`` or
``auto``, ``comm: true``, ``embedding_head: true``, ``fold`` null or false);
``check_memory``. Anything else is a
:class:`~dessim.errors.WorkloadError` naming the key.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dessim.errors import SpecError, WorkloadError
from dessim.workload.dataparallel.compression import Compression, parse_compression
from dessim.workload.dataparallel.io import InputPipeline, parse_input
from dessim.workload.common.gradsync import DEFAULT_BUCKET_SIZE
from dessim.units import parse_count, parse_size
from dessim.workload.common.document import as_str, check_section, merge_document

__all__ = ["DPTraining", "CommonSpec", "parse_common", "apply_overrides", "RunFlags", "COMMON_KEYS"]

#: Top-level keys every non-transformer file may have (its own sections come in addition).
COMMON_KEYS: tuple[str, ...] = ("kind", "name", "description", "source", "training", "compression", "input")


def _positive(value: Any, what: str) -> int:
    return parse_count(value, what, minimum=1)


_TRAINING_SCHEMA = {"global_batch": _positive, "micro_batch": _positive,
                    "bucket_size": lambda v, what: parse_size(v, what), "device": as_str}
_FLAT = {"global_batch": "training", "micro_batch": "training", "bucket_size": "training",
         "device": "training"}
#: Transformer-generator flags and the only value they may take here.
_FIXED = {"granularity": ("layer", "auto"), "comm": (True,), "embedding_head": (True,),
          "fold": (None, False)}


@dataclass(frozen=True)
class DPTraining:
    """The ``training:`` section (bytes, samples)."""

    global_batch: int
    micro_batch: int | None = None
    bucket_size: int = DEFAULT_BUCKET_SIZE
    device: str | None = None

    def per_gpu(self, gpus: int, where: str) -> tuple[int, int]:
        """(micro-batch, micro-batches per iteration) on ``gpus`` data-parallel GPUs."""
        if self.global_batch % gpus:
            raise WorkloadError(f"{where}: global_batch {self.global_batch} is not divisible by the "
                                f"{gpus} data-parallel GPUs")
        local = self.global_batch // gpus
        mb = self.micro_batch or local
        if local % mb:
            raise WorkloadError(f"{where}: {local} samples per GPU (global_batch {self.global_batch} / "
                                f"{gpus} GPUs) are not divisible by micro_batch {mb}")
        return mb, local // mb


@dataclass(frozen=True)
class CommonSpec:
    """The shared sections of a file, plus the raw document (for overrides)."""

    kind: str
    name: str
    training: DPTraining
    compression: Compression
    input: InputPipeline | None
    document: Mapping[str, Any]
    description: str = ""
    source: str = ""
    path: Path | None = None


def parse_common(data: Any, origin: str, default_name: str, own_keys: tuple[str, ...]) -> CommonSpec:
    """The shared sections of ``data`` (keys checked against COMMON_KEYS + ``own_keys``)."""
    valid = COMMON_KEYS + own_keys
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: a workload file must be a mapping with keys {', '.join(valid)}")
    for key in data:
        if key not in valid:
            raise SpecError(f"{origin}: unknown key {key!r}; valid keys: {', '.join(valid)}")
    tr = check_section(data.get("training"), _TRAINING_SCHEMA, f"{origin}: training")
    if "global_batch" not in tr:
        raise SpecError(f"{origin}: training section lacks global_batch")
    return CommonSpec(
        kind=as_str(data.get("kind"), f"{origin}: kind"),
        name=as_str(data.get("name", default_name), f"{origin}: name"),
        training=DPTraining(**tr),
        compression=parse_compression(data.get("compression"), f"{origin}: compression"),
        input=parse_input(data.get("input"), f"{origin}: input"),
        document=copy.deepcopy(data),
        description=as_str(data.get("description", ""), f"{origin}: description"),
        source=as_str(data.get("source", ""), f"{origin}: source"))


@dataclass(frozen=True)
class RunFlags:
    """Overrides that are not part of the document."""

    check_memory: bool = True


def apply_overrides(common: CommonSpec, overrides: Mapping[str, Any] | None, sections: tuple[str, ...],
                    num_gpus: int) -> tuple[dict[str, Any], RunFlags]:
    """The document with ``overrides`` merged (module docstring) and the run flags."""
    doc = copy.deepcopy(dict(common.document))
    flags: dict[str, Any] = {}
    where = f"{common.kind} workload {common.name!r}"
    for key, value in dict(overrides or {}).items():
        if key in sections + ("training", "compression", "input"):
            if not isinstance(value, Mapping):
                raise WorkloadError(f"{where}: override {key!r} must be a mapping, got {value!r}")
            merge_document(doc, {key: value})
        elif key in _FLAT:
            merge_document(doc, {_FLAT[key]: {key: value}})
        elif key in _FIXED:
            if value not in _FIXED[key]:
                raise WorkloadError(f"{where}: {key}={value!r} is not supported (only "
                                    f"{' or '.join(repr(v) for v in _FIXED[key])})")
        elif key == "check_memory":
            flags["check_memory"] = bool(value)
        elif key == "dp":
            if value is not None and value != num_gpus:
                raise WorkloadError(f"{where}: dp={value} must equal the {num_gpus} GPUs of the topology "
                                    "(data parallelism spans every GPU)")
        else:
            valid = sorted(set(sections + ("training", "compression", "input", "check_memory", "dp"))
                           | set(_FLAT) | set(_FIXED))
            raise WorkloadError(f"{where}: unknown or inapplicable override {key!r}; valid: {', '.join(valid)}")
    return doc, RunFlags(**flags)
