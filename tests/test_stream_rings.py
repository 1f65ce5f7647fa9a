"""Streamed rings (``stream_rings=True``: run_schedule, run_collective, EngineOptions): a ring channel as
ONE coupled flow. An approximation of the step-by-step replay: exact on an idle network
whose connections pay one latency and whose slowest connection is the same for all, within
0.1% under contention, an over-estimate of the latency where connections' latencies differ,
and a plain step-by-step replay wherever the coupling does not apply."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.collectives import build_schedule, get_op, run_collective, run_schedule
from dessim.collectives.schedule import pipelines
from dessim.collectives import CollectiveSettings
from dessim.engine import EngineOptions, Shortcuts, simulate
from dessim.network import FlowNetwork, make_network
from dessim.topology import load_topology
from dessim.workload import build_taskgraph, plan_workload
from test_network_incremental import ComparedFlowNetwork

SWITCH = "switch:n=8,bw=50GB/s,lat=1us"
#: one GPU per node (a DP group under TP 8) across two scalable units of a rail fabric
RAIL_RANKS = ",".join(str(8 * n + 3) for n in range(64))


def _plan(op: str, group: tuple[int, ...], **kw):
    return build_schedule(get_op(op), kw.pop("algo", "ring"), group, 1e9,
                          topology=load_topology(SWITCH), compact_schedules=True, **kw).plan


@pytest.mark.parametrize("op, steps", [("allreduce", 14), ("reducescatter", 7), ("allgather", 7)])
@pytest.mark.parametrize("channels", [1, 2])
def test_ring_channels_are_pipelines(op, steps, channels):
    found = pipelines(_plan(op, tuple(range(8)), channels=channels))
    assert found is not None and [p.channel for p in found] == list(range(channels))
    for p in found:
        assert p.hops == steps
        assert p.nbytes == pytest.approx(steps * 1e9 / 8 / channels)
        assert sorted(p.src.tolist()) == sorted(p.dst.tolist()) == list(range(8))
    if channels == 2:   # the odd channel runs the ring the other way round
        forward = set(zip(found[0].src.tolist(), found[0].dst.tolist()))
        assert set(zip(found[1].dst.tolist(), found[1].src.tolist())) == forward


def test_a_one_step_plan_is_not_a_pipeline():
    assert pipelines(_plan("reducescatter", tuple(range(8)), algo="direct")) is None


@pytest.mark.parametrize("topo, ranks", [(SWITCH, None), ("dgx-h100:nodes=1", None),
                                         ("dgx-a100:nodes=8", "0,8,16,24,32,40,48,56"),
                                         ("dgx-h100:nodes=64", RAIL_RANKS)])
@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("size", [1e5, 1e9])
def test_idle_network_times_are_exact(topo, ranks, op, size):
    step = run_collective(op, size, topo, algo="ring", ranks=ranks)
    stream = run_collective(op, size, topo, algo="ring", ranks=ranks, stream_rings=True)
    lo, hi = _hop_latencies(step, topo)
    if hi - lo < 1e-15:  # every connection pays one latency: both take hops x (latency + block time)
        assert stream.time_s == pytest.approx(step.time_s, rel=1e-12)
    else:
        # 64 nodes over two scalable units with LL (1e5 B): a spine-crossing connection's
        # route (4 us) exceeds NCCL's hop latency, the others pay 3 us. Step by step a
        # sender pays only the latency of its data's path (connection credits, executor
        # "Connections"); a stream pays the largest every hop: it over-estimates, by at
        # most hops x (largest - smallest latency).
        assert (topo, size) == ("dgx-h100:nodes=64", 1e5)
        hops = len(step.run.schedule.plan) // step.channels
        assert step.time_s < stream.time_s <= step.time_s + hops * (hi - lo) * (1 + 1e-12)
    assert stream.events <= 4                      # one flow: start, finish, its solves
    assert stream.events < step.events
    # every link carries the same bytes (each connection moves all its steps' blocks)
    carried = {row["link"]: row["bytes"] for row in stream.link_util}
    assert carried == pytest.approx({row["link"]: row["bytes"] for row in step.link_util}, rel=1e-9)


def _hop_latencies(result, topo: str) -> tuple[float, float]:
    """Smallest and largest latency (route + software, s) of a ring's connections (the
    built-in calibration leaves the presets' links as they are)."""
    from dessim.collectives.executor import _Charges
    from dessim.collectives.protocols import make_protocol

    sch = result.run.schedule
    net = make_network("flow", simpy.Environment(), load_topology(topo))
    charges = _Charges(net, make_protocol(result.protocol, 0.0), sch)
    lat = [charges.hop_latency(a, b) for p in sch.plan.patterns
           for a, b in zip(p.src.tolist(), p.dst.tolist())]
    return min(lat), max(lat)


def test_the_analytical_model_streams_too():
    step = run_collective("allreduce", 1e9, "dgx-h100:nodes=64", algo="ring", ranks=RAIL_RANKS,
                          network="analytical")
    stream = run_collective("allreduce", 1e9, "dgx-h100:nodes=64", algo="ring", ranks=RAIL_RANKS,
                            network="analytical", stream_rings=True)
    assert stream.time_s == pytest.approx(step.time_s, rel=1e-12)
    assert stream.events == 2 < step.events


