"""Generic topology builders: rings, fully connected, star switch, tori, meshes, leaf-spine
and ASTRA-sim style multi-dimensional networks.

Common conventions (every builder):

* Quantities are SI (bytes/second per direction, seconds); strings such as ``"50GB/s"`` or
  ``"500ns"`` are also accepted and parsed with :mod:`dessim.units`.
* GPUs are named ``gpu<rank>`` and carry ``rank``, ``device`` (a canonical catalog name or
  ``None``) and ``transit=True``: in these direct/generic networks a GPU may forward traffic.
* Every link gets ``type`` (``link_type``, one of :data:`dessim.catalog.links.LINK_TYPES`),
  ``bw``, ``lat``, ``duplex=True`` and ``efficiency`` (default 1.0).
* ``topology.meta`` holds ``{"builder": <name>, "params": {...}}`` with the arguments (SI).
* Bad arguments raise :class:`~dessim.errors.TopologyError` (or the unit parser's
  :class:`~dessim.errors.UnitError`) naming the builder and the argument.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import networkx as nx

from dessim.catalog.devices import get_device
from dessim.catalog.links import check_link_type
from dessim.errors import TopologyError
from dessim.topology.graph import Topology
from dessim.units import parse_bandwidth, parse_count, parse_time

__all__ = ["ring", "fully_connected", "switch", "torus2d", "torus3d", "mesh2d", "leafspine",
           "multidim", "DimSpec", "DIM_SHAPES", "link_attrs"]

#: Shapes a dimension of :func:`multidim` may have.
DIM_SHAPES: tuple[str, ...] = ("ring", "fc", "switch")


#: Longest link latency accepted (seconds): 1 s, far above any interconnect (NVLink about
#: 1 us, Ethernet/InfiniBand a few us, WAN tens of ms). A larger number is almost always
#: a latency given without its unit (``lat: 5`` meaning 5 us).
MAX_LINK_LATENCY = 1.0
#: Smallest non-zero link bandwidth accepted (bytes/second): 1 MB/s, below any datacentre
#: link; a smaller number is almost always a bandwidth without its unit (``bw: 50``).
MIN_LINK_BANDWIDTH = 1e6


def link_attrs(bw: object, lat: object, link_type: str = "custom", efficiency: float = 1.0,
               *, duplex: bool = True, where: str = "link") -> dict[str, Any]:
    """Validated edge attributes (SI) for one link; raises a DessimError naming ``where``."""
    try:
        eff = float(efficiency)
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: efficiency {efficiency!r} is not a number") from None
    if not 0 < eff <= 1:
        raise TopologyError(f"{where}: efficiency {efficiency!r} must be in (0, 1]")
    bw_s = parse_bandwidth(bw, f"{where} bw")
    lat_s = parse_time(lat, f"{where} lat")
    if lat_s > MAX_LINK_LATENCY:
        raise TopologyError(f"{where}: lat {lat!r} is {lat_s:g} s, implausible for a link (more "
                            f"than {MAX_LINK_LATENCY:g} s); a number is seconds: write the unit, "
                            "e.g. '5us' or '500ns'")
    if 0 < bw_s < MIN_LINK_BANDWIDTH:
        raise TopologyError(f"{where}: bw {bw!r} is {bw_s:g} B/s, implausible for a link (less "
                            f"than {MIN_LINK_BANDWIDTH:g} B/s); a number is bytes/second: write "
                            "the unit, e.g. '50GB/s' or '400Gb/s'")
    return {"type": check_link_type(link_type, f"{where} type"), "bw": bw_s, "lat": lat_s,
            "duplex": bool(duplex), "efficiency": eff}


def _device(device: object, where: str) -> str | None:
    return None if device is None else get_device(device, f"{where} device").name  # type: ignore[arg-type]


def _count(value: object, what: str, minimum: int) -> int:
    return parse_count(value, what, minimum=minimum)


def _add_gpus(g: nx.Graph, n: int, device: str | None) -> list[str]:
    names = [f"gpu{r}" for r in range(n)]
    for r, name in enumerate(names):
        g.add_node(name, kind="gpu", rank=r, device=device, transit=True)
    return names


def _finish(g: nx.Graph, name: str, dims: Sequence[int], builder: str,
            params: Mapping[str, Any]) -> Topology:
    return Topology(g, name=name, dims=tuple(dims),
                    meta={"builder": builder, "params": dict(params)})


def _common(builder: str, bw: object, lat: object, link_type: str, efficiency: float,
            device: object) -> tuple[dict[str, Any], str | None]:
    return link_attrs(bw, lat, link_type, efficiency, where=builder), _device(device, builder)


def _params(attrs: Mapping[str, Any], device: str | None, **extra: Any) -> dict[str, Any]:
    return {**extra, "bw": attrs["bw"], "lat": attrs["lat"], "link_type": attrs["type"],
            "efficiency": attrs["efficiency"], "device": device}


def ring(n: int, bw: float | str, lat: float | str, *, link_type: str = "custom",
         device: str | None = None, efficiency: float = 1.0, name: str | None = None) -> Topology:
    """A bidirectional ring of ``n`` >= 2 GPUs: ``gpu<i> — gpu<(i+1) % n>``, rank i.

    ``n = 2`` gives a single link (no duplicate). dims ``(n,)``.
    """
    n = _count(n, "ring n", 2)
    attrs, dev = _common("ring", bw, lat, link_type, efficiency, device)
    g = nx.Graph()
    gpus = _add_gpus(g, n, dev)
    for i in range(n):
        g.add_edge(gpus[i], gpus[(i + 1) % n], **attrs)
    return _finish(g, name or f"ring{n}", (n,), "ring", _params(attrs, dev, n=n))


def fully_connected(n: int, bw: float | str, lat: float | str, *, link_type: str = "custom",
                    device: str | None = None, efficiency: float = 1.0,
                    name: str | None = None) -> Topology:
    """``n`` >= 2 GPUs with one direct link between every pair (n(n-1)/2 links), rank i =
    ``gpu<i>``. dims ``(n,)``."""
    n = _count(n, "fully_connected n", 2)
    attrs, dev = _common("fully_connected", bw, lat, link_type, efficiency, device)
    g = nx.Graph()
    gpus = _add_gpus(g, n, dev)
    for a, b in itertools.combinations(gpus, 2):
        g.add_edge(a, b, **attrs)
    return _finish(g, name or f"fc{n}", (n,), "fully_connected", _params(attrs, dev, n=n))


def switch(n: int, bw: float | str, lat: float | str, *, link_type: str = "custom",
           device: str | None = None, efficiency: float = 1.0, name: str | None = None) -> Topology:
    """A star: ``n`` >= 1 GPUs, each linked to one switch node ``sw0``. A GPU-to-GPU path is
    2 links (bottleneck ``bw``, latency ``2 * lat``). dims ``(n,)``."""
    n = _count(n, "switch n", 1)
    attrs, dev = _common("switch", bw, lat, link_type, efficiency, device)
    g = nx.Graph()
    gpus = _add_gpus(g, n, dev)
    g.add_node("sw0", kind="switch")
    for gpu in gpus:
        g.add_edge(gpu, "sw0", **attrs)
    return _finish(g, name or f"switch{n}", (n,), "switch", _params(attrs, dev, n=n))


def _grid(builder: str, shape: Sequence[object], wrap: bool, bw: object, lat: object,
          link_type: str, efficiency: float, device: object, name: str | None) -> Topology:
    axes = "xyz"
    sizes = [_count(s, f"{builder} {axes[i]}", 1) for i, s in enumerate(shape)]
    attrs, dev = _common(builder, bw, lat, link_type, efficiency, device)
    g = nx.Graph()
    total = math.prod(sizes)
    gpus = _add_gpus(g, total, dev)
    strides = [math.prod(sizes[:d]) for d in range(len(sizes))]
    for rank in range(total):
        coords = [(rank // strides[d]) % sizes[d] for d in range(len(sizes))]
        for d, size in enumerate(sizes):
            c = coords[d]
            if c + 1 < size:
                nxt = rank + strides[d]
            elif wrap and size > 2:
                nxt = rank - c * strides[d]  # wrap-around to coordinate 0
            else:
                continue  # mesh edge, size-1 dim, or size-2 torus (already linked once)
            g.add_edge(gpus[rank], gpus[nxt], **attrs)
    params = _params(attrs, dev, **{axes[i]: s for i, s in enumerate(sizes)})
    default = f"{builder}_{'x'.join(map(str, sizes))}"
    return _finish(g, name or default, sizes, builder, params)


def torus2d(x: int, y: int, bw: float | str, lat: float | str, *, link_type: str = "custom",
            device: str | None = None, efficiency: float = 1.0, name: str | None = None) -> Topology:
    """An ``x`` by ``y`` 2-D torus: rank = i + x*j, each GPU linked to its +-1 neighbours in
    each dimension with wrap-around. A size-2 dimension has a single link between its two
    GPUs (no duplicate); a size-1 dimension has none. dims ``(x, y)``."""
    return _grid("torus2d", (x, y), True, bw, lat, link_type, efficiency, device, name)


def torus3d(x: int, y: int, z: int, bw: float | str, lat: float | str, *,
            link_type: str = "custom", device: str | None = None, efficiency: float = 1.0,
            name: str | None = None) -> Topology:
    """An ``x`` by ``y`` by ``z`` 3-D torus: rank = i + x*j + x*y*k (see :func:`torus2d`).
    dims ``(x, y, z)``."""
    return _grid("torus3d", (x, y, z), True, bw, lat, link_type, efficiency, device, name)


def mesh2d(x: int, y: int, bw: float | str, lat: float | str, *, link_type: str = "custom",
           device: str | None = None, efficiency: float = 1.0, name: str | None = None) -> Topology:
    """An ``x`` by ``y`` 2-D mesh (a torus without wrap-around links): rank = i + x*j.
    dims ``(x, y)``."""
    return _grid("mesh2d", (x, y), False, bw, lat, link_type, efficiency, device, name)


def leafspine(hosts: int, leaves: int, bw: float | str, lat: float | str, *,
              spines: int | None = None, oversub: float = 1.0,
              uplink_bw: float | str | None = None, uplink_lat: float | str | None = None,
              link_type: str = "custom", device: str | None = None, efficiency: float = 1.0,
              name: str | None = None) -> Topology:
    """A two-level folded Clos: ``hosts`` GPUs spread evenly over ``leaves`` leaf switches,
    every leaf linked once to every spine.

    * GPU ``gpu<r>`` (rank r) hangs off leaf ``leaf<r // h>`` with h = hosts/leaves
      (``hosts`` must be divisible by ``leaves``); downlinks have ``bw``/``lat``.
    * Each leaf's aggregate uplink bandwidth = its aggregate downlink bandwidth / ``oversub``
      = ``h * bw / oversub``, split evenly over one uplink to each spine
      (``uplink_bw = h * bw / (oversub * spines)``), latency ``uplink_lat`` (default ``lat``).
    * Default spine count: ``ceil(h / oversub)``, i.e. uplinks as fast as downlinks when that
      divides evenly (64 hosts, 8 leaves, 2:1 → 4 spines of ``bw`` each).
    * ``uplink_bw`` given explicitly replaces the computation (``oversub`` must then be left
      at 1.0); the effective ratio is recorded in ``meta["params"]["oversub"]``.
    * Spine nodes are ``spine<k>``. dims ``(h, leaves)``.
    """
    hosts = _count(hosts, "leafspine hosts", 1)
    leaves = _count(leaves, "leafspine leaves", 1)
    if hosts % leaves:
        raise TopologyError(f"leafspine: hosts={hosts} is not divisible by leaves={leaves}; "
                            "hosts are spread evenly over the leaves")
    per_leaf = hosts // leaves
    try:
        oversub = float(oversub)
    except (TypeError, ValueError):
        raise TopologyError(f"leafspine: oversub {oversub!r} is not a number") from None
    if not (oversub > 0 and math.isfinite(oversub)):
        raise TopologyError(f"leafspine: oversub {oversub!r} must be a finite number > 0 "
                            "(2 means 2:1 oversubscribed)")
    attrs, dev = _common("leafspine", bw, lat, link_type, efficiency, device)
    n_spines = (_count(spines, "leafspine spines", 1) if spines is not None
                else max(1, math.ceil(per_leaf / oversub)))
    down_total = per_leaf * attrs["bw"]
    if uplink_bw is not None:
        if oversub != 1.0:
            raise TopologyError("leafspine: give either oversub or uplink_bw, not both")
        up = parse_bandwidth(uplink_bw, "leafspine uplink_bw")
        oversub = down_total / (up * n_spines)
    else:
        up = down_total / (oversub * n_spines)
    up_attrs = dict(attrs, bw=up,
                    lat=attrs["lat"] if uplink_lat is None else parse_time(uplink_lat,
                                                                           "leafspine uplink_lat"))
    g = nx.Graph()
    gpus = _add_gpus(g, hosts, dev)
    for s in range(n_spines):
        g.add_node(f"spine{s}", kind="switch")
    for leaf in range(leaves):
        g.add_node(f"leaf{leaf}", kind="switch")
        for gpu in gpus[leaf * per_leaf:(leaf + 1) * per_leaf]:
            g.add_edge(gpu, f"leaf{leaf}", **attrs)
        for s in range(n_spines):
            g.add_edge(f"leaf{leaf}", f"spine{s}", **up_attrs)
    params = _params(attrs, dev, hosts=hosts, leaves=leaves, spines=n_spines, oversub=oversub,
                     uplink_bw=up, uplink_lat=up_attrs["lat"])
    return _finish(g, name or f"leafspine{hosts}", (per_leaf, leaves), "leafspine", params)


@dataclass(frozen=True, slots=True)
class DimSpec:
    """One dimension of :func:`multidim`: ``shape`` in :data:`DIM_SHAPES`, ``size`` GPUs per
    line, link ``bw`` (B/s per direction), ``lat`` (s), ``link_type``, ``efficiency``."""

    shape: str
    size: int
    bw: float | str
    lat: float | str
    link_type: str = "custom"
    efficiency: float = 1.0

    @classmethod
    def coerce(cls, value: object, where: str) -> "DimSpec":
        """A DimSpec from a DimSpec, a tuple ``(shape, size, bw, lat[, type[, eff]])`` or a
        mapping with those keys."""
        if isinstance(value, DimSpec):
            return value
        try:
            if isinstance(value, Mapping):
                return cls(**value)
            if isinstance(value, (tuple, list)) and 4 <= len(value) <= 6:
                return cls(*value)
        except TypeError as exc:
            raise TopologyError(f"{where}: {exc}") from None
        raise TopologyError(f"{where}: expected (shape, size, bw, lat[, link_type"
                            f"[, efficiency]]), got {value!r}")


def multidim(dims: Iterable[DimSpec | tuple | Mapping[str, Any]], *, device: str | None = None,
             name: str | None = None) -> Topology:
    """An ASTRA-sim style multi-dimensional network.

    ``dims`` lists dimensions fastest-varying first, each ``(shape, size, bw, lat)`` (see
    :class:`DimSpec`) with shape ``ring``, ``fc`` (fully connected) or ``switch``. Rank =
    i0 + s0*i1 + s0*s1*i2 + ...; GPU ``gpu<rank>``. Along dimension d, each *line* of GPUs
    whose coordinates differ only in d is wired as that shape: a ring (size 2: one link),
    all pairs, or a star around switch ``sw<d>.<line>`` (lines numbered in rank order of
    their first GPU). Size-1 dimensions add nothing. dims = the sizes.

    Example: ``multidim([("ring", 8, "300GB/s", "250ns"), ("switch", 4, "50GB/s", "1us")])``
    is 4 rings of 8 GPUs whose same-position GPUs share one of 8 switches.
    """
    specs = [DimSpec.coerce(d, f"multidim dim {i}") for i, d in enumerate(dims)]
    if not specs:
        raise TopologyError("multidim: at least one dimension is needed")
    sizes: list[int] = []
    attrs: list[dict[str, Any]] = []
    for i, d in enumerate(specs):
        where = f"multidim dim {i} ({d.shape})"
        if d.shape not in DIM_SHAPES:
            raise TopologyError(f"{where}: unknown shape {d.shape!r}; valid: {', '.join(DIM_SHAPES)}")
        sizes.append(_count(d.size, f"{where} size", 1))
        attrs.append(link_attrs(d.bw, d.lat, d.link_type, d.efficiency, where=where))
    dev = _device(device, "multidim")
    total = math.prod(sizes)
    g = nx.Graph()
    gpus = _add_gpus(g, total, dev)
    strides = [math.prod(sizes[:d]) for d in range(len(sizes))]
    for d, (spec, size, a) in enumerate(zip(specs, sizes, attrs)):
        if size == 1:
            continue
        starts = [r for r in range(total) if (r // strides[d]) % size == 0]
        for line, start in enumerate(starts):
            members = [gpus[start + k * strides[d]] for k in range(size)]
            if spec.shape == "ring":
                pairs = {tuple(sorted((members[k], members[(k + 1) % size]))) for k in range(size)}
                for u, v in sorted(pairs):
                    g.add_edge(u, v, **a)
            elif spec.shape == "fc":
                for u, v in itertools.combinations(members, 2):
                    g.add_edge(u, v, **a)
            else:
                sw = f"sw{d}.{line}"
                g.add_node(sw, kind="switch")
                for u in members:
                    g.add_edge(u, sw, **a)
    params = {"dims": [{"shape": s.shape, "size": n, "bw": a["bw"], "lat": a["lat"],
                        "link_type": a["type"], "efficiency": a["efficiency"]}
                       for s, n, a in zip(specs, sizes, attrs)], "device": dev}
    default = "x".join(f"{s.shape}{n}" for s, n in zip(specs, sizes))
    return _finish(g, name or default, sizes, "multidim", params)


#: Builder functions by name (used by specs and the CLI listing).
BUILDERS = {"ring": ring, "fully_connected": fully_connected, "switch": switch,
            "torus2d": torus2d, "torus3d": torus3d, "mesh2d": mesh2d,
            "leafspine": leafspine, "multidim": multidim}
__all__.append("BUILDERS")
