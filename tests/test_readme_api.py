"""The README's Python code runs as written, with only ``import dessim``; ``python -m dessim``
is the ``dessim`` command; every name ``dessim.__all__`` promises exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import dessim

README = Path(__file__).parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_python_blocks_run(capsys):
    blocks = python_blocks()
    assert blocks, "README has no python block"
    for code in blocks:
        namespace: dict = {}
        exec(compile(code, str(README), "exec"), namespace)   # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert "iteration_s" in out and "hierarchical" in out


def test_readme_uses_only_top_level_names():
    used = set()
    for code in python_blocks():
        used |= set(re.findall(r"\bdessim\.(\w+)", code))
        assert "from dessim" not in code, "the README's examples import only `dessim`"
    assert used and used <= set(dessim.__all__), used - set(dessim.__all__)


def test_all_names_resolve():
    for name in dessim.__all__:
        assert getattr(dessim, name) is not None, name
    assert dessim.simulate_workload.__module__.startswith("dessim.workload")


def test_python_dash_m_dessim():
    """One subprocess: ``python -m dessim`` is the command, down to its clean errors."""
    bad = subprocess.run([sys.executable, "-m", "dessim", "simulate", "no-such-workload"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown workload 'no-such-workload'")
