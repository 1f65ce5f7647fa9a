"""``dessim sweep SPEC.yaml``: run a design-space sweep and report the best configurations."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from dessim.cli.common import (OutputPath, calibration_option, json_option, print_json, reported_write,
                               table_records)
from dessim.errors import OutputError
from dessim.sweep.analysis import check_plots_dir
from dessim.sweep.runner import BACKENDS, Terminated, check_results_path, journal_path, run_sweep
from dessim.sweep.spec import SweepSpec, load_sweep


def default_out(spec_path: str) -> str:
    """``SPEC_STEM-results.parquet`` in the current directory."""
    return f"{Path(spec_path).stem}-results.parquet"


def backend_options(address: str | None) -> dict:
    return {"address": address} if address else {}


def calibration_engine(calibration: str | None) -> dict:
    """The engine setting of ``--calibration``: the file, checked now and named by its absolute
    path (workers may run elsewhere in the file system); {} without one."""
    if calibration is None:
        return {}
    from dessim.catalog.calibration import read_calibration

    read_calibration(calibration)
    return {"calibration": str(Path(calibration).resolve())}


def with_calibration(spec: SweepSpec, calibration: str | None) -> SweepSpec:
    """``spec`` with every point run under ``calibration`` (its base engine section's
    ``calibration``: an axis ``engine.calibration`` still varies it)."""
    extra = calibration_engine(calibration)
    if not extra:
        return spec
    base = dict(spec.base)
    base["engine"] = {**dict(base.get("engine") or {}), **extra}
    return dataclasses.replace(spec, base=base)


def report(result, group_by: tuple[str, ...], top: int, plots: str | None) -> None:
    """Print the text report and write plots; shared with ``dessim explore``."""
    from dessim.sweep.analysis import describe

    click.echo(describe(result, group_by=list(group_by) if group_by else None, top=top))
    for path in result.written:
        click.echo(f"results: {path}")
    if result.journal is not None:
        click.echo(f"journal: {result.journal} (resume: run the same command again)")
    for path in _plots(result, plots):
        click.echo(f"plot: {path}")


_BACKEND_HELP = "; ".join(f"{b.name}: {b.help}" for b in BACKENDS.values())


@click.command("sweep")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False))
@click.option("--workers", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Points evaluated in parallel (processes; cluster CPUs for ray/dask).")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="local", show_default=True,
              help=_BACKEND_HELP)
@click.option("--address", default=None,
              help="Dask scheduler (tcp://host:8786) or Ray cluster (ray://host:10001) address; "
                   "default: a local cluster of --workers.")
@click.option("--out", "-o", type=OutputPath(check_results_path), default=None,
              help="Results table, .parquet or .csv [default: SPEC-results.parquet here]. Its "
                   "journal OUT.journal.jsonl sits beside it; rerunning resumes from it.")
@click.option("--group-by", "-g", multiple=True,
              help="Column to report the best configuration per (repeatable; default: the "
                   "spec's analysis.group_by, or layout for parallelism: auto).")
@click.option("--metric", default=None,
              help="Metric to rank by [default: the spec's, else iteration_s / time_s].")
@click.option("--plots", type=OutputPath(check_plots_dir), default=None,
              help="Write the heatmap, metric-vs-axis and Pareto plots into this directory.")
@click.option("--max-points", type=click.IntRange(min=0), default=None,
              help="Evaluate at most this many new points now (run a sweep in slices).")
@click.option("--fresh", is_flag=True, help="Ignore the journal and evaluate every point again.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the best-configuration table to print.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress bar with ETA on stderr.")
@calibration_option
@json_option
def command(spec: str, workers: int, backend: str, address: str | None, out: str | None,
            group_by: tuple[str, ...], metric: str | None, plots: str | None,
            max_points: int | None, fresh: bool, top: int, progress: bool,
            calibration: str | None, as_json: bool) -> None:
    """Run every configuration of the sweep SPEC (YAML, see docs/sweeps.md).

    The whole sweep is checked first (files, names, metric, outputs): a spec error stops it
    before any point runs. A point that does not fit or is invalid is recorded with
    status=failed and its reason and the sweep goes on; the exit status is 1 if any point
    failed for another reason than not fitting in memory. Interrupt it at any time: the same command resumes where it stopped.
    --calibration runs every point with that file (the results' calibration column names it;
    points are keyed by the file's content, so a journal of another calibration is not reused).
    --json prints {sweep, metric, points, evaluated, reused, pending, group_by, best, results,
    files, journal, plots}: best per group and every finished point (the table's columns, SI
    units; null where a point has no value).

    \b
    Example:
      dessim sweep examples/comet/sweep.yaml --workers 2 --plots comet-plots
    """
    parsed = with_calibration(load_sweep(spec), calibration)
    if metric:
        parsed = dataclasses.replace(parsed, analysis=dataclasses.replace(parsed.analysis,
                                                                          metric=metric))
    if out is None:       # --out's default: checked here so that its error names the flag
        out = default_out(spec)
        try:
            check_results_path(out)
        except OutputError as exc:
            raise OutputError(f"{exc} (the default of --out, SPEC-results.parquet in the current "
                              "directory; give --out to write elsewhere)") from None
    try:
        result = run_sweep(parsed, out=out, workers=workers, backend=backend,
                           backend_options=backend_options(address), progress=progress,
                           max_points=max_points, resume=not fresh, columns=group_by)
    except KeyboardInterrupt as exc:      # Ctrl-C or SIGTERM: workers stopped, journal closed
        click.echo(f"interrupted: finished points are in {journal_path(out)}; run the same "
                   "command again to resume", err=True)
        raise SystemExit(143 if isinstance(exc, Terminated) else 130) from None
    if as_json:
        print_json(sweep_json(result, group_by, plots))
    else:
        report(result, group_by, top, plots)
    exit_on_problems(result)


def sweep_json(result, group_by: tuple[str, ...], plots: str | None) -> dict:
    """``dessim sweep --json``: counts, best per group, every finished point, files."""
    from dessim.sweep.analysis import best_per_group, default_group_by

    group = tuple(group_by) or default_group_by(result)
    best = best_per_group(result.table, result.metric, group, result.spec.analysis.minimize)
    return {"sweep": result.spec.name, "metric": result.metric, "points": result.points,
            "evaluated": result.evaluated, "reused": result.reused, "pending": result.pending,
            "group_by": list(group), "best": table_records(best),
            "results": table_records(result.table), "files": [str(p) for p in result.written],
            "journal": str(result.journal) if result.journal is not None else None,
            "plots": [str(p) for p in _plots(result, plots)]}


def _plots(result, plots: str | None) -> list:
    """The plots written into directory ``plots`` (none without one)."""
    from dessim.sweep.analysis import write_plots

    if not plots:
        return []
    with reported_write("--plots", plots):
        return write_plots(result, plots)


def exit_on_problems(result) -> None:
    """Exit with status 1 when points failed for another reason than not fitting (invalid
    combinations, bugs): the table has them with their reason, the exit status says so."""
    problems = result.problems()
    if len(problems):
        kinds = ", ".join(f"{n} {t}" for t, n in problems["error_type"].value_counts()
                          .sort_index().items())
        click.echo(f"error: {len(problems)} of {result.points} points failed ({kinds}); their "
                   "reason is in the results' reason column", err=True)
        raise SystemExit(1)
