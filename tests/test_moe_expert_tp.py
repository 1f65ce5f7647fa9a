"""A separate expert tensor-parallel size (``parallelism.etp``, Megatron-core's
``expert_tensor_parallel_size``; issue 18): "MoE parallel folding" refolds each pipeline
stage's ``tp·cp·dp`` ranks into ``etp × ep × edp`` for the expert layers
(``megatron/core/parallel_state.py`` at NVIDIA/Megatron-LM d98e8a6: the expert
``RankGenerator(tp=etp, ep=ep, dp=world // (etp·ep·pp), pp=pp, cp=1, order=...)``).

The tiny case: 2 nodes × 8 H100s, TP 4 with SP, DP 4, 32 experts top-4, hidden 512,
``T = 512`` tokens per rank before SP (128 after). With ``etp = 1, ep = 8`` each rank
dispatches the copies of its 128 tokens and its experts run at full width on what arrives;
with ``etp = 2, ep = 8`` the expert-TP pair all-gathers what the all-to-all delivered."""

from __future__ import annotations

import hashlib
import math
import json
from itertools import product

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli as main
from dessim.errors import DessimError, WorkloadError
from dessim.topology import load_topology
from dessim.workload.transformer.generator import build_taskgraph, lane_permutations
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.megatron import megatron_workload
from dessim.workload.transformer.memory import estimate_memory, layer_params_on_gpu, params_on_gpu
from dessim.workload.transformer.spec import parse_workload
from tests.moe_helpers import moe_doc
from tests.test_moe_alltoall_tp import _layer0

H, T, K, E, TP = 512, 512, 4, 32, 4
FFN = H // 2                        # moe_ffn_hidden of moe_doc
TSP = T // TP                       # a rank's sequence-parallel tokens: 128


def _spec(**par):
    doc = moe_doc({}, "nccl", hidden=H, experts=E, top_k=K, ranks=4)
    doc["model"].update({"activation": "swiglu", "bias": False})
    doc["parallelism"].update({"tp": TP, "sp": True, **par})
    doc["training"]["global_batch"] = 4
    return parse_workload(doc, "t")


def _megatron_expert_groups(tp: int, cp: int, dp: int, pp: int, etp: int, ep: int,
                            kind: str) -> list[tuple[int, ...]]:
    """Megatron-core's expert groups, computed independently: rank = etp_i + etp·(ep_i +
    ep·(edp_i + edp·pp_i)) (``order`` "tp-ep-dp-pp", cp = 1 in the expert grid)."""
    world = tp * cp * dp * pp
    edp = world // (etp * ep * pp)
    sizes = {"etp": etp, "ep": ep, "edp": edp, "pp": pp}
    varying = {"etp": ("etp",), "ep": ("ep",), "edp": ("edp",), "tp_ep": ("etp", "ep")}[kind]
    groups: dict[tuple, list[int]] = {}
    for c in product(*(range(sizes[d]) for d in ("etp", "ep", "edp", "pp"))):
        coord = dict(zip(("etp", "ep", "edp", "pp"), c))
        rank = coord["etp"] + etp * (coord["ep"] + ep * (coord["edp"] + edp * coord["pp"]))
        key = tuple(v for d, v in coord.items() if d not in varying)
        groups.setdefault(key, []).append(rank)
    return sorted(tuple(sorted(g)) for g in groups.values())


@pytest.mark.parametrize("tp, cp, dp, pp, etp, ep", [
    (4, 1, 4, 2, 1, 8), (4, 1, 4, 2, 2, 8), (8, 1, 1, 2, 1, 8), (2, 2, 2, 1, 1, 4), (1, 2, 4, 2, 2, 2)])
