"""Sweep throughput: simulated configurations per minute for a 200-point sweep.

Run: ``python benchmarks/bench_sweep.py [--workers 1 2]``.

The collective sweep is 200 all-reduce/all-gather simulations (flow network model) on a
leaf-spine of 16 or 32 GPUs: 2 sizes of cluster × 2 ops × 5 algorithms × 10 message sizes
(64KiB..32MiB). (A workload-kind sweep is to be added once dessim.workload.simulate_workload
exists.) Each run starts from an empty journal;
throughput counts the wall time of ``run_sweep`` including the process pool's start-up.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dessim.sweep.runner import run_sweep

COLLECTIVE_200 = {
    "name": "bench-collective-200",
    "kind": "collective",
    "base": {"topology": "leafspine:hosts=16,leaves=4,bw=50GB/s,lat=1us",
             "collective": {"op": "allreduce", "size": "1MiB"}},
    "axes": {"topology.hosts": [16, 32],
             "collective.op": ["allreduce", "allgather"],
             "engine.algo": ["ring", "tree", "rd", "direct", "hierarchical"],
             "collective.size": {"from": "64KiB", "to": "32MiB", "factor": 2}},
}

SPECS = {"collective": COLLECTIVE_200}


def bench(spec: dict, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run_sweep(spec, out=Path(tmp) / "r.parquet", workers=workers)
        wall = time.perf_counter() - start
    ok = int((result.table["status"] == "ok").sum())
    return {"points": result.points, "ok": ok, "workers": workers, "wall_s": wall,
            "per_minute": 60.0 * result.points / wall,
            "mean_point_s": float(result.table["eval_wall_s"].mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kind", choices=list(SPECS), default="collective")
    args = parser.parse_args()
    spec = SPECS[args.kind]
    print(f"{spec['name']}: kind {spec['kind']}")
    for w in args.workers:
        r = bench(spec, w)
        print(f"  workers={w}: {r['points']} points ({r['ok']} ok) in {r['wall_s']:.1f} s "
              f"-> {r['per_minute']:.0f} configurations/min (mean {1e3 * r['mean_point_s']:.1f} ms "
              f"per point)")


if __name__ == "__main__":
    main()
