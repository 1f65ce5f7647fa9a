"""Gantt charts of a run: PNG (matplotlib) or standalone interactive HTML (plotly).

One row per (rank, stream), one bar per task coloured by kind; a bar's hatched/lighter
leading part (HTML: hover text) is time spent waiting for peers. Time axis in seconds
(scaled to ms or us for readability).
"""

from __future__ import annotations

from pathlib import Path

from dessim.engine.result import SimulationResult
from dessim.errors import DessimError

__all__ = ["write_gantt", "KIND_COLORS"]

#: Colour of each task kind.
KIND_COLORS: dict[str, str] = {"compute": "#4C72B0", "delay": "#8C8C8C", "collective": "#DD8452",
                               "send": "#55A868", "recv": "#2E7D4F", "memcpy": "#8172B3"}


def _scale(makespan: float) -> tuple[float, str]:
    if makespan >= 1:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def _rows(result: SimulationResult, max_spans: int):
    """Spans to draw, row labels and row index; with more than ``max_spans`` spans only the
    first ranks whose spans fit are drawn (at least one), and the note says so."""
    df = result.spans()
    note = ""
    if len(df) > max_spans:
        counts = df.groupby("rank", sort=True).size()
        keep, total = [], 0
        for rank, n in counts.items():
            if keep and total + n > max_spans:
                break
            keep.append(rank)
            total += n
        note = (f" (ranks {keep[0]}-{keep[-1]} of {counts.index.size}: {len(df)} tasks exceed "
                f"{max_spans}; the Chrome trace has them all)")
        df = df[df["rank"].isin(keep)]
    labels = sorted({(int(r), str(s)) for r, s in zip(df["rank"], df["stream"])},
                    key=lambda rs: (rs[0], rs[1] != "compute", rs[1]))
    row = {lab: i for i, lab in enumerate(labels)}
    return df, labels, row, note


def _write_png(result: SimulationResult, path: Path, max_spans: int) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DessimError("PNG Gantt charts need matplotlib: pip install 'dessim[plot]'") from None
    df, labels, row, note = _rows(result, max_spans)
    k, unit = _scale(result.makespan_s)
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(labels) + 1.5))
    for kind, part in df.groupby("kind", sort=True):
        for (rank, stream), sub in part.groupby(["rank", "stream"], sort=True):
            y = row[(int(rank), str(stream))]
            active = [((a * k), (e - a) * k) for a, e in zip(sub["active_s"], sub["end_s"])]
            ax.broken_barh(active, (y - 0.4, 0.8), facecolors=KIND_COLORS.get(kind, "#999999"),
                           label=kind)
            waits = [(s * k, (a - s) * k) for s, a in zip(sub["start_s"], sub["active_s"]) if a > s]
            if waits:
                ax.broken_barh(waits, (y - 0.4, 0.8), facecolors="none",
                               edgecolors=KIND_COLORS.get(kind, "#999999"), hatch="//",
                               linewidth=0.5)
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper right", fontsize=8)
    ax.set_yticks(range(len(labels)), [f"rank {r} {s}" for r, s in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{result.meta.get('graph', '')} on {result.meta.get('topology', '')}\n"
                 f"makespan {result.makespan_s * k:.4g} {unit}{note}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _write_html(result: SimulationResult, path: Path, max_spans: int) -> None:
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise DessimError("HTML Gantt charts need plotly: pip install 'dessim[html]'") from None
    df, labels, row, note = _rows(result, max_spans)
    k, unit = _scale(result.makespan_s)
    fig = go.Figure()
    names = [f"rank {r} {s}" for r, s in labels]
    for kind, part in df.groupby("kind", sort=True):
        text = [f"{t}<br>{kind} {c}<br>start {s * k:.6g} {unit}, end {e * k:.6g} {unit}"
                f"<br>waited {(a - s) * k:.6g} {unit}<br>{b:.6g} B, {f:.6g} FLOP"
                for t, c, s, a, e, b, f in zip(part["name"], part["category"], part["start_s"],
                                                part["active_s"], part["end_s"], part["bytes"],
                                                part["flops"])]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", base=(part["start_s"] * k).tolist(),
            x=((part["end_s"] - part["start_s"]) * k).tolist(),
            y=[names[row[(int(r), str(s))]] for r, s in zip(part["rank"], part["stream"])],
            marker_color=KIND_COLORS.get(kind, "#999999"), hovertext=text, hoverinfo="text"))
    fig.update_layout(barmode="overlay", title=f"makespan {result.makespan_s * k:.4g} {unit}{note}",
                      xaxis_title=f"time ({unit})", height=max(300, 28 * len(labels) + 150))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=names)
    fig.write_html(path, include_plotlyjs=True, full_html=True)


def write_gantt(result: SimulationResult, path: str | Path, *, max_spans: int = 20000) -> Path:
    """Write a Gantt chart; ``.png`` (matplotlib) or ``.html`` (plotly, self-contained).

    Runs with more than ``max_spans`` tasks are drawn for their first ranks only (whole
    ranks, as many as fit); the title says which."""
    path = Path(path)
    if path.suffix == ".png":
        _write_png(result, path, max_spans)
    elif path.suffix in (".html", ".htm"):
        _write_html(result, path, max_spans)
    else:
        raise DessimError(f"Gantt chart {str(path)!r}: unknown format {path.suffix!r} "
                          "(use .png or .html)")
    return path
