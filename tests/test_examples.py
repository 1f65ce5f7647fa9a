"""Examples are golden tests: a reduced re-run of the COMET example reproduces its committed
results, and the figures the docs quote are those of the committed results."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dessim.sweep.runner import run_sweep
from dessim.sweep.spec import parse_sweep

ROOT = Path(__file__).resolve().parents[1]
COMET = ROOT / "examples" / "comet"
_spec = importlib.util.spec_from_file_location("comet_summarize", COMET / "summarize.py")
summarize = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = summarize
_spec.loader.exec_module(summarize)

RESULTS = pd.read_csv(COMET / "results.csv")
#: The reduced re-run: the committed points of one cluster configuration whose simulations
#: take well under a second each (400 Gb/s NICs, 80 GB HBM, no expansion), by layout.
REDUCED = {"topology.nic_bw": "400Gb/s", "memory.hbm_capacity": "80GB",
           "memory.expansion_capacity": "0GB", "memory.expansion_bw": "25GB/s"}
LAYOUTS = [(4, 1, 4), (8, 1, 2)]


def test_the_docs_quote_the_committed_results():
    docs = (ROOT / "docs" / "sweeps.md").read_text()
    assert summarize.facts_markdown(RESULTS) in docs


def test_best_csv_is_the_best_of_results_csv():
    best = pd.read_csv(COMET / "best.csv")
    ok = RESULTS[RESULTS["status"] == "ok"]
    fastest = ok.groupby(summarize.AXES)["iteration_s"].min().reset_index()
    merged = best.merge(fastest, on=summarize.AXES, suffixes=("", "_min"))
    assert len(merged) == len(best) == len(fastest)
    assert merged["iteration_s"].to_numpy() == pytest.approx(merged["iteration_s_min"].to_numpy())


@pytest.mark.slow
def test_a_reduced_rerun_reproduces_the_committed_points(tmp_path):
    doc = yaml.safe_load((COMET / "sweep.yaml").read_text())
    doc["axes"] = {**{k: [v] * len(LAYOUTS) for k, v in REDUCED.items()},
                   "workload.parallelism.tp": [tp for tp, _, _ in LAYOUTS],
                   "workload.parallelism.pp": [pp for _, pp, _ in LAYOUTS],
                   "workload.parallelism.dp": [dp for _, _, dp in LAYOUTS]}
    doc["mode"] = "zip"
    doc.pop("cost", None)
    doc["analysis"] = {"metric": "iteration_s"}
    spec = parse_sweep(doc, "reduced comet", base_dir=COMET)
    table = run_sweep(spec).table
    assert (table["status"] == "ok").all(), table["reason"].tolist()
    committed = RESULTS[(RESULTS["topology.nic_bw"] == 400e9 / 8) & (RESULTS["memory.hbm_capacity"] == 80e9)
                        & (RESULTS["memory.expansion_capacity"] == 0) & (RESULTS["offload"] == "none")
                        & (RESULTS["memory.expansion_bw"] == 25e9)]
    for (tp, pp, dp), got in zip(LAYOUTS, table["iteration_s"]):
        row = committed[committed["layout"] == f"tp{tp}-pp{pp}-dp{dp}"]
        assert len(row) == 1, (tp, pp, dp)
        assert got == pytest.approx(float(row["iteration_s"].iloc[0]), rel=1e-5)   # csv: 6 digits
