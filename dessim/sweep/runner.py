"""Run a sweep: backends, a resumable journal, progress, and the results table.

Journal
    Every finished point is appended as one JSON line to ``<out>.journal.jsonl`` the moment
    its result reaches this process (flushed at once, fsynced at most every
    :data:`FSYNC_INTERVAL_S`), so a sweep killed at any instant (even ``kill -9``) loses at
    most the points being evaluated. A line torn by the kill is cut off when the journal is
    reopened. On start, points whose key (:func:`dessim.sweep.axes.point_key`) is in the
    journal with status ``ok`` or ``failed`` are not evaluated again; ``error`` points (bugs)
    are retried. The results table (``--out``, Parquet or CSV; columns, nulls, units and
    recorded inputs: :mod:`dessim.sweep.table`) is rewritten from the journal at the end of
    every run; keep the journal beside it to resume or extend a sweep.

Backends (:data:`BACKENDS`)
    ``local`` — this machine: in-process with 1 worker, else a ``concurrent.futures`` process
    pool with the spawn start method (safe with threads and on every OS). ``dask`` — a
    ``distributed`` cluster (``address``) or a LocalCluster of ``workers`` processes
    (``processes: false`` for threads). ``ray`` — a Ray cluster (``address``) or a local
    Ray of ``workers`` CPUs. All run :func:`dessim.sweep.points.evaluate_task` on the same
    plain-data tasks, and the table is ordered by point index, so results do not depend on
    the backend or the number of workers (only the host-time column ``eval_wall_s`` does).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from dessim.errors import SweepError
from dessim.sweep.points import EVALUATORS, STATUS_ERROR, STATUS_OK, evaluate_task, make_task
from dessim.sweep.axes import Point
from dessim.sweep.spec import SweepSpec, load_sweep, parse_sweep
from dessim.sweep.table import FIXED_COLUMNS, WRITERS, records_to_table, write_table

__all__ = ["Backend", "BACKENDS", "Journal", "SweepResult", "run_sweep", "journal_path",
           "records_to_table", "write_table", "sweep_points", "WRITERS", "FIXED_COLUMNS",
           "FSYNC_INTERVAL_S"]

#: Longest time between two fsyncs of the journal (a power cut loses at most this much).
FSYNC_INTERVAL_S = 2.0
#: Tasks per process-pool submission: enough to amortise inter-process overhead, small
#: enough that results reach the journal and the progress bar often.
MAX_BATCH = 8


# ---------------------------------------------------------------- journal
def journal_path(out: str | Path) -> Path:
    """The journal that belongs to a results file: ``results.parquet.journal.jsonl``."""
    return Path(f"{out}.journal.jsonl")


class Journal:
    """Append-only JSON-lines log of finished points (see module doc)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = None
        self._last_sync = 0.0

    def read(self) -> dict[str, dict[str, Any]]:
        """Records by point key; later lines win; a torn or corrupt line is skipped."""
        records: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return records
        with self.path.open("r", encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and "key" in rec and "status" in rec:
                    records[rec["key"]] = rec
        return records

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # cut a line torn by a kill, so the next record starts clean
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                with self.path.open("r+b") as fh:
                    fh.truncate(data.rfind(b"\n") + 1)
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, record: Mapping[str, Any]) -> None:
        if self._file is None:
            self._open()
        self._file.write(json.dumps(record, default=str) + "\n")  # key order = column order
        self._file.flush()
        now = time.monotonic()
        if now - self._last_sync >= FSYNC_INTERVAL_S:
            os.fsync(self._file.fileno())
            self._last_sync = now

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


