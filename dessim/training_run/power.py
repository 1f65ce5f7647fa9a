"""Power and energy of a training iteration (watts, joules, seconds).

Model. Every GPU is, at each instant, in one *state* (:data:`GPU_STATES`): running a kernel
of one of the compute kinds (:data:`COMPUTE_KINDS`), only communicating, or idle:

* ``gemm`` — GEMMs (``matmul`` kernels: tensor-core bound);
* ``attention`` — fused attention (FlashAttention-2/3 blocks);
* ``memory`` — memory-bound kernels (elementwise, norms, softmax, optimizer, dropout, and
  unfused attention blocks);
* ``other`` — compute the engine cannot name (delays, compute tasks given only a duration);
* ``comm`` — only communication is active (exposed communication: copy engines, NVLink and
  NIC traffic, no compute);
* ``idle`` — nothing runs (waiting for peers, pipeline bubbles).

The engine reports each rank's compute seconds by kernel kind
(:attr:`~dessim.engine.result.RankTimes.compute_by_kernel`; :func:`power_kind` maps a kernel
kind to its state) and its exposed communication; the rest of the makespan is idle.
Communication the engine ran as compute (TP collectives timed in closed form: delays and
merged stage tasks, ``comm_in_compute``) is moved back to ``comm``, its kinds' shares kept, so
the shortcut's energy is the exact replay's. GPU energy
is ``Σ_state seconds × watts(state)`` per GPU. Every host draws ``host_w`` (CPUs, memory,
fans, NVSwitches, PCIe switches, its NICs: everything in the host but the GPUs), every
scale-out NIC outside the host figure ``nic_w``, every fabric switch ``switch_w`` — all the
time. Facility energy is IT energy × ``pue`` (power usage effectiveness).

Defaults (each with its source; short names in docs/references.md "Whole training runs"):

* GPU watts per state and model (:data:`GPU_POWER`). Compute kinds default to the board power
  limit: LLM training's compute-heavy phases draw up to the TDP (Patel et al. 2024; Choukse
  et al. 2025) — an upper bound (an H100 node measured under training drew at most 8.4 kW of
  its 10.2 kW rating, Latif et al. 2024). No public per-kernel measurement of memory-bound
  kernels on these GPUs was found, so ``memory`` is the board limit too, marked [U]. ``idle``
  is a measured draw of a GPU held by a job at 0 % utilisation (nvidia-smi / rocm-smi
  readings published in public issues); ``comm`` equals ``idle``: communication-heavy phases
  draw close to idle power (Choukse et al. 2025). Entries whose source string contains
  ``[U]`` are unconfirmed; override them (``--gpu-power``).
* ``host_w`` per host (:data:`HOST_POWER`): the DGX system's maximum input power (its user
  guide) minus its 8 GPUs at their board limit — a maximum, charged all the time. The DGX
  figure includes its NICs, so ``nic_w`` defaults to 0.
* ``switch_w``: no public figure for a fabric switch's draw was found — a topology with
  fabric switches needs it (``--switch-power``; 0 leaves them out), there is no default.
* ``pue`` 1.58: the Uptime Institute Global Data Center Survey 2023 average (hyperscale
  operators report ≈ 1.1: give ``--pue 1.1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

from dessim.catalog.devices import get_device
from dessim.engine.result import RankTimes, SimulationResult
from dessim.errors import DessimError
from dessim.training_run.failures import ComponentCounts

__all__ = ["GPU_STATES", "COMPUTE_KINDS", "GPUPower", "GPU_POWER", "HOST_POWER", "PowerModel",
           "IterationEnergy", "iteration_energy", "power_kind", "PowerError", "DEFAULT_PUE"]

#: Compute kinds of a GPU's time (:func:`power_kind`).
COMPUTE_KINDS: tuple[str, ...] = ("gemm", "attention", "memory", "other")
#: Every state a GPU's time is in: the compute kinds, communication only, idle.
GPU_STATES: tuple[str, ...] = COMPUTE_KINDS + ("comm", "idle")
#: [C2] Uptime Institute Global Data Center Survey 2023: average annual PUE 1.58.
DEFAULT_PUE = 1.58


class PowerError(DessimError):
    """A power figure is invalid or missing for a device."""


def power_kind(kernel: str) -> str:
    """The compute kind (:data:`COMPUTE_KINDS`) of a kernel kind the engine reports: ``matmul``
    and ``matmul.<precision>`` → gemm; ``attention.unfused.*`` (its GEMMs and softmax over
    the whole score matrix) → memory; other ``attention*`` → attention; ``delay``,
    ``compute`` (no kind) and ``layer`` → other; every other kind (the device model's
    memory-bound kernels) → memory."""
    if kernel == "matmul" or kernel.startswith("matmul."):
        return "gemm"
    if kernel.startswith("attention.unfused"):
        return "memory"
    if kernel.startswith("attention"):
        return "attention"
    if kernel in ("delay", "compute", "layer", ""):
        return "other"
    return "memory"


def _watts(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise PowerError(f"power {name}: must be a number of watts >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GPUPower:
    """Watts of one GPU model in each state of :data:`GPU_STATES`, each with its source."""

    watts: Mapping[str, float]
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        missing = [s for s in GPU_STATES if s not in self.watts or s not in self.sources]
        extra = sorted(set(self.watts) - set(GPU_STATES))
        if missing or extra:
            raise PowerError(f"GPU power: states {', '.join(GPU_STATES)} needed"
                             + (f"; missing {missing[0]!r}" if missing else f"; unknown {extra[0]!r}"))
        object.__setattr__(self, "watts", MappingProxyType({s: _watts(s, self.watts[s]) for s in GPU_STATES}))
        object.__setattr__(self, "sources", MappingProxyType({s: self.sources[s] for s in GPU_STATES}))

    def overridden(self, watts: Mapping[str, float]) -> "GPUPower":
        """These figures with the user's ``watts`` for the states it names (source ``user``)."""
        return GPUPower({**self.watts, **watts}, {**self.sources, **{s: "user" for s in watts}})


