"""ASTRA-sim analytical network files (``network.yml``) → a :class:`Topology`.

The file ASTRA-sim's analytical backend reads (``astra-sim/astra-network-analytical``,
``common/network-parser/NetworkParser.cc``; docs/references.md "ASTRA-sim network")::

    topology: [ Ring, FullyConnected, Switch ]   # one building block per dimension
    npus_count: [ 2, 8, 4 ]                      # NPUs per dimension (each > 1)
    bandwidth: [ 200.0, 100.0, 50.0 ]            # GB/s per link, 1 GB = 2^30 bytes
    latency: [ 50.0, 500.0, 2000.0 ]             # ns per link

becomes :func:`dessim.topology.builders.multidim` with the same dimensions, fastest-varying
first (ASTRA-sim's NPU id = i0 + n0·i1 + n0·n1·i2, ``translate_id_to_address``), shapes
``Ring`` → ``ring`` (bidirectional), ``FullyConnected`` → ``fc``, ``Switch`` → ``switch`` (one
switch per line: GPU-to-GPU is two links), bandwidth × 2^30 bytes/s per direction
(``bw_GBps_to_Bpns`` in ``common/NetworkFunction.cc``: "1 GB is 2^30 B") and latency / 10^9 (ns → s).
:func:`dessim.topology.load_topology` recognises such a file by its ``npus_count`` key.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from dessim.errors import SpecError
from dessim.resources import read_yaml
from dessim.topology.builders import DimSpec, multidim
from dessim.topology.graph import Topology

__all__ = ["ASTRA_SHAPES", "ASTRA_GB", "is_astra_network", "astra_network", "load_astra_network"]

#: ASTRA-sim building block → dessim multidim shape.
ASTRA_SHAPES: Mapping[str, str] = MappingProxyType({"Ring": "ring", "FullyConnected": "fc",
                                                     "Switch": "switch"})
#: Bytes in ASTRA-sim's analytical "GB" (``bw_GBps_to_Bpns``: 1 GB is 2^30 B).
ASTRA_GB = 2 ** 30
_KEYS = ("topology", "npus_count", "bandwidth", "latency")


def is_astra_network(data: Any) -> bool:
    """True for a parsed document shaped like an ASTRA-sim analytical network file."""
    return isinstance(data, dict) and "npus_count" in data and "topology" in data


def _numbers(data: Mapping[str, Any], key: str, where: str, n: int) -> list[float]:
    values = data[key]
    if not isinstance(values, list) or len(values) != n or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise SpecError(f"{where}: {key} must be a list of {n} numbers (one per dimension of "
                        f"'topology'), got {values!r}")
    return [float(v) for v in values]


def astra_network(data: Any, source: str = "<astra network>") -> Topology:
    """The topology of a parsed ASTRA-sim network document; errors name ``source`` and the key."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: an ASTRA-sim network file is a mapping with keys {', '.join(_KEYS)}")
    for key in data:
        if key not in _KEYS:
            raise SpecError(f"{source}: unknown key {key!r} in an ASTRA-sim analytical network file; "
                            f"valid keys: {', '.join(_KEYS)}")
    for key in _KEYS:
        if key not in data:
            raise SpecError(f"{source}: missing key {key!r}")
    shapes = data["topology"]
    if not isinstance(shapes, list) or not shapes:
        raise SpecError(f"{source}: topology must be a list of building blocks, got {shapes!r}")
    for s in shapes:
        if s not in ASTRA_SHAPES:
            raise SpecError(f"{source}: topology {s!r} is not supported; valid: {', '.join(ASTRA_SHAPES)}")
    n = len(shapes)
    counts = data["npus_count"]
    if not isinstance(counts, list) or len(counts) != n or not all(
            isinstance(c, int) and not isinstance(c, bool) and c > 1 for c in counts):
        raise SpecError(f"{source}: npus_count must be a list of {n} whole numbers > 1 (one per "
                        f"dimension), got {counts!r}")
    bws, lats = _numbers(data, "bandwidth", source, n), _numbers(data, "latency", source, n)
    for i, (bw, lat) in enumerate(zip(bws, lats)):
        if bw <= 0:
            raise SpecError(f"{source}: bandwidth[{i}] = {bw:g} GB/s must be > 0")
        if lat < 0:
            raise SpecError(f"{source}: latency[{i}] = {lat:g} ns must be >= 0")
    dims = [DimSpec(ASTRA_SHAPES[s], c, bw * ASTRA_GB, lat / 1e9)      # ns → s, as dessim.units
            for s, c, bw, lat in zip(shapes, counts, bws, lats)]
    topo = multidim(dims, name=Path(source).stem if source != "<astra network>" else None)
    topo.meta["source"] = source
    topo.meta["astra_network"] = {k: data[k] for k in _KEYS}
    return topo


def load_astra_network(path: str | Path) -> Topology:
    """The topology of an ASTRA-sim analytical network YAML file."""
    return astra_network(read_yaml(path, "ASTRA-sim network file"), str(path))
