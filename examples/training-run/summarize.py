"""Write the committed table of the training-run example from a ``dessim sweep`` results file.

    dessim sweep examples/training-run/sweep.yaml --out tr.parquet
    python examples/training-run/summarize.py tr.parquet

``results.csv``: every point (nodes, checkpoint interval, the headline figures; seconds, MWh,
USD); docs/training-run.md ("Example: the cheapest cluster size") reads it and
tests/test_worked_examples.py checks a fresh run against it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dessim.sweep.analysis import read_results, write_example_table

HERE = Path(__file__).parent
COLUMNS = ["topology.nodes", "train.checkpoint_interval", "status", "iteration_s", "time_to_train_s",
           "goodput", "expected_failures", "energy_run_mwh", "cost_usd", "checkpoint.interval_s"]


def main(path: str) -> None:
    write_example_table(read_results(path), COLUMNS, HERE / "results.csv")


if __name__ == "__main__":
    main(sys.argv[1])
