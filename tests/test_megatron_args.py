"""Megatron-LM launch arguments → dessim workload (dessim/workload/transformer/megatron.py).

tests/data/megatron/train_gpt3_175b_distributed.args is the argument list of Megatron-LM's
public GPT-3 175B recipe; it must give GPT-3 175B with the recipe's layout, and every flag
must be mapped, listed as without effect, or reported — never dropped silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.errors import SpecError
from dessim.workload import load_workload
from dessim.workload.transformer.megatron import megatron_workload
from dessim.workload.transformer.spec import parse_workload

RECIPE = Path(__file__).parent / "data" / "megatron" / "train_gpt3_175b_distributed.args"


def recipe_args() -> list[str]:
    lines = [ln.split("#")[0].strip() for ln in RECIPE.read_text().splitlines()]
    return " ".join(ln for ln in lines if ln).split()


def test_the_gpt3_175b_recipe_is_gpt3_175b_with_its_layout():
    launch = megatron_workload(recipe_args(), 128)
    spec = parse_workload(launch.document, "recipe")
    preset = load_workload("gpt3-175b").model
    for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "activation",
              "norm", "position_embedding", "bias", "dropout", "tied_embeddings"):
        assert getattr(spec.model, f) == getattr(preset, f), f
    assert spec.model.num_params() == preset.num_params()
    assert spec.model.precision == "fp16"                       # --fp16
    par, tr = spec.parallelism, spec.training
    assert (par.tp, par.pp, par.dp, par.cp, par.sp) == (8, 16, 1, 1, False)
    assert (tr.micro_batch, tr.global_batch, tr.zero_stage, tr.recompute, tr.bucket_size) == \
        (1, 1536, 0, "none", 0)
    # every flag of the recipe is accounted for: mapped, or listed as without effect
    assert not launch.unsupported and not launch.unknown
    assert "--rampup-batch-size 16 16 5859375" in launch.no_effect and "--lr 6.0e-5" in launch.no_effect
    assert any("padded to 51200" in n for n in launch.notes)


def test_issue_launch_line_interleaved_selective_distributed_optimizer():
    argv = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
            "--micro-batch-size 1 --global-batch-size 1536 --tensor-model-parallel-size 8 "
            "--pipeline-model-parallel-size 16 --num-layers-per-virtual-pipeline-stage 2 "
            "--sequence-parallel --recompute-granularity selective --use-distributed-optimizer "
            "--bf16 --vocab-size 50257 --overlap-grad-reduce").split()
    doc = megatron_workload(argv, 1024).document
    spec = parse_workload(doc, "issue")
    tr = spec.training
    assert (tr.schedule, tr.virtual_stages, tr.recompute, tr.zero_stage) == ("interleaved", 3, "selective", 1)
    assert spec.parallelism.dp == 8 and spec.parallelism.sp and spec.model.precision == "bf16"
    assert tr.bucket_size == 40_000_000 * 4        # max(4e7, 1e6 · dp) fp32 gradients (--bf16)


def test_swiglu_gqa_moe_and_precision_defaults():
    base = "--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 " \
           "--micro-batch-size 1 --vocab-size 32000 "
    m = megatron_workload((base + "--swiglu --group-query-attention --num-query-groups 8 "
                           "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
                           "--untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 "
                           "--num-experts 8 --moe-router-topk 2 --fp8-format hybrid --bf16").split(), 8)
    model = m.document["model"]
    assert model["ffn_hidden"] == int(4 * 4096 * 2 / 3 / 64) * 64 == 10880    # Megatron's SwiGLU default
    assert (model["kv_heads"], model["experts"], model["top_k"], model["precision"]) == (8, 8, 2, "fp8")
    assert (model["norm"], model["position_embedding"], model["bias"], model["dropout"],
            model["tied_embeddings"]) == ("rmsnorm", "rope", False, False, False)
    plain = megatron_workload(base.split(), 8).document
    assert plain["model"]["precision"] == "fp32" and plain["model"]["ffn_hidden"] == 4 * 4096
    assert "global_batch" not in plain["training"]          # micro_batch × dp, as Megatron
    assert parse_workload(plain, "x").layout(8).global_batch == 8


@pytest.mark.parametrize("extra, message", [
    ("--foo 3 --overlap-param-gather", "unsupported: --overlap-param-gather"),
    ("--foo 3", "unknown: --foo 3"),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 1",
     "recomputes 1 of the 4 layers"),
    ("--tensor-model-parallel-size 3", "not divisible by TP × PP × CP = 3"),
    ("--normalization BatchNorm", "--normalization 'BatchNorm' is not supported"),
    ("--seq-length x", "--seq-length 'x' is not a whole number"),
    ("--sequence-parallel 1", "--sequence-parallel takes no values"),
    ("--kv-channels 64", "--kv-channels 64 ≠ --hidden-size / --num-attention-heads = 32"),
])
def test_bad_or_unsupported_flags_are_errors_naming_them(extra, message):
    argv = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--micro-batch-size 1 --vocab-size 1000 " + extra).split()
    with pytest.raises(SpecError, match="megatron arguments") as err:
        megatron_workload(argv, 8)
    assert message in str(err.value)


def test_cli_lists_what_it_leaves_out_and_simulates_like_simulate(tmp_path):
    argv = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 "
            "--max-position-embeddings 256 --micro-batch-size 1 --global-batch-size 8 "
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
            "--num-layers-per-virtual-pipeline-stage 1 --sequence-parallel --use-distributed-optimizer "
            "--recompute-granularity selective --bf16 --vocab-size 1000 --lr 1e-4 "
            "--overlap-grad-reduce --ddp-bucket-size 100000").split()
    runner = CliRunner()
    topo = ["-t", "dgx-h100:nodes=1"]
    res = runner.invoke(cli, ["megatron", *topo, "--json", "--", *argv])
    assert res.exit_code == 0, res.output
    meg = json.loads(res.output)
    assert meg["megatron"]["no_effect"] == ["--lr 1e-4"]
    assert meg["layout"]["virtual_stages"] == 2
    # the same workload written as a dessim file, simulated by `dessim simulate`
    wl = tmp_path / "w.yaml"
    wl.write_text(runner.invoke(cli, ["megatron", *topo, "--print-workload", "--", *argv]).output)
    sim = json.loads(runner.invoke(cli, ["simulate", str(wl), *topo, "--json"]).output)
    assert sim["iteration_s"] == meg["iteration_s"]
    bad = runner.invoke(cli, ["megatron", *topo, "--", *argv, "--bogus", "--overlap-param-gather"])
    assert bad.exit_code == 2 and "unknown: --bogus" in bad.output and "--overlap-param-gather" in bad.output
    ok = runner.invoke(cli, ["megatron", *topo, "--allow-unsupported", "--json", "--", *argv, "--bogus"])
    assert ok.exit_code == 0
    assert "megatron flags unknown, left out: --bogus" in ok.stderr


_MOE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--micro-batch-size 1 --vocab-size 32000 --num-experts 8 --moe-router-topk 2 "
        "--expert-model-parallel-size 4 ")


@pytest.mark.parametrize("flags,dispatch", [("", "nccl"), ("--moe-token-dispatcher-type alltoall", "nccl"),
                                            ("--moe-token-dispatcher-type flex --moe-enable-deepep", "deepep")])
def test_the_token_dispatcher_maps_to_moe_dispatch(flags, dispatch):
    # '--moe-token-dispatcher-type alltoall', Megatron's usual MoE flag, was refused as unsupported
    doc = megatron_workload((_MOE + flags).split(), 8).document
    assert doc["training"]["moe_dispatch"] == dispatch
    assert parse_workload(doc, "x").layout(8).moe_dispatch == dispatch


@pytest.mark.parametrize("flags,match", [
    ("--moe-token-dispatcher-type allgather", "not supported: --moe-token-dispatcher-type allgather"),
    ("--moe-token-dispatcher-type flex", "flex without --moe-enable-deepep"),
    ("--moe-enable-deepep", r"--moe-enable-deepep needs --moe-token-dispatcher-type flex \(got none\)")])
def test_dispatchers_dessim_does_not_model_are_errors(flags, match):
    with pytest.raises(SpecError, match=match):
        megatron_workload((_MOE + flags).split(), 8)


@pytest.mark.parametrize("flags,stages", [
    ("--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5", [3, 4, 4, 5]),
    ("--decoder-first-pipeline-num-layers 1", [1, 5, 5, 5]),
    ("--decoder-last-pipeline-num-layers 7", [3, 3, 3, 7])])
def test_uneven_first_and_last_stages_map_to_pipeline_layers(flags, stages):
    # issue 18's uneven stages were reachable from workload files but refused here
    base = ("--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--micro-batch-size 1 --global-batch-size 16 --vocab-size 32000 "
            "--pipeline-model-parallel-size 4 ")
    doc = megatron_workload((base + flags).split(), 8).document
    assert doc["training"]["pipeline_layers"] == stages
    assert list(parse_workload(doc, "x").layout(8).pipeline_layers) == stages


@pytest.mark.parametrize("flags,match", [
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 3", "do not split evenly"),
    ("--decoder-first-pipeline-num-layers 3", "needs --pipeline-model-parallel-size >= 2"),
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
     "--decoder-first-pipeline-num-layers 2", "interleaved")])
def test_uneven_stages_megatron_would_refuse_are_errors(flags, match):
    base = ("--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--micro-batch-size 1 --vocab-size 32000 ")
    with pytest.raises(SpecError, match=match):
        megatron_workload((base + flags).split(), 8)


_SPLIT = ("--num-layers 14 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
          "--micro-batch-size 1 --global-batch-size 16 --vocab-size 32000 ")


@pytest.mark.parametrize("flags,pieces", [
    # 14 + embedding + loss = 16 counted layers, 4 per stage; the first stage builds one
    # fewer for the embedding, the last one fewer for the loss (Megatron-core's
    # get_num_layers_to_build)
    ("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split "
     "--account-for-loss-in-pipeline-split", [3, 4, 4, 3]),
    ("--pipeline-model-parallel-size 5 --account-for-embedding-in-pipeline-split", [2, 3, 3, 3, 3]),
    ("--pipeline-model-parallel-size 3 --account-for-loss-in-pipeline-split", [5, 5, 4]),
    # interleaved: 16 counted / 2 stages = 8 per stage, 2 per chunk -> 4 chunks each; the
    # first chunk of stage 0 (piece 0) and the last chunk of the last stage (the last piece)
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     [1, 2, 2, 2, 2, 2, 2, 1])])
def test_the_account_for_flags_count_the_embedding_and_loss_as_layers_in_the_split(flags, pieces):
    gpus = 2 * int(flags.split()[1])                  # dp = 2
    doc = megatron_workload((_SPLIT + flags).split(), gpus).document
    assert doc["training"]["pipeline_layers"] == pieces
    assert list(parse_workload(doc, "x").layout(gpus).pipeline_layers) == pieces
    one_stage = megatron_workload((_SPLIT + "--account-for-loss-in-pipeline-split").split(), 8).document
    assert "pipeline_layers" not in one_stage["training"]        # one stage holds every layer


@pytest.mark.parametrize("flags,match", [
    ("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split",
     r"--num-layers 14 \+ 1 \(embedding\) = 15 layers do not split evenly over "
     r"--pipeline-model-parallel-size 4 \(Megatron-core asserts they do\)"),
    ("--pipeline-model-parallel-size 4 --account-for-loss-in-pipeline-split "
     "--decoder-first-pipeline-num-layers 2", "cannot be combined with --account-for-embedding/loss"),
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     r"--num-layers 14 \+ 2 \(embedding/loss counted as layers\) / --pipeline-model-parallel-size 2 is not "
     "a multiple of --num-layers-per-virtual-pipeline-stage 3"),
    ("--pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 1 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "leave the first or last with no transformer layer")])
def test_account_for_splits_megatron_or_dessim_would_refuse_are_errors(flags, match):
    with pytest.raises(SpecError, match=match):
        megatron_workload((_SPLIT + flags).split(), 8)


def test_dessim_megatron_simulates_the_account_for_split():
    """The flags were refused as 'unsupported (uneven pipeline stages)'; the launch now runs
    with the stages Megatron-core builds."""
    argv = (_SPLIT + "--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split "
            "--account-for-loss-in-pipeline-split --bf16").split()
    res = CliRunner().invoke(cli, ["megatron", "-t", "dgx-h100:nodes=1", "--", *argv])
    assert res.exit_code == 0, res.output
    assert "tp=1 pp=4 dp=2 (8 GPUs) 1f1b layers=3/4/4/3" in res.output


@pytest.mark.parametrize("recipe,precision,note", [
    (None, "fp8", None),                      # Megatron's default recipe: delayed (per tensor)
    ("delayed", "fp8", None),
    ("tensorwise", "fp8", "the amax pass over each tensor before its cast is not modelled"),
    ("blockwise", "fp8-block", "--fp8-recipe blockwise → precision fp8-block: the same 1×128 / 128×128 "
                               "block casts and FP8 GEMMs, but fp8-block also carries DeepSeek-V3's memory recipe")])
def test_fp8_recipes_map_onto_dessims_fp8_precisions_and_say_what_differs(recipe, precision, note):
    """'--fp8-recipe blockwise' was refused as unsupported. Megatron's per-tensor recipes are
    dessim's fp8, Transformer Engine's blockwise scaling (1×128 / 128×128 blocks, fp32 scales)
    its fp8-block; what the mapping does not share is a note in the text and the JSON."""
    argv = (_SPLIT + "--bf16 --fp8-format hybrid" + (f" --fp8-recipe {recipe}" if recipe else "")).split()
    launch = megatron_workload(argv, 8)
    assert launch.document["model"]["precision"] == precision and not launch.unsupported
    said = [n for n in launch.notes if "--fp8-recipe" in n]
    assert (len(said) == 1 and note in said[0]) if note else not said
    res = CliRunner().invoke(cli, ["megatron", "-t", "dgx-h100:nodes=1", "--json", "--", *argv])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["megatron"]["notes"] == launch.notes and data["precision"] == precision


@pytest.mark.parametrize("recipe,match", [
    ("mxfp8", "not supported: --fp8-recipe mxfp8: MXFP8 (32-element blocks with E8M0 scales, Blackwell) is "
              "not modelled; use --fp8-recipe blockwise"),
    ("custom", "not supported: --fp8-recipe custom"),
    ("fancy", "--fp8-recipe 'fancy' is not one of Megatron's recipes")])
def test_fp8_recipes_dessim_cannot_map_are_errors_saying_what_to_use(recipe, match):
    with pytest.raises(SpecError, match=re.escape(match) if recipe == "mxfp8" else match):
        megatron_workload((_SPLIT + f"--bf16 --fp8-format hybrid --fp8-recipe {recipe}").split(), 8)


def test_an_fp8_recipe_without_fp8_format_trains_in_16_bits_and_says_so():
    launch = megatron_workload((_SPLIT + "--bf16 --fp8-recipe blockwise").split(), 8)
    assert launch.document["model"]["precision"] == "bf16"
    assert "--fp8-recipe blockwise without --fp8-format: no FP8, as in Megatron" in " ".join(launch.notes)


def test_uniform_recompute_of_layer_groups_says_its_memory_is_per_layer():
    """``--recompute-method uniform --recompute-num-layers N`` recomputes every layer, as dessim's
    full recompute, but checkpoints one input per N layers: dessim's memory is that of N = 1,
    which the launch's notes now say (it did not) — and N = 1 is exact, with no note."""
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--micro-batch-size 1 --vocab-size 1000 --recompute-granularity full "
            "--recompute-method uniform --recompute-num-layers ")
    two = megatron_workload((base + "2").split(), 8)
    assert two.document["training"]["recompute"] == "full"
    assert any("--recompute-num-layers 2: memory as with 1" in n for n in two.notes)
    one = megatron_workload((base + "1").split(), 8)
    assert not any("--recompute-num-layers" in n for n in one.notes)


