"""Benchmark and look: Gantt charts of training iterations at 8, 64 and 1,024 GPUs.

Runs ``dessim simulate`` with ``--gantt`` (HTML and PNG) for three sizes, prints one JSON line
per chart (GPUs, rows, HTML bytes, chart wall time) and, when a headless Chromium is on PATH
(Debian: ``apt-get install chromium-headless-shell``), screenshots each HTML file as a user
would see it.

Usage::

    python benchmarks/bench_gantt.py --out /tmp/gantt            # all three sizes
    python benchmarks/bench_gantt.py --out /tmp/gantt --sizes 8 64

The 1,024-GPU case (GPT-3 175B, TP 8, PP 16, DP 8, interleaved 1F1B; stage granularity with
replica folding) takes a few minutes on a laptop core; the Gantt itself well under a second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

#: GPUs -> (workload, topology, layout overrides)
CASES = {
    8: ("gpt3-1.3b", "dgx-h100:nodes=1", {"tp": 2, "pp": 2, "recompute": "selective"}),
    64: ("gpt3-13b", "dgx-h100:nodes=8", {"tp": 4, "pp": 4, "global_batch": 64}),
    1024: ("gpt3-175b", "dgx-h100:nodes=128", {"tp": 8, "pp": 16}),
}
BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome")


def screenshot(html: Path, png: Path, height: int) -> bool:
    """Render ``html`` in a headless Chromium into ``png``; False when none is installed."""
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        return False
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1400,{height}", f"--screenshot={png}", html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    return png.exists()


def main() -> None:
    from dessim.outputs.gantt import build_gantt, workload_labels, write_gantt
    from dessim.workload import simulate_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gantt-bench", help="directory for the charts")
    ap.add_argument("--sizes", type=int, nargs="*", default=sorted(CASES), choices=sorted(CASES))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for gpus in args.sizes:
        workload, topology, layout = CASES[gpus]
        t0 = time.perf_counter()
        # a chart needs every task: no micro-batch extrapolation
        result = simulate_workload(workload, topology, overrides={**layout, "extrapolate": False})
        sim_s = time.perf_counter() - t0
        labels = workload_labels(result, topology)
        t0 = time.perf_counter()
        html = write_gantt(result.simulation, out / f"gantt_{gpus}.html", labels)
        html_s = time.perf_counter() - t0
        write_gantt(result.simulation, out / f"gantt_{gpus}.png", labels)
        rows = len({lane.row for lane in build_gantt(result.simulation, labels).lanes})
        shot = screenshot(html, out / f"gantt_{gpus}_browser.png", 130 + 23 * rows + 60)
        print(json.dumps({"gpus": gpus, "workload": workload, "layout": labels.layout,
                          "tasks": len(result.simulation.span_records), "rows": rows,
                          "html_bytes": html.stat().st_size, "simulate_s": round(sim_s, 2),
                          "gantt_html_s": round(html_s, 3), "browser_screenshot": shot}))


if __name__ == "__main__":
    main()
