"""Link technologies as data: bandwidth per direction, latency and protocol efficiency.

A :class:`LinkTech` describes one kind of physical link as the topology uses it (one edge of
the graph). Bandwidth ``bw`` is bytes/second **per direction** (half a marketed bidirectional
figure). ``lat`` is a one-way latency in seconds. ``efficiency`` is the fraction of ``bw``
that payload actually achieves with NCCL, so the network model uses ``bw * efficiency``.

Sources are named by their short names in docs/references.md ("Links, fabrics and nodes",
"NCCL and nccl-tests") with that file's labels [C]/[C2]/[D]/[U] (see
:mod:`dessim.catalog.devices`).

Efficiency rule: efficiency = NCCL-measured bus bandwidth / raw per-direction bandwidth, only
where a published nccl-tests measurement exists (nccl-tests#149, #212, #160, #290); elsewhere
1.0 (ideal), said so in ``efficiency_source``. Constants are never fitted to an end-to-end
result.

Latency rule: no public source confirmed per-link hardware latencies; the defaults below are
documented, round, *unconfirmed* [U] values — override them with explicit ``lat`` in specs (a
topology or calibration file) when a measurement matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from dessim.errors import SpecError

__all__ = ["LINK_TYPES", "LinkTech", "LINK_TECHS", "get_link_tech", "check_link_type",
           "DEEPEP_NVLINK_EFFICIENCY"]

#: Valid values of a link's ``type`` attribute.
LINK_TYPES: tuple[str, ...] = ("nvlink", "pcie", "cxl", "ib", "ethernet", "infinity_fabric",
                               "ddr", "storage", "custom")

GB = 1e9
GIGA = 1e9  # seconds = nanoseconds / GIGA (division keeps 500ns exactly 5e-7)


@dataclass(frozen=True, slots=True)
class LinkTech:
    """A link technology: figures per direction, SI units, with their sources."""

    name: str                 #: registry key, e.g. "nvlink4"
    type: str                 #: one of LINK_TYPES
    bw: float                 #: raw bytes/second per direction
    lat: float                #: seconds, one way
    efficiency: float         #: fraction of bw payload achieves (0 < e <= 1)
    bw_source: str
    lat_source: str
    efficiency_source: str
    description: str = ""
    duplex: bool = True       #: False: both directions share ``bw`` (memory channels)

    @property
    def capacity(self) -> float:
        """Usable bytes/second per direction: ``bw * efficiency``."""
        return self.bw * self.efficiency


_U_NVLINK_LAT = ("[U] default: 250 ns per link, so GPU->NVSwitch->GPU ≈ 0.5 us, the order of "
                 "NCCL's NVLink Ring LL per-hop latency (0.47 us in NCCL tuning.cc @01afd20, "
                 "0.6 us in NCCL 2.30.7); override with a topology or calibration file")
_U_PCIE_LAT = ("[U] default: 500 ns per link, so GPU->PCIe switch->GPU ≈ 1 us, NCCL's PCI Ring "
               "LL per-hop latency 1.0 us (NCCL tuning.cc @01afd20, NCCL 2.30.7); override with "
               "a topology or calibration file")
_U_NET_LAT = ("[U] default: 500 ns per link, so NIC->switch->NIC ≈ 1 us (HCA-to-HCA RDMA "
              "~1-2 us, switch port-to-port 100-200 ns: unconfirmed); override with a topology "
              "or calibration file")
_U_ETH_LAT = ("[U] default: 1 us per link (RoCE switch ~0.5-1 us: unconfirmed); override with a "
              "topology or calibration file")
_NO_EFF = "no NCCL measurement published; 1.0 (ideal)"


def _t(name: str, type_: str, bw: float, lat: float, eff: float, bw_src: str, lat_src: str,
       eff_src: str, description: str, duplex: bool = True) -> LinkTech:
    return LinkTech(name, type_, bw, lat, eff, bw_src, lat_src, eff_src, description, duplex)


_LIST = [
    # ---- NVLink: per-GPU aggregate to the NVSwitch fabric (Interconnect generations)
    _t("nvlink2", "nvlink", 150 * GB, 250 / GIGA, 1.0,
       "[C2] 6 links x 25 GB/s uni = 150 GB/s (Interconnect generations)", _U_NVLINK_LAT, _NO_EFF,
       "NVLink 2 (V100), per-GPU aggregate"),
    _t("nvlink3", "nvlink", 300 * GB, 250 / GIGA, 230 / 300,
       "[C2] 12 links x 25 GB/s uni = 300 GB/s (Interconnect generations, glennklockwood A100)",
       _U_NVLINK_LAT,
       "[C] 8x A100 ring all-reduce busbw ≈ 230 GB/s of 300 raw: 230/300 = 0.767 "
       "(nccl-tests#149)",
       "NVLink 3 (A100), per-GPU aggregate"),
    _t("nvlink4", "nvlink", 450 * GB, 250 / GIGA, 370 / 450,
       "[C] 18 links x 25 GB/s uni = 450 GB/s (nccl-tests#212; Interconnect generations)",
       _U_NVLINK_LAT,
       "[C] 8x H100 Ring all-reduce busbw ≈ 370 GB/s of 450 raw: 370/450 = 0.822 "
       "(nccl-tests#212; NVLS reaches 480 via in-switch reduction)",
       "NVLink 4 (H100/H200), per-GPU aggregate"),
    _t("nvlink4_h800", "nvlink", 200 * GB, 250 / GIGA, 370 / 450,
       "[C2] H800 SXM: NVLink 400 GB/s bidirectional = 8 NVLink4 links x 25 GB/s uni = 200 GB/s "
       "(H800 SXM datasheet)",
       _U_NVLINK_LAT,
       "[C] NVLink4's 370/450 (nccl-tests#212): 164 GB/s, as DeepSeek-V3 report §3.2.2 "
       "('NVLink offers a bandwidth of 160 GB/s' on its H800 nodes)",
       "NVLink 4 of the H800 (8 of the 18 links), per-GPU aggregate"),
    _t("nvlink5", "nvlink", 900 * GB, 250 / GIGA, 1.0,
       "[C] 18 links x 50 GB/s uni = 900 GB/s (DGX SuperPOD GB200 RA; Interconnect generations)",
       _U_NVLINK_LAT, "[U] NCCL-effective NVLink5: no published measurement; 1.0 (ideal)",
       "NVLink 5 (B200/GB200), per-GPU aggregate"),
    # ---- AMD Infinity Fabric: one link per peer (MI300X OAM platforms are fully connected)
    _t("if_mi300x", "infinity_fabric", 64 * GB, 250 / GIGA, 1.0,
       "[C2] 128 GB/s bidir per link = 64 GB/s uni; 7 links per GPU (MI300X specs)",
       "[U] default 250 ns, like NVLink", _NO_EFF,
       "Infinity Fabric link between two MI300X (one per peer)"),
    # ---- PCIe x16 (PCIe table: Wikipedia values via hpc-notes)
    _t("pcie3", "pcie", 15.75 * GB, 500 / GIGA, 1.0,
       "[C2] 8 GT/s, 128b/130b: 15.75 GB/s per direction x16 (PCIe table)",
       _U_PCIE_LAT, _NO_EFF, "PCIe 3.0 x16"),
    _t("pcie4", "pcie", 31.5 * GB, 500 / GIGA, 1.0,
       "[C2] 16 GT/s: 31.5 GB/s per direction x16 (PCIe table)",
       _U_PCIE_LAT, _NO_EFF, "PCIe 4.0 x16"),
    _t("pcie5", "pcie", 63 * GB, 500 / GIGA, 1.0,
       "[C2] 32 GT/s: 63 GB/s per direction x16 (PCIe table)",
       _U_PCIE_LAT, _NO_EFF, "PCIe 5.0 x16"),
    _t("pcie6", "pcie", 121 * GB, 500 / GIGA, 1.0,
       "[C2] 64 GT/s PAM4 FLIT: ~121-128 GB/s per direction x16; the lower 121 is used "
       "(PCIe table)", _U_PCIE_LAT, _NO_EFF, "PCIe 6.0 x16"),
    # ---- CXL x16 (CXL on PCIe PHYs)
    _t("cxl2", "cxl", 63 * GB, 200 / GIGA, 1.0,
       "[C2] CXL 1.1/2.0 on the PCIe 5.0 PHY: 63 GB/s per direction x16 (CXL on PCIe PHYs, "
       "PCIe table)",
       "[U] default 200 ns: a CXL.mem load is 2-5x local DRAM ([C2] Wang et al. 2024 (CXL)), "
       "local DRAM sub-100 ns ([C] nextplatform CXL latency); override with a topology or "
       "calibration file", _NO_EFF, "CXL 2.0 x16"),
    _t("cxl3", "cxl", 121 * GB, 200 / GIGA, 1.0,
       "[C2] CXL 3.x on the PCIe 6.0 PHY: ~121-128 GB/s per direction x16; 121 used "
       "(CXL on PCIe PHYs, PCIe table)",
       "[U] default 200 ns (see cxl2)", _NO_EFF, "CXL 3.x x16"),
    # ---- InfiniBand, one port (Linux IB speeds)
    _t("ib_hdr", "ib", 25 * GB, 500 / GIGA, 24 / 25,
       "[C] HDR 200 Gb/s = 4 x 50G = 25 GB/s per direction (Linux IB speeds)", _U_NET_LAT,
       "[C] NCCL achieves ~24 GB/s per HDR NIC: 24/25 = 0.96 (nccl-tests#160)",
       "InfiniBand HDR 200 Gb/s port"),
    _t("ib_ndr", "ib", 50 * GB, 500 / GIGA, 47 / 50,
       "[C] NDR 400 Gb/s = 4 x 100G = 50 GB/s per direction (Linux IB speeds)", _U_NET_LAT,
       "[C] NCCL ring achieves 46-48 GB/s per NDR NIC; midpoint 47/50 = 0.94 "
       "(nccl-tests#290, #267)", "InfiniBand NDR 400 Gb/s port"),
    _t("ib_xdr", "ib", 100 * GB, 500 / GIGA, 1.0,
       "[C2] XDR 800 Gb/s = 4 x 200G = 100 GB/s per direction (Interconnect generations; "
       "Linux IB speeds: IB_RATE_800_GBPS)",
       _U_NET_LAT, "[U] NCCL-achieved XDR: no published measurement; 1.0 (ideal)",
       "InfiniBand XDR 800 Gb/s port"),
    # ---- Ethernet (RoCE), one port: arithmetic from the line rate [D]
    _t("eth100", "ethernet", 12.5 * GB, 1000 / GIGA, 1.0,
       "[D] 100 Gb/s / 8 = 12.5 GB/s", _U_ETH_LAT,
       "[U] RoCE ≈ IB when tuned: unconfirmed; 1.0 (ideal)", "100 GbE port"),
    _t("eth200", "ethernet", 25 * GB, 1000 / GIGA, 1.0,
       "[D] 200 Gb/s / 8 = 25 GB/s", _U_ETH_LAT,
       "RoCE efficiency [U]; 1.0 (ideal)", "200 GbE port"),
    _t("eth400", "ethernet", 50 * GB, 1000 / GIGA, 1.0,
       "[D] 400 Gb/s / 8 = 50 GB/s", _U_ETH_LAT,
       "RoCE efficiency [U]; 1.0 (ideal)", "400 GbE port"),
    _t("eth800", "ethernet", 100 * GB, 1000 / GIGA, 1.0,
       "[D] 800 Gb/s / 8 = 100 GB/s", _U_ETH_LAT,
       "RoCE efficiency [U]; 1.0 (ideal)", "800 GbE port"),
    # ---- Host memory: one socket's DDR channels aggregated into one link CPU -- memory
    _t("ddr4", "ddr", 204.8 * GB, 100 / GIGA, 1.0,
       "[D]/[C2] 8 channels x DDR4-3200 x 8 B = 204.8 GB/s per socket (AMD EPYC 7742 of DGX "
       "A100; EPYC DDR4 bandwidth, Microway DGX A100 review). A memory channel is half "
       "duplex: the figure is shared by reads and writes (duplex=False)",
       "[U] default 100 ns: local DDR load 'sub-100 ns' (nextplatform CXL latency)", _NO_EFF,
       "DDR4-3200, 8 channels, one socket", duplex=False),
    _t("ddr5", "ddr", 307.2 * GB, 100 / GIGA, 1.0,
       "[D]/[C2] 8 channels x DDR5-4800 x 8 B = 307.2 GB/s per socket (Xeon 8480C of DGX "
       "H100, DGX BasePOD RA; Sapphire Rapids memory). Half duplex (duplex=False)",
       "[U] default 100 ns: local DDR load 'sub-100 ns' (nextplatform CXL latency)", _NO_EFF,
       "DDR5-4800, 8 channels, one socket", duplex=False),
    # ---- Grace CPU to Blackwell GPU (GB200 superchip)
    _t("nvlink_c2c", "custom", 450 * GB, 100 / GIGA, 1.0,
       "[C2] NVLink-C2C 900 GB/s bidirectional = 450 GB/s per direction between the Grace CPU "
       "and its two Blackwell GPUs of one GB200 superchip (GB200 NVL72 datasheet)",
       "[U] default 100 ns, like a local memory access", _NO_EFF,
       "NVLink-C2C, Grace CPU to its GPUs (GB200)"),
    _t("lpddr5x", "ddr", 512 * GB, 100 / GIGA, 1.0,
       "[C2] Grace CPU LPDDR5X up to 512 GB/s per CPU (GB200 NVL72 datasheet: 480 GB per "
       "Grace). Half duplex (duplex=False)",
       "[U] default 100 ns: local DDR load 'sub-100 ns' (nextplatform CXL latency)", _NO_EFF,
       "LPDDR5X of one Grace CPU", duplex=False),
    # ---- CPU socket to socket (UPI / xGMI), aggregated
    _t("socket", "custom", 64 * GB, 100 / GIGA, 1.0,
       "[U] CPU-CPU socket interconnect (Intel UPI / AMD xGMI), aggregated over its links; "
       "default 64 GB/s per direction (e.g. 2-4 UPI links at 16 GT/s; Sapphire Rapids memory); "
       "unconfirmed, override with a topology or calibration file",
       "[U] default 100 ns", _NO_EFF, "CPU socket-to-socket link (UPI/xGMI)"),
]

#: Every link technology by name (read-only).
LINK_TECHS: Mapping[str, LinkTech] = MappingProxyType({t.name: t for t in _LIST})

#: DeepEP's normal kernels' NVLink copies, as a fraction of a link technology's usable rate
#: (:attr:`LinkTech.capacity`), by technology; technologies not listed: 1.0 (no measurement).
#: A kernel-level calibration, like the NCCL efficiencies above: DeepEP's intranode kernels
#: at EP 8 on one H800 node (deepseek-ai/DeepEP README.md @567632dd, "Normal kernels": 153 GB/s
#: dispatch, 158 GB/s combine, measured by ``tests/test_intranode.py``) are a microbenchmark of
#: nothing but these copies, while dessim's NVLink all-to-all of the same bytes reaches
#: 185.4 / 186.6 GB/s there at the full rate: 153/185.4 = 0.825 and 158/186.6 = 0.847, mean
#: 0.836. Those two figures are the CALIBRATION rows (benchmarks/validate_deepep.py excludes
#: them from its errors); the other NVLink-bound figures validate it. Physically: DeepEP moves
#: NVLink data with SM load/store and TMA copies on the ``Buffer.num_sms`` = 20 SMs it is given
#: (``csrc/kernels/intranode.cu``, ``internode.cu``), with head/tail signalling per chunk,
#: not with NCCL's channels; its maintainers' answer to a lower-than-link NVLink figure is
#: more SMs (deepseek-ai/DeepEP#16: "it may be essential to increase the number of SMs ...
#: Buffer.set_num_sms(32)"), and 24-SM runs stay below the link elsewhere (deepseek-ai/DeepEP#394,
#: GB200: 169 / 135 GB/s). Applied only to DeepEP's NVLink phases
#: (:func:`dessim.workload.transformer.deepep.deepep_nvlink_efficiency`), at DeepEP's default SMs,
#: and to its low-latency kernels' NVLink copies in benchmarks/validate_deepep.py: the same
#: ``UNROLLED_WARP_COPY`` of SM stores into a peer's buffer (``csrc/kernels/internode_ll.cu``
#: and ``intranode.cu`` at d8dd185c; with it the low-latency model is within 3 % of
#: deepseek-ai/DeepEP#173's H20 figures, docs/collectives.md).
DEEPEP_NVLINK_EFFICIENCY: Mapping[str, float] = MappingProxyType({"nvlink4_h800": 0.836})

#: Extra accepted names.
_ALIASES = {"ddr": "ddr5", "hdr": "ib_hdr", "ndr": "ib_ndr", "xdr": "ib_xdr",
            "infinity_fabric": "if_mi300x", "upi": "socket", "xgmi": "socket"}

for _tech in _LIST:
    assert _tech.type in LINK_TYPES, _tech
    assert 0 < _tech.efficiency <= 1, _tech


def get_link_tech(name: str | LinkTech, what: str = "link technology") -> LinkTech:
    """The :class:`LinkTech` called ``name`` (case-insensitive; ``-`` and ``_`` equivalent;
    aliases ``ddr`` = ddr5, ``hdr``/``ndr``/``xdr`` = ib_*). SpecError listing valid names."""
    if isinstance(name, LinkTech):
        return name
    if isinstance(name, str):
        key = name.strip().lower().replace("-", "_")
        key = _ALIASES.get(key, key)
        if key in LINK_TECHS:
            return LINK_TECHS[key]
    raise SpecError(f"{what}: unknown link technology {name!r}; valid names: "
                    f"{', '.join(LINK_TECHS)} (aliases: {', '.join(_ALIASES)})")


def check_link_type(value: object, what: str = "link type") -> str:
    """Return ``value`` if it is one of :data:`LINK_TYPES`, else a SpecError listing them."""
    if isinstance(value, str) and value in LINK_TYPES:
        return value
    raise SpecError(f"{what}: unknown link type {value!r}; valid types: {', '.join(LINK_TYPES)}")
