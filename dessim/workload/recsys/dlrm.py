"""Deep Learning Recommendation Models (``kind: dlrm``; Naumov et al. 2019, arXiv:1906.00091).

File schema (shared sections in :mod:`dessim.workload.dataparallel.spec`)::

    kind: dlrm
    model:
      dense_features: 13              # continuous inputs of the bottom MLP
      bottom_mlp: [512, 256, 128]     # its widths; the last must equal embedding_dim
      top_mlp: [1024, 1024, 512, 256, 1]
      embedding_dim: 128              # default dim of every table
      pooling: 1                      # default lookups per sample per table
      tables: [39884406, 39043, ...]  # rows per table, or mappings {name, rows, dim, pooling, sharding}
      precision: bf16                 # MLPs (dessim.workload.common.precision.PRECISIONS)
    embeddings:
      sharding: table_wise            # table_wise | row_wise | column_wise (dlrm_model)
      sharder: greedy                 # greedy (load balancing) | round_robin
      column_shards: 2
      element_bytes: 4                # bytes per embedding element (fp32 tables), also on the wire
      hbm_budget: 40GB                # embedding bytes per GPU kept in HBM (default: HBM − dense memory)
      spill: none                     # none | host | cxl | ssd, or a list nearest first: [host, ssd]
      spill_budget: {host: 64GB}      # bytes per GPU of every spill tier but the last
      prefetch: false                 # fetch the next iteration's far rows during this one
      storage: {kind: nvme, bw: 7GB/s, lat: 80us}   # attach an SSD tier if the topology has none
      comm_precision: fp32            # or {forward: fp16, backward: bf16}: quantised exchange

One iteration on every rank (hybrid parallelism, the DLRM paper §4.2):

1. input reads (:mod:`dessim.workload.dataparallel.io`);
2. the embedding lookup of the rank's shards (one fused, memory-bound kernel — FBGEMM's
   table-batched embedding): reads ``lookups·dim·e`` bytes, writes the pooled ``B·dim·e``
   (``/W`` rows for row-wise shards; :mod:`dessim.workload.recsys.dlrm_model`). Spilled shards'
   rows come from their far tier first: a ``memcpy`` of their ``lookups·dim·e`` bytes from the
   nearest ``host_mem`` / ``cxl_mem`` / ``storage`` node (category ``offload``;
   :mod:`dessim.workload.recsys.tiers`: tiers, budgets, prefetch);
3. the forward all-to-all (one send/recv pair per GPU pair with bytes, per-peer streams
   ``a2a.send.<peer>``/``a2a.recv.<peer>``: NCCL's all-to-all is grouped send/recv) and the
   row-wise reduce-scatter (stream ``a2a.rw``), category ``a2a``; meanwhile the bottom MLP
   runs on the rank's ``b`` samples. With ``comm_precision`` the exchange is quantised
   (:mod:`dessim.workload.recsys.qcomm`: a quantise kernel before, a dequantise kernel on
   stream ``a2a.codec`` after, fewer bytes on the wire), forward and backward;
4. the dot interaction of the ``T + 1`` vectors (bottom MLP output and one per table): a
   batched GEMM, FLOPs ``2·b·(T+1)²·dim``, modelled as one GEMM of shape
   ``(b·(T+1), T+1, dim)``; output ``dim + T(T+1)/2`` features per sample, the top MLP's
   input (479 for MLPerf's DLRM, 367 for the Kaggle one — both match the reference code);
5. top MLP forward and backward, interaction backward; then the backward all-to-all (the
   transposed matrix) and row-wise all-gather start while the bottom MLP's backward runs;
6. the embedding backward (SGD row updates in place, as MLPerf's DLRM reference: read the
   received gradients, read and write the looked-up rows) and, for spilled shards, the
   updated rows written back to far memory;
7. the MLPs' gradients all-reduced over every GPU in DDP buckets during the backward
   (:mod:`dessim.workload.dataparallel.graph`, optional compression), then the dense optimizer step.

HBM placement: a rank keeps its hottest shards (lookups per byte) in HBM up to
``hbm_budget`` and spills the rest to the ``spill`` tiers (:mod:`dessim.workload.recsys.tiers`);
with ``spill: none`` shards that do not fit raise :class:`~dessim.errors.MemoryFitError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

from pydantic import BeforeValidator, Field

from dessim.catalog.calibration import Calibration
from dessim.catalog.devices import get_device
from dessim.errors import DessimError, MemoryFitError, SpecError
from dessim.topology.graph import Topology
from dessim.topology.storage import attach_storage
from dessim.schema import Flag, Number, PositiveCount, Size, SpecModel, Text, choice, converted, described, inline_schema, validate
from dessim.units import format_size
from dessim.workload.dataparallel.compression import GradSync
from dessim.workload.recsys.dlrm_model import (SHARDERS, SHARDINGS, EmbeddingTable, Shard, alltoall_matrix, lookups,
                                               rowwise_bytes, shard_tables)
from dessim.workload.dataparallel.graph import (Layer, emit_backward, emit_forward, emit_training, memory_breakdown,
                                                mlp_layers)
from dessim.workload.dataparallel.result import DPResult, Generated
from dessim.workload.dataparallel.paramserver import iteration_figures
from dessim.workload.dataparallel.io import StorageSection
from dessim.workload.dataparallel.spec import (CommonSpec, DPFile, apply_overrides, dp_sync, parse_common,
                                               sync_details)
from dessim.workload.common.emitter import TaskEmitter
from dessim.workload.common.kernels import ELEMENTWISE, MATMUL, Kernel, KernelBuilder
from dessim.workload.common.placement import resolve_devices
from dessim.workload.common.precision import PRECISIONS, Precision
from dessim.workload.recsys.qcomm import CommPrecision, CommPrecisionValue, comm_precision_of
from dessim.workload.recsys.tiers import TIER_NODE_KINDS, parse_spill, parse_spill_budget, place_tiers

__all__ = ["DLRMSpec", "DLRMFile", "EmbeddingOptions", "parse_dlrm", "generate_dlrm", "dense_layers"]


@dataclass(frozen=True)
class EmbeddingOptions:
    """The ``embeddings:`` section."""

    sharding: str = "table_wise"
    sharder: str = "greedy"
    column_shards: int = 2
    element_bytes: int = 4
    hbm_budget: float | None = None
    spill: tuple[str, ...] = ()                     #: far tiers, nearest first (tiers.py)
    spill_budget: Mapping[str, float] = field(default_factory=dict)  #: bytes per GPU per tier
    prefetch: bool = False
    storage: Mapping[str, Any] = field(default_factory=dict)  #: attach_storage keys of an SSD tier
    comm_precision: CommPrecision = CommPrecision()


@dataclass(frozen=True)
class DLRMSpec:
    """A parsed ``kind: dlrm`` file."""

    common: CommonSpec
    dense_features: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    tables: tuple[EmbeddingTable, ...]
    embeddings: EmbeddingOptions
    precision: str = "bf16"

    @property
    def name(self) -> str:
        return self.common.name

    @property
    def dim(self) -> int:
        return self.bottom_mlp[-1]

    def interaction_width(self) -> int:
        """Top-MLP input: ``dim + F(F-1)/2`` with ``F = T + 1`` vectors."""
        f = len(self.tables) + 1
        return self.dim + f * (f - 1) // 2


_WIDTHS = Field(min_length=1, description="layer widths, first layer first")
_TABLE_ROWS = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
               "description": "rows of the table (a whole number, '1M')"}


class TableSection(SpecModel):
    """One embedding table of ``model.tables`` given as a mapping."""

    name: Text | None = Field(None, description="default: t<index>")
    rows: PositiveCount
    dim: PositiveCount | None = Field(None, description="default: embedding_dim")
    pooling: Number | None = Field(None, description="lookups per sample (default: model.pooling)")
    sharding: choice(SHARDINGS) | None = None


def _table(value: Any) -> Any:
    """A bare row count is a table with only ``rows``."""
    return value if isinstance(value, dict) else {"rows": value}


Table = Annotated[described(TableSection, lambda: {"anyOf": [_TABLE_ROWS, inline_schema(TableSection)]}),
                  BeforeValidator(_table)]


class DLRMModelSection(SpecModel):
    """``model:`` of a DLRM file (widths and rows are counts)."""

    dense_features: PositiveCount = Field(13, description="continuous inputs of the bottom MLP")
    bottom_mlp: list[PositiveCount] = _WIDTHS
    top_mlp: list[PositiveCount] = _WIDTHS
    embedding_dim: PositiveCount | None = Field(None, description="default dim of every table "
                                                "(default: the bottom MLP's last width)")
    pooling: Number = Field(1.0, gt=0, description="default lookups per sample per table")
    tables: list[Table] = Field(min_length=1, description="row counts, or table mappings")
    precision: choice(PRECISIONS) = "bf16"


class EmbeddingsSection(SpecModel):
    """``embeddings:`` of a DLRM file (module docstring)."""

    sharding: choice(SHARDINGS) = "table_wise"
    sharder: choice(SHARDERS) = "greedy"
    column_shards: PositiveCount = 2
    element_bytes: PositiveCount = Field(4, description="bytes per embedding element")
    hbm_budget: Size | None = Field(None, description="embedding bytes per GPU kept in HBM "
                                    "(default: HBM − dense memory)")
    spill: converted(parse_spill, {"anyOf": [{"enum": ["none", *TIER_NODE_KINDS]},
                                             {"type": "array", "items": {"enum": list(TIER_NODE_KINDS)}}],
                                   "description": "far tiers, nearest first"}, tuple) = ()
    spill_budget: dict[str, Size] | None = Field(None, description="bytes per GPU of every spill tier "
                                                 "but the last")
    prefetch: Flag = False
    storage: StorageSection | None = None
    comm_precision: CommPrecisionValue | None = None


class DLRMFile(DPFile):
    """A ``kind: dlrm`` workload file."""

    kind: Literal["dlrm"]
    model: DLRMModelSection
    embeddings: EmbeddingsSection = EmbeddingsSection()


def _tables(model: DLRMModelSection, dim: int, where: str) -> tuple[EmbeddingTable, ...]:
    out = [EmbeddingTable(t.name or f"t{i}", t.rows, t.dim or dim,
                          model.pooling if t.pooling is None else t.pooling, t.sharding)
           for i, t in enumerate(model.tables)]
    for t in out:
        if t.dim != dim:
            raise SpecError(f"{where}: table {t.name!r} has dim {t.dim}, but the dot interaction needs every "
                            f"vector at embedding_dim {dim}")
        if not t.pooling > 0:
            raise SpecError(f"{where}: table {t.name!r} has pooling {t.pooling!r}; it must be > 0")
    return tuple(out)


def parse_dlrm(data: Any, origin: str, default_name: str) -> DLRMSpec:
    """A :class:`DLRMSpec` from a parsed YAML document (validated by :class:`DLRMFile`);
    errors name ``origin``."""
    doc = validate(DLRMFile, data, origin)
    common = parse_common(doc, data, origin, default_name)
    m, e = doc.model, doc.embeddings
    bottom = tuple(m.bottom_mlp)
    dim = m.embedding_dim or bottom[-1]
    if bottom[-1] != dim:
        raise SpecError(f"{origin}: the bottom MLP ends at {bottom[-1]} but embedding_dim is {dim}; the dot "
                        "interaction needs them equal")
    try:
        emb = EmbeddingOptions(
            sharding=e.sharding, sharder=e.sharder, column_shards=e.column_shards,
            element_bytes=e.element_bytes,
            hbm_budget=float(e.hbm_budget) if e.hbm_budget is not None else None,
            spill=e.spill,
            spill_budget=parse_spill_budget(e.spill_budget, e.spill, f"{origin}: embeddings.spill_budget"),
            prefetch=e.prefetch, storage=e.storage.kwargs() if e.storage else {},
            comm_precision=comm_precision_of(e.comm_precision))
        return DLRMSpec(common, m.dense_features, bottom, tuple(m.top_mlp),
                        _tables(m, dim, f"{origin}: model.tables"), emb, m.precision)
    except SpecError:
        raise
    except (DessimError, ValueError) as exc:
        raise SpecError(f"{origin}: {exc}") from None


def _with_ssd(topology: Topology, opt: EmbeddingOptions, where: str) -> Topology:
    """``topology`` with the SSD tier ``embeddings.storage`` attaches when it has no storage."""
    if "ssd" not in opt.spill or topology.nodes_of_kind("storage"):
        return topology
    if not opt.storage:
        raise SpecError(f"{where}: embeddings.spill has the ssd tier but topology {topology.name!r} has no "
                        "storage node; give embeddings.storage (e.g. {kind: nvme, bw: 7GB/s, lat: 80us})")
    return attach_storage(topology, **{"kind": "nvme", **opt.storage})


def _check_tier_capacity(em: TaskEmitter, placement: Mapping[int, Mapping[str, list[Shard]]],
                         tiers: tuple[str, ...], e: int, where: str) -> None:
    """The shards of every GPU sharing a far-tier node must fit in its ``capacity`` (nodes
    without one are unbounded), as the transformer's offload check does."""
    used: dict[str, float] = {}
    for rank, by_tier in placement.items():
        for t in tiers:
            nbytes = sum(s.bytes(e) for s in by_tier[t])
            if nbytes:
                node = em.nearest(rank, TIER_NODE_KINDS[t], f"{where}: embeddings.spill {t}")
                used[node] = used.get(node, 0.0) + nbytes
    graph = em.topology.graph
    for node, nbytes in sorted(used.items()):
        cap = graph.nodes[node].get("capacity")
        if cap is not None and nbytes > cap:
            raise MemoryFitError(f"{where}: the embedding shards spilled to {node!r} need {format_size(nbytes)} "
                                 f"but it holds {format_size(cap)}; raise embeddings.spill_budget of a nearer "
                                 "tier, add a tier or use more GPUs")


