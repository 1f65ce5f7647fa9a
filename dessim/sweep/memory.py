"""The ``memory`` section of a workload sweep point: HBM capacity and memory expansion.

Keys (``base: memory: {...}`` or axes ``memory.KEY``; values as written, parsed here with
:mod:`dessim.units`):

``hbm_capacity``
    HBM bytes per GPU replacing the catalog figure of the topology's GPUs (passed to
    :func:`dessim.workload.simulate_workload` as the ``hbm_capacity`` override): the memory
    fit changes, every other figure of the device stays.
``expansion_capacity``
    Bytes of expansion memory **per GPU**; absent or 0: no expansion.
``expansion_bw`` / ``expansion_lat``
    Bandwidth per direction and one-way latency of the link from each GPU to its expansion
    memory. Defaults: the catalog's CXL 2.0 x16 figures (``cxl2``: 63 GB/s [C2], 200 ns [U];
    "CXL on PCIe PHYs" and "Wang et al. 2024 (CXL)" in docs/references.md).
``offload_optimizer``, ``offload_activations``, ``bucket_size``, ``overhead``
    :class:`~dessim.workload.transformer.memory.MemoryOptions` fields (the ``memory`` override of
    ``simulate_workload``).

Memory expansion model (an assumption, stated so it can be argued with)
    A disaggregated memory pool (CXL memory pooling): one ``cxl_mem`` node ``xmem`` of
    ``expansion_capacity`` × GPUs bytes, joined to **every GPU by its own** ``cxl`` link of
    ``expansion_bw`` per direction (efficiency 1.0: the figure is the payload rate). The link
    stands for a dedicated coherent port (a CXL port, or NVLink-C2C to a Grace CPU's LPDDR),
    not the PCIe switch the NICs share, so the expansion bandwidth is one free parameter and
    offload traffic contends only with the GPU's own offload traffic. Memory nodes never
    forward, so GPU-to-GPU traffic cannot cross the pool; the pool's internal bandwidth is not
    modelled. The workload generator offloads to the nearest ``cxl_mem`` node: the pool is
    one hop from every GPU. Each GPU's share is ``expansion_capacity``: the bytes a GPU
    offloads (the optimizer state and/or stored activations,
    :func:`dessim.workload.transformer.memory.estimate_memory`, worst pipeline stage) must fit in it
    (:func:`check_expansion_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import create_model

from dessim.catalog.links import get_link_tech
from dessim.errors import DessimError, MemoryFitError, SpecError
from dessim.schema import SpecModel, validate
from dessim.units import format_size, parse_bandwidth, parse_capacity, parse_time

__all__ = ["MEMORY_KEYS", "EXPANSION_KEYS", "OPTION_KEYS", "EXPANSION_TECH", "EXPANSION_TARGET",
           "POOL_NODE", "EXPANSION_ONLY_KEYS", "MemorySetup", "unused_expansion", "memory_setup", "check_memory_values", "with_expansion",
           "offloaded_per_gpu", "check_expansion_fit", "MemorySection"]

#: Keys that describe the hardware (consumed here).
EXPANSION_KEYS: tuple[str, ...] = ("hbm_capacity", "expansion_capacity", "expansion_bw", "expansion_lat")
#: Keys that only matter when something is offloaded to the expansion.
EXPANSION_ONLY_KEYS: tuple[str, ...] = ("expansion_capacity", "expansion_bw", "expansion_lat")
#: MemoryOptions fields (passed to the workload layer as the ``memory`` override).
OPTION_KEYS: tuple[str, ...] = ("offload_optimizer", "offload_activations", "bucket_size", "overhead")
#: Every valid key of the memory section.
MEMORY_KEYS: tuple[str, ...] = EXPANSION_KEYS + OPTION_KEYS
#: Catalog link technology whose figures are the expansion link's defaults.
EXPANSION_TECH = "cxl2"
#: Offload target (MemoryOptions value) that lands in the expansion memory.
EXPANSION_TARGET = "cxl"
#: Name of the expansion memory pool node.
POOL_NODE = "xmem"

#: The keys of a memory section (values as written: :data:`_PARSERS` reads them).
MemorySection = create_model("MemorySection", __base__=SpecModel,
                             __doc__="a sweep point's memory section (hbm_capacity, expansion_*, options)",
                             **{k: (Any, None) for k in MEMORY_KEYS})

_PARSERS = {"hbm_capacity": lambda v, w: parse_capacity(v, w, allow_zero=False),
            "expansion_capacity": lambda v, w: parse_capacity(v, w),
            "expansion_bw": lambda v, w: parse_bandwidth(v, w),
            "expansion_lat": lambda v, w: parse_time(v, w)}


@dataclass(frozen=True)
class MemorySetup:
    """A parsed memory section (SI units). ``expansion_capacity == 0``: no expansion."""

    hbm_capacity: float | None = None
    expansion_capacity: float = 0.0
    expansion_bw: float = 0.0
    expansion_lat: float = 0.0
    options: Mapping[str, Any] = field(default_factory=dict)   #: MemoryOptions overrides

    @property
    def has_expansion(self) -> bool:
        return self.expansion_capacity > 0

    def overrides(self, base: Mapping[str, Any] | None) -> dict[str, Any]:
        """``simulate_workload`` overrides: ``base`` plus ``hbm_capacity`` and ``memory``."""
        out = dict(base or {})
        if self.hbm_capacity is not None:
            out["hbm_capacity"] = self.hbm_capacity
        if self.options:
            out["memory"] = {**dict(out.get("memory") or {}), **self.options}
        return out

    def topology_key(self) -> tuple[float, float, float] | None:
        """What of the topology this setup changes (None: nothing)."""
        if not self.has_expansion:
            return None
        return (self.expansion_capacity, self.expansion_bw, self.expansion_lat)


def unused_expansion(section: Mapping[str, Any]) -> bool:
    """True when ``section`` explicitly offloads nothing to the expansion memory (both offload
    keys given, neither ``cxl``): the expansion then cannot change a simulation."""
    return all(k in section and section[k] != EXPANSION_TARGET
               for k in ("offload_optimizer", "offload_activations"))


def check_memory_values(key: str, values: list[Any], where: str) -> None:
    """Parse every value of a ``memory.KEY`` axis so that a typo fails when the spec is read."""
    parse = _PARSERS.get(key)
    for i, value in enumerate(values):
        if parse is not None:
            try:
                parse(value, f"{where}[{i}]")
            except DessimError as exc:
                raise SpecError(str(exc)) from None


def memory_setup(section: Mapping[str, Any] | None, where: str = "memory") -> MemorySetup:
    """The :class:`MemorySetup` of a point's memory section (module doc)."""
    section = dict(section or {})
    validate(MemorySection, section, where)
    values = {k: _PARSERS[k](section[k], f"{where}.{k}") for k in EXPANSION_KEYS if section.get(k) is not None}
    tech = get_link_tech(EXPANSION_TECH)
    capacity = float(values.get("expansion_capacity", 0))
    return MemorySetup(hbm_capacity=values.get("hbm_capacity"), expansion_capacity=capacity,
                       expansion_bw=float(values.get("expansion_bw", tech.bw)),
                       expansion_lat=float(values.get("expansion_lat", tech.lat)),
                       options={k: section[k] for k in OPTION_KEYS if k in section})


