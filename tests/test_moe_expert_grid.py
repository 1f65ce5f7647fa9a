"""One expert rank grid for every MoE layout (issue 18): Megatron-core builds the expert
layers' groups from the same ``tp·cp·dp·pp`` ranks as the attention's, with its own
``RankGenerator(tp=etp, ep=ep, dp=world // (etp·ep·pp), pp=pp, cp=1, order=...)`` even when
``etp = tp`` (``megatron/core/parallel_state.py`` at NVIDIA/Megatron-LM d98e8a6), so expert
parallelism spans CP × DP: TP 2, CP 2, DP 2, EP 4 is a valid layout, and with CP > 1 the EP
groups take the CP ranks first. The reference below re-derives Megatron-core's rule
independently: ``rank = Σ index · stride`` over the order's dimensions, a group of
``token`` = the ranks that differ only in the token's dimensions."""

from __future__ import annotations

from itertools import product

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli as main
from dessim.engine import EngineOptions
from dessim.errors import WorkloadError
from dessim.workload import simulate_workload
from dessim.workload.transformer.generator import lane_permutations
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.memory import estimate_memory, params_on_gpu


def _rank_generator(sizes: dict[str, int], order: str, token: str) -> list[tuple[int, ...]]:
    """Megatron-core's ``RankGenerator(**sizes, order=order).get_ranks(token)``: the groups
    of ranks that vary only in the dimensions named by ``token`` ("tp-ep", ...)."""
    dims = order.split("-")
    varying = token.split("-")
    strides, step = {}, 1
    for d in dims:
        strides[d] = step
        step *= sizes[d]
    groups: dict[tuple[int, ...], list[int]] = {}
    for idx in product(*(range(sizes[d]) for d in dims)):
        coord = dict(zip(dims, idx))
        rank = sum(coord[d] * strides[d] for d in dims)
        groups.setdefault(tuple(coord[d] for d in dims if d not in varying), []).append(rank)
    return sorted(tuple(sorted(g)) for g in groups.values())


def _megatron_order(order: tuple[str, ...]) -> str:
    """dessim's ``order`` as Megatron-core's string: EP just faster than DP ("tp-cp-ep-dp-pp")."""
    return "-".join(d for dim in order for d in (("ep", "dp") if dim == "dp" else (dim,)))


CASES = [
    # tp, cp, dp, pp, ep, etp, order
    (2, 2, 2, 1, 4, None, ("tp", "cp", "dp", "pp")),     # EP 4 > DP 2: spans CP × DP
    (2, 2, 4, 2, 2, None, ("tp", "cp", "dp", "pp")),     # EP divides DP, but takes the CP pair first
    (2, 2, 4, 1, 8, None, ("tp", "cp", "dp", "pp")),
    (2, 2, 2, 2, 4, None, ("tp", "dp", "cp", "pp")),     # cp after dp: EP over DP, then CP
    (1, 4, 2, 2, 8, None, ("tp", "cp", "dp", "pp")),
    (2, 1, 8, 2, 4, None, ("tp", "cp", "dp", "pp")),     # cp = 1: EP carved out of DP, as before
    (2, 1, 4, 1, 2, None, ("dp", "tp", "cp", "pp")),
    (4, 1, 4, 2, 8, 1, ("tp", "cp", "dp", "pp")),        # etp != tp (MoE parallel folding)
    (2, 2, 2, 1, 4, 1, ("tp", "cp", "dp", "pp")),
    (2, 1, 4, 1, 4, 1, ("dp", "tp", "cp", "pp")),        # ep and edp before etp
]


@pytest.mark.parametrize("tp, cp, dp, pp, ep, etp, order", CASES)
def test_groups_are_megatron_cores_rank_generators(tp, cp, dp, pp, ep, etp, order):
    """Attention groups = the decoder generator's (ep = 1), expert groups = the expert
    generator's (tp = etp, cp = 1, dp = world / (etp·ep·pp)); the expert gradients reduce
    over that expert-DP size."""
    lo = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, sp=tp > 1, order=order)
    world, e_tp = tp * cp * dp * pp, etp or tp
    edp = world // (e_tp * ep * pp)
    morder = _megatron_order(order)
    dense = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": 1}
    expert = {"tp": e_tp, "cp": 1, "dp": edp, "pp": pp, "ep": ep}
    for kind, token in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("dp_cp", "dp-cp"),
                        ("mp", "tp-pp")):
        assert list(lo.groups(kind)) == _rank_generator(dense, morder, token), kind
    for kind, token in (("etp", "tp"), ("ep", "ep"), ("edp", "dp"), ("tp_ep", "tp-ep")):
        assert list(lo.groups(kind)) == _rank_generator(expert, morder, token), kind
        assert all(lo.group_of(r, kind) == g for g in lo.groups(kind) for r in g)
    assert lo.edp == edp
    if etp is None:     # expert TP is TP
        assert lo.groups("etp") == lo.groups("tp")


def test_cp_and_dp_carry_expert_parallelism_beyond_dp():
    """TP 2, CP 2, DP 2, EP 4 (an error before): rank 0's EP group is the four ranks with TP
    index 0, one expert shard each, and every expert has one copy (expert DP 1)."""
    lo = ParallelLayout(tp=2, cp=2, dp=2, ep=4, sp=True)
    assert lo.groups("ep") == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert lo.groups("edp") == tuple((r,) for r in range(8))
    assert [lo.coords(r).ep for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=2, cp=2, dp=2, ep=8), r"ep=8 does not divide cp × dp = 2 × 2 = 4"),
    (dict(dp=4, ep=3), r"ep=3 does not divide dp=4"),
    (dict(tp=2, cp=2, dp=2, pp=2, ep=4, order=("tp", "cp", "pp", "dp")),
     r"ep=4, etp=2 needs pp last in order .* expert data-parallel size tp·cp·dp / \(etp·ep\) = 1 differs "
     r"from dp=2"),
    (dict(tp=2, cp=2, dp=2, pp=2, ep=2, order=("tp", "cp", "pp", "dp")),
     r"pipeline groups would differ from the attention's"),
    (dict(tp=2, cp=2, dp=2, ep=2, order=("cp", "tp", "dp", "pp")), r"puts cp before tp"),
])
def test_layouts_megatron_core_refuses_are_refused(kwargs, match):
    with pytest.raises(WorkloadError, match=match):
        ParallelLayout(**kwargs)


