"""ASTRA-sim system files (``system.json``) → dessim collective settings.

ASTRA-sim's system layer reads one JSON object per run (``astra-sim/system/Sys.cc``,
``Sys::initialize_sys`` and ``generate_collective_impl_from_input``;
github.com/astra-sim/astra-sim; docs/references.md "ASTRA-sim system"). dessim maps:

* ``all-reduce-implementation``, ``all-gather-implementation``, ``reduce-scatter-implementation``,
  ``all-to-all-implementation`` — one implementation per network dimension — to the algorithm
  of that collective (:data:`IMPLEMENTATIONS`): on a one-dimensional network ``ring`` →
  ``ring``, ``direct`` → ``direct``, ``halvingDoubling`` → ``hd``, ``doubleBinaryTree`` →
  ``dbtree``; the ``one*`` forms (``oneRing``, ``oneDirect``, ``oneHalvingDoubling``: one flat
  collective over every NPU) to the same flat algorithm on any network; on a
  multi-dimensional network the same implementation on every dimension to ``hierarchical``
  (one phase per dimension, ring inside each: dessim's hierarchical runs rings only).
  Anything else has no dessim equivalent for that collective and is reported as unsupported
  for it (an all-to-all over a ring, a direct window ``direct8``, mixed implementations).
* ``preferred-dataset-splits`` → ``chunks`` (each collective is cut into that many pieces that
  pipeline through the steps and dimensions).

Keys ASTRA-sim uses that dessim does not model are returned as notes naming the key and value
(:data:`NOT_MODELLED`); a key in neither table is an error (a misspelling would otherwise
change an ASTRA-sim run and not dessim's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from dessim.collectives.algorithms import ALGORITHMS
from dessim.collectives.settings import CollectiveSettings
from dessim.errors import SpecError

__all__ = ["AstraSystem", "IMPLEMENTATIONS", "IMPLEMENTATION_KEYS", "NOT_MODELLED",
           "astra_system", "load_astra_system"]

#: ``<collective>-implementation`` key → dessim op.
IMPLEMENTATION_KEYS: Mapping[str, str] = MappingProxyType({
    "all-reduce-implementation": "allreduce", "all-gather-implementation": "allgather",
    "reduce-scatter-implementation": "reducescatter", "all-to-all-implementation": "alltoall"})

#: ASTRA-sim implementation name → (dessim flat algorithm, flat over all NPUs).
IMPLEMENTATIONS: Mapping[str, tuple[str, bool]] = MappingProxyType({
    "ring": ("ring", False), "direct": ("direct", False), "halvingDoubling": ("hd", False),
    "doubleBinaryTree": ("dbtree", False), "oneRing": ("ring", True),
    "oneDirect": ("direct", True), "oneHalvingDoubling": ("hd", True)})

#: System keys dessim reads but does not model → why.
NOT_MODELLED: Mapping[str, str] = MappingProxyType({
    "scheduling-policy": "collectives start when their dependencies finish, in trace order",
    "endpoint-delay": "no per-message endpoint delay (cycles, 1 ns each in ASTRA-sim)",
    "active-chunks-per-dimension": "chunks are not throttled per dimension",
    "collective-optimization": "no local-bandwidth-aware rewriting of collectives",
    "local-mem-bw": "ASTRA-sim's roofline memory bandwidth (GB/s); dessim costs compute with "
                    "its kernel model",
    "local-reduction-delay": "reductions are free unless --reduction-bw is given",
    "boost-mode": "no boost mode",
    "roofline-enabled": "compute nodes last their trace duration (--cost-compute: dessim's "
                        "kernel model, not a roofline)",
    "peak-perf": "the GPU's peak comes from dessim's device catalog",
    "intra-dimension-scheduling": "no intra-dimension scheduling policy",
    "inter-dimension-scheduling": "no inter-dimension scheduling policy",
    "local-mem-size": "no local memory capacity check",
    "track-local-mem": "no local memory tracking",
    "trace-enabled": "ASTRA-sim tracing switch",
    "replay-only": "ASTRA-sim replay switch",
    "model-shared-bus": "no shared-bus model",
    "L": "no LogGP parameters", "o": "no LogGP parameters", "g": "no LogGP parameters",
    "G": "no LogGP parameters",
})
_SPLITS = "preferred-dataset-splits"


@dataclass
class AstraSystem:
    """What a system file means for dessim: ``settings`` (``chunks``), ``algos`` (dessim op →
    algorithm), ``unsupported`` (dessim op → why it has no equivalent), ``notes`` (keys not
    modelled, with their values)."""

    settings: CollectiveSettings
    algos: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _algorithm(names: Any, ndims: int, key: str) -> tuple[str | None, str]:
    """(dessim algorithm or None, why not) for one ``*-implementation`` list."""
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise SpecError(f"{key} must be a list of implementation names, got {names!r}")
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown:
        return None, f"{key} {unknown[0]!r} has no dessim equivalent (known: {', '.join(IMPLEMENTATIONS)})"
    flat = {IMPLEMENTATIONS[n] for n in names}
    if len(flat) > 1:
        return None, f"{key} {names} mixes implementations across dimensions"
    algo, one = flat.pop()
    if one or ndims == 1:
        return algo, ""
    if len(names) not in (1, ndims):
        return None, f"{key} {names}: {len(names)} entries for {ndims} network dimensions"
    if algo != "ring":
        return None, (f"{key} {names}: per-dimension {names[0]} on a {ndims}-dimensional network "
                      "(dessim's hierarchical collectives run a ring in each dimension)")
    return "hierarchical", ""


def astra_system(data: Any, ndims: int, source: str = "<astra system>") -> AstraSystem:
    """The meaning of a parsed ASTRA-sim system document for a network of ``ndims``
    dimensions; errors name ``source`` and the key."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: an ASTRA-sim system file is a JSON object, got {type(data).__name__}")
    valid = (*IMPLEMENTATION_KEYS, _SPLITS, *NOT_MODELLED)
    unknown = [k for k in data if k not in valid]
    if unknown:
        raise SpecError(f"{source}: unknown key{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}")
    chunks = data.get(_SPLITS, 1)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise SpecError(f"{source}: {_SPLITS} must be a whole number >= 1, got {chunks!r}")
    system = AstraSystem(CollectiveSettings(chunks=chunks))
    for key, op in IMPLEMENTATION_KEYS.items():
        if key not in data:
            continue
        try:
            algo, why = _algorithm(data[key], ndims, key)
        except SpecError as exc:
            raise SpecError(f"{source}: {exc}") from None
        if algo is not None and op not in ALGORITHMS[algo].ops:
            algo, why = None, f"{key} {data[key]}: dessim's {algo} does not run {op}"
        if algo is None:
            system.unsupported[op] = why
        else:
            system.algos[op] = algo
    system.notes = [f"{k}={data[k]!r}: not modelled ({why})" for k, why in NOT_MODELLED.items() if k in data]
    return system


def load_astra_system(path: str | Path, ndims: int) -> AstraSystem:
    """An ASTRA-sim system JSON file for a network of ``ndims`` dimensions."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"ASTRA-sim system file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"ASTRA-sim system file {str(path)!r} is not valid JSON: {exc}") from None
    return astra_system(data, ndims, str(path))
