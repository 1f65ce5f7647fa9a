"""Fused and overlapped computation–communication (issue 22, part 2;
dessim/workload/transformer/overlap.py, docs/comp-comm-overlap.md).

* closed form: a chunked GEMM + collective pipelined over ``n`` chunks takes
  ``c + m + (n-1)·max(c, m) = max(compute, comm) + one chunk`` (property test);
* the SM share: GEMM chunks next to a reduce-scatter / all-reduce run on ``SMs − 16`` SMs
  (Transformer Engine's ``pipeline`` default), those after an all-gather on all of them;
* the worked example of docs/comp-comm-overlap.md (golden values and the papers' direction:
  exposed TP communication falls, compute slows; fused optimizer all-reduce is faster);
* options in the workload file, overrides, the CLI, sweeps and the summary; bad values.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.catalog.calibration import load_calibration
from dessim.engine.device import SM_COUNT, DeviceModel
from dessim.engine.kernel_model import gemm_time
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.workload.api import simulate_workload
from dessim.workload.common.kernels import ELEMENTWISE, KernelBuilder, KernelSet, KernelTimer
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.overlap import METHODS, OverlapOptions, chunk_kernel, method_for
from dessim.workload.transformer.passes import END, Block, CommPoint, CommSpec, PassBuilder
from dessim.workload.transformer.stage_passes import pass_timeline

MODEL = TransformerConfig("toy", layers=1, hidden=1024, heads=8, ffn_hidden=4096, vocab=1024, seq_len=1024)
ON = OverlapOptions(tp_comm_overlap=True)


def _block(point: CommPoint, with_norm: bool) -> Block:
    b = KernelBuilder(MODEL)
    gemm = b.matmul("x.gemm", 1024, 1024, 1024)
    fwd = ((b.elementwise("x.norm", 10, 10, 0.0, ELEMENTWISE),) if with_norm else ()) + (gemm,)
    return Block("L0", KernelSet(fwd, ()), (point,), (0.0, 0.0))


def _makespan(steps, c: float, m: float, norm: float = 0.0) -> float:
    tl = pass_timeline(steps, set(), lambda k: norm if k.name == "x.norm" else c, lambda s: m)
    assert tl is not None
    return sum(s.duration for s in tl.segments) + tl.tail


@settings(max_examples=60, deadline=None)
@given(c=st.floats(1e-6, 1e-2), m=st.floats(1e-6, 1e-2), tp=st.sampled_from([2, 4, 8]))
def test_post_overlap_is_max_of_compute_and_comm_plus_one_chunk(c, m, tp):
    # reduce-scatter after a row-parallel GEMM: Transformer Engine's pipeline method, 4 chunks
    spec = CommSpec("tp", "reducescatter", 8e6, "tp", "x.g.rs")
    steps = PassBuilder(MODEL, ParallelLayout(tp=tp, sp=True), overlap=ON).forward(
        [_block(CommPoint(END, fwd=(spec,)), with_norm=False)], zero3=False)
    n = METHODS["pipeline"].chunks(tp)
    assert n == 4
    assert [s.size for s in steps if s.kind == "collective"] == [2e6] * 4
    expect = max(n * c, n * m) + min(c, m)
    assert _makespan(steps, c, m) == pytest.approx(expect, rel=1e-9)
    assert expect == pytest.approx(c + m + (n - 1) * max(c, m), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(c=st.floats(1e-6, 1e-2), m=st.floats(1e-6, 1e-2), norm=st.floats(0.0, 1e-3),
       tp=st.sampled_from([2, 4, 8]))
def test_pre_overlap_is_max_of_compute_and_comm_plus_one_chunk(c, m, norm, tp):
    # SP all-gather before a column-parallel GEMM: ring exchange, tp chunks, after its producer
    ag = CommSpec("tp", "allgather", 8e6, "tp", "x.f.ag")
    point = CommPoint("x.gemm", fwd=(ag,), consumers=("x.gemm",))
    steps = PassBuilder(MODEL, ParallelLayout(tp=tp, sp=True), overlap=ON).forward(
        [_block(point, with_norm=True)], zero3=False)
    assert sum(s.kind == "collective" for s in steps) == tp
    assert _makespan(steps, c, m, norm) == pytest.approx(norm + max(tp * c, tp * m) + min(c, m), rel=1e-9)


def test_without_the_option_nothing_is_chunked():
    spec = CommSpec("tp", "reducescatter", 8e6, "tp", "x.g.rs")
    steps = PassBuilder(MODEL, ParallelLayout(tp=4, sp=True)).forward(
        [_block(CommPoint(END, fwd=(spec,)), with_norm=False)], zero3=False)
    assert [s.kind for s in steps] == ["compute", "collective"]
    assert _makespan(steps, 1.0, 2.0) == 3.0


def test_chunks_keep_flops_and_bytes_of_activations():
    k = KernelBuilder(MODEL).matmul("g", 1000, 512, 256)
    parts = chunk_kernel(k, 3, 16)
    assert [p.shape[0] for p in parts] == [334, 333, 333]
    assert sum(p.flops for p in parts) == pytest.approx(k.flops)
    assert sum(p.bytes_written for p in parts) == pytest.approx(k.bytes_written)
    # every chunk reads the whole weight again
    assert sum(p.bytes_read for p in parts) == pytest.approx(k.bytes_read + 2 * 256 * 512 * 2)
    assert {p.reserved_sms for p in parts} == {16}


def test_sm_share_is_transformer_engines_default():
    # TE initialize_ub: pipeline num_sm=16 with set_sm_margin; ring_exchange num_sm=1 on copy engines
    assert method_for("post", "reducescatter").reserved_sms == 16
    assert method_for("post", "allreduce").reserved_sms == 16
    assert method_for("pre", "allgather").reserved_sms == 0
    assert method_for("pre", "reducescatter") is None


def test_reserved_sms_slow_a_compute_bound_gemm_by_the_sm_share():
    cal = load_calibration()
    dm = DeviceModel.for_device("H100", "bf16", cal)
    m = n = k = 16384
    full = dm.kernel_time("matmul", (m, n, k), 2.0 * m * n * k, 0.0)
    taken = dm.kernel_time("matmul", (m, n, k), 2.0 * m * n * k, 0.0, reserved_sms=16)
    sms = SM_COUNT["H100"]
    assert sms == 132
    # the GEMM runs on 116 of 132 SMs: ≈ 132/116 = 1.138 times longer (wave quantization aside)
    assert taken / full == pytest.approx(sms / (sms - 16), rel=0.02)
    expect = gemm_time(m, n, k, 1, dm.peak * (sms - 16) / sms, sms - 16, dm._c.gemm,
                       hbm_bw=dm.device.hbm_bw, memory_efficiency=dm._c.memory_efficiency)
    assert taken == pytest.approx(expect + dm.launch_overhead, rel=1e-12)
    with pytest.raises(DessimError, match="reserved_sms"):
        dm.kernel_time("matmul", (m, n, k), 1.0, 0.0, reserved_sms=sms)
    # the kernel field reaches the device model through the generators' timer
    kb = KernelBuilder(MODEL).matmul("g", m, n, k)
    timer = KernelTimer("bf16", cal)
    assert timer("H100", chunk_kernel(kb, 1, 16)[0]) > timer("H100", chunk_kernel(kb, 1, 0)[0])


# ---------------------------------------------------------------- worked example (golden)
#: docs/comp-comm-overlap.md, "Tensor-parallel overlap": GPT-3 175B layers, tp=8 on one
#: DGX H100, micro-batch 4 (iteration_s, exposed TP s, compute s).
GOLDEN_TP = {
    (True, False): (0.043611515378223054, 0.0060997222054054185, 0.03751179317281764),
    (True, True): (0.04183478015709069, 0.00172646023287306, 0.04010831992421763),
    (False, False): (0.04336178057988406, 0.0032207222130365633, 0.0401410583668475),
    (False, True): (0.042384635283981974, 0.0015967645465762596, 0.04078787073740571),
}


def _tp_example(sp: bool, overlap: bool):
    return simulate_workload("gpt3-175b", "dgx-h100:nodes=1", overrides={
        "model": {"layers": 2}, "parallelism": {"tp": 8, "sp": sp, "pp": 1},
        "training": {"global_batch": 4, "micro_batch": 4, "tp_comm_overlap": overlap,
                     "schedule": "1f1b", "virtual_stages": 1},
        "generator": {"embedding_head": False, "optimizer": False, "granularity": "layer"}}).summary()


@pytest.mark.parametrize("sp", [True, False])
def test_worked_example_exposed_tp_falls_and_compute_slows(sp):
    off, on = _tp_example(sp, False), _tp_example(sp, True)
    for s, ov in ((off, False), (on, True)):
        assert (s["iteration_s"], s["exposed_comm_s"]["tp"], s["compute_s"]) == pytest.approx(
            GOLDEN_TP[(sp, ov)], rel=1e-9)
        assert s["overlap"] == {"tp_comm_overlap": ov, "fuse_optimizer_allreduce": False}
    # the papers' direction: most exposed TP communication hidden, GEMMs slower, net gain
    assert on["exposed_comm_s"]["tp"] < 0.5 * off["exposed_comm_s"]["tp"]
    assert on["compute_s"] > off["compute_s"]
    assert on["iteration_s"] < off["iteration_s"]


#: docs/comp-comm-overlap.md, "Fused optimizer all-reduce": GPT-3 1.3B on two DGX A100.
GOLDEN_FUSED = {False: 0.5990517617541496, True: 0.579167713416713}   # fp32 gradients (bf16 recipe)


def test_worked_example_fused_optimizer_allreduce():
    got = {}
    for fused in (False, True):
        s = simulate_workload("gpt3-1.3b", "dgx-a100:nodes=2", overrides={
            "training": {"global_batch": 64, "micro_batch": 4, "fuse_optimizer_allreduce": fused}}).summary()
        got[fused] = s["iteration_s"]
        assert s["overlap"]["fuse_optimizer_allreduce"] is fused
    assert got == pytest.approx(GOLDEN_FUSED, rel=1e-9)
    assert got[True] < got[False]


def test_fused_optimizer_emits_per_bucket_update_and_gather():
    from dessim.workload.transformer.plan import plan_workload
    from dessim.workload.transformer.generator import build_taskgraph

    plan, topo = plan_workload("gpt3-1.3b", "dgx-a100:nodes=1", overrides={
        "training": {"global_batch": 16, "micro_batch": 2, "fuse_optimizer_allreduce": True},
        "generator": {"fold": False, "granularity": "layer"}})
    g = build_taskgraph(plan, topo)
    r0 = [t for t in g if t.rank == 0]
    reds = [t for t in r0 if t.category == "dp" and t.op == "reducescatter"]
    gathers = [t for t in r0 if t.category == "dp" and t.op == "allgather"]
    steps = [t for t in r0 if t.category == "optimizer"]
    assert reds and len(reds) == len(gathers) == len(steps)
    assert not [t for t in r0 if t.op == "allreduce"]
    # each update waits for its own bucket's reduce-scatter, not for the last one
    for red, step in zip(reds, steps):
        assert red.id in g.deps(step.id)


def test_options_are_checked_and_reach_the_summary():
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides={"training": {"tp_comm_overlap": "yes"}})
    with pytest.raises(WorkloadError, match="fuse_optimizer_allreduce needs zero_stage"):
        simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1",
                          overrides={"training": {"fuse_optimizer_allreduce": True, "zero_stage": 3}})
    with pytest.raises(WorkloadError):
        OverlapOptions(tp_comm_overlap=1)  # type: ignore[arg-type]
    s = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides={
        "tp": 2, "sp": True, "tp_comm_overlap": True, "global_batch": 16}).summary()
    assert s["overlap"]["tp_comm_overlap"] is True
    assert not math.isnan(s["iteration_s"])


def test_cli_flag_and_sweep_axis(tmp_path):
    from click.testing import CliRunner
    from dessim.cli.main import cli
    from dessim.sweep import run_sweep

    out = CliRunner().invoke(cli, ["simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--tp", "2", "--sp",
                                   "--global-batch", "16", "--tp-comm-overlap"])
    assert out.exit_code == 0, out.output
    assert "TP comm overlap on" in out.output
    spec = tmp_path / "s.yaml"
    spec.write_text("kind: workload\nbase:\n  workload: gpt3-1.3b\n  topology: dgx-h100:nodes=1\n"
                    "  overrides: {parallelism: {tp: 2, sp: true}, training: {global_batch: 16}}\n"
                    "axes:\n  workload.training.tp_comm_overlap: [false, true]\n")
    table = run_sweep(spec, workers=1, out=tmp_path / "r.parquet").table
    assert list(table["overlap.tp_comm_overlap"]) == [False, True]
    assert table["exposed_comm_s.tp"].iloc[1] < table["exposed_comm_s.tp"].iloc[0]


def test_engine_replay_of_the_chunked_pipeline_equals_the_closed_form_timeline():
    # layer granularity: every chunk collective simulated by the engine on the network;
    # stage granularity: the pass replayed in closed form (stage_passes.pass_timeline) with
    # isolated-island collective times — the two must agree with overlap on
    def run(gran: str) -> dict:
        return simulate_workload("gpt3-175b", "dgx-h100:nodes=1", overrides={
            "model": {"layers": 2}, "parallelism": {"tp": 8, "sp": True, "pp": 1},
            "training": {"global_batch": 4, "micro_batch": 2, "tp_comm_overlap": True,
                         "schedule": "1f1b", "virtual_stages": 1},
            "generator": {"granularity": gran, "fold": False}}).summary()
    layer, stage = run("layer"), run("stage")
    assert stage["shortcuts"]["stage_merged"] and not layer["shortcuts"]["stage_merged"]
    assert stage["iteration_s"] == pytest.approx(layer["iteration_s"], rel=1e-12)
    assert stage["exposed_comm_s"]["tp"] == pytest.approx(layer["exposed_comm_s"]["tp"], rel=1e-9)


#: examples/comp-comm-overlap/sweep.yaml (docs/comp-comm-overlap.md, "Where it pays"):
#: (micro-batch, overlap) -> (iteration_s, exposed TP s)
GOLDEN_SWEEP = {
    (1, False): (0.011060945987261383, 0.001814730551351351),
    (1, True): (0.012137790490457613, 0.0006997603118490114),
    (2, False): (0.021159190215642287, 0.003243061102702705),
    (2, True): (0.02180083063396889, 0.001124547780123772),
    (4, False): (0.04149708707650317, 0.00609972220540541),
    (4, True): (0.03972035185537082, 0.0017264602328730867),
}


def test_example_sweep_shows_where_overlap_pays():
    from pathlib import Path

    from dessim.sweep import run_sweep

    spec = Path(__file__).resolve().parent.parent / "examples" / "comp-comm-overlap" / "sweep.yaml"
    table = run_sweep(spec, workers=1).table
    got = {(int(r["workload.training.micro_batch"]), bool(r["workload.training.tp_comm_overlap"])):
           (r["iteration_s"], r["exposed_comm_s.tp"]) for _, r in table.iterrows()}
    assert got.keys() == GOLDEN_SWEEP.keys()
    for k, v in GOLDEN_SWEEP.items():
        assert got[k] == pytest.approx(v, rel=1e-9)
    for mb in (1, 2, 4):        # exposed TP always falls by more than half ...
        assert got[(mb, True)][1] < 0.5 * got[(mb, False)][1]
    # ... but the chunked GEMMs only pay for themselves at the larger micro-batch
    assert got[(1, True)][0] > got[(1, False)][0] and got[(4, True)][0] < got[(4, False)][0]
