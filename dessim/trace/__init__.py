"""Execution traces: Chakra ET (MLCommons) files as plain dataclasses.

:mod:`dessim.trace.chakra_schema` builds the et_def.proto schema for the protobuf runtime (an
optional dependency: ``pip install dessim[chakra]``); :mod:`dessim.trace.chakra_io` reads,
validates and writes ``<prefix>.<rank>.et`` files; :mod:`dessim.trace.convert` turns traces
into task graphs for the engine (:func:`chakra_to_taskgraph`, :func:`replay_chakra`) and task
graphs into traces (:func:`taskgraph_to_chakra`, :func:`export_chakra`). Importing this package
does not import protobuf; the first read or write does.
"""

from __future__ import annotations

from dessim.trace.chakra_io import (
    ChakraNode,
    ChakraTrace,
    IOInfo,
    RankTrace,
    process_groups,
    read_chakra,
    resolve_group,
    validate_for_replay,
    write_chakra,
)
from dessim.trace.convert import (
    COLLECTIVES,
    chakra_to_taskgraph,
    export_chakra,
    nearest_memory_node,
    parse_rank_map,
    replay_chakra,
    taskgraph_to_chakra,
)

__all__ = [
    "COLLECTIVES",
    "ChakraNode",
    "ChakraTrace",
    "IOInfo",
    "RankTrace",
    "process_groups",
    "read_chakra",
    "resolve_group",
    "validate_for_replay",
    "write_chakra",
    "chakra_to_taskgraph",
    "taskgraph_to_chakra",
    "export_chakra",
    "replay_chakra",
    "parse_rank_map",
    "nearest_memory_node",
]
