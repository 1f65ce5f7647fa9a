"""Collective algorithms as schedules of point-to-point transfers (docs/collectives.md).

* :mod:`~dessim.collectives.ops` — operations, nccl-tests size semantics, busbw factors;
* :mod:`~dessim.collectives.schedule` — :class:`Schedule` / :class:`Transfer` (data);
* :mod:`~dessim.collectives.algorithms` — the registry :data:`ALGORITHMS` and
  :func:`build_schedule`;
* :mod:`~dessim.collectives.executor` — :func:`run_schedule` on a network model;
* :mod:`~dessim.collectives.settings` — :class:`CollectiveSettings`, one object for every
  caller;
* :mod:`~dessim.collectives.nccl`, :mod:`~dessim.collectives.protocols`,
  :mod:`~dessim.collectives.auto` — NCCL's tuning model, its protocols as charged by the
  executor, and ``auto`` (NCCL's choice of algorithm and protocol);
* :mod:`~dessim.collectives.api` — :func:`plan_collective`, :func:`run_collective`,
  :func:`compare_collectives`;
* :mod:`~dessim.collectives.loop` — how nccl-tests times calls issued back to back (its
  ``-g`` and ``-n``), for comparing with published tables.
"""

from __future__ import annotations

from dessim.collectives.algorithms import ALGORITHMS, Algorithm, build_schedule, get_algorithm
from dessim.collectives.api import (CollectivePlan, CollectiveResult, compare_collectives,
                                    parse_ranks, plan_collective, run_collective)
from dessim.collectives.auto import AutoChoice, choose
from dessim.collectives.executor import ScheduleRun, run_schedule
from dessim.collectives.ops import OPS, Op, get_op
from dessim.collectives.protocols import Protocol
from dessim.collectives.schedule import Schedule, Transfer
from dessim.collectives.settings import CollectiveSettings

__all__ = ["ALGORITHMS", "Algorithm", "AutoChoice", "CollectivePlan", "CollectiveResult",
           "CollectiveSettings", "OPS", "Op", "Protocol", "Schedule", "ScheduleRun", "Transfer",
           "build_schedule", "choose", "compare_collectives", "get_algorithm", "get_op",
           "parse_ranks", "plan_collective", "run_collective", "run_schedule"]
