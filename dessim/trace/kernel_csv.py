"""Measured kernel times from a CSV file: the compute side of ``dessim calibrate``.

A user times the kernels that matter on their own GPU (GEMMs, attention, memory-bound kernels)
and writes one row per measurement. The header row is required; column names are
case-insensitive and their order is free. Blank lines and lines whose first cell starts with
``#`` are comments.

=========  ========  ==========================================================================
column     needed    values
=========  ========  ==========================================================================
kernel     yes       ``matmul`` (or gemm, bmm, mm, linear), ``attention`` (attn, sdpa, fmha,
                     flash_attention), ``memory`` (elementwise, pointwise, norm, layernorm,
                     rmsnorm, softmax, copy, memcpy, reduction, activation)
shape      yes       matmul ``MxNxK`` or ``BxMxNxK``; attention ``BxHxSqxSkxD`` (batch, query
                     heads, query and key sequence lengths, head dimension); memory: bytes
                     moved (read + written), ``268435456`` or ``256MiB`` (dessim.units sizes)
dtype      yes       ``bf16``, ``fp16``, ``fp32``, ``tf32``, ``fp8`` (aliases bfloat16, half,
                     float16, float, float32, e4m3, e5m2); may be empty for memory kernels
time_us,   one of    the time of one kernel call. ``time_us``/``time_ms``/``time_s`` hold plain
time_ms,   them      numbers in that unit; ``time`` holds a number with its unit (``12.5us``,
time_s,              ``3ms``; dessim.units.parse_time). Must be > 0.
time
gpu        no        a dessim catalog GPU (``H100``, ``h100-sxm``, ``A100``; see
                     dessim.catalog.devices)
causal     no        attention only: true/false (yes/no, 1/0); default false
impl       no        free text, e.g. flash2, flash3, cudnn, unfused
phase      no        ``fwd`` (default), ``bwd`` or ``fwd+bwd``
source     no        free text: where the number comes from
=========  ========  ==========================================================================

FLOP counts (:attr:`KernelMeasurement.flops`, derived, never read): a matmul is 2·B·M·N·K.
An attention forward is 4·B·H·Sq·Sk·D (two matmuls, QKᵀ and PV); the backward counts 2.5 times
the forward and forward+backward 3.5 times, and causal masking halves all of these. That is the
FlashAttention papers' convention as coded in Dao-AILab/flash-attention
``benchmarks/benchmark_flash_attention.py`` (``flops()``, commit 0469c72): it counts the masked
half as skipped, which is exact only for Sq = Sk ≫ 1, and it ignores softmax FLOPs. Memory
kernels have no FLOPs; :attr:`KernelMeasurement.bytes` is the bytes moved.

Every bad value raises :class:`~dessim.errors.TraceError` naming the file, the line and the
column.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass

from dessim.catalog.devices import get_device
from dessim.engine.kernel_model import ATTENTION_PHASE_FACTORS, attention_flops_fa
from dessim.errors import DessimError, TraceError
from dessim.trace.text_source import TextSource, load_text
from dessim.units import parse_size, parse_time

__all__ = ["KernelMeasurement", "read_kernel_csv", "KERNEL_KINDS", "ATTENTION_FLOP_FACTORS"]

#: Accepted ``kernel`` names -> kind.
KERNEL_KINDS: dict[str, str] = {
    **dict.fromkeys(("matmul", "gemm", "bmm", "mm", "linear"), "matmul"),
    **dict.fromkeys(("attention", "attn", "sdpa", "fmha", "flash_attention"), "attention"),
    **dict.fromkeys(("memory", "elementwise", "pointwise", "norm", "layernorm", "rmsnorm",
                     "softmax", "copy", "memcpy", "reduction", "activation"), "memory"),
}

#: Attention FLOPs per phase, in units of the forward count: the kernel model's
#: (:data:`dessim.engine.kernel_model.ATTENTION_PHASE_FACTORS`), under the name readers know.
ATTENTION_FLOP_FACTORS = ATTENTION_PHASE_FACTORS

_DTYPES = {
    **dict.fromkeys(("bf16", "bfloat16"), "bf16"),
    **dict.fromkeys(("fp16", "float16", "half"), "fp16"),
    **dict.fromkeys(("fp32", "float32", "float"), "fp32"),
    "tf32": "tf32",
    **dict.fromkeys(("fp8", "float8", "e4m3", "e5m2", "fp8_e4m3", "fp8_e5m2"), "fp8"),
}
_PHASES = {
    **dict.fromkeys(("fwd", "forward"), "fwd"),
    **dict.fromkeys(("bwd", "backward"), "bwd"),
    **dict.fromkeys(("fwd+bwd", "fwd_bwd", "fwdbwd", "fwd-bwd"), "fwd+bwd"),
}
_BOOLS = {**dict.fromkeys(("true", "yes", "1"), True), **dict.fromkeys(("false", "no", "0"), False)}
_TIME_COLUMNS = {"time_us": 1e6, "time_ms": 1e3, "time_s": 1.0, "time": None}
_COLUMNS = ("kernel", "shape", "dtype", *_TIME_COLUMNS, "gpu", "causal", "impl", "phase", "source")
_REQUIRED = ("kernel", "shape", "dtype")
_PLAIN_NUMBER = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$", re.ASCII)
_DIMS = re.compile(r"\s*[x×X]\s*")
_SHAPE_RANKS = {"matmul": (3, 4), "attention": (5,)}


@dataclass(frozen=True)
class KernelMeasurement:
    """One measured kernel (or, from a trace, one op's kernels): what it computed and how long.

    ``kind`` is ``matmul``, ``attention`` or ``memory``. ``shape`` is ``(B, M, N, K)`` for a
    matmul (B = 1 for a plain GEMM), ``(B, H, Sq, Sk, D)`` for attention, ``(bytes,)`` for a
    memory kernel, and ``()`` when not known (kernels found in a trace without shapes).
    ``dtype`` is a dessim precision (``bf16``, ``fp16``, ``fp32``, ``tf32``, ``fp8``) or None;
    ``time_s`` seconds per call; ``gpu`` a catalog name or None; ``causal`` None when unknown;
    ``phase`` ``fwd``/``bwd``/``fwd+bwd`` or None when unknown. ``name`` is the kernel label (the
    CSV ``kernel`` cell, or the GPU kernel's name in a trace), ``launches`` how many GPU kernels
    the time adds up (a trace op may launch several, e.g. a split-K GEMM and its reduction),
    ``source`` free-text provenance and ``line`` the CSV line (None for traces).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str | None
    time_s: float
    gpu: str | None = None
    causal: bool | None = False
    impl: str | None = None
    phase: str | None = "fwd"
    name: str | None = None
    launches: int = 1
    source: str | None = None
    line: int | None = None

    @property
    def flops(self) -> float | None:
        """FLOPs of one call (module docstring), None for memory kernels or unknown shapes."""
        if self.kind == "matmul" and len(self.shape) == 4:
            b, m, n, k = self.shape
            return 2.0 * b * m * n * k
        if self.kind == "attention" and len(self.shape) == 5:
            if self.causal is None or self.phase not in ATTENTION_FLOP_FACTORS:
                return None
            b, h, sq, sk, d = self.shape
            return attention_flops_fa(b * h, sq, sk, d, self.causal, self.phase)
        return None

    @property
    def bytes(self) -> int | None:
        """Bytes moved by a memory kernel (None for other kinds, or when not known)."""
        return self.shape[0] if self.kind == "memory" and len(self.shape) == 1 else None


def _cell_error(where: str, column: str, message: str) -> TraceError:
    return TraceError(f"{where}: column {column!r}: {message}")


def _parse_shape(kind: str, text: str, where: str) -> tuple[int, ...]:
    if kind == "memory":
        try:
            size = parse_size(text.strip(), "bytes moved", allow_zero=False)
        except DessimError as exc:
            raise _cell_error(where, "shape", str(exc)) from None
        return (size,)
    parts = _DIMS.split(text.strip())
    wanted = _SHAPE_RANKS[kind]
    form = "MxNxK or BxMxNxK" if kind == "matmul" else "BxHxSqxSkxD"
    if len(parts) not in wanted or not all(p.isdigit() and p.isascii() and len(p) <= 18
                                           for p in parts):
        raise _cell_error(where, "shape", f"{text!r} is not a {kind} shape ({form}, whole numbers)")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise _cell_error(where, "shape", f"{text!r} has a zero dimension")
    return (1, *dims) if len(dims) == 3 else dims


def _parse_time(column: str, text: str, where: str) -> float:
    scale = _TIME_COLUMNS[column]
    if scale is None:
        if _PLAIN_NUMBER.match(text):
            raise _cell_error(where, column, f"{text!r} has no unit; write e.g. '{text.strip()}us' "
                                             "or use a time_us / time_ms / time_s column")
        try:
            seconds = parse_time(text, column, allow_zero=False)
        except DessimError as exc:
            raise _cell_error(where, column, str(exc)) from None
        return seconds
    if not _PLAIN_NUMBER.match(text):
        raise _cell_error(where, column, f"{text!r} is not a plain number (the unit is in the "
                                         "column name; use a 'time' column for values with units)")
    value = float(text)
    if not math.isfinite(value):
        raise _cell_error(where, column, f"{text!r} is not a finite time")
    if value <= 0:
        raise _cell_error(where, column, f"{text!r} is {'negative' if value < 0 else 'zero'}; a "
                                         "measured time must be > 0")
    return value / scale


def _lookup(table: dict[str, str], column: str, text: str, where: str) -> str:
    key = text.strip().lower()
    if key not in table:
        raise _cell_error(where, column, f"unknown value {text!r} (accepted: "
                                         f"{', '.join(sorted(set(table)))})")
    return table[key]


def _parse_row(cells: dict[str, str], where: str, line: int) -> KernelMeasurement:
    label = cells["kernel"].strip()
    kind = _lookup(KERNEL_KINDS, "kernel", label, where)
    shape = _parse_shape(kind, cells["shape"], where)
    dtype_text = cells["dtype"].strip()
    if dtype_text:
        dtype = _lookup(_DTYPES, "dtype", dtype_text, where)
    elif kind == "memory":
        dtype = None
    else:
        raise _cell_error(where, "dtype", f"a {kind} kernel needs a data type")
    time_column = next(c for c in _TIME_COLUMNS if c in cells)
    time_s = _parse_time(time_column, cells[time_column], where)
    gpu = None
    if cells.get("gpu", "").strip():
        try:
            gpu = get_device(cells["gpu"].strip(), "gpu").name
        except DessimError as exc:
            raise _cell_error(where, "gpu", str(exc)) from None
    causal = False
    if cells.get("causal", "").strip():
        causal = _BOOLS.get(cells["causal"].strip().lower())
        if causal is None:
            raise _cell_error(where, "causal", f"{cells['causal']!r} is not true or false")
        if causal and kind != "attention":
            raise _cell_error(where, "causal", f"causal masking applies to attention, not {kind}")
    phase = "fwd"
    if cells.get("phase", "").strip():
        phase = _lookup(_PHASES, "phase", cells["phase"], where)
    impl = cells.get("impl", "").strip() or None
    source = cells.get("source", "").strip() or None
    return KernelMeasurement(kind, shape, dtype, time_s, gpu, causal, impl, phase, label, 1,
                             source, line)


def _header(row: list[str], where: str) -> list[str]:
    names = [cell.strip().lower() for cell in row]
    for index, name in enumerate(names):
        if name not in _COLUMNS:
            raise TraceError(f"{where}: unknown column {row[index].strip()!r} (columns: "
                             f"{', '.join(_COLUMNS)})")
        if names.index(name) != index:
            raise TraceError(f"{where}: column {name!r} appears twice")
    missing = [c for c in _REQUIRED if c not in names]
    if missing:
        raise TraceError(f"{where}: missing column {missing[0]!r} (needed: "
                         f"{', '.join(_REQUIRED)} and one of {', '.join(_TIME_COLUMNS)})")
    times = [c for c in names if c in _TIME_COLUMNS]
    if len(times) != 1:
        detail = "none" if not times else ", ".join(times)
        raise TraceError(f"{where}: exactly one time column is needed "
                         f"({', '.join(_TIME_COLUMNS)}); found {detail}")
    return names


def read_kernel_csv(path_or_text: TextSource) -> list[KernelMeasurement]:
    """Read a kernel-time CSV (module docstring) into :class:`KernelMeasurement` rows, in order.

    ``path_or_text`` follows :mod:`dessim.trace.text_source` (a path, text with a line break, or
    bytes). Raises :class:`~dessim.errors.TraceError` naming the file, line and column of the
    first bad value; a file with a header but no rows is an error too.
    """
    loaded = load_text(path_or_text)
    name = loaded.name
    reader = csv.reader(io.StringIO(loaded.text, newline=""))
    columns: list[str] | None = None
    header_line = 0
    out: list[KernelMeasurement] = []
    try:
        for row in reader:
            line = reader.line_num
            where = f"{name}:{line}"
            if not any(cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
                continue
            if columns is None:
                columns, header_line = _header(row, where), line
                continue
            if len(row) != len(columns):
                raise TraceError(f"{where}: {len(row)} cells, but the header (line {header_line}) "
                                 f"has {len(columns)} columns")
            out.append(_parse_row(dict(zip(columns, row)), where, line))
    except csv.Error as exc:
        raise TraceError(f"{name}:{reader.line_num}: not valid CSV ({exc})") from None
    if columns is None:
        raise TraceError(f"{name}: no header row (kernel, shape, dtype, time_us, ...)")
    if not out:
        raise TraceError(f"{name}: the CSV has a header (line {header_line}) but no rows")
    return out
