"""Max-min fair rate allocation by progressive filling (water-filling).

The textbook flow-level bandwidth-sharing model (SimGrid CM02 with cross traffic off, "raw" in
SimGrid 4.1; "SimGrid LMM" and "SimGrid CM02" in docs/references.md): every flow gets the
largest rate such that no channel exceeds its capacity and no flow can gain without taking
from a flow whose rate is not larger.

Algorithm: all unfixed flows grow together; the channel with the smallest fair share
``remaining capacity / unfixed flows`` saturates first and fixes its flows at that share; repeat.
Channels sit in a heap keyed by ``(share, channel id)`` with lazy invalidation — a channel's
share never decreases while filling and every change pushes a fresh entry, so a popped entry
whose share is out of date is simply dropped — which makes one solve
``O(sum of path lengths * log channels)`` instead of a linear scan per round (a linear scan is
fine for the few coupled flows a collective step makes; the heap keeps large coupled sets
tractable — docs/performance.md, ``bench_network.py``).

Deterministic: ties are broken by channel id, then flows are fixed in the order given.
"""

from __future__ import annotations

import heapq
from array import array
from collections import defaultdict
from itertools import chain
from operator import attrgetter
from typing import Callable, Generic, Hashable, Mapping, Protocol, Sequence, TypeVar

import numpy as np

__all__ = ["MaxMinSystem", "SAT_TOL", "Solver", "Variable", "solve_maxmin"]

F = TypeVar("F", bound=Hashable)


def _saturated(c: int, touched, remaining: dict[int, float], unfixed: dict, heap: list) -> None:
    """Channel ``c`` is full: its residual is 0, and every other channel the flows fixed on
    it cross (``touched``) that still has unfixed flows gets a heap entry with its new share."""
    remaining[c] = 0.0
    for d in touched:
        if d != c and unfixed[d] > 0:
            if remaining[d] < 0.0:  # float noise only: shares never exceed capacity
                remaining[d] = 0.0
            heapq.heappush(heap, (remaining[d] / unfixed[d], d))


def solve_maxmin(flow_channels: Mapping[F, Sequence[int]],
                 capacity: Mapping[int, float] | Sequence[float],
                 weights: Mapping[F, Sequence[float] | None] | None = None) -> dict[F, float]:
    """Max-min fair rates (bytes/s) of flows crossing channels of given capacity (bytes/s).

    ``flow_channels[f]`` lists the channel ids that flow ``f`` crosses. A channel listed twice
    for one flow is crossed twice and carries twice the flow's rate (a route never does that on
    a full-duplex link; it could cross a half-duplex link both ways). ``weights[f]`` (optional,
    aligned with ``flow_channels[f]``; None or a missing flow: every weight 1) gives each
    listing a coefficient: flow ``f`` loads the channel with ``weight * rate`` — a channel
    listed once with weight ``m`` is the same constraint as listed ``m`` times (what a
    quotient of channels, :mod:`dessim.network.quotient`, writes). Every flow still grows at
    the same pace: progressive filling on the constraints ``sum_f w_fc * r_f <= cap_c``.
    A flow that crosses no channel is unconstrained: its rate is ``float('inf')``. The result
    has the keys of ``flow_channels`` in the same order.

    Without weights, flows that list the same channel tuple are filled as one group
    (:func:`_solve_grouped`): the same float operations in the same order per channel, so
    the same rates, bit for bit.
    """
    if weights is None or not any(weights.values()):
        return _solve_grouped(flow_channels, capacity)
    inf = float("inf")
    rates: dict[F, float] = {}
    users: dict[int, list[F]] = {}
    weight: dict[int, float] = {}      # per channel: summed weights of its listings
    for f, chans in flow_channels.items():
        if not chans:
            rates[f] = inf
        ws = weights.get(f) if weights is not None else None
        for i, c in enumerate(chans):
            lst = users.get(c)
            if lst is None:
                users[c] = [f]
            else:
                lst.append(f)
            if ws is not None and ws[i] != 1:
                weight[c] = weight.get(c, 0) + ws[i] - 1

    # One pass builds the residual capacities, the unfixed counts (a flow once per crossing)
    # and the initial heap.
    remaining: dict[int, float] = {}
    unfixed: dict[int, int] = {}
    heap: list[tuple[float, int]] = []
    for c, fs in users.items():
        cap = float(capacity[c])
        n = len(fs) + weight.get(c, 0)
        remaining[c] = cap
        unfixed[c] = n
        heap.append((cap / n, c))
    heapq.heapify(heap)

    left = len(flow_channels) - len(rates)   # flows still to fix: stop as soon as none is
    while left:
        share, c = heapq.heappop(heap)
        n = unfixed[c]
        if n == 0:
            continue
        current = remaining[c] / n
        if current != share:  # stale: a newer entry with the grown share is in the heap
            continue
        # Channel c saturates: every unfixed flow on it gets `share`.
        touched: set[int] = set()
        for f in users[c]:
            if f in rates:
                continue
            rates[f] = share
            left -= 1
            ws = weights.get(f) if weights is not None else None
            if ws is None:
                for d in flow_channels[f]:
                    unfixed[d] -= 1
                    remaining[d] -= share
                    touched.add(d)
            else:
                for d, w in zip(flow_channels[f], ws):
                    unfixed[d] -= w
                    remaining[d] -= share * w
                    touched.add(d)
        _saturated(c, touched, remaining, unfixed, heap)
    return {f: rates[f] for f in flow_channels}


