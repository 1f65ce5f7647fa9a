"""Execution traces: Chakra ET (MLCommons) files as plain dataclasses.

:mod:`dessim.trace.chakra_schema` builds the et_def.proto schema for the protobuf runtime (an
optional dependency: ``pip install dessim[chakra]``); :mod:`dessim.trace.chakra_io` reads,
validates and writes ``<prefix>.<rank>.et`` files; :mod:`dessim.trace.convert` turns traces
into task graphs for the engine (:func:`chakra_to_taskgraph`, :func:`replay_chakra`) and task
graphs into traces (:func:`taskgraph_to_chakra`, :func:`export_chakra`). Importing this package
does not import protobuf; the first read or write does.

The inputs of ``dessim calibrate`` (a user's own measurements): :mod:`dessim.trace.nccl_tests`
reads and writes NVIDIA nccl-tests output (:func:`read_nccl_tests`, :func:`write_nccl_tests`),
:mod:`dessim.trace.kernel_csv` reads a CSV of measured kernel times (:func:`read_kernel_csv`) and
:mod:`dessim.trace.kineto` pulls GEMM, attention, memory-bound and NCCL kernel times out of a
PyTorch profiler trace (:func:`read_kineto`).
"""

from __future__ import annotations

from dessim.trace.chakra_io import (
    ChakraNode,
    ChakraTrace,
    IOInfo,
    RankTrace,
    check_chakra_prefix,
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
from dessim.trace.kernel_csv import KernelMeasurement, read_kernel_csv
from dessim.trace.kineto import CollectiveMeasurement, KinetoTrace, read_kineto
from dessim.trace.nccl_tests import NcclTestsLog, NcclTestsRow, read_nccl_tests, write_nccl_tests

__all__ = [
    "COLLECTIVES",
    "ChakraNode",
    "ChakraTrace",
    "IOInfo",
    "RankTrace",
    "check_chakra_prefix",
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
    "NcclTestsRow",
    "NcclTestsLog",
    "read_nccl_tests",
    "write_nccl_tests",
    "KernelMeasurement",
    "read_kernel_csv",
    "CollectiveMeasurement",
    "KinetoTrace",
    "read_kineto",
]
