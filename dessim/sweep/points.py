"""Point evaluators: what one sweep point *is* and how it is simulated.

An :class:`Evaluator` is data: the keys its ``base:`` section accepts, the axis namespaces it
understands (each routed to one place of the point's configuration), the paths that must be
set, the function that turns a configuration into metrics, and optionally an expansion of the
points (``parallelism: auto``). :data:`EVALUATORS` is the registry the sweep spec's ``kind``
selects from.

``cluster``
    A shared cluster over time (``base.cluster``: a cluster file with a ``scheduler:``
    section): ``scheduler.policy`` / ``scheduler.resize_overhead`` axes, ``topology.KEY``
    (with ``base.topology``) and ``engine.PATH``; metrics: makespan, utilisation, fairness
    loss, slowdowns, and ``jobs.<name>.{jct_s, slowdown, queue_s, mean_gpus, resizes}``.
    Running sets are memoised per process across points.
``collective``
    One collective (``collective.op``, ``collective.size``, optionally ``collective.ranks`` and
    ``collective.root``) on a topology, run with
    :func:`dessim.collectives.run_collective`; ``engine.network``, ``engine.collectives.*``
    (``algo``, ``protocol``, ``chunks``, ``channels``, ``reduction_bw``, ``gpus_per_process``),
    ``engine.shortcuts.stream_rings`` / ``bundles`` / ``compact_schedules`` and
    ``engine.calibration`` choose how. Metrics:
    ``time_s``, ``algbw_GBps``, ``busbw_GBps`` (nccl-tests definitions, doc/PERFORMANCE.md),
    ``algorithm``, ``transfers``, ``events``, ``link_util_max``, ``gpus``.
``workload``
    A training iteration of ``base.workload`` (file or preset) on a topology with
    ``dessim.workload.simulate_workload``. ``workload.A.B`` axes override key ``B`` of section
    ``A`` of the workload document (``overrides=``); ``memory.K`` axes set key ``K`` of the
    point's memory section (:mod:`dessim.sweep.memory`: HBM capacity, memory expansion,
    offload options); ``engine.PATH`` axes set the :class:`~dessim.engine.EngineOptions`
    setting at that dotted path (``engine.collectives.algo``, ``engine.noise.straggler_sigma``,
    ``engine.shortcuts.bundles``, ``engine.network``; :mod:`dessim.engine.options`).
    ``parallelism: auto`` expands every point into its valid layouts
    (:mod:`dessim.sweep.layouts`). Metrics: the workload result's ``summary()``, nested
    mappings flattened with dots (``exposed_comm_s.dp``, ``memory_per_gpu_bytes.weights``),
    without host time (``wall_s``) and the rank lists of the groups.
``train``
    A whole training run of that workload (:func:`dessim.training_run.simulate_training_run`):
    everything of ``workload`` plus a ``train:`` base section and ``train.KEY`` axes (the keys
    of :data:`dessim.training_run.options.TRAIN_KEYS`: ``tokens``, ``checkpoint_interval``,
    ``mtbf.gpu``, ``pue``, ``usd_per_kwh``, ...). Metrics: the iteration's, then the run's
    summary flattened — ``time_to_train_s`` (the default metric), ``goodput``,
    ``expected_failures``, ``energy_run_mwh``, ``energy_per_token_j``, ``cost_usd``,
    ``monte_carlo.time_to_train_s.p90``, ... (docs/training-run.md).

Every namespace ``topology.K`` sets key ``K`` of the base topology's builder (any key that
``dessim topology list`` shows for that builder); the topology is rebuilt per point, cached
per process.

Workers receive plain data (:func:`make_task`) and run :func:`evaluate_task`, a module-level
function, so the local process pool (spawn), Dask and Ray all run the very same code.
"""

from __future__ import annotations

import copy
import json
import time
import traceback
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pydantic import create_model

from dessim.errors import DessimError, SpecError
from dessim.resources import find_data_file, read_yaml
from dessim.schema import SpecModel, validate
from dessim.sweep.layouts import expand_layouts
from dessim.sweep.memory import (EXPANSION_ONLY_KEYS, MEMORY_KEYS, MemorySetup, check_expansion_fit,
                                 check_memory_values, memory_setup, unused_expansion, with_expansion)

