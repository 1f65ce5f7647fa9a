"""Topology specifications: inline spec strings, YAML files/dicts, and :func:`load_topology`.

Inline grammar
--------------
``KIND[:ITEM,ITEM,...]`` where an ITEM is a positional value, ``key=value`` or a bare flag
(``ideal``). Kinds, their positional form and keys are in :data:`KINDS`
(``dessim topology list`` prints them with defaults). Examples::

    ring:8,bw=50GB/s,lat=500ns        fc:8,tech=nvlink4          switch:16,bw=25GB/s
    torus2d:4x4                       torus3d:4x4x4              mesh2d:4x4
    leafspine:hosts=64,leaves=8,oversub=2,bw=50GB/s
    multidim:ring(8,bw=300GB/s,lat=250ns)xswitch(4,bw=50GB/s,lat=1us)
    dgx-a100:nodes=2    dgx-h100:4,ideal    pcie:8,gen=5    cxl:gpu=h100,expanders=4,capacity=512GB

Generic builders (ring, fc, switch, torus2d/3d, mesh2d, leafspine, multidim dimensions)
take link figures from, in order: explicit ``bw``/``lat``/``type``/``efficiency``; the
catalog entry named by ``tech=`` (e.g. ``tech=nvlink4``: bw, lat, type and efficiency);
the defaults ``bw=50GB/s, lat=500ns, type=custom, efficiency=1``.

YAML schema (also a dict)
-------------------------
Top-level keys: ``name``, ``description``, ``dims`` (list of ints), ``builder`` (mapping with
``kind`` and that kind's keys, as in the inline grammar; multidim takes ``dims:`` as a list of
mappings with ``shape``, ``size`` and link keys), ``routing`` (``ecmp`` or ``dmodk``:
:data:`~dessim.topology.routing.ROUTINGS`), ``nodes`` (list of mappings with ``name``,
``kind``, ``rank``, ``device``, ``transit``, ``capacity``, ``nic``, ``rail``, ``sharp``) and ``links`` (list of mappings with
``a``, ``b``, ``bw``, ``lat``, ``type``, ``duplex``, ``efficiency``, ``tech``). With a
``builder``, ``nodes``/``links`` are added to the built graph. Unknown keys, duplicate node
names, duplicate links and links to unknown nodes raise :class:`~dessim.errors.SpecError`
naming the file, the place (``links[3]``) and the valid keys.
"""

from __future__ import annotations

import functools
import os
import re
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping

import networkx as nx
from pydantic import Field, create_model

from dessim.catalog.devices import get_device
from dessim.catalog.links import LINK_TYPES, check_link_type, get_link_tech
from dessim.errors import DessimError, SpecError, TopologyError
from dessim.resources import check_limit, find_data_file, read_yaml, shipped_topologies
from dessim.schema import (BANDWIDTH_SCHEMA, SIZE_SCHEMA, TIME_SCHEMA, Flag, Size, SpecModel, Text, choice,
                           converted, described, did_you_mean, inline_schema, validate)
from dessim.topology import builders, presets
from dessim.topology.graph import NODE_KINDS, Topology
from dessim.topology.routing import ROUTINGS
from dessim.units import parse_bandwidth, parse_count, parse_size, parse_time

__all__ = ["KINDS", "Kind", "Param", "load_topology", "parse_inline", "inline_to_raw",
           "is_inline_spec", "find_kind", "topology_from_dict", "load_yaml", "build_kind",
           "DEFAULT_BW", "DEFAULT_LAT", "TopologyFile", "NodeSection", "LinkSection", "params_model", "kind_model"]

#: Link figures of generic builders when neither the spec nor ``tech=`` gives them.
DEFAULT_BW = "50GB/s"
DEFAULT_LAT = "500ns"

_REQUIRED = object()


# ---------------------------------------------------------------- value parsers (raw, what)
def _p_bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on", ""):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "no", "0", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise SpecError(f"{what}: cannot parse {value!r} as a boolean (true/false)")


def _p_float(value: object, what: str) -> float:
    if isinstance(value, bool):
        raise SpecError(f"{what}: expected a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{what}: cannot parse {value!r} as a number") from None


def _p_str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{what}: expected a non-empty string, got {value!r}")
    return value


def _schema(parse: Callable[[object, str], Any], schema: Mapping[str, Any]) -> Callable[[object, str], Any]:
    """``parse`` tagged with the JSON Schema of the values it accepts (for the spec models)."""
    parse.schema = dict(schema)  # type: ignore[attr-defined]
    return parse


_BOOL_SCHEMA = {"anyOf": [{"type": "boolean"}, {"enum": ["true", "false", "yes", "no", "on", "off"]}]}
_STR_SCHEMA = {"type": "string", "minLength": 1}


