"""``dessim megatron -t TOPOLOGY -- <pretrain_gpt.py arguments>``: simulate a Megatron-LM launch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from dessim.cli.common import GanttRequest, engine_options, output_options, print_json, write_outputs
from dessim.engine.options import EngineOptions
from dessim.outputs.gantt import workload_labels


@click.command("megatron", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--allow-unsupported", is_flag=True,
              help="Simulate without the unsupported and unknown flags (listed on stderr) instead "
                   "of stopping with an error that lists them.")
@click.option("--print-workload", is_flag=True,
              help="Print the equivalent dessim workload file (YAML) and stop.")
@click.option("--name", default="megatron", show_default=True, help="Workload name in the report.")
@engine_options()
@output_options
def command(args: tuple[str, ...], allow_unsupported: bool, print_workload: bool, name: str,
            topology: str, engine: EngineOptions, timeline: str | None, gantt: GanttRequest | None,
            spans: str | None, as_json: bool) -> None:
    """Simulate one iteration of the Megatron-LM launch whose pretrain_gpt.py ARGS follow '--'.

    The data-parallel size is the topology's GPUs / (TP · PP · CP), as Megatron derives it
    from the world size. Flags that set the model, layout or training step are mapped; those
    that do not change one iteration (learning rate, data, logging, checkpoints) are listed as
    without effect; unsupported or unknown flags are an error listing them all (or, with
    --allow-unsupported, listed on stderr and left out). docs/workloads.md, "Megatron-LM".

    \b
    Example:
      dessim megatron -t dgx-a100:nodes=128 -- --num-layers 96 --hidden-size 12288 \\
          --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 \\
          --micro-batch-size 1 --global-batch-size 1536 --tensor-model-parallel-size 8 \\
          --pipeline-model-parallel-size 16 --bf16 --vocab-size 50257
    """
    import yaml

    from dessim.cli.simulate_cmd import print_summary
    from dessim.topology import load_topology
    from dessim.workload import simulate_workload
    from dessim.workload.transformer.megatron import megatron_workload
    from dessim.workload.transformer.spec import parse_workload

    topo = load_topology(topology)
    launch = megatron_workload(list(args), topo.num_gpus, allow_unsupported=allow_unsupported,
                               name=name)
    for kind, flags in (("unsupported, left out", launch.unsupported), ("unknown, left out", launch.unknown)):
        if flags:
            click.echo(f"megatron flags {kind}: {'; '.join(flags)}", err=True)
    if print_workload:
        click.echo(yaml.safe_dump(launch.document, sort_keys=False), nl=False)
        return
    spec = parse_workload(launch.document, origin="megatron arguments", default_name=name)
    overrides: dict[str, Any] = {"device": engine.device} if engine.device else {}
    per_task = bool(timeline or gantt or spans)
    if per_task:       # per-task records: every micro-batch replayed (no extrapolation)
        overrides["extrapolate"] = False
    result = simulate_workload(spec, topo, overrides=overrides,
                               options=replace(engine, record_links=bool(timeline)))
    written = (write_outputs(result.simulation, timeline, gantt, spans, workload_labels(result, topology))
               if per_task else [])
    summary = result.summary()
    megatron = {"notes": launch.notes, "no_effect": launch.no_effect,
                "unsupported": launch.unsupported, "unknown": launch.unknown}
    if as_json:
        print_json({**summary, "megatron": megatron, "files": written})
        return
    print_summary(summary)
    for note in launch.notes:
        click.echo(f"  note                {note}")
    if launch.no_effect:
        click.echo(f"  without effect on one iteration: {' '.join(launch.no_effect)}")
    for line in written:
        click.echo(f"  wrote {line}")
