"""Options of a whole training run (:class:`TrainOptions`) and their one spelling in YAML,
sweep ``train.KEY`` axes and the command line (:data:`TRAIN_KEYS`, :func:`parse_train_options`).

Units: seconds, bytes, bytes/second, watts, US dollars; human units are parsed here at the
edge (``15T`` tokens, ``10min``, ``2TB/s``, ``79000h``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from dessim.errors import DessimError, SpecError
from dessim.training_run.cost import CostModel
from dessim.training_run.failures import COMPONENT_KINDS, DEFAULT_FAILURE_RATES, FailureRate
from dessim.training_run.power import COMPUTE_KINDS, GPU_STATES, PowerModel
from dessim.workload.common.document import check_section
from dessim.units import parse_bandwidth, parse_count, parse_size, parse_time

__all__ = ["TrainOptions", "INTERVAL_RULES", "TRAIN_KEYS", "parse_train_options", "GPU_POWER_KEYS"]

#: Named checkpoint-interval rules (:mod:`dessim.training_run.reliability`).
INTERVAL_RULES: tuple[str, ...] = ("young", "daly", "optimal")


@dataclass(frozen=True)
class TrainOptions:
    """How long to train and how the run fails, checkpoints, draws power and costs.

    * ``tokens`` to train on, or ``steps`` (iterations); exactly one.
    * ``checkpoint_interval``: useful seconds between checkpoints, or a rule of
      :data:`INTERVAL_RULES` (default ``daly``).
    * ``checkpoint_bytes``: override the size from the memory model; ``storage_bw``: bytes/s
      of the file system attached when the topology has none (None: the Llama 3 cluster's
      2 TB/s scaled by GPUs / 16,384).
    * ``restart_s`` (relaunch after a failure: detect, replace the node, reschedule, start
      processes, initialise NCCL) and ``rewarm_s`` (from restored state to full-speed
      iterations): seconds added to the simulated restore on every restart. No public
      measurement of either for a checkpoint-restart job was found, so they have no default:
      a run that can fail needs both (:meth:`check_restart`).
    * ``failure_rates``: per component kind (:mod:`dessim.training_run.failures`).
    * ``power`` (:class:`PowerModel`), ``cost`` (:class:`CostModel`).
    * ``samples`` Monte Carlo runs (0: closed form only) drawn from ``mc_seed``; ``health_states``:
      straggler draws simulated (needs the engine's ``noise.straggler_sigma``; 0: the one
      healthy iteration); ``attribute``: slowest ranks re-simulated healthy.
    """

    tokens: float | None = None
    steps: int | None = None
    checkpoint_interval: float | str = "daly"
    checkpoint_bytes: float | None = None
    storage_bw: float | None = None
    restart_s: float | None = None
    rewarm_s: float | None = None
    failure_rates: Mapping[str, FailureRate] = field(default_factory=lambda: DEFAULT_FAILURE_RATES)
    power: PowerModel = field(default_factory=PowerModel)
    cost: CostModel = field(default_factory=CostModel)
    samples: int = 1000
    mc_seed: int = 0
    health_states: int = 0
    attribute: int = 3

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise SpecError("give exactly one of tokens (e.g. 15T) and steps")
        if self.tokens is not None and not (self.tokens > 0 and math.isfinite(self.tokens)):
            raise SpecError(f"tokens: must be > 0, got {self.tokens!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 1):
            raise SpecError(f"steps: must be a whole number >= 1, got {self.steps!r}")
        ci = self.checkpoint_interval
        if isinstance(ci, str):
            if ci not in INTERVAL_RULES:
                raise SpecError(f"checkpoint_interval: {ci!r} is neither a time nor one of "
                                f"{', '.join(INTERVAL_RULES)}")
        elif isinstance(ci, bool) or not isinstance(ci, (int, float)) or not (ci > 0 and math.isfinite(ci)):
            raise SpecError(f"checkpoint_interval: must be > 0 seconds, got {ci!r}")
        for name in ("restart_s", "rewarm_s"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
                raise SpecError(f"{name}: must be >= 0 seconds, got {v!r}")
        missing = [k for k in COMPONENT_KINDS if k not in self.failure_rates]
        if missing:
            raise SpecError(f"failure_rates: missing component kind {missing[0]!r}")
        for name in ("samples", "health_states", "attribute", "mc_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"{name}: must be a whole number >= 0, got {v!r}")


    def check_restart(self) -> None:
        """Raise a :class:`~dessim.errors.SpecError` unless both restart times are given
        (called when the run can fail)."""
        missing = [k for k, f in (("restart", "restart_s"), ("rewarm", "rewarm_s")) if getattr(self, f) is None]
        if missing:
            raise SpecError("the run can fail, and dessim has no public figure for the time a restart "
                            f"takes: give {' and '.join(missing)} (--restart TIME, --rewarm TIME; "
                            "train.restart, train.rewarm; e.g. 5min and 1min), or make every component "
                            "never fail (--mtbf KIND=never)")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{what}: expected a number, got {value!r}")
    return float(value)


def _interval(value: Any, what: str) -> float | str:
    if isinstance(value, str) and value.strip().lower() in INTERVAL_RULES:
        return value.strip().lower()
    try:
        return parse_time(value, what, allow_zero=False)
    except DessimError:
        raise SpecError(f"{what}: {value!r} is neither a time (30min) nor one of "
                        f"{', '.join(INTERVAL_RULES)}") from None


def _mtbf(value: Any, what: str) -> dict[str, FailureRate]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{what}: expected a mapping component: MTBF (e.g. {{gpu: 79000h}}), got {value!r}")
    out = {}
    for kind, t in value.items():
        if kind not in COMPONENT_KINDS:
            raise SpecError(f"{what}: component kind {kind!r} is unknown; valid: {', '.join(COMPONENT_KINDS)}")
        if isinstance(t, str) and t.strip().lower() in ("inf", "never"):
            out[kind] = FailureRate(kind, 0.0, "user: never fails")
            continue
        seconds = parse_time(t, f"{what}.{kind}", allow_zero=False)
        out[kind] = FailureRate(kind, 1.0 / seconds, f"user: MTBF {t}")
    return out


#: Keys of ``gpu_power``: every GPU state, and ``busy`` for all compute kinds at once.
GPU_POWER_KEYS: tuple[str, ...] = ("busy",) + GPU_STATES


def _gpu_power(value: Any, where: str) -> dict[str, float]:
    """Watts by GPU state (:data:`~dessim.training_run.power.GPU_STATES`; ``busy`` sets every
    compute kind) over the device's defaults."""
    if not isinstance(value, Mapping) or not value or not set(value) <= set(GPU_POWER_KEYS):
        raise SpecError(f"{where}: expected a mapping of watts with keys among {', '.join(GPU_POWER_KEYS)} "
                        f"(busy: every compute kind), got {value!r}")
    w = {k: _number(value[k], f"{where}.{k}") for k in value}
    busy = w.pop("busy", None)
    out = dict.fromkeys(COMPUTE_KINDS, busy) if busy is not None else {}
    out.update(w)
    return out