def test_gradient_precision_follows_megatrons_accumulate_allreduce_grads_in_fp32():
    """megatron/training/arguments.py: --bf16 sets accumulate_allreduce_grads_in_fp32 ("bfloat16
    requires gradient accumulation and all-reduce to be done in fp32") unless
    --grad-reduce-in-bf16; --fp16 leaves it off unless --accumulate-allreduce-grads-in-fp32.
    The launch's gradients (memory, bucket bytes) follow, with no note: it is modelled."""
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--micro-batch-size 1 --vocab-size 1000 --overlap-grad-reduce ")
    def grads(extra: str) -> tuple[int, int, list[str]]:
        launch = megatron_workload((base + extra).split(), 8)
        spec = parse_workload(launch.document, "launch")
        return spec.model.precision_spec.grad_bytes, spec.training.bucket_size, launch.notes
    bf16, bucket, notes = grads("--bf16")
    assert (bf16, bucket) == (4, 40_000_000 * 4) and not any("gradient" in n for n in notes)
    assert grads("--bf16 --grad-reduce-in-bf16")[:2] == (2, 40_000_000 * 2)
    assert grads("--fp16")[:2] == (2, 40_000_000 * 2)
    assert grads("--fp16 --accumulate-allreduce-grads-in-fp32")[:2] == (4, 40_000_000 * 4)
    fp16_bf16, _, notes = grads("--fp16 --grad-reduce-in-bf16")
    assert fp16_bf16 == 2 and any("--grad-reduce-in-bf16 without --bf16: no effect" in n for n in notes)
    assert grads("--bf16 --fp8-format hybrid --grad-reduce-in-bf16")[0] == 2


