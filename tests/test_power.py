"""GPU power by kernel kind (dessim.training_run.power) and the engine's compute time by kernel
kind it prices: the engine's split against hand sums, energy = Σ state seconds × watts exactly,
the old three-state model recovered when every compute kind draws the old busy figure, the
defaults' sources, and the figures the user must give."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from dessim.cli.main import cli
from dessim.engine import simulate
from dessim.engine.result import RankTimes, SimulationResult
from dessim.errors import DessimError, SpecError
from dessim.taskgraph import Task, TaskGraph
from dessim.training_run import parse_train_options
from dessim.training_run.cost import CostModel
from dessim.training_run.failures import ComponentCounts
from dessim.training_run.power import (COMPUTE_KINDS, GPU_POWER, GPU_STATES, HOST_POWER, PowerError, PowerModel,
                                       iteration_energy, power_kind)
from engine_helpers import line

COUNTS = ComponentCounts(gpu=2, host=1, nic=2, link=0, switch=3, software=2)


# ---------------------------------------------------------------- the engine's split
def _kinds_graph() -> TaskGraph:
    """Rank 0: a matmul (1 ms), a two-kernel layer task (3 ms: 2 ms attention + 1 ms norm by its
    mix), a delay (0.5 ms) and, on a second compute stream, a norm (2 ms) overlapping the layer
    task; rank 1: one matmul (4 ms); then a send 0 -> 1."""
    g = TaskGraph("kinds")
    g.add(Task("mm", 0, "compute", duration=1e-3, kernel="matmul"))
    g.add(Task("layer", 0, "compute", duration=3e-3, kernel="layer"), ["mm"])
    g.kernel_mix["layer"] = (("attention.flash2.fwd", 20.0), ("norm", 10.0))   # shares, any unit
    g.add(Task("side", 0, "compute", stream="aux", duration=2e-3, kernel="norm"), ["mm"])
    g.add(Task("wait", 0, "delay", duration=5e-4), ["layer"])
    g.add(Task("mm1", 1, "compute", duration=4e-3, kernel="matmul"))
    g.add(Task("s", 0, "send", peer=1, size=1e6), ["wait"])
    g.add(Task("r", 1, "recv", peer=0, size=1e6), ["mm1"])
    return g


def test_engine_splits_compute_time_by_kernel_kind():
    res = simulate(_kinds_graph(), line(2))
    r0, r1 = res.ranks
    # rank 0's compute union: mm 0-1 ms, layer 1-4 ms with the side norm 1-3 ms, delay 4-4.5 ms
    assert r0.compute_s == pytest.approx(4.5e-3, rel=1e-12)
    assert sum(r0.compute_by_kernel.values()) == pytest.approx(r0.compute_s, rel=1e-12)
    # task seconds: matmul 1, attention 2, norm 1 + 2, delay 0.5 (6.5 ms) scaled to the 4.5 ms union
    f = 4.5 / 6.5
    assert r0.compute_by_kernel == {"attention.flash2.fwd": pytest.approx(2e-3 * f), "delay": pytest.approx(5e-4 * f),
                                    "matmul": pytest.approx(1e-3 * f), "norm": pytest.approx(3e-3 * f)}
    assert r1.compute_by_kernel == {"matmul": pytest.approx(4e-3, rel=1e-12)}


def test_granularities_report_the_same_kernel_time():
    """A layer task carries its kernels' mix: layer and kernel granularity split alike."""
    from dessim.workload import simulate_workload
    tiny = {"model": {"layers": 2, "hidden": 256, "heads": 8, "ffn_hidden": 1024, "vocab": 1024, "seq_len": 256},
            "tp": 2, "pp": 1, "global_batch": 8, "micro_batch": 1}
    got = [simulate_workload("gpt3-1.3b", "switch:4", overrides={**tiny, "device": "H100", "granularity": g})
           .simulation.ranks[0].compute_by_kernel for g in ("layer", "kernel")]
    assert set(got[0]) == set(got[1]) and {"matmul", "norm"} <= set(got[0])
    for k in got[0]:
        assert got[0][k] == pytest.approx(got[1][k], rel=1e-9, abs=1e-15), k


