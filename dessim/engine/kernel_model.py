"""How long a GPU kernel takes: GEMMs, attention and memory-bound kernels, from measurements.

Three models, each calibrated per GPU from kernel-level measurements
(:mod:`dessim.catalog.calibration`, ``calibration/default.yaml``; sources in
docs/references.md; residuals in docs/validation.md):

**GEMM** ``C[m×n] = A[m×k]·B[k×n]`` (``batch`` independent products, a batched GEMM)::

    t = max(2·batch·m·n·k / (peak · η · Q(m, n, batch) · k/(k + k½)),
            bytes / (hbm · memory_efficiency)) + t₀

* ``η`` (``peak_efficiency``): the fraction of dense peak a large, well-shaped GEMM reaches;
* ``Q``: tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's
  Guide"): the output is computed in tiles, partial tiles cost a whole tile, and tiles run in
  waves of one per SM, so a partial last wave idles SMs; the best of :data:`TILES` is taken,
  smaller tiles at a lower relative efficiency;
* ``k/(k + k½)``: each tile's fixed prologue/epilogue relative to its main loop over k;
* ``t₀`` (``fixed``): the kernel's fixed time (launch to first tile, tail) — what a 256³
  GEMM costs;
* the efficiency never exceeds ``ceiling``, the best a brute-force search of shapes measured
  (the "maximum achievable matmul FLOPS" of Bekman's ml-engineering);
* the memory bound reads A and B and writes C once (skinny GEMMs).

``η``, ``k½`` and ``t₀`` are fitted per GPU generation to measured GEMM times
(:func:`fit_gemm`, by least squares on log time) — XLA's GEMM performance table for H100, B200
and MI300X (375 shapes each, CUPTI kernel times), the best-shape figure elsewhere.

**Attention** (FlashAttention-2/3): time = FLOPs / measured TFLOP/s, looked up in the
FlashAttention papers' measured tables by head dimension, causal flag and sequence length
(log-interpolated; :class:`AttentionRate`). FLOPs follow FlashAttention's convention: a
forward pass is ``4·s_q·s_k·d`` per head, halved when causal; a backward pass 2.5 times that.
Unfused attention is not a kernel: the workload enumerates its GEMMs and memory-bound
kernels (:mod:`dessim.workload.transformer.kernels`).

**Memory-bound** kernels: ``bytes / (hbm · memory_efficiency) + t₀`` where
``memory_efficiency`` is the achieved fraction of HBM bandwidth of well-written fused kernels
(STREAM-like copy and Liger/QuACK normalisation kernels, docs/references.md).

Every kernel also pays the per-kernel launch overhead (measured back-to-back stream launches).
Units: seconds, bytes, FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

__all__ = ["TILES", "GemmParams", "gemm_quantization", "gemm_time", "fit_gemm", "GemmFit",
           "AttentionRate", "attention_flops_fa", "ATTENTION_PHASE_FACTORS"]

#: Candidate output tiles (rows, cols) and their efficiency relative to the largest [U]:
#: larger tiles reuse more data (the guide's §2.3); cuBLAS picks the best per shape.
TILES: tuple[tuple[int, int, float], ...] = ((256, 128, 1.0), (128, 128, 0.9), (128, 64, 0.75))


@dataclass(frozen=True)
class GemmParams:
    """GEMM model constants of one GPU (see the module docstring)."""

    peak_efficiency: float     #: η: fraction of dense peak at large, well-shaped GEMMs
    k_half: float              #: k½: the k at which the main loop reaches half efficiency
    fixed: float               #: t₀: fixed time per GEMM kernel, seconds
    #: the most any shape reaches (the measured best shape of a brute-force search), so the
    #: model never extrapolates past what the GPU has been seen to do
    ceiling: float = 1.0


def gemm_quantization(m, n, batch, sms: int):
    """Tile and wave quantization ``Q`` (0 < Q <= 1) of GEMMs with ``m×n`` outputs, ``batch``
    of them, on ``sms`` SMs; scalars or numpy arrays."""
    m, n, batch = (np.asarray(x, dtype=float) for x in (m, n, batch))
    best = np.zeros(np.broadcast(m, n, batch).shape)
    for tm, tn, rel in TILES:
        tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
        tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * batch
        wave_eff = tiles / (np.ceil(tiles / sms) * sms)
        best = np.maximum(best, rel * tile_eff * wave_eff)
    return best if best.shape else float(best)


def gemm_time(m: float, n: float, k: float, batch: float, peak: float, sms: int,
              params: GemmParams, *, operand_bytes: float = 2.0, hbm_bw: float = math.inf,
              memory_efficiency: float = 1.0):
    """Seconds of a (batched) GEMM (module docstring); scalars or numpy arrays."""
    m, n, k, batch = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
    eff = params.peak_efficiency * gemm_quantization(m, n, batch, sms) * k / (k + params.k_half)
    eff = np.minimum(eff, params.ceiling)
    compute = 2.0 * batch * m * n * k / (peak * eff)
    memory = batch * (m * k + k * n + m * n) * operand_bytes / (hbm_bw * memory_efficiency)
    t = np.maximum(compute, memory) + params.fixed
    return t if t.shape else float(t)


@dataclass(frozen=True)
class GemmFit:
    """Result of :func:`fit_gemm`: the parameters and the residual of every point
    (simulated / measured time - 1)."""

    params: GemmParams
    residuals: np.ndarray

    @property
    def rms_log_error(self) -> float:
        return float(np.sqrt(np.mean(np.log1p(self.residuals) ** 2)))

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.residuals)))


def _golden(f, lo: float, hi: float, iters: int = 40) -> float:
    """The minimiser of a unimodal ``f`` on ``[lo, hi]`` by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    a, c = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fc = f(a), f(c)
    for _ in range(iters):
        if fa < fc:
            hi, c, fc = c, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, c, fc
            c = lo + g * (hi - lo)
            fc = f(c)
    return (lo + hi) / 2


