"""Several training jobs on one cluster: disjoint GPU sets, one shared network.

Cluster spec (YAML; :func:`load_cluster`)::

    kind: cluster                        # optional; keeps the file out of workload lists
    name: two-jobs
    topology: "leafspine:hosts=16,leaves=2,oversub=4,spines=1,bw=25GB/s"   # any topology spec
    storage: {kind: pfs, bw: 20GB/s}     # optional: attach a storage tier (dessim.topology.storage)
    engine: {collectives: {algo: ring}}  # optional: EngineOptions (network, collectives, noise, ...)
    jobs:
      - name: a                          # default: job<i>
        workload: resnet50               # any kind: preset name or workload file
        gpus: [0, 8, 1, 9]               # global ranks in job-rank order; or "0-3,8-11"; or a count
        overrides: {training: {global_batch: 256}}
      - name: b
        workload: vit-b16
        gpus: 4                          # a count: the lowest free ranks, in order

How (:func:`simulate_cluster`)
    Each job's task graph is generated on a *view* of the cluster in which only its GPUs are
    GPUs (ranks 0..n−1 in the order given) and every other GPU becomes a switch with the same
    ``transit`` flag — so routes, link figures and memory/storage nodes are those of the
    cluster. The graphs are then merged into one: task ids and collective ids are prefixed
    with ``<job>/``, ranks, peers and groups mapped to global ranks (so jobs are generated
    without replica folding unless one asks for it, which is an error). One simulation runs them
    all; every job starts at t = 0 and a job's iteration time is the end of its last task.
    A job with parameter servers (:mod:`dessim.workload.dataparallel.paramserver`) brings its
    server nodes into the cluster renamed ``<job>/ps<i>`` (linked where its view placed them,
    :func:`with_job_nodes`) and reports the steady state of its several iterations.
    Each job is also simulated alone on the same topology (its remapped graph only); the
    slowdown from interference is ``shared / alone``. Under the flow model, jobs slow each
    other down only where their flows share links (max-min fair shares).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence

from pydantic import Field, WithJsonSchema

from dessim.resources import read_yaml
from dessim.schema import SpecModel, Text, converted, validate
from dessim.engine import EngineOptions, simulate
from dessim.engine.result import SimulationResult
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.taskgraph.model import TaskGraph
from dessim.topology import load_topology
from dessim.topology.calibrate import calibrated_topology
from dessim.topology.graph import Topology
from dessim.topology.storage import attach_storage
from dessim.workload.kinds import generate_workload
from dessim.workload.common.figures import ITERATION_MARKS, exposed_comm, steady_iteration_s
from dessim.workload.dataparallel.io import StorageSection

__all__ = ["JobSpec", "ClusterSpec", "JobResult", "ClusterResult", "load_cluster", "parse_cluster",
           "job_view", "merge_graphs", "simulate_cluster", "parse_gpus", "resolve_workload",
           "check_cluster_sections", "ClusterHead", "ClusterFile", "ClusterJob", "JobWorkload", "cluster_topology", "with_job_nodes",
           "JOB_NODES"]

#: The ``kind:`` of a cluster file (keeps it out of the workload preset lists).
CLUSTER_KIND = "cluster"


@dataclass(frozen=True)
class JobSpec:
    """One job: a workload, its GPUs (global ranks, job-rank order; or a count) and overrides."""

    name: str
    workload: Any
    gpus: tuple[int, ...] | int
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster with its jobs (module docstring)."""

    name: str
    topology: Any
    jobs: tuple[JobSpec, ...]
    engine: Mapping[str, Any] = field(default_factory=dict)
    storage: Mapping[str, Any] | None = None
    description: str = ""
    origin: str = ""      #: the file it was read from (named by error messages)


