"""Model configurations, parameter counts of the presets, and workload YAML loading."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dessim.errors import SpecError, WorkloadError
from dessim.workload import TransformerConfig, load_workload, shipped_workloads
from dessim.workload.transformer.spec import (parse_workload,
    ModelSection,
    OffloadSection,
    ParallelismSection,
    ParallelismSpec,
    TrainingSection,
    TrainingSpec,
)

# Published parameter counts: (preset, total, active, relative tolerance, source).
PUBLISHED = [
    ("gpt3-1.3b", 1.3e9, None, 0.02, "Brown et al. 2020 (GPT-3) Table 2.1: 1.3B"),
    ("gpt3-2.7b", 2.7e9, None, 0.02, "GPT-3 Table 2.1: 2.7B (rounded; exact count 2.65B)"),
    ("gpt3-6.7b", 6.7e9, None, 0.02, "GPT-3 Table 2.1: 6.7B"),
    ("gpt3-13b", 13.0e9, None, 0.02, "GPT-3 Table 2.1: 13.0B"),
    ("gpt-22b", 22e9, None, 0.02, "Korthikanti et al. 2022 Table 3: 22B"),
    ("gpt3-175b", 175.0e9, None, 0.01, "GPT-3 Table 2.1: 175.0B"),
    ("llama2-7b", 6.74e9, None, 0.01, "Hugging Face meta-llama/Llama-2-7b: 6.74B params "
                                      "(LLaMA-1 paper Table 2: 6.7B, same architecture)"),
    ("llama2-70b", 69.0e9, None, 0.01, "Hugging Face meta-llama/Llama-2-70b: 69.0B params ('70B')"),
    ("llama3-8b", 8.03e9, None, 0.01, "Hugging Face meta-llama/Meta-Llama-3-8B: 8.03B params"),
    ("llama3-70b", 70.6e9, None, 0.01, "Hugging Face meta-llama/Meta-Llama-3-70B: 70.6B params"),
    ("llama3-405b", 405e9, None, 0.01, "Llama 3 paper: 405B (Hugging Face: 406B params)"),
    ("llama3-405b-cp16", 405e9, None, 0.01, "the same model, long-context layout (Llama 3 Table 4)"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01, "Mistral AI, 'Mixtral of experts' (2023): 46.7B total, "
                                           "12.9B used per token"),
    # published totals leave the MTP module out; active: tests/test_deepseek_moe.py
    ("deepseek-v3", 671e9, 37e9, 0.005, "DeepSeek-V3 report (arXiv:2412.19437) §2: 671B total, "
                                        "37B activated per token"),
]
#: presets whose published active count is too coarsely rounded for ``tol`` (checked elsewhere)
_ACTIVE_ELSEWHERE = {"deepseek-v3"}


@pytest.mark.parametrize("name,total,active,tol,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_preset_parameter_counts_match_published_figures(name, total, active, tol, source):
    model = load_workload(name).model
    assert model.num_params(include_mtp=False) == pytest.approx(total, rel=tol), source
    if active is None:
        assert model.num_active_params() == model.num_params()
    elif name not in _ACTIVE_ELSEWHERE:
        assert model.num_active_params() == pytest.approx(active, rel=tol), source


def test_every_shipped_preset_is_tested():
    assert set(shipped_workloads()) == {p[0] for p in PUBLISHED}


def test_parameter_count_components_gpt3_175b():
    m = load_workload("gpt3-175b").model
    h, l, V, s = 12288, 96, 51200, 2048
    parts = m.param_breakdown()
    assert parts["embedding"] == V * h + s * h
    assert parts["attention"] == l * (4 * h * h + 4 * h)            # QKV+proj weights and biases
    assert parts["mlp"] == l * (8 * h * h + 5 * h)                  # 4h up, 4h down, biases 4h + h
    assert parts["norms"] == (2 * l + 1) * 2 * h
    assert parts["lm_head"] == 0                                    # tied
    assert m.num_params() == 12 * l * h * h + 13 * l * h + V * h + s * h + 2 * h


def test_llama2_7b_exact_count():
    # 32 × (4h² + 3·h·11008 + 2h) + 2·V·h + h: the released checkpoint's 6,738,415,616.
    assert load_workload("llama2-7b").model.num_params() == 6_738_415_616


def test_gqa_shrinks_kv_projections():
    mha = TransformerConfig("m", layers=1, hidden=1024, heads=16, ffn_hidden=4096, vocab=10, seq_len=8)
    gqa = dataclasses.replace(mha, kv_heads=4)
    assert mha.attention_params() - gqa.attention_params() == 2 * 1024 * (1024 - 256) + 2 * (1024 - 256)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(hidden=1000, heads=16), "hidden=1000 is not divisible by heads=16"),
    (dict(kv_heads=5), "heads=16 is not divisible by kv_heads=5"),
    (dict(activation="tanh"), "activation='tanh' is unknown"),
    (dict(norm="batchnorm"), "norm='batchnorm' is unknown"),
    (dict(precision="int4"), "precision='int4' is unknown"),
    (dict(layers=0), "layers=0 must be a whole number >= 1"),
    (dict(experts=4, top_k=8), "top_k=8 exceeds experts=4"),
    (dict(bias="yes"), "bias='yes' must be true or false"),
])
def test_invalid_model_raises_clear_error(kwargs, fragment):
    base = dict(layers=2, hidden=1024, heads=16, ffn_hidden=4096, vocab=100, seq_len=128)
    base.update(kwargs)
    with pytest.raises(WorkloadError, match="model 'bad'") as info:
        TransformerConfig("bad", **base)
    assert fragment in str(info.value)


# ---------------------------------------------------------------------- YAML loading
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


GOOD = """
model: {layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 1000, seq_len: 128}
parallelism: {tp: 2, dp: 2}
training: {global_batch: 8, micro_batch: 2, bucket_size: 4MiB, seq_len: 64, zero_stage: fsdp,
           offload: {optimizer: cxl}}
