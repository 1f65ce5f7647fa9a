"""Task emission for every task-graph generator (transformer, DLRM, CNNs, ViT).

:class:`TaskEmitter` wraps a :class:`~dessim.taskgraph.model.TaskGraph` with the
conventions every generator follows, so that their graphs look alike and the bookkeeping
(ids, counters, last task per stream, kernel times, nearest nodes) lives in one place:

* task ids ``r<rank>.<n>`` in emission order per rank;
* compute tasks carry ``flops``, ``bytes``, the kernel class and GEMM ``shape`` **and** a
  ``duration`` from the device model (:class:`~dessim.engine.device.DeviceModel` of the
  rank's GPU at the workload's precision), so a saved graph replays with the same times;
  ``attrs["model_flops"]`` holds the part that counts as model FLOPs;
* collectives get ``coll_id = <prefix><first member>.<n>`` where ``n`` counts that prefix's
  collectives on the rank — every member emits its collectives of one prefix in the same
  order, so the ids agree; a one-rank group emits nothing;
* the last task of each (rank, stream) is remembered (streams are FIFO, so waiting for it
  waits for everything before it);
* memory/storage nodes are found with :func:`~dessim.workload.common.placement.nearest_node`.

Units: seconds, bytes, FLOPs.
"""

from __future__ import annotations

from typing import Any, Sequence

from dessim.catalog.calibration import Calibration
from dessim.taskgraph.model import Task, TaskGraph, kernel_mix
from dessim.taskgraph.rows import Rows, RowTemplate
from dessim.topology.graph import Topology
from dessim.topology.routing import Router, router_for
from dessim.workload.common.kernels import Kernel, KernelTimer
from dessim.workload.common.placement import nearest_node

__all__ = ["TaskEmitter"]


