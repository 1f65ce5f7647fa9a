"""How to run a task graph: :class:`EngineOptions`, composed of typed, validated parts.

One run configuration, one spelling everywhere — the Python objects, sweep axes
(``engine.collectives.algo``), cluster files (``engine: {collectives: {algo: ring}}``) and the
command line's option group (:func:`dessim.cli.common.engine_options`) all name a setting
by its dotted path in this tree::

    EngineOptions
    ├── network            name of a model in dessim.network.NETWORK_MODELS ("flow", "analytical")
    ├── collectives        CollectiveSettings: algo, protocol, channels, chunks, reduction_bw,
    │                      gpus_per_process
    ├── noise              Noise: slowdown, straggler_sigma, seed
    ├── shortcuts          Shortcuts: compact_schedules, bundles, shape_memo, collective_memo,
    │                      merged_images, lane_families, lane_orbits, channel_quotient,
    │                      link_memo, stream_rings
    ├── calibration        the user's Calibration (a file name is read at construction) or None
    ├── record_links, device, precision

Every part validates itself at construction, so a bad value fails before any work starts.
The former flat spellings (``EngineOptions(algo=...)``, ``engine.algo`` in specs) are errors
that name the new path (:data:`MOVED`).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from dessim.catalog.calibration import Calibration, load_calibration, read_calibration
from dessim.catalog.devices import PRECISIONS, get_device
from dessim.collectives import CollectiveSettings
from dessim.errors import DessimError, NetworkError, SpecError

__all__ = ["EngineOptions", "Noise", "Shortcuts", "MOVED", "OptionsError", "check_engine_path",
           "check_engine_section", "engine_paths"]


class OptionsError(SpecError):
    """An engine option has a bad value or a former spelling (raised at construction)."""


@dataclass(frozen=True)
class Noise:
    """Per-rank compute slowdown (stragglers); dimensionless factors.

    * ``slowdown``: rank → factor (> 0, finite; 1.2 = 20 % slower), applied to that rank's
      compute tasks. Ranks may be written as strings (``{"3": 1.2}``, as JSON spells them).
    * ``straggler_sigma``: every rank is additionally slowed by ``1 + |N(0, sigma)|``, drawn
      with ``seed`` (0: off).
    * ``kernel_jitter_sigma``: every compute task's time is multiplied by an independent
      ``exp(sigma·Z − sigma²/2)``, ``Z ~ N(0, 1)`` (log-normal, mean 1: jitter does not move
      the mean time of a task), drawn from ``seed`` in the order tasks start (0: off). A
      "kernel" is the graph's compute task: a kernel at kernel granularity, a layer or stage
      pass at coarser ones.
    * ``seed``: the random generator's seed (an int).

    Whether a slowed rank exists is checked when the graph runs (the rank count is the
    topology's); everything else here.
    """

    slowdown: Mapping[int, float] = field(default_factory=dict)
    straggler_sigma: float = 0.0
    seed: int = 0
    kernel_jitter_sigma: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.slowdown, Mapping):
            raise OptionsError(f"noise.slowdown must be a mapping rank: factor (e.g. {{3: 1.2}}), "
                               f"got {self.slowdown!r}")
        clean: dict[int, float] = {}
        for rank, factor in self.slowdown.items():
            key = int(rank) if isinstance(rank, str) and rank.strip().isdigit() else rank
            if not isinstance(key, Integral) or isinstance(key, bool) or key < 0:
                raise OptionsError(f"noise.slowdown: rank {rank!r} is not a rank number >= 0")
            if isinstance(factor, bool) or not isinstance(factor, Real) \
                    or not (factor > 0 and math.isfinite(factor)):
                raise OptionsError(f"noise.slowdown of rank {key} must be a number > 0, got {factor!r}")
            clean[int(key)] = factor
        object.__setattr__(self, "slowdown", clean)
        for name in ("straggler_sigma", "kernel_jitter_sigma"):
            sigma = getattr(self, name)
            if isinstance(sigma, bool) or not isinstance(sigma, Real) \
                    or not (sigma >= 0 and math.isfinite(sigma)):
                raise OptionsError(f"noise.{name} must be a number >= 0, got {sigma!r}")
        if not isinstance(self.seed, Integral) or isinstance(self.seed, bool):
            raise OptionsError(f"noise.seed must be a whole number, got {self.seed!r}")

    @property
    def active(self) -> bool:
        """True when some rank or task may compute slower than the others."""
        return bool(self.slowdown) or self.straggler_sigma > 0 or self.kernel_jitter_sigma > 0


@dataclass(frozen=True)
class Shortcuts:
    """Speed shortcuts of the engine (docs/performance.md); booleans.

    The first nine are exact — switching them off changes no result, only the wall time:

    * ``compact_schedules``: ring/direct collectives stored as uniform steps;
    * ``bundles``: transfers that provably share one rate run as one network bundle;
    * ``shape_memo``: ``auto`` decisions and closed-form TP times once per group shape;
    * ``collective_memo``: a collective that provably has the network to itself is simulated
      once per (op, size, group, algorithm) and replayed;
    * ``merged_images``: in a folded graph, the images of one collective (same shape,
      disjoint groups, ECMP-independent routes) run as ONE schedule instead of one run each
      (:func:`~dessim.collectives.executor.merge_instances`);
    * ``lane_families``: in a folded graph, a transfer or collective runs on ONE lane, each
      flow standing for its images in the other lanes on the union of their routes
      (:mod:`dessim.network.families`); a collective whose schedule is invariant under a
      symmetry of its group (the lanes that map the group onto itself, the rotations of a
      ring, of hosts, of ranks inside hosts) keeps one transfer per orbit of it
      (:func:`~dessim.collectives.schedule.orbit_plan`). Exact by certificate: every rate
      solve checks that each image has a max-min bottleneck at the family's rate; the first
      solve that fails makes the engine replay the graph without families, and the result
      says why. Equal to the full replay up to float rounding (sums of rates taken in
      another order).
    * ``lane_orbits`` (with ``lane_families``): the one-transfer-per-orbit reduction above.
      Its symmetries need not be lanes of the fold (a rail all-to-all keeps host and rail
      rotations), so traffic running beside it may break them; a failed certificate in a run
      that used orbits replays it with families but without orbits first — unless its orbits
      rotated GPUs inside hosts (host x rail rotations, which a data-parallel ring
      beside them breaks): then the replay keeps them for the collectives that had ended
      before the failure and gives the others orbits of whole hosts.
    * ``channel_quotient`` (with ``lane_families``): in a run that starts lane-family flows,
      the max-min system has one constraint per block of channels that no route tells
      apart — every route crosses all channels of a block equally often — instead of one
      per channel, and a family flow one coefficient per block (its crossings of each of
      the block's channels): the images of a symmetric family, hundreds of channels, fall
      into a few blocks (:mod:`dessim.network.quotient`). The same constraints without
      copies: the same max-min rates up to the order of float additions.
    * ``link_memo`` (with ``collective_memo``): a collective that is not alone on the network
      but provably alone on its own channels while it runs — no task whose flows can use one
      of them runs, or can start before it ends (:mod:`dessim.engine.links`) — is memoised
      and replayed the same way (max-min rates are set per connected component of flows).
      A collective of several member tasks (unfolded ranks; DualPipe's two stages of one
      data-parallel group) is memoised when all its members arrived at its start, and
      replayed — each member ending as it did — when all arrive in one instant again.

    ``stream_rings`` is an approximation, off by default: ring collectives run as one
    coupled flow per channel instead of step by step (docs/collectives.md).
    """

    compact_schedules: bool = True
    bundles: bool = True
    shape_memo: bool = True
    collective_memo: bool = True
    merged_images: bool = True
    lane_families: bool = True
    lane_orbits: bool = True
    channel_quotient: bool = True
    link_memo: bool = True
    stream_rings: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise OptionsError(f"shortcuts.{f.name} must be true or false, got {value!r}")

    @classmethod
    def none(cls) -> "Shortcuts":
        """Every shortcut off: the full replay (``--exact``)."""
        return cls(compact_schedules=False, bundles=False, shape_memo=False,
                   collective_memo=False, merged_images=False, lane_families=False,
                   lane_orbits=False, channel_quotient=False, link_memo=False,
                   stream_rings=False)


def _network_model(model: object) -> type:
    """The network model class of ``model`` (a registered name or a Network subclass)."""
    from dessim.network import network_model

    return network_model(model)  # type: ignore[arg-type]


#: Composite fields of EngineOptions: the part's class and how it is built from a mapping.
_PARTS: dict[str, type] = {"collectives": CollectiveSettings, "noise": Noise, "shortcuts": Shortcuts}

#: Former flat spellings → their path now (``EngineOptions(algo=)`` → ``collectives.algo``).
MOVED: dict[str, str] = {
    **{name: f"collectives.{name}" for name in ("algo", "protocol", "chunks", "channels",
                                                  "reduction_bw")},
    **{name: f"noise.{name}" for name in ("slowdown", "straggler_sigma", "seed")},
    **{name: f"shortcuts.{name}" for name in ("compact_schedules", "bundles", "shape_memo",
                                                "collective_memo", "merged_images",
                                                "stream_rings")},
}


def _part(cls: type, value: Any, where: str) -> Any:
    """``value`` as part ``cls``: itself, or built from a mapping of its field names."""
    if isinstance(value, cls):
        return value
    names = [f.name for f in fields(cls)]
    if not isinstance(value, Mapping):
        raise OptionsError(f"{where}: expected a {cls.__name__} or a mapping with keys "
                           f"{', '.join(names)}, got {value!r}")
    bad = [k for k in value if k not in names]
    if bad:
        raise OptionsError(f"{where}: unknown key {bad[0]!r}; valid keys: {', '.join(names)}")
    try:
        return cls(**dict(value))
    except DessimError as exc:   # name the part unless the message does (CollectiveError stays one)
        if str(exc).startswith(where):
            raise
        raise type(exc)(f"{where}: {exc}") from None


@dataclass(frozen=True)
class EngineOptions:
    """How to run a task graph (validated at construction; seconds, bytes/second).

    * ``network``: the network model, a name in :data:`dessim.network.NETWORK_MODELS`
      (``"flow"``: max-min fair sharing; ``"analytical"``: latency + bytes/bandwidth) or a
      :class:`~dessim.network.Network` subclass itself (a strategy object, as networkx takes
      ``flow_func``); :attr:`network_name` is the name every output reports.
    * ``collectives``: :class:`~dessim.collectives.CollectiveSettings` of every collective;
      ``algo="auto"`` keeps each task's own algorithm, a name forces it for every collective.
    * ``noise``: :class:`Noise`, per-rank compute slowdown.
    * ``shortcuts``: :class:`Shortcuts`, the engine's speed shortcuts (``Shortcuts.none()``:
      the full replay).
    * ``calibration``: measured model constants — the user's file (a path is read here) or
      None for the built-in calibration (:mod:`dessim.catalog.calibration`); its links apply
      to the topology.
    * ``record_links``: keep link-utilisation change points (timelines).
    * ``device``: GPU model for ranks whose topology node names none; ``precision``: of
      FLOP-costed compute tasks.

    The parts may be given as mappings of their field names (``collectives={"algo": "ring"}``);
    :meth:`of` builds options from a nested mapping (sweep and cluster ``engine:`` sections).
    """

    network: "str | type" = "flow"
    collectives: CollectiveSettings = field(default_factory=CollectiveSettings)
    noise: Noise = field(default_factory=Noise)
    shortcuts: Shortcuts = field(default_factory=Shortcuts)
    calibration: Calibration | str | None = None
    record_links: bool = True
    device: str | None = None
    precision: str = "bf16"

    def __post_init__(self) -> None:
        try:
            _network_model(self.network)
        except NetworkError as exc:
            raise NetworkError(f"network: {exc}") from None
        for name, cls in _PARTS.items():
            object.__setattr__(self, name, _part(cls, getattr(self, name), name))
        if not isinstance(self.record_links, bool):
            raise OptionsError(f"record_links must be true or false, got {self.record_links!r}")
        if self.device is not None and not isinstance(self.device, str):
            raise OptionsError(f"device must be a GPU model name, got {self.device!r}")
        if self.device is not None:
            get_device(self.device, "device")      # an unknown name fails now, even if unused
        if self.precision not in PRECISIONS:
            raise OptionsError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.calibration is not None:  # a file name (sweep and cluster specs): read it now
            object.__setattr__(self, "calibration", read_calibration(self.calibration))

    @property
    def forced_algo(self) -> str | None:
        """The algorithm forced on every collective, or None (each task keeps its own)."""
        algo = self.collectives.algo
        return None if algo == "auto" else algo

    @property
    def network_name(self) -> str:
        """The name of the network model (its class's ``name`` for a strategy object)."""
        return _network_model(self.network).name

    def run_collective_kwargs(self) -> dict[str, Any]:
        """These options as keyword arguments of :func:`dessim.collectives.run_collective`
        (one collective on an idle network: the noise and device do not apply)."""
        s, cut = self.collectives, self.shortcuts
        settings = {f.name: getattr(s, f.name) for f in fields(s)}   # run_collective's names
        return {**settings, "network": self.network, "calibration": self.calibration,
                "bundles": cut.bundles, "compact_schedules": cut.compact_schedules,
                "stream_rings": cut.stream_rings}

    @property
    def model_calibration(self) -> Calibration:
        """The calibration to run with: the built-in one, overridden by ``calibration``."""
        return load_calibration(self.calibration)

    @classmethod
    def of(cls, value: "EngineOptions | Mapping[str, Any] | None", where: str = "",
           **defaults: Any) -> "EngineOptions":
        """Options from a nested mapping as sweep and cluster files write them
        (``{"network": "flow", "collectives": {"algo": "ring"}}``), over ``defaults``.
        ``where``: the place of the section, for messages (a file name). A former flat key
        is an error naming its new path; ``None`` gives the defaults."""
        if isinstance(value, cls):
            return value
        loc = f"{where}: " if where else ""
        data = dict(defaults)
        if value is not None:
            if not isinstance(value, Mapping):
                raise OptionsError(f"{loc}engine: expected a mapping of engine options, got {value!r}")
            for key in value:
                _check_key(str(key), loc)
            data.update(value)
        try:
            return cls(**data)
        except DessimError as exc:
            raise type(exc)(f"{loc}engine: {exc}") from None


_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineOptions))


