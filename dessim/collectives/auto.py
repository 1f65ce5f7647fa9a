"""``auto``: choose a collective's algorithm and protocol as NCCL's tuner does.

NCCL evaluates its cost model for every (algorithm, protocol) its rules allow on the
communicator and runs the cheapest (``ncclTopoTuneModel``, ``topoGetAlgoInfo``; NCCL 2.30.7,
docs/references.md). :func:`choose` does the same with :mod:`dessim.collectives.nccl`: it
derives what NCCL's topology search would find for the group on the topology
(:func:`~dessim.collectives.nccl.nccl_system`), evaluates NCCL's estimate of each candidate,
and returns the cheapest with every estimate (:meth:`AutoChoice.explanation`).

NCCL's algorithms map to dessim's: Ring → ``ring``, Tree → ``dbtree``, NVLS → ``nvls`` (across
nodes: NVLS + IB SHARP), NVLSTree → ``nvlstree``, CollNetChain → ``collnet``, CollNetDirect →
``collnetdirect``. CollNet (and NVLS across nodes) are candidates exactly where NCCL's model
has them: on a group whose NICs reach switches that declare SHARP
(:func:`~dessim.collectives.nccl.nccl_system`). PAT is not simulated; where NCCL's model would
pick it, ``auto`` takes the best of the others and says so. Operations NCCL runs as point-to-point
sends (all-to-all, send/recv) use ``direct`` with LL up to ``NCCL_P2P_LL_THRESHOLD`` =
16 KiB per peer and Simple above (NCCL ``src/enqueue.cc``).

A forced algorithm with protocol ``auto`` gets NCCL's best protocol for it; an algorithm NCCL
does not have (rd, hd, pairwise, tree, hierarchical, direct) runs with Simple. A forced
protocol restricts the choice to that protocol. NCCL's estimates decide; the simulation
times what was decided.

The older estimator of dessim's own algorithms by critical path and busiest link remains
available as :func:`estimate_schedule` (``dessim compare`` ranks algorithms by simulation).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import simpy

from dessim.collectives.algorithms import ALGORITHMS, check_supported
from dessim.collectives.nccl import NcclSystem, algo_time, allowed, nccl_system
from dessim.collectives.nccl.launch import NcclLaunch, launch
from dessim.collectives.ops import Op
from dessim.collectives.schedule import Schedule
from dessim.collectives.settings import CollectiveSettings
from dessim.errors import CollectiveError, DessimError
from dessim.network import make_network
from dessim.topology.graph import Topology

__all__ = ["Estimate", "AutoChoice", "choose", "estimate_schedule", "group_shape",
           "NCCL_TO_DESSIM", "P2P_LL_THRESHOLD"]

#: dessim's algorithm for each of NCCL's (None: not simulated).
NCCL_TO_DESSIM: dict[str, str | None] = {"ring": "ring", "tree": "dbtree", "nvls": "nvls",
                                         "nvls_tree": "nvlstree",
                                         "collnet_direct": "collnetdirect",
                                         "collnet_chain": "collnet", "pat": None}
_DESSIM_TO_NCCL = {v: k for k, v in NCCL_TO_DESSIM.items() if v}
#: Bytes per peer up to which NCCL sends point-to-point data with LL (NCCL_P2P_LL_THRESHOLD).
P2P_LL_THRESHOLD = 16384
_P2P_OPS = ("alltoall", "sendrecv")


@dataclass(frozen=True)
class Estimate:
    """NCCL's estimate (s) of one candidate, or why it cannot run."""

    algorithm: str          #: dessim name (NCCL's in parentheses when it is not simulated)
    protocol: str
    time_s: float | None
    reason: str = ""
    #: the choice itself, made without an NCCL estimate (point-to-point operations, a forced
    #: algorithm NCCL does not have)
    chosen: bool = False

    def describe(self) -> str:
        if self.time_s is None:
            how = "used without an estimate" if self.chosen else "not used"
            return f"{self.algorithm}/{self.protocol}: {how} ({self.reason})"
        return f"{self.algorithm}/{self.protocol}: {self.time_s * 1e6:.2f} us"


