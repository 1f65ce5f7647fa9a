"""Calibration from a user's own cluster (``dessim calibrate``).

Fits the measured constants of dessim's models (:mod:`dessim.catalog.calibration`) to a
user's measurements and writes them as a calibration file that every simulating command reads
with ``--calibration FILE`` (docs/calibration.md):

* :mod:`.collectives` — link efficiencies, NCCL's per-call overhead and scale-out latency from
  nccl-tests logs, by simulating each log on the user's topology;
* :mod:`.kernels` — GEMM, attention and memory-bound kernel constants per GPU from measured
  kernel times (CSV rows, Kineto traces);
* :mod:`.solve` — the one-dimensional root finder the collective fit uses;
* :mod:`.report` — fitted constants and the residual of every input point;
* :mod:`.api` — :func:`read_inputs` and :func:`calibrate`.

Layer: just below the CLI (it uses the trace readers, the collective and kernel models).
"""

from __future__ import annotations

from dessim.calibrate.api import CalibrationInputs, CalibrationResult, calibrate, read_inputs
from dessim.calibrate.report import Fitted, Residual

__all__ = ["CalibrationInputs", "CalibrationResult", "Fitted", "Residual", "calibrate",
           "read_inputs"]
