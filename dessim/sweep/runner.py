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

import contextlib
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from dessim.errors import DessimError, SweepError
from dessim.resources import check_limit, check_output, install_hint
from dessim.sweep.points import EVALUATORS, STATUS_ERROR, STATUS_OK, evaluate_task, make_task
from dessim.sweep.axes import Point
from dessim.sweep.spec import SweepSpec, load_sweep, parse_sweep
from dessim.sweep.table import FIXED_COLUMNS, TABLE_FORMATS, WRITERS, records_to_table, write_table

__all__ = ["Backend", "BACKENDS", "default_workers", "Journal", "SweepResult", "run_sweep", "journal_path",
           "records_to_table", "write_table", "check_results_path", "TABLE_FORMATS", "validate_sweep", "RESULT_FAILURES", "Terminated", "sweep_points", "WRITERS", "FIXED_COLUMNS",
           "FSYNC_INTERVAL_S"]

#: Error types of failed points that are results, not problems: a layout or memory
#: configuration that does not fit is what a sweep finds out (exit status 0).
RESULT_FAILURES: tuple[str, ...] = ("MemoryFitError",)
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
        with self.path.open("rb") as fh:
            for line in fh:
                try:
                    rec = json.loads(line.decode("utf-8"))
                except ValueError:          # not JSON, or bytes that are not UTF-8
                    continue
                if isinstance(rec, dict) and "key" in rec and "status" in rec:
                    records[rec["key"]] = rec
        return records

    def _open(self) -> None:
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


#: How often a worker checks that its parent is alive (seconds), where the OS cannot tell it.
PARENT_WATCH_S = 0.5


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the sweep process ends, however it ends.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the worker the moment
    its parent dies (even by ``kill -9``). Everywhere: a daemon thread polls the parent id
    and exits when it changes (the worker was re-parented). Ctrl-C is the parent's to handle:
    workers ignore SIGINT (no traceback per worker)."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:       # the parent died before this line
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dessim-parent-watch").start()


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a sweep: unwinds like Ctrl-C (workers stopped, journal closed)."""


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While a sweep runs in the main thread, SIGTERM raises :class:`Terminated`, so the
    sweep stops within a moment with its journal intact instead of dying mid-write."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_workers() -> int:
    """Processes for a local sweep when the user names none: the CPUs this process may run
    on (its affinity mask, e.g. a container's or ``taskset``'s share), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):        # not on Linux
        return max(1, os.cpu_count() or 1)


def _run_local(tasks: list[dict], workers: int, options: Mapping[str, Any]) -> Iterator[dict]:
    workers = min(workers, len(tasks))      # a process more than tasks would only start up
    if workers <= 1:
        for task in tasks:
            yield evaluate_task(task)
        return
    # points with a cost estimate come costliest first (run_sweep): one per submission, so
    # that the longest ones start at once on different workers
    hinted = any(t.get("cost") is not None for t in tasks)
    size = 1 if hinted else max(1, min(MAX_BATCH, len(tasks) // (workers * 4)))
    batches = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent, initargs=(os.getpid(),))
    finished = False
    try:
        pending = {pool.submit(_evaluate_batch, b) for b in batches}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield from fut.result()
        finished = True
    finally:
        if not finished:     # interrupted (Ctrl-C, SIGTERM, an error): stop the workers now
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)


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
                             f"{install_hint(self.extra)}") from None


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

    def problems(self) -> pd.DataFrame:
        """Points that failed for another reason than being a configuration that does not
        fit (:data:`RESULT_FAILURES`), or that hit a bug: the sweep did not do its job."""
        failed = self.failed()
        return failed[~failed["error_type"].isin(RESULT_FAILURES)]


def check_results_path(out: str | Path) -> Path:
    """Check, before any point runs, that the results table and its journal can be written
    (directory exists and is writable, format known, its extra installed)."""
    p = check_output(out, "sweep results file", TABLE_FORMATS)
    check_output(journal_path(p), "sweep journal")
    return p


