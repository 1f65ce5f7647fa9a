"""Workload kinds: one registry so that every entry point takes every kind of workload file.

A workload file's optional ``kind:`` key picks its parser and generator
(:data:`WORKLOAD_KINDS`): ``transformer`` (the default; :mod:`dessim.workload.transformer.spec` and
:mod:`dessim.workload.transformer.generator`), ``dlrm`` (:mod:`dessim.workload.recsys.dlrm`) and ``cnn``
(:mod:`dessim.workload.vision.cnn`, ResNet-50 and ViTs) and ``chakra`` (a Chakra execution trace
replayed: :mod:`dessim.workload.replay`).

* :func:`load_any_workload` — a spec of the right class from a file path or preset name;
* :func:`generate_workload` — the task graph of one iteration on a topology, not yet
  simulated (:class:`~dessim.workload.dataparallel.result.Generated`: what the multi-job cluster
  simulation merges);
* :func:`simulate_any` — generate, simulate, wrap the result: the one pipeline of every
  kind, what :func:`dessim.workload.simulate_workload` (``dessim simulate``, sweeps) runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


from dessim.engine import EngineOptions, simulate
from dessim.errors import SpecError
from dessim.resources import find_data_file, read_yaml
from dessim.schema import tagged
from dessim.topology import load_topology
from dessim.topology.calibrate import calibrated_topology
from dessim.topology.graph import Topology
from dessim.workload.vision.cnn import OVERRIDE_SECTIONS as CNN_SECTIONS
from dessim.workload.vision.cnn import CNNFile, CNNSpec, generate_cnn, parse_cnn
from dessim.workload.recsys.dlrm import OVERRIDE_SECTIONS as DLRM_SECTIONS
from dessim.workload.recsys.dlrm import DLRMFile, DLRMSpec, generate_dlrm, parse_dlrm
from dessim.workload.dataparallel.spec import check_override_keys as check_dp_override_keys
from dessim.workload.dataparallel.result import Generated
from dessim.workload.replay import CHAKRA_KIND, ChakraFile, ChakraSpec, generate_chakra, parse_chakra
from dessim.workload.transformer.generator import build_taskgraph
from dessim.workload.transformer.plan import check_override_keys, plan_workload
from dessim.workload.transformer.result import WorkloadResult
from dessim.workload.transformer.steady import ExtrapolatedResult, simulate_steady
from dessim.workload.transformer.steady import applies as steady_applies
from dessim.workload.transformer.spec import (TRANSFORMER_KIND, TransformerFile, WorkloadSpec, file_kind,
                                              load_workload, shipped_workloads)

__all__ = ["WorkloadKind", "WORKLOAD_KINDS", "WorkloadFile", "load_any_workload", "generate_workload", "simulate_any",
           "workload_kind", "kind_of", "shipped_any", "check_overrides"]


@dataclass(frozen=True)
class WorkloadKind:
    """A kind of workload file: how to parse it and how to generate its task graph."""

    name: str
    help: str
    spec_type: type
    model: type                                                 #: its file's pydantic model (dessim.schema)
    parse: Callable[[Any, str, str], Any]                       #: (document, origin, default name)
    generate: Callable[..., Generated]                          #: (spec, topology, overrides, device)
    #: (spec, overrides): raise on a top-level override key the kind does not take (None: no check)
    check_overrides: Callable[[Any, Mapping[str, Any] | None], None] | None = None


def _generate_transformer(spec: WorkloadSpec, topology: Topology, overrides: Mapping[str, Any] | None,
                          options: EngineOptions | None) -> Generated:
    plan, topo = plan_workload(spec, topology, overrides=overrides, engine=options)
    graph = build_taskgraph(plan, topo, engine=options)
    return Generated(spec.name, graph, topo, lambda sim: WorkloadResult(plan, graph, sim))


def _generate_dp(fn: Callable[..., Generated]) -> Callable[..., Generated]:
    def gen(spec: Any, topology: Topology, overrides: Mapping[str, Any] | None,
            options: EngineOptions | None) -> Generated:
        overrides = dict(overrides or {})
        device = overrides.pop("device", None) or (options.device if options else None)
        return fn(spec, topology, overrides, device=device,
                  calibration=options.model_calibration if options else None)
    return gen


def _check_dp(sections: tuple[str, ...]) -> Callable[[Any, Mapping[str, Any] | None], None]:
    def check(spec: Any, overrides: Mapping[str, Any] | None) -> None:
        check_dp_override_keys(spec.common, overrides, sections)
    return check


def _parse_transformer(data: Any, origin: str, default_name: str) -> WorkloadSpec:
    from dessim.workload.transformer.spec import parse_workload
    return parse_workload(data, origin, default_name)


#: Workload kinds by the value of a file's ``kind:`` key.
WORKLOAD_KINDS: dict[str, WorkloadKind] = {k.name: k for k in (
    WorkloadKind(TRANSFORMER_KIND, "dense or MoE transformer with TP/PP/DP/CP/EP (default)", WorkloadSpec,
                 TransformerFile, _parse_transformer, _generate_transformer, check_override_keys),
    WorkloadKind("dlrm", "recommendation model: sharded embeddings + data-parallel MLPs", DLRMSpec,
                 DLRMFile, parse_dlrm, _generate_dp(generate_dlrm), _check_dp(DLRM_SECTIONS)),
    WorkloadKind("cnn", "ResNet-50 / ViT, data parallel", CNNSpec, CNNFile, parse_cnn,
                 _generate_dp(generate_cnn), _check_dp(CNN_SECTIONS)),
    WorkloadKind(CHAKRA_KIND, "a Chakra execution trace, replayed (as dessim replay)", ChakraSpec,
                 ChakraFile, parse_chakra, generate_chakra),
)}

def _kind_tag(doc: Any) -> str | None:
    kind = doc.get("kind", TRANSFORMER_KIND) if isinstance(doc, dict) else TRANSFORMER_KIND
    return kind if isinstance(kind, str) and kind in WORKLOAD_KINDS else None


#: A workload file of any kind (its ``kind:`` picks the model): what ``dessim schema workload``
#: exports. Loading validates a file with its own kind's model (:func:`load_any_workload`).
WorkloadFile = tagged({k.name: k.model for k in WORKLOAD_KINDS.values()}, _kind_tag,
                      f"a workload of a known kind ({', '.join(WORKLOAD_KINDS)})")


def workload_kind(data: Any, origin: str) -> WorkloadKind:
    """The :class:`WorkloadKind` of a parsed document (``kind:``, default transformer)."""
    name = data.get("kind", TRANSFORMER_KIND) if isinstance(data, dict) else TRANSFORMER_KIND
    kind = WORKLOAD_KINDS.get(name) if isinstance(name, str) else None
    if name == "cluster":
        raise SpecError(f"{origin}: a cluster spec (several jobs), not a workload: run it with "
                        "'dessim cluster' (dessim.workload.multijob.simulate_cluster)")
    if kind is None:
        raise SpecError(f"{origin}: kind {name!r} is unknown; valid kinds: {', '.join(WORKLOAD_KINDS)}")
    return kind


def _find(path_or_name: str | Path) -> Path | None:
    text = str(path_or_name)
    path = Path(text)
    if path.is_file():
        return path
    return find_data_file("workloads", text)


def kind_of(path_or_name: str | Path) -> str | None:
    """The ``kind:`` of a workload file or preset name (``transformer`` when absent); None
    when it is neither a file nor a preset, or cannot be read."""
    path = _find(path_or_name)
    return file_kind(path) if path is not None else None


def _read(path: Path) -> Any:
    return read_yaml(path, "workload file")


def load_any_workload(path_or_name: str | Path) -> Any:
    """The spec (WorkloadSpec, DLRMSpec or CNNSpec) of a workload file or preset name."""
    path = _find(path_or_name)
    if path is None:
        return load_workload(path_or_name)      # raises the transformer loader's clear error
    data = _read(path)
    kind = workload_kind(data, str(path))
    if kind.name == TRANSFORMER_KIND:
        return load_workload(path)
    return kind.parse(data, str(path), path.stem)


def _kind_of_spec(spec: Any) -> WorkloadKind:
    for kind in WORKLOAD_KINDS.values():
        if isinstance(spec, kind.spec_type):
            return kind
    raise SpecError(f"expected a workload name, file or spec, got {type(spec).__name__}")


def check_overrides(spec: Any, overrides: Mapping[str, Any] | None) -> None:
    """Raise a :class:`~dessim.errors.WorkloadError` naming the first top-level key of
    ``overrides`` that ``spec``'s kind takes no override for, as its generator would."""
    check = _kind_of_spec(spec).check_overrides
    if check is not None:
        check(spec, overrides)


