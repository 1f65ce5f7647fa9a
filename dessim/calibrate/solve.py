"""One-dimensional root finding for the calibration fits.

Each fitted constant is scaled so that its residual function ``h(u)`` is non-decreasing in
the parameter ``u`` with a nominal slope of 1 (an efficiency is fitted as ``u = log e`` against
``-log(model / measured time)``, an overhead or latency as ``u`` seconds against ``model -
measured``): then ``u - h(u)`` is the fixed-point step that is exact when the model is exactly
that sensitive. :func:`solve` takes such steps, refines the slope by secants once two points
show it, lengthens the step while ``h`` stays flat (a parameter the model ignores until it
crosses a threshold, e.g. a link latency under NCCL's per-hop floor), and switches to
regula falsi (Illinois variant) once the root is bracketed. It stops when the next step would
move ``u`` by less than the tolerance, without evaluating ``h`` there (each evaluation is a
set of simulations). Deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Solution", "solve"]


@dataclass(frozen=True)
class Solution:
    """Where :func:`solve` stopped: ``u``, ``h(u)`` there, how many times ``h`` was evaluated,
    and ``status``: ``ok`` (converged), ``low`` (``h > 0`` even at the lower bound: the
    measurement wants less than the bound allows), ``high`` (``h < 0`` even at the upper
    bound) or ``stalled`` (no convergence within the evaluation budget)."""

    u: float
    h: float
    evaluations: int
    status: str


def solve(h: Callable[[float], float], u0: float, lo: float, hi: float,
          tol: Callable[[float], float], htol: float = 0.0,
          max_evaluations: int = 60) -> Solution:
    """A root of the non-decreasing ``h`` on ``[lo, hi]`` starting at ``u0`` (module
    docstring); stops when ``|h(u)| <= htol`` (the measurement cannot tell closer) or when
    the next step would move ``u`` by at most ``tol(u)``."""
    u = min(max(u0, lo), hi)
    hu = h(u)
    count = 1
    neg: tuple[float, float] | None = None     # bracket end with h < 0 (the largest such u)
    pos: tuple[float, float] | None = None     # bracket end with h > 0 (the smallest such u)
    prev: tuple[float, float] | None = None
    stretch = 1.0
    kept = ""                                   # the bracket end the last step left in place
    while True:
        if abs(hu) <= htol:
            return Solution(u, hu, count, "ok")
        if neg is not None and pos is not None:  # bracketed: u replaced one end
            side = "neg" if hu > 0 else "pos"    # the end left in place
            if side == kept:                     # Illinois: a stale end counts half
                if side == "neg":
                    neg = (neg[0], neg[1] / 2.0)
                else:
                    pos = (pos[0], pos[1] / 2.0)
            kept = side
        if hu < 0 and (neg is None or u > neg[0]):
            neg = (u, hu)
        if hu > 0 and (pos is None or u < pos[0]):
            pos = (u, hu)
        if neg is not None and pos is not None:
            (a, ha), (b, hb) = neg, pos
            if abs(b - a) <= tol(u):
                return Solution(u, hu, count, "ok")
            cand = a - ha * (b - a) / (hb - ha)
            if not min(a, b) < cand < max(a, b):
                cand = (a + b) / 2.0
        else:
            slope = 1.0
            if prev is not None and prev[0] != u:
                secant = (hu - prev[1]) / (u - prev[0])
                if secant > 0:
                    slope, stretch = secant, 1.0
                else:                           # flat: the model ignores u here; go further
                    stretch *= 2.0
            cand = min(max(u - stretch * hu / slope, lo), hi)
            if cand == u:                       # at a bound that h wants to cross
                return Solution(u, hu, count, "low" if hu > 0 else "high")
        if abs(cand - u) <= tol(u):             # the next step is too small to matter
            return Solution(u, hu, count, "ok")
        if count >= max_evaluations:
            return Solution(u, hu, count, "stalled")
        prev = (u, hu)
        u, hu = cand, h(cand)
        count += 1