def fit_gemm(points: Sequence[tuple[float, float, float, float, float]], peak: float, sms: int,
             *, hbm_bw: float = math.inf, operand_bytes: float = 2.0,
             k_half: float | None = None) -> GemmFit:
    """Fit ``η``, ``k½`` and ``t₀`` to measured GEMMs ``(m, n, k, batch, seconds)`` by least
    squares on log time, each point weighted by its time (a training step's time is made of
    its large GEMMs: a 10 % error on a 2 µs GEMM matters less than on a 2 ms one): a grid over
    ``k½`` and ``t₀``, and for each the best ``η`` by a one-dimensional golden-section search,
    then ``t₀`` (and a free ``k½``) refined between their neighbouring grid values
    (deterministic). With one point, ``k½`` and ``t₀`` stay at defaults (64, 0) and only
    ``η`` is fitted."""
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != 5 or len(pts) == 0:
        raise ValueError("fit_gemm needs points (m, n, k, batch, seconds)")
    m, n, k, b, t = pts.T
    log_t = np.log(t)
    weight = t / t.sum()

    def loss(eta: float, kh: float, t0: float) -> float:
        pred = gemm_time(m, n, k, b, peak, sms, GemmParams(eta, kh, t0),
                         operand_bytes=operand_bytes, hbm_bw=hbm_bw)
        return float(np.sum(weight * (np.log(pred) - log_t) ** 2))

    def best_eta(kh: float, t0: float) -> tuple[float, float]:
        eta = _golden(lambda e: loss(e, kh, t0), 0.05, 1.0)
        return loss(eta, kh, t0), eta

    if len(pts) == 1:
        kh = 64.0 if k_half is None else float(k_half)
        _, eta = best_eta(kh, 0.0)
        params = GemmParams(round(eta, 4), kh, 0.0)
    else:
        best = None
        t0_grid = np.concatenate([[0.0], np.geomspace(0.2e-6, 20e-6, 28)])
        kh_grid = np.geomspace(8, 2048, 33) if k_half is None else np.array([float(k_half)])
        for kh in kh_grid:
            for t0 in t0_grid:
                f, eta = best_eta(float(kh), float(t0))
                if best is None or f < best[0]:
                    best = (f, eta, float(kh), float(t0))
        _, eta, kh, t0 = best
        # refine t0 (and k_half when free) between the neighbouring grid values
        for _ in range(2):
            i = int(np.searchsorted(t0_grid, t0))
            lo_t, hi_t = t0_grid[max(i - 1, 0)], t0_grid[min(i + 1, len(t0_grid) - 1)]
            t0 = _golden(lambda x: best_eta(kh, x)[0], float(lo_t), float(hi_t))
            if k_half is None:
                j = int(np.searchsorted(kh_grid, kh))
                lo_k, hi_k = kh_grid[max(j - 1, 0)], kh_grid[min(j + 1, len(kh_grid) - 1)]
                kh = _golden(lambda x: best_eta(x, t0)[0], float(lo_k), float(hi_k))
        _, eta = best_eta(kh, t0)
        params = GemmParams(round(eta, 4), round(kh, 1), round(t0 * 1e9) / 1e9)
    pred = gemm_time(m, n, k, b, peak, sms, params, operand_bytes=operand_bytes, hbm_bw=hbm_bw)
    return GemmFit(params, np.asarray(pred / t - 1.0))


