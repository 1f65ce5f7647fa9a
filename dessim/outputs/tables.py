"""Tables as CSV or Parquet: :meth:`SimulationResult.spans` and any other result table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dessim.engine.result import SimulationResult
from dessim.errors import DessimError

__all__ = ["write_spans", "write_table"]


def write_spans(result: SimulationResult, path: str | Path) -> Path:
    """Write the span table; the format follows the suffix: ``.csv`` or ``.parquet``."""
    return write_table(result.spans(), path, "span table")


def write_table(df: Any, path: str | Path, what: str = "table") -> Path:
    """Write a pandas DataFrame; the format follows the suffix: ``.csv`` or ``.parquet``."""
    path = Path(path)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        try:
            df.to_parquet(path, index=False)
        except ImportError:
            raise DessimError("writing Parquet needs pyarrow: pip install 'dessim[parquet]'") from None
    else:
        raise DessimError(f"{what} {str(path)!r}: unknown format {path.suffix!r} "
                          "(use .csv or .parquet)")
    return path
