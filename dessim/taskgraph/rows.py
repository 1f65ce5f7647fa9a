"""Runs of tasks copied from one template, added to a task graph as one row each.

A workload generator emits the same program many times — a transformer pass on a rank is
the same ~100 tasks for every micro-batch, differing only in ids, names, collective ids and
the tasks the pass's first kernel waits for. :class:`RowTemplate` holds such a program once
(per task a checked prototype :class:`~dessim.taskgraph.model.Task`, its label, its
dependencies as offsets into the run); :meth:`TaskGraph.add_rows
<dessim.taskgraph.model.TaskGraph.add_rows>` adds one copy of it as a :class:`Rows` record
— a few fields, whatever the number of tasks — and the graph makes the tasks (ids, names,
``Task`` objects, dependency sets) when it is first read (docs/performance.md, "Generation:
pass runs"). The tasks made are those :meth:`TaskGraph.add` would have held had each been
added one by one, in order: tests/test_generation_rows.py proves it for the transformer
generator's graphs.

Conventions of a run (those of :class:`~dessim.workload.common.emitter.TaskEmitter`):

* task ``k`` of a run gets the id ``<prefix><first + k>`` (``prefix`` e.g. ``"r3."``) and the
  name ``labels[k] + suffix``;
* it waits for the run's tasks ``deps[k]`` (offsets < k, in order), then — the run's
  ``entry`` task only — for the run's ``inputs`` (ids of tasks already in the graph);
* a task with ``colls[k] = (slot, prefix)`` is numbered: its number is ``bases[slot] + n``,
  ``n`` counting the run's earlier tasks of that slot; a collective's member (``prefix`` a
  string) gets the ``coll_id`` ``prefix + str(number)``, a send or receive (``prefix``
  None) the ``tag`` number; either gets its own copy of the prototype's ``attrs``; the
  others share the prototype's;
* ``mixes[k]``, when not empty, is the task's :attr:`TaskGraph.kernel_mix` entry.

Units: as :mod:`dessim.taskgraph.model` (seconds, bytes, FLOP).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

__all__ = ["RowTemplate", "Rows"]


class RowTemplate:
    """A program of tasks copied run after run (module docstring). ``protos`` are checked
    tasks (their own ``id``, ``name`` and ``coll_id`` are placeholders); ``deps[k]`` offsets
    of earlier tasks of the run, each at most once; ``entry`` the task that also waits for a
    run's inputs (-1: none); ``colls[k]`` ``(slot, coll_id prefix or None for a tag)`` or
    None; ``mixes[k]``
    a kernel mix or ``()``."""

    __slots__ = ("protos", "labels", "deps", "entry", "colls", "mixes", "slots", "per_slot", "size",
                 "rows", "columns")

    def __init__(self, protos: Sequence[Any], labels: Sequence[str], deps: Sequence[Sequence[int]],
                 entry: int, colls: Sequence[tuple[int, str | None] | None],
                 mixes: Sequence[tuple[tuple[str, float], ...]]) -> None:
        n = len(protos)
        if not (len(labels) == len(deps) == len(colls) == len(mixes) == n):
            raise ValueError("RowTemplate: protos, labels, deps, colls and mixes differ in length")
        if not -1 <= entry < n:
            raise ValueError(f"RowTemplate: entry {entry} is not a task of the run")
        for k, refs in enumerate(deps):
            if any(not 0 <= r < k for r in refs) or len(set(refs)) != len(refs):
                raise ValueError(f"RowTemplate: task {k} waits for {list(refs)}: offsets must be "
                                 "earlier tasks of the run, each once")
        self.protos = tuple(protos)
        self.labels = tuple(labels)
        self.deps = tuple(tuple(r) for r in deps)
        self.entry = entry
        self.mixes = tuple(mixes)
        #: per task (slot, n-th of its slot in the run, coll_id prefix or None) or None
        seen: dict[int, int] = {}
        colls_n: list[tuple[int, int, str | None] | None] = []
        for c in colls:
            if c is None:
                colls_n.append(None)
                continue
            slot, prefix = c
            colls_n.append((slot, seen.get(slot, 0), prefix))
            seen[slot] = seen.get(slot, 0) + 1
        self.colls = tuple(colls_n)
        self.slots = max(seen, default=-1) + 1
        #: how many collectives of each slot one run holds
        self.per_slot = tuple(seen.get(s, 0) for s in range(self.slots))
        self.size = n
        #: per task (prototype, label, collective or None, offsets it waits for, offsets of
        #: the run's tasks waiting for it in run order, kernel mix): what making a run reads
        after: list[list[int]] = [[] for _ in range(n)]
        for k, refs in enumerate(self.deps):
            for r in refs:
                after[r].append(k)
        self.rows = tuple(zip(self.protos, self.labels, self.colls, self.deps,
                              (tuple(a) for a in after), self.mixes))
        #: the template's columns for an engine replay, made at its first one
        #: (:mod:`dessim.taskgraph.table`)
        self.columns: Any = None


class Rows(NamedTuple):
    """One run of a :class:`RowTemplate` (module docstring): task ``k`` is ``prefix +
    str(first + k)``, named ``labels[k] + suffix``; ``inputs`` the ids the entry task also
    waits for (none empty); ``bases`` the first collective number of each slot."""

    template: RowTemplate
    prefix: str
    first: int
    suffix: str
    inputs: tuple[str, ...]
    bases: tuple[int, ...]

    def task_id(self, k: int) -> str:
        """The id of the run's ``k``-th task."""
        return f"{self.prefix}{self.first + k}"