class TaskEmitter:
    """Builds one task graph; see the module docstring for the conventions."""

    def __init__(self, name: str, topology: Topology, devices: Sequence[str], precision: str,
                 meta: dict[str, Any] | None = None, calibration: Calibration | None = None) -> None:
        self.topology = topology
        self.devices = tuple(devices)
        self.precision = precision
        self.graph = TaskGraph(name, meta=meta)
        self.timer = KernelTimer(precision, calibration)   #: kernel times of the ranks' GPUs
        self._next: dict[int, int] = {}
        self._counts: dict[tuple[int, str], int] = {}
        self._last: dict[tuple[int, str], str] = {}
        self._router: Router | None = None
        self._nearest: dict[tuple[int, str], str] = {}
        self._costs: dict[tuple[int, str], tuple] = {}

    # ------------------------------------------------------------------ bookkeeping
    def new_id(self, rank: int) -> str:
        """A fresh task id of ``rank``: ``r<rank>.<n>``, ``n`` counting up from 0."""
        n = self._next.get(rank, 0)
        self._next[rank] = n + 1
        return f"r{rank}.{n}"

    def count(self, rank: int, what: str) -> int:
        """How many times ``what`` was counted on ``rank`` before (then counts one more)."""
        key = (rank, what)
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        return n

    def add(self, task: Task, deps: Sequence[str] = ()) -> str:
        """Add ``task`` after ``deps`` (repeats and empty ids dropped: the graph keeps an
        edge once); its id."""
        self.graph.add(task, [d for d in deps if d])
        self._last[(task.rank, task.stream)] = task.id
        return task.id

    def add_like(self, proto: Task, name: str, deps: Sequence[str] = ()) -> Task:
        """Add a copy of the checked task ``proto`` (:meth:`Task.derived`) with a fresh id of
        its rank and ``name``, after ``deps`` (empty ids dropped, as :meth:`add`); the copy.
        It shares ``proto``'s ``attrs``."""
        rank = proto.rank
        n = self._next.get(rank, 0)
        self._next[rank] = n + 1
        task = proto.derived(f"r{rank}.{n}", name)
        self.graph.add(task, [d for d in deps if d] if "" in deps else deps)
        self._last[(rank, task.stream)] = task.id
        return task

    def add_rows(self, rank: int, template: RowTemplate, counters: Sequence[str],
                 last: Sequence[tuple[str, int]], suffix: str, inputs: Sequence[str]) -> Rows:
        """Add one run of ``template`` on ``rank`` (:meth:`TaskGraph.add_rows
        <dessim.taskgraph.model.TaskGraph.add_rows>`) with the ids, counts and last task per
        stream that adding its tasks one by one with :meth:`add_like` would leave: the run's
        ids follow the rank's, slot ``j``'s numbers follow :meth:`count` of ``counters[j]``,
        and the run's task ``k`` becomes the last of ``stream`` for each ``(stream, k)`` of
        ``last``; names end with ``suffix``, the entry task also waits for ``inputs`` (empty
        ids dropped). The run."""
        first = self._next.get(rank, 0)
        self._next[rank] = first + template.size
        counts = self._counts
        bases = []
        for counter, n in zip(counters, template.per_slot):
            key = (rank, counter)
            base = counts.get(key, 0)
            counts[key] = base + n
            bases.append(base)
        prefix = f"r{rank}."
        rows = Rows(template, prefix, first, suffix, tuple(d for d in inputs if d), tuple(bases))
        self.graph.add_rows(rows)
        for stream, k in last:
            self._last[(rank, stream)] = f"{prefix}{first + k}"
        return rows

    def compute_template(self, rank: int, kernels: Sequence[Kernel], category: str,
                         stream: str = "compute", attrs: dict[str, Any] | None = None,
                         ) -> tuple[Task, tuple[tuple[str, float], ...]]:
        """A checked compute task of ``rank`` running ``kernels`` (as :meth:`compute`, but not
        in the graph; id and name are placeholders), and its seconds by kernel kind (``()``
        for one kind): copies of it, made by :meth:`add_like`, are the same tasks as
        :meth:`compute` makes for this (never changed) sequence."""
        duration, flops, nbytes, model_flops, kind, shape, mix = self._costed(rank, kernels, True)
        if attrs is None:
            attrs = {"model_flops": model_flops}
        task = Task("template", rank, "compute", stream=stream, category=category, duration=duration,
                    flops=flops, bytes=nbytes, kernel=kind, shape=shape, attrs=attrs)
        return task, mix

    def last(self, rank: int, stream: str) -> str:
        """Id of the last task emitted on (rank, stream), or ``""``."""
        return self._last.get((rank, stream), "")

    def kernel_time(self, rank: int, kernel: Kernel) -> float:
        """Seconds the rank's GPU takes for ``kernel`` (device model, cached)."""
        return self.timer(self.devices[rank], kernel)

    def nearest(self, rank: int, kind: str, what: str = "") -> str:
        """The ``kind`` node nearest to the rank's GPU (:func:`~dessim.workload.common.placement.nearest_node`;
        ``what`` names what needs it in the error when there is none)."""
        key = (rank, kind)
        node = self._nearest.get(key)
        if node is None:
            node = nearest_node(self.router, self.topology, self.topology.node_of(rank), kind, what)
            self._nearest[key] = node
        return node

    @property
    def router(self) -> Router:
        """The topology's router (made when first asked for)."""
        if self._router is None:
            self._router = router_for(self.topology)
        return self._router

    # ------------------------------------------------------------------ tasks
    def compute(self, rank: int, kernels: Sequence[Kernel], label: str, category: str,
                deps: Sequence[str] = (), stream: str = "compute",
                attrs: dict[str, Any] | None = None, reused: bool = False) -> str:
        """One compute task running ``kernels`` back to back; ``attrs`` default to
        ``{"model_flops": ...}`` (a generator that precomputes them passes its own).
        ``reused=True``: the caller passes this very sequence again for other tasks (and never
        changes it), so its sums are computed once per GPU model and kept."""
        duration, flops, nbytes, model_flops, kind, shape, mix = self._costed(rank, kernels, reused)
        if attrs is None:
            attrs = {"model_flops": model_flops}
        tid = self.add(Task(self.new_id(rank), rank, "compute", stream=stream, name=label,
                            category=category, duration=duration, flops=flops,
                            bytes=nbytes, kernel=kind, shape=shape, attrs=attrs), deps)
        if mix:
            self.graph.set_kernel_mix(tid, mix)
        return tid

    def _costed(self, rank: int, kernels: Sequence[Kernel], reused: bool) -> tuple:
        """(seconds, FLOPs, bytes, model FLOPs, kind, shape, seconds by kernel kind) of
        ``kernels`` on the rank's GPU (the last ``()`` for one kernel); a ``reused`` sequence
        is summed once per GPU model (the sums, in the same order, are the same numbers every
        time)."""
        key = (id(kernels), self.devices[rank])
        if reused:
            got = self._costs.get(key)
            if got is not None and got[0] is kernels:
                return got[1]
        times = [self.kernel_time(rank, k) for k in kernels]
        duration = sum(times)
        if len(kernels) == 1:
            kind, shape = kernels[0].kind, kernels[0].shape or ()
        else:
            kind, shape = "layer", ()
        # by the kind the device model costs (attention with its implementation)
        mix = kernel_mix([k.device_kind for k in kernels], times)
        if len(mix) == 1 and mix[0][0] == kind:
            mix = ()
        value = (duration, sum(k.flops for k in kernels), sum(k.bytes for k in kernels),
                 sum(k.flops for k in kernels if k.is_model_flops), kind, shape, mix)
        if reused:
            self._costs[key] = (kernels, value)  # holds the sequence: its id stays its own
        return value

    def collective(self, rank: int, op: str, size: float, group: Sequence[int], prefix: str,
                   label: str, category: str, stream: str, deps: Sequence[str] = ()) -> str | None:
        """One rank's part of a collective; ``None`` for a one-rank group (nothing to do)."""
        group = tuple(group)
        if len(group) < 2:
            return None
        n = self.count(rank, f"coll.{prefix}")
        return self.add(Task(self.new_id(rank), rank, "collective", stream=stream, name=label,
                             category=category, op=op, size=float(size), group=group,
                             coll_id=f"{prefix}{group[0]}.{n}"), deps)

    def p2p(self, rank: int, kind: str, peer: int, tag: int, size: float, label: str,
            category: str, stream: str, deps: Sequence[str] = ()) -> str:
        """A send (``kind="send"``) to or a receive from ``peer``."""
        return self.add(Task(self.new_id(rank), rank, kind, stream=stream, name=label, category=category,
                             peer=peer, tag=tag, size=float(size)), deps)

    def p2p_like(self, proto: Task, name: str, tag: int, deps: Sequence[str] = ()) -> str:
        """:meth:`p2p` from a checked send or receive ``proto`` (rank, kind, peer, stream,
        category and size): the same task — a fresh id, ``name``, ``tag``, its own empty
        ``attrs`` — copied (:meth:`Task.derived`) instead of built and checked."""
        task = proto.derived(self.new_id(proto.rank), name)
        task.tag = tag
        task.attrs = {}
        return self.add(task, deps)

    def memcpy(self, rank: int, size: float, node: str, direction: str, label: str, category: str,
               stream: str, deps: Sequence[str] = ()) -> str:
        """Move ``size`` bytes between the rank's HBM and ``node`` (``to_hbm``/``from_hbm``)."""
        return self.add(Task(self.new_id(rank), rank, "memcpy", stream=stream, name=label,
                             category=category, size=float(size), mem_node=node, direction=direction), deps)
