"""Collectives alone on their own links replayed from the memo (issue 17,
``Shortcuts.link_memo``, :mod:`dessim.engine.links`): in a pipeline, every stage's tensor-
parallel collectives run at the same time on their own NVSwitch ports, beside pipeline sends
that share those ports now and then. A collective is replayed only when no task that can put
a flow on its channels runs or can start before it would end; results must equal the run
without the shortcut (to the float rounding of a replayed start time, as the network-wide
memo: tests/test_collective_memo.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dessim.engine import EngineOptions, Shortcuts
from dessim.engine.links import LinkProof
from dessim.workload import simulate_workload

REL = 1e-12     # replayed start times round differently (tests/test_collective_memo.py)
ABS_S = 1e-12   # seconds: span times near zero


def _run(overrides, link_memo, workload="gpt3-1.3b", topo="dgx-a100:nodes=1"):
    return simulate_workload(workload, topo, overrides=overrides,
                             options=EngineOptions(record_links=False,
                                                   shortcuts=Shortcuts(link_memo=link_memo)))


def _assert_same(fast, full):
    assert fast.iteration_s == pytest.approx(full.iteration_s, rel=REL)
    a, b = fast.simulation, full.simulation
    assert a.link_bytes == pytest.approx(b.link_bytes, rel=REL)
    assert len(a.span_records) == len(b.span_records)
    for x, y in zip(a.span_records, b.span_records):
        assert x[:6] == y[:6] and x[9:] == y[9:]          # the same task, bytes, flops, peer
        assert x[6:9] == pytest.approx(y[6:9], rel=REL, abs=ABS_S)
    for x, y in zip(a.ranks, b.ranks):
        assert x.compute_s == pytest.approx(y.compute_s, rel=REL)
        assert x.exposed_comm_s == pytest.approx(y.exposed_comm_s, rel=1e-9, abs=ABS_S)


TP_PP = {"tp": 2, "pp": 2, "global_batch": 16, "micro_batch": 2, "generator": {"granularity": "layer"}}


def test_pipeline_tp_collectives_replay_on_links_and_change_nothing():
    fast = _run(TP_PP, True)
    full = _run(TP_PP, False)
    memo = fast.simulation.meta["collective_memo"]
    assert memo["replayed_on_links"] > 100                    # most TP collectives
    assert memo["refused_on_links"] > 0                       # pipeline sends beside some
    assert full.simulation.meta["collective_memo"]["replayed_on_links"] == 0
    _assert_same(fast, full)


def test_link_memo_equals_the_full_replay():
    """Against every shortcut off (--exact), not only against the memo without links."""
    ov = {"tp": 2, "pp": 2, "global_batch": 8, "micro_batch": 2, "generator": {"granularity": "layer"}}
    fast = _run(ov, True)
    exact = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=ov,
                              options=EngineOptions(record_links=False, shortcuts=Shortcuts.none()))
    assert fast.simulation.meta["collective_memo"]["replayed_on_links"] > 0
    _assert_same(fast, exact)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([2, 4]), pp=st.sampled_from([2, 4]), m=st.integers(1, 6),
       schedule=st.sampled_from(["1f1b", "gpipe"]), nodes=st.sampled_from([1, 2]))
def test_link_memo_equals_its_absence_on_random_pipelines(tp, pp, m, schedule, nodes):
    assume(tp * pp <= 8 * nodes)
    ov = {"tp": tp, "pp": pp, "dp": 8 * nodes // (tp * pp), "micro_batch": 1,
          "global_batch": m * (8 * nodes // (tp * pp)), "schedule": schedule,
          "generator": {"granularity": "layer"}}
    fast = _run(ov, True, topo=f"dgx-a100:nodes={nodes}")
    full = _run(ov, False, topo=f"dgx-a100:nodes={nodes}")
    _assert_same(fast, full)


def test_link_memo_is_off_under_exact_and_without_the_collective_memo():
    assert not Shortcuts.none().link_memo
    res = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=TP_PP,
                            options=EngineOptions(record_links=False,
                                                  shortcuts=Shortcuts(collective_memo=False)))
    assert "collective_memo" not in res.simulation.meta


def test_a_running_transfer_on_the_channels_refuses_the_proof():
    """White box: a send in the scope of the collective that is moving bytes now (both ends
    started) makes the proof fail, whatever the bounds say."""
    from dessim.engine.engine import _Run
    from dessim.workload.kinds import generate_workload

    gen = generate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=TP_PP)
    run = _Run(gen.graph, gen.topology, EngineOptions(record_links=False), None)
    proof = run.links
    assert isinstance(proof, LinkProof)
    coll = next(i for i, t in enumerate(run.tasks) if t.kind == "collective" and t.category == "tp")
    key = run.memo_key(run.tasks[coll])
    scope = proof._scope(coll, key)
    sends = [j for j in scope.members if run.tasks[j].kind == "send"]
    assert sends, "a pipeline send shares the TP group's NVSwitch ports"
    assert proof.free_now(coll, key) is not None       # nothing has started: free
    proof.watches.clear()
    send = min(sends, key=lambda j: run.stream_of[j] != run.stream_of[coll])
    recv = run.partner[send]
    for j in (send, recv):                              # a transfer in flight
        run.start[j] = 0.0
    stream = run.stream_of[send]
    run.head[stream] = proof._pos[send]
    run.head[run.stream_of[recv]] = proof._pos[recv]
    assert proof.free_now(coll, key) is None
    assert not proof.isolated(coll, key, 1e-3)


def test_simulate_names_the_per_link_memo_and_exact_turns_it_off():
    from click.testing import CliRunner

    from dessim.cli.main import cli

    args = ["simulate", "gpt3-1.3b", "--topology", "dgx-a100:nodes=1", "--tp", "2", "--pp", "2",
            "--global-batch", "16", "--micro-batch", "2", "--granularity", "layer"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.strip().startswith("shortcuts"))
    assert "alone on their own links: per-link memo" in line
    exact = CliRunner().invoke(cli, args + ["--exact"])
    assert exact.exit_code == 0, exact.output
    assert "per-link memo" not in exact.output



def test_the_route_budget_only_switches_the_shortcut(monkeypatch):
    """Past :data:`~dessim.engine.links.ROUTE_BUDGET` routed pairs the shortcut turns itself
    off for the run (every collective simulated) and nothing else changes; at a budget of
    exactly what the run's footprints route it stays on. (The budget is a speed guard:
    raising it for the 2,048-GPU deepseek-v3, whose footprints route 83,712 pairs, must not
    change a result.)"""
    import dessim.engine.links as links
    from dessim.engine.engine import _Run
    from dessim.workload.kinds import generate_workload

    gen = generate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=TP_PP)
    run = _Run(gen.graph, gen.topology, EngineOptions(record_links=False), None)
    run.run()
    needed = run.links._routed
    assert run.links.on and run.links.replayed > 0 and needed > 1
    on = _run(TP_PP, True)
    monkeypatch.setattr(links, "ROUTE_BUDGET", needed)
    at_budget = _run(TP_PP, True)
    assert (at_budget.simulation.meta["collective_memo"]
            == on.simulation.meta["collective_memo"])
    assert at_budget.iteration_s == on.iteration_s
    monkeypatch.setattr(links, "ROUTE_BUDGET", needed - 1)
    off = _run(TP_PP, True)
    assert off.simulation.meta["collective_memo"]["replayed_on_links"] == 0
    assert on.simulation.meta["collective_memo"]["replayed_on_links"] > 0
    _assert_same(on, off)


# ------------------------------------------------------------ several member tasks
DP_UNFOLDED = {"tp": 1, "pp": 1, "global_batch": 64, "micro_batch": 4, "bucket_size": "25MiB",
               "generator": {"fold": False}}


def test_collectives_of_several_members_replay_on_links_and_change_nothing():
    """Unfolded data parallelism: each gradient bucket's all-reduce has one member task per
    rank, all arriving at one instant (the ranks are symmetric). The first of each key is
    simulated under a watch, the others replayed with each member ending as it did; the run
    equals the one without the shortcut and the full replay (--exact)."""
    fast = _run(DP_UNFOLDED, True, topo="dgx-a100:nodes=2")
    full = _run(DP_UNFOLDED, False, topo="dgx-a100:nodes=2")
    exact = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=2", overrides=DP_UNFOLDED,
                              options=EngineOptions(record_links=False, shortcuts=Shortcuts.none()))
    memo = fast.simulation.meta["collective_memo"]
    assert memo["replayed_on_links"] > memo["simulated"] > 0
    _assert_same(fast, full)
    _assert_same(fast, exact)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1]), m=st.integers(1, 3),
       bucket=st.sampled_from(["10MiB", "25MiB", "100MiB"]), tp=st.sampled_from([1, 2]),
       pp=st.sampled_from([1, 2]), fold=st.booleans())
def test_several_member_memo_equals_its_absence(nodes, zero, m, bucket, tp, pp, fold):
    """Random data-, tensor- and pipeline-parallel layouts, folded or not (folded DP groups
    whose members are the pipeline's stages): the per-link memo of collectives of several
    member tasks changes no result beyond the rounding of replayed start times."""
    dp = 8 * nodes // (tp * pp)
    ov = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1, "global_batch": m * dp * pp,
          "zero_stage": zero, "bucket_size": bucket, "generator": {"fold": fold}}
    fast = _run(ov, True, topo=f"dgx-a100:nodes={nodes}")
    full = _run(ov, False, topo=f"dgx-a100:nodes={nodes}")
    _assert_same(fast, full)


def test_a_member_arriving_later_is_simulated():
    """White box: a memoised collective of several members is replayed only when every
    member arrived in the instant; one member alone (the other late) starts the run."""
    from dessim.engine.engine import _Run
    from dessim.workload.kinds import generate_workload

    gen = generate_workload("gpt3-1.3b", "dgx-a100:nodes=2", overrides=DP_UNFOLDED)
    run = _Run(gen.graph, gen.topology, EngineOptions(record_links=False), None)
    run.run()
    assert run.multi_memo and run.links.replayed > 0
    key, (offsets, _) = next(iter(run.multi_memo.items()))
    assert len(offsets) == 16 and all(d > 0 for _, d in offsets)     # one end per rank
    fresh = _Run(gen.graph, gen.topology, EngineOptions(record_links=False), None)
    fresh.multi_memo[key] = run.multi_memo[key]
    cid, members = next((c, ms) for c, ms in fresh.colls.items()
                        if fresh.memo_key(fresh.tasks[ms[0]]) == key)
    fresh.multi_wait[cid] = [members[0]]
    fresh._decide_multi(cid)
    assert cid in fresh.coll_state and fresh.links.replayed == 0