DEEPSEEK_R1 = Path(__file__).parent / "data" / "megatron" / "deepseek_r1_model.args"
#: DeepSeek-V3's published layout (report §3.2) on 2,048 GPUs, and its one MTP module
DEEPSEEK_LAYOUT = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 "
                   "--expert-model-parallel-size 64 --global-batch-size 15360 --vocab-size 129280 "
                   "--mtp-num-layers 1").split()


def deepseek_r1_args() -> list[str]:
    lines = [ln.split("#")[0].strip() for ln in DEEPSEEK_R1.read_text().splitlines()]
    return " ".join(ln for ln in lines if ln).split() + DEEPSEEK_LAYOUT


def test_megatrons_deepseek_launch_is_the_deepseek_v3_model():
    """MLA, 3 dense layers then 58 MoE layers (--moe-layer-freq [0]*3+[1]*58), one shared expert
    of the routed experts' width, one MTP module: the same model as the deepseek-v3 preset,
    parameter for parameter; only node-limited routing and MoE-layer recompute are refused."""
    launch = megatron_workload(deepseek_r1_args(), 2048, allow_unsupported=True)
    assert sorted(u.split(" (")[0] for u in launch.unsupported) == [
        "--moe-layer-recompute", "--moe-router-group-topk 4", "--moe-router-num-groups 8"]
    assert launch.unknown == []
    model = launch.document["model"]
    assert model["mla"] == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                            "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert (model["dense_layers"], model["shared_experts"], model["mtp_modules"]) == (3, 1, 1)
    ours, preset = parse_workload(launch.document).model, load_workload("deepseek-v3").model
    assert ours.num_params() == preset.num_params()
    assert ours.num_active_params() == preset.num_active_params()
    assert abs(ours.num_params(include_mtp=False) / 671e9 - 1) < 0.005     # "671B total" (report)
    assert any("SequentialMLP" in n for n in launch.notes)          # no --moe-grouped-gemm
    assert not any("--moe-shared-expert-overlap" in n for n in launch.notes)  # it has that one


