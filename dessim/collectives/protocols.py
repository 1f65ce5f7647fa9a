"""NCCL's protocols as the simulation charges them: wire bytes and latencies.

NCCL moves collective data with one of three protocols (NCCL 2.30.7; docs/references.md):

``LL``
    8-byte stores of 4 bytes of data and a 4-byte flag: the receiver polls the flag, so
    there is no separate synchronisation and the latency is the lowest, but half the bytes
    on the wire are flags. NCCL's model: ring bandwidth × 0.5 (``tuning.cc``).
``LL128``
    128-byte lines of 120 bytes of data and an 8-byte flag (``NCCL_LL128_LINESIZE``,
    ``NCCL_LL128_DATAELEMS``); NCCL's model charges ring bandwidth × 0.92.
``Simple``
    plain copies with a flag and a memory fence per step: full bandwidth, the highest
    latency.

A :class:`Protocol` turns that into what the executor charges each transfer:

* **wire bytes** = payload × :attr:`Protocol.wire_factor` (LL 2, LL128 1/0.92, Simple 1);
  NCCL's Tree (``dbtree``) instead pays the inverse of its own efficiency in NCCL's model
  (:func:`wire_factor`, :func:`dessim.collectives.nccl.tuning.tree_efficiency`: all-reduce
  ``.92``, LL ``/3.8``, LL128 ``120/128`` across nodes, ×0.85 on Hopper);
* **step latency**: a transfer (one pipeline step) takes at least NCCL's per-hop latency
  ``hwLat[link class][algorithm][protocol]`` (NVLink, PCIe or network: whether the route
  crosses a NIC, else whether it uses NVLink) — for a ring across nodes, at least the network
  proxy overhead on intra-node steps too (:func:`net_overhead`); the route's own latency
  counts towards it, so the executor adds ``max(0, hop latency - route latency)`` of
  software latency;
* **call latency**, once per collective call before its first transfer: NCCL's
  ``baseLat[algorithm][protocol]`` plus the per-call overhead
  (:func:`dessim.collectives.api.call_overhead`): the calibrated
  (:class:`~dessim.catalog.calibration.NcclCalibration`) ``call_overhead`` on one host or
  ``net_call_overhead`` across hosts, plus ``(gpus_per_process − 1) × host_overhead`` when
  one host thread drives several GPUs (nccl-tests ``-g N``): it launches the call's kernels
  one after the other, and the collective cannot progress before the last one starts. That
  is one isolated call; calls issued back to back overlap
  (:mod:`dessim.collectives.loop`).

On an idle network a ring all-reduce therefore takes NCCL's own latency formula plus the
call overhead, plus its bytes at the links' rates — the form of ``ncclTopoGetAlgoTime``,
with the bandwidth coming from the simulated links instead of NCCL's table.

``raw`` is the textbook model: no framing, no software or call latency — a transfer takes
its route latency plus its bytes at the links' rates (the closed forms of docs/collectives.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from dessim.collectives.nccl.tuning import (BASE_LATENCY_US, HW_LATENCY_US, NET, NVLINK, PCI,
                                           PROTOCOLS, tree_efficiency)
from dessim.errors import CollectiveError

__all__ = ["Protocol", "make_protocol", "RAW", "WIRE_FACTOR", "LINK_CLASSES", "link_class",
           "net_overhead", "wire_factor"]

#: Bytes on the wire per payload byte (NCCL's bandwidth fractions: LL 0.5, LL128 0.92).
WIRE_FACTOR: dict[str, float] = {"LL": 2.0, "LL128": 1.0 / 0.92, "Simple": 1.0, "raw": 1.0}
#: Link classes of NCCL's latency table by name.
LINK_CLASSES: dict[str, int] = {"nvlink": NVLINK, "pci": PCI, "net": NET}
#: Algorithms of NCCL's table that dessim's algorithms take their latencies from.
_NCCL_ALGO = {"ring": "ring", "dbtree": "tree", "tree": "tree", "nvls": "nvls",
              "nvlstree": "nvls_tree", "collnet": "collnet_chain",
              "collnetdirect": "collnet_direct"}


@dataclass(frozen=True)
class Protocol:
    """One protocol as charged by the executor (see the module docstring). Seconds."""

    name: str                   #: "LL", "LL128", "Simple" or "raw"
    call_overhead: float = 0.0  #: calibrated per-call cost (s), on top of NCCL's base latency

    def __post_init__(self) -> None:
        if self.name not in WIRE_FACTOR:
            raise CollectiveError(f"unknown protocol {self.name!r}; valid: {', '.join(WIRE_FACTOR)}")

    @property
    def wire_factor(self) -> float:
        return WIRE_FACTOR[self.name]

    @property
    def is_raw(self) -> bool:
        return self.name == "raw"

    def step_latency(self, algorithm: str, link_class: int, net_overhead: float = 0.0) -> float:
        """NCCL's per-hop latency (s) of ``algorithm`` (a dessim name) over ``link_class``;
        ``net_overhead`` (s) is the floor of a ring's intra-node steps when the ring crosses
        nodes (:func:`net_overhead`)."""
        if self.is_raw:
            return 0.0
        algo = _NCCL_ALGO.get(algorithm, "ring")
        hw = HW_LATENCY_US[link_class][algo][PROTOCOLS.index(self.name)] * 1e-6
        return max(hw, net_overhead) if link_class != NET else hw

    def call_latency(self, algorithm: str) -> float:
        """Latency (s) paid once per call before the first transfer."""
        if self.is_raw:
            return 0.0
        algo = _NCCL_ALGO.get(algorithm, "ring")
        return BASE_LATENCY_US[algo][PROTOCOLS.index(self.name)] * 1e-6 + self.call_overhead


#: The textbook model.
RAW = Protocol("raw")


def make_protocol(name: str, call_overhead: float) -> Protocol:
    """The protocol ``name`` with the per-call overhead (seconds; ignored by ``raw``)."""
    return Protocol(name, 0.0 if name == "raw" else call_overhead)


def link_class(graph, path: tuple[str, ...]) -> int:
    """NCCL's link class of a routed path (node names): NET if it crosses a NIC, else
    NVLINK if any hop is an NVLink, else PCI."""
    nodes = graph.nodes
    if any(nodes[n]["kind"] == "nic" for n in path):
        return NET
    edges = graph.edges
    if any(edges[a, b]["type"] == "nvlink" for a, b in zip(path, path[1:])):
        return NVLINK
    return PCI


def net_overhead(protocol: Protocol, algorithm: str, amd_cpu: bool) -> float:
    """NCCL's network proxy overhead (s) that floors each intra-node step of a ring crossing
    nodes (``getNetOverhead``, ``tuning.cc``: 1 µs on Intel, 2 µs on AMD hosts, ×3 with
    Simple); 0 for other algorithms and the raw protocol."""
    if protocol.is_raw or algorithm != "ring":
        return 0.0
    return (2.0 if amd_cpu else 1.0) * (3 if protocol.name == "Simple" else 1) * 1e-6


def wire_factor(protocol: Protocol, algorithm: str, op: str, arch: int, nodes: int) -> float:
    """Wire bytes per payload byte of ``algorithm`` running ``op`` with ``protocol`` on GPUs
    of NCCL architecture row ``arch`` spread over ``nodes`` hosts: the protocol's framing
    (:attr:`Protocol.wire_factor`), except for NCCL's Tree (``dbtree``), whose simulated
    flows run at NCCL's own Tree efficiency (:func:`~dessim.collectives.nccl.tuning.tree_efficiency`);
    1 for the raw model."""
    if protocol.is_raw or algorithm != "dbtree":
        return protocol.wire_factor
    return 1.0 / tree_efficiency(op, protocol.name, arch, nodes)
