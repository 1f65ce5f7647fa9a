"""Sweep specifications: YAML parsing, validation and expansion of axes into points.

Schema (docs/sweeps.md has the full reference)::

    name: comet-like                 # default: the file name
    description: "..."
    kind: workload                   # an evaluator of dessim.sweep.points.EVALUATORS
    base:                            # the fixed part of every point (keys depend on kind)
      workload: gpt3-13b             # file or preset   (kind: workload)
      topology: "dgx-a100:nodes=4"   # inline spec, shipped name, YAML path or mapping
      engine: {network: flow}
    mode: grid                       # grid (cartesian product, default) | zip (same lengths)
    axes:                            # PATH: VALUES, in this order (the first varies slowest)
      topology.nodes: [1, 2, 4]
      topology.oversub: {start: 1, stop: 4, step: 1}        # arithmetic, stop included
      topology.uplink_bw: {from: 100GB/s, to: 800GB/s, factor: 2}   # geometric
      workload.training.micro_batch: {values: [1, 2]}
      parallelism: auto              # every valid layout (workload kind)
    analysis: {metric: iteration_s, group_by: [topology.nodes], heatmap: [x, y], vs: axis}
    cost:                            # optional, for the Pareto front (see analysis.py)
      gpus: 30000                    # price per unit of a result column
      topology.uplink_bw: {price: 40, per: 1GB/s, times: gpus}

Values
    Strings that are quantities in dessim.units forms (``"100GB/s"``, ``"80GiB"``, ``"2us"``,
    ``"312TFLOP/s"``) are converted to SI numbers (bytes/s, bytes, s, FLOP/s) when the spec is
    read, so the results table holds numbers; the layers below accept SI numbers. Other strings
    (``"ring"``, ``"H100"``, ``"4x4"``) stay strings.

Points
    A :class:`Point` is one combination of axis values. Its ``key`` is a stable hash (SHA-256 of
    the canonical JSON of kind, base and parameters, plus the content of any file named in the
    base) — never Python's ``hash()`` — so an interrupted sweep recognises finished points.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence


from dessim.resources import read_yaml
from dessim.errors import DessimError, SpecError
from dessim.units import parse_bandwidth, parse_flops, parse_size, parse_time

__all__ = ["Axis", "AnalysisSpec", "SweepSpec", "Point", "QUANTITY_PARSERS", "TOP_KEYS",
           "AUTO_AXIS", "load_sweep", "parse_sweep", "expand_axis", "normalize_value",
           "quantity_family", "expand_points", "point_key", "expand_axis_pairs", "SI_SUFFIX"]

#: Top-level keys of a sweep file.
TOP_KEYS: tuple[str, ...] = ("name", "description", "kind", "base", "mode", "axes", "analysis",
                             "cost")
#: Keys of the ``analysis:`` section.
ANALYSIS_KEYS: tuple[str, ...] = ("metric", "minimize", "group_by", "heatmap", "vs")
#: Axis name that asks the evaluator to enumerate parallel layouts.
AUTO_AXIS = "parallelism"
MODES: tuple[str, ...] = ("grid", "zip")

#: Quantity families tried, in order, on string values (all parsers of dessim.units). A size
#: never ends in "/s", a bandwidth always does, a time has a time unit, a rate a FLOP unit, so
#: at most one family matches a string with a unit; a bare number parses as the first (size).
QUANTITY_PARSERS: tuple[tuple[str, Callable[..., float]], ...] = (
    ("size", parse_size), ("bandwidth", parse_bandwidth), ("time", parse_time),
    ("flops", parse_flops))


def quantity_family(value: object) -> str | None:
    """The unit family of a string quantity (``"100GB/s"`` → ``"bandwidth"``), else None."""
    if not isinstance(value, str):
        return None
    for family, parse in QUANTITY_PARSERS:
        try:
            parse(value, "value")
        except DessimError:
            continue
        return family
    return None


def normalize_value(value: object, where: str) -> object:
    """SI number for a quantity string, the value unchanged otherwise (see module doc)."""
    if isinstance(value, str):
        for _family, parse in QUANTITY_PARSERS:
            try:
                number = parse(value, where)
            except DessimError:
                continue
            return int(number) if float(number).is_integer() and abs(number) < 2**53 else number
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{where}: {value!r} is not a finite number")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [normalize_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): normalize_value(v, f"{where}.{k}") for k, v in value.items()}
    raise SpecError(f"{where}: unsupported value {value!r} (use numbers, strings, lists, mappings)")


def _number(value: object, where: str) -> tuple[float, str | None]:
    """(SI number, family) of a range bound; a SpecError naming ``where`` otherwise."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a number or a quantity such as 100GB/s, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value), None
    family = quantity_family(value)
    if family is None:
        raise SpecError(f"{where}: cannot read {value!r} as a number or a quantity "
                        "(size 80GB, bandwidth 100GB/s, time 2us, rate 312TFLOP/s)")
    return float(normalize_value(value, where)), family  # type: ignore[arg-type]