@dataclass(frozen=True)
class AutoChoice:
    """The chosen algorithm and protocol, every candidate's estimate (best first) and what
    NCCL would see of the group."""

    algorithm: str
    protocol: str
    estimates: tuple[Estimate, ...]
    system: NcclSystem | None = None
    note: str = ""
    launch: NcclLaunch | None = None   #: how NCCL launches the chosen one (reported, not timed)

    def explanation(self) -> str:
        head = f"auto chose {self.algorithm} with protocol {self.protocol}"
        s = self.system
        if s is not None:
            head += (f" (NCCL 2.30.7 tuning model; {s.nodes} node(s) x {s.ppn} GPU(s), "
                     f"{s.channels} search channels at {s.bw_intra:g}/{s.bw_inter:g} GB/s, "
                     f"{s.execution_channels} executed"
                     + (f", tree at {s.tree_bw_intra:g}/{s.bw_inter:g} GB/s"
                        if s.tree_bw_intra and s.tree_bw_intra != s.bw_intra else "")
                     + (f", NVLS {s.nvls_channels} heads" if s.nvls else "")
                     + (f", CollNet (IB SHARP) {s.collnet_heads} heads" if s.collnet else "")
                     + ")")
        lines = [head + ":"]
        if self.note:
            lines.append(f"  {self.note}")
        if self.launch is not None:
            lines.append(f"  {self.launch.describe()} (reported, not simulated)")
        if any(e.time_s is not None for e in self.estimates):
            # NCCL's model times, not the simulation's: a reader took one for the other
            lines.append("  NCCL's model estimates, best first (what it ranks by; the simulated time is "
                         "reported separately):")
        lines += [f"  {e.describe()}" for e in self.estimates]
        return "\n".join(lines)


def _system(group: tuple[int, ...], topology: Topology) -> NcclSystem:
    memo = topology.derived("nccl_systems", lambda _t: {})
    got = memo.get(group)
    if got is None:
        got = memo[group] = nccl_system(group, topology)
    return got


def choose(op: Op, group: tuple[int, ...], size: float, topology: Topology,
           settings: CollectiveSettings | None = None, **options) -> AutoChoice:
    """NCCL's choice of (algorithm, protocol) for ``op`` of ``size`` bytes (nccl-tests
    semantics) on ``group``, within what ``settings`` forces (see the module docstring)."""
    settings = settings or CollectiveSettings()
    group = tuple(group)
    forced_algo = None if settings.algo == "auto" else settings.algo
    forced_proto = None if settings.protocol == "auto" else settings.protocol
    # raw is no NCCL protocol: NCCL's model ranks the algorithms with its own protocols and
    # the chosen algorithm then runs with the textbook model, as asked
    raw = forced_proto == "raw"
    if op.name in _P2P_OPS:
        algo = forced_algo or "direct"
        per_peer = size / max(1, len(group) - 1) if op.name == "alltoall" else size
        proto = forced_proto or ("LL" if per_peer <= P2P_LL_THRESHOLD else "Simple")
        return AutoChoice(algo, proto, (Estimate(algo, proto, None, "point-to-point: NCCL "
                                                 "sends it peer to peer", chosen=True),))
    if forced_algo is not None and forced_algo not in _DESSIM_TO_NCCL:
        proto = forced_proto or "Simple"
        return AutoChoice(forced_algo, proto, (Estimate(forced_algo, proto, None,
                                                        "not an NCCL algorithm: Simple", chosen=True),))
    system = _system(group, topology)
    estimates: list[Estimate] = []
    unsimulated: list[tuple[float, str]] = []     # NCCL-only algorithms: (estimate, name)
    for nccl_algo, proto in allowed(op.name, system):
        name = NCCL_TO_DESSIM[nccl_algo]
        if forced_algo is not None and name != forced_algo:
            continue
        if forced_proto is not None and not raw and proto != forced_proto:
            continue
        t = algo_time(op.name, nccl_algo, proto, size, system)
        if name is None:
            if t is not None:
                unsimulated.append((t, nccl_algo))
            estimates.append(Estimate(f"({nccl_algo})", proto, None,
                                      f"NCCL's {nccl_algo} is not simulated"
                                      + (f"; NCCL estimates {t * 1e6:.2f} us" if t else "")))
            continue
        reason = ""
        if t is not None:
            try:
                check_supported(op, ALGORITHMS[name], group, topology, options)
            except DessimError as exc:
                t, reason = None, str(exc)
        estimates.append(Estimate(name, proto, t, reason or ("" if t is not None else
                                                              "disabled by NCCL's model")))
    ok = sorted((e for e in estimates if e.time_s is not None), key=lambda e: e.time_s)
    if not ok:
        if forced_algo is not None:     # NCCL's model does not run it here: run it anyway
            proto = forced_proto or "Simple"
            return AutoChoice(forced_algo, proto, tuple(estimates), system,
                              note=f"NCCL's model does not run {forced_algo} here; simulated "
                                   f"with {proto} as asked")
        raise CollectiveError(f"auto: no algorithm can run {op.name} on this group: "
                              + "; ".join(e.describe() for e in estimates))
    best = ok[0]
    if raw:
        return AutoChoice(best.algorithm, "raw", tuple(ok) + tuple(e for e in estimates if e.time_s is None),
                          system, "" if forced_algo else
                          f"NCCL's model chooses {best.algorithm} ({best.protocol}); simulated with "
                          "the raw protocol as asked")
    note = ""
    if unsimulated and min(unsimulated)[0] < best.time_s:
        note = (f"NCCL's model prefers {min(unsimulated)[1]} here, which dessim does not "
                f"simulate; the best simulated candidate is used")
    ranked = tuple(ok) + tuple(e for e in estimates if e.time_s is None)
    how = launch(op.name, _DESSIM_TO_NCCL[best.algorithm], best.protocol, size, system)
    return AutoChoice(best.algorithm, best.protocol, ranked, system, note, how)


