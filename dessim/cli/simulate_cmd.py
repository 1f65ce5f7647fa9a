"""``dessim simulate [WORKLOAD] --topology SPEC``: one training iteration of a workload."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from dessim.cli.common import (GanttRequest, OutputPath, collectives_line, engine_options, output_file, output_options,
                               progress_flag, report, report_run, status_line, reported_write,
                               write_file, write_outputs)
from dessim.trace.chakra_io import check_chakra_prefix
from dessim.engine.options import EngineOptions, Shortcuts
from dessim.outputs.gantt import workload_labels
from dessim.cli.workload_cmd import collect_overrides, layout_options
from dessim.units import format_size, format_time, parse_capacity
from dessim.workload.api import DEFAULT_TOPOLOGY
from dessim.workload.transformer.result import SHORTCUT_NAMES
from dessim.workload.transformer.steady import describe as describe_extrapolation


def print_summary(s: dict[str, Any]) -> None:
    """The readable report of a training iteration's summary (``dessim simulate``, ``megatron``)."""
    click.echo(f"{s['workload']} on {s['gpus']} x {s['device']}: {s['layout']['describe']}")
    click.echo(f"  iteration           {format_time(s['iteration_s'])}")
    attention = s["layout"].get("attention")      # transformers only (DLRM, CNN: none)
    precision = s.get("precision")                 # transformers only
    grads = f" ({s['grad_precision']} gradients)" if s.get("grad_precision") else ""
    click.echo(f"  compute model       {f'attention {attention}, ' if attention else ''}"
               f"{f'precision {precision}{grads}, ' if precision else ''}calibration {s['calibration']}")
    overlap = s.get("overlap")                     # transformers only
    if overlap:
        click.echo(f"  comp-comm overlap   TP comm overlap {'on' if overlap['tp_comm_overlap'] else 'off'}, "
                   f"fused optimizer all-reduce {'on' if overlap['fuse_optimizer_allreduce'] else 'off'}")
    tokens = f"{s['tokens_per_s']:,.0f} tokens/s, " if s["tokens_per_s"] else ""
    click.echo(f"  throughput          {tokens}{s['samples_per_s']:,.2f} samples/s")
    click.echo(f"  model FLOP/s        {s['model_tflops_per_gpu']:.1f} TFLOP/s per GPU, MFU {100 * s['mfu']:.1f}%")
    click.echo(f"  hardware FLOP/s     {s['hardware_tflops_per_gpu']:.1f} TFLOP/s per GPU, HFU {100 * s['hfu']:.1f}%")
    if s["bubble_fraction"] or s["layout"].get("pp", 1) > 1:
        click.echo(f"  pipeline bubble     {100 * s['bubble_fraction']:.1f}% of the pipeline window")
    d = s.get("details") or {}
    if d.get("gradient_sync") == "parameter_server":
        mode = d["ps_mode"] + (f", staleness {d['ps_staleness']}" if d["ps_mode"] == "async" else "")
        click.echo(f"  gradient sync       {d['parameter_servers']} parameter servers ({d['ps_placement']}, {mode}); "
                   f"steady state of {d['ps_iterations']} iterations")
    total = s["exposed_comm_total_s"]
    # the total is the time in which any kind is exposed: below the kinds' sum when they overlap
    shared = sum(s["exposed_comm_s"].values()) > total * (1 + 1e-9)
    click.echo(f"  exposed comm        {format_time(total)} (mean per GPU"
               + ("; time in which several kinds are exposed counted once)" if shared else ")"))
    for cat, v in s["exposed_comm_s"].items():
        if v:
            click.echo(f"    {cat:<17} {format_time(v)}")
    chosen = collectives_line(s.get("collectives"))
    if chosen:
        click.echo(f"  collectives         {chosen}")
    mem = s["memory_per_gpu_bytes"]
    click.echo(f"  memory per GPU      {format_size(mem['total'])} of {format_size(s['memory_capacity_bytes'])} "
               f"(stage {s['memory_stage']})")
    for k, v in mem.items():
        if k != "total" and v:
            click.echo(f"    {k:<17} {format_size(v)}")
    _print_shortcuts(s)
    for text in s.get("approximations", ()):
        click.echo(f"  approximation       {text}")
    fold = s.get("fold")
    if fold:
        click.echo(f"  replica folding     {fold['ranks_simulated']} ranks simulated × {fold['lanes']} lanes; "
                   f"largest lane skew {format_time(fold['max_lane_skew_s'])}"
                   + ("" if fold["max_lane_skew_s"] == 0 else
                      f" ({100 * fold['max_lane_skew_rel']:.3f}% of the iteration: lanes fell out of "
                      "step, rerun with --exact for the exact figure)"))
        if fold.get("lane_rank_rotations_refused"):
            click.echo("    lane orbits rotating GPUs inside hosts refused (replayed with orbits of "
                       "whole hosts for the collectives that had not ended): "
                       f"{fold['lane_rank_rotations_refused']}")
        if fold.get("lane_orbits_refused"):
            click.echo(f"    lane orbits refused (replayed with families, without orbits): "
                       f"{fold['lane_orbits_refused']}")
        if fold.get("lane_families_refused"):
            click.echo(f"    lane families refused (every lane replayed): {fold['lane_families_refused']}")
    elif s.get("fold_fallback"):
        click.echo(f"  replica folding     off: {s['fold_fallback']}")
    elif s["tasks"] > LARGE_GRAPH_TASKS:
        click.echo(f"  tip: {s['tasks']} tasks; try --granularity stage --fold, which simulate the same "
                   "iteration with far fewer where they are exact and say why where not (docs/workloads.md)")
    streamed = s.get("stream_rings")
    if streamed:
        click.echo(f"  streamed rings      {streamed['streamed']} of {streamed['collective_runs']} "
                   "collective runs as coupled flows (an approximation: docs/collectives.md)")
    ext = s.get("extrapolation")
    events = (f"{s['events']} events at {', '.join(map(str, ext['simulated_micro_batches']))} "
              "micro-batches" if ext else f"{s['events']} events")
    sc = s.get("shortcuts") or {}
    # stage granularity asked, merging refused (said above): the tasks are layer tasks
    gran = "layer" if s["granularity"] == "stage" and sc and not sc.get("stage_merged") else s["granularity"]
    click.echo(f"  {s['tasks']} tasks ({gran} granularity"
               f"{', communication free' if not s['comm'] else ''}), {events}, "
               f"{s['wall_s']:.2f} s simulation wall time")


