"""``dessim replay TRACE_PREFIX --topology SPEC``: replay a Chakra execution trace; with
``--astra-network`` / ``--astra-system``, on an ASTRA-sim user's own configuration files."""

from __future__ import annotations

import os
from dataclasses import replace

import click

from dessim.cli.common import (TOPOLOGY_HELP, GanttRequest, TracePrefix, engine_options, output_options,
                               report_run, write_outputs)
from dessim.engine import EngineOptions


@click.command("replay")
@click.argument("trace_prefix", type=TracePrefix())
@click.option("--topology", "-t", "topology", default=None,
              help=TOPOLOGY_HELP + " Or --astra-network.")
@engine_options(topology=False)
@click.option("--astra-network", type=click.Path(exists=True, dir_okay=False), default=None,
              help="ASTRA-sim analytical network YAML (topology, npus_count, bandwidth in GB/s = "
                   "2^30 bytes/s, latency in ns) as the topology, instead of --topology.")
@click.option("--astra-system", type=click.Path(exists=True, dir_okay=False), default=None,
              help="ASTRA-sim system JSON: each collective's implementation becomes its algorithm, "
                   "preferred-dataset-splits the chunks; keys dessim does not model are listed.")
@click.option("--allow-unsupported", is_flag=True,
              help="With --astra-system: replay collectives whose ASTRA-sim implementation has no "
                   "dessim equivalent with dessim's choice (auto) instead of stopping.")
@click.option("--rank-map", default=None, metavar="MAP",
              help="Place trace ranks on topology GPUs: 0:3,1:2,... or a JSON/YAML file "
                   "(mapping or list). Unlisted ranks keep their number. Needed when the "
                   "topology's GPU count differs from the trace's rank count.")
@click.option("--cost-compute", is_flag=True,
              help="Cost GPU compute nodes that carry num_ops/tensor_size with the device "
                   "model instead of replaying their duration_micros.")
@click.option("--mem-node", default=None, metavar="NODE|KIND",
              help="Memory of MEM_LOAD/MEM_STORE nodes: a topology node name, or host_mem / "
                   "cxl_mem (the nearest of that kind). Default: the nearest of either.")
@click.option("--ignore-dessim-attrs", is_flag=True,
              help="Replay only the Chakra fields of a trace dessim wrote (ignore its "
                   "dessim.task attributes), e.g. after editing it with Chakra tools.")
@output_options
def command(trace_prefix: str, topology: str | None, engine: EngineOptions, astra_network: str | None,
            astra_system: str | None, allow_unsupported: bool, rank_map: str | None,
            cost_compute: bool, mem_node: str | None, ignore_dessim_attrs: bool,
            timeline: str | None, gantt: GanttRequest | None, spans: str | None, as_json: bool) -> None:
    """Replay the Chakra execution trace TRACE_PREFIX on a topology.

    TRACE_PREFIX is the path ASTRA-sim takes: DIR/prefix for the files
    DIR/prefix.0.et .. DIR/prefix.N-1.et (a directory holding one trace, or one rank file,
    also works). Every node becomes a task of dessim's engine: compute nodes last their
    duration (or are costed from num_ops/tensor_size), collectives and sends/receives run
    on the simulated network with link sharing, memory nodes move data to/from the
    nearest host or CXL memory. See docs/chakra.md for the rules and how results differ
    from ASTRA-sim's.

    \b
    Examples:
      dessim replay traces/dp_overlap --topology ring:8,bw=50GB/s,lat=500ns --algo ring
      dessim replay traces/allreduce --astra-network network.yml --astra-system system.json
    """
    from dessim.topology import load_topology
    from dessim.topology.astra import load_astra_network
    from dessim.trace import read_chakra, replay_chakra

    if (topology is None) == (astra_network is None):
        raise click.UsageError("give the topology as --topology or --astra-network (one of them)")
    if rank_map and rank_map.lower().endswith((".yaml", ".yml", ".json")) and not os.path.exists(rank_map):
        raise click.BadParameter(f"file {rank_map!r} does not exist (a rank map is a file or pairs "
                                 "TRACE_RANK:TOPOLOGY_RANK, e.g. 0:3,1:2)", param_hint="--rank-map")
    topo = load_astra_network(astra_network) if astra_network else load_topology(topology)
    trace = read_chakra(trace_prefix)
    algo, extra = None, {}
    if astra_system:
        algo, engine, extra = _astra_system(astra_system, topo, trace, engine, allow_unsupported)
    # the Python API's replay (it applies --algo per collective: GATHER/SCATTER keep "direct")
    result = replay_chakra(trace, topo, replace(engine, record_links=bool(timeline)), rank_map=rank_map,
                           algo=algo, cost_compute=cost_compute, mem_node=mem_node,
                           use_dessim_attrs=not ignore_dessim_attrs)
    written = write_outputs(result, timeline, gantt, spans)
    tasks = len(result.span_records)        # every task of the graph runs once
    trace_info = {"prefix": trace.prefix, "ranks": trace.num_ranks,
                  "nodes": sum(len(r.nodes) for r in trace.ranks), "tasks": tasks}
    report_run(result, f"{result.meta['graph']}: {trace.num_ranks}-rank Chakra trace, {tasks} tasks "
                       f"on {topo.name}", written, as_json, {"trace": trace_info, **extra})
    if extra and not as_json:
        for note in extra["astra_system"]["notes"]:
            click.echo(f"  astra-system        {note}")


def _astra_system(path: str, topo, trace, engine: EngineOptions, allow_unsupported: bool):
    """Per-op algorithms and engine options of an ASTRA-sim system file, checked against the
    collectives the trace runs; the report's ``astra_system`` entry."""
    from dessim.collectives.astra import load_astra_system
    from dessim.errors import SpecError
    from dessim.trace.convert import trace_collective_ops

    system = load_astra_system(path, len(topo.dims))
    used = trace_collective_ops(trace)
    missing = {op: why for op, why in system.unsupported.items() if op in used}
    if missing and not allow_unsupported:
        raise SpecError(f"{path}: not supported for collectives this trace runs: "
                        f"{'; '.join(missing.values())} (--allow-unsupported replays them with "
                        "dessim's own choice, auto)")
    if engine.forced_algo:
        raise click.UsageError("--astra-system sets each collective's algorithm: drop --algo")
    engine = replace(engine, collectives=engine.collectives.with_(chunks=system.settings.chunks))
    notes = list(system.notes) + [f"{why}: unused by this trace" for op, why in system.unsupported.items()
                                  if op not in used]
    notes += [f"{why}: replayed with auto (--allow-unsupported)" for why in missing.values()]
    info = {"file": path, "algorithms": system.algos, "chunks": system.settings.chunks, "notes": notes}
    return dict(system.algos), engine, {"astra_system": info}
