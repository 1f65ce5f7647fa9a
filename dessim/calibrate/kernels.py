"""GEMM, attention and memory-bound kernel constants per GPU from measured kernel times.

Inputs are :class:`~dessim.trace.kernel_csv.KernelMeasurement` s (rows of a kernel-time CSV,
kernels of a Kineto trace). Each needs a GPU (its ``gpu``, else the ``gpu`` argument). What
each kind gives (the model: :mod:`dessim.engine.kernel_model`):

**GEMMs** (``matmul`` of known shape), per GPU and data type: ``peak_efficiency`` η,
``k_half`` k½ and ``fixed`` t₀ of the GEMM model, fitted by
:func:`~dessim.engine.kernel_model.fit_gemm` (least squares on log time) against the GPU's
dense peak at that data type — all three from 4 or more points with 3 or more distinct k;
η and t₀ (k½ from the base calibration) from 2 or more; η alone (closed form, base k½ and t₀)
from one. ``fp32`` points faster than the fp32 (vector) peak ran on TF32 tensor cores and are
fitted against the TF32 peak. The calibration file holds one GEMM model per GPU, used at the
run's precision: the 16-bit fit (bf16 and fp16 pooled: same peak) is written, else the fit
with the most points; the others are reported. ``ceiling`` becomes the best fraction of peak a
written point reached if that is above the base ceiling (a measurement shows the GPU can).

**Attention** (``attention`` of known shape, causal flag and phase): the implementation's
measured TFLOP/s (FlashAttention's FLOP convention) by head dimension, causal flag and key
sequence length, the median where several points share one; written into the GPU's table
for ``flash2``, ``flash3`` or ``unfused`` (a whole unfused block: matmul-softmax-matmul,
costed as one kernel at its measured rate; a measurement without an implementation counts as
``flash2``, said in the notes; other implementations are reported only). A GPU's own table replaces the
stand-in it borrowed from H100.

**Memory-bound** kernels of known bytes: ``memory_efficiency`` = the median achieved fraction
of the GPU's HBM bandwidth (capped at 1: bytes served from cache can look faster than HBM).

Kernels of unknown shape (most kernels of a trace) and launch overhead are not fitted: kernel
durations exclude the launch gaps between them. Residuals compare each point's measured time
with the calibrated kernel model's, without the launch overhead. Units: seconds, bytes,
FLOP/s.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import median
from typing import Sequence

import numpy as np

from dessim.calibrate.report import Fitted, PartFit, Residual
from dessim.catalog.calibration import Calibration
from dessim.catalog.devices import GPUSpec, get_device
from dessim.engine.device import ATTENTION_IMPLS, SM_COUNT
from dessim.engine.kernel_model import (AttentionRate, GemmParams, fit_gemm, gemm_quantization,
                                        gemm_time)
from dessim.errors import CalibrationError, DessimError
from dessim.trace.kernel_csv import KernelMeasurement

__all__ = ["KernelPoint", "prepare_kernels", "fit_kernels", "FITTED_IMPLS"]

#: Attention implementations the model has tables for.
FITTED_IMPLS: tuple[str, ...] = ATTENTION_IMPLS
#: Bytes per GEMM operand element by data type (the memory bound of skinny GEMMs).
_OPERAND_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "tf32": 4.0, "fp8": 1.0}
_SIXTEEN_BIT = ("bf16", "fp16")
_DEFAULT_SMS = 108          # as DeviceModel for GPUs without an SM count


@dataclass(frozen=True)
class KernelPoint:
    """A measurement with its GPU resolved, the file it came from and its place in it
    (``file:line``, or the file for trace kernels)."""

    m: KernelMeasurement
    gpu: GPUSpec
    file: str
    where: str

    def label(self) -> str:
        m = self.m
        shape = "x".join(str(d) for d in m.shape) if m.shape else "?"
        extra = [m.dtype or "", m.impl or "", "causal" if m.causal else "",
                 m.phase if m.kind == "attention" and m.phase else ""]
        tail = " ".join(x for x in extra if x)
        return f"{m.kind} {shape}" + (f" {tail}" if tail else "") + f" on {self.gpu.name}"


def prepare_kernels(measurements: Sequence[tuple[str, KernelMeasurement]],
                    gpu: str | None = None) -> list[KernelPoint]:
    """Every ``(file, measurement)`` with its GPU (its own, else ``gpu``), checked before any
    fit: :class:`CalibrationError` naming the file and line of a point without a GPU, or whose
    GPU lacks the peak of its data type."""
    default = get_device(gpu, "--gpu") if gpu is not None else None
    out = []
    for file, m in measurements:
        where = f"{file}:{m.line}" if m.line is not None else file
        spec = get_device(m.gpu) if m.gpu else default
        if spec is None:
            raise CalibrationError(f"{where}: {m.kind} kernel {m.name or ''!s} names no GPU; give "
                                   "a gpu column, or the GPU of every input with --gpu")
        if m.kind == "matmul" and m.dtype and len(m.shape) == 4:
            try:
                spec.peak_flops(spec.sixteen_bit if m.dtype in _SIXTEEN_BIT else m.dtype)
            except DessimError as exc:
                raise CalibrationError(f"{where}: {exc}") from None
        out.append(KernelPoint(m, spec, file, where))
    return out


def _with_seconds(doc: dict) -> Calibration:
    return Calibration.model_validate(doc, context={"seconds": True})


# ------------------------------------------------------------------------------------ GEMMs
@dataclass(frozen=True)
class _GemmGroup:
    gpu: GPUSpec
    dtype: str                 # the data type class: "bf16/fp16" or one data type
    precision: str             # the peak it is fitted against
    points: tuple[KernelPoint, ...]

    @property
    def arrays(self) -> np.ndarray:
        return np.array([(*p.m.shape[1:], p.m.shape[0], p.m.time_s) for p in self.points],
                        dtype=float)    # m, n, k, batch, seconds

    @property
    def peak(self) -> float:
        return self.gpu.peak_flops(self.precision)

    @property
    def sms(self) -> int:
        return SM_COUNT.get(self.gpu.name, _DEFAULT_SMS)

    @property
    def operand_bytes(self) -> float:
        return _OPERAND_BYTES[self.precision]


def _gemm_groups(points: Sequence[KernelPoint], notes: list[str]) -> list[_GemmGroup]:
    by: dict[tuple[str, str], list[KernelPoint]] = defaultdict(list)
    for p in points:
        cls = "bf16/fp16" if p.m.dtype in _SIXTEEN_BIT else p.m.dtype
        by[(p.gpu.name, cls)].append(p)
    groups = []
    for (name, cls), pts in sorted(by.items()):
        spec = pts[0].gpu
        if cls == "bf16/fp16":
            precision = spec.sixteen_bit
        elif cls == "fp32" and "tf32" in spec.flops and any(
                p.m.flops / p.m.time_s > spec.peak_flops("fp32") for p in pts):
            precision = "tf32"
            notes.append(f"{name} fp32 GEMMs run faster than the fp32 peak "
                         f"({spec.peak_flops('fp32') / 1e12:g} TFLOP/s): TF32 tensor cores; "
                         "fitted against the TF32 peak")
        else:
            precision = cls
        groups.append(_GemmGroup(spec, cls, precision, tuple(pts)))
    return groups


def _fit_group(group: _GemmGroup, base: GemmParams) -> tuple[GemmParams | None, str]:
    """GEMM parameters of one group and what was fitted (module docstring); None and the
    reason when the group says nothing about the GEMM rate."""
    pts = group.arrays
    m, n, k, b, t = pts.T
    kw = dict(hbm_bw=group.gpu.hbm_bw, operand_bytes=group.operand_bytes)
    if len(pts) >= 4 and len(set(k)) >= 3:
        fit = fit_gemm(pts, group.peak, group.sms, **kw).params
        fitted = "peak_efficiency, k_half, fixed"
    elif len(pts) >= 2:
        fit = fit_gemm(pts, group.peak, group.sms, k_half=base.k_half, **kw).params
        fitted = "peak_efficiency, fixed (k_half: too few distinct k)"
    else:   # t - t0 = 2bmnk / (peak * eta * Q * k/(k + k_half)), with the base k_half and t0
        q = gemm_quantization(m[0], n[0], b[0], group.sms) * k[0] / (k[0] + base.k_half)
        busy = t[0] - base.fixed
        if busy <= 0:
            return None, (f"it took {t[0] * 1e6:.4g}us, no more than the model's fixed time "
                          f"{base.fixed * 1e6:.4g}us: it says nothing about the GEMM rate")
        eta = 2.0 * b[0] * m[0] * n[0] * k[0] / (group.peak * busy * q)
        fit = GemmParams(round(eta, 4), base.k_half, base.fixed)
        fitted = "peak_efficiency (one point)"
    achieved = float(np.max(2.0 * b * m * n * k / t)) / group.peak
    ceiling = max(base.ceiling, math.ceil(achieved * 1000) / 1000)
    return GemmParams(fit.peak_efficiency, fit.k_half, fit.fixed, ceiling), fitted


def _gemm_residuals(group: _GemmGroup, params: GemmParams, fits: str) -> list[Residual]:
    pts = group.arrays
    model = gemm_time(*pts[:, :4].T, group.peak, group.sms, params, hbm_bw=group.gpu.hbm_bw,
                      operand_bytes=group.operand_bytes)
    return [Residual(p.where, p.label(), p.m.time_s, float(t), fits)
            for p, t in zip(group.points, np.atleast_1d(model))]


def _fit_gemms(points: Sequence[KernelPoint], base: Calibration, part: PartFit,
               devices: dict[str, dict]) -> None:
    groups = _gemm_groups(points, part.notes)
    by_gpu: dict[str, list[_GemmGroup]] = defaultdict(list)
    for g in groups:
        by_gpu[g.gpu.name].append(g)
    for name, gs in by_gpu.items():
        own = base.device(name).gemm          # the built-in file has one for every catalog GPU
        start = GemmParams(own.peak_efficiency, own.k_half, own.fixed, own.ceiling or 1.0)
        fits = {id(g): _fit_group(g, start) for g in gs}
        for g in gs:
            if fits[id(g)][0] is None:
                part.notes.append(f"{name} {g.dtype} GEMM at {g.points[0].where}: not fitted "
                                  f"({fits[id(g)][1]})")
                part.residuals.extend(_gemm_residuals(g, start, ""))
        gs = [g for g in gs if fits[id(g)][0] is not None]
        if not gs:
            continue
        chosen = next((g for g in gs if g.dtype == "bf16/fp16"),
                      max(gs, key=lambda g: (len(g.points), g.dtype)))
        for g in gs:
            params, what = fits[id(g)]
            key = f"devices.{name}.gemm"
            if g is chosen:
                sources = sorted({p.file for p in g.points})
                devices[name]["gemm"] = {
                    "peak_efficiency": params.peak_efficiency, "k_half": params.k_half,
                    "fixed": params.fixed, "ceiling": params.ceiling,
                    "source": f"dessim calibrate: {len(g.points)} {g.dtype} GEMM(s) against the "
                              f"{g.precision} peak ({what}) of {', '.join(sources)}"}
                part.fitted.append(Fitted(key, _gemm_text(start), _gemm_text(params),
                                          f"{len(g.points)} {g.dtype} GEMM(s) against the "
                                          f"{g.precision} peak; fitted {what}"))
                part.residuals.extend(_gemm_residuals(g, params, key))
            else:
                part.notes.append(f"{name} {g.dtype} GEMMs ({len(g.points)}): fit "
                                  f"{_gemm_text(params)}, not written (the file holds one GEMM "
                                  f"model per GPU: the {chosen.dtype} one); residuals against it")
                part.residuals.extend(_gemm_residuals(g, params, ""))


def _gemm_text(p: GemmParams) -> str:
    return (f"eta {p.peak_efficiency:.4f}, k_half {p.k_half:g}, t0 {p.fixed * 1e6:.4g}us, "
            f"ceiling {p.ceiling:.3f}")


# -------------------------------------------------------------------------------- attention
def _fit_attention(points: Sequence[KernelPoint], base: Calibration, part: PartFit,
                   devices: dict[str, dict]) -> None:
    by: dict[tuple[str, str], list[KernelPoint]] = defaultdict(list)
    for p in points:
        impl = (p.m.impl or "").lower() or None
        if impl is None:
            impl = "flash2"
            part.notes.append(f"{p.where}: attention without an implementation; taken as flash2")
        if impl not in FITTED_IMPLS:
            part.residuals.append(Residual(p.where, p.label(), p.m.time_s, None, "",
                                           f"{impl} is not one of {', '.join(FITTED_IMPLS)}"))
            continue
        by[(p.gpu.name, impl)].append(p)
    for (name, impl), pts in sorted(by.items()):
        rates: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for p in pts:
            rates[AttentionRate.key(p.m.shape[4], p.m.causal)][p.m.shape[3]].append(p.m.flops / p.m.time_s / 1e12)
        table = {key: {s: round(median(v), 1) for s, v in sorted(curve.items())}
                 for key, curve in sorted(rates.items())}
        sources = sorted({p.file for p in pts})
        devices[name].setdefault("attention", {})[impl] = {
            "tflops": table, "source": f"dessim calibrate: {len(pts)} measured {impl} "
                                       f"kernel(s) of {', '.join(sources)}"}
        own = base.device(name).attention.get(impl)
        merged = {k: dict(v) for k, v in (own.tflops.items() if own else ())}
        for key, curve in table.items():
            merged.setdefault(key, {}).update(curve)
        rate = AttentionRate.from_keys(merged)
        key = f"devices.{name}.attention.{impl}"
        cells = ", ".join(f"{k}@{s}: {v:g}" for k, curve in table.items() for s, v in curve.items())
        part.fitted.append(Fitted(key, "base table" if own else "none", f"{cells} TFLOP/s",
                                  f"{len(pts)} measured kernel(s), merged into the base table"
                                  if own else f"{len(pts)} measured kernel(s)"))
        for p in pts:
            model = p.m.flops / (rate.tflops(p.m.shape[4], bool(p.m.causal), p.m.shape[3]) * 1e12)
            part.residuals.append(Residual(p.where, p.label(), p.m.time_s, model, key))


# ----------------------------------------------------------------------------------- memory
def _fit_memory(points: Sequence[KernelPoint], base: Calibration, part: PartFit,
                devices: dict[str, dict]) -> None:
    by: dict[str, list[KernelPoint]] = defaultdict(list)
    for p in points:
        by[p.gpu.name].append(p)
    for name, pts in sorted(by.items()):
        hbm = pts[0].gpu.hbm_bw
        fraction = median(p.m.bytes / p.m.time_s / hbm for p in pts)
        key = f"devices.{name}.memory_efficiency"
        if fraction > 1:
            part.notes.append(f"{key}: the measured kernels move bytes faster than HBM "
                              f"({fraction:.3f} of {hbm / 1e12:g} TB/s: cache hits?); written as 1")
        value = min(1.0, round(fraction, 3))
        devices[name]["memory_efficiency"] = value
        before = base.device(name).memory_efficiency
        part.fitted.append(Fitted(key, "-" if before is None else f"{before:.3f}", f"{value:.3f}",
                                  f"median achieved fraction of HBM bandwidth of {len(pts)} "
                                  "memory-bound kernel(s)"))
        for p in pts:
            part.residuals.append(Residual(p.where, p.label(), p.m.time_s,
                                           p.m.bytes / (hbm * value), key))


# -------------------------------------------------------------------------------------- all
def fit_kernels(points: Sequence[KernelPoint], base: Calibration) -> PartFit:
    """Fit every GPU's kernel constants to ``points`` (module docstring), starting from
    ``base`` (the merged calibration the model runs with)."""
    part = PartFit()
    devices: dict[str, dict] = defaultdict(dict)
    gemms, attention, memory, unused = [], [], [], []
    for p in points:
        m = p.m
        if m.kind == "matmul" and len(m.shape) == 4 and m.dtype:
            gemms.append(p)
        elif m.kind == "attention" and m.flops is not None:
            attention.append(p)
        elif m.kind == "memory" and m.bytes is not None:
            memory.append(p)
        else:
            unused.append(p)
    if gemms:
        _fit_gemms(gemms, base, part, devices)
    if attention:
        _fit_attention(attention, base, part, devices)
    if memory:
        _fit_memory(memory, base, part, devices)
    for (source, kind), count in sorted(Counter((p.file, p.m.kind) for p in unused).items()):
        part.notes.append(f"{source}: {count} {kind} kernel(s) of unknown shape, data type or "
                          "causal flag: not used")
    files: dict[str, set[str]] = defaultdict(set)
    for p in points:
        files[p.gpu.name].add(p.file)
    doc = {name: {**values, "source": f"dessim calibrate: {', '.join(sorted(files[name]))}"}
           for name, values in sorted(devices.items())}
    part.calibration = _with_seconds({"devices": doc}) if doc else Calibration()
    return part
