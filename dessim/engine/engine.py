"""The replay engine: runs a :class:`~dessim.taskgraph.TaskGraph` on a topology with simpy.

Semantics (see also :mod:`dessim.taskgraph.model`):

* Every (rank, stream) runs its tasks one at a time in program order. A task starts when
  its dependencies are done and its stream has finished the previous task.
* ``compute`` tasks last their ``duration``, or what the device model says for their
  FLOPs/bytes, multiplied by the rank's slowdown factor (stragglers).
* ``send``/``recv`` pairs rendezvous: the transfer starts on the network when both tasks
  have started; both end when the last byte arrives.
* ``collective`` tasks: the collective's schedule of transfers (from
  :mod:`dessim.collectives`) runs on the network; a transfer starts once its own
  dependencies are done and both its ranks have started their task (arrived). A member's
  task ends when its own last transfer ends. Everything shares the links with all other
  traffic of the run, so concurrent collectives and sends slow each other down.
* ``memcpy`` moves bytes between the rank's GPU and a memory node over the topology.
* Folded graphs (:mod:`dessim.taskgraph.fold`): tasks exist for representative ranks only;
  a send moves its bytes on every lane (as exact bundle groups where possible), a collective
  runs on every distinct image of its group, and a task ends when its last lane does. The
  result's per-rank figures cover the representatives, and ``meta["fold"]`` reports the
  largest lane skew (0: every lane stayed in step, the run equals the unfolded one).

The engine is callback-driven (no simpy process per task): one simpy event per compute
task and the network's own events for communication. Runs are deterministic.
"""

from __future__ import annotations

import heapq
import math
import time
import zlib
from collections import Counter
from dataclasses import replace
from itertools import repeat
from typing import Callable, Sequence

import numpy as np
import simpy

from dessim.collectives import CollectivePlan, plan_collective, run_schedule
from dessim.collectives.executor import family_refusal, merge_instances
from dessim.collectives.schedule import CompactSchedule, Schedule, is_relabelling, orbit_plan
from dessim.engine.device import RankDevices
from dessim.engine.intervals import length, subtract, union
from dessim.engine.links import LinkProof
from dessim.engine.memlanes import memcpy_lanes
from dessim.engine.options import EngineOptions, Noise
from dessim.engine.progress import Ticker
from dessim.engine.result import RankTimes, SimulationResult
from dessim.errors import DessimError, TaskGraphError
from dessim.network import make_network
from dessim.network.base import sparse_bytes
from dessim.network.families import ComposedLaneFamily, LaneFamily, QuotientBroken
from dessim.network.flow import WAKE_PRIORITY
from dessim.taskgraph.collector import LARGE_GRAPH_TASKS, Freezer, collector_paused, heap_frozen
from dessim.taskgraph.model import ALGO_OPTIONS, Task, TaskGraph
from dessim.taskgraph.table import TaskTable, task_table
from dessim.topology.calibrate import calibrated_topology
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map

__all__ = ["EngineOptions", "simulate", "straggler_factors"]

ComputeCost = Callable[[Task], float]


def straggler_factors(num_ranks: int, noise: Noise) -> list[float]:
    """Per-rank compute slowdown factors: explicit ``slowdown`` times the seeded random one."""
    factors = [1.0] * num_ranks
    if noise.straggler_sigma > 0:
        rng = np.random.default_rng(noise.seed)
        draws = np.abs(rng.normal(0.0, noise.straggler_sigma, size=num_ranks))
        factors = [1.0 + float(d) for d in draws]
    for rank, f in noise.slowdown.items():
        if not 0 <= rank < num_ranks:
            raise TaskGraphError(f"slowdown given for rank {rank}, which does not exist "
                                 f"(ranks 0..{num_ranks - 1})")
        factors[rank] *= f
    return factors


class _Late(simpy.Event):
    """An event at the end of the current instant (simpy priority
    :data:`~dessim.network.flow.WAKE_PRIORITY`: after every ordinary event of this instant)
    that calls ``callback``."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None]) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        self.callbacks.append(callback)
        env.schedule(self, WAKE_PRIORITY, 0.0)


class _Join:
    """Calls ``done`` once ``n`` lane completions have arrived, and records how far apart in
    time they came (the lane skew of a folded run)."""

    __slots__ = ("run", "left", "first", "done")

    def __init__(self, run: "_Run", n: int, done: Callable[[], object]) -> None:
        self.run, self.left, self.first, self.done = run, n, -1.0, done

    def one(self, _event: object = None) -> None:
        self.hit(1)

    def members(self, members: Sequence[int]) -> None:
        """A bundle's ``on_done``: ``members`` of it completed now."""
        self.hit(len(members))

    #: the join is a bundle's ``on_done`` itself; a network reporting split bundle members
    #: that finish together calls ``each`` with all of them at once (``flow._report``):
    #: ``members((k,))`` for each ``k`` at one instant is ``hit(1)`` that many times, which
    #: is ``hit`` of their number (``left`` reaches 0 only with the lanes' last completion)
    __call__ = each = members

    def hit(self, k: int) -> None:
        now = self.run.env.now
        if self.first < 0:
            self.first = now
        self.left -= k
        if self.left == 0:
            skew = now - self.first
            if skew > _SKEW_RTOL * now:
                self.run.skewed_tasks += 1
                self.run.lane_skew = max(self.run.lane_skew, skew)
            self.done()


#: Task kinds that move bytes over the network.
_NET_KINDS = frozenset(("collective", "send", "recv", "memcpy"))

#: Lane finish times closer than this (relative to the time) count as together (float noise).
_SKEW_RTOL = 1e-12


