"""Wall time and events/s of ring and tree all-reduce from 8 to 4096 ranks on a switch.

Usage::

    python benchmarks/bench_collectives.py [--ranks 8,64,512,1024,4096] [--algos ring,tree]
        [--size 1GiB] [--network flow] [--budget 300]

For each (algorithm, ranks) it reports the schedule's transfers, the time to build the
schedule, the time to simulate it (executor + network model), the network's work counter
(``events``: flow starts + finishes + rate solves) and events per wall second. A run whose
predicted wall time (transfers × the last measured seconds per transfer) exceeds ``--budget``
seconds is skipped and its prediction printed instead.
"""

from __future__ import annotations

import argparse
import time

import simpy

from dessim.collectives import build_schedule, get_op, run_schedule
from dessim.network import make_network
from dessim.topology.builders import switch
from dessim.units import parse_size


def transfers_of(algo: str, p: int) -> int:
    """Transfers of a 1-channel, 1-chunk all-reduce (to predict the cost before building)."""
    return 2 * p * (p - 1) if algo == "ring" else 2 * (p - 1)


def bench(algo: str, p: int, size: float, network: str) -> dict:
    topo = switch(p, "50GB/s", "500ns")
    t0 = time.perf_counter()
    sched = build_schedule("allreduce", algo, range(p), size)
    t1 = time.perf_counter()
    env = simpy.Environment()
    net = make_network(network, env, topo)
    run = run_schedule(net, sched)
    env.run(run.done)
    t2 = time.perf_counter()
    algbw = size / run.duration
    return {"algo": algo, "ranks": p, "transfers": len(sched), "build_s": t1 - t0,
            "sim_s": t2 - t1, "events": net.events, "events_per_s": net.events / (t2 - t1),
            "sim_time_s": run.duration,
            "busbw_GBps": algbw * get_op("allreduce").busbw_factor(p) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64,512,1024,2048,4096")
    ap.add_argument("--algos", default="ring,tree")
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--network", default="flow")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="skip runs predicted to take longer than this many wall seconds")
    args = ap.parse_args()
    size = float(parse_size(args.size))
    print(f"{'algo':<5} {'ranks':>5} {'transfers':>10} {'build s':>8} {'sim s':>8} "
          f"{'events':>10} {'events/s':>9} {'us/transfer':>11} {'busbw GB/s':>10}")
    for algo in args.algos.split(","):
        per_transfer = None
        for p in (int(x) for x in args.ranks.split(",")):
            n = transfers_of(algo, p)
            if per_transfer is not None and n * per_transfer > args.budget:
                print(f"{algo:<5} {p:>5} {n:>10}  skipped: predicted {n * per_transfer:.0f} s "
                      f"> budget {args.budget:.0f} s")
                continue
            r = bench(algo, p, size, args.network)
            per_transfer = (r["build_s"] + r["sim_s"]) / r["transfers"]
            print(f"{algo:<5} {p:>5} {r['transfers']:>10} {r['build_s']:>8.2f} {r['sim_s']:>8.2f} "
                  f"{r['events']:>10} {r['events_per_s']:>9.0f} {per_transfer * 1e6:>11.1f} "
                  f"{r['busbw_GBps']:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
