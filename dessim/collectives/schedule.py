"""A collective as data: a :class:`Schedule` of point-to-point :class:`Transfer` s.

A transfer ``i`` moves ``nbytes`` from rank ``src`` to rank ``dst`` once every transfer in
``deps`` (indices of *earlier* transfers) has completed; on arrival the receiver reduces
``reduce_bytes`` of it into its own buffer (0 for plain copies).

Storage is columnar (``array`` columns, dependencies as one flat index array with offsets)
because a ring all-reduce over p ranks has 2p(p-1) transfers — 8.4 million at p = 2048 —
and Python objects per transfer would need gigabytes. :attr:`Schedule.transfers` and
iteration materialise :class:`Transfer` tuples on demand.

Schedules are built with :class:`ScheduleBuilder` and :class:`Lane`:

* **Connections are FIFO.** Transfers on one connection ``(src, dst, channel)`` are
  serialised in the order they are added (each depends on the previous one), as on NCCL's
  connections; this is what makes chunked trees and chains pipeline.
* A :class:`Lane` is one independent stream of an algorithm (one channel × one chunk). It
  remembers, per rank, which transfers the rank's next send must wait for (its own last send
  and everything it received since), so algorithms only describe *steps*.

Algorithms made of uniform steps (ring) can instead describe themselves as a :class:`StepPlan`
held by a :class:`CompactSchedule`: O(steps) to build and store, same transfers and
dependencies (materialised on demand, tested equal to the builder's), and the executor can
replay each step as one network bundle.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from dessim.collectives.ops import Op
from dessim.errors import CollectiveError

__all__ = ["Transfer", "Schedule", "ScheduleBuilder", "Lane", "StepPattern", "StepPlan",
           "StepPlanBuilder", "CompactSchedule", "merge_disjoint", "is_relabelling", "orbit_plan", "Pipeline", "pipelines", "Flow", "FluidSchedule"]

#: Relative tolerance of byte-count checks (sizes are float bytes split into blocks).
_REL_TOL = 1e-9


class Transfer(NamedTuple):
    """One point-to-point message of a schedule (bytes; ranks are global)."""

    src: int
    dst: int
    nbytes: float
    deps: tuple[int, ...] = ()
    reduce_bytes: float = 0.0
    channel: int = 0


@dataclass
class Schedule:
    """The transfers of one collective; see the module docstring."""

    op: Op
    algorithm: str
    group: tuple[int, ...]
    size: float                      #: bytes, nccl-tests semantics of ``op``
    root: int | None = None          #: global rank (broadcast, reduce, sendrecv source)
    src: array = field(default_factory=lambda: array("l"))
    dst: array = field(default_factory=lambda: array("l"))
    nbytes: array = field(default_factory=lambda: array("d"))
    reduce_bytes: array = field(default_factory=lambda: array("d"))
    channel: array = field(default_factory=lambda: array("l"))
    dep_start: array = field(default_factory=lambda: array("l", [0]))  #: offsets into dep_index
    dep_index: array = field(default_factory=lambda: array("l"))
    params: dict = field(default_factory=dict)  #: chunks, channels, ... used to build it
    #: member -> the member whose part it is counted in (:func:`orbit_plan`); None: itself
    account: dict[int, int] | None = None

    def __len__(self) -> int:
        return len(self.src)

    def deps(self, i: int) -> tuple[int, ...]:
        return tuple(self.dep_index[self.dep_start[i]:self.dep_start[i + 1]])

    def __getitem__(self, i: int) -> Transfer:
        return Transfer(self.src[i], self.dst[i], self.nbytes[i], self.deps(i),
                        self.reduce_bytes[i], self.channel[i])

    def __iter__(self) -> Iterator[Transfer]:
        return (self[i] for i in range(len(self)))

    @property
    def transfers(self) -> list[Transfer]:
        """All transfers as a list (materialised; fine for small schedules)."""
        return list(self)

    @property
    def communicator(self) -> tuple[int, ...]:
        """The ranks of ONE communicator this schedule runs on: ``group``, except for a
        merged schedule (:func:`merge_disjoint`), which runs several communicators of the
        same shape at once and charges each as this one."""
        return self.group

    # ------------------------------------------------------------------ accounting
    def bytes_sent(self) -> dict[int, float]:
        out = dict.fromkeys(self.group, 0.0)
        for s, n in zip(self.src, self.nbytes):
            out[s] += n
        return out

    def bytes_received(self) -> dict[int, float]:
        out = dict.fromkeys(self.group, 0.0)
        for d, n in zip(self.dst, self.nbytes):
            out[d] += n
        return out

    def total_reduce_bytes(self) -> float:
        return float(sum(self.reduce_bytes))

    def critical_path_length(self) -> int:
        """Longest chain of dependent transfers (the number of sequential steps)."""
        depth = array("l", bytes(8 * len(self)))
        best = 0
        for i in range(len(self)):
            a, b = self.dep_start[i], self.dep_start[i + 1]
            d = 1 + max((depth[j] for j in self.dep_index[a:b]), default=0)
            depth[i] = d
            best = max(best, d)
        return best

    # ------------------------------------------------------------------ validation
    def validate(self, *, causality: bool = True) -> None:
        """Check the schedule against its op; raise :class:`CollectiveError` on a violation.

        Checks: endpoints are group members and distinct, sizes positive, dependencies point
        to earlier transfers; bytes conservation — every rank sends and receives at least
        what the op requires (:class:`~dessim.collectives.ops.Op` lower bounds), reductions
        total at least ``(n-1)`` times the reduced bytes (and none for non-reducing ops);
        with ``causality``, every rank that must hear from another does through a chain of
        transfers ordered by the dependencies (cost O(transfers × n / 64)).
        """
        where = f"{self.algorithm} {self.op.name} on {len(self.group)} ranks"
        members = set(self.group)
        n = len(self.group)
        for i in range(len(self)):
            s, d = self.src[i], self.dst[i]
            if s not in members or d not in members:
                raise CollectiveError(f"{where}: transfer {i} {s}->{d} leaves the group")
            if s == d:
                raise CollectiveError(f"{where}: transfer {i} sends rank {s} to itself")
            if not self.nbytes[i] > 0:
                raise CollectiveError(f"{where}: transfer {i} has {self.nbytes[i]} bytes")
            if not 0 <= self.reduce_bytes[i] <= self.nbytes[i] * (1 + _REL_TOL):
                raise CollectiveError(f"{where}: transfer {i} reduces {self.reduce_bytes[i]} of "
                                      f"{self.nbytes[i]} bytes")
            if any(not 0 <= j < i for j in self.deps(i)):
                raise CollectiveError(f"{where}: transfer {i} depends on a later transfer")
        if n < 2:
            return
        self._check_bytes(where)
        reduced = self.total_reduce_bytes()
        need = (n - 1) * self.op.reduced_bytes(n, self.size)
        if self.op.reduces and reduced < need * (1 - _REL_TOL):
            raise CollectiveError(f"{where}: reduces {reduced:g} bytes in total; combining "
                                  f"{n} inputs needs >= {need:g}")
        if not self.op.reduces and reduced:
            raise CollectiveError(f"{where}: {self.op.name} must not reduce, "
                                  f"but reduces {reduced:g} bytes")
        if causality:
            self._check_causality(where)

    def _check_bytes(self, where: str) -> None:
        """Every rank sends and receives at least what the op needs."""
        n = len(self.group)
        sent, received = self.bytes_sent(), self.bytes_received()
        for r in self.group:
            is_root = r == self.root
            for what, got, need in (("sends", sent[r], self.op.min_sent(n, self.size, is_root)),
                                    ("receives", received[r],
                                     self.op.min_received(n, self.size, is_root))):
                if got < need * (1 - _REL_TOL):
                    raise CollectiveError(f"{where}: rank {r} {what} {got:g} bytes; "
                                          f"{self.op.name} needs >= {need:g}")

    def _check_causality(self, where: str) -> None:
        bit = {r: 1 << k for k, r in enumerate(self.group)}
        knows = [0] * len(self)           # what the sender of transfer i knew when sending it
        final = dict(bit)                 # what each rank knows at the end
        for i in range(len(self)):
            s = self.src[i]
            k = bit[s]
            for j in self.deps(i):
                if self.dst[j] == s or self.src[j] == s:
                    k |= knows[j]
            knows[i] = k
            final[self.dst[i]] |= k
        everyone = (1 << len(self.group)) - 1
        root = self.root if self.root is not None else self.group[0]
        if self.op.hears == "all":
            pairs = [(r, everyone) for r in self.group]
        elif self.op.hears == "from_root":
            pairs = [(r, bit[root]) for r in self.group]
        else:
            pairs = [(root, everyone)]
        for r, need in pairs:
            missing = need & ~final[r]
            if missing:
                who = [q for q in self.group if bit[q] & missing][:5]
                raise CollectiveError(f"{where}: rank {r} never hears from rank(s) {who}")


class ScheduleBuilder:
    """Appends transfers to a :class:`Schedule`, serialising each connection (FIFO)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self._last_on_connection: dict[tuple[int, int, int], int] = {}

    def add(self, src: int, dst: int, nbytes: float, deps: Iterable[int] = (),
            reduce_bytes: float = 0.0, channel: int = 0, fifo: bool = True) -> int:
        """Append a transfer and return its index; with ``fifo`` it also waits for the
        previous transfer on the same ``(src, dst, channel)`` connection (without: only for
        ``deps`` — a connection that keeps several steps in flight, as NCCL's 8-slot FIFOs
        do in a ring)."""
        s = self.schedule
        idx = len(s.src)
        conn = (src, dst, channel)
        prev = self._last_on_connection.get(conn)
        dep_set = set(deps)
        if prev is not None and fifo:
            dep_set.add(prev)
        self._last_on_connection[conn] = idx
        s.src.append(src)
        s.dst.append(dst)
        s.nbytes.append(nbytes)
        s.reduce_bytes.append(reduce_bytes)
        s.channel.append(channel)
        s.dep_index.extend(sorted(dep_set))
        s.dep_start.append(len(s.dep_index))
        return idx