def _moved_message(key: str) -> str:
    return f"engine.{key} is now engine.{MOVED[key]}"


def _check_key(key: str, loc: str) -> None:
    if key in MOVED:
        raise OptionsError(loc + _moved_message(key))
    if key not in _FIELDS:
        raise OptionsError(f"{loc}engine: unknown engine option {key!r}; valid: {', '.join(_FIELDS)}")


def _flat_init_guard(init: Callable[..., None]) -> Callable[..., None]:
    """``EngineOptions(algo="ring")`` names the new spelling instead of a bare TypeError."""
    import functools

    @functools.wraps(init)
    def __init__(self: EngineOptions, *args: Any, **kw: Any) -> None:
        for key in kw:
            if key in MOVED:
                part, _, name = MOVED[key].partition(".")
                raise OptionsError(f"EngineOptions({key}=...) is now "
                                   f"EngineOptions({part}={_PARTS[part].__name__}({name}=...))")
        init(self, *args, **kw)
    return __init__


EngineOptions.__init__ = _flat_init_guard(EngineOptions.__init__)  # type: ignore[method-assign]


def engine_paths(allowed: Sequence[str] | None = None) -> list[str]:
    """Every settable dotted path (``network``, ``collectives.algo``, ...), or those under
    ``allowed`` (top-level names or full paths)."""
    out = []
    for name in _FIELDS:
        if name == "record_links":
            continue
        subs = [f"{name}.{f.name}" for f in fields(_PARTS[name])] if name in _PARTS else [name]
        out += [p for p in subs if allowed is None or p in allowed or name in allowed]
    return out


