"""``calibrate``: read a user's measurements, fit the model to them, write a calibration file.

:func:`read_inputs` reads every input first (nccl-tests logs, kernel-time CSVs, Kineto traces;
a bad one raises a :class:`~dessim.errors.DessimError` naming its file and line before any
work), :func:`calibrate` checks them against the topology and GPU, fits the collective model
(:mod:`dessim.calibrate.collectives`) and the kernel model (:mod:`dessim.calibrate.kernels`),
and returns a :class:`CalibrationResult`: the calibration to write, the fitted constants, the
residual of every input point and notes. The file it writes holds what was fitted over the
user's base file (``base``), so ``--calibration FILE`` applies all of it over the built-in
defaults; every value names its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import yaml

from dessim.calibrate.collectives import fit_collectives, prepare_logs
from dessim.calibrate.kernels import KernelPoint, fit_kernels, prepare_kernels
from dessim.calibrate.report import Fitted, PartFit, Residual, format_report
from dessim.catalog.calibration import Calibration, load_calibration, read_calibration
from dessim.collectives import CollectiveSettings
from dessim.errors import CalibrationError, TraceError
from dessim.topology import load_topology
from dessim.topology.graph import Topology
from dessim.trace.kernel_csv import KernelMeasurement, read_kernel_csv
from dessim.trace.kineto import CollectiveMeasurement, read_kineto
from dessim.trace.nccl_tests import NcclTestsLog, read_nccl_tests

__all__ = ["CalibrationInputs", "CalibrationResult", "read_inputs", "calibrate"]

@dataclass(frozen=True)
class CalibrationInputs:
    """Measurements read from a user's files: nccl-tests logs, measured kernels (CSV rows and
    Kineto kernels, each with the file it came from) and Kineto's NCCL kernels (reported, not
    fitted: a trace does not say which GPUs a communicator spans). ``files`` names every input
    file in the order given."""

    nccl_tests: tuple[NcclTestsLog, ...] = ()
    kernels: tuple[tuple[str, KernelMeasurement], ...] = ()
    collectives: tuple[CollectiveMeasurement, ...] = ()
    files: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.nccl_tests or self.kernels or self.collectives)


def _read_log(path: str, ranks: int | None) -> NcclTestsLog:
    try:
        return read_nccl_tests(path)
    except TraceError as exc:
        if ranks is None or "rank count" not in str(exc):
            raise
    return read_nccl_tests(path, ranks=ranks)


def read_inputs(nccl_tests: Sequence[str | Path] = (), kernels: Sequence[str | Path] = (),
                kineto: Sequence[str | Path] = (), *, nccl_ranks: int | None = None
                ) -> CalibrationInputs:
    """Read every input file (paths). ``nccl_ranks``: the rank count of nccl-tests logs that do
    not show it (no ``#  Rank`` lines, and busbw/algbw cannot tell). Errors name the file and
    line of the first bad value."""
    for path in (*nccl_tests, *kernels, *kineto):
        if not Path(path).is_file():
            raise CalibrationError(f"input file {str(path)!r} does not exist"
                                   + (" (it is a directory)" if Path(path).is_dir() else ""))
    logs = tuple(_read_log(str(p), nccl_ranks) for p in nccl_tests)
    measured: list[tuple[str, KernelMeasurement]] = []
    for path in kernels:
        measured.extend((str(path), m) for m in read_kernel_csv(str(path)))
    collectives: list[CollectiveMeasurement] = []
    for path in kineto:
        trace = read_kineto(str(path))
        measured.extend((str(path), m) for m in trace.kernels)
        collectives.extend(trace.collectives)
    files = tuple(str(p) for p in (*nccl_tests, *kernels, *kineto))
    return CalibrationInputs(logs, tuple(measured), tuple(collectives), files)


@dataclass
class CalibrationResult:
    """What :func:`calibrate` found (module docstring)."""

    calibration: Calibration
    fitted: list[Fitted] = field(default_factory=list)
    residuals: list[Residual] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: tuple[str, ...] = ()

    def report(self) -> str:
        """The text report: fitted constants, notes, residual table."""
        return format_report(self.fitted, self.notes, self.residuals)

    def to_yaml(self) -> str:
        """The calibration file: a header naming the inputs, then the calibration (times as
        strings with units, every fitted value with its source)."""
        head = ["# dessim calibration file written by `dessim calibrate` (docs/calibration.md).",
                "# Inputs:"] + [f"#   {f}" for f in self.files] + [
                "# Use it with --calibration FILE on any simulating command; its values replace",
                "# the built-in ones (calibration/default.yaml) one by one."]
        body = yaml.safe_dump(self.calibration.to_document(), sort_keys=False, width=100,
                              allow_unicode=True)
        return "\n".join(head) + "\n" + body

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_yaml(), encoding="utf-8")
        return path


def calibrate(inputs: CalibrationInputs, topology: Topology | str | None = None,
              base: Calibration | str | Path | None = None, *, gpu: str | None = None,
              algo: str = "auto", protocol: str = "auto",
              name: str = "calibrated") -> CalibrationResult:
    """Fit the model to ``inputs`` (module docstring).

    ``topology`` (a Topology or a spec) is where the nccl-tests logs ran (their first N GPUs);
    needed only with logs. ``base``: the user's calibration to start from and to keep in the
    result (None: start from the built-in one). ``gpu``: the GPU of kernel measurements that
    name none. ``algo``/``protocol``: how the logs ran (``NCCL_ALGO``/``NCCL_PROTO``; auto:
    NCCL's choice). ``name``: the calibration's name (its label in outputs is
    ``name@fingerprint``). Everything is checked before anything is fitted.
    """
    if not inputs:
        raise CalibrationError("nothing to calibrate from: give nccl-tests logs, kernel-time "
                               "CSVs or Kineto traces")
    CollectiveSettings(algo=algo, protocol=protocol)       # checked before any work
    own = read_calibration(base) if base is not None else Calibration()
    merged = load_calibration(own)
    topo = None
    if inputs.nccl_tests:
        if topology is None:
            raise CalibrationError("nccl-tests logs need the topology they ran on (--topology, "
                                   "e.g. dgx-h100:nodes=2): each log runs on its first N GPUs")
        topo = topology if isinstance(topology, Topology) else load_topology(topology)
        prepare_logs(inputs.nccl_tests, topo)              # checks only: nothing simulated yet
    points: list[KernelPoint] = prepare_kernels(inputs.kernels, gpu)
    parts: list[PartFit] = []
    if inputs.nccl_tests:
        parts.append(fit_collectives(inputs.nccl_tests, topo, own, algo=algo, protocol=protocol))
    if points:
        parts.append(fit_kernels(points, merged))
    notes = [n for part in parts for n in part.notes]
    if inputs.collectives:
        notes.append(f"{len(inputs.collectives)} NCCL kernel(s) in the Kineto traces: not fitted "
                     "(a trace does not say which GPUs each communicator spans); calibrate the "
                     "network from nccl-tests logs")
    fitted = Calibration()
    for part in parts:
        fitted = part.calibration.over(fitted)
    description = (f"fitted by dessim calibrate to {len(inputs.files)} input file(s)"
                   + (f" over {own.name}" if base is not None else ""))
    result = fitted.over(own) if base is not None else fitted
    result = result.model_copy(update={"name": name, "description": description})
    return CalibrationResult(result, [f for part in parts for f in part.fitted],
                             [r for part in parts for r in part.residuals], notes, inputs.files)
