"""The task-graph JSON file format (version 1).

.. code-block:: json

    {
      "format": "dessim.taskgraph",
      "version": 1,
      "name": "two-rank example",
      "meta": {},
      "tasks": [
        {"id": "r0.fwd", "rank": 0, "kind": "compute", "duration": "10us"},
        {"id": "r0.ar", "rank": 0, "kind": "collective", "op": "allreduce", "size": "64MiB",
         "group": [0, 1], "coll_id": "grad", "deps": ["r0.fwd"]}
      ]
    }

Each task object holds the :class:`~dessim.taskgraph.model.Task` fields that differ from
their defaults, plus ``deps`` (ids of tasks it waits for). Tasks are listed in program
order: a stream runs its tasks in the order they appear. On reading, ``duration`` accepts
times with units (``"10us"``), ``size`` and ``bytes`` sizes with units (``"64MiB"``) and
``flops`` plain numbers or compute amounts; numbers are SI (s, bytes, FLOP). The writer
always writes plain SI numbers. Unknown keys are errors naming the task and the valid keys.
A folded graph (:mod:`dessim.taskgraph.fold`) also holds ``"fold": {"dims": [...], "perm":
[[...], ...]}``: one permutation of the ranks per lane, lane 0 the identity.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from dessim.errors import DessimError, SpecError, TaskGraphError
from dessim.resources import read_text
from dessim.taskgraph.fold import Fold
from dessim.taskgraph.model import Task, TaskGraph
from dessim.units import parse_count, parse_size, parse_time

__all__ = ["FORMAT", "VERSION", "taskgraph_to_dict", "taskgraph_from_dict", "save_taskgraph",
           "load_taskgraph"]

FORMAT = "dessim.taskgraph"
VERSION = 1

_TASK_KEYS = {f.name for f in fields(Task)} | {"deps"}
_TOP_KEYS = {"format", "version", "name", "meta", "tasks", "fold"}


def taskgraph_to_dict(graph: TaskGraph) -> dict[str, Any]:
    """The JSON-ready dict of ``graph`` (see the module docstring)."""
    tasks = []
    for t in graph:
        d = t.to_dict()
        deps = graph.deps(t.id)
        if deps:
            d["deps"] = deps
        tasks.append(d)
    out = {"format": FORMAT, "version": VERSION, "name": graph.name, "meta": graph.meta,
           "tasks": tasks}
    if graph.fold is not None:
        out["fold"] = graph.fold.to_dict()
    return out


def _convert(key: str, value: Any, where: str) -> Any:
    if key == "duration":
        return None if value is None else parse_time(value, f"{where} duration")
    if key in ("size", "bytes"):
        return float(parse_size(value, f"{where} {key}")) if isinstance(value, str) else value
    if key == "flops" and isinstance(value, str):
        return float(parse_count(value, f"{where} flops"))
    if key in ("rank", "peer", "tag") and not (isinstance(value, int) and not isinstance(value, bool)):
        raise TaskGraphError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def taskgraph_from_dict(data: dict[str, Any], source: str = "<dict>") -> TaskGraph:
    """Build and validate a :class:`TaskGraph` from its JSON dict; errors name ``source``."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a task graph file holds a JSON object, not {type(data).__name__}")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SpecError(f"{source}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                        f"{', '.join(sorted(_TOP_KEYS))}")
    if data.get("format", FORMAT) != FORMAT:
        raise SpecError(f"{source}: format is {data.get('format')!r}, expected {FORMAT!r}")
    if data.get("version", VERSION) != VERSION:
        raise SpecError(f"{source}: task-graph version {data.get('version')!r} is not supported "
                        f"(this dessim reads version {VERSION})")
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        raise SpecError(f"{source}: 'tasks' must be a list of task objects")
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise SpecError(f"{source}: 'meta' must be an object, got {meta!r}")
    graph = TaskGraph(name=str(data.get("name", Path(source).stem)), meta=meta)
    pending: list[tuple[str, list[str]]] = []
    try:
        if data.get("fold") is not None:
            graph.fold = Fold.from_dict(data["fold"])
        for i, raw in enumerate(tasks):
            if not isinstance(raw, dict):
                raise TaskGraphError(f"task #{i} is not an object")
            where = f"task #{i} ({raw.get('id', '?')!r})"
            unknown = set(raw) - _TASK_KEYS
            if unknown:
                raise TaskGraphError(f"{where}: unknown key {sorted(unknown)[0]!r}; valid keys: "
                                     f"{', '.join(sorted(_TASK_KEYS))}")
            for key in ("id", "rank", "kind"):
                if key not in raw:
                    raise TaskGraphError(f"{where}: missing {key!r}")
            kwargs = {k: _convert(k, v, where) for k, v in raw.items() if k != "deps"}
            try:
                task = Task(**kwargs)
            except TypeError as exc:  # wrong value types reaching the dataclass
                raise TaskGraphError(f"{where}: {exc}") from None
            graph.add(task)
            deps = raw.get("deps", [])
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                raise TaskGraphError(f"{where}: deps must be a list of task ids (strings), got {deps!r}")
            pending.append((task.id, deps))
        for tid, deps in pending:
            for d in deps:
                if d not in graph:
                    raise TaskGraphError(f"task {tid!r} depends on unknown task {d!r}")
                graph.depend(d, tid)
        graph.validate()
    except DessimError as exc:
        raise type(exc)(f"{source}: {exc}") from None
    return graph


def save_taskgraph(graph: TaskGraph, path: str | Path) -> Path:
    """Write ``graph`` as JSON (deterministic: same graph, same bytes)."""
    path = Path(path)
    path.write_text(json.dumps(taskgraph_to_dict(graph), indent=1, sort_keys=False) + "\n")
    return path


def load_taskgraph(path: str | Path) -> TaskGraph:
    """Read and validate a task-graph JSON file."""
    path = Path(path)
    text = read_text(path, "task graph")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = ("; a task graph is the JSON 'dessim simulate --save-graph' writes, a workload "
                "file runs with 'dessim simulate'" if path.suffix.lower() in (".yaml", ".yml") else "")
        raise SpecError(f"task graph {str(path)!r}: not valid JSON (line {exc.lineno}, column "
                        f"{exc.colno}: {exc.msg}){hint}") from None
    except (ValueError, RecursionError) as exc:   # an integer with too many digits, nesting
        raise SpecError(f"task graph {str(path)!r}: not valid JSON ({exc})") from None
    return taskgraph_from_dict(data, str(path))
