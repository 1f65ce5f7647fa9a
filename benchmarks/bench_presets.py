"""Benchmark: every shipped workload preset with no flags (issue 17).

Each preset runs at its own GPU count on the topology ``dessim workload show`` suggests
(data-parallel kinds — DLRM, CNNs — on one DGX H100), exactly as ``dessim simulate NAME
--topology SPEC`` runs it: default options, so the automatic shortcuts are whatever the
defaults choose. One subprocess per preset, so that each peak RSS is its own; a preset that
exceeds ``--timeout`` is killed and reported.

Usage:
    python benchmarks/bench_presets.py [--only NAME[,NAME]] [--timeout S] [--markdown]

Prints one line per preset: GPUs, topology, wall time (generation + simulation, process
start excluded), peak RSS, iteration time, and the shortcuts taken; then the targets
(<= 10 s and <= 1 GiB each; llama3-405b on its 8,192 GPUs <= 60 s; llama3-405b-cp16 on its
16,384 GPUs <= 120 s and <= 2 GiB).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_S = 10.0
TARGET_BYTES = 1 << 30
#: Presets with their own targets (issue 17: Llama-3 405B on its 8,192 GPUs, 60 s; with CP 16
#: on 16,384 GPUs, 120 s and 2 GiB).
TARGET_S_OF = {"llama3-405b": 60.0, "llama3-405b-cp16": 120.0}
TARGET_BYTES_OF = {"llama3-405b-cp16": 2 << 30}


def topology_for(name: str) -> str:
    """The suggested topology of a preset (transformers: its layout's GPUs on DGX nodes of its
    device; other kinds span one DGX H100)."""
    from dessim.workload import load_workload
    from dessim.topology.presets import suggested_topology

    if name in _transformers():
        spec = load_workload(name)
        got = suggested_topology(spec.num_gpus, spec.training.device)
        if got is None:
            raise SystemExit(f"preset {name}: no DGX preset for {spec.training.device}")
        return got
    return "dgx-h100:nodes=1"


def _transformers() -> list[str]:
    from dessim.workload import shipped_workloads

    return list(shipped_workloads())


def run_one(name: str, topology: str) -> dict:
    """Simulate ``name`` in this process; wall time and this process's peak RSS."""
    from dessim.workload import simulate_workload

    t0 = time.perf_counter()
    res = simulate_workload(name, topology)
    wall = time.perf_counter() - t0
    s = res.summary()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = rss if sys.platform == "darwin" else rss * 1024
    return {"preset": name, "topology": topology, "gpus": s.get("gpus"), "wall_s": round(wall, 2),
            "peak_rss_bytes": rss, "iteration_s": s.get("iteration_s"),
            "tasks": s.get("tasks"), "shortcuts": s.get("shortcuts")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--topology", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:                                   # the child process
        print(json.dumps(run_one(args.one, args.topology)))
        return 0
    from dessim.workload.kinds import shipped_any

    names = sorted(set(_transformers()) | {n for kind, files in shipped_any().items()
                                           if kind in ("dlrm", "cnn") for n in files})
    if args.only:
        names = [n for n in names if n in set(args.only.split(","))]
    rows = []
    for name in names:
        topo = topology_for(name)
        try:
            out = subprocess.run([sys.executable, __file__, "--one", name, "--topology", topo],
                                 capture_output=True, text=True, timeout=args.timeout)
            if out.returncode != 0:
                rows.append({"preset": name, "topology": topo, "error": out.stderr.strip().splitlines()[-1]})
            else:
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        except subprocess.TimeoutExpired:
            rows.append({"preset": name, "topology": topo, "error": f"killed at {args.timeout:.0f} s"})
        r = rows[-1]
        if "error" in r:
            print(f"{name:<20} {topo:<28} {r['error']}", flush=True)
        else:
            ok = (r["wall_s"] <= TARGET_S_OF.get(name, TARGET_S)
                  and r["peak_rss_bytes"] <= TARGET_BYTES_OF.get(name, TARGET_BYTES))
            sc = r["shortcuts"] or {}
            took = "+".join(k for k, v in (("stage", sc.get("stage_merged")),
                                           ("fold", sc.get("folded"))) if v) or "-"
            print(f"{name:<20} {topo:<28} {r['gpus']:>6} GPUs  {r['wall_s']:7.2f} s  "
                  f"{r['peak_rss_bytes'] / 2**20:7.0f} MiB  iteration {r['iteration_s']:.4g} s  "
                  f"tasks {r['tasks']}  shortcuts {took}  {'ok' if ok else 'MISSES TARGET'}",
                  flush=True)
    if args.markdown:
        print("\n| preset | topology | wall s | peak MiB |\n|---|---|---:|---:|")
        for r in rows:
            if "error" in r:
                print(f"| {r['preset']} | {r['topology']} | {r['error']} | |")
            else:
                print(f"| {r['preset']} | {r['topology']} | {r['wall_s']:.2f} | "
                      f"{r['peak_rss_bytes'] / 2**20:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
