"""Data parallelism synchronised through parameter servers (``training.gradient_sync:
parameter_server``).

The model (Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server",
OSDI; Chilimbi et al. 2014, "Project Adam", OSDI)

* ``N`` server processes (``training.parameter_servers``) hold the parameters, sharded evenly:
  server ``j`` owns ``1/N`` of every gradient bucket (key ranges split evenly, as ps-lite's
  range partitioning does). Servers are topology nodes
  (:func:`~dessim.topology.paramservers.attach_parameter_servers`; ``ps_placement``
  ``dedicated`` or ``colocated``).
* **Push**: when the backward fills a gradient bucket of ``G_b`` bytes (the same DDP buckets as
  the all-reduce path, :mod:`dessim.workload.common.gradsync`), every worker sends ``G_b / N``
  bytes to each server — a transfer from its GPU to the server node over the topology (stream
  ``ps.push<j>``, category ``ps``), overlapping the rest of the backward.
* **Pull**: each worker then receives the bucket's updated parameters, ``P_b / N`` bytes from
  each server (``P_b`` = the bucket's parameters × parameter bytes; stream ``ps.pull<j>``).
  The optimizer runs on the servers, so workers run no optimizer step and hold no optimizer
  state. Server-side aggregation and update compute is **not** modelled (assumed hidden
  behind the transfers; Li et al. report servers bound by the network): the figures are the
  communication side of the design.
* The next iteration's forward of a layer waits for the pull of that layer's bucket.

Consistency (``ps_mode``)

``sync`` (bulk synchronous)
    A server answers the pulls of bucket ``b`` of iteration ``k`` once every worker's push of
    it arrived.
``async`` with ``ps_staleness: s`` (bounded delay, Li et al. 2014 §3; stale synchronous
    parallel, Ho et al. 2013, "More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server", NeurIPS)
    A server applies each push as it arrives and answers that worker's pull at once; a worker
    may start iteration ``k+1`` only once every worker has pushed iteration ``k − s`` (so no
    worker runs more than ``s`` iterations ahead of the slowest).

Steady state: the graph holds ``ps_iterations`` iterations (default :meth:`PSConfig.simulated`:
3, or ``s + 3`` when asynchronous) and marks each iteration's pulls
(:data:`~dessim.workload.common.figures.ITERATION_MARKS`); the reported iteration time is
``(T_K − T_1) / (K − 1)``, ``T_k`` the end of the last pull of iteration ``k`` over all
workers (:func:`~dessim.workload.common.figures.steady_iteration_s`) — the first iteration
(no overlap with a previous one) is left out. A job of a cluster reports the same.

Closed form (idle network, one bucket): each server receives ``W·G/N`` bytes through its link
of bandwidth ``B_s`` while each worker sends ``G`` through its own link ``B_w``, so a push
takes ``max(W·G/(N·B_s), G/B_w) + ℓ`` (``ℓ`` the path latency; :func:`push_time`), a pull the
same with ``P`` for ``G``. Units: bytes, bytes/second, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from dessim.engine.result import SimulationResult
from dessim.errors import DessimError, SpecError
from dessim.topology.graph import Topology
from dessim.topology.paramservers import PLACEMENTS, attach_parameter_servers, server_names
from dessim.workload.common.emitter import TaskEmitter
from dessim.taskgraph.model import TaskGraph
from dessim.workload.common.figures import ITERATION_MARKS, steady_iteration_s
from dessim.workload.common.gradsync import fill_buckets

__all__ = ["GRADIENT_SYNCS", "PS_MODES", "PSConfig", "PSSync", "push_time", "bucket_of_layers",
           "emit_iterations", "iteration_figures"]

#: Ways the data-parallel gradients are synchronised (``training.gradient_sync``).
GRADIENT_SYNCS: tuple[str, ...] = ("allreduce", "parameter_server")
#: Parameter-server consistency models (``training.ps_mode``).
PS_MODES: tuple[str, ...] = ("sync", "async")


def push_time(grad_bytes: float, workers: int, servers: int, server_bw: float, worker_bw: float,
              latency: float) -> float:
    """Seconds for ``workers`` workers to push ``grad_bytes`` each, sharded evenly over
    ``servers`` servers, on an idle network (module docstring): the busier of a server's link
    (``workers·grad_bytes/servers`` bytes at ``server_bw`` B/s) and a worker's link
    (``grad_bytes`` at ``worker_bw``), plus the path latency."""
    return max(workers * grad_bytes / (servers * server_bw), grad_bytes / worker_bw) + latency


@dataclass(frozen=True)
class PSConfig:
    """Parameter-server settings of a ``training:`` section (module docstring)."""

    servers: int
    placement: str = "dedicated"
    mode: str = "sync"
    staleness: int = 0
    iterations: int | None = None     #: iterations simulated (None: :meth:`simulated`)
    nic_bw: float | None = None       #: bytes/s of a server's link (None: topology default)
    attach: tuple[str, ...] | None = None   #: nodes the servers hang off (None: by placement)

    def __post_init__(self) -> None:
        where = "training"
        if self.placement not in PLACEMENTS:
            raise SpecError(f"{where}.ps_placement: {self.placement!r} is unknown; valid: {', '.join(PLACEMENTS)}")
        if self.mode not in PS_MODES:
            raise SpecError(f"{where}.ps_mode: {self.mode!r} is unknown; valid: {', '.join(PS_MODES)}")
        if self.mode == "sync" and self.staleness:
            raise SpecError(f"{where}.ps_staleness: {self.staleness} needs ps_mode: async "
                            "(synchronous servers have no staleness)")
        if self.iterations is not None and self.iterations < 2:
            raise SpecError(f"{where}.ps_iterations: {self.iterations} must be >= 2 (the first "
                            "iteration is left out of the steady state)")

    @property
    def simulated(self) -> int:
        """Iterations in the graph: ``ps_iterations``, else 3 (sync) or ``s + 3`` (async)."""
        if self.iterations is not None:
            return self.iterations
        return 3 if self.mode == "sync" else self.staleness + 3

    def prepare(self, topology: Topology) -> Topology:
        """``topology`` with the server nodes attached (it must not have any yet)."""
        if topology.nodes_of_kind("param_server"):
            raise SpecError(f"training.parameter_servers: topology {topology.name!r} already has "
                            "parameter-server nodes; the workload attaches its own")
        try:
            return attach_parameter_servers(topology, self.servers, self.placement, bw=self.nic_bw,
                                            attach=self.attach)
        except DessimError as exc:
            raise SpecError(f"training.ps_attach / parameter_servers: {exc}") from None

    def summary(self) -> dict[str, Any]:
        """The settings as the workload summary reports them (``details``)."""
        return {"parameter_servers": self.servers, "ps_placement": self.placement, "ps_mode": self.mode,
                "ps_staleness": self.staleness, "ps_iterations": self.simulated}


def bucket_of_layers(layers: Sequence[Any], grad_bytes: int, bucket_size: float) -> dict[str, int]:
    """Layer name -> index of the gradient bucket holding its gradients, for layers with
    parameters, in the order :func:`~dessim.workload.dataparallel.graph.emit_backward` issues
    the buckets (the same :func:`fill_buckets` call)."""
    order = [l for l in reversed(layers) if l.backward]
    buckets = fill_buckets(((l.name, {"dp": l.params * grad_bytes}) for l in order), bucket_size)
    out: dict[str, int] = {}
    b = 0
    for layer in order:
        if layer.params > 0:
            out[layer.name] = b
        while b < len(buckets) and buckets[b].after == layer.name:
            b += 1
    return {k: min(v, len(buckets) - 1) for k, v in out.items()} if buckets else {}


@dataclass
class PSSync:
    """Emits pushes and pulls of one generator's graph (module docstring). Use as the ``sync``
    of :func:`~dessim.workload.dataparallel.graph.emit_backward` (its :meth:`bucket`), then
    :meth:`pulls` once every rank's iteration is emitted."""

    config: PSConfig
    ranks: int
    grad_bytes: int
    param_bytes: int
    servers: tuple[str, ...] = ()
    iteration: int = 0
    #: (iteration, bucket, server) -> push task ids, by rank
    pushes: dict[tuple[int, int, int], dict[int, str]] = field(default_factory=dict)
    #: (iteration, bucket) -> gradient bytes of the bucket (per worker)
    sizes: dict[tuple[int, int], float] = field(default_factory=dict)
    #: iteration -> every pull task id
    pulled: dict[int, list[str]] = field(default_factory=dict)
    _next: dict[tuple[int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.servers:
            self.servers = tuple(server_names(self.config.servers))

    def bucket(self, em: TaskEmitter, rank: int, nbytes: float, deps: Sequence[str], label: str) -> None:
        """Push ``nbytes`` of gradients, ``nbytes/N`` to each server (module docstring)."""
        if nbytes <= 0:
            return
        b = self._next.get((self.iteration, rank), 0)      # buckets count from 0 every iteration
        self._next[(self.iteration, rank)] = b + 1
        self.sizes[(self.iteration, b)] = nbytes
        share = nbytes / len(self.servers)
        for j, node in enumerate(self.servers):
            tid = em.memcpy(rank, share, node, "from_hbm", f"push {label} it{self.iteration} to {node}", "ps",
                            f"ps.push{j}", deps)
            self.pushes.setdefault((self.iteration, b, j), {})[rank] = tid

    def pulls(self, em: TaskEmitter, rank: int) -> dict[int, list[str]]:
        """The rank's pulls of the current iteration; bucket -> pull task ids."""
        k = self.iteration
        out: dict[int, list[str]] = {}
        buckets = sorted(b for (it, b) in self.sizes if it == k)
        ratio = self.param_bytes / self.grad_bytes
        for b in buckets:
            share = self.sizes[(k, b)] * ratio / len(self.servers)
            for j, node in enumerate(self.servers):
                pushed = self.pushes[(k, b, j)]
                deps = list(pushed.values()) if self.config.mode == "sync" else [pushed[rank]]
                tid = em.memcpy(rank, share, node, "to_hbm", f"pull bucket{b} it{k} from {node}", "ps",
                                f"ps.pull{j}", deps)
                out.setdefault(b, []).append(tid)
                self.pulled.setdefault(k, []).append(tid)
        return out

    def barrier(self, k: int) -> list[str]:
        """What iteration ``k`` must wait for on every rank beyond its own pulls: in
        asynchronous mode, every worker's last push of iteration ``k − 1 − s``."""
        k = k - 1 - self.config.staleness
        if self.config.mode == "sync" or k < 0:
            return []
        last = max((b for (it, b) in self.sizes if it == k), default=None)
        if last is None:
            return []
        return [tid for j in range(len(self.servers)) for tid in self.pushes[(k, last, j)].values()]


def iteration_figures(ps: PSSync | None, sim: SimulationResult, graph: TaskGraph) -> tuple[int, float | None]:
    """(iterations in the graph, steady-state seconds per iteration or None) of a generator's
    run: ``(1, None)`` without parameter servers."""
    return (1, None) if ps is None else (ps.config.simulated, steady_iteration_s(sim, graph))


def emit_iterations(ps: PSSync, em: TaskEmitter, layer_bucket: Mapping[str, int],
                    body: Callable[[int, list[str], dict[str, list[str]]], Any]) -> None:
    """Emit ``ps.config.simulated`` iterations: ``body(rank, start deps, extra deps by layer)``
    emits one rank's iteration (its backward pushing through ``ps``); then every rank's pulls.
    The next iteration's forward of each layer waits for its bucket's pulls, and its start for
    :meth:`PSSync.barrier`."""
    extra: dict[int, dict[str, list[str]]] = {r: {} for r in range(ps.ranks)}
    for k in range(ps.config.simulated):
        ps.iteration = k
        start = ps.barrier(k)
        for rank in range(ps.ranks):
            body(rank, start, extra[rank])
        for rank in range(ps.ranks):
            pulls = ps.pulls(em, rank)
            extra[rank] = {name: list(pulls.get(b, ())) for name, b in layer_bucket.items()}
    em.graph.meta[ITERATION_MARKS] = [ps.pulled[k] for k in sorted(ps.pulled)]
