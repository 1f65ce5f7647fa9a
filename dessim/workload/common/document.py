"""Workload documents (parsed YAML): merging overrides into a document, and
:func:`check_section` for the ``dessim train`` options mapping (workload files themselves are
validated by their kind's pydantic model, :mod:`dessim.schema`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

from dessim.errors import DessimError, SpecError

__all__ = ["check_section", "merge_document"]


def check_section(data: Any, schema: Mapping[str, Any], where: str,
                  name: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Check a mapping's keys against ``schema`` and convert its values; a value's errors
    name it ``name(key)`` (default ``where.key``; the command line passes its flags)."""
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
            out[key] = value if convert is None else convert(value, name(key) if name else f"{where}.{key}")
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
