"""Engine throughput: events per second on large synthetic task graphs.

Each rank runs a chain of compute tasks (``steps`` per rank); after every 4th compute it
exchanges a message with its ring neighbour (send + recv on a comm stream, overlapping the
next compute) and after every 16th it joins an all-reduce with the 7 other ranks of its
group of 8 (ring algorithm). Ranks sit on a leaf-spine (8 GPUs per leaf), so messages and
collectives share uplinks. Task count = ranks × steps × (1 + 2/4 + 1/16).

Prints, per case: tasks, graph build time, simulation wall time, engine + network events,
events/s and the peak resident memory of the process (each case runs in a fresh process).

    python benchmarks/bench_engine.py                 # 1e5 and 1e6 tasks on 64..1024 ranks
    python benchmarks/bench_engine.py --cases 64:1e5  # one case
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

DEFAULT_CASES = ["64:1e5", "256:1e5", "1024:1e5", "64:1e6", "256:1e6", "1024:1e6"]
PER_STEP = 1 + 2 / 4 + 1 / 16


def build(ranks: int, tasks: int):
    from dessim.taskgraph import Task, TaskGraph

    steps = max(16, round(tasks / ranks / PER_STEP / 16) * 16)
    g = TaskGraph(f"bench-{ranks}x{steps}")
    for r in range(ranks):
        prev = None
        group = tuple(range(r // 8 * 8, r // 8 * 8 + 8))
        for s in range(steps):
            tid = f"r{r}.c{s}"
            g.add(Task(tid, r, "compute", duration=10e-6), [prev] if prev else [])
            prev = tid
            if s % 4 == 3:
                peer_to, peer_from = (r + 1) % ranks, (r - 1) % ranks
                g.add(Task(f"r{r}.s{s}", r, "send", peer=peer_to, size=64e3, tag=s), [tid])
                g.add(Task(f"r{r}.v{s}", r, "recv", peer=peer_from, size=64e3, tag=s,
                           stream="recv"), [tid])
            if s % 16 == 15:
                g.add(Task(f"r{r}.a{s}", r, "collective", op="allreduce", algo="ring",
                           size=1e6, group=group, coll_id=f"g{r // 8}.{s}", stream="coll"),
                      [tid])
    return g


def run_case(ranks: int, tasks: int) -> dict:
    from dessim.engine import EngineOptions, simulate
    from dessim.topology import load_topology

    t0 = time.perf_counter()
    graph = build(ranks, tasks)
    topo = load_topology(f"leafspine:hosts={ranks},leaves={max(1, ranks // 8)},bw=50GB/s,lat=1us")
    t1 = time.perf_counter()
    res = simulate(graph, topo, EngineOptions(record_links=False))
    t2 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    return {"ranks": ranks, "tasks": len(graph), "build_s": t1 - t0, "sim_s": t2 - t1,
            "events": res.events, "events_per_s": res.events / (t2 - t1),
            "makespan_s": res.makespan_s, "peak_rss_MiB": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="RANKS:TASKS, e.g. 256:1e6")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        r, t = args.one.split(":")
        print(json.dumps(run_case(int(r), int(float(t)))))
        return
    print(f"{'ranks':>6} {'tasks':>9} {'build s':>8} {'sim s':>8} {'events':>10} "
          f"{'events/s':>9} {'peak MiB':>9}")
    for case in args.cases:
        out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True,
                             text=True, check=True)
        d = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{d['ranks']:>6} {d['tasks']:>9} {d['build_s']:>8.2f} {d['sim_s']:>8.2f} "
              f"{d['events']:>10} {d['events_per_s']:>9.0f} {d['peak_rss_MiB']:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
