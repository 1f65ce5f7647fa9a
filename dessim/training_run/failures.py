"""Failure rates per component and the components of a cluster: the job's MTBF.

A synchronous training job stops whenever any of its components fails, so with independent
exponential lifetimes the job's failure rate is ``Σ_kind count_kind · rate_kind`` (per
second) and its MTBF the inverse.

Default rates ([D]: derived by arithmetic from the counts of the Llama 3 report, "Llama 3
(Dubey et al. 2024)" in docs/references.md, §3.3.4 Table 5: 419 unexpected interruptions in
a 54-day snapshot of pre-training on 16,384 H100 GPUs in 2,048 hosts of 8). Each of the
table's categories is assigned to one component kind; the rate of a kind is its count
divided by the component-hours of the run (``count · 54 · 24 h``):

=========  =====  ==========================================================  =========
kind       count  Table 5 categories                                          components
=========  =====  ==========================================================  =========
gpu        268    faulty GPU 148, GPU HBM3 72, GPU SRAM 19, GPU system        16,384
                  processor 17, GPU thermal interface + sensor 6, silent data
                  corruption 6
host       46     unplanned host maintenance 32, SSD 3, power supply 3,        2,048
                  server chassis 2, IO expansion board 2, CPU 2, system memory 2
nic        7      NIC 7                                                       16,384 (one per GPU: assumption)
link       35     network switch/cable 35                                     49,152 (assumption below)
switch     0      (switch failures are inside "switch/cable": counted on links)
software   63     software bug 54, NCCL watchdog timeouts 7, dependency 2     16,384 (per GPU: assumption)
=========  =====  ==========================================================  =========

Assumptions ([U], stated in docs/training-run.md): one scale-out NIC per GPU; a three-tier
Clos with one fabric link per GPU per tier (3 × 16,384 links; the report gives no link
count); software interruptions scale with the number of GPUs (ranks). Planned
interruptions (47 in the same snapshot, automated maintenance) are not failures here.

Components of a topology (:func:`count_components`): ``gpu`` its GPUs; ``link`` its
scale-out links (types ``ib`` and ``ethernet``); ``host`` the connected groups of nodes
that remain when those links and storage nodes are removed and that hold a GPU (a DGX: its
GPUs, CPUs, NVSwitch and PCIe switches); ``switch`` switches outside every host (the
fabric); ``nic`` its ``nic`` nodes; ``software`` the GPU count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import networkx as nx

from dessim.errors import DessimError
from dessim.topology.graph import Topology

__all__ = ["COMPONENT_KINDS", "FailureRate", "DEFAULT_FAILURE_RATES", "LLAMA3_SNAPSHOT",
           "ComponentCounts", "count_components", "job_failure_rate", "FailureError"]


class FailureError(DessimError):
    """A failure rate or component count is invalid."""


#: Component kinds a failure rate may be given for.
COMPONENT_KINDS: tuple[str, ...] = ("gpu", "host", "nic", "link", "switch", "software")

#: Scale-out link types: cables of the cluster fabric.
FABRIC_LINK_TYPES: tuple[str, ...] = ("ib", "ethernet")


@dataclass(frozen=True)
class LlamaSnapshot:
    """The Llama 3 report's 54-day pre-training snapshot (§3.3.4): hours, components and
    interruptions per component kind (the module docstring's table)."""

    hours: float = 54 * 24.0
    components: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(
        {"gpu": 16_384, "host": 2_048, "nic": 16_384, "link": 3 * 16_384, "switch": 1, "software": 16_384}))
    interruptions: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(
        {"gpu": 148 + 72 + 19 + 17 + 6 + 6, "host": 32 + 3 + 3 + 2 + 2 + 2 + 2, "nic": 7, "link": 35,
         "switch": 0, "software": 54 + 7 + 2}))


#: The snapshot the default rates come from.
LLAMA3_SNAPSHOT = LlamaSnapshot()


@dataclass(frozen=True)
class FailureRate:
    """Failures per component-second of one kind, with its source."""

    kind: str
    per_s: float
    source: str

    def __post_init__(self) -> None:
        if self.kind not in COMPONENT_KINDS:
            raise FailureError(f"failure rate: component kind {self.kind!r} is unknown; valid: "
                               f"{', '.join(COMPONENT_KINDS)}")
        r = self.per_s
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (r >= 0 and math.isfinite(r)):
            raise FailureError(f"failure rate of {self.kind}: must be a number >= 0 per second, got {r!r}")

    @property
    def mtbf_s(self) -> float:
        """Mean time between failures of one component, seconds (inf at rate 0)."""
        return 1.0 / self.per_s if self.per_s > 0 else math.inf


def _llama_rate(kind: str) -> FailureRate:
    snap = LLAMA3_SNAPSHOT
    n, k = snap.components[kind], snap.interruptions[kind]
    return FailureRate(kind, k / (n * snap.hours * 3600.0),
                       f"[D] Llama 3 (Dubey et al. 2024) §3.3.4 Table 5: {k} interruptions / "
                       f"({n} {kind} x 54 days)")


#: Default failure rates per component kind (module docstring).
DEFAULT_FAILURE_RATES: Mapping[str, FailureRate] = MappingProxyType(
    {kind: _llama_rate(kind) for kind in COMPONENT_KINDS})


@dataclass(frozen=True)
class ComponentCounts:
    """How many components of each kind a job runs on (module docstring)."""

    gpu: int
    host: int
    nic: int
    link: int
    switch: int
    software: int

    def __post_init__(self) -> None:
        for kind in COMPONENT_KINDS:
            v = getattr(self, kind)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise FailureError(f"component count {kind}: must be a whole number >= 0, got {v!r}")

    def as_dict(self) -> dict[str, int]:
        return {kind: getattr(self, kind) for kind in COMPONENT_KINDS}


def count_components(topology: Topology) -> ComponentCounts:
    """The components of ``topology`` (module docstring's counting rules)."""
    g = topology.graph
    fabric = [(a, b) for a, b, d in g.edges(data=True) if d.get("type") in FABRIC_LINK_TYPES]
    inner = nx.Graph(g)
    inner.remove_edges_from(fabric)
    inner.remove_nodes_from(topology.nodes_of_kind("storage"))
    gpus = set(topology.gpus)
    hosts = [c for c in nx.connected_components(inner) if c & gpus]
    in_host = set().union(*hosts) if hosts else set()
    switches = [n for n in topology.nodes_of_kind("switch") if n not in in_host]
    return ComponentCounts(gpu=topology.num_gpus, host=len(hosts), nic=len(topology.nodes_of_kind("nic")),
                           link=len(fabric), switch=len(switches), software=topology.num_gpus)


def job_failure_rate(counts: ComponentCounts, rates: Mapping[str, FailureRate]) -> dict[str, float]:
    """Failures per second of the whole job by component kind (``count · rate``)."""
    return {kind: getattr(counts, kind) * rates[kind].per_s for kind in COMPONENT_KINDS}