def parse_gpus(value: Any, where: str) -> tuple[int, ...] | int:
    """``[0, 8, 1]``, ``"0-3,8-11"`` or a count ``4`` (module docstring)."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a list of ranks, a range string or a count, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(f"{where}: a GPU count must be >= 1, got {value}")
        return value
    items: list[int] = []
    if isinstance(value, str):
        for part in value.split(","):
            lo, sep, hi = part.strip().partition("-")
            try:
                a, b = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise SpecError(f"{where}: cannot read {part.strip()!r} of {value!r} as a rank or range a-b") from None
            if b < a:
                raise SpecError(f"{where}: range {part.strip()!r} runs backwards")
            items += range(a, b + 1)
    elif isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = list(value)
    else:
        raise SpecError(f"{where}: expected a list of ranks, a range string or a count, got {value!r}")
    if not items or len(set(items)) != len(items) or min(items) < 0:
        raise SpecError(f"{where}: GPU ranks {value!r} must be distinct integers >= 0")
    return tuple(items)


def resolve_workload(workload: Any, origin: str) -> Any:
    """A job's ``workload``: a file name relative to the cluster file's folder when it exists
    there, else as given (a preset name or a path)."""
    if isinstance(workload, str) and not Path(workload).is_absolute() and origin.endswith((".yaml", ".yml")):
        local = Path(origin).parent / workload
        return str(local) if local.is_file() else workload
    return workload


_GPUS_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 1},
                          {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
                          {"type": "string", "examples": ["0-3,8-11"]}],
                "description": "global ranks in job-rank order, a range string, or a GPU count"}
_TOPOLOGY_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "object"}],
                    "description": "any topology spec: inline, shipped name, file, or a mapping "
                                   "(dessim schema topology)"}


def _workload(value: Any, what: str) -> Any:
    """A preset name or file; from Python also a workload spec object (any kind)."""
    if not isinstance(value, str) and (value is None or isinstance(value, (bool, int, float, list, dict))):
        raise SpecError(f"{what}: expected a preset name or a workload file, got {value!r}")
    return value


#: A job's ``workload:`` (the JSON Schema shows the file form: a string).
JobWorkload = converted(_workload, {"type": "string", "description": "a preset name or a workload "
                                   "file (any kind)"})


class ClusterHead(SpecModel):
    """The keys every cluster file has (static jobs or a job trace)."""

    kind: Literal["cluster"] = Field(CLUSTER_KIND, description="keeps the file out of workload lists")
    name: Text | None = Field(None, description="default: the file name")
    description: Text = ""
    topology: Annotated[Any, WithJsonSchema(_TOPOLOGY_SCHEMA)] = Field(description=_TOPOLOGY_SCHEMA["description"])
    storage: StorageSection | None = Field(None, description="attach a storage tier (dessim.topology.storage)")
    engine: dict[str, Any] = Field({}, description="EngineOptions: network, collectives, noise, ...")


class ClusterJob(SpecModel):
    """One job of a static cluster file."""

    name: Text | None = Field(None, description="default: job<index>")
    workload: JobWorkload
    gpus: converted(parse_gpus, _GPUS_SCHEMA)
    overrides: dict[str, Any] = Field({}, description="shaped like the workload file's sections")


class ClusterFile(ClusterHead):
    """A cluster file with a fixed set of jobs (module docstring)."""

    jobs: list[ClusterJob] = Field(min_length=1)


def check_cluster_sections(head: ClusterHead, names: Sequence[str], origin: str) -> None:
    """Distinct job names, every engine setting valid."""
    if len(set(names)) != len(names):
        raise SpecError(f"{origin}: job names must be distinct, got {list(names)}")
    EngineOptions.of(head.engine, origin)   # every setting checked now


def check_not_other_spec(data: Any, origin: str) -> None:
    """Raise a :class:`SpecError` saying which command runs ``data`` when it is a workload
    file or a sweep spec rather than a cluster file (instead of the cluster schema's list of
    every key it does not know)."""
    from dessim.workload.kinds import WORKLOAD_KINDS

    if not isinstance(data, Mapping) or "jobs" in data or data.get("kind", CLUSTER_KIND) == CLUSTER_KIND \
            and "model" not in data and "axes" not in data:
        return
    if "axes" in data or "base" in data:
        raise SpecError(f"{origin}: a sweep spec, not a cluster file: run it with 'dessim sweep {origin}'")
    kind = data.get("kind", "transformer")
    if kind in WORKLOAD_KINDS or "model" in data:
        raise SpecError(f"{origin}: a workload file (kind {kind}), not a cluster file (kind: cluster, "
                        f"with jobs): simulate it with 'dessim simulate {origin}', or name it as the "
                        "workload of a job in a cluster file")


def parse_cluster(data: Any, origin: str = "<cluster>") -> ClusterSpec:
    """A :class:`ClusterSpec` from a parsed YAML document (validated by :class:`ClusterFile`)."""
    check_not_other_spec(data, origin)
    doc = validate(ClusterFile, data, origin)
    jobs = [JobSpec(job.name or f"job{i}", resolve_workload(job.workload, origin), job.gpus, job.overrides)
            for i, job in enumerate(doc.jobs)]
    check_cluster_sections(doc, [j.name for j in jobs], origin)
    return ClusterSpec(doc.name or Path(origin).stem, doc.topology, tuple(jobs), doc.engine,
                       doc.storage.kwargs() if doc.storage else None, doc.description, origin)


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load a cluster spec file."""
    return parse_cluster(read_yaml(path, "cluster file"), str(path))


