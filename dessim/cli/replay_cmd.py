"""``dessim replay TRACE_PREFIX --topology SPEC``: replay a Chakra execution trace."""

from __future__ import annotations

from dataclasses import replace

import click

from dessim.cli.common import engine_options, output_options, report_run, write_outputs
from dessim.engine import EngineOptions


@click.command("replay")
@click.argument("trace_prefix")
@engine_options()
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
def command(trace_prefix: str, topology: str, engine: EngineOptions, rank_map: str | None,
            cost_compute: bool,
            mem_node: str | None, ignore_dessim_attrs: bool, timeline: str | None,
            gantt: str | None, spans: str | None, as_json: bool) -> None:
    """Replay the Chakra execution trace TRACE_PREFIX on a topology.

    TRACE_PREFIX is the path ASTRA-sim takes: DIR/prefix for the files
    DIR/prefix.0.et .. DIR/prefix.N-1.et (a directory holding one trace, or one rank file,
    also works). Every node becomes a task of dessim's engine: compute nodes last their
    duration (or are costed from num_ops/tensor_size), collectives and sends/receives run
    on the simulated network with link sharing, memory nodes move data to/from the
    nearest host or CXL memory. See docs/chakra.md for the rules and how results differ
    from ASTRA-sim's.

    Example: dessim replay traces/dp_overlap --topology ring:8,bw=50GB/s,lat=500ns
    --algo ring --timeline t.json
    """
    from dessim.topology import load_topology
    from dessim.trace import read_chakra, replay_chakra

    topo = load_topology(topology)
    trace = read_chakra(trace_prefix)
    # the Python API's replay (it applies --algo per collective: GATHER/SCATTER keep "direct")
    result = replay_chakra(trace, topo, replace(engine, record_links=bool(timeline)), rank_map=rank_map,
                           cost_compute=cost_compute, mem_node=mem_node,
                           use_dessim_attrs=not ignore_dessim_attrs)
    written = write_outputs(result, timeline, gantt, spans)
    tasks = len(result.span_records)        # every task of the graph runs once
    trace_info = {"prefix": trace.prefix, "ranks": trace.num_ranks,
                  "nodes": sum(len(r.nodes) for r in trace.ranks), "tasks": tasks}
    report_run(result, f"{result.meta['graph']}: {trace.num_ranks}-rank Chakra trace, {tasks} tasks "
                       f"on {topo.name}", written, as_json, {"trace": trace_info})
