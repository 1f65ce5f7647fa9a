"""Reading a sweep's table: best per group, spread, cost, Pareto front, plots.

All functions take the results table of :func:`dessim.sweep.runner.run_sweep` (one row per
point; ``status == "ok"`` rows carry metrics) and use only the successful rows.

Cost model (``cost:`` in the sweep spec)
    ``cost = Σ price × column / per × times`` over the entries ``COLUMN: PRICE`` or
    ``COLUMN: {price: P, per: QUANTITY, times: OTHER_COLUMN}``. ``COLUMN`` is any numeric
    column of the table (an axis such as ``topology.uplink_bw``, or a metric such as ``gpus``);
    ``per`` (default 1, SI units: ``1GB/s``, ``1GB``) sets the unit the price is quoted in,
    ``times`` multiplies by another column (e.g. a NIC bandwidth priced per GPU: ``times:
    gpus``). The currency is whatever the prices are in. Example: 30000 per GPU plus 40 per
    GB/s of NIC bandwidth per GPU: ``{gpus: 30000, topology.uplink_bw: {price: 40, per: 1GB/s,
    times: gpus}}``.

Plots use matplotlib's Agg backend (files only, no display).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from dessim.errors import SpecError, SweepError
from dessim.outputs.plots import PLOT_FORMATS
from dessim.resources import check_output, check_output_dir, require_extra
from dessim.schema import validate
from dessim.sweep.spec import CostValue
from dessim.units import format_bandwidth, format_size, format_time

__all__ = ["check_cost", "add_cost", "best_per_group", "spread", "pareto_front", "significant",
           "read_results", "write_example_table",
           "plot_heatmap", "plot_vs", "plot_pareto", "write_plots", "FORMATTERS", "describe",
           "shorten", "configuration_spread", "EXTRAPOLATED", "MARK", "extrapolated_rows",
           "extrapolation_note"]


def format_size_label(nbytes: float) -> str:
    """Bytes as a sweep file likely wrote them: decimal units for round decimal numbers
    (``4e10`` → ``40GB``, as capacities are marketed), binary ones otherwise (``65536`` →
    ``64KiB``, as message sizes are written)."""
    if float(nbytes).is_integer() and int(nbytes) % 1000:
        return format_size(nbytes)
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.4g}{unit}"
    return f"{nbytes:.4g}B"


#: Tick-label formatters by unit family of an axis (dessim.units formatters).
FORMATTERS = {"size": format_size_label, "bandwidth": format_bandwidth, "time": format_time,
              "flops": lambda x: f"{x / 1e12:.4g}TFLOP/s"}


def _cost_term(value: object, where: str) -> tuple[float, float, str | None]:
    """(price, per, times) of one cost entry."""
    term = validate(CostValue, value, where)
    if not math.isfinite(term.price):
        raise SpecError(f"{where}: price must be a finite number, got {term.price!r}")
    return term.price, term.per, term.times


def check_cost(cost: Mapping[str, Any], where: str) -> None:
    """Validate a ``cost:`` mapping (module doc); columns are checked when the table exists."""
    for column, value in cost.items():
        _cost_term(value, f"{where}.{column}")


def cost_columns(cost: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(cost key, result column) of every column the cost model reads: each key's own
    column and its ``times`` column."""
    out = []
    for column, value in cost.items():
        times = _cost_term(value, f"cost.{column}")[2]
        out += [(column, col) for col in (column, times) if col is not None]
    return out


def add_cost(table: pd.DataFrame, cost: Mapping[str, Any]) -> pd.DataFrame:
    """A copy of ``table`` with a ``cost`` column (NaN where a needed column is missing)."""
    out = table.copy()
    total = pd.Series(0.0, index=out.index)
    for column, value in cost.items():
        price, per, times = _cost_term(value, f"cost.{column}")
        for col in (column, times):
            if col is not None and col not in out.columns:
                if len(out) and (out["status"] == "ok").any():
                    raise SweepError(f"cost.{column}: the results have no column {col!r}; "
                                     f"columns: {', '.join(map(str, out.columns))}")
                out["cost"] = math.nan
                return out
        term = pd.to_numeric(out[column], errors="coerce") * (price / per)
        if times is not None:
            term = term * pd.to_numeric(out[times], errors="coerce")
        total = total + term
    out["cost"] = total
    return out


