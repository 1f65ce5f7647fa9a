"""DeepEP's expert-parallel kernels as dessim runs them (issue 18): the options of the rail
all-to-all for the normal (training) kernels, and the low-latency kernels' cost.

DeepSeek's DeepEP (github.com/deepseek-ai/DeepEP) replaces NCCL's all-to-all for MoE dispatch
and combine.

Normal kernels (``moe_dispatch: deepep``)
    A token crosses the network once per target node, on its own rail, and is forwarded over
    NVLink once per target GPU there (:mod:`dessim.collectives.algorithms.rail`, with
    :func:`deepep_rail_options`). The two phases are pipelined in DeepEP's RDMA chunks
    (:func:`deepep_pipeline_chunks`, :func:`deepep_window`), and the NVLink copies run at
    :data:`dessim.catalog.links.DEEPEP_NVLINK_EFFICIENCY` of the link rate
    (:func:`deepep_nvlink_efficiency`).

Low-latency kernels (:func:`low_latency_time`; ``csrc/kernels/internode_ll.cu`` at d8dd185)
    Each (token, expert) selection is one message straight to the expert's GPU, with no
    de-duplication. A message to a peer that NVSHMEM maps (``nvshmemi_get_p2p_ptr``; ``Buffer``
    defaults ``allow_nvlink_for_low_latency_mode=True``) is a warp's ``UNROLLED_WARP_COPY`` of
    SM stores into the peer's receive buffer, the copy primitive of the normal intranode
    kernels, so NVLink runs at the same copy efficiency (:func:`deepep_copy_calibration`).
    Other messages are IBGDA RDMA puts. That is a flat ``direct`` all-to-all. The kernel's
    receive stage then runs after the transfers, at the GPU's memory-bound kernel rate
    (:func:`low_latency_receive_bytes`). benchmarks/validate_deepep.py compares it with
    DeepEP's README (docs/collectives.md).
"""

from __future__ import annotations

from math import ceil
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from dessim.catalog.calibration import Calibration, LinkCalibration
from dessim.catalog.links import DEEPEP_NVLINK_EFFICIENCY
from dessim.collectives import run_collective
from dessim.engine.device import DeviceModel
from dessim.topology import load_topology
from dessim.workload.common.precision import PRECISIONS

if TYPE_CHECKING:
    from dessim.topology.graph import Topology
    from dessim.workload.transformer.routing import MoERouting

__all__ = ["DEEPEP_PIPELINE_CHUNKS", "DEEPEP_APPROXIMATION", "DEEPEP_CHANNELS", "DEEPEP_RDMA_CHUNK_TOKENS",
           "DEEPEP_RDMA_RECV_TOKENS", "deepep_window", "deepep_pipeline_chunks", "deepep_nvlink_efficiency",
           "deepep_rail_options", "LL_FP8_HEADER", "LL_SRC_INFO", "FP8_ROWS", "low_latency_row_bytes",
           "deepep_copy_calibration", "low_latency_receive_bytes", "low_latency_time"]

#: ``deepep``: the most chunks the rail all-to-all's network and NVLink phases are pipelined in
#: (:mod:`dessim.collectives.algorithms.rail` option ``pipeline_chunks``; fewer when DeepEP
#: itself has fewer, :func:`deepep_pipeline_chunks`), or None for no cap. The chunks'
#: latencies overlap (``window``), so more chunks no longer cost simulated time, only replay
#: time: a cap ``K`` leaves at most ``1/K`` of the faster phase exposed (an approximation from
#: above, named by :data:`DEEPEP_APPROXIMATION`). 8 keeps the replay cost of DeepSeek-V3's
#: 4,096-token dispatches; no cap (DeepEP's 24 chunks there) makes the 256-GPU README run
#: 1.1 % faster for 30 % more CPU, DeepEP's EP 32-64 kernels 4.6-6.7 % faster
#: (docs/collectives.md, "Validation against DeepEP's kernels").
DEEPEP_PIPELINE_CHUNKS: int | None = 8
DEEPEP_APPROXIMATION = (f"MoE all-to-all (moe_dispatch deepep): the network and NVLink phases "
                        f"pipelined in DeepEP's RDMA chunks per channel and node, at most "
                        f"{DEEPEP_PIPELINE_CHUNKS}, up to 128 RDMA tokens in flight per connection, a "
                        "slot freed when its chunk arrives (DeepEP frees it once forwarded)")
#: DeepEP's channels: ``Buffer.num_sms`` = 20 SMs by default, two per channel in the internode
#: kernels (``num_channels = num_sms / 2``; deepseek-ai/DeepEP @567632dd ``deep_ep/buffer.py``,
#: ``csrc/kernels/internode.cu``). Each channel sends its own contiguous range of the tokens.
DEEPEP_CHANNELS = 10
#: ``num_max_rdma_chunked_send_tokens`` of DeepEP's recommended configs by EP size, (dispatch,
#: combine) (``Buffer.get_dispatch_config`` / ``get_combine_config``, deepseek-ai/DeepEP
#: @567632dd ``deep_ep/buffer.py``): the tokens of one RDMA chunk a channel sends to a node.
DEEPEP_RDMA_CHUNK_TOKENS: Mapping[int, tuple[int, int]] = MappingProxyType({
    2: (6, 6), 4: (6, 6), 8: (6, 6), 16: (20, 12), 24: (8, 8), 32: (8, 8), 48: (8, 8), 64: (8, 8),
    96: (12, 8), 128: (12, 8), 144: (12, 8), 160: (12, 8)})
