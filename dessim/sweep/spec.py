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
from typing import Any, Mapping, Sequence

from dessim.errors import SpecError
from dessim.resources import check_keys, read_yaml
from dessim.sweep.axes import Axis, Point, expand_axis_pairs, point_key, quantity_family
from dessim.sweep.points import EVALUATORS, get_evaluator

__all__ = ["AnalysisSpec", "SweepSpec", "TOP_KEYS", "AUTO_AXIS", "load_sweep", "parse_sweep",
           "expand_points"]

#: Top-level keys of a sweep file.
TOP_KEYS: tuple[str, ...] = ("name", "description", "kind", "base", "mode", "axes", "analysis",
                             "cost")
#: Keys of the ``analysis:`` section.
ANALYSIS_KEYS: tuple[str, ...] = ("metric", "minimize", "group_by", "heatmap", "vs")
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


def _check_mapping(data: object, valid: Sequence[str], where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    return check_keys(data, valid, where, f"expected a mapping with keys {', '.join(valid)}, "
                                          f"got {type(data).__name__}")


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
    from dessim.sweep.analysis import check_cost  # the cost model; here: analysis needs pandas
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
