"""Workload documents (parsed YAML): checking a section's keys and converting its values,
merging overrides into a document — the same rules for every kind of workload file.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

from dessim.errors import DessimError, SpecError
from dessim.resources import check_keys  # noqa: F401  (re-exported: the workload kinds call it from here)

__all__ = ["as_bool", "as_str", "as_choice", "as_positive", "check_keys", "check_section", "merge_document"]


def as_bool(value: Any, what: str) -> bool:
    """``value`` if it is true or false, else a :class:`SpecError` naming ``what``."""
    if not isinstance(value, bool):
        raise SpecError(f"{what}: expected true or false, got {value!r}")
    return value


def as_str(value: Any, what: str) -> str:
    """``value`` if it is a string, else a :class:`SpecError` naming ``what``."""
    if not isinstance(value, str):
        raise SpecError(f"{what}: expected a string, got {value!r}")
    return value


def as_choice(value: Any, choices: Any, what: str) -> Any:
    """``value`` if it is one of ``choices`` (a mapping's keys or a collection of strings),
    else a :class:`SpecError` naming ``what`` and listing them (also for unhashable values
    such as a list, which ``value in choices`` would crash on)."""
    if isinstance(value, (str, int, float, bool)) and value in choices:
        return value
    raise SpecError(f"{what} {value!r} is unknown; valid: {', '.join(map(str, choices))}")


def as_positive(value: Any, what: str) -> float:
    """``value`` as a finite number > 0 (int or float, not a bool or string), else a
    :class:`SpecError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise SpecError(f"{what}: expected a finite number > 0, got {value!r}")
    return float(value)


def check_section(data: Any, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check a mapping's keys against ``schema`` and convert its values."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of keys to values, got {type(data).__name__}")
    out = {}
    for key, value in data.items():
        if key not in schema:
            raise SpecError(f"{where}: unknown key {key!r}; valid keys: {', '.join(schema)}")
        convert = schema[key]
        try:
            out[key] = value if convert is None else convert(value, f"{where}.{key}")
        except SpecError:
            raise
        except DessimError as exc:  # e.g. a UnitError from dessim.units
            raise SpecError(str(exc)) from None
    return out


def merge_document(doc: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Merge ``extra`` into the workload document ``doc`` in place: nested mappings key by
    key, everything else replaced by a deep copy (overrides on a preset's document)."""
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(doc.get(k), dict):
            merge_document(doc[k], v)
        else:
            doc[k] = copy.deepcopy(v)