#: ``num_max_rdma_chunked_recv_tokens`` of every one of those configs: the tokens of the RDMA
#: ring buffer per (channel, source node) (same source). The ``Config`` constructor rounds it
#: up to a multiple of the chunk (``align_up``, ``csrc/config.hpp``), and the sender stalls
#: only while that many tokens are unacknowledged (``csrc/kernels/internode.cu``, ``dispatch``
#: ``kRDMASender``; ``combine`` likewise): ``recv / send`` chunks are in flight.
DEEPEP_RDMA_RECV_TOKENS = 128


def _deepep_send_tokens(ranks: int, combine: bool) -> int:
    """:data:`DEEPEP_RDMA_CHUNK_TOKENS` of the largest listed EP size up to ``ranks`` (the
    smallest listed one below it)."""
    size = max([k for k in DEEPEP_RDMA_CHUNK_TOKENS if k <= ranks] or [min(DEEPEP_RDMA_CHUNK_TOKENS)])
    return DEEPEP_RDMA_CHUNK_TOKENS[size][1 if combine else 0]


def deepep_window(ranks: int, combine: bool) -> int:
    """RDMA chunks DeepEP keeps in flight per (channel, node) on an EP group of ``ranks``:
    its receive buffer rounded up to whole chunks, in chunks
    (``align_up(recv, send) / send``, :data:`DEEPEP_RDMA_RECV_TOKENS`) — 16 at EP 24-64,
    7 (dispatch) / 11 (combine) at EP 16, 11 / 16 at EP 96-160."""
    send = _deepep_send_tokens(ranks, combine)
    return ceil(DEEPEP_RDMA_RECV_TOKENS / send)


def deepep_pipeline_chunks(tokens: float, ranks: int, node_hit: float, combine: bool) -> int:
    """Chunks of the rail all-to-all's pipeline for DeepEP moving ``tokens`` per rank over an EP
    group of ``ranks`` (``node_hit``: the probability that a token goes to a given node): the
    RDMA chunks one channel sends to one node — its ``tokens / DEEPEP_CHANNELS`` tokens times
    ``node_hit``, in chunks of :data:`DEEPEP_RDMA_CHUNK_TOKENS` (the config of the largest
    listed EP size up to ``ranks``) — at least 1 (and at most :data:`DEEPEP_PIPELINE_CHUNKS`
    if set). A small dispatch has few chunks, and DeepEP cannot overlap the phases of one
    chunk."""
    chunk = _deepep_send_tokens(ranks, combine)
    got = max(1, ceil(tokens / DEEPEP_CHANNELS * node_hit / chunk - 1e-9))
    return got if DEEPEP_PIPELINE_CHUNKS is None else min(DEEPEP_PIPELINE_CHUNKS, got)


def deepep_nvlink_efficiency(topology: "Topology", rank: int) -> float:
    """The fraction of the NVLink rate DeepEP's copies reach on GPU ``rank``
    (:data:`dessim.catalog.links.DEEPEP_NVLINK_EFFICIENCY` of the technology of its NVLink;
    1.0 for technologies without a measurement and GPUs without NVLink)."""
    graph = topology.graph
    node = topology.resolve(rank)
    for _, _, data in graph.edges(node, data=True):
        if data.get("type") == "nvlink":
            return DEEPEP_NVLINK_EFFICIENCY.get(data.get("tech"), 1.0)
    return 1.0


