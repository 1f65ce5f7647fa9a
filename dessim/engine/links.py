"""Per-link exclusivity of collectives (``Shortcuts.link_memo``).

The engine's collective memo (:mod:`dessim.engine.engine`) replays a collective that has the
network to itself: its run then depends on nothing but its own (op, size, group, algorithm),
so it is simulated once and replayed. Its test is network-wide — the collective is the only
network task running, and nothing can start before it would end. A pipeline of tensor-
parallel groups never passes it: every stage runs its own TP collectives at the same time,
on its own NVSwitch ports.

What a collective's run depends on is narrower: max-min rates are set per connected
component of flows coupled through shared channels (Bertsekas & Gallager §6.5.2), so a
collective none of whose channels carries another flow while it runs is as alone as on an
idle network. :class:`LinkProof` proves that for one collective task ``C`` at the instant
it starts:

* **Footprint.** Every network task of the graph has a set of channels its flows can ever
  use: the union, over its lane images and every ECMP choice (``Router.possible_hops``), of
  the routes of its transfers (a send: its pair; a collective: every transfer of its plans
  on every instance; a memcpy: each lane's GPU ↔ that lane's memory node,
  :mod:`dessim.engine.memlanes`). The *scope* of ``C`` is the tasks whose
  footprint meets ``C``'s.
* **Nothing in scope runs.** On every stream, the first unfinished task of the scope is not
  running — a send or receive that waits for its partner has no flow yet.
* **Nothing in scope starts before ``C`` ends** (replay; ``end = now + memoised duration``):
  each such first task, or for a send/receive its partner, provably cannot start before
  ``end``. A task starts once its stream's previous task and its dependencies are done, so a
  lower bound of its start is the longest path to it from what is running: a running compute
  task ends when it is due, a running network task no earlier than now, ``C`` at ``end``, a
  compute task not started lasts its (deterministic) duration. The bound must exceed
  ``end`` by a relative margin :data:`MARGIN`.
* **Recording** (the first run of a collective): ``C`` is simulated and memoised when no task
  of its scope ran at its start and none started while it ran (a watch on task starts); the
  bytes it carried are its channels' — other traffic elsewhere in the network finishes
  meanwhile.

**Several member tasks** (the collectives of an unfolded graph, or a folded data-parallel
group whose members are two pipeline stages, as under DualPipe): the run depends on the
members' arrival times as well, so it is recorded only when every member arrived at its
start, and replayed only when every member arrives in one instant (the engine decides at
the end of that instant); each member then ends when it did in the recorded run. The proof
skips every member's own stream position, and a task waiting for a member is bounded by
that member's end (:meth:`LinkProof.isolated`'s ``ends``).

A replay equals the simulated run up to the float rounding of its start time, as the
network-wide memo's does. The search is bounded (:data:`SEARCH_BUDGET` tasks per proof, and
:data:`ROUTE_BUDGET` routed pairs for the footprints of a run); past a bound the collective is
simulated, never replayed on an unproven assumption.
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Container, Protocol

import numpy as np

from dessim.collectives.schedule import CompactSchedule, FluidSchedule

__all__ = ["LinkProof", "MARGIN", "SEARCH_BUDGET", "ROUTE_BUDGET"]

#: A task in scope must not be able to start before ``end · (1 + MARGIN)``: far above the
#: rounding of a replayed end time, far below any compute task's duration.
MARGIN: float = 1e-9

#: Tasks one proof may visit in its backward search before it gives up (no replay).
SEARCH_BUDGET: int = 2_000

#: Routed (source, destination) pairs the footprints of one run may cost before the shortcut
#: turns itself off for the run (huge folded graphs: lanes × pairs). Footprints are routed
#: once per run, at its first proof, for every network task signature of the graph: the
#: 2,048-GPU deepseek-v3 needs 83,712 pairs (its 64-rank expert all-to-alls × 128 lanes'
#: pipeline sends), llama3-405b 20,480 and llama3-405b-cp16 102,400 (their cost:
#: docs/performance.md, step 25). Speed only: past it the collectives are simulated.
ROUTE_BUDGET: int = 250_000

#: The shortcut turns itself off for the run when fewer than :data:`MIN_REPLAY_FRACTION` of
#: a window of :data:`PROBE` decisions (collectives it was asked about) were replays: where
#: collectives rarely have their links to themselves (e.g. every lane's traffic crosses the
#: same spines) the footprints and proofs cost time and memory for nothing. Speed only.
PROBE: int = 500
MIN_REPLAY_FRACTION: float = 0.05

_NET = ("collective", "send", "recv", "memcpy")


class _Scope:
    """The tasks whose footprint meets a collective's channels, by stream."""

    __slots__ = ("members", "streams", "directions", "rows")

    def __init__(self, members: set[int], streams: dict[tuple, list[int]], directions: np.ndarray,
                 queues: dict[tuple, list[int]]):
        self.members = members          #: task indices in scope
        self.streams = streams          #: stream -> sorted queue positions of its tasks in scope
        self.directions = directions    #: bool per direction id: a channel of the collective
        #: per stream (in :attr:`streams` order): ``[stream, its queue, positions, cursor]``;
        #: the cursor is the first of ``positions`` not before the stream's head as last seen
        #: (heads only move forward, so it only moves forward: ``bisect_left`` amortised)
        self.rows = [[stream, queues[stream], positions, 0] for stream, positions in streams.items()]


