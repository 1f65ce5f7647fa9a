"""``compare`` without --algos compares every algorithm that can run the op on the group
(registry order, skipped ones listed with why); naming one that cannot run is an error that
lists every such one, why, and those that can."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.collectives import ALGORITHMS, compare_collectives
from dessim.collectives.algorithms import check_supported, split_applicable
from dessim.collectives.ops import get_op
from dessim.errors import CollectiveError
from dessim.topology import load_topology

TWO_NODES = "dgx-h100:nodes=2"


def _runnable(op: str, spec: str) -> list[str]:
    """Registry order, each algorithm kept exactly when check_supported accepts it."""
    topo, op_ = load_topology(spec), get_op(op)
    out = []
    for name, alg in ALGORITHMS.items():
        try:
            check_supported(op_, alg, tuple(range(topo.num_gpus)), topo, {})
        except CollectiveError:
            continue
        out.append(name)
    return out


def test_default_is_every_runnable_algorithm_in_registry_order():
    df = compare_collectives("allreduce", None, "1MiB", TWO_NODES)
    expected = _runnable("allreduce", TWO_NODES)
    assert df.attrs["algorithms"] == expected == df["algorithm"].tolist()
    assert "ring" in expected and "nvlstree" in expected and "nvls" not in expected
    # every allreduce algorithm not compared is reported as skipped, with why
    assert set(df.attrs["skipped"]) == {"nvls", "collnet", "collnetdirect"}
    assert "SHARP" in df.attrs["skipped"]["nvls"]
    assert df["winner"].sum() == 1


def test_default_is_deterministic_and_matches_naming_them():
    a = compare_collectives("allgather", None, "64KiB,4MiB", "switch:8")
    b = compare_collectives("allgather", a.attrs["algorithms"], "64KiB,4MiB", "switch:8")
    assert a.equals(b)


def test_naming_impossible_algorithms_lists_them_all_and_those_that_can():
    with pytest.raises(CollectiveError) as info:
        compare_collectives("allreduce", "ring,nvls,pairwise,tree", "1MiB", TWO_NODES)
    msg = str(info.value)
    assert "nvls (" in msg and "SHARP" in msg
    assert "pairwise (it runs alltoall, not allreduce)" in msg
    assert msg.endswith("can run: ring, tree (drop the others from --algos, or omit --algos "
                        "to compare every algorithm that can)")


def test_split_applicable_keeps_auto_and_the_callers_order():
    topo = load_topology(TWO_NODES)
    ok, why = split_applicable(get_op("allreduce"), tuple(range(16)), topo, {},
                               ["tree", "auto", "nvls", "ring"])
    assert ok == ["tree", "auto", "ring"] and list(why) == ["nvls"]


def test_cli_without_algos_says_what_it_compared_and_skipped():
    res = CliRunner().invoke(cli, ["compare", "allreduce", "--sizes", "1MiB,64MiB", "-t", TWO_NODES])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == ("algorithms: " + ", ".join(_runnable("allreduce", TWO_NODES))
                        + " (every one that can run allreduce)")
    assert [ln.split(":")[0] for ln in lines[1:4]] == ["skipped nvls", "skipped collnet",
                                                      "skipped collnetdirect"]
    assert "winners: 1MiB " in res.output


def test_cli_json_lists_algorithms_and_skipped():
    res = CliRunner().invoke(cli, ["compare", "alltoall", "--sizes", "1MiB", "-t", TWO_NODES, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["algorithms"] == ["direct", "pairwise", "rail"] and data["skipped"] == {}
    assert [r["algorithm"] for r in data["rows"]] == data["algorithms"]


@pytest.mark.parametrize("args,words", [
    (["allreduce", "--algos", "ring,nvls,tree", "-t", TWO_NODES], ["nvls (", "can run: ring, tree"]),
    (["sendrecv", "-t", TWO_NODES], ["no algorithm can run sendrecv", "exactly 2 ranks"]),
])
def test_cli_cannot_run_is_one_error_line(args, words):
    res = CliRunner().invoke(cli, ["compare", *args, "--sizes", "1MiB"])
    assert res.exit_code == 2
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output
    assert all(w in errors[0] for w in words), res.output


def test_help_and_docs_state_the_registry_order():
    from pathlib import Path

    order = ", ".join(ALGORITHMS)
    res = CliRunner().invoke(cli, ["compare", "--help"], terminal_width=10_000)
    assert order in " ".join(res.output.split())
    docs = Path(__file__).resolve().parents[1] / "docs" / "collectives.md"
    assert order in " ".join(docs.read_text().split())


def test_a_skip_reason_names_its_algorithm_once():
    """The reason nvls cannot span two DGX H100 nodes without SHARP wraps the SHARP check's
    own message; the algorithm's name is not repeated inside it."""
    _, why = split_applicable(get_op("allreduce"), tuple(range(16)),
                              load_topology("dgx-h100:nodes=2"))
    assert "no switch of this topology reduces in the network" in why["nvls"]
    assert "nvls:" not in why["nvls"]