# ---------------------------------------------------------------- backends
def _evaluate_batch(tasks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [evaluate_task(t) for t in tasks]


def _run_local(tasks: list[dict], workers: int, options: Mapping[str, Any]) -> Iterator[dict]:
    if workers <= 1:
        for task in tasks:
            yield evaluate_task(task)
        return
    size = max(1, min(MAX_BATCH, len(tasks) // (workers * 4)))
    batches = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        pending = {pool.submit(_evaluate_batch, b) for b in batches}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield from fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_dask(tasks: list[dict], workers: int, options: Mapping[str, Any]) -> Iterator[dict]:
    from distributed import Client, LocalCluster, as_completed

    client, owned = options.get("client"), []
    if client is None:
        if options.get("address"):
            client = Client(options["address"])
        else:
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1,
                                   processes=bool(options.get("processes", True)),
                                   dashboard_address=None)
            owned.append(cluster)
            client = Client(cluster)
        owned.insert(0, client)
    try:
        futures = client.map(evaluate_task, tasks, pure=False)
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        for obj in owned:
            obj.close()


def _run_ray(tasks: list[dict], workers: int, options: Mapping[str, Any]) -> Iterator[dict]:
    import ray

    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if options.get("address"):
            kwargs["address"] = options["address"]
        else:
            kwargs["num_cpus"] = max(1, workers)
        ray.init(**kwargs)
    try:
        remote = ray.remote(evaluate_task)
        refs = [remote.remote(t) for t in tasks]
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class Backend:
    """Where points run: ``run(tasks, workers, options)`` yields records as they finish."""

    name: str
    help: str
    run: Callable[[list[dict], int, Mapping[str, Any]], Iterator[dict]]
    requires: str | None = None   #: module that must import
    extra: str | None = None      #: pip extra that provides it

    def check(self) -> None:
        if self.requires is None:
            return
        try:
            __import__(self.requires)
        except ImportError:
            raise SweepError(f"backend {self.name!r} needs {self.requires}: "
                             f"pip install 'dessim[{self.extra}]'") from None


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("local", "process pool on this machine (default)", _run_local),
    Backend("dask", "Dask distributed: LocalCluster or address=tcp://...", _run_dask,
            "distributed", "dask"),
    Backend("ray", "Ray: local or address=ray://...", _run_ray, "ray", "ray"),
)}


# ---------------------------------------------------------------- results
@dataclass
class SweepResult:
    """A finished (or partly finished) sweep."""

    spec: SweepSpec
    table: pd.DataFrame               #: one row per finished point, by index
    points: int                       #: points in the sweep (after expansion)
    evaluated: int                    #: points evaluated by this run
    reused: int                       #: points taken from the journal
    out: Path | None = None
    journal: Path | None = None
    written: list[str] = field(default_factory=list)

    @property
    def metric(self) -> str:
        return self.spec.analysis.metric or EVALUATORS[self.spec.kind].default_metric

    @property
    def pending(self) -> int:
        return self.points - len(self.table)

    def ok(self) -> pd.DataFrame:
        return self.table[self.table["status"] == STATUS_OK]

    def failed(self) -> pd.DataFrame:
        return self.table[self.table["status"] != STATUS_OK]


