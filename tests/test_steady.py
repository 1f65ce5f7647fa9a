"""Steady-state micro-batch extrapolation (:mod:`dessim.workload.transformer.steady`).

The extrapolated summary equals the full replay's within the stated tolerance for every
pipeline schedule, with and without communication and with data parallelism (the gradient
all-reduce at the end); a figure that is not affine makes it refuse, saying why; per-task
outputs, ``--exact`` and ``--no-extrapolate`` turn it off; explore and sweep reports mark the
extrapolated rows. gpt3-1.3b cut to 8 layers on one DGX A100 node keeps each run well under
a second (stage tasks, replica folding).
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dessim.cli.main import cli
from dessim.errors import DessimError
from dessim.sweep.points import flatten
from dessim.workload import simulate_workload
from dessim.workload.transformer import steady
from dessim.workload.transformer.result import WorkloadResult
from dessim.workload.transformer.steady import COUNTERS, ERROR_BOUND, TIME_BOUND, ExtrapolatedResult

#: These small layouts repeat their steady phase exactly: the extrapolation agrees with the
#: full replay to rounding, far inside the promised ERROR_BOUND.
TOLERANCE = 1e-9

TOPOLOGY = "dgx-a100:nodes=1"
SMALL = {"model": {"layers": 8}, "micro_batch": 1}
#: (tp, pp, dp) on the node's 8 GPUs
SHAPES = [(4, 2, 1), (2, 2, 2), (1, 2, 4)]
#: Absolute slack of dimensionless fractions (MFU, bubble) near 0: the rounding of 1 - busy/window.
FRACTION_ABS = 1e-12
#: Entries that are host time or the extrapolation's own report.
NOT_FIGURES = {"wall_s", "extrapolation"}


def _schedule(name: str) -> dict:
    return {"schedule": name, **({"virtual_stages": 2} if name == "interleaved" else {})}


def run(extrapolate: bool | None, m: int, tp: int, pp: int, dp: int, **kw) -> dict:
    overrides = {**SMALL, "tp": tp, "pp": pp, "dp": dp, "global_batch": m * dp,
                 "extrapolate": extrapolate, **kw}
    return simulate_workload("gpt3-1.3b", TOPOLOGY, overrides=overrides).summary()


def _counter(key: str) -> bool:
    return any(key == c or key.startswith(c + ".") for c in COUNTERS)


def assert_close(ext: dict, full: dict) -> None:
    """Every figure of ``full`` in ``ext``: numbers within TOLERANCE relative (FRACTION_ABS
    absolute for values near 0), the rest equal; the simulation's own counters aside."""
    fe = flatten({k: v for k, v in ext.items() if k not in NOT_FIGURES})
    ff = flatten({k: v for k, v in full.items() if k not in NOT_FIGURES})
    assert set(fe) == set(ff)
    for key, want in ff.items():
        got = fe[key]
        if _counter(key):
            continue
        if isinstance(want, float):
            assert math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=FRACTION_ABS), (key, got, want)
        else:
            assert got == want, key


@settings(max_examples=16, deadline=None)
@given(schedule=st.sampled_from(["1f1b", "interleaved", "zb-h1", "dualpipe"]),
       comm=st.booleans(), shape=st.sampled_from(SHAPES), extra=st.integers(0, 6))
def test_extrapolated_figures_equal_the_full_replay(schedule, comm, shape, extra):
    m = 72 + 2 * extra          # pp = 2: runs at 4, 6, 8 micro-batches (+ 2·extra: ≡ m mod 2)
    kw = {**_schedule(schedule), "comm": comm}
    ext, full = run(None, m, *shape, **kw), run(False, m, *shape, **kw)
    e = ext["extrapolation"]
    assert e["micro_batches"] == m and e["auto"] and e["step"] == 2
    m1, m2, m3 = e["simulated_micro_batches"]
    assert m1 >= 4 and m2 == m1 + 2 and m3 == m1 + 4 and (m - m1) % 2 == 0
    assert "extrapolation" not in full
    assert full["exposed_comm_s"]["dp"] > 0 or shape[2] == 1 or not comm
    assert_close(ext, full)


def test_four_stages_step_by_the_pipeline_depth():
    ext, full = run(None, 170, 2, 4, 1), run(False, 170, 2, 4, 1)
    # first count >= 2·pp and ≡ 170 (mod 4): 10, 14, 18 (42 <= 170/4 micro-batches)
    assert ext["extrapolation"]["simulated_micro_batches"] == [10, 14, 18]
    assert ext["extrapolation"]["step"] == 4
    assert_close(ext, full)


def test_deterministic():
    a, b = run(None, 80, 2, 2, 2), run(None, 80, 2, 2, 2)
    a.pop("wall_s"), b.pop("wall_s")
    assert "extrapolation" in a
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_too_few_micro_batches_replay_in_full():
    # 3·(m1 + s) = 3·(4 + 2) = 18 micro-batches > a third of 52, not of 54
    assert "extrapolation" not in run(None, 52, 2, 2, 2)
    assert "extrapolation" in run(None, 54, 2, 2, 2)