class Lane:
    """One independent stream (channel × chunk) of an algorithm over global ranks.

    ``pending[r]`` are the transfers rank ``r`` must finish before its next step. :meth:`step`
    adds a set of concurrent sends: each waits for the pending transfers of its sender (the
    data it forwards) *and of its receiver* (rendezvous: the receiver has finished its
    previous step and posted the receive, as with MPI's rendezvous protocol and NCCL's
    connection flow control); afterwards a rank's pending set is its sends of the step (or
    its old set if it sent nothing) plus what it received in the step.
    """

    def __init__(self, builder: ScheduleBuilder, channel: int = 0,
                 pending: dict[int, list[int]] | None = None) -> None:
        self.builder = builder
        self.channel = channel
        self.pending: dict[int, list[int]] = pending if pending is not None else {}

    def step(self, sends: Iterable[tuple[int, int, float, float]]) -> list[int]:
        """Add concurrent sends ``(src, dst, nbytes, reduce_bytes)``; return their indices."""
        sent: dict[int, list[int]] = {}
        recv: dict[int, list[int]] = {}
        out = []
        for src, dst, nbytes, red in sends:
            deps = [*self.pending.get(src, ()), *self.pending.get(dst, ())]
            idx = self.builder.add(src, dst, nbytes, deps, red, self.channel)
            out.append(idx)
            sent.setdefault(src, []).append(idx)
            recv.setdefault(dst, []).append(idx)
        for r in sent.keys() | recv.keys():
            base = sent.get(r)
            if base is None:
                base = list(self.pending.get(r, ()))
            self.pending[r] = base + recv.get(r, [])
        return out


