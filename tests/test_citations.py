"""Citations point at sources a reader of the repository can open.

Docstrings, comments, docs and data once cited an unshipped collection of notes (its
README's sections, its simulation notes, its kernel and NCCL notes, a shared directory
outside the repository). A reader cannot open those; every fact now cites its public source
by a short name of docs/references.md. This test keeps such citations from coming back.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What is scanned: the package, its docs, tests, data and tools, and the top-level README.
SCANNED = ["dessim", "docs", "tests", "workloads", "calibration", "topologies", "benchmarks",
           "examples", "validation", "README.md"]
TEXT_SUFFIXES = {".py", ".md", ".rst", ".txt", ".yaml", ".yml", ".toml", ".json", ".csv",
                 ".cfg", ".ini"}

_STORE_FILES = r"(?:README|simulation-notes|kernels|nccl|chakra-et)\.md"
#: Ways the unshipped notes were cited. ``nccl.md`` / ``kernels.md`` are allowed as files of
#: a named public repository (``cuda/nccl.md`` of li-plus/playground), never bare.
FORBIDDEN = [
    (re.compile(r"reference\s+README", re.I), "its README"),
    (re.compile(r"simulation-notes", re.I), "its simulation notes"),
    (re.compile(r"reference\s+(?:notes|store|collection)", re.I), "the notes as a whole"),
    (re.compile(r"reference/" + _STORE_FILES, re.I), "one of its files"),
    (re.compile(r"(?:\.\./|/work/)shared\b"), "the shared directory"),
    (re.compile(r"(?<![\w./-])(?:kernels|nccl|chakra-et)\.md"), "one of its files, bare"),
]


def scanned_files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                    yield p


def unshipped_citations(text: str) -> list[tuple[int, str, str]]:
    """(line number, matched text, what it cites) of every citation of the unshipped notes."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for pattern, what in FORBIDDEN:
            for m in pattern.finditer(line):
                found.append((lineno, m.group(0), what))
    return found


def test_the_patterns_catch_the_old_citations_and_spare_public_files():
    old = ["(reference README §1.1)", "simulation-notes §2", "/work/shared/reference/README.md",
           "../shared/reference/nccl.md", "see kernels.md", "nccl.md §3.1",
           "[U: not in the reference store]", "reference notes", "chakra-et.md"]
    for text in old:
        assert unshipped_citations(text), text
    public = ["GitHub repo `li-plus/playground`, file `cuda/nccl.md`, commit b85070fb",
              "github.com/NVIDIA/nccl-tests `doc/PERFORMANCE.md`", "docs/collectives.md",
              "docs/references.md", "the reference system", "README.md"]
    for text in public:
        assert not unshipped_citations(text), text


def test_no_file_cites_the_unshipped_notes():
    this = Path(__file__).resolve()
    bad = []
    for path in scanned_files():
        if path.resolve() == this:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, match, what in unshipped_citations(text):
            bad.append(f"{path.relative_to(ROOT)}:{lineno}: {match!r} cites {what}")
    assert not bad, ("cite the public source by its short name in docs/references.md "
                     "instead:\n" + "\n".join(bad))