# ---------------------------------------------------------------------------------- helpers
def _estimator(topology: Topology):
    """One analytical network per topology for estimates: its router and route caches are
    shared by every estimate on that topology (:meth:`Topology.derived`)."""
    return topology.derived("auto_estimator",
                            lambda t: make_network("analytical", simpy.Environment(), t))


def estimate_schedule(schedule: Schedule, topology: Topology,
                      reduction_bw: float | None = None) -> tuple[float, float]:
    """(critical-path time, busiest-link time) of ``schedule`` on ``topology`` in seconds:
    each transfer costs its route's ``latency + nbytes / bottleneck`` after its dependencies
    (ECMP key 0), and the busiest channel's bytes / capacity bounds contention."""
    net = _estimator(topology)
    capacity = net.channels.capacity
    load: dict[int, float] = {}          # bytes per channel the schedule touches
    routes: dict[tuple, tuple[float, float, tuple[int, ...]]] = {}
    finish = array("d", [0.0]) * len(schedule)
    src, dst, nbytes, red = schedule.src, schedule.dst, schedule.nbytes, schedule.reduce_bytes
    dep_start, dep_index = schedule.dep_start, schedule.dep_index
    best = 0.0
    for i in range(len(schedule)):
        pair = (src[i], dst[i])
        r = routes.get(pair)
        if r is None:
            route = net.route(topology.resolve(pair[0]), topology.resolve(pair[1]))
            r = routes[pair] = (route.latency, route.bottleneck, route.channels)
        lat, bottleneck, chans = r
        n = nbytes[i]
        for c in chans:
            load[c] = load.get(c, 0.0) + n
        ready = max((finish[j] for j in dep_index[dep_start[i]:dep_start[i + 1]]), default=0.0)
        t = ready + lat + n / bottleneck
        if reduction_bw and red[i]:
            t += red[i] / reduction_bw
        finish[i] = t
        if t > best:
            best = t
    busiest = max((b / capacity[c] for c, b in load.items()), default=0.0)
    return best, busiest


def group_shape(group: tuple[int, ...], topology: Topology) -> tuple:
    """Everything a collective on ``group`` depends on, with members named by their position
    in ``group`` and channels by their order of first use: per ordered member pair its route's
    channels and latency (ECMP key 0), the capacity of every channel, the link types, and each
    algorithm's :meth:`~dessim.collectives.algorithms.base.Algorithm.topology_key`.

    Two groups with equal shapes are the same sub-network up to renaming, so every schedule,
    choice and idle-network time of a collective is the same on both (its transfers use
    only these routes). Equal shapes are a sufficient condition, never a guess."""
    net = _estimator(topology)
    capacity = net.channels.capacity
    node = topology.node_of
    chan_id: dict[int, int] = {}
    routes = []
    for a in group:
        na = node(a)
        for b in group:
            if a != b:
                r = net.route(na, node(b))
                routes.append((tuple(chan_id.setdefault(c, len(chan_id)) for c in r.channels),
                               r.latency, r.path and _kinds(topology, r.path)))
    caps = tuple(capacity[c] for c in chan_id)
    keys = tuple(alg.topology_key(tuple(group), topology) for alg in ALGORITHMS.values())
    devices = tuple(topology.device(r) for r in group)
    return (len(group), tuple(routes), caps, keys, devices, topology.meta.get("cpu_vendor"))


def _kinds(topology: Topology, path: tuple[str, ...]) -> tuple:
    g = topology.graph
    return tuple(g.edges[a, b]["type"] for a, b in zip(path, path[1:]))
