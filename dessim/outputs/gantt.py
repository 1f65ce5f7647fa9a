"""Gantt charts of a run that stay readable at 1,000 GPUs: PNG (matplotlib) or HTML (inline SVG).

Rows (:class:`GanttOptions`.rows)
    ``stage`` — one row per pipeline stage (the ranks the caller groups, :class:`GanttLabels`);
    ``rank`` — one row per rank while there are at most ``max_rows`` ranks with spans, else
    ``max_rows`` rows of consecutive ranks; ``auto`` — ``stage`` when the caller gives stages,
    else ``rank``. Each row has a compute lane (forward, backward, weight-gradient,
    recompute, optimizer, idle) over a thinner communication lane (one colour per kind,
    lighter where it covers less of a time bin, blank); :mod:`dessim.outputs.activity` defines the activities and
    how rows of many ranks are aggregated (merged segments, majority per time bin).

Size
    A lane has at most ``bins`` segments (default: one per pixel column of the time axis).
    The HTML is one self-contained file — inline SVG, one ``<path>`` per activity and lane,
    a few lines of script that print the time under the pointer; no JavaScript library — and
    while it would exceed ``max_bytes`` (default 2 MB) there are fewer bins (a chart that does
    not fit even at one bin per lane is an error naming ``--gantt-max-rows``). The Chrome trace
    (``--timeline``) keeps every task for zooming in.

Title
    Workload, layout, topology and iteration time (the makespan), then what a row is and
    the bin width when rows are binned. Times on the axis in s, ms or µs.

Output is deterministic: same result, same bytes.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dessim.engine.result import SPAN_COLUMNS, SimulationResult
from dessim.errors import DessimError
from dessim.resources import check_output, install_hint, output_format
from dessim.outputs.activity import ACTIVITIES, LANES, LaneRow, gantt_rows, rank_lanes

__all__ = ["GanttOptions", "GanttLabels", "GanttChart", "ROW_MODES", "build_gantt", "write_gantt",
           "gantt_html", "workload_labels", "GANTT_FORMATS"]

#: Gantt formats by suffix → the extra that draws them (HTML is self-contained SVG).
GANTT_FORMATS: dict[str, str | None] = {".png": "plot", ".html": None, ".htm": None}

#: Row modes of :class:`GanttOptions` (see module doc).
ROW_MODES: tuple[str, ...] = ("auto", "stage", "rank")

_COLUMNS = {c: i for i, c in enumerate(SPAN_COLUMNS)}
_PLOT_W = 1200          # px of the time axis (HTML); the default bin count
_LABEL_W = 130          # px of the row labels
_LANE_H = {"compute": 12, "comm": 6}
_ROW_GAP = 5


@dataclass(frozen=True)
class GanttOptions:
    """How to draw: ``rows`` mode (:data:`ROW_MODES`), at most ``max_rows`` rank rows,
    ``bins`` time bins per lane (None: one per pixel column), ``max_bytes`` of HTML."""

    rows: str = "auto"
    max_rows: int = 64
    bins: int | None = None
    max_bytes: int = 2_000_000

    def __post_init__(self) -> None:
        if self.rows not in ROW_MODES:
            raise DessimError(f"Gantt rows {self.rows!r}: expected one of {', '.join(ROW_MODES)}")
        if self.max_rows < 1:
            raise DessimError(f"Gantt max rows {self.max_rows!r}: expected a whole number >= 1")
        if self.bins is not None and self.bins < 1:
            raise DessimError(f"Gantt bins {self.bins!r}: expected a whole number >= 1")


@dataclass(frozen=True)
class GanttLabels:
    """What the run is, for the title, and its pipeline stages as ``(label, ranks)`` rows in
    display order (empty: the run has no stages)."""

    workload: str = ""
    layout: str = ""
    topology: str = ""
    stages: tuple[tuple[str, tuple[int, ...]], ...] = field(default_factory=tuple)


def workload_labels(result: Any, topology: str) -> GanttLabels:
    """The labels of a :func:`dessim.workload.simulate_workload` result: name, and for a
    transformer its layout and pipeline stages (ranks of each stage, in stage order)."""
    from dessim.workload.transformer.result import WorkloadResult

    if not isinstance(result, WorkloadResult):     # DLRM, CNN, a Chakra trace: no stages
        return GanttLabels(workload=str(getattr(result, "name", "")), topology=topology)
    lo = result.plan.layout
    stages: dict[int, list[int]] = {}
    for rank in range(result.plan.num_gpus):
        stages.setdefault(lo.stage_of(rank), []).append(rank)
    return GanttLabels(workload=result.plan.name, layout=lo.describe(), topology=topology,
                       stages=tuple((f"stage {s}", tuple(r)) for s, r in sorted(stages.items())))


@dataclass(frozen=True)
class GanttChart:
    """What both writers draw: the title lines, the lanes and the time span (seconds)."""

    title: str
    subtitle: str
    lanes: tuple[LaneRow, ...]
    makespan_s: float
    bins: int


def _scale(makespan: float) -> tuple[float, str]:
    if makespan >= 1:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _fmt(seconds: float) -> str:
    k, unit = _scale(seconds)
    return f"{seconds * k:.4g} {unit}"


def _rows(result: SimulationResult, labels: GanttLabels, options: GanttOptions,
          ranks: Sequence[int]) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    """The chart's rows and the phrase that says what a row is."""
    mode = options.rows
    if mode == "auto":
        mode = "stage" if labels.stages else "rank"
    if mode == "stage":
        if not labels.stages:
            raise DessimError("Gantt rows 'stage': this run has no pipeline stages "
                              "(use rows 'rank' or 'auto')")
        size = max(len(r) for _, r in labels.stages)
        return list(labels.stages), f"one row per pipeline stage ({size} ranks each)"
    if len(ranks) <= options.max_rows:
        return [(f"rank {r}", (r,)) for r in ranks], "one row per rank"
    per = -(-len(ranks) // options.max_rows)
    blocks = [tuple(ranks[i:i + per]) for i in range(0, len(ranks), per)]
    return ([(f"ranks {b[0]}-{b[-1]}", b) for b in blocks],
            f"one row per {per} consecutive ranks ({len(ranks)} ranks with tasks)")


@dataclass(frozen=True)
class _Prepared:
    """A run's rank lanes and chart rows, computed once for any number of bin counts."""

    lanes: dict
    rows: list[tuple[str, tuple[int, ...]]]
    title: str
    what: str
    makespan_s: float

    def chart(self, bins: int) -> GanttChart:
        lanes = tuple(gantt_rows(self.lanes, self.rows, self.makespan_s, bins))
        sub = self.what
        if any(lane.binned for lane in lanes):
            sub += (f"; binned at {_fmt(self.makespan_s / bins)} (each bin: the activity of most "
                    "rank-time)")
        return GanttChart(self.title, sub, lanes, self.makespan_s, bins)


def _prepare(result: SimulationResult, labels: GanttLabels | None,
             options: GanttOptions) -> _Prepared:
    labels = labels or GanttLabels()
    makespan = result.makespan_s
    lanes = rank_lanes(result.span_records, makespan, _COLUMNS)
    rows, what = _rows(result, labels, options, sorted(lanes))
    workload = labels.workload or result.meta.get("graph", "") or "run"
    topology = labels.topology or result.meta.get("topology", "")
    head = " · ".join(p for p in (workload, labels.layout, f"on {topology}" if topology else "") if p)
    if result.meta.get("fold"):
        what += "; folded run: rows show the simulated representative ranks"
    return _Prepared(lanes, rows, f"{head} · iteration {_fmt(makespan)}", what, makespan)


def build_gantt(result: SimulationResult, labels: GanttLabels | None = None,
                options: GanttOptions | None = None, bins: int | None = None) -> GanttChart:
    """The chart of ``result`` (module doc); ``bins`` overrides ``options.bins``."""
    options = options or GanttOptions()
    return _prepare(result, labels, options).chart(bins or options.bins or _PLOT_W)


# ------------------------------------------------------------------ HTML (inline SVG)
def _ticks(makespan: float) -> list[float]:
    """About eight round tick positions (seconds) across [0, makespan]."""
    if makespan <= 0:
        return [0.0]
    raw = makespan / 8
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(makespan / step + 1e-9) + 1)]


