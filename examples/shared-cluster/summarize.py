"""Write the committed table of the shared-cluster example from a ``dessim sweep`` results file.

    python examples/shared-cluster/summarize.py shared.parquet

``results.csv``: one row per scheduling policy — makespan, utilisation, fairness loss,
slowdowns and each job's completion time and slowdown (seconds); docs/shared-cluster.md reads
it and tests/test_worked_examples.py checks a fresh run against it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dessim.sweep.analysis import read_results, write_example_table

HERE = Path(__file__).parent
JOBS = ("r1", "v1", "r2", "r3", "v2")
COLUMNS = ["scheduler.policy", "status", "makespan_s", "utilization", "fairness_loss", "mean_slowdown",
           "max_slowdown", "mean_jct_s", *(f"jobs.{j}.{k}" for j in JOBS for k in ("jct_s", "slowdown"))]


def main(path: str) -> None:
    write_example_table(read_results(path), COLUMNS, HERE / "results.csv")


if __name__ == "__main__":
    main(sys.argv[1])