def dense_layers(spec: DLRMSpec, local_batch: int, precision: Precision) -> tuple[list[Layer], list[Layer]]:
    """(bottom MLP + interaction, top MLP) layers for ``local_batch`` samples (module docstring)."""
    bottom = mlp_layers("bot", (spec.dense_features,) + spec.bottom_mlp, local_batch, precision)
    f, d, b = len(spec.tables) + 1, spec.dim, local_batch
    act = precision.activation_bytes
    inter = Kernel("interaction.dot", MATMUL, "fwd", 2.0 * b * f * f * d, b * f * d * act,
                   b * spec.interaction_width() * act, (b * f, f, d))
    kb = KernelBuilder(precision)
    bwd = (Kernel("interaction.dot.bwd", MATMUL, "bwd", 2 * inter.flops,
                  inter.bytes_written + inter.bytes_read, b * f * d * act, (b * f, d, f)),)
    top = mlp_layers("top", (spec.interaction_width(),) + spec.top_mlp, local_batch, precision, final_relu=False)
    loss = kb.elementwise("top.loss", b, b, 5.0 * b)
    last = top[-1]
    top[-1] = Layer(last.name, last.forward + (loss,), kb.backward(loss) + last.backward, last.params)
    return bottom + [Layer("interaction", (inter,), bwd, 0.0)], top