def gantt_html(chart: GanttChart) -> str:
    """The chart as one self-contained HTML page (inline SVG, no external resources)."""
    k, unit = _scale(chart.makespan_s)
    span = chart.makespan_s or 1.0
    x = lambda t: _LABEL_W + t / span * _PLOT_W  # noqa: E731
    paths: list[str] = []
    labels: list[str] = []
    y = 30
    row_y: dict[str, float] = {}
    for lane in chart.lanes:
        if lane.row not in row_y:
            row_y[lane.row] = y
            labels.append(f'<text x="{_LABEL_W - 6}" y="{y + 10}" text-anchor="end">'
                          f'{html.escape(lane.row)}</text>')
            y += sum(_LANE_H.values()) + _ROW_GAP
        h = _LANE_H[lane.lane]
        mid = row_y[lane.row] + (0 if lane.lane == "compute" else _LANE_H["compute"]) + h / 2
        by_act: dict[tuple[int, float], list[str]] = {}
        for s in lane.segments:
            by_act.setdefault((s.activity, s.share), []).append(
                f"M{x(s.start_s):.1f} {mid:g}h{(s.end_s - s.start_s) / span * _PLOT_W:.2f}")
        for (act, share), ds in sorted(by_act.items()):
            a = ACTIVITIES[act]
            opacity = f' stroke-opacity="{share:g}"' if share < 1 else ""
            part = f" ({share:.0%} of the time)" if share < 1 else ""
            paths.append(f'<path d="{"".join(ds)}" stroke="{a.color}" stroke-width="{h}"{opacity}>'
                         f'<title>{html.escape(lane.row)}: {a.name}{part}</title></path>')
    height = y + 40
    ticks = "".join(f'<line x1="{x(t):.1f}" y1="24" x2="{x(t):.1f}" y2="{y}" class="g"/>'
                    f'<text x="{x(t):.1f}" y="{y + 16}" text-anchor="middle">{t * k:.4g}</text>'
                    for t in _ticks(chart.makespan_s))
    used = sorted({s.activity for lane in chart.lanes for s in lane.segments})
    legend = "".join(f'<span><i style="background:{ACTIVITIES[a].color}"></i>{ACTIVITIES[a].name}</span>'
                     for a in used)
    svg = (f'<svg id="g" xmlns="http://www.w3.org/2000/svg" width="{_LABEL_W + _PLOT_W + 20}" '
           f'height="{height}" font-size="11" font-family="sans-serif">'
           f'<style>.g{{stroke:#ccc;stroke-width:.5}}</style>{ticks}{"".join(labels)}'
           f'<text x="{_LABEL_W + _PLOT_W / 2}" y="{y + 32}" text-anchor="middle">time ({unit})</text>'
           f'<text id="t" x="{_LABEL_W}" y="14"></text>{"".join(paths)}</svg>')
    script = ("const g=document.getElementById('g'),t=document.getElementById('t');"
              "g.addEventListener('mousemove',e=>{const r=g.getBoundingClientRect(),"
              f"v=(e.clientX-r.left-{_LABEL_W})/{_PLOT_W}*{chart.makespan_s * k!r};"
              f"t.textContent=v>=0&&v<={chart.makespan_s * k!r}?'t = '+v.toPrecision(5)+' {unit}':''}});")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(chart.title)}</title><style>body{{font-family:sans-serif;margin:12px}}"
            "h1{font-size:16px;margin:0}p{font-size:12px;color:#555;margin:4px 0}"
            "#l span{display:inline-block;margin-right:14px;font-size:12px}"
            "#l i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}"
            f"</style></head><body><h1>{html.escape(chart.title)}</h1><p>{html.escape(chart.subtitle)}; "
            "each row: compute (upper lane), communication (lower lane; lighter = a smaller share of the bin). The timeline "
            "(--timeline) has every task.</p>"
            f'<div id="l">{legend}</div>{svg}<script>{script}</script></body></html>\n')