def _ok(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    if metric not in table.columns:
        raise SweepError(f"metric {metric!r} is not a column of the results; columns: "
                         f"{', '.join(map(str, table.columns))}")
    ok = table[table["status"] == "ok"].copy()
    ok[metric] = pd.to_numeric(ok[metric], errors="coerce")
    return ok[ok[metric].notna()]


def _check_columns(table: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    for col in columns:
        if col not in table.columns:
            raise SweepError(f"{what} {col!r} is not a column of the results; columns: "
                             f"{', '.join(map(str, table.columns))}")


def best_per_group(table: pd.DataFrame, metric: str, group_by: Sequence[str] = (),
                   minimize: bool = True) -> pd.DataFrame:
    """The best successful row overall (no ``group_by``) or per group, ordered by the metric.

    Ties go to the lowest point index (rows are in index order and the sort is stable).
    """
    _check_columns(table, group_by, "group_by column")
    ok = _ok(table, metric)
    if ok.empty:
        return ok
    ordered = ok.sort_values(metric, ascending=minimize, kind="mergesort")
    best = ordered.groupby(list(group_by), sort=False, dropna=False).head(1) if group_by \
        else ordered.head(1)
    return best.sort_values(metric, ascending=minimize, kind="mergesort")


def spread(table: pd.DataFrame, metric: str, group_by: Sequence[str] = (),
           minimize: bool = True) -> pd.DataFrame:
    """Best, worst and worst/best ratio of ``metric`` over successful rows, per group.

    The ratio is >= 1 for either direction (worst/best for a time, best/worst for a rate
    inverted so that "2" always reads "the worst configuration is 2x off the best").
    """
    _check_columns(table, group_by, "group_by column")
    ok = _ok(table, metric)
    groups = ok.groupby(list(group_by), sort=False, dropna=False) if group_by else [((), ok)]
    rows = []
    for key, part in groups:
        if part.empty:
            continue
        lo, hi = float(part[metric].min()), float(part[metric].max())
        best, worst = (lo, hi) if minimize else (hi, lo)
        ratio = (worst / best if minimize else best / worst) if min(lo, hi) > 0 else math.inf
        keys = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(group_by, keys)), "points": len(part), "best": best,
                     "worst": worst, "ratio": ratio})
    return pd.DataFrame(rows, columns=[*group_by, "points", "best", "worst", "ratio"])


def configuration_spread(table: pd.DataFrame, metric: str, axes: Sequence[str],
                         minimize: bool = True) -> pd.DataFrame:
    """Spread between configurations: the best row of each combination of ``axes`` (e.g.
    the fastest layout of each cluster), then :func:`spread` over those rows."""
    return spread(best_per_group(table, metric, axes, minimize), metric, (), minimize)


def pareto_front(table: pd.DataFrame, metric: str, cost: str = "cost",
                 minimize: bool = True) -> pd.DataFrame:
    """Rows not dominated in (cost, metric): no other row is cheaper-or-equal *and* better-or-
    equal with one strictly. Ordered by cost."""
    _check_columns(table, [cost], "cost column")
    ok = _ok(table, metric)
    ok = ok[pd.to_numeric(ok[cost], errors="coerce").notna()]
    sign = 1.0 if minimize else -1.0
    ordered = ok.assign(_m=sign * ok[metric]).sort_values([cost, "_m", "index"], kind="mergesort")
    keep, best = [], math.inf
    for idx, row in ordered.iterrows():
        if row["_m"] < best:
            keep.append(idx)
            best = row["_m"]
    return ordered.loc[keep].drop(columns="_m")


# ---------------------------------------------------------------- plots
def read_results(path: str | Path) -> pd.DataFrame:
    """A results table written by ``dessim sweep --out`` (.parquet or .csv)."""
    path = str(path)
    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)


