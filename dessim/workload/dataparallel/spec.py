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
      gradient_sync: allreduce     # allreduce (default) | parameter_server
      parameter_servers: 4         # server processes (implies gradient_sync: parameter_server)
      ps_placement: dedicated      # dedicated (own hosts) | colocated (beside GPUs)
      ps_mode: sync                # sync | async (bounded staleness ps_staleness: s)
      ps_iterations: 3             # iterations simulated for the steady state
      ps_nic_bw: 25GB/s            # a server's link (default: as the workers' hosts')
      ps_attach: [leaf0, leaf1]    # topology nodes the servers hang off, one per server
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

from pydantic import Field

from dessim.errors import SpecError, WorkloadError
from dessim.schema import Bandwidth, Count, PositiveCount, Size, SpecModel, Text, choice, converted, count, did_you_mean
from dessim.topology.paramservers import PLACEMENTS
from dessim.workload.dataparallel.compression import Compression, CompressionSection, compression_of
from dessim.workload.dataparallel.io import InputPipeline, InputSection, input_of
from dessim.workload.common.gradsync import DEFAULT_BUCKET_SIZE
from dessim.workload.dataparallel.paramserver import GRADIENT_SYNCS, PS_MODES, PSConfig, PSSync
from dessim.workload.common.document import merge_document

__all__ = ["DPTraining", "DPTrainingSection", "DPFile", "CommonSpec", "parse_common", "apply_overrides", "check_override_keys", "RunFlags", "dp_sync",
           "sync_details"]


