"""Tables as CSV or Parquet: :meth:`SimulationResult.spans` and any other result table; the
Parquet writer that records column units and run metadata (:func:`write_parquet`, used by
sweep tables too).

A span table's Parquet file records each column's unit as field metadata ``unit``
(:data:`SPAN_UNITS`: seconds, bytes, FLOPs) and, under the schema metadata key ``dessim``, the
dessim version, the task graph and topology names and the makespan (seconds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from dessim.engine.result import SimulationResult
from dessim.errors import DessimError
from dessim.resources import check_output, install_hint, output_format

__all__ = ["write_spans", "write_table", "write_parquet", "SPAN_UNITS", "METADATA_KEY",
           "SPAN_FORMATS"]

#: Table formats by suffix → the extra that writes them (None: always available).
SPAN_FORMATS: dict[str, str | None] = {".csv": None, ".parquet": "parquet", ".pq": "parquet"}

#: Units of the span table's columns that have one.
SPAN_UNITS: dict[str, str] = {"start_s": "s", "active_s": "s", "end_s": "s", "bytes": "B",
                              "flops": "FLOP"}
#: Key of the Parquet schema metadata that records the run.
METADATA_KEY = "dessim"


def write_parquet(df: Any, path: str | Path, units: Mapping[str, str],
                  meta: Mapping[str, Any]) -> None:
    """Write a pandas DataFrame as Parquet with ``units`` as field metadata ``unit`` and
    ``meta`` (JSON) under the schema metadata key :data:`METADATA_KEY`. Needs pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DessimError(f"writing Parquet needs pyarrow: {install_hint('parquet')}") from None
    table = pa.Table.from_pandas(df, preserve_index=False)
    fields = [f.with_metadata({"unit": units[f.name]}) if f.name in units else f for f in table.schema]
    text = json.dumps({**meta, "units": {c: units[c] for c in df.columns if c in units}},
                      sort_keys=True, default=str)
    schema = pa.schema(fields, metadata={**(table.schema.metadata or {}), METADATA_KEY.encode(): text.encode()})
    pq.write_table(table.cast(schema), path)


def write_spans(result: SimulationResult, path: str | Path) -> Path:
    """Write the span table; the format follows the suffix: ``.csv`` or ``.parquet``."""
    from dessim import __version__

    meta = {"dessim_version": __version__, "graph": result.meta.get("graph", ""),
            "topology": result.meta.get("topology", ""), "makespan_s": result.makespan_s}
    return write_table(result.spans(), path, "span table", SPAN_UNITS, meta)


def write_table(df: Any, path: str | Path, what: str = "table", units: Mapping[str, str] | None = None,
                meta: Mapping[str, Any] | None = None) -> Path:
    """Write a pandas DataFrame; the format follows the suffix: ``.csv`` or ``.parquet``
    (there with ``units`` and ``meta``, :func:`write_parquet`)."""
    path = check_output(path, what, SPAN_FORMATS)
    if output_format(path, SPAN_FORMATS) == ".csv":
        df.to_csv(path, index=False)
    else:
        write_parquet(df, path, units or {}, meta or {})
    return path