def generate_workload(workload: Any, topology: Topology | str, *, overrides: Mapping[str, Any] | None = None,
                      options: EngineOptions | None = None) -> Generated:
    """The not-yet-simulated task graph of one iteration of any kind of workload."""
    spec = workload if not isinstance(workload, (str, Path)) else load_any_workload(workload)
    topo = calibrated_topology(load_topology(topology), options.calibration if options else None)
    return _kind_of_spec(spec).generate(spec, topo, overrides, options)


def _simulate_transformer(spec: WorkloadSpec, topology: Topology, overrides: Mapping[str, Any] | None,
                          options: EngineOptions | None) -> WorkloadResult | ExtrapolatedResult:
    """Plan, then either extrapolate from short runs where that applies
    (:mod:`dessim.workload.transformer.steady`) or generate and replay the whole iteration
    (recording in the graph's meta why an extrapolation that was tried was refused)."""
    plan, topo = plan_workload(spec, topology, overrides=overrides, engine=options)
    engine = options or EngineOptions(record_links=False)
    refused = None
    if steady_applies(plan, options):
        out = simulate_steady(plan, topo, engine)
        if not isinstance(out, str):
            return out
        refused = out
    graph = build_taskgraph(plan, topo, engine=options)
    if refused:
        graph.meta["extrapolation_fallback"] = refused
    return WorkloadResult(plan, graph, simulate(graph, topo, engine))


def simulate_any(workload: Any, topology: Topology | str, *, overrides: Mapping[str, Any] | None = None,
                 options: EngineOptions | None = None) -> Any:
    """Generate and simulate one iteration; the kind's result object (``.summary()``). A
    transformer with many micro-batches whose caller needs summary figures only is
    extrapolated from short runs by default (:mod:`dessim.workload.transformer.steady`;
    ``extrapolate=False`` replays it in full)."""
    spec = workload if not isinstance(workload, (str, Path)) else load_any_workload(workload)
    if isinstance(spec, WorkloadSpec):
        topo = calibrated_topology(load_topology(topology), options.calibration if options else None)
        return _simulate_transformer(spec, topo, overrides, options)
    gen = generate_workload(spec, topology, overrides=overrides, options=options)
    sim = simulate(gen.graph, gen.topology, gen.options or options or EngineOptions(record_links=False))
    return gen.finish(sim)


def shipped_any() -> dict[str, dict[str, Path]]:
    """Shipped presets by kind: ``{"transformer": {...}, "dlrm": {...}, "cnn": {...}}``."""
    return {k: shipped_workloads(k) for k in WORKLOAD_KINDS}
