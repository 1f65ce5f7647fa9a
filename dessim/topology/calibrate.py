"""Link calibration applied to a topology: measured efficiencies and latencies per technology.

A calibration file (:mod:`dessim.catalog.calibration`) may say, per link technology (a key
of :data:`dessim.catalog.links.LINK_TECHS`: ``nvlink4``, ``ib_ndr``, ...), what fraction of
the raw rate NCCL achieves (``efficiency``) and the one-way latency of one link
(``latency``). :func:`calibrated_topology` returns the topology with those values on every
link whose ``tech`` attribute names that technology (presets and YAML links with ``tech:``
carry it; a preset's NIC of another port speed, ``ib_ndr@200Gb/s``, counts as ``ib_ndr``).
Links without a ``tech`` attribute (inline generic specs with explicit figures) are left as
they are: nothing says which technology they are.

The calibration describes the technology, so its values replace whatever the topology
gave those links (the catalog's figures, an explicit ``efficiency:`` in a YAML link, or
``ideal=true``). Only the values a calibration gives change; the bandwidth never does.

The result is cached on the topology (:meth:`Topology.derived`) per set of values, and a
topology that already carries them comes back as is, so applying a calibration twice costs
nothing and every layer that applies it sees one object (one router, one channel map).
Units: efficiency a fraction in (0, 1], latency seconds.
"""

from __future__ import annotations

import json
from typing import Mapping

from dessim.catalog.calibration import Calibration, LinkCalibration
from dessim.topology.graph import Topology

__all__ = ["calibrated_topology", "link_tech"]

LinkValues = Mapping[str, LinkCalibration]


def link_tech(attrs: Mapping[str, object]) -> str | None:
    """The catalog technology of a link from its attributes (``tech``, without a ``@speed``
    suffix), or None when the link names none."""
    tech = attrs.get("tech")
    return str(tech).split("@", 1)[0] if tech else None


def _changes(link: LinkCalibration) -> dict[str, float]:
    """Edge attributes a technology's calibration sets."""
    out = {}
    if link.efficiency is not None:
        out["efficiency"] = float(link.efficiency)
    if link.latency is not None:
        out["lat"] = float(link.latency)
    return out


def _needed(topology: Topology, wanted: Mapping[str, dict[str, float]]) -> bool:
    for _, _, attrs in topology.graph.edges(data=True):
        values = wanted.get(link_tech(attrs) or "")
        if values and any(attrs.get(k) != v for k, v in values.items()):
            return True
    return False


def _apply(topology: Topology, wanted: Mapping[str, dict[str, float]]) -> Topology:
    graph = topology.graph.copy()
    for _, _, attrs in graph.edges(data=True):
        attrs.update(wanted.get(link_tech(attrs) or "", {}))
    meta = dict(topology.meta)
    meta["calibrated_links"] = {tech: dict(v) for tech, v in sorted(wanted.items())}
    return Topology(graph, topology.name, topology.dims, meta)


def calibrated_topology(topology: Topology,
                        calibration: Calibration | LinkValues | None) -> Topology:
    """``topology`` with the link values of ``calibration`` (a :class:`Calibration`, its
    ``links`` mapping, or None) on every link of a calibrated technology (module docstring).

    Returns ``topology`` itself when nothing changes, else a copy (cached per set of values).
    Technology names are checked where a calibration is read (unknown names are errors there,
    listing the known ones).
    """
    links = calibration.links if isinstance(calibration, Calibration) else (calibration or {})
    wanted = {tech: values for tech, link in links.items() if (values := _changes(link))}
    if not wanted or not _needed(topology, wanted):
        return topology
    key = "calibrated:" + json.dumps(wanted, sort_keys=True)
    return topology.derived(key, lambda topo: _apply(topo, wanted))
