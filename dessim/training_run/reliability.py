"""Closed forms of checkpoint/restart under Poisson failures (seconds throughout).

The renewal model (Daly 2006, §3; "Young 1974" and "Daly 2006" in docs/references.md):
useful work is cut into segments of ``tau`` seconds, each followed by a checkpoint write of
``C`` seconds. Failures of the whole job arrive as a Poisson process of mean time between
failures ``M`` (rate ``1/M``), also during checkpoint writes and restarts. A failure loses
everything since the last completed checkpoint and starts a restart of ``R`` seconds
(relaunch, restore, re-warm); a failure during a restart starts the restart again.

Expected wall time of one segment of ``tau`` useful seconds, starting right after a
completed checkpoint (Daly 2006, Eq. 11 — exact for this model, no expansion)::

    A(tau) = M · e^(R/M) · (e^((tau + C)/M) − 1)

Derivation (kept here because the tests check it against Monte Carlo): an attempt of length
``T = tau + C`` succeeds with ``p = e^(−T/M)``; otherwise it fails at ``X < T`` and costs a
restart phase ``B``. ``E[min(X, T)] = M(1 − p)``; a restart phase is a restart attempt of
length ``R`` (succeeds with ``q = e^(−R/M)``) followed by a fresh segment, so
``B = A + M(e^(R/M) − 1)``; solving ``A = M(1 − p) + (1 − p)·B`` gives the form above.

Derived figures:

* expected failures during a run: ``E[N] = E[T_wall] / M`` (a Poisson process stopped at a
  stopping time: Wald's identity);
* expected time spent restarting: ``E[N] · M(1 − e^(−R/M))`` (each failure starts one
  restart attempt that lasts ``min(Exp(M), R)``);
* goodput ``= useful seconds / expected wall seconds``.

Optimum interval: Young (1974) ``tau = √(2·C·M)`` (first order in ``C/M``); Daly (2006,
Eq. 37) the higher-order ``√(2CM)·[1 + ⅓√(C/2M) + (1/9)(C/2M)] − C`` for ``C < 2M``, else
``M``. :func:`optimal_interval` is the exact minimiser of ``A(tau)/tau`` (the root of
``−ln(1 − tau/M) − tau/M = C/M``), which Daly's form approximates to better than 1 % for
``C/M < 0.1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dessim.errors import DessimError

__all__ = ["RenewalModel", "young_interval", "daly_interval", "segment_time", "optimal_interval",
           "ReliabilityError"]


class ReliabilityError(DessimError):
    """A checkpoint/restart parameter is out of range (names the parameter and value)."""


def _positive(name: str, value: float, allow_zero: bool = False, allow_inf: bool = False) -> float:
    ok = (value >= 0) if allow_zero else (value > 0)
    finite = allow_inf or math.isfinite(value) if isinstance(value, (int, float)) else False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok or not finite:
        bound = ">= 0" if allow_zero else "> 0"
        raise ReliabilityError(f"{name} must be a finite number {bound} (seconds), got {value!r}")
    return float(value)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): the checkpoint interval ``√(2·C·M)``, seconds (inf when nothing fails)."""
    return math.sqrt(2.0 * _positive("checkpoint time", checkpoint_s)
                     * _positive("MTBF", mtbf_s, allow_inf=True))


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006, Eq. 37): ``√(2CM)·[1 + ⅓√(C/2M) + (1/9)(C/2M)] − C`` for ``C < 2M``,
    else ``M``; seconds."""
    c, m = _positive("checkpoint time", checkpoint_s), _positive("MTBF", mtbf_s, allow_inf=True)
    if math.isinf(m):
        return m
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def segment_time(work_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """``A(tau)`` of the module docstring: expected seconds to complete ``work_s`` useful
    seconds plus one checkpoint write, starting after a completed checkpoint (``tau + C``
    when the MTBF is infinite: nothing fails)."""
    m = _positive("MTBF", mtbf_s, allow_inf=True)
    t = _positive("segment work", work_s, allow_zero=True) + _positive("checkpoint time", checkpoint_s,
                                                                        allow_zero=True)
    if math.isinf(m):
        return t
    log_a = math.log(m) + _positive("restart time", restart_s, allow_zero=True) / m
    x = t / m
    log_a += math.log(math.expm1(x)) if x < 700 else x     # expm1(x) = e^x at that size
    return math.exp(log_a) if log_a < 709 else math.inf   # inf: the run would never finish


@dataclass(frozen=True)
class RenewalModel:
    """A whole run under the renewal model: ``work_s`` useful seconds, checkpoint every
    ``interval_s`` useful seconds (the last, shorter segment also ends with a checkpoint),
    checkpoint write ``checkpoint_s``, restart ``restart_s``, job MTBF ``mtbf_s``; seconds."""

    work_s: float
    interval_s: float
    checkpoint_s: float
    restart_s: float
    mtbf_s: float

    def __post_init__(self) -> None:
        _positive("useful work", self.work_s, allow_zero=True)
        _positive("checkpoint interval", self.interval_s)
        _positive("checkpoint time", self.checkpoint_s, allow_zero=True)
        _positive("restart time", self.restart_s, allow_zero=True)
        _positive("MTBF", self.mtbf_s, allow_inf=True)

    @property
    def segments(self) -> tuple[int, float]:
        """(number of full segments, useful seconds of the last partial one, 0 if none)."""
        full = math.floor(self.work_s / self.interval_s)
        rest = self.work_s - full * self.interval_s
        return full, rest

    @property
    def checkpoints(self) -> int:
        """Completed checkpoint writes of a run (one per segment)."""
        full, rest = self.segments
        return full + (1 if rest > 0 else 0)

    def expected_wall_s(self) -> float:
        """Expected wall seconds of the run (sum of :func:`segment_time` over segments)."""
        full, rest = self.segments
        a = segment_time(self.interval_s, self.checkpoint_s, self.restart_s, self.mtbf_s)
        last = segment_time(rest, self.checkpoint_s, self.restart_s, self.mtbf_s) if rest > 0 else 0.0
        return full * a + last

    def expected_failures(self) -> float:
        """Expected failures during the run: ``E[T_wall] / M``."""
        return self.expected_wall_s() / self.mtbf_s

    def expected_restart_s(self) -> float:
        """Expected seconds spent restarting: ``E[N] · M(1 − e^(−R/M))``."""
        if math.isinf(self.mtbf_s):
            return 0.0
        return self.expected_failures() * self.mtbf_s * -math.expm1(-self.restart_s / self.mtbf_s)

    def expected_lost_s(self) -> float:
        """Expected seconds of lost work (work and checkpoint writes redone after failures;
        0 when nothing fails, never below 0 by rounding)."""
        if math.isinf(self.mtbf_s):
            return 0.0
        return max(0.0, self.expected_wall_s() - self.work_s - self.checkpoints * self.checkpoint_s
                   - self.expected_restart_s())

    def goodput(self) -> float:
        """Useful seconds / expected wall seconds (1 for an empty run)."""
        wall = self.expected_wall_s()
        return self.work_s / wall if wall > 0 else 1.0

    def steady_goodput(self) -> float:
        """Goodput of an endless run of full segments: ``tau / A(tau)``."""
        return self.interval_s / segment_time(self.interval_s, self.checkpoint_s, self.restart_s,
                                              self.mtbf_s)


def optimal_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The exact interval that maximises :meth:`RenewalModel.steady_goodput`, seconds.

    ``d/dtau [A(tau)/tau] = 0`` gives ``e^((tau + C)/M)·(1 − tau/M) = 1``; with ``v = tau/M``
    and ``c = C/M``: ``−ln(1 − v) − v = c`` (independent of ``R``). Its left side is
    ``v²/2 + v³/3 + …``, so Young's ``√(2CM)`` is the first-order root; the root is found by
    Newton's method from there (``log1p`` keeps it exact for small ``c``), kept inside
    ``(0, 1)`` by bisection. Returns inf when nothing fails, 0 for free checkpoints.
    """
    c = _positive("checkpoint time", checkpoint_s, allow_zero=True)
    m = _positive("MTBF", mtbf_s, allow_inf=True)
    if math.isinf(m):
        return math.inf     # nothing fails: no checkpoint is worth its write
    if c == 0:
        return 0.0          # free checkpoints: checkpoint continuously
    target = c / m
    lo, hi = 0.0, 1.0
    v = min(math.sqrt(2 * target), 0.5)
    for _ in range(100):
        g = -math.log1p(-v) - v - target
        if g > 0:
            hi = v
        else:
            lo = v
        step = g * (1 - v) / v
        nxt = v - step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - v) <= 1e-15 * v:
            v = nxt
            break
        v = nxt
    return v * m