MOE_ARGV = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--micro-batch-size 1 --vocab-size 1000 --num-experts 8 --moe-ffn-hidden-size 64 "
            "--disable-bias-linear").split()


@pytest.mark.parametrize("freq, dense", [("1", 0), ("[0]*1+[1]*3", 1), ("([0]*2+[1]*2)", 2),
                                         ("[0,1,1,1]", 1)])
def test_moe_layer_freq_with_dense_layers_first_maps_to_dense_layers(freq, dense):
    model = megatron_workload(MOE_ARGV + ["--moe-layer-freq", freq], 8).document["model"]
    assert model.get("dense_layers", 0) == dense


@pytest.mark.parametrize("extra, message", [
    ("--moe-layer-freq 2", "interleaves dense and MoE layers"),
    ("--moe-layer-freq [1,0,1,1]", "interleaves dense and MoE layers"),
    ("--moe-layer-freq [0]*3+[1]*3", "gives 6 layers, --num-layers is 4"),
    ("--moe-layer-freq __import__('os')", "neither a whole number nor a list expression"),
    ("--moe-layer-freq [2]*4", "neither a whole number nor a list expression"),
    ("--moe-shared-expert-intermediate-size 96", "not a multiple of the experts' width 64"),
    ("--kv-lora-rank 64", "--kv-lora-rank without --multi-latent-attention"),
    ("--qk-layernorm", "--qk-layernorm without --multi-latent-attention"),
    ("--multi-latent-attention --group-query-attention", "MLA has no key/value groups"),
    ("--tp-comm-overlap --tensor-model-parallel-size 2", "--tp-comm-overlap needs --sequence-parallel"),
])
def test_moe_mla_and_overlap_flags_dessim_cannot_map_are_errors(extra, message):
    with pytest.raises(SpecError, match="megatron arguments") as err:
        megatron_workload(MOE_ARGV + extra.split(), 8)
    assert message in str(err.value)


