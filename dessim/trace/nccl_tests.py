"""Reading and writing what NVIDIA's nccl-tests binaries print (``all_reduce_perf`` & co).

``dessim calibrate`` fits the network model to a user's own nccl-tests runs; this module turns
their output into checked numbers (:func:`read_nccl_tests`) and prints dessim's own results in
the same layout (:func:`write_nccl_tests`), so that the two can be compared line by line.

The format (nccl-tests 2.19.6, NVIDIA/nccl-tests ``src/util.cu`` and ``src/common.cu`` at commit
a0b82b2):

* Comment lines start with ``#``: ``# nccl-tests version 2.19.6 ...``, ``# Collective test
  starting: all_reduce_perf``, ``# nThread 1 nGpus 1 minBytes 8 ...``, one
  ``#  Rank  0 Group  0 Pid 12345 on host device  0 [0000:18:00] NVIDIA H100 80GB HBM3`` line per
  rank, the table header (``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time
  ...``) and its units line, then the footer: ``# Out of bounds values : 0 OK``,
  ``# Avg bus bandwidth    : 70.742`` and ``# Collective test concluded: all_reduce_perf``.
* A result row is ``"%12li  %12li  %8s  %6s  %6s"`` (size in bytes, count in elements, data
  type, reduction op, root) followed by an out-of-place and an in-place half, each
  ``"  %7s  %6s  %6s  %6g"`` (time in µs, algbw and busbw in GB/s, #wrong) or ``"...    N/A"``
  when data are not checked. Numbers go through ``getFloatStr``: the first of ``%.2f``,
  ``%.1f``, ``%.0f`` that fits 7 characters (time) or 6 (bandwidths), else ``%.1e``/``%.0e``.
* Older versions (2.10 era and before) have no ``root`` column (the oldest no ``redop`` either),
  print ``error`` (the largest numeric error, ``0e+00``) instead of ``#wrong``, and print times
  with ``%7.2f`` / ``%7.1f`` / ``%7.0f``. ``-C 1`` labels the time ``cputime`` (CPU time; algbw
  stays GPU-timed), ``-I 1`` appends ``i_min i_max i_p99 i_cv%`` to each half and ``-T`` a
  ``timestamp``. All of these are read: the columns come from the header line, not from a fixed
  layout. Lines that MPI launchers add (``[1,0]<stdout>:`` tags, ``NCCL INFO`` lines, warnings)
  are skipped.
* ``-J file.json`` writes JSON (``results[]`` with ``size``, ``count``, ``type``, ``redop``,
  ``root``, ``out_of_place``/``in_place`` {``time`` or ``cpu_time``, ``alg_bw``, ``bus_bw``,
  ``nwrong``}); :func:`read_nccl_tests` reads that too.

Semantics (nccl-tests ``doc/PERFORMANCE.md``; :mod:`dessim.collectives.ops`): ``time`` is µs per
call, ``algbw = size / time`` in GB/s (1 GB = 1e9 B) and ``busbw = algbw × factor(n)``:
2(n−1)/n for allreduce, (n−1)/n for allgather, reducescatter and alltoall, 1 for broadcast,
reduce and sendrecv. ``size`` is the per-rank buffer for allreduce, broadcast, reduce, alltoall
and sendrecv and the whole array for allgather and reducescatter; the ``count`` column is
``size / type size``, divided by n for allgather, reducescatter and alltoall (nccl-tests prints
the per-rank, per-peer count ``args->nbytes / wordSize``: ``src/all_gather.cu``,
``src/reduce_scatter.cu``, ``src/alltoall.cu``).

Every row is checked: busbw against algbw × factor and algbw against size / time, each within
the rounding of the printed digits (an interval, from the number of decimals each value was
printed with), and the count against the size. A row that fails raises
:class:`~dessim.errors.TraceError` naming the file and line; nothing is silently dropped.
All quantities in the returned dataclasses are SI except the bandwidths, which keep GB/s (as
printed) in fields whose names say so.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from dessim.collectives.ops import get_op
from dessim.errors import TraceError
from dessim.trace.text_source import TextSource, load_json, load_text

__all__ = [
    "NCCL_TESTS_OPS",
    "NCCL_TESTS_DTYPES",
    "NCCL_TESTS_VERSION",
    "NcclTestsRow",
    "NcclTestsLog",
    "read_nccl_tests",
    "write_nccl_tests",
    "format_nccl_float",
]

#: The nccl-tests version whose layout :func:`write_nccl_tests` prints.
NCCL_TESTS_VERSION = "2.19.6"

#: dessim op name -> nccl-tests program (``<name>_perf``).
NCCL_TESTS_OPS: dict[str, str] = {
    "allreduce": "all_reduce_perf",
    "allgather": "all_gather_perf",
    "reducescatter": "reduce_scatter_perf",
    "alltoall": "alltoall_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "sendrecv": "sendrecv_perf",
}

#: nccl-tests data type name -> bytes per element (``test_typenames`` in src/common.cu; ``char``
#: and ``int`` are the names of NCCL 1 builds).
NCCL_TESTS_DTYPES: dict[str, int] = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1,
    "char": 1, "int": 4,
}

_DTYPE_ALIASES = {
    "fp32": "float", "float32": "float", "f32": "float", "fp16": "half", "float16": "half",
    "f16": "half", "bf16": "bfloat16", "fp64": "double", "float64": "double", "f64": "double",
    "fp8": "f8e4m3", "e4m3": "f8e4m3", "fp8_e4m3": "f8e4m3", "fp8e4m3": "f8e4m3",
    "e5m2": "f8e5m2", "fp8_e5m2": "f8e5m2", "fp8e5m2": "f8e5m2", "i8": "int8", "u8": "uint8",
    "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64",
}

#: Ops whose ``count`` column is per rank (size / n / type size).
_PER_RANK_COUNT = frozenset({"allgather", "reducescatter", "alltoall"})
#: Ops whose busbw factor does not depend on n (no rank count can be derived from it).
_FLAT_FACTOR = frozenset({"broadcast", "reduce", "sendrecv"})
_REDOP = {"allreduce": "sum", "reducescatter": "sum", "reduce": "sum", "sendrecv": "sum",
          "allgather": "none", "broadcast": "none", "alltoall": "none"}

_PROGRAM = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                      r"send_?recv|reduce)", re.IGNORECASE)
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d{1,9})\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+"
                        r"device\s+\d+\s+\[[^\]]*\]\s*(.*?)\s*$", re.ASCII)
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s+\S", re.ASCII)
_WHOLE = re.compile(r"^[0-9]{1,20}$")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.(\d*))?|\.(\d+))(?:[eE]([+-]?\d{1,6}))?$", re.ASCII)
_WRONG_NAMES = ("#wrong", "error")
_TIME_NAMES = ("time", "cputime")
# JSON numbers are printed with "%lf" (util.cu jsonDouble): six decimals.
_JSON_TOL = 5e-7


# --------------------------------------------------------------------------------------------
# Dataclasses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NcclTestsRow:
    """One result row: an out-of-place and an in-place measurement of one size.

    ``size_bytes`` and ``count`` are as printed (nccl-tests size semantics, module docstring);
    times are seconds per call; bandwidths GB/s (1e9 B/s) as printed. ``wrong`` is the
    ``#wrong`` count (new versions) or the ``error`` value (old versions), None where the log
    says N/A. ``redop``/``root`` are None when the log has no such column. ``line`` is the line
    of the row in the source (None for JSON input).
    """

    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: float | None
    in_place_time_s: float
    in_place_algbw_GBps: float
    in_place_busbw_GBps: float
    in_place_wrong: float | None
    line: int | None = None


@dataclass(frozen=True)
class NcclTestsLog:
    """A whole nccl-tests run.

    ``op`` is dessim's op name; ``ranks`` the number of ranks; ``devices`` the device names the
    log lists (one per ``#  Rank`` line, or one per process for JSON); ``avg_busbw_GBps`` the
    footer's average (None if absent); ``version`` the nccl-tests version line (None if absent);
    ``source`` the file name (or ``<text>``). ``cputime`` is True when the time columns hold CPU
    time (``-C 1``): then algbw is GPU-timed and not derived from the printed time.
    """

    op: str
    ranks: int
    devices: tuple[str, ...]
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_GBps: float | None
    version: str | None
    source: str
    cputime: bool = False


# --------------------------------------------------------------------------------------------
# Numbers as nccl-tests prints them
# --------------------------------------------------------------------------------------------


def _float_text(value: float, width: int) -> tuple[str, bool]:
    """``getFloatStr`` and whether the number fitted ``width`` (else the text is cut short)."""
    for spec in (".2f", ".1f", ".0f"):
        text = f"{value:{width}{spec}}"
        if len(text) <= width:
            return text, True
    text = f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"
    return text[:width], len(text) <= width   # snprintf(str, width+1, ...) truncates


def format_nccl_float(value: float, width: int) -> str:
    """``getFloatStr`` of nccl-tests 2.19.6 (src/util.cu): the first of ``%.2f``, ``%.1f``,
    ``%.0f`` that fits ``width`` characters (7 for times, 6 for bandwidths), else ``%.1e``
    (width 7) or ``%.0e`` (width 6), cut to ``width`` characters as ``snprintf`` does."""
    return _float_text(value, width)[0]


@dataclass(frozen=True, slots=True)
class _Printed:
    """A printed number and half a unit of its last printed digit (the print rounding)."""

    value: float
    tol: float
    text: str


def _printed(token: str, where: str, what: str) -> _Printed:
    m = _NUMBER.match(token)
    if not m:
        if token.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            raise TraceError(f"{where}: {what} is {token!r}, not a finite number")
        raise TraceError(f"{where}: {what} {token!r} is not a number")
    value = float(token)
    decimals = len(m.group(1) or m.group(2) or "")
    exponent = int(m.group(3)) if m.group(3) else 0
    try:
        tol = 0.5 * 10.0 ** (exponent - decimals)
    except OverflowError:
        tol = math.inf
    if not (math.isfinite(value) and math.isfinite(tol)):
        raise TraceError(f"{where}: {what} {token!r} is not a finite number")
    return _Printed(value, tol, token)


def _json_number(value: Any, where: str, what: str) -> _Printed:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where}: {what} must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise TraceError(f"{where}: {what} {value!r} is not a finite number")
    return _Printed(value, _JSON_TOL + 1e-12 * abs(value), repr(value))


# --------------------------------------------------------------------------------------------
# Ops, ranks and per-row checks
# --------------------------------------------------------------------------------------------


def _check_dtype(dtype: Any, where: str, shown: Any = None) -> str:
    """``dtype`` if it is an nccl-tests type name, else a TraceError naming ``shown``/``dtype``."""
    if not isinstance(dtype, str) or dtype not in NCCL_TESTS_DTYPES:
        raise TraceError(f"{where}: unknown data type {shown if shown is not None else dtype!r} "
                         f"(nccl-tests types: {', '.join(NCCL_TESTS_DTYPES)})")
    return dtype


def _normalise_op(op: str, where: str) -> str:
    key = str(op).strip().lower().replace("-", "").replace("_", "")
    if key.endswith("perf"):
        key = key[:-4]
    if key not in NCCL_TESTS_OPS:
        raise TraceError(f"{where}: unknown collective {op!r}; dessim reads nccl-tests logs of "
                         f"{', '.join(NCCL_TESTS_OPS)}")
    return key


def _op_from_program(program: str) -> str | None:
    """``all_reduce_perf`` / ``/path/all_reduce_perf_mpi`` / ``all_reduce`` -> ``allreduce``."""
    base = os.path.basename(program.strip()).lower()
    base = re.sub(r"(_perf)?(_mpi)?$", "", base)
    key = base.replace("_", "")
    return key if key in NCCL_TESTS_OPS else None


def _op_from_file_name(name: str) -> str | None:
    found = {m.group(1).lower().replace("_", "") for m in _PROGRAM.finditer(os.path.basename(name))}
    return found.pop() if len(found) == 1 else None


def _busbw_factor(op: str, ranks: int) -> float:
    return get_op(op).busbw_factor(ranks)


def _factor_interval(alg: _Printed, bus: _Printed) -> tuple[float, float] | None:
    """The busbw/algbw ratios the two printed values allow (None if algbw may be zero)."""
    if alg.value - alg.tol <= 0:
        return None
    lo = max(0.0, bus.value - bus.tol) / (alg.value + alg.tol)
    hi = (bus.value + bus.tol) / (alg.value - alg.tol)
    return lo, hi


def _ranks_from_factor(op: str, lo: float, hi: float) -> tuple[float, float]:
    """The rank counts n whose busbw factor lies in [lo, hi] (a real interval; may reach inf).

    2(n-1)/n (allreduce) and (n-1)/n tend to ``limit`` = 2 and 1; n = limit / (limit - factor).
    """
    limit = 2.0 if op == "allreduce" else 1.0

    def inverse(factor: float) -> float:
        return limit / (limit - factor) if factor < limit else math.inf

    return inverse(lo), inverse(hi)


@dataclass
class _RawRow:
    """A row as read, before the rank count is known."""

    where: str
    line: int | None
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    halves: tuple[tuple[_Printed, _Printed, _Printed, float | None], ...]   # time, alg, bus, wrong


def _derive_ranks(op: str, rows: Sequence[_RawRow], name: str) -> int:
    if op in _FLAT_FACTOR:
        raise TraceError(f"{name}: cannot tell the rank count: the log has no '#  Rank' lines, "
                         f"and busbw = algbw for {op} whatever the rank count; pass ranks=")
    n_lo, n_hi = 1.0, math.inf
    informative = False
    for row in rows:
        for _, alg, bus, _ in row.halves:
            interval = _factor_interval(alg, bus)
            if interval is None:
                continue
            lo, hi = _ranks_from_factor(op, *interval)
            if math.isinf(lo):
                limit = 2 if op == "allreduce" else 1
                raise TraceError(f"{row.where}: busbw/algbw = {bus.text}/{alg.text} is more than "
                                 f"{op} gives for any rank count (busbw < {limit} × algbw); is "
                                 f"this log really of {op}?")
            informative = True
            if hi < n_lo - 1e-9 or lo > n_hi + 1e-9:
                raise TraceError(f"{row.where}: busbw/algbw {bus.text}/{alg.text} does not fit the "
                                 f"rank count the rows above imply ({n_lo:.4g}..{n_hi:.4g}); "
                                 "the rows disagree about the number of ranks")
            n_lo, n_hi = max(n_lo, lo), min(n_hi, hi)
    candidates: set[int] | None = None
    if op in _PER_RANK_COUNT:
        for row in rows:
            if row.count > 0:
                per = row.count * NCCL_TESTS_DTYPES[row.dtype]
                if row.size % per:
                    raise TraceError(f"{row.where}: size {row.size} B is not a whole number of "
                                     f"{row.count} × {NCCL_TESTS_DTYPES[row.dtype]} B blocks")
                here = {row.size // per}
                if here == {0}:
                    raise TraceError(f"{row.where}: size {row.size} B is smaller than count "
                                     f"{row.count} × {NCCL_TESTS_DTYPES[row.dtype]} B")
                candidates = here if candidates is None else candidates & here
                if not candidates:
                    raise TraceError(f"{row.where}: size / (count × type size) = {here.pop()} "
                                     "ranks disagrees with the rows above")
    if candidates:
        n = candidates.pop()
        if informative and not (n_lo - 1e-9 <= n <= n_hi + 1e-9):
            raise TraceError(f"{name}: the count column says {n} ranks but busbw/algbw says "
                             f"{n_lo:.4g}..{n_hi:.4g}")
        return n
    if not informative:
        raise TraceError(f"{name}: cannot tell the rank count: no '#  Rank' lines and every "
                         "algbw is too small to solve busbw/algbw for it; pass ranks=")
    first = math.ceil(n_lo - 1e-9) if math.isfinite(n_lo) else None
    last = math.floor(n_hi + 1e-9) if math.isfinite(n_hi) else None
    if first is None or (last is not None and first > last):
        raise TraceError(f"{name}: busbw/algbw fits no whole rank count ({n_lo:.6g}..{n_hi:.6g})")
    if first != last:
        upper = "more" if last is None else str(last)
        raise TraceError(f"{name}: cannot tell the rank count: busbw/algbw fits {first} to "
                         f"{upper} ranks at print precision; pass ranks=")
    return first


def _check_row(row: _RawRow, op: str, ranks: int, ranks_from: str, cputime: bool) -> None:
    factor = _busbw_factor(op, ranks)
    typesize = NCCL_TESTS_DTYPES[row.dtype]
    expected = row.count * typesize * (ranks if op in _PER_RANK_COUNT else 1)
    if expected != row.size:
        per = f" × {ranks} ranks" if op in _PER_RANK_COUNT else ""
        raise TraceError(f"{row.where}: count {row.count} × {typesize} B ({row.dtype}){per} = "
                         f"{expected} B, but size is {row.size} B")
    for half, (time, alg, bus, _) in zip(("out-of-place", "in-place"), row.halves):
        slack = 1e-9 * max(1.0, bus.value)
        if abs(bus.value - factor * alg.value) > bus.tol + factor * alg.tol + slack:
            raise TraceError(
                f"{row.where}: {half} busbw {bus.text} GB/s is not algbw {alg.text} GB/s × "
                f"{factor:.6g} = {factor * alg.value:.6g} GB/s (the {op} factor for {ranks} ranks, "
                f"{ranks_from}), not even within print rounding")
        if cputime:
            continue  # -C 1: the printed time is CPU time, algbw comes from GPU time
        t_lo, t_hi = max(0.0, time.value - time.tol), time.value + time.tol
        alg_lo = row.size / (t_hi * 1e3) if t_hi > 0 else math.inf
        alg_hi = row.size / (t_lo * 1e3) if t_lo > 0 else math.inf
        if row.size == 0:
            alg_lo = alg_hi = 0.0
        slack = 1e-9 * max(1.0, alg.value)
        if alg.value + alg.tol + slack < alg_lo or alg.value - alg.tol - slack > alg_hi:
            implied = row.size / (time.value * 1e3) if time.value > 0 else math.inf
            raise TraceError(
                f"{row.where}: {half} algbw {alg.text} GB/s is not size {row.size} B / time "
                f"{time.text} us = {implied:.6g} GB/s, not even within print rounding")


def _finish(raw_rows: list[_RawRow], *, name: str, op: str | None, op_hint: str | None,
            ranks: int | None, ranks_hint: tuple[int, str] | None, devices: tuple[str, ...],
            avg: float | None, version: str | None, cputime: bool) -> NcclTestsLog:
    if op is not None:
        op = _normalise_op(op, name)
    elif op_hint is not None:
        op = op_hint
    else:
        op = _op_from_file_name(name)
        if op is None:
            raise TraceError(f"{name}: cannot tell which collective this log measures (no "
                             "'Collective test concluded' line and no op in the file name); pass "
                             f"op= (one of {', '.join(NCCL_TESTS_OPS)})")
    if ranks is not None:
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise TraceError(f"{name}: ranks must be a whole number >= 1, got {ranks!r}")
        ranks_from = "from the ranks= argument"
    elif ranks_hint is not None:
        ranks, ranks_from = ranks_hint
    else:
        ranks = _derive_ranks(op, raw_rows, name)
        ranks_from = "derived from busbw/algbw"
    rows = []
    for raw in raw_rows:
        _check_row(raw, op, ranks, ranks_from, cputime)
        (t0, a0, b0, w0), (t1, a1, b1, w1) = raw.halves
        rows.append(NcclTestsRow(raw.size, raw.count, raw.dtype, raw.redop, raw.root,
                                 t0.value / 1e6, a0.value, b0.value, w0,
                                 t1.value / 1e6, a1.value, b1.value, w1, raw.line))
    return NcclTestsLog(op, ranks, devices, tuple(rows), avg, version, name, cputime)


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    line: int
    pre: tuple[str, ...]          # size, count, type[, redop][, root]
    half: tuple[str, ...]         # time|cputime, algbw, busbw, #wrong|error[, extras]
    timestamp: bool
    cputime: bool

    @property
    def width(self) -> int:
        return len(self.pre) + 2 * len(self.half) + (2 if self.timestamp else 0)


def _is_header(tokens: list[str]) -> bool:
    return (len(tokens) >= 3 and tokens[:3] == ["size", "count", "type"]
            and "algbw" in tokens)


def _parse_header(tokens: list[str], where: str, line: int) -> _Header:
    bad = f"{where}: results-table header {' '.join(tokens)!r} is not one dessim knows"
    timestamp = tokens[-1] == "timestamp"
    if timestamp:
        tokens = tokens[:-1]
    starts = [i for i, t in enumerate(tokens) if t in _TIME_NAMES]
    if len(starts) != 2:
        raise TraceError(f"{bad}: expected two time columns (out-of-place, in-place)")
    pre = tuple(tokens[:starts[0]])
    first, second = tuple(tokens[starts[0]:starts[1]]), tuple(tokens[starts[1]:])
    if pre[:3] != ("size", "count", "type") or pre[3:] not in ((), ("redop",), ("root",),
                                                              ("redop", "root")):
        raise TraceError(f"{bad}: unexpected columns before the times")
    if first != second or first[1:3] != ("algbw", "busbw") or first[3:4] not in (
            ("#wrong",), ("error",)):
        raise TraceError(f"{bad}: each half must be time algbw busbw #wrong|error")
    return _Header(line, pre, first, timestamp, first[0] == "cputime")


def _parse_row(tokens: list[str], header: _Header, where: str, line: int) -> _RawRow:
    if len(tokens) != header.width:
        raise TraceError(f"{where}: {len(tokens)} columns, but the header at line {header.line} "
                         f"has {header.width}")
    values = dict(zip(header.pre, tokens))
    size_tok, count_tok = values["size"], values["count"]
    if not (_WHOLE.match(size_tok) and _WHOLE.match(count_tok)):
        raise TraceError(f"{where}: size {size_tok!r} and count {count_tok!r} must be whole "
                         "numbers")
    dtype = _check_dtype(values["type"], where)
    root = None
    if "root" in values:
        try:
            root = int(values["root"])
        except ValueError:
            raise TraceError(f"{where}: root {values['root']!r} is not a whole number") from None
    halves = []
    n_pre, n_half = len(header.pre), len(header.half)
    for k, label in enumerate(("out-of-place", "in-place")):
        cells = tokens[n_pre + k * n_half: n_pre + (k + 1) * n_half]
        time = _printed(cells[0], where, f"{label} {header.half[0]}")
        alg = _printed(cells[1], where, f"{label} algbw")
        bus = _printed(cells[2], where, f"{label} busbw")
        for value, what in ((time, header.half[0]), (alg, "algbw"), (bus, "busbw")):
            if value.value < 0:
                raise TraceError(f"{where}: {label} {what} {value.text} is negative")
        wrong = (None if cells[3] == "N/A"
                 else _printed(cells[3], where, f"{label} {header.half[3]}"))
        if wrong is not None and wrong.value < 0:
            raise TraceError(f"{where}: {label} {header.half[3]} {wrong.text} is negative")
        for extra, cell in zip(header.half[4:], cells[4:]):
            _printed(cell, where, f"{label} {extra}")
        halves.append((time, alg, bus, None if wrong is None else wrong.value))
    return _RawRow(where, line, int(size_tok), int(count_tok), dtype, values.get("redop"), root,
                   tuple(halves))


def _read_text(text: str, name: str, op: str | None, ranks: int | None) -> NcclTestsLog:
    header: _Header | None = None
    closed = False
    version = None
    programs: list[str] = []
    rank_devices: dict[int, str] = {}
    avg: float | None = None
    raw_rows: list[_RawRow] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = _MPI_TAG.sub("", raw_line, count=1)
        where = f"{name}:{number}"
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            tokens = body.split()
            if body.startswith("nccl-tests version") and len(tokens) >= 3:
                version = tokens[2]
            elif body.startswith(("Collective test starting:", "Collective test concluded:")):
                programs.append(body.split(":", 1)[1].strip())
            elif m := _RANK_LINE.match(stripped):
                rank_devices.setdefault(int(m.group(1)), m.group(2))
            elif _is_header(tokens):
                if header is not None:
                    raise TraceError(f"{where}: a second results table starts here (the first at "
                                     f"line {header.line}); give each test its own file")
                header = _parse_header(tokens, where, number)
            elif body.startswith("Out of bounds values"):
                closed = header is not None
            elif body.startswith("Avg bus bandwidth"):
                value = body.split(":", 1)[1].split()[0] if ":" in body else ""
                try:
                    avg = float(value)
                except ValueError:
                    raise TraceError(f"{where}: average bus bandwidth {value!r} is not a "
                                     "number") from None
                if not math.isfinite(avg):
                    avg = None  # nccl-tests prints nan when it measured nothing
            continue
        tokens = stripped.split()
        if header is None and _is_header(tokens):  # a log whose '#' were lost (e.g. in Markdown)
            header = _parse_header(tokens, where, number)
            continue
        if header is not None and not closed and _ROW_START.match(line):
            raw_rows.append(_parse_row(tokens, header, where, number))
    if header is None:
        raise TraceError(f"{name}: no nccl-tests results table (the '#  size  count  type ... "
                         "time  algbw  busbw' header) found")
    if not raw_rows:
        raise TraceError(f"{name}: the results table at line {header.line} has no rows")
    op_hint = None
    for program in programs if op is None else ():
        op_hint = _op_from_program(program)
        if op_hint is None:
            raise TraceError(f"{name}: the log is of {program!r}, which is not one of the "
                             f"collectives dessim reads ({', '.join(NCCL_TESTS_OPS)})")
    ranks_hint = None
    if rank_devices:
        ranks_hint = (len(rank_devices), f"{len(rank_devices)} '#  Rank' lines")
    devices = tuple(rank_devices[r] for r in sorted(rank_devices))
    return _finish(raw_rows, name=name, op=op, op_hint=op_hint, ranks=ranks,
                   ranks_hint=ranks_hint, devices=devices, avg=avg, version=version,
                   cputime=header.cputime)


# --------------------------------------------------------------------------------------------
# JSON (nccl-tests -J)
# --------------------------------------------------------------------------------------------


def _json_field(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise TraceError(f"{where}: missing key {key!r}")
    return obj[key]


def _json_whole(value: Any, where: str, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,20}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: {what} must be a whole number >= {minimum}, got {value!r}")
    return value


def _read_json(text: str, name: str, op: str | None, ranks: int | None) -> NcclTestsLog:
    doc = load_json(text, name)
    if not isinstance(doc, dict):
        raise TraceError(f"{name}: an nccl-tests JSON file is an object, got {type(doc).__name__}")
    results = _json_field(doc, "results", name)
    if not isinstance(results, list) or not results:
        raise TraceError(f"{name}: key 'results' must be a non-empty list")
    cputime = False
    raw_rows = []
    for i, entry in enumerate(results):
        where = f"{name}: key results[{i}]"
        if not isinstance(entry, dict):
            raise TraceError(f"{where}: must be an object")
        size = _json_whole(_json_field(entry, "size", where), where, "size")
        count = _json_whole(_json_field(entry, "count", where), where, "count")
        dtype = _check_dtype(_json_field(entry, "type", where), where)
        redop = entry.get("redop")
        if redop is not None and not isinstance(redop, str):
            raise TraceError(f"{where}: redop must be a string, got {redop!r}")
        root = entry.get("root")
        if root is not None:
            root = _json_whole(root, where, "root", minimum=-1)
        halves = []
        for key in ("out_of_place", "in_place"):
            half = _json_field(entry, key, where)
            hwhere = f"{where}.{key}"
            if not isinstance(half, dict):
                raise TraceError(f"{hwhere}: must be an object, got {half!r}")
            tkey = "cpu_time" if "cpu_time" in half else "time"
            cputime = cputime or tkey == "cpu_time"
            time = _json_number(_json_field(half, tkey, hwhere), hwhere, tkey)
            alg = _json_number(_json_field(half, "alg_bw", hwhere), hwhere, "alg_bw")
            bus = _json_number(_json_field(half, "bus_bw", hwhere), hwhere, "bus_bw")
            for value, what in ((time, tkey), (alg, "alg_bw"), (bus, "bus_bw")):
                if value.value < 0:
                    raise TraceError(f"{hwhere}: {what} {value.value!r} is negative")
            nwrong = half.get("nwrong")
            if nwrong is not None:
                nwrong = _json_number(nwrong, hwhere, "nwrong").value
            halves.append((time, alg, bus, nwrong))
        raw_rows.append(_RawRow(where, None, size, count, dtype, redop, root, tuple(halves)))
    op_hint = None
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        op_hint = _op_from_program(args[0])
    devices: tuple[str, ...] = ()
    ranks_hint = None
    found = doc.get("devices")
    config = doc.get("config")
    if isinstance(found, list) and found and all(isinstance(d, dict) for d in found):
        devices = tuple(str(d.get("device_info", "")) for d in found)
        if isinstance(config, dict):
            per_process = [config.get("nthreads"), config.get("ngpus")]
            if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in per_process):
                n = per_process[0] * per_process[1] * len(found)
                ranks_hint = (n, "nthreads × ngpus × processes in the JSON")
    avg = None
    average = doc.get("average_bus_bandwidth")
    if isinstance(average, dict):
        bw = average.get("bandwidth")
        if isinstance(bw, (int, float)) and not isinstance(bw, bool) and math.isfinite(bw):
            avg = float(bw)
    return _finish(raw_rows, name=name, op=op, op_hint=op_hint, ranks=ranks,
                   ranks_hint=ranks_hint, devices=devices, avg=avg, version=None, cputime=cputime)


def read_nccl_tests(path_or_text: TextSource, *, op: str | None = None,
                    ranks: int | None = None) -> NcclTestsLog:
    """Read an nccl-tests log (text as printed, or the ``-J`` JSON) and check every row.

    ``path_or_text`` follows :mod:`dessim.trace.text_source` (a path, text with a line break,
    or bytes; gzip is fine). The collective is ``op`` if given, else the program named by
    ``# Collective test concluded:``/``starting:`` (``all_reduce_perf`` -> ``allreduce``), else
    the one the file name mentions, else an error asks for ``op=``. The rank count is ``ranks``
    if given, else the number of distinct ``#  Rank`` lines, else it is solved from busbw/algbw
    of every row (and, for allgather/reducescatter/alltoall, from size / count), with an error
    when the rows disagree or leave several counts possible (always for broadcast, reduce and
    sendrecv, whose busbw factor is 1).
    """
    loaded = load_text(path_or_text)
    if loaded.text.lstrip().startswith("{"):
        return _read_json(loaded.text, loaded.name, op, ranks)
    return _read_text(loaded.text, loaded.name, op, ranks)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _row_times(item: Any, index: int) -> tuple[int, float, float]:
    where = f"rows[{index}]"
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise TraceError(f"{where}: expected (size_bytes, time_s) or (size_bytes, time_s, "
                         f"in_place_time_s), got {item!r}")
    size = item[0]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise TraceError(f"{where}: size_bytes must be a whole number >= 0, got {size!r}")
    times = []
    for what, t in zip(("time_s", "in_place_time_s"), (item[1], item[-1])):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise TraceError(f"{where}: {what} must be a finite number of seconds > 0, got {t!r}")
        times.append(float(t))
    return size, times[0], times[1]


def write_nccl_tests(op: str, ranks: int, rows: Iterable[Sequence[Any]], *, dtype: str = "float",
                     devices: Sequence[str] | str | None = None,
                     version: str = NCCL_TESTS_VERSION) -> str:
    """The text nccl-tests would print for ``rows`` of ``(size_bytes, time_s)`` (or
    ``(size_bytes, time_s, in_place_time_s)``; the in-place time defaults to the out-of-place one).

    Layout and number formatting follow nccl-tests 2.19.6 exactly (module docstring), with
    ``validation: 0`` semantics: ``#wrong`` is ``N/A`` since no data were checked. dessim prints
    only the preamble lines it can fill truthfully: the version (without the NCCL header/library
    codes, which it has no library to ask), the test name and one ``#  Rank`` line per rank
    (``devices`` names the device of each rank, or one name for all; default ``unknown``; pid 0 on
    host ``dessim``); not the run-parameter line (warm-up and iteration counts are not dessim's
    to know). ``size_bytes`` must be a whole number of ``dtype`` elements (per rank for allgather,
    reducescatter and alltoall). :func:`read_nccl_tests` reads the result back to print precision.
    """
    op = _normalise_op(op, "write_nccl_tests")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise TraceError(f"write_nccl_tests: ranks must be a whole number >= 1, got {ranks!r}")
    type_name = _check_dtype(_DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower()),
                             "write_nccl_tests", shown=dtype)
    typesize = NCCL_TESTS_DTYPES[type_name]
    if devices is None or isinstance(devices, str):
        names = [devices or "unknown"] * ranks
    else:
        names = [str(d) for d in devices]
        if len(names) != ranks:
            raise TraceError(f"write_nccl_tests: {len(names)} device names for {ranks} ranks")
    if any("\n" in d or "\r" in d for d in names):
        raise TraceError("write_nccl_tests: device names must be single lines")
    factor = _busbw_factor(op, ranks)
    per = typesize * (ranks if op in _PER_RANK_COUNT else 1)
    program = NCCL_TESTS_OPS[op]
    root = 0 if op in ("broadcast", "reduce") else -1
    out = [f"# nccl-tests version {version}", f"# Collective test starting: {program}", "#",
           "# Using devices"]
    for rank, device in enumerate(names):
        out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
                   % (rank, 0, 0, "dessim", rank, 0, 0, 0, device))
    blank = ("", "", "", "", "")
    out.append("#")
    out.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
               "in-place          " % blank)
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s "
               % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                  "time", "algbw", "busbw", "#wrong"))
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s "
               % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                  "(GB/s)", "(GB/s)", ""))
    busbws = []
    for index, item in enumerate(rows):
        size, t_out, t_in = _row_times(item, index)
        if size % per:
            raise TraceError(f"rows[{index}]: size {size} B is not a whole number of {type_name} "
                             f"elements ({typesize} B)"
                             + (f" per rank ({ranks} ranks)" if per != typesize else ""))
        line = "%12li  %12li  %8s  %6s  %6s" % (size, size // per, type_name, _REDOP[op],
                                                "%6i" % root)
        for t in (t_out, t_in):
            algbw = size / t / 1e9
            busbw = algbw * factor
            busbws.append(busbw)
            cells = []
            for value, width, what in ((t * 1e6, 7, "time"), (algbw, 6, "algbw"),
                                       (busbw, 6, "busbw")):
                text, fits = _float_text(value, width)
                if not fits:
                    raise TraceError(f"rows[{index}]: {what} {value:.6g} does not fit nccl-tests' "
                                     f"{width}-character column")
                cells.append(text)
            line += "  %7s  %6s  %6s    N/A" % tuple(cells)
        out.append(line)
    if not busbws:
        raise TraceError("write_nccl_tests: no rows to write")
    out.append("# %-20s : %d %s" % ("Out of bounds values", 0, "OK"))
    out.append("# %-20s : %g %s" % ("Avg bus bandwidth", sum(busbws) / len(busbws), ""))
    out.append("#")
    out.append(f"# Collective test concluded: {program}")
    out.append("#")
    return "\n".join(out) + "\n"
