"""Where a workload runs: the GPU model of every rank, the node a GPU offloads to or reads from.

Nearest node of a kind
    The node of a kind (``host_mem``, ``cxl_mem``, ``storage``) with the fewest hops from the
    GPU, ties broken by node name — deterministic, and the one a NUMA-aware allocator or a
    node-local reader would pick.
"""

from __future__ import annotations

from typing import Sequence

from dessim.catalog.devices import get_device
from dessim.errors import WorkloadError
from dessim.topology.graph import Topology
from dessim.topology.routing import Router

__all__ = ["OFFLOAD_NODE_KINDS", "resolve_devices", "nearest_node"]

#: Topology node kind of each offload target.
OFFLOAD_NODE_KINDS: dict[str, str] = {"host": "host_mem", "cxl": "cxl_mem"}


def resolve_devices(topology: Topology, fallback: Sequence[str | None], where: str) -> tuple[str, ...]:
    """The catalog GPU name of every rank of ``topology``: the topology's own, else the first
    of ``fallback`` that is set (the command line's ``--device``, then the workload's);
    a :class:`~dessim.errors.WorkloadError` naming ``where`` if neither says, or if a device
    given first (``--device``) would be used by no rank: a topology that names every rank's
    GPU (dgx-h100) and another model asked for, which would otherwise be dropped silently."""
    out = []
    default = next((d for d in fallback if d), None)
    for r in range(topology.num_gpus):
        name = topology.device(r) or default
        if name is None:
            raise WorkloadError(f"{where}: rank {r} of topology {topology.name!r} has no GPU model and "
                                "the workload names no device: give one (--device H100 or training.device)")
        out.append(get_device(name).name)
    given = fallback[0] if fallback else None
    if given and all(topology.device(r) for r in range(topology.num_gpus)):
        wanted = get_device(given).name
        if wanted not in out:
            named = ", ".join(sorted(set(out)))
            raise WorkloadError(f"{where}: device {given!r} (--device, engine.device) would apply to no rank: topology "
                                f"{topology.name!r} names the GPU of every rank ({named}); choose the "
                                "GPU in the topology (a dgx-a100/dgx-h100/dgx-b200 preset, its gpu= key, "
                                "device= of an inline spec) or drop --device")
    return tuple(out)


def nearest_node(router: Router, topology: Topology, gpu: str, kind: str, what: str = "") -> str:
    """The node of ``kind`` nearest to node ``gpu`` (:meth:`Router.nearest`: fewest hops,
    then latency, then name); a :class:`~dessim.errors.WorkloadError` naming ``what`` needs
    it if the topology has none reachable from ``gpu``."""
    found = router.nearest(gpu, (kind,))
    if found is None:
        need = f"{what} needs" if what else "needs"
        raise WorkloadError(f"{need} a {kind} node reachable from {gpu!r}, but topology "
                            f"{topology.name!r} has none")
    return found
