"""Money of a run (US dollars): energy at a price per kWh, GPU rental per GPU-hour and
amortised capital cost.

Defaults: ``usd_per_kwh`` 0.0806, the US average retail price of electricity to industrial
customers in 2023 (8.06 ¢/kWh, US EIA; :data:`DEFAULT_USD_PER_KWH`); rental and capital cost 0
(nothing is charged that was not asked for). The write-off period has no default: give
``amortisation`` with ``capex_per_gpu``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dessim.errors import DessimError

__all__ = ["CostModel", "CostError", "YEAR_S", "DEFAULT_USD_PER_KWH"]

#: Seconds of a (365-day) year.
YEAR_S = 365 * 86400.0
#: [C2] US EIA: average retail price of electricity to industrial customers, 2023, USD/kWh.
DEFAULT_USD_PER_KWH = 0.0806


class CostError(DessimError):
    """A price is invalid or missing."""


@dataclass(frozen=True)
class CostModel:
    """Prices: ``usd_per_kwh`` of facility energy, ``usd_per_gpu_hour`` rental (0: owned),
    capital cost ``capex_per_gpu`` (USD per GPU including its share of hosts and network; 0:
    not counted) written off linearly over ``amortisation_s`` seconds (needed with a capital
    cost; None otherwise)."""

    usd_per_kwh: float = DEFAULT_USD_PER_KWH
    usd_per_gpu_hour: float = 0.0
    capex_per_gpu: float = 0.0
    amortisation_s: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name == "amortisation_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
                raise CostError(f"cost {f.name}: must be a number >= 0, got {v!r}")
        if self.amortisation_s is not None and self.amortisation_s <= 0:
            raise CostError(f"cost amortisation_s: must be > 0 seconds, got {self.amortisation_s!r}")
        if self.capex_per_gpu > 0 and self.amortisation_s is None:
            raise CostError("capex_per_gpu needs the write-off period: give amortisation (a time, e.g. 35040h for 4 years; "
                            "--amortisation TIME)")

    def breakdown(self, energy_j: float, wall_s: float, gpus: int) -> dict[str, float]:
        """USD by part for a run of ``wall_s`` seconds on ``gpus`` GPUs using ``energy_j``."""
        capex = gpus * self.capex_per_gpu * wall_s / self.amortisation_s if self.amortisation_s else 0.0
        return {"energy": energy_j / 3.6e6 * self.usd_per_kwh,
                "rental": gpus * wall_s / 3600.0 * self.usd_per_gpu_hour,
                "capex": capex}
