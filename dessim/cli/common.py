"""Options and output handling shared by the commands that run the engine.

Every simulating command (``run``, ``simulate``, ``replay``, ``collective``, ``compare``,
``cluster``) takes its engine options from ONE option group, :func:`engine_options`, which
builds an :class:`~dessim.engine.EngineOptions` (each flag sets one of its dotted paths,
:data:`ENGINE_FLAGS`); the outputs are defined once here too.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import click

from dessim.collectives.settings import PROTOCOL_NAMES
from dessim.engine import EngineOptions, Progress, SimulationResult, watching
from dessim.errors import DessimError, OutputError
from dessim.outputs.chrome_trace import TIMELINE_FORMATS, TIMELINE_HINT
from dessim.outputs.gantt import GANTT_FORMATS, ROW_MODES, GanttLabels, GanttOptions
from dessim.outputs.plots import PLOT_FORMATS
from dessim.outputs.tables import SPAN_FORMATS
from dessim.resources import check_output, data_files
from dessim.units import format_bandwidth, format_size, format_time

__all__ = ["GanttRequest", "report_run", "compose", "engine_options", "output_options", "build_engine_options",
           "write_outputs", "print_json", "print_run_summary", "parse_slowdown", "ENGINE_FLAGS",
           "GRAPH_ENGINE_PATHS", "calibration_option", "engine_flag", "table_records", "json_option",
           "OutputPath", "TracePrefix", "OutputKind", "OUTPUT_KINDS", "check_distinct_paths", "check_outputs", "suggest_compressed_timeline", "output_file", "reported_write", "write_file", "timeline_option", "gantt_option", "spans_option"]


def compose(*decorators: Callable) -> Callable:
    """One decorator applying ``decorators`` in the order written (like stacking them)."""
    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


class OutputPath(click.ParamType):
    """A path the command will write, checked by ``check`` (a function raising a
    :class:`~dessim.errors.DessimError`) once the command line is parsed, before any work
    (:func:`check_outputs`): a missing or read-only directory, an unknown format or a
    missing extra fails as a usage error naming the flag."""

    name = "path"

    def __init__(self, check: Callable[[str], Any], *, names_a_file: bool = True) -> None:
        self.check = check
        #: False for a prefix of several files (``--export-chakra``): not one file to compare
        #: with the inputs (:func:`check_distinct_paths`)
        self.names_a_file = names_a_file


def check_outputs(ctx: click.Context) -> None:
    """Check every output of the command line, before any work: first that none overwrites
    an input or another output (:func:`check_distinct_paths`: the gravest mistake is named
    first, ``--timeline w.yaml`` onto the input workload says so rather than that .yaml is no
    timeline format), then each output's own check (:class:`OutputPath`), in the order of
    the command's parameters."""
    check_distinct_paths(ctx)
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param.type, OutputPath) and isinstance(value, str):
            try:
                param.type.check(value)
            except DessimError as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


class TracePrefix(click.ParamType):
    """A Chakra trace prefix (``DIR/prefix`` of the files ``prefix.<rank>.et``): an input that
    names several files, which no output may overwrite (:func:`check_distinct_paths`)."""

    name = "trace_prefix"

    @staticmethod
    def files(value: str) -> list[str]:
        """The rank files ``value`` names (none if it names no trace: the command says so)."""
        from dessim.trace.chakra_io import find_rank_files

        try:
            return [str(f) for f in find_rank_files(value)[1]]
        except DessimError:
            return []


