"""Options and output handling shared by the commands that run the engine.

``run``, ``simulate`` and ``replay`` all take the same engine options and write the same
outputs; they are defined once here and applied with the decorators below.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

import click

from dessim.engine import EngineOptions, SimulationResult
from dessim.errors import DessimError
from dessim.units import format_bandwidth, format_size, format_time

__all__ = ["report_run", "compose", "engine_options", "output_options", "build_engine_options",
           "write_outputs", "print_json", "print_run_summary", "parse_slowdown",
           "collective_options", "calibration_option"]


def compose(*decorators: Callable) -> Callable:
    """One decorator applying ``decorators`` in the order written (like stacking them)."""
    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


_TOPOLOGY_HELP = ("Topology: inline spec (ring:8,bw=50GB/s,lat=500ns), preset (dgx-h100:nodes=4), "
                  "shipped name or YAML file.")


def engine_options(topology_default: str | None = None) -> Callable:
    """Decorator adding ``--topology`` (required unless ``topology_default`` is given) and
    the engine options (network model, collective settings, calibration, stragglers,
    device). The command receives them as ONE :class:`~dessim.engine.EngineOptions`
    argument ``engine`` (validated before any work starts; ``record_links`` off — commands
    that write timelines switch it on)."""
    topology = click.option(
        "--topology", "-t", "topology", required=topology_default is None, default=topology_default,
        help=_TOPOLOGY_HELP + (f" Default: {topology_default}." if topology_default else ""))

    def collect(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            values = {k: kw.pop(k) for k in _ENGINE_PARAMS}
            kw["engine"] = build_engine_options(**values)
            return f(*args, **kw)
        return wrapper

    return compose(topology, _engine_only, collect)


#: The command-line engine options, by the EngineOptions field (or input) each one sets.
_ENGINE_PARAMS = ("network", "algo", "protocol", "chunks", "channels", "reduction_bw", "stream_rings",
                  "calibration", "device", "slowdown", "straggler_sigma", "seed")

#: Collective settings as command-line options (the CollectiveSettings field names; --algo
#: is each command's own: its default and help differ).
collective_options = compose(
    click.option("--protocol", type=click.Choice(["auto", "LL", "LL128", "Simple", "raw"],
                                                 case_sensitive=False),
                 default="auto", show_default=True,
                 help="NCCL protocol of every collective: auto (NCCL's choice), LL, LL128, "
                      "Simple, or raw (the textbook alpha-beta model)."),
    click.option("--chunks", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Pipelining chunks per collective lane."),
    click.option("--channels", type=click.IntRange(min=1), default=None,
                 help="Lanes per collective (default: as NCCL lays them out, one per rail "
                      "across nodes)."),
)

#: Where the model constants come from.
calibration_option = click.option(
    "--calibration", type=click.Path(dir_okay=False), default=None,
    help="Calibration YAML (from dessim calibrate): measured constants that replace the "
         "built-in ones (docs/calibration.md).")


_engine_only = compose(
    click.option("--network", type=click.Choice(["flow", "analytical"]), default="flow",
                 show_default=True,
                 help="flow: max-min fair link sharing; analytical: no sharing (latency + n/bw)."),
    click.option("--algo", default=None,
                 help="Force this collective algorithm for every collective (default: auto, "
                      "NCCL's choice)."),
    collective_options,
    click.option("--reduction-bw", default=None, metavar="BW",
                 help="Speed a GPU reduces at, e.g. 200GB/s (default: reductions are free)."),
    click.option("--stream-rings", is_flag=True,
                 help="Run each ring channel as one coupled flow instead of step by step: an "
                      "approximation (exact on an idle network, within 0.1% in the tests) that "
                      "makes rings across thousands of GPUs cheap. See docs/performance.md."),
    calibration_option,
    click.option("--device", default=None,
                 help="GPU model (H100, A100, ...) for ranks whose topology names none."),
    click.option("--slowdown", multiple=True, metavar="RANK=FACTOR",
                 help="Slow a rank's compute down by FACTOR (e.g. 3=1.2); repeatable."),
    click.option("--straggler-sigma", type=click.FloatRange(min=0), default=0.0,
                 help="Random per-rank slowdown 1+|N(0,sigma)| drawn from --seed."),
    click.option("--seed", type=int, default=0, show_default=True, help="Random seed."),
)

#: Output options: timeline, Gantt, spans, JSON.
output_options = compose(
    click.option("--timeline", type=click.Path(dir_okay=False), default=None,
                 help="Write a Chrome/Perfetto trace JSON (open in ui.perfetto.dev)."),
    click.option("--gantt", type=click.Path(dir_okay=False), default=None,
                 help="Write a Gantt chart: .png or standalone interactive .html."),
    click.option("--spans", type=click.Path(dir_okay=False), default=None,
                 help="Write the per-task span table: .csv or .parquet."),
    click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text."),
)


def parse_slowdown(items: tuple[str, ...]) -> dict[int, float]:
    """``("3=1.2", "5=2")`` → ``{3: 1.2, 5: 2.0}``; a clear error for anything else."""
    out: dict[int, float] = {}
    for item in items:
        rank, sep, factor = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(rank)] = float(factor)
        except ValueError:
            raise DessimError(f"--slowdown {item!r}: expected RANK=FACTOR, e.g. 3=1.2") from None
    return out


def build_engine_options(*, network: str = "flow", algo: str | None = None,
                         protocol: str = "auto", chunks: int = 1, channels: int | None = None,
                         reduction_bw: str | None = None,
                         stream_rings: bool = False, calibration: str | None = None,
                         device: str | None = None, slowdown: tuple[str, ...] = (),
                         straggler_sigma: float = 0.0, seed: int = 0,
                         record_links: bool = False) -> EngineOptions:
    """The :class:`EngineOptions` of the command-line engine options (the calibration file
    is read and checked here, before any work)."""
    from dessim.catalog.calibration import load_calibration

    return EngineOptions(network=network, algo=algo, protocol=protocol, chunks=chunks,
                         channels=channels, reduction_bw=reduction_bw,
                         calibration=load_calibration(calibration)
                         if calibration else None, device=device,
                         slowdown=parse_slowdown(slowdown), straggler_sigma=straggler_sigma,
                         seed=seed, record_links=record_links, stream_rings=stream_rings)


def write_outputs(result: SimulationResult, timeline: str | None, gantt: str | None,
                  spans: str | None) -> list[str]:
    """Write the requested files; return a line per file written."""
    from dessim.outputs import write_chrome_trace, write_gantt, write_spans

    written = []
    if timeline:
        written.append(f"timeline: {write_chrome_trace(result, timeline)}")
    if gantt:
        written.append(f"gantt: {write_gantt(result, gantt)}")
    if spans:
        written.append(f"spans: {write_spans(result, spans)}")
    return written


def print_json(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=float))


def print_run_summary(result: SimulationResult, title: str) -> None:
    """Readable summary of an engine run."""
    s = result.summary()
    click.echo(title)
    click.echo(f"  makespan            {format_time(s['makespan_s'])}")
    click.echo(f"  compute (mean/rank) {format_time(s['compute_s'])}")
    click.echo(f"  communication       {format_time(s['comm_s'])}  "
               f"(exposed {format_time(s['exposed_comm_s'])})")
    for cat, v in s["exposed_comm_by_category_s"].items():
        click.echo(f"    exposed {cat:<11} {format_time(v)}")
    click.echo(f"  waiting for peers   {format_time(s['wait_s'])}")
    click.echo(f"  idle                {format_time(s['idle_s'])}")
    links = result.link_table()
    if len(links):
        top = links.sort_values(["bytes", "src", "dst"], ascending=[False, True, True]).iloc[0]
        click.echo(f"  busiest link        {top['src']} -> {top['dst']}: "
                   f"{format_size(top['bytes'])} at {format_bandwidth(top['capacity_Bps'])}, "
                   f"{100 * top['avg_utilisation']:.1f}% average utilisation")
    click.echo(f"  {s['tasks']} tasks on {s['ranks']} ranks, {s['events']} events, "
               f"{s['network']} network, {s['wall_s']:.3f} s wall")


def report_run(result: SimulationResult, title: str, written: list[str], as_json: bool,
               extra: dict[str, Any] | None = None) -> None:
    """Print an engine run: one JSON object (summary, per-rank table, ``extra``, files) or
    the readable summary under ``title`` followed by the files written."""
    if as_json:
        out = result.summary()
        out.update(extra or {})
        out["per_rank"] = result.rank_table().to_dict(orient="records")
        out["files"] = written
        print_json(out)
        return
    print_run_summary(result, title)
    for line in written:
        click.echo(f"  wrote {line}")