# ---------------------------------------------------------------------------------- compact
@dataclass(frozen=True, eq=False)
class StepPattern:
    """The concurrent sends of one step of a compact schedule: member ``i`` sends
    ``src[i] -> dst[i]`` once its dependencies — members ``dep_index[dep_start[i]:dep_start[i+1]]``
    of the step's *previous step* (sorted ascending) — are complete."""

    src: np.ndarray          #: global ranks (int64)
    dst: np.ndarray          #: global ranks (int64)
    dep_start: np.ndarray    #: CSR offsets, length len(src) + 1
    dep_index: np.ndarray    #: member indices in the previous step

    def __len__(self) -> int:
        return len(self.src)

    @property
    def dep_count(self) -> np.ndarray:
        return np.diff(self.dep_start)


@dataclass(frozen=True, eq=False)
class StepPlan:
    """A schedule as a chain of uniform steps instead of per-transfer rows.

    Step ``s`` consists of the members of ``patterns[pattern[s]]``, each moving ``nbytes[s]``
    bytes (reducing ``reduce_bytes[s]``) on ``channel[s]``; its members' dependencies refer to
    step ``prev[s]`` (-1: none). Transfers are numbered step by step: member ``i`` of step
    ``s`` is transfer ``offset[s] + i``. A ring all-reduce over p ranks is 2(p-1) steps of one
    pattern: O(p) memory instead of O(p²) rows, which is what lets the executor replay a
    whole step as one network bundle (docs/performance.md).
    """

    patterns: tuple[StepPattern, ...]
    pattern: tuple[int, ...]
    prev: tuple[int, ...]
    nbytes: tuple[float, ...]
    reduce_bytes: tuple[float, ...]
    channel: tuple[int, ...]
    offset: tuple[int, ...]          #: length steps + 1

    def __post_init__(self) -> None:
        for s, q in enumerate(self.prev):
            if not -1 <= q < s:
                raise CollectiveError(f"step {s} depends on step {q}, which is not earlier")
            counts = self.patterns[self.pattern[s]].dep_count
            if q >= 0 and len(counts) and counts.min() < 1:
                # the executor starts a step when its previous step completes; a member
                # without dependencies there would really start at time 0
                raise CollectiveError(f"step {s}: every member needs a dependency in step {q}")

    def __len__(self) -> int:
        return len(self.pattern)

    @property
    def transfers(self) -> int:
        return self.offset[-1]


class StepPlanBuilder:
    """Appends steps to a :class:`StepPlan` (patterns are shared, not copied)."""

    def __init__(self) -> None:
        self.patterns: list[StepPattern] = []
        self._pattern_ids: dict[int, int] = {}
        self.rows: list[tuple[int, int, float, float, int]] = []
        self.offset = [0]

    def add(self, pattern: StepPattern, prev: int, nbytes: float, reduce_bytes: float,
            channel: int) -> int:
        pid = self._pattern_ids.get(id(pattern))
        if pid is None:
            pid = self._pattern_ids[id(pattern)] = len(self.patterns)
            self.patterns.append(pattern)
        self.rows.append((pid, prev, float(nbytes), float(reduce_bytes), channel))
        self.offset.append(self.offset[-1] + len(pattern))
        return len(self.rows) - 1

    def build(self) -> StepPlan:
        cols = list(zip(*self.rows)) if self.rows else [(), (), (), (), ()]
        return StepPlan(tuple(self.patterns), *(tuple(c) for c in cols), tuple(self.offset))