@pytest.mark.parametrize("kernel,kind", [
    ("matmul", "gemm"), ("matmul.bf16", "gemm"), ("attention.flash2.fwd", "attention"),
    ("attention.flash3.bwd", "attention"), ("attention", "attention"), ("attention.unfused.fwd", "memory"),
    ("norm", "memory"), ("elementwise", "memory"), ("optimizer", "memory"), ("softmax", "memory"),
    ("delay", "other"), ("compute", "other"), ("layer", "other")])
def test_power_kind_of_each_kernel_kind(kernel, kind):
    assert power_kind(kernel) == kind


# ---------------------------------------------------------------- energy = Σ seconds × watts
def _sim(ranks: list[RankTimes], makespan: float) -> SimulationResult:
    return SimulationResult(makespan, ranks, [], {}, {}, [], 0, 0.0, "analytical")


watts = st.floats(min_value=0.0, max_value=2000.0, allow_nan=False)
secs = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
KERNELS = ("matmul", "attention.flash2.fwd", "norm", "elementwise", "attention.unfused.bwd", "delay")


@settings(max_examples=60, deadline=None)
@given(w=st.fixed_dictionaries({s: watts for s in GPU_STATES}),
       ranks=st.lists(st.tuples(st.fixed_dictionaries({k: secs for k in KERNELS}), secs, secs),
                      min_size=1, max_size=4),
       pue=st.floats(min_value=1.0, max_value=2.0))
def test_energy_is_the_sum_of_state_seconds_times_watts(w, ranks, pue):
    rts, t = [], 0.0
    for i, (by, comm, idle) in enumerate(ranks):
        c = sum(by.values())
        rts.append(RankTimes(i, c, comm, comm, 0.0, idle, c + comm, {}, {k: v for k, v in by.items() if v > 0}))
        t = max(t, c + comm + idle)
    devices = {i: "H100" for i in range(len(ranks))}
    power = PowerModel(host_w=0.0, switch_w=0.0, pue=pue, gpu=w)
    e = iteration_energy(_sim(rts, t), devices, COUNTS, power)
    expect = dict.fromkeys(GPU_STATES, 0.0)
    for (by, comm, _), r in zip(ranks, rts):
        for k, v in by.items():
            expect[power_kind(k)] += v * w[power_kind(k)]
        expect["comm"] += comm * w["comm"]
        expect["idle"] += (t - r.compute_s - comm) * w["idle"]
    for s in GPU_STATES:
        assert e.gpu_j[s] == pytest.approx(expect[s] * pue, rel=1e-9, abs=1e-9), s
    assert e.gpu_busy_j == pytest.approx(sum(e.busy_by_kind().values()), rel=1e-12, abs=1e-12)
    assert sum(e.gpu_s.values()) == pytest.approx(len(ranks) * t, rel=1e-9, abs=1e-12)
    assert e.total_j == pytest.approx(sum(e.breakdown().values()), rel=1e-12, abs=1e-12)


def _old_three_state(sim: SimulationResult, n: int, busy: float, comm: float, idle: float) -> float:
    """GPU joules of the former model: busy while any compute runs, comm, idle (no PUE)."""
    t, out = sim.makespan_s, 0.0
    for r in sim.ranks:
        c = min(r.compute_s, t)
        e = min(r.exposed_comm_s, t - c)
        out += n / len(sim.ranks) * (busy * c + comm * e + idle * max(0.0, t - c - e))
    return out