@given(curv=st.floats(0, 1e-2), periods=st.integers(1, 500), iteration=st.floats(1, 1000))
def test_the_check_bounds_the_error_of_the_extrapolated_figure(curv, periods, iteration):
    """A slope still off by ``c`` (the two differences apart by ``c``) carried ``k`` periods
    on moves the figure by ``k·c``: accepted exactly when that is within ERROR_BOUND of the
    figure and, for a time figure (seconds), within TIME_BOUND of the iteration time."""
    values = [1.0, 2.0, 3.0 + curv]
    at_m = values[2] + periods * (values[2] - values[0]) / 2
    # c as the differences give it in floats: (3 + 1e-4) - 2 - 1 is 1.0000000000000002e-4,
    # past a bound of exactly 1e-4 (the example curv=1e-4, periods=1, iteration=1)
    drift = periods * abs((values[2] - values[1]) - (values[1] - values[0]))
    for path, ok in (("mfu", drift <= ERROR_BOUND * at_m),
                     ("exposed_comm_s.tp", drift <= ERROR_BOUND * at_m and drift <= TIME_BOUND * iteration)):
        try:
            got = steady._combine(path, values, periods, iteration)
        except steady.NotSteady as exc:
            assert not ok and "not steady" in str(exc), (path, exc)
        else:
            assert ok and got == at_m, path


def test_a_settling_transient_slides_the_window_and_stays_within_the_bound(monkeypatch):
    """Stages that settle into step over a few periods: a figure whose curvature decays
    geometrically fails the check on the first windows, the window slides one step at a time
    (each retry one more run) until it passes, and the figure lands within ERROR_BOUND."""
    summary = WorkloadResult.summary

    def settling(self):
        s = summary(self)
        s["compute_s"] *= 1 + 0.3 * 0.5 ** self.plan.layout.num_micro_batches
        return s

    monkeypatch.setattr(WorkloadResult, "summary", settling)
    ext, full = run(None, 300, 2, 2, 2), run(False, 300, 2, 2, 2)
    e = ext["extrapolation"]
    assert e["retries"] and all("compute_s is not steady" in r for r in e["retries"])
    first = [int(c) for c in e["retries"][0].split(":")[0].split("micro-batches ")[1].split(", ")]
    assert first == [4, 6, 8]
    assert e["simulated_micro_batches"][0] == 4 + 2 * len(e["retries"])      # one step per retry
    assert math.isclose(ext["compute_s"], full["compute_s"], rel_tol=ERROR_BOUND)
    assert not math.isclose(ext["compute_s"], full["compute_s"], rel_tol=TOLERANCE)


def test_a_figure_that_is_not_affine_refuses_and_says_why(monkeypatch):
    summary = WorkloadResult.summary

    def curved(self):
        s = summary(self)
        s["compute_s"] += 1e-3 * self.plan.layout.num_micro_batches ** 2
        return s

    monkeypatch.setattr(WorkloadResult, "summary", curved)
    out = run(None, 80, 2, 2, 2)
    assert "extrapolation" not in out
    (reason,) = [r for r in out["shortcuts"]["refused"] if r.startswith("micro-batch extrapolation")]
    assert "compute_s is not steady in the micro-batches" in reason and "4, 6, 8" in reason


def test_memory_that_grows_with_the_micro_batches_refuses_before_simulating(monkeypatch):
    simulated = []
    monkeypatch.setattr(steady, "simulate", lambda *a: simulated.append(a) or pytest.fail("ran"))
    out = run(None, 80, 2, 2, 2, schedule="gpipe")     # GPipe holds every micro-batch's activations
    (reason,) = [r for r in out["shortcuts"]["refused"] if r.startswith("micro-batch extrapolation")]
    assert "memory estimate at 4 micro-batches differs" in reason and not simulated


def test_the_result_has_no_per_task_records():
    overrides = {**SMALL, "tp": 2, "pp": 2, "dp": 2, "global_batch": 160}
    result = simulate_workload("gpt3-1.3b", TOPOLOGY, overrides=overrides)
    assert isinstance(result, ExtrapolatedResult)
    with pytest.raises(DessimError, match="extrapolate=False"):
        result.simulation
    with pytest.raises(DessimError, match="--no-extrapolate or --exact"):
        result.taskgraph
    assert result.iteration_s == result.summary()["iteration_s"]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """gpt3-1.3b with 8 layers, as a workload file for the command line."""
    from dessim.resources import find_data_file

    text = find_data_file("workloads", "gpt3-1.3b").read_text().replace("layers: 24", "layers: 8").replace("  dp: 8\n", "")
    path = tmp_path_factory.mktemp("wl") / "small.yaml"
    path.write_text(text)
    return str(path)


def _cli(args: list[str]):
    return CliRunner().invoke(cli, args)


@pytest.fixture
def CLI(small) -> list[str]:
    return ["simulate", small, "-t", TOPOLOGY, "--tp", "2", "--pp", "2", "--global-batch", "160",
            "--micro-batch", "1"]


