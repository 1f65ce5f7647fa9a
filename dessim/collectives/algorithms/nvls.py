"""In-switch reduction: NVLink SHARP (NVLS) inside an NVLink domain and NVLSTree across
nodes, as fluid pipelines (:class:`~dessim.collectives.schedule.FluidSchedule`).

**NVLS** (NCCL ``src/transport/nvls.cc``, ``connectNvls``; docs/references.md). The NVSwitch
reduces and multicasts: for an all-reduce over ``n`` GPUs, GPU ``g`` owns shard ``g``
(``S/n`` bytes) and reads it reduced from every GPU's copy through the switch
(``multimem.ld_reduce``: every GPU sends each shard once, ``S`` up), gets it back (``S/n``
down), then stores it once to the multicast object (``S/n`` up), which the switch delivers
to every GPU (``S`` down). Each GPU's link to the switch therefore carries ``(1 + 1/n)·S``
each way, against ``2(n-1)/n·S`` for a ring. NVLS moves data at ``nvlsEfficiency`` of the
link rate (NCCL 2.30.7 ``tuning.cc``: 0.85 on Hopper, 0.74 on Blackwell), charged as extra
wire bytes. Reduce-scatter is the first half (``S`` up, ``S/n`` down), all-gather the second
(``S/n`` up, ``S`` down). The flows go between each GPU and the switch node. Needs sm90+
GPUs that share one NVSwitch.

On a DGX H100 (NVLink 450 GB/s, 82 % achieved by NCCL's ring) this gives
``busbw = 2(n-1)/(n+1) × 0.85 × 370 GB/s ≈ 489 GB/s`` for 8 GPUs; nccl-tests measures
≈ 480 (nccl-tests#212).

**NVLSTree** (``connectNvls``): inside each node NVLS reduces every shard onto the GPU that
owns a NIC (its *head*); heads of the same index across nodes all-reduce their shard over
NCCL's double binary tree of nodes (half the data on each tree), then NVLS multicasts the
result inside each node.

**NVLS across nodes** (NVLS + IB SHARP: NCCL's NVLS algorithm on a communicator with CollNet,
``all_reduce.h`` / ``all_gather.h`` / ``reduce_scatter.h``, ``connectNvls`` sets ``nvls.out``
to the network when CollNet is enabled). Inside each node NVLS works as above, but onto the
GPUs that own NICs (the NVLS heads, one per NIC): head ``h`` reads shard ``h`` reduced over
the node (``S/H`` of ``S``), sends it to its NIC, the SHARP switches reduce it across nodes
(:mod:`~dessim.collectives.algorithms.sharp`), and the head stores the result once to the
multicast object. Per GPU: ``S`` up plus ``S/H`` as a head, ``S/H`` down as a head plus ``S``
(``(1 + 1/p)·S`` each way when every GPU owns a NIC). All-gather: each GPU sends its block up
its NIC, the switches gather the rail's blocks of every node, and the head multicasts them
to the node (``S/p`` up, ``S`` down per GPU); reduce-scatter the reverse. NCCL enables it
only with CollNet (``updateCollCostTable``: NVLS with more than one node needs
``collNetSupport``), and all-gather / reduce-scatter only with one NIC per GPU
(``ncclTopoTuneModel``); ``check`` refuses otherwise.

**Pipeline fill (all-reduce inside one NVLink domain).** NCCL runs the single-node NVLS
all-reduce as three warp groups in a pipeline (NCCL 2.30.7 ``src/device/all_reduce.h``,
``RunWorkColl<ncclFuncAllReduce, …, NCCL_ALGO_NVLS, …>``, ``oneNode``): *scatter* copies
the user buffer into the NVLS unicast buffers, *reduce* reads each head's chunk reduced
through the switch and stores it to the multicast object, *gather* copies the result out.
Each channel walks its share in loops of ``nHeads`` chunks; the chunk shrinks with the
message (``calcCollChunking``: ``NCCL_NVLS_CHUNKSIZE`` 128 KiB, then 64, 32 and 16 KiB below
``64·ops·128K``, ``8·ops·64K`` and ``2·ops·32K`` bytes, ``ops = nvlsChannels · nHeads``;
``nvlsChannels`` 16 on Hopper, 32 on Blackwell). A three-stage pipeline takes its steady
time plus two stage times: the first loop's scatter and the last loop's gather. dessim takes
the stages as even (each moves a loop, ``ops`` chunks, at the pipeline's rate) and charges
the fill as ``2 · min(loop, S)`` more bytes on every flow — exact on an idle network, where
it adds ``2 · loop / rate`` (``2 · S / rate`` for a message smaller than one loop, whose stages
cannot overlap). On 8 × H100 the fill is 4 MiB of a 4 MiB message, 8 MiB from 8 to 64 MiB,
16 MiB up to 1 GiB and 32 MiB above (docs/collectives.md, "NVLS pipeline fill").

Latency: the critical path of the pipeline (:class:`~dessim.collectives.schedule.FluidSchedule`):
NVLS one hop into the switch; NVLSTree that plus ``2·log2(nodes)`` network hops; NVLS across
nodes that plus one network round trip — NCCL's latency formulas. NCCL's Tree across nodes
is :mod:`~dessim.collectives.algorithms.dbtree`.
"""

