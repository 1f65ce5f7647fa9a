"""``dessim topology``: inspect topologies (``show``) and list what can be built (``list``)."""

from __future__ import annotations

import json

import click

from dessim.resources import shipped_topologies
from dessim.topology.metrics import topology_metrics
from dessim.topology.spec import DEFAULT_BW, DEFAULT_LAT, KINDS
from dessim.units import format_bandwidth

SPEC_HELP = ("SPEC is an inline spec (ring:8,bw=50GB/s,lat=500ns; dgx-h100:nodes=4), a YAML "
             "file, or the name of a shipped topology (see 'dessim topology list').")


@click.group(name="topology")
def command() -> None:
    """Build and inspect cluster topologies."""


@command.command(name="show", epilog=SPEC_HELP)
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def show(spec: str, as_json: bool) -> None:
    """Summarise topology SPEC: node/link counts, diameter, injection and bisection bandwidth."""
    from dessim.topology.spec import load_topology

    topo = load_topology(spec)
    metrics = topology_metrics(topo).to_dict()
    if as_json:
        metrics["meta"] = topo.meta
        click.echo(json.dumps(metrics, indent=2, sort_keys=True, default=str))
        return
    inj = metrics["injection_bw"]
    lines = [
        f"topology   {metrics['name']}",
        f"gpus       {metrics['gpus']}   dims {metrics['dims']}",
        "nodes      " + ", ".join(f"{k} {v}" for k, v in metrics["nodes"].items())
        + f"  (total {metrics['num_nodes']})",
        "links      " + ", ".join(f"{k} {v}" for k, v in metrics["links"].items())
        + f"  (total {metrics['num_links']})",
        f"diameter   {metrics['diameter']} hop{'' if metrics['diameter'] == 1 else 's'}"
        " (GPU to GPU, through transit nodes)",
        f"injection  per GPU min {format_bandwidth(inj['min'])}, max {format_bandwidth(inj['max'])}"
        " (per direction, bw x efficiency)",
        f"bisection  {format_bandwidth(metrics['bisection_bw'])} per direction (rank halves)",
    ]
    if topo.meta.get("builder"):
        lines.append(f"builder    {topo.meta['builder']}")
    click.echo("\n".join(lines))


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
def list_(as_json: bool) -> None:
    """List inline spec kinds (with keys and defaults) and shipped topology files."""
    kinds = {}
    for kind in KINDS.values():
        kinds[kind.name] = {
            "help": kind.help,
            "positional": kind.positional_help,
            "aliases": list(kind.aliases),
            "flags": list(kind.flags),
            "keys": {p.name: {"default": None if p.required else p.default,
                              "required": p.required, "help": p.help} for p in kind.params},
        }
    files = {name: str(path) for name, path in shipped_topologies().items()}
    if as_json:
        click.echo(json.dumps({"kinds": kinds, "shipped": files}, indent=2, default=str))
        return
    click.echo(f"Inline specs: KIND:POSITIONAL,key=value,...  (link defaults: bw={DEFAULT_BW}, "
               f"lat={DEFAULT_LAT}, type=custom, or tech=<catalog link>)\n")
    for name, info in kinds.items():
        pos = f":{info['positional']}" if info["positional"] else ""
        click.echo(f"  {name}{pos}  — {info['help']}")
        keys = []
        for key, k in info["keys"].items():
            keys.append(f"{key}" + ("*" if k["required"] else
                                    f"={k['default']}" if k["default"] is not None else ""))
        click.echo(f"      keys: {', '.join(keys)}   (* required)")
    click.echo("\nShipped topologies (use the name as SPEC):")
    for name, path in files.items():
        click.echo(f"  {name:24s} {path}")
    if not files:
        click.echo("  (none found)")
