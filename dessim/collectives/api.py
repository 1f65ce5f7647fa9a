"""Run one collective on a topology, or compare algorithms over sizes.

:func:`plan_collective` decides how a collective runs — NCCL's choice of algorithm and
protocol (:mod:`dessim.collectives.auto`) within what :class:`CollectiveSettings` forces,
its schedule and the protocol charges with the calibrated per-call overhead — for every
caller alike: :func:`run_collective`, the engine and the TP closed forms.
:func:`run_collective` replays the plan on a fresh network model from time 0 and reports
the nccl-tests figures (docs/collectives.md): ``algbw = size / time`` and
``busbw = algbw × factor(op, n)``, in GB/s (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import simpy

from dessim.catalog.calibration import Calibration, load_calibration, read_calibration
from dessim.collectives.algorithms import build_schedule, split_applicable
from dessim.collectives.auto import AutoChoice, choose
from dessim.collectives.executor import ScheduleRun, run_schedule
from dessim.collectives.ops import Op, get_op
from dessim.collectives.protocols import Protocol, make_protocol
from dessim.collectives.schedule import Schedule
from dessim.collectives.settings import CollectiveSettings
from dessim.errors import CollectiveError, UnitError
from dessim.network import make_network
from dessim.topology import load_topology
from dessim.topology.calibrate import calibrated_topology
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map
from dessim.units import parse_size

__all__ = ["CollectiveResult", "CollectivePlan", "plan_collective", "run_collective",
           "compare_collectives", "parse_ranks", "resolve_topology", "parse_collective_size"]


@dataclass(frozen=True)
class CollectivePlan:
    """How one collective runs: its schedule, the protocol the executor charges, and
    ``auto``'s decision (None when both algorithm and protocol were forced)."""

    schedule: Schedule
    protocol: Protocol
    choice: AutoChoice | None = None

    @property
    def algorithm(self) -> str:
        return self.schedule.algorithm


def plan_collective(op: str | Op, group: tuple[int, ...], size: float, topology: Topology,
                    settings: CollectiveSettings | Mapping[str, Any] | None = None, *,
                    root: int | None = None, compact_schedules: bool = True,
                    calibration: Calibration | None = None, **options) -> CollectivePlan:
    """The :class:`CollectivePlan` of ``op`` (``size`` bytes, nccl-tests semantics) on
    ``group``: ``auto`` resolved as NCCL would, the schedule built, the protocol charged with
    ``calibration``'s per-call overhead (None: the built-in calibration). Under NCCL's
    protocols with one chunk, chains run pipelined as NCCL's kernels run them (ring broadcast
    and reduce, :meth:`~dessim.collectives.algorithms.ring.Ring.pipelined`); ``raw`` and
    ``chunks`` K > 1 keep the store-and-forward chain."""
    op_ = get_op(op)
    settings = CollectiveSettings.of(settings)
    choice = None
    algo, proto = settings.algo, settings.protocol
    if algo == "auto" or proto == "auto":
        choice = choose(op_, tuple(group), size, topology, settings, **options)
        algo, proto = choice.algorithm, choice.protocol
    schedule = build_schedule(op_, algo, group, size, chunks=settings.chunks,
                              channels=settings.channels, root=root, topology=topology,
                              compact_schedules=compact_schedules,
                              pipelined=proto != "raw" and settings.chunks == 1, **options)
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    return CollectivePlan(schedule, make_protocol(proto, call_overhead(cal, group, topology,
                                                                       settings)), choice)


def call_overhead(calibration: Calibration, group: tuple[int, ...] | list[int],
                  topology: Topology, settings: CollectiveSettings) -> float:
    """Seconds a call on ``group`` pays beyond NCCL's model latency: ``nccl.net_call_overhead``
    when the group spans hosts (``call_overhead`` if unset), else ``nccl.call_overhead``; plus
    ``(settings.gpus_per_process − 1) × nccl.host_overhead``: one host thread launches the
    call's kernels on its GPUs one after the other, and the collective cannot progress before
    the last has started (one isolated call; back-to-back calls overlap:
    :mod:`dessim.collectives.loop`; docs/collectives.md, "Protocols")."""
    nccl = calibration.nccl
    overhead = nccl.call_overhead or 0.0
    if nccl.net_call_overhead is not None and len(host_map(topology).split(tuple(group))) > 1:
        overhead = nccl.net_call_overhead
    return overhead + (settings.gpus_per_process - 1) * (nccl.host_overhead or 0.0)


