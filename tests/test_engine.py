"""The replay engine: hand-computed makespans, time accounting, errors, determinism."""

from __future__ import annotations

import pytest

from dessim.collectives import CollectiveSettings
from dessim.engine import EngineOptions, Noise, simulate
from dessim.errors import TaskGraphError
from dessim.taskgraph import Task, TaskGraph
from engine_helpers import BW, LAT, line

MB = 1e6


def pipeline_chain(stages: int, compute_s: float, nbytes: float) -> TaskGraph:
    """Stage r: recv from r-1, compute, send to r+1 (a pipeline of one micro-batch)."""
    g = TaskGraph("chain")
    for r in range(stages):
        deps = []
        if r > 0:
            g.add(Task(f"r{r}.recv", r, "recv", peer=r - 1, size=nbytes, category="pp"))
            deps = [f"r{r}.recv"]
        g.add(Task(f"r{r}.fwd", r, "compute", duration=compute_s), deps)
        if r < stages - 1:
            g.add(Task(f"r{r}.send", r, "send", peer=r + 1, size=nbytes, category="pp"),
                  [f"r{r}.fwd"])
    return g


def test_chain_of_pipeline_sends_matches_hand_computation():
    # 4 stages of 1 ms compute, 1 MB hops over one 1 GB/s link each (1 us latency).
    res = simulate(pipeline_chain(4, 1e-3, MB), line(4))
    hop = LAT + MB / BW
    assert res.makespan_s == pytest.approx(4 * 1e-3 + 3 * hop, rel=1e-12)
    last = res.ranks[3]
    assert last.compute_s == pytest.approx(1e-3)
    # rank 3 posted its recv at 0 and waited until rank 2 sent: 3 ms compute + 2 hops
    assert last.wait_s == pytest.approx(3e-3 + 2 * hop)
    assert last.exposed_comm_s == pytest.approx(hop)
    assert last.exposed_by_category == {"pp": pytest.approx(hop)}


def overlap_graph(overlap: bool) -> TaskGraph:
    """Rank 0 computes 2 ms and sends 1 MB to rank 1; with overlap the send does not wait."""
    g = TaskGraph("overlap" if overlap else "serial")
    g.add(Task("c", 0, "compute", duration=2e-3))
    g.add(Task("s", 0, "send", peer=1, size=MB), [] if overlap else ["c"])
    g.add(Task("r", 1, "recv", peer=0, size=MB))
    return g


def test_overlapped_send_is_hidden_behind_compute():
    hop = LAT + MB / BW  # 1.001 ms < 2 ms of compute
    serial = simulate(overlap_graph(False), line(2))
    hidden = simulate(overlap_graph(True), line(2))
    assert serial.makespan_s == pytest.approx(2e-3 + hop)
    assert serial.ranks[0].exposed_comm_s == pytest.approx(hop)
    assert hidden.makespan_s == pytest.approx(2e-3)
    assert hidden.ranks[0].exposed_comm_s == 0.0
    assert hidden.ranks[0].comm_s == pytest.approx(hop)


def test_stream_runs_tasks_in_program_order():
    g = TaskGraph()
    g.add(Task("a", 0, "compute", duration=1.0))
    g.add(Task("b", 0, "compute", duration=2.0))        # same stream: after a
    g.add(Task("c", 0, "compute", duration=0.5, stream="side"))  # other stream: at once
    spans = simulate(g, line(1)).spans().set_index("task")
    assert spans.loc["b", "start_s"] == 1.0 and spans.loc["b", "end_s"] == 3.0
    assert spans.loc["c", "start_s"] == 0.0 and spans.loc["c", "end_s"] == 0.5


def test_memcpy_crosses_the_links_to_host_memory():
    g = TaskGraph()
    g.add(Task("offload", 0, "memcpy", size=10e6, mem_node="host", direction="from_hbm"))
    g.add(Task("reload", 0, "memcpy", size=10e6, mem_node="host", direction="to_hbm"), ["offload"])
    res = simulate(g, line(2, mem=True))
    assert res.makespan_s == pytest.approx(2 * 10e6 / 10e9)
    assert res.link_bytes[("gpu0", "host")] == 10e6
    assert res.link_bytes[("host", "gpu0")] == 10e6