class _Run:
    """State of one replay (kept out of the public API)."""

    def __init__(self, graph: TaskGraph | TaskTable, topology: Topology, options: EngineOptions,
                 compute_cost: ComputeCost | None, *,
                 rank_rotations: bool | frozenset[str] = True) -> None:
        topology = calibrated_topology(topology, options.calibration)
        #: the graph's columns (a generator's runs of rows are read as they are: a ``Task``
        #: is made only for a task that is planned, paired or costed, docs/performance.md
        #: "Generation: the engine reads rows")
        table = task_table(graph) if not isinstance(graph, TaskTable) else graph
        graph = table.graph
        p2p, colls = table.check(num_ranks=topology.num_gpus)
        self.table = table
        self.graph = graph
        self.topology = topology
        self.options = options
        self.calibration = options.model_calibration          # merged once per run
        self.compute_cost = compute_cost or RankDevices(topology, options.device, options.precision,
                                                        self.calibration)
        self.env = simpy.Environment()
        self.shortcuts = options.shortcuts
        self.net = make_network(options.network, self.env, topology, record_links=options.record_links,
                                bundles=self.shortcuts.bundles)
        self.factors = straggler_factors(topology.num_gpus, options.noise)
        jitter = options.noise.kernel_jitter_sigma
        #: per compute task, log-normal of mean 1 (Noise); its own stream of the seed
        self.jitter = (jitter, np.random.default_rng([options.noise.seed, 1])) if jitter > 0 else None
        #: tasks in graph order (each made when first read; ``made[i] or tasks[i]`` reads
        #: one at list speed), their kinds and ranks
        self.tasks: Sequence[Task] = table.tasks
        self.made: list[Task | None] = table.made
        self.kinds, self.ranks = table.kinds, table.ranks
        #: per task, the tasks waiting for it (edge order: the release order; task ``i``'s
        #: are ``succ_base[i] + x`` for ``x`` in ``succ_rel[i]``, then ``succ_extra[i]``) and
        #: how many it still waits for
        self.succ_rel, self.succ_base, self.succ_extra = table.succ_rel, table.succ_base, table.succ_extra
        self.pending = list(table.waits)
        # streams: (rank, stream) -> queue of task indices in program order
        self.queues: dict[tuple[int, str], list[int]] = table.queues
        self.stream_of: list[tuple[int, str]] = table.keys
        self.head = dict.fromkeys(self.queues, 0)
        self.busy = dict.fromkeys(self.queues, False)
        # peers
        self.partner: dict[int, int] = {}
        for s, r in p2p.items():
            self.partner[s] = r
            self.partner[r] = s
        self.colls = colls
        self.settings = options.collectives
        self.forced_algo = options.forced_algo
        #: collective memo (Shortcuts.collective_memo): key -> (duration, bytes per link
        #: direction). ``memo_static``: every collective is exclusive by the graph's
        #: structure; otherwise one is exclusive when it is the only running task.
        self.memo_on = self.shortcuts.collective_memo and not options.record_links
        self.memo_static = self.memo_on and self._exclusive_collectives()
        self.coll_memo: dict[tuple, tuple[float, np.ndarray]] = {}
        self.memo_hits = 0
        #: memo key -> (runs, :meth:`_tally`) of its instances (planned at the key's first replay)
        self.replayed_instances: dict[tuple, tuple[int, list]] = {}
        #: per-link exclusivity (Shortcuts.link_memo, dessim.engine.links): collectives that
        #: are not alone on the network but alone on their channels are memoised too. Off
        #: with jitter (a duration is drawn when its task starts) and with a caller's own
        #: compute costing (the proofs cost tasks ahead of time)
        self.links = (LinkProof(self) if self.memo_on and not self.memo_static
                      and self.shortcuts.link_memo and self.jitter is None and compute_cost is None
                      else None)
        self.net_running = 0              #: network tasks started and not finished
        self.net_starts = 0               #: network tasks started so far
        #: (end time, task) of started compute and delay tasks (finished ones popped lazily)
        self.timed: list[tuple[float, int]] = []
        self.deferred: list[int] = []     #: single-member collectives arrived this instant
        #: the per-link memo of collectives of several member tasks (:meth:`_arrive_collective`):
        #: key -> ((member rank, its end after the start (s)) in finishing order, traffic);
        #: and per collective (coll_id) whose key it holds, its members arrived this instant
        self.multi_memo: dict[tuple, tuple[tuple[tuple[int, float], ...], tuple]] = {}
        self.multi_wait: dict[str, list[int]] = {}
        #: (category, algorithm, protocol) -> collective instances run with it, simulated or
        #: replayed from a memo (reported in the result: what ``auto`` chose for each group)
        self.choices: dict[tuple[str, str, str], int] = {}
        self.coll_state: dict[str, dict] = {}
        self.schedules: dict[tuple, object] = {}
        self.merged: dict[tuple, CompactSchedule | None] = {}   #: see _merged
        self.merged_runs = 0          #: collective starts whose images ran as one schedule
        #: lane families (Shortcuts.lane_families): per plan tuple the family or None; the
        #: family of point-to-point transfers (every other lane); starts that used one
        self.families_on = (self.shortcuts.lane_families and graph.fold is not None
                            and graph.fold.lanes > 1 and not self.shortcuts.stream_rings
                            and self.net.certifies_families)
        self.families: dict[tuple, LaneFamily | None] = {}
        self.orbits_on = self.families_on and self.shortcuts.lane_orbits
        self.orbits: dict[tuple, tuple | None] = {}
        self.p2p_family = (LaneFamily.of_lanes(graph.fold.perm, range(1, graph.fold.lanes))
                           if self.families_on else None)
        #: the channel quotient (Shortcuts.channel_quotient): family flows cross hundreds of
        #: channels that no route tells apart; rate them on blocks of such channels
        self.quotient_on = (self.families_on and self.shortcuts.channel_quotient
                            and self.net.use_channel_quotient())
        self.family_runs = 0
        self.orbit_runs = 0                   #: of which ran one transfer per orbit (_orbit_run)
        #: whether orbits may rotate ranks inside hosts (host x rank rotations, _rotations):
        #: True for every collective; else the collectives (coll_id) that may (see simulate)
        self.rank_rotations = rank_rotations
        self.rank_rotation_runs = 0           #: orbit runs whose symmetry rotated ranks in hosts
        #: why the host x rank rotations were refused (the replay kept host rotations alone)
        self.rank_rotations_refused: str | None = None
        self.p2p_refused: set[tuple[int, int]] = set()   #: sends refused a family (ECMP, latency)
        #: per folded send (src, dst): its lanes' images and bundle groups (:meth:`_lanes_of`)
        self.p2p_lanes: dict[tuple[int, int], tuple] = {}
        #: per (rank, memory node) of a memcpy: its lanes' (GPU, memory node) pairs
        self.mem_lanes: dict[tuple[int, str], tuple[tuple[str, str], ...]] = {}
        #: per collective group of a folded graph: ``where`` of its instance 0 alone
        self.where0: dict[tuple[int, ...], dict] = {}
        self.families_refused: str | None = None   #: why a run with families was replayed
        self.orbits_refused: str | None = None     #: why a run with orbits was replayed
        # records
        self.start = [float("nan")] * len(self.tasks)
        self.durations = table.durations
        self.active = [float("nan")] * len(self.tasks)
        self.end = [float("nan")] * len(self.tasks)
        self.done_count = 0
        #: progress for a watcher (dessim.engine.progress): checked when done_count reaches it
        self.ticker = Ticker(len(self.tasks))
        self.next_tick = self.ticker.next_at
        self.engine_events = 0
        # replica folding: lanes of every transfer and collective, and how far they drifted
        self.fold = graph.fold
        self.lane_skew = 0.0          #: largest spread of lane finish times of one task (s)
        self.skewed_tasks = 0         #: tasks whose lanes did not finish together
        self.collective_runs = 0      #: schedules started (one per collective instance)
        self.streamed_runs = 0        #: of which ran as coupled flows (stream_rings)
        #: ranks that hold tasks of a folded graph (its representatives)
        self.simulated_ranks = (sorted(set(self.ranks)) if self.fold is not None
                                else list(range(topology.num_gpus)))
        if self.fold is not None:
            self._check_fold_speeds()

    def _exclusive_collectives(self) -> bool:
        """Whether every collective has the network to itself for its whole run: the only
        network tasks are collectives, all on one (rank, stream) — so the stream's FIFO
        runs them one after another — and each has one member task (a folded graph's
        representative), so a collective ends only when every lane of it has. Then a
        collective's run depends on nothing but its own (op, size, group, algorithm), and
        the engine simulates each such collective once and replays it (exact up to float
        rounding of the start time)."""
        kinds = set(self.kinds)
        if "collective" not in kinds or not kinds.isdisjoint(("send", "recv", "memcpy")):
            return False
        net = [i for i, k in enumerate(self.kinds) if k == "collective"]
        if len({self.stream_of[i] for i in net}) != 1:
            return False
        return all(len(members) == 1 for members in self.colls.values())

    def _check_fold_speeds(self) -> None:
        fold = self.fold
        if self.jitter is not None:
            raise TaskGraphError("folded graph: noise.kernel_jitter_sigma draws every rank's tasks "
                                 "apart, but a folded rank stands for identical replicas — generate "
                                 "the graph unfolded to study jitter")
        for r in self.simulated_ranks:
            images = fold.images(r)
            slow = [x for x in images if self.factors[x] != self.factors[r]]
            if slow:
                raise TaskGraphError(f"folded graph: rank {slow[0]} (an image of rank {r}) has compute "
                                     f"slowdown {self.factors[slow[0]]:g} but rank {r} has "
                                     f"{self.factors[r]:g}; replicas must be identical — generate "
                                     "the graph unfolded to study stragglers")

    # ------------------------------------------------------------ scheduling
    def try_start(self, key: tuple[int, str]) -> None:
        if self.busy[key]:
            return
        queue = self.queues[key]
        h = self.head[key]
        if h >= len(queue):
            return
        i = queue[h]
        if self.pending[i]:
            return
        self.busy[key] = True
        self.start_task(i)

    def start_task(self, i: int) -> None:
        now = self.env.now
        self.start[i] = now
        self.engine_events += 1
        kind = self.kinds[i]
        if kind in _NET_KINDS:
            self.net_running += 1
            self.net_starts += 1
            if self.links is not None and self.links.watches:
                self.links.started(i)
        if kind == "compute" or kind == "delay":
            self.active[i] = now
            dur = self.duration_of(i)
            if self.memo_on:
                heapq.heappush(self.timed, (now + dur, i))
                if self.links is not None:
                    self.links.due[i] = now + dur
            ev = self.env.timeout(dur)
            ev.callbacks.append(lambda _e, i=i: self.finish(i))
        elif kind in ("send", "recv"):
            j = self.partner[i]
            if self.start[j] == self.start[j]:  # partner already started (not NaN)
                self.active[i] = self.active[j] = now
                self._start_p2p(i, j)
        elif kind == "collective":
            self._arrive_collective(i)
        elif kind == "memcpy":
            self.active[i] = now
            self._start_memcpy(i)
        else:  # pragma: no cover - Task validates kinds
            raise AssertionError(kind)

    def _start_memcpy(self, i: int) -> None:
        """Move memcpy task ``i``'s bytes: between its rank's GPU and its memory node, and in a
        folded graph on every lane, each image between its GPU and its own memory node
        (:func:`~dessim.engine.memlanes.memcpy_lanes`); the task ends when the last lane has
        (the lane join records any skew). ECMP key: the task's position, as unfolded (folded
        lanes have routes no key changes)."""
        t = self.tasks[i]
        lanes = self.memcpy_lanes(t.rank, t.mem_node, f"task {t.id!r}")
        to_hbm = t.direction == "to_hbm"
        if len(lanes) == 1:
            gpu, mem = lanes[0]
            ev = self.net.transfer(*((mem, gpu) if to_hbm else (gpu, mem)), t.size, key=i)
            ev.callbacks.append(lambda _e, i=i: self.finish(i))
            return
        join = _Join(self, len(lanes), lambda i=i: self.finish(i))
        for gpu, mem in lanes:
            ev = self.net.transfer(*((mem, gpu) if to_hbm else (gpu, mem)), t.size, key=i)
            ev.callbacks.append(join.one)

    def memcpy_lanes(self, rank: int, mem_node: str, where: str = "memcpy") -> tuple[tuple[str, str], ...]:
        """``(GPU node, memory node)`` of every lane of a memcpy of ``rank`` to/from
        ``mem_node`` (:func:`~dessim.engine.memlanes.memcpy_lanes`; ``where`` names the task
        in its errors), cached per pair: a function of the pair alone, shared by every such
        task and by the per-link memo's footprints."""
        key = (rank, mem_node)
        got = self.mem_lanes.get(key)
        if got is None:
            got = self.mem_lanes[key] = memcpy_lanes(self.net.router, self.topology, self.fold,
                                                     rank, mem_node, where)
        return got

    def task_duration(self, t: Task) -> float:
        """Seconds compute/delay task ``t`` takes on its rank (given, or costed by the device
        model; times the rank's slowdown factor and jitter for compute)."""
        if t.duration is not None:
            base = t.duration
        else:
            base = self.compute_cost(t)
        return self._scaled_duration(base, t.kind, t.rank)

    def duration_of(self, i: int) -> float:
        """:meth:`task_duration` of task ``i`` (position), read from the columns: the task
        is made only when the device model costs it."""
        base = self.durations[i]
        if base is None:
            base = self.compute_cost(self.tasks[i])
        return self._scaled_duration(base, self.kinds[i], self.ranks[i])

    def _scaled_duration(self, base: float, kind: str, rank: int) -> float:
        """``base`` seconds of a ``kind`` task on ``rank``, with its slowdown and jitter."""
        if kind != "compute":
            return base
        if self.jitter is not None:
            sigma, rng = self.jitter
            base *= math.exp(sigma * rng.standard_normal() - sigma * sigma / 2)
        return base * self.factors[rank]

    def plan(self, t: Task, group: tuple[int, ...]):
        """The :class:`~dessim.collectives.CollectivePlan` of collective task ``t`` on
        ``group`` (its own group, or an image of it in a folded graph). Cached: identical
        collectives on the same group share one plan; ``auto`` is decided once per such
        collective."""
        algo, options = self._algo(t)
        key = (t.op, t.size, group, algo, options)
        plan = self.schedules.get(key)
        if plan is None:
            try:
                plan = plan_collective(t.op, group, t.size, self.topology,
                                       self.settings.with_(algo=algo),
                                       compact_schedules=self.shortcuts.compact_schedules,
                                       calibration=self.calibration, **dict(options))
            except DessimError as exc:
                raise type(exc)(f"collective {t.coll_id!r} (task {t.id!r}): {exc}") from None
            self.schedules[key] = plan
        return plan

    @staticmethod
    def _tally(t: Task, plans: Sequence[CollectivePlan]) -> list[tuple[tuple[str, str, str], int]]:
        """One run of collective task ``t`` per plan (one per instance of its group), per
        (summary category — ``category or kind``, as the exposed-time accounting —,
        algorithm, protocol). Counted per distinct plan object (``plan`` is a cache: a
        folded collective's thousands of instances share a few), in C loops."""
        cat = t.category or t.kind
        counts = Counter(map(id, plans))
        by_id = dict(zip(map(id, plans), plans))
        return [((cat, by_id[k].schedule.algorithm, by_id[k].protocol.name), n)
                for k, n in counts.items()]

    def _chose(self, tally: list[tuple[tuple[str, str, str], int]]) -> None:
        """Add a :meth:`_tally` to the runs per choice (reported in the result)."""
        choices = self.choices
        for k, n in tally:
            choices[k] = choices.get(k, 0) + n

    def _start_p2p(self, i: int, j: int) -> None:
        """Both ends of a send/recv pair have started: move the bytes (on every lane of a
        folded graph). ECMP key 0 for every send: NCCL keeps one connection (queue pair)
        per peer pair, whose packets all hash to one path, so every transfer between two
        ranks takes the same path whatever order transfers start in."""
        send, recv = (i, j) if self.tasks[i].kind == "send" else (j, i)
        st = self.tasks[send]
        src, dst, size, key = st.rank, st.peer, st.size, 0
        fold = self.fold
        if fold is None:
            ev = self.net.transfer(src, dst, size, key=key)
            ev.callbacks.append(lambda _e, a=i, b=j: (self.finish(a), self.finish(b)))
            return
        srcs, dsts, groups = self._lanes_of(src, dst)
        bundled = groups is not None and all(t is not None for t, _ in groups)
        # lanes that travel as exact bundles cost one entity while alone (numpy, no solve);
        # otherwise one family flow for every lane (certified) instead of one flow per lane
        if not bundled and self.p2p_family is not None and (src, dst) not in self.p2p_refused:
            try:
                ev = self.net.transfer(src, dst, size, key=key, family=self.p2p_family)
            except QuotientBroken:             # e.g. ECMP paths: every lane as its own flow
                self.p2p_refused.add((src, dst))
            else:
                self.family_runs += 1
                ev.callbacks.append(lambda _e, a=i, b=j: (self.finish(a), self.finish(b)))
                return
        join = _Join(self, len(srcs), lambda a=i, b=j: (self.finish(a), self.finish(b)))
        if groups is None:
            groups = ((None, tuple(range(len(srcs)))),)
        for template, members in groups:
            if template is not None:
                self.net.start_bundle(template, size, join)
                continue
            for k in members:
                self.net.transfer(srcs[k], dsts[k], size, key=key).callbacks.append(join.one)

    def _lanes_of(self, src: int, dst: int) -> tuple:
        """The lane images of a folded send ``src -> dst`` and their bundle groups (None
        without bundles), computed once per pair: both are functions of the pair alone (the
        fold's permutation; :meth:`FlowNetwork.bundle_groups` is deterministic for ECMP key
        0), so each send of the pair reuses them instead of rebuilding the 2 x lanes lists
        and their cache key."""
        got = self.p2p_lanes.get((src, dst))
        if got is None:
            fold = self.fold
            srcs, dsts = fold.images(src), fold.images(dst)
            groups = self.net.bundle_groups(srcs, dsts, 0) if self.shortcuts.bundles else None
            got = self.p2p_lanes[src, dst] = (srcs, dsts, groups)
        return got

    def _where_in_first(self, group: tuple[int, ...], where: dict[int, list[tuple[int, int]]]
                        ) -> dict[int, list[tuple[int, int]]]:
        """``where`` (:meth:`Fold.instances` of ``group``) restricted to instance 0, computed
        once per group: a function of the group alone, read and never modified, and each
        collective on the group that runs as a lane family would otherwise filter its members'
        ``lanes`` pairs again."""
        got = self.where0.get(group)
        if got is None:
            got = self.where0[group] = {r: [(k, x) for k, x in pairs if k == 0]
                                        for r, pairs in where.items()}
        return got

    def _lane_family(self, t: Task, instances: list[tuple[int, ...]], plans: list) -> LaneFamily | None:
        """The lane family that lets instance 0 of collective task ``t`` stand for the other
        ``instances`` (:mod:`dessim.network.families`): when families are on and every other
        instance's plan is instance 0's renamed by the lane that maps the group onto it
        (:func:`~dessim.collectives.schedule.is_relabelling`: same transfers, bytes,
        channels and dependencies), with the same protocol. Image ``i`` keeps its own
        communicator's ECMP key base. None otherwise. Cached per plan tuple."""
        if not self.families_on:
            return None
        key = tuple(id(p) for p in plans)
        if key in self.families:
            return self.families[key]
        perm = self.fold.perm
        lane_of: dict[tuple[int, ...], int] = {}
        for k, row in enumerate(perm[:, list(instances[0])].tolist()):
            lane_of.setdefault(tuple(row), k)
        first = plans[0]
        family = None
        lanes = [lane_of.get(tuple(inst)) for inst in instances[1:]]
        if all(k is not None for k in lanes) and all(
                p.protocol == first.protocol and is_relabelling(first.schedule, p.schedule, perm[k])
                for p, k in zip(plans[1:], lanes)):
            base = self._key_base(first.schedule.communicator)
            family = LaneFamily(tuple(perm[k] for k in lanes),
                                tuple(self._key_base(p.schedule.communicator) - base for p in plans[1:]))
            if family_refusal(self.net, first.schedule, base, family) is not None:
                family = None          # e.g. ECMP paths: every instance runs
        self.families[key] = family
        return family

    def _orbit_run(self, plan, family: LaneFamily | None,
                   alone: bool, in_hosts_ok: bool = True) -> tuple[CompactSchedule, LaneFamily, bool] | None:
        """The run of ``plan`` (instance 0 of a folded collective; ``family``: its other
        instances, or None when it has none) with ONE transfer per orbit of a symmetry of the
        schedule that acts on its group freely (:func:`~dessim.collectives.schedule.orbit_plan`):
        a ring step's p sends become one (or one per rank of the first host). The symmetry is
        the lanes that map the group onto itself when there is one per member (every member
        is then a lane image of the first, so all arrive together); else, when the group's
        ranks all arrive together anyway (``alone``: one member task, whose images fill the
        group), the first of :meth:`_rotations` that the schedule and the network keep. Every
        rank ends with its orbit's representative (``account``). Returns the reduced schedule,
        the family of everything it stands for — each kept transfer's images under the
        symmetry, in every instance — and whether that symmetry rotates ranks inside hosts
        (the host x rank rotations). None otherwise. Cached."""
        key = (id(plan), id(family), alone, in_hosts_ok)
        if key in self.orbits:
            return self.orbits[key]
        got = None
        sched = plan.schedule
        group = list(sched.group)
        perm = self.fold.perm
        candidates: list[tuple[list[np.ndarray], bool]] = []
        if type(sched) in (CompactSchedule, Schedule) and len(group) > 1:
            stab = np.flatnonzero((np.sort(perm[:, group], axis=1) == np.sort(group)).all(axis=1))
            if len(stab) == len(group):
                candidates.append(([perm[k] for k in stab], False))
            if alone:
                candidates += self._rotations(group)
        images = [(perm[0], 0)] + (list(zip(family.perms, family.key_offsets))
                                  if family is not None else [])
        base = self._key_base(sched.communicator)
        for sym, in_hosts in candidates:   # the first symmetry of the schedule the network keeps
            if in_hosts and not in_hosts_ok:
                continue
            reduced = orbit_plan(sched, sym)
            if reduced is None:
                continue
            # the maps lane[m] for every lane and symmetry map but the representative's own,
            # kept as their factors (ComposedLaneFamily: the same images)
            whole = ComposedLaneFamily.compose([lane for lane, _ in images],
                                               [off for _, off in images], sym)
            if family_refusal(self.net, reduced, base, whole) is None:
                got = (reduced, whole, in_hosts)
                break
        self.orbits[key] = got
        return got

    def _rotations(self, group: list[int]) -> list[tuple[list[np.ndarray], bool]]:
        """Candidate symmetries of a schedule on ``group`` (rank maps over all ranks, identity
        first, identity outside the group; each acts on the group freely), tried in order:
        the rotations of the group's order (a ring's own rotations); then, when every host
        holds the same number of the group's ranks, the rotations of hosts combined with the
        rotations of ranks inside a host (what maps an all-to-all over hosts onto itself host
        for host), and the rotations of hosts alone (what maps a ring over hosts, host by
        host in ring order, onto itself: one kept transfer per rank of the first host).

        Each comes with whether it moves a rank to another position inside its host (GPU
        index on the host, hence rail). Traffic beside the schedule that treats a host's GPUs
        differently (a data-parallel ring entering a host at its first GPU and leaving at its
        last) breaks such a symmetry but not the rotations of whole hosts, which every host
        doing the same thing keeps: the replay after a failed certificate drops only those
        (``rank_rotations``)."""
        ident = np.arange(self.fold.perm.shape[1])
        out = []
        rot = []
        for k in range(len(group)):
            m = ident.copy()
            m[group] = np.roll(group, -k)
            rot.append(m)
        hosts_of = host_map(self.topology)
        out.append((rot, self._moves_in_hosts(rot, group)))
        rows = hosts_of.split(group)
        if len(rows) > 1 and len({len(r) for r in rows}) == 1 and len(rows[0]) > 1:
            grid = np.asarray(rows, dtype=np.int64)
            both = []
            for a in range(grid.shape[0]):
                for b in range(grid.shape[1]):
                    m = ident.copy()
                    m[grid.ravel()] = np.roll(np.roll(grid, -a, axis=0), -b, axis=1).ravel()
                    both.append(m)
            out.append((both, self._moves_in_hosts(both, group)))
            hosts = []
            for a in range(grid.shape[0]):
                m = ident.copy()
                m[grid.ravel()] = np.roll(grid, -a, axis=0).ravel()
                hosts.append(m)
            out.append((hosts, self._moves_in_hosts(hosts, group)))
        return out

    def ended_before(self, when: float) -> frozenset[str]:
        """The collectives (coll_id) whose member tasks all ended before ``when`` (s)."""
        end = self.end
        return frozenset(cid for cid, members in self.colls.items()
                         if all(end[m] < when for m in members))

    def _moves_in_hosts(self, maps: list[np.ndarray], group: list[int]) -> bool:
        """Whether some map of ``maps`` sends a member of ``group`` to a rank at another
        position inside its host (the index among its host's GPUs)."""
        hosts = host_map(self.topology)
        local = {r: hosts.host_of(r).gpus.index(r) for r in group}
        return any(local[int(m[g])] != local[g] for m in maps for g in group)

    def _merged(self, t: Task, instances: list[tuple[int, ...]], plans: list) -> CompactSchedule | None:
        """The images of collective task ``t`` in a folded graph as one schedule, when that
        is exact (:func:`~dessim.collectives.executor.merge_instances`: same shape, disjoint
        groups, key-independent routes, same charges) and the plans agree on the protocol;
        not with streamed rings (their runs are counted per instance), nor with the
        ``merged_images`` shortcut off. Cached."""
        if self.shortcuts.stream_rings or not self.shortcuts.merged_images:
            return None
        key = self.memo_key(t)          # the collective: op, size, group, algorithm and options
        if key in self.merged:
            return self.merged[key]
        got = None
        if len({(p.schedule.algorithm, p.protocol.name) for p in plans}) == 1:
            got = merge_instances(self.net, [p.schedule for p in plans])
        self.merged[key] = got
        return got

    def _shared_arrivals(self, members: Sequence[int], where: dict[int, list[tuple[int, int]]],
                         instances: list[tuple[int, ...]]) -> dict[int, simpy.Event] | None:
        """One arrival event per member task's rank of a merged run (``where``: its images,
        all in instance 0). The images of a member arrive at one instant, so they share the
        event, listed in the run's arrivals in the order ``where`` gives them: the run calls
        them in that order, as one event per image succeeded in that order would
        (:func:`~dessim.collectives.executor.run_schedule`) — two simpy events fewer per
        image and collective. None (one event per image) unless the members' images cover
        the merged group exactly once each (members of a folded graph lie in distinct
        orbits)."""
        ranks = [self.ranks[m] for m in members]
        images = [image for r in ranks for _, image in where[r]]
        if len(images) != len(set(images)) or set(images) != set(instances[0]):
            return None
        return {r: self.env.event() for r in ranks}

    def _key_base(self, group: tuple[int, ...]) -> int:
        """ECMP key base of collectives on ``group``: one per group, as a communicator's
        connections are set up once and reused by all its collectives (so their paths do not
        depend on the order collectives start in)."""
        return (zlib.crc32(repr(group).encode()) + 1) << 20

    def _replay_collective(self, i: int, key: tuple) -> bool:
        """Replay an exclusive collective from the memo; False if it is not there yet."""
        hit = self.coll_memo.get(key)
        if hit is None:
            return False
        duration, carried = hit
        self._count_replay(i, key)
        self.active[i] = self.env.now
        if self.links is not None:
            self.links.due[i] = self.env.now + duration

        def done(_e: object) -> None:
            self.net.add_finished_bytes(carried)
            self.finish(i)
        self.env.timeout(duration).callbacks.append(done)
        return True

    def _count_replay(self, i: int, key: tuple) -> None:
        """Count a replay of collective task ``i`` (memo ``key``) as the runs of its
        instances (planned at the key's first replay, as a run would plan them)."""
        got = self.replayed_instances.get(key)
        if got is None:         # plan every instance once (as a run would)
            t = self.tasks[i]
            instances = [t.group] if self.fold is None else self.fold.instances(t.group)[0]
            plans = [self.plan(t, inst) for inst in instances]
            got = self.replayed_instances[key] = (len(plans), self._tally(t, plans))
        self._chose(got[1])
        self.collective_runs += got[0]
        self.memo_hits += 1

    def _memo_recorder(self, i: int, key: tuple, watch=None) -> Callable[[], None]:
        """Finish member ``i`` and store its collective's duration and traffic, if it had
        the network to itself (statically, or no network task started while it ran) — or,
        with a ``watch`` of :class:`~dessim.engine.links.LinkProof`, its own channels (no
        task that can use them started while it ran; its traffic is then the bytes those
        channels carried)."""
        t0, before, starts = self.env.now, self.net.finished_bytes(), self.net_starts

        def done() -> None:
            delta = self.net.finished_bytes() - before
            if watch is not None:
                delta = self.links.recorded(watch, delta)
                if delta is not None:
                    self.coll_memo[key] = (self.env.now - t0, sparse_bytes(delta))
            elif self.memo_static or self.net_starts == starts:
                self.coll_memo[key] = (self.env.now - t0, sparse_bytes(delta))
            self.finish(i)
        return done

    def _algo(self, t: Task) -> tuple[str, tuple]:
        """Collective task ``t``'s algorithm (the forced one, else its own) and, for its own,
        its options (``attrs["algo_options"]``) as sorted (name, value) pairs."""
        if self.forced_algo:
            return self.forced_algo, ()
        options = t.attrs.get(ALGO_OPTIONS)
        return t.algo, (tuple(sorted(options.items())) if options else ())

    def memo_key(self, t: Task) -> tuple:
        """The collective memo's key of collective task ``t``: op, size, group, algorithm and
        options (the run's forced algorithm, if any)."""
        return (t.op, t.size, t.group) + self._algo(t)

    def _arrive_collective(self, i: int) -> None:
        t = self.made[i] or self.tasks[i]
        members = self.colls[t.coll_id]
        if self.links is not None and len(members) > 1 and t.coll_id not in self.coll_state:
            self._arrive_multi(i, members)
            return
        if self.memo_on and len(members) == 1:
            if self.memo_static:
                key = self.memo_key(t)
                if not self._replay_collective(i, key):
                    self._start_collective(i, key)
                return
            # whether it runs alone is known once everything starting now has started
            self.deferred.append(i)
            return
        self._start_collective(i, None)

    def _decide_deferred(self) -> None:
        """Start the single-member collectives that arrived this instant. One that is the
        only network task running has the network to itself until another network task
        starts; none can start before a running compute or delay task ends (everything else
        waits on those or on this collective). So when it is memoised and every running
        task ends after it would, it is replayed; otherwise it is simulated, and memoised if
        no network task started while it ran. One that is not alone on the network is
        replayed when it is provably alone on its own channels until it would end, and
        simulated for the memo when nothing that can use them runs as it starts
        (``Shortcuts.link_memo``, :class:`~dessim.engine.links.LinkProof`)."""
        if not self.deferred:
            return
        todo, self.deferred = self.deferred, []
        alone = len(todo) == 1 and self.net_running == 1
        links = self.links
        for i in todo:
            key = self.memo_key(self.tasks[i]) if alone else None
            hit = self.coll_memo.get(key) if key is not None else None
            if hit is not None and self._next_end() > self.env.now + hit[0]:
                self._replay_collective(i, key)
            elif alone or links is None:
                self._start_collective(i, key if hit is None else None)
            else:               # not alone on the network: maybe alone on its channels
                key = self.memo_key(self.tasks[i])
                hit = self.coll_memo.get(key)
                if hit is not None:
                    if links.isolated(i, key, self.env.now + hit[0]):
                        links.replayed += 1
                        self._replay_collective(i, key)
                        continue
                    links.refused += 1
                watch = links.free_now(i, key) if hit is None else None
                self._start_collective(i, key if watch is not None else None, watch)

    def _arrive_multi(self, i: int, members: list[int]) -> None:
        """Member ``i`` of a collective of several member tasks arrives, before its run has
        started (``Shortcuts.link_memo``). Such a run depends on nothing but the collective
        (its key) and its members' arrival times, as long as nothing else uses its channels
        (:class:`~dessim.engine.links.LinkProof`). When its key is memoised and nothing of
        its scope runs now, the members that arrive this instant wait for the instant's end
        (:meth:`_decide_multi`); otherwise the run starts now, watched for the memo when its
        key is new and nothing in its scope runs."""
        t = self.made[i] or self.tasks[i]
        cid = t.coll_id
        waiting = self.multi_wait.get(cid)
        if waiting is not None:
            waiting.append(i)
            return
        key = self.memo_key(t)
        own = frozenset(members)
        if key in self.multi_memo:
            if self.links.quiet(i, key, own):
                self.multi_wait[cid] = [i]
                _Late(self.env, lambda _e, cid=cid: self._decide_multi(cid))
                return
            self.links.refused += 1
            self._start_collective(i, None)
            return
        watch = self.links.free_now(i, key, own)
        self._start_collective(i, key if watch is not None else None, watch)

    def _decide_multi(self, cid: str) -> None:
        """End of the instant in which members of memoised collective ``cid`` arrived: when
        all of them did and its replay provably has its channels to itself until its last
        member ends (:meth:`LinkProof.isolated`), each member ends when it ended in the
        recorded run; otherwise the run starts, the members arriving in their order."""
        todo = self.multi_wait.pop(cid)
        members = self.colls[cid]
        key = self.memo_key(self.made[todo[0]] or self.tasks[todo[0]])
        offsets, carried = self.multi_memo[key]
        links = self.links
        now = self.env.now
        at = {self.ranks[m]: m for m in members}
        if len(todo) == len(members) and at.keys() == {r for r, _ in offsets}:
            ends = {at[r]: now + d for r, d in offsets}
            if links.isolated(todo[0], key, max(ends.values()), ends):
                links.replayed += 1
                self._replay_multi(todo[0], key, [(at[r], d) for r, d in offsets], carried)
                return
            links.refused += 1
        for i in todo:
            self._start_collective(i, None)

    def _replay_multi(self, i: int, key: tuple, offsets: list[tuple[int, float]],
                      carried: tuple) -> None:
        """Replay a collective of several member tasks (``i`` one of them) from the memo:
        each member ends ``d`` seconds from now (``offsets``: (member, d) in the recorded
        finishing order); its traffic is counted when the last one ends."""
        self._count_replay(i, key)
        now = self.env.now
        last = len(offsets) - 1
        for n, (m, d) in enumerate(offsets):
            self.active[m] = now
            self.links.due[m] = now + d

            def done(_e: object, m: int = m, n: int = n) -> None:
                if n == last:
                    self.net.add_finished_bytes(carried)
                self.finish(m)
            self.env.timeout(d).callbacks.append(done)

    def _multi_recorder(self, members: list[int], key: tuple, watch) -> Callable[[int], None]:
        """The end of each member of a collective of several member tasks, simulated under
        ``watch`` (:meth:`LinkProof.free_now`): when the last ends, its members' ends and the
        traffic of its channels are memoised if every member arrived at its start and no
        other task of its scope started while it ran."""
        t0, before = self.env.now, self.net.finished_bytes()
        ended: list[tuple[int, float]] = []

        def one(m: int) -> None:
            ended.append((self.ranks[m], self.env.now - t0))
            if len(ended) == len(members):
                delta = self.links.recorded(watch, self.net.finished_bytes() - before, at_end=True)
                if delta is not None and all(self.start[x] == t0 for x in members):
                    self.multi_memo[key] = (tuple(ended), sparse_bytes(delta))
            self.finish(m)
        return one

    def _next_end(self) -> float:
        """Earliest end of a running compute or delay task (inf if none)."""
        timed, end = self.timed, self.end
        while timed and end[timed[0][1]] == end[timed[0][1]]:     # finished (not NaN)
            heapq.heappop(timed)
        return timed[0][0] if timed else math.inf

    def _start_collective(self, i: int, memo_key: tuple | None, watch=None) -> None:
        """Start (or join) the run of collective task ``i``; with ``memo_key`` the run is
        exclusive (on the network, or with ``watch`` on its channels) and its duration and
        traffic are memoised when it ends."""
        t = self.made[i] or self.tasks[i]
        state = self.coll_state.get(t.coll_id)
        if state is None:
            if self.fold is None:
                instances, where = [t.group], None
            else:
                instances, where = self.fold.instances(t.group)
            plans = [self.plan(t, inst) for inst in instances]
            self._chose(self._tally(t, plans))
            family = self._lane_family(t, instances, plans) if len(instances) > 1 else None
            # one member task whose images fill instance 0: every rank of it arrives together
            alone = where is not None and len(self.colls[t.coll_id]) == 1 and \
                len({x for k, x in where[t.rank] if k == 0}) == len(instances[0])
            rotations = self.rank_rotations
            orbit = (self._orbit_run(plans[0], family, alone,
                                     rotations is True or t.coll_id in rotations)
                     if self.orbits_on and (family is not None or len(instances) == 1) else None)
            if orbit is not None:       # one transfer per orbit of the group (certified)
                self.orbit_runs += 1
                self.rank_rotation_runs += orbit[2]
                plans = [CollectivePlan(orbit[0], plans[0].protocol)]
                family = orbit[1]
            if family is not None:      # instance 0 stands for the others (certified)
                self.family_runs += 1
                instances, plans = instances[:1], plans[:1]
                where = self._where_in_first(t.group, where)
            merged = self._merged(t, instances, plans) if len(instances) > 1 else None
            if merged is not None:      # one run for every image (exact; see _merged)
                self.merged_runs += 1
                plans = [CollectivePlan(merged, plans[0].protocol)]
                instances = [merged.group]
                where = {r: [(0, image) for _, image in pairs] for r, pairs in where.items()}
            members = self.colls[t.coll_id]
            shared = self._shared_arrivals(members, where, instances) if merged is not None else None
            arrivals = []
            runs = []
            for inst, plan in zip(instances, plans):
                arr = {r: self.env.event() for r in inst} if shared is None else \
                    {image: shared[r] for r in shared for _, image in where[r]}
                runs.append(run_schedule(self.net, plan.schedule, arrivals=arr,
                                         protocol=plan.protocol,
                                         reduction_bw=self.settings.reduction_bw,
                                         key_base=self._key_base(plan.schedule.communicator),
                                         bundles=self.shortcuts.bundles,
                                         stream_rings=self.shortcuts.stream_rings,
                                         family=family))
                arrivals.append(arr)
            self.collective_runs += (len(runs) if merged is None else merged.params["merged"]) \
                + (len(family) if family is not None else 0)
            self.streamed_runs += sum(run.streamed for run in runs)
            state = {"arrivals": arrivals, "arrived": 0, "members": members, "where": where,
                     "shared": shared}
            self.coll_state[t.coll_id] = state
            several = (self._multi_recorder(members, memo_key, watch)
                       if memo_key is not None and len(members) > 1 else None)
            for m in members:
                rank = self.ranks[m]
                on_done = ((lambda m=m: several(m)) if several is not None
                           else self._memo_recorder(m, memo_key, watch) if memo_key is not None
                           else (lambda m=m: self.finish(m)))
                if where is None:
                    runs[0].rank_events[rank].callbacks.append(lambda _e, f=on_done: f())
                    continue
                pairs = where[rank]
                if orbit is not None:   # each image ends with its orbit's representative
                    acct = orbit[0].account
                    pairs = sorted({(k, acct[x]) for k, x in pairs})
                join = _Join(self, len(pairs), on_done)
                for inst, image in pairs:
                    runs[inst].rank_events[image].callbacks.append(join.one)
        state["arrived"] += 1
        if state["shared"] is not None:
            state["shared"][t.rank].succeed()
        elif state["where"] is None:
            state["arrivals"][0][t.rank].succeed()
        else:
            for inst, image in state["where"][t.rank]:
                state["arrivals"][inst][image].succeed()
        if state["arrived"] == len(state["members"]):
            now = self.env.now
            for m in state["members"]:
                self.active[m] = now
            # every member has arrived: the runs hold what they still need (their callbacks),
            # so the arrival bookkeeping goes (kept, it grew with every collective of the run)
            del self.coll_state[t.coll_id]

    def finish(self, i: int) -> None:
        self.end[i] = self.env.now
        self.done_count += 1
        if self.done_count >= self.next_tick:
            self.next_tick = self.ticker.check(self.done_count, self.env.now)
        if self.kinds[i] in _NET_KINDS:
            self.net_running -= 1
        self.engine_events += 1
        stream_of, pending = self.stream_of, self.pending
        key = stream_of[i]
        self.busy[key] = False
        self.head[key] += 1
        touched = [key]
        b = self.succ_base[i]
        for s in self.succ_rel[i]:
            s += b
            left = pending[s] - 1
            pending[s] = left
            if not left:
                touched.append(stream_of[s])
        extra = self.succ_extra.get(i)
        if extra is not None:
            for s in extra:
                left = pending[s] - 1
                pending[s] = left
                if not left:
                    touched.append(stream_of[s])
        try_start = self.try_start
        for k in touched:
            try_start(k)
        if self.deferred:           # (_decide_deferred has nothing to do otherwise)
            self._decide_deferred()

    # ------------------------------------------------------------ driver
    def run(self) -> None:
        for key in self.queues:
            self.try_start(key)
        self._decide_deferred()
        self.env.run()
        if self.done_count != len(self.tasks):
            self._report_deadlock()

    def _report_deadlock(self) -> None:
        stuck = []
        for key, queue in self.queues.items():
            h = self.head[key]
            if h < len(queue):
                stuck.append(queue[h])
        i = stuck[0]
        t = self.tasks[i]
        if self.start[i] != self.start[i]:
            waiting = [self.tasks[p].id for p in self.table.deps(i) if self.end[p] != self.end[p]]
            why = (f"it waits for {waiting[0]!r}, which never ran" if waiting else
                   "an earlier task of its stream never finished")
        elif t.kind in ("send", "recv"):
            peer = self.tasks[self.partner[i]]
            why = f"its peer task {peer.id!r} on rank {peer.rank} never started"
        else:
            why = "some member of its collective never started"
        raise TaskGraphError(f"deadlock: {len(self.tasks) - self.done_count} tasks never finished; "
                             f"e.g. task {t.id!r} (rank {t.rank}, stream {t.stream!r}): {why}")

    # ------------------------------------------------------------ results
    def result(self, wall_s: float) -> SimulationResult:
        n = self.topology.num_gpus
        shown = self.simulated_ranks
        per_rank: dict[int, dict[str, list]] = {r: {"compute": [], "comm": [], "wait": [],
                                                    "all": [], "cat": {}} for r in shown}
        by_kernel: dict[int, dict[str, float]] = {r: {} for r in shown}
        ids, names, statics, mixes = self.table.records()
        if mixes is None:
            mixes = repeat(None)
        records = []
        record = records.append
        # per rank: the lists below, bound once (one dict lookup per task instead of five)
        lists = {r: (acc["all"].append, acc["comm"].append, acc["wait"].append, acc["cat"],
                     acc["compute"].append, by_kernel[r]) for r, acc in per_rank.items()}
        # per task (static_record): rank, stream, kind, category, bytes, FLOP, op, peer,
        # whether it communicates, its summary category, its kernel class
        for tid, name, (rank, stream, kind, category, moved, flops, op, peer, comm, cat_key, kernel), \
                mix, s, a, e in zip(ids, names, statics, mixes, self.start, self.active, self.end):
            record((rank, stream, tid, name, kind, category, s, a, e, moved, flops, op, peer))
            add_all, add_comm, add_wait, cat, add_compute, kernels = lists[rank]
            add_all((s, e))
            if comm:
                add_comm((a, e))
                add_wait((s, a))
                cat.setdefault(cat_key, []).append((a, e))
            else:
                add_compute((s, e))
                _add_kernel_time(kernels, mix, kernel, e - s)
        makespan = max((e for e in self.end), default=0.0)
        ranks = []
        for r in shown:
            acc = per_rank[r]
            compute = union(acc["compute"])
            comm = union(acc["comm"])
            busy = union(compute + comm)
            exposed = subtract(comm, compute)
            wait = subtract(union(acc["wait"]), busy)
            by_cat = {c: length(subtract(union(iv), compute)) for c, iv in sorted(acc["cat"].items())}
            covered = union(acc["all"])
            compute_s = length(compute)
            ranks.append(RankTimes(rank=r, compute_s=compute_s, comm_s=length(comm),
                                   exposed_comm_s=length(exposed), wait_s=length(wait),
                                   idle_s=makespan - length(covered),
                                   end_s=max((e for _, e in acc["all"]), default=0.0),
                                   exposed_by_category=by_cat,
                                   compute_by_kernel=_scaled(by_kernel[r], compute_s)))
        return SimulationResult(
            makespan_s=makespan, ranks=ranks, span_records=records,
            link_bytes=self.net.link_bytes(), link_capacity=self._link_capacity(),
            link_series=list(self.net.utilisation),
            events=self.engine_events + self.net.events, wall_s=wall_s,
            network=self.options.network_name,
            meta={"graph": self.graph.name, "topology": self.topology.name,
                  "rank_nodes": {r: self.topology.node_of(r) for r in range(n)},
                  "flows": self._cross_rank_flows(), **self._fold_meta(makespan),
                  **self._stream_meta(), **self._memo_meta(),
                  "collectives": {"settings": self.settings.describe(),
                                  "calibration": self.calibration.label(),
                                  "chosen": self._chosen()}})

    def _chosen(self) -> dict[str, dict[str, int]]:
        """Collective runs per group category and ``algorithm/protocol`` (sorted)."""
        out: dict[str, dict[str, int]] = {}
        for (c, a, p), n in sorted(self.choices.items()):
            out.setdefault(c, {})[f"{a}/{p}"] = n
        return out

    def _memo_meta(self) -> dict:
        """How many exclusive collectives were replayed from the memo (empty when the
        shortcut did not apply)."""
        if not self.coll_memo and not self.multi_memo:
            return {}
        return {"collective_memo": {"simulated": len(self.coll_memo) + len(self.multi_memo),
                                    "replayed": self.memo_hits,
                                    "replayed_on_links": self.links.replayed if self.links else 0,
                                    "refused_on_links": self.links.refused if self.links else 0}}

    def _stream_meta(self) -> dict:
        """How many collective runs were streamed (empty unless ``stream_rings`` is on): the
        approximation is visible in every result that used it."""
        if not self.shortcuts.stream_rings:
            return {}
        return {"stream_rings": {"streamed": self.streamed_runs,
                                 "collective_runs": self.collective_runs}}

    def _fold_meta(self, makespan: float) -> dict:
        """What folding did (empty when the graph is not folded): lanes, simulated ranks and
        the largest lane skew — 0 when every lane stayed in step (the folded run is exact)."""
        fold = self.fold
        if fold is None:
            return {}
        return {"fold": {"dims": list(fold.dims), "lanes": fold.lanes,
                         "ranks_simulated": len(self.simulated_ranks),
                         "max_lane_skew_s": self.lane_skew,
                         "max_lane_skew_rel": self.lane_skew / makespan if makespan > 0 else 0.0,
                         "skewed_tasks": self.skewed_tasks,
                         "merged_image_runs": self.merged_runs,
                         "lane_family_runs": self.family_runs,
                         "lane_orbit_runs": self.orbit_runs,
                         "lane_families_refused": self.families_refused,
                         "lane_orbits_refused": self.orbits_refused,
                         "lane_rank_rotations_refused": self.rank_rotations_refused,
                         "channel_quotient": self._quotient_meta()}}

    def _quotient_meta(self) -> dict | None:
        """What the channel quotient did (None: off): the channels routes crossed, the
        blocks they were rated as, and how often a route split a block."""
        q = getattr(self.net, "quotient", None) if self.quotient_on else None
        if q is None:
            return None
        return {"channels": q.channels_seen, "blocks": q.blocks, "splits": q.splits}

    def _link_capacity(self) -> dict[tuple[str, str], float]:
        chmap = self.net.channels
        return {d: chmap.capacity[chmap.channel_of_direction[i]]
                for i, d in enumerate(chmap.directions)}

    def _cross_rank_flows(self) -> list[tuple[str, str]]:
        """(before, after) task ids of dependencies that cross ranks, and send -> recv pairs."""
        ids, ranks, kinds, dependents = self.table.records()[0], self.ranks, self.kinds, self.table.dependents
        flows = [(ids[i], ids[j]) for i in range(len(ids)) for j in dependents(i)
                 if ranks[j] != ranks[i]]
        flows += [(ids[i], ids[j]) for i, j in sorted(self.partner.items()) if kinds[i] == "send"]
        return flows


