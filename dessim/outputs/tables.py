"""Span tables: CSV and Parquet export of :meth:`SimulationResult.spans`."""

from __future__ import annotations

from pathlib import Path

from dessim.engine.result import SimulationResult
from dessim.errors import DessimError

__all__ = ["write_spans"]


def write_spans(result: SimulationResult, path: str | Path) -> Path:
    """Write the span table; the format follows the suffix: ``.csv`` or ``.parquet``."""
    path = Path(path)
    df = result.spans()
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        try:
            df.to_parquet(path, index=False)
        except ImportError:
            raise DessimError("writing Parquet needs pyarrow: pip install 'dessim[parquet]'") from None
    else:
        raise DessimError(f"span table {str(path)!r}: unknown format {path.suffix!r} "
                          "(use .csv or .parquet)")
    return path
