"""Speed-at-scale targets (issue 9): wall time, simulated transfers/s and peak memory.

Cases (each point runs in a fresh subprocess, so ``ru_maxrss`` is that point's peak RSS):

* ``ring``: ring all-reduce of 1 GiB on one switch (50 GB/s, 500 ns links), flow model,
  for each ``--ranks``; target 1,024 ranks <= 3.5 s, 4,096 ranks <= 60 s and <= 2 GiB.
  Prints transfers, wall (topology + schedule + simulation), transfers/s, events, peak RSS,
  busbw, and the fitted exponent of wall time vs simulated transfers (log-log least squares).
* ``gpt3``: one iteration of GPT-3 175B on 1,024 GPUs (TP 8, PP 16, DP 8, 1F1B, 192
  micro-batches, ``dgx-a100:nodes=128``), stage granularity with replica folding (target
  <= 10 s, <= 2 GiB); ``llama3``: Llama-3 405B on 8,192 GPUs (TP 8, PP 16, DP 64,
  ``dgx-h100:nodes=1024``), the same plus rings for the collectives, streamed (target
  <= 60 s). Generation and simulation are timed separately. ``bench_workload.py`` runs the
  same cases with every knob exposed (``--dp`` ladders, ``--profile``).

``--off`` runs with every exact shortcut switched off (compact schedules, flow bundles) for
before/after comparisons; results are identical (tests/test_scale_equivalence.py). Folding
and streamed rings are part of a case's definition and stay on.

    python benchmarks/bench_scale.py ring --ranks 128,256,512,1024,2048,4096
    python benchmarks/bench_scale.py ring --ranks 128,256,512 --off
    python benchmarks/bench_scale.py gpt3 --timeout 600
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

#: The iteration targets: keyword arguments of bench_workload.run (the one place that plans
#: and simulates a workload case).
WORKLOADS = {
    "gpt3": {"case": "gpt3", "dp": 8, "global_batch": 1536, "schedule": "1f1b",
             "granularity": "stage", "fold": True},
    "llama3": {"case": "llama405", "dp": 64, "global_batch": None, "granularity": "stage",
               "fold": True, "algo": "ring", "stream": True},
}


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def ring_point(p: int, size: float, off: bool) -> dict:
    import simpy

    from dessim.collectives import build_schedule, get_op, run_schedule
    from dessim.network import make_network
    from dessim.topology.builders import switch

    t0 = time.perf_counter()
    topo = switch(p, "50GB/s", "500ns")
    t1 = time.perf_counter()
    sched = build_schedule("allreduce", "ring", range(p), size, compact_schedules=not off)
    t2 = time.perf_counter()
    env = simpy.Environment()
    net = make_network("flow", env, topo, bundles=not off)
    run = run_schedule(net, sched, bundles=not off)
    env.run(run.done)
    t3 = time.perf_counter()
    wall = t3 - t0
    busbw = size / run.duration * get_op("allreduce").busbw_factor(p) / 1e9
    return {"case": "ring", "ranks": p, "shortcuts": not off, "transfers": len(sched),
            "topology_s": t1 - t0, "build_s": t2 - t1, "sim_s": t3 - t2, "wall_s": wall,
            "transfers_per_s": len(sched) / wall, "events": net.events,
            "bundled_steps": run.bundles_started, "sim_time_s": run.duration,
            "busbw_GBps": busbw, "peak_rss_MiB": peak_rss_mib()}


def workload_point(case: str, off: bool) -> dict:
    from bench_workload import run

    return run(network="flow", shortcuts=not off, **WORKLOADS[case])


def exponent(points: list[dict]) -> float:
    """Least-squares slope of log(wall) against log(transfers)."""
    xs = [math.log(r["transfers"]) for r in points]
    ys = [math.log(r["wall_s"]) for r in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


def subprocess_point(args: list[str], timeout: float) -> dict | str:
    cmd = [sys.executable, __file__, *args, "--one"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout:.0f} s"
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or "").strip().splitlines()
        return f"failed: {lines[-1] if lines else exc.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("case", choices=["ring", *WORKLOADS])
    ap.add_argument("--ranks", default="128,256,512,1024,2048,4096")
    ap.add_argument("--size", type=float, default=2.0**30, help="bytes (ring)")
    ap.add_argument("--off", action="store_true", help="switch every exact shortcut off")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per point")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    off = ["--off"] if args.off else []

    if args.case != "ring":
        if args.one:
            print(json.dumps(workload_point(args.case, args.off)))
            return
        r = subprocess_point([args.case, *off], args.timeout)
        print(r if isinstance(r, str) else json.dumps(r, indent=1))
        return

    ranks = [int(x) for x in args.ranks.split(",")]
    if args.one:
        print(json.dumps(ring_point(ranks[0], args.size, args.off)))
        return
    print(f"ring all-reduce {args.size / 2**30:g} GiB on one switch, flow model, shortcuts "
          f"{'off' if args.off else 'on'}")
    print(f"{'ranks':>6} {'transfers':>11} {'wall s':>8} {'build s':>8} {'sim s':>8} "
          f"{'transfers/s':>12} {'events':>9} {'bundles':>8} {'peak MiB':>9} {'busbw GB/s':>10}")
    done = []
    for p in ranks:
        r = subprocess_point(["ring", "--ranks", str(p), "--size", str(args.size), *off],
                             args.timeout)
        if isinstance(r, str):
            print(f"{p:>6} {r}", flush=True)
            continue
        done.append(r)
        print(f"{p:>6} {r['transfers']:>11,} {r['wall_s']:>8.2f} {r['build_s']:>8.2f} "
              f"{r['sim_s']:>8.2f} {r['transfers_per_s']:>12,.0f} {r['events']:>9,} "
              f"{r['bundled_steps']:>8,} {r['peak_rss_MiB']:>9.0f} {r['busbw_GBps']:>10.2f}",
              flush=True)
    if len(done) >= 2:
        print(f"wall time ~ transfers^{exponent(done):.2f} "
              f"(least squares over {len(done)} points)")


if __name__ == "__main__":
    main()