def with_expansion(topology, setup: MemorySetup):
    """A copy of ``topology`` with the expansion memory pool (module doc); ``topology`` itself
    when the setup has no expansion."""
    from dessim.topology.graph import Topology

    if not setup.has_expansion:
        return topology
    g = topology.graph.copy()
    if POOL_NODE in g:
        raise SpecError(f"memory expansion: topology {topology.name!r} already has a node {POOL_NODE!r}")
    g.add_node(POOL_NODE, kind="cxl_mem", capacity=setup.expansion_capacity * topology.num_gpus)
    for gpu in topology.gpus:
        g.add_edge(gpu, POOL_NODE, type="cxl", bw=setup.expansion_bw, lat=setup.expansion_lat,
                   duplex=True, efficiency=1.0)
    meta = {**topology.meta, "memory_expansion": {
        "capacity_per_gpu": setup.expansion_capacity, "bw": setup.expansion_bw,
        "lat": setup.expansion_lat, "model": "dessim.sweep.memory.with_expansion"}}
    return Topology(g, name=f"{topology.name}+xmem", dims=topology.dims, meta=meta)


def offloaded_per_gpu(model, layout, options, target: str = EXPANSION_TARGET) -> float:
    """Bytes one GPU offloads to ``target``, worst pipeline stage (memory estimate)."""
    from dessim.workload.transformer.memory import estimate_memory

    return max(estimate_memory(model, layout, options, stage=s).offloaded.get(target, 0.0)
               for s in range(layout.pp))


def check_expansion_fit(plan, setup: MemorySetup) -> None:
    """Raise :class:`~dessim.errors.MemoryFitError` if the plan offloads more bytes per GPU to
    the expansion memory than it holds."""
    if not setup.has_expansion:
        return
    moved = offloaded_per_gpu(plan.model, plan.layout, plan.memory)
    if moved > setup.expansion_capacity:
        raise MemoryFitError(
            f"model {plan.name!r} with {plan.layout.describe()} offloads {format_size(moved)} per "
            f"GPU to its expansion memory, more than its capacity of "
            f"{format_size(setup.expansion_capacity)} (memory.expansion_capacity)")

