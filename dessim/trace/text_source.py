"""Turning a reader's input (a path, a string of text or raw bytes) into checked text.

The calibration readers (:mod:`dessim.trace.nccl_tests`, :mod:`dessim.trace.kernel_csv`,
:mod:`dessim.trace.kineto`) share one convention for what they accept:

* an :class:`os.PathLike` (e.g. :class:`pathlib.Path`) is a file to read;
* ``bytes`` are the content itself;
* a ``str`` holding a line break is the content itself; any other ``str`` is a file name.

Content that starts with the gzip magic bytes is decompressed first (``.json.gz`` traces, gzipped
logs). The bytes must be UTF-8 (a leading byte-order mark is dropped); anything else raises
:class:`~dessim.errors.TraceError` naming the source, the line and the offending byte, never a
``UnicodeDecodeError``. :func:`load_json` parses JSON text the same way: a syntax error, a
``NaN``/``Infinity`` literal or nesting too deep to parse becomes a TraceError with the line and
column.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from typing import Any

from dessim.errors import TraceError

__all__ = ["TextSource", "load_text", "load_json"]

_GZIP_MAGIC = b"\x1f\x8b"

#: What a reader accepts: see the module docstring.
TextSource = str | bytes | os.PathLike


@dataclass(frozen=True, slots=True)
class _Loaded:
    text: str
    name: str       #: the file path, or "<text>" / "<bytes>" for in-memory content


def _decode(data: bytes, name: str) -> str:
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{name}: not a readable gzip file ({exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{name}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start})") from None


def load_text(source: TextSource) -> _Loaded:
    """The decoded text of ``source`` and the name to use in messages (see module docstring)."""
    if isinstance(source, bytes):
        return _Loaded(_decode(source, "<bytes>"), "<bytes>")
    if isinstance(source, str) and ("\n" in source or "\r" in source or source == ""):
        return _Loaded(source, "<text>")
    if not isinstance(source, (str, os.PathLike)):
        raise TraceError(f"expected a path, text or bytes, got {type(source).__name__}")
    name = os.fspath(source)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    try:
        with open(name, "rb") as fh:
            data = fh.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise TraceError(f"{name}: cannot read: {reason}") from None
    return _Loaded(_decode(data, name), name)


def _no_constant(literal: str) -> Any:
    raise ValueError(f"{literal} is not a JSON number")


def load_json(text: str, name: str) -> Any:
    """Parse JSON ``text``; every malformed input is a TraceError naming ``name`` and the line."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})"
                         ) from None
    except ValueError as exc:  # NaN / Infinity, or an integer with too many digits
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{name}: JSON nested too deeply to read") from None
