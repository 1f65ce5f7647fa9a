"""The task-graph model and its JSON format: valid graphs round-trip, invalid ones are named."""

from __future__ import annotations

import json

import pytest

from dessim.errors import SpecError, TaskGraphError
from dessim.taskgraph import Task, TaskGraph, brief_ranks, load_taskgraph, save_taskgraph, taskgraph_from_dict
from dessim.taskgraph.io import taskgraph_to_dict


def two_rank_graph() -> TaskGraph:
    g = TaskGraph("two")
    g.add(Task("r0.fwd", 0, "compute", duration=1e-3))
    g.add(Task("r1.fwd", 1, "compute", duration=2e-3))
    g.add(Task("r0.ar", 0, "collective", op="allreduce", size=1 << 20, group=(0, 1), coll_id="g"),
          ["r0.fwd"])
    g.add(Task("r1.ar", 1, "collective", op="allreduce", size=1 << 20, group=(0, 1), coll_id="g"),
          ["r1.fwd"])
    g.add(Task("r0.send", 0, "send", peer=1, size=4096, tag=3), ["r0.ar"])
    g.add(Task("r1.recv", 1, "recv", peer=0, size=4096, tag=3), ["r1.ar"])
    return g


def test_default_streams_follow_the_kind():
    g = two_rank_graph()
    assert g.task("r0.fwd").stream == "compute"
    assert g.task("r0.ar").stream == "comm"
    assert Task("m", 0, "memcpy", size=1, mem_node="n0.mem0", direction="to_hbm").stream == "mem"


def test_valid_graph_validates_and_pairs_p2p():
    g = two_rank_graph()
    g.validate(num_ranks=2)
    assert g.match_p2p() == {"r0.send": "r1.recv"}
    assert [t.id for t in g.collectives()["g"]] == ["r0.ar", "r1.ar"]
    assert g.num_ranks == 2


def test_json_round_trip_is_identical(tmp_path):
    g = two_rank_graph()
    path = save_taskgraph(g, tmp_path / "g.json")
    again = load_taskgraph(path)
    assert taskgraph_to_dict(again) == taskgraph_to_dict(g)
    assert path.read_bytes() == save_taskgraph(again, tmp_path / "h.json").read_bytes()


def test_json_accepts_units():
    data = {"tasks": [{"id": "a", "rank": 0, "kind": "compute", "duration": "1.5us"},
                      {"id": "b", "rank": 0, "kind": "memcpy", "size": "64MiB",
                       "mem_node": "cxl0", "direction": "from_hbm", "deps": ["a"]}]}
    g = taskgraph_from_dict(data)
    assert g.task("a").duration == 1.5e-6
    assert g.task("b").size == 64 * 2**20
    assert g.deps("b") == ["a"]


def test_cycle_is_named():
    g = TaskGraph()
    g.add(Task("a", 0, "compute", duration=1))
    g.add(Task("b", 0, "compute", duration=1), ["a"])
    g.depend("b", "a")
    with pytest.raises(TaskGraphError, match="dependency cycle: a -> b -> a"):
        g.validate()


def test_recv_without_send_is_named():
    g = TaskGraph()
    g.add(Task("lonely", 1, "recv", peer=0, size=10, tag=5))
    with pytest.raises(TaskGraphError, match=r"recv 'lonely' \(rank 1 from 0, tag 5\) has no matching send"):
        g.validate()


def test_send_without_recv_is_named():
    g = TaskGraph()
    g.add(Task("s", 0, "send", peer=1, size=10))
    with pytest.raises(TaskGraphError, match="send 's' .* has no matching recv on rank 1"):
        g.validate()


def test_send_recv_size_mismatch():
    g = TaskGraph()
    g.add(Task("s", 0, "send", peer=1, size=10))
    g.add(Task("r", 1, "recv", peer=0, size=20))
    with pytest.raises(TaskGraphError, match="disagree on the size"):
        g.validate()


