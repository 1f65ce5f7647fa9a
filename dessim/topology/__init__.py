"""Cluster topologies: the :class:`Topology` model, builders, presets, specs and metrics.

* :mod:`.graph` — the validated graph model (:class:`Topology`, :class:`Link`)
* :mod:`.builders` — ring, fully connected, switch, tori, mesh, leaf-spine, multidim
* :mod:`.presets` — DGX A100/H100 (rail-optimised clusters), PCIe server, CXL node
* :mod:`.spec` — inline specs, YAML files, :func:`load_topology`
* :mod:`.metrics` — diameter, injection and bisection bandwidth
"""

from __future__ import annotations

from dessim.topology.graph import NODE_KINDS, Link, Topology
from dessim.topology.spec import load_topology

__all__ = ["NODE_KINDS", "Link", "Topology", "load_topology"]