def test_expert_groups_are_megatron_cores(tp, cp, dp, pp, etp, ep):
    """ETP, EP, expert-DP and TP × EP groups equal Megatron-core's expert rank generator's;
    the attention groups stay those of tp × cp × dp × pp, and every rank's expert-DP group
    has world / (etp·ep·pp) members."""
    lo = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep, sp=tp > 1)
    for kind in ("etp", "ep", "edp", "tp_ep"):
        assert list(lo.groups(kind)) == _megatron_expert_groups(tp, cp, dp, pp, etp, ep, kind), kind
        assert all(lo.group_of(g[0], kind) == g for g in lo.groups(kind))
    plain = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, sp=tp > 1)
    for kind in ("tp", "cp", "dp", "pp", "dp_cp"):
        assert lo.groups(kind) == plain.groups(kind), kind
    assert lo.edp == lo.world_size // (etp * ep * pp)
    assert {len(g) for g in lo.groups("edp")} == {lo.edp}


def test_unset_or_equal_etp_is_the_old_layout():
    """``etp`` unset or equal to ``tp``: the same groups as before it existed (EP carved out
    of DP), and the same task graph."""
    old = ParallelLayout(tp=2, dp=8, ep=4, sp=True)
    same = ParallelLayout(tp=2, dp=8, ep=4, sp=True, etp=2)
    assert not same.separate_expert_tp and same.expert_tp == 2
    for kind in ("tp", "ep", "edp", "tp_ep", "dp"):
        assert old.groups(kind) == same.groups(kind)
    assert same.groups("etp") == old.groups("tp")
    spec = _spec()
    topo = load_topology("dgx-h100:nodes=2")

    def digest(lay):
        g = build_taskgraph((spec.model, lay), topo)
        return hashlib.sha256(repr([(t.name, t.op, t.size, t.group, t.duration) for t in g]).encode()).hexdigest()

    base = spec.layout(16)
    assert digest(base) == digest(spec.layout(16, etp=TP))


