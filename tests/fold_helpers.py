"""The check that a folded workload run equals its unfolded replay, shared by the fold tests."""

from __future__ import annotations

import pytest


def assert_folded_equals_unfolded(full, folded) -> None:
    """``folded`` (a :class:`~dessim.workload.transformer.result.WorkloadResult` with replica
    folding) is exact against ``full`` (the same run unfolded): a fold was made and shrank the
    graph, no lane drifted, and the iteration, the exposed communication per category and the
    bytes on every link are the unfolded ones."""
    assert folded.taskgraph.fold is not None and full.taskgraph.fold is None
    assert len(folded.taskgraph) < len(full.taskgraph)
    assert folded.simulation.meta["fold"]["max_lane_skew_s"] == 0.0
    assert folded.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    a, b = full.summary(), folded.summary()
    for cat, v in a["exposed_comm_s"].items():
        assert b["exposed_comm_s"][cat] == pytest.approx(v, rel=1e-9, abs=1e-12), cat
    for link, v in full.simulation.link_bytes.items():
        assert folded.simulation.link_bytes[link] == pytest.approx(v, rel=1e-12, abs=1e-3), link