#: Every key of a ``train:`` mapping: (converter, where it goes). ``mtbf`` maps component
#: kinds to a per-component MTBF; power in watts; cost in USD.
TRAIN_KEYS: Mapping[str, Any] = MappingProxyType({
    "tokens": lambda v, w: float(parse_count(v, w, minimum=1)),
    "steps": lambda v, w: parse_count(v, w, minimum=1),
    "checkpoint_interval": _interval,
    "checkpoint_bytes": lambda v, w: float(parse_size(v, w)),
    "storage_bw": lambda v, w: parse_bandwidth(v, w),
    "restart": lambda v, w: parse_time(v, w),
    "rewarm": lambda v, w: parse_time(v, w),
    "mtbf": _mtbf,
    "gpu_power": _gpu_power,    # watts by GPU state (GPU_POWER_KEYS)
    "host_power": _number, "nic_power": _number, "switch_power": _number, "pue": _number,
    "usd_per_kwh": _number, "usd_per_gpu_hour": _number, "capex_per_gpu": _number,
    "amortisation": lambda v, w: parse_time(v, w, allow_zero=False),
    "samples": lambda v, w: parse_count(v, w),
    "mc_seed": lambda v, w: parse_count(v, w),
    "health_states": lambda v, w: parse_count(v, w),
    "attribute": lambda v, w: parse_count(v, w),
})

_SIMPLE = {"tokens": "tokens", "steps": "steps", "checkpoint_interval": "checkpoint_interval",
           "checkpoint_bytes": "checkpoint_bytes", "storage_bw": "storage_bw", "restart": "restart_s",
           "rewarm": "rewarm_s", "samples": "samples", "mc_seed": "mc_seed", "health_states": "health_states",
           "attribute": "attribute"}
_POWER = {"host_power": "host_w", "nic_power": "nic_w", "switch_power": "switch_w", "pue": "pue"}
_COST = {"usd_per_kwh": "usd_per_kwh", "usd_per_gpu_hour": "usd_per_gpu_hour",
         "capex_per_gpu": "capex_per_gpu", "amortisation": "amortisation_s"}


def parse_train_options(data: Mapping[str, Any], where: str = "train") -> TrainOptions:
    """:class:`TrainOptions` from a mapping of :data:`TRAIN_KEYS` (YAML, sweep, CLI); any bad
    key or value raises a :class:`~dessim.errors.SpecError` naming ``where`` and the key."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(TRAIN_KEYS)}, got {data!r}")
    values = check_section(dict(data), TRAIN_KEYS, where)
    try:
        rates = dict(DEFAULT_FAILURE_RATES)
        rates.update(values.get("mtbf", {}))
        power = PowerModel(**{f: values[k] for k, f in _POWER.items() if k in values},
                           gpu=values.get("gpu_power", {}))
        cost = CostModel(**{f: values[k] for k, f in _COST.items() if k in values})
        opts = TrainOptions(**{f: values[k] for k, f in _SIMPLE.items() if k in values},
                            failure_rates=MappingProxyType(rates), power=power, cost=cost)
    except DessimError as exc:
        raise SpecError(f"{where}: {exc}") from None
    return opts

