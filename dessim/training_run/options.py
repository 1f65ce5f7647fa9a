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


def _number(value: Any, what: str, minimum: float = 0.0, unit: str = "a number", note: str = "") -> float:
    """``value`` as a finite float >= ``minimum``; the error names ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{what}: expected {unit}, got {value!r}")
    if not (value >= minimum and math.isfinite(value)):
        raise SpecError(f"{what}: must be {unit} >= {minimum:g}{note}, got {value!r}")
    return float(value)


def _watts(value: Any, what: str) -> float:
    return _number(value, what, unit="a number of watts")


def _pue(value: Any, what: str) -> float:
    return _number(value, what, 1.0, note=" (facility / IT energy)")


def _part(what: str, key: str) -> str:
    """How a part ``key`` of the value named ``what`` is named: ``train.mtbf.gpu`` in a file,
    ``--mtbf gpu`` on the command line."""
    return f"{what} {key}" if what.startswith("--") else f"{what}.{key}"


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
        seconds = parse_time(t, _part(what, kind), allow_zero=False)
        out[kind] = FailureRate(kind, 1.0 / seconds, f"user: MTBF {t}")
    return out


#: Keys of ``gpu_power``: every GPU state, and ``busy`` for all compute kinds at once.
GPU_POWER_KEYS: tuple[str, ...] = ("busy",) + GPU_STATES


def _gpu_power(value: Any, where: str) -> dict[str, float]:
    """Watts by GPU state (:data:`~dessim.training_run.power.GPU_STATES`; ``busy`` sets every
    compute kind) over the device's defaults."""
    if not isinstance(value, Mapping) or not value:
        raise SpecError(f"{where}: expected a mapping of watts with keys among {', '.join(GPU_POWER_KEYS)} "
                        f"(busy: every compute kind), got {value!r}")
    unknown = [k for k in value if k not in GPU_POWER_KEYS]
    if unknown:
        raise SpecError(f"{where}: unknown GPU state {unknown[0]!r}; valid: {', '.join(GPU_POWER_KEYS)} "
                        "(busy: every compute kind)")
    w = {k: _watts(value[k], _part(where, k)) for k in value}
    busy = w.pop("busy", None)
    out = dict.fromkeys(COMPUTE_KINDS, busy) if busy is not None else {}
    out.update(w)
    return out


def _storage_bw(value: Any, what: str) -> float:
    """The file system's aggregate bandwidth (bytes/s), at least the smallest link
    bandwidth a topology accepts (:data:`~dessim.topology.builders.MIN_LINK_BANDWIDTH`): the
    storage is attached as a link, whose own error would not name this key."""
    from dessim.topology.builders import MIN_LINK_BANDWIDTH

    bw = parse_bandwidth(value, what)
    if bw < MIN_LINK_BANDWIDTH:
        raise SpecError(f"{what}: {value!r} is {bw:g} B/s, below the {MIN_LINK_BANDWIDTH:g} B/s a "
                        "storage link may have (a file system's aggregate bandwidth, e.g. '2TB/s')")
    return bw


#: Every key of a ``train:`` mapping: (converter, where it goes). ``mtbf`` maps component
#: kinds to a per-component MTBF; power in watts; cost in USD.
TRAIN_KEYS: Mapping[str, Any] = MappingProxyType({
    "tokens": lambda v, w: float(parse_count(v, w, minimum=1)),
    "steps": lambda v, w: parse_count(v, w, minimum=1),
    "checkpoint_interval": _interval,
    "checkpoint_bytes": lambda v, w: float(parse_size(v, w, allow_zero=False)),
    "storage_bw": _storage_bw,
    "restart": lambda v, w: parse_time(v, w),
    "rewarm": lambda v, w: parse_time(v, w),
    "mtbf": _mtbf,
    "gpu_power": _gpu_power,    # watts by GPU state (GPU_POWER_KEYS)
    "host_power": _watts, "nic_power": _watts, "switch_power": _watts, "pue": _pue,
    "usd_per_kwh": _number, "usd_per_gpu_hour": _number, "capex_per_gpu": _number,   # USD >= 0
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


def parse_train_options(data: Mapping[str, Any], where: str = "train",
                        names: Mapping[str, str] | None = None) -> TrainOptions:
    """:class:`TrainOptions` from a mapping of :data:`TRAIN_KEYS` (YAML, sweep, CLI); any bad
    key or value raises a :class:`~dessim.errors.SpecError` naming the key as ``where.KEY``,
    or as ``names[KEY]`` where given (``dessim train`` passes its flags: ``--tokens``)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(TRAIN_KEYS)}, got {data!r}")

    def name(key: str) -> str:
        return (names or {}).get(key) or f"{where}.{key}"

    values = check_section(dict(data), TRAIN_KEYS, where, name)
    # what involves two keys, checked here to name them as given (the classes repeat it)
    if ("tokens" in values) == ("steps" in values):
        raise SpecError(f"give exactly one of {name('tokens')} (e.g. 15T) and {name('steps')}")
    if values.get("capex_per_gpu", 0.0) > 0 and "amortisation" not in values:
        raise SpecError(f"{name('capex_per_gpu')} needs the write-off period: give "
                        f"{name('amortisation')} (a time, e.g. 35040h for 4 years)")
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