def test_two_channels_differ_by_latency_terms_only():
    # Step by step, one channel's data fills the other's latency gaps; a stream pays its
    # latency up front. The gap is bounded by steps x largest latency.
    step = run_collective("reducescatter", 1e9, "dgx-h100:nodes=64", algo="ring",
                          ranks=RAIL_RANKS, channels=2)
    stream = run_collective("reducescatter", 1e9, "dgx-h100:nodes=64", algo="ring",
                            ranks=RAIL_RANKS, channels=2, stream_rings=True)
    assert 0 <= stream.time_s - step.time_s <= 63 * 1.5e-6
    assert stream.time_s == pytest.approx(step.time_s, rel=2e-3)


def test_rings_that_load_a_link_twice_run_step_by_step():
    # Without PXN, a flat ring over two DGX nodes crosses from rail 7 to rail 0 twice in the
    # same direction: no coupled flow, the ordinary replay (same times, same work).
    topo = "dgx-h100:nodes=2,pxn=false,routing=ecmp"
    step = run_collective("allreduce", 1e8, topo, algo="ring")
    stream = run_collective("allreduce", 1e8, topo, algo="ring", stream_rings=True)
    assert (stream.time_s, stream.events) == (step.time_s, step.events)


@pytest.mark.parametrize("kw", [{"reduction_bw": "200GB/s"},   # charged reductions
                                {"chunks": 2},                  # pipelined chunks
                                {"algo": "tree"}])              # not a ring
def test_other_cases_run_step_by_step(kw):
    kw = {"algo": "ring", **kw}
    step = run_collective("allreduce", 1e8, SWITCH, **kw)
    stream = run_collective("allreduce", 1e8, SWITCH, stream_rings=True, **kw)
    assert (stream.time_s, stream.events) == (step.time_s, step.events)


def _ring_with_cross_traffic(stream: bool, cross: list[tuple[int, int, float, float]]):
    topo = load_topology(SWITCH)
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    sched = build_schedule(get_op("allreduce"), "ring", tuple(range(8)), 1e9, topology=topo,
                           compact_schedules=True)

    def send(a: int, b: int, nbytes: float, at: float):
        yield env.timeout(at)
        yield net.transfer(a, b, nbytes)

    for a, b, nbytes, at in cross:
        env.process(send(a, b, nbytes, at))
    run = run_schedule(net, sched, stream_rings=stream)
    env.run()
    return run.duration, env.now, sum(net.link_bytes().values())


@pytest.mark.parametrize("cross", [[(0, 1, 5e8, 0.0)],                    # on a ring link
                                   [(0, 1, 2e8, 0.005)],                  # joins mid-way
                                   [(0, 1, 1e8, 0.0), (3, 5, 3e8, 0.01)],
                                   [(0, 4, 1e9, 0.0)]])                   # across the ring
def test_contention_agrees_within_a_tenth_of_a_percent(cross):
    ring_a, end_a, bytes_a = _ring_with_cross_traffic(False, cross)
    ring_b, end_b, bytes_b = _ring_with_cross_traffic(True, cross)
    assert ring_b == pytest.approx(ring_a, rel=1e-3)
    assert end_b == pytest.approx(end_a, rel=1e-3)
    assert bytes_b == pytest.approx(bytes_a, rel=1e-12)     # bytes sent = bytes received
    assert ring_b > 0.035028                                 # slower than on an idle switch


def test_a_stream_starts_when_the_last_member_arrives():
    topo = load_topology(SWITCH)
    env = simpy.Environment()
    net = make_network("flow", env, topo)
    sched = build_schedule(get_op("allgather"), "ring", tuple(range(8)), 1e9, topology=topo,
                           compact_schedules=True)
    arrivals = {r: env.event() for r in range(8)}
    run = run_schedule(net, sched, arrivals=arrivals, stream_rings=True)
    for r in range(8):
        env.timeout(1e-3 * r).callbacks.append(lambda _e, r=r: arrivals[r].succeed())
    env.run()
    idle = run_collective("allgather", 1e9, SWITCH, algo="ring", protocol="raw").time_s
    assert run.finish_time == pytest.approx(7e-3 + idle, rel=1e-12)
    assert set(run.rank_finish.values()) == {run.finish_time}
    assert len(run.transfer_finish) == len(sched)


def _iteration(stream: bool, fold: bool) -> tuple[float, int]:
    # TP 8 inside a node, so the DP rings have one GPU per node across 4 nodes
    plan, topo = plan_workload("gpt3-1.3b", "dgx-h100:nodes=8",
                               overrides={"tp": 8, "pp": 2, "dp": 4, "global_batch": 16,
                                          "generator": {"granularity": "stage", "fold": fold}})
    options = EngineOptions(collectives=CollectiveSettings(algo="ring"),
                            # lane families and the per-link memo make fewer events too:
                            # compare stream rings with the step-by-step run of every ring
                            shortcuts=Shortcuts(stream_rings=stream, lane_families=False,
                                                link_memo=False),
                            record_links=False)
    result = simulate(build_taskgraph(plan, topo, engine=options), topo, options)
    return result.makespan_s, result.events


