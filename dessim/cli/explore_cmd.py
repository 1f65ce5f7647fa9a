"""``dessim explore WORKLOAD --topology SPEC``: the best parallel layouts for a model on a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from dessim.units import parse_bandwidth, parse_capacity
from dessim.cli.common import OutputPath, calibration_option, engine_flag, json_option, print_json, table_records
from dessim.cli.sweep_cmd import backend_options, calibration_engine
from dessim.sweep.analysis import (EXTRAPOLATED, MARK, calibration_lines, extrapolated_rows, significant,
                                   extrapolation_note)
from dessim.sweep.layouts import forced_sp_note
from dessim.sweep.runner import BACKENDS, check_results_path, default_workers, run_sweep
from dessim.sweep.spec import parse_sweep

#: Columns of the ranked table, when the results have them.
RANKED_COLUMNS: tuple[str, ...] = ("layout", "offload", "iteration_s", "tokens_per_s", "mfu",
                                   "bubble_fraction", "exposed_comm_total_s",
                                   "memory_per_gpu_bytes.total")


def explore_spec(workload: str, topology: str, network: str = "flow",
                 memory: dict | None = None, overrides: dict | None = None,
                 engine: dict | None = None) -> dict:
    """The sweep ``dessim explore`` runs: every valid layout (``parallelism: auto``) of
    ``workload`` on all GPUs of ``topology``; ``engine``: further engine options, nested as
    :meth:`EngineOptions.of <dessim.engine.EngineOptions.of>` takes them (e.g. ``calibration``)."""
    base: dict = {"workload": workload, "topology": topology,
                  "engine": {"network": network, **(engine or {})}}
    if memory:
        base["memory"] = dict(memory)
    if overrides:
        base["overrides"] = dict(overrides)
    return {"name": f"explore-{Path(workload).stem}", "kind": "workload", "base": base,
            "axes": {"parallelism": "auto"}}


def ranked_text(result, top: int) -> str:
    """The layouts that ran, fastest first, then those that do not fit with their reason."""
    from dessim.sweep.analysis import shorten, spread

    ok, failed, metric = result.ok(), result.failed(), result.metric
    lines = calibration_lines(result.table)
    shortcuts = shortcut_line(result.table)
    if shortcuts:
        lines.append(shortcuts)
    forced = forced_sp_note(result.table)
    if forced:
        lines.append(forced)
    lines.append(f"{len(ok)} layouts fit, {len(failed)} do not (of {result.points} valid layouts "
                 f"on {_gpus(result)} GPUs); fastest first:")
    if len(ok):
        cols = [c for c in dict.fromkeys(("layout", "offload", metric, *RANKED_COLUMNS)) if c in ok]
        ranked = ok.sort_values([metric, "index"], kind="mergesort").head(top)
        marked = extrapolated_rows(ranked)
        ranked = ranked[cols]
        if "layout" in ranked and marked.any():
            ranked = ranked.assign(layout=[f"{label}{MARK}" if m else str(label)
                                           for label, m in zip(ranked["layout"], marked)])
        if "memory_per_gpu_bytes.total" in ranked:
            ranked = ranked.assign(**{"memory_per_gpu_bytes.total":
                                      ranked["memory_per_gpu_bytes.total"] / 1e9}).rename(
                columns={"memory_per_gpu_bytes.total": "hbm_GB"})
        lines.append(ranked.to_string(index=False, float_format=significant))
        note = extrapolation_note(ok)
        if note:
            lines.append(note)
        sp = spread(result.table, metric)
        if len(sp):
            row = sp.iloc[0]
            lines.append(f"spread: worst/best {metric} = {row['ratio']:.3g}x")
    if len(failed):
        lines.append("do not fit or invalid:")
        for _, row in failed.iterrows():
            label = row["layout"] if "layout" in failed and isinstance(row["layout"], str) else "-"
            lines.append(f"  {label}: {row['error_type']}: {shorten(row['reason'], 200)}")
    return "\n".join(lines)


def ranked_json(result, workload: str, topology: str) -> dict:
    """``dessim explore --json``: every layout that ran, fastest first, and those that did not."""
    ok, metric = result.ok(), result.metric
    ranked = ok.sort_values([metric, "index"], kind="mergesort") if len(ok) else ok
    return {"workload": workload, "topology": topology, "metric": metric, "points": result.points,
            "ranked": table_records(ranked), "failed": table_records(result.failed()),
            "files": [str(p) for p in result.written]}


def shortcut_line(table) -> str | None:
    """How many layouts took each exact shortcut: the layouts are simulated with the options
    ``dessim simulate`` uses by default (granularity ``auto``, folding where it applies: one
    chooser, :meth:`GeneratorOptions.resolved
    <dessim.workload.transformer.generator.GeneratorOptions.resolved>`). None when no row
    reports shortcuts (e.g. only failed layouts)."""
    from dessim.workload.transformer.result import SHORTCUT_NAMES

    ok = table[table["status"] == "ok"] if "status" in table else table
    if not len(ok) or not any(c.startswith("shortcuts.") for c in ok.columns):
        return None
    counts = []
    for key, name in SHORTCUT_NAMES.items():
        where = EXTRAPOLATED if key == "extrapolation" else f"shortcuts.{key}"
        cols = [c for c in ok.columns if c == where or c.startswith(f"{where}.")]
        took = sum(any(_taken(v) for v in row) for row in ok[cols].itertuples(index=False))
        counts.append(f"{name} {took}/{len(ok)}")
    skew = ok["fold.max_lane_skew_s"] if "fold.max_lane_skew_s" in ok else None
    skewed = int((skew.fillna(0) > 0).sum()) if skew is not None else 0
    exact = ("exact" if not skewed else
             f"NOT exact on {skewed} layouts whose folded lanes fell out of step")
    extrapolated = int(extrapolated_rows(ok).sum())
    if extrapolated:
        exact += (f" but for the {SHORTCUT_NAMES['extrapolation']} of the {extrapolated} layouts "
                  f"marked {MARK}")
    return (f"shortcuts (chosen automatically, as dessim simulate does): {', '.join(counts)} "
            f"layouts; {exact} — dessim simulate --exact replays one layout in full")


def _taken(value) -> bool:
    """A table cell says a shortcut was taken: true, a count > 0, or a figure (not null)."""
    import pandas as pd

    return not pd.isna(value) and value is not False and value != 0


def _gpus(result) -> str:
    col = result.table.get("gpus")
    return str(int(col.dropna().iloc[0])) if col is not None and col.notna().any() else "all"


@click.command("explore")
@click.argument("workload")
@click.option("--topology", "-t", required=True,
              help="Cluster: inline spec (dgx-h100:nodes=4), shipped name or YAML file; every "
                   "GPU of it is used.")
@click.option("--hbm", default=None, help="HBM capacity per GPU instead of the catalog's (40GB).")
@click.option("--expansion", default=None,
              help="Memory expansion per GPU (256GB): layouts may offload optimizer state and "
                   "activations to it (see docs/sweeps.md).")
@click.option("--expansion-bw", default=None,
              help="Bandwidth per direction of each GPU's expansion link [default: CXL 2.0 x16].")
@click.option("--global-batch", type=click.IntRange(min=1), default=None,
              help="Global batch (sequences) instead of the workload's.")
@engine_flag("network")
@click.option("--extrapolate/--no-extrapolate", default=None,
              help="Steady-state micro-batch extrapolation of layouts with many micro-batches "
                   "(default: on where it applies; marked rows; see dessim simulate --help).")
@click.option("--workers", "-j", type=click.IntRange(min=1), default=None,
              help="Layouts simulated in parallel (processes) [default: the CPUs this process "
                   "may use, at most one per layout]. Results and their order do not depend "
                   "on it.")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="local", show_default=True)
@click.option("--address", default=None, help="Dask/Ray cluster address (see dessim sweep).")
@click.option("--out", "-o", type=OutputPath(check_results_path), default=None,
              help="Also write the table (.parquet/.csv) with a resumable journal.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Layouts to print.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress bar with ETA on stderr (never with --json).")
@calibration_option
@json_option
def command(workload: str, topology: str, hbm: str | None, expansion: str | None,
            expansion_bw: str | None, global_batch: int | None, network: str,
            extrapolate: bool | None, workers: int | None,
            backend: str, address: str | None, out: str | None, top: int, progress: bool,
            calibration: str | None, as_json: bool) -> None:
    """Rank every parallel layout of WORKLOAD (file or preset) on a cluster.

    Enumerates the (tp, pp, dp, cp, ep) layouts that are valid for the model on all GPUs of
    the topology, simulates one iteration of each that fits in memory and prints them
    fastest first; layouts that do not fit are listed with the reason. --json prints
    {workload, topology, metric, points, ranked, failed, files}: ranked holds every layout
    that ran (all its table columns, SI units), fastest first; failed the others with
    error_type and reason.

    \b
    Examples:
      dessim explore gpt3-1.3b --topology dgx-a100:nodes=2 --workers 2
      dessim explore gpt3-13b -t dgx-a100:nodes=2 --hbm 40GB --expansion 256GB --global-batch 16
    """
    # parsed here so that a bad value names the flag; the sweep takes them in bytes (/s)
    memory = {k: parse(v, flag, allow_zero=False) for k, v, flag, parse in (
        ("hbm_capacity", hbm, "--hbm", parse_capacity), ("expansion_capacity", expansion, "--expansion", parse_capacity),
        ("expansion_bw", expansion_bw, "--expansion-bw", parse_bandwidth)) if v is not None}
    overrides: dict = {"training": {"global_batch": global_batch}} if global_batch else {}
    if extrapolate is not None:
        overrides["extrapolate"] = extrapolate
    spec = parse_sweep(explore_spec(workload, topology, network, memory, overrides or None,
                                    calibration_engine(calibration)), "dessim explore")
    if workers is None:
        workers = default_workers() if backend == "local" else 1
    result = run_sweep(spec, out=out, workers=workers, backend=backend,
                       backend_options=backend_options(address), progress=progress and not as_json)
    if as_json:
        print_json(ranked_json(result, workload, topology))
        return
    click.echo(ranked_text(result, top))
    for path in result.written:
        click.echo(f"results: {path}")