def _solve_grouped(flow_channels: Mapping[F, Sequence[int]],
                   capacity: Mapping[int, float] | Sequence[float]) -> dict[F, float]:
    """:func:`solve_maxmin` without weights, with the flows that list the same channel
    tuple kept as one group (a collective's ring lanes put dozens of flows on one route:
    the 10,000 flows of the 72 NVL72 rings of two racks cross 72 to 288 distinct tuples).

    Exact — the very floats of the flow-by-flow filling: when channel ``c`` saturates,
    every unfixed flow on it is fixed at the one value ``share`` and each of its listings
    subtracts ``share`` from that channel's ``remaining`` and 1 from its ``unfixed``. All
    subtractions of one saturation are of the same value, so each channel's sequence of
    float operations is ``remaining -= share`` once per listing of a newly fixed flow,
    whichever flow it comes from and in whatever order; here they are done per channel,
    ``k`` times for ``k`` listings, with nothing read in between (the heap entries pushed
    afterwards are the same tuples, and a heap pops equal tuples alike). The groups on a
    channel are the same flows, so each channel's unfixed count and first share are too
    (tests/test_maxmin.py compares with the flow-by-flow filling)."""
    inf = float("inf")
    rates: dict[F, float] = {}
    groups: dict[tuple[int, ...], list[F]] = {}     # channel tuple -> its flows, in order
    for f, chans in flow_channels.items():
        key = tuple(chans)
        fs = groups.get(key)
        if fs is None:
            groups[key] = [f]
        else:
            fs.append(f)
    users: dict[int, list[tuple[int, ...]]] = {}    # channel -> its groups (once per listing)
    unfixed: dict[int, int] = {}                    # flows on it, a flow once per listing
    for chans, fs in groups.items():
        if not chans:
            for f in fs:
                rates[f] = inf
            continue
        n = len(fs)
        for c in chans:
            lst = users.get(c)
            if lst is None:
                users[c] = [chans]
                unfixed[c] = n
            else:
                lst.append(chans)
                unfixed[c] += n
    remaining: dict[int, float] = {}
    heap: list[tuple[float, int]] = []
    for c, n in unfixed.items():
        cap = float(capacity[c])
        remaining[c] = cap
        heap.append((cap / n, c))
    heapq.heapify(heap)

    fixed: set[tuple[int, ...]] = set()
    left = len(flow_channels) - len(rates)
    while left:
        share, c = heapq.heappop(heap)
        n = unfixed[c]
        if n == 0:
            continue
        if remaining[c] / n != share:   # stale: a newer entry with the grown share is in the heap
            continue
        # Channel c saturates: every unfixed flow on it gets `share`.
        touched: dict[int, int] = {}     # channel -> listings of the flows fixed now
        for chans in users[c]:
            if chans in fixed:
                continue
            fixed.add(chans)
            fs = groups[chans]
            for f in fs:
                rates[f] = share
            k = len(fs)
            left -= k
            for d in chans:
                touched[d] = touched.get(d, 0) + k
        for d, k in touched.items():
            unfixed[d] -= k
            r = remaining[d]
            for _ in range(k):
                r -= share
            remaining[d] = r
        _saturated(c, touched, remaining, unfixed, heap)
    return {f: rates[f] for f in flow_channels}


