"""Axes and points of a sweep: quantity values, axis ranges, the stable key of a point.

Values
    Strings that are quantities in dessim.units forms (``"100GB/s"``, ``"80GiB"``, ``"2us"``,
    ``"312TFLOP/s"``) are converted to SI numbers (bytes/s, bytes, s, FLOP/s) when the spec is
    read, so the results table holds numbers; the layers below accept SI numbers. Other strings
    (``"ring"``, ``"H100"``, ``"4x4"``) stay strings.

Axes
    An axis is a list of values, a single value or a range mapping: ``{start, stop, step}``
    (arithmetic, stop included), ``{from, to, factor}`` (geometric) or ``{values: [...]}``.

Points
    A :class:`Point` is one combination of axis values. Its ``key`` is a stable hash (SHA-256 of
    the canonical JSON of kind, base and parameters, plus the content of any file named in the
    base) — never Python's ``hash()`` — so an interrupted sweep recognises finished points.

The sweep file itself (its sections, the grid/zip combination) is :mod:`dessim.sweep.spec`;
this module is below it, so that the evaluators (:mod:`dessim.sweep.points`,
:mod:`dessim.sweep.layouts`) and the analysis can use points and values without the spec.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from dessim.errors import DessimError, SpecError
from dessim.units import parse_bandwidth, parse_flops, parse_size, parse_time

__all__ = ["Axis", "Point", "QUANTITY_PARSERS", "SI_SUFFIX", "quantity_family", "normalize_value",
           "expand_axis", "expand_axis_pairs", "point_key", "fingerprint"]

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
class Point:
    """One configuration of a sweep: position, parameters (axis path → value), stable key."""

    index: int
    params: Mapping[str, Any]   #: table values (SI numbers)
    key: str
    inputs: Mapping[str, Any] = field(default_factory=dict)  #: values handed to the evaluator
    #: A rough relative estimate of the point's evaluation work (None: unknown), used only to
    #: start the costliest points first (:func:`dessim.sweep.runner.run_sweep`); never a result.
    cost: float | None = field(default=None, compare=False)

    @property
    def config_params(self) -> Mapping[str, Any]:
        return self.inputs or self.params


def fingerprint(value: object) -> object:
    """JSON-ready value; a string naming an existing file adds the file's SHA-256."""
    if isinstance(value, Mapping):
        return {str(k): fingerprint(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [fingerprint(v) for v in value]
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
    doc = {"kind": kind, "base": fingerprint(base), "params": dict(params)}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
