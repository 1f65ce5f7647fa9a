"""NCCL's own cost model: how NCCL picks an algorithm and a protocol for a collective.

A transcription of ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` (``src/graph/tuning.cc``)
and of the selection rules of ``src/enqueue.cc`` in **NCCL 2.30.7** (NVIDIA/nccl, commit
5067397c2676d5aed50042fc39e5c8ee96eb0027; docs/references.md). Every constant below is that
release's; NVIDIA changes them between releases.

NCCL uses this model to *choose*; NVIDIA does not calibrate it to predict absolute times, and
dessim does not use it for timing: the chosen algorithm and protocol are simulated on the
topology (:mod:`dessim.collectives.executor`). What this module answers is *which*
(algorithm, protocol) NCCL would run, and its estimate, shown in every ``auto`` explanation.

Units follow NCCL inside the formulas (µs, GB/s = bytes/ns) and SI at the interface:
:func:`algo_time` returns seconds. Inputs are an :class:`NcclSystem`: what NCCL's topology
search found for a communicator (see :mod:`dessim.collectives.nccl.system`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ALGORITHMS", "PROTOCOLS", "NcclSystem", "algo_time", "allowed", "tree_efficiency",
           "BASE_LATENCY_US", "HW_LATENCY_US", "VOLTA", "AMPERE", "HOPPER", "BLACKWELL",
           "NVLINK", "PCI", "NET"]

#: NCCL algorithm indices (src/include/device.h order) by dessim name.
ALGORITHMS: tuple[str, ...] = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls",
                               "nvls_tree", "pat")
#: NCCL protocol names (index 0, 1, 2).
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")

#: Architecture rows of the bandwidth tables (compute capability <80, 80-89, 90-99, >=100).
VOLTA, AMPERE, HOPPER, BLACKWELL = 0, 1, 2, 3
#: Link classes of the latency table.
NVLINK, PCI, NET = 0, 1, 2

#: ``baseLat`` (µs) per algorithm, (LL, LL128, Simple).
BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0)}

#: ``hwLat`` (µs) per link class, algorithm, (LL, LL128, Simple).
HW_LATENCY_US: dict[int, dict[str, tuple[float, float, float]]] = {
    NVLINK: {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0, 0, 3.7),
             "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0),
             "pat": (0, 0, 4.0)},
    PCI: {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0, 0, 3.7),
          "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
          "pat": (0, 0, 4.0)},
    NET: {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0, 0, 31.0),
          "collnet_chain": (0, 0, 30.0), "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 20.9),
          "pat": (0, 0, 14.0)},
}

# Bandwidth caps (GB/s), rows by architecture, columns by node count (1, 2, >= 3 nodes).
_LL_MAX_BW_ARCH = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0),
                   (282.0, 90.0, 70.0))
#: multi-node LL caps by CPU vendor: row 0 Intel/other, row 1 AMD (``llMaxBws`` rows 0-1)
_LL_MAX_BW_CPU = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0))
_PER_CH_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7),
                      (40.0, 40.0, 40.0))
_PER_CH_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                      (55.6, 31.67, 20.0))
_PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0),
                (70.0, 42.8, 24.0))
_PER_CH_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5),
                     (0.0, 96.0, 80.0))
_NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)

#: ``busBw *= .92`` of a Tree all-reduce: the tree kernel's reduce-and-forward overhead.
_TREE_ALLREDUCE = 0.92
#: ``busBw *= 0.85`` on sm90+ (the search falls back from BALANCED_TREE to TREE).
_TREE_SM90 = 0.85
#: Tree protocol fractions of ``ncclTopoTuneModel`` by node count: LL ``/3.8``, LL128
#: ``7/9`` on one node and ``120/128`` across nodes, Simple 1.
_TREE_PROTOCOL = {"LL": lambda nodes: 1.0 / 3.8,
                  "LL128": lambda nodes: 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0,
                  "Simple": lambda nodes: 1.0}


def tree_efficiency(op: str, proto: str, arch: int, nodes: int) -> float:
    """Fraction of its channels' bandwidth that NCCL's Tree reaches in ``ncclTopoTuneModel``
    (NCCL 2.30.7 ``tuning.cc``): ``.92`` for all-reduce, × the protocol's fraction (LL
    ``1/3.8``, LL128 ``7/9`` on one node or ``120/128`` across nodes), × ``0.85`` on Hopper
    and later. The per-channel caps (``perChMaxTreeBws``) are not part of it.

    The executor divides the bandwidth of the Tree's simulated flows by this (its wire
    bytes grow by its inverse, in place of the protocol's ring framing), so that a pipelined
    Tree on idle links runs at NCCL's own estimate of it: nccl#1368 (5 × 8 H100, 4 × 400G
    RoCE per node, ``NCCL_ALGO=Tree``) measures 150 GB/s busbw where the links alone allow
    193 and NCCL's model gives 146."""
    eff = (_TREE_ALLREDUCE if op == "allreduce" else 1.0) * _TREE_PROTOCOL[proto](nodes)
    return eff * (_TREE_SM90 if arch >= HOPPER else 1.0)