def _p_count(minimum: int) -> Callable[[object, str], int]:
    return _schema(lambda v, what: parse_count(v, what, minimum=minimum),
                   {"anyOf": [{"type": "integer", "minimum": minimum}, {"type": "string"}]})


def _p_device(value: object, what: str) -> str:
    return get_device(_p_str(value, what), what).name


def _p_tech(value: object, what: str) -> str:
    return get_link_tech(_p_str(value, what), what).name


_P_BW = _schema(lambda v, what: parse_bandwidth(v, what), BANDWIDTH_SCHEMA)
_P_LAT = _schema(lambda v, what: parse_time(v, what), TIME_SCHEMA)
_P_SIZE = _schema(lambda v, what: parse_size(v, what, allow_zero=False), SIZE_SCHEMA)
_P_TYPE = _schema(lambda v, what: check_link_type(v, what), {"enum": list(LINK_TYPES)})
_schema(_p_bool, _BOOL_SCHEMA)
_schema(_p_float, {"type": "number"})
_schema(_p_str, _STR_SCHEMA)
_schema(_p_device, {"type": "string", "description": "a GPU of dessim.catalog.devices"})
_schema(_p_tech, {"type": "string", "description": "a link technology of dessim.catalog.links"})


@dataclass(frozen=True, slots=True)
class Param:
    """One key of a kind: its parser, default (``None`` = not set) and help text."""

    name: str
    parse: Callable[[object, str], Any]
    default: Any = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def field(self) -> tuple[Any, Any]:
        """This key as a pydantic field: parsed by :attr:`parse` (the default too)."""
        tp = converted(self.parse, getattr(self.parse, "schema", {}))
        if self.required:
            return tp, Field(description=self.help)
        return tp, Field(self.default, description=self.help, validate_default=self.default is not None)


def params_model(name: str, params: tuple[Param, ...]) -> type[SpecModel]:
    """The spec model of a kind's keys (an inline spec's items or a YAML ``builder:``)."""
    return create_model(name, __base__=SpecModel, __doc__=f"keys of topology kind {name}",
                        **{p.name: p.field() for p in params})


@dataclass(frozen=True, slots=True)
class Kind:
    """An inline/YAML builder kind: accepted keys, positional form, flags, and the build."""

    name: str
    help: str
    params: tuple[Param, ...]
    build: Callable[[dict[str, Any]], Topology]
    positional: Callable[[list[str], str], dict[str, Any]] | None = None
    positional_help: str = ""
    aliases: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    words_are_positional: bool = False  #: bare words are positional values (multidim)
    #: Upper estimate of the nodes + links the build allocates, from the parsed values:
    #: checked against the ``topology_nodes`` limit (:data:`dessim.resources.LIMITS`) first.
    size: Callable[[dict[str, Any]], int] = lambda v: 1   # noqa: E731

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def _product(*keys: str) -> Callable[[dict[str, Any]], int]:
    """Size estimate: the product of the values of ``keys`` (GPUs of a ring, grid, ...)."""
    return lambda v: math.prod(v[k] for k in keys)


def _dgx_size(v: dict[str, Any]) -> int:
    # per node: 8 GPUs, NVSwitches, NICs, CPUs, memory (about 30 nodes and links); spines
    return v["nodes"] * 32 + (v["spines"] or 0) * v["nodes"]


def _positional_names(*names: str) -> Callable[[list[str], str], dict[str, Any]]:
    def split(values: list[str], where: str) -> dict[str, Any]:
        if len(values) > len(names):
            raise SpecError(f"{where}: too many positional values {values}; expected at most "
                            f"{len(names)} ({', '.join(names)})")
        return dict(zip(names, values))
    return split


def _positional_grid(*axes: str) -> Callable[[list[str], str], dict[str, Any]]:
    def split(values: list[str], where: str) -> dict[str, Any]:
        if len(values) != 1 or len(values[0].lower().split("x")) != len(axes):
            raise SpecError(f"{where}: expected one positional shape "
                            f"{'x'.join(a.upper() for a in axes)} (e.g. {'x'.join(['4'] * len(axes))}), "
                            f"got {values}")
        return dict(zip(axes, (v.strip() for v in values[0].lower().split("x"))))
    return split


# Link keys shared by generic builders and multidim dimensions.
_LINK_PARAMS = (
    Param("bw", _P_BW, None, f"bandwidth per direction (default {DEFAULT_BW} or tech's)"),
    Param("lat", _P_LAT, None, f"latency per link (default {DEFAULT_LAT} or tech's)"),
    Param("type", _P_TYPE, None, f"link type: {', '.join(LINK_TYPES)} (default custom)"),
    Param("efficiency", _p_float, None, "fraction of bw usable by payload (default 1.0)"),
    Param("tech", _p_tech, None, "catalog link technology giving bw/lat/type/efficiency"),
)
_NAME = Param("name", _p_str, None, "topology name")
_DEVICE = Param("device", _p_device, None, "GPU model from the catalog")


