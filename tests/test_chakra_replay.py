"""Replaying Chakra execution traces on dessim's engine (dessim.trace.convert, `dessim replay`).

Expected times are computed here from the alpha-beta formulas of the topologies used
(a link: latency alpha + n / B per message; ring all-reduce on p ranks:
2 (p - 1) (alpha + n / (p B)), Thakur et al. 2005 in docs/references.md), never copied from a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from click.testing import CliRunner

from dessim.collectives import CollectiveSettings
from dessim.engine import EngineOptions, simulate
from dessim.errors import TraceError
from dessim.topology import load_topology
from dessim.topology.graph import Topology
from dessim.trace import (COLLECTIVES, ChakraNode, ChakraTrace, IOInfo, RankTrace,
                          chakra_to_taskgraph, nearest_memory_node, parse_rank_map, read_chakra,
                          replay_chakra)

DATA = Path(__file__).parent / "data" / "chakra"
GEN = DATA / "chakra_generator_8npu"

ALPHA = 500e-9          # s, one link
BW = 50e9               # bytes/s per direction
RING8 = "ring:8,bw=50GB/s,lat=500ns"
#: The textbook collective model: the hand-computed times below hold exactly.
RAW = EngineOptions(collectives=CollectiveSettings(protocol="raw"), record_links=False)
MiB = 2**20


def ring_allreduce(p: int, n: float, alpha: float = ALPHA, bw: float = BW) -> float:
    """2(p-1) steps of one n/p block per link: 2(p-1)(alpha + n/(p B))."""
    return 2 * (p - 1) * (alpha + n / (p * bw))


def fixture(name: str) -> str:
    return str(next(DATA.glob(f"*/{name}.0.et"))).removesuffix(".0.et")


def approx(x: float):
    return pytest.approx(x, rel=1e-9, abs=1e-15)


def cli():
    """The dessim CLI with `replay` registered (main.py's COMMAND_MODULES is not ours)."""
    from dessim.cli import replay_cmd
    from dessim.cli.main import cli as group

    if "replay" not in group.commands:
        group.add_command(replay_cmd.command)
    return group


# -------------------------------------------------------------------- every fixture
REPLAYABLE = {  # prefix -> topology to replay it on
    "ALL_REDUCE": RING8, "ALL_GATHER": RING8, "REDUCE_SCATTER": RING8, "ALL_TO_ALL": RING8,
    "BROADCAST": RING8, "BARRIER": RING8, "one_comp_node": RING8,
    "two_comp_nodes_independent": RING8, "two_comp_nodes_dependent": RING8,
    "one_metadata_node_all_types": RING8, "one_remote_mem_load_node": "pcie:8,gen=5",
    "one_remote_mem_store_node": "cxl:gpu=h100,expanders=4", "ctrl_chain": RING8,
    "dp_overlap": RING8, "ring_sendrecv": RING8,
    "ar_dim0_only": "multidim:ring(8,bw=50GB/s,lat=500ns)xring(4,bw=50GB/s,lat=500ns)",
}


def all_fixture_prefixes() -> set[str]:
    return {p.name.rsplit(".", 2)[0] for p in DATA.glob("*/*.0.et")}


def test_the_table_covers_every_fixture():
    lone = {"one_comm_send_node", "one_comm_recv_node"}
    assert all_fixture_prefixes() == set(REPLAYABLE) | lone


@pytest.mark.parametrize("name", sorted(REPLAYABLE))
def test_every_fixture_replays(name):
    trace = read_chakra(fixture(name))
    topo = load_topology(REPLAYABLE[name])
    result = replay_chakra(trace, topo, EngineOptions(collectives=CollectiveSettings(
        algo="ring" if name != "ALL_TO_ALL" else "auto"), record_links=False))
    graph = chakra_to_taskgraph(trace, topo)
    replayed = sum(1 for r in trace.ranks for n in r.nodes.values() if n.type != "METADATA_NODE")
    assert len(graph) == replayed  # one task per non-metadata node
    assert result.makespan_s >= 0
    assert len(result.span_records) == replayed


@pytest.mark.parametrize("name,node_id,attr,role", [
    ("one_comm_send_node", 112, "comm_dst", "receiver"),
    ("one_comm_recv_node", 120, "comm_src", "sender")])
def test_lone_send_and_recv_are_rejected(name, node_id, attr, role):
    with pytest.raises(TraceError) as err:
        replay_chakra(fixture(name), RING8)
    msg = str(err.value)
    assert f"{name}.0.et: node {node_id} " in msg  # the file and the node id
    assert f"without {attr}: a replayer cannot tell the {role}" in msg


# -------------------------------------------------------------------- hand-computed times
@pytest.mark.parametrize("size", [MiB, 64 * MiB])
def test_single_allreduce_on_a_ring(size):
    name = {MiB: "allreduce_1MiB_8npu", 64 * MiB: "allreduce_64MiB_8npu"}[size]
    result = replay_chakra(str(DATA / name / "ALL_REDUCE"), RING8, RAW, algo="ring")
    assert result.makespan_s == approx(ring_allreduce(8, size))


@pytest.mark.parametrize("comm_type,expected", [
    # ring all-gather / reduce-scatter: p-1 steps of one block (dessim size / p) per link.
    # ALL_GATHER's comm_size (1 MiB) is one rank's part: dessim size 8 MiB, blocks of 1 MiB.
    ("ALL_GATHER", 7 * (ALPHA + MiB / BW)),
    # REDUCE_SCATTER's comm_size is the whole buffer: blocks of 1 MiB / 8.
    ("REDUCE_SCATTER", 7 * (ALPHA + MiB / 8 / BW)),
    ("ALL_REDUCE", ring_allreduce(8, MiB)),
    # BARRIER: an all-reduce of one float32.
    ("BARRIER", ring_allreduce(8, 4)),
])
def test_generator_collectives_follow_chakra_size_semantics(comm_type, expected):
    result = replay_chakra(str(GEN / comm_type), RING8, RAW, algo="ring")
    assert result.makespan_s == approx(expected)


def test_sendrecv_ring_all_at_once():
    # Every rank sends 1 MiB to its neighbour at the same time: one flow per link direction.
    result = replay_chakra(fixture("ring_sendrecv"), RING8)
    assert result.makespan_s == approx(ALPHA + MiB / BW)


def test_dependency_chain_of_two_compute_nodes():
    assert replay_chakra(str(GEN / "two_comp_nodes_dependent"), RING8).makespan_s == approx(10e-6)
    # Independent GPU kernels share the rank's compute stream: one after the other too.
    assert replay_chakra(str(GEN / "two_comp_nodes_independent"), RING8).makespan_s == approx(10e-6)


def test_ctrl_deps_order_the_allreduce_after_the_compute():
    result = replay_chakra(fixture("ctrl_chain"), RING8, RAW, algo="ring")
    assert result.makespan_s == approx(20e-6 + ring_allreduce(8, MiB))
    spans = result.spans()
    ar = spans[spans["kind"] == "collective"]
    assert (ar["start_s"] >= 20e-6 - 1e-15).all()


def test_dp_overlap_makespan_by_hand():
    # fwd 100us -> bwd_L2 50us -> AR_L2 (64 MiB) ; bwd_L2 -> bwd_L1 50us -> AR_L1 ; both -> opt 10us.
    # AR_L2 starts at 150us; bwd_L1 ends at 200us, but AR_L1 waits for AR_L2 on the group's
    # stream (one NCCL stream per process group) -> starts at 150us + T; optimizer after it.
    t = ring_allreduce(8, 64 * MiB)
    assert t > 50e-6  # so AR_L1 really waits for AR_L2, not for bwd_L1
    result = replay_chakra(fixture("dp_overlap"), RING8, RAW, algo="ring")
    assert result.makespan_s == approx(150e-6 + 2 * t + 10e-6)
    per_rank = result.rank_table()
    assert per_rank["exposed_comm_s"].iloc[0] == approx(2 * t - 50e-6)


def test_involved_dim_makes_eight_rank_groups_on_a_2d_network():
    topo = load_topology("multidim:ring(8,bw=50GB/s,lat=500ns)xring(4,bw=50GB/s,lat=500ns)")
    assert topo.dims == (8, 4)
    graph = chakra_to_taskgraph(fixture("ar_dim0_only"), topo, algo="ring")
    groups = {t.rank: t.group for t in graph}
    assert groups[5] == tuple(range(8))
    assert groups[13] == tuple(range(8, 16))
    assert groups[31] == tuple(range(24, 32))
    assert len({t.coll_id for t in graph}) == 4
    result = simulate(graph, topo, EngineOptions(record_links=False, collectives=CollectiveSettings(protocol="raw")))
    # Four disjoint 8-GPU rings at once: each is a plain ring all-reduce.
    assert result.makespan_s == approx(ring_allreduce(8, 64 * MiB))


def test_involved_dim_needs_a_topology_with_enough_dimensions():
    with pytest.raises(TraceError, match=r"involved_dim \[True, False\] needs a topology"):
        chakra_to_taskgraph(fixture("ar_dim0_only"))
    three_dims = load_topology("multidim:ring(8)xring(2)xring(2)")
    with pytest.raises(TraceError, match=r"ar_dim0_only.0.et: node 0 .*involved_dim \[True, False\] "
                                         r"has 2 entries but topology .* has 3 dimensions \[8, 2, 2\]"):
        chakra_to_taskgraph(fixture("ar_dim0_only"), three_dims)
    # Flags beyond the topology's dimensions are ignored (ASTRA-sim's default is 4 flags).
    graph = chakra_to_taskgraph(fixture("ar_dim0_only"), load_topology("ring:32"))
    assert {t.group for t in graph} == {tuple(range(32))}


# -------------------------------------------------------------------- memory nodes
def gpus_with_own_memory(n: int = 8) -> Topology:
    """n GPUs on a switch; GPU i has its own host memory mem<i> over 10 GB/s, 100 ns."""
    g = nx.Graph()
    g.add_node("sw", kind="switch")
    for i in range(n):
        g.add_node(f"gpu{i}", kind="gpu", device="H100")
        g.add_edge(f"gpu{i}", "sw", type="custom", bw=BW, lat=ALPHA)
        g.add_node(f"mem{i}", kind="host_mem")
        g.add_edge(f"gpu{i}", f"mem{i}", type="pcie", bw=10e9, lat=100e-9)
    return Topology(g, "own-mem")


@pytest.mark.parametrize("name,direction", [("one_remote_mem_load_node", "to_hbm"),
                                            ("one_remote_mem_store_node", "from_hbm")])
def test_memory_nodes_use_the_nearest_memory(name, direction):
    topo = gpus_with_own_memory()
    graph = chakra_to_taskgraph(str(GEN / name), topo)
    assert {(t.rank, t.mem_node, t.direction, t.size) for t in graph} == {
        (r, f"mem{r}", direction, 1024.0) for r in range(8)}
    result = simulate(graph, topo, EngineOptions(record_links=False))
    assert result.makespan_s == approx(100e-9 + 1024 / 10e9)


def test_memory_node_choice_and_errors():
    topo = load_topology("cxl:gpu=h100,expanders=4")
    assert topo.kind(nearest_memory_node(topo, 0, ("cxl_mem",))) == "cxl_mem"
    graph = chakra_to_taskgraph(str(GEN / "one_remote_mem_load_node"), topo, mem_node="cxl_mem")
    assert all(topo.kind(t.mem_node) == "cxl_mem" for t in graph)
    graph = chakra_to_taskgraph(str(GEN / "one_remote_mem_load_node"), topo, mem_node="cxl2")
    assert {t.mem_node for t in graph} == {"cxl2"}
    with pytest.raises(TraceError, match="'gpu0' is not a host_mem or cxl_mem node"):
        chakra_to_taskgraph(str(GEN / "one_remote_mem_load_node"), topo, mem_node="gpu0")
    with pytest.raises(TraceError, match=r"one_remote_mem_load_node.0.et: node 8 .*has no memory node"):
        chakra_to_taskgraph(str(GEN / "one_remote_mem_load_node"), load_topology(RING8))


# -------------------------------------------------------------------- compute costing
def comp_trace(num_ops: int, tensor_size: int, micros: int) -> ChakraTrace:
    node = ChakraNode(1, "gemm", "COMP_NODE", duration_micros=micros,
                      attrs={"is_cpu_op": False, "num_ops": num_ops, "tensor_size": tensor_size})
    cpu = ChakraNode(2, "host", "COMP_NODE", duration_micros=7, attrs={"num_ops": 10})
    return ChakraTrace([RankTrace(0, nodes={1: node, 2: cpu})])


def test_compute_nodes_costed_by_the_device_model():
    from dessim.engine import DeviceModel

    topo = load_topology("switch:1,device=H100")
    model = DeviceModel.for_device("H100")
    # Duration given: replayed as is; the CPU op (is_cpu_op absent = true) on the cpu stream.
    graph = chakra_to_taskgraph(comp_trace(10**12, 10**9, 40), topo)
    gemm, host = list(graph)
    assert (gemm.stream, gemm.duration, host.stream, host.duration) == ("compute", 40e-6, "cpu", 7e-6)
    # --cost-compute, or a zero duration: the device model prices num_ops / tensor_size.
    for trace, kwargs in ((comp_trace(10**12, 10**9, 40), {"cost_compute": True}),
                          (comp_trace(10**12, 10**9, 0), {})):
        graph = chakra_to_taskgraph(trace, topo, **kwargs)
        gemm, host = list(graph)
        assert gemm.duration is None and (gemm.flops, gemm.bytes) == (1e12, 1e9)
        assert host.duration == 7e-6  # CPU ops always replay their duration (as ASTRA-sim)
        expected = max(model(gemm), 7e-6)
        assert simulate(graph, topo).makespan_s == approx(expected)


# -------------------------------------------------------------------- rank maps
def test_rank_count_mismatch_is_an_error_naming_both():
    with pytest.raises(TraceError, match=r"trace .*ring_sendrecv has 8 ranks but topology "
                                         r"'ring16' has 16 GPUs.*--rank-map"):
        chakra_to_taskgraph(fixture("ring_sendrecv"), load_topology("ring:16"))


def test_rank_map_places_trace_ranks():
    topo = load_topology("ring:16,bw=50GB/s,lat=500ns")
    graph = chakra_to_taskgraph(fixture("ring_sendrecv"), topo,
                                rank_map={r: 2 * r for r in range(8)})
    sends = {t.rank: t.peer for t in graph if t.kind == "send"}
    assert sends == {2 * r: 2 * ((r + 1) % 8) for r in range(8)}
    # Every message now crosses two links (one GPU in between), the 14 -> 0 one too (16-ring).
    result = simulate(graph, topo, EngineOptions(record_links=False))
    assert result.makespan_s == approx(2 * ALPHA + MiB / BW)


@pytest.mark.parametrize("value,message", [
    ("0:1", "trace ranks 0 and 1 both run on topology rank 1"),
    ("0:9", "trace rank 0 is mapped to topology rank 9, but the topology has GPUs 0..7"),
    ("8:0", "trace rank 8 does not exist"),
    ("0-1", "cannot parse '0-1'"),
    ({0: "x"}, "is not trace rank: topology rank"),
])
def test_bad_rank_maps(value, message):
    with pytest.raises(TraceError, match=message):
        parse_rank_map(value, 8, 8)


def test_rank_map_from_files(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"0": 1, "1": 0}))
    (tmp_path / "m.yaml").write_text("0: 1\n1: 0\n")
    (tmp_path / "m.txt").write_text("0:1\n1:0\n")
    for name in ("m.json", "m.yaml", "m.txt"):
        assert parse_rank_map(str(tmp_path / name), 3, 3) == [1, 0, 2]
    assert parse_rank_map([2, 0, 1], 3, 3) == [2, 0, 1]


