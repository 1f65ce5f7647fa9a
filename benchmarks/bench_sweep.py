"""Sweep throughput: simulated configurations per minute for a 200-point sweep.

Run: ``python benchmarks/bench_sweep.py [--kind collective|workload] [--workers 1 2]``.

``collective``
    200 all-reduce/all-gather simulations (flow network model) on a leaf-spine of 16 or 32
    GPUs: 2 sizes of cluster × 2 ops × 5 algorithms × 10 message sizes (64KiB..32MiB).
``workload``
    The first 200 points of a ``parallelism: auto`` sweep of a small transformer
    (``SMALL_MODEL``: 4 layers, hidden 256, 512-token sequences) on 1 or 2 DGX A100 nodes
    (8 / 16 GPUs): NIC bandwidth (4 values) × global batch (8, 16) × network model (flow,
    analytical) × every valid layout (9 on 8 GPUs, 11 on 16). Each point is a full training
    iteration (task-graph generation + simulation).

Each run starts from an empty journal; throughput counts the wall time of ``run_sweep``
including the expansion of the layouts and the process pool's start-up.
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
             "engine.collectives.algo": ["ring", "tree", "rd", "direct", "hierarchical"],
             "collective.size": {"from": "64KiB", "to": "32MiB", "factor": 2}},
}

#: A small GPT-style model (fits every layout of 8-16 A100s; a point simulates in ~0.05-0.5 s).
SMALL_MODEL = """\
name: bench-small
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 4096, seq_len: 512}
parallelism: {tp: 1, pp: 1}
training: {global_batch: 16, micro_batch: 1, zero_stage: 1, recompute: selective}
"""

WORKLOAD_200 = {
    "name": "bench-workload-200",
    "kind": "workload",
    "base": {"workload": "MODEL", "topology": "dgx-a100:nodes=1"},
    "axes": {"topology.nodes": [1, 2],
             "topology.nic_bw": ["100Gb/s", "200Gb/s", "400Gb/s", "800Gb/s"],
             "workload.training.global_batch": [8, 16],
             "engine.network": ["flow", "analytical"],
             "parallelism": "auto"},
}

SPECS = {"collective": COLLECTIVE_200, "workload": WORKLOAD_200}
POINTS = 200


def bench(spec: dict, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if spec["kind"] == "workload":
            model = Path(tmp) / "small.yaml"
            model.write_text(SMALL_MODEL)
            spec = {**spec, "base": {**spec["base"], "workload": str(model)}}
        start = time.perf_counter()
        result = run_sweep(spec, out=Path(tmp) / "r.parquet", workers=workers, max_points=POINTS)
        wall = time.perf_counter() - start
    done = len(result.table)
    ok = int((result.table["status"] == "ok").sum())
    return {"points": done, "ok": ok, "workers": workers, "wall_s": wall,
            "per_minute": 60.0 * done / wall,
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