#: The document sections an override may set (besides the shared training, compression, input).
OVERRIDE_SECTIONS: tuple[str, ...] = ("model", "embeddings")


def generate_dlrm(spec: DLRMSpec, topology: Topology, overrides: Mapping[str, Any] | None = None,
                  device: str | None = None, calibration: Calibration | None = None) -> Generated:
    """The task graph of one iteration of ``spec`` on ``topology`` (module docstring)."""
    W = topology.num_gpus
    doc, flags = apply_overrides(spec.common, overrides, OVERRIDE_SECTIONS, W)
    spec = parse_dlrm(doc, f"workload {spec.name!r}", spec.name)
    c, opt = spec.common, spec.embeddings
    where = f"workload {spec.name!r}"
    topology = _with_ssd(topology, opt, where)
    if c.input is not None:
        topology = c.input.prepare(topology)
    if c.training.ps is not None:
        topology = c.training.ps.prepare(topology)
    devices = resolve_devices(topology, (device, c.training.device), where)
    precision = PRECISIONS[spec.precision]
    b, _ = c.training.per_gpu(W, where)
    B, e = c.training.global_batch, opt.element_bytes
    bottom, top = dense_layers(spec, b, precision)
    layers = bottom + top
    params = sum(l.params for l in layers)
    servers = c.training.ps is not None
    dense_mem = memory_breakdown(params, precision, layers, c.training.bucket_size, servers=servers)
    capacity = min(get_device(d).hbm_capacity for d in set(devices))
    budget = opt.hbm_budget if opt.hbm_budget is not None else max(0.0, capacity - dense_mem["total"])
    shards = shard_tables(spec.tables, W, opt.sharding, opt.sharder, opt.column_shards, e)
    per_rank: dict[int, list[Shard]] = {r: [] for r in range(W)}
    for s in shards:
        per_rank[s.rank].append(s)
    placement = {r: place_tiers(per_rank[r], budget, opt.spill, opt.spill_budget, e, B) for r in range(W)}
    worst = max(sum(s.bytes(e) for s in placement[r]["hbm"]) for r in range(W))
    spilled_max = max(sum(s.bytes(e) for s in placement[r]["overflow"]) for r in range(W))
    if spilled_max and flags.check_memory:
        raise MemoryFitError(f"{where}: a GPU's embedding shards need {format_size(worst + spilled_max)} but only "
                             f"{format_size(budget)} of HBM are left for them; spill them (embeddings.spill: host "
                             "or cxl), use more GPUs or another sharding")
    memory = memory_breakdown(params, precision, layers, c.training.bucket_size, {"embeddings": worst},
                              servers=servers)
    if flags.check_memory and memory["total"] > capacity:
        raise MemoryFitError(f"{where}: {format_size(memory['total'])} per GPU do not fit in {format_size(capacity)}")
    matrix = alltoall_matrix(shards, W, b, e)
    rw_size = rowwise_bytes(shards, B, e)
    qc = opt.comm_precision
    wire = {p: ([[x * qc.ratio(p, e) for x in row] for row in matrix], rw_size * qc.ratio(p, e))
            for p in ("forward", "backward")}
    group = tuple(range(W))
    sync = GradSync({r: group for r in range(W)}, precision.grad_bytes, c.compression)
    em = TaskEmitter(f"{spec.name} dp={W}", topology, devices, spec.precision,
                     meta={"workload": spec.name, "kind": "dlrm", "generator": "dessim.workload.recsys.dlrm"},
                     calibration=calibration)
    hit = c.input.effective_hit_ratio(topology) if c.input else 0.0

    def emb_kernels(ss: list[Shard], name: str) -> tuple[Kernel, Kernel]:
        rows = sum(lookups(s, B) * s.dim for s in ss)
        outs = sum(B * s.dim for s in ss)
        return (Kernel(f"{name}.lookup", ELEMENTWISE, "fwd", rows, rows * e, outs * e),
                Kernel(f"{name}.update", ELEMENTWISE, "bwd", 2 * rows, outs * e + rows * e, rows * e))

    if flags.check_memory:
        _check_tier_capacity(em, placement, opt.spill, e, where)
    ps = dp_sync(c, em, precision, W, where)

    def iteration(rank: int, start: list[str], extra: dict[str, list[str]]) -> str:
        tiers = placement[rank]
        owned = [sh for t in ("hbm", *opt.spill, "overflow") for sh in tiers[t]]
        reads = c.input.emit(em, rank, b, hit) if c.input else []
        waits = ([] if (c.input is None or c.input.prefetch) else reads) + start
        far = {t: sum(lookups(sh, B) * sh.dim * e for sh in tiers[t]) for t in opt.spill}
        far = {t: v for t, v in far.items() if v}
        fetch = [em.memcpy(rank, nbytes, em.nearest(rank, TIER_NODE_KINDS[t], f"{where}: embeddings.spill {t}"),
                           "to_hbm", f"embedding rows from {t}", "offload", "mem.in", waits)
                 for t, nbytes in far.items()]
        fwd_k, bwd_k = emb_kernels(owned, "emb")
        lookup = (em.compute(rank, [fwd_k], "fwd embeddings", "fwd", waits + ([] if opt.prefetch else fetch))
                  if owned else "")
        arrived = _exchange(em, rank, wire["forward"], qc, e, [lookup] if lookup else waits, backward=False)
        gates = {**extra, "interaction": arrived + extra.get("interaction", [])}
        last = emit_forward(em, rank, layers, waits, 0, extra_deps=gates)
        grads: list[str] = []

        def start_backward_a2a(tid: str, rank: int = rank, out: list[str] = grads) -> None:
            out += _exchange(em, rank, wire["backward"], qc, e, [tid], backward=True)

        last = emit_backward(em, rank, layers, [last], 0, ps or sync, c.training.bucket_size,
                             after={"interaction": start_backward_a2a})
        if owned:
            last = em.compute(rank, [bwd_k], "bwd embeddings", "bwd", [last] + grads)
            for t, nbytes in far.items():
                em.memcpy(rank, nbytes, em.nearest(rank, TIER_NODE_KINDS[t], where), "from_hbm",
                          f"updated embedding rows to {t}", "offload", "mem.out", [last])
        return last

    emit_training(em, W, layers, params, precision, c.training.bucket_size, ps, iteration)

    a2a_sent = [sum(row) for row in wire["forward"][0]]
    details = {
        "tables": len(spec.tables), "embedding_bytes": sum(t.bytes(e) for t in spec.tables),
        "dense_params": params, "sharding": opt.sharding, "sharder": opt.sharder,
        "shards_per_gpu": [len(per_rank[r]) for r in range(W)],
        "embedding_bytes_per_gpu": [sum(s.bytes(e) for s in per_rank[r]) for r in range(W)],
        "spilled_bytes_per_gpu": [sum(s.bytes(e) for t in opt.spill for s in placement[r][t])
                                  for r in range(W)],
        "tier_bytes_per_gpu": {t: [sum(s.bytes(e) for s in placement[r][t]) for r in range(W)]
                               for t in ("hbm", *opt.spill)},
        "spill": "+".join(opt.spill) or "none", "hbm_budget": budget, "prefetch": opt.prefetch,
        "comm_precision": qc.describe(),
        "alltoall_sent_bytes_per_gpu": a2a_sent, "rowwise_reducescatter_bytes": wire["forward"][1],
        "interaction_width": spec.interaction_width(), "local_batch": b,
        "compression": c.compression.method, "input_hit_ratio": hit if c.input else None,
        **sync_details(c.training),
    }
    extra = (f", spill {'+'.join(opt.spill)}{' (prefetch)' if opt.prefetch else ''}" if opt.spill else "")
    if qc != CommPrecision():
        extra += f", exchange {qc.describe()['forward']}/{qc.describe()['backward']} (fwd/bwd)"
    layout = {"dp": W, "micro_batch": b, "global_batch": B, "num_micro_batches": 1,
              "describe": f"dp={W} (MLPs), {opt.sharding} embeddings ({opt.sharder}), batch {b}/GPU{extra}"}

    def finish(sim):
        return DPResult("dlrm", spec.name, em.graph, sim, devices, spec.precision, B, layout, memory, 0,
                        c.training.bucket_size, details,
                        *iteration_figures(ps, sim, em.graph))

    return Generated(spec.name, em.graph, topology, finish)


