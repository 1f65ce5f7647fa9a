"""dessim against published end-to-end training runs (validation/training_runs.yaml).

Simulates every run with one global calibration (the built-in one, or ``--calibration
FILE``) on the topology the source used, and prints published vs simulated iteration time
with the error of each row, the MAPE per family and overall, and the sign of the error by
model size. No constant is fitted to these rows (docs/validation.md).

Usage:
    python benchmarks/validate.py [--quick] [--only ID[,ID...]] [--markdown] [--json FILE]
                                  [--calibration FILE] [--check-mape PCT]

``--quick`` keeps the runs that simulate in a few seconds (the test suite's subset);
``--check-mape`` exits non-zero when the MAPE of the selected runs exceeds PCT (CI).
Wall time and peak memory are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dessim.engine import EngineOptions  # noqa: E402
from dessim.workload import simulate_workload  # noqa: E402
from dessim.workload.transformer.spec import parse_workload  # noqa: E402

#: Runs small enough for the test suite (seconds each): tensor, pipeline and interleaved
#: pipeline parallelism. The data-parallel-only rows (1.7B-7.5B) take 15-30 s each (their
#: gradient all-reduces over 32-128 GPUs are simulated step by step).
QUICK = ("sc21-table1-18B", "sc21-table1-39B", "sc21-table1-76B")
#: The committed MAPE of the quick subset (tests/test_validation.py fails above it).
QUICK_MAPE_FILE = ROOT / "validation" / "quick_mape.json"


def load_runs(path: Path = ROOT / "validation" / "training_runs.yaml") -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["runs"]


def megatron_eq3_flops(model: dict, global_batch: int) -> float:
    """Narayanan et al. 2021, Eq. 3: FLOPs per iteration with full recomputation counted."""
    b, s, l, h, v = global_batch, model["seq_len"], model["layers"], model["hidden"], model["vocab"]
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def megatron_core_flops(model: dict, global_batch: int) -> float:
    """Megatron-Core's num_floating_point_operations (core_r0.8.0) for a 4h GeLU MHA model:
    model FLOPs per iteration, no recomputation counted."""
    b, s, l, h, v = global_batch, model["seq_len"], model["layers"], model["hidden"], model["vocab"]
    return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def published_iteration_s(run: dict) -> float:
    m = run["measured"]
    if run["flops"] == "iteration-time":
        return float(m["iteration_time_s"])
    formulas = {"megatron-eq3": megatron_eq3_flops, "megatron-core": megatron_core_flops}
    if run["flops"] in formulas:
        wl = run["workload"]
        gpus = (wl["parallelism"]["tp"] * wl["parallelism"]["pp"] * wl["parallelism"]["dp"])
        flops = formulas[run["flops"]](wl["model"], wl["training"]["global_batch"])
        return flops / (m["tflops_per_gpu"] * 1e12 * gpus)
    raise ValueError(f"run {run['id']}: unknown flops convention {run['flops']!r}")


def simulate_run(run: dict, calibration: str | None = None):
    doc = {"name": run["id"], **run["workload"]}
    spec = parse_workload(doc, origin=f"validation/training_runs.yaml ({run['id']})")
    options = EngineOptions(record_links=False, calibration=calibration)
    return simulate_workload(spec, run["topology"],
                             overrides={"generator": {"granularity": "stage", "fold": True}},
                             options=options)


def validate(runs: list[dict], calibration: str | None = None) -> list[dict]:
    rows = []
    for run in runs:
        t0 = time.perf_counter()
        res = simulate_run(run, calibration)
        pub = published_iteration_s(run)
        sim = res.iteration_s
        s = res.summary()
        rows.append({"id": run["id"], "family": run.get("family", ""),
                     "params_B": res.plan.model.num_params() / 1e9,
                     "gpus": res.plan.num_gpus, "published_s": pub, "simulated_s": sim,
                     "error": sim / pub - 1, "mfu_sim": s["mfu"],
                     "hfu_sim": s["hfu"], "bubble": s["bubble_fraction"],
                     "exposed_comm_s": s["exposed_comm_total_s"],
                     "wall_s": time.perf_counter() - t0})
    return rows


def mape(rows: list[dict]) -> float:
    return 100.0 * sum(abs(r["error"]) for r in rows) / len(rows) if rows else 0.0


def print_table(rows: list[dict], markdown: bool) -> None:
    if markdown:
        print("| run | params | GPUs | published s | simulated s | error | simulated MFU | bubble |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['id']} | {r['params_B']:.1f}B | {r['gpus']} | {r['published_s']:.3f} | "
                  f"{r['simulated_s']:.3f} | {100 * r['error']:+.1f} % | {100 * r['mfu_sim']:.1f} % | "
                  f"{100 * r['bubble']:.1f} % |")
    else:
        for r in rows:
            print(f"{r['id']:<28} {r['params_B']:8.1f}B {r['gpus']:6d} GPUs  published "
                  f"{r['published_s']:8.3f} s  simulated {r['simulated_s']:8.3f} s  "
                  f"{100 * r['error']:+6.1f} %  (MFU {100 * r['mfu_sim']:.1f} %, wall {r['wall_s']:.1f} s)")
    families = sorted({r["family"] for r in rows})
    for fam in families:
        part = [r for r in rows if r["family"] == fam]
        print(f"MAPE {fam}: {mape(part):.1f} % over {len(part)} runs")
    print(f"MAPE all: {mape(rows):.1f} % over {len(rows)} runs")
    by_size = sorted(rows, key=lambda r: r["params_B"])
    signs = "".join("+" if r["error"] > 0 else "-" for r in by_size)
    print(f"sign of the error by model size (small -> large): {signs}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--check-mape", type=float, default=None)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    runs = load_runs()
    if args.only:
        keep = set(args.only.split(","))
        runs = [r for r in runs if r["id"] in keep]
    elif args.quick:
        runs = [r for r in runs if r["id"] in QUICK]
    rows = validate(runs, args.calibration)
    print_table(rows, args.markdown)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wall {time.perf_counter() - start:.1f} s, peak memory {peak:.0f} MiB")
    if args.check_mape is not None and mape(rows) > args.check_mape:
        print(f"MAPE {mape(rows):.1f} % exceeds {args.check_mape} %")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
