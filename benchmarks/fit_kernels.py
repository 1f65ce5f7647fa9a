"""Fit the GEMM model of every GPU to the measured GEMMs in validation/kernels/ and report
its residuals (the "GEMM residual table" of docs/validation.md).

The measured points are kernel-level evidence only (cuBLAS/hipBLASLt/CUTLASS timings from
public sources, named in validation/kernels/README.md); no end-to-end training result enters
a fit. For each GPU this prints the fitted ``peak_efficiency`` (η), ``k_half`` (k½) and
``fixed`` (t₀), the ceiling (the best shape of a brute-force search,
``gemm_best_shape.csv``), and the residual of the model (simulated / measured time - 1)
by problem size. ``--check`` compares the fit with the built-in calibration
(calibration/default.yaml) and exits non-zero when they differ — the built-in GEMM constants
are exactly what this script produces.

Usage:
    python benchmarks/fit_kernels.py [--markdown] [--points] [--check] [--gpu NAME]
"""

from __future__ import annotations

import argparse
import csv
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dessim.catalog.calibration import default_calibration  # noqa: E402
from dessim.catalog.devices import get_device  # noqa: E402
from dessim.engine.device import SM_COUNT  # noqa: E402
from dessim.engine.kernel_model import GemmFit, GemmParams, fit_gemm, gemm_time  # noqa: E402

KERNELS = ROOT / "validation" / "kernels"


@dataclass(frozen=True)
class GemmData:
    """How one GPU's GEMM model is fitted: its measurement files and, when its points do not
    span k, a k½ taken from a GPU whose do (A100's square shapes tie k to m and n)."""

    gpu: str
    files: tuple[str, ...]
    k_half_from: str | None = None   #: take k½ from this GPU's fit
    #: the GEMMs' precision: bf16 (the ``gemm`` model) or fp8 (``gemm_fp8``, 1-byte operands)
    precision: str = "bf16"

    @property
    def operand_bytes(self) -> float:
        return 1.0 if self.precision == "fp8" else 2.0

    def builtin(self, calibration) -> object:
        """The built-in constants this fit reproduces."""
        dev = calibration.device(self.gpu)
        return dev.gemm_fp8 if self.precision == "fp8" else dev.gemm


#: One entry per GPU with a fitted GEMM model (A100-40GB, H200 share A100-80GB's, H100's).
FITS: tuple[GemmData, ...] = (
    GemmData("H100", ("xla_gemm_H100_bf16.csv",)),
    GemmData("A100-80GB", ("gemm_A100.csv",), k_half_from="H100"),
    GemmData("B200", ("xla_gemm_B200_bf16.csv",)),
    GemmData("MI300X", ("xla_gemm_MI300X_bf16.csv",)),
    # FP8 (DeepGEMM, H800): shared by H100 and H200 (the same GH100 die and FP8 peak)
    GemmData("H800", ("deepgemm_H800_fp8.csv",), precision="fp8"),
)
#: size classes of the residual table, by FLOPs of one GEMM
BUCKETS = ((0, 1e9, "< 1 GFLOP"), (1e9, 1e10, "1-10 GFLOP"), (1e10, 1e11, "10-100 GFLOP"),
           (1e11, np.inf, ">= 100 GFLOP"))


