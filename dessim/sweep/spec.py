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

Values, axis ranges and points (the stable key of each) are :mod:`dessim.sweep.axes`; the
evaluators that ``kind`` selects are :mod:`dessim.sweep.points`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import BeforeValidator, ConfigDict, Field

from dessim.errors import SpecError
from dessim.resources import read_yaml
from dessim.schema import Flag, Number, SpecModel, Text, choice, converted, described, inline_schema, validate
from dessim.sweep.axes import normalize_value
from dessim.sweep.axes import Axis, Point, expand_axis_pairs, point_key, quantity_family
from dessim.sweep.points import EVALUATORS, get_evaluator

__all__ = ["AnalysisSpec", "SweepSpec", "SweepFile", "AnalysisSection", "CostTerm", "CostValue", "AUTO_AXIS",
           "load_sweep", "parse_sweep", "expand_points"]

#: Axis name that asks the evaluator to enumerate parallel layouts.
AUTO_AXIS = "parallelism"
MODES: tuple[str, ...] = ("grid", "zip")


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


def _columns(value: object, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise SpecError(f"{where}: expected a column name or a list of column names, got {value!r}")
    return tuple(items)


def _heatmap(value: object, where: str) -> tuple[str, str]:
    hm = _columns(value, where)
    if len(hm) != 2:
        raise SpecError(f"{where}: expected two axis paths [x, y], got {list(hm)}")
    return hm[0], hm[1]


_COLUMNS_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1},
                             {"type": "array", "items": {"type": "string", "minLength": 1}}],
                   "description": "a result column or a list of them"}


class AnalysisSection(SpecModel):
    """``analysis:``: what to rank and plot."""

    metric: Text | None = Field(None, description="result column to rank (default: the kind's)")
    minimize: Flag = Field(True, description="lower is better")
    group_by: converted(_columns, _COLUMNS_SCHEMA, tuple) = ()
    heatmap: converted(_heatmap, {"type": "array", "items": {"type": "string"}, "minItems": 2,
                                  "maxItems": 2, "description": "axis paths [x, y]"}, tuple) | None = None
    vs: Text | None = Field(None, description="axis path of the line plots' x axis")


def _per(value: object, where: str) -> float:
    """``per``: a number or a quantity string (``1GB/s``) in SI units."""
    number = normalize_value(value, where)
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise SpecError(f"{where}: expected a number or a quantity such as 1GB/s, got {value!r}")
    return float(number)


class CostTerm(SpecModel):
    """One entry of ``cost:`` given as a mapping: ``price`` per ``per`` units of the column,
    times the column ``times`` if given."""

    price: Number = Field(ge=0, description="price per `per` units of the column")
    per: converted(_per, {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}],
                          "description": "units the price buys: a number or a quantity (1GB/s)"},
                   float) = Field(1.0, gt=0)
    times: Text | None = Field(None, description="a result column multiplying the term (e.g. gpus)")


def _term(value: Any) -> Any:
    """A bare number is a price per unit."""
    return value if isinstance(value, Mapping) else {"price": value}


#: A ``cost:`` entry: a price per unit of the column, or a :class:`CostTerm`.
CostValue = Annotated[described(CostTerm, lambda: {"anyOf": [{"type": "number", "minimum": 0},
                                                              inline_schema(CostTerm)]}),
                      BeforeValidator(_term)]


def _kind_bases(schema: dict[str, Any]) -> None:
    """JSON Schema: the keys of ``base:`` by ``kind`` (each evaluator's base model)."""
    schema["allOf"] = [{"if": {"properties": {"kind": {"const": name}}, "required": ["kind"]},
                        "then": {"properties": {"base": inline_schema(e.base_model)}}}
                       for name, e in EVALUATORS.items()]


class SweepFile(SpecModel):
    """A sweep file (module docstring; docs/sweeps.md)."""

    model_config = ConfigDict(json_schema_extra=_kind_bases)

    name: Text | None = Field(None, min_length=1, description="default: the file name")
    description: Text = ""
    kind: Text = Field(description="what one point evaluates (dessim.sweep.points.EVALUATORS)",
                       json_schema_extra=lambda schema: schema.update(enum=list(EVALUATORS)))
    base: dict[str, Any] = Field({}, description="the fixed part of every point (keys by kind)")
    mode: choice(MODES) = Field("grid", description="grid: cartesian product; zip: same lengths")
    axes: dict[str, Any] = Field({}, description="PATH: VALUES (a list, {start, stop, step}, "
                                 "{from, to, factor}, {values}), the first varying slowest")
    analysis: AnalysisSection = AnalysisSection()
    cost: dict[str, CostValue] = Field({}, description="COLUMN: price per unit, for the Pareto front")


#: Base keys whose string values may be files named relative to the sweep file.
FILE_KEYS: tuple[str, ...] = ("workload", "topology", "cluster")


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
    if not data:
        raise SpecError(f"{source}: empty sweep; give at least kind, base and axes")
    top = validate(SweepFile, data, source)
    evaluator = get_evaluator(top.kind, f"{source}: kind")
    base = evaluator.check_base(top.base, source)
    base = _resolve_files(base, Path(base_dir) if base_dir is not None else None)
    mode = top.mode
    raw_axes = top.axes
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
    _each_point_once(axes, mode, source)
    an = top.analysis
    analysis = AnalysisSpec(metric=an.metric, minimize=an.minimize, group_by=an.group_by,
                            heatmap=an.heatmap, vs=an.vs)
    cost = dict(data.get("cost") or {})       # as written: analysis.add_cost reads it
    name = top.name if top.name is not None else default_name
    return SweepSpec(name=name, kind=evaluator.name, base=base, axes=tuple(axes), mode=mode,
                     auto_parallelism=auto, analysis=analysis, cost=cost,
                     description=top.description, source=source)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep YAML file."""
    p = Path(path)
    data = read_yaml(p, "sweep file")
    return parse_sweep(data, str(p), default_name=p.stem, base_dir=p.parent)


def _each_point_once(axes: list[Axis], mode: str, source: str) -> None:
    """Refuse axes that would run one configuration twice: a value repeated on an axis of a
    grid (``[ring, ring]``, ``[100GB/s, 1e11]``), or a repeated row of zipped axes."""
    if mode == "zip":
        hit = _first_repeat(zip(*(a.values for a in axes)))
        if hit is not None:
            i, j = hit
            raise SpecError(f"{source}: mode zip: point {i} repeats point {j} "
                            f"({', '.join(f'{a.path}={a.inputs[i]!r}' for a in axes)})")
        return
    for a in axes:
        hit = _first_repeat(a.values)
        if hit is not None:
            i, j = hit
            raise SpecError(f"{source}: axes.{a.path}[{i}]: {a.inputs[i]!r} repeats item [{j}] "
                            f"({a.inputs[j]!r}); give each value once (the sweep would run the "
                            "same points twice)")


def _first_repeat(items) -> tuple[int, int] | None:
    """(i, j) of the first item equal (by its repr) to an earlier item j, or None."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        j = first.setdefault(repr(item), i)
        if j != i:
            return i, j
    return None


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