def deepep_rail_options(routing: "MoERouting", top_k: int, experts: int, nodes: int, per_node: int,
                        *, combine: bool, tokens: float, etp: int = 1,
                        nvlink_efficiency: float = 1.0) -> dict:
    """The :mod:`~dessim.collectives.algorithms.rail` options of a DeepEP all-to-all of
    ``tokens`` per rank over ``nodes`` hosts of ``per_node`` EP-group members (``etp`` of them
    one expert-TP group): ``network_share`` — a token crosses the network once per target node
    (:meth:`MoERouting.network_share`; each of the ``etp`` ranks sends ``1/etp`` of it) —,
    ``nvlink_share`` — once per target GPU over NVLink (:meth:`MoERouting.nvlink_share`) —,
    ``nvlink_first`` for the ``combine`` direction (DeepEP's combine reduces over NVLink on
    the forwarding GPU before the network phase), ``pipeline_chunks``
    (:func:`deepep_pipeline_chunks`, a node hit by ``nodes_per_token / nodes`` of the tokens)
    and ``window`` (:func:`deepep_window`: the chunks in flight per connection); and
    ``nvlink_efficiency`` when it is below 1 (:func:`deepep_nvlink_efficiency`)."""
    args = (top_k, experts, nodes, per_node // etp)
    node_hit = routing.nodes_per_token(top_k, experts, nodes) / nodes
    chunks = deepep_pipeline_chunks(tokens, nodes * per_node, node_hit, combine)
    options = {"network_share": routing.network_share(*args) / etp,
               "nvlink_share": routing.nvlink_share(*args),
               "nvlink_first": combine, "pipeline_chunks": chunks,
               "window": deepep_window(nodes * per_node, combine)}
    if nvlink_efficiency != 1.0:
        options["nvlink_efficiency"] = nvlink_efficiency
    return options


#: DeepEP's FP8 rows (``per_token_cast_to_fp8``: one fp32 scale per 128 elements) are the
#: ``fp8-block`` recipe's quantised bytes.
FP8_ROWS = PRECISIONS["fp8-block"]
#: Extra bytes of a low-latency FP8 message (``num_fp8_bytes`` of tests/test_low_latency.py: a
#: 16-byte header, the kernel's ``int4`` with the token's source index).
LL_FP8_HEADER = 16
#: Bytes of the source index the low-latency dispatch's receive stage stores per message
#: (``packed_recv_src_info``, an ``int``).
LL_SRC_INFO = 4


def low_latency_row_bytes(wire: str, hidden: int) -> float:
    """Bytes of one low-latency message of a ``hidden``-wide row: ``fp8`` — the header, the
    FP8 data and one fp32 scale per 128 elements; ``bf16`` — ``2·hidden``."""
    if wire == "bf16":
        return 2.0 * hidden
    return FP8_ROWS.quantized_bytes(hidden) + LL_FP8_HEADER


def deepep_copy_calibration(topology: "Topology", nvlink_efficiency: float | None = None
                            ) -> Calibration | None:
    """A calibration that runs every NVLink of ``topology`` at DeepEP's copy rate: the link's
    efficiency times ``nvlink_efficiency`` (None: :data:`DEEPEP_NVLINK_EFFICIENCY` of its
    technology). None when nothing changes (no NVLink, or a technology without a measurement)."""
    links = {}
    for _, _, data in topology.graph.edges(data=True):
        tech = data.get("tech")
        e = DEEPEP_NVLINK_EFFICIENCY.get(tech, 1.0) if nvlink_efficiency is None \
            else nvlink_efficiency
        if data.get("type") == "nvlink" and e != 1.0:
            links[tech] = LinkCalibration(efficiency=data["efficiency"] * e,
                                          source="DeepEP's NVLink copies (DEEPEP_NVLINK_EFFICIENCY)")
    return Calibration(name="deepep-copies", links=links) if links else None


def low_latency_receive_bytes(direction: str, nodes: int, tokens: float, selections: float,
                              hidden: int) -> float:
    """HBM bytes per rank of the low-latency kernel's receive stage that follow its transfers.
    Dispatch: once a message's (expert, source) count has arrived the kernel reads it from the
    receive buffer (header, FP8 data, scales) and stores its data, scales and source index in
    ``packed_recv_x``. The messages that arrive last, over the bottleneck, are copied after the
    all-to-all: all of them on one node, the share from other nodes, ``(nodes-1)/nodes``,
    across nodes (NVLink peers' messages arrive long before the NIC's). Combine: the kernel
    waits for every expert's flag and a grid sync, then reads the ``selections`` received BF16
    rows for the weighted reduction and writes one BF16 row per token."""
    if direction == "dispatch":
        per_message = low_latency_row_bytes("fp8", hidden) + FP8_ROWS.quantized_bytes(hidden) + LL_SRC_INFO
        late = 1.0 if nodes == 1 else (nodes - 1) / nodes
        return late * selections * per_message
    return (selections + tokens) * 2.0 * hidden


def low_latency_time(direction: str, nodes: int, selections: float, tokens: float, hidden: int,
                     topology: "Topology | str", gpu: str, *, hbm_bw: float | None = None,
                     nvlink_efficiency: float | None = None) -> tuple[float, str]:
    """Seconds of one low-latency ``direction`` kernel (``dispatch``: FP8 messages,
    ``combine``: BF16) that sends ``selections`` messages per rank for ``tokens`` tokens
    across every GPU of ``topology`` (``nodes`` hosts; module docstring), and what ran.
    ``gpu`` names the device model of the receive stage; ``hbm_bw`` (bytes/s) replaces its HBM
    rate and ``nvlink_efficiency`` DeepEP's catalogued copy efficiency."""
    topology = load_topology(topology) if isinstance(topology, str) else topology
    row = low_latency_row_bytes("fp8" if direction == "dispatch" else "bf16", hidden)
    res = run_collective("alltoall", selections * row, topology, algo="direct",
                         calibration=deepep_copy_calibration(topology, nvlink_efficiency))
    device = DeviceModel.for_device(gpu)
    nbytes = low_latency_receive_bytes(direction, nodes, tokens, selections, hidden)
    receive = (device.kernel_time("memory", (), 0.0, nbytes) - device.launch_overhead) \
        * device.device.hbm_bw / (hbm_bw or device.device.hbm_bw)
    return res.time_s + receive, f"{res.algorithm}+receive"
