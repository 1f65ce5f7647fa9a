"""What a GPU is doing when: spans classified into activities and aggregated into chart rows.

The Gantt charts (:mod:`dessim.outputs.gantt`) draw this, not raw spans, so that a chart of a
1,024-GPU run stays readable and small.

Activities (:data:`ACTIVITIES`, data; colours from matplotlib's "tab"/"deep" palettes, the comm
    lane's picked to stay apart when drawn light)
    Every span is one activity on one of two *lanes* of its rank:

    * ``compute`` lane: ``forward`` (category ``fwd``), ``backward`` (``bwd``),
      ``weight-gradient`` (category ``wgrad``: the W pass of a zero-bubble or DualPipe
      schedule; or a ``bwd`` compute task that is one weight-gradient GEMM alone: its
      name's kernel part ends in ``wgrad`` and is not a merged range ``a..b`` — merged layer
      or stage tasks that contain wgrad GEMMs stay ``backward``), ``recompute``,
      ``optimizer`` and ``other compute``; where no compute runs, ``idle``.
    * ``comm`` lane: one activity per communication category (``tp``, ``cp``, ``ep``,
      ``pp``, ``dp``, ``offload``; anything else ``other comm``) while data moves
      (``active_s``..``end_s``: time spent waiting for peers is not drawn — a receive posted
      early would cover the whole iteration; closed-form TP delays count as ``tp``); blank
      otherwise.

    When several activities of one lane overlap on a rank (e.g. a TP and a DP collective on
    two streams), the lane shows the first in :data:`ACTIVITIES` order.

Rows (:func:`gantt_rows`)
    A row is a set of ranks (a pipeline stage, one rank, or a block of consecutive ranks).
    A lane of a row is drawn exactly (adjacent same-activity intervals merged) when the row
    is one rank and needs at most ``bins`` segments. Otherwise time is cut into ``bins``
    equal bins and each bin shows the activity that covers the most rank-seconds of the
    row's ranks in it (compute lane: ``idle`` competes too). A comm-lane bin also carries
    the fraction of the bin's rank-seconds its activity covers, rounded up to quarters
    (``share``; drawn as opacity), so that short collectives between long computations stay
    visible without looking like they fill the bin. Adjacent equal bins merge, so a lane
    never has more than ``bins`` segments, whatever the run's size.

All times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Activity", "ACTIVITIES", "LANES", "Segment", "LaneRow", "SHARE_LEVELS", "classify",
           "rank_lanes", "gantt_rows"]


@dataclass(frozen=True, slots=True)
class Activity:
    """One colour of the chart: its name (legend), lane and colour (``#rrggbb``)."""

    name: str
    lane: str
    color: str


#: Every activity in priority order (first wins where a lane overlaps itself), compute lane
#: then comm lane; ``idle`` fills the compute lane's gaps.
ACTIVITIES: tuple[Activity, ...] = (
    Activity("forward", "compute", "#4C72B0"),
    Activity("backward", "compute", "#DD8452"),
    Activity("weight-gradient", "compute", "#8C564B"),
    Activity("recompute", "compute", "#8172B3"),
    Activity("optimizer", "compute", "#17BECF"),
    Activity("other compute", "compute", "#7F9CC9"),
    Activity("idle", "compute", "#E8E8E8"),
    Activity("tp", "comm", "#55A868"),
    Activity("cp", "comm", "#2CA02C"),
    Activity("ep", "comm", "#BCBD22"),
    Activity("pp", "comm", "#C44E52"),
    Activity("dp", "comm", "#7B3294"),
    Activity("offload", "comm", "#937860"),
    Activity("other comm", "comm", "#555555"),
)
#: The lanes of a row, top to bottom.
LANES: tuple[str, ...] = ("compute", "comm")

_INDEX = {a.name: i for i, a in enumerate(ACTIVITIES)}
_COMPUTE_BY_CATEGORY = {"fwd": "forward", "bwd": "backward", "wgrad": "weight-gradient",
                        "recompute": "recompute", "optimizer": "optimizer"}
_COMM_CATEGORIES = frozenset(a.name for a in ACTIVITIES if a.lane == "comm") - {"other comm"}
_COMM_KINDS = frozenset({"collective", "send", "recv", "memcpy"})
_FILLER = {"compute": "idle", "comm": None}
#: Binned communication shares are rounded up to multiples of 1/SHARE_LEVELS.
SHARE_LEVELS = 4


def _is_wgrad(name: str) -> bool:
    """A task name like ``bwd L3 mlp.up.wgrad mb0``: one wgrad kernel alone (see module doc)."""
    parts = name.split()
    return len(parts) >= 3 and ".." not in parts[2] and parts[2].endswith("wgrad")


def classify(kind: str, category: str, name: str) -> str:
    """The activity of a span (module doc): communication by category, compute by phase."""
    if kind in _COMM_KINDS or category in _COMM_CATEGORIES:
        return category if category in _COMM_CATEGORIES else "other comm"
    phase = _COMPUTE_BY_CATEGORY.get(category, "other compute")
    if phase == "backward" and kind == "compute" and _is_wgrad(name):
        return "weight-gradient"
    return phase


@dataclass(frozen=True, slots=True)
class Segment:
    """``start_s``..``end_s`` of one activity (index into :data:`ACTIVITIES`) on a lane."""

    start_s: float
    end_s: float
    activity: int
    label: str = ""      #: the task's name when the segment is one task drawn exactly
    share: float = 1.0   #: binned comm lane: the bin's fraction the activity covers (rounded up)


@dataclass(frozen=True, slots=True)
class LaneRow:
    """One lane of one chart row: its segments and whether they were binned."""

    row: str
    lane: str
    segments: tuple[Segment, ...]
    binned: bool


def _flatten(intervals: Sequence[tuple[float, float, int, str]], filler: str | None,
             makespan: float) -> list[Segment]:
    """Non-overlapping segments of one rank's lane: at every instant the highest-priority
    activity running (module doc), gaps as ``filler``; adjacent equal activities merged."""
    ordered = sorted((iv for iv in intervals if iv[1] > iv[0]), key=lambda iv: (iv[0], iv[1]))
    if all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:])):
        return _sequential(ordered, filler, makespan)
    bounds = sorted({0.0, makespan, *(s for s, _, _, _ in intervals), *(e for _, e, _, _ in intervals)})
    if len(bounds) < 2:
        return []
    starts: dict[float, list[int]] = {}
    ends: dict[float, list[int]] = {}
    for i, (s, e, _, _) in enumerate(intervals):
        if e > s:
            starts.setdefault(s, []).append(i)
            ends.setdefault(e, []).append(i)
    running: dict[int, int] = {}       # interval index -> activity
    fill = _INDEX[filler] if filler is not None else None
    out: list[Segment] = []
    for t0, t1 in zip(bounds, bounds[1:]):
        for i in ends.get(t0, ()):
            running.pop(i, None)
        for i in starts.get(t0, ()):
            running[i] = intervals[i][2]
        if running:
            act = min(running.values())
            names = {intervals[i][3] for i, a in running.items() if a == act}
            label = names.pop() if len(names) == 1 else ""
        elif fill is not None:
            act, label = fill, ""
        else:
            continue
        last = out[-1] if out else None
        if last is not None and last.activity == act and last.end_s == t0:
            out[-1] = Segment(last.start_s, t1, act, last.label if last.label == label else "")
        else:
            out.append(Segment(t0, t1, act, label))
    return out


