"""Task graphs: what every rank does, as tasks with dependencies.

A :class:`TaskGraph` is the common currency of dessim: the workload generators produce one,
the Chakra reader converts traces into one, and the engine replays one on a topology.

Tasks (:class:`Task`) — every task runs on one ``rank`` (a GPU) and one named ``stream``;
a stream runs its tasks one at a time **in the order they were added to the graph**
(program order, like a CUDA stream). A task starts when all its dependencies are done
and its stream is free. Kinds (:data:`TASK_KINDS`):

``compute``
    A kernel. Either ``duration`` (s) is given, or ``flops`` (FLOP) and ``bytes`` (bytes
    moved to/from HBM) are given and the engine's device model costs it (``kernel`` says
    which efficiency applies: ``matmul``, ``attention``, ``elementwise``, ``norm``, ...,
    with ``shape`` (m, n, k) for matmuls).
``collective``
    One rank's part of a collective: ``op``, ``size`` (bytes, nccl-tests semantics),
    ``group`` (ranks), ``algo`` (``auto`` default) and ``coll_id``: every member of
    ``group`` has exactly one task with that ``coll_id`` and they must agree on op, size,
    group and algo. ``attrs["algo_options"]`` (:data:`ALGO_OPTIONS`), a mapping, is passed
    to that algorithm as its options (rail: ``network_share``, ``nvlink_share``, ``nvlink_first``,
    ``pipeline_chunks``); ignored when the engine
    forces another algorithm.
``send`` / ``recv``
    A point-to-point transfer of ``size`` bytes to/from ``peer`` with a ``tag``. The k-th
    send from a to b with tag t matches the k-th recv on b from a with tag t. A transfer
    begins when both sides have started (rendezvous, as NCCL does).
``memcpy``
    A memory move of ``size`` bytes between the rank's HBM and the memory node
    ``mem_node`` of the topology (host DRAM or a CXL expander), ``direction`` ``to_hbm``
    or ``from_hbm``; it runs over the links that join them. In a folded graph each lane
    image copies to and from its own nearest node of ``mem_node``'s kind, which must be the
    rank's nearest one (:mod:`dessim.engine.memlanes`).
``delay``
    A plain wait of ``duration`` seconds (host-side work, data loading, ...).

``category`` labels a task for the summaries (e.g. ``tp``, ``dp``, ``pp``, ``ep``,
``fwd``, ``bwd``, ``optimizer``); ``name`` is a free label shown in timelines.
Dependencies are edges ``before -> after``; they may cross ranks.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import networkx as nx

from dessim.errors import TaskGraphError
from dessim.taskgraph.collector import collector_paused
from dessim.taskgraph.fold import Fold
from dessim.taskgraph.rows import Rows

__all__ = ["TASK_KINDS", "COMM_KINDS", "DEFAULT_STREAM", "ALGO_OPTIONS", "Task", "TaskGraph", "kernel_mix", "brief_ranks",
           "pair_p2p", "make_row_task"]

#: Valid task kinds.
TASK_KINDS: tuple[str, ...] = ("compute", "collective", "send", "recv", "memcpy", "delay")
#: The kinds that move data between devices (:attr:`Task.is_comm`): the engine counts their
#: time as communication, every other kind's as compute.
COMM_KINDS: frozenset[str] = frozenset(("collective", "send", "recv", "memcpy"))

#: The stream a task runs on when it names none.
DEFAULT_STREAM: dict[str, str] = {
    "compute": "compute", "delay": "compute", "collective": "comm",
    "send": "comm", "recv": "comm", "memcpy": "mem",
}

#: Fields each kind requires (beyond id, rank, kind).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "compute": (), "delay": ("duration",),
    "collective": ("op", "size", "group", "coll_id"),
    "send": ("peer", "size"), "recv": ("peer", "size"),
    "memcpy": ("size", "mem_node", "direction"),
}

MEMCPY_DIRECTIONS = ("to_hbm", "from_hbm")

#: Key of a collective task's ``attrs`` holding its algorithm's options (module docstring).
ALGO_OPTIONS = "algo_options"


@dataclass(slots=True)
class Task:
    """One task of a task graph (see the module docstring for the kinds and units)."""

    id: str
    rank: int
    kind: str
    stream: str = ""
    name: str = ""
    category: str = ""
    # compute / delay
    duration: float | None = None      #: seconds (compute: overrides the device model)
    flops: float = 0.0                 #: FLOP of a compute task
    bytes: float = 0.0                 #: HBM bytes read + written by a compute task
    kernel: str = ""                   #: device-model efficiency class of a compute task
    shape: tuple[int, ...] = ()        #: (m, n, k) of a matmul
    # communication
    size: float = 0.0                  #: bytes of a collective / send / recv / memcpy
    op: str = ""                       #: collective operation
    algo: str = "auto"                 #: collective algorithm
    group: tuple[int, ...] = ()        #: collective members (global ranks)
    coll_id: str = ""                  #: matches the members' tasks of one collective
    peer: int = -1                     #: send: destination rank; recv: source rank
    tag: int = 0                       #: send/recv matching tag
    mem_node: str = ""                 #: memcpy: topology node holding the far memory
    direction: str = ""                #: memcpy: to_hbm | from_hbm
    attrs: dict[str, Any] = field(default_factory=dict)  #: free-form extras (kept in JSON)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TaskGraphError(f"task ids must be non-empty strings, got {self.id!r}")
        if self.kind not in TASK_KINDS:
            raise TaskGraphError(f"{self._where}: unknown kind {self.kind!r}; valid kinds: "
                                 f"{', '.join(TASK_KINDS)}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise TaskGraphError(f"{self._where}: rank must be an integer >= 0, got {self.rank!r}")
        if not self.stream:
            self.stream = DEFAULT_STREAM[self.kind]
        self.group = tuple(self.group)
        self.shape = tuple(self.shape)
        self._check_fields()

    @property
    def _where(self) -> str:
        return f"task {self.id!r}"

    def _check_fields(self) -> None:
        # the common case in one expression (generators add ~10^6 tasks); the loops below
        # find what is wrong
        if not (type(self.stream) is str and type(self.kernel) is str and type(self.op) is str
                and type(self.algo) is str and type(self.coll_id) is str
                and type(self.mem_node) is str and type(self.direction) is str):
            for name in ("stream", "kernel", "op", "algo", "coll_id", "mem_node", "direction"):
                value = getattr(self, name)
                if not isinstance(value, str):
                    raise TaskGraphError(f"{self._where}: {name} must be a string, got {value!r}")
        for name in _REQUIRED[self.kind]:
            value = getattr(self, name)
            if value is None or value == "" or value == () or (name == "peer" and value == -1):
                raise TaskGraphError(f"{self._where}: a {self.kind} task needs {name!r}")
        if self.duration is not None and not self.duration >= 0:
            raise TaskGraphError(f"{self._where}: duration {self.duration!r} must be >= 0 seconds")
        if not (self.flops >= 0 and self.bytes >= 0 and self.size >= 0):
            for name in ("flops", "bytes", "size"):
                if not getattr(self, name) >= 0:
                    raise TaskGraphError(f"{self._where}: {name} {getattr(self, name)!r} must be >= 0")
        if self.kind == "compute" and self.duration is None and self.flops == 0 and self.bytes == 0:
            raise TaskGraphError(f"{self._where}: a compute task needs a duration, or flops and/or bytes "
                                 "for the device model")
        if self.kind in ("send", "recv") and self.peer == self.rank:
            raise TaskGraphError(f"{self._where}: {self.kind} to its own rank {self.rank}")
        if self.kind == "collective" and self.rank not in self.group:
            raise TaskGraphError(f"{self._where}: rank {self.rank} is not in its collective's group "
                                 f"{list(self.group)}")
        if self.kind == "collective" and len(set(self.group)) != len(self.group):
            raise TaskGraphError(f"{self._where}: group {list(self.group)} lists a rank twice")
        if self.kind == "memcpy" and self.direction not in MEMCPY_DIRECTIONS:
            raise TaskGraphError(f"{self._where}: direction {self.direction!r}; valid: "
                                 f"{', '.join(MEMCPY_DIRECTIONS)}")

    def derived(self, id: str, name: str) -> "Task":
        """A copy of this task with another ``id`` and ``name``, built without the field
        checks: every other field is this task's, already checked when it was made (a
        generator's template task, copied for each micro-batch). The copy shares ``attrs``;
        give it its own dict if it will differ. ``id`` must be a non-empty string."""
        return _derive(self, id, name)

    @property
    def is_comm(self) -> bool:
        """True for tasks that move data between devices (:data:`COMM_KINDS`)."""
        return self.kind in COMM_KINDS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict holding only the fields that differ from their defaults."""
        out: dict[str, Any] = {"id": self.id, "rank": self.rank, "kind": self.kind}
        for f in fields(self):
            if f.name in out:
                continue
            value = getattr(self, f.name)
            if f.name == "stream" and value == DEFAULT_STREAM[self.kind]:
                continue
            if f.name == "attrs":
                if value:
                    out["attrs"] = value
                continue
            if value == _DEFAULTS[f.name]:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Task) if f.name != "attrs"}


