"""Memory tiers of DLRM embedding shards (ZionEX, Mudigere et al. ISCA 2022): HBM, then the
far tiers ``embeddings.spill`` names, nearest first.

Tiers (:data:`TIER_NODE_KINDS`): ``host`` (host DDR, a ``host_mem`` node), ``cxl`` (a
``cxl_mem`` node), ``ssd`` (a ``storage`` node: an NVMe drive of
:func:`~dessim.topology.storage.attach_storage`, with its bandwidth and latency;
``embeddings.storage`` attaches one when the topology has none). A GPU keeps its hottest
shards (lookups per byte) in HBM up to ``hbm_budget``, the next hottest in the first far tier
up to its ``spill_budget`` (bytes per GPU; the GPUs sharing a tier node must fit in its
``capacity`` when it has one), and so on — each shard, hottest first, into the
nearest tier with room — and the last tier takes the rest.

Per iteration a far-tier shard's looked-up rows (``lookups·dim·e`` bytes) move from the
tier's node nearest to the GPU into HBM before the lookup, and the updated rows back after
the update (``memcpy`` tasks, category ``offload``, streams ``mem.in`` / ``mem.out``).
``embeddings.prefetch: true`` pipelines the tiers as ZionEX's software-managed cache does:
the rows of the *next* iteration are fetched during this one (its indices are known from the
data loader), so the lookup does not wait and the iteration lasts
``max(transfers, compute)`` in steady state (the input pipeline's prefetch rule,
:mod:`dessim.workload.dataparallel.io`). Rows move directly between the tier and HBM over
the topology's links (SSD → CPU → PCIe → GPU); a staging copy in host memory is not modelled.
Units: bytes, bytes per GPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dessim.errors import SpecError
from dessim.units import parse_size
from dessim.workload.common.placement import OFFLOAD_NODE_KINDS
from dessim.workload.recsys.dlrm_model import Shard, lookups

__all__ = ["TIER_NODE_KINDS", "parse_spill", "parse_spill_budget", "place_tiers"]

#: Far tiers and the topology node kind that holds each.
TIER_NODE_KINDS: Mapping[str, str] = {**OFFLOAD_NODE_KINDS, "ssd": "storage"}


def parse_spill(value: Any, where: str) -> tuple[str, ...]:
    """``none``, one tier name or a list of distinct tier names, nearest first."""
    if value is None or value == "none":
        return ()
    tiers = [value] if isinstance(value, str) else value
    if not isinstance(tiers, (list, tuple)) or not tiers:
        raise SpecError(f"{where}: expected none, a tier or a list of tiers "
                        f"({', '.join(TIER_NODE_KINDS)}), got {value!r}")
    for t in tiers:
        if t not in TIER_NODE_KINDS:
            raise SpecError(f"{where}: tier {t!r} is unknown; valid: none, {', '.join(TIER_NODE_KINDS)}")
    if len(set(tiers)) != len(tiers):
        raise SpecError(f"{where}: tier listed twice in {list(tiers)!r}")
    return tuple(tiers)


def parse_spill_budget(value: Any, tiers: Sequence[str], where: str) -> dict[str, float]:
    """Bytes per GPU of each far tier but the last (a mapping tier → size)."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: expected a mapping tier → size such as {{host: 64GB}}, got {value!r}")
    out = {}
    for tier, size in value.items():
        if tier not in tiers[:-1]:
            raise SpecError(f"{where}: {tier!r} is not a spill tier before the last of {list(tiers)!r} "
                            "(the last tier takes every shard that is left)")
        out[str(tier)] = float(parse_size(size, f"{where}.{tier}"))
    missing = [t for t in tiers[:-1] if t not in out]
    if missing:
        raise SpecError(f"{where}: give the bytes per GPU of tier {missing[0]!r} (every tier but the last "
                        "needs a budget)")
    return out


def place_tiers(shards: Sequence[Shard], hbm_budget: float, tiers: Sequence[str],
                budgets: Mapping[str, float], e: int, batch: int) -> dict[str, list[Shard]]:
    """Shards per tier (``hbm`` first, then ``tiers``): hottest (lookups per byte) first, each
    into the nearest tier with room left; shards no tier can hold go to ``overflow``."""
    order = sorted(shards, key=lambda s: (-lookups(s, batch) / s.bytes(e), s.table))
    names = ["hbm", *tiers]
    caps = [hbm_budget] + [budgets.get(t, float("inf")) if i + 1 < len(tiers) else float("inf")
                           for i, t in enumerate(tiers)]
    out: dict[str, list[Shard]] = {n: [] for n in names}
    out["overflow"] = []
    used = dict.fromkeys(names, 0.0)
    for s in order:
        size = s.bytes(e)
        tier = next((n for n, cap in zip(names, caps) if used[n] + size <= cap), "overflow")
        out[tier].append(s)
        if tier != "overflow":
            used[tier] += size
    return out