def _print_shortcuts(s: dict[str, Any]) -> None:
    """One line: the shortcuts the run took, that they are exact, and what was refused."""
    sc = s.get("shortcuts")
    if not sc:
        return
    took = []
    if sc["stage_merged"]:
        took.append(SHORTCUT_NAMES["stage_merged"])
    if sc["tp_closed_form_groups"]:
        took.append(f"{SHORTCUT_NAMES['tp_closed_form_groups']} on {sc['tp_closed_form_groups']} "
                    "NVSwitch islands")
    if sc["folded"]:
        took.append(SHORTCUT_NAMES["folded"])
    if sc.get("merged_image_runs"):
        took.append(f"{SHORTCUT_NAMES['merged_image_runs']} ({sc['merged_image_runs']} collectives)")
    if sc.get("lane_family_runs"):
        orbits = sc.get("lane_orbit_runs")
        took.append(f"{SHORTCUT_NAMES['lane_family_runs']} on {sc['lane_family_runs']} transfers "
                    "and collectives" + (f" ({orbits} of them one transfer per orbit)" if orbits else ""))
    quotient = sc.get("channel_quotient")
    if quotient and quotient["channels"] and sc.get("lane_family_runs"):
        took.append(f"{SHORTCUT_NAMES['channel_quotient']} ({quotient['channels']} channels "
                    f"rated as {quotient['blocks']} blocks)")
    if sc.get("collective_memo"):
        m = sc["collective_memo"]
        links = m.get("replayed_on_links")
        took.append(f"{m['simulated']} exclusive collectives simulated once, replayed {m['replayed']}×"
                    + (f" ({links}× alone on their own links: per-link memo)" if links else ""))
    ext = s.get("extrapolation")
    if ext:
        took.append(SHORTCUT_NAMES["extrapolation"])
    how = "chosen automatically" if sc["auto"] or (ext and ext["auto"]) else "as asked"
    fold = s.get("fold") or {}
    exact = ("exact" if not fold.get("max_lane_skew_s") else
             "NOT exact: folded lanes fell out of step")
    if ext:
        exact = (f"{exact} but for the {SHORTCUT_NAMES['extrapolation']}: {describe_extrapolation(ext)}"
                 " — --exact replays every task and micro-batch")
    else:
        exact += " — --exact replays every task"
    line = f"{', '.join(took)} ({how}; {exact})" if took else "none (the full replay)"
    click.echo(f"  shortcuts           {line}")
    merging = [r for r in sc["refused"] if not r.startswith(_OTHER_REFUSALS)]
    if sc["auto"] and merging and s["granularity"] == "stage" and not sc["stage_merged"]:
        click.echo(f"    stage merging refused: {merging[0]}")
    for reason in sc["refused"]:
        if reason.startswith(_EXTRAPOLATION_REFUSED):
            click.echo("    micro-batch extrapolation refused (every micro-batch replayed): "
                       + reason[len(_EXTRAPOLATION_REFUSED):])