@pytest.mark.parametrize("fold", [False, True])
def test_training_iteration_agrees_within_a_tenth_of_a_percent(fold):
    (step, step_events), (stream, stream_events) = _iteration(False, fold), _iteration(True, fold)
    assert stream == pytest.approx(step, rel=1e-3)
    assert stream_events < step_events / 2
    assert _iteration(True, fold)[0] == stream                # deterministic


def test_cli_stream_rings_flag_reaches_the_engine_and_the_collective_command():
    import json

    from click.testing import CliRunner

    from dessim.cli.main import cli

    runner = CliRunner()
    # unfolded: folded, lane families and orbit runs already make the exact step-by-step
    # replay smaller (154 events) than streamed rings (309)
    args = ["simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=8", "--tp", "8", "--pp", "2",
            "--global-batch", "16", "--granularity", "stage", "--algo", "ring", "--no-fold",
            "--json"]
    step = json.loads(runner.invoke(cli, args).output)
    stream = json.loads(runner.invoke(cli, [*args, "--stream-rings"]).output)
    assert stream["iteration_s"] == pytest.approx(step["iteration_s"], rel=1e-3)
    assert stream["events"] < step["events"]
    # the summary says when the approximation was used, and how often
    assert step["stream_rings"] is None
    assert 0 < stream["stream_rings"]["streamed"] <= stream["stream_rings"]["collective_runs"]
    ranks = ",".join(str(8 * n) for n in range(8))
    coll = ["collective", "allreduce", "--size", "1GiB", "-t", "dgx-a100:nodes=8", "--ranks", ranks,
            "--json", "--links", "0"]
    a = json.loads(runner.invoke(cli, coll).output)
    b = json.loads(runner.invoke(cli, [*coll, "--stream-rings"]).output)
    assert b["time_s"] == pytest.approx(a["time_s"], rel=1e-12) and b["events"] <= 4


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(3, 8), size=st.floats(1e5, 5e9),
       op=st.sampled_from(["allreduce", "reducescatter", "allgather"]),
       cross=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.floats(1e4, 1e9),
                                st.floats(0.0, 0.02)), max_size=5))
def test_streams_keep_the_network_invariants(p, size, op, cross):
    # Under any cross traffic: every solve is max-min (coupled flows included) and no
    # channel carries more than its capacity; both replays move the same bytes over every
    # link; a stream is never faster than on an idle network; the same input, the same times.
    topo = load_topology(SWITCH)
    cross = [c for c in cross if c[0] != c[1]]

    def replay(stream: bool, net_cls=FlowNetwork):
        env = simpy.Environment()
        net = net_cls(env, topo, record_links=True)
        sched = build_schedule(get_op(op), "ring", tuple(range(p)), size, topology=topo,
                               compact_schedules=True)

        def send(a: int, b: int, nbytes: float, at: float):
            yield env.timeout(at)
            yield net.transfer(a, b, nbytes)

        for c in cross:
            env.process(send(*c))
        run = run_schedule(net, sched, stream_rings=stream)
        env.run()
        return run, net

    stream, net = replay(True, ComparedFlowNetwork)
    step, step_net = replay(False)
    assert all(used <= 1 + 1e-9 for _, _, used in net.utilisation)
    carried = net.link_bytes()
    assert carried == pytest.approx(step_net.link_bytes(), rel=1e-9, abs=1e-3)
    idle = run_collective(op, size, SWITCH, algo="ring", ranks=list(range(p)),
                          protocol="raw").time_s
    assert stream.duration >= idle * (1 - 1e-12)
    assert set(stream.rank_finish) == set(range(p))
    again, _ = replay(True)
    assert again.finish_time == stream.finish_time


def test_a_collective_sweep_can_put_streamed_rings_on_an_axis():
    from dessim.sweep.points import EVALUATORS
    from dessim.sweep.spec import parse_sweep

    spec = parse_sweep({"kind": "collective",
                        "base": {"topology": "dgx-a100:nodes=8",
                                 "collective": {"op": "allreduce", "size": "1GiB",
                                                "ranks": "0,8,16,24,32,40,48,56"}},
                        "axes": {"engine.shortcuts.stream_rings": [False, True]}})
    rows = [EVALUATORS["collective"].evaluate(EVALUATORS["collective"].config(spec.base, p.params))
            for p in spec.points()]
    assert rows[0]["time_s"] == pytest.approx(rows[1]["time_s"], rel=1e-12)
    assert rows[1]["events"] < rows[0]["events"]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_switch_that_is_not_true_or_false_is_refused(value):
    from dessim.errors import CollectiveError

    with pytest.raises(CollectiveError, match="stream_rings must be true or false"):
        run_collective("allreduce", 1e6, SWITCH, algo="ring", stream_rings=value)
