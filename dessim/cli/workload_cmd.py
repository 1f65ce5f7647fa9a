"""``dessim workload show|list``: inspect workloads without simulating.

Also defines :data:`layout_options` (``--tp --pp --dp ...``) and :func:`collect_overrides`,
shared with ``dessim simulate``.
"""

from __future__ import annotations

from typing import Any

import click

from dessim.cli.common import compose, print_json
from dessim.units import format_size, parse_size
from dessim.taskgraph import brief_ranks
from dessim.workload.common.precision import GRAD_PRECISIONS, PRECISIONS
from dessim.workload.transformer.layout import MOE_DISPATCH, SCHEDULES

__all__ = ["command", "layout_options", "collect_overrides", "LAYOUT_OPTION_NAMES"]


_POS = click.IntRange(min=1)

#: Parallel-layout and memory options shared by ``simulate`` and ``workload show``.
layout_options = compose(
    click.option("--tp", type=_POS, default=None, help="Tensor-parallel size."),
    click.option("--pp", type=_POS, default=None, help="Pipeline-parallel stages."),
    click.option("--dp", type=_POS, default=None,
                 help="Data-parallel size (default: GPUs / (tp·pp·cp))."),
    click.option("--cp", type=_POS, default=None, help="Context-parallel size (ring attention)."),
    click.option("--ep", type=_POS, default=None,
                 help="Expert-parallel size (MoE; divides cp × dp, Megatron-core's expert grid)."),
    click.option("--etp", type=_POS, default=None,
                 help="Expert tensor-parallel size (MoE; default: tp). When it differs from tp the "
                      "expert layers refold each stage's ranks into etp × ep × edp (Megatron-core's "
                      "MoE parallel folding)."),
    click.option("--sp/--no-sp", "sp", default=None, help="Sequence parallelism (with tp > 1)."),
    click.option("--zero", type=click.Choice(["0", "1", "2", "3", "fsdp"]), default=None,
                 help="ZeRO stage (fsdp = 3)."),
    click.option("--micro-batch", type=_POS, default=None, help="Sequences per micro-batch."),
    click.option("--global-batch", type=_POS, default=None, help="Sequences per iteration."),
    click.option("--seq-len", type=_POS, default=None,
                 help="Tokens per sequence (default: the workload's; a Hugging Face config's "
                      "context length)."),
    click.option("--schedule", type=click.Choice(list(SCHEDULES)), default=None,
                 help="Pipeline schedule (zb-h1, zb-h2, dualpipe split the backward into B and W)."),
    click.option("--interleave", "virtual_stages", type=_POS, default=None, metavar="V",
                 help="Model chunks per stage (implies --schedule interleaved when > 1)."),
    click.option("--pipeline-layers", default=None, metavar="RULE|N,N,...",
                 help="Layers per pipeline piece (stage, or chunk when interleaved), first first: "
                      "'balanced' (one fewer on the first and last pieces when uneven) or a list."),
    click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default=None,
                 help="Activation recomputation."),
    click.option("--attention", type=click.Choice(["unfused", "flash2", "flash3"]), default=None,
                 help="Attention implementation: unfused (Megatron-LM before FlashAttention), "
                      "flash2, flash3 (Hopper)."),
    click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None,
                 help="Training precision (model.precision): bf16, fp16, fp8 (per-tensor scaling), "
                      "fp8-block (DeepSeek-V3's 1x128/128x128 block scaling), fp32 (docs/workloads.md, "
                      "'FP8')."),
    click.option("--grad-precision", type=click.Choice(list(GRAD_PRECISIONS)), default=None,
                 help="Gradient accumulation and data-parallel reduction precision "
                      "(training.grad_precision; default the recipe's: fp32 for bf16/fp8, fp16 for "
                      "fp16). bf16 = Megatron-LM's --grad-reduce-in-bf16 (transformers; docs/workloads.md)."),
    click.option("--moe-dispatch", type=click.Choice(list(MOE_DISPATCH)), default=None,
                 help="MoE all-to-all (training.moe_dispatch): nccl, or deepep (same-rail network "
                      "sends, then NVLink forwarding). MoE routing (zipf, per-expert counts, "
                      "capacity factor) is set in the workload file's model.routing."),
    click.option("--bucket-size", default=None, metavar="SIZE",
                 help="Gradient bucket (25MiB, 0 = one all-reduce after the backward)."),
    click.option("--offload-optimizer", type=click.Choice(["none", "host", "cxl"]), default=None,
                 help="Keep optimizer states in host or CXL memory."),
    click.option("--offload-activations", type=click.Choice(["none", "host", "cxl"]), default=None,
                 help="Offload stored activations to host or CXL memory."),
    click.option("--tp-comm-overlap/--no-tp-comm-overlap", "tp_comm_overlap", default=None,
                 help="Chunk tensor-parallel collectives against their GEMMs (Transformer Engine "
                      "userbuffers / CoCoNet; docs/comp-comm-overlap.md)."),
    click.option("--fuse-optimizer-allreduce/--no-fuse-optimizer-allreduce", "fuse_optimizer_allreduce",
                 default=None, help="Per-bucket reduce-scatter + optimizer update + all-gather "
                                    "(CoCoNet; docs/comp-comm-overlap.md)."),
    click.option("--gradient-sync", type=click.Choice(["allreduce", "parameter_server"]), default=None,
                 help="Data-parallel gradient synchronisation (DLRM, CNN/ViT workloads)."),
    click.option("--parameter-servers", type=_POS, default=None, metavar="N",
                 help="Parameter-server processes (implies --gradient-sync parameter_server)."),
    click.option("--ps-placement", type=click.Choice(["dedicated", "colocated"]), default=None,
                 help="Parameter servers on their own hosts or beside GPUs."),
    click.option("--ps-mode", type=click.Choice(["sync", "async"]), default=None,
                 help="Synchronous or bounded-staleness asynchronous parameter servers."),
    click.option("--ps-staleness", type=click.IntRange(min=0), default=None, metavar="S",
                 help="Iterations a worker may run ahead of the slowest (--ps-mode async)."),
)

