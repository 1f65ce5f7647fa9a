"""dessim's collectives against published nccl-tests measurements (validation/).

Simulates every dataset of ``validation/nccl_tests_curves.csv`` and every figure of
``validation/nccl_tests_points.csv`` with dessim's defaults — ``auto`` (NCCL's choice), or the
algorithm the measurement forced with ``NCCL_ALGO`` — timed as nccl-tests times its loop
(``-g`` GPUs per host thread and ``-n`` iterations from the published command; calls back to
back, :mod:`dessim.collectives.loop`) — and prints, per dataset, the plateau
busbw, the small-message latency and the knee (the size at half the plateau), published vs
simulated, with the error of each. ``--plots DIR`` writes one busbw-vs-size plot per dataset;
``--markdown`` prints the tables for docs/collectives.md; ``--curves`` adds dessim-only
curves (8 B - 8 GiB; all-reduce, all-gather, reduce-scatter, all-to-all) for DGX A100 + HDR
and DGX H100 + NDR at 1, 2, 4, 32 and 128 nodes.

Usage:
    python benchmarks/validate_collectives.py [--quick] [--markdown] [--plots DIR] [--curves]

``--quick`` (used by the test suite) keeps the single-node and 2-4 node datasets and every
eighth size. Wall time and peak memory are printed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dessim.catalog.calibration import load_calibration  # noqa: E402
from dessim.collectives import run_collective  # noqa: E402
from dessim.collectives.loop import NCCL_TESTS_ITERS, nccl_tests_iteration_time  # noqa: E402
from dessim.collectives.ops import get_op  # noqa: E402
from dessim.topology import load_topology  # noqa: E402

_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
        "alltoall": "alltoall", "sendrecv": "sendrecv"}


@dataclass(frozen=True)
class Case:
    """How dessim runs one published dataset."""

    topology: str
    op: str
    algo: str = "auto"
    ranks: str | None = None
    note: str = ""
    quick: bool = True          #: in the --quick subset (CI)


CASES: dict[str, Case] = {
    "together_h100_1n_allreduce_ring": Case("dgx-h100:nodes=1", "allreduce", "ring"),
    "together_h100_1n_allreduce_nvls": Case("dgx-h100:nodes=1", "allreduce"),
    "together_h100_1n_allgather_ring": Case("dgx-h100:nodes=1", "allgather", "ring"),
    "together_h100_1n_allgather_nvls": Case("dgx-h100:nodes=1", "allgather"),
    "together_h100_1n_reducescatter_ring": Case("dgx-h100:nodes=1", "reducescatter", "ring"),
    "xxrjun_h100_1n_all_reduce_perf": Case("dgx-h100:nodes=1", "allreduce"),
    "xxrjun_h100_1n_all_gather_perf": Case("dgx-h100:nodes=1", "allgather"),
    "xxrjun_h100_1n_reduce_scatter_perf": Case("dgx-h100:nodes=1", "reducescatter"),
    "xxrjun_h100_1n_alltoall_perf": Case("dgx-h100:nodes=1", "alltoall"),
    "xxrjun_h100_1n_sendrecv_perf": Case("dgx-h100:nodes=1", "sendrecv", ranks="0,1",
                                         note="nccl-tests sendrecv: each rank to the next; one pair here"),
    "xxrjun_h100_10n_all_reduce_perf": Case("dgx-h100:nodes=10", "allreduce",
                                            note="NIC not stated; 8 x NDR assumed", quick=False),
    "xxrjun_h100_10n_all_gather_perf": Case("dgx-h100:nodes=10", "allgather",
                                            note="NIC not stated; 8 x NDR assumed", quick=False),
    "xxrjun_h100_10n_reduce_scatter_perf": Case("dgx-h100:nodes=10", "reducescatter",
                                                note="NIC not stated; 8 x NDR assumed", quick=False),
    "xxrjun_h100_10n_alltoall_perf": Case("dgx-h100:nodes=10", "alltoall",
                                          note="NIC not stated; 8 x NDR assumed", quick=False),
    "azure_ND_A100_v4_allreduce": Case("dgx-a100:nodes=1", "allreduce"),
    "azure_ND_H100_v5_allreduce": Case("dgx-h100:nodes=1", "allreduce", "nvls",
                                       note="measured with NCCL_ALGO=NVLS forced"),
    "azure_ND_H200_v5_allreduce": Case("dgx-h100:nodes=1,gpu=H200", "allreduce", "nvls",
                                       note="measured with NCCL_ALGO=NVLS forced"),
    "coreweave_a100_32rank_allreduce": Case("dgx-a100:nodes=4", "allreduce",
                                            note="NIC count and speed not stated; 8 x HDR assumed"),
    "gcp_a3mega_2n_allreduce": Case("dgx-h100:nodes=2,nic=eth200", "allreduce",
                                    note="8 x 200 Gb/s GPUDirect-TCPXO (Ethernet), not IB"),
    "issue812_2xdgxa100_ring_small": Case("dgx-a100:nodes=2", "allreduce", "ring"),
    "coreweave_h100_8n_allreduce_sharp": Case("dgx-h100:nodes=8,sharp=true", "allreduce",
                                              "collnet",
                                              note="NCCL_ALGO=COLLNETCHAIN; NIC count and speed "
                                                   "not stated: 8 x NDR assumed"),
}
#: Datasets dessim cannot express, with the reason.
SKIPPED = {
    "issue232_2n_1xh100_4nic_tree": "one GPU driving 4 NICs: dessim pins a GPU to one NIC",
    "xxrjun_h100_10n_sendrecv_perf": "80-rank sendrecv pattern (each rank to the next) with an "
                                     "unstated NIC: 15 GB/s is below one NDR NIC",
}


def _curve(data: pd.DataFrame) -> pd.DataFrame:
    """One published row per size: out-of-place where given, else in-place."""
    data = data.sort_values(["size_bytes", "in_or_out_of_place"], ascending=[True, False])
    return data.drop_duplicates("size_bytes", keep="first").reset_index(drop=True)


def _time_us(row, op: str, ranks: int) -> float:
    if not math.isnan(row.time_us):
        return float(row.time_us)
    algbw = row.busbw_GBps / get_op(op).busbw_factor(ranks)
    return row.size_bytes / (algbw * 1e9) * 1e6


def knee(sizes: list[float], busbw: list[float]) -> float:
    """The size (bytes) where busbw first reaches half its largest value (log-interpolated)."""
    half = max(busbw) / 2
    for i, b in enumerate(busbw):
        if b >= half:
            if i == 0:
                return sizes[0]
            s0, s1, b0 = math.log(sizes[i - 1]), math.log(sizes[i]), busbw[i - 1]
            return math.exp(s0 + (s1 - s0) * (half - b0) / (b - b0))
    return sizes[-1]


def gpus_per_process(command: str) -> int:
    """GPUs one nccl-tests thread drove (``-g N`` in the published command; 1 if not
    stated: the MPI launch, one process per GPU)."""
    m = re.search(r"-g\s*(\d+)", command)
    return int(m.group(1)) if m else 1


def nccl_tests_iters(command: str) -> int:
    """Timed iterations of the published command (``-n N``; nccl-tests' default 20)."""
    m = re.search(r"-n\s*(\d+)", command)
    return int(m.group(1)) if m else NCCL_TESTS_ITERS


def as_nccl_tests(op: str, size: float, topology: str, algo: str, ranks: str | None,
                  gpus: int = 1, iters: int = NCCL_TESTS_ITERS):
    """dessim's call, timed as nccl-tests' loop times it: ``iters`` calls back to back, each
    issued by threads driving ``gpus`` GPUs (:func:`nccl_tests_iteration_time`, with the
    built-in ``nccl.host_overhead``)."""
    res = run_collective(op, size, topology, algo=algo, ranks=ranks)
    host = load_calibration(None).nccl.host_overhead or 0.0
    t = nccl_tests_iteration_time(res.time_s, gpus, host, iters)
    return dataclasses.replace(res, time_s=t, algbw_GBps=res.algbw_GBps * res.time_s / t,
                               busbw_GBps=res.busbw_GBps * res.time_s / t)


def simulate(case: Case, size: float, gpus: int = 1, iters: int = NCCL_TESTS_ITERS):
    return as_nccl_tests(case.op, size, case.topology, case.algo, case.ranks, gpus, iters)


def validate_dataset(name: str, data: pd.DataFrame, quick: bool) -> dict:
    case = CASES[name]
    curve = _curve(data)
    if quick:
        curve = curve.iloc[::max(1, len(curve) // 6)].reset_index(drop=True)
        if curve.iloc[-1].size_bytes != data.size_bytes.max():
            curve = pd.concat([curve, _curve(data).tail(1)]).reset_index(drop=True)
    n = int(data.gpus.iloc[0]) if case.ranks is None else len(case.ranks.split(","))
    gpus = gpus_per_process(str(data.collective.iloc[0]))
    iters = nccl_tests_iters(str(data.collective.iloc[0]))
    rows = []
    for row in curve.itertuples(index=False):
        res = simulate(case, float(row.size_bytes), gpus, iters)
        rows.append({"size": float(row.size_bytes), "pub_busbw": float(row.busbw_GBps),
                     "sim_busbw": res.busbw_GBps, "pub_us": _time_us(row, case.op, n),
                     "sim_us": res.time_s * 1e6, "choice": f"{res.algorithm}/{res.protocol}"})
    t = pd.DataFrame(rows)
    out = {"dataset": name, "topology": case.topology, "op": case.op, "algo": case.algo,
           "note": case.note, "points": t, "gpus_per_process": gpus, "iters": iters}
    if t.pub_busbw.max() >= 1.0:          # the plateau: the peak of each curve
        out["plateau_pub"], out["plateau_sim"] = t.pub_busbw.max(), t.sim_busbw.max()
        out["plateau_err"] = out["plateau_sim"] / out["plateau_pub"] - 1
    if t["size"].iloc[0] <= 64 * 1024:    # small-message latency: the smallest size
        out["lat_pub"], out["lat_sim"] = t.pub_us.iloc[0], t.sim_us.iloc[0]
        out["lat_size"] = t["size"].iloc[0]
        out["lat_err"] = out["lat_sim"] / out["lat_pub"] - 1
    if t["size"].iloc[0] <= 64 * 1024 and t.pub_busbw.max() >= 1.0:
        out["knee_pub"] = knee(t["size"].tolist(), t.pub_busbw.tolist())
        out["knee_sim"] = knee(t["size"].tolist(), t.sim_busbw.tolist())
        out["knee_ratio"] = out["knee_sim"] / out["knee_pub"]
    out["mape_busbw"] = float((t.sim_busbw / t.pub_busbw - 1).abs()[t.pub_busbw > 0.5].mean())
    out["choices"] = ", ".join(dict.fromkeys(t.choice))
    return out


def validate_points(points: pd.DataFrame) -> list[dict]:
    out = []
    for p in points.itertuples(index=False):
        ranks = None if isinstance(p.ranks, float) or not p.ranks else str(p.ranks)
        gpus = 1 if math.isnan(p.gpus_per_process) else int(p.gpus_per_process)
        iters = NCCL_TESTS_ITERS if math.isnan(p.iters) else int(p.iters)
        res = as_nccl_tests(p.op, float(p.size_bytes), p.topology, p.algo, ranks, gpus, iters)
        sim = res.time_s * 1e6 if p.metric == "time_us" else res.busbw_GBps
        lo = p.low if not math.isnan(p.low) else p.value
        hi = p.high if not math.isnan(p.high) else p.value
        err = 0.0 if lo <= sim <= hi else (sim / (lo if sim < lo else hi) - 1)
        out.append({"id": p.id, "system": p.system, "metric": p.metric, "published": p.value,
                    "range": f"{lo:g}-{hi:g}" if lo != hi else "", "simulated": sim,
                    "error": err, "choice": f"{res.algorithm}/{res.protocol}",
                    "source": p.source})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def print_markdown(results: list[dict], points: list[dict]) -> None:
    print("| dataset | dessim topology | op (algo) | -g | plateau busbw pub / sim (GB/s) | err | "
          "latency pub / sim (us) | err | knee pub / sim (MiB) | ratio | busbw mean abs err | "
          "dessim's choice |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        knee_txt = (f"{r['knee_pub'] / 2**20:.2f} / {r['knee_sim'] / 2**20:.2f} | "
                    f"{r['knee_ratio']:.2f}" if "knee_ratio" in r else "- | -")
        plateau = (f"{r['plateau_pub']:.1f} / {r['plateau_sim']:.1f} | {_pct(r['plateau_err'])}"
                   if "plateau_err" in r else "- | -")
        lat = (f"{r['lat_pub']:.1f} / {r['lat_sim']:.1f} | {_pct(r['lat_err'])}"
               if "lat_err" in r else "- | -")
        mape = "-" if math.isnan(r["mape_busbw"]) else f"{100 * r['mape_busbw']:.1f} %"
        print(f"| {r['dataset']} | `{r['topology']}` | {r['op']} ({r['algo']}) | "
              f"{r['gpus_per_process']} | {plateau} | "
              f"{lat} | {knee_txt} | {mape} | {r['choices']} |")
    print()
    print("| figure | system | metric | published | simulated | error | dessim's choice | source |")
    print("|---|---|---|---|---|---|---|---|")
    for p in points:
        pub = f"{p['published']:g}" + (f" ({p['range']})" if p["range"] else "")
        print(f"| {p['id']} | {p['system']} | {p['metric']} | {pub} | {p['simulated']:.1f} | "
              f"{_pct(p['error'])} | {p['choice']} | {p['source']} |")


def _busbw_plot(path: Path, title: str, curves, legend_size: int = 8,
                markersize: float | None = None) -> None:
    """One busbw-over-size figure: ``curves`` are (sizes, busbw GB/s, style, label)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for sizes, busbw, style, label in curves:
        ax.plot(sizes, busbw, style, ms=markersize, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: list[dict], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r in results:
        t = r["points"]
        _busbw_plot(directory / f"{r['dataset']}.png", f"{r['dataset']}\n{r['op']} on {r['topology']}",
                    [(t["size"], t.pub_busbw, "o-", "published (nccl-tests)"),
                     (t["size"], t.sim_busbw, "s--", "dessim")])


def dessim_curves(directory: Path | None, sizes_per_decade: int = 1) -> pd.DataFrame:
    """dessim-only busbw curves for the reference systems (no published counterpart)."""
    sizes = [2.0 ** k for k in range(3, 34, 3 if sizes_per_decade <= 1 else 1)]
    rows = []
    for system, spec in (("A100+HDR", "dgx-a100"), ("H100+NDR", "dgx-h100")):
        for nodes in (1, 2, 4, 32, 128):
            topo = load_topology(f"{spec}:nodes={nodes}")
            for op in ("allreduce", "allgather", "reducescatter", "alltoall"):
                if op == "alltoall" and nodes > 32:
                    continue
                for size in sizes:
                    res = run_collective(op, size, topo, stream_rings=nodes >= 32)
                    rows.append({"system": system, "nodes": nodes, "op": op, "size": size,
                                 "busbw_GBps": res.busbw_GBps, "time_us": res.time_s * 1e6,
                                 "choice": f"{res.algorithm}/{res.protocol}"})
    df = pd.DataFrame(rows)
    if directory is not None:
        for (system, op), part in df.groupby(["system", "op"]):
            _busbw_plot(directory / f"dessim_{system.replace('+', '_')}_{op}.png",
                        f"dessim {op}, {system}",
                        [(p["size"], p.busbw_GBps, "o-", f"{nodes} node(s)")
                         for nodes, p in part.groupby("nodes")], legend_size=7, markersize=3)
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI subset: few sizes, few nodes")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--plots", type=Path, default=None, help="write PNG plots to this directory")
    ap.add_argument("--curves", action="store_true", help="also dessim-only curves (slow)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    curves = pd.read_csv(ROOT / "validation" / "nccl_tests_curves.csv")
    results = []
    for name, data in curves.groupby("dataset", sort=True):
        if name in SKIPPED or (args.quick and not CASES[name].quick):
            continue
        results.append(validate_dataset(name, data, args.quick))
    points = validate_points(pd.read_csv(ROOT / "validation" / "nccl_tests_points.csv")
                             .query("not id.str.contains('1984')" if args.quick else "index >= 0"))
    if args.markdown:
        print_markdown(results, points)
    else:
        for r in results:
            print(f"{r['dataset']:<38}"
                  + (f" plateau {r['plateau_pub']:7.1f} vs {r['plateau_sim']:7.1f} GB/s "
                     f"({_pct(r['plateau_err'])})" if "plateau_err" in r else "")
                  + (f"  latency {r['lat_pub']:7.1f} vs {r['lat_sim']:7.1f} us "
                     f"({_pct(r['lat_err'])})" if "lat_err" in r else "")
                  + (f"  knee x{r['knee_ratio']:.2f}" if "knee_ratio" in r else ""))
        for p in points:
            print(f"{p['id']:<38} {p['metric']} {p['published']:g} vs {p['simulated']:.1f} "
                  f"({_pct(p['error'])}) [{p['choice']}]")
    for name, why in SKIPPED.items():
        print(f"skipped {name}: {why}")
    if args.plots:
        plot(results, args.plots)
    if args.curves:
        dessim_curves(args.plots)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wall {time.perf_counter() - start:.1f} s, peak memory {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
