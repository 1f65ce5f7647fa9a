"""The Ray backend gives the same results as the local one (skipped without the ray extra).

Kept apart from test_sweep_runner.py because starting a local Ray instance alone takes
~15-20 s on a 2-core machine.
"""

from __future__ import annotations

import pandas as pd
import pytest

from dessim.sweep.runner import run_sweep

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'dessim[ray]')")

SPEC = {"kind": "collective",
        "base": {"topology": "ring:4,bw=50GB/s,lat=500ns",
                 "collective": {"op": "allreduce", "size": "256KiB"}},
        "axes": {"collective.ranks": ["0-3", "0-7"], "engine.collectives.algo": ["ring", "tree"]}}


def test_ray_backend_gives_identical_results():
    local = run_sweep(SPEC, workers=1).table.drop(columns="eval_wall_s")
    remote = run_sweep(SPEC, workers=2, backend="ray").table.drop(columns="eval_wall_s")
    pd.testing.assert_frame_equal(remote, local)
    assert list(remote["status"]) == ["ok", "ok", "failed", "failed"]
