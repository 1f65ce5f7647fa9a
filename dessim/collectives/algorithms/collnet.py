"""NCCL's CollNet: reduction in InfiniBand switches (SHARP) across nodes, as fluid pipelines.

NCCL 2.30.7 (NVIDIA/nccl 5067397c, docs/references.md) has two CollNet algorithms; both hand
each node's data to its NICs, let the SHARP switches reduce it across nodes and multicast the
result back (:mod:`dessim.topology.sharp`), and differ in how the GPUs of a node meet the NICs
(``src/device/all_reduce.h``; channels from ``src/graph/connect.cc``):

**CollNetChain** (``collnet``; ``NCCL_ALGO=COLLNETCHAIN``). One channel per NIC (the collnet
chain graph has as many channels as the ring graph: one per NIC on DGX systems). In every node
the channel's data goes up a chain of the node's GPUs headed by the GPU that owns the
channel's NIC (``collnetChain.up`` of the head is the network), each GPU adding its part
(``directRecvReduceDirectSend``); the head sends the node's sum to its NIC once; the switches
reduce it across nodes and send the result back; the head passes it down the chain
(``directRecvCopyDirectSend``). With ``L`` lanes (channels) of ``S/L`` bytes and ``p`` GPUs
per node, every GPU but a lane's tail sends ``S/L`` up and every GPU but the head ``S/L``
down: with heads rotating over the GPUs, each GPU's NVLink carries ``2(p-1)/p·S`` each way,
each NIC ``S/L`` each way.

**CollNetDirect** (``collnetdirect``). One head per NIC (``connectCollNet``); head ``h`` owns
``S/H`` of the data (``H`` heads). Every GPU sends head ``h`` its part of that shard
(``scatter``), the head reduces the node's parts and sends them to the network
(``recvReduceDirectSend``), receives the reduced shard and sends it to every other GPU of
the node (``directRecvCopyDirectSend``). Per GPU: ``(H-1)/H·S`` to the other heads plus
``(p-1)/H·S`` as a head, each way; with ``H = p`` the same ``2(p-1)/p·S`` as the chain.
All-gather and reduce-scatter (``all_gather.h``, ``reduce_scatter.h``; NCCL needs the
plugin's ``iallgather`` / ``ireducescatter``, which the SHARP plugin has, and one NIC per GPU)
go through the same heads: all-gather sends each GPU's block up its own NIC, the switches
gather the rail's blocks of every node and send them to every NIC of the rail, and each head
copies them to the node's other GPUs; reduce-scatter is the reverse (each GPU sends each
head the node's blocks of its rail, the head sends the node's sum up, and gets its own block
back).

In the network (:func:`~dessim.collectives.algorithms.sharp.sharp_flows`), per lane: every
head sends its node's data to its NIC's aggregation switch and receives the result from it;
every edge of the SHARP tree carries the reduced data once each way (all-reduce), the
gathered blocks down and the node's own blocks up (all-gather), or the reverse
(reduce-scatter). A switch reduces at its port rate; the flows share every link max-min with
each other and all other traffic, so oversubscribed uplinks, congestion and several trees on
one spine show up in the time. On DGX H100 nodes with 8 NDR NICs the NVLinks are the limit
(``2(p-1)/p·S`` at 369 GB/s against ``S/8`` per NIC at 47 GB/s): all-reduce busbw
``2(n-1)/n × 369 / 1.75`` ≈ 416 GB/s for 64 ranks; CoreWeave measured 386 GB/s with
CollNetChain (NCCL 2.18.1, validation/).

**Time.** As every fluid pipeline (:class:`~dessim.collectives.schedule.FluidSchedule`): all
flows start together once every member has arrived, and the collective ends
``max(0, critical - paid)`` after the last flow, where ``paid`` is the largest latency a flow
paid (route + software step latency) and ``critical`` NCCL's latency of the pipeline's
critical path: CollNetChain ``2(p-1)`` NVLink hops (up and down the chain) plus one network
round trip (``2(p-1)·intra + inter`` in ``ncclTopoTuneModel``); CollNetDirect one hop to a
head, the network round trip and one hop back, plus NCCL's 0.4 µs per peer of "arity
serialization" each way (``2(min(1, p-1)·intra + (p-1)·0.4) + inter``). The network round
trip is one hop from the first node's head to the head of a node behind another aggregation
switch (the route up to the tree's top and down again), charged once with NCCL's
``hwLat[NET][CollNet*][Simple]`` (30 / 31 µs) when a protocol applies (with one GPU per node
NCCL's model takes the Tree row, 14 µs, instead; dessim keeps the CollNet row). On an idle network
where the slowest flow is also one that paid the most latency — a NIC's flow when the NICs
are the bottleneck — the time is therefore exactly ``call latency + critical + bytes /
rate`` (tests/test_collnet.py).

Where NCCL runs it (``ncclTopoTuneModel``, ``updateCollCostTable``, ``init.cc``): at least 2
nodes (``NCCL_COLLNET_NODE_THRESHOLD``), at most 8 GPUs per node (``NCCL_MAX_DIRECT_ARITY``
+ 1), SHARP on the switches of every NIC's rail (the plugin's communicator fails otherwise),
the Simple protocol only; CollNetDirect only on NVSwitch systems. ``check`` refuses the rest
with the reason. Not modelled: SHARP's data types and operators (nccl-tests' float sum is
supported), switch buffer limits, NCCL's use of the plugin's host-side progress thread.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.collectives.algorithms.nvls import nvswitch_of
from dessim.collectives.algorithms.sharp import (network_hop, one_nic_per_gpu, sharp_flows,
                                                 sharp_key, sharp_lanes)
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Flow, FluidSchedule, Lane
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology

__all__ = ["CollNetChain", "CollNetDirect", "ARITY_SERIALIZATION_S"]

#: NCCL's "arity serialization" latency per local peer of CollNetDirect (tuning.cc), s.
ARITY_SERIALIZATION_S = 0.4e-6


class _CollNet(Algorithm):
    """Shared checks of the CollNet algorithms."""

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        sharp_lanes(group, topology, None, self.name)

    def emit(self, lane: Lane, op: Op, group, size, root, topology, options) -> None:
        raise CollectiveError(f"{self.name} runs as a fluid pipeline only")

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        return sharp_key(group, topology)


@register
class CollNetChain(_CollNet):
    name = "collnet"
    summary = ("NCCL CollNetChain: a chain of GPUs per node, IB SHARP switches reduce across "
               "nodes (switches that declare sharp)")
    ops = frozenset({"allreduce"})

    def fluid(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
              topology: Topology | None, channels: int | None, options: dict) -> FluidSchedule:
        parts, lanes = sharp_lanes(group, topology, channels, self.name)
        per = size / len(lanes)
        flows: list[Flow] = []
        for c, lane in enumerate(lanes):
            for part, head in zip(parts, lane.heads):
                i = part.index(head)
                chain = part[i:] + part[:i]
                for a, b in zip(chain, chain[1:]):
                    flows.append(Flow(b, a, per, c))      # reduce up the chain
                    flows.append(Flow(a, b, per, c))      # broadcast down
            flows += sharp_flows("allreduce", lane, per, c)
        head = lanes[0].heads[0]
        i = parts[0].index(head)
        chain0 = parts[0][i:] + parts[0][:i]
        up = list(zip(chain0[:0:-1], chain0[-2::-1]))     # tail ... -> head
        down = [(b, a) for a, b in reversed(up)]
        critical = up + [network_hop(lanes[0])] + down
        return FluidSchedule(op, self.name, group, size, root, flows, critical,
                             {"channels": len(lanes), "chunks": 1})


@register
class CollNetDirect(_CollNet):
    name = "collnetdirect"
    summary = ("NCCL CollNetDirect: every GPU to one head per NIC, IB SHARP switches reduce "
               "across nodes (switches that declare sharp)")
    ops = frozenset({"allreduce", "allgather", "reducescatter"})

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        parts, lanes = sharp_lanes(group, topology, None, self.name)
        for part in parts:
            if nvswitch_of(part, topology) is None:  # type: ignore[arg-type]
                raise CollectiveError(f"{self.name}: NCCL runs CollNetDirect only on NVSwitch "
                                      f"systems; ranks {list(part)} of one node share no "
                                      "NVSwitch (use collnet, NCCL's CollNetChain)")
        one_nic_per_gpu(op.name, parts, lanes, self.name)

    def fluid(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
              topology: Topology | None, channels: int | None, options: dict) -> FluidSchedule:
        parts, lanes = sharp_lanes(group, topology, None, self.name)   # one lane per head
        n, heads = len(group), len(lanes)
        flows: list[Flow] = []
        for c, lane in enumerate(lanes):
            for part, head in zip(parts, lane.heads):
                others = [m for m in part if m != head]
                if op.name == "allreduce":           # shard S/H: scatter, reduce, broadcast
                    shard = size / heads
                    flows += [Flow(m, head, shard, c) for m in others]
                    flows += [Flow(head, m, shard, c) for m in others]
                elif op.name == "allgather":         # the rail's blocks of every node
                    flows += [Flow(head, m, len(parts) * size / n, c) for m in others]
                else:                                # reducescatter
                    flows += [Flow(m, head, len(parts) * size / n, c) for m in others]
            per = size / heads if op.name == "allreduce" else size / n
            flows += sharp_flows(op.name, lane, per, c)
        head = lanes[0].heads[0]
        peer = next((m for m in parts[0] if m != head), None)
        hop = [network_hop(lanes[0])]
        critical = ([(peer, head)] + hop + [(head, peer)]) if peer is not None else hop
        ppn = len(parts[0])
        return FluidSchedule(op, self.name, group, size, root, flows, critical,
                             {"channels": heads, "chunks": 1},
                             serial_s=2 * (ppn - 1) * ARITY_SERIALIZATION_S)