def test_compute_costed_by_the_device_model():
    # A memory-bound kernel: 1 GB on an H100 at the calibrated fraction of 3.35 TB/s, plus the
    # calibrated launch overhead.
    from dessim.catalog.calibration import load_calibration
    from dessim.catalog.devices import get_device

    h100 = load_calibration().device("H100")
    g = TaskGraph()
    g.add(Task("k", 0, "compute", bytes=1e9, kernel="elementwise"))
    res = simulate(g, line(1))
    expected = 1e9 / (get_device("H100").hbm_bw * h100.memory_efficiency) + h100.launch_overhead
    assert res.makespan_s == pytest.approx(expected)


def test_straggler_slows_only_its_rank_compute():
    res = simulate(pipeline_chain(2, 1e-3, MB), line(2),
                   EngineOptions(noise=Noise(slowdown={0: 1.5})))
    assert res.makespan_s == pytest.approx(1.5e-3 + LAT + MB / BW + 1e-3)


def test_random_stragglers_are_seeded():
    a = simulate(pipeline_chain(3, 1e-3, MB), line(3), EngineOptions(noise=Noise(straggler_sigma=0.2, seed=7)))
    b = simulate(pipeline_chain(3, 1e-3, MB), line(3), EngineOptions(noise=Noise(straggler_sigma=0.2, seed=7)))
    c = simulate(pipeline_chain(3, 1e-3, MB), line(3), EngineOptions(noise=Noise(straggler_sigma=0.2, seed=8)))
    assert a.makespan_s == b.makespan_s != c.makespan_s
    assert a.makespan_s > simulate(pipeline_chain(3, 1e-3, MB), line(3)).makespan_s


def test_identical_runs_give_identical_spans():
    a = simulate(pipeline_chain(4, 1e-3, MB), line(4)).spans()
    b = simulate(pipeline_chain(4, 1e-3, MB), line(4)).spans()
    assert a.equals(b)


def test_deadlock_names_a_stuck_task():
    g = TaskGraph()
    # rank 0 sends after its recv, rank 1 likewise: classic head-to-head deadlock
    g.add(Task("r0.recv", 0, "recv", peer=1, size=1))
    g.add(Task("r0.send", 0, "send", peer=1, size=1), ["r0.recv"])
    g.add(Task("r1.recv", 1, "recv", peer=0, size=1))
    g.add(Task("r1.send", 1, "send", peer=0, size=1), ["r1.recv"])
    with pytest.raises(TaskGraphError, match="deadlock: 4 tasks never finished"):
        simulate(g, line(2))


def test_graph_larger_than_topology_is_rejected():
    g = TaskGraph()
    g.add(Task("x", 5, "compute", duration=1))
    with pytest.raises(TaskGraphError, match="names rank 5, but the topology has only 2 GPUs"):
        simulate(g, line(2))


def test_unknown_network_model_is_named():
    from dessim.errors import NetworkError

    with pytest.raises(NetworkError, match="unknown network model 'packet'"):
        simulate(pipeline_chain(2, 1e-3, MB), line(2), EngineOptions(network="packet"))


def test_analytical_network_gives_the_same_chain_time():
    res = simulate(pipeline_chain(4, 1e-3, MB), line(4), EngineOptions(network="analytical"))
    assert res.makespan_s == pytest.approx(4e-3 + 3 * (LAT + MB / BW))


# ---------------------------------------------------------------- collectives in the engine
AR_BYTES = 1e6
# ring all-reduce of 1 MB over 2 ranks on one 1 GB/s link: 2(p-1) steps of alpha + n/(p B)
AR_TIME = 2 * (2 - 1) * (LAT + AR_BYTES / 2 / BW)