def write_example_table(results: pd.DataFrame, columns: Sequence[str], out: str | Path) -> pd.DataFrame:
    """The ``columns`` of a results table in point order, written to ``out`` (CSV, 9 significant
    digits): the committed table of a worked example (examples/*/summarize.py)."""
    _check_columns(results, columns, "example table")
    table = results[list(columns)].reset_index(drop=True)
    table.to_csv(out, index=False, float_format="%.9g")
    return table


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _label(value: object, family: str | None) -> str:
    if family in FORMATTERS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return FORMATTERS[family](value)
    return str(value)


def plot_heatmap(table: pd.DataFrame, x: str, y: str, metric: str, path: str | Path, *,
                 minimize: bool = True, families: Mapping[str, str | None] | None = None,
                 title: str = "") -> Path:
    """Heatmap of ``metric`` over axes ``x`` and ``y``; when other axes vary too, each cell
    shows the best value over them (min, or max if not ``minimize``). Failed cells are blank."""
    _check_columns(table, [x, y], "heatmap axis")
    families = families or {}
    ok = _ok(table, metric)
    grid = ok.pivot_table(index=y, columns=x, values=metric, aggfunc="min" if minimize else "max")
    xs = list(dict.fromkeys(table[x])) if len(table) else []
    ys = list(dict.fromkeys(table[y])) if len(table) else []
    grid = grid.reindex(index=ys, columns=xs)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * max(len(xs), 2), 1.0 + 0.6 * max(len(ys), 2)))
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="viridis_r" if minimize else "viridis")
    ax.set_xticks(range(len(xs)), [_label(v, families.get(x)) for v in xs], rotation=30, ha="right")
    ax.set_yticks(range(len(ys)), [_label(v, families.get(y)) for v in ys])
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            v = grid.iloc[i, j]
            ax.text(j, i, "fail" if pd.isna(v) else f"{v:.3g}", ha="center", va="center",
                    color="w" if not pd.isna(v) else "k", fontsize=8)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_title(title or f"{metric} ({'best' if ok[[x, y]].duplicated().any() else 'value'} per cell)")
    return _save(fig, plt, path)


def _group_label(row: pd.Series, group_by: Sequence[str],
                 families: Mapping[str, str | None] | None = None) -> str:
    families = families or {}
    return ", ".join(f"{g.rpartition('.')[2]}={_label(row[g], families.get(g))}"
                     for g in group_by) or "all"


def plot_vs(table: pd.DataFrame, axis: str, metric: str, path: str | Path, *,
            group_by: Sequence[str] = (), minimize: bool = True,
            families: Mapping[str, str | None] | None = None, title: str = "") -> Path:
    """``metric`` against one axis, one line per group (e.g. per parallel layout); when
    other columns vary within a group, the best value per axis value is drawn."""
    _check_columns(table, [axis, *group_by], "column")
    families = families or {}
    ok = _ok(table, metric)
    order = list(dict.fromkeys(table[axis]))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in order)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = list(ok.groupby(list(group_by), sort=False, dropna=False)) if group_by else [((), ok)]
    if len(groups) > 10:   # the default cycle repeats after 10 colours
        cmap = plt.get_cmap("tab20")
        ax.set_prop_cycle(color=[cmap(i % 20) for i in range(len(groups))])
    for _key, part in groups:
        best = part.groupby(axis, sort=False)[metric].agg("min" if minimize else "max")
        best = best.reindex([v for v in order if v in best.index])
        xs = list(best.index) if numeric else [order.index(v) for v in best.index]
        ax.plot(xs, best.to_numpy(), marker="o", label=_group_label(part.iloc[0], group_by, families))
    if numeric and len(order) > 2 and min(order) > 0 and max(order) / min(order) >= 8:
        ax.set_xscale("log")
        ax.minorticks_off()   # only the axis values are labelled
    ax.set_xticks(order if numeric else range(len(order)), [_label(v, families.get(axis)) for v in order])
    ax.set_xlabel(axis)
    ax.set_ylabel(metric)
    if group_by:
        ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    ax.set_title(title or f"{metric} vs {axis}")
    return _save(fig, plt, path)


