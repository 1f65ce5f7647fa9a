"""Power and energy of a training iteration (watts, joules, seconds).

Model: every GPU draws ``busy_w`` while it computes (any compute task runs),
``comm_w`` while only communication is active (exposed communication: copy engines, NVLink
and NIC traffic, no compute) and ``idle_w`` otherwise (waiting for peers, pipeline bubbles).
The engine's per-rank accounting (:class:`~dessim.engine.result.RankTimes`: ``compute_s``,
``exposed_comm_s``) gives the time in each state. Every host draws ``host_w`` (CPUs, memory,
fans, NVSwitch and PCIe switches: everything in the host but the GPUs and NICs), every NIC
``nic_w``, every fabric switch ``switch_w`` — all the time. Facility overhead is the power
usage effectiveness ``pue`` (total facility / IT energy).

Defaults per GPU model (:data:`GPU_POWER`, each with its source in docs/references.md
"Whole training runs"). ``busy_w`` is the board power limit (TDP) —
an upper bound: a node measured under LLM training drew at most 8.4 kW of its 10.2 kW
rating (Latif et al. 2024, "H100 node power" in docs/references.md), so the busy figure
over-estimates GPU power by up to ≈ 20 % when kernels do not saturate the GPU; override it
with a measured figure. ``idle_w`` and ``comm_w`` and the host, NIC, switch and PUE
defaults are [U] (unconfirmed orders of magnitude to override, never test oracles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Mapping

from dessim.catalog.devices import get_device
from dessim.engine.result import SimulationResult
from dessim.errors import DessimError
from dessim.training_run.failures import ComponentCounts

__all__ = ["GPUPower", "GPU_POWER", "PowerModel", "IterationEnergy", "iteration_energy", "PowerError"]


class PowerError(DessimError):
    """A power figure is invalid or missing for a device."""


@dataclass(frozen=True)
class GPUPower:
    """Power of one GPU model by activity, watts, with sources."""

    busy_w: float
    comm_w: float
    idle_w: float
    source: str


_IDLE_U = "[U] idle and comm-only: unconfirmed fractions of TDP (~15 % and ~40 %); override"
_TDP_U = "[U] the datasheet TDP, not re-read for dessim; override"

#: Per GPU model (catalog names): the board power limit (TDP) as busy power.
GPU_POWER: Mapping[str, GPUPower] = MappingProxyType({
    "V100": GPUPower(300.0, 120.0, 45.0, "V100 SXM2 300 W " + _TDP_U + "; " + _IDLE_U),
    "A100-40GB": GPUPower(400.0, 160.0, 60.0, "[C2] glennklockwood A100 (400 W maximum); " + _IDLE_U),
    "A100-80GB": GPUPower(400.0, 160.0, 60.0, "[C2] glennklockwood A100 (400 W maximum, as the "
                                              "40 GB part); " + _IDLE_U),
    "H100": GPUPower(700.0, 280.0, 105.0, "[C2] H100 power (H100 SXM up to 700 W TDP); " + _IDLE_U),
    "H200": GPUPower(700.0, 280.0, 105.0, "H200 SXM 700 W " + _TDP_U + "; " + _IDLE_U),
    "B200": GPUPower(1000.0, 400.0, 150.0, "[C2] glennklockwood B200 (HGX B200: 1,000 W); " + _IDLE_U),
    "MI300X": GPUPower(750.0, 300.0, 113.0, "MI300X 750 W " + _TDP_U + "; " + _IDLE_U),
})


def _watts(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise PowerError(f"power {name}: must be a number of watts >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PowerModel:
    """Power figures that are not per GPU model (watts) and the PUE; ``gpu`` overrides the
    per-device table (None: :data:`GPU_POWER` of each rank's device)."""

    host_w: float = 1000.0      #: [U] per host besides GPUs and NICs (CPUs, DRAM, fans, NVSwitch)
    nic_w: float = 25.0         #: [U] per scale-out NIC
    switch_w: float = 1000.0    #: [U] per fabric switch
    pue: float = 1.2            #: [U] facility / IT energy
    gpu: GPUPower | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name not in ("gpu", "pue"):
                _watts(f.name, getattr(self, f.name))
        if isinstance(self.pue, bool) or not isinstance(self.pue, (int, float)) or not (
                self.pue >= 1 and math.isfinite(self.pue)):
            raise PowerError(f"pue: must be a number >= 1 (facility / IT energy), got {self.pue!r}")

    def gpu_power(self, device: str) -> GPUPower:
        """The GPU figures for ``device`` (a catalog name or alias)."""
        if self.gpu is not None:
            return self.gpu
        name = get_device(device).name
        if name not in GPU_POWER:
            raise PowerError(f"no power figures for GPU {name!r}; give them (busy_w, comm_w, idle_w)")
        return GPU_POWER[name]

    def fixed_w(self, counts: ComponentCounts) -> float:
        """IT watts of hosts, NICs and switches (drawn all the time)."""
        return counts.host * self.host_w + counts.nic * self.nic_w + counts.switch * self.switch_w


@dataclass(frozen=True)
class IterationEnergy:
    """Facility energy of one iteration by part (joules, PUE applied) and the mean IT power."""

    gpu_busy_j: float
    gpu_comm_j: float
    gpu_idle_j: float
    host_j: float
    nic_j: float
    switch_j: float
    pue: float
    iteration_s: float
    idle_cluster_w: float   #: facility watts of the cluster with every GPU idle

    @property
    def it_j(self) -> float:
        return (self.gpu_busy_j + self.gpu_comm_j + self.gpu_idle_j + self.host_j + self.nic_j
                + self.switch_j) / self.pue

    @property
    def total_j(self) -> float:
        return self.it_j * self.pue

    @property
    def mean_w(self) -> float:
        """Mean facility watts over the iteration."""
        return self.total_j / self.iteration_s if self.iteration_s > 0 else 0.0

    def breakdown(self) -> dict[str, float]:
        """Joules by part, PUE overhead as ``facility``."""
        return {"gpu_busy": self.gpu_busy_j, "gpu_comm": self.gpu_comm_j, "gpu_idle": self.gpu_idle_j,
                "host": self.host_j, "nic": self.nic_j, "switch": self.switch_j}


def iteration_energy(sim: SimulationResult, devices: Mapping[int, str], counts: ComponentCounts,
                     power: PowerModel) -> IterationEnergy:
    """Facility joules of one simulated iteration (module docstring). ``devices``: each
    rank's GPU model; ranks the simulation did not report (folded replicas) are counted as
    the mean of the simulated ones."""
    t = sim.makespan_s
    busy = comm = idle = 0.0
    ranks = {r.rank: r for r in sim.ranks}
    n = len(devices)
    if ranks:
        scale = n / len(ranks)
        for r in ranks.values():
            p = power.gpu_power(devices.get(r.rank) or next(iter(devices.values())))
            c = min(r.compute_s, t)
            e = min(r.exposed_comm_s, t - c)
            busy += scale * p.busy_w * c
            comm += scale * p.comm_w * e
            idle += scale * p.idle_w * max(0.0, t - c - e)
    gpu_idle_w = sum(power.gpu_power(d).idle_w for d in devices.values())
    pue = power.pue
    return IterationEnergy(busy * pue, comm * pue, idle * pue, counts.host * power.host_w * t * pue,
                           counts.nic * power.nic_w * t * pue, counts.switch * power.switch_w * t * pue,
                           pue, t, (gpu_idle_w + power.fixed_w(counts)) * pue)