# ---------------------------------------------------------------- the run
def _as_spec(spec: SweepSpec | str | Path | Mapping[str, Any]) -> SweepSpec:
    if isinstance(spec, SweepSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_sweep(spec)
    return load_sweep(spec)


def sweep_points(spec: SweepSpec) -> list[Point]:
    """All points of the sweep, after the evaluator's expansion (``parallelism: auto``)."""
    points = spec.points()
    evaluator = EVALUATORS[spec.kind]
    if spec.auto_parallelism and evaluator.expand is not None:
        points = evaluator.expand(spec, points)
    return points


def same_configuration(tasks: Sequence[Mapping[str, Any]], evaluator) -> dict[str, list[Mapping[str, Any]]]:
    """Tasks grouped by identical configuration once the evaluator's ``canonical`` hook has
    dropped the settings that cannot matter (e.g. a memory expansion nothing is offloaded
    to): the first task's key → the other tasks of its group. Only first tasks are run."""
    firsts: dict[str, str] = {}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for task in tasks:
        config = evaluator.canonical(task["config"]) if evaluator.canonical else task["config"]
        ident = json.dumps(config, sort_keys=True, default=repr)
        first = firsts.setdefault(ident, task["key"])
        if first == task["key"]:
            groups[first] = []
        else:
            groups[first].append(task)
    return groups


def _with_copies(record: dict[str, Any], others: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    """The evaluated record, then one per task of the same configuration (no host time)."""
    yield record
    for task in others:
        yield {**record, "index": task["index"], "key": task["key"], "params": task["params"],
               "eval_wall_s": 0.0}


def run_sweep(spec: SweepSpec | str | Path | Mapping[str, Any], *, out: str | Path | None = None,
              workers: int = 1, backend: str = "local",
              backend_options: Mapping[str, Any] | None = None, progress: bool = False,
              max_points: int | None = None, resume: bool = True) -> SweepResult:
    """Run every point of ``spec`` (a SweepSpec, a YAML path or a parsed mapping).

    ``out``: results table (.parquet/.csv) with its journal beside it (module doc); without
    it nothing is written and nothing can be resumed. ``max_points``: evaluate at most that
    many new points (run a sweep in slices; the rest stays pending). ``resume=False``: ignore
    the journal and start over (the journal is replaced).
    """
    spec = _as_spec(spec)
    if backend not in BACKENDS:
        raise SweepError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if not isinstance(workers, int) or workers < 1:
        raise SweepError(f"workers must be a whole number >= 1, got {workers!r}")
    chosen = BACKENDS[backend]
    chosen.check()
    if out is not None and Path(out).suffix.lower() not in WRITERS:
        raise SweepError(f"results file {str(out)!r}: unknown format; use {' or '.join(WRITERS)}")
    points = sweep_points(spec)
    journal = Journal(journal_path(out)) if out is not None else None
    if journal is not None and not resume and journal.path.exists():
        journal.path.unlink()
    done = journal.read() if journal is not None else {}
    wanted = {p.key for p in points}
    records = {k: r for k, r in done.items() if k in wanted and r["status"] != STATUS_ERROR}
    todo = [p for p in points if p.key not in records]
    if max_points is not None:
        todo = todo[:max(0, max_points)]
    tasks = [make_task(spec.kind, spec.base, p) for p in todo]
    copies = same_configuration(tasks, EVALUATORS[spec.kind])
    tasks = [t for t in tasks if t["key"] in copies]
    reused = len(points) - len([p for p in points if p.key not in records])

    from tqdm import tqdm

    bar = tqdm(total=len(points), initial=reused, desc=spec.name, unit="pt", disable=not progress,
               file=sys.stderr, dynamic_ncols=True, smoothing=0.05)
    failures = sum(1 for r in records.values() if r["status"] != STATUS_OK)
    evaluated = 0
    try:
        if tasks:
            for evaluated_rec in chosen.run(tasks, workers, dict(backend_options or {})):
                for rec in _with_copies(evaluated_rec, copies[evaluated_rec["key"]]):
                    records[rec["key"]] = rec
                    evaluated += 1
                    if journal is not None:
                        journal.append(rec)
                    failures += rec["status"] != STATUS_OK
                    bar.update(1)
                if failures:
                    bar.set_postfix(failed=failures, refresh=False)
    finally:
        bar.close()
        if journal is not None:
            journal.close()
    table = records_to_table(points, records, spec.axis_paths)
    cost_error = None
    if spec.cost:
        from dessim.sweep.analysis import add_cost
        try:
            table = add_cost(table, spec.cost)
        except SweepError as exc:   # a cost column that no result has: keep the results
            cost_error = exc
    result = SweepResult(spec, table, len(points), evaluated, reused,
                         Path(out) if out is not None else None,
                         journal.path if journal is not None else None)
    if out is not None:
        result.written.append(str(write_table(table, out, spec)))
    if cost_error is not None:
        saved = f"; the results were written to {out} without cost" if out is not None else ""
        raise SweepError(f"{cost_error}{saved}")
    return result