@dataclass(frozen=True, eq=False)
class Pipeline:
    """One channel of a :class:`StepPlan` that is a forwarding pipeline: every step moves
    data over the same connections ``src[i] -> dst[i]`` — a permutation (each member sends
    on one connection and receives on one) — and each step of a connection waits for the
    upstream connection's previous step (the data it forwards arrives there), as in a ring.
    See :func:`pipelines`."""

    channel: int
    src: np.ndarray          #: global ranks (int64)
    dst: np.ndarray          #: global ranks (int64)
    hops: int                #: steps: transfers per connection
    nbytes: float            #: bytes per connection over all steps


def pipelines(plan: StepPlan) -> tuple[Pipeline, ...] | None:
    """The channels of ``plan`` as :class:`Pipeline` s, or None unless every channel is one:
    its steps form one chain (each depends on the channel's previous step), at least two of
    them, all over the same connections, which form a permutation, and every member of every
    later step depends on its upstream member (the one whose destination is its source)."""
    steps_of: dict[int, list[int]] = {}
    for s, c in enumerate(plan.channel):
        steps_of.setdefault(c, []).append(s)
    out = []
    checked: set[int] = set()
    for c, steps in steps_of.items():
        if len(steps) < 2 or any(plan.prev[b] != a for a, b in zip([-1, *steps], steps)):
            return None
        first = plan.patterns[plan.pattern[steps[0]]]
        src, dst = first.src, first.dst
        if len(np.unique(src)) != len(src) or not np.array_equal(np.sort(src), np.sort(dst)):
            return None
        where = {int(r): i for i, r in enumerate(dst.tolist())}
        upstream = np.fromiter((where[int(r)] for r in src), dtype=np.int64, count=len(src))
        for s in steps[1:]:
            pid = plan.pattern[s]
            if pid in checked:
                continue
            pat = plan.patterns[pid]
            if not (np.array_equal(pat.src, src) and np.array_equal(pat.dst, dst)):
                return None
            for i, u in enumerate(upstream.tolist()):
                if u not in pat.dep_index[pat.dep_start[i]:pat.dep_start[i + 1]]:
                    return None
            checked.add(pid)
        out.append(Pipeline(c, src, dst, len(steps), float(sum(plan.nbytes[s] for s in steps))))
    return tuple(out) if out else None


_COLUMNS = ("src", "dst", "nbytes", "reduce_bytes", "channel", "dep_start", "dep_index")


class CompactSchedule(Schedule):
    """A :class:`Schedule` stored as a :class:`StepPlan`; the per-transfer columns (``src``,
    ``dst``, ..., ``dep_index``) are materialised on first access, identical to what
    :class:`ScheduleBuilder` would have produced for the same algorithm."""

    def __init__(self, op: Op, algorithm: str, group: tuple[int, ...], size: float,
                 root: int | None, plan: StepPlan, params: dict | None = None,
                 communicator: tuple[int, ...] | None = None) -> None:
        self.op, self.algorithm, self.group, self.size, self.root = op, algorithm, group, size, root
        self.params = dict(params or {})
        self.plan = plan
        self._communicator = group if communicator is None else communicator
        self._columns: dict[str, array] | None = None
        #: member -> the member whose part it is counted in (:func:`orbit_plan`); None: itself
        self.account: dict[int, int] | None = None

    @property
    def communicator(self) -> tuple[int, ...]:
        return self._communicator

    def __len__(self) -> int:
        return self.plan.transfers

    def __repr__(self) -> str:
        return (f"CompactSchedule({self.algorithm} {self.op.name}, ranks={len(self.group)}, "
                f"size={self.size:g}, steps={len(self.plan)}, transfers={len(self)})")

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def materialize(self) -> dict[str, array]:
        """The per-transfer columns (built once, then cached)."""
        if self._columns is None:
            self._columns = _materialize(self.plan)
        return self._columns


def _same_steps(a: CompactSchedule, b: CompactSchedule) -> bool:
    """Whether two compact schedules are the same collective with the same step plan up to
    the ranks: op, algorithm, size, group size, steps (pattern ids, previous steps, bytes,
    reductions, channels) and each pattern's dependencies."""
    p, q = a.plan, b.plan
    if (a.op is not b.op or a.algorithm != b.algorithm or a.size != b.size
            or len(a.group) != len(b.group)
            or (p.pattern, p.prev, p.nbytes, p.reduce_bytes, p.channel)
            != (q.pattern, q.prev, q.nbytes, q.reduce_bytes, q.channel)
            or len(p.patterns) != len(q.patterns)):
        return False
    return all(len(x) == len(y) and np.array_equal(x.dep_start, y.dep_start)
               and np.array_equal(x.dep_index, y.dep_index) for x, y in zip(p.patterns, q.patterns))


