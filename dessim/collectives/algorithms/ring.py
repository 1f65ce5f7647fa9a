"""Ring algorithms, laid out as NCCL lays out its ring channels (docs/collectives.md).

* allreduce = ring reduce-scatter (p-1 steps, reduce on arrival) + ring all-gather (p-1
  steps), each step moving one block of ``size/p`` to the next rank:
  ``2(p-1)(α + S/p·β)`` on an idle network.
* reducescatter / allgather: ``p-1`` steps of ``size/p`` (``size`` = whole array).
* broadcast / reduce: a chain along the ring starting at (broadcast) or ending at (reduce)
  the root; with ``chunks`` k it pipelines: ``(p-2+k)(α + S/k·β)`` (the textbook store and
  forward, protocol ``raw``). Under NCCL's protocols the chain runs as NCCL runs it
  (:meth:`Ring.pipelined`): its kernel (``src/device/broadcast.h``, ``reduce.h``) moves the
  data in chunks of ``stepSize·chunkSteps`` (512 KiB for Simple) through every hop at once,
  so the chain is a fluid pipeline — every hop one flow of the lane's bytes, the critical path
  ``p-1`` hops: ``(p-1)α + S/b``, NCCL's own model (``ncclTopoTuneModel``: ring broadcast at
  the full bus bandwidth, ``nRanks-1`` hops of latency).

**Lanes.** NCCL splits a collective's data over channels, each a ring through all ranks
(NCCL 2.30.7 ``src/graph/search.cc``, ``connect.cc``; docs/references.md):

* inside one node (every member on one host), every channel follows the group order, and
  the channels differ only in which GPU's links they use first; on a switch all of them load
  the same links, so dessim runs them as **one lane** unless ``channels`` asks for more (odd
  lanes then run the ring backwards, using the other direction of each link);
* across nodes, **each channel enters and leaves every node through NICs of one rail**: it
  enters at the GPU that owns the rail's NIC and leaves from a GPU one PCIe switch away from
  that NIC (``NET/0 GPU/0 GPU/7 ... GPU/1 NET/0`` on a DGX A100) or, when there is none,
  through it by PXN (routing, :mod:`dessim.topology.hosts`). The next node enters on the
  same rail, so every inter-node hop of a channel is one leaf hop. dessim runs **one lane per
  rail** of the group's first node (8 on a DGX with 8 NICs), each with ``1/rails`` of the
  data: every NIC carries one lane in and one out, as NCCL's channels load them. With
  ``channels`` C, lane c takes rail ``c mod rails``.

**Steps.** A rank forwards a block as soon as it has received (and reduced) it: step ``j``
of connection ``i`` waits for step ``j-1`` of the upstream connection ``i-1`` (the data) and
of its own connection (connections are FIFO), not for the receiver: NCCL's connections keep
8 steps in flight (``NCCL_STEPS``), so a receiver's free buffer does not hold a sender back
in a balanced ring. The connection dependency orders the bytes, not the latency: a send waits
for its previous send's bytes to have left the sender, not to have arrived (the executor's
connection credit, :mod:`dessim.collectives.executor`, "Connections"; NVIDIA/nccl
``src/device/prims_ll.h`` ``waitSend``). Inside a node every connection has the same latency
and the steps stay in lockstep; across nodes a network connection's sends are paced by the
data reaching it, so the ring pays the latency of its data's path — the network latency on
about ``2(p − 1) · nodes / p`` of an all-reduce's steps, against NCCL's model's
``2(nNodes − 1)`` (``src/graph/tuning.cc``, ``ncclTopoTuneModel``, ring branch).
"""

from __future__ import annotations

import numpy as np

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.ops import Op
from dessim.collectives.schedule import (Flow, FluidSchedule, Lane, StepPattern, StepPlan,
                                         StepPlanBuilder)
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["Ring", "ring_lanes"]

