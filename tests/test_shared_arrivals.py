"""Images of one folded rank share one arrival event in a merged run (issue 17, ``dessim
explore``'s costly layouts): the run must be exactly the run with one arrival event per image
succeeded in the same order — same start and finish of every transfer, same rank finishes —
with and without a protocol's call latency, whatever order the images are listed in."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dessim.collectives import build_schedule, executor
from dessim.collectives.executor import merge_instances, run_schedule
from dessim.collectives.protocols import RAW, make_protocol
from dessim.network import make_network
from dessim.topology import load_topology

TOPOLOGY = load_topology("dgx-h100:nodes=2")
LANES, RANKS = 4, 4
PROTOCOLS = {"raw": RAW, "Simple": make_protocol("Simple", 0.0), "LL": make_protocol("LL", 2e-6)}


class _Calls:
    """The ranks the replay is told have arrived, in call order."""

    def __init__(self, monkeypatch) -> None:
        self.ranks: list[int] = []
        original = executor._PlanRun._arrived

        def arrived(run, r: int) -> None:
            self.ranks.append(r)
            original(run, r)
        monkeypatch.setattr(executor._PlanRun, "_arrived", arrived)


def _run(op: str, algo: str, protocol, arrive: list[float], reverse: bool, shared: bool):
    """Every transfer's (start, finish) and every rank's finish; images of member j of the
    group (one per lane) arrive at ``arrive[j]`` seconds, listed lane by lane (or backwards)."""
    env = simpy.Environment()
    net = make_network("flow", env, TOPOLOGY)
    net.transfer(0, 9, 3e6)                       # cross traffic: bundles split
    groups = [tuple(range(lane, LANES * RANKS, LANES)) for lane in range(LANES)]
    sched = merge_instances(net, [build_schedule(op, algo, g, 8e6) for g in groups])
    assert sched is not None
    arrivals: dict[int, simpy.Event] = {}
    order = []
    for j in range(RANKS):
        images = [g[j] for g in (reversed(groups) if reverse else groups)]
        one = env.event() if shared else None
        events = [one or env.event() for _ in images]
        arrivals.update(zip(images, events))
        order.append((arrive[j], list({id(e): e for e in events}.values())))
    run = run_schedule(net, sched, arrivals=arrivals, protocol=protocol)
    for t, events in order:
        env.timeout(t).callbacks.append(lambda _e, events=events: [e.succeed() for e in events])
    env.run()
    return list(run.transfer_start), list(run.transfer_finish), run.rank_finish


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([("allreduce", "ring"), ("allgather", "ring"), ("alltoall", "direct")]),
       st.sampled_from(sorted(PROTOCOLS)),
       st.lists(st.sampled_from([0.0, 1e-5, 3e-5]), min_size=RANKS, max_size=RANKS),
       st.booleans())
def test_one_shared_arrival_event_is_one_event_per_image(opalgo, protocol, arrive, reverse):
    op, algo = opalgo
    with pytest.MonkeyPatch.context() as mp:
        calls = _Calls(mp)
        shared = _run(op, algo, PROTOCOLS[protocol], arrive, reverse, shared=True)
        shared_calls, calls.ranks = calls.ranks, []
        alone = _run(op, algo, PROTOCOLS[protocol], arrive, reverse, shared=False)
    assert shared == alone
    assert shared_calls == calls.ranks and len(set(shared_calls)) == LANES * RANKS


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_ranks_that_arrived_before_the_run_take_part_at_once(protocol):
    """Events already processed when the run starts: the ranks count as arrived (with the
    call latency), shared or not."""
    results = []
    for shared in (True, False):
        env = simpy.Environment()
        net = make_network("flow", env, TOPOLOGY)
        groups = [tuple(range(lane, LANES * RANKS, LANES)) for lane in range(LANES)]
        sched = merge_instances(net, [build_schedule("allreduce", "ring", g, 8e6) for g in groups])
        early = env.event()
        early.succeed()
        env.run()                                  # processed
        arrivals = {g[0]: (early if shared else env.event()) for g in groups}
        if not shared:
            for ev in arrivals.values():
                ev.succeed()
            env.run()
        run = run_schedule(net, sched, arrivals=arrivals, protocol=PROTOCOLS[protocol])
        env.run()
        results.append((list(run.transfer_finish), run.rank_finish))
    assert results[0] == results[1]