#: Keyword names that :data:`layout_options` adds to a command.
LAYOUT_OPTION_NAMES = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "micro_batch", "global_batch", "seq_len",
                       "schedule", "virtual_stages", "pipeline_layers", "recompute", "attention",
                       "precision", "grad_precision", "moe_dispatch", "bucket_size", "offload_optimizer", "offload_activations", "tp_comm_overlap",
                       "fuse_optimizer_allreduce", "gradient_sync", "parameter_servers",
                       "ps_placement", "ps_mode", "ps_staleness")


def collect_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    """simulate_workload overrides from the :data:`layout_options` values (pops them)."""
    vals = {name: kw.pop(name, None) for name in LAYOUT_OPTION_NAMES}
    out: dict[str, Any] = {}
    for name in ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "micro_batch", "global_batch", "schedule",
                 "recompute", "attention", "grad_precision", "moe_dispatch", "tp_comm_overlap",
                 "fuse_optimizer_allreduce"):
        if vals[name] is not None:
            out[name] = vals[name]
    if vals["seq_len"] is not None:
        out["training"] = {"seq_len": vals["seq_len"]}
    if vals["precision"] is not None:
        out["model"] = {"precision": vals["precision"]}
    if vals["zero"] is not None:
        out["zero_stage"] = vals["zero"] if vals["zero"] == "fsdp" else int(vals["zero"])
    v = vals["virtual_stages"]
    if v is not None:
        out["virtual_stages"] = v
        if v > 1 and "schedule" not in out:
            out["schedule"] = "interleaved"
    if vals["pipeline_layers"] is not None:
        out["pipeline_layers"] = _pipeline_layers(vals["pipeline_layers"])
    if vals["bucket_size"] is not None:
        out["bucket_size"] = int(parse_size(vals["bucket_size"], "--bucket-size"))
    for name in ("offload_optimizer", "offload_activations", "gradient_sync", "parameter_servers",
                 "ps_placement", "ps_mode", "ps_staleness"):
        if vals[name] is not None:
            out[name] = vals[name]
    return out


def _pipeline_layers(text: str) -> str | list[int]:
    """``--pipeline-layers``: a rule name or comma-separated layer counts."""
    if "," not in text and not text.strip().isdigit():
        return text.strip()
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a rule (balanced) or whole numbers separated by "
                                 "commas, e.g. 3,4,4,3", param_hint="--pipeline-layers") from None


@click.group("workload")
def command() -> None:
    """Inspect workloads (model presets and YAML files) without simulating."""


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(as_json: bool) -> None:
    """List the shipped workload presets: transformers with their size and default layout,
    then the other kinds (dlrm, cnn) by name."""
    from dessim.workload import load_workload, shipped_workloads
    from dessim.workload.kinds import shipped_any

    rows = []
    others = {kind: sorted(files) for kind, files in shipped_any().items() if kind != "transformer" and files}
    for name in shipped_workloads():
        spec = load_workload(name)
        lo = spec.layout()
        rows.append({"name": name, "params": spec.model.num_params(), "layers": spec.model.layers,
                     "hidden": spec.model.hidden, "seq_len": spec.model.seq_len, "gpus": lo.world_size,
                     "layout": lo.describe(), "device": spec.training.device or "",
                     "description": spec.description})
    if as_json:
        print_json({"workloads": rows, "other_kinds": others})
        return
    width = max([14, *(len(r["name"]) for r in rows)])     # the longest name sets the column
    for r in rows:
        click.echo(f"{r['name']:<{width}} {r['params'] / 1e9:8.2f}B  {r['gpus']:>5} GPUs  {r['layout']}")
    for kind, names in others.items():
        click.echo(f"{kind + ':':<{width}} {', '.join(names)}")


