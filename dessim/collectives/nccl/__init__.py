"""NCCL's view of a collective: its tuning model and what its topology search finds.

:mod:`~dessim.collectives.nccl.tuning` transcribes NCCL 2.30.7's cost model (which
algorithm and protocol NCCL picks); :mod:`~dessim.collectives.nccl.system` derives the
inputs of that model from a dessim topology. ``auto`` uses both (docs/collectives.md).
"""

from __future__ import annotations

from dessim.collectives.nccl.system import nccl_system
from dessim.collectives.nccl.tuning import ALGORITHMS, PROTOCOLS, NcclSystem, algo_time, allowed

__all__ = ["ALGORITHMS", "PROTOCOLS", "NcclSystem", "algo_time", "allowed", "nccl_system"]
