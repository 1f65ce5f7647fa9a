"""Design-space sweeps: many simulated configurations compared in one table (docs/sweeps.md).

* :mod:`~dessim.sweep.axes` — quantity values, axis ranges, points and their stable keys;
* :mod:`~dessim.sweep.spec` — sweep YAML: validation, grid/zip combination of the axes;
* :mod:`~dessim.sweep.points` — the point evaluators (``workload``, ``collective``);
* :mod:`~dessim.sweep.runner` — local / Dask / Ray backends, resumable journal, progress;
* :mod:`~dessim.sweep.analysis` — best per group, spread, cost, Pareto front, plots.
"""

from __future__ import annotations

from dessim.sweep.points import EVALUATORS, Evaluator, evaluate_task
from dessim.sweep.axes import Axis, Point, expand_axis
from dessim.sweep.spec import SweepSpec, load_sweep, parse_sweep

__all__ = ["EVALUATORS", "Evaluator", "evaluate_task", "Axis", "Point", "SweepSpec", "expand_axis",
           "load_sweep", "parse_sweep", "run_sweep", "SweepResult", "BACKENDS"]


def __getattr__(name: str):  # runner pulls in pandas/tqdm: import it only when asked for
    if name in ("run_sweep", "SweepResult", "BACKENDS"):
        from dessim.sweep import runner
        return getattr(runner, name)
    raise AttributeError(name)