_FUSED = "[D] as gemm: fused attention is tensor-core bound, part of the compute-heavy phase; no per-kernel measurement found"
_MEMORY = "[U] the board limit, an upper bound: no public per-kernel power of memory-bound kernels on this GPU found"
_OTHER = "[D] the board limit: compute of unknown kind (delays, duration-only tasks)"
_COMM = "[D] = idle: communication-heavy phases draw close to idle power (Choukse et al. 2025)"
_TDP_AT = "; LLM training's compute-heavy phases run at the TDP (Patel et al. 2024; Choukse et al. 2025)"


def _gpu(tdp: float, tdp_source: str, idle: float, idle_source: str) -> GPUPower:
    """A GPU model's figures: compute kinds at the board limit ``tdp``, comm = idle."""
    comm = _COMM if "[U]" not in idle_source else "[U] = idle, itself unconfirmed"
    return GPUPower({"gemm": tdp, "attention": tdp, "memory": tdp, "other": tdp, "comm": idle, "idle": idle},
                    {"gemm": tdp_source + _TDP_AT, "attention": _FUSED, "memory": _MEMORY, "other": _OTHER,
                     "comm": comm, "idle": idle_source})


_IDLE_U = "[U] 15 % of the board limit: no public idle reading of this GPU found; override"
_SMI_H100 = "github.com/wilicc/gpu-burn issue #114"
_SMI_V100 = "github.com/zai-org/GLM-130B issue #32"
_SMI_MI300X = "github.com/ROCm/legacy-rocm-build issue #5231"

#: Per GPU model (catalog names). Sources' short names are in docs/references.md.
GPU_POWER: Mapping[str, GPUPower] = MappingProxyType({
    "V100": _gpu(300.0, f"[C2] 300 W: nvidia-smi power cap of Tesla V100-SXM2 ({_SMI_V100})",
                 53.0, f"[C2] 53 W: the same nvidia-smi, a V100-SXM2 at 0 % utilisation in P0 holding 20 GB"),
    "A100-40GB": _gpu(400.0, "[C2] glennklockwood A100 (400 W maximum)",
                      53.0, "[C2] 52.5–54.3 W: nvidia-smi of four A100-SXM4-40GB at 0 % utilisation "
                            "(huggingface.co/spaces/seawolf2357/PLUS_Lab_GPUs, gpus.csv)"),
    "A100-80GB": _gpu(400.0, "[C2] glennklockwood A100 (400 W maximum, as the 40 GB part)",
                      53.0, "[D] as A100-40GB (52.5–54.3 W at 0 %, PLUS_Lab_GPUs gpus.csv)"),
    "H100": _gpu(700.0, f"[C2] H100 power (H100 SXM up to 700 W TDP; nvidia-smi cap 700 W in {_SMI_H100})",
                 142.5, f"[C2] 140–145 W: nvidia-smi of H100 80GB HBM3 at 0–4 % utilisation in P0 holding "
                        f"72.8 GB ({_SMI_H100}): a GPU held by a job, waiting"),
    "H200": _gpu(700.0, "[U] H200 SXM 700 W: the datasheet TDP, not re-read for dessim", 105.0, _IDLE_U),
    "B200": _gpu(1000.0, "[C2] glennklockwood B200 (HGX B200: 1,000 W)",
                 137.0, "[C2] 137 W: an air-cooled B200 at idle, reported in "
                        "github.com/ROCm/legacy-rocm-build issue #5219"),
    "MI300X": _gpu(750.0, f"[C2] 750 W: rocm-smi PwrCap of an MI300X ({_SMI_MI300X})",
                   191.0, f"[C2] 191 W: the same rocm-smi, an MI300X at 0 % GPU use holding 95 % of its memory"),
})