def assign_gpus(jobs: Sequence[JobSpec], num_gpus: int, where: str) -> list[tuple[int, ...]]:
    """Global ranks of every job: explicit lists checked, counts filled with the lowest free ranks."""
    used: dict[int, str] = {}
    out: list[tuple[int, ...] | None] = []
    for job in jobs:
        if isinstance(job.gpus, tuple):
            for r in job.gpus:
                if r >= num_gpus:
                    raise SpecError(f"{where}: job {job.name!r} names GPU {r}, but the cluster has ranks "
                                    f"0..{num_gpus - 1}")
                if r in used:
                    raise SpecError(f"{where}: GPU {r} is given to both {used[r]!r} and {job.name!r}")
                used[r] = job.name
            out.append(job.gpus)
        else:
            out.append(None)
    for i, job in enumerate(jobs):
        if out[i] is None:
            free = [r for r in range(num_gpus) if r not in used][: job.gpus]  # type: ignore[misc]
            if len(free) < job.gpus:  # type: ignore[operator]
                raise SpecError(f"{where}: job {job.name!r} needs {job.gpus} GPUs but only {len(free)} are free")
            for r in free:
                used[r] = job.name
            out[i] = tuple(free)
    return [g for g in out if g is not None]


def job_view(topology: Topology, gpus: Sequence[int], name: str) -> Topology:
    """The cluster as one job sees it (module docstring): its GPUs ranked 0..n−1 in order,
    every other GPU turned into a switch with the same ``transit`` flag."""
    graph = topology.graph.copy()
    local = {topology.node_of(r): i for i, r in enumerate(gpus)}
    for node in topology.gpus:
        data = graph.nodes[node]
        if node in local:
            data["rank"] = local[node]
        else:
            transit = data["transit"]
            data.clear()
            data.update(kind="switch", transit=transit)
    return Topology(graph, name=f"{topology.name}[{name}]", meta=dict(topology.meta, job=name))


#: Task-graph meta key: nodes a job's generator added to its view of the cluster (its
#: parameter servers), renamed ``<job>/<node>`` in the cluster (:func:`with_job_nodes`).
JOB_NODES = "job_nodes"


def with_job_nodes(topology: Topology, added: Sequence[tuple[str, Topology, Sequence[str]]]) -> Topology:
    """``topology`` plus the nodes each ``(job, the job's generated topology, its added nodes)``
    brought, renamed ``<job>/<node>``, with their links (to the same cluster nodes)."""
    if not any(nodes for _, _, nodes in added):
        return topology
    graph = topology.graph.copy()
    for job, own, nodes in added:
        rename = {n: f"{job}/{n}" for n in nodes}
        for n in nodes:
            graph.add_node(rename[n], **own.graph.nodes[n])
            for m in own.graph.adj[n]:
                graph.add_edge(rename[n], rename.get(m, m), **own.graph.edges[n, m])
    return Topology(graph, name=topology.name, dims=topology.dims, meta=topology.meta)