from __future__ import annotations

from dessim.collectives.algorithms.base import Algorithm, register
from dessim.catalog.devices import get_device
from dessim.collectives.algorithms.dbtree import node_tree_edges, tree_depth
from dessim.collectives.algorithms.sharp import (network_hop, one_nic_per_gpu, sharp_flows,
                                                 sharp_key, sharp_lanes)
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Flow, FluidSchedule, Lane
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["NVLS", "NVLSTree", "NVLS_EFFICIENCY", "NVLS_CHANNELS", "nvls_chunk_bytes",
           "nvls_fill_bytes", "nvswitch_of"]

#: NCCL 2.30.7 ``nvlsEfficiency`` by GPU generation (tuning.cc).
NVLS_EFFICIENCY: dict[str, float] = {"hopper": 0.85, "blackwell": 0.74}
#: Channels an NVLS call runs (NCCL ``NVLS_NCHANNELS_SM90`` / ``_SM100``, src/transport/nvls.cc).
NVLS_CHANNELS: dict[str, int] = {"hopper": 16, "blackwell": 32}
#: The largest NVLS chunk, bytes (``NCCL_NVLS_CHUNKSIZE``'s default).
NVLS_MAX_CHUNK = 128 * 1024
#: Warp groups of the single-node NVLS all-reduce pipeline: scatter, reduce + multicast, gather.
NVLS_STAGES = 3


def nvls_chunk_bytes(nbytes: float, concurrent_ops: int) -> int:
    """NCCL's NVLS chunk (bytes) for a call of ``nbytes`` with ``concurrent_ops`` =
    channels × heads (NCCL 2.30.7 ``calcCollChunking``, ``src/enqueue.cc``)."""
    chunk = NVLS_MAX_CHUNK
    if nbytes < 64 * concurrent_ops * chunk and chunk > 65536:
        chunk = 65536
    if nbytes < 8 * concurrent_ops * chunk and chunk > 32768:
        chunk = 32768
    if nbytes < 2 * concurrent_ops * chunk and chunk > 16384:
        chunk = 16384
    return chunk


def nvls_fill_bytes(nbytes: float, heads: int, channels: int) -> float:
    """Bytes of pipeline fill the single-node NVLS all-reduce pays, in units of the message
    (module docstring): ``(NVLS_STAGES − 1) × min(loop, nbytes)``, one loop being
    ``channels × heads`` chunks."""
    ops = channels * heads
    return (NVLS_STAGES - 1) * min(ops * nvls_chunk_bytes(nbytes, ops), nbytes)


def nvswitch_of(group: tuple[int, ...], topology: Topology) -> str | None:
    """The NVSwitch node every member of ``group`` links to over NVLink, or None."""
    graph = topology.graph
    common: set[str] | None = None
    for r in group:
        node = topology.node_of(r)
        sw = {v for _, v, d in graph.edges(node, data=True)
              if d["type"] == "nvlink" and graph.nodes[v]["kind"] == "switch"}
        common = sw if common is None else common & sw
        if not common:
            return None
    return min(common) if common else None