def _link_kwargs(v: dict[str, Any]) -> dict[str, Any]:
    """bw/lat/link_type/efficiency from explicit keys, then ``tech``, then defaults."""
    tech = get_link_tech(v["tech"]) if v.get("tech") else None
    pick = lambda key, from_tech, default: (v[key] if v.get(key) is not None  # noqa: E731
                                            else from_tech if tech is not None else default)
    return {"bw": pick("bw", tech and tech.bw, DEFAULT_BW),
            "lat": pick("lat", tech and tech.lat, DEFAULT_LAT),
            "link_type": pick("type", tech and tech.type, "custom"),
            "efficiency": pick("efficiency", tech and tech.efficiency, 1.0)}


def _generic(fn: Callable[..., Topology], *size_keys: str) -> Callable[[dict[str, Any]], Topology]:
    def build(v: dict[str, Any]) -> Topology:
        link = _link_kwargs(v)
        return fn(*(v[k] for k in size_keys), link.pop("bw"), link.pop("lat"), **link,
                  device=v.get("device"), name=v.get("name"))
    return build


def _build_leafspine(v: dict[str, Any]) -> Topology:
    link = _link_kwargs(v)
    return builders.leafspine(v["hosts"], v["leaves"], link.pop("bw"), link.pop("lat"),
                              spines=v.get("spines"), oversub=v["oversub"],
                              uplink_bw=v.get("uplink_bw"), uplink_lat=v.get("uplink_lat"),
                              **link, device=v.get("device"), name=v.get("name"))


# ---------------------------------------------------------------- multidim dimensions
_DIM_PARAMS = (Param("shape", _p_str, _REQUIRED, f"one of {', '.join(builders.DIM_SHAPES)}"),
               Param("size", _p_count(1), _REQUIRED, "GPUs per line"), *_LINK_PARAMS)
_DIM_RE = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)


def _dim_from_mapping(raw: Mapping[str, Any], where: str) -> builders.DimSpec:
    values = _parse_params(_DIM_PARAMS, raw, where)
    link = _link_kwargs(values)
    return builders.DimSpec(values["shape"], values["size"], link["bw"], link["lat"],
                            link["link_type"], link["efficiency"])


def _parse_dims_expr(expr: str, where: str) -> list[builders.DimSpec]:
    parts = _split_top(expr, "x")
    dims = []
    for i, part in enumerate(parts):
        m = _DIM_RE.match(part)
        if not m:
            raise SpecError(f"{where}: dimension {i} {part.strip()!r} is not SHAPE(SIZE,key=value,...) "
                            f"(shapes: {', '.join(builders.DIM_SHAPES)}); dimensions are joined by 'x'")
        positional, keyed, flags = _split_items(m.group(2), f"{where}: dimension {i}")
        if flags or len(positional) > 1:
            raise SpecError(f"{where}: dimension {i}: expected SIZE then key=value items, "
                            f"got {positional + flags}")
        raw = {"shape": m.group(1).lower(), **dict(zip(["size"], positional)), **keyed}
        dims.append(_dim_from_mapping(raw, f"{where}: dimension {i} ({m.group(1)})"))
    return dims


def _multidim_positional(values: list[str], where: str) -> dict[str, Any]:
    if len(values) != 1:
        raise SpecError(f"{where}: expected one dimension expression like "
                        f"ring(8,bw=300GB/s)xswitch(4,bw=50GB/s), got {values}")
    return {"dims": values[0]}


def _p_dims(value: object, what: str) -> list[builders.DimSpec]:
    if isinstance(value, str):
        return _parse_dims_expr(value, what)
    if isinstance(value, list) and value:
        out = []
        for i, item in enumerate(value):
            if isinstance(item, builders.DimSpec):
                out.append(item)
            elif isinstance(item, Mapping):
                out.append(_dim_from_mapping(item, f"{what}[{i}]"))
            else:
                raise SpecError(f"{what}[{i}]: expected a mapping with keys "
                                f"{', '.join(p.name for p in _DIM_PARAMS)}, got {item!r}")
        return out
    raise SpecError(f"{what}: expected a non-empty list of dimensions or an expression like "
                    f"ring(8)xswitch(4), got {value!r}")


# ---------------------------------------------------------------- the kinds
def _p_routing(value: object, what: str) -> str:
    text = _p_str(value, what).strip().lower()
    if text not in ROUTINGS:
        raise SpecError(f"{what}: {value!r} is not a routing; valid: "
                        + "; ".join(f"{k} ({v})" for k, v in ROUTINGS.items()))
    return text


_schema(_p_routing, {"enum": list(ROUTINGS)})
_ROUTING = Param("routing", _p_routing, None, "how a switch picks among equal-cost next hops: "
                 "dmodk (InfiniBand static, by destination) or ecmp (per-flow hash); default by "
                 "the NIC technology")