def simulate(graph: TaskGraph, topology: Topology, options: EngineOptions | None = None, *,
             compute_cost: ComputeCost | None = None) -> SimulationResult:
    """Replay ``graph`` on ``topology`` and return what happened.

    ``compute_cost`` costs compute tasks that carry FLOPs/bytes instead of a duration; by
    default each rank's GPU model from the topology (or ``options.device``) through
    :class:`~dessim.engine.device.RankDevices`. Tasks with a ``duration`` never consult it. Raises :class:`~dessim.errors.TaskGraphError` for invalid graphs and
    for graphs that deadlock (naming a stuck task).
    """
    t0 = time.perf_counter()
    options = options or EngineOptions()
    # a large graph and the run's set-up: out of the collector's passes
    with heap_frozen(len(graph) >= LARGE_GRAPH_TASKS) as freezer:
        return _simulate(graph, topology, options, compute_cost, t0, freezer)


def _simulate(graph: TaskGraph, topology: Topology, options: EngineOptions,
              compute_cost: ComputeCost | None, t0: float, freezer: Freezer) -> SimulationResult:
    """:func:`simulate` inside :func:`~dessim.taskgraph.collector.heap_frozen`."""
    with collector_paused():     # its 10^6 set-up objects hold no cycle to collect meanwhile
        run = _Run(graph, topology, options, compute_cost)
    rotations_refused = orbits_refused = None
    while True:
        freezer.freeze()         # the run's own set-up too
        try:
            run.run()
            break
        except QuotientBroken as exc:
            freezer.thaw()       # the broken run is garbage (a cycle through simpy's callbacks)
            # not symmetric: replay with host rotations alone (when orbits rotated ranks
            # inside hosts), then without orbits, then without families
            if run.rank_rotation_runs:
                # up to the failure every rate was certified, so the replay runs the same
                # until then: the collectives that had ended keep their orbits inside hosts
                # (certified again all the same); the others take orbits of whole hosts
                rotations_refused = str(exc)
                keep = run.ended_before(run.env.now) if run.rank_rotations is True else frozenset()
                run = _Run(run.table, topology, options, compute_cost, rank_rotations=keep)
            elif run.orbit_runs:
                orbits_refused = str(exc)
                run = _Run(run.table, topology, replace(options, shortcuts=replace(
                    options.shortcuts, lane_orbits=False)), compute_cost)
            else:
                run = _families_off(run.table, topology, options, compute_cost, exc)
                break
    run.rank_rotations_refused = rotations_refused
    run.orbits_refused = orbits_refused
    return run.result(time.perf_counter() - t0)