def _make_derive() -> Any:
    """``derive(proto, id, name)``: a new :class:`Task` with ``proto``'s fields but ``id``
    and ``name``, as straight-line slot stores (no ``__init__``/``__post_init__``): about a
    tenth of a checked construction, which generators pay per task (docs/performance.md,
    step 19)."""
    lines = ["def derive(p, id, name):", "    t = new(Task)"]
    for f in fields(Task):
        lines.append(f"    t.{f.name} = {f.name}" if f.name in ("id", "name") else f"    t.{f.name} = p.{f.name}")
    lines.append("    return t")
    namespace: dict[str, Any] = {"new": object.__new__, "Task": Task}
    exec("\n".join(lines), namespace)
    return namespace["derive"]


_derive = _make_derive()


def kernel_mix(kinds: Iterable[str], seconds: Iterable[float]) -> tuple[tuple[str, float], ...]:
    """Seconds summed by kernel kind, sorted by kind (:attr:`TaskGraph.kernel_mix`)."""
    out: dict[str, float] = {}
    for k, s in zip(kinds, seconds):
        out[k] = out.get(k, 0.0) + s
    return tuple(sorted(out.items()))


def brief_ranks(ranks: Sequence[int], limit: int = 8) -> str:
    """A rank list for messages: in full up to ``limit`` ranks, else its first two, its last
    and its size (``[0, 2, ..., 254] (128 ranks)``), so a message about a 16,384-rank group
    stays one line."""
    ranks = list(ranks)
    if len(ranks) <= limit:
        return str(ranks)
    return f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}] ({len(ranks)} ranks)"