def is_relabelling(a: Schedule, b: Schedule, ranks: np.ndarray) -> bool:
    """Whether ``b`` is ``a`` with every rank ``r`` renamed ``ranks[r]`` (``ranks``: an
    integer array over global ranks, e.g. one lane of a replica fold): the same transfers,
    bytes, channels and dependencies, each between the renamed ranks, with the renamed group
    and root. Compact schedules are compared step plan by step plan, others row by row;
    streamed (fluid) schedules never qualify. What makes the images of a collective under a
    fold the lane images of one of them (:mod:`dessim.network.families`)."""
    if type(a) is not type(b) or type(a) not in (Schedule, CompactSchedule):
        return False
    mapped = [int(ranks[r]) for r in a.group]
    if tuple(mapped) != tuple(b.group) or (a.root is None) != (b.root is None) \
            or (a.root is not None and int(ranks[a.root]) != b.root):
        return False
    if type(a) is CompactSchedule:
        if not _same_steps(a, b):
            return False
        return all(np.array_equal(ranks[x.src], y.src) and np.array_equal(ranks[x.dst], y.dst)
                   for x, y in zip(a.plan.patterns, b.plan.patterns))
    if (a.op is not b.op or a.algorithm != b.algorithm or a.size != b.size or len(a) != len(b)
            or (a.nbytes, a.reduce_bytes, a.channel, a.dep_start, a.dep_index)
            != (b.nbytes, b.reduce_bytes, b.channel, b.dep_start, b.dep_index)):
        return False
    return (np.array_equal(ranks[np.asarray(a.src, dtype=np.int64)], np.asarray(b.src, dtype=np.int64))
            and np.array_equal(ranks[np.asarray(a.dst, dtype=np.int64)], np.asarray(b.dst, dtype=np.int64)))


def _inverse_permutation(m: np.ndarray) -> np.ndarray:
    """``np.argsort(m)`` for a permutation ``m`` of ``0 .. len(m) - 1``, by one scatter
    (linear, where the sort is n log n: the fold's 16,384-rank maps, thousands per run); a
    permutation's values are distinct, so its argsort is unique and equal to this. Anything
    else is sorted as before."""
    n = len(m)
    inv = np.zeros(n, dtype=np.intp)
    if n and 0 <= int(m.min()) and int(m.max()) < n:
        inv[m] = np.arange(n, dtype=np.intp)
        if np.array_equal(m[inv], np.arange(n)):
            return inv
    return np.argsort(m)


