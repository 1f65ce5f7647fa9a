"""Pipeline schedules against the papers' diagrams (tick by tick, unit pass times, free
communication) and closed forms; the programs' invariants under hypothesis.

Diagrams: Narayanan et al. SC21 Fig. 4 (1F1B and interleaved, p = 4, m = 8, backward = 2 ×
forward); Qi et al. ICLR 2024 Fig. 3 (ZB-H1 / ZB-H2, p = 4, F = B = W); DeepSeek-V3 report
Fig. 5 / deepseek-ai/DualPipe ``DualPipe.step`` (its eight steps, p = 4, m = 8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from dessim.workload.transformer.layout import SCHEDULES
from dessim.workload.transformer.schedules import (diagram, next_virtual, peak_held, prev_virtual,
                                                   stage_program, unit_bubble, unit_timeline)


def grid(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip().splitlines()]


# ---------------------------------------------------------------------- diagrams
ONE_F_ONE_B = grid("""
F1 F2 F3 F4 .  .  .  .  .  .  B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 F8 B5 B5 .  B6 B6 .  B7 B7 .  B8 B8
.  F1 F2 F3 .  .  .  .  B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5 B5 F8 B6 B6 .  B7 B7 .  B8 B8
.  .  F1 F2 .  .  B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7 B6 B6 F8 B7 B7 .  B8 B8
.  .  .  F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 B7 F8 B8 B8
""")

INTERLEAVED = grid("""
F1 F2 F3 F4 F1' F2' F3' F4' F5 F6 F7 . . . B1' B1' F8 B2' B2' . F5' B3' B3' F6' B4' B4' F7' B1 B1 F8' B2 B2 B3 B3 . B4 B4 . B5' B5' . B6' B6' . B7' B7' . B8' B8' B5 B5 B6 B6 B7 B7 B8 B8
. F1 F2 F3 F4 F1' F2' F3' F4' F5 . . B1' B1' F6 B2' B2' F7 B3' B3' F8 B4' B4' F5' B1 B1 F6' B2 B2 F7' B3 B3 F8' B4 B4 . B5' B5' . B6' B6' . B7' B7' . B8' B8' B5 B5 B6 B6 B7 B7 B8 B8
. . F1 F2 F3 F4 F1' F2' F3' . B1' B1' F4' B2' B2' F5 B3' B3' F6 B4' B4' F7 B1 B1 F8 B2 B2 F5' B3 B3 F6' B4 B4 F7' B5' B5' F8' B6' B6' . B7' B7' . B8' B8' B5 B5 B6 B6 B7 B7 B8 B8
. . . F1 F2 F3 F4 F1' B1' B1' F2' B2' B2' F3' B3' B3' F4' B4' B4' F5 B1 B1 F6 B2 B2 F7 B3 B3 F8 B4 B4 F5' B5' B5' F6' B6' B6' F7' B7' B7' F8' B8' B8' B5 B5 B6 B6 B7 B7 B8 B8
""")

ZB_H1 = grid("""
F1 F2 F3 F4 .  .  .  B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 F8 B5 W5 B6 W6 B7 W7 B8 W8
.  F1 F2 F3 .  .  B1 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 F8 B6 W5 B7 W6 B8 W7 W8
.  .  F1 F2 .  B1 F3 B2 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 F8 B7 W5 B8 W6 W7 W8
.  .  .  F1 B1 F2 B2 F3 B3 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 F8 B8 W5 W6 W7 W8
""")

ZB_H2 = grid("""
F1 F2 F3 F4 F5 F6 F7 B1 W1 B2 F8 B3 W2 B4 W3 B5 W4 B6 W5 B7 W6 W7 B8 W8
.  F1 F2 F3 F4 F5 B1 F6 B2 F7 B3 W1 B4 F8 B5 W2 B6 W3 B7 W4 W5 B8 W6 W7 W8
.  .  F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 W1 B6 F8 B7 W2 W3 B8 W4 W5 W6 W7 W8
.  .  .  F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 W1 F8 B8 W2 W3 W4 W5 W6 W7 W8
""")

# ' = the reverse direction (micro-batches 5-8 enter at the last stage)
DUALPIPE = grid("""
F1 F2 F3 F5' B5' W5' F6' F4 B6' B6' . F7' B1 B1 B7' B7' . F8' B2 B2 B8' B8' B3 W3 B4 W4
. F1 F5' F2 F6' F3 B5' B5' F7' B1 B1 F4 B6' B6' F8' B2 B2 B7' B7' B3 B3 . B8' B4 W8' W4
. F5' F1 F6' F2 F7' B1 B1 F3 B5' B5' F8' B2 B2 F4 B6' B6' B3 B3 B7' B7' . B4 B8' W4 W8'
F5' F6' F7' F1 B1 W1 F2 F8' B2 B2 . F3 B5' B5' B3 B3 . F4 B6' B6' B4 B4 B7' W7' B8' W8'
""")


@pytest.mark.parametrize("schedule,v,times,expected", [
    ("1f1b", 1, dict(b=2, w=0), ONE_F_ONE_B),          # SC21 Fig. 4 top (backward = 2 forward)
    ("interleaved", 2, dict(b=2, w=0), INTERLEAVED),   # SC21 Fig. 4 bottom
    ("zb-h1", 1, {}, ZB_H1),                           # ZB Fig. 3 top
    ("zb-h2", 1, {}, ZB_H2),                           # ZB Fig. 3 bottom
    ("dualpipe", 1, {}, DUALPIPE),                     # DualPipe's eight steps
])
def test_schedule_diagram_tick_by_tick(schedule, v, times, expected):
    assert diagram(schedule, 4, 8, v, **times) == expected


def test_dualpipe_figure_size_runs_the_eight_steps():
    """The DualPipe README figure's case (8 ranks, 20 micro-batches): rank 0 starts with
    (p/2 - 1)·2 = 6 forwards, every rank runs every micro-batch of each direction once, and
    the main phase pairs a forward with a backward of the other direction."""
    prog = stage_program("dualpipe", 0, 8, 20)
    assert [op.phase for op in prog[:6]] == ["F"] * 6 and prog[6].phase == "F"
    for s in range(8):
        prog = stage_program("dualpipe", s, 8, 20)
        fwd = sorted((op.mb, op.chunk) for op in prog if op.phase == "F")
        assert fwd == sorted([(i, 0) for i in range(10)] + [(i, 1) for i in range(10, 20)])
        for a, b in zip(prog, prog[1:]):
            if b.paired:
                assert {a.phase, b.phase} == {"F", "B"} and a.chunk != b.chunk


# ---------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (6, 12), (2, 5)])
def test_1f1b_bubble_is_p_minus_1_over_m(p, m):
    assert unit_bubble("1f1b", p, m, b=2, w=0) == pytest.approx((p - 1) / m)
    assert SCHEDULES["1f1b"].bubble_fraction(p, m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 6, 3), (8, 16, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    assert unit_bubble("interleaved", p, m, v, b=2, w=0) == pytest.approx((p - 1) / (v * m))
    assert SCHEDULES["interleaved"].bubble_fraction(p, m, v) == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24), (6, 12), (3, 9)])
@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5), (1.5, 1, 1)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(p, m, f, b, w):
    """Qi et al. §3.1: ZB-H1 idles (p-1)(F + B - W) on every stage; 1F1B (p-1)(F + B + W)."""
    tl = unit_timeline("zb-h1", p, m, f=f, b=b, w=w)
    end = max(t.end for row in tl for t in row)
    for row in tl:
        assert end - sum(t.end - t.start for t in row) == pytest.approx((p - 1) * (f + b - w))
    one_f_one_b = unit_bubble("1f1b", p, m, f=f, b=b, w=w)
    assert unit_bubble("zb-h1", p, m, f=f, b=b, w=w) == pytest.approx(
        one_f_one_b * (f + b - w) / (f + b + w))


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (6, 24)])
def test_zb_h1_is_a_third_of_1f1b_with_equal_passes(p, m):
    assert unit_bubble("zb-h1", p, m) == pytest.approx(unit_bubble("1f1b", p, m) / 3)
    assert SCHEDULES["zb-h1"].bubble_fraction(p, m) == pytest.approx((p - 1) / m / 3)
    assert unit_bubble("zb-h1", p, m) == pytest.approx(SCHEDULES["zb-h1"].bubble_fraction(p, m))


@pytest.mark.parametrize("p,m", [(4, 7), (4, 8), (6, 24), (8, 16)])
def test_zb_h2_leaves_no_gap_inside_any_stage(p, m):
    """With m >= 2p - 1 every stage works from its first pass to its last (the parallelogram
    of Qi et al. Fig. 3): stage s runs from s to s + 3m."""
    for s, row in enumerate(unit_timeline("zb-h2", p, m)):
        assert (row[0].start, row[-1].end) == (s, s + 3 * m)
        assert sum(t.end - t.start for t in row) == 3 * m


@pytest.mark.parametrize("p,m", [(4, 8), (8, 20), (6, 24), (8, 32)])
@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 1, 0.5), (2, 2, 1)])
def test_dualpipe_bubble_is_the_readme_formula(p, m, f, b, w):
    """deepseek-ai/DualPipe README: bubble (PP/2 - 1)(F&B + B - 3W) per rank, B a whole
    backward; F&B = F + B + W when the pair's overlap hides communication only (free here).
    Holds with F = B (the README's figure); below ZB-H1's and 1F1B's bubbles."""
    tl = unit_timeline("dualpipe", p, m, f=f, b=b, w=w)
    end = max(t.end for row in tl for t in row)
    whole = b + w
    expected = (p / 2 - 1) * ((f + whole) + whole - 3 * w)
    assert [end - sum(t.end - t.start for t in row) for row in tl] == pytest.approx([expected] * p)
    dual, zb, base = (unit_bubble(s, p, m, f=f, b=b, w=w) for s in ("dualpipe", "zb-h1", "1f1b"))
    assert dual < zb < base
    if f == b == w:
        assert dual == pytest.approx(SCHEDULES["dualpipe"].bubble_fraction(p, m))


# ---------------------------------------------------------------------- memory
def test_in_flight_activations_per_schedule():
    p, m = 8, 32
    one_f = [SCHEDULES["1f1b"].in_flight(s, p, m) for s in range(p)]
    assert one_f == [peak_held("1f1b", s, p, m) for s in range(p)] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert [peak_held("interleaved", s, p, m, 2) for s in range(p)] == [
        SCHEDULES["interleaved"].in_flight(s, p, m, 2) for s in range(p)]
    # ZB-H1: 1F1B's peak p on every stage (Qi et al. §3.1); ZB-H2: 2p - 1
    assert [SCHEDULES["zb-h1"].in_flight(s, p, m) for s in range(p)] == [p] * p
    assert [SCHEDULES["zb-h2"].in_flight(s, p, m) for s in range(p)] == [2 * p - 1] * p
    # DualPipe: PP + 1 chunks' activations (DualPipe README), each half of the rank's layers
    assert SCHEDULES["dualpipe"].in_flight(0, p, m) == (p + 1) / 2
    # uneven chunks weigh by their layers
    assert peak_held("dualpipe", 0, p, m, weights=(3.0, 1.0)) != peak_held("dualpipe", 0, p, m)


@settings(max_examples=40, deadline=None)
@given(schedule=st.sampled_from(["zb-h1", "zb-h2", "dualpipe"]), p=st.integers(1, 8), m=st.integers(1, 30))
def test_in_flight_closed_forms_equal_the_count_on_the_pass_order(schedule, p, m):
    if schedule == "dualpipe":
        p = 2 * ((p + 1) // 2)
        m = max(m + m % 2, 2 * p)
    for s in range(p):
        assert SCHEDULES[schedule].in_flight(s, p, m) == peak_held(schedule, s, p, m)


# ---------------------------------------------------------------------- invariants
@settings(max_examples=40, deadline=None)
@given(schedule=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 6), m=st.integers(1, 14),
       v=st.integers(2, 3))
def test_every_pass_once_in_dependency_order(schedule, p, m, v):
    sched = SCHEDULES[schedule]
    if sched.bidirectional:
        p = 2 * ((p + 1) // 2)
        m = max(m + m % 2, 2 * p)
    if sched.interleaved:
        m = p * max(1, m // p)
    else:
        v = 1
    chunks = sched.chunks(v)
    for stage in range(p):
        prog = stage_program(schedule, stage, p, m, v)
        mbs = (lambda c: range(m)) if not sched.bidirectional else (
            lambda c: range(c * m // 2, (c + 1) * m // 2))
        want = {(ph, mb, c) for c in range(chunks) for mb in mbs(c) for ph in "FB"}
        seen = [(op.phase, op.mb, op.chunk) for op in prog]
        assert len(seen) == len(set(seen))
        assert {x for x in seen if x[0] != "W"} == want
        assert {(op.mb, op.chunk) for op in prog if op.phase == "W"} == {
            (op.mb, op.chunk) for op in prog if op.phase == "B" and op.split}
        pos = {x: i for i, x in enumerate(seen)}
        for (ph, mb, c), i in pos.items():
            if ph == "B":
                assert pos[("F", mb, c)] < i
            if ph == "W":
                assert pos[("B", mb, c)] < i
    unit_timeline(schedule, p, m, v)       # no deadlock across stages


def test_bidirectional_routes():
    assert next_virtual(0, 0, 4, 2, bidirectional=True) == (1, 0)
    assert next_virtual(0, 1, 4, 2, bidirectional=True) is None
    assert prev_virtual(0, 1, 4, bidirectional=True) == (1, 1)
    assert prev_virtual(3, 1, 4, bidirectional=True) is None


# ---------------------------------------------------------------------- the generator
def _simulate(schedule: str, p: int, m: int, v: int = 1, layers: int = 8):
    from dessim.engine import EngineOptions, simulate
    from dessim.topology import load_topology
    from dessim.workload import GeneratorOptions, ParallelLayout, TransformerConfig, build_taskgraph

    model = TransformerConfig("uniform", layers=layers, hidden=1024, heads=16, ffn_hidden=4096,
                              vocab=4096, seq_len=256)
    topo = load_topology(f"ring:{p},device=H100")
    lo = ParallelLayout(pp=p, global_batch=m, schedule=schedule, virtual_stages=v)
    g = build_taskgraph((model, lo), topo, options=GeneratorOptions(comm=False, embedding_head=False,
                                                                    optimizer=False))
    return g, simulate(g, topo, EngineOptions(record_links=False))


def _pass_times(graph, passes: int) -> tuple[float, float, float]:
    """Mean forward, input-gradient and weight-gradient time of rank 0's passes (s)."""
    tasks = [t for t in graph if t.rank == 0 and t.kind == "compute"]
    return tuple(sum(t.duration for t in tasks if t.category == c) / passes  # type: ignore[return-value]
                 for c in ("fwd", "bwd", "wgrad"))


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("zb-h1", 4, 8, 1),
                                            ("zb-h2", 4, 8, 1), ("dualpipe", 4, 8, 1), ("dualpipe", 4, 12, 1)])
def test_simulated_iteration_follows_the_unit_timeline(schedule, p, m, v):
    """The task graph of a schedule, replayed with free communication and identical stages,
    takes exactly what :func:`unit_timeline` predicts from its pass times: the generator
    emits the schedule's order, dependencies and split backward as drawn."""
    zb, _ = _simulate("zb-h1", p, m)
    f, b, w = _pass_times(zb, m)                       # per stage (2 layers), split backward
    g, result = _simulate(schedule, p, m, v)
    spans = [(r[6], r[8]) for r in result.span_records if r[4] == "compute"]
    window = max(e for _, e in spans) - min(s for s, _ in spans)
    tl = unit_timeline(schedule, p, m, v, f=f / v, b=b / v, w=w / v)
    assert window == pytest.approx(max(t.end for row in tl for t in row), rel=1e-9)
    if SCHEDULES[schedule].split_backward:
        assert any(t.category == "wgrad" for t in g)
        # a split backward's passes add up to the whole backward
        one_f, _ = _simulate("1f1b", p, m)
        whole = _pass_times(one_f, m)[1]
        assert b + w == pytest.approx(whole, rel=1e-9)


def test_gantt_draws_f_b_w_apart(tmp_path):
    """The Gantt chart of a ZB-H1 iteration puts its forward, input-gradient and
    weight-gradient passes in their own activities (as Qi et al. Fig. 3 colours F, B, W)."""
    from dessim.outputs.activity import classify
    from dessim.outputs.gantt import write_gantt

    g, result = _simulate("zb-h1", 2, 4)
    kinds = {classify(t.kind, t.category, t.name) for t in g if t.kind == "compute"}
    assert {"forward", "backward", "weight-gradient"} <= kinds
    html = write_gantt(result, tmp_path / "zb.html").read_text()
    assert "weight-gradient" in html


# ---------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli():
    from click.testing import CliRunner

    from dessim.cli import simulate_cmd, workload_cmd
    from dessim.cli.main import DessimGroup

    group = DessimGroup("dessim")
    for cmd in (simulate_cmd.command, workload_cmd.command):
        group.add_command(cmd)
    return lambda *args: CliRunner().invoke(group, list(args))


def test_cli_draws_a_schedule_and_rejects_bad_sizes(cli):
    res = cli("workload", "schedule", "zb-h1", "--pp", "4", "--micro-batches", "8")
    assert res.exit_code == 0, res.output
    assert [line.split(None, 2)[2] for line in res.output.splitlines()[:4]] == ZB_H1
    assert "bubble: 12.5% of the ideal time" in res.output
    bad = cli("workload", "schedule", "dualpipe", "--pp", "3")
    assert bad.exit_code == 2 and "need an even p" in bad.output and "Traceback" not in bad.output


def test_cli_simulates_a_zero_bubble_schedule_with_uneven_stages(cli):
    res = cli("simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--tp", "2", "--pp", "4",
              "--global-batch", "8", "--schedule", "zb-h1", "--pipeline-layers", "5,7,7,5", "--json")
    assert res.exit_code == 0, res.output
    import json
    layout = json.loads(res.output)["layout"]
    assert (layout["schedule"], layout["pipeline_layers"]) == ("zb-h1", [5, 7, 7, 5])
    bad = cli("simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--pp", "4", "--global-batch", "8",
              "--pipeline-layers", "5,7,7")
    assert bad.exit_code == 2 and "pipeline_layers has 3 entries" in bad.output


def test_dualpipe_reduces_each_pieces_gradients_over_both_stages_that_hold_it():
    """Stage s and stage p-1-s hold the same two pieces (DualPipe's 2× parameters), so their
    gradients are reduced together: DP groups of 2·dp ranks spanning the two stages, and ZeRO
    shards the optimizer states over them; ZeRO-3 is refused."""
    from dessim.errors import WorkloadError
    from dessim.workload import ParallelLayout, TransformerConfig, estimate_memory, simulate_workload

    res = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1",
                            overrides={"tp": 1, "pp": 4, "schedule": "dualpipe", "zero_stage": 1,
                                       "global_batch": 64, "generator": {"fold": False}})
    lo = res.plan.layout
    groups = {t.group for t in res.taskgraph if t.category == "dp" and t.group}
    assert groups and all(len(g) == 2 * lo.dp for g in groups)
    for g in groups:
        assert sorted({lo.stage_of(r) for r in g}) in ([0, 3], [1, 2])
    model = TransformerConfig("t", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=4096, seq_len=256)
    one = estimate_memory(model, ParallelLayout(pp=4, dp=2, global_batch=16, zero_stage=1))
    dual = estimate_memory(model, ParallelLayout(pp=4, dp=2, global_batch=16, zero_stage=1, schedule="dualpipe"))
    assert dual.params == pytest.approx(2 * one.params, rel=0.05)       # two pieces per stage
    assert dual.optimizer == pytest.approx(one.optimizer, rel=0.05)     # sharded over twice the ranks
    with pytest.raises(WorkloadError, match="'dualpipe' with zero_stage 3 is not modelled"):
        ParallelLayout(pp=4, global_batch=8, schedule="dualpipe", zero_stage=3)


def test_split_backward_puts_weight_gradients_and_their_regather_in_w():
    """B keeps the data gradients and the input-gradient reduction; W gets the ``.wgrad``
    GEMMs (whole or as ``#i`` row chunks) and the re-gather only they wait for."""
    from dessim.workload.common.kernels import MATMUL, Kernel
    from dessim.workload.transformer.passes import WGRAD, Step, split_backward

    def gemm(name):
        return Kernel(name, MATMUL, "bwd", 1.0, 1.0, 1.0, (1, 1, 1))

    steps = [Step("compute", "d", "bwd", "compute", [], "L0", [gemm("mlp.up.dgrad")]),
             Step("collective", "rs", "tp", "tp", [0], "L0", op="reducescatter", size=8.0, group="tp"),
             Step("collective", "ag", "tp", "tp", [0], "L0", op="allgather", size=8.0, group="tp"),
             Step("compute", "w", "bwd", "compute", [2], "L0", [gemm("mlp.up.wgrad#0"), gemm("mlp.up.wgrad#1")]),
             Step("compute", "n", "bwd", "compute", [1], "L0", [gemm("attn.norm.bwd")])]
    b, w = split_backward(steps)
    assert [s.name for s in b] == ["d", "rs", "n"] and [s.name for s in w] == ["ag", "w"]
    assert w[1].category == WGRAD and w[1].deps == [0] and b[2].deps == [1]
    assert b[-1].completes == ["L0"] and w[-1].completes == ["L0"]


def test_split_backward_keeps_sends_and_receives_in_b():
    """Context parallelism's K/V ring: a backward pass forwards K/V with a send issued after
    the previous layer's weight-gradient GEMM. The peer's input-gradient pass waits for it,
    and sends pair with the peer's receives by their order, so every send and receive stays
    in B, re-anchored on the last B compute step before the W step it followed."""
    from dessim.workload.common.kernels import MATMUL, Kernel
    from dessim.workload.transformer.passes import Step, split_backward

    def gemm(name):
        return Kernel(name, MATMUL, "bwd", 1.0, 1.0, 1.0, (1, 1, 1))

    steps = [Step("compute", "d", "bwd", "compute", [], "L1", [gemm("attn.proj.dgrad")]),
             Step("compute", "w", "bwd", "compute", [0], "L1", [gemm("attn.proj.wgrad")]),
             Step("send", "kv", "cp", "cp.send", [1], "L1", size=8.0, peer="next"),
             Step("recv", "kv_in", "cp", "cp.recv", [], "L1", size=8.0, peer="prev"),
             Step("compute", "core", "bwd", "compute", [3], "L1", [gemm("attn.core.bwd")])]
    b, w = split_backward(steps)
    assert [s.name for s in b] == ["d", "kv", "kv_in", "core"] and [s.name for s in w] == ["w"]
    assert b[1].deps == [0]          # after the dgrad, where it was issued
    assert b[3].deps == [2]


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2", "dualpipe"])
def test_context_parallel_rings_pair_under_split_backward_schedules(schedule):
    """Schedules that split the backward (zero-bubble, DualPipe) with CP 2: every CP send
    meets a receive of its size (they used to pair a 4 MiB forward-K/V receive with an
    8 MiB gradient send), and the iteration simulates."""
    from dessim.workload.api import simulate_workload

    res = simulate_workload("llama3-8b", "dgx-h100:nodes=2",
                            overrides={"cp": 2, "tp": 4, "pp": 2, "schedule": schedule, "global_batch": 16})
    assert res.summary()["iteration_s"] > 0


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), v=st.integers(1, 4), extra=st.integers(0, 40), bidirectional=st.booleans())
def test_pipeline_pieces_cover_every_layer_once_in_model_order(pp, v, extra, bidirectional):
    """``balanced``: every layer in exactly one piece, pieces contiguous in model order,
    sizes differing by at most one with the lighter ones at the ends; DualPipe puts each
    piece on two stages (s and pp-1-s)."""
    from dessim.workload.transformer.layout import ParallelLayout

    if bidirectional:
        pp, v = 2 * ((pp + 1) // 2), 1
        lo = ParallelLayout(pp=pp, global_batch=2 * pp, schedule="dualpipe")
    else:
        lo = ParallelLayout(pp=pp, global_batch=pp, schedule="interleaved" if v > 1 and pp > 1 else "1f1b",
                            virtual_stages=v if pp > 1 else 1)
    layers = lo.pipeline_pieces + extra
    counts = lo.layer_counts(layers)
    assert sum(counts) == layers and max(counts) - min(counts) <= 1
    light = [i for i, n in enumerate(counts) if n < max(counts)]
    n = len(counts)
    assert sorted(light) == sorted(([i // 2 if i % 2 == 0 else n - 1 - i // 2 for i in range(n)])[:len(light)])
    held = [r for s in range(pp) for r in lo.stage_layers(layers, s)]
    by_piece = sorted({(r.start, r.stop) for r in held})
    assert [i for a, b in by_piece for i in range(a, b)] == list(range(layers))
    assert len(held) == (2 * pp if bidirectional else lo.pipeline_pieces)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_split_backward_closed_form_holds_with_fewer_micro_batches_than_stages(schedule):
    """'workload schedule zb-h1 --pp 4 --micro-batches 2' drew an 83.3 % bubble next to a
    closed form of 50 %: (p-1)/(3m) assumes m >= p. Stage 0 waits 2p - 1 for its first B
    with only min(p, m) forwards to fill the wait: (p - 1 + max(0, p - m))/(3m) everywhere."""
    for p in range(2, 9):
        for m in range(1, 3 * p):
            closed = SCHEDULES[schedule].bubble_fraction(p, m)
            assert unit_bubble(schedule, p, m) == pytest.approx(closed, abs=1e-12), (p, m)
            if m >= p:
                assert closed == pytest.approx((p - 1) / (3 * m))


def test_interleaved_with_one_chunk_is_refused_as_the_layout_refuses_it():
    # 'workload schedule interleaved --pp 2 --micro-batches 4 --interleave 1' drew a
    # schedule no one runs (3 warm-up forwards on 2 stages) under the name interleaved
    from click.testing import CliRunner

    from dessim.cli.main import cli

    res = CliRunner().invoke(cli, ["workload", "schedule", "interleaved", "--pp", "2",
                                   "--micro-batches", "4", "--interleave", "1"])
    assert res.exit_code == 2
    assert res.output.startswith("error: interleaved schedule: needs v >= 2 model chunks per stage")