#: Attention FLOPs per phase in units of the forward count (FlashAttention's convention:
#: Dao-AILab/flash-attention ``benchmarks/benchmark_flash_attention.py``, ``flops()``).
ATTENTION_PHASE_FACTORS: dict[str, float] = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def attention_flops_fa(batch_heads: float, s_q: float, s_k: float, head_dim: float,
                       causal: bool, phase: str) -> float:
    """FLOPs of attention in FlashAttention's convention: forward ``4·s_q·s_k·d`` per head
    (halved when causal), backward 2.5× the forward, ``fwd+bwd`` 3.5×
    (:data:`ATTENTION_PHASE_FACTORS`)."""
    fwd = 4.0 * batch_heads * s_q * s_k * head_dim * (0.5 if causal else 1.0)
    return fwd * ATTENTION_PHASE_FACTORS[phase]


@dataclass(frozen=True)
class AttentionRate:
    """Measured attention throughput of one implementation on one GPU: TFLOP/s (forward +
    backward, FlashAttention's FLOP convention) by ``(head_dim, causal)`` and sequence length;
    :meth:`tflops` interpolates in log sequence length and in log head dimension between the
    measured curves (clamped at the table's ends; the other causal flag's curves when the
    table has none of the asked one)."""

    table: Mapping[tuple[int, bool], Mapping[int, float]]

    @staticmethod
    def key(head_dim: int, causal: bool) -> str:
        """The calibration file's name of a curve: ``d<head_dim>`` or ``d<head_dim>-causal``."""
        return f"d{head_dim}-causal" if causal else f"d{head_dim}"

    @classmethod
    def from_keys(cls, tflops: Mapping[str, Mapping[int, float]]) -> "AttentionRate":
        """A rate from curves named as in calibration files (:meth:`key`)."""
        out = {}
        for name, curve in tflops.items():
            d, _, causal = name.partition("-")
            out[(int(d.lstrip("d")), causal == "causal")] = {int(q): float(v) for q, v in curve.items()}
        return cls(out)

    def tflops(self, head_dim: float, causal: bool, seq: float) -> float:
        flag = causal if any(key[1] == causal for key in self.table) else not causal
        dims = sorted(key[0] for key in self.table if key[1] == flag)
        return _log_interp(dims, lambda d: self._along_seq(self.table[(d, flag)], seq), head_dim)

    @staticmethod
    def _along_seq(curve: Mapping[int, float], seq: float) -> float:
        seqs = sorted(curve)
        return _log_interp(seqs, lambda q: float(curve[q]), seq)


def _log_interp(xs: list[int], value: Callable[[int], float], x: float) -> float:
    """``value`` interpolated linearly in ``log x`` between the sorted points ``xs``, clamped
    at both ends."""
    if x <= xs[0]:
        return value(xs[0])
    if x >= xs[-1]:
        return value(xs[-1])
    for lo, hi in zip(xs, xs[1:]):
        if lo <= x <= hi:
            w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return value(lo) * (1 - w) + value(hi) * w
    raise AssertionError("unreachable")