__all__ = ["Namespace", "Evaluator", "EVALUATORS", "get_evaluator", "make_task", "evaluate_task",
           "topology_document", "flatten", "STATUS_OK", "STATUS_FAILED", "STATUS_ERROR"]

STATUS_OK = "ok"            #: evaluated
STATUS_FAILED = "failed"    #: the configuration is invalid (a DessimError): a result, not retried
STATUS_ERROR = "error"      #: a bug (any other exception): recorded, retried on resume


# ---------------------------------------------------------------- topology composition
def _inline_builder(text: str) -> dict[str, Any]:
    """``"dgx-a100:nodes=4,ideal"`` → ``{"kind": "dgx-a100", "nodes": "4", "ideal": True}``
    (the topology layer's :func:`~dessim.topology.spec.inline_to_raw`; values stay raw)."""
    from dessim.topology.spec import inline_to_raw

    kind, raw = inline_to_raw(text)
    return {"kind": kind.name, **raw}


def topology_document(spec: object, where: str) -> dict[str, Any]:
    """The YAML-schema mapping of any topology spec form that has a builder, for composing
    axis values into it: inline string → ``{"builder": {...}}``; a YAML file or shipped name →
    its document; a mapping with ``kind`` → ``{"builder": mapping}``; a full mapping as is."""
    from dessim.topology.spec import _KIND_ALIASES

    if isinstance(spec, Mapping):
        return copy.deepcopy(dict(spec)) if "kind" not in spec else {"builder": dict(spec)}
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"{where}: expected a topology spec string or mapping, got {spec!r}")
    path = Path(spec) if Path(spec).is_file() else find_data_file("topologies", spec.strip())
    if path is not None:
        try:
            data = read_yaml(path, "topology file")
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError(f"{where}: topology file {str(path)!r} is not a mapping")
        return data
    head = spec.partition(":")[0].strip().lower().replace("_", "-")
    if head not in _KIND_ALIASES:
        from dessim.topology import load_topology
        load_topology(spec)  # raises the topology layer's own message for a bad spec
    return {"builder": _inline_builder(spec)}


def _builder_kind(doc: Mapping[str, Any], where: str):
    from dessim.topology.spec import find_kind

    builder = doc.get("builder")
    if not isinstance(builder, Mapping) or "kind" not in builder:
        raise SpecError(f"{where}: topology axes need a topology built by a builder (an inline "
                        "spec such as dgx-a100:nodes=4, or a YAML file with a builder: section); "
                        "this one lists nodes and links")
    return find_kind(builder["kind"], where)


def _walk(container: Any, parts: Sequence[str], where: str, prefix: str) -> None:
    """Check that ``parts`` (mapping keys / list indices) lead somewhere inside ``container``."""
    for i, part in enumerate(parts):
        here = ".".join([prefix, *parts[: i + 1]])
        if isinstance(container, list):
            if not part.isdigit() or int(part) >= len(container):
                raise SpecError(f"{where}: {here!r}: {part!r} is not an index 0..{len(container) - 1} "
                                "of the base topology's list")
            container = container[int(part)]
        elif isinstance(container, Mapping):
            if part not in container and i < len(parts) - 1:
                raise SpecError(f"{where}: {here!r}: the base topology has no {part!r} here; "
                                f"it has {', '.join(map(str, container))}")
            container = container.get(part)
        else:
            raise SpecError(f"{where}: {here!r}: the base topology's value there is {container!r}, "
                            "not a list or mapping (write dims as a list of mappings to sweep "
                            "one dimension's keys)")


def _check_topology_axis(key: str, values: Sequence[Any], base: Mapping[str, Any], where: str) -> None:
    doc = topology_document(base.get("topology"), f"{where} (base.topology)")
    kind = _builder_kind(doc, where)
    params = {p.name: p for p in kind.params}
    head, *sub = key.split(".")
    if head not in params or head == "name":
        raise SpecError(f"{where}: {kind.name} has no key {head!r}; valid keys: "
                        f"{', '.join(k for k in kind.keys if k != 'name')}")
    if sub:  # e.g. dims.1.bw: checked against the base here, parsed by the builder per point
        _walk(doc["builder"].get(head), sub, where, head)
        return
    for i, v in enumerate(values):
        try:
            params[head].parse(v, f"{where}[{i}]")
        except DessimError as exc:
            raise SpecError(str(exc) if str(exc).startswith(where) else f"{where}[{i}]: {exc}") from None


