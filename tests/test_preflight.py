"""Every output is checked before any work: a missing or non-directory parent, an unknown
format or a missing optional package fails at once (exit 2, the flag named), nothing is
simulated, and no directory is ever created."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dessim import resources
from dessim.cli.main import cli
from dessim.errors import OutputError
from dessim.resources import Extra, check_output, check_output_dir, install_hint

SWEEP = {"name": "tiny", "kind": "collective",
         "base": {"topology": "ring:4,bw=50GB/s,lat=500ns",
                  "collective": {"op": "allreduce", "size": "1MiB"}},
         "axes": {"engine.collectives.algo": ["ring", "tree"]}}

#: (command line with OUT where the output goes, the flag that names it)
WRITERS = [
    (["simulate", "gpt3-1.3b", "--timeline", "OUT.json"], "--timeline"),
    (["simulate", "gpt3-1.3b", "--gantt", "OUT.png"], "--gantt"),
    (["simulate", "gpt3-1.3b", "--spans", "OUT.csv"], "--spans"),
    (["simulate", "gpt3-1.3b", "--save-graph", "OUT.json"], "--save-graph"),
    (["simulate", "gpt3-1.3b", "--export-chakra", "OUT"], "--export-chakra"),
    (["run", "GRAPH", "-t", "ring:4", "--timeline", "OUT.json.gz"], "--timeline"),
    (["replay", "x", "-t", "ring:4", "--spans", "OUT.parquet"], "--spans"),
    (["collective", "allreduce", "--size", "1MiB", "-t", "ring:4", "--timeline", "OUT.json"],
     "--timeline"),
    (["compare", "allreduce", "--algos", "ring", "--sizes", "1MiB", "-t", "ring:4", "--csv",
      "OUT.csv"], "--csv"),
    (["compare", "allreduce", "--algos", "ring", "--sizes", "1MiB", "-t", "ring:4", "--plot",
      "OUT.png"], "--plot"),
    (["cluster", "workloads/cluster-two-jobs.yaml", "--gantt", "OUT.html"], "--gantt"),
    (["sweep", "SPEC", "--out", "OUT.csv"], "--out"),
    (["sweep", "SPEC", "--plots", "OUT/plots"], "--plots"),
    (["explore", "gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--out", "OUT.csv"], "--out"),
    (["calibrate", "--kernels", "K", "--out", "OUT.yaml"], "--out"),
]


def _args(template: list[str], out: str, tmp_path) -> list[str]:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    graph = tmp_path / "g.json"
    graph.write_text("{}")
    names = {"SPEC": str(spec), "GRAPH": str(graph),
             "K": "tests/data/calibration/kernel_times_h100_published.csv"}
    return [names.get(a, a.replace("OUT", out)) for a in template]


@pytest.mark.parametrize("template,flag", WRITERS, ids=[f"{t[0]} {f}" for t, f in WRITERS])
def test_an_output_into_a_missing_directory_fails_before_any_work(template, flag, tmp_path):
    missing = tmp_path / "no" / "such"
    res = CliRunner().invoke(cli, _args(template, str(missing / "out"), tmp_path))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert flag in res.output and "does not exist" in res.output, res.output
    assert not (tmp_path / "no").exists()          # nothing created


#: A directory that exists, passes os.access(W_OK) for root, and where no file can be made.
NO_FILES_HERE = Path("/proc")


@pytest.mark.skipif(not (NO_FILES_HERE / "self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("template,flag", WRITERS, ids=[f"{t[0]} {f}" for t, f in WRITERS])
def test_an_output_into_a_directory_that_takes_no_files_fails_before_any_work(template, flag, tmp_path):
    out = NO_FILES_HERE if "OUT/plots" in template else NO_FILES_HERE / "out"   # a file in /proc
    res = CliRunner().invoke(cli, _args(template, str(out), tmp_path))
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert flag in res.output and "cannot create files in directory '/proc'" in res.output, res.output


def test_the_write_check_leaves_nothing_behind(tmp_path):
    check_output(tmp_path / "t.json", "timeline")
    check_output_dir(tmp_path / "plots", "plots")
    assert list(tmp_path.iterdir()) == []


def test_an_output_under_a_file_or_onto_a_directory_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is not a directory"):
        check_output(tmp_path / "f" / "t.json", "timeline")
    with pytest.raises(OutputError, match="is a directory; give a file name"):
        check_output(tmp_path, "timeline")
    with pytest.raises(OutputError, match=r"unknown format '.pdf' \(use .png, .html, .htm\)"):
        check_output(tmp_path / "g.pdf", "Gantt chart", {".png": "plot", ".html": "html",
                                                         ".htm": "html"})
    with pytest.raises(OutputError, match="exists and is not a directory"):
        check_output_dir(tmp_path / "f", "plots")
    assert check_output_dir(tmp_path / "new", "plots") == tmp_path / "new"
    assert not (tmp_path / "new").exists()


def test_a_missing_extra_fails_before_the_sweep_runs_with_a_hint_that_works(tmp_path, monkeypatch):
    monkeypatch.setitem(resources.EXTRAS, "parquet", Extra("parquet", "no_such_module_x1"))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    res = CliRunner().invoke(cli, ["sweep", str(spec), "--out", str(tmp_path / "r.parquet"),
                                   "--no-progress"])
    assert res.exit_code == 2
    assert "--out" in res.output and "needs no_such_module_x1" in res.output
    assert install_hint("parquet") in res.output
    assert not list(tmp_path.glob("r.parquet*"))     # no journal: no point ran


def test_install_hint_from_a_checkout_installs_the_checkout():
    hint = install_hint("plot")
    # this test suite runs from the repository: the hint must point at it, not at PyPI
    assert hint.startswith("pip install -e '") and hint.endswith("[plot]'")