def merge_graphs(name: str, parts: Sequence[tuple[str, TaskGraph, Sequence[int]]]) -> TaskGraph:
    """One graph of every ``(job, graph, global ranks)`` (module docstring for the renaming)."""
    folded = [job for job, graph, _ in parts if graph.fold is not None]
    if folded:
        raise WorkloadError(f"cluster {name!r}: job {folded[0]!r} has a folded task graph (replica "
                            "folding); jobs sharing a cluster are merged rank by rank, so generate "
                            "them without fold")
    merged = TaskGraph(name, meta={"jobs": [p[0] for p in parts], "generator": "dessim.workload.multijob",
                                   # what the jobs' exposed communication is computed from
                                   "tp_closed_form_groups": sum(g.meta.get("tp_closed_form_groups", 0)
                                                                for _, g, _ in parts),
                                   "stage_merged": any(g.meta.get("stage_merged") for _, g, _ in parts)})
    for job, graph, ranks in parts:
        to_global = list(ranks)
        owned = set(graph.meta.get(JOB_NODES, ()))
        for t in graph:
            merged.add(dataclasses.replace(
                t, id=f"{job}/{t.id}", rank=to_global[t.rank],
                peer=to_global[t.peer] if t.peer >= 0 else -1,
                group=tuple(to_global[g] for g in t.group),
                coll_id=f"{job}/{t.coll_id}" if t.coll_id else "",
                mem_node=f"{job}/{t.mem_node}" if t.mem_node in owned else t.mem_node,
                attrs=dict(t.attrs, job=job)))
        for a, b in graph.edges():
            merged.depend(f"{job}/{a}", f"{job}/{b}")
        merged.kernel_mix.update({f"{job}/{tid}": mix for tid, mix in graph.kernel_mix.items()})
    return merged


