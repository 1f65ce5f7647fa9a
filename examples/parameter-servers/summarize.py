"""Write the committed table of the parameter-server example from a ``dessim sweep`` results file.

    python examples/parameter-servers/summarize.py ps.parquet

``results.csv``: every point (placement, servers, the headline figures, seconds);
docs/parameter-servers.md reads it and tests/test_examples_ps_cluster.py checks a fresh run
against it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dessim.sweep.analysis import read_results, write_example_table

HERE = Path(__file__).parent
COLUMNS = ["workload.training.ps_placement", "workload.training.parameter_servers", "status", "iteration_s",
           "compute_s", "gpu_busy_fraction", "exposed_comm_s.ps", "samples_per_s", "details.ps_mode"]


def main(path: str) -> None:
    write_example_table(read_results(path), COLUMNS, HERE / "results.csv")


if __name__ == "__main__":
    main(sys.argv[1])