def plot_pareto(table: pd.DataFrame, metric: str, path: str | Path, *, cost: str = "cost",
                minimize: bool = True, title: str = "") -> Path:
    """Every successful point in (cost, metric), the Pareto front highlighted."""
    ok = _ok(table, metric)
    front = pareto_front(table, metric, cost, minimize)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(ok[cost], ok[metric], s=14, alpha=0.5, label="configurations")
    ax.plot(front[cost], front[metric], "r-o", ms=5, label="Pareto front")
    ax.set_xlabel(cost)
    ax.set_ylabel(metric)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title or f"{metric} vs {cost}")
    return _save(fig, plt, path)


def _save(fig, plt, path: str | Path) -> Path:
    p = check_output(path, "sweep plot", PLOT_FORMATS)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def default_group_by(result) -> tuple[str, ...]:
    """The spec's ``group_by``; else ``layout`` when layouts were enumerated; else none."""
    if result.spec.analysis.group_by:
        return tuple(result.spec.analysis.group_by)
    return ("layout",) if "layout" in result.table.columns else ()


def check_plots_dir(directory: str | Path) -> Path:
    """Check, before any point runs, that the plots can be written into ``directory``: it
    exists or its parent does (only the last level is created), and matplotlib is installed."""
    require_extra("plot", f"sweep plots directory {str(directory)!r}")
    return check_output_dir(directory, "sweep plots directory")


def write_plots(result, directory: str | Path) -> list[Path]:
    """The plots the spec asks for (or sensible defaults) into ``directory``.

    Heatmap: ``analysis.heatmap`` or the first two axes with more than one value; metric vs
    one axis: ``analysis.vs`` or the first such axis, one line per parallel layout (with
    ``parallelism: auto``) or per group; Pareto front when the spec has ``cost:``.
    """
    spec, table, metric = result.spec, result.table, result.metric
    minimize = spec.analysis.minimize
    families = {a.path: a.family for a in spec.axes}
    varying = [a.path for a in spec.axes if len(a.values) > 1]
    written: list[Path] = []
    if _ok(table, metric).empty:
        return written
    out = check_plots_dir(directory)
    out.mkdir(exist_ok=True)
    heat = spec.analysis.heatmap or (tuple(varying[:2]) if len(varying) >= 2 else None)
    if heat:
        written.append(plot_heatmap(table, heat[0], heat[1], metric, out / "heatmap.png",
                                    minimize=minimize, families=families))
    vs = spec.analysis.vs or (varying[0] if varying else None)
    if vs:
        by_layout = ("layout",) if "layout" in table.columns else default_group_by(result)
        group = [g for g in by_layout if g != vs]
        written.append(plot_vs(table, vs, metric, out / f"{metric}_vs_{vs}.png", group_by=group,
                               minimize=minimize, families=families))
    if spec.cost and "cost" in table.columns:
        written.append(plot_pareto(table, metric, out / "pareto.png", minimize=minimize))
    return written


def shorten(text: str, limit: int = 240) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis) for one-line reports."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def calibration_lines(table) -> list[str]:
    """The calibration(s) the points ran with (the ``calibration`` column of their results:
    ``name@fingerprint``; several when an axis varies ``engine.calibration``)."""
    if "calibration" not in table.columns:
        return []
    labels = sorted(str(v) for v in table.loc[table["status"] == "ok", "calibration"].dropna().unique())
    if not labels:
        return []
    if len(labels) == 1:
        return [f"calibration: {labels[0]}"]
    return [f"calibrations: {', '.join(labels)}"]


#: The table column present on layouts whose figures were extrapolated, and their mark.
EXTRAPOLATED = "extrapolation.micro_batches"
MARK = "*"


def extrapolated_rows(table):
    """Per row: whether its figures were extrapolated (a boolean Series)."""
    import pandas as pd

    if EXTRAPOLATED not in table:
        return pd.Series(False, index=table.index)
    return table[EXTRAPOLATED].notna()