def _node_list(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{what}: expected a list of topology node names (one per server), got {value!r}")
    return tuple(value)


class DPTrainingSection(SpecModel):
    """``training:`` of a data-parallel file (samples, bytes, bytes/s)."""

    global_batch: PositiveCount = Field(description="samples per iteration")
    micro_batch: PositiveCount | None = Field(None, description="samples per GPU per step "
                                              "(default: global_batch / GPUs)")
    bucket_size: Size = Field(DEFAULT_BUCKET_SIZE, description="DDP gradient bucket, bytes "
                              "(0: one all-reduce after the backward)")
    device: Text | None = Field(None, description="GPU model when the topology names none")
    gradient_sync: choice(GRADIENT_SYNCS) | None = None
    parameter_servers: PositiveCount | None = Field(None, description="server processes (implies "
                                                    "gradient_sync: parameter_server)")
    ps_placement: choice(PLACEMENTS) = "dedicated"
    ps_mode: choice(PS_MODES) = "sync"
    ps_staleness: Count = 0
    ps_iterations: count(2) | None = None
    ps_nic_bw: Bandwidth | None = Field(None, description="a server's link, bytes/s")
    ps_attach: converted(_node_list, {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                      "description": "topology nodes the servers hang off, one per server"},
                         tuple) | None = None


class DPFile(SpecModel):
    """The sections every non-transformer workload file shares; each kind's model adds its own."""

    kind: str
    name: Text | None = Field(None, description="default: the file name")
    description: Text = ""
    source: Text = ""
    training: DPTrainingSection
    compression: CompressionSection | None = None
    input: InputSection | None = None


#: Flat overrides and the section they go to: every training key.
_FLAT = {key: "training" for key in DPTrainingSection.model_fields}
#: Training keys that only apply to parameter servers.
_PS_KEYS = ("parameter_servers", "ps_placement", "ps_mode", "ps_staleness", "ps_iterations", "ps_nic_bw",
            "ps_attach")
#: Transformer-generator flags and the only value they may take here.
_FIXED = {"granularity": ("layer", "auto"), "comm": (True,), "embedding_head": (True,),
          "fold": (None, False), "extrapolate": (None, False)}


@dataclass(frozen=True)
class DPTraining:
    """The ``training:`` section (bytes, samples)."""

    global_batch: int
    micro_batch: int | None = None
    bucket_size: int = DEFAULT_BUCKET_SIZE
    device: str | None = None
    #: ``allreduce`` | ``parameter_server`` (default: ``parameter_server`` when
    #: ``parameter_servers`` is given); :mod:`dessim.workload.dataparallel.paramserver`
    gradient_sync: str | None = None
    parameter_servers: int | None = None
    ps_placement: str = "dedicated"
    ps_mode: str = "sync"
    ps_staleness: int = 0
    ps_iterations: int | None = None
    ps_nic_bw: float | None = None         #: bytes/s of a server's link (None: topology default)
    ps_attach: tuple[str, ...] | None = None   #: topology nodes the servers hang off (None: by placement)

    def __post_init__(self) -> None:
        sync = self.gradient_sync or ("parameter_server" if self.parameter_servers else "allreduce")
        if sync not in GRADIENT_SYNCS:
            raise SpecError(f"training.gradient_sync: {sync!r} is unknown; valid: {', '.join(GRADIENT_SYNCS)}")
        object.__setattr__(self, "gradient_sync", sync)
        if sync == "parameter_server":
            if self.parameter_servers is None:
                raise SpecError("training.gradient_sync: parameter_server needs training.parameter_servers "
                                "(the number of server processes)")
            self.ps      # validated now
        else:
            given = [k for k in _PS_KEYS if getattr(self, k) != getattr(DPTraining, k)]
            if given:
                raise SpecError(f"training.{given[0]}: applies to gradient_sync: parameter_server only "
                                f"(gradient_sync is {sync!r})")

    @property
    def ps(self) -> PSConfig | None:
        """The parameter-server settings, or None with ``gradient_sync: allreduce``."""
        if self.gradient_sync != "parameter_server":
            return None
        return PSConfig(self.parameter_servers or 1, self.ps_placement, self.ps_mode, self.ps_staleness,
                        self.ps_iterations, self.ps_nic_bw, self.ps_attach)

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


def parse_common(doc: DPFile, data: Mapping[str, Any], origin: str, default_name: str) -> CommonSpec:
    """The shared sections of a file already validated as ``doc`` (a :class:`DPFile`
    subclass; ``data``: the raw document, kept for overrides)."""
    try:
        training = DPTraining(**doc.training.model_dump(exclude_unset=True))
    except SpecError as exc:
        raise SpecError(f"{origin}: {exc}") from None
    return CommonSpec(
        kind=doc.kind, name=doc.name if doc.name is not None else default_name, training=training,
        compression=compression_of(doc.compression, f"{origin}: compression"),
        input=input_of(doc.input, f"{origin}: input"),
        document=copy.deepcopy(dict(data)), description=doc.description, source=doc.source)


@dataclass(frozen=True)
class RunFlags:
    """Overrides that are not part of the document."""

    check_memory: bool = True


def check_override_keys(common: CommonSpec, overrides: Mapping[str, Any] | None, sections: tuple[str, ...]) -> None:
    """Raise a :class:`WorkloadError` naming the first top-level key of ``overrides`` that is
    no override of a file with the document ``sections`` (a sweep checks its overrides with
    it before any point runs)."""
    valid = sorted(set(sections + ("training", "compression", "input", "check_memory", "dp"))
                   | set(_FLAT) | set(_FIXED))
    for key in overrides or {}:
        if key not in valid:
            raise WorkloadError(f"{common.kind} workload {common.name!r}: unknown or inapplicable override "
                                f"{key!r}{did_you_mean(key, valid)}; valid: {', '.join(valid)}")


def apply_overrides(common: CommonSpec, overrides: Mapping[str, Any] | None, sections: tuple[str, ...],
                    num_gpus: int) -> tuple[dict[str, Any], RunFlags]:
    """The document with ``overrides`` merged (module docstring) and the run flags."""
    doc = copy.deepcopy(dict(common.document))
    flags: dict[str, Any] = {}
    where = f"{common.kind} workload {common.name!r}"
    check_override_keys(common, overrides, sections)
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
        elif value is not None and value != num_gpus:       # dp (check_override_keys)
            raise WorkloadError(f"{where}: dp={value} must equal the {num_gpus} GPUs of the topology "
                                "(data parallelism spans every GPU)")
    return doc, RunFlags(**flags)


def dp_sync(common: CommonSpec, em: Any, precision: Any, ranks: int, where: str) -> PSSync | None:
    """The parameter-server synchroniser of a generator (None with ``gradient_sync:
    allreduce``); compression applies to all-reduce only."""
    ps = common.training.ps
    if ps is None:
        return None
    if common.compression.method != "none":
        raise WorkloadError(f"{where}: compression {common.compression.method!r} applies to gradient_sync: "
                            "allreduce only; remove it or use allreduce")
    if ranks < 1:
        raise WorkloadError(f"{where}: no GPUs")
    return PSSync(ps, ranks, precision.grad_bytes, precision.param_bytes)


def sync_details(training: DPTraining) -> dict[str, Any]:
    """The gradient-synchronisation figures every data-parallel summary reports (``details``)."""
    ps = training.ps
    base = {"gradient_sync": training.gradient_sync, "parameter_servers": 0, "ps_placement": None,
            "ps_mode": None, "ps_staleness": None, "ps_iterations": 1}
    return base if ps is None else {**base, **ps.summary()}