@pytest.mark.parametrize("etp", [1, 2, 4])
def test_expert_gemms_are_sliced_by_etp(etp):
    """The grouped expert GEMMs run on the copies of the expert-TP group's ``etp·T/tp``
    tokens (``top_k·etp·128`` rows), ``moe_ffn_hidden/etp`` wide, ``E/ep`` experts; their
    FLOPs per rank do not depend on ``etp`` (``2·top_k·T/tp·h·ffn`` per matrix). The shared
    experts and attention keep TP's slices."""
    ep = 16 // etp
    lo = ParallelLayout(tp=TP, dp=4, ep=ep, etp=etp, sp=True, global_batch=4)
    spec = _spec()
    by = {k.name: k for k in layer_kernels(spec.model, lo).forward}
    rows = K * TSP * etp
    assert by["moe.expert.up"].shape == (rows, FFN // etp, H)
    assert by["moe.expert.down"].shape == (rows, H, FFN // etp)
    assert by["moe.expert.up"].groups == E // ep
    assert by["moe.expert.up"].flops == 2 * K * TSP * H * FFN
    assert by["moe.router"].shape[0] == TSP
    assert by["attn.proj"].shape == (T, H, H // TP)


def _comm(graph, phase):
    return [(t.name.split()[2], t.op, t.size, t.group) for t in _layer0(graph, phase)
            if t.kind == "collective" and t.name.split()[2].startswith(("moe.", "attn."))]


def test_etp1_dispatches_the_sp_shard_with_no_expert_tp_collective():
    """ETP 1, EP 16 on 16 GPUs (TP 4, DP 4): forward, the attention's TP all-gather and
    reduce-scatter over the TP group (ranks 0-3), the all-to-all of the 512 copies of rank 0's
    128 tokens over all 16 ranks (EP spans TP × DP), no expert-TP all-gather or
    reduce-scatter, then the combine all-to-all; backward the same two all-to-alls."""
    topo = load_topology("dgx-h100:nodes=2")
    g = build_taskgraph(_spec(etp=1, ep=16), topo)
    ep, tp = tuple(range(16)), (0, 1, 2, 3)
    assert _comm(g, "fwd") == [("attn.f.ag", "allgather", T * H * 2, tp),
                               ("attn.g.rs", "reducescatter", T * H * 2, tp),
                               ("moe.dispatch", "alltoall", K * TSP * H * 2, ep),
                               ("moe.combine", "alltoall", K * TSP * H * 2, ep)]
    assert [c[:3] for c in _comm(g, "bwd") if c[0].startswith("moe.")] == [
        ("moe.combine", "alltoall", K * TSP * H * 2), ("moe.dispatch", "alltoall", K * TSP * H * 2)]


def test_etp2_gathers_over_the_expert_tp_pair():
    """ETP 2, EP 8: the all-to-all over rank 0's EP group (every other rank), then the
    expert-TP all-gather of the pair's ``2·512`` rows over (0, 1); before the combine the
    reduce-scatter of the experts' rows over the pair."""
    topo = load_topology("dgx-h100:nodes=2")
    g = build_taskgraph(_spec(etp=2, ep=8), topo)
    ep, pair = tuple(range(0, 16, 2)), (0, 1)
    moe = [c for c in _comm(g, "fwd") if c[0].startswith("moe.")]
    assert moe == [("moe.dispatch", "alltoall", K * TSP * H * 2, ep),
                   ("moe.dispatch.ag", "allgather", 2 * K * TSP * H * 2, pair),
                   ("moe.combine.rs", "reducescatter", 2 * K * TSP * H * 2, pair),
                   ("moe.combine", "alltoall", K * TSP * H * 2, ep)]


def test_expert_gradients_reduce_over_world_over_etp_ep_pp():
    """The expert weights' gradient reduction runs over the expert-DP group of world /
    (etp·ep·pp) = 16 / (2·4) = 2 ranks (0 and 8), the dense weights' over DP (0, 4, 8, 12)."""
    topo = load_topology("dgx-h100:nodes=2")
    g = build_taskgraph(_spec(etp=2, ep=4), topo, options=None)
    groups = {t.group for t in g if t.rank == 0 and t.category == "dp"}
    assert groups == {(0, 4, 8, 12), (0, 8)}


@pytest.mark.parametrize("etp, ep", [(1, 16), (2, 8), (4, 4), (2, 2)])
def test_memory_splits_expert_weights_and_states_over_etp_ep(etp, ep):
    """Expert parameters per GPU: ``E/ep`` experts of ``3·h·ffn/etp`` (SwiGLU) each; ZeRO-1
    shards their optimizer states over the expert-DP group (16/(etp·ep)), 12 bytes each."""
    spec = _spec(etp=etp, ep=ep)
    lo = spec.layout(16, zero_stage=1)
    _, expert = layer_params_on_gpu(spec.model, lo)
    assert expert == E / ep * 3 * H * FFN / etp
    est = estimate_memory(spec.model, lo)
    dense_total, expert_total = params_on_gpu(spec.model, lo, 0)
    edp = 16 // (etp * ep)
    assert lo.edp == edp and expert_total == spec.model.layers * expert
    assert est.optimizer == pytest.approx(12 * (dense_total / 4 + expert_total / edp), rel=1e-12)


@pytest.mark.parametrize("par, training, match", [
    ({"etp": 2, "ep": 16}, {}, "etp × ep = 2 × 16 does not divide tp × cp × dp = 4 × 1 × 4 = 16"),
    ({"etp": 1, "ep": 16, "sp": False}, {}, "needs sequence parallelism"),
    ({"etp": 8, "ep": 2}, {}, "moe_ffn_hidden=260 is not divisible by etp=8"),
])
def test_impossible_combinations_are_refused(par, training, match):
    doc = moe_doc({}, "nccl", hidden=H, experts=E, top_k=K, ranks=4)
    doc["model"]["moe_ffn_hidden"] = 260
    doc["parallelism"].update({"tp": TP, "sp": True, **par})
    doc["training"].update({"global_batch": 4, **training})
    with pytest.raises(DessimError, match=match):
        parse_workload(doc, "t")


def test_layout_only_checks():
    with pytest.raises(WorkloadError, match="ep=4, etp=1 needs pp last in order"):
        ParallelLayout(tp=2, pp=2, dp=2, ep=4, etp=1, order=("tp", "cp", "pp", "dp"))
    with pytest.raises(WorkloadError, match="etp=0"):
        ParallelLayout(tp=2, etp=0)
    dense = parse_workload({"name": "d", "model": {"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 1024,
                                                   "vocab": 1024, "seq_len": 256}}, "t").model
    with pytest.raises(WorkloadError, match="etp=1 but the model is dense"):
        ParallelLayout(tp=2, dp=2, etp=1, sp=True).validate(dense)


def test_cli_flag_and_error_line(tmp_path):
    """``--etp`` sets it; an impossible value is one ``error:`` line, exit 2."""
    path = tmp_path / "moe.yaml"
    doc = moe_doc({}, "nccl", hidden=H, experts=E, top_k=K, ranks=4)
    doc["parallelism"].update({"tp": TP, "sp": True})
    doc["training"]["global_batch"] = 4
    path.write_text(json.dumps(doc))
    runner = CliRunner()
    ok = runner.invoke(main, ["simulate", str(path), "--topology", "dgx-h100:nodes=2", "--etp", "1", "--ep", "16",
                              "--no-comm", "--json"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["simulate", str(path), "--topology", "dgx-h100:nodes=2", "--etp", "2", "--ep", "16"])
    assert bad.exit_code == 2
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "etp × ep" in lines[0]
    show = runner.invoke(main, ["workload", "show", str(path), "--etp", "2", "--ep", "4", "--dp", "4"])
    assert show.exit_code == 0, show.output
    assert "etp [0, 1] [2, 3] ... (8 groups of 2)" in show.output and "edp [0, 8] [1, 9]" in show.output


def test_megatron_flag_maps_to_etp():
    """``--expert-tensor-parallel-size`` (Megatron-LM ``arguments.py``) becomes
    ``parallelism.etp``: TP 8, EP 8, ETP 1 on 8 GPUs — EP folded over the TP ranks."""
    argv = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
            "--micro-batch-size 1 --vocab-size 4096 --num-experts 8 --moe-router-topk 2 "
            "--tensor-model-parallel-size 8 --sequence-parallel --expert-model-parallel-size 8 "
            "--expert-tensor-parallel-size 1 --bf16").split()
    doc = megatron_workload(argv, 8).document
    assert doc["parallelism"]["etp"] == 1
    lo = parse_workload(doc, "m").layout(8)
    assert lo.groups("ep") == (tuple(range(8)),) and lo.groups("etp") == tuple((r,) for r in range(8))


@pytest.mark.parametrize("tp, cp, dp, pp, etp, ep", [(4, 1, 4, 2, 1, 8), (2, 2, 4, 1, 1, 8), (1, 1, 16, 1, 2, 4)])
def test_fold_lanes_map_every_group_kind_onto_its_kind(tp, cp, dp, pp, etp, ep):
    """Replica folding with ``etp != tp``: each lane (a shift of the stage-local index by a
    multiple of lcm(tp·cp, etp·ep)) maps every attention and expert group onto a group of the
    same kind, and the CP ring's next rank onto the next rank; the representatives are the
    first lcm(tp·cp, etp·ep) ranks of each stage."""
    lo = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep, sp=tp > 1)
    perm = lane_permutations(lo)
    period = math.lcm(tp * cp, etp * ep)
    assert perm.shape == (tp * cp * dp // period, lo.world_size)
    for kind in ("tp", "cp", "dp", "pp", "dp_cp", "etp", "ep", "edp", "tp_ep"):
        groups = set(lo.groups(kind))
        for lane in perm:
            assert {tuple(sorted(int(lane[r]) for r in g)) for g in groups} == groups, kind
    for g in lo.groups("cp"):
        for lane in perm:
            assert [int(lane[r]) for r in g] == list(lo.group_of(int(lane[g[0]]), "cp"))