def orbit_plan(schedule: Schedule, ranks: Sequence[np.ndarray]) -> Schedule | None:
    """``schedule`` reduced to one transfer per orbit of a symmetry of its own, or None.

    ``ranks`` are rank maps (integer arrays over global ranks, the identity first; e.g. the
    lanes of a replica fold that map the group onto itself) that act on the group freely:
    no map but the identity fixes a member. They split the group into rank orbits; the first
    member of each (in group order) is its representative, and for every member exactly one
    map sends its representative to it. The schedule is *invariant* under the maps when
    every step's transfers are the images of its transfers that leave a representative,
    each with the images of their dependencies. Then each image starts and ends with the
    transfer it is an image of, and the reduced schedule keeps only the transfers leaving a
    representative: step ``s`` holds those of step ``s``, each depending on the
    representatives of what it depended on. Every member ends with its representative:
    ``account`` (an attribute of the result) maps every member to it, so the replay counts a
    kept transfer's arrival for its receiver's representative. Compact schedules only
    (others: None); None unless invariant. The result keeps the group, op, size and
    algorithm (what protocol charges read) and records ``params["orbit"]`` = how many
    transfers each kept one stands for.

    A plain :class:`Schedule` (per-transfer rows, e.g. a pipelined two-phase all-to-all) is
    reduced the same way by :func:`_orbit_rows`: its k-th transfer on a connection
    ``(src, dst, channel)`` is the image of the k-th on the mapped connection."""
    if type(schedule) not in (CompactSchedule, Schedule) or schedule.root is not None:
        return None
    group = schedule.group
    maps = [np.asarray(m, dtype=np.int64) for m in ranks]
    n = len(maps)
    if len(group) < 2 or n < 2 or len(group) % n:
        return None
    members = set(group)
    lane_of: dict[int, tuple[int, np.ndarray]] = {}     # member -> (representative, its map)
    for g in group:
        if g in lane_of:
            continue
        images = [int(m[g]) for m in maps]
        if len(set(images)) != n or not members.issuperset(images):
            return None                                  # not free, or leaves the group
        for x, m in zip(images, maps):
            lane_of[x] = (g, m)
    inverse: dict[int, np.ndarray] = {}     # id(map) -> its inverse
    reps = {r for r, _ in lane_of.values()}
    if type(schedule) is Schedule:
        return _orbit_rows(schedule, lane_of, reps, n)
    plan = schedule.plan
    index = [{(a, b): i for i, (a, b) in enumerate(zip(pat.src.tolist(), pat.dst.tolist()))}
             for pat in plan.patterns]
    reduced: dict[tuple[int, int], tuple[StepPattern, list[int]]] = {}

    def back(a: int) -> np.ndarray:
        """The inverse of member ``a``'s map, once per map (members share their map)."""
        m = lane_of[a][1]
        got = inverse.get(id(m))
        if got is None:
            got = inverse[id(m)] = _inverse_permutation(m)
        return got

    def reduce(pid: int, qid: int, prev_rep: list[int]) -> tuple[StepPattern, list[int]] | None:
        """Pattern ``pid`` (dependencies into pattern ``qid``, -1: none) as its kept
        transfers, and each member's kept transfer's position among them."""
        pat, look = plan.patterns[pid], index[pid]
        if len(look) != len(pat):
            return None                                  # a pair twice: not a plain step
        src, dst = pat.src.tolist(), pat.dst.tolist()
        kept = [i for i, a in enumerate(src) if a in reps]
        if len(kept) * n != len(pat):
            return None
        where = {i: k for k, i in enumerate(kept)}
        rep_of: list[int] = []
        for a, b in zip(src, dst):
            r = look.get((lane_of[a][0], int(back(a)[b]))) if a in lane_of else None
            if r is None or r not in where:
                return None
            rep_of.append(where[r])
        if qid < 0:
            none = np.zeros(len(kept) + 1, dtype=np.int64)
            return StepPattern(pat.src[kept], pat.dst[kept], none, none[:0]), rep_of
        prev, prev_look = plan.patterns[qid], index[qid]
        qsrc, qdst = prev.src.tolist(), prev.dst.tolist()
        deps: list[list[int]] = []
        for i, a in enumerate(src):   # deps(member) = its map's image of deps(its kept one)
            m = lane_of[a][1]
            mine = sorted(pat.dep_index[pat.dep_start[i]:pat.dep_start[i + 1]].tolist())
            r = kept[rep_of[i]]
            image = []
            for j in pat.dep_index[pat.dep_start[r]:pat.dep_start[r + 1]].tolist():
                k = prev_look.get((int(m[qsrc[j]]), int(m[qdst[j]])))
                if k is None:
                    return None
                image.append(k)
            if sorted(image) != mine:
                return None
            if a in reps:
                deps.append(sorted({prev_rep[j] for j in mine}))
        start = np.cumsum([0] + [len(d) for d in deps], dtype=np.int64)
        flat = np.fromiter((j for d in deps for j in d), dtype=np.int64, count=int(start[-1]))
        return StepPattern(pat.src[kept], pat.dst[kept], start, flat), rep_of

    builder = StepPlanBuilder()
    rep_index: dict[int, list[int]] = {}
    for s, pid in enumerate(plan.pattern):
        q = plan.prev[s]
        qid = plan.pattern[q] if q >= 0 else -1
        got = reduced.get((pid, qid))
        if got is None:
            got = reduce(pid, qid, rep_index.get(qid, []))
            if got is None:
                return None
            reduced[(pid, qid)] = got
        rep_index[pid] = got[1]
        builder.add(got[0], q, plan.nbytes[s], plan.reduce_bytes[s], plan.channel[s])
    out = CompactSchedule(schedule.op, schedule.algorithm, group, schedule.size, None,
                          builder.build(), {**schedule.params, "orbit": n},
                          communicator=schedule.communicator)
    out.account = {g: r for g, (r, _) in lane_of.items()}
    return out


def _orbit_rows(schedule: Schedule, lane_of: dict[int, tuple[int, np.ndarray]],
                reps: set[int], n: int) -> Schedule | None:
    """:func:`orbit_plan` of a plain schedule (``lane_of``: member -> (representative, the map
    sending it there); ``reps``: the representatives; ``n``: the maps). Transfer ``i`` is
    named by its connection and its rank on it, ``(src, dst, channel, k)``; the map of member
    ``a`` sends that name of a transfer leaving ``a``'s representative to a transfer leaving
    ``a``. Invariant when every transfer is the image of one leaving a representative, with
    the same bytes and reduction, and its dependencies are the images of that one's. The
    kept transfers are ordered by dependency depth (which the maps preserve), so every kept
    transfer comes after the representatives of what it waited for."""
    src, dst, chan = schedule.src, schedule.dst, schedule.channel
    nbytes, red = schedule.nbytes, schedule.reduce_bytes
    dep_start, dep_index = schedule.dep_start, schedule.dep_index
    total = len(schedule)
    if total % n:
        return None
    rank: list[int] = []
    name: dict[tuple[int, int, int, int], int] = {}
    seen: dict[tuple[int, int, int], int] = {}
    for i in range(total):
        conn = (src[i], dst[i], chan[i])
        k = seen.get(conn, 0)
        seen[conn] = k + 1
        rank.append(k)
        name[(*conn, k)] = i
    inverse: dict[int, list[int]] = {}
    forward: dict[int, list[int]] = {}
    for a, (_, m) in lane_of.items():
        forward[a] = m.tolist()
    depth = [0] * total
    rep_of = [0] * total
    for i in range(total):
        a = src[i]
        r, m = lane_of[a]
        back = inverse.get(a)
        if back is None:
            back = inverse[a] = np.argsort(m).tolist()
        j = name.get((r, back[dst[i]], chan[i], rank[i]))
        if j is None or nbytes[j] != nbytes[i] or red[j] != red[i]:
            return None
        rep_of[i] = j
        fwd = forward[a]
        mine = dep_index[dep_start[i]:dep_start[i + 1]]
        image = []
        for d in dep_index[dep_start[j]:dep_start[j + 1]]:
            k = name.get((fwd[src[d]], fwd[dst[d]], chan[d], rank[d]))
            if k is None:
                return None
            image.append(k)
        if sorted(image) != sorted(mine):
            return None
        depth[i] = 1 + max((depth[d] for d in mine), default=-1)
    kept = sorted((i for i in range(total) if src[i] in reps), key=lambda i: (depth[i], i))
    if len(kept) * n != total:
        return None
    where = {i: k for k, i in enumerate(kept)}
    out = Schedule(schedule.op, schedule.algorithm, schedule.group, schedule.size, None,
                   params={**schedule.params, "orbit": n})
    for i in kept:
        out.src.append(src[i])
        out.dst.append(dst[i])
        out.nbytes.append(nbytes[i])
        out.reduce_bytes.append(red[i])
        out.channel.append(chan[i])
        out.dep_index.extend(sorted({where[rep_of[d]] for d in dep_index[dep_start[i]:dep_start[i + 1]]}))
        out.dep_start.append(len(out.dep_index))
    out.account = {g: r for g, (r, _) in lane_of.items()}
    return out