def _flag_name(param: click.Parameter) -> str:
    """How a parameter is written on the command line: its long option, or its metavar."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def check_distinct_paths(ctx: click.Context) -> None:
    """Refuse, before any work, an output that would overwrite one of the command's input
    files (``dessim run g.json --timeline g.json``) or another output of the same run
    (``--timeline x.json --save-graph x.json``): either loses data without a word."""
    outputs: list[tuple[str, str]] = []
    inputs: list[tuple[str, str, str]] = []     # (the input as named in messages, file, what it is part of)
    traces: list[str] = []                      # trace prefixes: their rank files, read on demand
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if not isinstance(item, str) or not item:
                continue
            if isinstance(param.type, OutputPath):
                if param.type.names_a_file:
                    outputs.append((_flag_name(param), item))
            elif isinstance(param.type, TracePrefix):
                traces.append(item)
            elif os.path.isfile(item):
                inputs.append((f"the input {_flag_name(param)} {item!r}", item, "the input"))
    if traces and any(os.path.isfile(path) for _, path in outputs):
        inputs += [(f"the rank file {f!r} of trace {prefix!r}", f, "the trace")
                   for prefix in traces for f in TracePrefix.files(prefix)]
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if os.path.exists(path) and not os.path.isfile(path):
            continue                        # /dev/null, a pipe: not a file to lose
        real = os.path.realpath(path)
        if real in seen:
            raise OutputError(f"{flag} {path!r} is also the {seen[real]} output: give each output "
                              "its own file")
        seen[real] = flag
        if not os.path.exists(path):
            continue
        for kind, what in (("workloads", "workload"), ("topologies", "topology")):   # presets: read by name
            if any(os.path.samefile(path, f) for f in data_files(kind).values()):
                raise OutputError(f"{flag} {path!r} is a {what} file shipped with dessim "
                                  "(a preset reads it): give another file")
        for source, given, whole in inputs:
            if os.path.samefile(path, given):
                raise OutputError(f"{flag} {path!r} is {source}: writing it would destroy "
                                  f"{whole}; give another file")


@dataclass(frozen=True)
class OutputKind:
    """A kind of file a command writes: its name in messages, the suffixes it takes (suffix →
    the extra that writes it; the first is the format of a device such as /dev/null) and
    what to say when a suffix is refused."""

    what: str
    formats: Mapping[str, str | None]
    hint: str = ""


_IMAGE_HINT = "for a Chrome/Perfetto trace, --timeline x.json"

#: Every file an output flag writes, by kind: the one place that knows which suffixes each
#: takes. Checked once the command line is parsed (:func:`check_outputs`), so that a wrong
#: suffix fails before any simulation, with the formats the flag takes. (``--export-chakra``
#: takes a prefix of several files, ``--plots`` a directory; sweep and explore results
#: tables are checked with their journal, ``dessim.sweep``.)
OUTPUT_KINDS: dict[str, OutputKind] = {
    "timeline": OutputKind("timeline", TIMELINE_FORMATS, TIMELINE_HINT),
    "gantt": OutputKind("Gantt chart", GANTT_FORMATS, _IMAGE_HINT),
    "spans": OutputKind("span table", SPAN_FORMATS),
    "job table": OutputKind("per-job table", SPAN_FORMATS),
    "task graph": OutputKind("task graph file", {".json": None},
                             "a task graph is dessim JSON (dessim run reads it back)"),
    "csv": OutputKind("CSV table", {".csv": None}),
    "plot": OutputKind("busbw plot", PLOT_FORMATS),
    "calibration": OutputKind("calibration file", {".yaml": None, ".yml": None}),
    "schema": OutputKind("JSON Schema", {".json": None}),
}


def output_file(kind: str) -> OutputPath:
    """:class:`OutputPath` of one file of ``kind`` (:data:`OUTPUT_KINDS`)."""
    k = OUTPUT_KINDS[kind]
    return OutputPath(functools.partial(check_output, what=k.what, formats=k.formats, hint=k.hint))


TOPOLOGY_HELP = ("Topology: inline spec (ring:8,bw=50GB/s,lat=500ns), preset (dgx-h100:nodes=4), "
                  "shipped name or YAML file.")


@dataclass(frozen=True)
class _EngineFlag:
    """One command-line engine option: the :class:`EngineOptions` path it sets, the click
    option (its parameter is the path's last name), and how the flag's value becomes the
    option's (a file name read, ``RANK=FACTOR`` items parsed)."""

    path: str
    option: Callable
    convert: Callable[[Any], Any] = lambda value: value   # noqa: E731 — as given

    @property
    def param(self) -> str:
        return self.path.rpartition(".")[2]


def _algo_help() -> str:
    from dessim.collectives import ALGORITHMS

    return ("Collective algorithm of every collective: auto (NCCL's choice; in a task graph, "
            "each collective's own) or one of " + ", ".join(ALGORITHMS) + ".")


def _network_choice() -> click.Choice:
    from dessim.network import NETWORK_MODELS

    return click.Choice(sorted(NETWORK_MODELS))


def _read_calibration(path: str | None) -> Any:
    from dessim.catalog.calibration import load_calibration

    return load_calibration(path) if path else None


#: Every command-line engine option, by the EngineOptions path it sets (one spelling: the
#: flag is the path's last name, dashed). Commands pick the paths that apply to them.
ENGINE_FLAGS: tuple[_EngineFlag, ...] = (
    _EngineFlag("network", click.option(
        "--network", type=_network_choice(), default="flow", show_default=True,
        help="Network model: flow (max-min fair link sharing) or analytical (no sharing: "
             "latency + bytes/bandwidth).")),
    _EngineFlag("collectives.algo", click.option(
        "--algo", default="auto", show_default=True, help=_algo_help())),
    _EngineFlag("collectives.protocol", click.option(
        "--protocol", type=click.Choice(PROTOCOL_NAMES, case_sensitive=False),
        default="auto", show_default=True,
        help="NCCL protocol of every collective: auto (NCCL's choice), LL, LL128, Simple, or raw "
             "(the textbook alpha-beta model).")),
    _EngineFlag("collectives.chunks", click.option(
        "--chunks", type=click.IntRange(min=1), default=1, show_default=True,
        help="Pipelining chunks per collective lane.")),
    _EngineFlag("collectives.channels", click.option(
        "--channels", type=click.IntRange(min=1), default=None,
        help="Lanes per collective (default: as NCCL lays them out, one per rail across nodes).")),
    _EngineFlag("collectives.reduction_bw", click.option(
        "--reduction-bw", default=None, metavar="BW",
        help="Speed a GPU reduces at, e.g. 200GB/s (default: reductions are free).")),
    _EngineFlag("collectives.gpus_per_process", click.option(
        "--gpus-per-process", type=click.IntRange(min=1), default=1, show_default=True,
        help="GPUs one host thread drives, as nccl-tests -g N: an isolated call pays N - 1 more "
             "host issues (nccl.host_overhead). Training: 1 (one process per GPU).")),
    _EngineFlag("shortcuts.stream_rings", click.option(
        "--stream-rings", is_flag=True,
        help="Run each ring channel as one coupled flow instead of step by step: an "
             "approximation (exact on an idle network, within 0.1% in the tests) that makes "
             "rings across thousands of GPUs cheap. See docs/performance.md.")),
    _EngineFlag("calibration", click.option(
        "--calibration", type=click.Path(dir_okay=False), default=None,
        help="Calibration YAML (from dessim calibrate): measured constants that replace the "
             "built-in ones (docs/calibration.md)."), _read_calibration),
    _EngineFlag("device", click.option(
        "--device", default=None, help="GPU model (H100, A100, ...) for ranks whose topology names none.")),
    _EngineFlag("noise.slowdown", click.option(
        "--slowdown", multiple=True, metavar="RANK=FACTOR",
        help="Slow a rank's compute down by FACTOR (e.g. 3=1.2); repeatable."),
        lambda items: parse_slowdown(items)),
    _EngineFlag("noise.straggler_sigma", click.option(
        "--straggler-sigma", type=click.FloatRange(min=0), default=0.0,
        help="Random per-rank slowdown 1+|N(0,sigma)| drawn from --seed.")),
    _EngineFlag("noise.kernel_jitter_sigma", click.option(
        "--kernel-jitter-sigma", type=click.FloatRange(min=0), default=0.0,
        help="Random per-task compute time factor exp(sigma·N(0,1) − sigma²/2) (mean 1), drawn "
             "from --seed.")),
    _EngineFlag("noise.seed", click.option(
        "--seed", type=int, default=0, show_default=True, help="Random seed.")),
)

def engine_flag(path: str) -> Callable:
    """The click option of one engine path alone, for commands that put it into a spec
    instead of building options (``sweep``, ``explore``)."""
    return next(f.option for f in ENGINE_FLAGS if f.path == path)


#: ``--calibration`` alone (sweep, explore: the file goes into the spec's engine section).
calibration_option = engine_flag("calibration")

#: What a command that replays task graphs takes (run, simulate, replay).
GRAPH_ENGINE_PATHS: tuple[str, ...] = (
    "network", "collectives.algo", "collectives.protocol", "collectives.chunks",
    "collectives.channels", "collectives.reduction_bw", "shortcuts.stream_rings", "calibration",
    "device", "noise.slowdown", "noise.straggler_sigma", "noise.kernel_jitter_sigma", "noise.seed")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"collectives.algo": "ring"}`` → ``{"collectives": {"algo": "ring"}}``."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        head, _, rest = path.partition(".")
        if rest:
            out.setdefault(head, {})[rest] = value
        else:
            out[head] = value
    return out