# -------------------------------------------------------------------- malformed traces
def coll(node_id: int, comm_type: int = 0, size: int = 1024, **attrs) -> ChakraNode:
    return ChakraNode(node_id, f"c{node_id}", "COMM_COLL_NODE",
                      attrs={"is_cpu_op": False, "comm_type": comm_type, "comm_size": size, **attrs})


def two_ranks(nodes0: list[ChakraNode], nodes1: list[ChakraNode]) -> ChakraTrace:
    return ChakraTrace([RankTrace(0, nodes={n.id: n for n in nodes0}),
                        RankTrace(1, nodes={n.id: n for n in nodes1})], prefix="mem/t")


def test_collective_whose_ranks_disagree_on_the_size():
    trace = two_ranks([coll(1, size=1024)], [coll(1, size=2048)])
    with pytest.raises(TraceError, match=r"collective world:ALL_REDUCE:0: the ranks disagree: "
                                         r"rank 1: node 1 .* has size .* 2048.0 but rank 0: node 1"):
        chakra_to_taskgraph(trace, load_topology("ring:2"))


def test_unknown_process_group():
    trace = two_ranks([coll(1, pg_name="7")], [coll(1, pg_name="7")])
    with pytest.raises(TraceError, match=r"node 1 .*pg_name '7' is not declared"):
        chakra_to_taskgraph(trace, load_topology("ring:2"))


