"""Locating data files shipped with dessim (ready-made topologies, workloads, ...), and what
a run needs from its environment: optional packages (:data:`EXTRAS`, :func:`install_hint`),
writable output paths (:func:`check_output`) and resource limits (:func:`limit`).

Two layouts are supported:

* an installed wheel: the files live inside the package, ``dessim/_data/<kind>/`` (pyproject's
  ``force-include`` copies the repository's ``topologies/`` and ``workloads/`` there);
* an editable checkout: the files live at the repository root, ``<repo>/<kind>/``.

The package copy wins when both exist.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from dessim.errors import LimitError, OutputError, SpecError

__all__ = ["data_dir", "data_files", "find_data_file", "shipped_topologies", "read_yaml",
           "read_text", "Extra", "EXTRAS", "install_hint", "require_extra", "check_output", "output_format",
           "check_output_dir", "Limit", "LIMITS", "limit", "check_limit"]

_PACKAGE = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path | None:
    """Directory of shipped data of ``kind`` (e.g. ``"topologies"``), or None if absent."""
    for candidate in (_PACKAGE / "_data" / kind, _PACKAGE.parent / kind):
        if candidate.is_dir():
            return candidate
    return None


def data_files(kind: str, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> dict[str, Path]:
    """Shipped files of ``kind`` by name (file stem), sorted by name."""
    directory = data_dir(kind)
    if directory is None:
        return {}
    files = [p for p in directory.iterdir() if p.is_file() and p.suffix in suffixes]
    return {p.stem: p for p in sorted(files, key=lambda p: p.name)}


def find_data_file(kind: str, name: str, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> Path | None:
    """The shipped file of ``kind`` called ``name`` (with or without its suffix), or None."""
    files = data_files(kind, suffixes)
    stem = name
    for suffix in suffixes:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
    return files.get(stem)


def shipped_topologies() -> dict[str, Path]:
    """Ready-made topology files (``topologies/*.yaml``) by name."""
    return data_files("topologies")


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """The parsed content of a YAML (or JSON) file; a :class:`~dessim.errors.SpecError`
    naming the file if it cannot be read (``what`` says which kind: "topology file", ...)
    or is not valid YAML."""
    p = Path(path)
    text = read_text(p, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{what} {str(p)!r}: {_syntax_error(text, p, exc)}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # PyYAML's own constructors fail with these on e.g. a timestamp 2024-13-45
        raise SpecError(f"{what} {str(p)!r}: invalid YAML value: {exc}") from None


def _syntax_error(text: str, path: Path, exc: yaml.YAMLError) -> str:
    """One line saying where ``text`` stops parsing: as JSON for a ``.json`` file (a Hugging
    Face config.json, an ASTRA-sim system file), else as YAML (line and column, 1-based)."""
    if path.suffix.lower() == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            return f"invalid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        except (ValueError, RecursionError):
            pass
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"invalid YAML ({where}{problem}{f', {context}' if context else ''})"


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of a UTF-8 file; a :class:`~dessim.errors.SpecError` naming the file (and
    ``what`` it is) if it is missing, a directory, unreadable or not valid UTF-8."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"{what} {str(p)!r} is a directory, not a file")
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {what} {str(p)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{what} {str(p)!r} is not valid UTF-8 text (byte {exc.start}: "
                        f"{exc.object[exc.start:exc.start + 1]!r}); save it as UTF-8") from None


# ---------------------------------------------------------------- optional packages
@dataclass(frozen=True)
class Extra:
    """An optional dependency: the module that must import and the pip extra providing it."""

    name: str      #: the extra's name in pyproject.toml ([project.optional-dependencies])
    module: str    #: the import name that must be found

    def available(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


#: The optional dependencies, by extra name (pyproject.toml's optional-dependencies).
EXTRAS: dict[str, Extra] = {e.name: e for e in (
    Extra("plot", "matplotlib"), Extra("html", "plotly"), Extra("parquet", "pyarrow"),
    Extra("chakra", "google.protobuf"), Extra("dask", "distributed"), Extra("ray", "ray"))}


def _checkout_root() -> Path | None:
    """The repository root when dessim runs from a source checkout (editable install)."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and not (_PACKAGE / "_data").is_dir() else None


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra``: from the checkout when dessim runs from one
    (``pip install -e '/repo[plot]'``; ``dessim[plot]`` would fetch another copy), else from
    the package index (``pip install 'dessim[plot]'``)."""
    root = _checkout_root()
    return f"pip install -e '{root}[{extra}]'" if root else f"pip install 'dessim[{extra}]'"


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`~dessim.errors.OutputError` naming ``what`` needs it unless the extra's
    module is importable."""
    e = EXTRAS[extra]
    if not e.available():
        raise OutputError(f"{what} needs {e.module}, which is not installed: {install_hint(extra)}")


def _check_dir(directory: Path, what: str, shown: str) -> None:
    if not directory.exists():
        raise OutputError(f"{what} {shown!r}: directory {str(directory)!r} does not exist "
                          "(create it first; dessim does not create directories)")
    if not directory.is_dir():
        raise OutputError(f"{what} {shown!r}: {str(directory)!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {shown!r}: directory {str(directory)!r} is not writable")
    # os.access says yes to root everywhere (/proc, /sys, read-only bind mounts of some file
    # systems): create and remove a file to know, so a run never ends in a failed write
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".dessim-write-check-")
    except OSError as exc:
        raise OutputError(f"{what} {shown!r}: cannot create files in directory "
                          f"{str(directory)!r} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def output_format(path: str | os.PathLike, formats: Mapping[str, str | None]) -> str | None:
    """The key of ``formats`` that names ``path``'s format: the longest suffix its name ends
    with, case-insensitively (``.json.gz`` before ``.gz``); for a path that exists and is
    not a regular file (``/dev/null``, a pipe), which has no suffix to go by, the first
    (default) format; None if no format matches."""
    p = Path(os.fspath(path))
    if p.exists() and not p.is_file():
        return next(iter(formats), None)
    name = p.name.lower()
    return next((s for s in sorted(formats, key=len, reverse=True) if name.endswith(s)), None)


def check_output(path: str | os.PathLike, what: str,
                 formats: Mapping[str, str | None] | None = None, hint: str = "") -> Path:
    """Check now, before any work, that ``path`` can be written: its directory exists and is
    writable, it is not a directory, its suffix is one of ``formats`` (suffix → the extra that
    writes it, or None; :func:`output_format`) and that extra is installed. Returns the path;
    raises :class:`~dessim.errors.OutputError` naming ``what`` and the path otherwise, with
    ``hint`` after the suffixes it takes when the suffix is the fault."""
    text = os.fspath(path)
    if not text.strip():
        raise OutputError(f"{what}: empty path")
    p = Path(text)
    if p.is_dir():
        raise OutputError(f"{what} {text!r} is a directory; give a file name")
    if formats is not None:
        suffix = output_format(p, formats)
        if suffix is None:
            raise OutputError(f"{what} {text!r}: unknown format {p.suffix or '(no suffix)'!r} "
                              f"(use {', '.join(formats)}{'; ' + hint if hint else ''})")
        if formats[suffix]:
            require_extra(formats[suffix], f"{what} {text!r} ({suffix})")
    _check_dir(p.parent, what, text)
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{what} {text!r} exists and is not writable")
    return p


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """Check that directory ``path`` exists and is writable, or can be made (its parent
    exists and is writable): only the last level is ever created."""
    text = os.fspath(path)
    p = Path(text)
    if p.exists():
        if not p.is_dir():
            raise OutputError(f"{what} {text!r} exists and is not a directory")
        _check_dir(p, what, text)
    else:
        _check_dir(p.parent, what, text)
    return p


# ---------------------------------------------------------------- resource limits
@dataclass(frozen=True)
class Limit:
    """A documented resource limit: the default, the environment variable raising it, the
    unit of what it counts and why it exists."""

    name: str
    default: int
    env: str
    unit: str
    help: str

    def value(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        try:
            v = int(raw)
        except ValueError:
            raise LimitError(f"environment variable {self.env}={raw!r}: expected a whole "
                             "number") from None
        if v < 1:
            raise LimitError(f"environment variable {self.env}={raw!r}: must be >= 1")
        return v


#: Resource limits (docs/limits.md). Inputs beyond them are refused before anything is
#: allocated, with the limit and how to raise it.
LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("topology_nodes", 2_000_000, "DESSIM_MAX_TOPOLOGY_NODES", "nodes and links",
          "a topology takes about 1 KB of memory per node and link"),
    Limit("sweep_points", 1_000_000, "DESSIM_MAX_SWEEP_POINTS", "points",
          "a sweep's points are expanded in memory before the first runs"),
)}


def limit(name: str) -> int:
    """The current value of limit ``name`` (its environment variable, else the default)."""
    return LIMITS[name].value()


def check_limit(name: str, requested: int, what: str) -> None:
    """Raise :class:`~dessim.errors.LimitError` if ``requested`` exceeds limit ``name``."""
    lim = LIMITS[name]
    cap = lim.value()
    if requested > cap:
        raise LimitError(f"{what}: about {requested:,} {lim.unit}, more than the limit of "
                         f"{cap:,} ({lim.help}); raise it with the environment variable "
                         f"{lim.env}=N if the machine has the memory (docs/limits.md)")
