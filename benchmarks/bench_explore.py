"""Benchmark: ``dessim explore gpt3-13b --topology dgx-a100:nodes=4`` with no flags (issue 17).

Runs the command (or another workload/topology, plus any further explore flags after ``--``)
as a subprocess, exactly as a user types it, and prints its wall time (process start
included) and peak memory: the largest sum of the resident set sizes of the command and its
worker processes, sampled every ``--interval`` seconds from /proc (Linux), and the largest
single process's peak RSS as the kernel reports it (``getrusage``). Target: <= 60 s.

Usage:
    python benchmarks/bench_explore.py [--workload gpt3-13b] [--topology dgx-a100:nodes=4]
                                       [--timeout S] [-- EXPLORE FLAGS...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 60.0
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants now (0 where /proc is absent)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
        todo += _children(p)
    return total


def run(args: list[str], timeout: float, interval: float) -> dict:
    """Run ``dessim`` with ``args``: wall time (s), peak summed RSS (bytes), largest process
    RSS (bytes), exit status and the last lines of its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "dessim.cli.main", *args]
    t0 = time.perf_counter()
    # the output goes to a file, not a pipe: a pipe read only at the end fills up (64 KiB) and
    # blocks a command that prints more, e.g. explore --json
    with tempfile.TemporaryFile("w+") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.DEVNULL, text=True,
                                env=env, cwd=ROOT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                break
            time.sleep(interval)
        proc.wait()
        wall = time.perf_counter() - t0
        sink.seek(0)
        out = sink.read()
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    largest = largest if sys.platform == "darwin" else largest * 1024
    return {"command": "dessim " + " ".join(args), "wall_s": wall, "peak_tree_rss_bytes": peak,
            "peak_process_rss_bytes": largest, "returncode": proc.returncode,
            "output": out.strip().splitlines()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt3-13b")
    ap.add_argument("--topology", default="dgx-a100:nodes=4")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is killed")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between RSS samples")
    args = ap.parse_args(argv)
    r = run(["explore", args.workload, "--topology", args.topology, "--no-progress", *extra],
            args.timeout, args.interval)
    for line in r["output"]:
        print(line)
    status = ("killed at the timeout" if r["wall_s"] > args.timeout else
              f"exit {r['returncode']}" if r["returncode"] else
              "ok" if r["wall_s"] <= TARGET_S else "MISSES TARGET")
    print(f"\n{r['command']}\n  wall {r['wall_s']:.1f} s (target {TARGET_S:.0f} s), peak RSS "
          f"{r['peak_tree_rss_bytes'] / 2**20:.0f} MiB summed over processes "
          f"(largest process {r['peak_process_rss_bytes'] / 2**20:.0f} MiB), "
          f"{os.cpu_count()} CPUs: {status}")
    return 0 if r["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
