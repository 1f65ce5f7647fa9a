"""What a simulation run produced: spans, time accounting, link usage.

All times in seconds, sizes in bytes. A *span* is one task's life on its stream:
``start_s`` (the stream began the task), ``active_s`` (data began to move: for
communication tasks the time all peers had arrived; equals ``start_s`` for compute) and
``end_s``. Time between ``start_s`` and ``active_s`` is *waiting for peers*.

Per-rank accounting (each a union of intervals, so overlapping tasks are not double counted):

* ``compute_s`` — time at least one compute/delay task ran, and ``compute_by_kernel`` the
  same seconds by kernel kind;
* ``comm_s`` — time at least one communication task was active (moving data);
* ``exposed_comm_s`` — communication time not overlapped by compute;
* ``wait_s`` — time spent only waiting for peers (no compute, no active communication);
* ``idle_s`` — makespan minus time covered by any task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["RankTimes", "SimulationResult", "SPAN_COLUMNS"]

#: Columns of :meth:`SimulationResult.spans` (one row per task).
SPAN_COLUMNS = ("rank", "stream", "task", "name", "kind", "category", "start_s", "active_s",
                "end_s", "bytes", "flops", "op", "peer")


@dataclass(frozen=True, slots=True)
class RankTimes:
    """Time accounting of one rank (seconds)."""

    rank: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    wait_s: float
    idle_s: float
    end_s: float                                 #: when the rank's last task ended
    exposed_by_category: dict[str, float] = field(default_factory=dict)
    #: ``compute_s`` by device-model kernel kind (``matmul``, ``attention.flash2.fwd``,
    #: ``norm``, ...; ``delay`` for delays, ``compute`` for compute tasks of no kind): each
    #: compute task's time split by its kernel mix (:attr:`TaskGraph.kernel_mix`), scaled so
    #: the kinds add up to ``compute_s`` (overlapping compute tasks share their overlap)
    compute_by_kernel: dict[str, float] = field(default_factory=dict)


@dataclass
class SimulationResult:
    """Result of :func:`dessim.engine.simulate`."""

    makespan_s: float
    ranks: list[RankTimes]
    span_records: list[tuple]                     #: rows in SPAN_COLUMNS order
    link_bytes: dict[tuple[str, str], float]      #: bytes carried per direction (a, b)
    link_capacity: dict[tuple[str, str], float]   #: bytes/s per direction (a, b)
    link_series: list[tuple[float, tuple[str, str], float]]  #: (time_s, link, utilisation) change points
    events: int                                   #: engine + network events processed
    wall_s: float                                 #: wall-clock time of the run
    network: str                                  #: network model used
    meta: dict[str, Any] = field(default_factory=dict)

    # ---------------------------------------------------------------- tables
    def spans(self) -> pd.DataFrame:
        """One row per task (see :data:`SPAN_COLUMNS`), sorted by rank, start, task. What a
        task does not have is null: ``peer`` (nullable ``Int64``) of tasks without a peer,
        ``category`` and ``op`` of tasks without one."""
        df = pd.DataFrame.from_records(self.span_records, columns=list(SPAN_COLUMNS))
        df["peer"] = df["peer"].where(df["peer"] >= 0).astype("Int64")
        for col in ("category", "op"):
            df[col] = df[col].where(df[col].astype(bool), None)
        return df.sort_values(["rank", "start_s", "task"], kind="stable").reset_index(drop=True)

    def rank_table(self) -> pd.DataFrame:
        """Per-rank time accounting as a DataFrame."""
        rows = [{"rank": r.rank, "compute_s": r.compute_s, "comm_s": r.comm_s,
                 "exposed_comm_s": r.exposed_comm_s, "wait_s": r.wait_s, "idle_s": r.idle_s,
                 "end_s": r.end_s} for r in self.ranks]
        return pd.DataFrame(rows)

    def link_table(self) -> pd.DataFrame:
        """Per directed link: bytes carried, capacity, average utilisation over the makespan."""
        rows = []
        for (a, b), nbytes in sorted(self.link_bytes.items()):
            cap = self.link_capacity.get((a, b), float("nan"))
            util = nbytes / (cap * self.makespan_s) if self.makespan_s > 0 else 0.0
            rows.append({"src": a, "dst": b, "bytes": nbytes, "capacity_Bps": cap,
                         "avg_utilisation": util})
        return pd.DataFrame(rows, columns=["src", "dst", "bytes", "capacity_Bps", "avg_utilisation"])

    def collectives(self) -> dict[str, Any]:
        """What ran the collectives: ``settings`` (the run's collective settings, one line:
        ``algorithm auto, protocol auto, ...``) and ``chosen`` — per group category (``dp``,
        ``tp``, ...), the collective runs (one per group instance, simulated or replayed from
        a memo) per ``algorithm/protocol``: what ``auto`` chose (NCCL's tuner) or was asked."""
        c = self.meta.get("collectives", {})
        return {"settings": c.get("settings"), "chosen": c.get("chosen", {})}

    # ---------------------------------------------------------------- totals
    def _mean(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.ranks) / len(self.ranks) if self.ranks else 0.0

    def summary(self) -> dict[str, Any]:
        """Plain dict (JSON-ready) of the headline figures; per-rank figures are means."""
        exposed: dict[str, float] = {}
        for r in self.ranks:
            for cat, v in r.exposed_by_category.items():
                exposed[cat] = exposed.get(cat, 0.0) + v / len(self.ranks)
        util = self.link_table()["avg_utilisation"]
        return {
            "makespan_s": self.makespan_s,
            "compute_s": self._mean("compute_s"),
            "comm_s": self._mean("comm_s"),
            "exposed_comm_s": self._mean("exposed_comm_s"),
            "exposed_comm_by_category_s": dict(sorted(exposed.items())),
            "wait_s": self._mean("wait_s"),
            "idle_s": self._mean("idle_s"),
            "ranks": len(self.ranks),
            "tasks": len(self.span_records),
            "events": self.events,
            "wall_s": self.wall_s,
            "network": self.network,
            "max_link_avg_utilisation": float(util.max()) if len(util) else 0.0,
            "collectives": self.collectives(),
        }
