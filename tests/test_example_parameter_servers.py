"""The worked example of docs/parameter-servers.md is a golden test: the sweep in
examples/parameter-servers reproduces its committed results.csv and the knee the studies report
(Li et al. 2014; Jiang et al. 2020, BytePS §3: servers' NICs bound the iteration until there are
as many servers as workers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from dessim.sweep.runner import run_sweep

HERE = Path(__file__).resolve().parent.parent / "examples" / "parameter-servers"


@pytest.fixture(scope="module")
def fresh() -> pd.DataFrame:
    spec = importlib.util.spec_from_file_location("ps_summarize", HERE / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.table(run_sweep(HERE / "sweep.yaml", workers=1).table)


def test_results_match_the_committed_table(fresh):
    golden = pd.read_csv(HERE / "results.csv")
    assert list(fresh.columns) == list(golden.columns)
    assert (fresh["status"] == "ok").all()
    for col in ("iteration_s", "compute_s", "gpu_busy_fraction", "exposed_comm_s.ps"):
        assert fresh[col].to_numpy() == pytest.approx(golden[col].to_numpy(), rel=1e-6), col


def test_the_knee(fresh):
    ded = fresh[fresh["workload.training.ps_placement"] == "dedicated"].set_index(
        "workload.training.parameter_servers")["iteration_s"]
    compute = fresh["compute_s"].iloc[0]
    workers = 8
    # NIC-bound: every doubling below the knee saves time, most where the servers are fewest
    assert ded[2] < 0.75 * ded[1] and ded[4] < 0.85 * ded[2] and ded[8] < 0.9 * ded[4]
    assert ded[1] > 2 * compute
    # the knee at N = W: more servers buy nothing, the iteration is within 20 % of compute
    assert ded[2 * workers] == pytest.approx(ded[workers], rel=1e-3)
    assert ded[workers] < 1.2 * compute