#: Unit suffix that writes an SI number of a family back as a dessim.units string, so the
#: layer below parses it with its own rules (a size given for a bandwidth is still an error).
SI_SUFFIX: dict[str, str] = {"size": "B", "bandwidth": "B/s", "time": "s", "flops": "FLOP/s"}


def _pair(number: float, integral: bool, family: str | None) -> tuple[object, object]:
    """(table value, value passed down) of a generated range value."""
    value = int(round(number)) if integral else number
    return value, value if family is None else f"{value!r}{SI_SUFFIX[family]}"


def _family_of(bounds: Mapping[str, tuple[float, str | None]], where: str) -> str | None:
    families = {f for _, f in bounds.values() if f is not None}
    if len(families) > 1:
        raise SpecError(f"{where}: bounds mix units ({', '.join(sorted(families))})")
    return families.pop() if families else None


def _arithmetic(raw: Mapping[str, Any], where: str) -> list[tuple[object, object]]:
    bounds = {k: _number(raw[k], f"{where}.{k}") for k in ("start", "stop", "step")}
    family = _family_of(bounds, where)
    start, stop, step = (bounds[k][0] for k in ("start", "stop", "step"))
    if step <= 0 or stop < start:
        raise SpecError(f"{where}: need step > 0 and stop >= start, got start={raw['start']!r}, "
                        f"stop={raw['stop']!r}, step={raw['step']!r}")
    count = int(math.floor((stop - start) / step + 1e-9)) + 1
    integral = all(float(b[0]).is_integer() for b in bounds.values())
    return [_pair(start + i * step, integral, family) for i in range(count)]


def _geometric(raw: Mapping[str, Any], where: str) -> list[tuple[object, object]]:
    bounds = {k: _number(raw[k], f"{where}.{k}") for k in ("from", "to")}
    family = _family_of(bounds, where)
    lo, hi = bounds["from"][0], bounds["to"][0]
    factor = raw["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        raise SpecError(f"{where}.factor: expected a number > 1, got {factor!r}")
    if not 0 < lo <= hi:
        raise SpecError(f"{where}: need 0 < from <= to, got from={raw['from']!r}, to={raw['to']!r}")
    count = int(math.floor(math.log(hi / lo) / math.log(factor) + 1e-9)) + 1
    integral = lo.is_integer() and float(factor).is_integer()
    return [_pair(lo * factor**i, integral, family) for i in range(count)]


def _as_list(values: object, where: str) -> list[tuple[object, object]]:
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: expected a non-empty list of values, got {values!r}")
    return [(normalize_value(v, f"{where}[{i}]"), v) for i, v in enumerate(values)]


#: Range forms: the keys that select a form (exactly these), and the expansion.
RANGE_FORMS: tuple[tuple[frozenset[str], Callable[[Mapping[str, Any], str], list[tuple[object, object]]]], ...] = (
    (frozenset({"start", "stop", "step"}), _arithmetic),
    (frozenset({"from", "to", "factor"}), _geometric),
    (frozenset({"values"}), lambda raw, where: _as_list(raw["values"], f"{where}.values")),
)


def expand_axis_pairs(raw: object, where: str) -> list[tuple[object, object]]:
    """(table value, value passed down) per value of one axis: the table holds SI numbers,
    the layers below get the value as written (ranges: the SI number with its unit)."""
    if isinstance(raw, Mapping):
        keys = frozenset(raw)
        for form, expand in RANGE_FORMS:
            if keys == form:
                return expand(raw, where)
        forms = " | ".join("{" + ", ".join(sorted(f)) + "}" for f, _ in RANGE_FORMS)
        raise SpecError(f"{where}: a range mapping has keys {sorted(keys)}; valid forms: {forms}")
    if isinstance(raw, list):
        return _as_list(raw, where)
    return [(normalize_value(raw, where), raw)]


def expand_axis(raw: object, where: str) -> list[object]:
    """Values of one axis as they appear in the table: a list, a range mapping or a single
    value (see module doc); quantities as SI numbers."""
    return [value for value, _ in expand_axis_pairs(raw, where)]


@dataclass(frozen=True)
class Axis:
    """One swept parameter: its path (``topology.nodes``) and its values (SI numbers/strings)."""

    path: str
    values: tuple[Any, ...]
    #: The values handed to the layer below (as written; see :func:`expand_axis_pairs`).
    inputs: tuple[Any, ...] = ()
    #: Unit family shared by the values as written ("bandwidth", ...), for plot labels.
    family: str | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AnalysisSpec:
    """What to rank and plot: ``metric`` (default: the evaluator's), lower is better unless
    ``minimize`` is false, ``group_by`` columns, ``heatmap`` axes ``[x, y]``, ``vs`` axis."""

    metric: str | None = None
    minimize: bool = True
    group_by: tuple[str, ...] = ()
    heatmap: tuple[str, str] | None = None
    vs: str | None = None


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: position, parameters (axis path → value), stable key."""

    index: int
    params: Mapping[str, Any]   #: table values (SI numbers)
    key: str
    inputs: Mapping[str, Any] = field(default_factory=dict)  #: values handed to the evaluator

    @property
    def config_params(self) -> Mapping[str, Any]:
        return self.inputs or self.params


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep (see module doc); ``source`` names the file in messages."""

    name: str
    kind: str
    base: Mapping[str, Any]
    axes: tuple[Axis, ...]
    mode: str = "grid"
    auto_parallelism: bool = False
    analysis: AnalysisSpec = AnalysisSpec()
    cost: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str = "<sweep>"

    @property
    def axis_paths(self) -> tuple[str, ...]:
        return tuple(a.path for a in self.axes)

    def points(self) -> list[Point]:
        """The points before any evaluator expansion (``parallelism: auto``)."""
        return expand_points(self)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that :func:`parse_sweep` reads back into an equal spec."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "base": dict(self.base),
                               "mode": self.mode,
                               "axes": {a.path: list(a.inputs or a.values) for a in self.axes}}
        if self.auto_parallelism:
            out["axes"][AUTO_AXIS] = "auto"
        an = self.analysis
        out["analysis"] = {"metric": an.metric, "minimize": an.minimize,
                           "group_by": list(an.group_by),
                           "heatmap": list(an.heatmap) if an.heatmap else None, "vs": an.vs}
        out["analysis"] = {k: v for k, v in out["analysis"].items() if v not in (None, [])}
        if self.cost:
            out["cost"] = dict(self.cost)
        if self.description:
            out["description"] = self.description
        return out