def _groups_text(layout) -> list[str]:
    lines = []
    for kind in ("tp", "cp", "dp", "pp", "ep") + (("etp",) if layout.separate_expert_tp else ()) + (
            ("edp",) if layout.expert_grid and (layout.separate_expert_tp or layout.cp > 1) else ()):
        gs = layout.groups(kind)
        if len(gs[0]) == 1:
            continue
        shown = " ".join(brief_ranks(g) for g in gs[:2])
        more = f" ... ({len(gs)} groups of {len(gs[0])})" if len(gs) > 2 else ""
        lines.append(f"    {kind:<3} {shown}{more}" if len(kind) <= 3 else f"    {kind} {shown}{more}")
    return lines


@command.command("show")
@click.argument("workload")
@click.option("--topology", "-t", default=None, help="Topology spec: GPU count and GPU model.")
@click.option("--gpus", type=_POS, default=None, help="GPU count (instead of --topology).")
@click.option("--device", default=None, help="GPU model for the memory capacity and peak.")
@layout_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_cmd(workload: str, topology: str | None, gpus: int | None, device: str | None,
             as_json: bool, **kw: Any) -> None:
    """Show WORKLOAD's layout, rank groups, FLOPs per iteration and memory per GPU.

    WORKLOAD is a preset name (dessim workload list), a YAML file or a Hugging Face
    config.json. Nothing is simulated;
    the memory estimate is compared with the device's HBM (a shortfall is shown, not an error).

    Example: dessim workload show gpt3-175b --gpus 1024 --pp 16
    """
    from dessim.catalog.devices import get_device
    from dessim.engine.device import DeviceModel
    from dessim.errors import DessimError
    from dessim.workload import (estimate_memory, hardware_flops_per_iteration, model_flops_per_iteration)
    from dessim.topology.presets import suggested_topology
    from dessim.workload.transformer.plan import resolve_workload
    from dessim.workload.kinds import kind_of
    from dessim.workload.transformer.memory import check_fit

    overrides = collect_overrides(kw)
    if topology is not None and gpus is not None:
        raise click.UsageError("give --topology or --gpus, not both")
    kind = kind_of(workload)
    if kind not in (None, "transformer"):
        raise click.UsageError(f"workload show describes transformer workloads; {workload!r} is a "
                               f"{kind!r} workload: dessim simulate {workload} --topology SPEC "
                               "reports its figures")
    topo = None
    if topology is not None:
        from dessim.topology import load_topology
        topo = load_topology(topology)
        gpus = topo.num_gpus
    spec, rest, explicit_dp = resolve_workload(workload, overrides, gpus)
    layout = spec.layout(gpus, **({"dp": spec.parallelism.dp} if explicit_dp else {}))
    model = spec.model
    memory = spec.memory_options(**rest)
    est = estimate_memory(model, layout, memory)
    dev_name = (topo.device(0) if topo is not None else None) or device or spec.training.device
    dev = get_device(dev_name) if dev_name else None
    fit = unsupported = None
    if dev is not None:
        try:
            check_fit(est, dev.hbm_capacity)
            fit = "fits"
        except DessimError as exc:
            fit = str(exc)
        try:                # e.g. FP8 on an A100: simulate refuses it, say so here too
            DeviceModel(dev, model.precision).check_precision()
        except DessimError as exc:
            unsupported = str(exc)
    f_model = model_flops_per_iteration(model, layout.global_batch)
    f_hw = hardware_flops_per_iteration(model, layout.global_batch, layout.recompute)
    out = {"workload": spec.name, "params": model.num_params(), "active_params": model.num_active_params(),
           "gpus": layout.world_size, "layout": layout.describe(), "precision": model.precision,
           "grad_precision": model.precision_spec.grad_dtype,
           "moe_dispatch": layout.moe_dispatch if model.is_moe else None,
           "moe_routing": {"distribution": model.routing.distribution,
                           "capacity_factor": model.routing.capacity_factor,
                           "load_factor": model.routing.load_factor(model.experts, layout.ep),
                           "dropped_fraction": model.routing.dropped_fraction(model.experts)}
           if model.is_moe else None,
           "overlap": spec.overlap_options().describe(),
           "groups": {k: [list(g) for g in layout.groups(k)[:4]] for k in ("tp", "cp", "dp", "pp", "ep")},
           "group_counts": {k: len(layout.groups(k)) for k in ("tp", "cp", "dp", "pp", "ep")},
           "model_flops": f_model, "hardware_flops": f_hw,
           "memory_per_gpu_bytes": dict(est.breakdown()), "memory_stage": est.stage,
           "device": dev.name if dev else None, "capacity_bytes": dev.hbm_capacity if dev else None,
           "fit": fit, "precision_error": unsupported, "topology": suggested_topology(layout.world_size, dev_name)
           if topology is None else topology, "model_note": model.description}
    if as_json:
        print_json(out)
        return
    click.echo(f"{spec.name}: {model.num_params() / 1e9:.3f}B parameters"
               + (f" ({model.num_active_params() / 1e9:.3f}B active)" if model.is_moe else ""))
    click.echo(f"  layout      {layout.describe()}")
    click.echo(f"  precision   {model.precision} ({model.precision_spec.grad_dtype} gradients)"
               + (f", MoE all-to-all {layout.moe_dispatch}" if model.is_moe else ""))
    if model.is_moe and not model.routing.balanced:
        click.echo(f"  routing     {model.routing.describe(model.experts, layout.ep)}")
    if model.description:       # e.g. what a Hugging Face config holds that dessim does not model
        click.echo(f"  note        {model.description}")
    click.echo(f"  overlap     {out['overlap']} (training.tp_comm_overlap, fuse_optimizer_allreduce)")
    if topology is None and out["topology"] is None:
        click.echo(f"  topology    none built in for {dev_name} (no DGX preset): describe the "
                   "cluster with --topology (docs/topologies.md)")
    elif topology is None:
        click.echo(f"  topology    {out['topology']} (suggested: this layout's GPUs on "
                   f"{dev_name or 'H100'} DGX nodes; dessim simulate {workload} --topology "
                   f"{out['topology']})")
    click.echo("  groups")
    for line in _groups_text(layout) or ["    (every group has one rank)"]:
        click.echo(line)
    click.echo(f"  FLOPs/iter  model {f_model:.4g}, hardware {f_hw:.4g} (recompute={layout.recompute})")
    click.echo(f"  memory/GPU  (stage {est.stage}, the largest)")
    for k, v in est.breakdown().items():
        click.echo(f"    {k:<14} {format_size(v)}")
    if dev is not None:
        click.echo(f"  {dev.name} HBM {format_size(dev.hbm_capacity)}: {fit}")
    if unsupported:
        click.echo(f"  not runnable: {unsupported}")



