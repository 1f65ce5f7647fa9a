"""Money of a run (US dollars): energy at a price per kWh, GPU rental per GPU-hour and
amortised capital cost. Every price is the user's (defaults are [U] placeholders, 0 for
rental and capex: nothing is charged that was not asked for)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dessim.errors import DessimError

__all__ = ["CostModel", "CostError", "YEAR_S"]

#: Seconds of a (365-day) year.
YEAR_S = 365 * 86400.0


class CostError(DessimError):
    """A price is invalid."""


@dataclass(frozen=True)
class CostModel:
    """Prices: ``usd_per_kwh`` of facility energy ([U] 0.10, an order of magnitude of
    industrial electricity prices), ``usd_per_gpu_hour`` rental (0: owned), capital cost
    ``capex_per_gpu`` (USD per GPU including its share of hosts and network; 0: not
    counted) written off linearly over ``amortisation_s`` seconds ([U] 4 years)."""

    usd_per_kwh: float = 0.10
    usd_per_gpu_hour: float = 0.0
    capex_per_gpu: float = 0.0
    amortisation_s: float = 4 * YEAR_S

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
                raise CostError(f"cost {f.name}: must be a number >= 0, got {v!r}")
        if self.amortisation_s <= 0:
            raise CostError(f"cost amortisation_s: must be > 0 seconds, got {self.amortisation_s!r}")

    def breakdown(self, energy_j: float, wall_s: float, gpus: int) -> dict[str, float]:
        """USD by part for a run of ``wall_s`` seconds on ``gpus`` GPUs using ``energy_j``."""
        return {"energy": energy_j / 3.6e6 * self.usd_per_kwh,
                "rental": gpus * wall_s / 3600.0 * self.usd_per_gpu_hour,
                "capex": gpus * self.capex_per_gpu * wall_s / self.amortisation_s}
