"""Sweep results tables: real nulls, whole numbers kept whole, units and run inputs in Parquet."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dessim import __version__
from dessim.sweep.axes import Point
from dessim.sweep.runner import run_sweep
from dessim.sweep.table import column_units, records_to_table

pq = pytest.importorskip("pyarrow.parquet")

#: 2 sizes x 2 bandwidths x 2 roots; root 9 is not on a 4-GPU ring: 4 points fail.
SPEC = {
    "name": "table",
    "kind": "collective",
    "base": {"topology": "ring:4,bw=50GB/s,lat=500ns", "collective": {"op": "broadcast"}},
    "axes": {"collective.size": ["64KiB", "1MiB"], "topology.bw": ["25GB/s", "100GB/s"],
             "collective.root": [0, 9]},
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "r.parquet"
    run_sweep(SPEC, out=out)
    return out


def test_missing_values_are_nulls_not_placeholders(written):
    t = pd.read_parquet(written)
    ok, failed = t[t["status"] == "ok"], t[t["status"] == "failed"]
    assert len(ok) == len(failed) == 4
    assert ok["reason"].isna().all() and ok["error_type"].isna().all()
    assert failed["time_s"].isna().all() and failed["algorithm"].isna().all()
    assert failed["gpus"].isna().all() and (ok["gpus"] == 4).all()
    for col in ("gpus", "transfers", "events"):
        assert str(t[col].dtype) == "Int64", col             # whole numbers with nulls
    raw = pq.read_table(written)
    for col in t.columns:                                     # no "", -1 or "nan" stand-ins
        values = raw.column(col).to_pylist()
        assert "" not in values and "nan" not in values, col
        if col not in ("index", "collective.root"):
            assert -1 not in values, col


def test_parquet_records_units_inputs_and_version(written):
    schema = pq.read_schema(written)
    unit = {f.name: (f.metadata or {}).get(b"unit", b"").decode() for f in schema}
    assert unit["collective.size"] == "B" and unit["topology.bw"] == "B/s"
    assert unit["time_s"] == "s" and unit["busbw_GBps"] == "GB/s" and unit["size_bytes"] == "B"
    assert unit["collective.root"] == "" and unit["gpus"] == ""    # plain numbers: no unit
    meta = json.loads(schema.metadata[b"dessim"])
    assert meta["dessim_version"] == __version__
    assert meta["sweep"]["axes"]["topology.bw"] == ["25GB/s", "100GB/s"]   # as written
    assert meta["sweep"]["base"]["collective"] == {"op": "broadcast"}
    assert meta["units"]["topology.bw"] == "B/s"


def test_csv_keeps_the_axis_paths_as_column_names(tmp_path):
    res = run_sweep({**SPEC, "axes": {"topology.bw": ["25GB/s"], "collective.size": ["1KiB"]}},
                    out=tmp_path / "r.csv")
    back = pd.read_csv(res.out)
    assert "topology.bw" in back.columns and back["reason"].isna().all()


def test_metric_units_follow_the_name_conventions():
    table = pd.DataFrame(columns=["iteration_s", "tokens_per_s", "samples_per_s", "exposed_comm_s.tp",
                                  "memory_per_gpu_bytes.weights", "model_flops", "model_tflops_per_gpu",
                                  "mfu", "layout", "topology.nic_bw"])
    assert column_units(table, {"topology.nic_bw": "B/s"}) == {
        "iteration_s": "s", "tokens_per_s": "tokens/s", "samples_per_s": "samples/s",
        "exposed_comm_s.tp": "s", "memory_per_gpu_bytes.weights": "B", "model_flops": "FLOP",
        "model_tflops_per_gpu": "TFLOP/s", "topology.nic_bw": "B/s"}


def test_boolean_metrics_stay_booleans_with_nulls():
    points = [Point(i, {"a": i}, f"k{i}") for i in range(3)]
    records = {"k0": {"status": "ok", "metrics": {"fits": True, "n": 2}},
               "k1": {"status": "ok", "metrics": {"fits": False, "n": 3}},
               "k2": {"status": "failed", "reason": "no", "error_type": "E"}}
    t = records_to_table(points, records, ["a"])
    assert str(t["fits"].dtype) == "boolean" and t["fits"].isna().tolist() == [False, False, True]
    assert str(t["n"].dtype) == "Int64" and t["reason"].isna().tolist() == [True, True, False]