def _families_off(graph: TaskGraph | TaskTable, topology: Topology, options: EngineOptions,
                  compute_cost: ComputeCost | None, exc: QuotientBroken) -> _Run:
    """The run of ``graph`` without lane families (after ``exc`` broke one), done."""
    run = _Run(graph, topology, replace(options, shortcuts=replace(
        options.shortcuts, lane_families=False, lane_orbits=False)), compute_cost)
    run.families_refused = str(exc)
    run.run()
    return run


def _add_kernel_time(acc: dict[str, float], mix: tuple[tuple[str, float], ...] | None, kind: str,
                     seconds: float) -> None:
    """Add a compute task's ``seconds`` to ``acc`` by kernel kind: split by its kernel mix
    (shares of its costed time) when it has one, else all under ``kind``."""
    if seconds <= 0:
        return
    total = sum(v for _, v in mix) if mix else 0.0
    if total <= 0:
        acc[kind] = acc.get(kind, 0.0) + seconds
        return
    for k, v in mix:
        acc[k] = acc.get(k, 0.0) + seconds * v / total


def _scaled(acc: dict[str, float], compute_s: float) -> dict[str, float]:
    """``acc`` (summed task seconds by kernel kind) scaled to add up to the rank's compute
    time ``compute_s`` (a union): overlapping compute tasks share the overlap in proportion."""
    total = sum(acc.values())
    if total <= 0:
        return {}
    f = compute_s / total
    return {k: v * f for k, v in sorted(acc.items())}
