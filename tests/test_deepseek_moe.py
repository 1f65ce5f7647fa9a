"""DeepSeek-style MoE (fine-grained and shared experts, dense first layers), MLA, MTP, MoE
routing loads, FP8 recipes and the rail all-to-all (issue 18)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.collectives.algorithms import build_schedule
from dessim.engine.device import DeviceModel
from dessim.errors import DessimError, SpecError, WorkloadError
from dessim.topology import load_topology
from dessim.workload import load_workload
from dessim.workload.transformer.flops import closed_form_flops, model_flops_per_iteration
from dessim.workload.transformer.kernels import layer_kernels, routed_tokens
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.memory import estimate_memory, layer_params_on_gpu
from dessim.workload.transformer.mla import MLAConfig
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.passes import PassBuilder, Block, layer_points
from dessim.workload.transformer.routing import MoERouting, read_counts
from dessim.workload.transformer.spec import parse_workload

DS = load_workload("deepseek-v3")


# ------------------------------------------------------------------ parameters
def test_deepseek_v3_total_is_the_published_671b():
    assert DS.model.num_params(include_mtp=False) == pytest.approx(671e9, rel=0.005)


def test_deepseek_v3_active_rounds_to_the_published_37b():
    # "37B activated" has two significant digits: 0.5 % cannot be asserted on it. DeepSeek's
    # figure leaves the input embedding (a lookup) out, as the DeepSeek-V2 figure (21B) does.
    m = DS.model
    active = m.num_active_params(include_mtp=False) - m.embedding_params()
    assert round(active / 1e9) == 37


def test_deepseek_v3_with_its_mtp_module_is_the_released_checkpoint():
    # Hugging Face deepseek-ai/DeepSeek-V3: 685B = 671B main + 14B MTP, the MTP module
    # stored with its own copies of the embedding and LM head
    m = DS.model
    copies = m.embedding_params() + m.head_params()
    assert m.num_params() + copies == pytest.approx(685e9, rel=0.005)


def test_mla_parameters_are_the_released_weight_shapes():
    # modeling_deepseek.py weight shapes for hidden 7168, 128 heads
    h, H = 7168, 128
    shapes = [h * 1536, 1536, 1536 * H * 192, h * (512 + 64), 512, 512 * H * (128 + 128), H * 128 * h]
    assert DS.model.mla.params(h, H) == sum(shapes)
    assert DS.model.attention_params() == sum(shapes)


def test_dense_layers_and_shared_experts_in_the_breakdown():
    m = DS.model
    mlp = m.param_breakdown()["mlp"]
    expert = 3 * 7168 * 2048
    assert mlp == 58 * ((256 + 1) * expert + 7168 * 256) + 3 * 3 * 7168 * 18432


# ------------------------------------------------------------------ FLOPs
def _small(**kw) -> TransformerConfig:
    base = dict(name="tiny", layers=4, hidden=256, heads=4, ffn_hidden=512, vocab=1000,
                seq_len=128, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                bias=False, dropout=False, tied_embeddings=False, experts=8, top_k=2,
                moe_ffn_hidden=64, dense_layers=1, shared_experts=1,
                mla=MLAConfig(32, 16, 32, 32, 48), mtp_modules=1)
    base.update(kw)
    return TransformerConfig(**base)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(2, 6), dense=st.integers(0, 1), shared=st.integers(0, 2),
       top_k=st.integers(1, 4), q_lora=st.sampled_from([0, 32]), mtp=st.integers(0, 2),
       batch=st.integers(1, 3), mla=st.booleans())
def test_kernel_flops_equal_the_closed_form(layers, dense, shared, top_k, q_lora, mtp, batch, mla):
    m = _small(layers=layers, dense_layers=dense, shared_experts=shared, top_k=top_k,
               mla=MLAConfig(32, 16, 32, 32, q_lora) if mla else None, mtp_modules=mtp)
    assert model_flops_per_iteration(m, batch) == pytest.approx(closed_form_flops(m, batch), rel=1e-12)


def test_closed_form_reduces_to_the_dense_one_without_deepseek_features():
    plain = _small(dense_layers=0, shared_experts=0, mla=None, mtp_modules=0)
    h, s, f, E, k = 256, 128, 64, 8, 2
    kv = plain.kv_dim
    per_layer = 6 * (2 * h * h + 2 * h * kv) + 12 * s * h + 6 * k * 3 * h * f + 6 * h * E
    per_token = 4 * per_layer + 6 * h * 1000
    assert closed_form_flops(plain, 1) == pytest.approx(s * per_token)


# ------------------------------------------------------------------ routing
def test_uniform_routing_is_balanced():
    r = MoERouting()
    assert r.load_factor(256, 64) == pytest.approx(1.0) and r.dropped_fraction(256) == 0


def test_zipf_load_factor_is_the_hottest_ranks_share():
    r = MoERouting("zipf", exponent=1.0)
    w = [1 / (i + 1) for i in range(8)]
    assert r.load_factor(8, 4) == pytest.approx((w[0] + w[1]) / sum(w) * 4)
    assert MoERouting("zipf", exponent=0.0).load_factor(8, 4) == pytest.approx(1.0)


def test_dropless_skewed_routing_costs_no_extra_token_copy():
    """Without a capacity limit every routed copy is processed once, whatever the skew: on one
    EP rank (and in the unsharded model FLOPs) the copies are exactly ``top_k·T``. The zipf
    shares of 8 experts sum to 1 + 2.2e-16 in floating point; rounding that load factor up
    counted one token copy more than routed (sanity3 hunt: 8193 copies of 4096 tokens x
    top-2, and model FLOPs 4.2e9 above uniform routing's for a 4-layer Mixtral-width model)."""
    m = _small(dense_layers=0, shared_experts=0, mla=None, mtp_modules=0)
    for routing in (MoERouting("zipf", exponent=1.0), MoERouting("zipf", exponent=1.3),
                    MoERouting("counts", counts=(1, 2, 3, 4, 5, 6, 7, 8))):
        skewed = dataclasses.replace(m, routing=routing)
        assert routed_tokens(skewed, ParallelLayout(), 4096) == 8192
        assert model_flops_per_iteration(skewed, 4) == model_flops_per_iteration(m, 4)
        assert routing.dropped_fraction(8) == 0.0


def test_capacity_factor_caps_the_load_and_reports_drops():
    r = MoERouting("counts", counts=(5, 1, 1, 1), capacity_factor=1.25)
    # expert 0 holds 5/8 of the copies, capacity 1.25/4: the excess is dropped
    assert r.dropped_fraction(4) == pytest.approx(5 / 8 - 1.25 / 4)
    assert r.load_factor(4, 4) == pytest.approx(1.25)


def test_counts_from_a_file(tmp_path):
    f = tmp_path / "counts.txt"
    f.write_text("# tokens per expert\n10\n30\n")
    assert read_counts(str(f), "routing.counts") == (10.0, 30.0)
    with pytest.raises(WorkloadError, match="does not exist"):
        read_counts(str(tmp_path / "none.txt"), "routing.counts")


def test_imbalanced_routing_makes_the_experts_and_all_to_all_bigger():
    lo = ParallelLayout(ep=4, dp=4)
    m = _small(experts=8, top_k=2)
    hot = dataclasses.replace(m, routing=MoERouting("zipf", exponent=1.2))

    def expert_rows(model):
        ks = layer_kernels(model, lo)
        return next(k.shape[0] for k in ks.forward if k.name == "moe.expert.gate")

    assert expert_rows(hot) > expert_rows(m) == 2 * 128
    sizes = [next(p.fwd[0].size for p in layer_points(x, lo, layer_kernels(x, lo))
                  if p.fwd and p.fwd[0].label == "moe.dispatch") for x in (m, hot)]
    assert sizes[1] > sizes[0]


@pytest.mark.parametrize("routing, match", [
    ({"distribution": "pareto"}, "distribution"),
    ({"distribution": "counts", "counts": [1, 2]}, "2 counts given for 8 experts"),
    ({"capacity_factor": 0}, "capacity_factor"),
    ({"counts": [1, 2]}, "set distribution: counts"),
    # a token picks top_k distinct experts: one expert with tokens cannot serve top_k = 2
    ({"distribution": "counts", "counts": [5, 0, 0, 0, 0, 0, 0, 0]}, "fewer than top_k=2"),
])
def test_bad_routing_is_a_clear_error(routing, match):
    doc = {"name": "t", "model": {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128,
                                  "vocab": 100, "seq_len": 32, "experts": 8, "top_k": 2,
                                  "routing": routing},
           "parallelism": {"ep": 2, "dp": 2}, "training": {"global_batch": 2}}
    with pytest.raises(SpecError, match=match):
        parse_workload(doc, "t.yaml")


def test_bad_mla_is_a_clear_error():
    doc = {"name": "t", "model": {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128,
                                  "vocab": 100, "seq_len": 32, "mla": {"kv_lora_rank": 16}},
           "training": {"global_batch": 2}}
    with pytest.raises(SpecError, match="mla: lacks qk_rope_head_dim"):
        parse_workload(doc, "t.yaml")


# ------------------------------------------------------------------ shared-expert overlap
def test_shared_experts_run_while_the_dispatch_is_in_flight():
    lo = ParallelLayout(ep=2, dp=2)
    m = _small()
    ks = layer_kernels(m, lo)
    block = Block("L1", ks, tuple(layer_points(m, lo, ks)), (0.0, 0.0))
    steps = PassBuilder(m, lo).forward([block], False)
    idx = {s.name: i for i, s in enumerate(steps)}
    dispatch = idx["moe.dispatch"]
    assert dispatch not in steps[idx["moe.shared.gate"]].deps        # shared: no wait
    assert dispatch in steps[idx["moe.expert.gate"]].deps             # routed experts wait
    back = PassBuilder(m, lo).backward([block], False)
    bidx = {s.name: i for i, s in enumerate(back)}
    b_dispatch = bidx["moe.dispatch"]
    assert b_dispatch > bidx["moe.expert.gate.dgrad"]
    assert b_dispatch not in back[bidx["moe.shared.down.dgrad"]].deps
    assert b_dispatch in back[bidx["moe.permute.bwd"]].deps


# ------------------------------------------------------------------ FP8
def test_fp8_on_a_gpu_without_fp8_is_refused_before_simulating():
    from dessim.workload.api import simulate_workload
    with pytest.raises(DessimError, match="fp8 tensor cores"):
        simulate_workload("gpt3-1.3b", "dgx-a100:nodes=1",
                          overrides={"model": {"precision": "fp8"}})


def test_fp8_gemms_run_at_the_fp8_peak_and_keep_the_head_in_bf16():
    m = dataclasses.replace(load_workload("llama3-8b").model, precision="fp8-block")
    ks = layer_kernels(m, ParallelLayout())
    names = {k.name: k for k in ks.forward}
    assert names["attn.qkv"].precision == "" and names["attn.qkv"].bytes_read < \
        layer_kernels(dataclasses.replace(m, precision="bf16"), ParallelLayout()).forward[1].bytes_read
    h100 = DeviceModel.for_device("H100", "fp8-block")
    shape = (8192, 8192, 8192)
    fp8 = h100.kernel_time("matmul", shape, 2 * 8192 ** 3, 0)
    bf16 = h100.kernel_time("matmul.bf16", shape, 2 * 8192 ** 3, 0)
    assert fp8 < 0.6 * bf16


def test_block_scaling_quantizes_with_more_bytes_than_per_tensor():
    lo = ParallelLayout()
    base = load_workload("llama3-8b").model
    q = {}
    for p in ("fp8", "fp8-block"):
        ks = layer_kernels(dataclasses.replace(base, precision=p), lo)
        q[p] = next(k for k in ks.forward if k.name == "attn.quant_in")
    n = 8192 * 4096      # seq_len x hidden
    assert q["fp8"].bytes_written == pytest.approx(n + 4)
    assert q["fp8-block"].bytes_written == pytest.approx(n * (1 + 4 / 128))


@pytest.mark.parametrize("schedule,copies", [("1f1b", 1), ("dualpipe", 2)])
def test_fp8_block_memory_counts_deepseek_v3_states(schedule, copies):
    lo = DS.layout(schedule=schedule)
    est = estimate_memory(DS.model, lo, DS.memory_options(), stage=3)
    dense, expert = layer_params_on_gpu(DS.model, lo)
    # ZeRO-1: bf16 weights 2, fp32 gradients 4 per parameter; fp32 master + bf16 moments = 8
    # sharded over dp (dense) and edp (experts) — and over DualPipe's two copies of a piece
    # (stage 3 holds pieces 3 and 12 there)
    layers = sum(len(c) for c in lo.stage_layers(61, 3))
    assert est.weights == pytest.approx(2 * layers * (dense + expert))
    assert est.gradients == pytest.approx(4 * layers * (dense + expert))
    assert est.optimizer == pytest.approx(8 * layers * (dense / 128 + expert / 2) / copies)
    assert est.total < 80e9


def test_deepseek_v3_preset_runs_dualpipe_and_fits_the_h800():
    """The report's schedule (§3.2.1) with its two parameter copies fits 80 GB (stage 0, the
    largest: both ends of the model, the embedding and the LM head with MTP)."""
    lo = DS.layout()
    assert lo.pipeline.bidirectional
    est = estimate_memory(DS.model, lo, DS.memory_options())
    assert est.stage in (0, 15) and est.total < 80e9 * 0.94


# ------------------------------------------------------------------ rail all-to-all
def test_rail_all_to_all_carries_flat_bytes_over_same_rail_flows():
    topo = load_topology("dgx-h100:nodes=4")
    group = tuple(range(32))
    size = 32e6
    sched = build_schedule("alltoall", "rail", group, size, topology=topo)
    net = [t for t in sched.transfers if t.src // 8 != t.dst // 8]
    assert all(t.src % 8 == t.dst % 8 for t in net)                  # one rail each
    assert sum(t.nbytes for t in net) == pytest.approx(32 * size * 3 / 4)
    flat = build_schedule("alltoall", "direct", group, size, topology=topo)
    assert sum(t.nbytes for t in flat.transfers if t.src // 8 != t.dst // 8) == \
        pytest.approx(32 * size * 3 / 4)
    assert len(net) < len([t for t in flat.transfers if t.src // 8 != t.dst // 8])


@pytest.mark.parametrize("share", [1.0, 0.45])
def test_pipelined_rail_all_to_all_overlaps_its_two_phases(share):
    """``pipeline_chunks`` K: the same bytes on the same rail-aligned connections, in K
    independent two-phase exchanges; the time falls from about network + NVLink phase towards
    the slower phase plus 1/K of the faster (plus K steps' latencies), never below the slower."""
    from dessim.collectives.api import run_collective

    topo = load_topology("dgx-h100:nodes=4")
    group, size = tuple(range(32)), 512e6

    def bytes_of(sched, cross):
        return sum(t.nbytes for t in sched.transfers if (t.src // 8 != t.dst // 8) == cross)

    one = build_schedule("alltoall", "rail", group, size, topology=topo, network_share=share)
    eight = build_schedule("alltoall", "rail", group, size, topology=topo, network_share=share,
                           pipeline_chunks=8)
    for cross in (True, False):
        assert bytes_of(eight, cross) == pytest.approx(bytes_of(one, cross))
    assert len(eight.transfers) == 8 * len(one.transfers)

    def time(ranks, **opts):
        return run_collective("alltoall", size, topo, algo="rail", ranks=list(ranks),
                              network_share=share, **opts).time_s

    # each phase alone, with the same bytes per pair: one GPU per host (network), one host (NVLink)
    net, nvl = time([0, 8, 16, 24]), time(range(8))
    serial, piped = time(group), time(group, pipeline_chunks=8)
    assert serial == pytest.approx(net + nvl, rel=0.02)
    assert max(net, nvl) <= piped < max(net, nvl) + min(net, nvl) / 2


def test_bad_rail_options_are_refused():
    topo = load_topology("dgx-h100:nodes=2")
    with pytest.raises(DessimError, match="pipeline_chunks=0"):
        build_schedule("alltoall", "rail", tuple(range(16)), 1e6, topology=topo, pipeline_chunks=0)
    with pytest.raises(DessimError, match="network_share=1.5"):
        build_schedule("alltoall", "rail", tuple(range(16)), 1e6, topology=topo, network_share=1.5)


def test_rail_all_to_all_needs_equal_ranks_per_host():
    with pytest.raises(DessimError, match="unevenly"):
        build_schedule("alltoall", "rail", tuple(range(12)), 1e6,
                       topology=load_topology("dgx-h100:nodes=2"))


def test_deepseek_v3_preset_is_the_published_layout():
    lo = DS.layout()
    assert (lo.tp, lo.pp, lo.dp, lo.ep, lo.zero_stage) == (1, 16, 128, 64, 1)
    assert lo.world_size == 2048 and DS.training.device == "H800"
    assert DS.model.precision == "fp8-block"


@pytest.mark.parametrize("dispatch, algo", [("nccl", "auto"), ("deepep", "rail")])
def test_moe_dispatch_chooses_the_all_to_all(dispatch, algo):
    from dessim.workload.transformer.generator import _Generator, make_plan
    topo = load_topology("dgx-h100:nodes=2")
    m = _small(layers=2, dense_layers=0, mtp_modules=0, experts=16)
    # one EP group of 16 ranks over both nodes
    lo = ParallelLayout(dp=16, ep=16, global_batch=16, moe_dispatch=dispatch).validate(m)
    plan = make_plan(m, lo, topo, device="H100")
    assert _Generator(plan, topo).ep_algo == algo


def test_unknown_moe_dispatch_is_refused():
    with pytest.raises(WorkloadError, match="moe_dispatch='nvshmem'"):
        ParallelLayout(moe_dispatch="nvshmem")


def test_a_counts_file_is_named_relative_to_the_workload_file(tmp_path, monkeypatch):
    # as hf_config is: the file names its neighbour, whatever folder dessim runs from
    import yaml

    root = Path(__file__).resolve().parents[1]
    doc = yaml.safe_load((root / "workloads/mixtral-8x7b.yaml").read_text())
    doc["model"]["routing"] = {"distribution": "counts", "counts": "load.txt"}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "sub" / "load.txt").write_text("# tokens per expert\n" + "\n".join(map(str, range(1, 9))))
    monkeypatch.chdir(tmp_path)              # not the workload's folder
    spec = load_workload("sub/w.yaml")
    assert spec.model.routing.counts == tuple(float(i) for i in range(1, 9))