def load_points(files: tuple[str, ...]) -> np.ndarray:
    """Measured GEMMs as rows (m, n, k, batch, seconds)."""
    rows = []
    for name in files:
        with open(KERNELS / name, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                m, n, k, b = (float(r[x]) for x in ("m", "n", "k", "b"))
                rows.append((m, n, k, b, 2.0 * b * m * n * k / (float(r["tflops"]) * 1e12)))
    return np.asarray(rows)


def ceilings() -> dict[tuple[str, str], float]:
    """Best-shape TFLOP/s per (GPU, precision) (a maximum over a brute-force search: a bound,
    not a point to fit)."""
    with open(KERNELS / "gemm_best_shape.csv", newline="", encoding="utf-8") as f:
        return {(r["gpu"], r["dtype"]): float(r["tflops"]) * 1e12 for r in csv.DictReader(f)}


def fit(data: GemmData) -> tuple[GemmParams, GemmFit, np.ndarray]:
    spec = get_device(data.gpu)
    pts = load_points(data.files)
    k_half = None
    if data.k_half_from is not None:
        k_half = fit(next(d for d in FITS if d.gpu == data.k_half_from))[0].k_half
    peak = spec.peak_flops(data.precision)
    result = fit_gemm(pts, peak, SM_COUNT[data.gpu], hbm_bw=spec.hbm_bw, k_half=k_half,
                      operand_bytes=data.operand_bytes)
    best = ceilings().get((data.gpu, data.precision))
    if best is None:        # no search: the best point measured is the bound
        best = float(np.max(2 * pts[:, 3] * pts[:, 0] * pts[:, 1] * pts[:, 2] / pts[:, 4]))
    ceiling = round(best / peak, 3)
    p = result.params
    params = GemmParams(p.peak_efficiency, p.k_half, p.fixed, ceiling)
    pred = gemm_time(*pts[:, :4].T, peak, SM_COUNT[data.gpu], params, hbm_bw=spec.hbm_bw,
                     operand_bytes=data.operand_bytes)
    return params, result, pred / pts[:, 4] - 1.0


def residual_rows(pts: np.ndarray, res: np.ndarray) -> list[tuple[str, int, float, float, float]]:
    flops = 2 * pts[:, 3] * pts[:, 0] * pts[:, 1] * pts[:, 2]
    out = []
    for lo, hi, label in BUCKETS:
        sel = (flops >= lo) & (flops < hi)
        if sel.any():
            r = res[sel]
            out.append((label, int(sel.sum()), float(np.median(r)), float(np.median(np.abs(r))),
                        float(np.max(np.abs(r)))))
    out.append(("all", len(res), float(np.median(res)), float(np.median(np.abs(res))),
                float(np.max(np.abs(res)))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--points", action="store_true", help="print every point's residual")
    ap.add_argument("--check", action="store_true",
                    help="fail when the built-in calibration differs from the fit")
    ap.add_argument("--gpu", help="fit only this GPU")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    builtin = default_calibration()
    mismatches = []
    for data in FITS:
        if args.gpu and data.gpu != args.gpu:
            continue
        params, result, res = fit(data)
        pts = load_points(data.files)
        kh = f"from {data.k_half_from}" if data.k_half_from else "fitted"
        print(f"\n{data.gpu} {data.precision}: eta {params.peak_efficiency:.4f}, k_half {params.k_half:g} ({kh}), "
              f"t0 {params.fixed * 1e6:.3f} us, ceiling {params.ceiling:.3f}; "
              f"{len(pts)} points, RMS log error {result.rms_log_error:.3f}")
        rows = residual_rows(pts, res)
        if args.markdown:
            print("\n| GEMM size | points | median residual | median abs | max abs |")
            print("|---|---:|---:|---:|---:|")
            for label, n, med, mabs, mx in rows:
                print(f"| {label} | {n} | {med:+.1%} | {mabs:.1%} | {mx:.1%} |")
        else:
            for label, n, med, mabs, mx in rows:
                print(f"  {label:>13}: {n:4d} points  median {med:+7.1%}  median|.| {mabs:6.1%}"
                      f"  max|.| {mx:6.1%}")
        if args.points:
            for (m, n, k, b, t), r in zip(pts, res):
                print(f"    b={b:g} {m:g}x{n:g}x{k:g}: measured "
                      f"{2 * b * m * n * k / t / 1e12:7.1f} TFLOP/s, residual {r:+.1%}")
        g = data.builtin(builtin)
        have = (g.peak_efficiency, g.k_half, g.fixed, g.ceiling) if g else None
        want = (params.peak_efficiency, params.k_half, params.fixed, params.ceiling)
        if have is None or not np.allclose(have, want, rtol=1e-3, atol=1e-9):
            mismatches.append(f"{data.gpu} {data.precision}: built-in {have}, fit {want}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - t0:.1f} s, peak memory {peak:.0f} MiB")
    if args.check and mismatches:
        print("built-in calibration differs from the fit:\n  " + "\n  ".join(mismatches))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
