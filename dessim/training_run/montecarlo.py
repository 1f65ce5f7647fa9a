"""Monte Carlo of a whole run over failure arrivals: the process of
:mod:`dessim.training_run.reliability`, sampled instead of averaged (seconds).

Every sample runs the same renewal process: segments of ``interval_s`` useful seconds each
followed by a ``checkpoint_s`` write; failure gaps are i.i.d. exponential of mean ``mtbf_s``
(also during writes and restarts); a failure loses the work since the last completed
checkpoint and starts a restart of ``restart_s`` that a further failure starts over.
Samples are stepped together, one failure per round (numpy, vectorised), so a run with a
few hundred failures and a thousand samples takes a few hundred array operations. Each
sample may have its own useful work (``work_s`` an array: one health state per sample).

Seeded with :func:`numpy.random.default_rng`: the same seed gives the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dessim.training_run.reliability import ReliabilityError, RenewalModel

__all__ = ["RunSamples", "sample_runs", "MAX_EXPECTED_FAILURES"]

#: Runs expecting more failures than this are refused (each costs one vectorised round).
MAX_EXPECTED_FAILURES = 1e5


@dataclass(frozen=True)
class RunSamples:
    """Per-sample outcomes (numpy arrays of equal length; seconds, counts)."""

    wall_s: np.ndarray          #: elapsed wall time of the run
    work_s: np.ndarray          #: useful seconds of the run
    failures: np.ndarray        #: failures during the run (incl. during restarts)
    restart_s: np.ndarray       #: time spent restarting
    checkpoint_s: np.ndarray    #: time of completed checkpoint writes

    @property
    def lost_s(self) -> np.ndarray:
        """Work and checkpoint writes redone after failures."""
        return np.maximum(self.wall_s - self.work_s - self.checkpoint_s - self.restart_s, 0.0)

    @property
    def goodput(self) -> np.ndarray:
        return np.where(self.wall_s > 0, self.work_s / np.where(self.wall_s > 0, self.wall_s, 1.0), 1.0)


def sample_runs(work_s: float | np.ndarray, interval_s: float, checkpoint_s: float, restart_s: float,
                mtbf_s: float, samples: int, seed: int = 0) -> RunSamples:
    """``samples`` runs of the renewal process (module docstring); ``work_s`` a float or one
    value per sample. Parameters are checked as :class:`RenewalModel` checks them."""
    work = np.broadcast_to(np.asarray(work_s, dtype=float), (samples,)).copy()
    for w in np.unique(work):
        failures = RenewalModel(float(w), interval_s, checkpoint_s, restart_s, mtbf_s).expected_failures()
        if failures > MAX_EXPECTED_FAILURES:
            raise ReliabilityError(f"Monte Carlo: {failures:.3g} failures expected per run (MTBF {mtbf_s:g} s "
                                   f"against segments of {interval_s + checkpoint_s:g} s and restarts of "
                                   f"{restart_s:g} s); the run would hardly progress — more than "
                                   f"{MAX_EXPECTED_FAILURES:g} is not sampled")
    rng = np.random.default_rng(seed)
    seg = interval_s + checkpoint_s
    full = np.floor(work / interval_s)
    rest = work - full * interval_s
    done_segs = np.zeros(samples)                 # completed full segments
    partial_done = np.zeros(samples, dtype=bool)  # the last, partial segment completed
    wall = np.zeros(samples)
    failures = np.zeros(samples, dtype=np.int64)
    restart = np.zeros(samples)
    active = np.ones(samples, dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        gap = rng.exponential(mtbf_s, size=idx.size)
        left_full = full[idx] - done_segs[idx]
        need = left_full * seg + np.where(rest[idx] > 0, rest[idx] + checkpoint_s, 0.0)
        finish = gap >= need
        fin = idx[finish]
        wall[fin] += need[finish]
        done_segs[fin] = full[fin]
        partial_done[fin] = rest[fin] > 0
        active[fin] = False
        fail = idx[~finish]
        if fail.size == 0:
            continue
        g = gap[~finish]
        k = np.minimum(np.floor(g / seg), left_full[~finish]) if seg > 0 else left_full[~finish]
        done_segs[fail] += k
        wall[fail] += g
        failures[fail] += 1
        # restart: attempts of restart_s until one survives the next failure gap
        pending = fail
        while pending.size:
            y = rng.exponential(mtbf_s, size=pending.size)
            ok = y >= restart_s
            wall[pending[ok]] += restart_s
            restart[pending[ok]] += restart_s
            bad = pending[~ok]
            wall[bad] += y[~ok]
            restart[bad] += y[~ok]
            failures[bad] += 1
            pending = bad
    ckpt = (done_segs + partial_done) * checkpoint_s
    return RunSamples(wall, work, failures, restart, ckpt)