# ---------------------------------------------------------------------------------------------
# The incremental system: variables (flows) over constraints (channels), re-solved in place.

#: Relative tolerance of the incremental solve's max-min check (a channel is saturated when
#: its load is >= capacity * (1 - SAT_TOL); a flow is the largest on a channel when no other
#: one exceeds its rate * (1 + SAT_TOL)). It only has to absorb float rounding of sums of at
#: most a few thousand rates (~1e-13 relative); a tighter value is always safe (a false
#: violation only enlarges the affected set), a looser one could accept a rate that is wrong
#: by up to SAT_TOL relative.
SAT_TOL: float = 1e-12

#: The incremental solve gives up and re-solves the whole component once the affected set
#: holds more than this fraction of the variables (or the minimum below): past that point a
#: few restricted solves cost more than one full solve. Speed only; both paths are exact.
INCREMENTAL_MAX_FRACTION: float = 0.5
INCREMENTAL_MIN_LIMIT: int = 32

#: Bounds of the memos of :class:`MaxMinSystem` (entries; for the state memo, its states'
#: variables plus the constraints each state names — freed, modified and re-rated ones,
#: which for lane-family flows over hundreds of channels outnumber the variables):
#: each memo is cleared when full, so memory stays flat on long runs.
MAX_MEMO_SOLVES: int = 4096
MAX_MEMO_STATE_VARS: int = 2_000_000

#: The state memo switches itself off when fewer than :data:`MEMO_MIN_HIT_FRACTION` of the
#: lookups of a window of :data:`MEMO_PROBE` hit (building a key costs O(variables), which
#: only pays when states recur). Speed only: both ways give the same floats.
MEMO_PROBE: int = 1000
MEMO_MIN_HIT_FRACTION: float = 0.05

Solver = Callable[[Mapping[int, Sequence[int]], Mapping[int, float] | Sequence[float]],
                  dict[int, float]]


class Variable(Protocol):
    """What :class:`MaxMinSystem` needs of a variable (a flow): a unique integer id, the
    constraint (channel) ids it crosses, and its current rate (bytes/s), which the owner of the
    variable sets from :meth:`MaxMinSystem.solve`'s answer."""

    fid: int
    channels: tuple[int, ...]
    rate: float
    #: channels listed more than once in ``channels`` -> how many times (None: none is); a
    #: variable crossing a channel ``m`` times loads it with ``m`` times its rate. With
    #: ``weights``: each channel's coefficient (sum of the weights of its listings), where > 1
    mult: Mapping[int, int] | None
    #: the coefficient of each listing of ``channels`` (aligned; None: all 1). A quotient of
    #: channels (:mod:`dessim.network.quotient`) lists a block once with the number of the
    #: variable's crossings of each of its channels
    weights: tuple[int, ...] | None


V = TypeVar("V", bound=Variable)


#: From this many variables, :func:`_id_order` sorts with numpy (the same permutation).
_NUMPY_ORDER_FROM = 64


