"""Steady-state micro-batch extrapolation: the summary of an iteration with many micro-batches
from three short runs of the same layout (issue 17).

Why it holds
    A pipeline schedule with ``m`` micro-batches is a warm-up, a steady phase that repeats
    one pattern per micro-batch (per ``p`` micro-batches for interleaved and bidirectional
    schedules: :mod:`dessim.workload.transformer.schedules`) and a cool-down followed by the
    gradient reduction and the optimizer step, which do not depend on ``m``. Past the
    warm-up, one more period of micro-batches adds the same tasks, the same events and the
    same time to every per-iteration figure: the iteration time, the exposed communication
    of each kind, the compute time, the pipeline window and the working time inside it, the
    task and event counts are affine in ``m`` over counts ``≡ m (mod s)``.

What is run
    With ``s = pp`` (a multiple of every schedule's period; it keeps interleaved schedules'
    ``m % p == 0`` and DualPipe's even ``m``), ``m1`` the smallest count ``≥ max(2·pp, 4)``
    with ``m1 ≡ m (mod s)`` (past every schedule's warm-up of at most ``2p − 1`` passes,
    and DualPipe's ``m ≥ 2p``), the same plan is simulated at ``m1``, ``m1 + s`` and
    ``m1 + 2s`` micro-batches (the global batch scaled, nothing else changed). Every figure
    ``f`` of the three summaries must be

    * the same in all three (memory, parameter counts, layout, shortcuts taken...), taken as is;
    * or a number whose two differences agree well enough to extrapolate (below), extrapolated
      to ``f(m) = f3 + k · (f3 − f1)/2`` with ``k = (m − m3)/s`` periods to go (whole numbers:
      equal differences, exactly);

    anything else (a figure that differs but is not a number, keys that differ, a memory
    estimate unlike the full plan's) refuses. Counters of the simulation's own work
    (:data:`COUNTERS`: engine events, memo and lane-family runs) are summed over the runs. A
    failed check slides the window one step on (``m1 + s, m1 + 2s, m1 + 3s``: one more run,
    two reused) while the budget allows; the derived figures (tokens/s, model and hardware
    FLOP/s, MFU, HFU, the bubble fraction, the total exposed communication, the lane skew
    relative to the iteration) are recomputed from the extrapolated ones and the full plan
    exactly as :meth:`WorkloadResult.summary
    <dessim.workload.transformer.result.WorkloadResult.summary>` derives them.

The check and its error bound
    The two differences ``d1 = f2 − f1`` and ``d2 = f3 − f2`` estimate the figure's slope per
    period; in a steady state they are equal, and ``|d2 − d1|`` bounds how far the slope is
    still from settled. Carried over the ``k`` periods to ``m``, a slope off by that much
    moves the extrapolated figure by ``k·|d2 − d1|``; the check requires
    ``k·|d2 − d1| ≤ ERROR_BOUND · |f(m)|`` for every figure and, for a time figure
    (:data:`TIMES`, seconds), also ``≤ TIME_BOUND · T(m)``, ``T(m)`` the extrapolated
    iteration time: every figure is good to :data:`ERROR_BOUND` (0.1 %, what issue 17 allows
    a shortcut against the full replay) of itself, and the iteration time and its parts to
    :data:`TIME_BOUND` (1e-4) of the iteration. This holds under the
    premise the check tests: that the slope does not drift further (a transient that still
    decays, such as pipeline stages whose transfers share links and settle into step over a
    few periods, only drifts less). Layouts whose steady phase repeats exactly agree with the
    full replay far closer (to rounding, 1e-11 on explore's table, docs/performance.md). Every
    output that shows extrapolated figures says so, with the bound, and ``extrapolate=False``
    (``--no-extrapolate``, ``--exact``) replays every micro-batch.

When it applies (:func:`applies`)
    Only where the caller needs summary figures, not per-task records (the result has no
    task graph or engine result to write timelines from): sweeps and ``dessim explore``,
    ``dessim simulate`` without a per-task output. Only with micro-batches to spare: all
    attempts together simulate at most :data:`BUDGET` (a third) of the full run's
    micro-batches (the first needs ``3·(m1 + s) ≤ m/3``). The runs' cost grows about
    linearly with their micro-batches, so an accepted extrapolation costs about a third of
    the full replay or less (plus the runs' fixed costs: set-up, gradient reduction,
    optimizer), and a refused one at most a third more than the full replay alone; a retry is
    made only while this still holds. Never with per-task random draws (``noise.kernel_jitter_sigma``:
    every task's draw depends on the order all tasks started in).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from numbers import Real
from typing import Any, Callable, Sequence

from dessim.engine import EngineOptions, simulate
from dessim.errors import DessimError
from dessim.topology.graph import Topology
from dessim.workload.common.figures import rate_figures
from dessim.workload.transformer.flops import hardware_flops_per_iteration, model_flops_per_iteration
from dessim.workload.transformer.generator import WorkloadPlan, build_taskgraph
from dessim.workload.transformer.memory import estimate_memory
from dessim.workload.transformer.result import BubbleFigures, WorkloadResult, bubble_figures, layout_summary

__all__ = ["ERROR_BOUND", "TIME_BOUND", "TIMES", "BUDGET", "COUNTERS", "NotSteady", "ExtrapolatedResult", "applies", "first_count",
           "simulate_steady", "describe"]

#: The relative error an extrapolated figure may carry (module docstring, the check): the
#: 0.1 % issue 17 allows a shortcut against the full replay.
ERROR_BOUND = 1e-3
#: The error a time figure (:data:`TIMES`) may carry, relative to the iteration time.
TIME_BOUND = 1e-4
#: Figures in seconds (dotted paths; a path names the entry and everything under it), checked
#: against the iteration time (module docstring).
TIMES = ("iteration_s", "compute_s", "exposed_comm_s", "exposed_comm_total_s", "fold.max_lane_skew_s")
#: All attempts together simulate at most this share of the full run's micro-batches.
BUDGET = 1 / 3
#: Counters of the simulation's own work (engine events, shortcut runs, memo hits), not
#: figures of the iteration: summed over the short runs (what was simulated), never
#: extrapolated. Dotted paths; a path names the entry and everything under it.
COUNTERS = ("events", "shortcuts.merged_image_runs", "shortcuts.lane_family_runs",
            "shortcuts.lane_orbit_runs", "shortcuts.collective_memo",
            "shortcuts.channel_quotient.splits", "fold.merged_image_runs", "fold.lane_family_runs",
            "fold.lane_orbit_runs", "fold.channel_quotient.splits", "stream_rings")
#: Summary entries recomputed from the extrapolated figures and the full plan, not combined.
DERIVED = ("tokens_per_s", "samples_per_s", "model_flops", "hardware_flops", "model_tflops_per_gpu",
           "hardware_tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "layout", "wall_s")
#: Nested entries recomputed likewise (dotted paths).
DERIVED_NESTED = ("fold.max_lane_skew_rel",)
#: The summary entry of the raw bubble figures while combining (removed afterwards).
_BUBBLE = "_bubble"


class NotSteady(DessimError):
    """The three short runs do not show one steady state (the message names the figure)."""


def _aligned(low: int, m: int, step: int) -> int:
    """The smallest count ``≥ low`` and ``≡ m (mod step)``."""
    return low + (m - low) % step


def first_count(m: int, step: int, pp: int) -> int:
    """The smallest micro-batch count ``≥ max(2·pp, 4)`` and ``≡ m (mod step)``."""
    return _aligned(max(2 * pp, 4), m, step)


def _within_budget(m: int, simulated: int) -> bool:
    """Whether ``simulated`` micro-batches in all stay within :data:`BUDGET` of ``m``."""
    return simulated <= BUDGET * m


def applies(plan: WorkloadPlan, engine: EngineOptions | None) -> bool:
    """Whether the extrapolation is to be tried for ``plan`` (module docstring)."""
    if plan.options.extrapolate is False:
        return False
    if engine is not None and engine.noise.kernel_jitter_sigma > 0:
        return False
    lo = plan.layout
    m, step = lo.num_micro_batches, lo.pp
    return _within_budget(m, 3 * (first_count(m, step, lo.pp) + step))


def _with_micro_batches(plan: WorkloadPlan, count: int) -> WorkloadPlan:
    """``plan`` at ``count`` micro-batches: the global batch scaled, nothing else changed."""
    lo = plan.layout
    layout = replace(lo, global_batch=count * lo.micro_batch * lo.dp)
    layout.validate(plan.model, plan.num_gpus)
    return replace(plan, layout=layout, estimate=estimate_memory(plan.model, layout, plan.memory),
                   options=replace(plan.options, extrapolate=False))


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _total(path: str, values: Sequence[Any]) -> Any:
    """A counter summed over the runs (:data:`COUNTERS`): numbers added, mappings per key,
    anything else equal in all runs."""
    first = values[0]
    if all(isinstance(v, dict) for v in values):
        if any(list(v) != list(first) for v in values[1:]):
            raise NotSteady(f"{path}: the runs report different entries")
        return {k: _total(f"{path}.{k}", [v[k] for v in values]) for k in first}
    if all(_is_number(v) for v in values):
        return sum(values)
    if any(v != first for v in values[1:]):
        raise NotSteady(f"{path} differs between the runs ({', '.join(map(repr, values))})")
    return first


def _under(path: str, names: Sequence[str]) -> bool:
    """Whether dotted ``path`` is one of ``names`` or inside one of them."""
    return any(path == n or path.startswith(n + ".") for n in names)


def _combine(path: str, values: Sequence[Any], periods: int, iteration: float) -> Any:
    """One summary entry at ``m`` from its values at ``m1, m2, m3`` (module docstring);
    ``periods = (m − m3)/s``; ``iteration``: the extrapolated iteration time, seconds (the
    scale of :data:`TIMES`). :data:`COUNTERS` are summed instead."""
    if path in COUNTERS:
        return _total(path, values)
    if path in DERIVED_NESTED:
        return None                               # recomputed by the caller
    first = values[0]
    if all(isinstance(v, dict) for v in values):
        keys = list(first)
        if any(list(v) != keys for v in values[1:]):
            raise NotSteady(f"{path}: the runs report different entries")
        return {k: _combine(f"{path}.{k}" if path else k, [v[k] for v in values], periods,
                             iteration)
                for k in keys}
    if all(type(v) is type(first) and v == first for v in values[1:]):
        return first
    if not all(_is_number(v) for v in values):
        raise NotSteady(f"{path} differs between the runs ({', '.join(map(repr, values))}) and "
                        "is not a number")
    f1, f2, f3 = values
    d1, d2 = f2 - f1, f3 - f2
    if all(isinstance(v, int) for v in values):
        if d1 != d2:
            raise NotSteady(f"{path} is not affine in the micro-batches: {f1}, {f2}, {f3}")
        return f3 + periods * d2
    extrapolated = f3 + periods * (f3 - f1) / 2
    drift = periods * abs(d2 - d1)        # how far a slope still off by |d2 − d1| carries it
    bounds = [(ERROR_BOUND, abs(extrapolated), "the figure")]
    if _under(path, TIMES):
        bounds.append((TIME_BOUND, iteration, "the iteration time"))
    for bound, scale, of in bounds:
        if drift > bound * scale:
            raise NotSteady(f"{path} is not steady in the micro-batches: {f1!r}, {f2!r}, {f3!r} "
                            f"(differences {d1!r}, {d2!r}: {periods} periods on, up to "
                            f"{drift / scale if scale else float('inf'):.2g} of {of}, above {bound:g})")
    return extrapolated


def describe(ext: dict[str, Any]) -> str:
    """One sentence for reports: what was simulated and what the figures are."""
    sims = ", ".join(str(c) for c in ext["simulated_micro_batches"])
    return (f"micro-batches {sims} simulated, figures extrapolated to {ext['micro_batches']} "
            f"from a checked steady state (approximate: each within {ext['error_bound']:.1%} of "
            f"itself, times within {ext['time_bound']:g} of the iteration)")


@dataclass
class ExtrapolatedResult:
    """One iteration's summary extrapolated from short runs (module docstring): ``plan`` is
    the full plan, ``runs`` the three short runs, ``counts`` their micro-batches, ``step``
    the period, ``retries`` why earlier attempts were refused. Has no task graph or engine
    result of the full iteration: :attr:`taskgraph` and :attr:`simulation` raise."""

    plan: WorkloadPlan
    runs: tuple[WorkloadResult, ...]
    counts: tuple[int, ...]
    step: int
    auto: bool
    retries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._summary = self._extrapolate()       # raises NotSteady before anyone uses it

    def _missing(self, what: str) -> DessimError:
        return DessimError(f"workload {self.plan.name!r}: this result's figures are extrapolated "
                           f"from {', '.join(map(str, self.counts))} micro-batches and it has no "
                           f"{what} of the full iteration; simulate with extrapolate=False "
                           "(--no-extrapolate or --exact) for per-task records")

    @property
    def taskgraph(self) -> Any:
        raise self._missing("task graph")

    @property
    def simulation(self) -> Any:
        raise self._missing("engine result")

    @property
    def iteration_s(self) -> float:
        return float(self._summary["iteration_s"])

    def _extrapolate(self) -> dict[str, Any]:
        plan, m = self.plan, self.plan.layout.num_micro_batches
        periods = (m - self.counts[-1]) // self.step
        summaries = []
        for run in self.runs:
            s = run.summary()
            b = bubble_figures(run.simulation)
            s[_BUBBLE] = {"busy_s": b.busy_s, "window_s": b.window_s, "ranks": b.ranks}
            summaries.append(s)
        order = list(summaries[-1])
        t1, _, t3 = (s["iteration_s"] for s in summaries)
        combined = _combine("", [{k: v for k, v in s.items() if k not in DERIVED} for s in summaries],
                            periods, abs(t3 + periods * (t3 - t1) / 2))
        raw = combined.pop(_BUBBLE)
        it = combined["iteration_s"]
        lo, model = plan.layout, plan.model
        f_model = model_flops_per_iteration(model, lo.global_batch)
        f_hw = hardware_flops_per_iteration(model, lo.global_batch, lo.recompute)
        derived = {**rate_figures(it, lo.global_batch, model.seq_len, f_model, f_hw, plan.num_gpus,
                                  plan.peak_flops()),
                   "bubble_fraction": BubbleFigures(raw["busy_s"], raw["window_s"], raw["ranks"]).fraction,
                   "layout": layout_summary(plan),
                   "wall_s": sum(s["wall_s"] for s in summaries)}
        fold = combined.get("fold")
        if fold and "max_lane_skew_s" in fold:
            fold["max_lane_skew_rel"] = fold["max_lane_skew_s"] / it if it > 0 else 0.0
        out = {k: derived[k] if k in derived else combined[k] for k in order if k != _BUBBLE}
        out["extrapolation"] = {"micro_batches": m, "simulated_micro_batches": list(self.counts),
                                "step": self.step, "error_bound": ERROR_BOUND,
                                "time_bound": TIME_BOUND,
                                "auto": self.auto,
                                "retries": list(self.retries)}
        return out

    def summary(self) -> dict[str, Any]:
        """The summary of the full iteration (the keys of ``WorkloadResult.summary()``) with
        ``extrapolation``: the micro-batches of the full iteration and of the simulated runs,
        the step, the error bounds of the check,
        whether it was chosen automatically, refused attempts."""
        return copy.deepcopy(self._summary)


def simulate_steady(plan: WorkloadPlan, topology: Topology, engine: EngineOptions,
                    run: Callable[[WorkloadPlan], WorkloadResult] | None = None
                    ) -> ExtrapolatedResult | str:
    """The extrapolated result of ``plan`` (which :func:`applies`), or why it was refused
    (the caller then replays every micro-batch). ``run`` simulates one short plan (default:
    generate its task graph and simulate it with ``engine``)."""
    lo = plan.layout
    m, step = lo.num_micro_batches, lo.pp
    m1 = first_count(m, step, lo.pp)
    def replay(short: WorkloadPlan) -> WorkloadResult:
        graph = build_taskgraph(short, topology, engine=engine)
        return WorkloadResult(short, graph, simulate(graph, topology, engine))

    simulate_one = run or replay
    done: dict[int, WorkloadResult] = {}
    simulated = 0                         # micro-batches simulated by every attempt so far
    retries: list[str] = []
    while _within_budget(m, simulated + sum(c for c in (m1, m1 + step, m1 + 2 * step) if c not in done)):
        counts = (m1, m1 + step, m1 + 2 * step)
        for c in [c for c in done if c not in counts]:
            del done[c]                   # left behind by the sliding window: free its graph
        plans = {c: _with_micro_batches(plan, c) for c in counts if c not in done}
        for c, short in plans.items():    # m-independent figures first, before any simulation
            if short.estimate.breakdown() != plan.estimate.breakdown() \
                    or short.estimate.stage != plan.estimate.stage:
                return (f"the memory estimate at {c} micro-batches differs from the one at {m} "
                        "(the schedule holds activations in proportion to the micro-batches)")
        for c, short in plans.items():
            done[c] = simulate_one(short)
            simulated += c
        try:
            return ExtrapolatedResult(plan, tuple(done[c] for c in counts), counts, step,
                                      plan.options.extrapolate is None, tuple(retries))
        except NotSteady as exc:
            retries.append(f"at micro-batches {', '.join(map(str, counts))}: {exc}")
        m1 += step                        # slide the window: one more run, two reused
    return ("no steady state within the micro-batch budget (" + "; ".join(retries) + ")"
            if retries else "too few micro-batches")