_TOPOLOGY_CACHE: dict[str, Any] = {}
_TOPOLOGY_CACHE_SIZE = 64  # topologies are small; a sweep has few distinct ones per worker


def _load_topology_cached(spec: object, setup: MemorySetup | None = None):
    """The topology of ``spec`` (with ``setup``'s memory expansion), cached per process."""
    from dessim.topology import load_topology

    extra = setup.topology_key() if setup is not None else None
    key = json.dumps([spec, extra], sort_keys=True, default=repr)
    topo = _TOPOLOGY_CACHE.get(key)
    if topo is None:
        topo = load_topology(spec) if extra is None else with_expansion(_load_topology_cached(spec), setup)
        if len(_TOPOLOGY_CACHE) >= _TOPOLOGY_CACHE_SIZE:
            _TOPOLOGY_CACHE.pop(next(iter(_TOPOLOGY_CACHE)))
        _TOPOLOGY_CACHE[key] = topo
    return topo


# ---------------------------------------------------------------- the evaluator model
@dataclass(frozen=True)
class Namespace:
    """Axis paths ``NAME.KEY[.SUB...]`` of one kind: where they go and which keys are valid.

    ``target``: path in the point configuration that receives ``KEY: value``; ``keys``: valid
    keys (None: any, checked by the layer below when the point runs); ``nested``: dotted
    sub-keys allowed (``workload.training.micro_batch``); ``check``: extra validation.
    """

    name: str
    target: tuple[str, ...]
    keys: tuple[str, ...] | None = None
    nested: bool = False
    help: str = ""
    check: Callable[[str, Sequence[Any], Mapping[str, Any], str], None] | None = None


def _set_path(doc: Any, path: Sequence[str], value: Any) -> None:
    """Set ``value`` at ``path`` (mapping keys; digits index lists), creating mappings."""
    for part in path[:-1]:
        if isinstance(doc, list):
            doc = doc[int(part)]
            continue
        nxt = doc.get(part)
        if not isinstance(nxt, (dict, list)):
            nxt = {}
            doc[part] = nxt
        doc = nxt
    if isinstance(doc, list):
        doc[int(path[-1])] = value
    else:
        doc[path[-1]] = value


def _has_path(doc: Mapping[str, Any], path: Sequence[str]) -> bool:
    for part in path:
        if not isinstance(doc, Mapping) or part not in doc:
            return False
        doc = doc[part]
    return True


