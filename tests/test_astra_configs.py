"""ASTRA-sim network YAML and system JSON files (tests/data/astra/, ASTRA-sim's own examples)
load as a dessim topology and collective settings; `dessim replay --astra-network
--astra-system` equals the replay on the equivalent dessim spelling, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.collectives.astra import astra_system, load_astra_system
from dessim.errors import SpecError
from dessim.topology import load_topology
from dessim.topology.astra import ASTRA_GB, astra_network, load_astra_network

ASTRA = Path(__file__).parent / "data" / "astra"
CHAKRA = Path(__file__).parent / "data" / "chakra"


def test_one_dimensional_examples():
    ring = load_astra_network(ASTRA / "Ring_4npus.yml")
    assert ring.num_gpus == 4 and ring.dims == (4,)
    links = [d for _, _, d in ring.graph.edges(data=True)]
    assert len(links) == 4 and {(d["bw"], d["lat"]) for d in links} == {(50 * ASTRA_GB, 500e-9)}
    hgx = load_topology(str(ASTRA / "HGX-H100-validated.yml"))     # recognised by load_topology
    assert hgx.num_gpus == 8 and hgx.graph.number_of_nodes() == 9           # 8 NPUs + a switch
    assert {d["bw"] for _, _, d in hgx.graph.edges(data=True)} == {400 * 2 ** 30}
    fc = load_astra_network(ASTRA / "FullyConnected_8npus.yml")
    assert fc.graph.number_of_edges() == 8 * 7 // 2


def test_three_dimensional_example_addresses_npus_as_astra_sim():
    topo = load_astra_network(ASTRA / "Ring_FullyConnected_Switch.yml")
    assert topo.num_gpus == 64 and topo.dims == (2, 8, 4)
    # ASTRA-sim: NPU 47 of [2, 8, 4] has address [1, 7, 2]
    assert tuple(topo.coords(47)) == (1, 7, 2)
    edge = topo.graph.edges["gpu0", "gpu1"]           # dimension 0: the 2-NPU ring
    assert (edge["bw"], edge["lat"]) == (200 * ASTRA_GB, 50e-9)
    edge = topo.graph.edges["gpu0", "gpu2"]           # dimension 1: fully connected
    assert (edge["bw"], edge["lat"]) == (100 * ASTRA_GB, 500e-9)
    switches = [n for n, d in topo.graph.nodes(data=True) if d.get("kind") == "switch"]
    assert len(switches) == 16                         # one per line of dimension 2


@pytest.mark.parametrize("doc, message", [
    ({"topology": ["Torus"], "npus_count": [4], "bandwidth": [1], "latency": [1]}, "'Torus' is not supported"),
    ({"topology": ["Ring"], "npus_count": [4, 2], "bandwidth": [1], "latency": [1]}, "npus_count must be a list of 1"),
    ({"topology": ["Ring"], "npus_count": [1], "bandwidth": [1], "latency": [1]}, "whole numbers > 1"),
    ({"topology": ["Ring"], "npus_count": [4], "bandwidth": [0], "latency": [1]}, "bandwidth[0] = 0 GB/s"),
    ({"topology": ["Ring"], "npus_count": [4], "bandwidth": [1]}, "missing key 'latency'"),
    ({"topology": ["Ring"], "npus_count": [4], "bandwidth": [1], "latency": [1], "bw": 2}, "unknown key 'bw'"),
])
def test_bad_network_files_name_the_key(doc, message):
    with pytest.raises(SpecError, match="net.yml") as err:
        astra_network(doc, "net.yml")
    assert message in str(err.value)


def test_system_examples_map_to_algorithms_and_chunks():
    s = load_astra_system(ASTRA / "Ring_4chunks.json", 1)
    assert s.settings.chunks == 4
    assert s.algos == {"allreduce": "ring", "allgather": "ring", "reducescatter": "ring"}
    assert "alltoall" in s.unsupported                       # no ring all-to-all in dessim
    assert any(n.startswith("endpoint-delay=10: not modelled") for n in s.notes)
    assert any(n.startswith("peak-perf=900") for n in s.notes)
    multi = load_astra_system(ASTRA / "Ring_4chunks.json", 3)
    assert multi.algos["allreduce"] == "hierarchical"          # a ring in each dimension
    one = astra_system({"all-reduce-implementation": ["oneHalvingDoubling"],
                        "all-to-all-implementation": ["direct", "direct"]}, 2)
    assert one.algos == {"allreduce": "hd"} and "alltoall" in one.unsupported
    dbt = astra_system({"all-reduce-implementation": ["doubleBinaryTree"]}, 1)
    assert dbt.algos == {"allreduce": "dbtree"}


def test_bad_system_files():
    with pytest.raises(SpecError, match="unknown key 'all-reduce-implemention'"):
        astra_system({"all-reduce-implemention": ["ring"]}, 1, "sys.json")
    with pytest.raises(SpecError, match="preferred-dataset-splits must be a whole number"):
        astra_system({"preferred-dataset-splits": 0}, 1, "sys.json")
    assert "mixes implementations" in astra_system(
        {"all-reduce-implementation": ["ring", "direct"]}, 2).unsupported["allreduce"]


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_replay_on_astra_files_equals_the_dessim_spelling():
    trace = str(CHAKRA / "allreduce_64MiB_8npu" / "ALL_REDUCE")
    astra = _json(["replay", trace, "--astra-network", str(ASTRA / "HGX-H100-validated.yml"),
                   "--astra-system", str(ASTRA / "HGX-H100-validated.json"), "--json"])
    plain = _json(["replay", trace, "-t", "switch:8,bw=400GiB/s,lat=936.25ns", "--algo", "ring",
                   "--chunks", "4", "--json"])
    assert astra["makespan_s"] == plain["makespan_s"]
    info = astra["astra_system"]
    assert info["algorithms"]["allreduce"] == "ring" and info["chunks"] == 4
    assert any("all-to-all" in n and "unused by this trace" in n for n in info["notes"])


def test_replay_stops_on_an_implementation_the_trace_needs():
    trace = str(CHAKRA / "chakra_generator_8npu" / "ALL_TO_ALL")
    args = ["replay", trace, "--astra-network", str(ASTRA / "HGX-H100-validated.yml"),
            "--astra-system", str(ASTRA / "HGX-H100-validated.json")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "all-to-all-implementation" in res.output
    ok = CliRunner().invoke(cli, [*args, "--allow-unsupported", "--json"])
    assert ok.exit_code == 0, ok.output
    assert any("replayed with auto" in n for n in json.loads(ok.output)["astra_system"]["notes"])
    both = CliRunner().invoke(cli, ["replay", trace, "-t", "ring:8",
                                    "--astra-network", str(ASTRA / "HGX-H100-validated.yml")])
    assert both.exit_code == 2 and "--topology or --astra-network" in both.output
