"""What a calibration found: fitted constants, notes, and the residual of every input point.

Every fitter of :mod:`dessim.calibrate` returns a :class:`PartFit`: the part of the calibration
it fitted, one :class:`Fitted` line per constant (value before and after, and from what), one
:class:`Residual` per input point (measured against the calibrated model) and notes (what
could not be fitted, and why). :func:`format_report` prints them for ``dessim calibrate``.

Residual = model / measured - 1 (positive: the model is slower than the measurement).
Times are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from dessim.catalog.calibration import Calibration
from dessim.units import format_time

__all__ = ["Residual", "Fitted", "PartFit", "format_report", "residual_table"]


@dataclass(frozen=True)
class Residual:
    """One input point: where it comes from, what it is, its measured and model time (s).

    ``model_s`` is None when the model cannot time the point (its shape is unknown, its
    implementation is not modelled); ``note`` then says why. ``fits`` names the constant the
    point was fitted to ("" when it is only checked)."""

    source: str
    point: str
    measured_s: float
    model_s: float | None
    fits: str = ""
    note: str = ""

    @property
    def residual(self) -> float | None:
        """model / measured - 1, or None when the model has no time for the point."""
        return None if self.model_s is None else self.model_s / self.measured_s - 1.0


@dataclass(frozen=True)
class Fitted:
    """One fitted constant: its key in the calibration file, the value the fit started from
    and the one it found (as written), and what it was fitted to."""

    key: str
    before: str
    after: str
    detail: str


@dataclass
class PartFit:
    """What one fitter produced (module docstring)."""

    calibration: Calibration = field(default_factory=Calibration)
    fitted: list[Fitted] = field(default_factory=list)
    residuals: list[Residual] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f}%"


def residual_table(residuals: Sequence[Residual]) -> str:
    """The residuals as an aligned text table, one row per input point."""
    header = ("input", "point", "measured", "model", "residual", "fits")
    rows = [header]
    for r in residuals:
        model = "-" if r.model_s is None else format_time(r.model_s, 5)
        rows.append((r.source, r.point, format_time(r.measured_s, 5), model, _percent(r.residual),
                     r.fits or (f"- ({r.note})" if r.note else "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells) + "  " + row[-1])
    return "\n".join(lines)


def format_report(fitted: Sequence[Fitted], notes: Sequence[str],
                  residuals: Sequence[Residual]) -> str:
    """The text ``dessim calibrate`` prints: fitted constants, notes, residual table and the
    largest residual of the points that were fitted."""
    lines = ["fitted constants:"]
    if not fitted:
        lines.append("  (none: no input point could be fitted)")
    width = max((len(f.key) for f in fitted), default=0)
    for f in fitted:
        lines.append(f"  {f.key:<{width}}  {f.before} -> {f.after}   {f.detail}")
    if notes:
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in notes)
    if residuals:
        lines.append("residuals (model / measured - 1):")
        lines.extend("  " + line for line in residual_table(residuals).splitlines())
        used = [abs(r.residual) for r in residuals if r.fits and r.residual is not None]
        if used:
            lines.append(f"largest |residual| of the fitted points: {100 * max(used):.2f}%")
    return "\n".join(lines)