def test_collective_issued_by_only_some_members():
    trace = two_ranks([coll(1), coll(2, comm_type=2)], [coll(1), coll(2, comm_type=7)])
    with pytest.raises(TraceError, match="would never complete|never issues it"):
        chakra_to_taskgraph(trace, load_topology("ring:2"))


def test_process_groups_from_metadata_nodes():
    # PyTorch's "## process_group:init ##" node: str() of a list holding the JSON.
    pg = ChakraNode(0, "## process_group:init ##", "METADATA_NODE",
                    inputs=IOInfo(values=str([json.dumps([{"pg_name": "3", "ranks": [0, 2]}])])))
    gather = ChakraNode(1, "ag", "COMM_COLL_NODE", data_deps=(0,),
                        attrs={"is_cpu_op": False, "comm_type": 2, "comm_size": 100, "pg_name": "3"})
    ranks = [RankTrace(r, nodes={0: pg, 1: gather} if r != 1 else {0: pg}) for r in range(3)]
    graph = chakra_to_taskgraph(ChakraTrace(ranks), load_topology("ring:3"))
    tasks = list(graph)
    assert [(t.rank, t.group, t.size, t.stream, t.coll_id) for t in tasks] == [
        (0, (0, 2), 200.0, "comm.pg3", "pg3:ALL_GATHER:0"),
        (2, (0, 2), 200.0, "comm.pg3", "pg3:ALL_GATHER:0")]
    assert graph.deps(tasks[0].id) == []  # the METADATA parent makes no task


