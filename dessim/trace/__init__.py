"""Execution traces: Chakra ET (MLCommons) files as plain dataclasses.

:mod:`dessim.trace.chakra_schema` builds the et_def.proto schema for the protobuf runtime (an
optional dependency: ``pip install dessim[chakra]``); :mod:`dessim.trace.chakra_io` reads,
validates and writes ``<prefix>.<rank>.et`` files. Importing this package does not import
protobuf; the first read or write does.
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

__all__ = [
    "ChakraNode",
    "ChakraTrace",
    "IOInfo",
    "RankTrace",
    "process_groups",
    "read_chakra",
    "resolve_group",
    "validate_for_replay",
    "write_chakra",
]