def pair_p2p(tasks: Iterable[Task], fold: Fold | None) -> list[tuple[Task, Task]]:
    """The (send, recv) pairs of ``tasks`` (in graph order; the others are ignored): the k-th
    send from a to b with tag t and the k-th recv on b from a with tag t, compared up to a
    lane in a folded graph (:meth:`Fold.canonical_pair`). Raises :class:`TaskGraphError` on a
    size mismatch or an unmatched task (:meth:`TaskGraph.match_p2p`)."""
    sends: dict[tuple[int, int, int], list[Task]] = {}
    recvs: dict[tuple[int, int, int], list[Task]] = {}
    pair = (lambda a, b: (a, b)) if fold is None else fold.canonical_pair
    for t in tasks:
        if t.kind == "send":
            sends.setdefault((*pair(t.rank, t.peer), t.tag), []).append(t)
        elif t.kind == "recv":
            recvs.setdefault((*pair(t.peer, t.rank), t.tag), []).append(t)
    pairs: list[tuple[Task, Task]] = []
    for key in sends.keys() | recvs.keys():
        s_list, r_list = sends.get(key, []), recvs.get(key, [])
        for s, r in zip(s_list, r_list):
            if s.size != r.size:
                raise TaskGraphError(f"send {s.id!r} ({s.size:g} B) and its recv {r.id!r} "
                                     f"({r.size:g} B) disagree on the size")
            pairs.append((s, r))
        src, dst, tag = key
        if len(s_list) > len(r_list):
            extra = s_list[len(r_list)]
            raise TaskGraphError(f"send {extra.id!r} (rank {src} -> {dst}, tag {tag}) has no "
                                 f"matching recv on rank {dst}")
        if len(r_list) > len(s_list):
            extra = r_list[len(s_list)]
            raise TaskGraphError(f"recv {extra.id!r} (rank {dst} from {src}, tag {tag}) has no "
                                 f"matching send on rank {src}")
    return pairs


def make_row_task(rows: Rows, k: int) -> Task:
    """Task ``k`` of run ``rows``, as :meth:`TaskGraph.add_rows` makes it (module docstring
    of :mod:`dessim.taskgraph.rows`)."""
    proto, label, c = rows.template.rows[k][:3]
    task = _derive(proto, f"{rows.prefix}{rows.first + k}", label + rows.suffix)
    if c is not None:
        task.attrs = dict(proto.attrs)      # each its own, as one by one
        if c[2] is None:
            task.tag = rows.bases[c[0]] + c[1]
        else:
            task.coll_id = c[2] + str(rows.bases[c[0]] + c[1])
    return task