def _write_html(result: SimulationResult, path: Path, labels: GanttLabels | None,
                options: GanttOptions) -> None:
    bins = options.bins or _PLOT_W
    prepared = _prepare(result, labels, options)
    while True:
        chart = prepared.chart(bins)
        text = gantt_html(chart)
        size = len(text.encode("utf-8"))
        if size <= options.max_bytes:
            break
        if bins == 1:
            rows = len({lane.row for lane in chart.lanes})
            raise DessimError(f"Gantt chart {str(path)!r}: {rows} rows need {size} bytes even at "
                              f"one time bin, over the {options.max_bytes}-byte bound; draw fewer "
                              "rows (--gantt-max-rows, or --gantt-rows stage)")
        # fewer bins in proportion (lanes also cost a fixed part), at least halved
        bins = max(1, min(bins // 2, int(bins * options.max_bytes / size * 0.9)))
    path.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------ PNG
def _write_png(result: SimulationResult, path: Path, labels: GanttLabels | None,
               options: GanttOptions) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise DessimError(f"PNG Gantt charts need matplotlib: {install_hint('plot')}") from None
    chart = build_gantt(result, labels, options)
    k, unit = _scale(chart.makespan_s)
    rows = list(dict.fromkeys(lane.row for lane in chart.lanes))
    height = 0.32 * len(rows) + 2.2                 # inches
    fig, ax = plt.subplots(figsize=(14, height))
    for lane in chart.lanes:
        y = rows.index(lane.row)
        y0, h = (y - 0.42, 0.5) if lane.lane == "compute" else (y + 0.1, 0.3)
        by_act: dict[tuple[int, float], list[tuple[float, float]]] = {}
        for s in lane.segments:
            by_act.setdefault((s.activity, s.share), []).append((s.start_s * k, (s.end_s - s.start_s) * k))
        for (act, share), bars in sorted(by_act.items()):
            ax.broken_barh(bars, (y0, h), facecolors=ACTIVITIES[act].color, alpha=share, linewidth=0)
    used = sorted({s.activity for lane in chart.lanes for s in lane.segments})
    ax.legend([Patch(color=ACTIVITIES[a].color) for a in used], [ACTIVITIES[a].name for a in used],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(10, len(used)), fontsize=8,
              frameon=False)
    ax.set_yticks(range(len(rows)), rows, fontsize=7 if len(rows) > 24 else 8)
    ax.set_ylim(len(rows) - 0.5, -0.6)
    ax.set_xlim(0, chart.makespan_s * k)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{chart.title}\n{chart.subtitle}", fontsize=9, pad=22)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


#: Writers by file suffix.
_WRITERS = {".png": _write_png, ".html": _write_html, ".htm": _write_html}


def write_gantt(result: SimulationResult, path: str | Path, labels: GanttLabels | None = None,
                options: GanttOptions | None = None) -> Path:
    """Write a Gantt chart; ``.png`` (matplotlib) or ``.html`` (self-contained)."""
    path = check_output(path, "Gantt chart", GANTT_FORMATS)
    writer = _WRITERS[output_format(path, GANTT_FORMATS)]
    writer(result, path, labels, options or GanttOptions())
    return path
