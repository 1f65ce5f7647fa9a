"""The CI subset of the end-to-end validation (docs/validation.md): published Megatron-LM
runs simulated with the built-in calibration. Fails when the subset's MAPE gets worse than
the committed figure; an improvement lowers that figure in the same commit."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def validate():
    spec = importlib.util.spec_from_file_location("validate", ROOT / "benchmarks" / "validate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick_rows(validate):
    runs = [r for r in validate.load_runs() if r["id"] in validate.QUICK]
    assert [r["id"] for r in runs] == list(validate.QUICK)
    return validate.validate(runs)


def test_quick_subset_mape_is_no_worse_than_committed(validate, quick_rows):
    committed = json.loads(validate.QUICK_MAPE_FILE.read_text())
    assert committed["runs"] == list(validate.QUICK)
    got = validate.mape(quick_rows)
    assert got <= committed["mape_percent"] + 0.05, (
        f"MAPE of the quick validation subset rose from {committed['mape_percent']} % to "
        f"{got:.2f} %: {[(r['id'], round(100 * r['error'], 2)) for r in quick_rows]}")


def test_every_run_names_its_source_and_a_known_flop_convention(validate):
    for run in validate.load_runs():
        assert run["source"].strip() and run["flops"] in ("megatron-eq3", "megatron-core",
                                                           "iteration-time")
        assert validate.published_iteration_s(run) > 0


def test_megatron_eq3_matches_the_papers_1t_figure(validate):
    # Narayanan et al. 2021 (SC21), Eq. 3 for the 1T model: 128 layers, h 25600, s 2048,
    # V 51200, B 3072 -> 5.14e19 FLOPs per iteration (the check quoted in the paper's text)
    model = {"layers": 128, "hidden": 25600, "seq_len": 2048, "vocab": 51200}
    assert validate.megatron_eq3_flops(model, 3072) == pytest.approx(5.14e19, rel=0.005)