"""


def test_load_file_applies_overrides_and_units(tmp_path):
    spec = load_workload(_write(tmp_path, GOOD))
    assert spec.name == "w"
    assert spec.model.seq_len == 64
    assert spec.training.bucket_size == 4 * 2**20
    assert spec.training.zero_stage == 3
    assert spec.memory_options().offload_optimizer == "cxl"
    layout = spec.layout()
    assert (layout.tp, layout.dp, layout.world_size, layout.num_micro_batches) == (2, 2, 4, 2)
    assert spec.layout(num_gpus=8).dp == 4


def test_global_batch_defaults_to_one_micro_batch_per_replica(tmp_path):
    """Without training.global_batch: micro_batch × dp (Megatron-LM's default)."""
    path = tmp_path / "w.yaml"
    path.write_text(GOOD.replace("global_batch: 8, ", ""))
    spec = load_workload(path)
    assert spec.training.global_batch is None
    assert spec.layout().global_batch == 2 * 2 and spec.layout(num_gpus=8).global_batch == 2 * 4


@pytest.mark.parametrize("text,fragment", [
    (GOOD + "extra: 1\n", "unknown key 'extra'; valid keys: kind, name, description"),
    (GOOD.replace("seq_len: 128}", "seq_len: 128, hiden: 3}"), "model: unknown key 'hiden' (did you mean 'hidden'?); valid keys: hf_config, layers"),
    (GOOD.replace("dp: 2}", "dp: 2, pipeline: 2}"), "parallelism: unknown key 'pipeline'; valid keys: tp"),
    (GOOD.replace("micro_batch: 2,", "micro_batch: 2, batch: 1,"), "training: unknown key 'batch'"),
    (GOOD.replace("{optimizer: cxl}", "{optimiser: cxl}"), "training.offload: unknown key 'optimiser' (did you mean 'optimizer'?); "
                                                          "valid keys: optimizer, activations"),
    (GOOD.replace("vocab: 1000, ", ""), "model: lacks vocab"),
    (GOOD.replace("heads: 8", "heads: 7"), "hidden=256 is not divisible by heads=7"),
    (GOOD.replace("tp: 2", "tp: 3"), "heads=8 is not divisible by tp=3"),
    (GOOD.replace("layers: 4", "layers: four"), "model.layers"),
    (GOOD.replace("{optimizer: cxl}", "{optimizer: disk}"), "training.offload.optimizer: 'disk' is unknown"),
    ("model: [1, 2]\ntraining: {global_batch: 1}\n", "model: expected a mapping"),
    ("model: {layers: [\n", "invalid YAML"),
])
def test_bad_files_raise_spec_error_naming_file_and_key(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_workload(path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(SpecError, match="unknown workload 'gpt5'.*gpt3-175b"):
        load_workload("gpt5")
    with pytest.raises(SpecError, match="does not exist"):
        load_workload("nowhere/x.yaml")


def test_presets_load_by_name_and_by_path():
    by_name = load_workload("llama3-8b")
    by_path = load_workload(shipped_workloads()["llama3-8b"])
    assert by_name == by_path
    assert by_name.path is not None and by_name.path.name == "llama3-8b.yaml"
    assert by_name.training.device == "H100"


def test_yaml_schema_lists_exactly_the_dataclass_fields():
    # grad_precision is written in training: (TrainingSection) and carried by the model
    model_fields = {f.name for f in dataclasses.fields(TransformerConfig)} - {"name", "grad_precision"}
    assert set(ModelSection.model_fields) - {"hf_config"} == model_fields
    assert set(ParallelismSection.model_fields) == {f.name for f in dataclasses.fields(ParallelismSpec)}
    training = (set(TrainingSection.model_fields) - {"offload"}) | {f"offload_{k}" for k in OffloadSection.model_fields}
    assert training == {f.name for f in dataclasses.fields(TrainingSpec)}


def test_grad_precision_round_trips_through_the_schema_and_overrides():
    """training.grad_precision (Megatron's --grad-reduce-in-bf16, FSDP reduce_dtype) is one
    typed option: parsed into the spec and the model's precision, written back by
    workload_document, settable as an override (--grad-precision), refused where the recipe's
    weights are of another type, with the key named."""
    from dessim.workload.transformer.plan import resolve_workload, workload_document

    base = {"name": "g", "model": {"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 1024,
                                   "vocab": 1000, "seq_len": 128}}
    default = parse_workload(base, "g")
    assert default.training.grad_precision is None and default.model.precision_spec.grad_dtype == "fp32"
    bf16 = parse_workload({**base, "training": {"grad_precision": "bf16"}}, "g")
    assert bf16.training.grad_precision == "bf16" and bf16.model.grad_precision == "bf16"
    assert bf16.model.precision_spec.grad_bytes == 2
    doc = workload_document(bf16)
    assert doc["training"]["grad_precision"] == "bf16" and "grad_precision" not in doc["model"]
    again = parse_workload(doc, "again")
    assert (again.model, again.training) == (bf16.model, bf16.training)
    assert "grad_precision" not in workload_document(default)["training"]
    over, _, _ = resolve_workload(default, {"grad_precision": "bf16"})
    assert over.model.precision_spec.grad_bytes == 2
    with pytest.raises(SpecError, match=r"g: model 'g': training.grad_precision: bf16 gradients need bf16 "
                                        r"weights; precision fp16 has fp16 weights"):
        parse_workload({**base, "model": {**base["model"], "precision": "fp16"},
                        "training": {"grad_precision": "bf16"}}, "g")
    with pytest.raises(SpecError, match="grad_precision"):
        parse_workload({**base, "training": {"grad_precision": "fp8"}}, "g")