def _id_order(fids: list[int]) -> tuple[int, ...]:
    """The positions of ``fids`` (distinct ids) in ascending id order. The ids are distinct,
    so every sort gives this one permutation; numpy's is several times faster on the tens of
    thousands of variables of a large run (the state memo builds one per solve)."""
    n = len(fids)
    if n < _NUMPY_ORDER_FROM:
        return tuple(sorted(range(n), key=fids.__getitem__))
    return tuple(np.argsort(np.fromiter(fids, dtype=np.int64, count=n), kind="stable").tolist())


_channels_of = attrgetter("channels")
_weights_of = attrgetter("weights")
_rate_of = attrgetter("rate")


#: From this many freed constraints, :func:`_freed_key` sorts with numpy (the same bytes).
_NUMPY_FREED_FROM = 64


def _freed_key(freed: dict[int, float]) -> bytes:
    """The freed rates (bytes/s) per constraint, in ascending constraint order, as bytes:
    the constraint ids (int64) then the rates (float64). Equal bytes are equal items (the
    rates are sums of rates >= 0, never -0.0 or NaN, so equal floats have equal bytes), and
    bytes cache their hash; sorting the ids in numpy rather than the (id, rate) pairs in
    Python is several times faster on the tens of thousands of channels a large run frees
    between two solves; a few freed constraints (one flow's blocks) are sorted in Python
    into the same bytes (``array`` of int64 and float64, native order as numpy's), without
    numpy's per-call cost."""
    n = len(freed)
    if n < _NUMPY_FREED_FROM:       # the same bytes without numpy's per-call cost
        ids = sorted(freed)
        return array("q", ids).tobytes() + array("d", [freed[c] for c in ids]).tobytes()
    ids = np.fromiter(freed.keys(), dtype=np.int64, count=n)
    rates = np.fromiter(freed.values(), dtype=np.float64, count=n)
    order = np.argsort(ids, kind="stable")
    return ids[order].tobytes() + rates[order].tobytes()