@dataclass
class CollectiveResult:
    """Outcome of :func:`run_collective` (SI units; bandwidths in GB/s = 1e9 B/s)."""

    op: str
    algorithm: str
    ranks: tuple[int, ...]
    size: float                 #: bytes, nccl-tests semantics of ``op``
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    events: int                 #: the network model's work counter (flows + solves)
    wall_s: float               #: host seconds to build and simulate
    transfers: int
    network: str
    chunks: int
    channels: int               #: lanes simulated
    link_util_max: float        #: busiest channel: bytes / (capacity × time)
    protocol: str = "raw"
    link_util: list[dict] = field(default_factory=list)  #: per used channel, busiest first
    auto: AutoChoice | None = None
    run: ScheduleRun | None = field(default=None, repr=False)
    calibration: str = ""       #: label (name@fingerprint) of the calibration it ran with

    @property
    def explanation(self) -> str:
        """auto's estimates per candidate ("" if algorithm and protocol were given)."""
        return self.auto.explanation() if self.auto else ""

    def to_dict(self, links: bool = False) -> dict[str, Any]:
        """A JSON-ready summary (``links``: include the per-channel utilisation table)."""
        out = {"op": self.op, "algorithm": self.algorithm, "protocol": self.protocol,
               "ranks": len(self.ranks), "size_bytes": self.size, "time_s": self.time_s,
               "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
               "events": self.events, "wall_s": self.wall_s, "transfers": self.transfers,
               "network": self.network, "chunks": self.chunks, "channels": self.channels,
               "link_util_max": self.link_util_max, "calibration": self.calibration}
        if self.auto:
            out["auto"] = [{"algorithm": e.algorithm, "protocol": e.protocol,
                            "estimate_s": e.time_s, "reason": e.reason}
                           for e in self.auto.estimates]
        if links:
            out["links"] = self.link_util
        return out


def resolve_topology(topology: Topology | str) -> Topology:
    """A :class:`Topology` as is, or one loaded from a spec / preset / YAML path."""
    return topology if isinstance(topology, Topology) else load_topology(topology)


def parse_ranks(ranks: str | int | Iterable[int] | None, topology: Topology) -> tuple[int, ...]:
    """Group from ``"0-7"``, ``"0,2,4,6"``, ``"0-3,8-11"``, a list of ints, or None (all)."""
    n = topology.num_gpus
    if ranks is None:
        return tuple(range(n))
    out: list[int] = []
    if isinstance(ranks, str):
        for part in (p.strip() for p in ranks.split(",")):
            try:
                if "-" in part[1:]:
                    a, b = part.split("-", 1)
                    lo, hi = int(a), int(b)
                    if hi < lo:
                        raise ValueError
                    out.extend(range(lo, hi + 1))
                else:
                    out.append(int(part))
            except ValueError:
                raise CollectiveError(f"ranks {ranks!r}: cannot parse {part!r} (use e.g. "
                                      "'0-7', '0,2,4,6' or '0-3,8-11')") from None
    else:
        items = [ranks] if isinstance(ranks, int) else list(ranks)
        for r in items:
            if not isinstance(r, int) or isinstance(r, bool):
                raise CollectiveError(f"ranks {ranks!r}: {r!r} is not an integer rank")
            out.append(r)
    bad = [r for r in out if not 0 <= r < n]
    if bad:
        raise CollectiveError(f"ranks {ranks!r}: rank {bad[0]} does not exist in topology "
                              f"{topology.name!r} (ranks are 0..{n - 1})")
    if len(set(out)) != len(out):
        raise CollectiveError(f"ranks {ranks!r}: a rank appears twice")
    if not out:
        raise CollectiveError(f"ranks {ranks!r}: the group is empty")
    return tuple(out)


def parse_collective_size(size: object) -> float:
    """Bytes > 0 from ``"1MiB"`` / a number; :class:`CollectiveError` otherwise."""
    try:
        value = parse_size(size, "collective size") if isinstance(size, str) else size
    except UnitError as exc:
        raise CollectiveError(str(exc)) from None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise CollectiveError(f"collective size {size!r} must be > 0 bytes")
    return float(value)


