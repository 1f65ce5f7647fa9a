"""``dessim train [WORKLOAD] --topology SPEC --tokens 15T``: a whole training run — time to
train, failures and goodput, energy and cost, with Monte Carlo bands (docs/training-run.md)."""

from __future__ import annotations

from typing import Any

import click

from dessim.cli.common import compose, engine_options, report, reported_write
from dessim.cli.workload_cmd import collect_overrides, layout_options
from dessim.engine.options import EngineOptions
from dessim.errors import DessimError
from dessim.units import format_size, format_time
from dessim.workload.api import DEFAULT_TOPOLOGY

#: Command-line flag (click parameter name) → key of the ``train:`` mapping
#: (:data:`dessim.training_run.options.TRAIN_KEYS`): the one spelling, parsed there.
FLAG_KEYS: dict[str, str] = {
    "tokens": "tokens", "steps": "steps", "checkpoint_interval": "checkpoint_interval",
    "checkpoint_size": "checkpoint_bytes", "storage_bw": "storage_bw", "restart": "restart",
    "rewarm": "rewarm", "pue": "pue", "host_power": "host_power", "nic_power": "nic_power",
    "switch_power": "switch_power", "usd_per_kwh": "usd_per_kwh", "usd_per_gpu_hour": "usd_per_gpu_hour",
    "capex_per_gpu": "capex_per_gpu", "amortisation": "amortisation", "samples": "samples",
    "mc_seed": "mc_seed", "health_states": "health_states", "attribute": "attribute",
}

#: How each key of the ``train:`` mapping is named in messages: the flag that sets it.
FLAG_NAMES: dict[str, str] = {**{key: "--" + flag.replace("_", "-") for flag, key in FLAG_KEYS.items()},
                              "mtbf": "--mtbf", "gpu_power": "--gpu-power"}

train_options = compose(
    click.option("--tokens", default=None, metavar="N", help="Tokens to train on (15T = 15e12)."),
    click.option("--steps", default=None, metavar="N", help="Iterations to run (instead of --tokens)."),
    click.option("--checkpoint-interval", default=None, metavar="RULE|TIME",
                 help="Useful time between checkpoints: young (√(2CM)), daly (default), optimal, "
                      "or a time (30min)."),
    click.option("--checkpoint-size", default=None, metavar="SIZE",
                 help="Checkpoint bytes instead of the memory model's weights + optimizer state."),
    click.option("--storage-bw", default=None, metavar="BW",
                 help="Aggregate bandwidth of the file system attached when the topology has "
                      "none (default: 2TB/s × GPUs / 16,384, the Llama 3 cluster's per GPU)."),
    click.option("--restart", default=None, metavar="TIME",
                 help="Relaunch time per failure: detect, replace, reschedule, start, init NCCL "
                      "(needed when the run can fail; no default)."),
    click.option("--rewarm", default=None, metavar="TIME",
                 help="Time from restored state to full-speed iterations per restart (needed when the "
                      "run can fail; no default)."),
    click.option("--mtbf", multiple=True, metavar="KIND=TIME",
                 help="MTBF of one component of KIND (gpu, host, nic, link, switch, software), "
                      "e.g. gpu=79000h or link=never; repeatable."),
    click.option("--gpu-power", default=None, metavar="STATE=W,...",
                 help="GPU watts by state over the device's defaults: gemm, attention, memory, other "
                      "(compute kinds; busy = all four), comm (only communicating), idle; e.g. "
                      "memory=450,idle=90. Also BUSY,COMM,IDLE."),
    click.option("--host-power", default=None, type=float, metavar="W",
                 help="Watts per host besides its GPUs (default: the DGX maximum of the GPU model "
                      "minus its GPUs; its NICs included)."),
    click.option("--nic-power", default=None, type=float, metavar="W",
                 help="Watts per scale-out NIC outside the host figure (default 0)."),
    click.option("--switch-power", default=None, type=float, metavar="W",
                 help="Watts per fabric switch; needed when the topology has any (no default)."),
    click.option("--pue", default=None, type=float,
                 help="Power usage effectiveness (default 1.58, Uptime Institute 2023 average)."),
    click.option("--usd-per-kwh", default=None, type=float,
                 help="Energy price, USD per kWh (default 0.0806, US EIA industrial average 2023)."),
    click.option("--usd-per-gpu-hour", default=None, type=float, help="Rental price, USD per GPU-hour."),
    click.option("--capex-per-gpu", default=None, type=float,
                 help="Capital cost per GPU, USD (amortised; needs --amortisation)."),
    click.option("--amortisation", default=None, metavar="TIME",
                 help="Write-off period of --capex-per-gpu (e.g. 35040h = 4 years; no default)."),
    click.option("--samples", default=None, metavar="N", help="Monte Carlo runs (default 1000; 0: closed form only)."),
    click.option("--mc-seed", default=None, metavar="N", help="Seed of the Monte Carlo (default 0)."),
    click.option("--health-states", default=None, metavar="K",
                 help="Straggler draws to simulate (needs --straggler-sigma); default 0."),
    click.option("--attribute", default=None, metavar="K",
                 help="Slowest ranks of the worst health state re-simulated healthy (default 3)."),
    click.option("--plots", default=None, type=click.Path(file_okay=False), metavar="DIR",
                 help="Write time_to_train.png, goodput_vs_interval.png and energy.png to DIR."),
)


