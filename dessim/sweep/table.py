"""The results table of a sweep: columns, missing values, units, and what the file records.

Columns
    :data:`FIXED_COLUMNS` first, then the parameters (axes first, in spec order), the metrics
    in the order they first appear, and ``eval_wall_s`` (host seconds). A value a point does
    not have is a real null: ``reason`` and ``error_type`` of successful points, every metric
    of a failed point. Whole-number metrics stay whole numbers with nulls (pandas ``Int64``,
    Parquet ``int64``), true/false ones booleans, never ``-1``, ``""`` or the text ``"nan"``.

Units (:func:`column_units`)
    Axis columns hold SI numbers; an axis written with units (``100GB/s``, ``80GB``, ``2us``,
    ``312TFLOP/s``) gets the unit of its family (B/s, B, s, FLOP/s). Metric units follow the
    metric names' suffix conventions (:data:`METRIC_UNITS`: ``_s`` seconds, ``_bytes`` bytes,
    ``_GBps`` GB/s, ...; the part before the first dot counts for nested metrics such as
    ``exposed_comm_s.tp``). Parquet files carry each column's unit as field metadata
    ``unit``; the CSV format has no place for it (the column names stay the axis paths that
    the spec's ``analysis`` and ``cost`` sections refer to).

File metadata (Parquet, key ``dessim``)
    JSON with the dessim version, the sweep as parsed (:meth:`SweepSpec.to_dict`), the
    SHA-256 of every file the sweep's base names (as in the point keys,
    :func:`dessim.sweep.axes.fingerprint`) and the units: a table says what produced it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from dessim.resources import check_output
from dessim.outputs.tables import METADATA_KEY, write_parquet
from dessim.sweep.axes import SI_SUFFIX, Point, fingerprint

__all__ = ["FIXED_COLUMNS", "METRIC_UNITS", "METADATA_KEY", "WRITERS", "TABLE_FORMATS", "records_to_table",
           "column_units", "table_metadata", "write_table"]

#: Columns every results table starts with (then the axes, the metrics, eval_wall_s).
FIXED_COLUMNS: tuple[str, ...] = ("index", "key", "status", "reason", "error_type")
#: Unit of a metric by the end of its name, first match wins (see module doc).
METRIC_UNITS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"),
    ("_tflops_per_gpu", "TFLOP/s"), ("_GBps", "GB/s"), ("_Bps", "B/s"), ("_bytes", "B"),
    ("_flops", "FLOP"), ("_s", "s"),
)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def records_to_table(points: Sequence[Point], records: Mapping[str, Mapping[str, Any]],
                     axis_paths: Sequence[str]) -> pd.DataFrame:
    """Rows of the finished points in point order: fixed columns, parameters, metrics."""
    rows, metric_cols = [], {}
    types: dict[str, set[type]] = {}
    for p in points:
        rec = records.get(p.key)
        if rec is None:
            continue
        row = {"index": p.index, "key": p.key, "status": rec["status"],
               "reason": rec.get("reason") or None, "error_type": rec.get("error_type") or None}
        row.update(p.params)
        for k, v in (rec.get("metrics") or {}).items():
            metric_cols.setdefault(k, None)
            row[k] = v
            if _present(v):
                types.setdefault(k, set()).add(type(v))
        row["eval_wall_s"] = rec.get("eval_wall_s", math.nan)
        rows.append(row)
    param_cols = list(dict.fromkeys([*axis_paths, *(k for p in points for k in p.params)]))
    columns = [*FIXED_COLUMNS, *param_cols,
               *(c for c in metric_cols if c not in param_cols), "eval_wall_s"]
    table = pd.DataFrame(rows, columns=columns)
    for col, seen in types.items():
        if col in param_cols:
            continue
        if seen == {bool}:
            table[col] = table[col].astype("boolean")
        elif seen == {int}:
            table[col] = table[col].astype("Int64")
    return table


def column_units(table: pd.DataFrame, axis_units: Mapping[str, str]) -> dict[str, str]:
    """Unit of every column that has one: ``axis_units`` for axes, else by name (module doc)."""
    units: dict[str, str] = {}
    for col in table.columns:
        if col in axis_units:
            units[col] = axis_units[col]
            continue
        head = col.split(".", 1)[0]
        unit = next((u for end, u in METRIC_UNITS if head.endswith(end)), None)
        if unit is not None:
            units[col] = unit
    return units


def table_metadata(spec: Any, table: pd.DataFrame) -> dict[str, Any]:
    """What the Parquet file records about its run (module doc); ``spec`` a SweepSpec."""
    from dessim import __version__

    axis_units = {a.path: SI_SUFFIX[a.family] for a in spec.axes if a.family in SI_SUFFIX}
    return {"dessim_version": __version__, "sweep": spec.to_dict(),
            "base_files": fingerprint(spec.base), "units": column_units(table, axis_units)}


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding several Python types become strings (Parquet needs one type);
    nulls stay nulls."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            types = {type(v) for v in out[col] if _present(v)}
            if len(types) > 1 or (types and not types <= {str, bool}):
                out[col] = out[col].map(lambda v: str(v) if _present(v) else None)
    return out


def _write_parquet(df: pd.DataFrame, path: Path, meta: Mapping[str, Any] | None) -> None:
    meta = dict(meta or {})
    write_parquet(_parquet_safe(df), path, meta.pop("units", {}), meta)


#: Table writers by file suffix: ``writer(table, path, metadata or None)``.
WRITERS: dict[str, Callable[[pd.DataFrame, Path, Mapping[str, Any] | None], None]] = {
    ".parquet": _write_parquet,
    ".csv": lambda df, p, meta: df.to_csv(p, index=False),
}


#: The extra each results format needs (None: always available).
TABLE_FORMATS: dict[str, str | None] = {".parquet": "parquet", ".csv": None}


def write_table(df: pd.DataFrame, out: str | Path, spec: Any = None) -> Path:
    """Write the results table; the format follows the suffix (.parquet or .csv). With the
    sweep's ``spec``, a Parquet file records units, inputs and version (module doc)."""
    p = check_output(out, "sweep results file", TABLE_FORMATS)
    writer = WRITERS[p.suffix.lower()]
    tmp = p.with_name(p.name + ".tmp")
    writer(df, tmp, table_metadata(spec, df) if spec is not None else None)
    os.replace(tmp, p)   # atomic: a kill never leaves a half-written table
    return p