@command.command("schedule")
@click.argument("schedule", type=click.Choice(list(SCHEDULES)))
@click.option("--pp", type=_POS, default=4, show_default=True, help="Pipeline stages.")
@click.option("--micro-batches", "m", type=_POS, default=8, show_default=True,
              help="Micro-batches per iteration.")
@click.option("--interleave", "v", type=_POS, default=None, metavar="V",
              help="Model chunks per stage (interleaved; default 2 there, else 1).")
@click.option("--times", default="1,1,1", show_default=True, metavar="F,B,W",
              help="Whole-number lengths of a forward, an input-gradient and a weight-gradient pass "
                   "(a whole backward takes B + W; the papers draw 1,2,0 for 1F1B and 1,1,1 for ZB).")
def schedule_cmd(schedule: str, pp: int, m: int, v: int | None, times: str) -> None:
    """Draw SCHEDULE as the papers do: one line per stage, one cell per time unit (F3 = forward
    of micro-batch 3, B backward or input gradient, W weight gradient, ' a later chunk or
    DualPipe's reverse direction, . idle), with free communication; then the bubble and the
    micro-batches each stage holds at its peak."""
    from dessim.errors import DessimError
    from dessim.workload.transformer.schedules import diagram, peak_held, unit_bubble

    try:
        f, b, w = (int(x) for x in times.split(","))
    except ValueError:
        raise click.BadParameter(f"{times!r}: expected three whole numbers F,B,W", param_hint="--times") from None
    if min(f, b, w) < 0 or f + b + w == 0:
        raise click.BadParameter(f"{times!r}: lengths must be >= 0 and not all 0", param_hint="--times")
    sched = SCHEDULES[schedule]
    v = v or (2 if sched.interleaved else 1)
    try:
        rows = diagram(schedule, pp, m, v, f=f, b=b, w=w)
        bubble = unit_bubble(schedule, pp, m, v, f=f, b=b, w=w)
        held = [peak_held(schedule, s, pp, m, v) for s in range(pp)]
    except DessimError as exc:
        raise click.UsageError(str(exc)) from None
    for s, row in enumerate(rows):
        click.echo(f"stage {s:<3} {row}")
    click.echo(f"bubble: {100 * bubble:.1f}% of the ideal time (idle stage-time / busy stage-time; "
               f"closed form with equal passes: {100 * sched.bubble_fraction(pp, m, v):.1f}%)")
    click.echo("peak in flight (micro-batches through the whole stage): "
               + " ".join(f"{h:g}" for h in held))
