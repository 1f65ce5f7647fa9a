"""`dessim topology show|list` through click's CliRunner."""

import json

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli


@pytest.fixture
def run():
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, ["topology", *args])


def test_show_human_summary(run):
    res = run("show", "ring:8,bw=50GB/s,lat=500ns")
    assert res.exit_code == 0, res.output
    assert "gpus       8" in res.output
    assert "diameter   4 hops" in res.output
    assert "bisection  100GB/s" in res.output


def test_show_json(run):
    res = run("show", "dgx-h100:2", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["gpus"] == 16 and data["diameter"] == 8 and data["dims"] == [8, 2]
    # NIC links + 8 leaves x 2 spines (2 nodes per leaf: two port-speed uplinks each)
    assert data["nodes"]["nic"] == 16 and data["links"]["ib"] == 16 + 8 * 2
    assert data["bisection_bw_GBps"] == pytest.approx(8 * 47)
    assert data["bisection_bw"] == pytest.approx(8 * 47e9)
    assert data["injection_bw"]["min"] == pytest.approx(433e9)
    assert data["meta"]["builder"] == "dgx_h100"


def test_show_shipped_file(run):
    res = run("show", "torus-4x4", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["bisection_bw_GBps"] == pytest.approx(800)


def test_show_bad_spec_is_a_one_line_error(run):
    res = run("show", "ring:8,bw=fast")
    assert res.exit_code == 2
    assert "error: ring spec 'ring:8,bw=fast': bw: cannot parse 'fast'" in res.output
    assert "Traceback" not in res.output


def test_list_shows_kinds_defaults_and_shipped_files(run):
    res = run("list")
    assert res.exit_code == 0
    for text in ("ring:N", "leafspine:HOSTS,LEAVES", "oversub=1.0", "dgx-h100:NODES",
                 "dgx-h100-4node", "torus-4x4"):
        assert text in res.output
    data = json.loads(run("list", "--json").output)
    assert data["kinds"]["ring"]["keys"]["n"]["required"] is True
    assert data["kinds"]["pcie"]["keys"]["gen"]["default"] == 4
    assert "cxl-node" in data["shipped"]


def test_help(run):
    assert "Build and inspect" in run("--help").output
    assert "--json" in run("show", "--help").output


@pytest.mark.parametrize("spec, line", [("fc:4", "diameter   1 hop (GPU"),
                                        ("ring:2", "diameter   1 hop (GPU"),
                                        ("ring:8", "diameter   4 hops (GPU")])
def test_show_counts_one_hop_in_the_singular(run, spec, line):
    res = run("show", spec)
    assert res.exit_code == 0, res.output
    assert line in res.output