@dataclass(frozen=True)
class HostPower:
    """Watts of one host (everything but its GPUs), with its source."""

    watts: float
    source: str


def _dgx(system_w: float, tdp: float, system_source: str) -> HostPower:
    return HostPower(system_w - 8 * tdp, f"[D] {system_source} maximum {system_w / 1e3:g} kW minus 8 GPUs "
                                         f"at {tdp:g} W: CPUs, DRAM, NVSwitches, NICs, fans, power supplies")


_DGX_H = "DGX H100/H200 user guide (via unanswered.io, supercluster.blog):"
_DGX_A = "DGX A100 documentation (via pcnews.ru):"
#: Per host of 8 GPUs of each model (catalog names); ``host_w`` when not given.
HOST_POWER: Mapping[str, HostPower] = MappingProxyType({
    "H100": _dgx(10200.0, 700.0, _DGX_H),
    "H200": HostPower(10200.0 - 8 * 700.0, f"[D] {_DGX_H} maximum 10.2 kW minus 8 GPUs at 700 W "
                                           "([U] H200 TDP)"),
    "A100-40GB": _dgx(6500.0, 400.0, _DGX_A),
    "A100-80GB": _dgx(6500.0, 400.0, _DGX_A),
    "B200": _dgx(14300.0, 1000.0, "DGX B200 user guide (docs.nvidia.com/dgx/dgxb200-user-guide):"),
})


@dataclass(frozen=True)
class PowerModel:
    """Power figures that are not per GPU model (watts) and the PUE.

    ``host_w`` None: :data:`HOST_POWER` of the cluster's GPU model. ``switch_w`` None: not
    given — an error for a topology with fabric switches. ``gpu``: the user's watts for some
    of :data:`GPU_STATES`, over each rank's :data:`GPU_POWER` entry."""

    host_w: float | None = None
    nic_w: float = 0.0          #: [D] per scale-out NIC outside the host figure (a DGX's are inside)
    switch_w: float | None = None
    pue: float = DEFAULT_PUE
    gpu: Mapping[str, float] = field(default_factory=dict)
    _tables: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for f in ("host_w", "nic_w", "switch_w"):
            if getattr(self, f) is not None:
                _watts(f, getattr(self, f))
        if isinstance(self.pue, bool) or not isinstance(self.pue, (int, float)) or not (
                self.pue >= 1 and math.isfinite(self.pue)):
            raise PowerError(f"pue: must be a number >= 1 (facility / IT energy), got {self.pue!r}")
        unknown = sorted(set(self.gpu) - set(GPU_STATES))
        if unknown:
            raise PowerError(f"gpu power: unknown state {unknown[0]!r}; valid: {', '.join(GPU_STATES)}")
        object.__setattr__(self, "gpu", MappingProxyType({s: _watts(f"gpu {s}", w) for s, w in self.gpu.items()}))

    def gpu_power(self, device: str) -> GPUPower:
        """The GPU figures for ``device`` (a catalog name or alias), the user's over the table."""
        got = self._tables.get(device)
        if got is None:
            if set(self.gpu) == set(GPU_STATES):
                got = GPUPower(self.gpu, {s: "user" for s in GPU_STATES})
            else:
                name = get_device(device).name
                if name not in GPU_POWER:
                    raise PowerError(f"no power figures for GPU {name!r}; give them all "
                                     f"(--gpu-power {','.join(f'{s}=W' for s in GPU_STATES)})")
                got = GPU_POWER[name].overridden(self.gpu)
            self._tables[device] = got
        return got

    def host_watts(self, devices: Mapping[int, str]) -> float:
        """Watts per host: ``host_w``, else the mean :data:`HOST_POWER` of the GPUs' models."""
        if self.host_w is not None:
            return self.host_w
        names = [get_device(d).name for d in devices.values()]
        missing = sorted({n for n in names if n not in HOST_POWER})
        if missing:
            raise PowerError(f"no host power figure for {missing[0]} hosts (dessim has DGX figures for "
                             f"{', '.join(HOST_POWER)}): give the watts per host besides its GPUs "
                             "(--host-power W; train.host_power)")
        return sum(HOST_POWER[n].watts for n in names) / len(names) if names else 0.0

    def check(self, counts: ComponentCounts) -> None:
        """Raise :class:`PowerError` when the topology needs a figure that was not given."""
        if counts.switch and self.switch_w is None:
            raise PowerError(f"the topology has {counts.switch} fabric switches and dessim has no public "
                             "figure for a switch's power: give the watts per switch (--switch-power W; "
                             "train.switch_power), or 0 to leave them out")

    def fixed_w(self, counts: ComponentCounts, devices: Mapping[int, str]) -> float:
        """IT watts of hosts, NICs and switches (drawn all the time)."""
        self.check(counts)
        return (counts.host * self.host_watts(devices) + counts.nic * self.nic_w
                + counts.switch * (self.switch_w or 0.0))


