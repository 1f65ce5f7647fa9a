"""The text report labels each refused shortcut by what refused it: a refused micro-batch
extrapolation was not printed at all, and when it was the only refusal of a run whose stages
were not merged it was printed as "stage merging refused"."""

from __future__ import annotations

from dessim.cli.simulate_cmd import _print_shortcuts

EXTRAPOLATION = ("micro-batch extrapolation: no steady state within the micro-batch budget "
                 "(at micro-batches 8, 12, 16: exposed_comm_s.pp is not steady)")
MERGING = "TP group [0, 1]: channel n0.gpu0->n0.nvsw is also used by group [0, 2]"


def _summary(refused: list[str]) -> dict:
    return {"granularity": "stage", "fold": {}, "extrapolation": None,
            "shortcuts": {"auto": ["granularity"], "stage_merged": False, "tp_closed_form_groups": 0,
                          "folded": True, "merged_image_runs": 0, "lane_family_runs": 0,
                          "lane_orbit_runs": 0, "channel_quotient": None, "collective_memo": None,
                          "refused": refused}}


def _lines(capsys, refused: list[str]) -> list[str]:
    _print_shortcuts(_summary(refused))
    return capsys.readouterr().out.splitlines()[1:]


def test_each_refusal_under_its_own_label(capsys):
    assert _lines(capsys, [MERGING, EXTRAPOLATION]) == [
        f"    stage merging refused: {MERGING}",
        "    micro-batch extrapolation refused (every micro-batch replayed): "
        + EXTRAPOLATION.split(": ", 1)[1]]


def test_an_extrapolation_refusal_is_not_called_stage_merging(capsys):
    lines = _lines(capsys, [EXTRAPOLATION, "lane families: no symmetry"])
    assert not any("stage merging" in ln for ln in lines)
    assert lines[0].startswith("    micro-batch extrapolation refused")


def test_a_channel_quotient_over_no_channel_is_not_reported(capsys):
    # 'simulate mixtral-8x7b -t dgx-h100:nodes=2 --pp 2 --ep 4 --schedule zb-h1' printed
    # "channel quotient (0 channels rated as 0 blocks)"
    s = _summary([])
    s["shortcuts"].update(lane_family_runs=5, channel_quotient={"channels": 0, "blocks": 0})
    _print_shortcuts(s)
    line = capsys.readouterr().out
    assert "lane families on 5" in line and "channel quotient" not in line
    s["shortcuts"]["channel_quotient"] = {"channels": 16, "blocks": 4}
    _print_shortcuts(s)
    assert "channel quotient (16 channels rated as 4 blocks)" in capsys.readouterr().out


def test_the_task_line_names_the_granularity_the_run_has():
    """Stage granularity asked (or chosen by auto) but merging refused: the tasks are layer
    tasks, and the task line says so instead of "stage granularity"."""
    from click.testing import CliRunner

    from dessim.cli.main import cli

    out = CliRunner().invoke(cli, ["simulate", "llama3-8b", "-t", "dgx-h100:nodes=2", "--tp", "8",
                                   "--pp", "2", "--global-batch", "16", "--schedule", "dualpipe"]).output
    assert "stage merging refused" in out
    assert " tasks (layer granularity)" in out
    merged = CliRunner().invoke(cli, ["simulate", "llama3-8b", "-t", "dgx-h100:nodes=2", "--tp", "8",
                                      "--pp", "2", "--global-batch", "16"]).output
    assert " tasks (stage granularity)" in merged
