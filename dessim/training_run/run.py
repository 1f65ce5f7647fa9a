"""From one iteration to a whole training run: :func:`simulate_training_run`.

Pipeline (docs/training-run.md):

1. The iteration is simulated with :func:`dessim.workload.simulate_workload` once per
   distinct *health state* — the engine options as given (state 0) and, with
   ``health_states = K > 1``, ``K − 1`` further draws of the engine's noise (per-rank
   stragglers and per-task kernel jitter, ``noise.seed + i``) — never once per step.
2. Steps = ⌈tokens / tokens per iteration⌉ (or ``steps``); useful seconds ``W = steps · T``.
3. Checkpoint size from the memory model, write and restore times simulated as transfers
   to the storage tier (:mod:`dessim.training_run.checkpoint`).
4. Job failure rate ``Σ count · rate`` over the topology's components
   (:mod:`dessim.training_run.failures`); restart ``R = restart + restore + rewarm``; the
   checkpoint interval by Young, Daly, the exact optimum or as given, rounded to a whole
   number of iterations (checkpoints are taken between steps). When nothing can fail, the
   rules' interval is infinite: no checkpoint is taken or charged (a given interval still
   is).
5. Closed-form expectation of the renewal model (:mod:`dessim.training_run.reliability`)
   and a seeded Monte Carlo over failure arrivals and health states
   (:mod:`dessim.training_run.montecarlo`): P50/P90/P99 of time to train.
6. "What if rank r were healthy": when some rank is slowed (``noise``), the slowest health
   state is re-simulated with each of its ``attribute`` slowest ranks at full speed.
7. Energy (:mod:`dessim.training_run.power`) and cost (:mod:`dessim.training_run.cost`):
   useful and lost work at the iteration's mean power; restarts and checkpoint writes at the
   cluster's idle power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dessim.engine import EngineOptions
from dessim.engine.engine import straggler_factors
from dessim.errors import DessimError
from dessim.topology import load_topology
from dessim.topology.graph import Topology
from dessim.training_run.checkpoint import (CheckpointTimes, checkpoint_bytes, checkpoint_times,
                                            default_storage_bw, planned_checkpoint_bytes)
from dessim.training_run.failures import ComponentCounts, count_components, job_failure_rate
from dessim.training_run.montecarlo import RunSamples, sample_runs
from dessim.training_run.options import TrainOptions
from dessim.training_run.power import IterationEnergy, iteration_energy
from dessim.training_run.reliability import RenewalModel, daly_interval, optimal_interval, young_interval
from dessim.units import format_time
from dessim.workload.api import simulate_workload
from dessim.workload.common.figures import closed_form_tp_by_rank

__all__ = ["simulate_training_run", "TrainingRunResult", "QUANTILES"]

#: Percentiles reported for Monte Carlo figures.
QUANTILES: tuple[int, ...] = (50, 90, 99)

#: Checkpoint-interval rules: (checkpoint seconds, MTBF seconds) → interval seconds.
_RULES = {"young": young_interval, "daly": daly_interval, "optimal": optimal_interval}


@dataclass
class TrainingRunResult:
    """A whole run: the iteration results per health state and every derived figure."""

    options: TrainOptions
    iterations: list[Any]            #: workload results, health state 0 first
    counts: ComponentCounts
    checkpoint: CheckpointTimes
    steps: int
    tokens_per_iteration: float
    interval_s: float                #: useful seconds between checkpoints; inf: none taken
    restart_total_s: float
    model: RenewalModel
    rates_per_s: dict[str, float]
    energy: IterationEnergy
    samples: RunSamples | None
    iteration_summary: dict[str, Any]    #: ``summary()`` of health state 0 (computed once)
    attribution: list[dict[str, float]] = field(default_factory=list)

    @property
    def iteration_times(self) -> np.ndarray:
        return np.array([r.iteration_s for r in self.iterations])

    @property
    def nominal(self) -> Any:
        return self.iterations[0]

    def run_energy_j(self, wall_s: float, lost_s: float, restart_s: float, checkpoint_s: float,
                     work_s: float) -> float:
        """Facility joules of a run: work and lost work at the iteration's mean power,
        restarts and checkpoint writes at idle power."""
        return self.energy.mean_w * (work_s + lost_s) + self.energy.idle_cluster_w * (restart_s + checkpoint_s)

    def _expected(self) -> dict[str, float]:
        m = self.model
        wall = m.expected_wall_s()
        return {"wall_s": wall, "failures": m.expected_failures(), "lost_s": m.expected_lost_s(),
                "restart_s": m.expected_restart_s(), "checkpoint_s": m.checkpoints * m.checkpoint_s,
                "goodput": m.goodput()}

    def _monte_carlo(self) -> dict[str, Any] | None:
        s = self.samples
        if s is None:
            return None

        def q(x: np.ndarray) -> dict[str, float]:
            return {"mean": float(np.mean(x)), **{f"p{p}": float(np.percentile(x, p)) for p in QUANTILES}}

        energy = self.run_energy_j(s.wall_s, s.lost_s, s.restart_s, s.checkpoint_s, s.work_s)
        return {"samples": len(s.wall_s), "mc_seed": self.options.mc_seed, "time_to_train_s": q(s.wall_s),
                "goodput": q(s.goodput), "failures": q(s.failures.astype(float)), "lost_s": q(s.lost_s),
                "energy_run_mwh": q(energy / 3.6e9)}

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures (SI units: seconds, bytes, joules, watts; MWh and USD named)."""
        it = self.iteration_summary
        exp = self._expected()
        e = self.energy
        run_j = self.run_energy_j(exp["wall_s"], exp["lost_s"], exp["restart_s"], exp["checkpoint_s"],
                                  self.model.work_s)
        gpus = self.counts.gpu
        cost = self.options.cost.breakdown(run_j, exp["wall_s"], gpus)
        times = self.iteration_times
        return {
            "workload": it["workload"], "gpus": gpus, "device": it["device"],
            "iteration_s": self.nominal.iteration_s,
            "tokens_per_iteration": self.tokens_per_iteration,
            "steps": self.steps, "tokens": self.steps * self.tokens_per_iteration,
            "useful_s": self.model.work_s,
            "time_to_train_s": exp["wall_s"], "goodput": exp["goodput"],
            "expected_failures": exp["failures"],
            "energy_run_mwh": run_j / 3.6e9, "energy_per_token_j": (e.total_j / self.tokens_per_iteration
                                                                   if self.tokens_per_iteration else 0.0),
            "cost_usd": sum(cost.values()),
            "expected": exp,
            "monte_carlo": self._monte_carlo(),
            "health": {"states": len(times), "iteration_s": {
                "mean": float(times.mean()), **{f"p{p}": float(np.percentile(times, p)) for p in QUANTILES}},
                "attribution": self.attribution},
            "checkpoint": {"bytes": self.checkpoint.bytes, "write_s": self.checkpoint.write_s,
                           "restore_s": self.checkpoint.restore_s, "storage": self.checkpoint.storage,
                           # None: no checkpoint taken (a rule when nothing can fail)
                           "interval_s": _finite(self.interval_s),
                           "every_steps": (round(self.interval_s / self.nominal.iteration_s)
                                           if math.isfinite(self.interval_s) else None),
                           "count": self.model.checkpoints if math.isfinite(self.interval_s) else 0,
                           "rule": (self.options.checkpoint_interval
                                    if isinstance(self.options.checkpoint_interval, str) else "given"),
                           "young_s": _finite(young_interval(max(self.checkpoint.write_s, 1e-300), self.model.mtbf_s)),
                           "daly_s": _finite(daly_interval(max(self.checkpoint.write_s, 1e-300), self.model.mtbf_s))},
            "restart_s": self.restart_total_s,
            "failures": {"mtbf_s": _finite(self.model.mtbf_s), "rate_per_s": dict(self.rates_per_s),
                         "components": self.counts.as_dict()},
            "energy": {"per_iteration_j": e.total_j, "mean_power_w": e.mean_w, "idle_power_w": e.idle_cluster_w,
                       "pue": e.pue, "breakdown_j": e.breakdown(), "gpu_busy_by_kind_j": e.busy_by_kind()},
            "cost": cost,
        }