def _dgx_kind(name: str, fn: Callable[..., Topology], gpus: str) -> Kind:
    return Kind(
        name, f"{fn.__doc__.split(':')[0].strip()}; rail-optimised fabric when nodes > 1",
        (Param("nodes", _p_count(1), 1, "number of DGX nodes"),
         Param("ideal", _p_bool, False, "every link efficiency 1.0"),
         Param("oversub", _p_float, 1.0, "leaf uplink oversubscription (1 = non-blocking)"),
         Param("spines", _p_count(1), None, "spine switches (default min(leaves/2, nodes per leaf/oversub))"),
         Param("gpu", _p_device, None, f"GPU model ({gpus})"),
         Param("su_size", _p_count(1), presets.SU_SIZE, "nodes per scalable unit"),
         Param("nic", _p_str, None, "scale-out link technology (catalog key, e.g. ib_ndr, eth400)"),
         Param("nic_bw", _P_BW, None, "scale-out port bandwidth per direction (e.g. 400Gb/s)"),
         Param("nics", _p_count(1), presets.DGX_GPUS, "compute NICs per node (8: one per GPU; "
               "4: one per GPU pair)"),
         Param("pxn", _p_bool, True, "route to a receiver's rail over NVLink (NCCL's PXN)"),
         Param("sharp", _p_bool, False, "leaf and spine switches reduce in the network "
               "(IB SHARP: NCCL's CollNet)"),
         _ROUTING, _NAME),
        lambda v: fn(v["nodes"], ideal=v["ideal"], oversub=v["oversub"], spines=v["spines"],
                     gpu=v["gpu"], su_size=v["su_size"], name=v["name"], nic=v["nic"],
                     nic_bw=v["nic_bw"], nics=v["nics"], pxn=v["pxn"], sharp=v["sharp"],
                     routing=v["routing"]),
        _positional_names("nodes"), "NODES", (name.replace("-", "_"),), ("ideal",), size=_dgx_size)