def _sequential(ordered: Sequence[tuple[float, float, int, str]], filler: str | None,
                makespan: float) -> list[Segment]:
    """:func:`_flatten` of intervals that do not overlap (one stream), in one pass."""
    fill = _INDEX[filler] if filler is not None else None
    out: list[Segment] = []
    t = 0.0
    for s, e, act, name in [*ordered, (makespan, makespan, -1, "")]:
        if s > t and fill is not None:
            out.append(Segment(t, s, fill))
        if act < 0:
            break
        last = out[-1] if out else None
        if last is not None and last.activity == act and last.end_s == s:
            out[-1] = Segment(last.start_s, e, act, "")
        else:
            out.append(Segment(s, e, act, name))
        t = e
    return out


def rank_lanes(span_records: Iterable[tuple], makespan: float,
               columns: Mapping[str, int]) -> dict[int, dict[str, list[Segment]]]:
    """Per rank, per lane: the flattened segments of its spans (module doc). ``columns``
    maps span column names to tuple positions (:data:`dessim.engine.result.SPAN_COLUMNS`)."""
    c = columns
    per: dict[int, dict[str, list[tuple[float, float, int, str]]]] = {}
    for rec in span_records:
        act = classify(rec[c["kind"]], rec[c["category"]] or "", rec[c["name"]])
        lanes = per.setdefault(int(rec[c["rank"]]), {lane: [] for lane in LANES})
        start, active, end = rec[c["start_s"]], rec[c["active_s"]], rec[c["end_s"]]
        lane = ACTIVITIES[_INDEX[act]].lane
        lanes[lane].append((active if lane == "comm" else start, end, _INDEX[act], rec[c["name"]]))
    return {r: {lane: _flatten(iv, _FILLER[lane], makespan) for lane, iv in lanes.items()}
            for r, lanes in sorted(per.items())}