#: Top-level keys of :meth:`TrainingRun.summary` (sweeps check metric names against them
#: before running; tests/test_training_run.py checks they are the summary's keys).
SUMMARY_KEYS: tuple[str, ...] = (
    "workload", "gpus", "device", "iteration_s", "tokens_per_iteration", "steps", "tokens",
    "useful_s", "time_to_train_s", "goodput", "expected_failures", "energy_run_mwh",
    "energy_per_token_j", "cost_usd", "expected", "monte_carlo", "health", "checkpoint",
    "restart_s", "failures", "energy", "cost")


def _finite(x: float) -> float | None:
    """JSON has no infinity: None stands for 'never' (no failures)."""
    return x if math.isfinite(x) else None


def _attribution(workload: Any, topo: Topology, overrides: Any, engine: EngineOptions, k: int,
                 slow: Any) -> list[dict[str, float]]:
    """Iteration time of the slowest health state with each of its ``k`` slowest ranks healthy."""
    factors = straggler_factors(topo.num_gpus, engine.noise)
    order = sorted(range(len(factors)), key=lambda r: (-factors[r], r))[:k]
    out = []
    for r in order:
        if factors[r] <= 1.0:
            break
        noise = replace(engine.noise, slowdown={**engine.noise.slowdown,
                                                 r: engine.noise.slowdown.get(r, 1.0) / factors[r]})
        healed = simulate_workload(workload, topo, overrides=overrides, options=replace(engine, noise=noise))
        out.append({"rank": r, "slowdown": factors[r], "iteration_s_if_healthy": healed.iteration_s,
                    "saved_s": slow.iteration_s - healed.iteration_s})
    return out