def _exchange(em: TaskEmitter, rank: int, wire: tuple[list[list[float]], float], qc: CommPrecision,
              e: int, deps: list[str], backward: bool) -> list[str]:
    """The rank's part of the embedding all-to-all (forward, or the transposed backward) and
    the row-wise reduce-scatter (all-gather backward), in wire bytes ``wire = (matrix,
    row-wise size)``, quantised by ``qc`` (module docstring); returns what the consumer waits
    for."""
    matrix, rw_size = wire
    W = len(matrix)
    tag = 1 if backward else 0
    phase = "bwd" if backward else "fwd"
    sends = {p: matrix[p][rank] if backward else matrix[rank][p] for p in range(W) if p != rank}
    recvs = {p: matrix[rank][p] if backward else matrix[p][rank] for p in range(W) if p != rank}
    ratio = qc.ratio("backward" if backward else "forward", e)
    rw_in, rw_out = (rw_size / W, rw_size) if backward else (rw_size, rw_size / W)
    quant, dequant = qc.kernels("backward" if backward else "forward",
                                (sum(sends.values()) + rw_in) / ratio, (sum(recvs.values()) + rw_out) / ratio, e)
    if quant:
        deps = [em.compute(rank, quant, f"quantise a2a {phase}", "compress", deps)]
    done: list[str] = []
    for peer in sends:
        if sends[peer]:
            em.p2p(rank, "send", peer, tag, sends[peer], f"a2a {phase} to {peer}", "a2a", f"a2a.send.{peer}", deps)
        if recvs[peer]:
            done.append(em.p2p(rank, "recv", peer, tag, recvs[peer], f"a2a {phase} from {peer}", "a2a",
                               f"a2a.recv.{peer}"))
    if rw_size:
        op = "allgather" if backward else "reducescatter"
        tid = em.collective(rank, op, rw_size, tuple(range(W)), f"rw.{phase}", f"row-wise {op}", "a2a",
                            "a2a.rw", deps)
        if tid:
            done.append(tid)
    if dequant and done:
        done = [em.compute(rank, dequant, f"dequantise a2a {phase}", "compress", done, stream="a2a.codec")]
    return done