def grad_allreduce(overlap: bool) -> TaskGraph:
    """Two ranks: backward in two halves; the gradient all-reduce after half 1 (overlap) or
    after both halves (no overlap)."""
    g = TaskGraph("overlap" if overlap else "no-overlap")
    for r in (0, 1):
        g.add(Task(f"r{r}.bwd1", r, "compute", duration=1e-3))
        g.add(Task(f"r{r}.bwd2", r, "compute", duration=1e-3), [f"r{r}.bwd1"])
        after = f"r{r}.bwd1" if overlap else f"r{r}.bwd2"
        g.add(Task(f"r{r}.ar", r, "collective", op="allreduce", algo="ring", size=AR_BYTES,
                   group=(0, 1), coll_id="grads", category="dp"), [after])
    return g


#: The textbook collective model: closed forms below hold exactly (no NCCL protocol latency).
RAW = EngineOptions(collectives=CollectiveSettings(protocol="raw"))


def test_compute_then_allreduce_without_overlap():
    res = simulate(grad_allreduce(False), line(2), RAW)
    assert res.makespan_s == pytest.approx(2e-3 + AR_TIME, rel=1e-12)
    assert res.ranks[0].exposed_comm_s == pytest.approx(AR_TIME)
    assert res.ranks[0].exposed_by_category == {"dp": pytest.approx(AR_TIME)}


def test_compute_then_allreduce_with_overlap():
    res = simulate(grad_allreduce(True), line(2), RAW)
    # the all-reduce starts at 1 ms, beside the second half of the backward
    assert res.makespan_s == pytest.approx(1e-3 + AR_TIME, rel=1e-12)
    assert res.ranks[0].exposed_comm_s == pytest.approx(AR_TIME - 1e-3)
    assert res.ranks[0].comm_s == pytest.approx(AR_TIME)


def test_collective_waits_for_the_late_member():
    g = TaskGraph()
    for r, dur in ((0, 1e-3), (1, 3e-3)):
        g.add(Task(f"c{r}", r, "compute", duration=dur))
        g.add(Task(f"ar{r}", r, "collective", op="allreduce", algo="ring", size=AR_BYTES,
                   group=(0, 1), coll_id="x"), [f"c{r}"])
    res = simulate(g, line(2), RAW)
    assert res.makespan_s == pytest.approx(3e-3 + AR_TIME)
    assert res.ranks[0].wait_s == pytest.approx(2e-3)
    assert res.ranks[1].wait_s == 0.0


def test_concurrent_collectives_share_the_link():
    # Two independent 2-rank all-reduces over the same single link run at half speed each:
    # every step moves n/2 bytes per direction for each of the two, sharing B.
    g = TaskGraph()
    for cid in ("a", "b"):
        for r in (0, 1):
            g.add(Task(f"{cid}{r}", r, "collective", op="allreduce", algo="ring", size=AR_BYTES,
                       group=(0, 1), coll_id=cid, stream=f"comm_{cid}"))
    res = simulate(g, line(2), RAW)
    assert res.makespan_s == pytest.approx(2 * (LAT + 2 * (AR_BYTES / 2) / BW), rel=1e-9)


def test_forced_algorithm_and_bad_collective_are_reported():
    from dessim.errors import CollectiveError

    g = TaskGraph()
    for r in (0, 1):
        g.add(Task(f"x{r}", r, "collective", op="allreduce", size=AR_BYTES, group=(0, 1),
                   coll_id="x"))
    with pytest.raises(CollectiveError, match="collective 'x'"):
        simulate(g, line(2), EngineOptions(collectives=CollectiveSettings(algo="pairwise")))


def test_slowdown_ranks_may_be_written_as_strings_as_json_and_sweep_axes_spell_them():
    assert Noise(slowdown={"3": 1.2, 1: 2.0}).slowdown == {3: 1.2, 1: 2.0}


def test_a_reduction_speed_written_with_units_is_parsed_where_the_options_are_made():
    """As a cluster file's engine section writes it; the engine needs the number."""
    assert EngineOptions.of({"collectives": {"reduction_bw": "200GB/s"}}).collectives.reduction_bw == 200e9