#: How :meth:`~dessim.workload.transformer.result.WorkloadResult.shortcuts` prefixes the
#: refusals that are not stage merging's (folding and lanes are printed with the folding line).
_EXTRAPOLATION_REFUSED = "micro-batch extrapolation: "
_OTHER_REFUSALS = ("folding: ", _EXTRAPOLATION_REFUSED, "lane orbits", "lane families: ")


#: Above this many tasks the summary suggests stage granularity and replica folding.
LARGE_GRAPH_TASKS = 200_000


@click.command("simulate")
@click.argument("workload", required=False)
@layout_options
@click.option("--granularity", type=click.Choice(["auto", "layer", "kernel", "stage"]), default="auto",
              show_default=True,
              help="auto: stage where exact, else layer. layer: one compute task per layer pass; "
                   "kernel: per kernel (small cases, validation); stage: one task per stage pass "
                   "with tensor-parallel collectives in closed form where the TP group's links "
                   "carry nothing else (exact; falls back to layer otherwise).")
@click.option("--fold/--no-fold", default=None,
              help="Replica folding (default: on where it applies): simulate TP rank 0 of DP "
                   "replica 0 of each stage and carry every transfer and collective on all "
                   "TP × DP lanes (all traffic stays on the network). Exact while the lanes stay "
                   "in step; the summary reports the largest lane skew.")
@click.option("--extrapolate/--no-extrapolate", default=None,
              help="Steady-state micro-batch extrapolation (default: on where it applies: many "
                   "micro-batches and no per-task output): simulate the layout at three small "
                   "micro-batch counts, check that every figure is affine in them and extrapolate "
                   "it to the full count (approximate: each figure within 0.1 % of itself, times within "
                   "1e-4 of the iteration; "
                   "refused, with the reason, where the check fails). See docs/performance.md.")
@click.option("--exact", is_flag=True,
              help="Turn every shortcut off (layer granularity, no folding and so no merged "
                   "images, lane families, their orbits or the channel quotient, simulated "
                   "TP, no bundles, compact "
                   "schedules or collective memo, network-wide or per link, no micro-batch "
                   "extrapolation): the full replay of every micro-batch, for checking a fast "
                   "result.")
@click.option("--no-comm", is_flag=True, help="Make communication free (same dependencies, no transfer time).")
@click.option("--uniform-stages", is_flag=True,
              help="Leave out the embedding and LM head so that pipeline stages are identical.")
@click.option("--no-memory-check", is_flag=True, help="Simulate even if the layout does not fit in HBM.")
@click.option("--hbm", default=None, metavar="SIZE",
              help="HBM capacity per GPU instead of the catalog's, e.g. 40GB (the memory fit and "
                   "memory_capacity_bytes; the override hbm_capacity, a sweep's memory.hbm_capacity).")
@click.option("--save-graph", type=output_file("task graph"), default=None,
              help="Write the generated task graph (dessim JSON format).")
@click.option("--export-chakra", type=OutputPath(check_chakra_prefix, names_a_file=False), default=None,
              metavar="DIR/PREFIX",
              help="Write the generated task graph as Chakra ET files DIR/PREFIX.<rank>.et "
                   "(one per GPU of the topology).")
