"""``dessim explore WORKLOAD --topology SPEC``: the best parallel layouts for a model on a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from dessim.cli.sweep_cmd import backend_options, report
from dessim.sweep.runner import BACKENDS, run_sweep
from dessim.sweep.spec import parse_sweep


def explore_spec(workload: str, topology: str, gpus: int | None = None,
                 network: str = "flow") -> dict:
    """The sweep ``dessim explore`` runs: every valid layout (``parallelism: auto``)."""
    base: dict = {"workload": workload, "topology": topology, "engine": {"network": network}}
    if gpus is not None:
        base["gpus"] = gpus
    return {"name": f"explore-{Path(workload).stem}", "kind": "workload", "base": base,
            "axes": {"parallelism": "auto"}}


@click.command("explore")
@click.argument("workload")
@click.option("--topology", "-t", required=True,
              help="Cluster: inline spec (dgx-h100:nodes=4), shipped name or YAML file.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs to use [default: all GPUs of the topology].")
@click.option("--network", type=click.Choice(["flow", "analytical"]), default="flow",
              show_default=True, help="Network model of every simulation.")
@click.option("--workers", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Layouts simulated in parallel.")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="local", show_default=True)
@click.option("--address", default=None, help="Dask/Ray cluster address (see dessim sweep).")
@click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
              help="Also write the ranked table (.parquet/.csv) with a resumable journal.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Layouts to print.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def command(workload: str, topology: str, gpus: int | None, network: str, workers: int,
            backend: str, address: str | None, out: str | None, top: int, progress: bool) -> None:
    """Rank every parallel layout of WORKLOAD (file or preset) that fits on a cluster.

    Enumerates the valid (tp, pp, dp, ...) layouts for the GPU count that fit in memory,
    simulates one iteration of each and prints them fastest first.

    \b
    Example:
      dessim explore gpt3-13b --topology dgx-a100:nodes=4 --workers 2
    """
    spec = parse_sweep(explore_spec(workload, topology, gpus, network), "dessim explore")
    result = run_sweep(spec, out=out, workers=workers, backend=backend,
                       backend_options=backend_options(address), progress=progress)
    ok = result.ok()
    metric = result.metric
    click.echo(f"{len(ok)} layouts fit, {len(result.failed())} do not; fastest first:")
    if len(ok):
        cols = [c for c in ("layout", metric, "tokens_per_s", "mfu", "bubble_fraction") if c in ok]
        ranked = ok.sort_values([metric, "index"], kind="mergesort")[cols].head(top)
        click.echo(ranked.to_string(index=False))
    report(result, ("layout",) if "layout" in result.table else (), 1, None)
