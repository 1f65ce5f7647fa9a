"""DLRM embedding tables, their sharding over GPUs, and the bytes the sharding moves.

Tables
    :class:`EmbeddingTable`: ``rows``, ``dim`` (columns), ``pooling`` (lookups per sample,
    summed into one ``dim`` vector — Criteo's features are one-hot: pooling 1).
Sharding schemes (torchrec's names; Mudigere et al. 2022, "Software-Hardware Co-design for
Fast and Scalable Training of DLRM Models", §4 for the trade-offs)
    ``table_wise`` — a table lives whole on one GPU, which looks it up for the *global* batch
    ``B`` and sends each GPU the pooled vectors of that GPU's ``b = B/W`` samples (all-to-all);
    ``column_wise`` — a table is cut into ``column_shards`` tables of ``dim/c`` columns, each
    placed like a table-wise table (spreads one wide table's work and traffic);
    ``row_wise`` — every GPU holds ``rows/W`` rows (the first ``rows mod W`` GPUs one more), looks
    up the global batch's ids that fall in its rows (``B·pooling/W`` lookups on average,
    uniform ids assumed) and produces *partial* sums for all ``B`` samples, which a
    reduce-scatter turns into each GPU's ``b`` full vectors.
Placement of table-wise and column-wise shards (``sharder``)
    ``round_robin`` — shard ``i`` (tables in file order, columns in order) on GPU ``i mod W``;
    ``greedy`` — load balancing by longest-processing-time first: shards sorted by cost
    ``(pooling + 1)·dim`` (lookups read plus the pooled vector written and sent, per sample)
    then by bytes, each placed on the GPU with the least cost so far, ties to the least
    bytes, then the lowest rank (Graham's LPT rule; torchrec's greedy partitioner works alike).
Bytes per iteration (``e`` = bytes per embedding element)
    Forward all-to-all: GPU ``o`` sends GPU ``j ≠ o`` ``b·dim·e`` bytes per table-wise or
    column-wise shard it owns (:func:`alltoall_matrix`); row-wise tables: one reduce-scatter
    of ``Σ B·dim·e`` bytes (nccl-tests size: the whole array). The backward sends the same
    bytes the other way (gradients of the pooled vectors): the transposed matrix, and an
    all-gather of the row-wise gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dessim.errors import WorkloadError

__all__ = ["EmbeddingTable", "Shard", "SHARDINGS", "SHARDERS", "shard_tables", "alltoall_matrix",
           "rowwise_bytes", "lookups"]

SHARDINGS: tuple[str, ...] = ("table_wise", "row_wise", "column_wise")
SHARDERS: tuple[str, ...] = ("round_robin", "greedy")


@dataclass(frozen=True)
class EmbeddingTable:
    """One embedding table."""

    name: str
    rows: int
    dim: int
    pooling: float = 1.0
    sharding: str | None = None      #: overrides the file's sharding for this table

    def bytes(self, element_bytes: int) -> float:
        return float(self.rows) * self.dim * element_bytes


@dataclass(frozen=True)
class Shard:
    """The part of a table one GPU holds: ``rows × dim`` of table ``table``."""

    table: str
    rank: int
    rows: int
    dim: int
    pooling: float
    scheme: str                       #: table_wise | row_wise | column_wise
    world: int                        #: GPUs sharing a row-wise table (1 otherwise)

    def bytes(self, element_bytes: int) -> float:
        return float(self.rows) * self.dim * element_bytes

    @property
    def cost(self) -> float:
        """Greedy placement cost per sample: lookups read + pooled vector written."""
        return (self.pooling + 1.0) * self.dim


def lookups(shard: Shard, global_batch: int) -> float:
    """Rows the shard's GPU reads per iteration: ``B·pooling`` (table/column-wise), ``/W``
    for a row-wise shard (uniform ids)."""
    return global_batch * shard.pooling / shard.world


def _place(shards: list[Shard], world: int, sharder: str, element_bytes: int) -> list[Shard]:
    if sharder == "round_robin":
        return [Shard(s.table, i % world, s.rows, s.dim, s.pooling, s.scheme, 1) for i, s in enumerate(shards)]
    order = sorted(range(len(shards)), key=lambda i: (-shards[i].cost, -shards[i].bytes(element_bytes), i))
    cost = [0.0] * world
    mem = [0.0] * world
    placed: dict[int, Shard] = {}
    for i in order:
        s = shards[i]
        r = min(range(world), key=lambda k: (cost[k], mem[k], k))
        cost[r] += s.cost
        mem[r] += s.bytes(element_bytes)
        placed[i] = Shard(s.table, r, s.rows, s.dim, s.pooling, s.scheme, 1)
    return [placed[i] for i in range(len(shards))]


def shard_tables(tables: Sequence[EmbeddingTable], world: int, sharding: str = "table_wise",
                 sharder: str = "greedy", column_shards: int = 2, element_bytes: int = 4) -> list[Shard]:
    """Every shard of ``tables`` on ``world`` GPUs (module docstring)."""
    if sharder not in SHARDERS:
        raise WorkloadError(f"embeddings.sharder {sharder!r} is unknown; valid: {', '.join(SHARDERS)}")
    placeable: list[Shard] = []
    rowwise: list[Shard] = []
    for t in tables:
        scheme = t.sharding or sharding
        if scheme not in SHARDINGS:
            raise WorkloadError(f"table {t.name!r}: sharding {scheme!r} is unknown; valid: {', '.join(SHARDINGS)}")
        if scheme == "table_wise":
            placeable.append(Shard(t.name, -1, t.rows, t.dim, t.pooling, scheme, 1))
        elif scheme == "column_wise":
            if column_shards < 1 or t.dim % column_shards:
                raise WorkloadError(f"table {t.name!r}: dim {t.dim} is not divisible by column_shards "
                                    f"{column_shards}")
            placeable += [Shard(f"{t.name}[c{c}]", -1, t.rows, t.dim // column_shards, t.pooling, scheme, 1)
                          for c in range(column_shards)]
        else:
            base, extra = divmod(t.rows, world)
            rowwise += [Shard(t.name, r, base + (1 if r < extra else 0), t.dim, t.pooling, scheme, world)
                        for r in range(world)]
    return _place(placeable, world, sharder, element_bytes) + rowwise


def alltoall_matrix(shards: Sequence[Shard], world: int, local_batch: int, element_bytes: int) -> list[list[float]]:
    """``M[i][j]``: forward all-to-all bytes GPU ``i`` sends GPU ``j`` (0 on the diagonal):
    ``Σ b·dim·e`` over the table/column-wise shards GPU ``i`` owns."""
    per_rank = [0.0] * world
    for s in shards:
        if s.scheme != "row_wise":
            per_rank[s.rank] += local_batch * s.dim * element_bytes
    return [[0.0 if i == j else per_rank[i] for j in range(world)] for i in range(world)]


def rowwise_bytes(shards: Sequence[Shard], global_batch: int, element_bytes: int) -> float:
    """nccl-tests size of the row-wise reduce-scatter: ``Σ B·dim·e`` over row-wise tables."""
    dims = {s.table: s.dim for s in shards if s.scheme == "row_wise"}
    return float(sum(global_batch * d * element_bytes for d in dims.values()))