def _generations(group: tuple[int, ...], topology: Topology) -> set[str]:
    return {get_device(d).generation for d in (topology.device(r) for r in group) if d}


def _nvls_efficiency(group: tuple[int, ...], topology: Topology, what: str) -> float:
    gens = _generations(group, topology)
    effs = [NVLS_EFFICIENCY.get(g) for g in gens]
    if not effs or any(e is None for e in effs):
        raise CollectiveError(f"{what}: NVLink SHARP needs Hopper or Blackwell GPUs (sm90+); "
                              f"this group has {', '.join(sorted(gens)) or 'no declared GPU model'}")
    return min(e for e in effs if e is not None)


def _nvls_flows(members: tuple[int, ...], switch: str, op: str, size: float, eff: float,
                channel: int = 0) -> list[Flow]:
    """Per member: its bytes into and out of the switch (module docstring)."""
    n = len(members)
    up, down = {"allreduce": ((1 + 1 / n) * size, (1 + 1 / n) * size),
                "reducescatter": (size, size / n), "allgather": (size / n, size)}[op]
    flows = []
    for r in members:
        flows.append(Flow(r, switch, up / eff, channel))
        flows.append(Flow(switch, r, down / eff, channel))
    return flows


@register
class NVLS(Algorithm):
    name = "nvls"
    summary = ("NVLink SHARP: reduce and multicast in the NVSwitch (one NVLink domain, sm90+; "
               "across nodes with IB SHARP switches)")
    ops = frozenset({"allreduce", "reducescatter", "allgather"})

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        if topology is not None and nvswitch_of(group, topology) is None \
                and len(host_map(topology).split(group)) > 1:
            self._across(op, group, topology)
            return
        if topology is None or nvswitch_of(group, topology) is None:
            raise CollectiveError("nvls: every rank of the group must link to one NVSwitch "
                                  "(one NVLink domain); across nodes use nvlstree")
        _nvls_efficiency(group, topology, "nvls")

    def _across(self, op: Op, group: tuple[int, ...], topology: Topology):
        """Parts per node and SHARP lanes of NVLS across nodes, or why it cannot run."""
        try:
            parts, lanes = sharp_lanes(group, topology, None, "nvls")
        except CollectiveError as exc:
            raise CollectiveError(f"nvls: the group spans several nodes, not one NVSwitch; "
                                  f"across nodes NVLS needs IB SHARP switches (NVLS + CollNet; "
                                  f"else use nvlstree): {str(exc).removeprefix('nvls: ')}") from None
        for part in parts:
            if nvswitch_of(part, topology) is None:
                raise CollectiveError(f"nvls: ranks {list(part)} of one node do not share an "
                                      "NVSwitch")
        one_nic_per_gpu(op.name, parts, lanes, "nvls")
        _nvls_efficiency(group, topology, "nvls")
        return parts, lanes

    def emit(self, lane: Lane, op: Op, group, size, root, topology, options) -> None:
        raise CollectiveError("nvls runs as a fluid pipeline only")   # fluid() always answers

    def topology_key(self, group: tuple[int, ...], topology: Topology) -> object:
        """Across nodes: the SHARP lanes (:func:`~dessim.collectives.algorithms.sharp.sharp_key`)."""
        return sharp_key(group, topology)

    def fluid(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
              topology: Topology | None, channels: int | None, options: dict) -> FluidSchedule:
        switch = nvswitch_of(group, topology)  # type: ignore[arg-type]
        eff = _nvls_efficiency(group, topology, "nvls")  # type: ignore[arg-type]
        if switch is None:
            return self._fluid_across(op, group, size, root, topology, eff)  # type: ignore[arg-type]
        fill = 0.0
        if op.name == "allreduce":
            channels = min(NVLS_CHANNELS[g] for g in _generations(group, topology))  # type: ignore[arg-type]
            fill = nvls_fill_bytes(size, len(group), channels)
        flows = _nvls_flows(group, switch, op.name, size + fill, eff)  # type: ignore[arg-type]
        return FluidSchedule(op, self.name, group, size, root, flows, [(group[0], switch)],
                             {"channels": 1, "chunks": 1, "nvls_efficiency": eff,
                              "pipeline_fill_bytes": fill})

    def _fluid_across(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
                      topology: Topology, eff: float) -> FluidSchedule:
        """NVLS + SHARP (module docstring): NVLS onto the NIC heads in every node, SHARP
        across nodes, one lane per head."""
        parts, lanes = self._across(op, group, topology)
        n_heads, n = len(lanes), len(group)
        flows: list[Flow] = []
        for part in parts:
            sw = nvswitch_of(part, topology)
            if op.name != "allreduce":                       # one head per GPU here
                flows += _nvls_flows(part, sw, op.name, size, eff)  # type: ignore[arg-type]
                continue
            heads = {lane.heads[parts.index(part)] for lane in lanes}
            for r in part:                                   # reduce onto heads, multicast
                mine = size / n_heads if r in heads else 0.0
                flows.append(Flow(r, sw, (size + mine) / eff, 0))   # type: ignore[arg-type]
                flows.append(Flow(sw, r, (size + mine) / eff, 0))   # type: ignore[arg-type]
        for c, lane in enumerate(lanes):
            per = size / n_heads if op.name == "allreduce" else size / n
            flows += sharp_flows(op.name, lane, per, 1 + c)
        sw0 = nvswitch_of(parts[0], topology)
        critical = [(parts[0][0], sw0), network_hop(lanes[0])]
        return FluidSchedule(op, self.name, group, size, root, flows, critical,
                             {"channels": n_heads, "chunks": 1, "nvls_efficiency": eff})