@dataclass(frozen=True)
class Evaluator:
    """One kind of sweep point (see module doc)."""

    name: str
    help: str
    base_keys: tuple[str, ...]
    base_sections: Mapping[str, tuple[str, ...] | None]  #: valid keys of mapping-valued base keys
    required: tuple[str, ...]                         #: config paths set by base or axes
    namespaces: Mapping[str, Namespace]
    evaluate: Callable[[Mapping[str, Any]], dict[str, Any]]
    default_metric: str
    expand: Callable[[Any, list[Any]], list[Any]] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: The configuration without settings that cannot change the result (None: as is); points
    #: with equal canonical configurations are simulated once (dessim.sweep.runner).
    canonical: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    #: Further checks of base sections by name: ``check(section, where)`` raises a SpecError.
    section_checks: Mapping[str, Callable[[Any, str], None]] = field(default_factory=dict)
    #: Cheap check of one point's configuration without simulating it (files exist, names
    #: are known, the topology builds): raises a DessimError. Run on every distinct
    #: configuration before the first point (dessim.sweep.runner), so a spec error stops
    #: the sweep at once instead of becoming failed points.
    precheck: Callable[[Mapping[str, Any]], None] | None = None
    #: Top-level names of the metrics a point reports (dotted metrics such as
    #: ``exposed_comm_s.dp`` start with one of them); a spec's metric is checked against them.
    #: None: not declared, the names are not checked before the run.
    metrics: tuple[str, ...] | None = None

    @property
    def supports_auto(self) -> bool:
        return self.expand is not None

    @cached_property
    def base_model(self) -> type[SpecModel]:
        """The spec model of this kind's ``base:``: its keys and the keys of its sections
        (values as written: the layer below parses their units)."""
        fields: dict[str, Any] = {}
        for key in self.base_keys:
            valid = self.base_sections.get(key)
            if valid is None:
                fields[key] = (Any, None)
            else:
                section = create_model(f"{self.name}_base_{key}", __base__=SpecModel,
                                       **{k: (Any, None) for k in valid})
                fields[key] = (section | None, None)
        return create_model(f"{self.name}_base", __base__=SpecModel,
                            __doc__=f"base: of a sweep of kind {self.name}", **fields)

    def check_base(self, base: Mapping[str, Any], source: str) -> dict[str, Any]:
        """Copy of ``base`` validated by :attr:`base_model`, its sections' own checks run;
        errors name ``source`` (the sweep file) and ``base.KEY``."""
        validate(self.base_model, base, source, at="base")
        where = f"{source}: base"
        out: dict[str, Any] = {}
        for key, value in base.items():
            if key in self.section_checks:
                self.section_checks[key](value, f"{where}.{key}")
            out[key] = value  # as written: the layer below parses its units
        return out

    def check_axis(self, path: str, values: Sequence[Any], base: Mapping[str, Any], where: str) -> None:
        """Raise a SpecError naming ``where`` unless ``path`` is a valid axis of this kind."""
        head, _, rest = path.partition(".")
        ns = self.namespaces.get(head)
        if ns is None or not rest:
            valid = ", ".join(f"{n}.KEY" for n in self.namespaces)
            raise SpecError(f"{where}: unknown axis {path!r} for kind {self.name!r}; valid axes: "
                            f"{valid}" + (", parallelism: auto" if self.supports_auto else ""))
        parts = rest.split(".")
        if len(parts) > 1 and not ns.nested:
            raise SpecError(f"{where}: {head} axes take one key ({head}.KEY), got {path!r}")
        if ns.keys is not None and parts[0] not in ns.keys:
            raise SpecError(f"{where}: unknown key {parts[0]!r} in {head}; valid keys: {', '.join(ns.keys)}")
        if ns.check is not None:
            ns.check(rest, values, base, where)

    def check_complete(self, base: Mapping[str, Any], axis_paths: Sequence[str], where: str) -> None:
        """Every required configuration path is set by the base or by an axis."""
        covered = {self._config_path(p) for p in axis_paths if p.partition(".")[0] in self.namespaces}
        for req in self.required:
            parts = tuple(req.split("."))
            if not _has_path(base, parts) and parts not in covered:
                raise SpecError(f"{where}: {req!r} is not set: give it under base: or as an axis")

    def _config_path(self, path: str) -> tuple[str, ...]:
        head, _, rest = path.partition(".")
        ns = self.namespaces[head]
        return (*ns.target, *rest.split("."))

    def config(self, base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """The point's full configuration: defaults, then base, then the axis values."""
        cfg: dict[str, Any] = copy.deepcopy(dict(self.defaults))
        for key, value in base.items():
            if isinstance(value, Mapping) and isinstance(cfg.get(key), dict):
                cfg[key].update(copy.deepcopy(dict(value)))
            else:
                cfg[key] = copy.deepcopy(value)
        topo_params = {k: v for k, v in params.items() if k.startswith("topology.")}
        if topo_params:
            doc = topology_document(cfg["topology"], "base.topology")
            for path, value in topo_params.items():
                _set_path(doc["builder"], path.split(".")[1:], value)
            cfg["topology"] = doc
        for path, value in params.items():
            if not path.startswith("topology."):
                _set_path(cfg, self._config_path(path), value)
        return cfg


# ---------------------------------------------------------------- collective
_COLLECTIVE_KEYS = ("op", "size", "ranks", "root")
#: The engine settings one collective on an idle network uses (paths of EngineOptions).
_COLLECTIVE_ENGINE_PATHS = ("network", "collectives", "shortcuts.stream_rings", "shortcuts.bundles",
                            "shortcuts.compact_schedules", "calibration")


def _engine_of(section: Mapping[str, Any] | None, where: str = "") -> Any:
    """The point's :class:`~dessim.engine.EngineOptions` (no link timelines)."""
    from dessim.engine import EngineOptions

    return EngineOptions.of(section, where, record_links=False)


def _check_engine_axis(allowed: Sequence[str] | None) -> Callable[..., None]:
    """Axis check of ``engine.PATH``: a known path (a former flat name is an error naming
    the new one) and values the option accepts, before any point runs."""
    def check(key: str, values: Sequence[Any], base: Mapping[str, Any], where: str) -> None:
        from dessim.engine.options import check_engine_path

        check_engine_path(key, values, where, allowed)
    return check


def _check_engine_section(allowed: Sequence[str] | None) -> Callable[[Any, str], None]:
    """Base check of ``engine:``: every key and value, as the points will build it."""
    def check(section: Any, where: str) -> None:
        from dessim.engine.options import check_engine_section

        check_engine_section(section, where, allowed)
    return check


def _precheck_collective(cfg: Mapping[str, Any]) -> None:
    from dessim.collectives.ops import OPS
    from dessim.units import parse_size

    _load_topology_cached(cfg["topology"])
    _engine_of(cfg["engine"])
    op = cfg["collective"].get("op")
    if not isinstance(op, str) or op.lower() not in OPS:
        raise SpecError(f"collective.op {op!r} is unknown; valid: {', '.join(OPS)}")
    parse_size(cfg["collective"]["size"], "collective.size")


def _evaluate_collective(cfg: Mapping[str, Any]) -> dict[str, Any]:
    from dessim.collectives import run_collective

    topo = _load_topology_cached(cfg["topology"])
    coll = cfg["collective"]
    options = _engine_of(cfg["engine"])
    res = run_collective(coll["op"], coll["size"], topo, ranks=coll.get("ranks"),
                         root=coll.get("root"), **options.run_collective_kwargs())
    out = res.to_dict()
    out.pop("wall_s", None)  # host time: not a result (reported as eval_wall_s)
    out["gpus"] = topo.num_gpus
    return out


_TOPOLOGY_NS = Namespace("topology", ("topology",), nested=True,
                         help="a key of the base topology's builder; KEY.I.SUB reaches into "
                              "lists/mappings (dims.1.bw: bandwidth of the second dimension)",
                         check=_check_topology_axis)

COLLECTIVE = Evaluator(
    name="collective",
    help="one collective operation on a topology (dessim.collectives.run_collective)",
    base_keys=("topology", "collective", "engine"),
    base_sections={"collective": _COLLECTIVE_KEYS, "engine": None},
    section_checks={"engine": _check_engine_section(_COLLECTIVE_ENGINE_PATHS)},
    required=("topology", "collective.op", "collective.size"),
    namespaces={"topology": _TOPOLOGY_NS,
                "collective": Namespace("collective", ("collective",), _COLLECTIVE_KEYS,
                                        help="what runs"),
                "engine": Namespace("engine", ("engine",), nested=True,
                                    help="how it runs: network, collectives.KEY, "
                                         "shortcuts.stream_rings, calibration",
                                    check=_check_engine_axis(_COLLECTIVE_ENGINE_PATHS))},
    evaluate=_evaluate_collective,
    precheck=_precheck_collective,
    metrics=("algbw_GBps", "algorithm", "auto", "busbw_GBps", "calibration", "channels", "chunks",
             "events", "link_util_max", "network", "op", "protocol", "ranks", "size_bytes",
             "time_s", "transfers", "gpus"),
    default_metric="time_s",
    defaults={"collective": {}, "engine": {}},
)


# ---------------------------------------------------------------- workload
def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings → one level with dotted keys; lists/tuples → JSON strings."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


#: Summary entries that are not results of the configuration: host time, rank lists.
_DROPPED_SUMMARY_KEYS: tuple[str, ...] = ("wall_s", "groups")


def _workload_inputs(cfg: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(topology, engine options, overrides) of a workload point; a memory expansion's
    capacity is checked before anything is simulated."""
    from dessim.workload import plan_workload

    setup = memory_setup(cfg.get("memory"))
    topo = _load_topology_cached(cfg["topology"], setup)
    options = _engine_of(cfg.get("engine"))
    overrides = setup.overrides(cfg.get("overrides")) or None
    if setup.has_expansion:
        check_expansion_fit(plan_workload(cfg["workload"], topo, overrides=overrides, engine=options)[0],
                            setup)
    return topo, options, overrides


def _iteration_metrics(summary: Mapping[str, Any], topo: Any) -> dict[str, Any]:
    summary = {k: v for k, v in summary.items() if k not in _DROPPED_SUMMARY_KEYS}
    out = flatten(summary)
    out.setdefault("gpus", topo.num_gpus)
    return out


def _evaluate_workload(cfg: Mapping[str, Any]) -> dict[str, Any]:
    from dessim.workload import simulate_workload

    cfg = _canonical_workload(cfg)
    topo, options, overrides = _workload_inputs(cfg)
    result = simulate_workload(cfg["workload"], topo, overrides=overrides, options=options)
    return _iteration_metrics(result.summary(), topo)


def _evaluate_train(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The iteration's metrics and the whole run's (:mod:`dessim.training_run`): headline
    ``time_to_train_s``, ``goodput``, ``expected_failures``, ``energy_run_mwh``,
    ``energy_per_token_j``, ``cost_usd`` and the nested figures flattened with dots."""
    from dessim.training_run import parse_train_options, simulate_training_run

    cfg = _canonical_workload(cfg)
    topo, options, overrides = _workload_inputs(cfg)
    train = parse_train_options(cfg.get("train") or {}, "train")
    run = simulate_training_run(cfg["workload"], topo, train, overrides=overrides, engine=options)
    out = _iteration_metrics(run.iteration_summary, topo)
    out.update(flatten(run.summary()))
    return out


def _precheck_workload(cfg: Mapping[str, Any]) -> None:
    from dessim.workload.kinds import check_overrides, load_any_workload

    setup = memory_setup(cfg.get("memory"))
    _load_topology_cached(cfg["topology"], setup)
    _engine_of(cfg.get("engine"))
    # a misspelt top-level override (trainng:) is one error before any point runs, not the
    # same failure recorded for every point
    check_overrides(load_any_workload(cfg["workload"]), cfg.get("overrides"))
    for path in _override_paths(cfg.get("overrides")):    # base overrides as the axes' keys
        problem = _unknown_workload_key(cfg["workload"], path)
        if problem:
            raise SpecError(f"overrides.{'.'.join(path)}: {problem}")


def _canonical_workload(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Without the memory expansion when the point says it offloads nothing to it."""
    mem = cfg.get("memory") or {}
    if unused_expansion(mem):
        return {**cfg, "memory": {k: v for k, v in mem.items() if k not in EXPANSION_ONLY_KEYS}}
    return cfg


def _unknown_workload_key(workload: Any, parts: Sequence[str]) -> str | None:
    """What is wrong with the key path ``parts`` (``model.routing.distribution``) of the
    workload file ``workload``, checked against its kind's file model at every depth, or None.
    Paths whose first key is not a section of the file (flat overrides such as ``tp``, the
    ``memory``/``generator`` options), paths under a list or free mapping, and a workload that
    does not load are None: the points say what is wrong with those."""
    from dessim.schema import did_you_mean, unknown_key
    from dessim.workload.kinds import WORKLOAD_KINDS, load_any_workload

    if len(parts) < 2 or not isinstance(workload, (str, Path)):
        return None
    try:
        spec = load_any_workload(workload)
    except DessimError:
        return None
    kind = next((k for k in WORKLOAD_KINDS.values() if isinstance(spec, k.spec_type)), None)
    if kind is None or parts[0] not in kind.model.model_fields:
        return None
    missing = unknown_key(kind.model, list(parts))
    if missing is None:
        return None
    section, name, names = missing
    return (f"unknown key {name!r} in the {'.'.join(section)} section of workload {str(workload)!r}"
            f"{did_you_mean(name, names)}; valid keys: {', '.join(names)}")


def _check_workload_axis(key: str, values: Sequence[Any], base: Mapping[str, Any], where: str) -> None:
    """An axis ``workload.SECTION.KEY[.KEY...]`` names a key of that section of the base
    workload file, at every depth and for every kind (``workload.model.routing.distribution``
    of a transformer, ``workload.model.embedding_dim`` of a DLRM, ``workload.model.image_size``
    of a CNN): a typo is a spec error before any point runs, not the same failure recorded for
    every point (:func:`_unknown_workload_key`)."""
    problem = _unknown_workload_key(base.get("workload"), key.split("."))
    if problem:
        raise SpecError(f"{where}: {problem}")


def _override_paths(overrides: Any, head: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths to the leaves of nested override mappings."""
    if not isinstance(overrides, Mapping) or not overrides:
        return [head] if head else []
    return [p for k, v in overrides.items() for p in _override_paths(v, (*head, str(k)))]


def _expand_workload(spec: Any, points: list[Any]) -> list[Any]:
    return expand_layouts(spec, points, WORKLOAD.config, _load_topology_cached)


WORKLOAD = Evaluator(
    name="workload",
    help="one training iteration of a workload on a topology (dessim.workload.simulate_workload)",
    base_keys=("workload", "topology", "engine", "overrides", "memory"),
    base_sections={"engine": None, "overrides": None, "memory": MEMORY_KEYS},
    section_checks={"engine": _check_engine_section(None)},
    required=("workload", "topology"),
    namespaces={"topology": _TOPOLOGY_NS,
                "workload": Namespace("workload", ("overrides",), nested=True,
                                      help="SECTION.KEY of the workload document",
                                      check=_check_workload_axis),
                "memory": Namespace("memory", ("memory",), MEMORY_KEYS,
                                    help="HBM capacity, memory expansion, offload options",
                                    check=lambda key, values, base, where: check_memory_values(
                                        key, list(values), where)),
                "engine": Namespace("engine", ("engine",), nested=True,
                                    help="an EngineOptions setting by its dotted path "
                                         "(collectives.algo, noise.straggler_sigma, "
                                         "shortcuts.bundles, network, ...)",
                                    check=_check_engine_axis(None))},
    evaluate=_evaluate_workload,
    precheck=_precheck_workload,
    metrics=("approximations", "bubble_fraction", "bucket_size", "calibration", "collectives", "comm",
             "compute_s", "details",
             "device", "events", "exposed_comm_s", "extrapolation", "exposed_comm_total_s", "fold",
             "fold_fallback", "gpu_busy_fraction", "gpus", "granularity", "hardware_flops",
             "hardware_tflops_per_gpu", "hfu", "iteration_s", "kind", "layout",
             "memory_capacity_bytes", "memory_per_gpu_bytes", "memory_stage", "mfu",
             "model_flops", "model_tflops_per_gpu", "samples_per_s", "shortcuts", "stream_rings",
             "tasks", "tokens_per_s", "workload", "offload"),
    default_metric="iteration_s",
    expand=_expand_workload,
    canonical=_canonical_workload,
    defaults={"engine": {}, "overrides": {}, "memory": {}},
)


# ---------------------------------------------------------------- cluster over time
#: Running sets and alone runs already simulated in this process (dessim.workload.sharedcluster).
_CLUSTER_MEMO: dict[Any, Any] = {}
_SCHEDULER_KEYS = ("policy", "resize_overhead")


def _evaluate_cluster(cfg: Mapping[str, Any]) -> dict[str, Any]:
    from dessim.units import parse_time
    from dessim.workload.jobtrace import load_job_trace
    from dessim.workload.sharedcluster import simulate_job_trace

    trace = load_job_trace(cfg["cluster"])
    engine = {**trace.engine, **(cfg.get("engine") or {})}
    sched = cfg.get("scheduler") or {}
    overhead = sched.get("resize_overhead")
    topo = cfg.get("topology")
    result = simulate_job_trace(trace, topology=_load_topology_cached(topo) if topo is not None else None,
                                options=_engine_of(engine, str(cfg["cluster"])), policy=sched.get("policy"),
                                resize_overhead=None if overhead is None else parse_time(
                                    overhead, "scheduler.resize_overhead"),
                                memo=_CLUSTER_MEMO)
    summary = result.summary()
    summary.pop("allocations")
    jobs = summary.pop("jobs")
    out = flatten(summary)
    for j in jobs:
        for key in ("jct_s", "slowdown", "queue_s", "mean_gpus", "resizes"):
            out[f"jobs.{j['name']}.{key}"] = j[key]
    return out


def _cluster_summary_keys() -> tuple[str, ...]:
    from dessim.workload.sharedcluster import SUMMARY_KEYS
    return SUMMARY_KEYS


CLUSTER = Evaluator(
    name="cluster",
    help="a shared cluster over time: a job-arrival trace under a scheduler "
         "(dessim.workload.sharedcluster.simulate_job_trace)",
    base_keys=("cluster", "topology", "engine", "scheduler"),
    base_sections={"engine": None, "scheduler": _SCHEDULER_KEYS},
    section_checks={"engine": _check_engine_section(None)},
    required=("cluster",),
    namespaces={"topology": _TOPOLOGY_NS,
                "scheduler": Namespace("scheduler", ("scheduler",), _SCHEDULER_KEYS,
                                       help="policy (fifo, fair, dorm), resize_overhead"),
                "engine": Namespace("engine", ("engine",), nested=True,
                                    help="an EngineOptions setting by its dotted path",
                                    check=_check_engine_axis(None))},
    evaluate=_evaluate_cluster,
    default_metric="makespan_s",
    metrics=tuple(k for k in _cluster_summary_keys() if k != "allocations"),
    defaults={"engine": {}, "scheduler": {}},
)


def _train_summary_keys() -> tuple[str, ...]:
    from dessim.training_run.run import SUMMARY_KEYS
    return SUMMARY_KEYS


def _train_keys() -> tuple[str, ...]:
    from dessim.training_run.options import TRAIN_KEYS
    return tuple(TRAIN_KEYS)


TRAIN = replace(
    WORKLOAD, name="train",
    help="a whole training run of a workload: time to train, goodput, energy, cost "
         "(dessim.training_run.simulate_training_run)",
    base_keys=(*WORKLOAD.base_keys, "train"),
    base_sections={**WORKLOAD.base_sections, "train": _train_keys()},
    namespaces={**WORKLOAD.namespaces,
                "train": Namespace("train", ("train",), _train_keys(), nested=True,
                                   help="a key of the train section (tokens, checkpoint_interval, "
                                        "mtbf.gpu, pue, usd_per_kwh, ...; docs/training-run.md)")},
    evaluate=_evaluate_train,
    metrics=(*WORKLOAD.metrics, *_train_summary_keys()),
    default_metric="time_to_train_s",
    expand=lambda spec, points: expand_layouts(spec, points, TRAIN.config, _load_topology_cached),
    defaults={**WORKLOAD.defaults, "train": {}},
)

#: Point kinds by name (the sweep spec's ``kind``).
EVALUATORS: dict[str, Evaluator] = {e.name: e for e in (WORKLOAD, COLLECTIVE, CLUSTER, TRAIN)}


def get_evaluator(name: object, where: str = "kind") -> Evaluator:
    if isinstance(name, str) and name in EVALUATORS:
        return EVALUATORS[name]
    raise SpecError(f"{where}: unknown sweep kind {name!r}; valid kinds: {', '.join(EVALUATORS)}")


# ---------------------------------------------------------------- worker side
def make_task(kind: str, base: Mapping[str, Any], point: Any) -> dict[str, Any]:
    """Plain, picklable description of one point for any backend."""
    evaluator = EVALUATORS[kind]
    return {"kind": kind, "index": point.index, "key": point.key, "params": dict(point.params),
            "config": evaluator.config(base, point.config_params), "cost": point.cost}


def evaluate_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """Run one point; never raises. Returns the journal record of the point.

    ``status`` is ``ok``, ``failed`` (a DessimError: the configuration does not fit or is
    invalid; ``reason`` is its message) or ``error`` (an unexpected exception, i.e. a bug;
    ``reason`` ends with the innermost traceback line). ``eval_wall_s`` is host time, the only
    field that differs between runs.
    """
    start = time.perf_counter()
    record: dict[str, Any] = {"index": task["index"], "key": task["key"], "params": task["params"]}
    try:
        metrics = EVALUATORS[task["kind"]].evaluate(task["config"])
        record.update(status=STATUS_OK, reason="", error_type="", metrics=metrics)
    except DessimError as exc:
        record.update(status=STATUS_FAILED, reason=str(exc), error_type=type(exc).__name__,
                      metrics={})
    except Exception as exc:  # noqa: BLE001 — a bug in a lower layer must not stop the sweep
        where = traceback.extract_tb(exc.__traceback__)[-1]
        record.update(status=STATUS_ERROR, error_type=type(exc).__name__, metrics={},
                      reason=f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})")
    record["eval_wall_s"] = time.perf_counter() - start
    return record
