"""A sweep killed with SIGTERM or SIGKILL leaves no process behind, stops within 2 s on
SIGTERM, and resumes without losing or repeating a point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"name": "slow", "kind": "collective",
        "base": {"topology": "ring:64", "collective": {"op": "allreduce"},
                 "engine": {"collectives": {"algo": "ring"}}},
        "axes": {"collective.size": {"from": "1MiB", "to": "64MiB", "factor": 4},
                 "engine.collectives.chunks": [1, 2, 3, 4]}}
POINTS = 4 * 4

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("PPid:") and int(line.split()[1]) == pid:
                out.add(int(status.parent.name))
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z":
            alive.add(p)
    return alive


def _lines(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    return [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]


def _start(tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "dessim.cli.main", "sweep", "s.yaml", "--workers",
                             "2", "--no-progress", "--out", "r.csv"], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _run_until(proc: subprocess.Popen, journal: Path, lines: int) -> set[int]:
    """Wait for ``lines`` journal lines; the sweep's worker processes then."""
    deadline = time.monotonic() + 90
    while len(_lines(journal)) < lines:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers          # two workers (and the spawn helper)
    return workers


def _gone(pids: set[int], within: float) -> set[int]:
    deadline = time.monotonic() + within
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


def test_sigterm_and_sigkill_leave_no_process_and_lose_no_point(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SPEC))
    journal = tmp_path / "r.csv.journal.jsonl"

    proc = _start(tmp_path)
    workers = _run_until(proc, journal, 2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - t0 < 2.0
    assert proc.returncode == 143
    assert "run the same command again to resume" in proc.stderr.read().decode()
    assert not _gone(workers, 3.0), "workers outlived the sweep after SIGTERM"
    after_term = _lines(journal)
    assert len({r["key"] for r in after_term}) == len(after_term) < POINTS

    proc = _start(tmp_path)
    workers = _run_until(proc, journal, len(after_term) + 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert not _gone(workers, 3.0), "workers outlived the sweep after SIGKILL"

    done = subprocess.run([sys.executable, "-m", "dessim.cli.main", "sweep", "s.yaml", "--workers",
                           "2", "--no-progress", "--out", "r.csv"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    records = _lines(journal)
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == POINTS            # none lost, none evaluated twice
    table = pd.read_csv(tmp_path / "r.csv")
    assert sorted(table["index"]) == list(range(POINTS)) and (table["status"] == "ok").all()