def test_dense_layouts_build_no_expert_grid():
    """ep = 1, etp = tp: expert TP = TP and expert DP = DP × CP whatever the order (no
    Megatron-core expert-grid check for a grid that is not built)."""
    lo = ParallelLayout(tp=2, cp=2, dp=2, pp=2, order=("tp", "dp", "pp", "cp"))
    assert not lo.expert_grid
    assert lo.groups("edp") == lo.groups("dp_cp") and lo.groups("etp") == lo.groups("tp")
    assert lo.groups("ep") == tuple((r,) for r in range(16))


OVERRIDES = {"tp": 2, "cp": 2, "pp": 1, "ep": 8, "global_batch": 8, "micro_batch": 1, "model": {"layers": 2}}


def test_expert_gradients_and_optimizer_states_over_edp():
    """TP 2, CP 2, DP 4, EP 8 on 16 GPUs: expert DP = 16 / (2·8) = 1, so the expert weights
    have no gradient reduction and ZeRO-1 keeps all their optimizer states; the dense weights
    reduce over DP × CP (8 ranks)."""
    res = simulate_workload("mixtral-8x7b", "dgx-h100:nodes=2", overrides=dict(
        OVERRIDES, zero_stage=1, generator={"fold": False}), options=EngineOptions(record_links=False))
    lo = res.plan.layout
    assert lo.edp == 1 and lo.groups("ep")[0] == (0, 2, 4, 6, 8, 10, 12, 14)
    groups = {t.group for t in res.taskgraph if t.rank == 0 and t.category == "dp"}
    assert groups == {lo.group_of(0, "dp_cp")} and len(lo.group_of(0, "dp_cp")) == 8
    model = res.plan.model
    dense_total, expert_total = params_on_gpu(model, lo, 0)
    est = estimate_memory(model, lo)
    assert est.optimizer == pytest.approx(model.precision_spec.optimizer_bytes * (dense_total / 8 + expert_total),
                                          rel=1e-12)


@pytest.mark.parametrize("tp, cp, dp, pp, ep, order, lanes", [
    (2, 2, 2, 1, 4, ("tp", "cp", "dp", "pp"), 4),     # ep > cp: no CP shift; DP digits (dp mod 2, dp div 2)
    (2, 2, 4, 2, 2, ("tp", "cp", "dp", "pp"), 8),     # ep = cp: EP = the CP pair, DP rotates freely
    (2, 4, 2, 1, 2, ("tp", "cp", "dp", "pp"), 8),     # ep | cp: CP shifts by 2
    (1, 8, 2, 2, 4, ("tp", "cp", "dp", "pp"), 4),
    (2, 2, 16, 1, 8, ("tp", "cp", "dp", "pp"), 32),   # mixtral-8x7b --cp 2 on 64 GPUs
    (2, 2, 4, 1, 4, ("tp", "dp", "cp", "pp"), 16),    # cp after dp: EP within DP (the DP-digit lanes)
    (2, 1, 8, 2, 4, ("tp", "cp", "dp", "pp"), 16),
])
def test_lanes_map_every_group_kind_and_the_cp_ring_onto_themselves(tp, cp, dp, pp, ep, order, lanes):
    """The lanes shift TP, the CP ring (by multiples of ep when ep | cp, not when ep > cp)
    and the DP index's digits (dp mod q, dp div q), q = lcm(cp, ep)/cp: every attention and
    expert group maps onto one of its kind, the CP ring's order onto a CP ring's order and an
    EP group's order onto a rotation of an EP group's (the direct all-to-all's send order)."""
    lo = ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, sp=tp > 1, order=order)
    perm = lane_permutations(lo)
    assert perm.shape == (lanes, lo.world_size)
    for kind in ("tp", "cp", "dp", "pp", "dp_cp", "etp", "ep", "edp", "tp_ep"):
        groups = set(lo.groups(kind))
        for lane in perm:
            assert sorted(lane.tolist()) == list(range(lo.world_size))
            assert {tuple(sorted(int(lane[r]) for r in g)) for g in groups} == groups, kind
    for kind in ("cp", "ep"):        # the image of a ring / an all-to-all is a rotation of one
        for g in lo.groups(kind):
            for lane in perm:
                image, target = [int(lane[r]) for r in g], list(lo.group_of(int(lane[g[0]]), kind))
                k = target.index(image[0])
                assert image == target[k:] + target[:k], kind


def test_cli_accepts_ep_over_cp_and_dp_and_refuses_with_one_line():
    runner = CliRunner()
    base = ["workload", "show", "mixtral-8x7b", "--tp", "2", "--cp", "2"]
    ok = runner.invoke(main, base + ["--dp", "4", "--ep", "4"])
    assert ok.exit_code == 0, ok.output
    assert "ep  [0, 2, 4, 6] [1, 3, 5, 7] ... (4 groups of 4)" in ok.output
    assert "edp [0, 8] [1, 9] ... (8 groups of 2)" in ok.output
    bad = runner.invoke(main, base + ["--dp", "2", "--ep", "8"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:")
    assert "ep=8 does not divide cp × dp = 2 × 2 = 4" in lines[0]
