"""Benchmark the network models: transfers simulated per second of wall time and peak memory.

Workload (seeded, reproducible): N transfers between random distinct GPU pairs of a leaf-spine
(default 128 GPUs, 8 leaves, 16 spines, 50 GB/s = 400 Gb/s links, 1 us per hop), sizes
log-uniform between 64 KiB and 64 MiB. Start times (``--starts``):

* ``poisson`` (default): Poisson arrivals at ``--load`` (default 0.5) of the aggregate GPU
  injection bandwidth, so the number of *concurrent* flows stays bounded (~hosts x load / (1-load)
  at steady state) and the cost per flow does not grow with N;
* ``simultaneous``: all N start at t = 0 — every flow is coupled to every other one through the
  spine links, so each of the ~N finish times re-solves a component of up to N flows: O(N^2)
  work in total (see docs/network.md, "Cost").

The flow model re-rates only the flows whose max-min rate can change (incremental solves, the
default); ``--full-solves`` makes it re-solve the whole coupled component at every change
(``FlowNetwork(incremental=False)``), for comparison. "flows/solve" is the mean number of flows
handed to the max-min solver per call (an incremental solve may call it more than once).

Each point runs in a fresh subprocess so ``ru_maxrss`` is that point's peak resident memory.
A point that exceeds ``--timeout`` is reported as such.

    python benchmarks/bench_network.py                      # N = 100 .. 100,000, both models
    python benchmarks/bench_network.py --starts simultaneous --sizes 100 1000 3000
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import time


def build_leafspine(hosts: int, leaves: int, bw: float, lat: float, spines: int):
    try:
        from dessim.topology.builders import leafspine
        return leafspine(hosts, leaves, bw, lat, spines=spines)
    except ImportError:  # builders not available: same shape by hand
        import networkx as nx
        from dessim.topology.graph import Topology
        g = nx.Graph()
        per_leaf = hosts // leaves
        for s in range(spines):
            g.add_node(f"spine{s}", kind="switch")
        for leaf in range(leaves):
            g.add_node(f"leaf{leaf}", kind="switch")
            for r in range(leaf * per_leaf, (leaf + 1) * per_leaf):
                g.add_node(f"gpu{r}", kind="gpu", rank=r)
                g.add_edge(f"gpu{r}", f"leaf{leaf}", type="custom", bw=bw, lat=lat)
            for s in range(spines):
                g.add_edge(f"leaf{leaf}", f"spine{s}", type="custom",
                           bw=per_leaf * bw / spines, lat=lat)
        return Topology(g, name=f"leafspine{hosts}")


def workload(n: int, hosts: int, bw: float, starts: str, load: float, seed: int):
    rng = random.Random(seed)
    lo, hi = math.log(64 * 2**10), math.log(64 * 2**20)
    sizes = [round(math.exp(rng.uniform(lo, hi))) for _ in range(n)]
    mean = sum(sizes) / n
    rate = load * hosts * bw / mean  # arrivals per second
    t = 0.0
    out = []
    for size in sizes:
        src = rng.randrange(hosts)
        dst = rng.randrange(hosts - 1)
        dst += dst >= src
        if starts == "poisson":
            t += rng.expovariate(rate)
        out.append((src, dst, size, t))
    return out


def one_point(args: argparse.Namespace) -> dict:
    from dessim.network import simulate_transfers
    from dessim.network.maxmin import solve_maxmin

    topo = build_leafspine(args.hosts, args.leaves, args.bw, args.lat, args.spines)
    transfers = workload(args.n, args.hosts, args.bw, args.starts, args.load, args.seed)
    solved = [0, 0]

    def counting_solver(flows, caps):
        solved[0] += 1
        solved[1] += len(flows)
        return solve_maxmin(flows, caps)

    options = ({"solver": counting_solver, "incremental": not args.full_solves}
               if args.model == "flow" else {})
    t0 = time.perf_counter()
    res = simulate_transfers(topo, transfers, network=args.model, **options)
    wall = time.perf_counter() - t0
    return {"model": args.model, "n": args.n, "wall_s": wall, "flows_per_s": args.n / wall,
            "events": res.events, "makespan_s": res.makespan,
            "flows_per_solve": solved[1] / solved[0] if solved[0] else 0.0,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000],
                   help="numbers of transfers N (default: 100 1000 10000 100000)")
    p.add_argument("--models", nargs="+", default=["flow", "analytical"])
    p.add_argument("--starts", choices=["poisson", "simultaneous"], default="poisson")
    p.add_argument("--load", type=float, default=0.5, help="offered load for poisson starts")
    p.add_argument("--hosts", type=int, default=128)
    p.add_argument("--leaves", type=int, default=8)
    p.add_argument("--spines", type=int, default=16)
    p.add_argument("--bw", type=float, default=50e9, help="GPU link bandwidth, bytes/s")
    p.add_argument("--lat", type=float, default=1e-6, help="per-hop latency, s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--full-solves", action="store_true",
                   help="flow model: re-solve the whole coupled component at every change")
    p.add_argument("--timeout", type=float, default=600, help="seconds per point")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_point(args)))
        return

    print(f"leaf-spine {args.hosts} GPUs / {args.leaves} leaves / {args.spines} spines, "
          f"{args.starts} starts" + (f" at load {args.load}" if args.starts == "poisson" else "")
          + (", full solves" if args.full_solves else ""))
    print(f"{'model':<11}{'N':>9}{'wall s':>10}{'flows/s':>11}{'events':>10}"
          f"{'flows/solve':>13}{'peak MiB':>10}")
    common = ["--starts", args.starts, "--load", str(args.load), "--hosts", str(args.hosts),
              "--leaves", str(args.leaves), "--spines", str(args.spines), "--bw", str(args.bw),
              "--lat", str(args.lat), "--seed", str(args.seed)]
    common += ["--full-solves"] if args.full_solves else []
    for n in args.sizes:
        for model in args.models:
            cmd = [sys.executable, __file__, "--one", "--n", str(n), "--model", model, *common]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                     check=True)
            except subprocess.TimeoutExpired:
                print(f"{model:<11}{n:>9,}   timeout after {args.timeout:.0f} s", flush=True)
                continue
            except subprocess.CalledProcessError as exc:
                print(f"{model:<11}{n:>9,}   failed: {exc.stderr.strip().splitlines()[-1]}", flush=True)
                continue
            r = json.loads(out.stdout)
            print(f"{model:<11}{n:>9,}{r['wall_s']:>10.2f}{r['flows_per_s']:>11,.0f}"
                  f"{r['events']:>10,}{r['flows_per_solve']:>13.1f}{r['maxrss_mib']:>10.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
