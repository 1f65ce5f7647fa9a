"""The executor takes the members of a split bundle that finish together in one call
(``_Done.each`` / ``_PlanRun._done_each``): the same effect as reporting them one at a time,
which is what the flow network does for a callback without ``each``. Every recorded time and
the network's counters must be identical, bit for bit."""

from __future__ import annotations

import pytest

from dessim.collectives import executor
from dessim.collectives.api import run_collective


def _figures(result):
    run = result.run
    return (result.time_s, result.events, result.transfers, list(run.transfer_start),
            list(run.transfer_finish), sorted(run.rank_finish.items()),
            [(row["link"], row["bytes"]) for row in result.link_util])


CASES = [
    # several ring channels over the same ports: each step's bundle joins onto ports the
    # other channels' bundles hold, splits, and its members finish together; the hops
    # between hosts / racks finish later, so steps also complete piecemeal
    ("allreduce", "gb200-nvl72:racks=2", dict(algo="ring", ranks="0-7,72-79")),
    ("allgather", "dgx-h100:nodes=2", dict(algo="ring")),
    ("allreduce", "dgx-h100:nodes=4", dict(algo="ring")),
    ("allreduce", "gb200-nvl72:racks=1", dict(algo="ring", ranks="0-7", channels=8)),
    # with a reduction cost (those steps take the per-member calls themselves)
    ("allreduce", "dgx-h100:nodes=2", dict(algo="ring", reduction_bw=2e11)),
]


@pytest.mark.parametrize("op,topology,kw", CASES)
def test_each_equals_one_at_a_time(monkeypatch, op, topology, kw):
    calls = []
    done_each = executor._PlanRun._done_each

    def counted(self, s, members):
        calls.append(len(members))
        return done_each(self, s, members)

    monkeypatch.setattr(executor._PlanRun, "_done_each", counted)
    batched = _figures(run_collective(op, "8MiB", topology, **kw))
    assert calls and max(calls) > 1, "the case must report split members together"
    monkeypatch.delattr(executor._Done, "each")
    one_by_one = _figures(run_collective(op, "8MiB", topology, **kw))
    assert batched == one_by_one
