"""Parsing and formatting of physical quantities at the edges of dessim.

Inside dessim every quantity is in SI base units: seconds, bytes, bytes/second, FLOP/s.
Human-readable strings are parsed only where data enters (CLI flags, YAML, inline specs)
with the functions below, which all follow the same rules:

* Sizes (bytes): ``4096``, ``64KiB``, ``1.5MB``, ``1GiB``. Decimal prefixes (k, K, M, G, T, P)
  are powers of 1000, binary prefixes (Ki, Mi, Gi, Ti, Pi) powers of 1024. A trailing ``B``
  means bytes; ``b`` (bits) is accepted for sizes too and divided by 8.
  A memory *capacity* (:func:`parse_capacity`: ``--hbm``, ``--expansion``) given as a string
  must name its unit: ``--hbm 40`` (40 bytes) is refused, it means ``40GB``.
* Bandwidths (bytes/second): ``50GB/s`` (GB = 1e9 bytes), ``400Gb/s`` and ``400Gbps``
  (bits: divided by 8), ``1.6Tb/s``, ``25GiB/s``. A number (int/float) is bytes/second; a
  *string* must name its unit (``"50"`` is refused: 50 B/s is never what was meant), except
  ``"0"``.
* Times (seconds): ``500ns``, ``1.5us`` (or ``µs``), ``2ms``, ``3s``, ``1min``. A number is
  seconds; a string must name its unit (``lat=5`` is refused, not taken as 5 s), except ``"0"``.
* Rates of computation (FLOP/s): ``312TFLOPs``, ``989.4TFLOP/s``, ``1e15``.

Numbers (int/float) are taken as already in SI units. Negative values, NaN, infinities,
malformed strings, sizes above :data:`MAX_SIZE` (1 EiB), bandwidths above
:data:`MAX_BANDWIDTH` (1 PB/s per direction) and a non-zero size that rounds to 0 bytes raise
:class:`~dessim.errors.UnitError` naming the value and, when given, what it was for
(``what="link bw"``).
"""

from __future__ import annotations

import math
import re

from dessim.errors import UnitError

__all__ = [
    "parse_size",
    "parse_capacity",
    "parse_bandwidth",
    "parse_time",
    "parse_flops",
    "parse_count",
    "format_size",
    "format_bandwidth",
    "format_time",
]

#: Largest size accepted (bytes): 1 EiB, far above any device or cluster memory; larger
#: values are typos (``1e30GB``) and would overflow 64-bit byte counts.
MAX_SIZE = 2 ** 60
#: Largest bandwidth accepted (bytes/second per direction): 1 PB/s, above any link or
#: memory (HBM3e is about 8 TB/s per GPU).
MAX_BANDWIDTH = 1e15

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PATTERN = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-zµ/]*)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
# Seconds per unit as (multiplier, divisor): dividing by 1e9 keeps "500ns" exactly 5e-7.
_TIME = {"s": (1.0, 1.0), "sec": (1.0, 1.0), "ms": (1.0, 1e3), "us": (1.0, 1e6), "µs": (1.0, 1e6),
         "ns": (1.0, 1e9), "ps": (1.0, 1e12), "min": (60.0, 1.0), "h": (3600.0, 1.0)}


def _require_unit(value: object, unit: str, number: float, what: str, kind: str,
                  examples: str) -> None:
    """A string without a unit (other than zero) is ambiguous: refuse it with examples."""
    if isinstance(value, str) and not unit and number != 0:
        raise UnitError(f"{what}: {value!r} has no unit; write the {kind} with one, e.g. "
                        f"{examples} (a bare number would mean {number:g} "
                        f"{_BARE_UNIT[kind]})")


#: What a bare number means, by kind of quantity (for :func:`_require_unit`'s message).
_BARE_UNIT = {"bandwidth": "B/s", "time": "s", "memory capacity": "bytes"}


def _check_max(number: float, cap: float, original: object, what: str, kind: str,
               shown: str) -> None:
    if number > cap:
        raise UnitError(f"{what}: {original!r} is above {shown}, not a plausible {kind} "
                        "(a typo in the exponent or unit?)")


