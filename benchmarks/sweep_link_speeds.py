"""Does a faster link ever make a collective slower? (docs/collectives.md, "Faster links,
slower collective").

For each operation, NCCL algorithm and protocol, node count and size, simulate the collective
on a DGX preset and on copies of it with one link class (NVLink, PCIe, NIC) ``--factor`` times
faster (same latency), and print the time ratio per class (< 1: faster). With the algorithm,
protocol and lanes fixed, NCCL is never slower on faster links; every ratio above 1 is listed
at the end. Usage::

    python benchmarks/sweep_link_speeds.py dgx-h100 1 2 3 4 [--factor 1.5]
        [--network analytical] [--stream-rings] [--no-credits] > sweep.tsv

``--no-credits`` replays every schedule with one message in flight per connection (schedule
parameter ``window`` = 1: no connection credits, the replay before 2026-11-28).

Columns: nodes, op, algorithm, protocol, size (B), time on the preset (us), lanes, then
``class=ratio`` per link class (``(chN)``: the faster copy ran N lanes), CPU seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import simpy

from dessim.collectives import run_collective, run_schedule
from dessim.collectives.api import plan_collective
from dessim.network import make_network
from dessim.errors import CollectiveError
from dessim.topology import load_topology
from dessim.topology.graph import Topology

#: Link types of each class, as the DGX presets name them.
CLASSES = {"nvlink": ("nvlink",), "pcie": ("pcie",), "nic": ("ib", "roce", "ethernet")}

#: Sizes swept (bytes, nccl-tests semantics): 8 B to 1 GiB.
SIZES = (8, 256, 8 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30)


def faster(topo: Topology, link_class: str, factor: float) -> Topology | None:
    """``topo`` with every link of ``link_class`` ``factor`` times faster; None if it has none."""
    graph = topo.graph.copy()
    changed = 0
    for _a, _b, data in graph.edges(data=True):
        if data["type"] in CLASSES[link_class]:
            data["bw"] = data["bw"] * factor
            changed += 1
    if not changed:
        return None
    return Topology(graph, name=f"{topo.name}+{link_class}x{factor}", dims=topo.dims,
                    meta=dict(topo.meta))


def run(op: str, size: int, topo: Topology, algo: str, proto: str, credits: bool, **kw):
    """``run_collective``'s time and lanes; without ``credits``, the schedule replayed with
    ``window`` = 1 (one message in flight per connection)."""
    if credits:
        return run_collective(op, size, topo, algo=algo, protocol=proto, **kw)
    plan = plan_collective(op, tuple(range(topo.num_gpus)), size, topo,
                           {"algo": algo, "protocol": proto})
    plan.schedule.params["window"] = 1
    env = simpy.Environment()
    replay = run_schedule(make_network(kw.get("network", "flow"), env, topo), plan.schedule,
                          protocol=plan.protocol, stream_rings=kw.get("stream_rings", False))
    env.run(replay.done)
    lanes = int(plan.schedule.params.get("channels", 1))
    return SimpleNamespace(time_s=replay.duration, channels=lanes)


def cases(nodes: int, nvls: bool) -> list[tuple[str, str, str]]:
    """(op, algorithm, protocol) NCCL can run on ``nodes`` DGX nodes (``nvls``: Hopper)."""
    out = []
    for proto in ("ll", "ll128", "simple"):
        out += [("allreduce", "ring", proto), ("allreduce", "dbtree", proto)]
        if nvls:
            out.append(("allreduce", "nvls" if nodes == 1 else "nvlstree", proto))
        out += [("allgather", "ring", proto), ("reducescatter", "ring", proto),
                ("alltoall", "direct", proto)]
        if nvls and nodes == 1:
            out += [("allgather", "nvls", proto), ("reducescatter", "nvls", proto)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", help="DGX preset, e.g. dgx-h100 or dgx-a100")
    ap.add_argument("nodes", type=int, nargs="+")
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--network", default="flow", choices=("flow", "analytical"))
    ap.add_argument("--stream-rings", action="store_true")
    ap.add_argument("--no-credits", action="store_true")
    args = ap.parse_args(argv)
    kw = {"network": args.network, "stream_rings": args.stream_rings}
    slower = []
    for nodes in args.nodes:
        base = load_topology(f"{args.preset}:nodes={nodes}")
        variants = {c: v for c in CLASSES if (v := faster(base, c, args.factor)) is not None}
        for op, algo, proto in cases(nodes, "h100" in args.preset or "b200" in args.preset):
            for size in SIZES:
                t0 = time.process_time()
                try:
                    r0 = run(op, size, base, algo, proto, not args.no_credits, **kw)
                except CollectiveError as exc:
                    print(f"# skipped {nodes} {op} {algo} {proto}: {str(exc).splitlines()[0]}")
                    break
                cols = []
                for c, topo in variants.items():
                    r = run(op, size, topo, algo, proto, not args.no_credits, **kw)
                    ratio = r.time_s / r0.time_s
                    cols.append(f"{c}={ratio:.9f}" + ("" if r.channels == r0.channels
                                                      else f"(ch{r.channels})"))
                    if ratio > 1.0:
                        slower.append((ratio, nodes, op, algo, proto, size, c))
                print(nodes, op, algo, proto, size, f"{r0.time_s * 1e6:.3f}", r0.channels, *cols,
                      f"cpu={time.process_time() - t0:.2f}", sep="\t", flush=True)
    print(f"# {len(slower)} case(s) slower on a {args.factor}x faster link class")
    for ratio, *case in sorted(slower, reverse=True):
        print("# slower", f"{(ratio - 1) * 100:+.4f} %", *case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