class _Watch:
    """A collective being simulated for the memo: dirty once a task of its scope starts,
    other than its own member tasks (``own``: a collective of several member tasks, whose
    other members arrive after the first); ``dirty_at``: when that first happened (s)."""

    __slots__ = ("scope", "dirty", "own", "dirty_at")

    def __init__(self, scope: _Scope, own: frozenset[int] = frozenset()) -> None:
        self.scope, self.dirty, self.own, self.dirty_at = scope, False, own, math.inf


class EngineRun(Protocol):
    """What a :class:`LinkProof` reads of the engine's replay state (``dessim.engine.engine._Run``):
    the tasks in graph order with their dependencies, streams and times (s), the flow
    network and topology, and three questions the engine answers the same way for itself."""

    env: Any                        #: the simpy environment (``now``, s)
    graph: Any                      #: the :class:`~dessim.taskgraph.TaskGraph` being replayed
    table: Any                      #: its :class:`~dessim.taskgraph.table.TaskTable`
    tasks: list                     #: tasks in graph order
    start: Any                      #: start time of each task (s; NaN before it starts)
    end: Any                        #: end time of each task (s; NaN before it ends)
    head: Any                       #: stream -> position in its queue of its next task
    queues: dict                    #: stream -> its tasks' positions in program order
    stream_of: Any                  #: position -> stream key
    partner: Any                    #: send/recv position -> its matched partner
    fold: Any                       #: the graph's :class:`~dessim.taskgraph.Fold` or None
    net: Any                        #: the flow network (``router``, ``channels``)
    topology: Any                   #: the :class:`~dessim.topology.Topology`

    def memo_key(self, t: Any) -> tuple: ...
    def plan(self, t: Any, group: tuple[int, ...]) -> Any: ...
    def task_duration(self, t: Any) -> float: ...
    def memcpy_lanes(self, rank: int, mem_node: str) -> tuple[tuple[str, str], ...]: ...


