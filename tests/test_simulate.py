"""Simulated iterations: pipeline bubbles, DP overlap, summaries, bad input, the CLI."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from dessim.cli import simulate_cmd, workload_cmd
from dessim.cli.main import DessimGroup
from dessim.errors import DessimError, MemoryFitError, WorkloadError
from dessim.topology import load_topology
from dessim.workload import (GeneratorOptions, ParallelLayout, TransformerConfig, build_taskgraph,
                             bubble_fraction, enumerate_layouts, estimate_memory, simulate_workload)
from dessim.engine import EngineOptions, simulate

GPT = TransformerConfig("tiny-gpt", layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=4096, seq_len=256)
SMALL = {"model": {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096},
         "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 512}}

SUMMARY_KEYS = {"iteration_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu",
                "hardware_tflops_per_gpu", "mfu", "bubble_fraction", "exposed_comm_s",
                "memory_per_gpu_bytes", "layout", "groups"}


def free_bubble(schedule: str, p: int, m: int, v: int = 1, layers: int = 8) -> float:
    model = TransformerConfig("uniform", layers=layers, hidden=512, heads=8, ffn_hidden=2048,
                              vocab=4096, seq_len=256)
    topo = load_topology(f"ring:{p},device=H100")
    lo = ParallelLayout(pp=p, global_batch=m, schedule=schedule, virtual_stages=v)
    g = build_taskgraph((model, lo), topo, options=GeneratorOptions(comm=False, embedding_head=False))
    return bubble_fraction(simulate(g, topo, EngineOptions(record_links=False)))


# ---------------------------------------------------------------- pipeline bubble
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 4), (4, 8), (2, 6)])
def test_free_communication_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    assert free_bubble(schedule, p, m) == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (2, 4, 4), (4, 4, 2)])
def test_interleaving_divides_the_ideal_relative_bubble_by_v(p, m, v):
    bubble = free_bubble("interleaved", p, m, v, layers=p * v * 2)
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)
    # relative to the ideal (bubble-free) time: (p-1)/(v·m), i.e. 1F1B's (p-1)/m divided by v
    assert bubble / (1 - bubble) == pytest.approx((p - 1) / m / v, abs=1e-9)


# ---------------------------------------------------------------- data parallel overlap
def test_bucketing_exposes_less_dp_communication_and_overlaps_the_backward():
    def run(bucket):
        return simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides={
            **SMALL, "training": {**SMALL["training"], "global_batch": 8}, "bucket_size": bucket})
    none, bucketed = run(0), run(8 * 2**20)
    exposed_none = none.summary()["exposed_comm_s"]["dp"]
    exposed_bucketed = bucketed.summary()["exposed_comm_s"]["dp"]
    assert exposed_none > 0 and 0 < exposed_bucketed < exposed_none
    spans = bucketed.simulation.spans()
    r0 = spans[spans["rank"] == 0]
    bwd = r0[(r0["kind"] == "compute") & (r0["category"] == "bwd")]
    dp = r0[r0["category"] == "dp"]
    overlap = [(a, e) for a, e in zip(dp["active_s"], dp["end_s"])
               if ((bwd["start_s"] < e) & (bwd["end_s"] > a)).any()]
    assert overlap, "some DP all-reduce must run while backward compute runs"


# ---------------------------------------------------------------- summary
def test_summary_has_the_headline_figures_and_consistent_throughput():
    r = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=2", overrides={**SMALL, "tp": 2, "pp": 2, "sp": True})
    s = r.summary()
    assert SUMMARY_KEYS <= set(s)
    assert set(s["exposed_comm_s"]) >= {"tp", "dp", "pp", "ep", "cp", "offload"}
    assert s["exposed_comm_s"]["tp"] > 0 and s["exposed_comm_s"]["pp"] > 0
    assert s["tokens_per_s"] == pytest.approx(16 * 512 / s["iteration_s"])
    assert s["mfu"] == pytest.approx(s["model_tflops_per_gpu"] * 1e12 / 989.4e12, rel=1e-3)
    assert 0 < s["bubble_fraction"] < 1
    assert s["memory_per_gpu_bytes"]["total"] == pytest.approx(
        sum(v for k, v in s["memory_per_gpu_bytes"].items() if k != "total"))
    json.dumps(s)  # JSON-ready


def test_layer_and_kernel_granularity_agree_without_communication():
    over = {**SMALL, "tp": 2, "dp": 1, "pp": 1, "comm": False}
    layer = simulate_workload("gpt3-1.3b", "ring:2,device=H100", overrides=over)
    kernel = simulate_workload("gpt3-1.3b", "ring:2,device=H100", overrides={**over, "granularity": "kernel"})
    assert len(kernel.taskgraph) > len(layer.taskgraph)
    assert kernel.iteration_s == pytest.approx(layer.iteration_s, rel=1e-9)


def test_offload_traffic_appears_in_the_timeline():
    r = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1",
                          overrides={**SMALL, "offload_optimizer": "host", "offload_activations": "host"})
    spans = r.simulation.spans()
    moved = spans[spans["category"] == "offload"]
    assert len(moved) and (moved["end_s"] > moved["active_s"]).all()
    assert r.summary()["memory_per_gpu_bytes"]["offloaded:host"] > 0


# ---------------------------------------------------------------- layouts that fit
def test_enumerate_layouts_lists_valid_fitting_layouts():
    base = ParallelLayout(global_batch=64, sp=True)
    layouts = enumerate_layouts(GPT, 8, 80e9, base=base)
    assert {(lo.tp, lo.pp, lo.dp) for lo in layouts} >= {(1, 1, 8), (8, 1, 1), (2, 2, 2), (1, 8, 1)}
    for lo in layouts:
        assert lo.world_size == 8 and lo.validate(GPT, 8) is lo
        assert estimate_memory(GPT, lo).total <= 80e9
    assert enumerate_layouts(GPT, 8, 1e6, base=base) == []


# ---------------------------------------------------------------- bad input
BAD = [
    ({"tp": 2, "pp": 2, "dp": 4}, WorkloadError, "but there are 8 GPUs"),
    ({"model": {"heads": 12, "hidden": 1536}, "tp": 8}, DessimError, "heads=12 is not divisible by tp=8"),
    ({"model": {"layers": 6}, "pp": 8}, DessimError, "layers=6 is fewer than the 8 pipeline pieces"),
    ({"global_batch": 100, "micro_batch": 4}, DessimError, "global_batch=100 is not divisible by micro_batch"),
    ({"frobnicate": 1}, WorkloadError, "unknown override 'frobnicate'"),
]


@pytest.mark.parametrize("overrides,error,message", BAD)
def test_bad_layouts_are_clear_errors(overrides, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides=overrides)


def test_unknown_preset():
    with pytest.raises(DessimError, match="unknown workload 'gpt-9000'.*presets: .*gpt3-175b"):
        simulate_workload("gpt-9000", "dgx-h100:nodes=1")


def test_a_layout_that_does_not_fit_says_by_how_much_and_what_would_fit():
    with pytest.raises(MemoryFitError, match=r"does not fit.*by [\d.]+\s?[KMGT]i?B.*would fit with: .*"):
        simulate_workload("gpt3-13b", "dgx-h100:nodes=1", overrides={
            "tp": 1, "recompute": "none", "zero_stage": 0, "micro_batch": 4, "global_batch": 64})


# ---------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli():
    group = DessimGroup("dessim")
    group.add_command(simulate_cmd.command)
    group.add_command(workload_cmd.command)
    runner = CliRunner()
    return lambda *args: runner.invoke(group, list(args))


def test_cli_simulate_json_has_the_summary_keys(cli, tmp_path):
    graph = tmp_path / "g.json"
    res = cli("simulate", "gpt3-1.3b", "-t", "dgx-h100:nodes=1", "--tp", "2", "--pp", "2",
              "--global-batch", "8", "--micro-batch", "1", "--save-graph", str(graph), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert SUMMARY_KEYS <= set(out) and out["layout"]["tp"] == 2 and out["layout"]["dp"] == 2
    assert json.loads(graph.read_text())["tasks"]


def test_cli_simulate_without_arguments_runs_the_default(cli):
    res = cli("simulate")
    assert res.exit_code == 0, res.output
    assert "gpt3-1.3b on 8 x H100" in res.output and "MFU" in res.output


@pytest.mark.parametrize("args,message", [
    (["--dp", "4", "--tp", "1"], "but there are 8 GPUs"),
    # a dp that does not fill the GPUs is named as such, not as a batch it does not divide
    (["--dp", "3", "--tp", "1"], "dp=3 makes tp × pp × dp × cp = 1 × 1 × 3 × 1 = 3 GPUs, but there are 8"),
    (["--global-batch", "100", "--micro-batch", "4"], "is not divisible by micro_batch"),
    # a dp that fills the GPUs by itself says so, and which batches would do
    (["--global-batch", "100", "--tp", "1"], "micro_batch × dp = 4 × 8 = 32, where dp=8 fills the topology's 8 GPUs (tp × pp × cp = 1); "
                                             "give --global-batch a multiple of 32 (e.g. 96 or 128)"),
    (["--pp", "8", "--uniform-stages"], None),
])
def test_cli_bad_input_exits_2_with_one_error_line(cli, args, message):
    res = cli("simulate", "gpt3-1.3b", *args) if message else cli("simulate", "nope")
    assert res.exit_code == 2
    assert res.output.startswith("error: ") and "Traceback" not in res.output
    if message:
        assert message in res.output


def test_cli_memory_error(cli):
    res = cli("simulate", "gpt3-175b", "-t", "dgx-h100:nodes=1", "--tp", "8", "--pp", "1",
              "--schedule", "1f1b", "--interleave", "1")
    assert res.exit_code == 2 and "error: " in res.output and "does not fit" in res.output


def test_cli_workload_show_and_list(cli):
    res = cli("workload", "show", "gpt3-175b", "--gpus", "1024", "--pp", "16", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["layout"].startswith("tp=8 pp=16 dp=8") and out["memory_per_gpu_bytes"]["total"] > 0
    assert out["model_flops"] > 3e18 and out["group_counts"]["tp"] == 128
    text = cli("workload", "show", "mixtral-8x7b", "-t", "dgx-h100:nodes=8")
    assert text.exit_code == 0 and "ep " in text.output and "memory/GPU" in text.output
    listing = cli("workload", "list")
    assert listing.exit_code == 0 and "gpt3-175b" in listing.output
    assert isinstance(simulate_cmd.command, click.Command)


@pytest.mark.parametrize("preset, kind", [("dlrm-small", "dlrm"), ("resnet50", "cnn")])
def test_cli_workload_show_says_it_describes_transformers_only(cli, preset, kind):
    res = cli("workload", "show", preset)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"is a '{kind}' workload" in res.output and f"dessim simulate {preset}" in res.output


def test_uneven_pipeline_stages_carry_their_own_layers():
    """10 layers on 4 stages: 2, 3, 3, 2 layers. The middle stages' forward passes take 3/2
    of the outer ones' (no embedding/head, so layers are all that differs), and each stage's
    tasks name exactly its layers."""
    from dessim.workload import simulate_workload

    r = simulate_workload("gpt3-1.3b", "dgx-h100:nodes=1", overrides={
        "tp": 2, "pp": 4, "dp": 1, "global_batch": 4, "model": {"layers": 10},
        "embedding_head": False}, options=EngineOptions(record_links=False))
    spans = r.simulation.spans()
    fwd = spans[(spans.kind == "compute") & (spans.category == "fwd")].copy()
    fwd["stage"] = fwd["rank"].map(r.plan.layout.stage_of)
    fwd["layer"] = fwd["name"].str.extract(r" L(\d+) ", expand=False).astype(int)
    layers = fwd.groupby("stage")["layer"].agg(lambda x: sorted(set(x)))
    assert layers.tolist() == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    busy = (fwd.end_s - fwd.start_s).groupby(fwd.stage).sum()
    assert busy[1] / busy[0] == pytest.approx(1.5, rel=1e-9)
    from dessim.workload.transformer.memory import estimate_memory
    per = [estimate_memory(r.plan.model, r.plan.layout, r.plan.memory, s).total for s in range(4)]
    assert r.plan.estimate.total == max(per)        # the memory check takes the worst stage