def _link_table(net, elapsed: float) -> list[dict]:
    chmap = net.channels
    per_channel = [0.0] * len(chmap.capacity)
    for (a, b), nbytes in net.link_bytes().items():
        per_channel[chmap.channel_of_direction[chmap.direction(a, b)]] += nbytes
    rows = []
    for ch, nbytes in zip(chmap.channels, per_channel):
        if nbytes > 0:
            arrow = "->" if ch.duplex else "<->"
            util = nbytes / (ch.capacity * elapsed) if elapsed > 0 else 0.0
            rows.append({"link": f"{ch.a}{arrow}{ch.b}", "bytes": nbytes, "utilisation": util})
    rows.sort(key=lambda r: (-r["utilisation"], r["link"]))
    return rows


def run_collective(op: str, size: object, topology: Topology | str, *, algo: str = "auto",
                   protocol: str = "auto", chunks: int = 1, channels: int | None = None,
                   reduction_bw: object = None, gpus_per_process: int = 1,
                   ranks: str | Iterable[int] | None = None,
                   network: "str | type" = "flow", root: int | None = None, bundles: bool = True,
                   compact_schedules: bool = True, stream_rings: bool = False,
                   calibration: Calibration | str | None = None, **options) -> CollectiveResult:
    """Simulate one collective from time 0 on an idle network and report its figures.

    ``algo``, ``protocol``, ``chunks``, ``channels``, ``reduction_bw`` and
    ``gpus_per_process`` (nccl-tests ``-g``) are the fields of
    :class:`CollectiveSettings` (``"auto"``: NCCL's choice, in ``result.auto`` with every
    candidate's estimate; ``protocol="raw"``: the textbook model). ``calibration``: the user's
    file or :class:`~dessim.catalog.calibration.Calibration` (None: the built-in one): its
    ``links`` apply to the topology (:func:`~dessim.topology.calibrate.calibrated_topology`),
    its other values replace the built-in ones.
    ``options`` go to the algorithm (hierarchical: ``inner="ring,tree"``).
    Exact speed shortcuts, on by default (docs/performance.md): ``compact_schedules`` stores uniform-step
    algorithms (ring) as steps, ``bundles`` runs a step as one network bundle while its flows
    provably see identical, private bottlenecks. Switching them off changes no result.
    ``stream_rings`` (off by default, an approximation): rings run as one coupled flow per channel
    (:func:`~dessim.collectives.executor.run_schedule`).
    """
    start_wall = time.perf_counter()
    op_ = get_op(op)
    own = read_calibration(calibration) if calibration is not None else None
    topo = calibrated_topology(resolve_topology(topology), own)
    group = parse_ranks(ranks, topo)
    nbytes = parse_collective_size(size)
    if len(group) < 2:
        raise CollectiveError(f"{op_.name}: a collective needs at least 2 ranks, got {list(group)}")
    if root is not None and not op_.rooted:
        raise CollectiveError(f"{op_.name} has no root: drop root={root} (it applies to broadcast, "
                              "reduce and sendrecv)")
    if root is not None and root not in group:
        raise CollectiveError(f"{op_.name}: root {root} is not in the group {list(group)}")
    settings = CollectiveSettings(algo=algo, protocol=protocol, channels=channels, chunks=chunks,
                                  reduction_bw=reduction_bw, gpus_per_process=gpus_per_process)
    cal = load_calibration(own)
    plan = plan_collective(op_, group, nbytes, topo, settings, root=root, compact_schedules=compact_schedules,
                           calibration=cal, **options)
    sched = plan.schedule
    env = simpy.Environment()
    net = make_network(network, env, topo, bundles=bundles)
    run = run_schedule(net, sched, protocol=plan.protocol, reduction_bw=settings.reduction_bw,
                       bundles=bundles, stream_rings=stream_rings)
    env.run(run.done)
    elapsed = run.duration
    wall = time.perf_counter() - start_wall
    algbw = nbytes / elapsed / 1e9 if elapsed > 0 else math.inf
    links = _link_table(net, elapsed)
    return CollectiveResult(
        op=op_.name, algorithm=sched.algorithm, ranks=group, size=nbytes, time_s=elapsed,
        algbw_GBps=algbw, busbw_GBps=algbw * op_.busbw_factor(len(group)), events=net.events,
        wall_s=wall, transfers=len(sched), network=net.name, chunks=chunks,
        channels=int(sched.params.get("channels", 1)),
        link_util_max=max((r["utilisation"] for r in links), default=0.0), link_util=links,
        protocol=plan.protocol.name, auto=plan.choice, run=run, calibration=cal.label())