class Checked(NamedTuple):
    """What :meth:`TaskGraph.validate` found: {send id: recv id} and each collective's member
    tasks in group order (:meth:`TaskGraph.match_p2p`, :meth:`TaskGraph.collectives`)."""

    p2p: dict[str, str]
    collectives: dict[str, list[Task]]


class TaskGraph:
    """A task graph: :class:`Task` objects and their dependencies (edges ``before -> after``).

    Tasks keep insertion order, which is the program order of each stream. Build with
    :meth:`add` and :meth:`depend`, then call :meth:`validate` (the engine and the file
    reader do).

    Storage is a compact adjacency: one dict of tasks by id, and per task the ids it waits
    for and the ids waiting for it, each in the order the edges were added (an edge added
    twice is kept once). Generators add hundreds of thousands of tasks, and a networkx
    ``DiGraph`` spent about a third of their time and most of the graph's memory on per-node
    and per-edge attribute dicts that nothing read (issue 17's generation profile,
    docs/performance.md). :meth:`as_networkx` gives a ``DiGraph`` view for analysis.

    A generator may :meth:`defer` the building to the graph's first read and add a pass's
    copies as runs of rows (:meth:`add_rows`, :mod:`dessim.taskgraph.rows`); the tasks made
    then keep their dependents implicit until something asks for them (``_succ_from``).
    Either way every query answers as if each task had been added by :meth:`add`.
    """

    def __init__(self, name: str = "taskgraph", meta: dict[str, Any] | None = None,
                 fold: Fold | None = None) -> None:
        self.name = name
        self.meta: dict[str, Any] = dict(meta or {})
        self._tasks: dict[str, Task] = {}
        #: task id -> the ids it waits for / that wait for it, in edge order (dict as an
        #: ordered set, or a tuple of distinct ids for a task of a run of rows until a
        #: :meth:`depend` adds to it; absent = none)
        self._pred: dict[str, dict[str, None] | tuple[str, ...]] = {}
        self._succ: dict[str, dict[str, None]] = {}
        #: None: ``_succ`` holds every edge. Else the insertion position from which tasks
        #: were made by a deferred graph's :meth:`_flush` without adding themselves to their
        #: dependencies' ``_succ`` — every one of their edges added after all edges before
        #: and in insertion order, so walking their ``_pred`` in order appends them as
        #: :meth:`add` would have (:meth:`_sync_succ`; :meth:`index_adjacency` reads them so
        #: without making the dicts: the engine never needs them)
        self._succ_from: int | None = None
        self._edges = 0
        #: the task added last, and whether some dependency may point backwards in insertion
        #: order: :meth:`add` only makes a task wait for tasks already there, so while no
        #: :meth:`depend` call made an earlier task wait for a later one, insertion order is a
        #: topological order and the graph has no cycle (:meth:`_check_cycles`)
        self._last_added: str | None = None
        self._backward = False
        #: Replica folding (:mod:`dessim.taskgraph.fold`): the tasks are those of
        #: representative ranks, each standing for its images in every lane. None = unfolded.
        self.fold = fold
        self._kernel_mix: dict[str, tuple[tuple[str, float], ...]] = {}
        #: deferred building (:meth:`defer`): what was added and not yet made, in order —
        #: ``(0, task, deps)``, ``(1, rows, None)``, ``(2, task id, kernel mix)``; None: not
        #: deferring. ``_deferred`` counts the tasks in it.
        self._pending: list[tuple[int, Any, Any]] | None = None
        self._deferred = 0

    @property
    def kernel_mix(self) -> dict[str, tuple[tuple[str, float], ...]]:
        """Seconds by device-model kernel kind (``matmul``, ``attention.flash2.fwd``, ``norm``,
        ...) of a compute task that runs several kernels (``kernel="layer"``), as its
        generator costed them: the engine splits the task's time by these shares
        (:attr:`dessim.engine.result.RankTimes.compute_by_kernel`). Kept in memory only
        (not in task-graph files); a task without an entry counts under its ``kernel``.
        Builders set entries with :meth:`set_kernel_mix` (deferred with the tasks)."""
        if self._pending:
            self._flush()
        return self._kernel_mix

    def set_kernel_mix(self, task_id: str, mix: tuple[tuple[str, float], ...]) -> None:
        """Set ``task_id``'s :attr:`kernel_mix` entry (after the task, when deferring)."""
        if self._pending is not None:
            self._pending.append((2, task_id, mix))
        else:
            self._kernel_mix[task_id] = mix

    # ------------------------------------------------------------------ deferred building
    def defer(self) -> None:
        """Build lazily from now on: :meth:`add`, :meth:`add_rows` and :meth:`set_kernel_mix`
        only record what they are given, in order; the first read of the graph (any query,
        :meth:`depend`, :attr:`kernel_mix`) makes it, as the same calls made one by one would
        have — the same tasks, edges in the same order, the same errors (raised then, not by
        the call that caused them). For generators, whose graphs are read once they are
        complete (a :class:`~dessim.taskgraph.rows.Rows` run then costs one record, not a
        ``Task``, an id, a name and two dict entries per task: docs/performance.md,
        "Generation: pass runs")."""
        if self._pending is None:
            self._pending = []

    def add_rows(self, rows: Rows) -> None:
        """Add a run of copies of a :class:`~dessim.taskgraph.rows.RowTemplate` (its module
        docstring says which tasks): as many :meth:`add` calls, one per task in run order."""
        if self._pending is not None:
            self._pending.append((1, rows, None))
            self._deferred += rows.template.size
        else:
            self._make_rows(rows)

    def make(self) -> "TaskGraph":
        """Make what a deferred graph (:meth:`defer`) holds now rather than at its first
        read (e.g. before its objects are frozen out of the collector's passes); the graph."""
        if self._pending:
            self._flush()
        return self

    def _flush(self) -> None:
        """Make what was deferred (:meth:`defer`), in order; stays deferring after."""
        pending = self._pending
        assert pending is not None
        self._pending = None          # the calls below add at once
        if self._succ_from is None:
            self._succ_from = len(self._tasks)      # edges from here on: in _pred only
        try:
            with collector_paused():  # 10^5-10^6 new objects (dessim.taskgraph.collector)
                mix = self._kernel_mix
                for code, a, b in pending:
                    if code == 0:
                        self.add(a, b)
                    elif code == 1:
                        self._make_rows(a)
                    else:
                        mix[a] = b
        finally:
            self._pending = []
            self._deferred = 0

    def _make_rows(self, rows: Rows) -> None:
        """The tasks of run ``rows``, with the same fields and edges (in the same order) as
        :meth:`add` called for each in turn — the entry task through :meth:`add` itself (its
        inputs are checked and may repeat). The others wait only for earlier tasks of the
        run, which are distinct, known and not themselves, so their edges are set directly
        (``_pred`` a tuple); while ``_succ`` is lazy (``_succ_from``, always so in a flush)
        nothing else, else a task's dependents inside the run, known from the template, and
        tasks added later append theirs after them (key order, as :meth:`add` leaves it)."""
        tpl = rows.template
        tasks, pred, succ, mix = self._tasks, self._pred, self._succ, self._kernel_mix
        prefix, suffix, bases, entry = rows.prefix, rows.suffix, rows.bases, tpl.entry
        ids = [f"{prefix}{n}" for n in range(rows.first, rows.first + tpl.size)]
        if not tasks.keys().isdisjoint(ids):
            raise TaskGraphError(f"duplicate task id {next(t for t in ids if t in tasks)!r}")
        derive = _derive
        lazy = self._succ_from
        edges = 0
        k = 0
        for proto, label, c, refs, after, m in tpl.rows:
            tid = ids[k]
            task = derive(proto, tid, label + suffix)
            if c is not None:
                task.attrs = dict(proto.attrs)      # each its own, as one by one
                if c[2] is None:
                    task.tag = bases[c[0]] + c[1]
                else:
                    task.coll_id = c[2] + str(bases[c[0]] + c[1])
            if after and lazy is None:
                succ[tid] = {ids[x]: None for x in after}
            if k == entry:
                self.add(task, [ids[r] for r in refs] + list(rows.inputs))
            else:
                tasks[tid] = task
                if refs:
                    pred[tid] = (ids[refs[0]],) if len(refs) == 1 else tuple([ids[r] for r in refs])
                    edges += len(refs)
            if m:
                mix[tid] = m
            k += 1
        self._edges += edges
        if ids:
            self._last_added = ids[-1]

    # ------------------------------------------------------------------ building
    def add(self, task: Task, deps: Iterable[str] = ()) -> Task:
        """Add ``task`` (after its ``deps``, which must already be in the graph)."""
        if self._pending is not None:
            self._pending.append((0, task, list(deps)))
            self._deferred += 1
            return task
        tasks = self._tasks
        tid = task.id
        if tid in tasks:
            raise TaskGraphError(f"duplicate task id {tid!r}")
        preds = dict.fromkeys(deps)     # first occurrences, in order (an edge is kept once)
        self._last_added = tid
        if not preds:
            tasks[tid] = task
            return task
        if not preds.keys() <= tasks.keys():    # an unknown id: name it as depend() does
            tasks[tid] = task
            for d in preds:
                self.depend(d, tid)
        # the same edges, in the same order, as depend() one by one: the task is new, so no
        # edge exists yet and none is a self-dependency
        tasks[tid] = task
        self._pred[tid] = preds
        self._edges += len(preds)
        if self._succ_from is not None:     # added to the dependencies' _succ when needed
            return task
        succ = self._succ
        for d in preds:
            s = succ.get(d)
            if s is None:
                succ[d] = {tid: None}
            else:
                s[tid] = None
        return task

    def _sync_succ(self) -> None:
        """Add the edges of the tasks made since ``_succ_from`` to ``_succ``, in insertion
        order and each task's dependencies in order: the order :meth:`add` adds them in."""
        start = self._succ_from
        if start is None:
            return
        succ, pred = self._succ, self._pred
        for tid in islice(self._tasks, start, None):
            for d in pred.get(tid, ()):
                s = succ.get(d)
                if s is None:
                    succ[d] = {tid: None}
                else:
                    s[tid] = None
        self._succ_from = None

    def depend(self, before: str, after: str) -> None:
        """Make ``after`` wait for ``before`` (again: no change)."""
        if self._pending:
            self._flush()
        tasks = self._tasks
        if before not in tasks or after not in tasks:
            unknown = before if before not in tasks else after
            raise TaskGraphError(f"dependency {before!r} -> {after!r}: unknown task {unknown!r}")
        if before == after:
            raise TaskGraphError(f"task {before!r} depends on itself")
        if after != self._last_added:       # ``before`` may come later than ``after``
            self._backward = True
        self._sync_succ()                   # this edge comes after every one there is
        preds = self._pred.get(after)
        if preds is None:
            preds = self._pred[after] = {}
        elif before in preds:
            return
        elif type(preds) is tuple:          # a run's task: now an ordered set to add to
            preds = self._pred[after] = dict.fromkeys(preds)
        preds[before] = None
        succs = self._succ.get(before)
        if succs is None:
            self._succ[before] = {after: None}
        else:
            succs[after] = None
        self._edges += 1

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._tasks) + self._deferred

    def __iter__(self) -> Iterator[Task]:
        if self._pending:
            self._flush()
        return iter(self._tasks.values())

    def __contains__(self, task_id: object) -> bool:
        if self._pending:
            self._flush()
        try:
            return task_id in self._tasks
        except TypeError:       # an unhashable value is no task id (as networkx answers)
            return False

    def task(self, task_id: str) -> Task:
        if self._pending:
            self._flush()
        try:
            return self._tasks[task_id]
        except KeyError:
            raise TaskGraphError(f"unknown task {task_id!r}") from None

    def deps(self, task_id: str) -> list[str]:
        """The ids ``task_id`` waits for, in the order the dependencies were added."""
        self.task(task_id)
        return list(self._pred.get(task_id, ()))

    def dependents(self, task_id: str) -> list[str]:
        """The ids waiting for ``task_id``, in the order the dependencies were added."""
        self.task(task_id)
        self._sync_succ()
        return list(self._succ.get(task_id, ()))

    def positions(self) -> dict[str, int]:
        """A new dict of every task's insertion position (``enumerate(graph)``'s numbers)."""
        if self._pending:
            self._flush()
        return dict(zip(self._tasks, range(len(self._tasks))))

    def index_adjacency(self, index: dict[str, int], positional: bool = False,
                        ) -> tuple[list[list[int]], list[int]]:
        """For every task in insertion order, the ``index`` numbers of its dependents (in the
        order the dependencies were added, as :meth:`dependents`) and how many tasks it waits
        for (``len(deps(id))``): the engine's set-up in one pass, without a list of ids per
        task. When ``index`` numbers the tasks by insertion position (:meth:`positions`;
        checked unless the caller says so with ``positional``), the dependents of tasks made
        by a deferred graph are read from their dependencies, without making the
        dependents' dicts (``_succ_from``)."""
        if self._pending:
            self._flush()
        succ, pred, tasks = self._succ, self._pred, self._tasks
        none: dict[str, None] = {}
        start = self._succ_from
        if start is not None and not positional and not (len(index) == len(tasks) and all(
                index.get(tid) == i for i, tid in enumerate(tasks))):
            self._sync_succ()
            start = None
        if start is None:
            after = [[index[s] for s in succ.get(tid, none)] for tid in tasks]
        else:       # edges before ``start`` from _succ, then the rest in the order add() keeps
            after = [[index[s] for s in succ.get(tid, none)] for tid in islice(tasks, start)]
            after += [[] for _ in range(len(tasks) - start)]
            i = start
            for tid in islice(tasks, start, None):
                for d in pred.get(tid, none):
                    after[index[d]].append(i)
                i += 1
        waits = [len(pred.get(tid, none)) for tid in tasks]
        return after, waits

    def has_dependency(self, before: str, after: str) -> bool:
        """Whether ``after`` waits for ``before`` directly."""
        if self._pending:
            self._flush()
        return before in self._pred.get(after, ())

    def edges(self) -> Iterator[tuple[str, str]]:
        """Every dependency ``(before, after)``: tasks in insertion order, each one's
        dependents in the order they were added."""
        if self._pending:
            self._flush()
        self._sync_succ()
        succ = self._succ
        for before in self._tasks:
            for after in succ.get(before, ()):
                yield before, after

    @property
    def num_dependencies(self) -> int:
        if self._pending:
            self._flush()
        return self._edges

    def as_networkx(self) -> nx.DiGraph:
        """The graph as a new ``networkx.DiGraph`` (node attribute ``task``), for analysis."""
        if self._pending:
            self._flush()
        g = nx.DiGraph()
        g.add_nodes_from((tid, {"task": t}) for tid, t in self._tasks.items())
        g.add_edges_from(self.edges())
        return g

    @property
    def ranks(self) -> list[int]:
        return sorted({t.rank for t in self})

    @property
    def num_ranks(self) -> int:
        """1 + the highest rank any task names (as a task's rank, peer or group member)."""
        hi = -1
        for t in self:
            hi = max(hi, t.rank, t.peer, max(t.group, default=-1))
        return hi + 1

    # ------------------------------------------------------------------ validation
    def validate(self, num_ranks: int | None = None) -> "Checked":
        """Check the graph; raise :class:`TaskGraphError` naming the first bad task. Returns
        what the checks found (the send/recv pairs and the collectives' members), so that a
        caller needing them does not compute them again.

        Checks: no cycle; every send has its recv (same ranks, tag, size) and vice versa;
        the members of each collective agree on op, size, group and algo and each has exactly
        one task; with ``num_ranks``, no task, peer or group member names a rank >= num_ranks.
        Folded graphs: one representative per orbit, the fold covers every rank, every group
        member is a task's rank or an image of one. (A folded ``memcpy``'s lanes need the
        topology: the engine checks them, :mod:`dessim.engine.memlanes`.)
        """
        self._check_cycles()
        if self.fold is not None:       # first: a fold's rank count names a mismatch plainly
            self._check_fold(num_ranks)
        if num_ranks is not None:
            self._check_ranks(num_ranks)
        return Checked(self.match_p2p(), self.collectives())

    def _check_cycles(self) -> None:
        """Kahn's topological sort, linear in tasks + dependencies; if tasks remain, every one
        of them waits for another remaining one, so walking back along waits names a cycle.
        Nothing to sort when every dependency points forward in insertion order (see
        ``_backward``): that order is then a topological one."""
        if self._pending:
            self._flush()
        if not self._backward:
            return
        self._sync_succ()
        pending = {tid: len(p) for tid, p in self._pred.items()}
        ready = [tid for tid in self._tasks if tid not in pending]
        succ = self._succ
        done = 0
        while ready:
            tid = ready.pop()
            done += 1
            for s in succ.get(tid, ()):
                left = pending[s] - 1
                pending[s] = left
                if not left:
                    ready.append(s)
        if done == len(self._tasks):
            return
        left_over = {tid for tid, n in pending.items() if n}
        start = next(tid for tid in self._tasks if tid in left_over)
        path, seen = [start], {start: 0}
        while True:
            prev = next(p for p in self._pred[path[-1]] if p in left_over)
            if prev in seen:
                ids = path[seen[prev]:][::-1]       # before -> after order, shown from the
                order = {tid: i for i, tid in enumerate(self._tasks) if tid in set(ids)}
                first = min(range(len(ids)), key=lambda i: order[ids[i]])
                ids = ids[first:] + ids[:first]     # member added first
                break
            seen[prev] = len(path)
            path.append(prev)
        shown = " -> ".join(ids[:6]) + (" -> ..." if len(ids) > 6 else "") + f" -> {ids[0]}"
        raise TaskGraphError(f"dependency cycle: {shown}")

    def _check_ranks(self, num_ranks: int) -> None:
        for t in self:
            if t.rank < num_ranks and t.peer < num_ranks and (not t.group or max(t.group) < num_ranks):
                continue                # the common case, without a list per task
            bad = [r for r in (t.rank, t.peer, *t.group) if r >= num_ranks]
            if bad:
                raise TaskGraphError(f"task {t.id!r} names rank {bad[0]}, but the topology has "
                                     f"only {num_ranks} GPUs (ranks 0..{num_ranks - 1})")

    def _check_fold(self, num_ranks: int | None) -> None:
        fold = self.fold
        assert fold is not None
        if num_ranks is not None and fold.num_ranks != num_ranks:
            raise TaskGraphError(f"the graph has {fold.num_ranks} ranks but the topology has {num_ranks} "
                                 f"GPUs (the graph is replica-folded: it replays on exactly {fold.num_ranks} "
                                 "GPUs; save it again for this topology, or unfolded with "
                                 "'dessim simulate --exact')")
        fold.check_representatives(sorted({t.rank for t in self}))

    def match_p2p(self) -> dict[str, str]:
        """Pair sends with recvs; return {send id: recv id} (and raise on any mismatch). In a
        folded graph pairs are compared up to a lane (:meth:`Fold.canonical_pair`)."""
        return {s.id: r.id for s, r in pair_p2p(self, self.fold)}

    def collectives(self) -> dict[str, list[Task]]:
        """Group collective tasks by ``coll_id`` (checking agreement); members in group order."""
        by_id: dict[str, list[Task]] = {}
        for t in self:
            if t.kind == "collective":
                by_id.setdefault(t.coll_id, []).append(t)
        out: dict[str, list[Task]] = {}
        images: dict[tuple[int, ...], set[int]] = {}      # folded: ranks covered by representatives
        #: (rank, group) of single-member collectives already checked below: another one is
        #: checked alike (its rank's images cover the group) and its member list is itself
        covering: set[tuple[int, tuple[int, ...]]] = set()
        folded = self.fold is not None
        for cid, members in by_id.items():
            first = members[0]
            if len(members) == 1 and folded and (first.rank, first.group) in covering:
                out[cid] = [first]
                continue
            if len(members) == 1:       # a folded collective's representative: nothing to agree on
                by_rank: dict[int, Task] = {first.rank: first}
            else:
                by_rank = self._members_by_rank(cid, members)
            covered: Any = by_rank
            if self.fold is not None:
                reps = tuple(sorted(by_rank))
                covered = images.get(reps)
                if covered is None:
                    covered = images[reps] = set(self.fold.perm[:, list(reps)].ravel().tolist())
            missing = [r for r in first.group if r not in covered]
            if missing:
                raise TaskGraphError(f"collective {cid!r} (task {first.id!r}): group member rank "
                                     f"{missing[0]} has no task for it")
            out[cid] = [by_rank[r] for r in first.group if r in by_rank]
            if len(members) == 1 and folded and out[cid]:      # out[cid] == [first]
                covering.add((first.rank, first.group))
        return out

    @staticmethod
    def _members_by_rank(cid: str, members: list[Task]) -> dict[int, Task]:
        """Collective ``cid``'s member tasks by rank, after checking they agree on op, size,
        group and algo and that no rank has two."""
        first = members[0]
        for t in members[1:]:
            for attr in ("op", "size", "group", "algo"):
                if getattr(t, attr) != getattr(first, attr):
                    raise TaskGraphError(
                        f"collective {cid!r}: task {t.id!r} has {attr}={getattr(t, attr)!r} "
                        f"but task {first.id!r} has {attr}={getattr(first, attr)!r}")
        by_rank: dict[int, Task] = {}
        for t in members:
            if t.rank in by_rank:
                raise TaskGraphError(f"collective {cid!r}: rank {t.rank} has two tasks "
                                     f"({by_rank[t.rank].id!r} and {t.id!r})")
            by_rank[t.rank] = t
        return by_rank

    def __repr__(self) -> str:
        if self._pending:
            self._flush()
        return (f"TaskGraph({self.name!r}, tasks={len(self)}, "
                f"deps={self._edges})")