def extrapolation_note(table) -> str | None:
    """The footnote of the rows marked :data:`MARK` (None when no row is extrapolated): what
    was simulated, that the figures are extrapolated (:mod:`dessim.workload.transformer.steady`)
    and how to replay them in full."""
    rows = table[extrapolated_rows(table)]
    if not len(rows):
        return None
    sims = sorted({s for s in rows["extrapolation.simulated_micro_batches"]})
    bound, times = rows["extrapolation.error_bound"].max(), rows["extrapolation.time_bound"].max()
    return (f"{MARK} micro-batch extrapolation: each marked row was simulated at three small "
            f"micro-batch counts ({'; '.join(s.strip('[]') for s in sims)}) and its figures "
            f"extrapolated to the full count from a checked steady state (approximate: each within "
            f"{bound:.1%} of itself, times within {times:g} of the iteration); dessim simulate "
            "--exact replays every micro-batch")


def significant(value: float) -> str:
    """A table cell to six significant digits (pandas' default of six decimals printed a
    74 us time_s as 0.000074 and told apart no two microsecond results)."""
    return f"{value:.6g}"


def describe(result, group_by: Sequence[str] | None = None, top: int = 10) -> str:
    """Plain-text report: counts, failures by reason, best per group, spread."""
    table, metric, minimize = result.table, result.metric, result.spec.analysis.minimize
    group = tuple(group_by) if group_by is not None else default_group_by(result)
    n_ok = int((table["status"] == "ok").sum())
    lines = [f"sweep {result.spec.name!r}: {result.points} points, {n_ok} ok, "
             f"{len(table) - n_ok} failed, {result.pending} pending "
             f"({result.evaluated} evaluated now, {result.reused} from the journal)"]
    lines.extend(calibration_lines(table))
    failed = table[table["status"] != "ok"]
    if len(failed):
        by_type = failed["error_type"].value_counts()
        lines.append("failures: " + ", ".join(f"{n} {t}" for t, n in by_type.items()) +
                     "; commonest reasons:")
        for reason, count in failed["reason"].value_counts().head(5).items():
            lines.append(f"  {count} x {shorten(reason)}")
    if n_ok:
        shown = [*group, *(c for c in result.spec.axis_paths if c not in group)]
        if "layout" in table.columns and "layout" not in shown:
            shown.append("layout")
        cols = ["index", *shown, metric, *(["cost"] if "cost" in table.columns else [])]
        best = best_per_group(table, metric, group, minimize)[cols].head(top)
        for axis in result.spec.axes:   # 1e11 -> 100GB/s for reading; the table keeps SI
            if axis.family in FORMATTERS and axis.path in best:
                best[axis.path] = [_label(v, axis.family) for v in best[axis.path]]
        lines.append(f"best {metric} " + (f"per {', '.join(group)}:" if group else "overall:"))
        marked = extrapolated_rows(table.set_index("index").loc[best["index"]]).to_numpy()
        if marked.any():
            best["index"] = [f"{i}{MARK}" if m else str(i) for i, m in zip(best["index"], marked)]
        lines.append(best.to_string(index=False, float_format=significant))
        note = extrapolation_note(table[table["status"] == "ok"])
        if note:
            lines.append(note)
        sp = spread(table, metric, (), minimize)
        if len(sp):
            row = sp.iloc[0]
            lines.append(f"spread: best {row['best']:.6g}, worst {row['worst']:.6g}, "
                         f"worst/best = {row['ratio']:.3g}x over {int(row['points'])} points")
        axes = [a for a in result.spec.axis_paths if a in table.columns]
        if "layout" in table.columns and axes:
            sp = configuration_spread(table, metric, axes, minimize)
            if len(sp):
                row = sp.iloc[0]
                lines.append(f"spread between configurations (best layout of each of "
                             f"{int(row['points'])}): best {row['best']:.6g}, worst "
                             f"{row['worst']:.6g}, worst/best = {row['ratio']:.3g}x")
    return "\n".join(lines)