def train_mapping(kw: dict[str, Any]) -> dict[str, Any]:
    """The ``train:`` mapping of the flags given (pops them from ``kw``)."""
    out = {key: kw.pop(flag) for flag, key in FLAG_KEYS.items() if kw.get(flag) is not None}
    for flag in FLAG_KEYS:
        kw.pop(flag, None)
    mtbf = kw.pop("mtbf", ())
    if mtbf:
        pairs = {}
        for item in mtbf:
            kind, sep, value = item.partition("=")
            if not sep:
                raise DessimError(f"--mtbf {item!r}: expected KIND=TIME, e.g. gpu=79000h")
            pairs[kind.strip()] = value.strip()
        out["mtbf"] = pairs
    gp = kw.pop("gpu_power", None)
    if gp is not None:
        out["gpu_power"] = _gpu_power(gp)
    if "tokens" not in out and "steps" not in out:
        raise DessimError("dessim train: give --tokens (e.g. 15T) or --steps")
    return out


def _gpu_power(text: str) -> dict[str, float]:
    """``--gpu-power``: STATE=W pairs, or the three figures BUSY,COMM,IDLE."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if all("=" in p for p in parts):
            return {k.strip(): float(v) for k, _, v in (p.partition("=") for p in parts)}
        busy, comm, idle = (float(p) for p in parts)
    except ValueError:
        raise DessimError(f"--gpu-power {text!r}: expected STATE=W pairs (e.g. memory=450,idle=90) or three "
                          "watt figures BUSY,COMM,IDLE (e.g. 700,142,142)") from None
    return {"busy": busy, "comm": comm, "idle": idle}


def _days(seconds: float) -> str:
    """A duration in days, or in the time units below a hundredth of a day (a short run
    printed '0.00 days')."""
    return f"{seconds / 86400:,.2f} days" if seconds >= 864 else format_time(seconds)


def _in_days(seconds: float) -> str:
    """`` (2.08 days)`` after a duration of a hundredth of a day or more, else nothing."""
    return f" ({_days(seconds)})" if seconds >= 864 else ""


def _usd(amount: float) -> str:
    """Dollars: whole ones from 100 up, three significant digits below (a short run's cost
    printed '0')."""
    return f"{amount:,.0f}" if amount >= 100 or amount == 0 else f"{amount:.3g}"


def _energy(joules: float) -> str:
    """Energy in MWh from one MWh up, else kWh, kJ or J (a short run printed '0.00 MWh')."""
    for scale, unit in ((3.6e9, "MWh"), (3.6e6, "kWh"), (1e3, "kJ")):
        if joules >= scale:
            return f"{joules / scale:,.2f} {unit}" if unit == "MWh" else f"{joules / scale:.4g} {unit}"
    return f"{joules:.4g} J"


def _print_summary(s: dict[str, Any]) -> None:
    exp, ck, en = s["expected"], s["checkpoint"], s["energy"]
    click.echo(f"{s['workload']} on {s['gpus']} x {s['device']}: {s['steps']:,} steps of "
               f"{format_time(s['iteration_s'])}" + (f" ({s['tokens']:.3g} tokens)" if s["tokens"] else ""))
    click.echo(f"  useful time         {format_time(s['useful_s'])}{_in_days(s['useful_s'])}")
    ttt = s["time_to_train_s"]
    days = f"{_days(ttt)}, " if ttt >= 864 else ""
    click.echo(f"  time to train       {format_time(ttt)} ({days}expected; goodput {100 * s['goodput']:.2f}%)")
    mc = s["monte_carlo"]
    if mc:
        t = mc["time_to_train_s"]
        click.echo(f"    Monte Carlo       P50 {_days(t['p50'])}, P90 {_days(t['p90'])}, "
                   f"P99 {_days(t['p99'])} over {mc['samples']} runs")
    mtbf = s["failures"]["mtbf_s"]
    click.echo(f"  failures            {exp['failures']:.1f} expected (job MTBF "
               f"{'never' if mtbf is None else format_time(mtbf)}); lost work {format_time(exp['lost_s'])}, "
               f"restarts {format_time(exp['restart_s'])}")
    when = (f"every {format_time(ck['interval_s'])} ({ck['rule']})" if ck["interval_s"] is not None else
            f"none taken: nothing can fail, so the {ck['rule']} interval is infinite")
    click.echo(f"  checkpoint          {format_size(ck['bytes'])}, write {format_time(ck['write_s'])}, "
               f"restore {format_time(ck['restore_s'])}, {when}")
    h = s["health"]
    if h["states"] > 1:
        it = h["iteration_s"]
        click.echo(f"  iteration (health)  P50 {format_time(it['p50'])}, P90 {format_time(it['p90'])}, "
                   f"P99 {format_time(it['p99'])} over {h['states']} straggler draws")
        for a in h["attribution"]:
            click.echo(f"    rank {a['rank']:<5} slowdown {a['slowdown']:.3f}: healthy would save "
                       f"{format_time(a['saved_s'])} per iteration")
    per_token = f", {s['energy_per_token_j']:.4g} J per token" if s["tokens_per_iteration"] else ""
    click.echo(f"  energy              {_energy(s['energy_run_mwh'] * 3.6e9)} per run, "
               f"{_energy(en['per_iteration_j'])} per iteration{per_token} (PUE {en['pue']:g}; mean {en['mean_power_w'] / 1e3:,.1f} kW)")
    gpu = en["gpu_busy_by_kind_j"]
    total = sum(gpu.values()) or 1.0
    click.echo("    GPU compute       " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in gpu.items())
               + f" of {_energy(total)} per iteration")
    cost = s["cost"]
    click.echo(f"  cost                {_usd(s['cost_usd'])} USD (energy {_usd(cost['energy'])}, rental "
               f"{_usd(cost['rental'])}, capex {_usd(cost['capex'])})")


@click.command("train")
@click.argument("workload", required=False)
@layout_options
@train_options
@engine_options(topology_default=DEFAULT_TOPOLOGY)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def command(workload: str | None, topology: str, engine: EngineOptions, as_json: bool, plots: str | None,
            **kw: Any) -> None:
    """Simulate a whole training run of WORKLOAD: time to train, failures and goodput, energy
    and cost, with Monte Carlo bands (docs/training-run.md).

    The iteration is simulated once (once per health state with --health-states), then
    scaled to the run: steps = tokens / tokens per iteration; failures per component from
    published rates (Llama 3 report) over the topology's GPUs, hosts, NICs, links and
    switches; checkpoint write and restore simulated over the storage links; the checkpoint
    interval by Young/Daly; energy from per-device power and PUE.

    Example: dessim train llama3-8b --topology dgx-h100:nodes=4 --tokens 1T --usd-per-gpu-hour 2
    """
    from dessim.training_run import parse_train_options, simulate_training_run
    from dessim.workload.api import DEFAULT_WORKLOAD

    if plots:                       # before any work: the directory and matplotlib
        from dessim.resources import check_output_dir, require_extra
        require_extra("plot", f"--plots {plots!r}")
        check_output_dir(plots, "--plots")
    mapping = train_mapping(kw)
    options = parse_train_options(mapping, "dessim train", FLAG_NAMES)
    overrides = collect_overrides(kw)
    if engine.device:
        overrides["device"] = engine.device
    result = simulate_training_run(workload or DEFAULT_WORKLOAD, topology, options,
                                   overrides=overrides or None, engine=engine)
    summary = result.summary()
    written = []
    if plots:
        from dessim.outputs.training_plots import write_training_plots
        with reported_write("--plots", plots):
            written = write_training_plots(result, plots)
    report(summary, written, as_json, lambda: _print_summary(summary))