def engine_options(topology_default: str | None = None, *, paths: tuple[str, ...] = GRAPH_ENGINE_PATHS,
                   topology: bool = True, given_only: bool = False) -> Callable:
    """Decorator: the option group that builds a command's engine options.

    Adds ``--topology`` (required unless ``topology_default`` is given; none with
    ``topology=False``) and one flag per :class:`~dessim.engine.EngineOptions` path in
    ``paths`` (:data:`ENGINE_FLAGS`). The command receives them as ONE argument ``engine``:
    an :class:`EngineOptions`, validated before any work starts, with ``record_links`` off
    (commands that write timelines switch it on). With ``given_only`` it receives instead
    the nested mapping of the flags given on the command line (``{"collectives": {"algo":
    "ring"}}``), to lay over a file's ``engine:`` section (``dessim cluster``)."""
    flags = [f for f in ENGINE_FLAGS if f.path in paths]
    unknown = set(paths) - {f.path for f in flags}
    if unknown:
        raise ValueError(f"engine_options: no command-line flag for {sorted(unknown)}")
    decorators = [f.option for f in flags]
    if topology:
        decorators.insert(0, click.option(
            "--topology", "-t", "topology", required=topology_default is None, default=topology_default,
            help=TOPOLOGY_HELP + (f" Default: {topology_default}." if topology_default else "")))

    def collect(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            ctx = click.get_current_context()
            values = {}
            for flag in flags:
                value = kw.pop(flag.param)
                if given_only and ctx.get_parameter_source(flag.param) in (
                        click.core.ParameterSource.DEFAULT, None):
                    continue
                values[flag.path] = flag.convert(value)
            kw["engine"] = _nest(values) if given_only else build_engine_options(values)
            return f(*args, **kw)
        return wrapper

    return compose(*decorators, collect)


#: The output files of an engine run, each checked before any work (:class:`OutputPath`).
timeline_option = click.option(
    "--timeline", type=output_file("timeline"), default=None,
    help="Write a Chrome/Perfetto trace (open in ui.perfetto.dev; times in us): .json, or "
         ".json.gz compressed (link counters, one event per change of a link's rate, are "
         "most of a large trace); link counters in GB/s and utilisation.")
gantt_option = click.option(
    "--gantt", type=output_file("gantt"), default=None,
    help="Write a Gantt chart: .png or self-contained .html (at most 2 MB).")
spans_option = click.option(
    "--spans", type=output_file("spans"), default=None,
    help="Write the per-task span table (times in s, sizes in bytes): .csv or .parquet.")


@dataclass(frozen=True)
class GanttRequest:
    """A Gantt chart asked for on the command line: the file and how to draw it."""

    path: str
    options: GanttOptions = GanttOptions()


def _gantt_request(f: Callable) -> Callable:
    """Replace the ``gantt`` path and its ``--gantt-*`` flags by one :class:`GanttRequest`."""
    @functools.wraps(f)
    def wrapper(*args: Any, gantt: str | None, gantt_rows: str, gantt_max_rows: int, **kw: Any) -> Any:
        request = None
        if gantt:
            request = GanttRequest(gantt, GanttOptions(rows=gantt_rows, max_rows=gantt_max_rows))
        return f(*args, gantt=request, **kw)
    return wrapper


#: Output options: timeline, Gantt, spans, JSON.
output_options = compose(
    timeline_option, gantt_option,
    click.option("--gantt-rows", type=click.Choice(ROW_MODES), default="auto", show_default=True,
                 help="Gantt rows: one per pipeline stage, one per rank (blocks of ranks past "
                      "--gantt-max-rows), or auto (stages where the workload has them)."),
    click.option("--gantt-max-rows", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Most rank rows in a Gantt chart; more ranks are drawn in blocks."),
    spans_option,
    click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text."),
    _gantt_request,
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


def build_engine_options(values: dict[str, Any], *, record_links: bool = False) -> EngineOptions:
    """The :class:`EngineOptions` of command-line values by path (``{"collectives.algo":
    "ring", "noise.seed": 3}``), validated now, before any work."""
    return EngineOptions.of(_nest(values), "command line", record_links=record_links)


@contextmanager
def reported_write(flag: str, path: str, note: str = "") -> Iterator[None]:
    """Turn an operating-system error of the block (a full disk, a vanished directory) into
    an :class:`OutputError` naming ``flag`` and ``path``, plus ``note``."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"{flag} {path!r}: cannot write it ({exc.strerror or exc}){note}") from None


def write_file(path: str, flag: str, writer: Callable[[str], Any]) -> str:
    """Call ``writer`` with a temporary file beside ``path`` (same suffix: writers pick the
    format by it) and move it onto ``path`` once complete, so that a failed write (a full
    disk, an interrupt) leaves an existing file as it was and no partial file behind. A
    path that is not a regular file (``/dev/null``, a pipe) is written in place. An
    operating-system error is reported as an :class:`OutputError` naming ``flag`` and the
    path. Returns ``path``."""
    target = Path(os.path.realpath(path))       # through a symlink: replace what it points at
    if target.exists() and not target.is_file():
        staged = target
    else:
        # the whole name last: writers pick the format by its suffix, .json.gz as .png
        staged = target.with_name(f".dessim-partial-{os.getpid()}.{target.name}")
    try:
        with reported_write(flag, path, "; nothing was changed there"):
            writer(str(staged))
            if staged != target:
                os.replace(staged, target)
    finally:
        if staged != target and staged.exists():
            staged.unlink()
    return path


#: Bytes of a plain ``.json`` timeline above which the command suggests ``.json.gz``.
LARGE_TIMELINE_BYTES = 20e6


def suggest_compressed_timeline(path: str) -> None:
    """On standard error (standard output may be one JSON object): a tip to write a large
    ``.json`` timeline as ``.json.gz``, the same trace compressed (:data:`TIMELINE_FORMATS`)."""
    if not (path.lower().endswith(".json") and os.path.isfile(path)):
        return
    size = os.path.getsize(path)
    if size > LARGE_TIMELINE_BYTES:
        click.echo(f"tip: the timeline {path} is {format_size(size)}; --timeline {path}.gz writes the "
                   "same trace compressed (gzip), which Perfetto opens as it is", err=True)


def write_outputs(result: SimulationResult, timeline: str | None, gantt: GanttRequest | None,
                  spans: str | None, labels: GanttLabels | None = None) -> list[str]:
    """Write the requested files (each by :func:`write_file`); return a line per file
    written. ``labels`` name the run and its pipeline stages in the Gantt chart."""
    from dessim.outputs import write_chrome_trace, write_gantt, write_spans

    written = []
    if timeline:
        written.append(f"timeline: {write_file(timeline, '--timeline', lambda p: write_chrome_trace(result, p))}")
        suggest_compressed_timeline(timeline)
    if gantt:
        written.append("gantt: " + write_file(gantt.path, "--gantt", lambda p: write_gantt(
            result, p, labels, gantt.options)))
    if spans:
        written.append(f"spans: {write_file(spans, '--spans', lambda p: write_spans(result, p))}")
    return written


def print_json(obj: dict[str, Any]) -> None:
    """``obj`` as indented JSON; a NaN (a figure that was not computed) is printed as null,
    as the --json help promises, never as the ``NaN`` that JSON parsers other than Python's
    refuse."""
    click.echo(json.dumps(_no_nan(obj), indent=2, sort_keys=False, default=float))


def _no_nan(value: Any) -> Any:
    """``value`` with every leaf as :func:`_plain` gives it (NaN/NA as None)."""
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return _plain(value)


#: The ``--json`` flag of every command that can print one JSON object instead of text.
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object instead of text (SI units; null where "
                                "a value is missing).")


def _plain(value: Any) -> Any:
    """A table cell as plain JSON data: numpy scalars as Python numbers, NaN/NA as None."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and value != value:
        return None
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:         # pragma: no cover - pandas is a core dependency
        pass
    return value


def table_records(table: Any) -> list[dict[str, Any]]:
    """The rows of a pandas DataFrame as JSON-ready mappings (column → value; missing values
    are None, printed as ``null``; numbers keep full precision)."""
    return [{str(k): _plain(v) for k, v in row.items()} for row in table.to_dict(orient="records")]


def collectives_line(c: dict[str, Any] | None) -> str | None:
    """The summary line of a run's ``collectives`` (:meth:`SimulationResult.collectives`):
    per group, each ``algorithm/protocol`` with its runs — what ``auto`` chose — and the
    closed-form choices; None when the run had no collective."""
    if not c:
        return None
    parts = [f"{group} " + ", ".join(f"{ap} ×{n:,}" for ap, n in chosen.items())
             for group, chosen in (c.get("chosen") or {}).items()]
    parts += [f"{group} {', '.join(aps)} (closed form)"
              for group, aps in (c.get("closed_form") or {}).items()]
    if not parts:
        return None
    algo = (c.get("settings") or "").split(",")[0]
    how = ("algorithm auto: NCCL's tuning model, where a collective names none"
           if algo == "algorithm auto" else f"{algo}, as asked")
    return f"{'; '.join(parts)} (runs per group; {how})"


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
    chosen = collectives_line(s["collectives"])
    if chosen:
        click.echo(f"  collectives         {chosen}")
    links = result.link_table()
    if len(links):
        top = links.sort_values(["bytes", "src", "dst"], ascending=[False, True, True]).iloc[0]
        click.echo(f"  busiest link        {top['src']} -> {top['dst']}: "
                   f"{format_size(top['bytes'])} at {format_bandwidth(top['capacity_Bps'])}, "
                   f"{100 * top['avg_utilisation']:.1f}% average utilisation")
    click.echo(f"  {s['tasks']} tasks on {s['ranks']} ranks, {s['events']} events, "
               f"{s['network']} network, {s['wall_s']:.3f} s wall")


def report(summary: dict[str, Any], written: list[str], as_json: bool,
           print_text: Callable[[], None]) -> None:
    """Print a command's result: one JSON object (``summary`` with the ``files`` written) or
    its readable form (``print_text``) followed by a line per file written."""
    if as_json:
        summary["files"] = written
        print_json(summary)
        return
    print_text()
    for line in written:
        click.echo(f"  wrote {line}")


def report_run(result: SimulationResult, title: str, written: list[str], as_json: bool,
               extra: dict[str, Any] | None = None) -> None:
    """Print an engine run: one JSON object (summary, per-rank table, ``extra``, files) or
    the readable summary under ``title`` followed by the files written."""
    out: dict[str, Any] = {}
    if as_json:
        out = result.summary()
        out.update(extra or {})
        out["per_rank"] = result.rank_table().to_dict(orient="records")
    report(out, written, as_json, lambda: print_run_summary(result, title))


def progress_flag(f: Callable) -> Callable:
    """``--progress/--no-progress`` for commands that run the engine (default: shown when
    standard error is a terminal)."""
    return click.option("--progress/--no-progress", default=None,
                        help="Show a status line on standard error while the engine runs: tasks "
                             "finished, simulated time reached, wall time and an estimate of the "
                             "time left (default: when standard error is a terminal). Results "
                             "are the same either way.")(f)


#: Seconds of wall time between two updates of :func:`status_line`.
STATUS_EVERY_S = 0.5


@contextmanager
def status_line(enabled: bool | None) -> Iterator[None]:
    """While the block runs, a tqdm status line on standard error for every engine run
    (:func:`dessim.engine.watching`); ``enabled`` None: when standard error is a terminal. A
    new engine run (an extrapolation's next short run, a replay after a refused shortcut)
    starts a new line. The line is removed when the block ends."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def show(p: Progress) -> None:
        bar = bars[-1] if bars else None
        if bar is None or p.tasks_total != bar.total or p.tasks_done < bar.n:
            if bar is not None:
                bar.close()
            bar = tqdm(total=p.tasks_total, unit="task", desc=f"engine run {len(bars) + 1}",
                       file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=0,
                       smoothing=0)
            bar.start_t = bar._time() - p.wall_s     # the run started before its first report
            bars.append(bar)
        bar.set_postfix_str(f"{format_time(p.sim_time_s)} simulated", refresh=False)
        bar.update(p.tasks_done - bar.n)

    try:
        with watching(show, every_s=STATUS_EVERY_S):
            yield
    finally:
        if bars:
            bars[-1].close()
