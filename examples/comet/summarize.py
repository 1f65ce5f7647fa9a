"""Write the committed tables of the COMET-style example from a ``dessim sweep`` results file.

    python examples/comet/summarize.py comet.parquet

``results.csv``: every point (inputs, layout, offload, status, the headline metrics, cost; the
failure reason cut to one line); ``best.csv``: the fastest layout of each cluster
configuration (docs/sweeps.md reads them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dessim.sweep.analysis import best_per_group, shorten

HERE = Path(__file__).parent
AXES = ["topology.nic_bw", "memory.hbm_capacity", "memory.expansion_capacity", "memory.expansion_bw"]
COLUMNS = ["index", "status", *AXES, "layout", "offload", "iteration_s", "tokens_per_s", "mfu",
           "bubble_fraction", "compute_s", "exposed_comm_s.tp", "exposed_comm_s.pp",
           "exposed_comm_s.dp", "exposed_comm_s.offload", "memory_per_gpu_bytes.total",
           "memory_per_gpu_bytes.offloaded:cxl", "cost", "error_type", "reason"]


def main(path: str) -> None:
    table = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    out = table[[c for c in COLUMNS if c in table.columns]].copy()
    out["reason"] = [shorten(r, 160) if isinstance(r, str) else r for r in out["reason"]]
    out.to_csv(HERE / "results.csv", index=False, float_format="%.6g")
    best = best_per_group(table, "iteration_s", AXES).sort_values(AXES, kind="mergesort")
    best[[c for c in COLUMNS if c in best.columns and c not in ("error_type", "reason", "status")]].to_csv(
        HERE / "best.csv", index=False, float_format="%.6g")


if __name__ == "__main__":
    main(sys.argv[1])