def test_the_summary_says_it_in_text_and_json(CLI):
    res = _cli(CLI)
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if l.strip().startswith("shortcuts"))
    assert "micro-batch extrapolation" in line and "micro-batches 4, 6, 8 simulated" in line
    assert "each within 0.1% of itself, times within 0.0001 of the iteration" in line and "--exact replays every task and micro-batch" in line
    data = json.loads(_cli([*CLI, "--json"]).output)
    assert data["extrapolation"]["simulated_micro_batches"] == [4, 6, 8]
    assert data["extrapolation"]["micro_batches"] == 80


@pytest.mark.parametrize("flag", [["--exact"], ["--no-extrapolate"]])
def test_exact_and_no_extrapolate_turn_it_off(CLI, flag):
    res = _cli([*CLI, *flag, "--json"])
    assert res.exit_code == 0, res.output
    assert "extrapolation" not in json.loads(res.output)


@pytest.mark.parametrize("output", ["--spans=x.csv", "--timeline=x.json", "--save-graph=g.json",
                                    "--gantt=g.html"])
def test_per_task_outputs_turn_it_off(CLI, output, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _cli([*CLI, output, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert "extrapolation" not in data and data["files"]
    res = _cli([*CLI, output, "--extrapolate"])
    assert res.exit_code == 2 and "per-task records" in res.output


def test_exact_with_extrapolate_is_a_usage_error(CLI):
    res = _cli([*CLI, "--exact", "--extrapolate"])
    assert res.exit_code == 2 and "--exact turns every shortcut off" in res.output


def test_explore_marks_the_extrapolated_rows(tmp_path):
    from tests.test_sweep_workload import TINY

    wl = tmp_path / "tiny.yaml"
    wl.write_text(TINY)
    args = ["explore", str(wl), "-t", TOPOLOGY, "--hbm", "20MB", "--global-batch", "256",
            "--workers", "1", "--no-progress"]
    res = _cli(args)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    fit = int(next(l for l in lines if "layouts fit" in l).split()[0])
    assert fit >= 3
    assert f"micro-batch extrapolation {fit}/{fit} layouts" in lines[1] and "marked *" in lines[1]
    rows = lines[lines.index(next(l for l in lines if l.lstrip().startswith("layout"))) + 1:][:fit]
    assert all(r.split()[0].endswith("*") for r in rows)
    assert any(l.startswith("* micro-batch extrapolation: each marked row was simulated") for l in lines)
    # the same table replayed in full: every figure within the tolerance
    ext = json.loads(_cli([*args, "--json"]).output)["ranked"]
    full = json.loads(_cli([*args, "--json", "--no-extrapolate"]).output)["ranked"]
    assert [r["layout"] for r in ext] == [r["layout"] for r in full]
    for e, f in zip(ext, full):
        assert e["extrapolation.micro_batches"] is not None and "extrapolation.micro_batches" not in f
        for col in ("iteration_s", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_total_s",
                    "memory_per_gpu_bytes.total"):
            assert math.isclose(e[col], f[col], rel_tol=TOLERANCE, abs_tol=FRACTION_ABS), col


def test_sweep_report_marks_the_extrapolated_points(tmp_path):
    from dessim.cli.explore_cmd import explore_spec
    from dessim.sweep.analysis import describe
    from dessim.sweep.runner import run_sweep
    from dessim.sweep.spec import parse_sweep
    from tests.test_sweep_workload import TINY

    wl = tmp_path / "tiny.yaml"
    wl.write_text(TINY)
    spec = parse_sweep(explore_spec(str(wl), TOPOLOGY, memory={"hbm_capacity": "20MB"},
                                    overrides={"training": {"global_batch": 256}}), "test")
    text = describe(run_sweep(spec, workers=1))
    assert "* micro-batch extrapolation: each marked row was simulated" in text
    best = text.splitlines()[text.splitlines().index(next(l for l in text.splitlines()
                                                          if l.startswith("best"))) + 2]
    assert best.split()[0].endswith("*")


def test_never_with_kernel_jitter_and_a_bad_value_is_an_error():
    from dessim.engine import EngineOptions
    from dessim.errors import WorkloadError
    from dessim.workload.transformer.plan import plan_workload

    overrides = {**SMALL, "tp": 2, "pp": 2, "dp": 2, "global_batch": 160}
    plan, _ = plan_workload("gpt3-1.3b", TOPOLOGY, overrides=overrides)
    assert steady.applies(plan, EngineOptions())
    assert not steady.applies(plan, EngineOptions(noise={"kernel_jitter_sigma": 0.1, "seed": 1}))
    assert not steady.applies(plan_workload("gpt3-1.3b", TOPOLOGY,
                                            overrides={**overrides, "extrapolate": False})[0], None)
    with pytest.raises(WorkloadError, match="extrapolate='yes' must be true, false or null"):
        plan_workload("gpt3-1.3b", TOPOLOGY, overrides={**overrides, "extrapolate": "yes"})
