"""Task graphs written as Chakra traces (dessim.trace.convert): round trips and what Chakra
tools read from the files."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.collectives import CollectiveSettings
from dessim.engine import EngineOptions, simulate
from dessim.errors import TraceError
from dessim.taskgraph import Task, TaskGraph, taskgraph_to_dict
from dessim.trace.chakra_io import KNOWN_ATTR_KINDS
from dessim.topology import load_topology
from dessim.trace import (chakra_to_taskgraph, export_chakra,
                          process_groups, read_chakra, replay_chakra, taskgraph_to_chakra,
                          validate_for_replay)

RING8 = "ring:8,bw=50GB/s,lat=500ns"


def same_graph(a: TaskGraph, b: TaskGraph) -> bool:
    """Identical: name, meta, tasks (every field, program order) and dependencies (in order)."""
    return taskgraph_to_dict(a) == taskgraph_to_dict(b)


def hand_graph() -> TaskGraph:
    """Every task kind, sub-groups in a non-sorted order, exact float durations and sizes."""
    g = TaskGraph("hand", meta={"source": "test", "layers": 2})
    g.add(Task("r0.fwd", 0, "compute", duration=1.234567e-5, name="fwd", category="fwd"))
    g.add(Task("r1.fwd", 1, "compute", flops=3.5e12, bytes=1.25e9, kernel="matmul",
               shape=(4096, 4096, 1024)))
    g.add(Task("r2.fwd", 2, "compute", duration=2e-5, stream="compute2", attrs={"layer": [1, 2]}))
    for r in range(4):
        g.add(Task(f"r{r}.ar", r, "collective", op="allreduce", size=3e6, group=(0, 1, 2, 3),
                   coll_id="grad", category="dp", algo="ring"),
              [f"r{r}.fwd"] if r < 3 else [])
    for r in (2, 0):
        g.add(Task(f"r{r}.ag", r, "collective", op="allgather", size=1000.5, group=(2, 0),
                   coll_id="ag"))
    g.add(Task("r0.send", 0, "send", peer=3, size=7.5, tag=11), ["r0.ar"])
    g.add(Task("r3.recv", 3, "recv", peer=0, size=7.5, tag=11, stream="pp"))
    g.add(Task("r3.load", 3, "memcpy", size=4096, mem_node="mem0", direction="to_hbm"), ["r3.recv"])
    g.add(Task("r1.store", 1, "memcpy", size=10, mem_node="mem1", direction="from_hbm"), ["r1.ar"])
    g.add(Task("r1.sr", 1, "collective", op="sendrecv", size=64, group=(1, 2), coll_id="p2p"))
    g.add(Task("r2.sr", 2, "collective", op="sendrecv", size=64, group=(1, 2), coll_id="p2p"))
    g.add(Task("r2.wait", 2, "delay", duration=0.25, name="r2.wait"), ["r2.sr", "r2.ag"])
    g.add(Task("r0.opt", 0, "compute", duration=0.0, flops=10.0, stream="cpu"), ["r0.ag", "r0.send"])
    return g


def test_hand_graph_round_trips_identically(tmp_path):
    graph = hand_graph()
    (tmp_path / "out").mkdir()          # dessim never creates directories
    paths = export_chakra(graph, tmp_path / "out" / "hand")
    assert [p.name for p in paths] == [f"hand.{r}.et" for r in range(4)]
    back = chakra_to_taskgraph(read_chakra(tmp_path / "out" / "hand"))
    assert same_graph(graph, back)


def test_files_carry_what_chakra_tools_read(tmp_path):
    export_chakra(hand_graph(), tmp_path / "hand")
    trace = read_chakra(tmp_path / "hand")
    validate_for_replay(trace)
    # Only non-world groups are declared, with integer names (ASTRA-sim calls stoi on them);
    # a sendrecv is a send/recv pair and needs none.
    assert process_groups(trace) == {"1": (0, 2)}
    nodes = {n.name: n for r in trace.ranks for n in r.nodes.values()}
    # Replay attributes have the feeder's value types (attr_kinds lists only non-default ones).
    for node in nodes.values():
        assert not set(node.attr_kinds) & set(KNOWN_ATTR_KINDS), node
    ar = nodes["r0.ar"]
    assert (ar.type, ar.comm_type, ar.comm_size, ar.pg_name) == ("COMM_COLL_NODE", "ALL_REDUCE",
                                                                 3_000_000, None)
    ag = nodes["r0.ag"]  # dessim size = whole gathered array; Chakra: one rank's part
    assert (ag.comm_type, ag.comm_size, ag.pg_name) == ("ALL_GATHER", 500, "1")
    send = nodes["r0.send"]
    assert (send.type, send.comm_src, send.comm_dst, send.comm_tag, send.comm_size) == (
        "COMM_SEND_NODE", 0, 3, 11, 8)
    assert nodes["fwd"].duration_micros == 12 and nodes["fwd"].is_cpu_op is False
    assert nodes["r1.fwd"].num_ops == 3_500_000_000_000 and nodes["r1.fwd"].tensor_size == 1_250_000_000
    assert nodes["r3.load"].type == "MEM_LOAD_NODE" and nodes["r1.store"].type == "MEM_STORE_NODE"
    assert nodes["r2.wait"].is_cpu_op is True and nodes["r2.wait"].duration_micros == 250_000
    assert (nodes["r1.sr"].type, nodes["r2.sr"].type) == ("COMM_SEND_NODE", "COMM_RECV_NODE")
    # Dependencies are data_deps on the same rank.
    rank0 = trace.ranks[0]
    by_id = {n.id: n.name for n in rank0.nodes.values()}
    assert [by_id[d] for d in nodes["r0.opt"].data_deps] == ["r0.ag", "r0.send"]


def test_process_group_metadata_is_what_astra_sim_parses(tmp_path):
    export_chakra(hand_graph(), tmp_path / "hand")
    meta = read_chakra(tmp_path / "hand").ranks[3].nodes[0]
    assert (meta.type, meta.name) == ("METADATA_NODE", "## process_group:init ##")
    text = meta.inputs.values
    # ASTRA-sim's issue_pytorch_pg_metadata strips two characters at each end, then parses JSON.
    groups = json.loads(text[2:-2])
    assert [(g["pg_name"], g["ranks"]) for g in groups] == [("1", [0, 2])]


def test_replaying_the_export_gives_the_same_makespan(tmp_path):
    topo = load_topology(RING8)
    graph = TaskGraph("dp")
    for r in range(8):
        graph.add(Task(f"r{r}.fwd", r, "compute", duration=(100 + 10 * r) * 1e-6))
        graph.add(Task(f"r{r}.ar", r, "collective", op="allreduce", size=64 * 2**20,
                       group=tuple(range(8)), coll_id="ar"), [f"r{r}.fwd"])
        graph.add(Task(f"r{r}.rs", r, "collective", op="reducescatter", size=2**20,
                       group=tuple(range(r // 4 * 4, r // 4 * 4 + 4)), coll_id=f"rs{r // 4}"))
        graph.add(Task(f"r{r}.s", r, "send", peer=(r + 1) % 8, size=3e5, tag=1), [f"r{r}.ar"])
        graph.add(Task(f"r{r}.r", r, "recv", peer=(r - 1) % 8, size=3e5, tag=1, stream="rx"))
        graph.add(Task(f"r{r}.opt", r, "compute", duration=1e-5), [f"r{r}.s", f"r{r}.r"])
    options = EngineOptions(collectives=CollectiveSettings(algo="ring"), record_links=False)
    direct = simulate(graph, topo, options)
    export_chakra(graph, tmp_path / "dp")
    replayed = replay_chakra(tmp_path / "dp", topo, options)
    assert replayed.makespan_s == direct.makespan_s
    assert replayed.makespan_s > 100e-6


def test_workload_graph_round_trip(tmp_path):
    """A generated training iteration (TP, PP send/recv, DP) -> ET -> replay = direct run."""
    generator = pytest.importorskip("dessim.workload.transformer.generator")
    from dessim.workload import ParallelLayout, TransformerConfig

    model = TransformerConfig(name="tiny", layers=2, hidden=256, heads=4, ffn_hidden=1024,
                              vocab=1000, seq_len=128)
    layout = ParallelLayout(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
    topo = load_topology("switch:8,bw=50GB/s,lat=1us,device=H100")
    exact = generator.GeneratorOptions(granularity="layer", fold=False)   # every rank's tasks
    graph = generator.build_taskgraph((model, layout), topo, options=exact)
    assert {t.kind for t in graph} >= {"compute", "collective", "send", "recv"}
    export_chakra(graph, tmp_path / "w")
    assert same_graph(graph, chakra_to_taskgraph(tmp_path / "w", topo))
    options = EngineOptions(record_links=False)
    assert replay_chakra(tmp_path / "w", topo, options).makespan_s == \
        simulate(graph, topo, options).makespan_s


# -------------------------------------------------------------------- what cannot be written
def test_cross_rank_dependency_is_refused():
    g = TaskGraph()
    g.add(Task("a", 0, "compute", duration=1e-6))
    g.add(Task("b", 1, "compute", duration=1e-6), ["a"])
    with pytest.raises(TraceError, match=r"task 'b' \(rank 1\) depends on task 'a' of rank 0: "
                                         "Chakra dependencies stay within one rank"):
        taskgraph_to_chakra(g)


def test_values_chakra_cannot_hold():
    g = TaskGraph()
    g.add(Task("s", 0, "send", peer=1, size=1, tag=2**40))
    g.add(Task("r", 1, "recv", peer=0, size=1, tag=2**40))
    with pytest.raises(TraceError, match="task 's': tag 1099511627776 does not fit Chakra's int32"):
        taskgraph_to_chakra(g)
    g = TaskGraph()
    g.add(Task("c", 0, "compute", duration=1e-6, attrs={"obj": object()}))
    with pytest.raises(TraceError, match="task 'c': cannot store it in the trace"):
        taskgraph_to_chakra(g)


def test_an_edited_export_is_detected(tmp_path):
    from dataclasses import replace

    trace = taskgraph_to_chakra(hand_graph())
    rank0 = trace.ranks[0]
    node = next(n for n in rank0.nodes.values() if n.name == "fwd")
    edited = dict(rank0.nodes)
    edited[node.id] = replace(node, duration_micros=99)
    trace.ranks[0] = replace(rank0, nodes=edited)
    with pytest.raises(TraceError, match=r"node \d+ \('fwd', COMP_NODE\): the Chakra fields disagree "
                                         r".*duration_micros 99.*use_dessim_attrs=False"):
        chakra_to_taskgraph(trace)
    plain = chakra_to_taskgraph(trace, use_dessim_attrs=False, mem_node="mem0")
    assert next(t for t in plain if t.name == "fwd").duration == 99e-6


# -------------------------------------------------------------------- property test
NAMES = st.text(alphabet="abcxyz._-01", min_size=1, max_size=6)


@st.composite
def task_graphs(draw) -> TaskGraph:
    """Random valid task graphs of every kind Chakra can carry (deps stay within a rank)."""
    n = draw(st.integers(2, 4))
    graph = TaskGraph(draw(NAMES), meta=draw(st.dictionaries(NAMES, st.integers(0, 9), max_size=2)))
    per_rank: dict[int, list[str]] = {r: [] for r in range(n)}
    counter = iter(range(10**6))
    sizes = st.one_of(st.integers(1, 10**9).map(float),
                      st.floats(1e-3, 1e12, allow_nan=False, allow_infinity=False))
    durations = st.floats(0, 10, allow_nan=False, allow_infinity=False)

    def add(task: Task) -> None:
        earlier = per_rank[task.rank]
        deps = draw(st.lists(st.sampled_from(earlier), unique=True, max_size=3)) if earlier else []
        graph.add(task, deps)
        earlier.append(task.id)

    def common(rank: int) -> dict:
        return {"rank": rank, "name": draw(st.one_of(st.just(""), NAMES)),
                "category": draw(st.sampled_from(["", "fwd", "dp", "tp"]))}

    for _ in range(draw(st.integers(1, 12))):
        what = draw(st.sampled_from(["compute", "flops", "delay", "p2p", "coll", "memcpy"]))
        tid = lambda: f"t{next(counter)}"  # noqa: E731
        if what == "compute":
            r = draw(st.integers(0, n - 1))
            add(Task(tid(), kind="compute", duration=draw(durations),
                     stream=draw(st.sampled_from(["", "cpu", "side"])), **common(r)))
        elif what == "flops":
            r = draw(st.integers(0, n - 1))
            add(Task(tid(), kind="compute", flops=draw(sizes), bytes=draw(sizes),
                     kernel=draw(st.sampled_from(["", "matmul", "norm"])),
                     shape=draw(st.sampled_from([(), (64, 128, 256)])), **common(r)))
        elif what == "delay":
            add(Task(tid(), kind="delay", duration=draw(durations), **common(draw(st.integers(0, n - 1)))))
        elif what == "memcpy":
            add(Task(tid(), kind="memcpy", size=draw(sizes), mem_node=draw(NAMES),
                     direction=draw(st.sampled_from(["to_hbm", "from_hbm"])),
                     **common(draw(st.integers(0, n - 1)))))
        elif what == "p2p":
            a, b = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
            size, tag = draw(sizes), draw(st.integers(-5, 5))
            add(Task(tid(), kind="send", peer=b, size=size, tag=tag, **common(a)))
            add(Task(tid(), kind="recv", peer=a, size=size, tag=tag, **common(b)))
        else:
            op = draw(st.sampled_from(["allreduce", "allgather", "reducescatter", "alltoall",
                                       "broadcast", "reduce", "sendrecv"]))
            k = 2 if op == "sendrecv" else draw(st.integers(2, n))
            group = tuple(draw(st.permutations(range(n)))[:k])
            cid = f"c{next(counter)}"
            size = draw(sizes)
            algo = draw(st.sampled_from(["auto", "ring", "direct"]))
            for r in draw(st.permutations(group)):
                add(Task(tid(), kind="collective", op=op, size=size, group=group, coll_id=cid,
                         algo=algo, **common(r)))
    return graph


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_graphs())
def test_random_graphs_survive_write_and_read(tmp_path_factory, graph):
    prefix = tmp_path_factory.mktemp("rt") / "g"
    export_chakra(graph, prefix)
    back = chakra_to_taskgraph(read_chakra(prefix))
    assert same_graph(graph, back)