#: (reduce-scatter phase, all-gather phase) of the ring ops that are made of uniform steps.
_PHASES = {"allreduce": (True, True), "reducescatter": (True, False), "allgather": (False, True)}


def _alternating(group: tuple[int, ...], channels: int) -> list[tuple[int, ...]]:
    return [group if c % 2 == 0 else group[::-1] for c in range(channels)]


def _rail_ring(parts: list[tuple[int, ...]], hosts, rail: object) -> tuple[int, ...]:
    """The ring of one rail: per host, enter at the member owning the rail's NIC and leave
    from a member one PCIe switch away from it (see the module docstring)."""
    out: list[int] = []
    for part in parts:
        host = hosts.host_of(part[0])
        nic = host.nic_on_rail(rail)
        entry = next((r for r in part if nic is not None and host.nic_of.get(r) == nic), part[0])
        rest = [r for r in part[part.index(entry) + 1:] + part[:part.index(entry)]]
        near = host.pix.get(nic, frozenset()) if nic is not None else frozenset()
        exit_ = next((r for r in reversed(rest) if r in near), None)
        if exit_ is not None:
            rest.remove(exit_)
            rest.append(exit_)
        out.append(entry)
        out.extend(rest)
    return tuple(out)


def ring_lanes(group: tuple[int, ...], topology: Topology | None,
               channels: int | None) -> list[tuple[int, ...]]:
    """The ring order of each lane (see the module docstring): ``channels`` None lays them
    out as NCCL does; an int forces that many lanes."""
    if topology is None or len(group) < 2:
        return _alternating(group, channels or 1)
    hosts = host_map(topology)
    parts = hosts.split(group)
    first = hosts.host_of(group[0])
    rails = sorted({first.rail[n] for r in parts[0] for n in (first.nic_of.get(r),)
                    if n is not None and n in first.rail}, key=str)
    if len(parts) < 2 or not rails:
        order = tuple(r for part in parts for r in part)
        return _alternating(order, channels or 1)
    count = len(rails) if channels is None else channels
    return [_rail_ring(parts, hosts, rails[c % len(rails)]) for c in range(count)]


