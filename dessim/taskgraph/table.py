"""The engine's view of a task graph: its tasks as columns, in insertion order.

A replay reads, per task, its kind, rank, stream, given duration, the tasks waiting for it
and how many it waits for; it needs a whole :class:`~dessim.taskgraph.model.Task` only for
the tasks it plans or pairs (collectives, sends, receives, memory copies, and compute tasks
the device model costs) and for outputs. :func:`task_table` gives those columns.

Two ways to the same table:

* **From runs of rows.** A generator's deferred graph (:meth:`TaskGraph.defer
  <dessim.taskgraph.model.TaskGraph.defer>`) holds a pass's copy for one micro-batch as one
  :class:`~dessim.taskgraph.rows.Rows` record. Its columns are the template's, repeated (one
  C-level ``list.extend`` per record and column); the dependents of a run's task inside its
  run are the template's offsets (``succ_rel``) plus the run's first position
  (``succ_base``); those outside it (a later run's entry, a task added on its own) are listed
  in ``succ_extra``. No ``Task``, id or name is made per row: a ``Task`` is made when
  :attr:`TaskTable.tasks` is indexed, ids and names when an output asks
  (:meth:`TaskTable.records`). The graph itself stays deferred.
* **From tasks**, for every other graph (made, read, folded, or holding something the fast
  path does not take — then the graph is made, which raises what :meth:`TaskGraph.make
  <dessim.taskgraph.model.TaskGraph.make>` raises).

Either way the columns are those of the graph made task by task: the dependents of a task
in the order :meth:`TaskGraph.dependents <dessim.taskgraph.model.TaskGraph.dependents>`
gives them (by insertion position of the dependent: a graph whose every edge was added
with its later task — no backward edge — orders each task's dependents so), the streams'
queues in program order and first-appearance order, the same send/receive pairs and
collective members (:meth:`TaskTable.check`, with :meth:`TaskGraph.validate
<dessim.taskgraph.model.TaskGraph.validate>`'s checks). tests/test_task_table.py proves the
two ways equal, and the engine's results from them equal bit for bit
(docs/performance.md, "Generation: the engine reads rows").

Units: as :mod:`dessim.taskgraph.model` (seconds, bytes, FLOP).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Iterator, Sequence

import numpy as np

from dessim.taskgraph.model import COMM_KINDS, Task, TaskGraph, make_row_task, pair_p2p
from dessim.taskgraph.rows import Rows, RowTemplate

__all__ = ["TaskTable", "task_table"]

_DIGITS = "0123456789"

Stream = tuple[int, str]


def static_record(t: Task) -> tuple:
    """What an engine result's record and summaries read of ``t`` besides its id, name and
    times: (rank, stream, kind, category, bytes moved (size of a communication task, else
    HBM bytes), FLOP, op, peer, whether it communicates, its summary category (``category or
    kind``), its kernel class (``kernel or kind``))."""
    comm = t.kind in COMM_KINDS
    return (t.rank, t.stream, t.kind, t.category, float(t.size if comm else t.bytes),
            float(t.flops), t.op, t.peer, comm, t.category or t.kind, t.kernel or t.kind)


class _Columns:
    """A :class:`RowTemplate`'s columns (cached on it): per task of a run its kind, rank,
    stream key, given duration, dependents inside the run (offsets), how many tasks of the
    run it waits for, and its :func:`static_record` (made at the first result); per stream its tasks' offsets; the
    highest rank any task names; its numbered collective members by (slot, coll_id prefix):
    (slot, prefix, n-th of the slot of each, their offsets, their (rank, (op, size, group,
    algo))), and the others (offset, coll_id, (rank, ...)); the offsets of sends and
    receives; per task its kernel mix or None, and whether any task has one."""

    __slots__ = ("kinds", "ranks", "keys", "durations", "after", "waits", "statics",
                 "by_stream", "hi", "coll_groups", "loose", "p2p", "mixes", "mixed")

    def __init__(self, tpl: RowTemplate) -> None:
        protos = tpl.protos
        keys: dict[Stream, Stream] = {}
        self.kinds = [p.kind for p in protos]
        self.ranks = [p.rank for p in protos]
        self.keys = [keys.setdefault((p.rank, p.stream), (p.rank, p.stream)) for p in protos]
        self.durations = [p.duration for p in protos]
        self.after = [row[4] for row in tpl.rows]
        self.waits = [len(refs) for refs in tpl.deps]
        self.statics: list[tuple] | None = None     # made when a result first asks
        by: dict[Stream, list[int]] = {}
        for k, key in enumerate(self.keys):
            by.setdefault(key, []).append(k)
        self.by_stream = list(by.items())
        groups = {id(p.group): p.group for p in protos if p.group}     # a few shared tuples
        self.hi = max(max(self.ranks, default=-1), max((p.peer for p in protos), default=-1),
                      max((max(g) for g in groups.values()), default=-1))
        agree: dict[tuple, tuple] = {}
        groups: dict[tuple[int, str], tuple[list[int], list[int], list[tuple]]] = {}
        self.loose = []
        for k, (p, c) in enumerate(zip(protos, tpl.colls)):
            if p.kind == "collective":
                key = (p.op, p.size, p.group, p.algo)
                info = (p.rank, agree.setdefault(key, key))
                if c is not None and c[2] is not None:
                    ns, offs, infos = groups.setdefault((c[0], c[2]), ([], [], []))
                    ns.append(c[1])
                    offs.append(k)
                    infos.append(info)
                else:
                    self.loose.append((k, p.coll_id, info))
        self.coll_groups = [(slot, prefix, tuple(ns), offs, infos)
                            for (slot, prefix), (ns, offs, infos) in groups.items()]
        self.p2p = [k for k, p in enumerate(protos) if p.kind in ("send", "recv")]
        self.mixes = [m or None for m in tpl.mixes]
        self.mixed = any(tpl.mixes)


def _columns(tpl: RowTemplate) -> _Columns:
    cols = tpl.columns
    if cols is None:
        cols = tpl.columns = _Columns(tpl)
    return cols


class _Unusual(Exception):
    """The deferred records hold something the fast path does not take (the table is then
    built from the made graph, which raises what a bad graph raises)."""


class TaskTable:
    """Per-task columns of a graph in insertion order (module docstring).

    ``kinds``, ``ranks``, ``keys`` ((rank, stream)), ``durations`` (s or None), ``waits``
    (how many tasks each waits for); the dependents of task ``i`` are ``succ_base[i] + x``
    for ``x`` in ``succ_rel[i]``, then ``succ_extra.get(i, ())``; ``queues`` each stream's
    tasks in program order (streams in order of first appearance); ``tasks`` the tasks,
    each made when first indexed, and ``made`` the list of those made so far (None: not
    yet; ``made[i] or tasks[i]`` reads a task without a call once it is made)."""

    __slots__ = ("graph", "n", "kinds", "ranks", "keys", "durations", "waits", "succ_rel",
                 "succ_base", "succ_extra", "queues", "tasks", "rows_path", "_runs", "_starts",
                 "_direct", "_mixes", "_resolver", "_records", "_preds", "made")

    def __init__(self, graph: TaskGraph) -> None:
        self.graph = graph
        self._records: tuple | None = None
        self.rows_path = False
        if graph._pending and not graph._tasks and not graph._backward and graph.fold is None \
                and not graph._kernel_mix:
            try:
                self._from_rows(graph._pending)
                self.rows_path = True
                return
            except _Unusual:
                pass
        self._from_tasks(graph.make())

    # ------------------------------------------------------------------ building
    def _from_tasks(self, graph: TaskGraph) -> None:
        tasks = list(graph)
        index = graph.positions()
        succ, waits = graph.index_adjacency(index, positional=True)
        self.n = len(tasks)
        self.kinds = [t.kind for t in tasks]
        self.ranks = [t.rank for t in tasks]
        self.keys = [(t.rank, t.stream) for t in tasks]
        self.durations = [t.duration for t in tasks]
        self.waits = waits
        self.succ_rel = succ
        self.succ_base = [0] * len(tasks)
        self.succ_extra = {}
        queues: dict[Stream, list[int]] = {}
        for i, key in enumerate(self.keys):
            q = queues.get(key)
            if q is None:
                queues[key] = [i]
            else:
                q.append(i)
        self.queues = queues
        self.tasks = self.made = tasks
        self._resolver = index
        mix = graph.kernel_mix
        self._mixes = [mix.get(tid) for tid in index] if mix else None
        self._runs = self._starts = None
        self._direct = None

    def _from_rows(self, pending: list[tuple[int, Any, Any]]) -> None:
        kinds: list[str] = []
        ranks: list[int] = []
        keys: list[Stream] = []
        durations: list[float | None] = []
        waits: list[int] = []
        rel: list[Sequence[int]] = []
        base_col: list[int] = []
        extra: dict[int, list[int]] = {}
        queues: dict[Stream, list[int]] = {}
        runs: list[tuple[int, Rows, int]] = []     # (first position, run, record number)
        starts: list[int] = []
        direct: dict[int, Task] = {}
        direct_ids: dict[str, int] = {}
        by_prefix: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {}
        mix_writes: list[tuple[int, str, Any]] = []
        #: the dependencies outside its run of a run's entry, and of a task added on its own
        preds_of: dict[int, list[int]] = {}
        resolver = _Resolver(direct_ids, by_prefix)
        resolve = resolver.resolve
        none: tuple[int, ...] = ()
        pos = 0
        for rec, (code, a, b) in enumerate(pending):
            if code == 1:
                rows: Rows = a
                tpl = rows.template
                size = tpl.size
                if not size:
                    continue
                cols = _columns(tpl)
                prefix = rows.prefix
                if prefix[-1:] in _DIGITS and prefix:
                    raise _Unusual
                # inputs: tasks already there (not of this run; distinct, in order)
                inputs = _resolve_all(resolve, rows.inputs) if tpl.entry >= 0 else ()
                if inputs:
                    preds_of[pos + tpl.entry] = inputs
                firsts, spans = by_prefix.setdefault(prefix, ([], []))
                if spans and rows.first < spans[-1][1]:
                    raise _Unusual                  # out of order or overlapping: ids may repeat
                firsts.append(rows.first)
                spans.append((rows.first, rows.first + size, pos))
                runs.append((pos, rows, rec))
                starts.append(pos)
                kinds += cols.kinds
                ranks += cols.ranks
                keys += cols.keys
                durations += cols.durations
                rel += cols.after
                waits += cols.waits
                base_col += [pos] * size
                if inputs:
                    waits[pos + tpl.entry] += len(inputs)
                    _link(extra, inputs, pos + tpl.entry)
                for key, offs in cols.by_stream:
                    q = queues.get(key)
                    if q is None:
                        queues[key] = [pos + o for o in offs]
                    else:
                        q += [pos + o for o in offs]
                pos += size
            elif code == 0:
                task: Task = a
                if task.id in direct_ids:
                    raise _Unusual                  # a duplicate id (a run's: checked below)
                preds = _resolve_all(resolve, b)    # (unknown, or itself: _Unusual)
                preds_of[pos] = preds
                direct[pos] = task
                direct_ids[task.id] = pos
                kinds.append(task.kind)
                ranks.append(task.rank)
                key = (task.rank, task.stream)
                keys.append(key)
                durations.append(task.duration)
                rel.append(none)
                base_col.append(0)
                waits.append(len(preds))
                _link(extra, preds, pos)
                q = queues.get(key)
                if q is None:
                    queues[key] = [pos]
                else:
                    q.append(pos)
                pos += 1
            else:
                mix_writes.append((rec, a, b))
        resolver.runs_only = True
        for tid in direct_ids:          # a task added on its own whose id a run also holds
            if resolve(tid) is not None:
                raise _Unusual
        resolver.runs_only = False
        self.n = pos
        self.kinds, self.ranks, self.keys, self.durations = kinds, ranks, keys, durations
        self.waits, self.succ_rel, self.succ_base, self.succ_extra = waits, rel, base_col, extra
        self.queues = queues
        self._runs, self._starts, self._direct = runs, starts, direct
        self._preds = preds_of
        self._resolver = resolver
        self.tasks = _LazyTasks(self)
        self.made = self.tasks.made
        self._mixes = self._row_mixes(mix_writes)

    def _row_mixes(self, writes: list[tuple[int, str, Any]]) -> list | None:
        """Per position its kernel mix (None: none), as the made graph's
        :attr:`~dessim.taskgraph.model.TaskGraph.kernel_mix` holds it: a run's entries
        written with its tasks, each :meth:`set_kernel_mix` call in its turn, the last write
        wins."""
        runs, direct = self._runs, self._direct
        if not writes and not any(_columns(rows.template).mixed for _, rows, _ in runs):
            return None
        mixes: list = []
        none = [None]
        pos = 0
        j = 0
        while pos < self.n:             # the runs' entries, position by position
            if pos in direct:
                mixes += none
                pos += 1
                continue
            tpl = runs[j][1].template
            j += 1
            mixes += _columns(tpl).mixes
            pos += tpl.size
        for rec, tid, mix in writes:    # then each set_kernel_mix call, unless a run wrote later
            p = self._resolver.resolve(tid)
            if p is None:               # no task of the graph has this id
                continue
            if p not in direct:
                first, rows, run_rec = runs[bisect_right(self._starts, p) - 1]
                if run_rec > rec and rows.template.mixes[p - first]:
                    continue
            mixes[p] = mix
        return mixes

    # ------------------------------------------------------------------ reading
    def task(self, i: int) -> Task:
        """Task ``i`` (position), made as the made graph holds it."""
        direct = self._direct
        if direct is None:
            return self.tasks[i]
        got = direct.get(i)
        if got is not None:
            return got
        first, rows, _ = self._runs[bisect_right(self._starts, i) - 1]
        return make_row_task(rows, i - first)

    def position(self, task_id: str) -> int:
        """The position of task ``task_id`` (KeyError: no such task)."""
        p = self._resolver.get(task_id) if isinstance(self._resolver, dict) else \
            self._resolver.resolve(task_id)
        if p is None:
            raise KeyError(task_id)
        return p

    def positions(self) -> dict[str, int]:
        """A new dict of every task's position by id."""
        return dict(zip(self.records()[0], range(self.n)))

    def deps(self, i: int) -> list[int]:
        """The positions of the tasks task ``i`` waits for, in edge order
        (:meth:`TaskGraph.deps <dessim.taskgraph.model.TaskGraph.deps>`)."""
        if self._runs is None:
            graph = self.graph
            return [self._resolver[d] for d in graph.deps(self.tasks[i].id)]
        outside = self._preds.get(i, [])
        if i in self._direct:
            return list(outside)
        first, rows, _ = self._runs[bisect_right(self._starts, i) - 1]
        return [first + r for r in rows.template.deps[i - first]] + outside

    def dependents(self, i: int) -> list[int]:
        """The positions of the tasks waiting for task ``i``, in edge order."""
        b = self.succ_base[i]
        return [b + x for x in self.succ_rel[i]] + self.succ_extra.get(i, [])

    def mix(self, i: int) -> tuple[tuple[str, float], ...] | None:
        """Task ``i``'s kernel mix entry, or None."""
        return None if self._mixes is None else self._mixes[i]

    def records(self) -> tuple[list[str], list[str], list[tuple], list | None]:
        """Per task its id, its name for timelines (``name or id``), its
        :func:`static_record` and its kernel mix (None when no task has one): what an
        engine result records. Made once, run by run for runs of rows."""
        if self._records is not None:
            return self._records
        if self._runs is None:
            ids = [t.id for t in self.tasks]
            names = [t.name or t.id for t in self.tasks]
            statics = [static_record(t) for t in self.tasks]
        else:
            ids, names, statics = [], [], []
            direct = self._direct
            runs = self._runs
            j = 0
            pos = 0
            while pos < self.n:
                t = direct.get(pos)
                if t is not None:
                    ids.append(t.id)
                    names.append(t.name or t.id)
                    statics.append(static_record(t))
                    pos += 1
                    continue
                first, rows, _ = runs[j]
                j += 1
                tpl = rows.template
                prefix, suffix = rows.prefix, rows.suffix
                run_ids = [f"{prefix}{n}" for n in range(rows.first, rows.first + tpl.size)]
                ids += run_ids
                if suffix:
                    names += [label + suffix for label in tpl.labels]
                else:
                    names += tpl.labels
                if not all(names[first:]):
                    for k in range(first, len(names)):
                        names[k] = names[k] or ids[k]
                cols = _columns(tpl)
                if cols.statics is None:
                    cols.statics = [static_record(p) for p in tpl.protos]
                statics += cols.statics
                pos += tpl.size
        self._records = (ids, names, statics, self._mixes)
        return self._records

    # ------------------------------------------------------------------ validation
    def check(self, num_ranks: int | None = None) -> tuple[dict[int, int], dict[str, list[int]]]:
        """:meth:`TaskGraph.validate <dessim.taskgraph.model.TaskGraph.validate>` by
        position: {send: recv} and each collective's members in group order. Raises what
        ``validate`` raises (a graph this path doubts is made and validated)."""
        if self.rows_path:
            got = self._check_rows(num_ranks)
            if got is not None:
                return got
        graph = self.graph
        checked = graph.validate(num_ranks=num_ranks)
        index = graph.positions()
        return ({index[s]: index[r] for s, r in checked.p2p.items()},
                {cid: [index[t.id] for t in members] for cid, members in checked.collectives.items()})

    def _check_rows(self, num_ranks: int | None) -> tuple[dict[int, int], dict[str, list[int]]] | None:
        """The checks of ``validate`` on runs of rows; None when one fails (or may)."""
        direct, runs = self._direct, self._runs
        if num_ranks is not None:
            if any(_columns(rows.template).hi >= num_ranks for _, rows, _ in runs):
                return None
            if any(max(t.rank, t.peer, max(t.group, default=-1)) >= num_ranks for t in direct.values()):
                return None
        p2p: list[tuple[int, Task]] = []
        #: a collective's members that are not numbered by a run: coll_id -> (position,
        #: (rank, agreement key)) in graph order
        by_id: dict[str, list[tuple[int, tuple]]] = {}
        #: numbered members: (prefix, first number, n-th of each) -> per run holding them
        #: (its first position, their offsets, their (rank, agreement key))
        blocks: dict[tuple[str, int, tuple[int, ...]], list[tuple[int, list[int], list[tuple]]]] = {}
        pos = 0
        j = 0
        n = self.n
        while pos < n:
            t = direct.get(pos)
            if t is not None:
                if t.kind == "collective":
                    by_id.setdefault(t.coll_id, []).append(
                        (pos, (t.rank, (t.op, t.size, t.group, t.algo))))
                elif t.kind in ("send", "recv"):
                    p2p.append((pos, t))
                pos += 1
                continue
            first, rows, _ = runs[j]
            j += 1
            tpl = rows.template
            cols = _columns(tpl)
            bases = rows.bases
            for slot, prefix, ns, offs, infos in cols.coll_groups:
                key = (prefix, bases[slot], ns)
                got = blocks.get(key)
                if got is None:
                    blocks[key] = [(first, offs, infos)]
                else:
                    got.append((first, offs, infos))
            for k, cid, info in cols.loose:
                by_id.setdefault(cid, []).append((first + k, info))
            for k in cols.p2p:
                p2p.append((first + k, make_row_task(rows, k)))
            pos += tpl.size
        try:
            pairs = pair_p2p([t for _, t in p2p], None)
        except Exception:
            return None
        where = {id(t): p for p, t in p2p}
        matched = {where[id(s)]: where[id(r)] for s, r in pairs}
        colls = _block_members(blocks)
        if colls is None:
            return None
        for cid, members in by_id.items():
            key0 = members[0][1][1]
            group = key0[2]
            if len(members) != len(group) or cid in colls:
                return None
            by_rank = {}
            for p, (rank, key) in members:
                if key is not key0 and key != key0:
                    return None
                by_rank[rank] = p
            if len(by_rank) != len(group):
                return None
            colls[cid] = [by_rank[r] for r in group]
        return matched, colls


