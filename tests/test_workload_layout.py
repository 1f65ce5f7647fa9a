"""Parallel layouts: validation errors, placement of dimensions on ranks, rank groups."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dessim.errors import WorkloadError
from dessim.workload import SCHEDULES, ParallelLayout, TransformerConfig

GPT = TransformerConfig("gpt", layers=24, hidden=2048, heads=16, ffn_hidden=8192, vocab=51200, seq_len=2048)
MOE = TransformerConfig("moe", layers=8, hidden=1024, heads=16, kv_heads=4, ffn_hidden=4096, vocab=32000,
                        seq_len=1024, activation="swiglu", experts=8, top_k=2)


# ---------------------------------------------------------------------- validation
def test_world_size_mismatch_names_product_and_count():
    layout = ParallelLayout(tp=2, pp=2, dp=3, cp=1, global_batch=6)
    with pytest.raises(WorkloadError, match=r"tp × pp × dp × cp = 2 × 2 × 3 × 1 = 12 but there are 16 GPUs"):
        layout.validate(GPT, num_gpus=16)
    assert layout.validate(GPT, num_gpus=12) is layout


@pytest.mark.parametrize("model,layout,fragment", [
    (GPT, ParallelLayout(tp=3), "heads=16 is not divisible by tp=3"),
    (MOE, ParallelLayout(tp=8), "kv_heads=4 is not divisible by tp=8"),
    (GPT, ParallelLayout(pp=32, global_batch=32), "layers=24 is fewer than the 32 pipeline pieces (pp = 32)"),
    (GPT, ParallelLayout(pp=4, schedule="interleaved", virtual_stages=8, global_batch=4),
     "layers=24 is fewer than the 32 pipeline pieces (pp × virtual_stages = 4 × 8"),
    (GPT, ParallelLayout(pp=2, global_batch=2, pipeline_layers=(11, 12)),
     "pipeline_layers=[11, 12] add up to 23 layers but the model has layers=24"),
    (GPT, ParallelLayout(pp=2, schedule="interleaved", virtual_stages=2, global_batch=2,
                         pipeline_layers=(12, 12)),
     "pipeline_layers has 2 entries but the schedule 'interleaved' splits the model into 4 pieces"),
    (GPT, ParallelLayout(dp=2, ep=2), "ep=2 but the model is dense"),
    (MOE, ParallelLayout(dp=6, ep=3), "ep=3 does not divide experts=8"),
    (GPT.with_seq_len(1004), ParallelLayout(cp=4), "seq_len=1004 is not divisible by 2 × cp = 8"),
    (GPT.with_seq_len(2052), ParallelLayout(tp=8, sp=True), "seq_len / cp = 2052 divisible by tp=8"),
])
def test_model_dependent_errors(model, layout, fragment):
    with pytest.raises(WorkloadError) as info:
        layout.validate(model)
    assert fragment in str(info.value)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(dp=4, micro_batch=2, global_batch=12), "global_batch=12 is not divisible by micro_batch × dp = 2 × 4 = 8"),
    (dict(dp=4, ep=3), "ep=3 does not divide dp=4"),
    (dict(schedule="zb-h3"), "schedule='zb-h3' is unknown; valid: gpipe, 1f1b, interleaved, zb-h1, zb-h2, dualpipe"),
    (dict(schedule="dualpipe", pp=3, global_batch=6), "dualpipe' needs an even pp >= 2 (got pp=3)"),
    (dict(schedule="dualpipe", pp=4, global_batch=6), "even number of micro-batches >= 2·pp = 8 (got 6"),
    (dict(pipeline_layers="ends"), "pipeline_layers='ends' is not a rule; valid: balanced"),
    (dict(pipeline_layers=[3, 0]), "must be balanced or a non-empty list of whole numbers >= 1"),
    (dict(recompute="some"), "recompute='some' is unknown"),
    (dict(zero_stage=4), "zero_stage=4 is not a ZeRO stage"),
    (dict(tp=0), "tp=0 must be a whole number >= 1"),
    (dict(pp=4, schedule="interleaved"), "needs virtual_stages >= 2"),
    (dict(schedule="interleaved", virtual_stages=2), "needs pp >= 2"),
    (dict(pp=2, virtual_stages=2), "virtual_stages=2 needs schedule 'interleaved'"),
    (dict(pp=4, schedule="interleaved", virtual_stages=2, global_batch=6),
     "number of micro-batches (6 = global_batch / (micro_batch × dp)) to be divisible by pp=4"),
    (dict(order=("tp", "dp", "pp")), "must list each of tp, cp, dp, pp exactly once"),
])
def test_layout_errors(kwargs, fragment):
    with pytest.raises(WorkloadError) as info:
        ParallelLayout(**kwargs)
    assert fragment in str(info.value)


def test_micro_batches_and_fsdp_alias():
    layout = ParallelLayout(tp=2, dp=4, micro_batch=2, global_batch=64, zero_stage="fsdp")
    assert layout.num_micro_batches == 8
    assert layout.zero_stage == 3
    assert ParallelLayout(dp=4, micro_batch=2).global_batch == 8  # default: one micro-batch each


# ---------------------------------------------------------------------- placement and groups
def test_default_order_tp_innermost_pp_outermost():
    layout = ParallelLayout(tp=2, cp=2, dp=2, pp=2)
    assert layout.rank_of(tp=1) == 1
    assert layout.rank_of(cp=1) == 2
    assert layout.rank_of(dp=1) == 4
    assert layout.rank_of(pp=1) == 8
    assert layout.coords(13) == (1, 0, 1, 1, 0, 1)     # tp, cp, dp, pp, ep, edp
    assert layout.stage_of(13) == 1


def test_tp_groups_stay_inside_8_gpu_nodes():
    layout = ParallelLayout(tp=8, pp=4, dp=4)
    gpus_per_node = 8
    for group in layout.groups("tp"):
        assert len({r // gpus_per_node for r in group}) == 1
    assert layout.groups("tp")[0] == tuple(range(8))


def test_pp_chains_in_stage_order_and_dp_groups():
    layout = ParallelLayout(tp=2, pp=3, dp=2)
    assert layout.groups("pp") == ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11))
    assert [layout.stage_of(r) for r in (0, 4, 8)] == [0, 1, 2]
    assert layout.groups("dp") == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11))
    assert layout.groups("mp")[0] == (0, 1, 4, 5, 8, 9)


def test_expert_groups_split_dp():
    layout = ParallelLayout(dp=8, ep=4)
    assert layout.groups("ep") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert layout.groups("edp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert layout.group_of(6, "ep") == (4, 5, 6, 7)
    assert layout.group_of(6, "edp") == (2, 6)


def test_dp_cp_group_spans_both():
    layout = ParallelLayout(tp=2, cp=2, dp=2)
    assert layout.groups("dp_cp") == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_custom_order():
    layout = ParallelLayout(tp=2, dp=2, pp=2, order=("dp", "tp", "cp", "pp"))
    assert layout.groups("dp")[0] == (0, 1)
    assert layout.groups("tp")[0] == (0, 2)


def test_unknown_group_and_out_of_range():
    layout = ParallelLayout(tp=2)
    with pytest.raises(WorkloadError, match="unknown rank group 'xx'; valid: tp, cp, dp"):
        layout.groups("xx")
    with pytest.raises(WorkloadError, match="rank 2 is out of range 0..1"):
        layout.coords(2)


def test_stage_layers_plain_and_interleaved():
    plain = ParallelLayout(pp=4, global_batch=4)
    assert plain.stage_layers(24, 1) == (range(6, 12),)
    inter = ParallelLayout(pp=4, schedule="interleaved", virtual_stages=2, global_batch=4)
    assert inter.stage_layers(24, 1) == (range(3, 6), range(15, 18))


def _layout_or_none(**kw):
    """The layout, or None for one Megatron-core refuses (its expert grid; module docstring)."""
    try:
        return ParallelLayout(**kw)
    except WorkloadError:
        return None


layouts = st.builds(
    lambda tp, cp, dp_mult, ep, pp, order: _layout_or_none(tp=tp, cp=cp, dp=dp_mult * ep, ep=ep, pp=pp,
                                                         order=order),
    tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp_mult=st.integers(1, 3),
    ep=st.sampled_from([1, 2]), pp=st.integers(1, 3),
    order=st.permutations(["tp", "cp", "dp", "pp"]).map(tuple)).filter(lambda lo: lo is not None)


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_every_rank_in_exactly_one_group_per_dimension(layout):
    ranks = set(range(layout.world_size))
    for name in ("tp", "cp", "dp", "pp", "ep", "edp", "dp_cp", "mp", "etp", "tp_ep"):
        groups = layout.groups(name)
        members = [r for g in groups for r in g]
        assert sorted(members) == sorted(ranks)            # a partition of all ranks
        expected = {"dp_cp": layout.dp * layout.cp, "mp": layout.tp * layout.pp,
                    "tp_ep": layout.tp * layout.ep}.get(name)
        size = expected or layout.size(name)
        assert all(len(g) == size for g in groups)
        for g in groups[:3]:
            assert layout.group_of(g[-1], name) == g


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_rank_and_coords_are_inverse(layout):
    """Attention coordinates and ranks are inverse; with EP carved out of DP (cp = 1 or cp
    after dp) the expert indices split the DP index, ``dp = ep + ep_size · edp``."""
    classic = layout.cp == 1 or layout.order.index("cp") > layout.order.index("dp")
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert layout.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == rank
        if classic:
            assert c.dp % layout.ep == c.ep and (c.dp + layout.dp * c.cp) // layout.ep == c.edp
    seen = {layout.rank_of(tp=a, cp=b, dp=c, pp=d) for a, b, c, d in itertools.product(
        range(layout.tp), range(layout.cp), range(layout.dp), range(layout.pp))}
    assert seen == set(range(layout.world_size))


# ---------------------------------------------------------------------- schedules
def test_schedule_in_flight_micro_batches():
    p, m = 4, 8
    assert [SCHEDULES["1f1b"].in_flight(i, p, m) for i in range(p)] == [4, 3, 2, 1]
    assert SCHEDULES["1f1b"].in_flight(0, p, 2) == 2               # fewer micro-batches than stages
    assert SCHEDULES["gpipe"].in_flight(0, p, m) == m
    # Megatron interleaved warm-up: 2(p-1) + (v-1)p chunk-forwards, +1, in chunks of 1/v stage.
    assert SCHEDULES["interleaved"].in_flight(0, p, m, 2) == (2 * 3 + 4 + 1) / 2
    assert SCHEDULES["interleaved"].in_flight(0, p, m, 2) > SCHEDULES["1f1b"].in_flight(0, p, m)


def test_bubble_fractions():
    assert SCHEDULES["1f1b"].bubble_fraction(8, 32) == pytest.approx(7 / 32)
    assert SCHEDULES["gpipe"].bubble_fraction(8, 32) == pytest.approx(7 / 32)
    assert SCHEDULES["interleaved"].bubble_fraction(8, 32, 4) == pytest.approx(7 / 128)


def test_uneven_stages_follow_llama3_first_and_last_lighter():
    """126 layers on 16 stages (Llama 3 405B): 7 layers on the first and last stage, 8 on the
    others, contiguous and covering every layer once."""
    lo = ParallelLayout(pp=16, global_batch=16)
    ranges = [lo.stage_layers(126, s)[0] for s in range(16)]
    assert [len(r) for r in ranges] == [7] + [8] * 14 + [7]
    assert [i for r in ranges for i in r] == list(range(126))
    # a larger deficit is taken from both ends inwards
    lo4 = ParallelLayout(pp=4, global_batch=4)
    assert [len(lo4.stage_layers(10, s)[0]) for s in range(4)] == [2, 3, 3, 2]
    assert [len(lo4.stage_layers(7, s)[0]) for s in range(4)] == [1, 2, 2, 2]
    assert ParallelLayout(pp=5, global_batch=5).validate(GPT) is not None


def test_a_preset_on_too_few_gpus_says_where_its_own_layout_runs():
    """The obvious command on the default one-node topology names the topology the preset's
    own layout needs, so the user can copy it."""
    from dessim.errors import SpecError
    from dessim.workload.transformer.spec import load_workload

    spec = load_workload("llama3-405b")
    with pytest.raises(SpecError, match=r"8 GPUs are not divisible by tp × pp × cp = 128; its own "
                                        r"layout runs on 8192 GPUs: --topology dgx-h100:nodes=1024"):
        spec.layout(8)