@pytest.mark.parametrize("attr,value", [("size", 2.0), ("op", "allgather"), ("algo", "tree")])
def test_collective_members_must_agree(attr, value):
    g = TaskGraph()
    g.add(Task("a", 0, "collective", op="allreduce", size=1.0, group=(0, 1), coll_id="c"))
    kwargs = dict(op="allreduce", size=1.0, group=(0, 1), coll_id="c")
    kwargs[attr] = value
    g.add(Task("b", 1, "collective", **kwargs))
    with pytest.raises(TaskGraphError, match=f"collective 'c': task 'b' has {attr}="):
        g.validate()


def test_collective_group_disagreement_and_missing_member():
    g = TaskGraph()
    g.add(Task("a", 0, "collective", op="allreduce", size=1.0, group=(0, 1), coll_id="c"))
    g.add(Task("b", 1, "collective", op="allreduce", size=1.0, group=(0, 1, 2), coll_id="c"))
    with pytest.raises(TaskGraphError, match="has group="):
        g.validate()
    g2 = TaskGraph()
    g2.add(Task("a", 0, "collective", op="allreduce", size=1.0, group=(0, 1), coll_id="c"))
    with pytest.raises(TaskGraphError, match="group member rank 1 has no task"):
        g2.validate()


def test_task_on_rank_the_topology_lacks():
    g = TaskGraph()
    g.add(Task("far", 9, "compute", duration=1))
    with pytest.raises(TaskGraphError, match="task 'far' names rank 9, but the topology has only 8 GPUs"):
        g.validate(num_ranks=8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(id="x", rank=0, kind="teleport"), "unknown kind 'teleport'"),
    (dict(id="x", rank=0, kind="compute"), "needs a duration, or flops"),
    (dict(id="x", rank=0, kind="send", size=4), "needs 'peer'"),
    (dict(id="x", rank=0, kind="send", peer=0, size=4), "send to its own rank 0"),
    (dict(id="x", rank=0, kind="delay", duration=-1), "duration -1 must be >= 0"),
    (dict(id="x", rank=2, kind="collective", op="allreduce", size=1, group=(0, 1), coll_id="c"),
     "rank 2 is not in its collective's group"),
    (dict(id="x", rank=0, kind="memcpy", size=1, mem_node="m", direction="sideways"),
     "direction 'sideways'"),
    (dict(id="x", rank=0, kind="collective", op="allreduce", size=1, group=(0, 1), coll_id=[]),
     r"coll_id must be a string, got \[\]"),
])
def test_bad_tasks(kwargs, message):
    with pytest.raises(TaskGraphError, match=message):
        Task(**kwargs)


def test_file_errors_name_the_file_and_task(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tasks": [{"id": "a", "rank": 0, "kind": "compute",
                                          "duraton": "1us"}]}))
    with pytest.raises(TaskGraphError, match=r"bad.json: task #0 \('a'\): unknown key 'duraton'"):
        load_taskgraph(bad)
    bad.write_text(json.dumps({"tasks": [{"id": "a", "rank": 0, "kind": "compute",
                                          "duration": 1, "deps": ["ghost"]}]}))
    with pytest.raises(TaskGraphError, match="task 'a' depends on unknown task 'ghost'"):
        load_taskgraph(bad)
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_taskgraph(bad)
    with pytest.raises(SpecError, match="version 7 is not supported"):
        taskgraph_from_dict({"version": 7, "tasks": []})


def test_brief_ranks_keeps_messages_one_line():
    """Small groups print in full; large ones as first two, last and size, so a refusal that
    names a 128-rank data-parallel group (mixtral on 256 GPUs) stays readable."""
    assert brief_ranks([0, 1]) == "[0, 1]"
    assert brief_ranks(range(8)) == str(list(range(8)))
    assert brief_ranks(range(0, 256, 2)) == "[0, 2, ..., 254] (128 ranks)"
    assert brief_ranks(range(9), limit=8) == "[0, 1, ..., 8] (9 ranks)"
