"""Exclusive collectives replayed from a memo (issue 17): when every collective provably has
the network to itself, the engine simulates each distinct one once. Results must equal the
full replay."""

from __future__ import annotations

import pytest

from dessim.engine import EngineOptions
from dessim.workload import simulate_workload

DP_ONLY = {"tp": 1, "pp": 1, "global_batch": 64, "micro_batch": 4, "bucket_size": "25MiB"}


def _run(workload, topo, overrides, memo):
    return simulate_workload(workload, topo, overrides=overrides,
                             options=EngineOptions(record_links=False, collective_memo=memo))


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


def test_memo_stays_off_when_other_traffic_can_share_the_links():
    # pipeline parallelism: send/recv can overlap the data-parallel collectives
    res = _run("gpt3-1.3b", "dgx-a100:nodes=2", dict(DP_ONLY, pp=2), True)
    assert "collective_memo" not in res.simulation.meta


def test_memo_stays_off_without_folding():
    res = _run("gpt3-1.3b", "dgx-a100:nodes=1", dict(DP_ONLY, generator={"fold": False}), True)
    assert "collective_memo" not in res.simulation.meta


def test_memo_stays_off_when_link_timelines_are_recorded():
    res = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides=DP_ONLY,
                            options=EngineOptions(record_links=True))
    assert "collective_memo" not in res.simulation.meta