def _check_mapping(data: object, valid: Sequence[str], where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(valid)}, "
                        f"got {type(data).__name__}")
    for key in data:
        if key not in valid:
            raise SpecError(f"{where}: unknown key {key!r}; valid keys: {', '.join(valid)}")
    return data


def _str_list(value: object, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise SpecError(f"{where}: expected a column name or a list of column names, got {value!r}")
    return tuple(items)


def _parse_analysis(raw: object, where: str) -> AnalysisSpec:
    data = _check_mapping(raw, ANALYSIS_KEYS, where)
    heatmap = None
    if data.get("heatmap") is not None:
        hm = _str_list(data["heatmap"], f"{where}.heatmap")
        if len(hm) != 2:
            raise SpecError(f"{where}.heatmap: expected two axis paths [x, y], got {list(hm)}")
        heatmap = (hm[0], hm[1])
    minimize = data.get("minimize", True)
    if not isinstance(minimize, bool):
        raise SpecError(f"{where}.minimize: expected true or false, got {minimize!r}")
    for key in ("metric", "vs"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise SpecError(f"{where}.{key}: expected a column name, got {data[key]!r}")
    return AnalysisSpec(metric=data.get("metric"), minimize=minimize,
                        group_by=_str_list(data.get("group_by", []), f"{where}.group_by"),
                        heatmap=heatmap, vs=data.get("vs"))


#: Base keys whose string values may be files named relative to the sweep file.
FILE_KEYS: tuple[str, ...] = ("workload", "topology")


def _resolve_files(base: Mapping[str, Any], base_dir: Path | None) -> dict[str, Any]:
    out = dict(base)
    if base_dir is None:
        return out
    for key in FILE_KEYS:
        value = out.get(key)
        if isinstance(value, str) and not Path(value).is_absolute() and (base_dir / value).is_file():
            out[key] = str(base_dir / value)
    return out


def parse_sweep(data: object, source: str = "<sweep>", default_name: str = "sweep",
                base_dir: str | Path | None = None) -> SweepSpec:
    """A validated :class:`SweepSpec` from parsed YAML; errors name ``source`` and the place.

    ``base_dir``: directory that relative file names in ``base`` (workload, topology) are
    looked up in first (:func:`load_sweep` passes the sweep file's directory).
    """
    from dessim.sweep.points import EVALUATORS, get_evaluator  # registry lives with evaluators

    top = _check_mapping(data, TOP_KEYS, f"{source}: top level")
    if not top:
        raise SpecError(f"{source}: empty sweep; give at least kind, base and axes")
    if "kind" not in top:
        raise SpecError(f"{source}: missing 'kind' (valid kinds: {', '.join(EVALUATORS)})")
    evaluator = get_evaluator(top["kind"], f"{source}: kind")
    base = evaluator.check_base(_check_mapping(top.get("base"), evaluator.base_keys,
                                               f"{source}: base"), f"{source}: base")
    base = _resolve_files(base, Path(base_dir) if base_dir is not None else None)
    mode = top.get("mode", "grid")
    if mode not in MODES:
        raise SpecError(f"{source}: mode {mode!r} is unknown; valid modes: {', '.join(MODES)}")
    raw_axes = top.get("axes") or {}
    if not isinstance(raw_axes, Mapping):
        raise SpecError(f"{source}: axes must be a mapping of PATH: VALUES, got {raw_axes!r}")
    evaluator.check_complete(base, [str(p) for p in raw_axes], f"{source}")
    axes: list[Axis] = []
    auto = False
    for path, raw in raw_axes.items():
        where = f"{source}: axes.{path}"
        if path == AUTO_AXIS:
            if raw != "auto":
                raise SpecError(f"{where}: the only value is 'auto' (every valid parallel layout); "
                                f"got {raw!r}")
            if not evaluator.supports_auto:
                kinds = [k for k, e in EVALUATORS.items() if e.supports_auto]
                raise SpecError(f"{where}: 'auto' is not available for kind {evaluator.name!r}" +
                                (f"; kinds that enumerate layouts: {', '.join(kinds)}" if kinds else
                                 " (this installation has no layout enumerator: "
                                 "dessim.workload.enumerate_layouts)"))
            auto = True
            continue
        pairs = expand_axis_pairs(raw, where)
        values = [v for v, _ in pairs]
        evaluator.check_axis(str(path), [i for _, i in pairs], base, where)
        families = {quantity_family(v) for v in (raw if isinstance(raw, list) else [])} - {None}
        if isinstance(raw, Mapping) and raw.keys() != {"values"}:
            bounds = [raw.get(k) for k in ("start", "from")]
            families = {quantity_family(b) for b in bounds} - {None}
        axes.append(Axis(str(path), tuple(values), tuple(i for _, i in pairs), family=families.pop() if len(families) == 1 else None))
    if mode == "zip" and len({len(a.values) for a in axes}) > 1:
        sizes = ", ".join(f"{a.path}: {len(a.values)}" for a in axes)
        raise SpecError(f"{source}: mode zip needs axes of equal length, got {sizes}")
    analysis = _parse_analysis(top.get("analysis"), f"{source}: analysis")
    cost = top.get("cost") or {}
    if not isinstance(cost, Mapping):
        raise SpecError(f"{source}: cost must be a mapping of COLUMN: PRICE, got {cost!r}")
    from dessim.sweep.analysis import check_cost  # the cost model lives with the analysis
    check_cost(cost, f"{source}: cost")
    name = top.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise SpecError(f"{source}: name must be a non-empty string, got {name!r}")
    return SweepSpec(name=name, kind=evaluator.name, base=base, axes=tuple(axes), mode=mode,
                     auto_parallelism=auto, analysis=analysis, cost=dict(cost),
                     description=str(top.get("description", "")), source=source)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep YAML file."""
    p = Path(path)
    data = read_yaml(p, "sweep file")
    return parse_sweep(data, str(p), default_name=p.stem, base_dir=p.parent)


def _fingerprint(value: object) -> object:
    """JSON-ready value; a string naming an existing file adds the file's SHA-256."""
    if isinstance(value, Mapping):
        return {str(k): _fingerprint(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fingerprint(v) for v in value]
    if isinstance(value, str) and len(value) < 4096:
        try:
            p = Path(value)
            if p.is_file():
                return {"file_sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        except OSError:
            pass
    return value


def point_key(kind: str, base: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit identity of a point (SHA-256 of canonical JSON)."""
    doc = {"kind": kind, "base": _fingerprint(base), "params": dict(params)}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def expand_points(spec: SweepSpec) -> list[Point]:
    """Grid (first axis slowest) or zip combination of the axes, as :class:`Point` s."""
    value_lists = [list(zip(a.values, a.inputs or a.values)) for a in spec.axes]
    combos = itertools.product(*value_lists) if spec.mode == "grid" else zip(*value_lists)
    points = []
    for i, combo in enumerate(combos):
        params = {path: v for path, (v, _) in zip(spec.axis_paths, combo)}
        inputs = {path: x for path, (_, x) in zip(spec.axis_paths, combo)}
        points.append(Point(i, params, point_key(spec.kind, spec.base, params), inputs))
    return points
