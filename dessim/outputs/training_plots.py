"""Plots of a whole training run (:mod:`dessim.training_run`): the time-to-train
distribution, goodput against the checkpoint interval and the energy breakdown, GPU compute by
kernel kind (PNG, Agg)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dessim.resources import check_output_dir, require_extra
from dessim.training_run.reliability import RenewalModel, daly_interval, young_interval
from dessim.training_run.run import TrainingRunResult

__all__ = ["write_training_plots", "goodput_curve"]


def _pyplot() -> Any:
    require_extra("plot", "training-run plots")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def goodput_curve(model: RenewalModel, points: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(intervals, expected goodput) of ``model``'s run for intervals from ``C/10`` (or 1 s)
    to ``100·√(2CM)``, log-spaced; seconds, fraction."""
    c = max(model.checkpoint_s, 1e-3)
    young = young_interval(c, model.mtbf_s) if math.isfinite(model.mtbf_s) else model.work_s
    lo, hi = max(c / 10, 1e-3), min(max(100 * young, 10 * c), max(model.work_s, 10 * c))
    taus = np.geomspace(lo, hi, points)
    good = np.array([RenewalModel(model.work_s, float(t), model.checkpoint_s, model.restart_s,
                                  model.mtbf_s).goodput() for t in taus])
    return taus, good


def _save(fig: Any, plt: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return str(path)


def write_training_plots(result: TrainingRunResult, directory: str | Path) -> list[str]:
    """Write ``time_to_train.png`` (when there are Monte Carlo samples),
    ``goodput_vs_interval.png`` and ``energy.png`` into ``directory``; their paths."""
    plt = _pyplot()
    out = check_output_dir(directory, "training-run plots directory")
    out.mkdir(exist_ok=True)        # only the last level, as every dessim output
    written = []
    s = result.summary()
    if result.samples is not None:
        days = result.samples.wall_s / 86400
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.hist(days, bins=40, color="#4c72b0", alpha=0.85)
        for p, style in zip((50, 90, 99), ("-", "--", ":")):
            ax.axvline(np.percentile(days, p), color="k", linestyle=style, label=f"P{p}")
        ax.axvline(s["time_to_train_s"] / 86400, color="#c44e52", label="closed-form expectation")
        ax.set_xlabel("time to train (days)")
        ax.set_ylabel("Monte Carlo runs")
        ax.set_title(f"{s['workload']} on {s['gpus']} GPUs: time to train")
        ax.legend()
        written.append(_save(fig, plt, out / "time_to_train.png"))
    # the curve of the simulated write (a run that takes no checkpoint charges none in its model)
    model = replace(result.model, checkpoint_s=result.checkpoint.write_s)
    taus, good = goodput_curve(model)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(taus / 60, 100 * good, label="renewal model (Daly 2006)")
    if math.isfinite(model.mtbf_s) and model.checkpoint_s > 0:
        for name, tau in (("Young", young_interval(model.checkpoint_s, model.mtbf_s)),
                          ("Daly", daly_interval(model.checkpoint_s, model.mtbf_s))):
            ax.axvline(tau / 60, linestyle="--", alpha=0.6, label=f"{name} {tau / 60:.1f} min")
    if math.isfinite(result.interval_s):      # inf: no checkpoint taken (nothing can fail)
        ax.axvline(result.interval_s / 60, color="k", alpha=0.5, label="chosen")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of useful work)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(f"goodput vs checkpoint interval (checkpoint {model.checkpoint_s:.3g} s, "
                 f"restart {model.restart_s:.3g} s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    written.append(_save(fig, plt, out / "goodput_vs_interval.png"))
    # GPU compute by kernel kind (gemm, attention, memory, other), then the other parts
    parts = {f"gpu {k}": v for k, v in s["energy"]["gpu_busy_by_kind_j"].items()}
    parts.update({k.replace("_", " "): v for k, v in s["energy"]["breakdown_j"].items()
                  if k != "gpu_busy"})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(parts)
    colors = ["#4c72b0" if n.startswith("gpu ") else "#55a868" for n in names]
    ax.bar(names, [parts[n] / 1e3 for n in names], color=colors)
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_ylabel("facility energy per iteration (kJ, PUE included)")
    ax.set_title(f"energy per iteration: {s['energy']['per_iteration_j'] / 1e3:,.1f} kJ, "
                 f"run {s['energy_run_mwh']:,.2f} MWh")
    written.append(_save(fig, plt, out / "energy.png"))
    return written
