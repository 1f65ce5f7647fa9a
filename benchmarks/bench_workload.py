"""Benchmark: wall time, simulated events/s and peak memory of simulating one training
iteration (layer granularity by default; ``--granularity stage`` for closed-form TP islands).

Targets (issue 5): GPT-3 175B on 1,024 GPUs (TP 8, PP 16, DP 8, dgx-a100:nodes=128) and
Llama-3 70B on 512 GPUs (its preset layout, dgx-h100:nodes=64). Those full runs need tens of
millions of tasks; ``--dp`` and ``--global-batch`` shrink a case along the two axes the cost
scales with (tasks ∝ GPUs × micro-batches), so the scaling can be measured and extrapolated.

Usage::

    python benchmarks/bench_workload.py                      # scaled-down ladder of both models
    python benchmarks/bench_workload.py --case gpt3 --dp 8 --global-batch 1536   # the full target
    python benchmarks/bench_workload.py --case gpt3 --dp 1 --global-batch 64 --profile
    python benchmarks/bench_workload.py --case gpt3 --dp 8 --global-batch 1536 --schedule 1f1b \
        --granularity stage --fold                           # issue 9: GPT-3 175B, 1,024 GPUs
    python benchmarks/bench_workload.py --case llama405 --dp 64 --granularity stage --fold \
        --algo ring --stream-rings                           # issue 9: Llama-3 405B, 8,192 GPUs

Each run prints one JSON line: tasks, generation wall time (``generate_s``: what
``build_taskgraph`` takes — the transformer generator defers its graph as runs of rows,
docs/performance.md "Generation: pass runs"), the engine's set-up (``setup_s``: from the
generated graph to the replay's first event — reading the graph, checking it, the replay's
state; "Generation: the engine reads rows"), the end-to-end rate ``tasks_per_s_usable``
(tasks / (generation + set-up): a full graph generated and ready to replay; ``_cpu``: the
same in CPU seconds, steadier on a shared machine), simulation wall time (set-up included), events, events/s, iteration time, peak RSS (``ru_maxrss``, the whole
process). ``--make`` makes every ``Task`` of the graph before the replay (``make_s``, as
outputs reading the whole graph do; the engine itself does not). Run it from the repository
root with ``PYTHONPATH=$PWD`` to measure this checkout rather than an installed one.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import sys
import time

CASES = {
    # name: (preset, topology builder per node count, tp, pp, schedule overrides)
    "gpt3": ("gpt3-175b", "dgx-a100", 8, 16, {"schedule": "interleaved", "virtual_stages": 2}),
    "llama3": ("llama3-70b", "dgx-h100", 8, 4, {}),
    "llama405": ("llama3-405b", "dgx-h100", 8, 16, {}),     # issue 9: --dp 64 = 8,192 GPUs
}


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def run(case: str, dp: int, global_batch: int | None, network: str, granularity: str = "layer",
        schedule: str | None = None, fold: bool = False, algo: str | None = None,
        stream: bool = False, shortcuts: bool = True, make: bool = False) -> dict:
    """One iteration of ``case``; ``shortcuts=False`` switches the exact speed shortcuts
    (compact schedules, flow bundles) off for before/after comparisons; ``make``: make the
    graph's tasks before the replay."""
    from dessim.collectives import CollectiveSettings
    from dessim.engine import EngineOptions, Shortcuts, engine, simulate
    from dessim.workload import build_taskgraph, plan_workload

    first_event: list[float] = []       # when the replay starts (its set-up done)
    replay = engine._Run.run

    def timed_replay(self) -> None:
        first_event.append(time.perf_counter())
        first_event.append(time.process_time())
        replay(self)

    preset, builder, tp, pp, extra = CASES[case]
    gpus = tp * pp * dp
    overrides = {"tp": tp, "pp": pp, "dp": dp, **extra, "generator": {"granularity": granularity, "fold": fold}}
    if schedule:  # e.g. plain 1F1B instead of the preset's interleaving
        overrides.update({"schedule": schedule, "virtual_stages": 1})
    if global_batch:
        overrides["global_batch"] = global_batch
    t0 = time.perf_counter()
    plan, topo = plan_workload(preset, f"{builder}:nodes={gpus // 8}", overrides=overrides)
    t1 = time.perf_counter()
    c1 = time.process_time()
    options = EngineOptions(network=network, record_links=False,
                            collectives=CollectiveSettings(algo=algo or "auto"),
                            shortcuts=Shortcuts(stream_rings=stream, bundles=shortcuts,
                                                compact_schedules=shortcuts))
    graph = build_taskgraph(plan, topo, engine=options)
    t2 = time.perf_counter()
    if make:            # what an output reading every task costs (the engine does not)
        graph.make()
    t2m = time.perf_counter()
    engine._Run.run = timed_replay
    try:
        sim = simulate(graph, topo, options)
    finally:
        engine._Run.run = replay
    t3 = time.perf_counter()
    setup = first_event[0] - t2m
    fold_meta = sim.meta.get("fold") or {}
    return {"case": case, "preset": preset, "gpus": gpus, "layout": plan.layout.describe(),
            "network": network, "algo": algo or "auto", "stream_rings": stream, "shortcuts": shortcuts, "granularity": granularity, "tasks": len(graph), "plan_s": round(t1 - t0, 3),
            "generate_s": round(t2 - t1, 3), "make_s": round(t2m - t2, 3), "setup_s": round(setup, 3),
            "simulate_s": round(t3 - t2m, 3), "events": sim.events,
            "events_per_s": round(sim.events / (t3 - t2)), "tasks_per_s_generate": round(len(graph) / (t2 - t1)),
            "tasks_per_s_usable": round(len(graph) / (first_event[0] - t1)),
            "tasks_per_s_usable_cpu": round(len(graph) / (first_event[1] - c1)),
            "iteration_s": sim.makespan_s, "fold_lanes": fold_meta.get("lanes", 1),
            "fold_max_lane_skew_s": fold_meta.get("max_lane_skew_s", 0.0),
            "wall_s": round(t3 - t0, 3), "peak_rss_GB": round(peak_rss_bytes() / 1e9, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), default=None)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--network", choices=["flow", "analytical"], default="flow")
    ap.add_argument("--granularity", choices=["layer", "kernel", "stage"], default="layer")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"], default=None,
                    help="override the case's pipeline schedule (1f1b: no virtual stages)")
    ap.add_argument("--fold", action="store_true",
                    help="replica folding: simulate TP rank 0 of DP replica 0 per stage, all traffic on the network")
    ap.add_argument("--algo", default=None,
                    help="collective algorithm for every collective (default: each task's, auto)")
    ap.add_argument("--stream-rings", action="store_true",
                    help="rings as one coupled flow per channel (an approximation; docs/performance.md)")
    ap.add_argument("--make", action="store_true",
                    help="make every Task of the graph before the replay (timed as make_s)")
    ap.add_argument("--profile", action="store_true", help="cProfile the run; print the top 25 functions")
    args = ap.parse_args(argv)
    if args.case is None:  # the default ladder: each run in a fresh process keeps peak RSS honest
        import subprocess
        for case, dp, gb in (("gpt3", 1, 32), ("gpt3", 1, 64), ("gpt3", 2, 64), ("llama3", 1, 32),
                             ("llama3", 2, 32)):
            subprocess.run([sys.executable, __file__, "--case", case, "--dp", str(dp),
                            "--global-batch", str(gb), "--network", args.network,
                            "--granularity", args.granularity], check=True)
        return
    if args.profile:
        prof = cProfile.Profile()
        out = prof.runcall(run, args.case, args.dp, args.global_batch, args.network,
                           args.granularity, args.schedule, args.fold, args.algo, args.stream_rings,
                           make=args.make)
        print(json.dumps(out))
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return
    print(json.dumps(run(args.case, args.dp, args.global_batch, args.network, args.granularity,
                         args.schedule, args.fold, args.algo, args.stream_rings, make=args.make)), flush=True)


if __name__ == "__main__":
    main()