@register
class NVLSTree(Algorithm):
    name = "nvlstree"
    summary = "NVLS inside each node + double binary tree of the NIC heads across nodes"
    ops = frozenset({"allreduce"})

    def check(self, op: Op, group: tuple[int, ...], topology: Topology | None,
              options: dict) -> None:
        if topology is None:
            raise CollectiveError("nvlstree needs a topology")
        parts = host_map(topology).split(group)
        if len(parts) < 2:
            raise CollectiveError("nvlstree runs across nodes; inside one NVLink domain use nvls")
        if len({len(p) for p in parts}) != 1:
            raise CollectiveError("nvlstree: every node must hold the same number of ranks of "
                                  f"the group, got {sorted({len(p) for p in parts})}")
        for p in parts:
            if nvswitch_of(p, topology) is None:
                raise CollectiveError(f"nvlstree: ranks {list(p)} of one node do not share an "
                                      "NVSwitch")
        _nvls_efficiency(group, topology, "nvlstree")

    def emit(self, lane: Lane, op: Op, group, size, root, topology, options) -> None:
        raise CollectiveError("nvlstree runs as a fluid pipeline only")

    def fluid(self, op: Op, group: tuple[int, ...], size: float, root: int | None,
              topology: Topology | None, channels: int | None, options: dict) -> FluidSchedule:
        parts = host_map(topology).split(group)  # type: ignore[arg-type]
        eff = _nvls_efficiency(group, topology, "nvlstree")  # type: ignore[arg-type]
        ppn = len(parts[0])
        flows: list[Flow] = []
        for part in parts:
            flows += _nvls_flows(part, nvswitch_of(part, topology), "allreduce", size, eff)  # type: ignore[arg-type]
        shard = size / ppn / 2          # per head, per tree
        trees = node_tree_edges(len(parts))
        for h in range(ppn):
            for t, edges in trees:
                for child, parent in edges:
                    a, b = parts[child][h], parts[parent][h]
                    flows.append(Flow(a, b, shard, 1 + 2 * h + t))
                    flows.append(Flow(b, a, shard, 1 + 2 * h + t))
        sw0 = nvswitch_of(parts[0], topology)  # type: ignore[arg-type]
        depth = tree_depth(len(parts))
        critical = [(parts[0][0], sw0)] + [(parts[0][0], parts[1][0])] * (2 * depth)
        return FluidSchedule(op, self.name, group, size, root, flows, critical,
                             {"channels": ppn * 2, "chunks": 1, "nvls_efficiency": eff})