@pytest.mark.parametrize("device", ["H100", "A100-80GB", "B200"])
def test_every_kind_at_the_old_busy_figure_gives_the_old_total(device):
    sim = simulate(_kinds_graph(), line(2))
    old = {"H100": (700.0, 280.0, 105.0), "A100-80GB": (400.0, 160.0, 60.0), "B200": (1000.0, 400.0, 150.0)}[device]
    busy, comm, idle = old
    power = PowerModel(host_w=1000.0, nic_w=25.0, switch_w=1000.0, pue=1.2,
                       gpu={**dict.fromkeys(COMPUTE_KINDS, busy), "comm": comm, "idle": idle})
    devices = {0: device, 1: device}
    e = iteration_energy(sim, devices, COUNTS, power)
    t = sim.makespan_s
    old_total = (_old_three_state(sim, 2, busy, comm, idle) + (1000.0 + 2 * 25.0 + 3 * 1000.0) * t) * 1.2
    assert e.total_j == pytest.approx(old_total, rel=1e-12)
    assert e.gpu_busy_j == pytest.approx(1.2 * busy * sum(r.compute_s for r in sim.ranks), rel=1e-12)


def test_a_rank_without_a_kernel_split_is_all_other():
    r = RankTimes(0, 2.0, 0.0, 0.0, 0.0, 1.0, 2.0)
    e = iteration_energy(_sim([r], 3.0), {0: "H100"}, COUNTS, PowerModel(switch_w=0.0, pue=1.0))
    w = GPU_POWER["H100"].watts
    assert e.gpu_j["other"] == pytest.approx(2.0 * w["other"]) and e.gpu_j["idle"] == pytest.approx(w["idle"])


# ---------------------------------------------------------------- defaults and their sources
#: (model, state) defaults that carry a public source: none may be marked [U].
SOURCED = {(m, s) for m in ("V100", "A100-40GB", "A100-80GB", "H100", "B200", "MI300X")
           for s in ("gemm", "attention", "other", "comm", "idle")}


def test_sourced_gpu_defaults_carry_no_unconfirmed_mark():
    for model, state in SOURCED:
        src = GPU_POWER[model].sources[state]
        assert "[U]" not in src and ("[C" in src or "[D]" in src), (model, state, src)
    # what has no public figure says so
    for model, p in GPU_POWER.items():
        assert "[U]" in p.sources["memory"], model
    assert "[U]" in GPU_POWER["H200"].sources["idle"] and "[U]" in GPU_POWER["H200"].sources["gemm"]
    for model in ("H100", "A100-40GB", "A100-80GB", "B200"):
        assert "[U]" not in HOST_POWER[model].source
    assert HOST_POWER["H100"].watts == 10200 - 8 * 700 and HOST_POWER["B200"].watts == 14300 - 8 * 1000


def test_sources_are_in_the_references():
    from pathlib import Path
    refs = (Path(__file__).resolve().parents[1] / "docs" / "references.md").read_text()
    for name in ("Patel et al. 2024", "Choukse et al. 2025", "Latif et al. 2024", "gpu-burn issue #114",
                 "GLM-130B issue #32", "legacy-rocm-build issue #5231", "legacy-rocm-build issue #5219",
                 "PLUS_Lab_GPUs", "DGX H100/H200 user guide", "DGX A100", "DGX B200 user guide",
                 "Uptime Institute", "EIA"):
        assert name in refs, name


def test_defaults_of_pue_and_price():
    opts = parse_train_options({"steps": 1})
    assert opts.power.pue == 1.58 and opts.cost.usd_per_kwh == 0.0806
    assert opts.power.switch_w is None and opts.power.host_w is None and opts.cost.amortisation_s is None


# ---------------------------------------------------------------- user figures
def test_gpu_power_overrides_only_the_states_named():
    opts = parse_train_options({"steps": 1, "gpu_power": {"memory": 450, "idle": 90}})
    p = opts.power.gpu_power("H100")
    assert p.watts["memory"] == 450 and p.watts["idle"] == 90 and p.watts["gemm"] == 700
    assert p.sources["memory"] == "user" and p.sources["gemm"] == GPU_POWER["H100"].sources["gemm"]
    busy = parse_train_options({"steps": 1, "gpu_power": {"busy": 500, "comm": 100}}).power.gpu_power("h100")
    assert all(busy.watts[k] == 500 for k in COMPUTE_KINDS) and busy.watts["comm"] == 100


