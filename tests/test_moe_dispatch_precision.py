"""Wire precision of the MoE dispatch under FP8 compute (``training.moe_dispatch_precision``,
issue 18). ``fp8`` (the default of FP8 recipes): DeepSeek-V3's recipe (report §3.3.3), FP8
rows and their 1×128 fp32 scales in the dispatch direction — the forward dispatch and the
combine's backward. ``bf16``: Megatron-core's ``alltoall`` dispatcher (and its flex
dispatcher's ``moe_dispatch_fwd_dtype`` / ``moe_combine_bwd_dtype`` default ``'bf16'``,
NVIDIA/Megatron-LM d98e8a6 ``transformer_config.py``): 16-bit rows on the wire, the experts
cast what they receive. The combine direction is 16-bit either way.

The tiny case of tests/test_moe_alltoall_tp.py: 2 × 8 H100s, TP 2 with SP, EP 8, 32 experts
top-4, hidden 512, T = 512 tokens (256 per rank): a rank sends 1,024 copies, the experts see
2,048 rows."""

from __future__ import annotations

import pytest

from dessim.errors import DessimError
from dessim.topology import load_topology
from dessim.workload.transformer.generator import build_taskgraph
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.memory import MemoryOptions, estimate_memory
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc
from tests.test_moe_alltoall_tp import FP8, ROWS, SENT, H, K, T, TP, _layer0

WIRE = {"fp8": FP8, "bf16": 2.0}     # bytes per element on the wire (fp8: 1 + 4/128)


def _doc(wire: str | None, precision: str = "fp8-block", shared: int = 0, tp: int = TP) -> dict:
    doc = moe_doc({}, "nccl", hidden=H, experts=32, top_k=K, ranks=8)
    doc["model"].update({"precision": precision, "shared_experts": shared})
    doc["parallelism"].update({"tp": tp, "sp": tp > 1})
    if wire is not None:
        doc["training"]["moe_dispatch_precision"] = wire
    return doc


def _moe_comm(wire: str | None, phase: str) -> list:
    graph = build_taskgraph(parse_workload(_doc(wire), "t"), load_topology("dgx-h100:nodes=2"))
    return [(t.name.split()[2], t.op, t.size) for t in _layer0(graph, phase)
            if t.kind == "collective" and t.name.split()[2].startswith(("moe.dispatch", "moe.combine"))]


@pytest.mark.parametrize("wire", [None, "fp8", "bf16"])
def test_bytes_on_the_wire_follow_the_option_in_both_passes(wire):
    """Forward: the dispatch all-to-all of 1,024 copies × 512 and the TP all-gather of the
    2,048 rows carry ``w`` bytes per element (FP8 + scales: 540,672 and 1,081,344 bytes;
    bf16: 1,048,576 and 2,097,152), the combine 16-bit. Backward: the combine's backward
    (dispatch direction) at ``w``, the dispatch's backward 16-bit. Unset = fp8."""
    w = WIRE[wire or "fp8"]
    assert _moe_comm(wire, "fwd") == [("moe.dispatch", "alltoall", SENT * H * w),
                                      ("moe.dispatch.ag", "allgather", ROWS * H * w),
                                      ("moe.combine.rs", "reducescatter", ROWS * H * 2),
                                      ("moe.combine", "alltoall", SENT * H * 2)]
    assert _moe_comm(wire, "bwd") == [("moe.combine", "alltoall", SENT * H * w),
                                      ("moe.combine.ag", "allgather", ROWS * H * w),
                                      ("moe.dispatch.rs", "reducescatter", ROWS * H * 2),
                                      ("moe.dispatch", "alltoall", SENT * H * 2)]