KINDS_LIST: tuple[Kind, ...] = (
    Kind("ring", "bidirectional ring of n GPUs",
         (Param("n", _p_count(2), _REQUIRED, "GPUs"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.ring, "n"), _positional_names("n"), "N", size=_product("n")),
    Kind("fc", "fully connected: a link between every pair of n GPUs",
         (Param("n", _p_count(2), _REQUIRED, "GPUs"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.fully_connected, "n"), _positional_names("n"), "N",
         ("fully-connected", "full"), size=_product("n", "n")),
    Kind("switch", "star: n GPUs on one switch sw0",
         (Param("n", _p_count(1), _REQUIRED, "GPUs"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.switch, "n"), _positional_names("n"), "N", ("star",),
         size=_product("n")),
    Kind("torus2d", "2-D torus, rank = i + x*j",
         (Param("x", _p_count(1), _REQUIRED, "size of dim 0"),
          Param("y", _p_count(1), _REQUIRED, "size of dim 1"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.torus2d, "x", "y"), _positional_grid("x", "y"), "XxY",
         size=_product("x", "y")),
    Kind("torus3d", "3-D torus, rank = i + x*j + x*y*k",
         (Param("x", _p_count(1), _REQUIRED, "size of dim 0"),
          Param("y", _p_count(1), _REQUIRED, "size of dim 1"),
          Param("z", _p_count(1), _REQUIRED, "size of dim 2"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.torus3d, "x", "y", "z"), _positional_grid("x", "y", "z"), "XxYxZ",
         size=_product("x", "y", "z")),
    Kind("mesh2d", "2-D mesh (torus without wrap-around), rank = i + x*j",
         (Param("x", _p_count(1), _REQUIRED, "size of dim 0"),
          Param("y", _p_count(1), _REQUIRED, "size of dim 1"), *_LINK_PARAMS, _DEVICE, _NAME),
         _generic(builders.mesh2d, "x", "y"), _positional_grid("x", "y"), "XxY",
         size=_product("x", "y")),
    Kind("leafspine", "two-level leaf-spine: hosts GPUs over leaves leaf switches",
         (Param("hosts", _p_count(1), _REQUIRED, "GPUs"),
          Param("leaves", _p_count(1), _REQUIRED, "leaf switches (must divide hosts)"),
          Param("spines", _p_count(1), None, "spine switches (default ceil(hosts/leaves/oversub))"),
          Param("oversub", _p_float, 1.0, "leaf downlink:uplink bandwidth ratio"),
          Param("uplink_bw", _P_BW, None, "per-uplink bandwidth (instead of oversub)"),
          Param("uplink_lat", _P_LAT, None, "uplink latency (default lat)"),
          *_LINK_PARAMS, _DEVICE, _NAME),
         _build_leafspine, _positional_names("hosts", "leaves"), "HOSTS,LEAVES",
         size=lambda v: 2 * v["hosts"] + v["leaves"] * (v["spines"] or v["hosts"] // v["leaves"] + 1)),
    Kind("multidim", "ASTRA-sim style multi-dimensional network (dims fastest first)",
         (Param("dims", _p_dims, _REQUIRED, "SHAPE(SIZE,key=value)xSHAPE(...) with shapes "
                                           f"{'/'.join(builders.DIM_SHAPES)} and link keys"),
          _DEVICE, _NAME),
         lambda v: builders.multidim(v["dims"], device=v["device"], name=v["name"]),
         _multidim_positional, "SHAPE(SIZE,...)xSHAPE(SIZE,...)", words_are_positional=True,
         size=lambda v: math.prod(d.size for d in v["dims"]) * (1 + len(v["dims"]))),
    _dgx_kind("dgx-a100", presets.dgx_a100, "A100-80GB default, A100-40GB"),
    _dgx_kind("dgx-h100", presets.dgx_h100, "H100 default, H800, H200"),
    _dgx_kind("dgx-b200", presets.dgx_b200, "B200"),
    Kind("gb200-nvl72", "GB200 NVL72 racks: 72 GPUs in one NVLink domain each; rail-optimised "
         "fabric between racks",
         (Param("racks", _p_count(1), 1, "number of NVL72 racks"),
          Param("ideal", _p_bool, False, "every link efficiency 1.0"),
          Param("oversub", _p_float, 1.0, "leaf uplink oversubscription (1 = non-blocking)"),
          Param("spines", _p_count(1), None, "spine switches (default min(leaves/2, racks per "
                "leaf/oversub))"),
          Param("su_size", _p_count(1), presets.NVL72_SU_SIZE, "racks per scalable unit"),
          Param("nic", _p_str, "ib_ndr", "scale-out link technology (catalog key)"),
          Param("nic_bw", _P_BW, None, "scale-out port bandwidth per direction (e.g. 800Gb/s)"),
          Param("pxn", _p_bool, True, "route to a receiver's rail over NVLink (NCCL's PXN)"),
          Param("sharp", _p_bool, False, "leaf and spine switches reduce in the network"),
          _ROUTING, _NAME),
         lambda v: presets.gb200_nvl72(v["racks"], ideal=v["ideal"], oversub=v["oversub"],
                                       spines=v["spines"], su_size=v["su_size"], name=v["name"],
                                       nic=v["nic"], nic_bw=v["nic_bw"], pxn=v["pxn"],
                                       sharp=v["sharp"], routing=v["routing"]),
         _positional_names("racks"), "RACKS", ("gb200_nvl72", "nvl72"), ("ideal",)),
    Kind("pcie", "PCIe-only server: GPUs under PCIe switches under 2 CPUs",
         (Param("gpus", _p_count(1), 8, "GPUs"), Param("gen", _p_count(3), 4, "PCIe generation 3-6"),
          Param("gpu", _p_device, "A100-80GB", "GPU model"),
          Param("gpus_per_switch", _p_count(1), 2, "GPUs per PCIe switch"),
          Param("host_mem", _P_SIZE, "512GB", "host memory per socket"),
          Param("ideal", _p_bool, False, "every link efficiency 1.0"), _NAME),
         lambda v: presets.pcie_server(v["gpus"], v["gen"], gpu=v["gpu"],
                                       gpus_per_switch=v["gpus_per_switch"],
                                       host_mem=v["host_mem"], ideal=v["ideal"], name=v["name"]),
         _positional_names("gpus"), "GPUS", ("pcie-server",), ("ideal",),
         size=lambda v: 2 * v["gpus"]),
    Kind("cxl", "node with CXL memory expanders on the PCIe switches (or CPUs)",
         (Param("gpu", _p_device, "H100", "GPU model"), Param("gpus", _p_count(1), 8, "GPUs"),
          Param("expanders", _p_count(0), 4, "CXL memory expanders"),
          Param("capacity", _P_SIZE, "256GB", "capacity of each expander"),
          Param("cxl", _p_tech, "cxl2", "CXL link technology (cxl2, cxl3)"),
          Param("attach", _p_str, "pcie", "attach expanders to 'pcie' switches or 'cpu's"),
          Param("gen", _p_count(3), None, "PCIe generation (default: the GPU's)"),
          Param("host_mem", _P_SIZE, "1000GB", "host memory per socket"),
          Param("ideal", _p_bool, False, "every link efficiency 1.0"), _NAME),
         lambda v: presets.cxl_node(v["gpu"], v["gpus"], v["expanders"], v["capacity"],
                                    cxl=v["cxl"], attach=v["attach"], gen=v["gen"],
                                    host_mem=v["host_mem"], ideal=v["ideal"], name=v["name"]),
         _positional_names("gpus"), "GPUS", ("cxl-node",), ("ideal",),
         size=lambda v: 2 * v["gpus"] + v["expanders"]),
)

#: Kinds by canonical name.
KINDS: dict[str, Kind] = {k.name: k for k in KINDS_LIST}


@functools.lru_cache(maxsize=None)
def kind_model(params: tuple[Param, ...]) -> type[SpecModel]:
    """The spec model of a kind's keys (or of a multidim dimension), made on first use."""
    name = next((k.name for k in KINDS_LIST if k.params == params), "dimension")
    return params_model(name.replace("-", "_"), params)
_KIND_ALIASES: dict[str, str] = {}
for _k in KINDS_LIST:
    for _a in (_k.name, *_k.aliases):
        _KIND_ALIASES[_a.replace("_", "-")] = _k.name


def find_kind(name: object, where: str) -> Kind:
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key in _KIND_ALIASES:
        return KINDS[_KIND_ALIASES[key]]
    raise SpecError(f"{where}: unknown topology kind {name!r}; valid kinds: {', '.join(KINDS)}")


# ---------------------------------------------------------------- generic helpers
def _split_top(text: str, sep: str) -> list[str]:
    """Split ``text`` on ``sep`` outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _split_items(text: str, where: str) -> tuple[list[str], dict[str, str], list[str]]:
    """Comma-separated items → (positional values, key=value pairs, bare words)."""
    positional: list[str] = []
    keyed: dict[str, str] = {}
    words: list[str] = []
    if not text.strip():
        return positional, keyed, words
    for item in _split_top(text, ","):
        item = item.strip()
        if not item:
            raise SpecError(f"{where}: empty item (two commas in a row or a trailing comma)")
        if "=" in item and "(" not in item.split("=", 1)[0]:
            key, value = (s.strip() for s in item.split("=", 1))
            if key in keyed:
                raise SpecError(f"{where}: key {key!r} given twice")
            keyed[key] = value
        elif re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", item):
            words.append(item)
        else:
            positional.append(item)
    return positional, keyed, words


def _parse_params(params: tuple[Param, ...], raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check keys and parse each value through the params' spec model; missing keys get their
    defaults (parsed)."""
    model = kind_model(params)
    values = validate(model, dict(raw), where, error=None)     # UnitError for a bad bw, ...
    return {p.name: getattr(values, p.name) for p in params}


def build_kind(kind: Kind | str, raw: Mapping[str, Any], where: str) -> Topology:
    """Build ``kind`` from raw values (strings or numbers); errors are prefixed by ``where``."""
    try:
        k = kind if isinstance(kind, Kind) else find_kind(kind, where)
        values = _parse_params(k.params, raw, where)
        check_limit("topology_nodes", k.size(values), f"{where}: {k.name} topology")
        return k.build(values)
    except DessimError as exc:
        msg = str(exc)
        raise type(exc)(msg if msg.startswith(where) else f"{where}: {msg}") from None


# ---------------------------------------------------------------- inline specs
def inline_to_raw(spec: str) -> tuple[Kind, dict[str, Any]]:
    """Split an inline spec into its :class:`Kind` and raw, unparsed values keyed by the
    kind's keys — the same mapping a YAML ``builder:`` section holds (without ``kind``):
    ``"dgx-a100:4,ideal"`` → (dgx-a100, ``{"nodes": "4", "ideal": True}``)."""
    head, _, rest = spec.strip().partition(":")
    kind = find_kind(head, f"topology spec {spec!r}")
    where = f"{kind.name} spec {spec!r}"
    try:
        positional, keyed, words = _split_items(rest, where)
        raw: dict[str, Any] = {}
        for word in words:
            if word in kind.flags:
                raw[word] = True
            elif kind.words_are_positional:
                positional.append(word)
            else:  # positionals are numbers or shapes ("8", "4x4"), never bare words
                raise SpecError(f"{where}: unknown flag {word!r}; valid keys: "
                                f"{', '.join(kind.keys)}" +
                                (f"; flags: {', '.join(kind.flags)}" if kind.flags else ""))
        if positional:
            if kind.positional is None:
                raise SpecError(f"{where}: {kind.name} takes no positional value, got {positional}")
            for key, value in kind.positional(positional, where).items():
                if key in keyed:
                    raise SpecError(f"{where}: {key!r} given both positionally and as {key}=")
                raw[key] = value
        raw.update(keyed)
    except DessimError as exc:
        raise type(exc)(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    return kind, raw


def is_inline_spec(text: str) -> bool:
    """Whether ``text`` starts with a known inline kind (``ring``, ``dgx-h100:...``)."""
    head = text.partition(":")[0].strip().lower().replace("_", "-")
    return head in _KIND_ALIASES


def parse_inline(spec: str) -> Topology:
    """Build a topology from an inline spec such as ``"ring:8,bw=50GB/s,lat=500ns"``."""
    kind, raw = inline_to_raw(spec)
    return build_kind(kind, raw, f"{kind.name} spec {spec!r}")


# ---------------------------------------------------------------- YAML / dict
def _rail(value: Any, what: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise SpecError(f"{what}: expected an integer or a name, got {value!r}")
    return value


def _rank(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecError(f"{what}: must be an integer >= 0, got {value!r}")
    return value


class NodeSection(SpecModel):
    """One entry of ``nodes:``."""

    name: converted(_p_str, _STR_SCHEMA, str)
    kind: choice(NODE_KINDS)
    rank: converted(_rank, {"type": "integer", "minimum": 0}, int) | None = Field(
        None, description="the GPU's rank (default: by name order)")
    device: converted(_p_device, _p_device.schema, str) | None = None  # type: ignore[attr-defined]
    transit: converted(_p_bool, _BOOL_SCHEMA, bool) | None = Field(
        None, description="whether routes may pass through this node")
    capacity: Size | None = Field(None, description="memory bytes of a memory or storage node")
    nic: converted(_p_str, _STR_SCHEMA, str) | None = Field(None, description="the NIC of a GPU")
    rail: converted(_rail, {"anyOf": [{"type": "integer"}, {"type": "string", "minLength": 1}]}) | None = \
        Field(None, description="a nic's rail (rail-optimised fabrics)")
    sharp: Flag | None = Field(None, description="a switch that reduces in the network (IB SHARP)")


class LinkSection(SpecModel):
    """One entry of ``links:`` (undirected, full duplex unless ``duplex: false``)."""

    a: converted(_p_str, _STR_SCHEMA, str)
    b: converted(_p_str, _STR_SCHEMA, str)
    bw: converted(_P_BW, BANDWIDTH_SCHEMA, float) | None = Field(None, description="bytes/s per direction "
                                                                  "(required without tech)")
    lat: converted(_P_LAT, TIME_SCHEMA, float) | None = Field(None, description="seconds (required "
                                                               "without tech)")
    type: converted(_P_TYPE, _P_TYPE.schema, str) | None = None  # type: ignore[attr-defined]
    duplex: converted(_p_bool, _BOOL_SCHEMA, bool) | None = None
    efficiency: converted(_p_float, {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, float) | None \
        = Field(None, description="fraction of bw usable by payload")
    tech: converted(_p_tech, _p_tech.schema, str) | None = Field(  # type: ignore[attr-defined]
        None, description="catalog link technology giving bw, lat, type and efficiency")


def _builder_schema() -> dict[str, Any]:
    """JSON Schema of ``builder:`` (made when the schema is exported): one alternative per
    kind, its ``kind`` naming it."""
    alternatives = []
    for k in KINDS_LIST:
        schema = inline_schema(kind_model(k.params))
        schema["properties"] = {"kind": {"enum": [k.name, *k.aliases]}, **schema["properties"]}
        schema["required"] = ["kind", *schema.get("required", [])]
        schema["description"] = k.help
        alternatives.append(schema)
    return {"oneOf": alternatives, "description": "a generated topology: kind and that kind's keys "
            "(as in the inline grammar); nodes and links are added to it"}


class TopologyFile(SpecModel):
    """A topology file (module docstring): a ``builder``, explicit ``nodes`` and ``links``, or
    both."""

    name: Text | None = Field(None, description="default: the builder's or the file name")
    description: Text | None = None
    dims: list[Annotated[int, Field(strict=True)]] | None = Field(
        None, description="GPUs per dimension (multi-dimensional collectives)")
    builder: described(dict[str, Any], _builder_schema) | None = None
    routing: choice(ROUTINGS) | None = Field(
        None, description="how switches pick among equal-cost next hops: "
        + "; ".join(f"{k}: {v}" for k, v in ROUTINGS.items())
        + " (default: the builder's, else ecmp)")
    nodes: list[NodeSection] = []
    links: list[LinkSection] = []


def _node_attrs(item: NodeSection, where: str) -> dict[str, Any]:
    """The graph attributes of a validated node; the rules across its keys."""
    attrs = item.model_dump(exclude={"name"}, exclude_none=True)
    if item.rail is not None and item.kind != "nic":
        raise SpecError(f"{where} ({item.name}): only a nic has a rail (kind is {item.kind!r})")
    if item.sharp and item.kind != "switch":
        raise SpecError(f"{where} ({item.name}) sharp: only a switch can reduce in the network "
                        f"(IB SHARP); kind is {item.kind!r}")
    return attrs


def _link_attrs(item: LinkSection, where: str) -> dict[str, Any]:
    tech = get_link_tech(item.tech) if item.tech is not None else None
    if tech is None:
        missing = [k for k in ("bw", "lat") if getattr(item, k) is None]
        if missing:
            raise SpecError(f"{where}: missing {missing[0]!r} (give bw and lat, or tech)")
    pick = lambda key, from_tech, default: (getattr(item, key) if getattr(item, key) is not None  # noqa: E731
                                            else from_tech if tech is not None else default)
    attrs = builders.link_attrs(
        pick("bw", tech and tech.bw, None), pick("lat", tech and tech.lat, None),
        pick("type", tech and tech.type, "custom"), pick("efficiency", tech and tech.efficiency, 1.0),
        duplex=pick("duplex", tech and tech.duplex, True), where=where)
    if tech is not None:
        attrs["tech"] = tech.name
    return attrs


def topology_from_dict(data: object, source: str = "<dict>") -> Topology:
    """Build a topology from a parsed YAML document (validated by :class:`TopologyFile`; the
    schema is in the module docstring).

    ``source`` (a file name) prefixes every error message.
    """
    top = validate(TopologyFile, data, source, error=None)
    meta: dict[str, Any] = {"source": source}
    dims = top.dims
    if top.builder is not None:
        b = top.builder
        if "kind" not in b:
            raise SpecError(f"{source}: builder: missing 'kind' (valid kinds: {', '.join(KINDS)})")
        kind = find_kind(b["kind"], f"{source}: builder")
        raw = {k: v for k, v in b.items() if k != "kind"}
        if top.name is not None and "name" not in raw:
            raw["name"] = top.name
        base = build_kind(kind, raw, f"{source}: builder ({kind.name})")
        graph = base.graph.copy()
        meta.update(base.meta)
        if dims is None and not top.nodes:
            dims = base.dims
        name = base.name
    else:
        graph = nx.Graph()
        name = top.name or Path(source).stem
    if top.description is not None:
        meta["description"] = top.description
    if top.routing is not None:
        meta["routing"] = top.routing
    for i, node in enumerate(top.nodes):
        where = f"{source}: nodes[{i}]"
        if node.name in graph:
            raise SpecError(f"{where}: duplicate node name {node.name!r}")
        graph.add_node(node.name, **_node_attrs(node, where))
    for i, link in enumerate(top.links):
        where = f"{source}: links[{i}]"
        for end in ("a", "b"):
            if getattr(link, end) not in graph:
                raise SpecError(f"{where}: {end}: unknown node {getattr(link, end)!r} (declare it under "
                                "nodes: first)")
        a, b = link.a, link.b
        if a == b:
            raise SpecError(f"{where}: a link from {a!r} to itself")
        if graph.has_edge(a, b):
            raise SpecError(f"{where}: duplicate link {a} -- {b} (a link is undirected and full "
                            "duplex; give one entry per physical link)")
        graph.add_edge(a, b, **_link_attrs(link, f"{where} ({a} -- {b})"))
    try:
        return Topology(graph, name=name, dims=dims, meta=meta)
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def load_yaml(path: str | os.PathLike[str]) -> Topology:
    """Load a topology YAML (or JSON) file: dessim's schema, or an ASTRA-sim analytical network
    file (:mod:`dessim.topology.astra`, recognised by its ``npus_count`` key)."""
    from dessim.topology.astra import astra_network, is_astra_network

    data = read_yaml(path, "topology file")
    if is_astra_network(data):
        return astra_network(data, str(path))
    return topology_from_dict(data, str(path))


def load_topology(spec: Topology | str | os.PathLike[str] | Mapping[str, Any]) -> Topology:
    """A :class:`Topology` from any spec form.

    ``spec`` may be a Topology (returned as is), a dict (YAML schema), a path to a YAML file,
    the name of a shipped file in ``topologies/`` (``"dgx-h100-4node"``), or an inline spec
    (``"ring:8,bw=50GB/s"``, ``"dgx-h100:nodes=4"``).
    """
    if isinstance(spec, Topology):
        return spec
    if isinstance(spec, Mapping):
        return topology_from_dict(spec)
    if isinstance(spec, os.PathLike):
        return load_yaml(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"topology spec: expected a spec string, file, dict or Topology, got {spec!r}")
    text = spec.strip()
    if Path(text).is_file():
        return load_yaml(text)
    if Path(text).is_dir():
        raise SpecError(f"topology {text!r} is a directory, not a topology file or spec")
    shipped = find_data_file("topologies", text)
    if shipped is not None:
        return load_yaml(shipped)
    if is_inline_spec(text):
        return parse_inline(text)
    if text.endswith((".yaml", ".yml", ".json")) or os.sep in text:
        raise SpecError(f"topology file {text!r} does not exist")
    kind = text.partition(":")[0]
    raise SpecError(f"unknown topology spec {text!r}"
                    f"{did_you_mean(kind, [*shipped_topologies(), *KINDS])}: not a file, not a shipped topology "
                    f"({', '.join(shipped_topologies()) or 'none found'}) and not an inline spec "
                    f"KIND:... with KIND in {', '.join(KINDS)}")
