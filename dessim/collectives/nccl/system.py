"""What NCCL's topology search finds for a communicator on a dessim topology.

:func:`nccl_system` summarises a group of ranks on a :class:`~dessim.topology.graph.Topology`
as the :class:`~dessim.collectives.nccl.tuning.NcclSystem` NCCL's tuning model reads: GPU
architecture, nodes and GPUs per node, the ring/tree search result (channels and per-channel
bandwidth), and whether NVLink SHARP (NVLS) applies. It follows NCCL 2.30.7
(``src/graph/topo.cc``, ``search.cc``, ``connect.cc``; docs/references.md):

* bandwidths in NCCL's units (GB/s): an NVLink counts ``SM80_NVLINK_BW`` = 20.0,
  ``SM90_NVLINK_BW`` = 20.6 or ``SM100_NVLINK_BW`` = 40.1 GB/s per link (25 or 50 GB/s raw
  per direction), a PCIe x16 link ``width * GT/s code / 80`` (Gen4 24, Gen5 48 GB/s, i.e.
  24/31.5 of the raw rate), a NIC its line rate (400 Gb/s = 50 GB/s);
* the ring search (``ncclTopoCompute``): the first speed of NCCL's speed list not above the
  best GPU path (``maxBw``), as many channels as the links admit (each channel takes
  ``speed`` on every link it crosses, ``ncclTopoFollowPath``: the entry NIC, its PCIe link
  and the entry GPU's, the ``ppn - 1`` NVLink hops inside the node, the exit GPU's and exit
  NIC's PCIe links; :func:`_ring_channels`), lower speeds while above 0.49 times the best
  speed and only if strictly better, stopping once ``nChannels * speed`` reaches a GPU's
  NVLink total (``totalBw``); then ``ncclTopoDupChannels`` (×2 channels at half the speed
  unless the speed is below 25, or below 50 on sm90+ with more than 4 channels) and
  ``ncclTopoPostset`` (×2 execution channels, ×2 more on sm90+ across nodes with fewer than
  16 and speed above 45);
* the tree graph (``init.cc``: ``BALANCED_TREE``, on sm90 falling back to ``TREE``, with the
  ring's channel count as its minimum and maximum) finds the ring's speed across nodes;
  ``ncclTopoCompute``'s second pass then raises its ``bwIntra`` through the inter speed list
  while below twice ``bwInter`` and the NVLinks carry the chains
  (:func:`_tree_bw_intra`): DGX A100 8 × 30/24, DGX H100 8 × 48/48, DGX H100 on 200G
  Ethernet 8 × 48/24. NCCL's tree estimate reads ``bwIntra`` up to 2 nodes, ``bwInter``
  beyond (``tuning.cc``);
* NVLS: sm90+ GPUs on one NVSwitch; one NVLS channel per GPU at the fastest intra speed that
  fits (8 × 40 GB/s on a DGX H100).
* CollNet (IB SHARP): enabled when the group spans at least 2 nodes and every channel's NICs
  are joined by switches that declare ``sharp``
  (:func:`~dessim.collectives.algorithms.sharp.sharp_lanes`) — NCCL with the SHARP plugin and
  ``NCCL_COLLNET_ENABLE=1``; a SHARP fabric declares that the deployment runs them (the
  CoreWeave SHARP runs of validation/ did). Its two graphs (``init.cc``: the CollNetChain graph
  is a ``TREE`` pattern with the ring's channel count, the CollNetDirect graph one head per NIC,
  ``NCCL_TOPO_PATTERN_COLLNET_DIRECT``): inter-node speed = the ring's (the NIC path);
  ``ncclTopoCompute``'s second pass then raises the intra-node speed of these tree patterns
  through the inter speed list while it stays below twice the inter speed and the NVLinks
  carry it — a chain channel crosses ``ppn-1`` GPU links, spread over ``ppn`` GPUs; a direct
  head sends ``bw`` to the other GPUs and each GPU ``bw/(ppn-1)`` to every other head. DGX H100:
  chain 8 × 48/48, direct 8 × 48/48 GB/s; DGX A100: chain 8 × 30/24, direct 8 × 48/24.
  ``connect.cc`` then launches 1.5× the channels when the chain's intra speed exceeds its
  inter speed (reported only).

These reproduce the search results worked out from the source for DGX A100 (1 node: 12
channels × 20 GB/s, 24 executed; multi-node: 8 × 24, 16 executed; 4 HDR NICs: 4 × 24) and
DGX H100 (1 node: 12 × 30, 24 executed; multi-node: 8 × 48, 16 executed; NCCL debug logs in
nccl-tests#100 and nccl#892 agree; 4 × 400G: 4 × 48 duplicated to 8 × 24). An 800 Gb/s NIC
on the same PCIe Gen5 link finds the same 8 × 48 (the NIC's PCIe link admits one ring of 48,
and 8 rings of 48 already fill the NVLinks: 7 × 48 <= 370.8 < 8 × 48); a GB200 NVL72 ring
crosses all 72 GPUs of its NVLink domain, so the NVLinks admit 15 rings of 48 or 16 of 45.1
(kept: 721.6 > 720). Only NCCL's *choice* depends on them (:mod:`~dessim.collectives.nccl.tuning`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dessim.catalog.devices import get_device
from dessim.collectives.algorithms.sharp import sharp_lanes
from dessim.collectives.nccl.tuning import AMPERE, BLACKWELL, HOPPER, VOLTA, NcclSystem
from dessim.errors import CollectiveError
from dessim.topology.graph import Topology
from dessim.topology.hosts import HostMap, host_map

__all__ = ["nccl_system", "ARCH_OF_GENERATION", "arch_of"]

#: NCCL table row of each GPU generation; RCCL (MI300X) is given Ampere's rows [U].
ARCH_OF_GENERATION = {"volta": VOLTA, "ampere": AMPERE, "hopper": HOPPER,
                      "blackwell": BLACKWELL, "cdna3": AMPERE}
#: NCCL's per-NVLink bandwidth (GB/s) over the raw per-link rate (25 or 50 GB/s).
_NVLINK_FACTOR = {VOLTA: 20.0 / 25.0, AMPERE: 20.0 / 25.0, HOPPER: 20.6 / 25.0,
                  BLACKWELL: 40.1 / 50.0}
#: NCCL's PCIe x16 figure (Gen4: 16 * 120 / 80 = 24 GB/s) over the raw rate (31.5 GB/s).
_PCI_FACTOR = 24.0 / 31.5
_SPEED_INTRA = (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3)
_SPEED_INTRA_SM90 = (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3)
_SPEED_INTRA_SM100 = (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18)
_SPEED_INTER = (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12)
_SPEED_INTER_SM90 = (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12)
_SPEED_INTER_SM100 = (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4,
                      1.2, 0.24, 0.12)
#: MAXCHANNELS / 2: the most ring channels a search may find.
_MAX_SEARCH_CHANNELS = 32
_MAX_CHANNELS = 64
#: NVLS channels NCCL launches (NVLS_NCHANNELS_SM90 / _SM100), for reports.
_NVLS_EXEC_CHANNELS = {HOPPER: 16, BLACKWELL: 32}


def _speeds(arch: int, inter: bool) -> tuple[float, ...]:
    if arch >= BLACKWELL:
        return _SPEED_INTER_SM100 if inter else _SPEED_INTRA_SM100
    if arch >= HOPPER:
        return _SPEED_INTER_SM90 if inter else _SPEED_INTRA_SM90
    return _SPEED_INTER if inter else _SPEED_INTRA


def _search(speeds: tuple[float, ...], max_bw: float, total_bw: float,
            channels_at: Callable[[float], int]) -> tuple[int, float]:
    """Pass 1 of NCCL's ``ncclTopoCompute`` (``search.cc``): start at the first speed not above
    ``max_bw`` (the best GPU path, ``system->maxBw``), find ``channels_at(speed)`` channels,
    and try lower speeds while the next one is above 0.49 times the best graph's speed,
    keeping a graph only if ``nChannels * speed`` is strictly larger; stop once a graph
    reaches ``total_bw`` (``system->totalBw``, a GPU's NVLink or PCIe total) or the 32-channel
    maximum."""
    i = next((k for k, v in enumerate(speeds) if v <= max_bw * (1 + 1e-9)), len(speeds) - 1)
    n_best, bw_best = 0, speeds[i]
    while True:
        n = channels_at(speeds[i])
        if n * speeds[i] > n_best * bw_best:
            n_best, bw_best = n, speeds[i]
        if n_best >= _MAX_SEARCH_CHANNELS or n_best * bw_best >= total_bw - 1e-9:
            break
        if i + 1 >= len(speeds) or (n_best and speeds[i + 1] / bw_best <= 0.49):
            break
        i += 1
    return max(1, n_best), bw_best


def _fit(capacity: float, speed: float) -> int:
    """How many channels of ``speed`` GB/s a link of ``capacity`` GB/s admits: ``followPath``
    subtracts ``speed`` per channel (rounded to 1e-3, ``SUB_ROUND``) while it fits."""
    if math.isinf(capacity):
        return _MAX_CHANNELS
    return math.floor(capacity / speed + 1e-6)


@dataclass(frozen=True)
class _NodeLinks:
    """The links of one node a multi-node ring channel crosses, in NCCL's units (GB/s).

    ``nic_groups``: per set of NICs sharing the same local GPUs (a PCIe switch), the
    capacity of each of those NICs (``min(line rate, NIC PCIe link)``) and how many of the
    communicator's GPUs are local to them (PIX); ``gpu_pcie``: a GPU's PCIe link;
    ``gpu_intra``: a GPU's NVLink total (or its PCIe link when the GPUs talk over PCIe);
    ``all_local``: every member GPU has a NIC on its PCIe switch (or cabled to it); ``ppn``:
    member GPUs."""

    nic_groups: tuple[tuple[tuple[float, ...], int], ...]
    gpu_pcie: float
    gpu_intra: float
    intra_nvlink: bool
    all_local: bool
    ppn: int


def _ring_channels(links: _NodeLinks, speed: float) -> int:
    """Ring channels of ``speed`` GB/s that NCCL's search can place on ``links`` (NCCL 2.30.7,
    commit 5067397c: ``src/graph/search.cc`` ``followPath`` / ``ncclTopoFollowPath`` lines
    81-170, ``ncclTopoSearchNextGpuSort`` 253, ``ncclTopoSearchCheckNet`` 593,
    ``ncclTopoSearchRecGpu`` 621, ``ncclTopoSearchRecNet`` 724; PXN: ``src/graph/paths.cc``
    812-842; docs/references.md "NCCL 2.30.7 ring search bound").

    A channel enters the node from a NIC into a GPU local to it (NET -> NIC -> PCIe switch
    -> GPU: ``net.bw`` and both PCIe links are charged ``speed``), crosses the other
    ``ppn - 1`` GPUs over NVLink (each GPU -> NVSwitch -> GPU hop charges the sender's and the
    receiver's NVLink ``speed``) and leaves from its last GPU to a NIC local to that GPU
    (``crossNic``: that NIC may differ from the entry NIC; through PXN the last GPU would
    instead send over NVLink to the NIC's GPU, which saves no NVLink). So, per node:

    * entries (and exits) <= sum over PCIe switches of min(NIC capacity / speed, local GPUs
      x GPU PCIe / speed), each quotient floored;
    * every GPU sends on NVLink in every channel except those it ends: with ``c`` channels
      per GPU NVLink (``floor(NVLink / speed)``) and ends spread over the ``ppn`` GPUs,
      ``n - floor(n / ppn) <= c``, i.e. ``n <= floor(ppn * c / (ppn - 1))``, and a GPU ends
      at most ``floor(GPU PCIe / speed)`` channels (``n <= c + that``); when a member GPU
      has no NIC on its switch it never ends a channel, so ``n <= c``; receives are the
      mirror image (a GPU receives on NVLink in every channel it does not start);
    * GPUs talking over PCIe send both ring hops and NIC traffic on their one PCIe link:
      ``n <= floor(GPU PCIe / speed)``.

    The search is a bounded depth-first search; this is the number it finds when it is not
    cut short by its time budget, as on the DGX systems whose NCCL logs agree (module
    docstring). It assumes NICs and GPUs spread evenly over the PCIe switches, as every
    preset does."""
    entries = sum(min(sum(_fit(c, speed) for c in caps), gpus * _fit(links.gpu_pcie, speed))
                  for caps, gpus in links.nic_groups)
    n = min(entries, _MAX_SEARCH_CHANNELS)
    ppn = links.ppn
    if ppn > 1:
        per_gpu = _fit(links.gpu_intra, speed)
        if not links.intra_nvlink:
            n = min(n, per_gpu)
        elif links.all_local:
            n = min(n, (ppn * per_gpu) // (ppn - 1), per_gpu + _fit(links.gpu_pcie, speed))
        else:
            n = min(n, per_gpu)
    return n


def arch_of(topology: Topology, rank: int) -> int:
    """Row of NCCL's per-architecture tables for the GPU of ``rank`` (AMPERE when the
    topology names no device)."""
    device = topology.device(rank)
    return ARCH_OF_GENERATION.get(get_device(device).generation, AMPERE) if device else AMPERE


def nccl_system(group: tuple[int, ...], topology: Topology) -> NcclSystem:
    """The :class:`NcclSystem` NCCL would see for a communicator of ``group`` on
    ``topology`` (see the module docstring). Cached per group shape by the caller."""
    hosts = host_map(topology)
    parts = hosts.split(group)
    nodes, ppn = len(parts), max(len(p) for p in parts)
    graph = topology.graph
    gpu = topology.node_of(group[0])
    arch = arch_of(topology, group[0])
    # intra-node: NVLink bandwidth of a member (NCCL units) and whether an NVSwitch joins them
    nvl_raw = sum(float(d["bw"]) for _, _, d in graph.edges(gpu, data=True) if d["type"] == "nvlink")
    nvswitch = any(d["type"] == "nvlink" and graph.nodes[v]["kind"] == "switch"
                   for _, v, d in graph.edges(gpu, data=True))
    intra_nvlink = nvl_raw > 0
    pcie_raw = max((float(d["bw"]) for _, _, d in graph.edges(gpu, data=True)
                    if d["type"] == "pcie"), default=0.0)
    total = (nvl_raw * _NVLINK_FACTOR[arch] if intra_nvlink else pcie_raw * _PCI_FACTOR) / 1e9
    if total <= 0:   # a generic topology: the member's widest link, raw
        total = max((float(d["bw"]) for _, _, d in graph.edges(gpu, data=True)), default=1e9) / 1e9
    if nodes == 1:
        n_ch, bw = _search(_speeds(arch, False), total, total,
                           lambda v: min(_MAX_SEARCH_CHANNELS, _fit(total, v)))
        bw_inter = bw
        pxn_ok = True
    else:
        links, path = _node_links(topology, hosts, parts[0], total, intra_nvlink, pcie_raw)
        n_ch, bw = _search(_speeds(arch, True), path, total,
                           lambda v: _ring_channels(links, v))
        bw_inter = bw
        pxn_ok = bool(topology.meta.get("pxn", True))
    # ncclTopoDupChannels
    if not (bw < 25.0 or (arch >= HOPPER and bw < 50.0 and n_ch > 4)):
        dup = min(2 * n_ch, _MAX_SEARCH_CHANNELS)
        bw /= math.ceil(dup / n_ch)
        bw_inter /= math.ceil(dup / n_ch)
        n_ch = dup
    # ncclTopoPostset: execution channels
    execution = min(_MAX_CHANNELS, 2 * n_ch)
    if arch >= HOPPER and nodes > 1 and bw > 45.0 and execution < 16:
        execution = min(_MAX_CHANNELS, 2 * execution)
    collnet = _collnet_graphs(group, topology, arch, nodes, ppn, n_ch, bw_inter, total)
    if collnet and collnet["collnet_chain_bw_intra"] > collnet["collnet_chain_bw_inter"] \
            and len(group) > nodes:
        execution = min(_MAX_CHANNELS, execution + execution // 2)
    nvls = arch >= HOPPER and nvswitch and ppn > 1
    nvls_ch, nvls_bw = 0, 0.0
    if nvls:
        nvls_ch = min(32, ppn)
        fits = [v for v in _speeds(arch, False) if nvls_ch * v <= total + 1e-9]
        nvls_bw = fits[0] if fits else _speeds(arch, False)[-1]
    tree_intra = (_tree_bw_intra(_speeds(arch, True), bw_inter, n_ch, ppn, total)
                  if nodes > 1 and intra_nvlink else bw)
    return NcclSystem(arch=arch, ranks=len(group), nodes=nodes, ppn=ppn, channels=n_ch,
                      bw_intra=bw, bw_inter=bw_inter, tree_bw_intra=tree_intra,
                      intra_nvlink=intra_nvlink, inter_pxn_or_better=pxn_ok, nvls=nvls,
                      nvls_channels=nvls_ch, nvls_bw_intra=nvls_bw,
                      nvls_bw_inter=(bw_inter if nodes > 1 else nvls_bw),
                      collnet=bool(collnet), amd_cpu=topology.meta.get("cpu_vendor") == "amd",
                      execution_channels=execution, nvswitch=nvswitch, **collnet)


def _node_links(topology: Topology, hosts: HostMap, members: tuple[int, ...],
                gpu_intra: float, intra_nvlink: bool,
                pcie_raw: float) -> tuple[_NodeLinks, float]:
    """The :class:`_NodeLinks` of the host of ``members`` and the best GPU -> NET path
    bandwidth (``system->maxBw``: min of the GPU's PCIe link, the NIC's PCIe link and the
    NIC's line rate), in NCCL's units (GB/s)."""
    graph = topology.graph
    host = hosts.host_of(members[0])
    nics = [n for n in host.nics if any(host.nic_of.get(r) == n or r in host.pix.get(n, ())
                                        for r in members)] or list(host.nics)
    gpu_pcie = pcie_raw * _PCI_FACTOR / 1e9 if pcie_raw else math.inf

    def capacity(nic: str) -> float:
        line = min((float(graph.edges[nic, m]["bw"]) for m in graph.adj[nic]
                    if graph.nodes[m].get("kind") == "switch" and m not in hosts.domain),
                   default=25e9) / 1e9
        pci = [float(graph.edges[nic, m]["bw"]) * _PCI_FACTOR / 1e9 for m in graph.adj[nic]
               if m in hosts.domain and graph.edges[nic, m]["type"] == "pcie"]
        return min([line] + pci)

    groups: dict[frozenset[int], list[float]] = {}
    for nic in nics:        # the members a NIC is local to: on its PCIe switch, or its own
        near = set(host.pix.get(nic, ())) | {r for r, n in host.nic_of.items() if n == nic}
        groups.setdefault(frozenset(near) & frozenset(members), []).append(capacity(nic))
    local = frozenset().union(*groups)
    nic_groups = tuple((tuple(caps), len(gpus) or len(members)) for gpus, caps in groups.items())
    links = _NodeLinks(nic_groups, gpu_pcie, gpu_intra, intra_nvlink,
                       local >= frozenset(members), len(members))
    return links, min(gpu_pcie, max(c for caps, _ in nic_groups for c in caps))


def _raise_intra(speeds: tuple[float, ...], bw_inter: float,
                 fits: Callable[[float], bool]) -> float:
    """Pass 2 of ``ncclTopoCompute`` for tree patterns (``search.cc`` line 1280, "increase
    bwIntra for trees (2 nodes or collnet)"): from the graph's speed, step ``bwIntra`` up
    NCCL's inter speed list while it is below twice ``bw_inter`` and the search still
    places the graph's channels at the higher speed (``fits``)."""
    i = next((k for k, v in enumerate(speeds) if v <= bw_inter * (1 + 1e-9)), 0)
    intra = speeds[i]
    while i > 0 and intra < 2 * bw_inter and fits(speeds[i - 1]):
        i -= 1
        intra = speeds[i]
    return intra


def _tree_bw_intra(speeds: tuple[float, ...], bw_inter: float, channels: int, ppn: int,
                   nvlink: float) -> float:
    """``bwIntra`` of a multi-node tree graph (``TREE`` / ``BALANCED_TREE`` pattern, the ring's
    ``channels``, ``init.cc`` minChannels = maxChannels = the ring's) after pass 2
    (:func:`_raise_intra`). A tree channel enters a GPU from a NIC, returns to that NIC
    (``bwInter``) and chains through the other ``ppn - 1`` GPUs over NVLink, stepping to
    the next GPU (``ncclTopoSearchNextGpuSort``): every GPU but the chain's last sends
    ``bwIntra`` on its NVLink, and with chains started on every GPU in turn a GPU sends in
    ``channels - floor(channels / ppn)`` of them. ``nvlink``: a GPU's NVLink total, NCCL
    units (GB/s)."""
    if ppn < 2:
        return bw_inter
    sends = channels - channels // ppn
    return _raise_intra(speeds, bw_inter, lambda v: sends * v <= nvlink + 1e-6)


def _collnet_graphs(group: tuple[int, ...], topology: Topology, arch: int, nodes: int,
                    ppn: int, ring_channels: int, bw_inter: float, nvlink: float) -> dict:
    """CollNet fields of :class:`NcclSystem` (module docstring); empty when CollNet is off.
    ``nvlink``: a GPU's NVLink (or PCIe) bandwidth in NCCL's units."""
    if nodes < 2:
        return {}
    try:
        _, lanes = sharp_lanes(group, topology, None)
    except CollectiveError:
        return {}
    heads = len(lanes)
    speeds = _speeds(arch, True)
    chain = _tree_bw_intra(speeds, bw_inter, ring_channels, ppn, nvlink)
    per_gpu = 1 + (heads - 1) / (ppn - 1) if ppn > 1 else 1.0
    direct = _raise_intra(speeds, bw_inter, lambda v: v * per_gpu <= nvlink + 1e-9)
    return {"collnet_heads": heads, "collnet_chain_channels": ring_channels,
            "collnet_chain_bw_intra": chain, "collnet_chain_bw_inter": bw_inter,
            "collnet_direct_channels": heads, "collnet_direct_bw_intra": direct,
            "collnet_direct_bw_inter": bw_inter}
