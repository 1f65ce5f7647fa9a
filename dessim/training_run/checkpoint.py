"""Checkpoint size and the time to write and restore it over the topology (bytes, seconds).

Size: the model state a restart needs — weights and optimizer state, not gradients:
``parameters · (param_bytes + optimizer_bytes)`` of the training precision for a transformer
(bf16 mixed-precision Adam: 2 + 12 = 14 bytes per parameter; ZeRO §3.1, as the memory model
counts them, :mod:`dessim.workload.transformer.memory`). Data-parallel kinds (DLRM, CNN):
the per-GPU ``weights + optimizer`` of their memory estimate (the replicated dense state,
saved once) plus every embedding table of a DLRM once (``details.embedding_bytes``, all
shards together; its SGD row updates keep no optimizer state). Give ``checkpoint_bytes`` for
other layouts of a checkpoint.

Time: a simulated transfer. Every GPU writes ``size / gpus`` bytes (a sharded checkpoint in
which every rank saves an equal, distinct part, as PyTorch Distributed Checkpoint does) to
its nearest ``storage`` node, all at once, as ``memcpy`` tasks over the topology's links
(:func:`dessim.engine.simulate`): the storage tier's bandwidth, the host links and NICs are
shared max-min fairly. A restore reads the same bytes back. A topology without a storage
node gets a parallel file system (:func:`~dessim.topology.storage.attach_storage`) of
``storage_bw`` aggregate bandwidth (:func:`checkpoint_times`' default 2 TB/s is the
sustained throughput of the Llama 3 training cluster's Tectonic file system, "Llama 3
(Dubey et al. 2024)" §3.3.1 in docs/references.md [C2]; ``dessim train``
scales it by GPUs / 16,384 — give the storage of a real cluster).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dessim.engine import EngineOptions, simulate
from dessim.errors import DessimError
from dessim.taskgraph.model import Task, TaskGraph
from dessim.topology.graph import Topology
from dessim.topology.routing import router_for
from dessim.topology.storage import attach_storage
from dessim.training_run.failures import LLAMA3_SNAPSHOT
from dessim.workload.common.placement import nearest_node
from dessim.workload.kinds import load_any_workload
from dessim.workload.transformer.plan import resolve_workload
from dessim.workload.transformer.spec import WorkloadSpec

__all__ = ["checkpoint_bytes", "planned_checkpoint_bytes", "CheckpointTimes", "checkpoint_times", "DEFAULT_STORAGE_BW",
           "default_storage_bw"]

#: Aggregate bandwidth of the Llama 3 cluster's file system (module docstring), bytes/s.
DEFAULT_STORAGE_BW = 2e12


def default_storage_bw(gpus: int) -> float:
    """:data:`DEFAULT_STORAGE_BW` per GPU of that 16,384-GPU cluster, times ``gpus`` (bytes/s):
    the file system ``dessim train`` attaches when the topology has none ([U] proportional
    scaling)."""
    return DEFAULT_STORAGE_BW * gpus / LLAMA3_SNAPSHOT.components["gpu"]


def _model_state_bytes(model: Any) -> float:
    prec = model.precision_spec
    return float(model.num_params()) * (prec.param_bytes + prec.optimizer_bytes)


def planned_checkpoint_bytes(workload: Any, overrides: Mapping[str, Any] | None, num_gpus: int) -> float | None:
    """Checkpoint bytes of a transformer workload from its document and overrides alone,
    before anything is simulated (so the transfers can run, and free their memory, first);
    None for other kinds (sized from their simulated result by :func:`checkpoint_bytes`)."""
    spec = workload if not isinstance(workload, (str, Path)) else load_any_workload(workload)
    if not isinstance(spec, WorkloadSpec):
        return None
    resolved, _rest, _dp = resolve_workload(spec, overrides, num_gpus)
    return _model_state_bytes(resolved.model)


def checkpoint_bytes(result: Any) -> float:
    """Bytes of one checkpoint of the workload simulated in ``result`` (module docstring)."""
    plan = getattr(result, "plan", None)
    if plan is not None:
        return _model_state_bytes(plan.model)
    memory = getattr(result, "memory", None)
    if isinstance(memory, dict) and "weights" in memory:
        tables = float((getattr(result, "details", None) or {}).get("embedding_bytes", 0.0))
        return float(memory["weights"]) + float(memory.get("optimizer", 0.0)) + tables
    raise DessimError("train: cannot size the checkpoint of this workload (no model state); "
                      "give checkpoint_bytes (--checkpoint-size)")


@dataclass(frozen=True)
class CheckpointTimes:
    """Simulated seconds to write and to restore one checkpoint of ``bytes`` bytes."""

    bytes: float
    write_s: float
    restore_s: float
    storage: str        #: where it went: the storage nodes' names


def with_storage(topology: Topology, storage_bw: float) -> Topology:
    """``topology`` itself when it has a storage node, else with a PFS of ``storage_bw``."""
    if topology.nodes_of_kind("storage"):
        return topology
    return attach_storage(topology, "pfs", storage_bw)


def _storage_of_ranks(topology: Topology) -> list[str]:
    """The storage node nearest to each rank's GPU (one look-up when there is one node)."""
    nodes = topology.nodes_of_kind("storage")
    if len(nodes) == 1:
        return nodes * topology.num_gpus
    router = router_for(topology)
    return [nearest_node(router, topology, gpu, "storage", "a checkpoint") for gpu in topology.gpus]


def _transfer_time(topology: Topology, targets: list[str], nbytes: float, direction: str) -> float:
    graph = TaskGraph(f"checkpoint {direction}")
    share = nbytes / topology.num_gpus
    for rank, node in enumerate(targets):
        graph.add(Task(f"ckpt.{rank}", rank, "memcpy", stream="io", name=f"checkpoint {direction}",
                       category="checkpoint", size=share, mem_node=node, direction=direction))
    return simulate(graph, topology, EngineOptions(record_links=False)).makespan_s


def checkpoint_times(topology: Topology, nbytes: float, storage_bw: float = DEFAULT_STORAGE_BW) -> CheckpointTimes:
    """Simulated write (``from_hbm``) and restore (``to_hbm``) times of ``nbytes`` bytes."""
    topo = with_storage(topology, storage_bw)
    storage = ",".join(sorted(topo.nodes_of_kind("storage")))
    if nbytes <= 0:
        return CheckpointTimes(0.0, 0.0, 0.0, storage)
    targets = _storage_of_ranks(topo)
    return CheckpointTimes(nbytes, _transfer_time(topo, targets, nbytes, "from_hbm"),
                           _transfer_time(topo, targets, nbytes, "to_hbm"), storage)
