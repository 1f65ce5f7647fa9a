"""Locating data files shipped with dessim (ready-made topologies, workloads, ...).

Two layouts are supported:

* an installed wheel: the files live inside the package, ``dessim/_data/<kind>/`` (pyproject's
  ``force-include`` copies the repository's ``topologies/`` and ``workloads/`` there);
* an editable checkout: the files live at the repository root, ``<repo>/<kind>/``.

The package copy wins when both exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dessim.errors import SpecError

__all__ = ["data_dir", "data_files", "find_data_file", "shipped_topologies", "read_yaml"]

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
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {what} {str(p)!r}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: invalid YAML: {exc}") from None
