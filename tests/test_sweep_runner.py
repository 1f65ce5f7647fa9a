"""Running sweeps: same results for 1/2 workers and Dask, failed points, resume, analysis, CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from dessim.errors import OutputError, SweepError
from dessim.sweep import analysis
from dessim.sweep.points import EVALUATORS, Evaluator
from dessim.sweep.runner import BACKENDS, Backend, Journal, journal_path, run_sweep
from dessim.sweep.spec import parse_sweep

#: 2 x 2 x 2 = 8 small collectives; ranks "0-7" does not exist on a 4-GPU ring: 4 points fail.
SPEC = {
    "name": "small",
    "kind": "collective",
    "base": {"topology": "ring:4,bw=50GB/s,lat=500ns",
             "collective": {"op": "allreduce", "size": "256KiB"}},
    "axes": {"collective.ranks": ["0-3", "0-7"],
             "topology.bw": {"from": "25GB/s", "to": "50GB/s", "factor": 2},
             "engine.collectives.algo": ["ring", "tree"]},
    "cost": {"topology.bw": {"price": 10, "per": "1GB/s", "times": "gpus"}},
    "analysis": {"heatmap": ["topology.bw", "engine.collectives.algo"], "vs": "topology.bw"},
}


def results(table: pd.DataFrame) -> pd.DataFrame:
    """Everything but host time, which is the one column allowed to differ between runs."""
    return table.drop(columns=["eval_wall_s"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def serial():
    return run_sweep(SPEC, workers=1)


def test_every_point_has_a_row_in_point_order_with_inputs_and_metrics(serial):
    t = serial.table
    assert list(t["index"]) == list(range(8)) and serial.evaluated == 8
    assert {"collective.ranks", "topology.bw", "engine.collectives.algo", "time_s", "busbw_GBps",
            "algbw_GBps", "gpus", "cost"} <= set(t.columns)
    ok = t[t["status"] == "ok"]
    assert len(ok) == 4 and set(ok["engine.collectives.algo"]) == {"ring", "tree"}
    assert (ok["algorithm"] == ok["engine.collectives.algo"]).all()
    # busbw = algbw * 2(n-1)/n for allreduce on 4 ranks (nccl-tests definitions)
    assert ok["busbw_GBps"].to_numpy() == pytest.approx(ok["algbw_GBps"].to_numpy() * 1.5)
    # cost model: 10 per GB/s of bandwidth per GPU
    assert ok["cost"].to_numpy() == pytest.approx(10 * ok["topology.bw"].to_numpy() / 1e9 * 4)


def test_failed_points_are_recorded_with_their_reason_and_do_not_stop_the_sweep(serial):
    failed = serial.failed()
    assert len(failed) == 4 and set(failed["collective.ranks"]) == {"0-7"}
    assert set(failed["status"]) == {"failed"} and set(failed["error_type"]) == {"CollectiveError"}
    assert all("rank 4 does not exist" in r for r in failed["reason"])
    assert failed["time_s"].isna().all()


def test_two_workers_give_identical_results(serial):
    parallel = run_sweep(SPEC, workers=2)
    pd.testing.assert_frame_equal(results(parallel.table), results(serial.table))


def test_dask_backend_gives_identical_results(serial):
    pytest.importorskip("distributed", reason="the dask extra (dask[distributed]) is not installed")
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        remote = run_sweep(SPEC, backend="dask", backend_options={"client": client})
    pd.testing.assert_frame_equal(results(remote.table), results(serial.table))


def test_results_files_parquet_and_csv_round_trip(tmp_path, serial):
    for name in ("r.parquet", "r.csv"):
        res = run_sweep(SPEC, out=tmp_path / name)
        back = pd.read_parquet(tmp_path / name) if name.endswith("parquet") else pd.read_csv(tmp_path / name)
        assert list(back["key"]) == list(serial.table["key"])
        assert back["time_s"].to_numpy() == pytest.approx(serial.table["time_s"].to_numpy(), nan_ok=True)
        assert res.written == [str(tmp_path / name)]
    with pytest.raises(OutputError, match=r"unknown format '.xlsx' \(use .parquet, .csv\)"):
        run_sweep(SPEC, out=tmp_path / "r.xlsx")


# ---------------------------------------------------------------- resume
def journal_lines(path) -> list[str]:
    return [line for line in journal_path(path).read_text().splitlines() if line.strip()]


def test_resume_after_interruption_evaluates_only_the_rest(tmp_path, serial):
    out = tmp_path / "r.parquet"
    first = run_sweep(SPEC, out=out, max_points=3)
    assert (first.evaluated, first.pending) == (3, 5) and len(journal_lines(out)) == 3
    with journal_path(out).open("a") as fh:       # a kill -9 in the middle of a write
        fh.write('{"index": 3, "key": "')
    second = run_sweep(SPEC, out=out)
    assert (second.evaluated, second.reused, second.pending) == (5, 3, 0)
    lines = journal_lines(out)
    keys = [json.loads(line)["key"] for line in lines]   # the torn line was cut off
    assert len(keys) == 8 and set(keys) == set(serial.table["key"])
    pd.testing.assert_frame_equal(results(second.table), results(serial.table))
    third = run_sweep(SPEC, out=out)
    assert (third.evaluated, third.reused) == (0, 8) and len(journal_lines(out)) == 8


def test_a_journal_line_of_bytes_that_are_not_utf8_is_skipped_like_any_corrupt_line(tmp_path, serial):
    """A damaged journal (a disk error, an editor) costs its bad lines, never the sweep."""
    out = tmp_path / "r.parquet"
    run_sweep(SPEC, out=out, max_points=3)
    with journal_path(out).open("ab") as fh:
        fh.write(b"\xff\xfe not a record\n")
    resumed = run_sweep(SPEC, out=out)
    assert (resumed.evaluated, resumed.reused, resumed.pending) == (5, 3, 0)
    pd.testing.assert_frame_equal(results(resumed.table), results(serial.table))


def test_resume_after_a_real_kill_9(tmp_path):
    """Kill a running sweep process with SIGKILL, then resume: nothing finished is redone."""
    spec = dict(SPEC, axes={"collective.size": [f"{k}KiB" for k in range(64, 64 + 30)]}, cost={})
    spec_file = tmp_path / "s.json"
    spec_file.write_text(json.dumps(spec))
    out = tmp_path / "r.parquet"
    script = textwrap.dedent(f"""
        import json, time
        from dessim.sweep import points, runner
        slow = points.evaluate_task
        def evaluate(task):
            time.sleep(0.05)
            return slow(task)
        runner.evaluate_task = evaluate
        runner.run_sweep(json.load(open({str(spec_file)!r})), out={str(out)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal_path(out).exists() and len(journal_lines(out)) >= 3:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = {json.loads(line)["key"] for line in journal_lines(out)
              if line.endswith("}")}
    assert 3 <= len(before) < 30
    resumed = run_sweep(spec, out=out)
    assert resumed.evaluated == 30 - len(before) and resumed.reused == len(before)
    assert (resumed.table["status"] == "ok").all() and len(resumed.table) == 30


def test_points_that_hit_a_bug_are_recorded_as_errors_and_retried_on_resume(tmp_path, monkeypatch):
    calls = []

    def flaky(cfg):
        calls.append(cfg["x"])
        if len(calls) == 1:
            raise ZeroDivisionError("boom")
        return {"y": cfg["x"] * 2}

    from dessim.sweep.points import Namespace
    monkeypatch.setitem(EVALUATORS, "flaky", Evaluator(
        name="flaky", help="test", base_keys=("x",), base_sections={}, required=(),
        namespaces={"p": Namespace("p", ())}, evaluate=flaky, default_metric="y"))
    spec = {"kind": "flaky", "base": {"x": 1}, "axes": {"p.x": [1, 2]}}
    out = tmp_path / "r.csv"
    first = run_sweep(spec, out=out)
    assert list(first.table["status"]) == ["error", "ok"]
    assert first.table["reason"][0].startswith("ZeroDivisionError: boom (test_sweep_runner.py:")
    second = run_sweep(spec, out=out)
    assert second.evaluated == 1 and list(second.table["status"]) == ["ok", "ok"]
    assert list(second.table["y"]) == [2, 4]


def test_fresh_start_ignores_the_journal(tmp_path):
    out = tmp_path / "r.parquet"
    run_sweep(SPEC, out=out, max_points=2)
    again = run_sweep(SPEC, out=out, resume=False)
    assert again.evaluated == 8 and len(journal_lines(out)) == 8


# ---------------------------------------------------------------- backends
def test_unknown_backend_and_missing_extra_are_clear(monkeypatch):
    with pytest.raises(SweepError, match=r"unknown backend 'slurm'; valid backends: local, dask, ray"):
        run_sweep(SPEC, backend="slurm")
    monkeypatch.setitem(BACKENDS, "ray", Backend("ray", "", BACKENDS["ray"].run,
                                                 "ray_not_installed_here", "ray"))
    with pytest.raises(SweepError, match=r"backend 'ray' needs ray_not_installed_here: "
                                         r"pip install -e '.*\[ray\]'"):
        run_sweep(SPEC, backend="ray")


# ---------------------------------------------------------------- analysis
def test_best_per_group_and_spread_read_the_table(serial):
    t = serial.table
    ok = t[t["status"] == "ok"]
    best = analysis.best_per_group(t, "time_s", ["engine.collectives.algo"])
    assert list(best["engine.collectives.algo"]) == sorted(ok["engine.collectives.algo"].unique(),
                                               key=lambda a: ok[ok["engine.collectives.algo"] == a]["time_s"].min())
    for _, row in best.iterrows():
        assert row["time_s"] == ok[ok["engine.collectives.algo"] == row["engine.collectives.algo"]]["time_s"].min()
    sp = analysis.spread(t, "time_s")
    assert sp["ratio"][0] == pytest.approx(ok["time_s"].max() / ok["time_s"].min())
    assert sp["points"][0] == 4
    rate = analysis.spread(t, "busbw_GBps", minimize=False)
    assert rate["ratio"][0] == pytest.approx(ok["busbw_GBps"].max() / ok["busbw_GBps"].min())


def test_pareto_front_keeps_exactly_the_non_dominated_points(serial):
    t = serial.table
    front = analysis.pareto_front(t, "time_s")
    ok = t[t["status"] == "ok"]
    for _, row in ok.iterrows():
        dominated = ((ok["cost"] <= row["cost"]) & (ok["time_s"] <= row["time_s"]) &
                     ((ok["cost"] < row["cost"]) | (ok["time_s"] < row["time_s"]))).any()
        assert (row["index"] in set(front["index"])) == (not dominated)


def test_plots_are_written(tmp_path, serial):
    paths = analysis.write_plots(serial, tmp_path)
    assert sorted(p.name for p in paths) == ["heatmap.png", "pareto.png", "time_s_vs_topology.bw.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_describe_reports_counts_failures_best_and_spread(serial):
    text = analysis.describe(serial, group_by=["engine.collectives.algo"])
    assert "8 points, 4 ok, 4 failed, 0 pending" in text
    assert "4 x " in text and "rank 4 does not exist" in text
    assert "best time_s per engine.collectives.algo:" in text and "worst/best" in text


def test_a_cost_column_that_no_result_has_is_refused_before_any_point_runs(tmp_path):
    spec = dict(SPEC, cost={"nic_count": 5})
    with pytest.raises(SweepError, match=r"cost.nic_count 'nic_count' is not a metric or column"):
        run_sweep(spec, out=tmp_path / "r.csv")
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "r.csv.journal.jsonl").exists()


def test_unknown_metric_or_group_is_named(serial):
    with pytest.raises(SweepError, match=r"metric 'iteration_s' is not a column of the results"):
        analysis.best_per_group(serial.table, "iteration_s")
    with pytest.raises(SweepError, match=r"group_by column 'layout' is not a column"):
        analysis.best_per_group(serial.table, "time_s", ["layout"])


# ---------------------------------------------------------------- CLI
def test_cli_sweep_runs_reports_and_resumes(tmp_path):
    import yaml
    from dessim.cli.sweep_cmd import command

    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "r.parquet"
    args = [str(spec_file), "--out", str(out), "--no-progress", "-g", "engine.collectives.algo",
            "--plots", str(tmp_path / "plots")]
    res = CliRunner().invoke(command, args)
    # the 0-7 points fail on 4 GPUs: a spec problem, not a result, so the exit status says so
    assert res.exit_code == 1, res.output
    assert "8 points, 4 ok, 4 failed" in res.output and "8 evaluated now" in res.output
    assert "4 of 8 points failed (4 CollectiveError)" in res.output
    assert (tmp_path / "plots" / "heatmap.png").exists()
    again = CliRunner().invoke(command, args)
    assert "0 evaluated now, 8 from the journal" in again.output


def test_cli_help_texts():
    from dessim.cli.explore_cmd import command as explore
    from dessim.cli.sweep_cmd import command as sweep

    assert "resumes" in CliRunner().invoke(sweep, ["--help"]).output
    assert "parallel layout" in CliRunner().invoke(explore, ["--help"]).output
