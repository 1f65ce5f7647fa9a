"""Worked examples as golden tests: run an example's sweep and select its committed columns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from dessim.sweep.analysis import write_example_table
from dessim.sweep.runner import run_sweep

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def fresh_example_table(name: str, tmp: Path) -> pd.DataFrame:
    """examples/<name>/sweep.yaml run now (one worker), in the columns of its summarize.py."""
    here = EXAMPLES / name
    spec = importlib.util.spec_from_file_location(f"summarize_{name.replace('-', '_')}", here / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return write_example_table(run_sweep(here / "sweep.yaml", workers=1).table, mod.COLUMNS, tmp / "results.csv")
