"""Link efficiencies, NCCL call overhead and scale-out latency from nccl-tests logs.

Each log is simulated as it ran: the same collective, on the first N GPUs of the user's
topology (N = the log's rank count), at every size of the log, with dessim's collective model
(:func:`dessim.collectives.run_collective`: NCCL's choice of algorithm and protocol unless the
logs were run with ``NCCL_ALGO``/``NCCL_PROTO``, given as ``algo``/``protocol``). Measured
times are the out-of-place ones (nccl-tests prints both; the in-place half is ignored).

Which points fit what (the model decides which points are latency- or bandwidth-bound, with
the starting constants):

* **large messages** — sizes where the model's time grows almost in proportion to the size
  (d log t / d log size >= 0.7) — fit the efficiency of the log's *bottleneck technology*:
  the scale-out NIC technology (``ib_ndr``, ...) when the log's ranks span hosts, else the
  scale-up technology (``nvlink4``, ...; PCIe on GPUs without one). Every link of that
  technology gets the fitted efficiency.
* **small messages** — sizes where the model's time hardly grows (d log t / d log size < 0.1)
  and the measured time is within 25 % of the log's fastest — fit ``nccl.call_overhead``
  (the fixed cost of a call beyond NCCL's own latency model). When both a single-host and a
  multi-host log are given, the single-host logs fit the overhead and the multi-host logs'
  small messages fit the one-way latency of the scale-out technology's links.

Each constant is solved for so that the median of its points' errors is zero
(:mod:`dessim.calibrate.solve`), the constants in turn (overhead, latency, efficiencies), until
a whole pass changes none by more than 0.1 %. At most :data:`POINTS_PER_LOG` sizes of each
kind per log enter a fit (the largest bandwidth-bound ones; latency-bound ones spread over
their range): every size costs a simulation per step. Every row is checked in the residuals. An efficiency stays in (0, 1]: where the measured bandwidth needs more than
the model can give at 1 (in-network reduction such as SHARP, which the model lacks), the fit
stops at 1 and says so. A constant the points hardly depend on (the model's bottleneck is
elsewhere: e.g. NVLink under NVLS-tree across two DGX nodes) is reported and not written.
Units: seconds; efficiencies are fractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Callable, Sequence

from dessim.calibrate.report import Fitted, PartFit, Residual
from dessim.calibrate.solve import solve
from dessim.catalog.calibration import Calibration, load_calibration
from dessim.catalog.links import LINK_TYPES
from dessim.collectives import run_collective
from dessim.errors import CalibrationError
from dessim.topology.calibrate import calibrated_topology, link_tech
from dessim.topology.graph import Topology
from dessim.topology.hosts import host_map
from dessim.trace.nccl_tests import NcclTestsLog, NcclTestsRow
from dessim.units import format_size, format_time

__all__ = ["LogSetup", "prepare_logs", "fit_collectives"]

#: Link types of a GPU's scale-up fabric (else PCIe), and of scale-out NICs.
SCALE_UP_TYPES: tuple[str, ...] = ("nvlink", "infinity_fabric")
SCALE_OUT_TYPES: tuple[str, ...] = ("ib", "ethernet")
#: d log t / d log size of the model below which a size is latency-bound ...
SMALL_ELASTICITY = 0.1
#: ... and the measured time must be within this factor of the log's fastest.
SMALL_MEASURED = 1.25
#: d log t / d log size of the model from which a size is bandwidth-bound.
LARGE_ELASTICITY = 0.7
#: Relative change below which a constant counts as converged.
RTOL = 1e-3
#: Median relative error of its points below which a constant counts as fitted (the printed
#: times have 4-5 significant digits).
HTOL = 2e-4
#: Sensitivity (d log t / d log efficiency of the large points) below which an efficiency is
#: not constrained by the log.
WEAK = 0.2
#: Points per log that fit a constant: the largest bandwidth-bound sizes, and latency-bound
#: sizes spread over their range (every row is checked in the residuals all the same).
POINTS_PER_LOG = 4
_MAX_PASSES = 12
_MIN_EFFICIENCY = 1e-3
_MAX_SECONDS = 1e-3     # bound of a fitted overhead or latency


@dataclass(frozen=True)
class LogSetup:
    """One log as it is simulated: the group (the first N GPUs), how many hosts it spans,
    the technology its large messages fit (``role``: scale-out NIC or scale-up) and its rows
    of size > 0 by size."""

    log: NcclTestsLog
    group: tuple[int, ...]
    hosts: int
    tech: str
    role: str
    rows: tuple[NcclTestsRow, ...]

    def where(self, row: NcclTestsRow) -> str:
        return f"{self.log.source}:{row.line}" if row.line is not None else self.log.source

    def describe(self) -> str:
        return (f"{self.log.op} on {len(self.group)} ranks "
                f"({self.hosts} host{'s' if self.hosts > 1 else ''})")


def _techs(topology: Topology, nodes: Sequence[str], types: Sequence[str]) -> set[str | None]:
    graph = topology.graph
    return {link_tech(graph.edges[n, m]) for n in nodes for m in graph.adj[n]
            if graph.edges[n, m]["type"] in types}


def _one_tech(found: set[str | None], what: str, log: NcclTestsLog, topology: Topology) -> str:
    named = sorted(t for t in found if t)
    if not found:
        raise CalibrationError(f"{log.source}: topology {topology.name!r} has no {what} links "
                               f"for the {log.ranks} ranks of this log")
    if not named:
        raise CalibrationError(f"{log.source}: the {what} links of topology {topology.name!r} name "
                               "no technology (attribute tech), so there is nothing to calibrate; "
                               "use a preset (e.g. dgx-h100:nodes=2) or a YAML topology whose "
                               "links give tech:")
    if len(named) > 1 or None in found:
        raise CalibrationError(f"{log.source}: the {what} links of topology {topology.name!r} are "
                               f"of several technologies ({', '.join(named)}); calibrate needs one")
    return named[0]


def prepare_logs(logs: Sequence[NcclTestsLog], topology: Topology) -> list[LogSetup]:
    """Check every log against ``topology`` before anything is simulated (module docstring);
    :class:`CalibrationError` naming the log for what cannot be simulated."""
    hosts = host_map(topology)
    out = []
    for log in logs:
        n = log.ranks
        if n > topology.num_gpus:
            raise CalibrationError(f"{log.source}: the log has {n} ranks but topology "
                                   f"{topology.name!r} has {topology.num_gpus} GPUs; give a "
                                   f"topology with at least {n} (its first {n} GPUs run the log)")
        if n < 2:
            raise CalibrationError(f"{log.source}: a collective needs at least 2 ranks, the log "
                                   f"has {n}")
        if log.op == "sendrecv" and n != 2:
            raise CalibrationError(f"{log.source}: sendrecv_perf on {n} ranks sends around a ring "
                                   "of all of them at once, dessim's sendrecv is one pair; give "
                                   "a 2-rank sendrecv log")
        if log.cputime:
            raise CalibrationError(f"{log.source}: the times are CPU times (nccl-tests -C 1); "
                                   "calibrate needs GPU times (run without -C)")
        rows = tuple(sorted((r for r in log.rows if r.size_bytes > 0), key=lambda r: r.size_bytes))
        if not rows:
            raise CalibrationError(f"{log.source}: no row of size > 0")
        group = tuple(range(n))
        spanned = hosts.split(group)
        gpus = [topology.node_of(r) for r in group]
        if len(spanned) > 1:
            nics = [nic for part in spanned for nic in hosts.host_of(part[0]).nics]
            tech = _one_tech(_techs(topology, nics, SCALE_OUT_TYPES), "scale-out (NIC)", log,
                             topology)
            role = "scale-out NIC"
        else:
            found = (_techs(topology, gpus, SCALE_UP_TYPES) or _techs(topology, gpus, ("pcie",))
                     or _techs(topology, gpus, LINK_TYPES))
            tech = _one_tech(found, "scale-up", log, topology)
            role = "scale-up"
        out.append(LogSetup(log, group, len(spanned), tech, role, rows))
    return out


# --------------------------------------------------------------------------------------------
# The model at a set of constants
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _State:
    """Constants under fit: efficiency and latency (s) per technology, call overhead (s)."""

    eff: tuple[tuple[str, float], ...] = ()
    lat: tuple[tuple[str, float], ...] = ()
    overhead: float = 0.0

    def with_(self, kind: str, tech: str | None, value: float) -> "_State":
        if kind == "overhead":
            return _State(self.eff, self.lat, value)
        table = dict(self.eff if kind == "efficiency" else self.lat)
        table[tech] = value
        items = tuple(sorted(table.items()))
        return _State(items, self.lat, self.overhead) if kind == "efficiency" else \
            _State(self.eff, items, self.overhead)

    def get(self, kind: str, tech: str | None) -> float:
        if kind == "overhead":
            return self.overhead
        return dict(self.eff if kind == "efficiency" else self.lat)[tech]

    def links(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for tech, e in self.eff:
            out.setdefault(tech, {})["efficiency"] = e
        for tech, lat in self.lat:
            out.setdefault(tech, {})["latency"] = lat
        return out


def _with_seconds(doc: dict) -> Calibration:
    """A calibration from values already in SI units (seconds)."""
    return Calibration.model_validate(doc, context={"seconds": True})


class _Model:
    """Times of log rows at a :class:`_State` (memoised), on a private copy of the topology
    (so the per-state topologies it caches die with it)."""

    def __init__(self, topology: Topology, algo: str, protocol: str) -> None:
        self.topology = Topology(topology.graph.copy(), topology.name, topology.dims,
                                 dict(topology.meta))
        self.algo, self.protocol = algo, protocol
        self.memo: dict[tuple, float] = {}

    def run(self, setup: LogSetup, size: int, state: _State):
        links = _with_seconds({"links": state.links()})
        topo = calibrated_topology(self.topology, links)
        return run_collective(setup.log.op, size, topo, algo=self.algo, protocol=self.protocol,
                              ranks=setup.group,
                              calibration=_with_seconds({"nccl": {
                                  "call_overhead": state.overhead,
                                  "net_call_overhead": state.overhead}}))

    def time(self, setup: LogSetup, row: NcclTestsRow, state: _State) -> float:
        key = (setup.log.op, setup.group, row.size_bytes, state)
        if key not in self.memo:
            self.memo[key] = self.run(setup, row.size_bytes, state).time_s
        return self.memo[key]

    def busiest_tech(self, setup: LogSetup, row: NcclTestsRow, state: _State) -> str | None:
        """The technology of the busiest link when ``row`` runs (None if it names none)."""
        result = self.run(setup, row.size_bytes, state)
        if not result.link_util:
            return None
        a, _, b = result.link_util[0]["link"].replace("<->", "->").partition("->")
        return link_tech(self.topology.graph.edges[a, b])


def _spread(indices: list[int], k: int) -> list[int]:
    """At most ``k`` of ``indices``, evenly spread, first and last included."""
    if len(indices) <= k:
        return indices
    return [indices[round(i * (len(indices) - 1) / (k - 1))] for i in range(k)]


def _classify(setup: LogSetup, times: Sequence[float]) -> tuple[list[int], list[int]]:
    """Indices of the latency-bound rows (at most :data:`POINTS_PER_LOG`, spread over their
    sizes) and of the largest bandwidth-bound rows (module docstring)."""
    rows = setup.rows
    if len(rows) < 2:
        return [], []
    fastest = min(r.time_s for r in rows)
    small, large = [], []
    for i in range(len(rows)):
        j, k = (i, i + 1) if i + 1 < len(rows) else (i - 1, i)
        elasticity = (math.log(times[k] / times[j])
                      / math.log(rows[k].size_bytes / rows[j].size_bytes))
        if elasticity < SMALL_ELASTICITY and rows[i].time_s <= SMALL_MEASURED * fastest:
            small.append(i)
        elif elasticity >= LARGE_ELASTICITY:
            large.append(i)
    return _spread(small, POINTS_PER_LOG), large[-POINTS_PER_LOG:]


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------


@dataclass
class _Param:
    """One constant under fit and the points that fit it."""

    kind: str                     # efficiency, overhead or latency
    tech: str | None
    points: list[tuple[LogSetup, NcclTestsRow]] = field(default_factory=list)

    @property
    def key(self) -> str:
        if self.kind == "overhead":
            return "nccl.call_overhead"
        return f"links.{self.tech}.{self.kind}"

    # u: the solved variable (log e for an efficiency, seconds otherwise)
    def to_u(self, value: float) -> float:
        return math.log(value) if self.kind == "efficiency" else value

    def from_u(self, u: float) -> float:
        return math.exp(u) if self.kind == "efficiency" else u

    def bounds(self) -> tuple[float, float]:
        if self.kind == "efficiency":
            return math.log(_MIN_EFFICIENCY), 0.0
        return 0.0, _MAX_SECONDS

    def tol(self, u: float) -> float:
        return RTOL if self.kind == "efficiency" else max(RTOL * abs(u), 1e-10)

    def htol(self) -> float:
        """|h| within which the points cannot tell the constant better (:data:`HTOL`)."""
        if self.kind == "efficiency":
            return HTOL
        return HTOL * median(row.time_s for _, row in self.points)

    @property
    def role(self) -> str:
        return self.points[0][0].role if self.points else ""

    def residual(self, model: _Model, state: _State) -> Callable[[float], float]:
        """h(u): non-decreasing in u with a nominal slope of 1 (dessim.calibrate.solve)."""
        def h(u: float) -> float:
            s = state.with_(self.kind, self.tech, self.from_u(u))
            if self.kind == "efficiency":
                return -median(math.log(model.time(log, row, s) / row.time_s)
                               for log, row in self.points)
            return median(model.time(log, row, s) - row.time_s for log, row in self.points)
        return h

    def text(self, value: float) -> str:
        return f"{value:.4f}" if self.kind == "efficiency" else format_time(value, 6)

    def rounded(self, value: float) -> float:
        """The value as written: efficiencies to 4 decimals (0.01 % of a time at most),
        times to 0.1 ns."""
        return round(value, 4) if self.kind == "efficiency" else round(value, 10)


def _start(setups: Sequence[LogSetup], topology: Topology, base: Calibration) -> _State:
    """The constants the fit starts from: the base calibration's, or the topology's links."""
    graph = topology.graph
    eff, lat = {}, {}
    for tech in sorted({s.tech for s in setups}):
        attrs = [d for _, _, d in graph.edges(data=True) if link_tech(d) == tech]
        eff[tech] = float(median(d["efficiency"] for d in attrs))
        lat[tech] = float(median(d["lat"] for d in attrs))
    overhead = load_calibration(base).nccl.call_overhead or 0.0
    return _State(tuple(sorted(eff.items())), tuple(sorted(lat.items())), overhead)


def _params(setups: Sequence[LogSetup], classes: Sequence[tuple[list[int], list[int]]],
            notes: list[str]) -> list[_Param]:
    params: dict[tuple[str, str | None], _Param] = {}
    single = [(s, c) for s, c in zip(setups, classes) if s.hosts == 1 and c[0]]
    multi = [(s, c) for s, c in zip(setups, classes) if s.hosts > 1 and c[0]]
    split = bool(single and multi)   # overhead from one host, scale-out latency across hosts
    for setup, (small, large) in zip(setups, classes):
        if large:
            p = params.setdefault(("efficiency", setup.tech), _Param("efficiency", setup.tech))
            p.points.extend((setup, setup.rows[i]) for i in large)
        else:
            notes.append(f"{setup.log.source}: no bandwidth-bound size (the model's time grows "
                         "less than in proportion to the size everywhere); it fits no efficiency")
        if not small:
            notes.append(f"{setup.log.source}: no latency-bound size; it fits no overhead or "
                         "latency")
            continue
        kind, tech = ("latency", setup.tech) if split and setup.hosts > 1 else ("overhead", None)
        p = params.setdefault((kind, tech), _Param(kind, tech))
        p.points.extend((setup, setup.rows[i]) for i in small)
    # latency first: small messages hardly depend on the efficiencies, large ones a little on
    # the latency terms, so this order settles in about two passes; scale-up efficiencies
    # before scale-out ones, which multi-host logs may see through the scale-up links
    order = {"overhead": 0, "latency": 1, "efficiency": 2}
    return sorted(params.values(), key=lambda p: (order[p.kind], p.role != "scale-up",
                                                  p.tech or ""))


def _describe_points(param: _Param) -> str:
    logs = {}
    for setup, _ in param.points:
        logs.setdefault(setup.log.source, setup)
    what = {"efficiency": "large-message times", "overhead": "small-message times",
            "latency": "small-message times across hosts"}[param.kind]
    parts = [f"{src} ({s.describe()}" + (f", {s.tech} is its {s.role} technology)"
                                         if param.kind == "efficiency" else ")")
             for src, s in logs.items()]
    return f"{what} ({len(param.points)} sizes) of " + "; ".join(parts)


def fit_collectives(logs: Sequence[NcclTestsLog], topology: Topology,
                    base: Calibration | None = None, *, algo: str = "auto",
                    protocol: str = "auto") -> PartFit:
    """Fit link efficiencies, ``nccl.call_overhead`` and (with single- and multi-host logs)
    scale-out latency to ``logs`` on ``topology`` (module docstring). ``base``: the user's own
    starting calibration (unmerged; None: the built-in one). Returns the fitted part of the
    calibration, a line per constant, the residual of every row and notes."""
    base = base or Calibration()
    topology = calibrated_topology(topology, base)
    setups = prepare_logs(logs, topology)
    model = _Model(topology, algo, protocol)
    state = _start(setups, topology, base)
    notes: list[str] = []
    classes = [_classify(s, [model.time(s, r, state) for r in s.rows]) for s in setups]
    params = _params(setups, classes, notes)
    initial = state
    status: dict[str, str] = {}
    for _ in range(_MAX_PASSES):
        moved = False
        for p in params:
            u0 = p.to_u(state.get(p.kind, p.tech))
            sol = solve(p.residual(model, state), u0, *p.bounds(), p.tol, p.htol())
            state = state.with_(p.kind, p.tech, p.from_u(sol.u))
            status[p.key] = sol.status
            moved = moved or abs(sol.u - u0) > p.tol(u0)
        if not moved:
            break
    else:
        notes.append(f"the fit did not settle within {_MAX_PASSES} passes; the constants "
                     "below are the last pass's")
    part = PartFit()
    written: dict = {"nccl": {}, "links": {}}
    for p in params:
        keep = _check(p, model, state, status[p.key], notes)
        if not keep:
            state = state.with_(p.kind, p.tech, initial.get(p.kind, p.tech))
            continue
        value = p.rounded(state.get(p.kind, p.tech))
        state = state.with_(p.kind, p.tech, value)      # the residuals are of what is written
        source = f"dessim calibrate: {_describe_points(p)}"
        if p.kind == "overhead":
            # the model ran with this one overhead for calls on one host and across hosts
            written["nccl"] = {"call_overhead": value, "net_call_overhead": value,
                               "source": source}
        else:
            entry = written["links"].setdefault(p.tech, {})
            entry[p.kind] = value
            entry["source"] = "; ".join(filter(None, (entry.get("source"), source)))
        part.fitted.append(Fitted(p.key, p.text(initial.get(p.kind, p.tech)), p.text(value),
                                  _describe_points(p)))
    part.calibration = _with_seconds({k: v for k, v in written.items() if v})
    used = {(id(s), r.size_bytes): p.key for p in params for s, r in p.points
            if any(f.key == p.key for f in part.fitted)}
    for setup in setups:
        for row in setup.rows:
            part.residuals.append(Residual(
                setup.where(row), f"{setup.log.op} {format_size(row.size_bytes)}, "
                f"{len(setup.group)} ranks", row.time_s, model.time(setup, row, state),
                used.get((id(setup), row.size_bytes), "")))
    part.notes.extend(notes)
    return part


def _check(p: _Param, model: _Model, state: _State, status: str, notes: list[str]) -> bool:
    """Notes on how well ``p`` is determined; False when it should not be written."""
    value = state.get(p.kind, p.tech)
    if p.kind == "efficiency":
        if status == "high":
            notes.append(f"{p.key}: the measured large-message times are shorter than the model "
                         f"gives even at efficiency 1 (the log implies more than the link rate: "
                         "e.g. SHARP or NVLS in-network reduction, which the model lacks); "
                         "written as 1.0, see the residuals")
            return True
        h = p.residual(model, state)
        u = p.to_u(value)
        sensitivity = (h(u) - h(u - 0.1)) / 0.1
        if sensitivity < WEAK:
            setup, row = max(p.points, key=lambda pt: pt[1].size_bytes)
            busiest = model.busiest_tech(setup, row, state)
            elsewhere = f"; the model's busiest link there is {busiest}" if busiest else ""
            notes.append(f"{p.key}: not constrained by these logs (the large-message times "
                         f"change by {100 * sensitivity:.1f} % per % of efficiency{elsewhere}); "
                         f"not written")
            return False
        return True
    what = "call overhead" if p.kind == "overhead" else f"{p.tech} latency"
    if status == "low":
        written = "written as 0" if p.kind == "overhead" else "not written"
        notes.append(f"{p.key}: the model's own latency exceeds the measured small-message "
                     f"times even with a {what} of 0; {written}, see the residuals")
        return p.kind == "overhead"
    if status == "high":
        notes.append(f"{p.key}: the measured small-message times need more than "
                     f"{format_time(_MAX_SECONDS)} of {what}; written at that bound")
    if p.kind == "latency":
        h = p.residual(model, state)
        if h(value) == h(0.5 * value):
            notes.append(f"{p.key}: the small-message times across hosts do not depend on the "
                         f"{p.tech} latency here (NCCL's per-hop network latency floors it); "
                         "not written")
            return False
    return True
