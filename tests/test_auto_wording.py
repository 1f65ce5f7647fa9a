"""auto's explanation never calls the algorithm it runs "not used": a point-to-point
operation (NCCL sends it peer to peer) and a forced algorithm NCCL does not have are chosen
without an NCCL estimate, and the explanation says so."""

from __future__ import annotations

from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.collectives import run_collective


def test_point_to_point_choice_is_reported_as_used():
    res = run_collective("alltoall", "64MiB", "switch:8")
    assert res.algorithm == "direct" and res.protocol == "Simple"
    assert "not used" not in res.explanation
    assert "direct/Simple: used without an estimate (point-to-point: NCCL sends it peer to peer)" \
        in res.explanation


def test_a_forced_algorithm_nccl_lacks_is_reported_as_used():
    out = CliRunner().invoke(cli, ["collective", "allreduce", "--algo", "rd", "--size", "1MiB",
                                   "-t", "switch:8"])
    assert out.exit_code == 0, out.output
    assert "rd/Simple: used without an estimate (not an NCCL algorithm: Simple)" in out.output
    assert "not used" not in out.output


def test_candidates_nccl_rejects_are_still_not_used():
    res = run_collective("allreduce", "64MiB", "dgx-h100:nodes=2", ranks="0-7,8-11")
    assert any(line.strip().startswith("nvlstree/") and "not used (" in line
               for line in res.explanation.splitlines())


def test_nccl_model_estimates_are_labelled_as_estimates():
    """The ranked candidates are NCCL's model times, not the simulated time printed below
    them (a 64 MiB NVLS all-reduce: 271.72 us in NCCL's model, 325.1 us simulated)."""
    out = CliRunner().invoke(cli, ["collective", "allreduce", "--size", "64MiB", "-t", "dgx-h100:nodes=1"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    k = next(i for i, ln in enumerate(lines) if "NCCL's model estimates, best first" in ln)
    assert lines[k + 1].strip().startswith("nvls/Simple: ")
    assert any(ln.startswith("time ") for ln in lines[k + 1:])