def _block_members(blocks: dict[tuple[str, int, tuple[int, ...]], list[tuple[int, list[int], list[tuple]]]],
                   ) -> dict[str, list[int]] | None:
    """The collectives numbered by runs, {coll_id: member positions in group order}, from
    ``blocks`` (:meth:`TaskTable._check_rows`): the runs of a block hold the same numbers, so
    its ``i``-th collective is the ``i``-th member of each. None when blocks of one prefix may
    share a number, or a collective's members disagree (on op, size, group or algorithm),
    repeat a rank or miss one: the made graph is validated then, and says which."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for prefix, base, ns in blocks:
        if base + min(ns) < 0 or prefix[-1:].isdigit():
            return None         # "tp-" + "3" is "tp" + "-3"; "a1" + "2" is "a" + "12"
        spans.setdefault(prefix, []).append((base + min(ns), base + max(ns)))
    for got in spans.values():
        got.sort()
        if any(b[0] <= a[1] for a, b in zip(got, got[1:])):
            return None
    # every coll_id below is then made once: prefix + str(number) decodes to (prefix,
    # number) when no prefix ends with a digit and no number is negative, and the blocks
    # of one prefix hold disjoint numbers
    orders: dict[tuple[int, ...], list[list[int]] | None] = {}
    colls: dict[str, list[int]] = {}
    for (prefix, base, ns), runs in blocks.items():
        sig = tuple(id(infos) for _, _, infos in runs)
        order = orders.get(sig, False)
        if order is False:
            order = orders[sig] = _group_orders([infos for _, _, infos in runs], len(ns))
        if order is None:
            return None
        firsts = [first for first, _, _ in runs]
        offs = [o for _, o, _ in runs]
        cids = [f"{prefix}{base + n}" for n in ns]
        perm = order[0]
        if all(p == perm for p in order):       # one group order: the block as one array
            at = (np.asarray(firsts)[:, None] + np.asarray(offs))[perm]
            colls.update(zip(cids, at.T.tolist()))
        else:
            colls.update((cid, [firsts[r] + offs[r][i] for r in p])
                         for i, (cid, p) in enumerate(zip(cids, order)))
    return colls


def _group_orders(infos: list[list[tuple]], count: int) -> list[list[int]] | None:
    """For each of ``count`` collectives with one member in each of the runs whose member
    (rank, agreement key) lists are ``infos``: the runs in the order of the group's ranks;
    None when some collective's members disagree, repeat a rank or miss one."""
    out = []
    for i in range(count):
        members = [run[i] for run in infos]
        key0 = members[0][1]
        group = key0[2]
        if len(members) != len(group) or any(key is not key0 and key != key0 for _, key in members):
            return None
        by_rank = {rank: r for r, (rank, _) in enumerate(members)}
        if len(by_rank) != len(group):
            return None
        out.append([by_rank[g] for g in group])
    return out


