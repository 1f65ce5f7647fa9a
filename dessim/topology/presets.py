"""Presets of real systems: DGX A100 / DGX H100 nodes and rail-optimised clusters, a PCIe-only
server and a node with CXL memory expanders.

Every figure comes from the catalog (:mod:`dessim.catalog`): link bandwidth, latency and
protocol efficiency from :data:`~dessim.catalog.links.LINK_TECHS`, GPU models from
:data:`~dessim.catalog.devices.DEVICES`. ``ideal=True`` sets every link efficiency to 1.0.

Node layout of one DGX node ``n<k>`` (DGX BasePOD RA for DGX H100, Microway DGX A100 review for
DGX A100; short names of docs/references.md)::

    n<k>.gpu0..7   GPUs (rank 8k + i), transit=False: they do not forward IB/PCIe traffic
    n<k>.nvsw      ONE logical NVSwitch: the 6 (A100) or 4 (H100) NVSwitch chips are
                   aggregated into a single switch node; each GPU's link carries its whole
                   per-GPU NVLink bandwidth (300 / 450 GB/s per direction)
    n<k>.pcie0..3  PCIe switches; pcie<j> holds gpu2j, gpu2j+1, nic2j, nic2j+1 (Gen4 on A100,
                   Gen5 on H100) and links to cpu<j // 2>
    n<k>.nic0..7   compute NICs, one per GPU (IB HDR 200 Gb/s on A100, NDR 400 Gb/s on H100);
                   NIC i is on rail i (node attribute ``rail``: the rail leaf it is cabled to)
    n<k>.cpu0..1   CPU sockets, joined by a socket link (UPI/xGMI, [U] figure)
    n<k>.mem0..1   host memory (kind host_mem, capacity bytes) behind a ddr link per socket

Scale-out (``nodes > 1``): rail-optimised fat tree (DGX SuperPOD H100 RA, "Network Fabrics"):
NIC i of every node of scalable unit (SU) s (nodes 32s..32s+31) connects to rail leaf
``leaf.su<s>.r<i>``; every leaf links once (aggregated) to every spine ``spine<k>``. Default
spine count = min(leaves / 2, ceil(nodes per leaf / oversub)), at least 1: the SuperPOD's 16
spines per 32 leaves, and no uplink slower than a NIC port on smaller clusters; each leaf's
aggregate uplink = its aggregate downlink / ``oversub`` (1.0: non-blocking), split evenly over
the spines. Same-rail traffic in an SU is one leaf hop; cross-rail or cross-SU traffic goes
through a spine. dims ``(8, nodes)``, rank = 8 * node + local GPU index.

``routing`` (:data:`dessim.topology.routing.ROUTINGS`): how a leaf picks the spine. Default by
the NIC technology: InfiniBand fabrics route statically by destination, D-mod-K as OpenSM's
fat-tree engine does (``dmodk``: every flow to one NIC takes one spine, NICs under one leaf
come down different spines); Ethernet fabrics hash each flow (``ecmp``).

``sharp=True`` declares every leaf and spine switch able to reduce in the network (InfiniBand
SHARP, switch attribute ``sharp``). NVIDIA's Quantum (HDR) and Quantum-2 (NDR) InfiniBand
switches implement SHARP, but NCCL only uses it with the SHARP CollNet plugin
(Mellanox/nccl-rdma-sharp-plugins) and ``NCCL_COLLNET_ENABLE=1`` (NCCL's default is off), so
the presets leave it off (:mod:`dessim.topology.sharp`, docs/collectives.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx

from dessim.catalog.devices import GPUSpec, get_device
from dessim.catalog.links import LinkTech, get_link_tech
from dessim.errors import TopologyError
from dessim.topology.graph import Topology
from dessim.topology.routing import ROUTINGS
from dessim.units import parse_bandwidth, parse_count, parse_size

__all__ = ["dgx_a100", "dgx_h100", "dgx_b200", "gb200_nvl72", "pcie_server", "cxl_node", "PRESETS", "DGX_GPUS",
           "SU_SIZE", "suggested_topology"]

#: GPUs per DGX node.
DGX_GPUS = 8
#: Nodes per scalable unit of the rail-optimised fabric (DGX SuperPOD H100 RA).
SU_SIZE = 32

GB = 1e9


def _attrs(tech: LinkTech, ideal: bool, bw: float | None = None) -> dict[str, Any]:
    """Edge attributes of one link of technology ``tech`` (catalog figures)."""
    return {"type": tech.type, "bw": tech.bw if bw is None else bw, "lat": tech.lat,
            "duplex": tech.duplex, "efficiency": 1.0 if ideal else tech.efficiency,
            "tech": tech.name}


def _add_scaleup(g: nx.Graph, prefix: str, gpus: list[str], dev: GPUSpec, ideal: bool) -> None:
    """Scale-up fabric of one node: NVLink → one logical NVSwitch ``<prefix>nvsw`` with one
    link per GPU at the per-GPU NVLink bandwidth; Infinity Fabric → a direct link per GPU
    pair at the per-link figure (MI300X platforms are fully connected)."""
    tech = get_link_tech(dev.scaleup_link)
    if tech.type == "nvlink":
        sw = f"{prefix}nvsw"
        g.add_node(sw, kind="switch")
        for gpu in gpus:
            g.add_edge(gpu, sw, **_attrs(tech, ideal, dev.scaleup_bw))
    else:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                g.add_edge(a, b, **_attrs(tech, ideal))


def _add_host(g: nx.Graph, prefix: str, gpus: list[str], nics: list[str], pcie: LinkTech,
              ddr: LinkTech, mem_per_socket: float, gpus_per_switch: int,
              ideal: bool) -> list[str]:
    """PCIe switches (``gpus_per_switch`` GPUs and an equal share of the NICs each), 2 CPU sockets joined
    by a socket link, one host memory per socket. Switch j hangs off cpu ``2j // switches``.
    Returns the PCIe switch names."""
    if len(gpus) % gpus_per_switch:
        raise TopologyError(f"{len(gpus)} GPUs cannot be split evenly over PCIe switches of "
                            f"{gpus_per_switch} GPUs each")
    n_sw = len(gpus) // gpus_per_switch
    socket = get_link_tech("socket")
    cpus = [f"{prefix}cpu{c}" for c in range(2)]
    for c, cpu in enumerate(cpus):
        g.add_node(cpu, kind="cpu")
        mem = f"{prefix}mem{c}"
        g.add_node(mem, kind="host_mem", capacity=mem_per_socket)
        g.add_edge(cpu, mem, **_attrs(ddr, ideal))
    g.add_edge(cpus[0], cpus[1], **_attrs(socket, ideal))
    switches = []
    for j in range(n_sw):
        sw = f"{prefix}pcie{j}"
        switches.append(sw)
        g.add_node(sw, kind="switch")
        members = gpus[j * gpus_per_switch:(j + 1) * gpus_per_switch]
        members += nics[j * len(nics) // n_sw:(j + 1) * len(nics) // n_sw]
        for m in members:
            g.add_edge(m, sw, **_attrs(pcie, ideal))
        g.add_edge(sw, cpus[(2 * j) // n_sw], **_attrs(pcie, ideal))
    return switches


@dataclass(frozen=True, slots=True)
class DGXDesign:
    """What differs between DGX generations (catalog keys; DGX BasePOD RA, Microway DGX A100
    review in docs/references.md)."""

    system: str
    default_gpu: str
    allowed_gpus: tuple[str, ...]
    nic: str
    pcie: str
    ddr: str
    host_mem_per_socket: float
    host_mem_source: str
    cpu_vendor: str = "intel"   #: "amd" or "intel": rows of NCCL's tuning tables


DGX_A100 = DGXDesign("dgx_a100", "A100-80GB", ("A100-40GB", "A100-80GB"), "ib_hdr", "pcie4",
                     "ddr4", 512 * GB,
                     "[C2] 1 TB DDR4 (Microway DGX A100 review) split over 2 sockets",
                     cpu_vendor="amd")   # 2 x AMD EPYC 7742
DGX_H100 = DGXDesign("dgx_h100", "H100", ("H100", "H800", "H200"), "ib_ndr", "pcie5", "ddr5",
                     1000 * GB,
                     "[C] 2 TB DDR5 (DGX BasePOD RA) split over 2 sockets")
# DGX B200 datasheet: 8 x B200 on 2 NVSwitch chips (NVLink5, 1.8 TB/s per GPU), 8 single-port
# ConnectX-7 400 Gb/s compute NICs, 2 x Xeon Platinum 8570, 2 TB DDR5 (up to 4 TB)
DGX_B200 = DGXDesign("dgx_b200", "B200", ("B200",), "ib_ndr", "pcie5", "ddr5", 1000 * GB,
                     "[C2] 2 TB DDR5 (DGX B200 datasheet) split over 2 sockets")


def _scaleout(where: str, oversub: object, nic: object, nic_bw: object) -> tuple[float, LinkTech]:
    """The checked oversubscription and NIC technology (``nic_bw``: another port speed of the
    same technology) of a rail-optimised fabric."""
    try:
        oversub = float(oversub)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: oversub {oversub!r} is not a number") from None
    if not (oversub > 0 and math.isfinite(oversub)):
        raise TopologyError(f"{where}: oversub {oversub!r} must be a finite number > 0")
    nic_tech = get_link_tech(str(nic), f"{where} nic")
    if nic_tech.type not in ("ib", "ethernet"):
        raise TopologyError(f"{where}: nic {nic_tech.name!r} is a {nic_tech.type} link, not a "
                            "scale-out (ib or ethernet) technology")
    if nic_bw is not None:  # same technology (latency, efficiency), another port speed
        nic_tech = replace(nic_tech, name=f"{nic_tech.name}@{nic_bw}",
                           bw=parse_bandwidth(nic_bw, f"{where} nic_bw"))
    return oversub, nic_tech


def fabric_routing(routing: object, nic: LinkTech, where: str) -> str:
    """The fabric's routing (:data:`~dessim.topology.routing.ROUTINGS`): ``routing`` when
    given, else by the scale-out technology — InfiniBand's destination-based D-mod-K
    (``dmodk``: what OpenSM's fat-tree engine sets up) for ``ib`` links, per-flow hashing
    (``ecmp``) for Ethernet."""
    if routing is None:
        return "dmodk" if nic.type == "ib" else "ecmp"
    if routing not in ROUTINGS:
        raise TopologyError(f"{where}: routing={routing!r}; valid: "
                            + "; ".join(f"{k} ({v})" for k, v in ROUTINGS.items()))
    return str(routing)


def _rail_fabric(g: nx.Graph, where: str, nodes: int, n_nics: int, nic: LinkTech, su_size: int,
                 oversub: float, spines: object, ideal: bool, sharp: bool) -> int:
    """The rail-optimised fat tree of the module docstring over ``nodes`` hosts whose NICs are
    ``n<k>.nic<r>`` (``r < n_nics``, rail r); returns the spine count (0 for one host)."""
    if nodes <= 1:
        return 0
    reduces = {"sharp": True} if sharp else {}     # fabric switch attribute (IB SHARP)
    n_su = math.ceil(nodes / su_size)
    n_leaves = n_su * n_nics
    per_leaf = min(nodes, su_size)  # nodes (NIC ports) under the fullest leaf
    # Default: uplinks at port speed or wider. A leaf needs ceil(per_leaf / oversub) port-speed
    # uplinks; the SuperPOD (32 leaves, 16 spines, 2 x 400G per leaf-spine pair) caps the
    # spine count at leaves / 2. Fewer, thinner uplinks would cap a single cross-rail flow
    # below its NIC speed on small clusters.
    n_spines = (parse_count(spines, f"{where} spines", minimum=1) if spines is not None
                else max(1, min(n_leaves // 2, math.ceil(per_leaf / oversub))))
    for s in range(n_spines):
        g.add_node(f"spine{s}", kind="switch", **reduces)
    for su in range(n_su):
        members = range(su * su_size, min(nodes, (su + 1) * su_size))
        for r in range(n_nics):
            leaf = f"leaf.su{su}.r{r}"
            g.add_node(leaf, kind="switch", **reduces)
            for k in members:
                g.add_edge(f"n{k}.nic{r}", leaf, **_attrs(nic, ideal))
            up = len(members) * nic.bw / (oversub * n_spines)
            for s in range(n_spines):
                g.add_edge(leaf, f"spine{s}", **_attrs(nic, ideal, up))
    return n_spines


def _dgx(design: DGXDesign, nodes: object, ideal: bool, oversub: object, spines: object,
         gpu: object, su_size: object, name: str | None, nic: object = None,
         nic_bw: object = None, nics: object = DGX_GPUS, pxn: bool = True,
         sharp: bool = False, routing: str | None = None) -> Topology:
    where = design.system
    if not isinstance(sharp, bool):
        raise TopologyError(f"{where}: sharp={sharp!r}; it must be true or false")
    nodes = parse_count(nodes, f"{where} nodes", minimum=1)
    n_nics = parse_count(nics, f"{where} nics", minimum=1)
    if n_nics not in (DGX_GPUS, DGX_GPUS // 2):
        raise TopologyError(f"{where}: nics={n_nics}; valid: {DGX_GPUS} (one NIC per GPU) or "
                            f"{DGX_GPUS // 2} (one NIC per GPU pair)")
    per_nic = DGX_GPUS // n_nics
    su_size = parse_count(su_size, f"{where} su_size", minimum=1)
    dev = get_device(gpu if gpu is not None else design.default_gpu, f"{where} gpu")
    if dev.name not in design.allowed_gpus:
        raise TopologyError(f"{where}: gpu {dev.name!r} is not a {where} GPU "
                            f"(valid: {', '.join(design.allowed_gpus)})")
    oversub, nic = _scaleout(where, oversub, design.nic if nic is None else nic, nic_bw)
    routing = fabric_routing(routing, nic, where)
    pcie, ddr = (get_link_tech(t) for t in (design.pcie, design.ddr))
    g = nx.Graph()
    for k in range(nodes):
        p = f"n{k}."
        gpus = [f"{p}gpu{i}" for i in range(DGX_GPUS)]
        nic_names = [f"{p}nic{i}" for i in range(n_nics)]
        for i, name_ in enumerate(gpus):
            g.add_node(name_, kind="gpu", rank=DGX_GPUS * k + i, device=dev.name, transit=False,
                       nic=nic_names[i // per_nic])
        for i, name_ in enumerate(nic_names):
            g.add_node(name_, kind="nic", rail=i)
        _add_scaleup(g, p, gpus, dev, ideal)
        _add_host(g, p, gpus, nic_names, pcie, ddr, design.host_mem_per_socket, 2, ideal)
    n_spines = _rail_fabric(g, where, nodes, n_nics, nic, su_size, oversub, spines, ideal, sharp)
    params = {"nodes": nodes, "gpu": dev.name, "ideal": bool(ideal), "oversub": oversub,
              "spines": n_spines, "su_size": su_size, "nic": nic.name, "nics": n_nics,
              "pxn": bool(pxn), "sharp": sharp, "routing": routing, "pcie": pcie.name,
              "ddr": ddr.name, "host_mem_source": design.host_mem_source}
    default = f"{where.replace('_', '-')}" + (f"-{nodes}node" if nodes > 1 else "")
    return Topology(g, name=name or default, dims=(DGX_GPUS, nodes),
                    meta={"builder": design.system, "params": params, "pxn": bool(pxn),
                          "routing": routing,
                          "cpu_vendor": design.cpu_vendor,
                          "notes": "NVSwitch chips aggregated into one logical switch per node"})


def dgx_a100(nodes: int = 1, *, ideal: bool = False, oversub: float = 1.0,
             spines: int | None = None, gpu: str | None = None, su_size: int = SU_SIZE,
             name: str | None = None, nic: str | None = None,
             nic_bw: float | str | None = None, nics: int = DGX_GPUS,
             pxn: bool = True, sharp: bool = False, routing: str | None = None) -> Topology:
    """DGX A100 node(s): 8 x A100 (``gpu``: A100-80GB default or A100-40GB), NVLink3 via one
    logical NVSwitch (6 chips aggregated), PCIe Gen4 switches, 8 x IB HDR NICs, DDR4 host
    memory; ``nodes > 1`` adds the rail-optimised fabric (see module docstring; ``sharp``:
    its switches reduce in the network)."""
    return _dgx(DGX_A100, nodes, ideal, oversub, spines, gpu, su_size, name, nic, nic_bw, nics,
                pxn, sharp, routing)


def dgx_h100(nodes: int = 1, *, ideal: bool = False, oversub: float = 1.0,
             spines: int | None = None, gpu: str | None = None, su_size: int = SU_SIZE,
             name: str | None = None, nic: str | None = None,
             nic_bw: float | str | None = None, nics: int = DGX_GPUS,
             pxn: bool = True, sharp: bool = False, routing: str | None = None) -> Topology:
    """DGX H100 node(s): 8 x H100 (or ``gpu="H200"``), NVLink4 via one logical NVSwitch (4
    chips aggregated), PCIe Gen5 switches, 8 x IB NDR NICs, DDR5 host memory (2 TB);
    ``nodes > 1`` adds the rail-optimised fabric (see module docstring); ``nic`` and ``nic_bw``
    as for :func:`dgx_a100`; ``sharp``: its switches reduce in the network (IB SHARP)."""
    return _dgx(DGX_H100, nodes, ideal, oversub, spines, gpu, su_size, name, nic, nic_bw, nics,
                pxn, sharp, routing)


def _host_techs(dev: GPUSpec, gen: object | None, where: str) -> tuple[LinkTech, LinkTech]:
    pcie = get_link_tech(dev.host_link if gen is None else
                         f"pcie{parse_count(gen, f'{where} gen', minimum=0)}", f"{where} gen")
    ddr = get_link_tech("ddr4" if pcie.bw < get_link_tech("pcie5").bw else "ddr5")
    return pcie, ddr


def dgx_b200(nodes: int = 1, *, ideal: bool = False, oversub: float = 1.0,
             spines: int | None = None, gpu: str | None = None, su_size: int = SU_SIZE,
             name: str | None = None, nic: str | None = None,
             nic_bw: float | str | None = None, nics: int = DGX_GPUS,
             pxn: bool = True, sharp: bool = False, routing: str | None = None) -> Topology:
    """DGX B200 node(s): 8 x B200, NVLink5 (900 GB/s per GPU per direction) via one logical
    NVSwitch (2 chips aggregated), PCIe Gen5 switches, 8 x ConnectX-7 400 Gb/s (IB NDR) NICs,
    DDR5 host memory (2 TB); ``nodes > 1`` adds the rail-optimised fabric (module
    docstring); other options as for :func:`dgx_h100`."""
    return _dgx(DGX_B200, nodes, ideal, oversub, spines, gpu, su_size, name, nic, nic_bw, nics,
                pxn, sharp, routing)


#: GPUs per GB200 NVL72 rack (one NVLink domain) and per GB200 superchip (one Grace CPU).
NVL72_GPUS = 72
SUPERCHIP_GPUS = 2
#: NVL72 racks per scalable unit of the GB200 SuperPOD (8 racks = 576 GPUs; DGX SuperPOD GB200
#: RA).
NVL72_SU_SIZE = 8
#: Grace LPDDR5X per CPU, bytes ([C2] GB200 NVL72 datasheet: up to 480 GB per Grace).
GRACE_MEMORY = 480 * GB


def gb200_nvl72(racks: int = 1, *, ideal: bool = False, oversub: float = 1.0,
                spines: int | None = None, su_size: int = NVL72_SU_SIZE,
                name: str | None = None, nic: str = "ib_ndr",
                nic_bw: float | str | None = None, pxn: bool = True,
                sharp: bool = False, routing: str | None = None) -> Topology:
    """GB200 NVL72 rack(s) (GB200 NVL72 datasheet; DGX SuperPOD GB200 RA).

    Rack ``n<k>``: 72 B200-class GPUs ``n<k>.gpu<i>`` (device GB200, rank 72k + i) in ONE
    NVLink domain: the 18 NVSwitch chips of its 9 switch trays are aggregated into one logical
    switch ``n<k>.nvsw``, each GPU's link carrying its whole NVLink5 bandwidth (900 GB/s per
    direction). Superchip ``s`` (36 per rack) is a Grace CPU ``n<k>.cpu<s>`` joined to its two
    GPUs by NVLink-C2C (450 GB/s per direction) with 480 GB LPDDR5X ``n<k>.mem<s>``; one
    ConnectX-7 400 Gb/s compute NIC per GPU (``n<k>.nic<i>``, rail i) sits with the
    superchip's two GPUs under a PCIe switch ``n<k>.pcie<s>`` (PCIe Gen5 [U]: how the NICs
    attach is not in the datasheet). ``racks > 1``: the rail-optimised fat tree of the module
    docstring over the racks (``su_size`` racks per scalable unit, default 8 = 576 GPUs).
    dims ``(72, racks)``."""
    where = "gb200_nvl72"
    if not isinstance(sharp, bool):
        raise TopologyError(f"{where}: sharp={sharp!r}; it must be true or false")
    racks = parse_count(racks, f"{where} racks", minimum=1)
    su_size = parse_count(su_size, f"{where} su_size", minimum=1)
    oversub, nic_tech = _scaleout(where, oversub, nic, nic_bw)
    routing = fabric_routing(routing, nic_tech, where)
    dev = get_device("GB200")
    pcie, c2c, mem = (get_link_tech(t) for t in ("pcie5", "nvlink_c2c", "lpddr5x"))
    g = nx.Graph()
    for k in range(racks):
        p = f"n{k}."
        gpus = [f"{p}gpu{i}" for i in range(NVL72_GPUS)]
        for i, gname in enumerate(gpus):
            g.add_node(gname, kind="gpu", rank=NVL72_GPUS * k + i, device=dev.name,
                       transit=False, nic=f"{p}nic{i}")
            g.add_node(f"{p}nic{i}", kind="nic", rail=i)
        _add_scaleup(g, p, gpus, dev, ideal)
        for sc in range(NVL72_GPUS // SUPERCHIP_GPUS):
            cpu, sw = f"{p}cpu{sc}", f"{p}pcie{sc}"
            g.add_node(cpu, kind="cpu")
            g.add_node(f"{p}mem{sc}", kind="host_mem", capacity=GRACE_MEMORY)
            g.add_edge(cpu, f"{p}mem{sc}", **_attrs(mem, ideal))
            g.add_node(sw, kind="switch")
            for i in range(SUPERCHIP_GPUS * sc, SUPERCHIP_GPUS * (sc + 1)):
                g.add_edge(gpus[i], cpu, **_attrs(c2c, ideal))
                g.add_edge(gpus[i], sw, **_attrs(pcie, ideal))
                g.add_edge(f"{p}nic{i}", sw, **_attrs(pcie, ideal))
            g.add_edge(sw, cpu, **_attrs(pcie, ideal))
    n_spines = _rail_fabric(g, where, racks, NVL72_GPUS, nic_tech, su_size, oversub, spines,
                            ideal, sharp)
    params = {"racks": racks, "gpu": dev.name, "ideal": bool(ideal), "oversub": oversub,
              "spines": n_spines, "su_size": su_size, "nic": nic_tech.name, "pxn": bool(pxn),
              "sharp": sharp, "routing": routing, "pcie": pcie.name, "c2c": c2c.name}
    default = "gb200-nvl72" + (f"-{racks}rack" if racks > 1 else "")
    return Topology(g, name=name or default, dims=(NVL72_GPUS, racks),
                    meta={"builder": where, "params": params, "pxn": bool(pxn),
                          "routing": routing,
                          "cpu_vendor": "nvidia",
                          "notes": "18 NVSwitch chips aggregated into one logical switch per rack"})


def pcie_server(gpus: int = 8, gen: int = 4, *, gpu: str = "A100-80GB", gpus_per_switch: int = 2,
                host_mem: float | str = 512 * GB, ideal: bool = False,
                name: str | None = None) -> Topology:
    """A PCIe-only server: ``gpus`` GPUs (no NVLink), ``gpus_per_switch`` per PCIe switch
    ``pcie<j>``, switches split over 2 CPU sockets ``cpu0``/``cpu1`` joined by a socket link,
    host memory ``mem0``/``mem1`` (``host_mem`` bytes each, [U] default 512 GB) behind DDR4
    (gen <= 4) or DDR5 (gen >= 5) links. All PCIe links are x16 of generation ``gen``.

    GPU-to-GPU traffic under one switch crosses 2 PCIe links; across switches it goes through
    the CPU (and the socket link across sockets). GPUs are ``gpu<i>`` (rank i), transit=False.
    ``gpu`` only sets the device (compute figures); the catalog has SXM parts, so the
    figures are those of the SXM variant.
    """
    where = "pcie_server"
    n = parse_count(gpus, f"{where} gpus", minimum=1)
    per = parse_count(gpus_per_switch, f"{where} gpus_per_switch", minimum=1)
    dev = get_device(gpu, f"{where} gpu")
    pcie, ddr = _host_techs(dev, gen, where)
    cap = parse_size(host_mem, f"{where} host_mem")
    g = nx.Graph()
    names = [f"gpu{i}" for i in range(n)]
    for i, gname in enumerate(names):
        g.add_node(gname, kind="gpu", rank=i, device=dev.name, transit=False)
    _add_host(g, "", names, [], pcie, ddr, cap, per, ideal)
    params = {"gpus": n, "gen": int(pcie.name[4:]), "gpu": dev.name, "gpus_per_switch": per,
              "host_mem": cap, "ideal": bool(ideal), "pcie": pcie.name, "ddr": ddr.name}
    return Topology(g, name=name or f"pcie{pcie.name[4:]}-server{n}", dims=(n,),
                    meta={"builder": "pcie_server", "params": params})


def cxl_node(gpu: str = "H100", gpus: int = 8, expanders: int = 4,
             capacity: float | str = 256 * GB, *, cxl: str = "cxl2", attach: str = "pcie",
             gen: int | None = None, host_mem: float | str = 1000 * GB, ideal: bool = False,
             name: str | None = None) -> Topology:
    """One node with CXL memory expanders.

    Like :func:`pcie_server` (GPUs ``gpu<i>``, 2 per PCIe switch ``pcie<j>``, 2 CPUs, host
    memory; PCIe generation from the GPU's host interface unless ``gen`` is given) plus the
    GPU's scale-up fabric (one logical NVSwitch ``nvsw`` for NVLink GPUs, direct links for
    MI300X) and ``expanders`` CXL memory expanders ``cxl<e>`` (kind ``cxl_mem``,
    ``capacity`` bytes each, [U] default 256 GB, a common expander size). Expander e is
    attached by a ``cxl`` link (``cxl2`` or ``cxl3``, x16) to PCIe switch ``pcie<e mod S>``
    (``attach="pcie"``) or to CPU ``cpu<e mod 2>`` (``attach="cpu"``), so a GPU↔CXL transfer
    crosses the GPU's PCIe link and the CXL link.
    """
    where = "cxl_node"
    dev = get_device(gpu, f"{where} gpu")
    n = parse_count(gpus, f"{where} gpus", minimum=1)
    n_exp = parse_count(expanders, f"{where} expanders", minimum=0)
    cap = parse_size(capacity, f"{where} capacity", allow_zero=False)
    mem = parse_size(host_mem, f"{where} host_mem")
    link = get_link_tech(cxl, f"{where} cxl")
    if link.type != "cxl":
        raise TopologyError(f"{where}: cxl={cxl!r} is a {link.type} link, not a CXL one "
                            "(use cxl2 or cxl3)")
    if attach not in ("pcie", "cpu"):
        raise TopologyError(f"{where}: attach={attach!r}; valid: pcie, cpu")
    pcie, ddr = _host_techs(dev, gen, where)
    g = nx.Graph()
    names = [f"gpu{i}" for i in range(n)]
    for i, gname in enumerate(names):
        g.add_node(gname, kind="gpu", rank=i, device=dev.name, transit=False)
    if n > 1:
        _add_scaleup(g, "", names, dev, ideal)
    switches = _add_host(g, "", names, [], pcie, ddr, mem, 2 if n % 2 == 0 else 1, ideal)
    hosts = switches if attach == "pcie" else ["cpu0", "cpu1"]
    for e in range(n_exp):
        node = f"cxl{e}"
        g.add_node(node, kind="cxl_mem", capacity=cap)
        g.add_edge(node, hosts[e % len(hosts)], **_attrs(link, ideal))
    params = {"gpu": dev.name, "gpus": n, "expanders": n_exp, "capacity": cap, "cxl": link.name,
              "attach": attach, "pcie": pcie.name, "ddr": ddr.name, "host_mem": mem,
              "ideal": bool(ideal)}
    return Topology(g, name=name or f"cxl-node-{dev.name.lower()}", dims=(n,),
                    meta={"builder": "cxl_node", "params": params})


#: Preset functions by name.
PRESETS = {"dgx_a100": dgx_a100, "dgx_h100": dgx_h100, "dgx_b200": dgx_b200,
           "gb200_nvl72": gb200_nvl72, "pcie_server": pcie_server, "cxl_node": cxl_node}


#: The DGX node preset of each GPU family that has one (:func:`suggested_topology`).
_DGX_OF = {"A100-80GB": "dgx-a100", "A100-40GB": "dgx-a100,gpu=A100-40GB", "H100": "dgx-h100",
           "H800": "dgx-h100,gpu=H800", "H200": "dgx-h100,gpu=H200", "B200": "dgx-b200"}


def suggested_topology(gpus: int, device: str | None) -> str | None:
    """The inline spec of ``gpus`` GPUs on DGX nodes of ``device`` (:data:`DGX_GPUS` per
    node, rounded up; H100 when ``device`` is None), or on GB200 NVL72 racks
    (:data:`NVL72_GPUS` per rack): what ``dessim workload show`` suggests for a layout. None
    for a GPU without such a preset (MI300X, V100): its cluster has to be described (an inline
    ``leafspine``/``switch`` spec or a YAML file)."""
    name = get_device(device).name if device else "H100"
    if name == "GB200":
        return f"gb200-nvl72:racks={max(1, -(-gpus // NVL72_GPUS))}"
    builder = _DGX_OF.get(name)
    if builder is None:
        return None
    kind, _, params = builder.partition(",")
    nodes = max(1, -(-gpus // DGX_GPUS))
    return f"{kind}:nodes={nodes}" + (f",{params}" if params else "")