@engine_options(topology_default=DEFAULT_TOPOLOGY)
@output_options
@progress_flag
def command(workload: str | None, granularity: str, fold: bool | None, extrapolate: bool | None,
            exact: bool, no_comm: bool,
            uniform_stages: bool,
            no_memory_check: bool, hbm: str | None, save_graph: str | None, export_chakra: str | None,
            topology: str, engine: EngineOptions, timeline: str | None, gantt: GanttRequest | None,
            spans: str | None, as_json: bool, progress: bool | None, **kw: Any) -> None:
    """Simulate one training iteration of WORKLOAD on a topology.

    WORKLOAD is a preset name (dessim workload list), a workload YAML file or a Hugging Face
    config.json (local; its model with default training: --seq-len, --global-batch); the
    layout flags override the file's. Without WORKLOAD: the gpt3-1.3b preset; without --topology:
    dgx-h100:nodes=1. Data parallelism fills the topology (dp = GPUs / (tp·pp·cp)) unless
    --dp is given.

    Prints iteration time, tokens/s, model and hardware FLOP/s per GPU, MFU, the pipeline
    bubble, exposed communication by kind and memory per GPU; --json prints them as one object.

    Example: dessim simulate gpt3-13b --topology dgx-a100:nodes=4 --tp 4 --pp 2 --timeline t.json
    """
    from dessim.taskgraph import save_taskgraph
    from dessim.workload import simulate_workload
    from dessim.workload.api import DEFAULT_WORKLOAD
    from dessim.workload.replay import ReplayResult

    overrides = collect_overrides(kw)
    per_task = [flag for flag, given in (("--timeline", timeline), ("--gantt", gantt), ("--spans", spans),
                                         ("--save-graph", save_graph),
                                         ("--export-chakra", export_chakra)) if given]
    if per_task:
        if extrapolate:
            raise click.UsageError(f"{per_task[0]} writes per-task records, which an extrapolated "
                                   "run does not have: drop --extrapolate or the output")
        extrapolate = False
    if exact:
        clash = [flag for flag, given in ((f"--granularity {granularity}", granularity not in ("auto", "layer")),
                                          ("--fold", fold), ("--extrapolate", extrapolate)) if given]
        if clash:
            raise click.UsageError("--exact turns every shortcut off (it replays every task at "
                                   f"layer granularity): drop {' and '.join(clash)}, or drop --exact")
        extrapolate = False
        if engine.shortcuts.stream_rings:
            raise click.UsageError("--exact turns every shortcut off: drop --stream-rings (an "
                                   "approximation), or drop --exact")
        granularity, fold = "layer", False
        engine = replace(engine, shortcuts=Shortcuts.none())
    if export_chakra and fold is None:
        fold = False            # Chakra has one trace per rank: generate every rank
    overrides["granularity"] = granularity
    if fold is not None:   # only transformer workloads fold; other kinds accept only false
        overrides["fold"] = fold
    if extrapolate is not None:   # likewise: only transformers extrapolate
        overrides["extrapolate"] = extrapolate
    overrides["comm"] = not no_comm
    overrides["embedding_head"] = not uniform_stages
    overrides["check_memory"] = not no_memory_check
    if hbm is not None:     # parsed here so that a bad value names the flag
        overrides["hbm_capacity"] = parse_capacity(hbm, "--hbm", allow_zero=False)
    if engine.device:
        overrides["device"] = engine.device
    options = replace(engine, record_links=bool(timeline))
    with status_line(progress):
        result = simulate_workload(workload or DEFAULT_WORKLOAD, topology, overrides=overrides,
                                   options=options)
    written = (write_outputs(result.simulation, timeline, gantt, spans, workload_labels(result, topology))
               if timeline or gantt or spans else [])
    if save_graph:
        written.append("graph: " + write_file(save_graph, "--save-graph",
                                              lambda p: save_taskgraph(result.taskgraph, p)))
    replayed = isinstance(result, ReplayResult)
    if export_chakra:
        from dessim.trace import export_chakra as write_et

        with reported_write("--export-chakra", export_chakra):
            files = write_et(result.taskgraph, export_chakra, num_ranks=result.taskgraph.num_ranks
                             if replayed else result.plan.num_gpus)
        written.append(f"chakra: {len(files)} rank files {export_chakra}.<rank>.et")
    if replayed:                # a trace file (kind: chakra): reported as dessim replay does
        report_run(result.simulation, f"{result.name}: Chakra trace replay, "
                   f"{len(result.taskgraph)} tasks on {topology}", written, as_json,
                   {"workload": result.name, "kind": "chakra"})
        return
    summary = result.summary()
    report(summary, written, as_json, lambda: print_summary(summary))
