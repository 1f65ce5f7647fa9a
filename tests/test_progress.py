"""A watcher of a running simulation (dessim.engine.progress, ``--progress``): told how far each
engine run has got, and changing nothing of what is simulated."""

import json

import pytest
from click.testing import CliRunner

from dessim.cli import common
from dessim.cli.main import cli
from dessim.engine import Progress, watching
from dessim.engine.progress import Ticker
from dessim.workload import simulate_workload

CASE = ("gpt3-13b", "dgx-a100:nodes=2", {"tp": 4, "pp": 2, "global_batch": 32, "extrapolate": False})


def _without_wall(obj):
    if isinstance(obj, dict):
        return {k: _without_wall(v) for k, v in obj.items() if "wall" not in k and k != "events_per_s"}
    if isinstance(obj, list):
        return [_without_wall(v) for v in obj]
    return obj


def _summary():
    workload, topology, overrides = CASE
    return _without_wall(simulate_workload(workload, topology, overrides=dict(overrides)).summary())


def test_a_watcher_sees_every_run_advance_and_changes_nothing():
    plain = _summary()
    seen: list[Progress] = []
    with watching(seen.append, every_s=0):
        watched = _summary()
    assert watched == plain                 # same figures, events included
    assert seen, "the watcher was never told anything"
    total = seen[0].tasks_total
    assert total > 0 and all(p.tasks_total == total for p in seen)     # one engine run here
    done = [p.tasks_done for p in seen]
    assert done == sorted(done) and len(set(done)) == len(done)         # strictly forward
    assert 0 < done[0] and done[-1] <= total
    assert total - done[-1] < Ticker.STRIDE          # checked every STRIDE tasks, to the end
    sim = [p.sim_time_s for p in seen]
    assert sim == sorted(sim) and sim[-1] <= plain["iteration_s"]
    assert all(p.wall_s >= 0 for p in seen)


def test_nobody_watching_costs_one_comparison_and_reports_nothing():
    assert Ticker(10).next_at == float("inf")
    seen: list[Progress] = []
    with watching(seen.append, every_s=3600):
        ticker = Ticker(100)
        assert ticker.next_at == 0
        assert ticker.check(5, 1.0) == 5 + Ticker.STRIDE
        assert seen == []                   # the interval has not passed
        ticker.check(100, 2.0)              # the run is complete: reported whatever the interval
    assert seen == [Progress(100, 100, 2.0, seen[0].wall_s)]
    assert Ticker(10).next_at == float("inf")      # the watcher ends with its block


def test_a_negative_interval_is_refused():
    with pytest.raises(ValueError, match="every_s"):
        with watching(lambda p: None, every_s=-1):
            pass


def _simulate_cli(*flags):
    workload, topology, _ = CASE
    return CliRunner().invoke(cli, ["simulate", workload, "--topology", topology, "--tp", "4",
                                    "--pp", "2", "--global-batch", "32", "--json", *flags])


def test_the_status_line_goes_to_stderr_and_the_json_is_unchanged(monkeypatch):
    monkeypatch.setattr(common, "STATUS_EVERY_S", 0.0)       # every check shows, however short
    shown, hidden = _simulate_cli("--progress"), _simulate_cli("--no-progress")
    assert shown.exit_code == 0 and hidden.exit_code == 0, shown.output + hidden.output
    assert _without_wall(json.loads(shown.stdout)) == _without_wall(json.loads(hidden.stdout))
    assert hidden.stderr == ""
    frames = [f for f in shown.stderr.split("\r") if f.strip()]     # tqdm's carriage-return frames
    assert frames and all(f.startswith("engine run 1:") for f in frames)
    assert "task/s" in shown.stderr and "simulated" in shown.stderr


def test_without_a_terminal_the_default_shows_nothing(monkeypatch):
    monkeypatch.setattr(common, "STATUS_EVERY_S", 0.0)
    run = _simulate_cli()                  # CliRunner's stderr is not a terminal
    assert run.exit_code == 0 and run.stderr == ""