def _split(value: object, what: str, kind: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"{what}: expected a {kind}, got the boolean {value!r}")
    if isinstance(value, (int, float)):
        return float(value), ""
    if not isinstance(value, str):
        raise UnitError(f"{what}: expected a {kind} (number or string), got {value!r}")
    m = _PATTERN.match(value)
    if not m:
        raise UnitError(f"{what}: cannot parse {value!r} as a {kind}")
    return float(m.group(1)), m.group(2)


def _check(number: float, original: object, what: str, kind: str, allow_zero: bool) -> float:
    if math.isnan(number) or math.isinf(number):
        raise UnitError(f"{what}: {original!r} is not a finite {kind}")
    if number < 0 or (number == 0 and not allow_zero):
        bound = "negative" if number < 0 else "zero"
        raise UnitError(f"{what}: {original!r} is {bound}; a {kind} must be "
                        f"{'>= 0' if allow_zero else '> 0'}")
    return number


def _prefix_multiplier(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    return None


def _byte_unit(unit: str) -> float | None:
    """Multiplier (to bytes) for a size unit such as 'KiB', 'MB', 'Gb', 'k', ''."""
    if unit == "":
        return 1.0
    if unit.endswith("B"):
        scale, prefix = 1.0, unit[:-1]
    elif unit.endswith("b"):
        scale, prefix = 1.0 / 8.0, unit[:-1]
    else:
        scale, prefix = 1.0, unit
    if prefix == "byte" or prefix == "bytes":
        return 1.0
    mult = _prefix_multiplier(prefix)
    return None if mult is None else mult * scale


def parse_size(value: object, what: str = "size", *, allow_zero: bool = True) -> int:
    """Parse a size in bytes (``"64KiB"``, ``"1.5MB"``, ``4096``) and return whole bytes.

    Fractional results are rounded to the nearest byte (``"1.5KiB"`` → 1536).
    """
    number, unit = _split(value, what, "size")
    mult = _byte_unit(unit)
    if mult is None:
        raise UnitError(f"{what}: unknown size unit {unit!r} in {value!r} "
                        "(use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB or bits with b)")
    nbytes = _check(number * mult, value, what, "size", allow_zero)
    _check_max(nbytes, MAX_SIZE, value, what, "size", "1 EiB")
    if nbytes != 0 and round(nbytes) == 0:
        raise UnitError(f"{what}: {value!r} is less than half a byte and would round to 0 "
                        "bytes; sizes are whole bytes")
    return int(round(nbytes))


def parse_capacity(value: object, what: str = "memory capacity", *,
                   allow_zero: bool = True) -> int:
    """A memory capacity in bytes (:func:`parse_size`) whose string form must name its unit:
    ``"40"`` is refused (a GPU of 40 bytes is a unit left out, not a study), ``"0"`` and
    numbers (bytes) are not."""
    if isinstance(value, str):
        number, unit = _split(value, what, "size")
        _require_unit(value, unit, number, what, "memory capacity", "'80GB', '40GiB' or '256GB'")
    return parse_size(value, what, allow_zero=allow_zero)


def parse_bandwidth(value: object, what: str = "bandwidth", *, allow_zero: bool = False) -> float:
    """Parse a bandwidth and return bytes/second (``"50GB/s"`` → 5e10, ``"400Gb/s"`` → 5e10)."""
    number, unit = _split(value, what, "bandwidth")
    if unit.endswith("/s"):
        unit = unit[:-2]
    elif unit.endswith("ps"):  # 400Gbps, 25GBps
        unit = unit[:-2]
    elif unit not in ("",):
        raise UnitError(f"{what}: {value!r} lacks '/s'; write e.g. '50GB/s' or '400Gb/s'")
    else:
        _require_unit(value, unit, number, what, "bandwidth", "'50GB/s' or '400Gb/s'")
    mult = _byte_unit(unit)
    if mult is None:
        raise UnitError(f"{what}: unknown bandwidth unit in {value!r} "
                        "(use e.g. B/s, MB/s, GB/s, GiB/s, Gb/s, Tb/s, Gbps)")
    bw = _check(number * mult, value, what, "bandwidth", allow_zero)
    _check_max(bw, MAX_BANDWIDTH, value, what, "bandwidth", "1 PB/s")
    return bw


def parse_time(value: object, what: str = "time", *, allow_zero: bool = True) -> float:
    """Parse a duration and return seconds (``"500ns"`` → 5e-7, ``"1.5us"`` → 1.5e-6)."""
    number, unit = _split(value, what, "time")
    _require_unit(value, unit, number, what, "time", "'500ns', '5us' or '2ms'")
    scale = _TIME.get(unit) if unit else (1.0, 1.0)
    if scale is None:
        raise UnitError(f"{what}: unknown time unit {unit!r} in {value!r} "
                        "(use ps, ns, us, ms, s, min, h)")
    return _check(number * scale[0] / scale[1], value, what, "time", allow_zero)


def parse_flops(value: object, what: str = "compute rate", *, allow_zero: bool = False) -> float:
    """Parse a compute rate and return FLOP/s (``"312TFLOPs"``, ``"989.4TFLOP/s"``, ``1e15``)."""
    number, unit = _split(value, what, "compute rate")
    for suffix in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
        if unit.endswith(suffix):
            unit = unit[: -len(suffix)]
            break
    mult = _prefix_multiplier(unit)
    if mult is None:
        raise UnitError(f"{what}: unknown unit in {value!r} (use e.g. 312TFLOP/s or 1e15)")
    return _check(number * mult, value, what, "compute rate", allow_zero)


#: Largest whole number a spec may give (2^53): every count above it loses digits in the
#: floating-point arithmetic of the model (``seq_len: 1e100`` read as 1e100 + 1.6e83).
MAX_COUNT = 2 ** 53


def parse_count(value: object, what: str = "count", *, minimum: int = 0, maximum: int | None = None) -> int:
    """Parse a whole number (``8``, ``"8"``, ``"1k"`` → 1000) that must be >= ``minimum`` and,
    when given, <= ``maximum``."""
    number, unit = _split(value, what, "whole number")
    mult = _DECIMAL.get(unit)
    if mult is None:
        billions = ", billions are G: '100G' = 1e11" if unit in ("B", "b", "bn") else ""
        raise UnitError(f"{what}: cannot parse {value!r} as a whole number (decimal suffixes "
                        f"k, M, G, T, P, E: '15T' = 15e12{billions})")
    number *= mult
    if not math.isfinite(number):
        raise UnitError(f"{what}: {value!r} is not a finite whole number")
    if number != int(number):
        raise UnitError(f"{what}: {value!r} is not a whole number")
    if number < minimum:
        raise UnitError(f"{what}: {value!r} must be >= {minimum}")
    if maximum is not None and number > maximum:
        shown = repr(value) if len(repr(value)) <= 24 else f"{number:.6g}"
        raise UnitError(f"{what}: {shown} is above {maximum:,}, the largest whole number "
                        "dessim takes here (a typo?)")
    return int(number)


def _format(value: float, steps: list[tuple[float, str]], unit_suffix: str, digits: int) -> str:
    for scale, name in steps:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g}{name}{unit_suffix}"
    return f"{value:.{digits}g}{steps[-1][1] if steps[-1][0] == 1 else ''}{unit_suffix}"


def format_size(nbytes: float, digits: int = 4) -> str:
    """Format bytes with binary prefixes: 1048576 → ``'1MiB'``."""
    steps = [(2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki"), (1.0, "")]
    return _format(float(nbytes), steps, "B", digits)


def format_bandwidth(bytes_per_s: float, digits: int = 4) -> str:
    """Format bytes/second with decimal prefixes: 5e10 → ``'50GB/s'``."""
    steps = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    return _format(float(bytes_per_s), steps, "B/s", digits)


def format_time(seconds: float, digits: int = 4) -> str:
    """Format seconds with the largest fitting unit: 1.5e-6 → ``'1.5us'``."""
    s = float(seconds)
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if abs(s) >= scale:
            return f"{s / scale:.{digits}g}{name}"
    return "0s" if s == 0 else f"{s / 1e-9:.{digits}g}ns"
