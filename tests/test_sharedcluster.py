"""A shared cluster over time: scheduling policies (properties), the event loop against
closed forms, memoisation of running sets, outputs (JSON, job table, sweep) and errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dessim.cli import cluster_cmd
from dessim.errors import DessimError, SpecError
from dessim.sweep.runner import run_sweep
from dessim.workload import sharedcluster
from dessim.workload.jobtrace import parse_job_trace
from dessim.workload.schedulers import POLICIES, Demand, fair_shares, place
from dessim.workload.sharedcluster import simulate_job_trace

#: 4 GPUs, two leaves of two (ranks 0-1 and 2-3): jobs of 2 GPUs on separate leaves share nothing.
TOPO = "leafspine:hosts=4,leaves=2,bw=12.5GB/s,lat=1us,device=H100"
JOB = {"workload": "resnet50", "overrides": {"training": {"global_batch": 24}}}


def trace(jobs, policy="fifo", **sched):
    return parse_job_trace({"topology": TOPO, "scheduler": {"policy": policy, **sched},
                            "jobs": [{**JOB, **j} for j in jobs]}, "<test>")


# ------------------------------------------------------------------ policies
demands = st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
                             st.sampled_from([1, 2, 4]), st.integers(0, 3)), min_size=1, max_size=6)


def _demands(raw, total):
    out, used = [], 0
    for i, (lo, mult_req, mult_max, running) in enumerate(raw):
        gpus = lo * mult_req
        d = Demand(f"j{i}", gpus, lo, gpus * mult_max, 0)
        cur = d.sizes()[min(running, len(d.sizes()) - 1)] if running else 0
        if used + cur > total:
            cur = 0
        used += cur
        out.append(Demand(d.name, d.gpus, d.min_gpus, d.max_gpus, cur))
    return out


@settings(max_examples=200, deadline=None)
@given(raw=demands, total=st.sampled_from([4, 8, 16]), policy=st.sampled_from(sorted(POLICIES)))
def test_policies_allocate_allowed_sizes_within_the_cluster(raw, total, policy):
    active = _demands(raw, total)
    counts = POLICIES[policy](active, total)
    assert set(counts) == {d.name for d in active}
    assert sum(counts.values()) <= total
    for d in active:
        assert counts[d.name] == 0 or counts[d.name] in d.sizes()
        if policy != "dorm" and d.current:
            assert counts[d.name] == d.current                 # static partitions
    if policy == "dorm":
        free = total - sum(counts.values())
        for d in active:                                          # work-conserving
            if counts[d.name]:
                assert not [s for s in d.sizes() if counts[d.name] < s <= counts[d.name] + free]
        started = [counts[d.name] > 0 for d in active]            # admitted in arrival order
        assert started == sorted(started, reverse=True)


@settings(max_examples=200, deadline=None)
@given(dem=st.lists(st.floats(0, 20), min_size=1, max_size=8), total=st.floats(1, 40))
def test_fair_shares_are_max_min_fair(dem, total):
    shares = fair_shares(dem, total)
    assert sum(shares) == pytest.approx(min(total, sum(dem)), abs=1e-9)
    level = max(shares)
    for d, s in zip(dem, shares):
        assert s <= d + 1e-9
        assert s == pytest.approx(d, abs=1e-9) or s == pytest.approx(level, abs=1e-9)


@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=4))
def test_place_gives_disjoint_ranks_and_keeps_unchanged_partitions(counts):
    total = 16
    first = place({}, {f"j{i}": n for i, n in enumerate(counts)}, total)
    again = place(first, {f"j{i}": n for i, n in enumerate(counts)}, total)
    assert again == first
    ranks = [r for rr in first.values() for r in rr]
    assert len(ranks) == len(set(ranks)) == sum(counts)


# ------------------------------------------------------------------ the event loop
def test_fifo_on_separate_leaves_matches_the_closed_form():
    """a (2 GPUs, 0 s) and b (2 GPUs, 1 s) land on different leaves: no interference, so
    each completes in iterations × its alone iteration time, and the GPU-time adds up."""
    res = simulate_job_trace(trace([{"name": "a", "gpus": 2, "iterations": 100},
                                    {"name": "b", "gpus": 2, "arrival": 1, "iterations": 100}]))
    a, b = res.jobs
    tau = a.alone_iteration_s
    assert b.alone_iteration_s == pytest.approx(tau)
    assert (a.start_s, a.finish_s) == pytest.approx((0.0, 100 * tau))
    assert (b.start_s, b.finish_s) == pytest.approx((1.0, 1.0 + 100 * tau))
    assert a.slowdown == pytest.approx(1.0) and b.slowdown == pytest.approx(1.0)
    span = max(100 * tau, 1 + 100 * tau)
    assert res.makespan_s == pytest.approx(span)
    assert res.utilization == pytest.approx(2 * 2 * 100 * tau / (4 * span))


def test_fifo_blocks_and_queues():
    res = simulate_job_trace(trace([{"name": "a", "gpus": 3, "iterations": 50},
                                    {"name": "b", "gpus": 2, "arrival": 0.001, "iterations": 50}]))
    a, b = res.jobs
    assert b.start_s == pytest.approx(a.finish_s)
    assert b.queue_s == pytest.approx(a.finish_s - 0.001)
    assert b.slowdown > 1


def test_dorm_expands_then_shrinks_with_the_resize_pause():
    """a may use 2..4 GPUs: alone it runs on all 4; when b (2 GPUs) arrives at t1 it shrinks to
    its first two ranks (leaf 0), pauses o, and finishes the rest on 2 GPUs; b runs on leaf 1."""
    t1, o, n = 0.2, 0.05, 40
    res = simulate_job_trace(trace([{"name": "a", "gpus": 2, "min_gpus": 2, "max_gpus": 4, "iterations": n},
                                    {"name": "b", "gpus": 2, "arrival": t1, "iterations": n}],
                                   policy="dorm", resize_overhead=o))
    a, b = res.jobs
    first, second = res.segments[:2]
    assert (first.start_s, first.end_s, first.gpus) == (0.0, pytest.approx(t1), {"a": 4})
    assert second.gpus == {"a": 2, "b": 2}
    tau4, tau2 = first.iteration_s["a"], a.alone_iteration_s
    assert second.iteration_s == pytest.approx({"a": tau2, "b": tau2})     # separate leaves
    assert a.resizes == 1 and b.resizes == 0
    assert a.finish_s == pytest.approx(t1 + o + (n - t1 / tau4) * tau2, rel=1e-9)
    assert b.finish_s == pytest.approx(t1 + n * tau2, rel=1e-9)
    assert a.gpu_seconds == pytest.approx(4 * t1 + 2 * (a.finish_s - t1), rel=1e-9)
    assert res.utilization == pytest.approx(1.0) if a.finish_s == b.finish_s else res.utilization < 1


def test_running_sets_are_simulated_once(monkeypatch):
    calls = []
    real = sharedcluster.simulate_cluster

    def counting(spec, **kw):
        calls.append(tuple(j.gpus for j in spec.jobs))
        return real(spec, **kw)

    monkeypatch.setattr(sharedcluster, "simulate_cluster", counting)
    jobs = [{"name": "a", "gpus": 2, "iterations": 20}, {"name": "b", "gpus": 2, "arrival": 0.01, "iterations": 20},
            {"name": "c", "gpus": 2, "arrival": 0.02, "iterations": 20}]
    memo: dict = {}
    first = simulate_job_trace(trace(jobs), memo=memo)
    assert len(calls) == len(set(calls))                    # no set twice
    n = len(calls)
    again = simulate_job_trace(trace(jobs), memo=memo)       # everything memoised
    assert len(calls) == n
    assert again.summary() == first.summary()
    assert first.simulations == n + 1                        # + the alone run (one workload, 2 GPUs)


def test_tokens_become_iterations():
    vit = {"workload": "vit-b16", "overrides": {"training": {"global_batch": 4}}}
    t = parse_job_trace({"topology": TOPO, "scheduler": {}, "jobs": [
        {**vit, "name": "v", "gpus": 2, "tokens": 197 * 4 * 10 + 1}]}, "<t>")
    res = simulate_job_trace(t)
    assert res.jobs[0].iterations == 11                      # 197 tokens per image, 4 images
    with pytest.raises(DessimError, match="job 'r' gives tokens"):
        simulate_job_trace(trace([{"name": "r", "gpus": 2, "tokens": 1e6}]))


# ------------------------------------------------------------------ outputs
def test_cli_json_and_table(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"topology": TOPO, "scheduler": {"policy": "fifo"}, "jobs": [
        {**JOB, "name": "a", "gpus": 2, "iterations": 10}, {**JOB, "name": "b", "gpus": 4, "iterations": 10}]}))
    out = CliRunner().invoke(cluster_cmd.command, [str(path), "--policy", "dorm", "--json",
                                                   "--table", str(tmp_path / "jobs.csv")])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)
    assert s["policy"] == "dorm" and 0 < s["utilization"] <= 1 and s["fairness_loss"] >= 0
    assert [j["name"] for j in s["jobs"]] == ["a", "b"] and s["allocations"]
    header = (tmp_path / "jobs.csv").read_text().splitlines()[0]
    assert header == ",".join(sharedcluster.JOB_COLUMNS)
    text = CliRunner().invoke(cluster_cmd.command, [str(path), "--resize-overhead", "1s"])
    assert text.exit_code == 0 and "fairness loss" in text.output and "slowdown" in text.output
    bad = CliRunner().invoke(cluster_cmd.command, [str(path), "--spans", "x.csv"])
    assert bad.exit_code == 2 and "not for a cluster over time" in bad.output


def test_sweep_over_policies(tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps({"topology": TOPO, "scheduler": {}, "jobs": [
        {**JOB, "name": "a", "gpus": 2, "max_gpus": 4, "iterations": 10},
        {**JOB, "name": "b", "gpus": 2, "arrival": 0.01, "iterations": 10}]}))
    (tmp_path / "s.yaml").write_text(json.dumps({"kind": "cluster", "base": {"cluster": "c.yaml"},
                                                 "axes": {"scheduler.policy": ["fifo", "dorm"]}}))
    t = run_sweep(tmp_path / "s.yaml").table
    assert list(t["status"]) == ["ok", "ok"]
    for col in ("makespan_s", "utilization", "fairness_loss", "mean_slowdown", "jobs.a.slowdown",
                "jobs.b.queue_s", "jobs.a.resizes"):
        assert col in t.columns, col
    assert list(t["policy"]) == ["fifo", "dorm"]
    # the summary's keys are the ones sweeps check metric names against before running
    from dessim.workload.sharedcluster import SUMMARY_KEYS
    assert tuple(simulate_job_trace(tmp_path / "c.yaml").summary()) == SUMMARY_KEYS


def test_a_misspelt_cluster_metric_stops_the_sweep_before_any_point(tmp_path, monkeypatch):
    from dessim.errors import SweepError

    (tmp_path / "c.yaml").write_text(json.dumps({"topology": TOPO, "scheduler": {}, "jobs": [
        {**JOB, "name": "a", "gpus": 2, "iterations": 10}]}))
    (tmp_path / "s.yaml").write_text(json.dumps({
        "kind": "cluster", "base": {"cluster": "c.yaml"}, "axes": {"scheduler.policy": ["fifo"]},
        "analysis": {"metric": "makespan"}}))
    monkeypatch.setattr(sharedcluster, "simulate_cluster", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SweepError, match=r"analysis.metric 'makespan' is not a metric"):
        run_sweep(tmp_path / "s.yaml")


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("jobs, sched, message", [
    ([{"gpus": 2}], {}, "exactly one of 'iterations' or 'tokens'"),
    ([{"gpus": 2, "iterations": 1, "tokens": 5}], {}, "exactly one of"),
    ([{"gpus": 2, "iterations": 1, "max_gpus": 1}], {}, "min_gpus <= gpus <= max_gpus"),
    ([{"gpus": 2, "iterations": 1, "arrival": "soon"}], {}, "arrival"),
    ([{"gpus": 2, "iterations": 1, "colour": "red"}], {}, "unknown key 'colour'"),
    ([{"gpus": 2, "iterations": 1}], {"policy": "lottery"}, "scheduler.policy: 'lottery' is unknown"),
    ([{"gpus": 2, "iterations": 1}], {"resize_overhead": "-1s"}, "resize_overhead"),
    ([{"gpus": 2, "iterations": 1}], {"preempt": True}, "unknown key 'preempt'"),
])
def test_bad_trace_files_name_the_place(jobs, sched, message):
    with pytest.raises(DessimError, match=message):
        parse_job_trace({"topology": TOPO, "scheduler": sched, "jobs": [{**JOB, **j} for j in jobs]}, "c.yaml")


def test_a_job_larger_than_the_cluster_fails_before_simulating():
    with pytest.raises(SpecError, match="job 'big' asks for 8 GPUs .* the cluster has 4"):
        simulate_job_trace(trace([{"name": "big", "gpus": 8, "iterations": 1}]))