class LinkProof:
    """Per-link exclusivity proofs for the collectives of one engine run (module docstring)."""

    def __init__(self, run: EngineRun) -> None:
        #: the engine's replay state (:class:`EngineRun`); read only, except :attr:`due`
        #: which the engine fills
        self.run = run
        #: due end (s) of each running compute/delay task and replayed collective (NaN: none)
        self.due = array("d", [math.nan]) * len(run.tasks)
        self.watches: list[_Watch] = []
        self.on = True
        self._decisions = 0
        self._replayed_before = 0
        self.replayed = 0               #: collectives replayed on a per-link proof
        self.refused = 0                #: memoised collectives whose proof failed (simulated)
        self._routed = 0
        self._pos: array | None = None
        self._by_sig: dict[tuple, list[int]] | None = None
        self._chans: dict[tuple, frozenset[int] | None] = {}
        self._scopes: dict[tuple, _Scope | None] = {}
        self._by_chans: dict[frozenset[int], _Scope] = {}   #: collectives on the same channels
        self._preds: dict[int, tuple[int, ...]] = {}
        self._dur: dict[int, float] = {}
        #: proven lower bounds of start times of unstarted tasks (s; facts of the run)
        self._known: dict[int, float] = {}

    # ------------------------------------------------------------ footprints
    def _sig(self, i: int) -> tuple:
        t = self.run.tasks[i]
        if t.kind == "collective":
            return ("c",) + self.run.memo_key(t)
        if t.kind == "memcpy":
            return ("m", t.rank, t.mem_node)
        return ("p",) + ((t.rank, t.peer) if t.kind == "send" else (t.peer, t.rank))

    def _lanes(self, rank: int) -> list[int]:
        fold = self.run.fold
        return [rank] if fold is None else fold.images(rank)

    def _pairs(self, i: int) -> list[tuple[str, str]] | None:
        """Node pairs of every transfer task ``i`` can start (all lanes), None if unknown."""
        run = self.run
        t = run.tasks[i]
        topo = run.topology
        if t.kind == "memcpy":        # every lane: its image's GPU <-> that image's memory node
            return [(a, b) for n, mem in run.memcpy_lanes(t.rank, t.mem_node)
                    for a, b in ((n, mem), (mem, n))]
        if t.kind in ("send", "recv"):
            src, dst = (t.rank, t.peer) if t.kind == "send" else (t.peer, t.rank)
            return [(topo.node_of(a), topo.node_of(b))
                    for a, b in zip(self._lanes(src), self._lanes(dst))]
        instances = [t.group] if run.fold is None else run.fold.instances(t.group)[0]
        ends: set[tuple] = set()          # a ring's pairs recur at every step: resolve each once
        for inst in instances:
            sched = run.plan(t, inst).schedule
            if isinstance(sched, CompactSchedule):
                for p in sched.plan.patterns:
                    ends.update(zip(p.src.tolist(), p.dst.tolist()))
            elif isinstance(sched, FluidSchedule):
                ends.update((f.src, f.dst) for f in sched.flows)
            else:
                ends.update(zip(sched.src, sched.dst))
        return list({(topo.resolve(a), topo.resolve(b)) for a, b in ends})

    def _channels(self, i: int) -> frozenset[int] | None:
        """Channel ids task ``i``'s flows can ever use; None when the run's route budget is
        spent (then the shortcut is off)."""
        sig = self._sig(i)
        if sig in self._chans:
            return self._chans[sig]
        pairs = self._pairs(i)
        self._routed += len(pairs)
        if self._routed > ROUTE_BUDGET:
            self._off()
            return None
        router = self.run.net.router
        chmap = self.run.net.channels
        got: set[int] = set()
        for a, b in set(pairs):
            if a != b:
                got.update(chmap.channel(u, v) for u, v in router.possible_hops(a, b))
        found = frozenset(got)
        self._chans[sig] = found
        return found

    def _scope(self, i: int, key: tuple) -> _Scope | None:
        """The scope of collective task ``i`` (memo ``key``), cached per key."""
        if key in self._scopes:
            return self._scopes[key]
        run = self.run
        if self._by_sig is None:
            by_sig: dict[tuple, list[int]] = {}
            for j, t in enumerate(run.tasks):
                if t.kind in _NET:
                    by_sig.setdefault(self._sig(j), []).append(j)
            self._by_sig = by_sig
            pos = array("l", bytes(8 * len(run.tasks)))
            for queue in run.queues.values():
                for p, j in enumerate(queue):
                    pos[j] = p
            self._pos = pos
        mine = self._channels(i)
        scope = self._by_chans.get(mine) if mine is not None else None
        if mine is not None and scope is None:
            members: set[int] = set()
            for sig, tasks in self._by_sig.items():
                chans = self._channels(tasks[0])
                if chans is None:
                    break
                if not chans.isdisjoint(mine):
                    members.update(tasks)
            else:
                streams: dict[tuple, list[int]] = {}
                for j in members:
                    streams.setdefault(run.stream_of[j], []).append(self._pos[j])
                for v in streams.values():
                    v.sort()
                chmap = run.net.channels
                dirs = np.isin(np.asarray(chmap.channel_of_direction), np.fromiter(mine, dtype=np.int64))
                scope = self._by_chans[mine] = _Scope(members, streams, dirs, run.queues)
        self._scopes[key] = scope
        return scope

    # ------------------------------------------------------------ proofs
    def _off(self) -> None:
        """Turn the shortcut off for the rest of the run and drop what it built."""
        self.on = False
        self._by_sig = self._pos = None
        self._scopes, self._chans, self._preds, self._dur, self._known = {}, {}, {}, {}, {}
        self._by_chans = {}

    def _deciding(self) -> bool:
        """Count one decision; False once the shortcut is off (module constants)."""
        if not self.on:
            return False
        self._decisions += 1
        if self._decisions % PROBE == 0:
            if self.replayed - self._replayed_before < MIN_REPLAY_FRACTION * PROBE:
                self._off()
                return False
            self._replayed_before = self.replayed
        return True

    def _scope_for(self, i: int, key: tuple) -> _Scope | None:
        """One decision about collective ``i`` (memo ``key``): its scope, or None when the
        shortcut is off or the scope is unknown."""
        return self._scope(i, key) if self._deciding() else None

    def _heads(self, scope: _Scope, own: Container[int]) -> list[int]:
        """The first unfinished task in scope of every stream, the collective's own member
        tasks ``own`` skipped (in the order of :attr:`_Scope.streams`)."""
        head = self.run.head
        out = []
        for row in scope.rows:
            stream, queue, positions, k = row
            h = head[stream]
            n = len(positions)
            while k < n and positions[k] < h:      # bisect_left(positions, h), amortised
                k += 1
            row[3] = k
            if k < n and queue[positions[k]] in own:
                k += 1
            if k < n:
                out.append(queue[positions[k]])
        return out

    def _started(self, j: int) -> bool:
        s = self.run.start[j]
        return s == s

    def free_now(self, i: int, key: tuple, own: frozenset[int] | None = None) -> _Watch | None:
        """A watch for simulating collective ``i`` for the memo, when no task of its scope is
        running now (a send/receive waiting for its partner moves nothing yet); else None.
        ``own``: every member task of the collective (default: ``i`` alone); the others'
        arrivals do not make the watch dirty."""
        scope = self._scope_for(i, key)
        if scope is None:
            return None
        own = frozenset((i,)) if own is None else own
        if self._moving(scope, own):
            return None
        watch = _Watch(scope, own)
        self.watches.append(watch)
        return watch

    def _moving(self, scope: _Scope, own: frozenset[int]) -> bool:
        """Whether a task of ``scope`` other than ``own`` runs now (a send/receive waiting
        for its partner moves nothing yet)."""
        run = self.run
        for j in self._heads(scope, own):
            if self._started(j) and not (run.tasks[j].kind in ("send", "recv")
                                         and not self._started(run.partner[j])):
                return True
        return False

    def quiet(self, i: int, key: tuple, own: frozenset[int]) -> bool:
        """Whether nothing of the scope of collective ``i`` (memo ``key``; member tasks
        ``own``) runs now, without counting a decision: a collective of several members
        waits for the end of its arrival instant to be replayed only then (a task running
        now would make the proof fail anyway)."""
        if not self.on:
            return False
        scope = self._scope(i, key)
        return scope is not None and not self._moving(scope, own)

    def started(self, j: int) -> None:
        """Network task ``j`` starts: every watch whose scope holds it is dirty (unless it
        is a member of the watched collective)."""
        for w in self.watches:
            if j in w.scope.members and j not in w.own and not w.dirty:
                w.dirty, w.dirty_at = True, self.run.env.now

    def recorded(self, watch: _Watch, delta: np.ndarray, *, at_end: bool = False) -> np.ndarray | None:
        """End of a watched run: its bytes per direction (``delta`` restricted to its own
        channels) if nothing in its scope started meanwhile, else None. ``at_end`` (a
        collective of several members, recorded when its last member ends): a task of the
        scope that started at this very instant is no obstacle — it waited for a member that
        ended now, and every flow of the run was done before that member's end was known,
        so its own flows join after them."""
        self.watches.remove(watch)
        if watch.dirty and not (at_end and watch.dirty_at >= self.run.env.now):
            return None
        return np.where(watch.scope.directions, delta, 0.0)

    def isolated(self, i: int, key: tuple, end: float,
                 ends: dict[int, float] | None = None) -> bool:
        """Whether collective task ``i`` (memo ``key``), replayed now to end at ``end``, has its
        channels to itself until then (module docstring). ``ends``: every member task of a
        collective of several, each with its replayed end (s; the latest is ``end``);
        default ``{i: end}``."""
        scope = self._scope_for(i, key)
        if scope is None:
            return False
        # several members: a task that provably waits for the member that ends last may start
        # at that very end (its flows join after every flow of the run; see ``recorded``)
        at_end = None if ends is None else end
        if ends is None:
            ends = {i: end}
        run = self.run
        bound = end * (1.0 + MARGIN)
        tentative: list[tuple[int, float]] = []    # bounds that hold if ``i`` is replayed
        start, known, tasks, partner, head = run.start, self._known, run.tasks, run.partner, run.head
        inf = -math.inf
        for row in scope.rows:                      # the heads (:meth:`_heads`), inline
            stream, queue, positions, k = row
            h = head[stream]
            n = len(positions)
            while k < n and positions[k] < h:
                k += 1
            row[3] = k
            if k < n and queue[positions[k]] in ends:
                k += 1
            if k == n:
                continue
            j = queue[positions[k]]
            s = start[j]
            if s == s:                                  # started (not NaN)
                got = inf
            else:
                got = known.get(j, inf)                 # _start_after's first answer, inline
                if got <= bound:
                    got = self._start_after(j, ends, bound, tentative, at_end)
            if got <= bound:
                if tasks[j].kind not in ("send", "recv"):
                    return False
                q = partner[j]
                s = start[q]
                if s == s:
                    return False
                got = known.get(q, inf)
                if got <= bound:
                    got = self._start_after(q, ends, bound, tentative, at_end)
                    if got <= bound:
                        return False
        for j, b in tentative:
            if b > known.get(j, inf):
                known[j] = b
        return True

    def _start_after(self, j: int, ends: dict[int, float], bound: float,
                     tentative: list[tuple[int, float]], at_end: float | None = None) -> float:
        """A lower bound above ``bound`` (s) of the start of unstarted task ``j``, with the
        member tasks of collective ``c`` (the keys of ``ends``) each ending at its value;
        -inf when none is found. With ``at_end`` (the last member's end; a collective of
        several members): a path that rests on a member of ``c`` and reaches ``j`` no
        earlier than ``at_end`` is a proof as well (the caller is told by ``inf``: ``j``
        waits for the end of ``c``, so it cannot share its channels with it); no fact is
        kept of it.

        ``j`` starts once each of its predecessors (stream predecessor, dependencies) is done,
        so it is enough that ONE unfinished predecessor ends after ``bound``: a member of ``c``; a
        running compute/delay task or replayed collective due after it; or an unstarted task
        that provably starts after ``bound`` minus its own duration — the same question one
        step back (an OR over paths, searched depth-first; it stops at the first proof). An
        unstarted task starts no earlier than now. Bounded by :data:`SEARCH_BUDGET`; a
        search that runs out proves nothing.

        The bound found is the end it rests on plus the durations on the way. It is a fact of
        the run (due times and now do not change), remembered per task (:attr:`_known`) and
        reused while ``j`` waits; one that rests on ``c``'s end is only true if ``c`` is
        replayed, so it goes to ``tentative`` for the caller to keep then."""
        known = self._known.get(j, -math.inf)
        if known > bound:
            return known
        run = self.run
        now = run.env.now
        finish, start, due = run.end, run.start, self.due
        durations, duration = self._dur, self._duration
        preds, pos, head, stream_of, queues = self._preds, self._pos, run.head, run.stream_of, run.queues
        stack = [(j, bound)]
        seen: dict[int, float] = {j: bound}   # smallest bound each task was searched with
        while stack:
            x, y = stack.pop()
            found, via_c = (now if now > y else -math.inf), False
            if found < 0:
                got = preds.get(x)                    # :meth:`_preds_of`, inline
                if got is None:
                    got = self._deps_of(x)
                stream = stream_of[x]
                p = pos[x]
                if p > head[stream]:
                    got = (*got, queues[stream][p - 1])
                for p in got:
                    if finish[p] == finish[p]:        # finished
                        continue
                    e = ends.get(p)
                    if e is not None:                 # a member of c
                        if e > y:
                            found, via_c = e, True
                            break
                        if at_end is not None and e + (bound - y) >= at_end:
                            return math.inf           # j waits for the end of c
                        continue
                    if start[p] == start[p]:          # running: due, or no earlier than now
                        d = due[p]
                        if d == d and d > y:
                            found = d
                            break
                        continue
                    d = durations.get(p)
                    yp = y - (duration(p) if d is None else d)
                    if seen.get(p, math.inf) <= yp:   # searched already with a lower bound
                        continue
                    seen[p] = yp
                    if len(seen) > SEARCH_BUDGET:
                        return -math.inf
                    stack.append((p, yp))
            if found >= 0:
                lower = found + (bound - y)           # + the durations from x up to j
                if via_c:
                    tentative.append((j, lower))
                elif lower > known:
                    self._known[j] = lower
                return lower
        return -math.inf

    def _deps_of(self, j: int) -> tuple[int, ...]:
        """The dependencies of task ``j`` (task indices), cached."""
        got = self._preds[j] = tuple(self.run.table.deps(j))
        return got

    def _duration(self, j: int) -> float:
        """Seconds task ``j`` will take once started: its compute/delay duration (the
        engine's, deterministic: no jitter here), 0 for anything else (a lower bound)."""
        got = self._dur.get(j)
        if got is None:
            t = self.run.tasks[j]
            got = self.run.task_duration(t) if t.kind in ("compute", "delay") else 0.0
            self._dur[j] = got
        return got

