"""Simulate a workload of any kind on a topology: the entry point of ``dessim simulate``.

:func:`simulate_workload` is what ``dessim simulate`` and the sweep's ``workload`` points
call: every kind takes :func:`dessim.workload.kinds.simulate_any` — a transformer is planned
(:func:`~dessim.workload.transformer.plan.plan_workload`: overrides, validation, memory fit),
its task graph generated (:mod:`dessim.workload.transformer.generator`), replayed
(:func:`dessim.engine.simulate`) and wrapped
(:class:`~dessim.workload.transformer.result.WorkloadResult`); other kinds alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dessim.engine import EngineOptions
from dessim.topology.graph import Topology
from dessim.workload.kinds import simulate_any
from dessim.workload.transformer.result import WorkloadResult
from dessim.workload.transformer.spec import WorkloadSpec

__all__ = ["simulate_workload", "DEFAULT_WORKLOAD", "DEFAULT_TOPOLOGY"]

#: What ``dessim simulate`` runs without arguments (small enough for a few seconds).
DEFAULT_WORKLOAD = "gpt3-1.3b"
DEFAULT_TOPOLOGY = "dgx-h100:nodes=1"

def simulate_workload(workload: str | Path | WorkloadSpec, topology: Topology | str, *,
                      overrides: Mapping[str, Any] | None = None,
                      options: EngineOptions | None = None) -> WorkloadResult:
    """Simulate one training iteration of ``workload`` (preset name, YAML path or spec) on
    ``topology`` (a Topology or any spec :func:`~dessim.topology.load_topology` takes).

    Every kind of workload takes the one pipeline :func:`dessim.workload.kinds.simulate_any`
    (plan → generate → simulate → result), the very one ``dessim cluster`` generates its jobs
    with (tests/test_entry_points.py). Files of another ``kind:`` (``dlrm``, ``cnn``) return a
    :class:`~dessim.workload.dataparallel.result.DPResult` (the same ``summary()`` keys where
    they apply).

    Raises a :class:`~dessim.errors.DessimError` for any bad input: unknown preset or key,
    invalid layout (:class:`~dessim.errors.WorkloadError` naming the numbers), a layout that
    does not fit (:class:`~dessim.errors.MemoryFitError` with the shortfall and suggestions).
    """
    return simulate_any(workload, topology, overrides=overrides, options=options)