def test_bf16_wire_moves_the_cast_to_the_experts():
    """bf16 on the wire: no cast before the permutation (``moe.quant_in`` gone without shared
    experts), the permutation moves 16-bit rows (256 × 512 read, 1,024 × 512 written, 2 bytes
    each), and the experts cast the 2,048 rows they receive (``moe.expert.quant_in``: read
    2 bytes, write FP8 + scales per element; backward the GeLU up-projection output's
    gradient, 2,048 × 128 per TP rank). fp8: the cast of the 256 tokens before an FP8 permutation."""
    model = parse_workload(_doc(None), "t").model
    ffn = H // 2 // TP
    fp8 = {k.name: k for k in layer_kernels(model, ParallelLayout(tp=TP, dp=8, ep=8, sp=True)).forward}
    bf16 = {k.name: k for k in layer_kernels(model, ParallelLayout(tp=TP, dp=8, ep=8, sp=True,
                                                                   moe_dispatch_precision="bf16")).forward}
    q = fp8["moe.quant_in"]
    assert (q.bytes_read, q.bytes_written) == (T // TP * H * 2, T // TP * H * FP8)
    assert (fp8["moe.permute"].bytes_read, fp8["moe.permute"].bytes_written) == (T // TP * H * FP8, SENT * H * FP8)
    assert "moe.expert.quant_in" not in fp8
    assert "moe.quant_in" not in bf16
    assert (bf16["moe.permute"].bytes_read, bf16["moe.permute"].bytes_written) == (T // TP * H * 2, SENT * H * 2)
    e = bf16["moe.expert.quant_in"]
    assert (e.bytes_read, e.bytes_written) == (ROWS * H * 2, ROWS * H * FP8)
    assert e.backward_bytes == (ROWS * ffn * 2, ROWS * ffn * FP8)
    assert bf16["moe.expert.up"].flops == fp8["moe.expert.up"].flops          # same FP8 GEMMs


def test_bf16_wire_keeps_the_shared_experts_cast_without_tp():
    """TP 1 with a shared expert: the tokens' cast before the dispatch served both; with bf16
    on the wire ``moe.quant_in`` casts the 512 tokens for the shared expert only (backward:
    its up-projection output's gradient, 512 × 256)."""
    model = parse_workload(_doc("bf16", shared=1, tp=1), "t").model
    lo = ParallelLayout(dp=8, ep=8, moe_dispatch_precision="bf16")
    by = {k.name: k for k in layer_kernels(model, lo).forward}
    q = by["moe.quant_in"]
    assert (q.bytes_read, q.backward_bytes[0]) == (T * H * 2, T * (H // 2) * 2)
    assert "moe.shared.quant_in" not in by and "moe.expert.quant_in" in by


@pytest.mark.parametrize("wire", ["fp8", "bf16"])
def test_memory_buffers_hold_the_wire_format(wire):
    """Dispatch buffer: the 1,024 copies in the wire format; combine buffer 16-bit; plus the
    TP term (T × h × 2) and DP's two gradient buckets."""
    model = parse_workload(_doc(wire), "t").model
    lo = ParallelLayout(tp=TP, dp=8, ep=8, sp=True, moe_dispatch_precision=wire).validate(model)
    est = estimate_memory(model, lo)
    assert est.comm_buffers == pytest.approx(SENT * H * WIRE[wire] + SENT * H * 2 + T * H * 2
                                             + 2 * MemoryOptions().bucket_size, rel=1e-15)


def test_deepep_dispatch_sizes_follow_the_option():
    """DeepEP (TP 1, EP 16 over 2 nodes): the dispatch's flat size is the 2,048 copies of the
    rank's 512 tokens at the wire's bytes; the combine 16-bit."""
    sizes = {}
    for wire in ("fp8", "bf16"):
        doc = moe_doc({}, "deepep", hidden=H, experts=32, top_k=K, ranks=16)
        doc["model"]["precision"] = "fp8-block"
        doc["training"]["moe_dispatch_precision"] = wire
        graph = build_taskgraph(parse_workload(doc, "t"), load_topology("dgx-h100:nodes=2"))
        sizes[wire] = {t.name.split()[2]: t.size for t in _layer0(graph, "fwd") if t.kind == "collective"}
    for wire, w in WIRE.items():
        assert sizes[wire]["moe.dispatch"] == K * T * H * w
        assert sizes[wire]["moe.combine"] == K * T * H * 2


@pytest.mark.parametrize("precision, wire, match", [
    ("bf16", "fp8", "moe_dispatch_precision fp8 needs an FP8 recipe"),
    ("fp16", "bf16", "moe_dispatch_precision bf16 with precision='fp16'"),
    ("fp8", "int4", "moe_dispatch_precision"),
])
def test_impossible_settings_are_refused(precision, wire, match):
    with pytest.raises(DessimError, match=match):
        parse_workload(_doc(wire, precision=precision), "t")