@register
class Ring(Algorithm):
    name = "ring"
    summary = "NCCL rings: reduce-scatter + all-gather, one lane per rail across nodes"
    ops = frozenset({"allreduce", "reducescatter", "allgather", "broadcast", "reduce"})
    def lanes(self, group: tuple[int, ...], topology: Topology | None,
              channels: int | None) -> list[tuple[int, ...]]:
        return ring_lanes(group, topology, channels)

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """The default lanes' orders as member positions (they depend on hosts and rails)."""
        pos = {r: i for i, r in enumerate(group)}
        return tuple(tuple(pos[r] for r in lane) for lane in ring_lanes(group, topology, None))

    def pipelined(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
                  topology: Topology | None, channels: int | None) -> FluidSchedule | None:
        """Broadcast / reduce as NCCL pipelines them (module docstring): on each lane the
        chain from (broadcast) or to (reduce) ``root`` along the lane's ring, every hop one
        flow of ``size / lanes`` bytes, all at once; critical path the chain's ``p-1`` hops.
        None for the other ops (their steps already move one block each) and fewer than 2
        ranks."""
        if op.name not in ("broadcast", "reduce") or len(group) < 2:
            return None
        lanes = self.lanes(group, topology, channels)
        per = size / len(lanes)
        flows: list[Flow] = []
        critical: list[tuple[int, int]] = []
        for c, order in enumerate(lanes):
            hops = self._chain(op, order, root)
            flows += [Flow(a, b, per, c) for a, b in hops]
            critical = critical or hops
        return FluidSchedule(op, self.name, group, size, root, flows, critical,
                             {"channels": len(lanes), "chunks": 1})

    @staticmethod
    def _chain(op: Op, order: tuple[int, ...], root: int | None) -> list[tuple[int, int]]:
        """The hops of the chain along ring ``order``: from ``root`` (broadcast: root, root+1,
        ..., root-1) or to it (reduce: root+1, ..., root-1, root)."""
        start = order.index(root)
        if op.name == "broadcast":
            chain = order[start:] + order[:start]
        else:
            chain = order[start + 1:] + order[:start + 1]
        return list(zip(chain, chain[1:]))

    def emit(self, lane: Lane, op: Op, group: tuple[int, ...], size: float,
             root: int | None, topology: Topology | None, options: dict) -> None:
        order = group        # build_schedule passes each lane's ring order as its group
        p = len(order)
        if p < 2:
            return
        if op.name in ("broadcast", "reduce"):
            red = size if op.reduces else 0.0
            for a, b in self._chain(op, order, root):
                lane.step([(a, b, size, red)])
            return
        block = size / p
        hops = [(order[i], order[(i + 1) % p]) for i in range(p)]
        builder, channel = lane.builder, lane.channel
        prev: list[int] | None = None
        for j, reduces in enumerate(self._step_reductions(op, p)):
            red = block if reduces else 0.0
            # step j of hop i waits for step j-1 of the upstream hop i-1 (data only); the
            # first step waits for what its sender had to do before (an earlier phase of a
            # composed algorithm) and for the connection's previous transfer (a chunk)
            prev = [builder.add(a, b, block,
                                [prev[(i - 1) % p]] if prev else lane.pending.get(a, ()),
                                red, channel)
                    for i, (a, b) in enumerate(hops)]
        if prev:
            for i, (a, b) in enumerate(hops):   # a rank's last send and last receive
                lane.pending[a] = [prev[i], prev[(i - 1) % p]]

    @staticmethod
    def _step_reductions(op: Op, p: int) -> list[bool]:
        rs, ag = _PHASES[op.name]
        return [True] * ((p - 1) * rs) + [False] * ((p - 1) * ag)

    def plan(self, op: Op, group: tuple[int, ...], size: float, chunks: int,
             lanes: list[tuple[int, ...]]) -> StepPlan | None:
        """The same transfers and dependencies as :meth:`emit` over ``lanes × chunks``
        (see :func:`~dessim.collectives.algorithms.build_schedule`), as a :class:`StepPlan`;
        None for the ops that are not uniform steps (broadcast, reduce).

        Dependencies: member ``i`` (hop ``order[i] -> order[i+1]``) of a step waits for
        member ``i-1`` of the previous step of its lane (the data it forwards); the first
        step of chunk ``k > 0`` waits for member ``i`` of chunk ``k-1``'s last step (the
        previous transfer on the same connection)."""
        if op.name not in _PHASES or len(group) < 2:
            return None
        p = len(group)
        reductions = self._step_reductions(op, p)
        block = size / (chunks * len(lanes)) / p
        idx = np.arange(p, dtype=np.int64)
        # member i waits for the upstream member i-1 (data) and for itself (FIFO connection)
        ring_deps = [sorted({(i - 1) % p, i}) for i in range(p)]
        ring_start = np.cumsum([0] + [len(d) for d in ring_deps], dtype=np.int64)
        ring_index = np.fromiter((j for d in ring_deps for j in d), dtype=np.int64)
        builder = StepPlanBuilder()
        for c, order_ in enumerate(lanes):
            order = np.asarray(order_, dtype=np.int64)
            src, dst = order, np.roll(order, -1)
            first = StepPattern(src, dst, np.zeros(p + 1, dtype=np.int64), idx[:0])
            chained = StepPattern(src, dst, np.arange(p + 1, dtype=np.int64), idx)
            ring = StepPattern(src, dst, ring_start, ring_index)
            last = -1
            for k in range(chunks):
                for j, reduces in enumerate(reductions):
                    pattern = ring if j else (chained if k else first)
                    last = builder.add(pattern, last, block, block if reduces else 0.0, c)
        return builder.build()