def check_engine_path(path: str, values: Sequence[Any], where: str,
                      allowed: Sequence[str] | None = None) -> None:
    """Check a sweep axis ``engine.<path>`` and each of its ``values`` now, before any point
    runs: an unknown or former spelling, or a value the option rejects, is an
    :class:`OptionsError` naming ``where``. ``allowed``: the paths this kind of point uses
    (None: all)."""
    head, _, rest = path.partition(".")
    if head in MOVED and not rest:
        raise OptionsError(f"{where}: {_moved_message(head)}")
    valid = engine_paths(allowed)
    whole_part = head in _PARTS and not rest and any(p.startswith(head + ".") for p in valid)
    if path not in valid and not whole_part:
        raise OptionsError(f"{where}: unknown engine option {path!r}; valid: {', '.join(valid)}")
    for i, value in enumerate(values):
        nested: Any = value
        for part in reversed(path.split(".")):
            nested = {part: nested}
        try:
            EngineOptions.of(nested)
        except DessimError as exc:
            raise type(exc)(f"{where}[{i}]: {exc}") from None


def check_engine_section(section: Any, where: str, allowed: Sequence[str] | None = None) -> None:
    """Check an ``engine:`` section as written in a spec (nested mapping) now, key by key, as
    :func:`check_engine_path` checks an axis: ``where`` names the section."""
    if not isinstance(section, Mapping):
        raise OptionsError(f"{where}: expected a mapping of engine options, got {section!r}")
    for key, value in section.items():
        if key in _PARTS and isinstance(value, Mapping):
            for sub, v in value.items():
                check_engine_path(f"{key}.{sub}", [v], where, allowed)
        else:
            check_engine_path(str(key), [value], where, allowed)
