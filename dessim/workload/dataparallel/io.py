"""Input pipeline: every iteration each GPU reads its samples from storage or from a cache in
host memory (YAML section ``input:``).

Per rank and iteration: ``local_batch · sample_bytes`` bytes, of which a fraction ``h``
(the cache hit ratio) comes from the nearest ``host_mem`` node and ``1 − h`` from the nearest
``storage`` node (:mod:`dessim.topology.storage`), as ``memcpy`` tasks (category ``io``,
streams ``io`` and ``io.cache``) over the topology's links — so concurrent readers share the
file system's bandwidth max-min fairly. Decoding and augmentation on the CPU are not
modelled (an assumption: enough loader workers).

Hit ratio ``h``
    ``cache: none`` → 0; ``cache: host`` with ``hit_ratio`` → that; with
    ``cached_after_first_epoch: true`` → 0 in epoch 0 and, from ``epoch: 1`` on, the
    fraction of the data set the cache holds: ``min(1, cache_bytes / dataset_bytes)``
    (``cache_bytes`` default: the capacity of every ``host_mem`` node; 1 without
    ``dataset_bytes``). This is the page cache / DALI-style in-memory cache of DLIO's and
    MLPerf HPC's data-staging studies.
Prefetching (``prefetch: true``, the default — PyTorch's DataLoader keeps batches in flight)
    The reads of the *next* iteration run during this one and the iteration ends when both
    are done: iteration time = max(read time, compute time) in steady state, and an I/O-bound
    job shows its GPUs idle at the end of the iteration. ``prefetch: false``: the forward
    waits for this iteration's reads (read time + compute time).
``storage:`` (optional mapping: ``kind``, ``bw``, ``lat``, ``attach``, ``client_bw``,
``name``) attaches a storage tier with :func:`~dessim.topology.storage.attach_storage` when
the topology has no ``storage`` node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import Field

from dessim.errors import SpecError
from dessim.schema import Bandwidth, Count, Flag, Number, Size, SpecModel, Text, Time, choice, converted, validate
from dessim.topology.graph import Topology
from dessim.topology.storage import STORAGE_KINDS, attach_storage
from dessim.workload.common.emitter import TaskEmitter

__all__ = ["InputPipeline", "InputSection", "StorageSection", "parse_input", "input_of", "CACHES"]

#: Cache locations.
CACHES: tuple[str, ...] = ("none", "host")



def _nodes(value: Any, what: str) -> str | list[str]:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    raise SpecError(f"{what}: expected a node name or a list of node names, got {value!r}")


class StorageSection(SpecModel):
    """A storage tier to attach when the topology has none: the keys of
    :func:`~dessim.topology.storage.attach_storage` (``input.storage``, DLRM's
    ``embeddings.storage``)."""

    kind: choice(STORAGE_KINDS) | None = None
    bw: Bandwidth | None = Field(None, description="bytes/s of the tier's link")
    lat: Time | None = Field(None, description="seconds, one way")
    attach: converted(_nodes, {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                               "description": "topology node(s) it hangs off"}) | None = None
    client_bw: Bandwidth | None = Field(None, description="bytes/s of each client link (pfs)")
    name: Text | None = None

    def kwargs(self) -> dict[str, Any]:
        """The given keys, as :func:`attach_storage` takes them."""
        return self.model_dump(exclude_none=True)


class InputSection(SpecModel):
    """``input:``: the samples each GPU reads per iteration (module docstring)."""

    sample_bytes: Size = Field(description="bytes read per sample, e.g. 110KB")
    cache: choice(CACHES) = "none"
    hit_ratio: Number = Field(0.0, description="fraction of reads served by the cache, in [0, 1]")
    cached_after_first_epoch: Flag = False
    epoch: Count = 0
    dataset_bytes: Size | None = None
    cache_bytes: Size | None = None
    prefetch: Flag = True
    storage: StorageSection | None = None


@dataclass(frozen=True)
class InputPipeline:
    """Sample reads of one iteration (module docstring). Bytes, fractions."""

    sample_bytes: float
    cache: str = "none"
    hit_ratio: float = 0.0
    cached_after_first_epoch: bool = False
    epoch: int = 0
    dataset_bytes: float | None = None
    cache_bytes: float | None = None
    prefetch: bool = True
    storage: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cache not in CACHES:
            raise SpecError(f"input: cache {self.cache!r} is unknown; valid: {', '.join(CACHES)}")
        if not 0 <= self.hit_ratio <= 1:
            raise SpecError(f"input: hit_ratio {self.hit_ratio!r} must be in [0, 1]")
        if self.cache == "none" and (self.hit_ratio or self.cached_after_first_epoch):
            raise SpecError("input: hit_ratio / cached_after_first_epoch need cache: host")

    def effective_hit_ratio(self, topology: Topology) -> float:
        """``h`` of the module docstring on ``topology``."""
        if self.cache == "none":
            return 0.0
        if not self.cached_after_first_epoch:
            return self.hit_ratio
        if self.epoch == 0:
            return 0.0
        if not self.dataset_bytes:
            return 1.0
        cache = self.cache_bytes
        if cache is None:
            cache = sum(float(topology.graph.nodes[n].get("capacity", 0.0))
                        for n in topology.nodes_of_kind("host_mem"))
        return min(1.0, cache / self.dataset_bytes)

    def prepare(self, topology: Topology) -> Topology:
        """The topology with the ``storage:`` tier attached if it has no storage node."""
        if topology.nodes_of_kind("storage") or not self.storage:
            return topology
        return attach_storage(topology, **self.storage)

    def emit(self, em: TaskEmitter, rank: int, samples: int, hit: float) -> list[str]:
        """The rank's read tasks for ``samples`` samples; returns their ids."""
        total = samples * self.sample_bytes
        out = []
        if hit < 1 and total:
            node = em.nearest(rank, "storage", "an input pipeline reading from storage")
            out.append(em.memcpy(rank, total * (1 - hit), node, "to_hbm", f"read {samples} samples",
                                 "io", "io"))
        if hit > 0 and total:
            node = em.nearest(rank, "host_mem", "an input pipeline with a host-memory cache")
            out.append(em.memcpy(rank, total * hit, node, "to_hbm", f"cached {samples} samples",
                                 "io", "io.cache"))
        return out


def parse_input(data: Any, where: str) -> InputPipeline | None:
    """An :class:`InputPipeline` from a YAML ``input:`` mapping (:class:`InputSection`);
    None when absent."""
    return input_of(None if data is None else validate(InputSection, data, where), where)


def input_of(section: InputSection | None, where: str) -> InputPipeline | None:
    """The :class:`InputPipeline` of a validated section (None when absent); its cross-key
    rules (``hit_ratio`` needs ``cache: host``) raise a :class:`SpecError` at ``where``."""
    if section is None:
        return None
    kw = section.model_dump(exclude={"storage"}, exclude_none=True)
    for key in ("sample_bytes", "dataset_bytes", "cache_bytes"):
        if key in kw:
            kw[key] = float(kw[key])
    try:
        return InputPipeline(**kw, storage=section.storage.kwargs() if section.storage else {})
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
