"""A whole training run (dessim.training_run): closed forms against Monte Carlo, the
Young/Daly optimum, the Llama 3 snapshot the default failure rates come from, component
counting, energy bookkeeping, option errors, the API, the CLI and determinism."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dessim.cli.main import cli
from dessim.errors import DessimError, SpecError
from dessim.topology import load_topology
from dessim.training_run import (RenewalModel, daly_interval, optimal_interval, parse_train_options,
                                 simulate_training_run, young_interval)
from dessim.training_run.failures import (DEFAULT_FAILURE_RATES, LLAMA3_SNAPSHOT, ComponentCounts,
                                          count_components, job_failure_rate)
from dessim.training_run.montecarlo import sample_runs
from dessim.training_run.reliability import segment_time

pos = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)


# ---------------------------------------------------------------- closed forms
@given(c=pos, m=st.floats(min_value=1.0, max_value=1e9))
def test_young_is_the_square_root_of_2cm(c, m):
    assert young_interval(c, m) == pytest.approx(math.sqrt(2 * c * m), rel=1e-12)


@settings(max_examples=60)
@given(ratio=st.floats(min_value=1e-8, max_value=0.1), m=st.floats(min_value=10.0, max_value=1e8),
       r_ratio=st.floats(min_value=0.0, max_value=5.0))
def test_optimum_is_the_minimum_and_young_daly_its_approximations(ratio, m, r_ratio):
    c, r = ratio * m, r_ratio * m
    opt = optimal_interval(c, m)
    best = RenewalModel(1e9, opt, c, r, m).steady_goodput()
    for tau in (opt * 0.99, opt * 1.01, young_interval(c, m), daly_interval(c, m)):
        assert RenewalModel(1e9, tau, c, r, m).steady_goodput() <= best * (1 + 1e-12)
    # Young is the first-order root: its relative error is O(sqrt(C/M)); Daly's is smaller
    assert abs(young_interval(c, m) / opt - 1) <= math.sqrt(ratio) + 1e-9
    assert abs(daly_interval(c, m) / opt - 1) <= 0.01


@given(c=pos, r=pos, m=st.floats(min_value=10.0, max_value=1e7), tau=pos)
def test_segment_time_is_the_renewal_expectation(c, r, m, tau):
    """Daly's A(tau) against the first-step equations it solves: A = M(1-p) + (1-p)B,
    B = A + M(e^(R/M) - 1), p = e^(-(tau+C)/M)."""
    if (tau + c + r) / m > 300:
        assert segment_time(tau, c, r, m) > 1e100        # hopeless runs: huge or inf, no overflow error
        return
    a = segment_time(tau, c, r, m)
    q = -math.expm1(-(tau + c) / m)                      # 1 - p without cancellation
    b = a + m * math.expm1(r / m)
    assert a == pytest.approx(m * q + q * b, rel=1e-9)
    assert a >= tau + c


@given(c=pos, r=pos, tau=pos)
def test_goodput_tends_to_the_checkpoint_cost_alone_without_failures(c, r, tau):
    model = RenewalModel(100 * tau, tau, c, r, math.inf)
    assert model.goodput() == pytest.approx(tau / (tau + c), rel=1e-12)
    assert model.expected_failures() == 0 and model.expected_lost_s() == 0


def test_expected_overheads_add_up():
    m = RenewalModel(1e6, 300.0, 5.0, 120.0, 4000.0)
    parts = m.work_s + m.checkpoints * m.checkpoint_s + m.expected_restart_s() + m.expected_lost_s()
    assert parts == pytest.approx(m.expected_wall_s(), rel=1e-12)
    assert m.expected_lost_s() > 0 and 0 < m.goodput() < 1


@pytest.mark.parametrize("work,tau,c,r,mtbf", [(2e5, 600.0, 20.0, 300.0, 5000.0),
                                               (5e4, 1000.0, 0.0, 0.0, 800.0),
                                               (3.3e4, 700.0, 50.0, 900.0, 1500.0)])
def test_monte_carlo_converges_to_the_closed_form(work, tau, c, r, mtbf):
    """Sample means within 4 standard errors of the renewal expectations (seeded)."""
    n = 4000
    s = sample_runs(work, tau, c, r, mtbf, n, seed=11)
    m = RenewalModel(work, tau, c, r, mtbf)
    for got, want in ((s.wall_s, m.expected_wall_s()), (s.failures.astype(float), m.expected_failures()),
                      (s.restart_s, m.expected_restart_s()), (s.lost_s, m.expected_lost_s())):
        se = got.std(ddof=1) / math.sqrt(n)
        assert abs(got.mean() - want) <= 4 * se + 1e-9 * want, (got.mean(), want, se)
    assert np.all(s.wall_s >= work + m.checkpoints * c - 1e-6)


def test_hopeless_runs_are_refused_not_sampled_forever():
    from dessim.training_run.reliability import ReliabilityError
    with pytest.raises(ReliabilityError, match="hardly progress"):
        sample_runs(1e6, 500.0, 10.0, 1e5, 100.0, 10)


def test_monte_carlo_is_seeded():
    a = sample_runs(1e5, 500.0, 10.0, 100.0, 3000.0, 200, seed=3)
    b = sample_runs(1e5, 500.0, 10.0, 100.0, 3000.0, 200, seed=3)
    assert np.array_equal(a.wall_s, b.wall_s) and np.array_equal(a.failures, b.failures)


# ---------------------------------------------------------------- failures
def test_default_rates_reproduce_the_llama3_snapshot():
    """419 unexpected interruptions in 54 days on 16,384 GPUs (Llama 3 report §3.3.4)."""
    counts = ComponentCounts(**LLAMA3_SNAPSHOT.components)
    rate = sum(job_failure_rate(counts, DEFAULT_FAILURE_RATES).values())
    assert rate * 54 * 86400 == pytest.approx(419, rel=1e-12)
    assert sum(LLAMA3_SNAPSHOT.interruptions.values()) == 419
    assert 1 / rate / 3600 == pytest.approx(3.09, abs=0.01)    # "one failure every three hours"


def test_components_of_a_dgx_cluster():
    c = count_components(load_topology("dgx-h100:nodes=2"))
    assert c.as_dict() == {"gpu": 16, "host": 2, "nic": 16, "link": 32, "switch": 10, "software": 16}
    assert count_components(load_topology("switch:8")).host == 1


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("data,match", [
    ({"tokens": "1T", "steps": 2}, "exactly one"),
    ({"steps": 2, "foo": 1}, "unknown key 'foo'"),
    ({"steps": 2, "mtbf": {"cpu": "1h"}}, "'cpu' is unknown"),
    ({"steps": 2, "pue": 0.5}, "pue"),
    ({"steps": 2, "checkpoint_interval": "weekly"}, "checkpoint_interval"),
    ({"steps": 2, "gpu_power": {"fast": 700}}, "gpu_power"),
    ({"steps": 2, "gpu_power": {"idle": -1}}, "idle"),
    ({"steps": 2, "capex_per_gpu": 30000}, "amortisation"),
    ({"steps": 2, "usd_per_kwh": -1}, "usd_per_kwh"),
])
def test_bad_train_options_name_the_key(data, match):
    with pytest.raises(SpecError, match=match):
        parse_train_options(data)


# ---------------------------------------------------------------- the whole run
@pytest.fixture(scope="module")
def small_run():
    opts = parse_train_options({"tokens": "20G", "samples": 300, "mc_seed": 5, "restart": "5min",
                                "rewarm": "1min", "mtbf": {"gpu": "2000h"}, "usd_per_gpu_hour": 2.0})
    return simulate_training_run("gpt3-1.3b", "dgx-h100:nodes=1", opts)


def test_run_scales_one_iteration(small_run):
    s = small_run.summary()
    from dessim.training_run.run import SUMMARY_KEYS
    assert tuple(s) == SUMMARY_KEYS     # what sweeps check metric names against before running
    it = small_run.nominal
    assert s["steps"] == math.ceil(20e9 / s["tokens_per_iteration"])
    assert s["useful_s"] == pytest.approx(s["steps"] * it.iteration_s)
    assert s["time_to_train_s"] > s["useful_s"] and 0 < s["goodput"] < 1
    assert s["goodput"] == pytest.approx(s["useful_s"] / s["time_to_train_s"])
    ck = s["checkpoint"]
    model = it.plan.model
    assert ck["bytes"] == model.num_params() * 14            # bf16 weights + fp32 Adam state
    assert ck["write_s"] > 0 and ck["interval_s"] == pytest.approx(ck["every_steps"] * it.iteration_s)
    assert abs(ck["interval_s"] - ck["daly_s"]) <= it.iteration_s / 2     # Daly's, to a whole step
    assert s["restart_s"] == pytest.approx(300 + 60 + ck["restore_s"])
    # the user's GPU MTBF dominates the job rate: 8 GPUs at 2000 h
    assert s["failures"]["rate_per_s"]["gpu"] == pytest.approx(8 / (2000 * 3600))
    mc = s["monte_carlo"]
    assert mc["time_to_train_s"]["p50"] <= mc["time_to_train_s"]["p90"] <= mc["time_to_train_s"]["p99"]
    # the Monte Carlo's mean energy agrees with the closed form's (same power bookkeeping)
    assert mc["energy_run_mwh"]["mean"] == pytest.approx(s["energy_run_mwh"], rel=0.01)


def test_energy_and_cost_bookkeeping(small_run):
    s = small_run.summary()
    e = s["energy"]
    assert sum(e["breakdown_j"].values()) == pytest.approx(e["per_iteration_j"])
    # every GPU is at most at its TDP: 8 x 700 W plus the DGX H100 host (10.2 kW - 8 x 700 W), times PUE
    upper = (8 * 700 + 4600) * 1.58 * small_run.nominal.iteration_s
    assert e["per_iteration_j"] <= upper * (1 + 1e-9)
    assert sum(e["gpu_busy_by_kind_j"].values()) == pytest.approx(e["breakdown_j"]["gpu_busy"], rel=1e-12)
    assert e["gpu_busy_by_kind_j"]["gemm"] > 0 and e["gpu_busy_by_kind_j"]["memory"] > 0
    assert e["per_iteration_j"] / s["tokens_per_iteration"] == pytest.approx(s["energy_per_token_j"])
    assert s["energy_run_mwh"] * 3.6e9 >= s["steps"] * e["per_iteration_j"] * (1 - 1e-9)
    cost = s["cost"]
    assert cost["rental"] == pytest.approx(8 * s["time_to_train_s"] / 3600 * 2.0)
    assert s["cost_usd"] == pytest.approx(sum(cost.values()))


def test_health_states_and_attribution():
    from dessim.engine import EngineOptions
    opts = parse_train_options({"steps": 1000, "samples": 50, "health_states": 3, "attribute": 2,
                                "restart": "5min", "rewarm": "1min"})
    eng = EngineOptions(noise={"straggler_sigma": 0.1, "seed": 2})
    r = simulate_training_run("gpt3-1.3b", "switch:8", opts, engine=eng,
                              overrides={"device": "H100", "global_batch": 32, "model": {"layers": 4}})
    s = r.summary()
    assert s["health"]["states"] == 3
    times = r.iteration_times
    assert len(set(times)) == 3
    att = s["health"]["attribution"]
    assert att and att[0]["saved_s"] > 0                     # healing the slowest rank helps
    assert att[0]["slowdown"] >= att[-1]["slowdown"]
    assert all(a["saved_s"] >= -1e-12 for a in att)
    with pytest.raises(DessimError, match="kernel_jitter_sigma"):
        simulate_training_run("gpt3-1.3b", "switch:8", opts, overrides={"device": "H100"})


def test_cli_train_json_is_deterministic_and_plots(tmp_path):
    args = ["train", "gpt3-1.3b", "--topology", "dgx-h100:nodes=1", "--tokens", "10G",
            "--samples", "100", "--restart", "5min", "--rewarm", "1min", "--json"]
    runner = CliRunner()
    a = runner.invoke(cli, args)
    b = runner.invoke(cli, args)
    assert a.exit_code == 0, a.output
    da, db = json.loads(a.output), json.loads(b.output)
    assert da == db
    assert da["monte_carlo"]["samples"] == 100 and da["time_to_train_s"] > da["useful_s"]
    text = runner.invoke(cli, ["train", "gpt3-1.3b", "--steps", "100", "--samples", "20", "--restart", "300s",
                               "--rewarm", "60s", "--plots", str(tmp_path)])
    assert text.exit_code == 0, text.output
    # a 100-step run uses a few kWh (MWh from one MWh up: a short run printed '0.00 MWh')
    assert "time to train" in text.output and re.search(r"\d kWh per run", text.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["energy.png", "goodput_vs_interval.png",
                                                          "time_to_train.png"]


@pytest.mark.parametrize("args,match", [
    (["train", "gpt3-1.3b"], "--tokens"),
    (["train", "gpt3-1.3b", "--steps", "10", "--mtbf", "gpu"], "KIND=TIME"),
    (["train", "gpt3-1.3b", "--steps", "10", "--gpu-power", "700"], "BUSY,COMM,IDLE"),
    (["train", "gpt3-1.3b", "--steps", "10", "--gpu-power", "hot=700"], "hot"),
    (["train", "gpt3-1.3b", "--steps", "10", "--topology", "dgx-h100:nodes=2"], "--switch-power"),
    (["train", "gpt3-1.3b", "--tokens", "lots"], "tokens"),
    (["train", "gpt3-1.3b", "--steps", "10", "--restart", "5min"], "rewarm"),
])
def test_cli_train_bad_input_is_a_clean_error(args, match):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and match in res.output and "Traceback" not in res.output


def test_cli_train_names_every_missing_figure_in_one_error():
    """A multi-node run that can fail needs switch power and restart times: both are named
    at once, so the user fixes the command in one go."""
    res = CliRunner().invoke(cli, ["train", "gpt3-1.3b", "--steps", "10", "--topology", "dgx-h100:nodes=2"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--switch-power" in res.output and "--restart" in res.output and "--rewarm" in res.output


# ---------------------------------------------------------------- sweeps
TINY = """\
name: tiny
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1024, seq_len: 256}
parallelism: {tp: 1, pp: 1}
training: {global_batch: 8, micro_batch: 1, zero_stage: 1, bucket_size: 1MiB}
"""


def test_train_sweep_reports_run_metrics_per_point(tmp_path):
    from dessim.sweep.runner import run_sweep
    from dessim.sweep.spec import parse_sweep

    wl = tmp_path / "tiny.yaml"
    wl.write_text(TINY)
    spec = parse_sweep({"kind": "train",
                        "base": {"workload": str(wl), "topology": "dgx-a100:nodes=1",
                                 "engine": {"network": "analytical"},
                                 "train": {"tokens": "1G", "samples": 50, "mtbf": {"gpu": "500h"},
                                           "restart": "5min", "rewarm": "1min"}},
                        "axes": {"train.checkpoint_interval": ["young", "2min"], "train.pue": [1.1, 1.5]}},
                       "inline")
    table = run_sweep(spec).table
    assert list(table["status"]) == ["ok"] * 4
    for col in ("time_to_train_s", "goodput", "energy_run_mwh", "cost_usd", "expected_failures",
                "monte_carlo.time_to_train_s.p90", "iteration_s", "mfu"):
        assert col in table.columns, col
    by = table.set_index(["train.checkpoint_interval", "train.pue"])
    assert by.loc[(120, 1.5), "energy_run_mwh"] > by.loc[(120, 1.1), "energy_run_mwh"]
    point = by.loc[(120, 1.1)]                                       # the axis parsed '2min'
    assert abs(point["checkpoint.interval_s"] - 120) <= point["iteration_s"] / 2
    young = by.loc[("young", 1.1)]
    assert abs(young["checkpoint.interval_s"] - young["checkpoint.young_s"]) <= young["iteration_s"] / 2
    bad = parse_sweep({"kind": "train", "base": {"workload": str(wl), "topology": "dgx-a100:nodes=1",
                                                  "train": {"steps": 10, "pue": 0.2}}}, "inline")
    rec = run_sweep(bad).table.iloc[0]
    assert rec["status"] == "failed" and "pue" in rec["reason"]


# ---------------------------------------------------------------- docs/training-run.md
def test_llama3_worked_example():
    """The table of docs/training-run.md "Worked example": 54 days on the Llama 3 cluster."""
    from dessim.workload import load_workload

    model = load_workload("llama3-405b").model
    ckpt = model.num_params() * 14
    assert ckpt / 16_384 == pytest.approx(347e6, rel=1e-3)      # within the report's 1 MB-4 GB per GPU
    counts = ComponentCounts(**LLAMA3_SNAPSHOT.components)
    rates = job_failure_rate(counts, DEFAULT_FAILURE_RATES)
    m = 1 / sum(rates.values())
    c = ckpt / 2e12
    assert c == pytest.approx(2.84, abs=0.005)
    assert (young_interval(c, m), daly_interval(c, m), optimal_interval(c, m)) == pytest.approx(
        (251.5, 249.6, 249.6), abs=0.05)
    assert rates["gpu"] / sum(rates.values()) == pytest.approx(0.64, abs=0.005)
    wall = 54 * 86400
    tau = daly_interval(c, m)
    for minutes, goodput in ((5, 0.952), (10, 0.926), (15, 0.902), (20, 0.878), (30, 0.832)):
        r = minutes * 60.0
        work = RenewalModel(1e9, tau, c, r, m).steady_goodput() * wall
        run = RenewalModel(work, tau, c, r, m)
        assert run.expected_wall_s() == pytest.approx(wall, rel=1e-4)
        assert run.expected_failures() == pytest.approx(419, rel=1e-4)
        assert run.goodput() == pytest.approx(goodput, abs=5e-4)
    s = sample_runs(RenewalModel(1e9, tau, c, 600.0, m).steady_goodput() * wall, tau, c, 600.0, m, 2000, seed=1)
    p50, p90, p99 = np.percentile(s.failures, [50, 90, 99])
    assert 415 <= p50 <= 424 and 440 <= p90 <= 455 and 465 <= p99 <= 485


def test_checkpoint_transfers_share_the_storage_links():
    """Node-local drives behind the two CPUs of a DGX: four GPUs share each 5 GB/s drive, so
    a 40 GB checkpoint (5 GB per GPU) takes 4 × 5 GB / 5 GB/s = 4 s to write and to read."""
    from dessim.topology.storage import attach_storage
    from dessim.training_run.checkpoint import checkpoint_times

    topo = attach_storage(load_topology("dgx-h100:nodes=1"), "nvme", "5GB/s")
    t = checkpoint_times(topo, 40e9)
    assert t.storage == "nvme0,nvme1"
    assert t.write_s == pytest.approx(4.0, rel=1e-3) and t.restore_s == pytest.approx(4.0, rel=1e-3)
    fast = checkpoint_times(attach_storage(load_topology("dgx-h100:nodes=1"), "nvme", "50GB/s"), 40e9)
    assert fast.write_s < t.write_s


def test_checkpoint_size_before_simulating_matches_the_plan(small_run):
    from dessim.training_run.checkpoint import checkpoint_bytes, planned_checkpoint_bytes

    assert planned_checkpoint_bytes("gpt3-1.3b", None, 8) == checkpoint_bytes(small_run.nominal)
    assert planned_checkpoint_bytes("gpt3-1.3b", {"model": {"layers": 4}}, 8) < checkpoint_bytes(small_run.nominal)
    assert planned_checkpoint_bytes("resnet50", None, 8) is None          # sized after its simulation



def test_a_dlrm_checkpoint_holds_its_embedding_tables():
    """dlrm-small's checkpoint was its dense MLPs' weights and Adam state alone (5.4 MiB),
    without the 26 embedding tables (2.2 GB, 99.8 % of the model); now every table once."""
    from dessim.training_run.checkpoint import checkpoint_bytes
    from dessim.workload import simulate_workload

    result = simulate_workload("dlrm-small", "dgx-h100:nodes=1")
    tables = result.details["embedding_bytes"]
    assert tables > 2e9
    assert checkpoint_bytes(result) == result.memory["weights"] + result.memory["optimizer"] + tables
    cnn = simulate_workload("resnet50", "dgx-h100:nodes=1")
    assert checkpoint_bytes(cnn) == cnn.memory["weights"] + cnn.memory["optimizer"]


def test_a_short_run_prints_its_figures_in_units_that_show_them():
    """A 1,000-step DLRM run printed '(0 tokens)', '0.00 days', '0.00 MWh per run, 0.0 kJ per
    iteration' and 'cost 0 USD': every figure rounded away. Now: no token count for a model
    without tokens, seconds, kJ and J, and three significant digits of a dollar."""
    from click.testing import CliRunner

    from dessim.cli.main import cli

    never = [a for k in ("gpu", "host", "nic", "link", "switch", "software") for a in ("--mtbf", f"{k}=never")]
    res = CliRunner().invoke(cli, ["train", "dlrm-small", "-t", "dgx-h100:nodes=1", "--steps", "1000",
                                   "--switch-power", "0", *never])
    assert res.exit_code == 0, res.output
    out = res.output
    for rounded_away in ("0 tokens", "0.00 days", "0.00 d,", "0.00 MWh", "0.0 kJ", " 0 USD"):
        assert rounded_away not in out, (rounded_away, out)
    assert "kJ per run" in out and " J per iteration" in out and "USD (energy 0.0" in out


# ---------------------------------------------------------------- per-kernel jitter (engine noise)
def _chain(n: int, seconds: float):
    from dessim.taskgraph.model import Task, TaskGraph

    g = TaskGraph("chain")
    prev = None
    for i in range(n):
        g.add(Task(f"k{i}", 0, "compute", duration=seconds), deps=[prev] if prev else [])
        prev = f"k{i}"
    return g


def test_kernel_jitter_is_mean_one_lognormal_and_seeded():
    """A chain of 400 tasks of 1 ms: the makespan's mean over seeds stays 0.4 s and its
    spread is sigma·sqrt(n) ms; the same seed gives the same makespan; sigma 0 changes nothing."""
    from dessim.engine import EngineOptions, simulate

    topo = load_topology("switch:2")
    g = _chain(400, 1e-3)
    base = simulate(g, topo, EngineOptions(record_links=False)).makespan_s
    assert base == pytest.approx(0.4)
    sigma = 0.2
    runs = [simulate(g, topo, EngineOptions(record_links=False,
                                            noise={"kernel_jitter_sigma": sigma, "seed": s})).makespan_s
            for s in range(40)]
    sd = math.sqrt(math.expm1(sigma ** 2)) * math.sqrt(400) * 1e-3     # std of the sum
    assert abs(np.mean(runs) - 0.4) < 4 * sd / math.sqrt(40)
    assert 0.5 * sd < np.std(runs, ddof=1) < 1.5 * sd
    again = simulate(g, topo, EngineOptions(record_links=False, noise={"kernel_jitter_sigma": sigma, "seed": 3}))
    assert again.makespan_s == runs[3]
    with pytest.raises(SpecError, match="kernel_jitter_sigma"):
        EngineOptions(noise={"kernel_jitter_sigma": -1})


def test_health_states_from_kernel_jitter_alone():
    from dessim.engine import EngineOptions
    opts = parse_train_options({"steps": 100, "samples": 20, "health_states": 3,
                                "restart": "5min", "rewarm": "1min"})
    r = simulate_training_run("gpt3-1.3b", "switch:8", opts,
                              engine=EngineOptions(noise={"kernel_jitter_sigma": 0.05}),
                              overrides={"device": "H100", "global_batch": 32, "model": {"layers": 4}})
    assert len(set(r.iteration_times)) == 3 and r.summary()["health"]["attribution"] == []


def test_the_example_sweep_parses():
    from pathlib import Path

    from dessim.sweep.spec import expand_points, load_sweep

    spec = load_sweep(Path(__file__).resolve().parent.parent / "examples" / "training-run" / "sweep.yaml")
    assert spec.kind == "train" and len(expand_points(spec)) == 4


NEVER = [a for k in ("gpu", "host", "nic", "link", "switch", "software") for a in ("--mtbf", f"{k}=never")]


def test_a_checkpoint_interval_shorter_than_one_iteration_is_refused_naming_the_iteration():
    """'--checkpoint-interval 1us' was silently taken as one iteration (1.4 ms, 1,400 times
    longer). Checkpoints are taken between steps: the interval is refused, in the text and
    in --json alike, naming the iteration time and what to give instead; the value it
    suggests is accepted as one checkpoint per step."""
    args = ["train", "dlrm-small", "-t", "dgx-h100:nodes=1", "--steps", "100", "--samples", "0",
            "--switch-power", "0", "--checkpoint-size", "1KiB", *NEVER]
    runner = CliRunner()
    text = runner.invoke(cli, [*args, "--checkpoint-interval", "1us"])
    as_json = runner.invoke(cli, [*args, "--checkpoint-interval", "1us", "--json"])
    assert text.exit_code == as_json.exit_code == 2 and "Traceback" not in text.output
    assert text.output == as_json.output
    line = text.output.strip()
    assert line.startswith("error: checkpoint interval 1us (--checkpoint-interval; train.checkpoint_interval) "
                           "is shorter than one iteration (") and "(young, daly, optimal)" in line
    given = re.search(r"give (\S+) \(a checkpoint after every step\)", line).group(1)
    ok = runner.invoke(cli, [*args, "--checkpoint-interval", given, "--json"])
    assert ok.exit_code == 0, ok.output
    ck = json.loads(ok.output)["checkpoint"]
    assert ck["every_steps"] == 1 and ck["rule"] == "given"


def test_a_run_that_cannot_fail_takes_no_checkpoint_unless_an_interval_is_given():
    """With every component at MTBF 'never', Young's and Daly's intervals are infinite: no
    checkpoint protects anything, so none is charged (dlrm-small printed goodput 38.93 %:
    a 2.2 s write after 1.4 s of work) and the output says why. An interval the user gives
    is still honoured."""
    args = ["train", "dlrm-small", "-t", "dgx-h100:nodes=1", "--steps", "1000", "--samples", "20",
            "--switch-power", "0", *NEVER]
    runner = CliRunner()
    res = runner.invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    ck = s["checkpoint"]
    assert ck["write_s"] > 0 and ck["count"] == 0 and ck["interval_s"] is None and ck["every_steps"] is None
    assert s["goodput"] == 1.0 and s["time_to_train_s"] == s["useful_s"]
    assert s["expected"]["checkpoint_s"] == 0.0 and s["monte_carlo"]["time_to_train_s"]["p99"] == s["useful_s"]
    text = runner.invoke(cli, args)
    assert "none taken: nothing can fail, so the daly interval is infinite" in text.output
    assert "goodput 100.00%" in text.output
    given = json.loads(runner.invoke(cli, [*args, "--checkpoint-interval", "0.5s", "--json"]).output)
    assert given["checkpoint"]["count"] == 3 and given["checkpoint"]["rule"] == "given"
    assert given["expected"]["checkpoint_s"] == pytest.approx(3 * ck["write_s"])
    assert given["goodput"] < 0.25


def test_a_run_that_hardly_progresses_names_what_takes_the_time():
    """A checkpoint after every 1.4 ms step of dlrm-small (2.2 s writes) was blamed on 'the
    MTBFs (--mtbf) and restart times', also when nothing could fail; now the checkpoints are
    named, with the goodput they alone would leave, and the failures only where they cost."""
    args = ["train", "dlrm-small", "-t", "dgx-h100:nodes=1", "--steps", "1000", "--samples", "0",
            "--switch-power", "0"]
    runner = CliRunner()
    never = runner.invoke(cli, [*args, *NEVER, "--checkpoint-interval", "1.414ms"])
    assert never.exit_code == 2 and "job MTBF never" in never.output
    # one 2.2 s write per 1.4 ms step leaves about 1.4e-3 / 2.2 of the time for work
    assert re.search(r"check the checkpoint interval \(--checkpoint-interval\) and size \(--checkpoint-size\): "
                     r"without failures goodput would be [5-7]\.\d\de-04$", never.output.strip())
    assert "--mtbf" not in never.output
    flaky = runner.invoke(cli, [*args, "--mtbf", "gpu=1s", "--restart", "5min", "--rewarm", "1min"])
    assert flaky.exit_code == 2 and flaky.output.rstrip().endswith("and the MTBFs (--mtbf) and restart times")