def _devices(result: Any, topo: Topology, engine: EngineOptions) -> dict[int, str]:
    plan = getattr(result, "plan", None)
    devs = plan.devices if plan is not None else getattr(result, "devices", None)
    if devs:
        return dict(enumerate(devs))
    return {r: topo.device(r) or engine.device or "" for r in range(topo.num_gpus)}


def simulate_training_run(workload: str | Path | Any, topology: Topology | str, options: TrainOptions, *,
                          overrides: Mapping[str, Any] | None = None,
                          engine: EngineOptions | None = None) -> TrainingRunResult:
    """Simulate ``workload`` on ``topology`` for a whole run (module docstring). Raises a
    :class:`~dessim.errors.DessimError` for bad input before the Monte Carlo starts."""
    engine = replace(engine or EngineOptions(), record_links=False)
    topo = load_topology(topology)
    noise = engine.noise
    if options.health_states > 1 and noise.straggler_sigma <= 0 and noise.kernel_jitter_sigma <= 0:
        raise DessimError(f"health states {options.health_states} (--health-states; train.health_states): the draws need "
                          "noise.straggler_sigma > 0 (--straggler-sigma) or noise.kernel_jitter_sigma > 0 "
                          "(--kernel-jitter-sigma)")
    counts = count_components(topo)
    # figures the run needs and nobody gave, before any simulation: all of them in one error
    rates = job_failure_rate(counts, options.failure_rates)
    total_rate = sum(rates.values())
    checks = [lambda: options.power.check(counts)]
    if total_rate > 0:
        checks.append(options.check_restart)
    missing: list[DessimError] = []
    for check in checks:
        try:
            check()
        except DessimError as exc:
            missing.append(exc)
    if len(missing) == 1:
        raise missing[0]
    if missing:
        raise DessimError("train needs figures that have no public default:\n  - "
                          + "\n  - ".join(str(e) for e in missing))
    storage_bw = options.storage_bw if options.storage_bw is not None else default_storage_bw(topo.num_gpus)
    nbytes = (options.checkpoint_bytes if options.checkpoint_bytes is not None
              else planned_checkpoint_bytes(workload, overrides, topo.num_gpus))
    # the transfers first: their network state is freed before the iteration's simulation
    ckpt = checkpoint_times(topo, nbytes, storage_bw) if nbytes is not None else None
    # the energy model reads every task's activity: replay every micro-batch (no extrapolation)
    overrides = {**(overrides or {}), "extrapolate": False}
    iterations = [simulate_workload(workload, topo, overrides=overrides, options=engine)]
    if not hasattr(iterations[0], "summary") or not hasattr(iterations[0], "iteration_s"):
        raise DessimError("train: this workload kind has no iteration result to scale")
    engines = [engine]
    for i in range(1, options.health_states):
        e = replace(engine, noise=replace(engine.noise, seed=engine.noise.seed + i))
        engines.append(e)
        iterations.append(simulate_workload(workload, topo, overrides=overrides, options=e))
    nominal = iterations[0]
    it_summary = nominal.summary()
    tpi = float(it_summary["tokens_per_s"]) * float(it_summary["iteration_s"])
    if options.tokens is not None:
        if tpi <= 0:
            raise DessimError(f"train: workload {it_summary['workload']!r} has no tokens per "
                              "iteration; give steps instead of tokens")
        steps = math.ceil(options.tokens / tpi)
    else:
        steps = int(options.steps)
    if ckpt is None:
        ckpt = checkpoint_times(topo, checkpoint_bytes(nominal), storage_bw)
    mtbf = 1.0 / total_rate if total_rate > 0 else math.inf
    restart = (options.restart_s or 0.0) + ckpt.restore_s + (options.rewarm_s or 0.0)
    work = steps * nominal.iteration_s
    ci = options.checkpoint_interval
    interval = _RULES[ci](ckpt.write_s, mtbf) if isinstance(ci, str) else float(ci)
    if not isinstance(ci, str) and interval < nominal.iteration_s * (1 - 1e-3):
        # within the 4 digits printed of the iteration time, the interval is one iteration
        raise DessimError(f"checkpoint interval {format_time(interval)} (--checkpoint-interval; "
                          f"train.checkpoint_interval) is shorter than one iteration "
                          f"({format_time(nominal.iteration_s)}): checkpoints are taken between steps; "
                          f"give {format_time(nominal.iteration_s)} (a checkpoint after every step) or "
                          f"more, or a rule ({', '.join(_RULES)})")
    # checkpoints are taken between steps: a whole number of iterations, at most the run
    write = ckpt.write_s
    if math.isfinite(interval):
        every = max(1, min(steps, round(interval / nominal.iteration_s)))
        interval = every * nominal.iteration_s
    else:
        # a rule when nothing can fail: the optimal interval is infinite, no checkpoint is
        # taken (interval stays inf), the model's one segment charges no write
        every, write = steps, 0.0
    model = RenewalModel(work, every * nominal.iteration_s, write, restart, mtbf)
    if model.goodput() < 1e-3:
        # name what takes the time: the checkpoints alone (goodput if nothing failed), and/or
        # the failures (they at least halve what the checkpoints leave)
        alone = replace(model, mtbf_s=math.inf).goodput()
        causes = ([f"the checkpoint interval (--checkpoint-interval) and size (--checkpoint-size): "
                   f"without failures goodput would be {alone:.2e}"] if alone < 0.5 else []) + \
                 (["the MTBFs (--mtbf) and restart times"] if model.goodput() < alone / 2 else [])
        mtbf_text = format_time(mtbf) if math.isfinite(mtbf) else "never"
        raise DessimError(f"train: the run would hardly progress: job MTBF {mtbf_text} against a restart "
                          f"of {format_time(restart)} and checkpoints of {format_time(write)} every "
                          f"{format_time(model.interval_s)} (expected goodput {model.goodput():.2e}); check "
                          + "; and ".join(causes))
    energy = iteration_energy(nominal.simulation, _devices(nominal, topo, engine), counts, options.power,
                              closed_form_tp_by_rank(nominal.simulation, nominal.taskgraph)
                              if nominal.taskgraph.meta.get("tp_closed_form_groups") else None)
    samples = None
    if options.samples:
        rng = np.random.default_rng(options.mc_seed)
        state = rng.integers(len(iterations), size=options.samples)
        works = steps * np.array([r.iteration_s for r in iterations])[state]
        samples = sample_runs(works, model.interval_s, write, restart, mtbf, options.samples,
                              seed=options.mc_seed + 1)
    attribution: list[dict[str, float]] = []
    if options.attribute and engine.noise.active:
        worst = max(range(len(iterations)), key=lambda i: (iterations[i].iteration_s, -i))
        attribution = _attribution(workload, topo, overrides, engines[worst], options.attribute, iterations[worst])
    return TrainingRunResult(options, iterations, counts, ckpt, steps, tpi, interval, restart, model,
                             rates, energy, samples, it_summary, attribution)