class StateKey:
    """A key of :class:`MaxMinSystem`'s state memo: everything a solve's floats depend on
    (``parts``: the variables' channel tuples, weights and rates in order of addition, their
    id order, the joined positions, the freed rates (:func:`_freed_key`) and the modified
    constraints).

    Equal keys are equal ``parts`` (a memo hit is the very state). The hash leaves out the
    channel tuples and weights, which a tuple would re-hash channel by channel on every
    lookup (tens of thousands of channels per state on the CP preset; a tuple's hash is not
    cached): it is computed once, from the rest, and equal parts give equal hashes, so the
    memo answers exactly what a plain tuple key would. Speed only."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self._hash = hash(parts[2:])

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not StateKey:
            return NotImplemented
        return self._hash == other._hash and self.parts == other.parts

    def __getitem__(self, i: int):
        return self.parts[i]


class MaxMinSystem(Generic[V]):
    """Max-min fair rates of variables (flows) sharing constraints (channels), kept up to date
    incrementally — the structure of SimGrid's LMM system (``src/kernel/lmm/System.hpp`` and
    ``maxmin.cpp``: variables, constraints, a modified-constraint set, and a ``solve()`` that
    only touches what the modifications can reach).

    :meth:`add` and :meth:`remove` mark the constraints whose variable set changed;
    :meth:`insert` adds a variable that keeps its rate (a flow-bundle member whose rate is
    already the max-min one). :meth:`solve` then re-rates only the variables whose max-min rate
    can change (``incremental=True``; :meth:`_solve_incremental`), falling back to the
    connected component (variables coupled through shared constraints) of the modified
    constraints, which ``incremental=False`` always solves. The caller applies the answer:
    ``solve`` never sets a rate itself, so the owner can account progress at the old rate
    first.

    Deterministic and exact: every float operation depends only on the constraints' capacities
    (bytes/s, fixed), the variables' channel tuples, their rates, their order of addition per
    constraint and the order of their ids. Two memos exploit that (the same collective step
    recurs in every layer): the ``solver``'s answers per (channel tuples, capacities), and
    whole solves per system state. Both return the very floats a recomputation would; they
    are used with the default ``solver`` only (a custom one may not be a pure function).
    """

    def __init__(self, capacity: Sequence[float], *, solver: Solver = solve_maxmin,
                 incremental: bool = True) -> None:
        self.capacity = capacity
        self.solver = solver
        self.incremental = bool(incremental)
        #: Per constraint id: its variables by id, in order of addition (created on first
        #: use: a fabric has 10^4+ channels and most runs touch few of them).
        self.users: defaultdict[int, dict[int, V]] = defaultdict(dict)
        #: Every variable, in order of addition.
        self.variables: dict[int, V] = {}
        self.modified: set[int] = set()     # constraints whose variable set changed
        self.joined: list[V] = []           # variables added since the last solve
        self.freed: dict[int, float] = {}   # per constraint: rates of the variables removed
        #: Solves done on an affected set only / that fell back to the whole component.
        self.incremental_solves = 0
        self.fallback_solves = 0
        #: Solver calls and whole solves answered from the memos.
        self.memo_hits = 0
        self.state_hits = 0
        pure = solver is solve_maxmin
        self._memo: dict[tuple, tuple[float, ...]] | None = {} if pure else None
        self._states: dict[StateKey, tuple] | None = {} if pure else None
        self._state_vars = 0
        #: bumped whenever the state memo forgets its states (cleared or switched off), so
        #: whoever keeps facts about states (the flow network's certified states) drops them too
        self.state_generation = 0
        self._state_lookups = 0
        self._hits_before = 0
        #: the state key of the last :meth:`solve` (None: state memo off) and whether its
        #: answer came from the state memo — the same state as an earlier solve
        self.last_state: StateKey | None = None
        self.last_hit = False
        #: after a :meth:`solve` that re-rated an affected set (not answered from the state
        #: memo, no fallback): ``(load, largest rate)`` (bytes/s) of every channel of the
        #: re-rated variables at their new rates — the very floats :meth:`load` returns once
        #: the caller has applied them (same sums in the same order); None otherwise
        self.last_loads: dict[int, tuple[float, float]] | None = None

    def __len__(self) -> int:
        return len(self.variables)

    # ------------------------------------------------------------------ modifications
    def add(self, var: V) -> None:
        """``var`` starts sharing its constraints (its rate is set by the next solve)."""
        fid = var.fid
        self.variables[fid] = var
        self.joined.append(var)
        users = self.users
        chans = var.channels
        self.modified.update(chans)
        for c in chans:
            users[c][fid] = var

    def insert(self, var: V) -> None:
        """``var`` shares its constraints at its current rate, which is already max-min (no
        constraint is marked modified)."""
        fid = var.fid
        self.variables[fid] = var
        users = self.users
        for c in var.channels:
            users[c][fid] = var

    def remove(self, var: V) -> None:
        """``var`` leaves: its rate is freed on each of its constraints."""
        fid = var.fid
        del self.variables[fid]
        if not var.rate and var in self.joined:   # added and removed between two solves
            self.joined.remove(var)
        users, freed, rate = self.users, self.freed, var.rate
        get = freed.get
        chans = var.channels
        self.modified.update(chans)
        ws = var.weights
        if ws is None:
            for c in chans:             # a channel crossed m times frees m times the rate
                users[c].pop(fid, None)
                freed[c] = get(c, 0.0) + rate
        else:
            for c, w in zip(chans, ws):
                users[c].pop(fid, None)
                freed[c] = get(c, 0.0) + rate * w

    def split(self, c: int, parts: Sequence[int], keep: bool) -> None:
        """Constraint ``c`` becomes the constraints ``parts`` (new ids, each of ``c``'s
        capacity) besides ``c`` itself (``keep``) or instead of it: every variable on ``c``
        is on each of them with its coefficient on ``c`` — the same constraint written
        several times, so no rate or load changes (a quotient of channels refining its
        blocks, :mod:`dessim.network.quotient`). The caller rewrites the variables' own
        ``channels``/``weights``/``mult``; this keeps the per-constraint bookkeeping
        (users in the same order, modified marks, freed rates)."""
        on = self.users.get(c)
        for p in parts:
            if on:
                self.users[p] = dict(on)
            if c in self.modified:
                self.modified.add(p)
            if c in self.freed:
                self.freed[p] = self.freed[c]
        if not keep:
            self.users.pop(c, None)
            self.modified.discard(c)
            self.freed.pop(c, None)

    def load(self, c: int) -> tuple[float, float]:
        """Constraint ``c``'s load at the current rates (bytes/s; a variable crossing it ``m``
        times counts ``m`` times) and the largest rate of a variable on it."""
        load = top = 0.0
        for g in self.users[c].values():
            r = g.rate
            m = g.mult
            load += r if m is None else r * m.get(c, 1)
            if r > top:
                top = r
        return load, top

    # ------------------------------------------------------------------ solve
    def solve(self) -> tuple[list[V], Sequence[float], list[int]]:
        """Re-rate what the modifications since the last solve can affect.

        Returns the variables re-rated (ascending id; their rates may be unchanged), their
        new rates (bytes/s) in the same order, and the constraints whose load may have
        changed. The modifications are consumed.
        """
        key = self.last_state = self._state_key()
        self.last_hit = False
        self.last_loads = None
        if key is not None:
            got = self._states.get(key)
            if got is not None:
                self.state_hits += 1
                self.last_hit = True
                fallback, idx, vals, chans = got
                if fallback:
                    self.fallback_solves += 1
                elif self.incremental:
                    self.incremental_solves += 1
                self.modified, self.joined, self.freed = set(), [], {}
                allv = list(self.variables.values())
                return [allv[i] for i in idx], vals, list(chans)
        fallback = False
        out = self._solve_incremental() if self.incremental else None
        if out is None:
            fallback = self.incremental
            out = self._solve_component()
        if self.incremental:
            if fallback:
                self.fallback_solves += 1
            else:
                self.incremental_solves += 1
        solved, rates, chans = out
        vals = tuple([rates[v.fid] for v in solved])
        if key is not None:
            pos = {fid: i for i, fid in enumerate(self.variables)}
            self._remember(key, (fallback, tuple([pos[v.fid] for v in solved]), vals,
                                 tuple(chans)))
        return solved, vals, chans

    def _state_key(self) -> StateKey | None:
        """Everything a solve's floats depend on (see the class docstring), or None when the
        state memo is off. Variables are named by position in order of addition, which per
        constraint is the order of :attr:`users`."""
        if self._states is None:
            return None
        allv = self.variables
        self._state_lookups += 1
        if self._state_lookups % MEMO_PROBE == 0:
            if self.state_hits - self._hits_before < MEMO_MIN_HIT_FRACTION * MEMO_PROBE:
                self._states = None      # the states do not recur: stop paying for keys
                self.state_generation += 1
                return None
            self._hits_before = self.state_hits
        fids = list(allv)
        vs = allv.values()
        joined: tuple[int, ...] = ()
        if self.joined:
            pos = {fid: i for i, fid in enumerate(fids)}
            joined = tuple([pos[v.fid] for v in self.joined])
        return StateKey((tuple(map(_channels_of, vs)), tuple(map(_weights_of, vs)),
                         tuple(map(_rate_of, vs)), _id_order(fids), joined,
                         _freed_key(self.freed), frozenset(self.modified)))

    def _remember(self, key: StateKey, value: tuple) -> None:
        # variables, and the constraints a state names: freed, modified and touched ones
        n = len(key[0]) + len(key[-2]) // 16 + len(key[-1]) + len(value[3])   # 16 B per freed
        if self._state_vars + n > MAX_MEMO_STATE_VARS:
            self._states.clear()
            self._state_vars = 0
            self.state_generation += 1
        self._states[key] = value
        self._state_vars += n

    def rates(self, variables: list[V], capacity: Mapping[int, float] | Sequence[float],
              cap_key: tuple[float, ...] | None) -> dict[int, float]:
        """The solver's rates (bytes/s) of ``variables`` (in this order) on ``capacity``.

        With the default :func:`solve_maxmin` the answer is memoised: its rates depend only on
        the sequence of the variables' channel tuples and on the capacities of those channels
        (``cap_key``: their values in the order the solver meets the channels; None = the
        system's own capacities), not on the ids. Same floats.
        """
        ws = tuple([v.weights for v in variables])
        weighted = any(w is not None for w in ws)
        if self._memo is None:
            flows = {v.fid: v.channels for v in variables}
            if weighted:      # only then: a custom solver need not take weights
                return self.solver(flows, capacity, {v.fid: v.weights for v in variables})
            return self.solver(flows, capacity)
        chans = tuple([v.channels for v in variables])
        key = (chans, ws if weighted else None, cap_key)
        got = self._memo.get(key)
        if got is None:
            rates = self.solver(dict(enumerate(chans)), capacity,
                                dict(enumerate(ws)) if weighted else None)
            got = tuple(rates.values())
            if len(self._memo) >= MAX_MEMO_SOLVES:
                self._memo.clear()
            self._memo[key] = got
        else:
            self.memo_hits += 1
        return {v.fid: r for v, r in zip(variables, got)}

    def component(self) -> tuple[dict[int, V], list[int]]:
        """Variables and constraints coupled (through shared constraints) with the modified
        constraints."""
        users = self.users
        seen = bytearray(len(self.capacity))   # one mark per constraint: cheaper than a set
        stack = list(self.modified)
        for c in stack:
            seen[c] = 1
        chans = list(stack)
        flows: dict[int, V] = {}
        while stack:
            for fid, f in users[stack.pop()].items():
                if fid in flows:
                    continue
                flows[fid] = f
                for d in f.channels:
                    if not seen[d]:
                        seen[d] = 1
                        stack.append(d)
                        chans.append(d)
        return flows, chans

    def _solve_component(self) -> tuple[list[V], dict[int, float], list[int]]:
        flows, chans = self.component()
        self.modified, self.joined, self.freed = set(), [], {}
        members = [flows[fid] for fid in sorted(flows)]
        return members, self.rates(members, self.capacity, None), chans

    def _solve_incremental(self) -> tuple[list[V], dict[int, float], list[int]] | None:
        """Re-rate only the variables whose max-min rate can change; None = fall back.

        Start from the flows that joined and the flows on channels that were saturated when a
        flow left them (the others were bottlenecked elsewhere: the freed capacity does not
        reach them directly). Progressive filling runs on this affected set ``A``
        with every other flow's rate fixed (each channel's capacity minus the outside flows'
        rates). The result is the global max-min allocation iff every flow still has a
        bottleneck — a saturated channel on its path where no flow gets more (Bertsekas &
        Gallager, Data Networks §6.5.2). Only flows of ``A`` and outside flows sharing a
        channel with ``A`` can lose theirs (nothing else changed), so those are checked:

        * an outside flow without a bottleneck (its bottleneck channel was freed, or a flow of
          ``A`` now gets more there) joins ``A``;
        * a flow of ``A`` without one is held below an outside flow that gets more on a
          saturated channel: those outside flows join ``A``.

        Repeat until the check passes (the allocation is then the max-min one: the same rates
        as a full solve up to float rounding), or ``A`` outgrows the limit, or no flow can be
        added (float noise beyond :data:`SAT_TOL`): then the caller solves the whole component.
        Returns what :meth:`solve` does.
        """
        users, cap = self.users, self.capacity
        dirty = sorted(self.modified)
        limit = max(INCREMENTAL_MIN_LIMIT, int(INCREMENTAL_MAX_FRACTION * len(self.variables)))
        lo, hi = 1.0 - SAT_TOL, 1.0 + SAT_TOL
        aff: dict[int, V] = {f.fid: f for f in self.joined}
        for c, gone in sorted(self.freed.items()):
            on = users[c]
            if on:
                before = gone
                for g in on.values():
                    m = g.mult
                    before += g.rate if m is None else g.rate * m.get(c, 1)
                if before >= cap[c] * lo:
                    aff.update(on)
        fixed: dict[int, tuple[float, float]] = {}  # (load, top) of channels without A flows
        while True:
            if len(aff) > limit:
                return None
            order = sorted(aff)
            flows = [aff[fid] for fid in order]
            # residual capacity of every channel of A (in order of first appearance along
            # the flows of A): capacity minus the outside flows' rates
            resid: dict[int, float] = {}
            for c in dict.fromkeys(chain.from_iterable(map(_channels_of, flows))):
                outside = 0.0
                for gid, g in users[c].items():
                    if gid not in aff:
                        m = g.mult
                        outside += g.rate if m is None else g.rate * m.get(c, 1)
                r = cap[c] - outside
                resid[c] = r if r > 0.0 else 0.0
            rates = self.rates(flows, resid, tuple(resid.values()))
            # Per channel of A: load and largest rate with the new rates. A channel is "worse"
            # if it was saturated (it could be an outside flow's bottleneck) and is not any
            # more, or its largest rate grew: only outside flows on a worse channel can have
            # lost their bottleneck. (A channel a flow left is not saturated by the flows that
            # remain; if it was saturated before, every one of them is in A.)
            stats: dict[int, tuple[float, float]] = {}
            sat: dict[int, float] = {}      # the saturated ones -> their largest rate
            worse: list[int] = []
            new_rate = rates.get            # the rates of A's flows (keyed by A's ids)
            for c in resid:
                load = top = load0 = top0 = 0.0
                for gid, g in users[c].items():
                    r0 = g.rate
                    r = new_rate(gid, r0)
                    m = g.mult
                    if m is None:
                        load += r
                        load0 += r0
                    else:
                        k = m.get(c, 1)
                        load += r * k
                        load0 += r0 * k
                    if r > top:
                        top = r
                    if r0 > top0:
                        top0 = r0
                stats[c] = (load, top)
                full = cap[c] * lo
                if load >= full:
                    sat[c] = top
                if load0 >= full and (load < full or top > top0 * hi):
                    worse.append(c)
            grow: dict[int, V] = {}
            top_of = sat.get
            for f in flows:     # flows of A: held below an outside flow?
                bound = rates[f.fid] * hi
                chans = f.channels
                for top in map(top_of, chans):      # a saturated channel where none is faster
                    if top is not None and top <= bound:
                        break
                else:
                    for c in chans:
                        if c in sat:
                            for gid, g in users[c].items():
                                if gid not in aff and g.rate > bound:
                                    grow[gid] = g
            for c in worse:     # outside flows on a worse channel: still bottlenecked?
                for gid, g in users[c].items():
                    if gid in aff or gid in grow:
                        continue
                    bound = g.rate * hi
                    for d in g.channels:
                        st = stats.get(d)
                        if st is None:
                            st = fixed.get(d)
                            if st is None:
                                st = fixed[d] = self.load(d)
                        if st[0] >= cap[d] * lo and st[1] <= bound:
                            break
                    else:
                        grow[gid] = g
            if not grow:
                break
            aff.update(grow)
        if not all(r > 0.0 for r in rates.values()):
            return None       # float noise left a flow of A without capacity: solve it all
        self.modified, self.joined, self.freed = set(), [], {}
        self.last_loads = stats
        return flows, rates, sorted(set(resid).union(dirty))
