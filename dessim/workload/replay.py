"""A Chakra execution trace as a workload kind (``kind: chakra``).

A workload file names a trace instead of a model::

    kind: chakra
    name: dp-overlap              # default: the file's stem
    trace: traces/dp_overlap      # <prefix>.<rank>.et files, relative to this file
    rank_map: "0:3,1:2"           # optional: trace rank -> topology GPU (as dessim replay)
    cost_compute: false           # optional: cost compute nodes with the device model
    mem_node: host_mem            # optional: memory of MEM nodes (a node or a kind)

so that every entry point that takes a workload (``dessim simulate FILE``, the Python API,
``dessim cluster`` jobs, sweeps) replays a trace through the one pipeline of
:mod:`dessim.workload.kinds`, exactly as ``dessim replay`` does
(:func:`dessim.trace.replay_chakra`; tests/test_entry_points.py). The conversion rules are
:func:`dessim.trace.chakra_to_taskgraph`'s (docs/chakra.md). A forced collective algorithm
(``engine.collectives.algo``) is applied per collective when the graph is made, so GATHER and
SCATTER keep ``direct``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field

from dessim.engine import EngineOptions, SimulationResult
from dessim.errors import SpecError
from dessim.schema import Flag, SpecModel, Text, validate
from dessim.taskgraph import TaskGraph
from dessim.topology.graph import Topology
from dessim.trace import chakra_to_taskgraph, read_chakra
from dessim.trace.convert import note_forced_algo
from dessim.workload.common.figures import IterationResult
from dessim.workload.dataparallel.result import Generated

__all__ = ["CHAKRA_KIND", "ChakraFile", "ChakraSpec", "ReplayResult", "parse_chakra", "generate_chakra"]

CHAKRA_KIND = "chakra"
#: Generator overrides the other kinds take, with the only value a trace replay accepts (what
#: ``dessim simulate`` passes by default): a trace has no granularity, folding or model parts.
_NEUTRAL_OVERRIDES: Mapping[str, tuple[Any, ...]] = {
    "granularity": ("auto",), "fold": (None, False), "comm": (True,), "embedding_head": (True,),
    "check_memory": (True,), "extrapolate": (None, False)}


class ChakraFile(SpecModel):
    """A ``kind: chakra`` workload file: a Chakra execution trace to replay."""

    kind: Literal["chakra"]
    name: Text | None = Field(None, min_length=1, description="default: the file name")
    description: Text = ""
    trace: Text = Field(min_length=1, description="prefix of the trace's <prefix>.<rank>.et files "
                        "(relative to this file)")
    rank_map: Any = Field(None, description="trace rank -> topology GPU (as dessim replay --rank-map)")
    cost_compute: Flag = Field(False, description="time compute nodes with dessim's kernel model")
    mem_node: Text | None = Field(None, description="a topology node name or kind for memory transfers")


@dataclass(frozen=True)
class ChakraSpec:
    """A trace to replay: the prefix of its ``<prefix>.<rank>.et`` files and how to place it."""

    name: str
    trace: Path
    rank_map: Any = None
    cost_compute: bool = False
    mem_node: str | None = None
    description: str = ""


def parse_chakra(data: Any, origin: str, default_name: str) -> ChakraSpec:
    """The :class:`ChakraSpec` of a ``kind: chakra`` document read from ``origin`` (a file:
    a relative ``trace`` is taken from the file's directory)."""
    doc = validate(ChakraFile, data, origin)
    path = Path(doc.trace)
    if not path.is_absolute() and Path(origin).exists():
        path = Path(origin).parent / path
    return ChakraSpec(doc.name or default_name, path, doc.rank_map, doc.cost_compute, doc.mem_node,
                      doc.description)


@dataclass
class ReplayResult(IterationResult):
    """A replayed trace: the engine's result and the graph, with the workload's name."""

    name: str
    taskgraph: TaskGraph
    simulation: SimulationResult

    def summary(self) -> dict[str, Any]:
        return {"workload": self.name, "kind": CHAKRA_KIND, "gpus": self.taskgraph.num_ranks,
                "iteration_s": self.iteration_s, "tasks": len(self.taskgraph),
                **self.simulation.summary()}


def generate_chakra(spec: ChakraSpec, topology: Topology, overrides: Mapping[str, Any] | None,
                    options: EngineOptions | None) -> Generated:
    """The task graph of the trace on ``topology`` (no simulation)."""
    for key, value in (overrides or {}).items():
        if value not in _NEUTRAL_OVERRIDES.get(key, ()):
            raise SpecError(f"workload {spec.name!r} (a Chakra trace replay) takes no option "
                            f"{key}={value!r}: a trace fixes its tasks")
    options = options or EngineOptions(record_links=False)
    graph = chakra_to_taskgraph(read_chakra(spec.trace), topology, rank_map=spec.rank_map,
                                cost_compute=spec.cost_compute, algo=options.forced_algo,
                                mem_node=spec.mem_node)
    algo = options.forced_algo
    return Generated(spec.name, graph, topology,
                     lambda sim: ReplayResult(spec.name, graph, note_forced_algo(sim, algo)),
                     options=replace(options, collectives=options.collectives.with_(algo="auto")))