def _unfolded(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A job's overrides with replica folding off unless the job asks for it: graphs are merged
    rank by rank (:func:`merge_graphs`), so the automatic choice (on where it applies) must be
    off in a cluster; an explicit ``fold: true`` still meets merge_graphs' clear error."""
    if "fold" in overrides or "fold" in (overrides.get("generator") or {}):
        return dict(overrides)
    return {**overrides, "fold": False}


@dataclass
class JobResult:
    """One job's iteration alone and shared, seconds."""

    name: str
    workload: str
    gpus: tuple[int, ...]
    alone_s: float
    shared_s: float
    exposed_comm_alone_s: dict[str, float]
    exposed_comm_shared_s: dict[str, float]

    @property
    def slowdown(self) -> float:
        """``shared / alone``; NaN when the job was not simulated alone (``alone=False``)."""
        if self.alone_s != self.alone_s:
            return float("nan")
        return self.shared_s / self.alone_s if self.alone_s > 0 else 1.0

    def summary(self) -> dict[str, Any]:
        """The figures; ``alone_s`` and ``slowdown`` are None when the job did not run alone."""
        ran = self.alone_s == self.alone_s
        return {"name": self.name, "workload": self.workload, "gpus": list(self.gpus),
                "alone_s": self.alone_s if ran else None,
                "shared_s": self.shared_s, "slowdown": self.slowdown if ran else None,
                "exposed_comm_alone_s": self.exposed_comm_alone_s,
                "exposed_comm_shared_s": self.exposed_comm_shared_s}


@dataclass
class ClusterResult:
    """Every job's figures and the shared simulation (timelines: ``simulation``)."""

    name: str
    topology: Topology
    jobs: list[JobResult]
    simulation: SimulationResult
    taskgraph: TaskGraph

    def summary(self) -> dict[str, Any]:
        return {"cluster": self.name, "topology": self.topology.name, "gpus": self.topology.num_gpus,
                "makespan_s": self.simulation.makespan_s, "jobs": [j.summary() for j in self.jobs],
                "calibration": self.simulation.meta.get("collectives", {}).get("calibration"),
                "collectives": self.simulation.collectives(),
                "tasks": len(self.taskgraph), "events": self.simulation.events, "wall_s": self.simulation.wall_s}


def _job_figures(sim: SimulationResult, graph: TaskGraph, ranks: Sequence[int], own: TaskGraph,
                 job: str) -> tuple[float, dict[str, float]]:
    """A job's iteration and exposed communication by category, as its workload summary
    computes them (:func:`~dessim.workload.common.figures.exposed_comm`): the end of its last
    task, or the steady state of a graph of several iterations (parameter servers,
    :func:`~dessim.workload.common.figures.steady_iteration_s`; exposure per iteration).
    ``graph`` is the merged graph ``sim`` ran, ``own`` the job's own."""
    steady = steady_iteration_s(sim, own, f"{job}/")
    k = len(own.meta.get(ITERATION_MARKS) or ()) or 1
    exposed = {c: v / k for c, v in sorted(exposed_comm(sim, graph, ranks).items())}
    return (max(sim.ranks[r].end_s for r in ranks) if steady is None else steady), exposed


def cluster_topology(topology: Topology | str, storage: Mapping[str, Any] | None, options: EngineOptions,
                     where: str) -> Topology:
    """The cluster's topology: loaded, with its ``storage:`` tier, calibrated (before the jobs'
    views are cut). A :class:`Topology` that already went through here is returned as is."""
    if isinstance(topology, Topology) and topology.meta.get("cluster_prepared"):
        return topology
    try:
        topo = load_topology(topology)
    except DessimError as exc:
        raise type(exc)(f"{where}: topology: {exc}") from None
    if storage:
        try:
            topo = attach_storage(topo, **dict(storage))
        except TypeError:
            raise SpecError(f"{where}: storage: unknown key in {sorted(storage)}; valid: kind, bw, lat, "
                            "attach, client_bw, name") from None
    topo = calibrated_topology(topo, options.calibration)
    return Topology(topo.graph, name=topo.name, dims=topo.dims, meta={**topo.meta, "cluster_prepared": True})


def simulate_cluster(cluster: ClusterSpec | str | Path, *, topology: Topology | str | None = None,
                     options: EngineOptions | None = None, alone: bool = True) -> ClusterResult:
    """Simulate every job of ``cluster`` together (and each alone unless ``alone=False``);
    ``topology`` and ``options`` replace the file's."""
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    where = f"cluster {spec.name!r}" + (f" ({spec.origin})" if spec.origin else "")
    if options is None:
        options = EngineOptions.of(spec.engine, where, record_links=False)
    topo = cluster_topology(topology if topology is not None else spec.topology, spec.storage, options, where)
    gpu_sets = assign_gpus(spec.jobs, topo.num_gpus, where)
    parts = []
    owned: list[tuple[str, Topology, list[str]]] = []
    for job, gpus in zip(spec.jobs, gpu_sets):
        view = job_view(topo, gpus, job.name)
        try:
            gen = generate_workload(job.workload, view, overrides=_unfolded(job.overrides), options=options)
        except DessimError as exc:
            raise type(exc)(f"{where}: job {job.name!r}: {exc}") from None
        nodes = [n for n in gen.topology.graph.nodes if n not in view.graph]
        if any(gen.topology.kind(n) != "param_server" for n in nodes):
            raise SpecError(f"{where}: job {job.name!r} attaches its own storage tier; give it to the cluster "
                            "instead (cluster key 'storage:' or storage nodes in the topology)")
        gen.graph.meta[JOB_NODES] = nodes
        parts.append((job.name, gen.graph, gpus))
        owned.append((job.name, gen.topology, nodes))
    topo = with_job_nodes(topo, owned)
    merged = merge_graphs(spec.name, parts)
    shared = simulate(merged, topo, options)
    results = []
    for (name, graph, gpus), job in zip(parts, spec.jobs):
        end_shared, exp_shared = _job_figures(shared, merged, gpus, graph, name)
        if alone:
            solo_graph = merge_graphs(name, [(name, graph, gpus)])
            end_alone, exp_alone = _job_figures(simulate(solo_graph, topo, options), solo_graph, gpus, graph, name)
        else:
            end_alone, exp_alone = float("nan"), {}
        results.append(JobResult(name, str(job.workload if isinstance(job.workload, (str, Path))
                                           else getattr(job.workload, "name", "?")),
                                 tuple(gpus), end_alone, end_shared, exp_alone, exp_shared))
    return ClusterResult(spec.name, topo, results, shared, merged)