@dataclass(frozen=True)
class IterationEnergy:
    """Facility energy of one iteration by part (joules, PUE applied), the GPU-seconds in each
    state summed over GPUs, and the cluster's idle power."""

    gpu_j: Mapping[str, float]          #: by :data:`GPU_STATES`
    gpu_s: Mapping[str, float]          #: GPU-seconds by state (all GPUs)
    host_j: float
    nic_j: float
    switch_j: float
    pue: float
    iteration_s: float
    idle_cluster_w: float   #: facility watts of the cluster with every GPU idle

    @property
    def gpu_busy_j(self) -> float:
        """GPU joules of every compute kind."""
        return sum(self.gpu_j[k] for k in COMPUTE_KINDS)

    @property
    def it_j(self) -> float:
        return self.total_j / self.pue

    @property
    def total_j(self) -> float:
        return sum(self.gpu_j.values()) + self.host_j + self.nic_j + self.switch_j

    @property
    def mean_w(self) -> float:
        """Mean facility watts over the iteration."""
        return self.total_j / self.iteration_s if self.iteration_s > 0 else 0.0

    def breakdown(self) -> dict[str, float]:
        """Joules by part (GPU compute of every kind as ``gpu_busy``); they add up to the total."""
        return {"gpu_busy": self.gpu_busy_j, "gpu_comm": self.gpu_j["comm"], "gpu_idle": self.gpu_j["idle"],
                "host": self.host_j, "nic": self.nic_j, "switch": self.switch_j}

    def busy_by_kind(self) -> dict[str, float]:
        """GPU compute joules by kind (:data:`COMPUTE_KINDS`); they add up to ``gpu_busy``."""
        return {k: self.gpu_j[k] for k in COMPUTE_KINDS}


def _state_seconds(r: RankTimes, t: float, comm_in_compute: float = 0.0) -> dict[str, float]:
    """Seconds of one rank in each GPU state over a makespan ``t``; ``comm_in_compute``:
    seconds of exposed communication the engine counted in the rank's ``compute_s``."""
    out = dict.fromkeys(GPU_STATES, 0.0)
    moved = min(max(comm_in_compute, 0.0), r.compute_s)
    c = min(r.compute_s - moved, t)
    if c > 0:
        by = r.compute_by_kernel
        total = sum(by.values())
        if total > 0:
            for kernel, s in by.items():
                out[power_kind(kernel)] += s * c / total
        else:
            out["other"] = c
    e = min(r.exposed_comm_s + moved, t - c)
    out["comm"] = e
    out["idle"] = max(0.0, t - c - e)
    return out


def iteration_energy(sim: SimulationResult, devices: Mapping[int, str], counts: ComponentCounts,
                     power: PowerModel, comm_in_compute: Mapping[int, float] | None = None,
                     ) -> IterationEnergy:
    """Facility joules of one simulated iteration (module docstring). ``devices``: each
    rank's GPU model; ranks the simulation did not report (folded replicas) are counted as
    the mean of the simulated ones. ``comm_in_compute``: per rank, seconds of exposed
    communication the engine ran as compute (closed-form TP,
    :func:`~dessim.workload.common.figures.closed_form_tp_by_rank`), charged as ``comm``."""
    power.check(counts)
    t = sim.makespan_s
    joules = dict.fromkeys(GPU_STATES, 0.0)
    seconds = dict.fromkeys(GPU_STATES, 0.0)
    n = len(devices)
    if sim.ranks:
        scale = n / len(sim.ranks)
        fallback = next(iter(devices.values()))
        for r in sim.ranks:
            w = power.gpu_power(devices.get(r.rank) or fallback).watts
            moved = comm_in_compute.get(r.rank, 0.0) if comm_in_compute else 0.0
            for state, s in _state_seconds(r, t, moved).items():
                seconds[state] += scale * s
                joules[state] += scale * s * w[state]
    pue = power.pue
    gpu_idle_w = sum(power.gpu_power(d).watts["idle"] for d in devices.values())
    host_w = counts.host * power.host_watts(devices)
    return IterationEnergy(MappingProxyType({s: j * pue for s, j in joules.items()}), MappingProxyType(seconds),
                           host_w * t * pue, counts.nic * power.nic_w * t * pue,
                           counts.switch * (power.switch_w or 0.0) * t * pue, pue, t,
                           (gpu_idle_w + power.fixed_w(counts, devices)) * pue)