def _resolve_all(resolve: Any, ids: Sequence[str]) -> list[int]:
    """The positions of the distinct ``ids`` in order (:class:`_Unusual` if one is not a
    task added before)."""
    out = []
    for tid in dict.fromkeys(ids):
        p = resolve(tid)
        if p is None:
            raise _Unusual
        out.append(p)
    return out


def _link(extra: dict[int, list[int]], preds: Sequence[int], after: int) -> None:
    """Add ``after`` to the dependents of each of ``preds`` (``extra``, in edge order)."""
    for p in preds:
        got = extra.get(p)
        if got is None:
            extra[p] = [after]
        else:
            got.append(after)


class _Resolver:
    """Task id -> position over tasks added on their own and runs of rows (a run's ids are
    ``prefix + str(n)`` for ``n`` in its range; a prefix never ends with a digit here)."""

    __slots__ = ("direct", "by_prefix", "runs_only")

    def __init__(self, direct: dict[str, int],
                 by_prefix: dict[str, tuple[list[int], list[tuple[int, int, int]]]]) -> None:
        self.direct, self.by_prefix, self.runs_only = direct, by_prefix, False

    def resolve(self, tid: Any) -> int | None:
        if type(tid) is not str:
            return None
        if not self.runs_only:
            p = self.direct.get(tid)
            if p is not None:
                return p
        head = tid.rstrip(_DIGITS)
        got = self.by_prefix.get(head)
        num = tid[len(head):]
        if got is None or not num or (num[0] == "0" and len(num) > 1) or not num.isascii():
            return None
        n = int(num)
        firsts, spans = got
        j = bisect_right(firsts, n) - 1
        if j < 0:
            return None
        first, end, pos = spans[j]
        return pos + n - first if n < end else None


class _LazyTasks(Sequence):
    """A table's tasks by position, each made at its first reading and kept."""

    __slots__ = ("table", "made")

    def __init__(self, table: TaskTable) -> None:
        self.table = table
        self.made: list[Task | None] = [None] * table.n

    def __len__(self) -> int:
        return len(self.made)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self.made)))]
        t = self.made[i]
        if t is None:
            if i < 0:
                i += len(self.made)
            t = self.made[i] = self.table.task(i)
        return t

    def __iter__(self) -> Iterator[Task]:
        for i in range(len(self.made)):
            yield self[i]


def task_table(graph: TaskGraph) -> TaskTable:
    """The columns of ``graph`` an engine replay reads (module docstring)."""
    return TaskTable(graph)
