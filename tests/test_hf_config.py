"""Hugging Face config.json files as model specs (dessim/workload/transformer/hf_config.py).

The configs in tests/data/hf/ are the published files of public model repositories
(tests/data/hf/README.md); dessim's parameter counts must equal the published ones within
0.5 %, a config must give the same simulation as the equivalent workload file, and whatever
dessim cannot model is an error naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dessim.cli.main import cli
from dessim.errors import SpecError
from dessim.workload import load_workload
from dessim.workload.transformer.hf_config import hf_model_section

HF = Path(__file__).parent / "data" / "hf"

#: Published parameter counts (tests/data/hf/README.md).
PUBLISHED = {
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "mistral-7b-v0.1": 7.24e9,
    "mixtral-8x7b-v0.1": 46.7e9,
    "qwen2-7b": 7.62e9,
    "gpt2": 124e6,
    "gpt-neox-20b": 20.6e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_the_published_one(name):
    spec = load_workload(HF / name / "config.json")
    assert spec.name == name
    assert spec.model.num_params() == pytest.approx(PUBLISHED[name], rel=5e-3)


def test_exact_counts_where_the_published_count_is_exact():
    exact = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "gpt2": 124_439_808,
             "gpt-neox-20b": 20_554_567_680}
    for name, n in exact.items():
        assert load_workload(HF / name / "config.json").model.num_params() == n, name
    # Qwen2's q/k/v biases (h + 2 kv per layer) are the one documented omission
    q = load_workload(HF / "qwen2-7b" / "config.json").model
    assert 7_615_616_512 - q.num_params() == q.layers * (q.hidden + 2 * q.kv_dim)


def test_mixtral_and_family_facts():
    m = load_workload(HF / "mixtral-8x7b-v0.1" / "config.json").model
    assert (m.experts, m.top_k, m.moe_ffn_hidden, m.activation) == (8, 2, 14336, "swiglu")
    assert m.num_active_params() == pytest.approx(12.9e9, rel=5e-3)      # "13B active"
    g = load_workload(HF / "gpt2" / "config.json").model
    assert (g.activation, g.norm, g.position_embedding, g.bias, g.tied_embeddings) == \
        ("gelu", "layernorm", "learned", True, True)
    # Mistral 7B v0.1 attends over a 4,096-token window: full attention is exact up to it
    assert load_workload(HF / "mistral-7b-v0.1" / "config.json").model.seq_len == 4096


@pytest.mark.parametrize("name, keys", [
    ("deepseek-v2-lite", ["n_shared_experts", "first_k_dense_replace", "kv_lora_rank"]),
    ("qwen1.5-moe-a2.7b", ["shared_expert_intermediate_size"]),
])
def test_features_dessim_lacks_are_named(name, keys):
    with pytest.raises(SpecError, match="not supported yet") as err:
        load_workload(HF / name / "config.json")
    for key in keys:
        assert key in str(err.value)


def test_unknown_architecture_and_missing_keys(tmp_path):
    cfg = json.loads((HF / "llama3-8b" / "config.json").read_text())
    with pytest.raises(SpecError, match="model_type 'mamba' is not supported; supported: llama"):
        hf_model_section({**cfg, "model_type": "mamba"}, "c.json")
    with pytest.raises(SpecError, match="needs 'model_type'"):
        hf_model_section({k: v for k, v in cfg.items() if k != "model_type"}, "c.json")
    with pytest.raises(SpecError, match="missing key 'intermediate_size'"):
        hf_model_section({k: v for k, v in cfg.items() if k != "intermediate_size"}, "c.json")
    with pytest.raises(SpecError, match="head_dim=160"):
        hf_model_section({**cfg, "head_dim": 160}, "c.json")
    with pytest.raises(SpecError, match="hidden_act='quick_gelu'"):
        hf_model_section({**cfg, "hidden_act": "quick_gelu"}, "c.json")
    with pytest.raises(SpecError, match="attention_bias/mlp_bias"):
        hf_model_section({**cfg, "attention_bias": True}, "c.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(cli, ["workload", "show", str(bad), "--gpus", "8"])
    assert res.exit_code == 2 and "error:" in res.output and str(bad) in res.output


def test_workload_yaml_names_a_config_relative_to_itself(tmp_path):
    wl = tmp_path / "wl" / "gpt2-small.yaml"
    wl.parent.mkdir()
    rel = Path("..") / "gpt2" / "config.json"
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text((HF / "gpt2" / "config.json").read_text())
    wl.write_text(f"model: {{hf_config: {rel}, seq_len: 512, precision: fp16}}\n"
                  "parallelism: {tp: 2}\ntraining: {global_batch: 16}\n")
    spec = load_workload(wl)
    assert (spec.model.seq_len, spec.model.precision, spec.model.hidden) == (512, "fp16", 768)
    # the learned position table follows seq_len: 512 × 768 fewer parameters than GPT-2's 1024
    assert spec.model.num_params() == 124_439_808 - 512 * 768
    wl.write_text("model: {hf_config: nowhere/config.json}\ntraining: {global_batch: 16}\n")
    with pytest.raises(SpecError, match="does not exist"):
        load_workload(wl)


def test_config_simulates_like_the_equivalent_workload_file(tmp_path):
    """`dessim simulate config.json` runs the very model of the matching workload file."""
    flags = ["-t", "dgx-h100:nodes=1", "--tp", "8", "--seq-len", "2048", "--global-batch", "8",
             "--no-sp", "--json"]
    hf = CliRunner().invoke(cli, ["simulate", str(HF / "llama3-8b" / "config.json"), *flags])
    assert hf.exit_code == 0, hf.output
    spec = load_workload(HF / "llama3-8b" / "config.json")
    model = {f: getattr(spec.model, f) for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                                 "vocab", "activation", "norm", "position_embedding",
                                                 "bias", "dropout", "tied_embeddings")}
    wl = tmp_path / "llama3-8b.yaml"
    wl.write_text(json.dumps({"name": "llama3-8b", "model": {**model, "seq_len": 8192},
                              "training": {"global_batch": 8}}))
    ref = CliRunner().invoke(cli, ["simulate", str(wl), *flags])
    assert ref.exit_code == 0, ref.output
    a, b = json.loads(hf.output), json.loads(ref.output)
    assert a["iteration_s"] == b["iteration_s"] and a["memory_per_gpu_bytes"] == b["memory_per_gpu_bytes"]
    assert a["workload"] == "llama3-8b" and a["layout"]["global_batch"] == 8


def test_explore_needs_a_global_batch_for_a_bare_config():
    res = CliRunner().invoke(cli, ["explore", str(HF / "gpt2"), "-t", "dgx-h100:nodes=1",
                                   "--no-progress", "-j", "1"])
    assert res.exit_code == 2 and "--global-batch" in res.output


def test_a_model_directory_is_its_config_json():
    assert load_workload(HF / "gpt2").model.num_params() == 124_439_808


def test_default_global_batch_is_one_micro_batch_per_replica():
    spec = load_workload(HF / "gpt2" / "config.json")
    assert spec.training.global_batch is None
    assert spec.layout(8).global_batch == 8          # micro_batch 1 × dp 8 (Megatron's default)