def compare_collectives(op: str, algos: Sequence[str] | str | None, sizes: Sequence[object] | str,
                        topology: Topology | str, **kwargs):
    """Time and busbw of each algorithm at each size, with the winner per size.

    Returns a :class:`pandas.DataFrame` with one row per (size, algorithm): ``size_bytes``,
    ``algorithm``, ``time_s``, ``algbw_GBps``, ``busbw_GBps``, ``events``, ``winner`` (the
    fastest at that size; ties go to the first listed). ``algos`` / ``sizes`` may be
    comma-separated strings. ``algos=None``: every algorithm that can run ``op``
    on the group, in registration order (ring, tree, dbtree, rd, hd, direct, pairwise, rail,
    hierarchical, nvls, nvlstree, collnet, collnetdirect); ``df.attrs["skipped"]`` maps each
    algorithm for ``op`` that cannot run on this group to why. A named algorithm that cannot
    run is a :class:`CollectiveError` naming every such one, why, and those that can.
    ``df.attrs["algorithms"]`` lists the algorithms compared. ``kwargs`` go to
    :func:`run_collective` (``ranks``: the group; algorithm options such as ``inner``).
    """
    import pandas as pd

    if isinstance(algos, str):
        algos = [a.strip() for a in algos.split(",") if a.strip()]
    if isinstance(sizes, str):
        sizes = [s.strip() for s in sizes.split(",") if s.strip()]
    if not sizes:
        raise CollectiveError("compare: give at least one size (--sizes)")
    if algos is not None and not algos:
        raise CollectiveError("compare: give at least one algorithm (--algos), or leave --algos "
                              "out to compare every algorithm that can run the operation")
    op_ = get_op(op)
    topo = resolve_topology(topology)
    group = parse_ranks(kwargs.get("ranks"), topo)
    options = {k: v for k, v in kwargs.items() if k not in _RUN_PARAMETERS}
    named = None if algos is None else list(algos)
    usable, skipped = split_applicable(op_, group, topo, options, named)
    where = f"{op_.name} on this group of {len(group)} ranks"
    if named is not None and skipped:
        why = "; ".join(f"{name} ({reason})" for name, reason in skipped.items())
        can = ", ".join(usable) if usable else "none of those named"
        raise CollectiveError(f"compare: cannot run {where}: {why}; can run: {can} (drop the "
                              "others from --algos, or omit --algos to compare every algorithm "
                              "that can)")
    if not usable:
        why = "; ".join(f"{name} ({reason})" for name, reason in skipped.items())
        raise CollectiveError(f"compare: no algorithm can run {where}: {why}")
    rows = []
    for size in sizes:
        nbytes = parse_collective_size(size)
        block = []
        for algo in usable:
            res = run_collective(op_.name, nbytes, topo, algo=algo, **kwargs)
            block.append({"size_bytes": nbytes, "algorithm": str(algo).lower(),
                          "chosen": res.algorithm, "protocol": res.protocol, "time_s": res.time_s,
                          "algbw_GBps": res.algbw_GBps, "busbw_GBps": res.busbw_GBps,
                          "events": res.events, "calibration": res.calibration})
        best = min(range(len(block)), key=lambda i: block[i]["time_s"])
        for i, row in enumerate(block):
            row["winner"] = i == best
        rows.extend(block)
    df = pd.DataFrame(rows)
    df.attrs["algorithms"] = [str(a).lower() for a in usable]
    df.attrs["skipped"] = dict(skipped)
    return df


#: :func:`run_collective`'s own keyword parameters; compare passes any other keyword to the
#: algorithms as options.
_RUN_PARAMETERS = frozenset(inspect.signature(run_collective).parameters) - {"options"}