def _coverage(segments: Sequence[Segment], edges: np.ndarray) -> np.ndarray:
    """Seconds each activity covers in each bin: array ``(activities, bins)``."""
    cov = np.zeros((len(ACTIVITIES), len(edges) - 1))
    if not segments:
        return cov
    acts = np.fromiter((s.activity for s in segments), int, len(segments))
    st = np.fromiter((s.start_s for s in segments), float, len(segments))
    en = np.fromiter((s.end_s for s in segments), float, len(segments))
    for a in np.unique(acts):
        s, e = np.sort(st[acts == a]), np.sort(en[acts == a])
        # covered length up to t: sum(max(0, t - s_i)) - sum(max(0, t - e_i))
        cs, ce = np.concatenate(([0.0], np.cumsum(s))), np.concatenate(([0.0], np.cumsum(e)))
        ks, ke = np.searchsorted(s, edges, "right"), np.searchsorted(e, edges, "right")
        upto = (ks * edges - cs[ks]) - (ke * edges - ce[ke])
        cov[a] = np.diff(upto)
    return cov


def _binned(members: Sequence[list[Segment]], lane: str, makespan: float, bins: int) -> list[Segment]:
    edges = np.linspace(0.0, makespan, bins + 1)
    cov = sum((_coverage(segs, edges) for segs in members), np.zeros((len(ACTIVITIES), bins)))
    best = np.argmax(cov, axis=0)                  # ties: the first activity in priority order
    room = len(members) * np.diff(edges)           # rank-seconds in each bin
    share = np.zeros(bins)
    if _FILLER[lane] is None:                      # comm lane: lighter where less of the bin
        np.divide(cov[best, np.arange(bins)], room, out=share, where=room > 0)
        share = np.ceil(np.clip(share, 0.0, 1.0) * SHARE_LEVELS) / SHARE_LEVELS
    else:
        share[:] = 1.0
    out: list[Segment] = []
    for b in range(bins):
        act, level = int(best[b]), float(share[b])
        if cov[act, b] <= 0:
            continue
        if out and out[-1].activity == act and out[-1].share == level and out[-1].end_s == edges[b]:
            out[-1] = Segment(out[-1].start_s, float(edges[b + 1]), act, share=level)
        else:
            out.append(Segment(float(edges[b]), float(edges[b + 1]), act, share=level))
    return out


def gantt_rows(lanes: Mapping[int, Mapping[str, list[Segment]]], rows: Sequence[tuple[str, Sequence[int]]],
               makespan: float, bins: int) -> list[LaneRow]:
    """The chart's lanes: for each ``(label, ranks)`` row, each lane exact or binned (module
    doc). Ranks without spans are left out of their row; a row without any is dropped."""
    out: list[LaneRow] = []
    for label, ranks in rows:
        members = [lanes[r] for r in ranks if r in lanes]
        if not members:
            continue
        for lane in LANES:
            segs = [m[lane] for m in members]
            if len(segs) == 1 and len(segs[0]) <= bins:
                out.append(LaneRow(label, lane, tuple(segs[0]), False))
            else:
                out.append(LaneRow(label, lane, tuple(_binned(segs, lane, makespan, bins)), True))
    return out