def merge_disjoint(schedules: Sequence[Schedule]) -> CompactSchedule | None:
    """Compact schedules of the same collective on pairwise-disjoint groups, with the same
    step structure (what the images of one collective under a replica fold are), as ONE
    compact schedule: step ``s`` holds step ``s`` of every schedule, schedule by schedule;
    each member keeps its own dependencies (indices shifted to its schedule's block of the
    previous step), so every transfer waits for exactly what it waited for alone. The merged
    ``communicator`` is the first schedule's group. None unless there are at least two and
    all of them qualify (compact, same op, algorithm, size and root-less, equal step plans
    up to the ranks, disjoint groups)."""
    if len(schedules) < 2 or not all(type(s) is CompactSchedule for s in schedules):
        return None
    first = schedules[0]
    plan = first.plan
    ranks: set[int] = set()
    for sch in schedules:
        if sch.root is not None or ranks.intersection(sch.group) or not _same_steps(sch, first):
            return None
        ranks.update(sch.group)
    k = len(schedules)
    builder = StepPlanBuilder()
    merged: dict[tuple[int, int], StepPattern] = {}
    for s, pid in enumerate(plan.pattern):
        q = plan.prev[s]
        prev_len = len(plan.patterns[plan.pattern[q]]) if q >= 0 else 0
        pattern = merged.get((pid, prev_len))
        if pattern is None:
            parts = [sch.plan.patterns[pid] for sch in schedules]
            base = parts[0]
            deps = len(base.dep_index)
            pattern = merged[(pid, prev_len)] = StepPattern(
                np.concatenate([p.src for p in parts]), np.concatenate([p.dst for p in parts]),
                np.concatenate([base.dep_start[:1]] + [base.dep_start[1:] + i * deps for i in range(k)]),
                np.concatenate([base.dep_index + i * prev_len for i in range(k)]))
        builder.add(pattern, q, plan.nbytes[s], plan.reduce_bytes[s], plan.channel[s])
    group = tuple(r for sch in schedules for r in sch.group)
    return CompactSchedule(first.op, first.algorithm, group, first.size, None, builder.build(),
                           {**first.params, "merged": k}, communicator=first.group)


def _column(name: str) -> property:
    return property(lambda self: self.materialize()[name],
                    doc=f"per-transfer ``{name}`` column (materialised on demand)")


for _name in _COLUMNS:
    setattr(CompactSchedule, _name, _column(_name))
del _name


def _materialize(plan: StepPlan) -> dict[str, array]:
    i64 = np.int64
    parts: dict[str, list] = {k: [] for k in _COLUMNS}
    dep_total = 0
    for s in range(len(plan)):
        pat = plan.patterns[plan.pattern[s]]
        m = len(pat)
        parts["src"].append(pat.src)
        parts["dst"].append(pat.dst)
        parts["nbytes"].append(np.full(m, plan.nbytes[s]))
        parts["reduce_bytes"].append(np.full(m, plan.reduce_bytes[s]))
        parts["channel"].append(np.full(m, plan.channel[s], dtype=i64))
        q = plan.prev[s]
        if q < 0:
            parts["dep_start"].append(np.full(m, dep_total, dtype=i64))
        else:
            parts["dep_start"].append(dep_total + pat.dep_start[1:].astype(i64))
            parts["dep_index"].append(plan.offset[q] + pat.dep_index.astype(i64))
            dep_total += len(pat.dep_index)
    out: dict[str, array] = {}
    for name, code in zip(_COLUMNS, "lldddll"):
        arr = np.concatenate(parts[name]) if parts[name] else np.zeros(0)
        if name == "dep_start":
            arr = np.concatenate([np.zeros(1, dtype=i64), arr]) if parts[name] else np.zeros(1)
        col = array(code)
        col.frombytes(np.ascontiguousarray(arr, dtype=np.float64 if code == "d" else i64).tobytes())
        out[name] = col
    return out


