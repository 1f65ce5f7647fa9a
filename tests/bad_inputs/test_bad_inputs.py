"""Every bad input of the corpus (``corpus.py``) fails cleanly: non-zero exit, no traceback,
and a message naming the file or flag at fault and the key or value that is wrong."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli

_spec = importlib.util.spec_from_file_location("bad_inputs_corpus", Path(__file__).with_name("corpus.py"))
corpus = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = corpus          # dataclasses look their module up there
_spec.loader.exec_module(corpus)


def test_the_corpus_is_large_and_its_ids_unique():
    ids = [c.id for c in corpus.CASES]
    assert len(ids) >= 200
    assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]
    assert all(c.expect for c in corpus.CASES)


@pytest.mark.parametrize("case", corpus.CASES, ids=[c.id for c in corpus.CASES])
def test_bad_input_fails_cleanly_and_says_where(case, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(corpus.ROOT))      # cases name shipped files relative to the repo
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    args = [a.replace("{d}", str(tmp_path)) for a in case.args]
    res = CliRunner().invoke(cli, args)
    output = res.output
    assert res.exit_code != 0, f"exit 0 on a bad input:\n{output}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"uncaught {type(res.exception).__name__}: {res.exception}") from res.exception
    assert "Traceback" not in output
    if "points failed" not in output:       # a sweep that ran reports failed points with exit 1
        assert res.exit_code == 2, f"exit {res.exit_code}, not 2:\n{output}"
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Usage:" not in output, f"not one error: line:\n{output}"
    missing = [w for w in case.expect if w.replace("{d}", str(tmp_path)) not in output]
    assert not missing, f"message lacks {missing}:\n{output}"
    if "points failed" not in output:       # a spec error: caught before any point ran
        assert not (tmp_path / "r.csv").exists() and not (tmp_path / "r.csv.journal.jsonl").exists()