def test_cli_gpu_power_pairs_and_triple():
    from dessim.cli.train_cmd import _gpu_power
    assert _gpu_power("memory=450, idle=90") == {"memory": 450.0, "idle": 90.0}
    assert _gpu_power("700,142,142") == {"busy": 700.0, "comm": 142.0, "idle": 142.0}
    with pytest.raises(DessimError, match="STATE=W"):
        _gpu_power("fast")


def test_figures_without_a_public_source_must_be_given():
    with pytest.raises(PowerError, match="--switch-power"):
        PowerModel().check(COUNTS)
    PowerModel(switch_w=0.0).check(COUNTS)
    with pytest.raises(PowerError, match="--host-power"):
        PowerModel().host_watts({0: "V100"})
    assert PowerModel(host_w=2500.0).host_watts({0: "V100"}) == 2500.0
    assert PowerModel().host_watts({0: "H100", 1: "B200"}) == pytest.approx((4600 + 6300) / 2)
    with pytest.raises(DessimError, match="amortisation"):
        CostModel(capex_per_gpu=25000.0)
    cost = CostModel(capex_per_gpu=25000.0, amortisation_s=4 * 365 * 86400.0)
    assert cost.breakdown(0.0, 365 * 86400.0, 8)["capex"] == pytest.approx(8 * 25000 / 4)
    with pytest.raises(SpecError, match="gpu_power"):
        parse_train_options({"steps": 1, "gpu_power": {"turbo": 1}})


def test_cli_names_the_missing_switch_power_before_simulating():
    res = CliRunner().invoke(cli, ["train", "gpt3-1.3b", "--steps", "10", "--topology", "dgx-h100:nodes=2"])
    assert res.exit_code == 2 and "--switch-power" in res.output and "Traceback" not in res.output
    assert math.isfinite(GPU_POWER["H100"].watts["idle"])


def test_merged_job_graphs_keep_their_kernel_mix():
    from dessim.workload.multijob import merge_graphs
    g = _kinds_graph()
    merged = merge_graphs("two", [("a", g, [0, 1]), ("b", g, [2, 3])])
    assert merged.kernel_mix == {"a/layer": g.kernel_mix["layer"], "b/layer": g.kernel_mix["layer"]}


def test_closed_form_tp_communication_is_priced_as_communication():
    """TP collectives timed in closed form run as compute tasks in the engine (delays, merged
    stage tasks); the energy still charges them as communication, so the default shortcut and
    the exact replay draw the same joules (before: 3998 J against 3591 J per iteration on
    gpt3-1.3b, TP 8 PP 2, 2 x DGX H100: the TP time at the board limit)."""
    from dessim.training_run import simulate_training_run
    opts = parse_train_options({"tokens": "1G", "restart": "5min", "rewarm": "1min", "switch_power": 0})
    layout = {"parallelism": {"tp": 8, "pp": 2}, "training": {"global_batch": 16}}
    runs = [simulate_training_run("gpt3-1.3b", "dgx-h100:nodes=2", opts,
                                  overrides={**layout, "generator": gen})
            for gen in ({}, {"granularity": "layer", "fold": False})]
    quick, exact = (r.summary() for r in runs)
    assert runs[0].iterations[0].taskgraph.meta["tp_closed_form_groups"] > 0
    assert quick["iteration_s"] == pytest.approx(exact["iteration_s"], rel=1e-12)
    assert quick["energy"]["per_iteration_j"] == pytest.approx(exact["energy"]["per_iteration_j"], rel=1e-9)
    for part in ("gpu_busy", "gpu_comm", "gpu_idle"):
        assert quick["energy"]["breakdown_j"][part] == pytest.approx(exact["energy"]["breakdown_j"][part], rel=1e-9)
