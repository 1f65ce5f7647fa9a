"""run_collective / compare_collectives / auto / the collective and compare commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dessim.cli.collective_cmd import command as collective_cmd
from dessim.cli.compare_cmd import command as compare_cmd
from dessim.collectives import compare_collectives, parse_ranks, run_collective
from dessim.collectives import CollectiveSettings
from dessim.collectives.auto import choose
from dessim.collectives.ops import get_op
from dessim.errors import CollectiveError
from dessim.topology import load_topology

SPEC = "switch:8,bw=50GB/s,lat=500ns"


@pytest.mark.parametrize("text,expected", [("0-3", (0, 1, 2, 3)), ("0,2,4,6", (0, 2, 4, 6)),
                                           ("0-1,6-7", (0, 1, 6, 7)), ([5, 1], (5, 1)),
                                           (None, tuple(range(8)))])
def test_rank_groups(text, expected):
    assert parse_ranks(text, load_topology(SPEC)) == expected


@pytest.mark.parametrize("ranks,match", [("0-8", "rank 8 does not exist"), ("3-1", "parse"),
                                         ("a", "parse"), ("1,1", "twice"), ([0, -1], "-1")])
def test_bad_rank_groups(ranks, match):
    with pytest.raises(CollectiveError, match=match):
        run_collective("allreduce", "1MiB", SPEC, ranks=ranks)


@pytest.mark.parametrize("size", [0, -1, "0B", "-4KiB", "lots"])
def test_bad_sizes_are_collective_errors(size):
    with pytest.raises(CollectiveError, match="size"):
        run_collective("allreduce", size, SPEC)


def test_unknown_op_and_algorithm_list_valid_names():
    with pytest.raises(CollectiveError, match="allreduce.*alltoall"):
        run_collective("allsum", "1MiB", SPEC)
    with pytest.raises(CollectiveError, match="ring.*hierarchical"):
        run_collective("allreduce", "1MiB", SPEC, algo="butterfly")


def test_group_of_one_rank_is_rejected():
    with pytest.raises(CollectiveError, match="at least 2"):
        run_collective("allreduce", "1MiB", SPEC, ranks="3")


def test_result_figures_are_consistent():
    res = run_collective("allreduce", "64MiB", SPEC, algo="ring", ranks="0-3")
    assert res.algbw_GBps == pytest.approx(64 * 2**20 / res.time_s / 1e9)
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * 2 * 3 / 4)
    assert res.transfers == 2 * 3 * 4 and res.events > 0 and res.wall_s > 0
    assert res.link_util_max == max(r["utilisation"] for r in res.link_util)
    assert {r["link"] for r in res.link_util} >= {"gpu0->sw0", "sw0->gpu1"}
    assert "gpu5->sw0" not in {r["link"] for r in res.link_util}   # outside the group


def test_auto_chooses_as_nccls_model_and_explains():
    from dessim.collectives.nccl import algo_time, allowed, nccl_system

    topo = load_topology("dgx-a100:nodes=4")
    group = tuple(range(32))
    small = choose(get_op("allreduce"), group, 1024.0, topo)
    large = choose(get_op("allreduce"), group, 2.0**30, topo)
    assert (small.algorithm, small.protocol) == ("dbtree", "LL")     # NCCL's Tree, LL
    assert (large.algorithm, large.protocol) == ("ring", "Simple")
    assert "auto chose dbtree with protocol LL" in small.explanation()
    assert "NCCL 2.30.7" in small.explanation()
    # the choice is the argmin of NCCL's estimates over what its rules allow
    system = nccl_system(group, topo)
    best = min((algo_time("allreduce", a, p, 2.0**30, system), a, p)
               for a, p in allowed("allreduce", system)
               if algo_time("allreduce", a, p, 2.0**30, system) is not None)
    assert (best[1], best[2]) == ("ring", "Simple")
    assert large.estimates[0].time_s == pytest.approx(best[0])


def test_a_forced_algorithm_gets_ncclss_best_protocol_and_non_nccl_ones_simple():
    topo = load_topology("dgx-h100:nodes=1")
    ring = choose(get_op("allreduce"), tuple(range(8)), 8.0, topo,
                  CollectiveSettings(algo="ring"))
    assert (ring.algorithm, ring.protocol) == ("ring", "LL")
    hd = choose(get_op("allreduce"), tuple(range(8)), 8.0, topo, CollectiveSettings(algo="hd"))
    assert (hd.algorithm, hd.protocol) == ("hd", "Simple")
    a2a = choose(get_op("alltoall"), tuple(range(8)), 8 * 2.0**20, topo)
    assert (a2a.algorithm, a2a.protocol) == ("direct", "Simple")      # NCCL's p2p


def test_auto_reports_algorithms_that_cannot_run_the_group():
    # NVLSTree needs the same number of ranks on every node
    res = run_collective("allreduce", "64MiB", "dgx-h100:nodes=2", algo="auto",
                         ranks="0-7,8-11")
    reasons = {e.algorithm: e.reason for e in res.auto.estimates}
    assert "same number of ranks" in reasons["nvlstree"]
    assert res.algorithm != "nvlstree"


def test_compare_gives_a_winner_per_size():
    df = compare_collectives("allreduce", "ring,tree,hd", "1KiB,16MiB", SPEC)
    assert len(df) == 6
    assert df.groupby("size_bytes")["winner"].sum().tolist() == [1, 1]
    for size, part in df.groupby("size_bytes"):
        assert part.loc[part["winner"], "time_s"].iloc[0] == part["time_s"].min()


def test_compare_rejects_an_algorithm_that_cannot_run_the_op():
    with pytest.raises(CollectiveError, match="pairwise"):
        compare_collectives("allreduce", "ring,pairwise", "1MiB", SPEC)


# --------------------------------------------------------------------------- CLI
def test_collective_command_json():
    out = CliRunner().invoke(collective_cmd, ["all-reduce", "--algo", "ring", "--size", "1MiB",
                                              "--topology", SPEC, "--ranks", "0-3", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    for key in ("time_s", "algbw_GBps", "busbw_GBps", "events", "wall_s", "link_util_max"):
        assert key in data
    assert data["ranks"] == 4 and data["algorithm"] == "ring"


def test_collective_command_text_with_auto_explanation():
    out = CliRunner().invoke(collective_cmd, ["allreduce", "--algo", "auto", "--size", "1KiB",
                                              "--topology", SPEC, "--channels", "2"])
    assert out.exit_code == 0, out.output
    assert "auto chose" in out.output and "busbw" in out.output


def test_collective_command_bad_input_is_a_dessim_error():
    out = CliRunner().invoke(collective_cmd, ["allreduce", "--algo", "pairwise", "--size",
                                              "1MiB", "--topology", SPEC])
    assert isinstance(out.exception, CollectiveError)


def test_compare_command_writes_csv_and_plot(tmp_path):
    csv, png = tmp_path / "out.csv", tmp_path / "out.png"
    out = CliRunner().invoke(compare_cmd, ["allreduce", "--algos", "ring,tree,hd,direct",
                                           "--sizes", "1KiB,1MiB", "--topology", SPEC,
                                           "--csv", str(csv), "--plot", str(png)])
    assert out.exit_code == 0, out.output
    assert "winners:" in out.output
    assert csv.read_text().startswith("size_bytes,algorithm")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF"), (".png", b"\x89PNG")])
def test_compare_plots_every_offered_format_the_same_bytes_each_run(tmp_path, suffix, magic):
    # .svg (offered by --plot) used to end in a traceback: PNG's "Software" metadata key
    # was passed to the SVG writer, which refuses it
    outs = []
    for i in range(2):
        path = tmp_path / f"p{i}{suffix}"
        out = CliRunner().invoke(compare_cmd, ["allreduce", "--algos", "ring,direct", "--sizes",
                                               "1KiB,1MiB", "--topology", SPEC, "--plot", str(path)])
        assert out.exit_code == 0 and out.exception is None, out.output
        outs.append(path.read_bytes())
    assert outs[0].startswith(magic) and outs[0] == outs[1]


def test_run_collective_takes_the_collective_settings_by_their_field_names():
    """One spelling: every field of CollectiveSettings is a keyword of run_collective (what
    EngineOptions.run_collective_kwargs passes), and the shortcuts use their Shortcuts names."""
    import inspect
    from dataclasses import fields

    from dessim.collectives import CollectiveSettings, run_collective
    from dessim.engine import EngineOptions

    params = inspect.signature(run_collective).parameters
    assert {f.name for f in fields(CollectiveSettings)} <= set(params)
    assert set(EngineOptions().run_collective_kwargs()) <= set(params)
