"""How collectives run: one typed object, passed whole from the CLI to the executor.

:class:`CollectiveSettings` holds the choices NCCL makes for a collective — algorithm,
protocol, channels — and dessim's two modelling knobs (pipelining chunks, reduction speed).
Every layer that runs collectives (:func:`~dessim.collectives.run_collective`, the engine,
the TP closed forms, sweeps) takes this object instead of loose arguments, and addresses its
fields by the same names (``collectives.algo`` in sweep specs, ``--algo`` on the command line).

``auto`` (the default of ``algo`` and ``protocol``) is NCCL's tuner
(:mod:`dessim.collectives.auto`): the choice NCCL 2.30.7 would make for the operation, size,
group and topology. Naming an algorithm or protocol overrides that choice (as
``NCCL_ALGO`` / ``NCCL_PROTO`` do); ``protocol="raw"`` is the textbook alpha-beta model — no
protocol framing, no software latency — for checking closed forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from dessim.collectives.algorithms import get_algorithm
from dessim.errors import CollectiveError, UnitError
from dessim.units import parse_bandwidth

__all__ = ["CollectiveSettings", "PROTOCOL_NAMES"]

#: Valid ``protocol`` values: NCCL's three, the textbook model, and NCCL's choice.
PROTOCOL_NAMES: tuple[str, ...] = ("auto", "LL", "LL128", "Simple", "raw")
_PROTOCOL_KEYS = {p.lower(): p for p in PROTOCOL_NAMES}


@dataclass(frozen=True)
class CollectiveSettings:
    """Settings of every collective of a run (validated at construction; SI units).

    * ``algo``: ``"auto"`` (NCCL's tuner; in a task graph, each task's own algorithm)
      or an algorithm name (:data:`~dessim.collectives.algorithms.ALGORITHMS`), forced for
      every collective.
    * ``protocol``: ``"auto"`` (NCCL's tuner), ``"LL"``, ``"LL128"``, ``"Simple"`` or
      ``"raw"`` (case-insensitive).
    * ``channels``: parallel lanes; None = as NCCL lays them out (one per rail of the
      group's nodes across nodes, one inside a node); an int forces that many lanes, each
      with 1/C of the data (rings alternate direction).
    * ``chunks``: pieces per lane sent one after another on the same connections
      (pipelines trees and chains).
    * ``reduction_bw``: bytes/second a GPU reduces at (a number or ``"200GB/s"``); None =
      reductions are free.
    * ``gpus_per_process``: GPUs one host thread drives, issuing every collective once per
      GPU, one after the other (nccl-tests ``-g N``; NCCL's single-process multi-GPU mode).
      Training frameworks run one process per GPU: 1, the default. Each call then pays
      ``(gpus_per_process − 1) × nccl.host_overhead`` (an isolated call: its kernels start
      one host issue apart; nccl-tests' back-to-back loop is
      :func:`dessim.collectives.loop.nccl_tests_iteration_time`; docs/collectives.md,
      "Protocols").
    """

    algo: str = "auto"
    protocol: str = "auto"
    channels: int | None = None
    chunks: int = 1
    reduction_bw: float | None = None
    gpus_per_process: int = 1

    def __post_init__(self) -> None:
        algo = self.algo
        if not isinstance(algo, str) or not algo.strip():
            raise CollectiveError(f"collectives.algo must be an algorithm name or auto, "
                                  f"got {algo!r}")
        algo = algo.strip().lower()
        if algo != "auto":
            algo = get_algorithm(algo).name
        object.__setattr__(self, "algo", algo)
        proto = _PROTOCOL_KEYS.get(str(self.protocol).strip().lower()) \
            if isinstance(self.protocol, str) else None
        if proto is None:
            raise CollectiveError(f"collectives.protocol {self.protocol!r} is not a protocol; "
                                  f"valid: {', '.join(PROTOCOL_NAMES)}")
        object.__setattr__(self, "protocol", proto)
        for name in ("chunks", "channels", "gpus_per_process"):
            value = getattr(self, name)
            if value is None and name == "channels":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CollectiveError(f"collectives.{name} must be a whole number >= 1"
                                      f"{' or None (as NCCL lays them out)' if name == 'channels' else ''}"
                                      f", got {value!r}")
        bw = self.reduction_bw
        if bw is not None:
            try:
                bw = parse_bandwidth(bw, "collectives.reduction_bw")
            except UnitError as exc:
                raise CollectiveError(str(exc)) from None
            if not (bw > 0 and math.isfinite(bw)):
                raise CollectiveError(f"collectives.reduction_bw must be > 0 bytes/s, got {bw!r}")
            object.__setattr__(self, "reduction_bw", float(bw))

    @classmethod
    def of(cls, value: "CollectiveSettings | Mapping[str, Any] | None", where: str = "collectives"
           ) -> "CollectiveSettings":
        """``value`` as settings: itself, the default for None, or built from a mapping of
        field names (unknown keys are an error naming them)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise CollectiveError(f"{where}: expected a mapping of {', '.join(cls.field_names())}, "
                                  f"got {value!r}")
        bad = [k for k in value if k not in cls.field_names()]
        if bad:
            raise CollectiveError(f"{where}: unknown key {bad[0]!r}; valid keys: "
                                  f"{', '.join(cls.field_names())}")
        return cls(**dict(value))

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(CollectiveSettings))

    def with_(self, **changes: Any) -> "CollectiveSettings":
        """A copy with ``changes`` (validated)."""
        return replace(self, **changes)

    def describe(self) -> str:
        """One line for summaries: ``algorithm auto, protocol auto, channels as NCCL, ...``."""
        ch = "as NCCL" if self.channels is None else str(self.channels)
        red = "free" if self.reduction_bw is None else f"{self.reduction_bw / 1e9:g} GB/s"
        gpp = "" if self.gpus_per_process == 1 else f", {self.gpus_per_process} GPUs per process"
        return (f"algorithm {self.algo}, protocol {self.protocol}, channels {ch}, "
                f"chunks {self.chunks}, reductions {red}{gpp}")