def test_gather_scatter_map_onto_direct_reduce_and_broadcast():
    assert (COLLECTIVES["GATHER"].op, COLLECTIVES["GATHER"].algo) == ("reduce", "direct")
    assert (COLLECTIVES["SCATTER"].op, COLLECTIVES["SCATTER"].algo) == ("broadcast", "direct")
    trace = two_ranks([coll(1, comm_type=3, size=1000)], [coll(1, comm_type=3, size=1000)])
    graph = chakra_to_taskgraph(trace, load_topology("ring:2"), algo="ring")
    assert {(t.op, t.algo, t.size, t.attrs["chakra_comm_type"]) for t in graph} == {
        ("reduce", "direct", 1000.0, "GATHER")}


def test_every_comm_type_has_a_mapping():
    from dessim.trace.chakra_schema import COLLECTIVE_COMM_TYPES

    assert set(COLLECTIVES) == set(COLLECTIVE_COMM_TYPES)


# -------------------------------------------------------------------- CLI
def test_cli_replay_json():
    result = CliRunner().invoke(cli(), ["replay", fixture("ring_sendrecv"), "-t", RING8, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["makespan_s"] == approx(ALPHA + MiB / BW)
    assert out["trace"]["ranks"] == 8 and out["trace"]["tasks"] == 16
    assert len(out["per_rank"]) == 8


def test_cli_replay_says_the_algorithm_it_was_asked_for():
    """replay applies --algo per collective and runs the engine with auto; its summary said
    'algorithm auto: NCCL's tuning model' for 'replay ... --algo ring' (simulate says 'ring,
    as asked'), and so did the JSON's collectives.settings."""
    args = ["replay", fixture("ALL_REDUCE"), "-t", RING8, "--algo", "ring"]
    text = CliRunner().invoke(cli(), args)
    assert text.exit_code == 0, text.output
    line = next(l for l in text.output.splitlines() if l.lstrip().startswith("collectives"))
    assert "ring/" in line and "algorithm ring, as asked" in line and "auto" not in line
    data = json.loads(CliRunner().invoke(cli(), [*args, "--json"]).output)
    assert data["collectives"]["settings"].startswith("algorithm ring,")
    auto = json.loads(CliRunner().invoke(cli(), [*args[:-2], "--json"]).output)
    assert auto["collectives"]["settings"].startswith("algorithm auto,")


def test_cli_rank_count_mismatch():
    result = CliRunner().invoke(cli(), ["replay", fixture("ring_sendrecv"), "-t", "ring:16"])
    assert result.exit_code == 2
    assert "error: trace" in result.output and "has 8 ranks but topology 'ring16' has 16 GPUs" \
        in result.output


def test_cli_rank_map_and_timeline(tmp_path):
    args = ["replay", fixture("ring_sendrecv"), "-t", "ring:16,bw=50GB/s,lat=500ns", "--rank-map",
            ",".join(f"{r}:{2 * r}" for r in range(8)), "--json", "--timeline",
            str(tmp_path / "t.json")]
    result = CliRunner().invoke(cli(), args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["makespan_s"] == approx(2 * ALPHA + MiB / BW)
    assert out["ranks"] == 16
    assert json.loads((tmp_path / "t.json").read_text())


def test_cli_help():
    result = CliRunner().invoke(cli(), ["replay", "--help"])
    assert result.exit_code == 0 and "--rank-map" in result.output and "--cost-compute" in result.output
