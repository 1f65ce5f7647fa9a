"""Exclusive collectives replayed from a memo (issue 17): when every collective provably has
the network to itself, the engine simulates each distinct one once. Results must equal the
full replay."""

from __future__ import annotations

import pytest

from dessim.engine import EngineOptions, Shortcuts
from dessim.workload import simulate_workload

DP_ONLY = {"tp": 1, "pp": 1, "global_batch": 64, "micro_batch": 4, "bucket_size": "25MiB"}


def _run(workload, topo, overrides, memo):
    return simulate_workload(workload, topo, overrides=overrides,
                             options=EngineOptions(record_links=False,
                                                                 shortcuts=Shortcuts(collective_memo=memo)))


@pytest.mark.parametrize("zero", [0, 1])
def test_memo_replays_exclusive_collectives_and_changes_nothing(zero):
    ov = dict(DP_ONLY, zero_stage=zero)
    fast = _run("gpt3-1.3b", "dgx-a100:nodes=2", ov, True)
    full = _run("gpt3-1.3b", "dgx-a100:nodes=2", ov, False)
    memo = fast.simulation.meta["collective_memo"]
    assert memo["replayed"] > 0 and memo["simulated"] < memo["replayed"]
    assert fast.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)   # start-time rounding
    assert fast.simulation.link_bytes == pytest.approx(full.simulation.link_bytes, rel=1e-12)
    for a, b in zip(fast.simulation.ranks, full.simulation.ranks):
        assert a.exposed_comm_s == pytest.approx(b.exposed_comm_s, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("overrides", [
    pytest.param({"tp": 2, "pp": 1, "global_batch": 16, "micro_batch": 2, "generator": {"granularity": "layer"}},
                 id="tp-overlapping-wgrad"),
    pytest.param({"tp": 2, "pp": 2, "global_batch": 16, "micro_batch": 2, "generator": {"granularity": "layer"}},
                 id="tp-pp-send-recv"),
    pytest.param({"tp": 4, "pp": 1, "sp": True, "global_batch": 16, "micro_batch": 1, "zero_stage": 1,
                  "generator": {"granularity": "layer"}}, id="sp-zero1"),
])
def test_memo_replays_only_collectives_that_ran_alone_and_changes_nothing(overrides):
    """Collectives that overlap compute, pipeline sends or other collectives: replayed only
    when no other network task can start before they end."""
    fast = _run("gpt3-1.3b", "dgx-a100:nodes=2", overrides, True)
    full = _run("gpt3-1.3b", "dgx-a100:nodes=2", overrides, False)
    assert fast.simulation.meta["collective_memo"]["replayed"] > 0
    assert fast.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert fast.simulation.link_bytes == pytest.approx(full.simulation.link_bytes, rel=1e-12)
    for a, b in zip(fast.simulation.ranks, full.simulation.ranks):
        assert a.exposed_comm_s == pytest.approx(b.exposed_comm_s, rel=1e-9, abs=1e-12)
        assert a.compute_s == pytest.approx(b.compute_s, rel=1e-12)


def test_without_folding_only_the_per_link_memo_replays():
    """Unfolded, every collective has one member task per rank: never the network-wide memo
    (it takes single-member collectives), but the per-link memo of collectives of several
    members (tests/test_link_memo.py) when they all arrive at one instant."""
    ov = dict(DP_ONLY, generator={"fold": False})
    res = _run("gpt3-1.3b", "dgx-a100:nodes=1", ov, True)
    memo = res.simulation.meta["collective_memo"]
    assert memo["replayed"] == memo["replayed_on_links"] > 0
    off = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=ov,
                            options=EngineOptions(record_links=False,
                                                  shortcuts=Shortcuts(link_memo=False)))
    assert "collective_memo" not in off.simulation.meta


def test_memo_stays_off_when_link_timelines_are_recorded():
    res = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=DP_ONLY,
                            options=EngineOptions(record_links=True))
    assert "collective_memo" not in res.simulation.meta