#: ``treeCorrectionFactor[proto][log2(bytes/64)]`` for 64 B .. 512 MiB.
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)

#: Which algorithms NCCL's model allows per collective (enqueue.cc); NVLS only with Simple.
_ALLOWED: dict[str, tuple[str, ...]] = {
    "allreduce": ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree"),
    "allgather": ("ring", "pat", "nvls", "collnet_direct"),
    "reducescatter": ("ring", "pat", "nvls", "collnet_direct"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
}


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL's topology search knows about one communicator (see
    :func:`dessim.collectives.nccl.system.nccl_system`). Bandwidths in GB/s per channel
    (NCCL's units), as the search graphs hold them."""

    arch: int                   #: VOLTA, AMPERE, HOPPER or BLACKWELL
    ranks: int
    nodes: int
    ppn: int                    #: GPUs of the communicator per node (the largest)
    channels: int               #: ring/tree search channels (after duplication)
    bw_intra: float             #: ring/tree graph per-channel bandwidth inside a node
    bw_inter: float             #: ring/tree graph per-channel bandwidth across nodes
    intra_nvlink: bool          #: GPUs of a node talk over NVLink (else PCIe)
    inter_pxn_or_better: bool = True   #: GPU-NIC paths no worse than PXN (LL128 across nodes)
    #: tree graph bwIntra (search pass 2 raises it on multi-node trees; 0: ``bw_intra``)
    tree_bw_intra: float = 0.0
    nvls: bool = False          #: NVLink SHARP available (NVSwitch, sm90+)
    nvls_channels: int = 0      #: NVLS search channels (heads)
    nvls_bw_intra: float = 0.0
    nvls_bw_inter: float = 0.0
    collnet: bool = False       #: in-network reduction (SHARP) enabled
    amd_cpu: bool = False       #: multi-node LL cap and network overhead rows
    execution_channels: int = 0  #: channels NCCL launches (after Postset), for reports
    nvswitch: bool = False      #: the GPUs of a node share an NVSwitch (CollNetDirect needs it)
    collnet_heads: int = 0      #: collNetHeadsNum: CollNet heads per node (one per NIC)
    collnet_chain_channels: int = 0     #: CollNetChain graph channels
    collnet_chain_bw_intra: float = 0.0  #: CollNetChain graph bwIntra (GB/s per channel)
    collnet_chain_bw_inter: float = 0.0
    collnet_direct_channels: int = 0    #: CollNetDirect graph channels (heads)
    collnet_direct_bw_intra: float = 0.0
    collnet_direct_bw_inter: float = 0.0

    @property
    def index2(self) -> int:
        """Column of the per-node-count tables: 1 node, 2 nodes, 3 or more."""
        return self.nodes - 1 if self.nodes <= 2 else 2


def allowed(op: str, system: NcclSystem) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL's model considers for ``op`` on ``system``
    (``updateCollCostTable`` and the default enables of ``ncclTopoTuneModel``).

    CollNet (``system.collnet``: SHARP switches, the CollNet plugin, ``NCCL_COLLNET_ENABLE``):
    CollNetChain and CollNetDirect with Simple and at most ``NCCL_MAX_DIRECT_ARITY`` + 1 = 8
    GPUs per node, CollNetDirect only on NVSwitch systems; NVLS across nodes only with
    CollNet; all-gather and reduce-scatter over CollNetDirect or NVLS across nodes only when
    the plugin has ``iallgather`` / ``ireducescatter`` (the SHARP plugin has) and every node
    has at most as many GPUs as CollNet heads."""
    out = []
    one_per_head = system.collnet and system.ppn <= system.collnet_heads
    for algo in _ALLOWED.get(op, ()):
        if algo in ("nvls", "nvls_tree"):
            if not system.nvls:
                continue
            if algo == "nvls_tree" and system.nodes == 1:
                continue
            if algo == "nvls" and system.nodes > 1 and not system.collnet:
                continue
            if op != "allreduce" and (system.ppn > 32 or (system.nodes > 1 and not one_per_head)):
                continue
        if algo.startswith("collnet"):
            if not system.collnet or system.ppn > 8:
                continue
            if algo == "collnet_direct" and not system.nvswitch:
                continue
            if op != "allreduce" and not one_per_head:
                continue
        if algo == "pat" and not (system.ppn == 1 and system.nodes > 1):
            continue
        for proto in PROTOCOLS:
            if algo in ("nvls", "nvls_tree", "pat") and proto != "Simple":
                continue
            if algo.startswith("collnet") and proto != "Simple":
                continue
            if proto == "LL128" and not _ll128_enabled(system):
                continue
            out.append((algo, proto))
    return out


def _ll128_enabled(system: NcclSystem) -> bool:
    """LL128 by default: NVLink inside nodes (``typeIntra <= PATH_NVB``) and, across nodes,
    NIC paths no worse than PXN on sm90+ (``NCCL_LL128_C2C``) or PXB before; never before
    Volta (dessim's catalog has nothing older)."""
    if not system.intra_nvlink:
        return False
    return system.nodes == 1 or system.inter_pxn_or_better


def _bus_bw(op: str, algo: str, proto: str, s: NcclSystem) -> float:
    """``busBw`` of ``ncclTopoTuneModel`` (GB/s), 0 when the combination is disabled."""
    idx = s.index2
    if algo in ("nvls", "nvls_tree"):
        n_ch = s.nvls_channels
        if n_ch < 2:
            return 0.0
        intra = s.nvls_bw_intra * _NVLS_EFFICIENCY[s.arch] * (n_ch - 1) / n_ch
        intra *= 2 if op == "allreduce" else (s.ppn - 1) / s.ppn
        inter = s.nvls_bw_inter * (2 if (s.nodes <= 2 and algo == "nvls_tree") else 1)
        bw = min(intra, inter) if s.nodes > 1 else intra
        if algo == "nvls_tree":
            bw = min(bw, _PER_CH_NVLS_TREE[s.arch][idx])
        return n_ch * bw
    if algo == "collnet_chain":      # nChannels * bwIntra of the CollNetChain graph
        return s.collnet_chain_channels * s.collnet_chain_bw_intra if proto == "Simple" else 0.0
    if algo == "collnet_direct":
        if proto != "Simple" or s.collnet_direct_channels < 1:
            return 0.0
        if op in ("allgather", "reducescatter"):
            return s.ppn * min(s.collnet_direct_bw_intra, 0.9 * s.collnet_direct_bw_inter)
        bus = s.collnet_direct_channels * s.collnet_direct_bw_intra
        factor = s.ppn / s.collnet_direct_channels   # "requires all GPUs to have a local NIC"
        factor -= (factor - 1) / 2
        bus /= factor
        if s.arch >= HOPPER:
            bus *= 0.85
        return bus
    bw = ((s.tree_bw_intra or s.bw_intra) if algo == "tree" else s.bw_intra) \
        if s.nodes <= 2 else s.bw_inter       # graphs[a]->bwIntra of the algorithm's graph
    bus = s.channels * bw
    ll_max = (_LL_MAX_BW_ARCH[s.arch][0] if s.nodes == 1
              else _LL_MAX_BW_CPU[1 if s.amd_cpu else 0][idx])
    if algo == "ring":
        if proto == "LL":
            bus = min(ll_max, bus * 0.5)
        elif proto == "LL128":
            bus = min(bus * 0.92, s.channels * _PER_CH_RING_LL128[s.arch][idx])
    elif algo == "tree":
        if op == "allreduce":
            bus = min(bus * _TREE_ALLREDUCE, s.channels * _PER_CH_TREE[s.arch][idx])
        if proto == "LL":
            bus = min(bus * _TREE_PROTOCOL["LL"](s.nodes), ll_max)
        elif proto == "LL128":
            bus = min(bus * _TREE_PROTOCOL["LL128"](s.nodes),
                      s.channels * _PER_CH_TREE_LL128[s.arch][idx])
        if s.arch >= HOPPER:   # sm90 falls back from the balanced tree to the plain TREE pattern
            bus *= _TREE_SM90
    elif algo == "pat":
        bus *= 0.75
    return bus


def _latency_us(op: str, algo: str, proto: str, s: NcclSystem) -> float:
    """Latency (µs) of ``ncclTopoTuneModel`` for one call."""
    p = PROTOCOLS.index(proto)
    intra_hw = NVLINK if s.intra_nvlink else PCI
    intra = HW_LATENCY_US[intra_hw][algo][p]
    inter = HW_LATENCY_US[NET][algo if s.ppn > 1 else "tree"][p]
    lat = BASE_LATENCY_US[algo][p]
    n_ranks, n_nodes, ppn = s.ranks, s.nodes, s.ppn
    if algo == "ring":
        if op in ("allreduce", "allgather", "reducescatter"):
            nsteps = 2 * (n_ranks - 1) if op == "allreduce" else n_ranks - 1
            if n_nodes > 1:
                overhead = (2.0 if s.amd_cpu else 1.0) * (3 if proto == "Simple" else 1)
                intra = max(intra, overhead)
            inter_steps = 0 if n_nodes == 1 else (2 * (n_nodes - 1) if op == "allreduce"
                                                  else n_nodes - 1)
            return lat + (nsteps - inter_steps) * intra + inter_steps * inter
        hw = intra if n_nodes == 1 else HW_LATENCY_US[NET]["ring"][p]
        return lat + n_ranks * hw
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + _log2i(n_nodes) * inter)
    if algo == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algo == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if n_nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return lat + intra + 2 * _log2i(n_nodes) * inter
    if algo == "pat":
        return lat + _log2i(n_nodes) * (inter / 3.5) + n_ranks * 2.8
    raise ValueError(algo)


def _log2i(n: int) -> int:
    return max(0, int(n).bit_length() - 1)


def algo_time(op: str, algo: str, proto: str, nbytes: float, system: NcclSystem) -> float | None:
    """NCCL's estimate (seconds) for ``op`` of ``nbytes`` (nccl-tests size) with ``algo`` and
    ``proto`` on ``system``; None if NCCL's model disables the combination."""
    if (algo, proto) not in allowed(op, system):
        return None
    bus = _bus_bw(op, algo, proto, system)
    if bus <= 0:
        return None
    n = system.ranks
    if op in ("allgather", "reducescatter") and algo != "ring":
        bw = bus                       # "skipped for non-Ring AG/RS"
    elif algo in ("ring", "nvls", "nvls_tree"):
        nsteps = {"allreduce": 2 * (n - 1), "allgather": n - 1, "reducescatter": n - 1}.get(op, n)
        bw = bus * n / nsteps
    else:                              # tree, collnet, pat
        bw = bus * 0.5
    lat = _latency_us(op, algo, proto, system)
    log_size = int(nbytes) >> 6
    log_size = log_size.bit_length() - 1 if log_size > 0 else -1
    p = PROTOCOLS.index(proto)
    if op == "allreduce" and algo == "tree" and 0 <= log_size < 23:
        bw *= _TREE_CORRECTION[p][log_size]
    if (op == "allreduce" and algo == "ring" and proto == "Simple" and system.nodes > 1
            and nbytes / (system.channels * n) >= 64):
        lat *= 1.9 if system.arch == VOLTA else 1.4
    return (lat + nbytes / (1000.0 * bw)) * 1e-6 if math.isfinite(bw) else None