def test_moe_flags_without_experts_are_errors():
    argv = " ".join(MOE_ARGV).replace("--num-experts 8 ", "").split() + ["--moe-grouped-gemm"]
    with pytest.raises(SpecError, match="--moe-grouped-gemm without --num-experts"):
        megatron_workload(argv, 8)


def test_shared_experts_grouped_gemms_and_overlap_say_what_dessim_runs():
    """dessim costs experts as grouped GEMMs and runs shared experts under the dispatch; a
    launch without --moe-grouped-gemm / --moe-shared-expert-overlap is told so."""
    launch = megatron_workload(MOE_ARGV + ["--moe-shared-expert-intermediate-size", "128"], 8)
    assert launch.document["model"]["shared_experts"] == 2
    assert any("SequentialMLP" in n for n in launch.notes)
    assert any("--moe-shared-expert-overlap" in n for n in launch.notes)
    quiet = megatron_workload(MOE_ARGV + "--moe-shared-expert-intermediate-size 128 --moe-grouped-gemm "
                              "--moe-shared-expert-overlap".split(), 8)
    assert not any("SequentialMLP" in n or "--moe-shared-expert-overlap" in n for n in quiet.notes)


def test_tp_comm_overlap_maps_to_dessims_userbuffers_overlap():
    argv = MOE_ARGV + "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap".split()
    assert megatron_workload(argv, 8).document["training"]["tp_comm_overlap"] is True
    assert "tp_comm_overlap" not in megatron_workload(MOE_ARGV, 8).document["training"]


def test_mla_takes_megatrons_defaults_and_ignores_kv_channels():
    argv = [a for a in MOE_ARGV] + "--multi-latent-attention --kv-channels 128".split()
    launch = megatron_workload(argv, 8)
    assert launch.document["model"]["mla"] == {"q_lora_rank": 0, "kv_lora_rank": 32,
                                               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                               "v_head_dim": 128}
    assert any("--qk-layernorm" in n for n in launch.notes)
    parse_workload(launch.document)          # a valid workload