# ---------------------------------------------------------------- the run
def _as_spec(spec: SweepSpec | str | Path | Mapping[str, Any]) -> SweepSpec:
    if isinstance(spec, SweepSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_sweep(spec)
    return load_sweep(spec)


def _planned_points(spec: SweepSpec) -> int:
    sizes = [len(a.values) for a in spec.axes]
    if not sizes:
        return 1
    return math.prod(sizes) if spec.mode == "grid" else max(sizes)


def validate_sweep(spec: SweepSpec, columns: Sequence[str] = ()) -> None:
    """Check the whole sweep before any point runs (:class:`~dessim.errors.SweepError`):
    its size against the ``sweep_points`` limit, every distinct configuration with the
    evaluator's ``precheck`` (workload and topology files, algorithm and op names, engine
    options), and the metric, ``group_by`` names and ``columns`` against what the points
    report. Points that are valid but do not fit or run stay results (status failed)."""
    check_limit("sweep_points", _planned_points(spec), f"{spec.source}: sweep")
    evaluator = EVALUATORS[spec.kind]
    points = spec.points()
    if evaluator.precheck is not None:
        seen: set[str] = set()
        problems: dict[str, list[str]] = {}      # message -> the points that have it
        for p in points:
            config = evaluator.config(spec.base, p.config_params)
            ident = json.dumps(config, sort_keys=True, default=repr)
            if ident in seen:
                continue
            seen.add(ident)
            try:
                evaluator.precheck(config)
            except DessimError as exc:
                params = ", ".join(f"{k}={v}" for k, v in p.params.items())
                problems.setdefault(str(exc), []).append(
                    f"point {p.index}{f' ({params})' if params else ''}")
        if problems:
            lines = [f"{ps[0]}{f' and {len(ps) - 1} more' if len(ps) > 1 else ''}: {msg}"
                     for msg, ps in list(problems.items())[:3]]
            raise SweepError(f"{spec.source}: invalid configuration, nothing was run:\n  "
                             + "\n  ".join(lines))
    if evaluator.metrics is None:
        return
    known = {*evaluator.metrics, *spec.axis_paths, *FIXED_COLUMNS, "eval_wall_s", "layout",
             "offload", *(("cost",) if spec.cost else ())}
    from dessim.sweep.analysis import cost_columns

    names = [("analysis.metric", spec.analysis.metric),
             *(("analysis.group_by", g) for g in spec.analysis.group_by or ()),
             *((f"cost.{c}", col) for c, col in cost_columns(spec.cost)),
             *(("column", c) for c in columns)]
    for what, name in names:
        if name is None or name in known or (isinstance(name, str) and
                                             name.split(".")[0] in evaluator.metrics):
            continue
        raise SweepError(f"{spec.source}: {what} {name!r} is not a metric or column of a "
                         f"{spec.kind} sweep; metrics: {', '.join(evaluator.metrics)}; axes: "
                         f"{', '.join(spec.axis_paths) or '(none)'}")


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
              max_points: int | None = None, resume: bool = True,
              columns: Sequence[str] = ()) -> SweepResult:
    """Run every point of ``spec`` (a SweepSpec, a YAML path or a parsed mapping).

    ``out``: results table (.parquet/.csv) with its journal beside it (module doc); without
    it nothing is written and nothing can be resumed. ``max_points``: evaluate at most that
    many new points (run a sweep in slices; the rest stays pending). ``resume=False``: ignore
    the journal and start over (the journal is replaced). ``columns``: further names
    (e.g. the report's group-by columns) checked with the metric before anything runs
    (:func:`validate_sweep`).
    """
    spec = _as_spec(spec)
    if backend not in BACKENDS:
        raise SweepError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if not isinstance(workers, int) or workers < 1:
        raise SweepError(f"workers must be a whole number >= 1, got {workers!r}")
    chosen = BACKENDS[backend]
    chosen.check()
    if out is not None:
        check_results_path(out)
    validate_sweep(spec, columns)
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
    # costliest first (longest processing time first): with several workers the last point
    # to finish is then a short one; a stable sort, so points without an estimate keep
    # their order (after those with one). Results do not depend on the order.
    tasks.sort(key=lambda t: -(t.get("cost") or 0.0))
    reused = len(points) - len([p for p in points if p.key not in records])

    from tqdm import tqdm

    bar = tqdm(total=len(points), initial=reused, desc=spec.name, unit="pt", disable=not progress,
               file=sys.stderr, dynamic_ncols=True, smoothing=0.05)
    failures = sum(1 for r in records.values() if r["status"] != STATUS_OK)
    evaluated = 0
    running = chosen.run(tasks, workers, dict(backend_options or {})) if tasks else iter(())
    try:
        with _sigterm_interrupts():
            for evaluated_rec in running:
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
        close = getattr(running, "close", None)
        if close is not None:
            close()         # an interrupted backend stops its workers now, not at GC
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