# ----------------------------------------------------------------------------------- fluid
class Flow(NamedTuple):
    """One stream of a :class:`FluidSchedule`: ``nbytes`` (wire bytes) from ``src`` to
    ``dst`` — a global rank, or a node name for a switch that reduces or multicasts in the
    network (NVLS, SHARP) — on ECMP channel ``channel``."""

    src: int | str
    dst: int | str
    nbytes: float
    channel: int = 0


class FluidSchedule(Schedule):
    """A deeply pipelined collective as concurrent flows (trees, NVLS, in-network reduction).

    NCCL runs trees and NVLS as pipelines of small chunks (64 KiB - 2 MiB) through every
    edge at once; replaying each chunk would cost thousands of transfers per collective, and
    a few large store-and-forward chunks would charge a pipeline fill NCCL does not pay.
    A fluid schedule takes the pipeline's limit instead: every edge is one flow carrying all
    its bytes, all flows start together (once every member has arrived) and share the links
    max-min fairly with each other and with all other traffic, and the collective ends when
    the last flow ends plus the *tail*: the latency of the pipeline's critical path
    (``critical``, a list of hops ``(src, dst)`` a chunk crosses one after another) beyond
    the latency the flows themselves paid. On an idle network a fluid collective therefore
    takes ``call latency + critical-path latency + bytes / rate`` — the additive form of
    NCCL's own model (``ncclTopoGetAlgoTime``).

    Endpoints may be switch node names (``relays``): a flow into a switch is reduced there,
    a flow out of it is the switch's multicast, a flow between two switches is a step of an
    in-network reduction tree (SHARP) and pays no software latency. Per-transfer columns
    (``src``, ``dst``, ...) list the flows, with no dependencies. ``serial_s`` (seconds) is
    software latency of the critical path that no hop carries (NCCL's per-peer serialization
    of CollNetDirect); like every software latency it is charged only with NCCL's protocols.
    """

    def __init__(self, op: Op, algorithm: str, group: tuple[int, ...], size: float,
                 root: int | None, flows: Iterable[Flow], critical: Iterable[tuple],
                 params: dict | None = None, serial_s: float = 0.0) -> None:
        self.op, self.algorithm, self.group, self.size, self.root = op, algorithm, group, size, root
        self.params = dict(params or {})
        self.serial_s = float(serial_s)
        self.flows: tuple[Flow, ...] = tuple(Flow(*f) for f in flows)
        self.critical: tuple[tuple, ...] = tuple(tuple(h) for h in critical)
        n = len(self.flows)
        self.src = [f.src for f in self.flows]           # type: ignore[assignment]
        self.dst = [f.dst for f in self.flows]           # type: ignore[assignment]
        self.nbytes = array("d", (f.nbytes for f in self.flows))
        self.reduce_bytes = array("d", bytes(8 * n))
        self.channel = array("l", (f.channel for f in self.flows))
        self.dep_start = array("l", bytes(8 * (n + 1)))
        self.dep_index = array("l")

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return (f"FluidSchedule({self.algorithm} {self.op.name}, ranks={len(self.group)}, "
                f"size={self.size:g}, flows={len(self.flows)})")

    @property
    def relays(self) -> tuple[str, ...]:
        """Switch endpoints, in order of first use."""
        return tuple(dict.fromkeys(e for f in self.flows for e in (f.src, f.dst)
                                   if isinstance(e, str)))

    def bytes_sent(self) -> dict[int, float]:
        return self._member_bytes("src")

    def bytes_received(self) -> dict[int, float]:
        return self._member_bytes("dst")

    def _member_bytes(self, end: str) -> dict[int, float]:
        """Bytes per member at flow end ``end`` (``src`` or ``dst``); switches excluded."""
        out = dict.fromkeys(self.group, 0.0)
        for f in self.flows:
            who = getattr(f, end)
            if not isinstance(who, str):
                out[who] += f.nbytes
        return out

    def validate(self, *, causality: bool = True) -> None:
        """Endpoints are members or switches, sizes positive, and every member sends and
        receives at least what the op needs (reductions and causality happen inside the
        pipeline and are not checked)."""
        where = f"{self.algorithm} {self.op.name} on {len(self.group)} ranks"
        members = set(self.group)
        for i, f in enumerate(self.flows):
            for e in (f.src, f.dst):
                if not isinstance(e, str) and e not in members:
                    raise CollectiveError(f"{where}: flow {i} {f.src}->{f.dst} leaves the group")
            if f.src == f.dst:
                raise CollectiveError(f"{where}: flow {i} sends {f.src} to itself")
            if not f.nbytes > 0:
                raise CollectiveError(f"{where}: flow {i} has {f.nbytes} bytes")
        if len(self.group) >= 2:
            self._check_bytes(where)
