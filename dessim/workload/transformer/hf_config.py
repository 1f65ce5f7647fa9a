"""Hugging Face ``config.json`` files → the ``model:`` section of a transformer workload.

A user who has a model's ``config.json`` (from a local checkout of a Hugging Face model
repository; nothing is downloaded) can name it wherever dessim takes a workload:
``dessim simulate path/config.json --tp 8``, or ``model: {hf_config: path}`` in a workload
file (other ``model:`` keys override what the config says, e.g. ``seq_len``).

Each supported family (:data:`HF_FAMILIES`, keyed by the config's ``model_type``) is data: the
Hugging Face key of every dessim field, the defaults the ``transformers`` config class uses
when a key is absent, and the architecture facts a config does not spell out (norm, position
embedding, gated MLP, biases). Sources: the ``transformers`` configuration and modelling files
of each family (``src/transformers/models/<family>/configuration_<family>.py`` and
``modeling_<family>.py``, github.com/huggingface/transformers); docs/references.md.

Rules
    * ``seq_len`` is the config's context length (``max_position_embeddings``, GPT-2's
      ``n_positions``), except that with a sliding attention window (Mistral 7B v0.1) it is the
      window: dessim's attention is full attention, exact up to the window. A workload's
      ``training.seq_len`` (``--seq-len``) overrides it.
    * The MLP is gated (SwiGLU for ``silu``, GeGLU for GeLU) in the Llama-style families and
      plain (GeLU) in GPT-2 and GPT-NeoX.
    * ``torch_dtype`` is the stored checkpoint's type, not the training precision: the
      precision stays dessim's default (bf16) unless the workload names one.
    * DeepSeek-V2/V3 (``deepseek_v2``, ``deepseek_v3``): ``q_lora_rank`` (null: no query
      latent, dessim's 0), ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
      ``v_head_dim`` → ``mla``; ``first_k_dense_replace`` → ``dense_layers`` (their MLP is
      ``intermediate_size`` wide); ``n_shared_experts`` → ``shared_experts``;
      ``moe_intermediate_size`` → ``moe_ffn_hidden``; ``num_nextn_predict_layers`` →
      ``mtp_modules``; ``num_key_value_heads`` is not read (MLA has no grouped heads).
      Router details that change neither parameters nor FLOPs (``scoring_func``,
      ``topk_method``, ``norm_topk_prob``, ``routed_scaling_factor``, ``aux_loss_alpha``) are
      ignored; so is DeepSeek-V3's ``e_score_correction_bias`` (``n_routed_experts`` numbers
      per MoE layer, 14,848 in all), as the ``deepseek-v3`` preset does. Node-limited
      routing (``n_group`` > 1 groups, ``topk_group`` < ``n_group``: a token's experts on at
      most ``topk_group`` nodes) becomes ``routing.max_nodes = topk_group`` (a group read as
      a node of the EP group, as DeepSeek-V3 trains: EP64 over 8 nodes, 8 groups) and is
      reported in the model's ``description`` (``dessim workload show`` prints it as a note).
    * Qwen2-MoE: its one shared expert of width ``shared_expert_intermediate_size`` is
      ``shared_experts = shared_expert_intermediate_size / moe_intermediate_size`` experts of
      width ``moe_intermediate_size`` (exact: a SwiGLU MLP's parameters and FLOPs are linear
      in its width; a width that does not divide is an error). Not counted: the shared
      expert's sigmoid gate (``hidden`` parameters per layer) and the q/k/v biases, as for
      Qwen2 (together 0.001 % of Qwen1.5-MoE-A2.7B).
    * ``quantization_config`` (DeepSeek-V3's FP8 checkpoint) is, like ``torch_dtype``, the
      stored checkpoint format: the training precision is the workload's (``precision:
      fp8-block`` for DeepSeek-V3's recipe).
    * Features dessim's :class:`~dessim.workload.transformer.model.TransformerConfig` does not
      have (MoE on every n-th layer only: ``moe_layer_freq``/``decoder_sparse_step`` ≠ 1,
      ``mlp_only_layers``; head_dim ≠ hidden / heads outside MLA; biases on some projections
      only) are :class:`~dessim.errors.SpecError` ``not supported yet: <key>`` naming every
      such key, not silently dropped. One known approximation: Qwen2's query/key/value biases
      (``h + 2·kv`` parameters per layer, 0.002 % of Qwen2-7B) are not counted — dessim's
      ``bias`` is all linear layers or none, and Qwen2 has no other biases.
    * A config without ``model_type``, of an unknown ``model_type``, or missing a key its family
      needs is an error naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from dessim.errors import SpecError

__all__ = ["HFFamily", "HF_FAMILIES", "hf_model_section", "read_hf_config", "is_hf_config",
           "hf_workload_name", "HF_CONFIG_KEY"]

#: The ``model:`` key of a workload file that names a Hugging Face config.
HF_CONFIG_KEY = "hf_config"

#: Activation names of ``hidden_act`` / ``activation_function`` → dessim's activation in a
#: (plain MLP, gated MLP); None: dessim has no such activation (a plain SiLU MLP).
_ACTIVATIONS: Mapping[str, tuple[str | None, str]] = MappingProxyType({
    "silu": (None, "swiglu"),
    "swish": (None, "swiglu"),
    "gelu": ("gelu", "geglu"),
    "gelu_new": ("gelu", "geglu"),
    "gelu_fast": ("gelu", "geglu"),
    "gelu_pytorch_tanh": ("gelu", "geglu"),
    "relu": ("relu", "relu"),
})


def _present(value: Any) -> bool:
    """A feature key is in use: not absent, None, 0, False or empty."""
    return value not in (None, 0, False, [], {}, "")


@dataclass(frozen=True)
class HFFamily:
    """How one ``model_type`` maps to a :class:`TransformerConfig`.

    ``keys``: dessim model field → Hugging Face key. ``defaults``: value of a Hugging Face key
    when the file leaves it out (the ``transformers`` config class's default; a key without a
    default is required). ``gated``: the MLP is gated. ``bias``: function of the config giving
    dessim's ``bias`` (None: the config mixes biased and unbiased projections — unsupported).
    ``unsupported``: Hugging Face key → (in use?, what dessim lacks). ``extras``: function
    of the config (defaults filled in) and the file's name giving the model fields beyond the
    plain ones (MLA, shared experts, ...)."""

    name: str
    keys: Mapping[str, str]
    defaults: Mapping[str, Any]
    gated: bool
    norm: str
    position_embedding: str
    bias: Callable[[Mapping[str, Any]], bool | None]
    unsupported: Mapping[str, tuple[Callable[[Any], bool], str]] = field(default_factory=dict)
    source: str = ""
    extras: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None


_LLAMA_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size",
               "vocab": "vocab_size", "seq_len": "max_position_embeddings",
               "tied_embeddings": "tie_word_embeddings", "activation": "hidden_act"}
_LLAMA_DEFAULTS = {"tie_word_embeddings": False, "hidden_act": "silu"}


def _llama_bias(cfg: Mapping[str, Any]) -> bool | None:
    attn, mlp = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
    return attn if attn == mlp else None


def _no_bias(cfg: Mapping[str, Any]) -> bool:
    return False


def _all_bias(cfg: Mapping[str, Any]) -> bool:
    return True


def _neox_bias(cfg: Mapping[str, Any]) -> bool | None:
    # GPTNeoXConfig.attention_bias (default True) covers the attention projections; the MLP
    # (dense_h_to_4h, dense_4h_to_h) always has biases.
    return True if cfg.get("attention_bias", True) else None


_EVERY_LAYER = (lambda v: v not in (None, 1), "MoE on every n-th layer only")
_MOE_ONLY = {
    "moe_layer_freq": _EVERY_LAYER,
    "decoder_sparse_step": _EVERY_LAYER,
    "mlp_only_layers": (_present, "dense layers among the MoE layers"),
}

#: The MLA keys: dessim's :class:`~dessim.workload.transformer.mla.MLAConfig` fields carry the
#: Hugging Face names (``modeling_deepseek.py``); q_lora_rank null = queries projected
#: directly, dessim's 0.
_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")

#: Node-limited routing (DeepSeek-V3 report §2.1.2, "each token is sent to at most M nodes"):
#: ``n_group`` expert groups, a token's experts drawn from its ``topk_group`` best groups.
_GROUP_KEYS = ("n_group", "topk_group")


def _count0(cfg: Mapping[str, Any], key: str, where: str) -> int:
    """A whole number >= 0 of a key that may be absent or null (0)."""
    value = cfg.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}: {key}={value!r} must be a whole number >= 0 (or null)")
    return value


def _deepseek_extras(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA, dense first layers, shared experts and MTP modules (the released
    ``configuration_deepseek.py`` / ``modeling_deepseek.py`` of deepseek-ai/DeepSeek-V2-Lite
    and deepseek-ai/DeepSeek-V3). ``num_key_value_heads`` is not read: MLA has none (every
    head gets its own key and value from the latent). Node-limited routing (``topk_group``
    of ``n_group`` groups) becomes ``routing.max_nodes`` (a group read as a node of the EP
    group, as DeepSeek-V3 trains) and is named in the model's ``description``."""
    missing = [k for k in _MLA_KEYS if k not in cfg]
    if missing:
        raise SpecError(f"{where}: missing key(s) {', '.join(map(repr, missing))} (multi-head "
                        "latent attention dimensions)")
    mla = {k: _count0(cfg, k, where) if k == "q_lora_rank" else _count(cfg, k, where) for k in _MLA_KEYS}
    out: dict[str, Any] = {"mla": mla, "dense_layers": _count0(cfg, "first_k_dense_replace", where),
                           "shared_experts": _count0(cfg, "n_shared_experts", where),
                           "mtp_modules": _count0(cfg, "num_nextn_predict_layers", where)}
    groups, top = (_count0(cfg, k, where) for k in _GROUP_KEYS)
    if groups > 1 and top < groups:
        out["routing"] = {"max_nodes": top}
        out["description"] = (f"node-limited routing n_group={groups}, topk_group={top} read as "
                              f"routing.max_nodes={top}: a group is taken as a node of the EP group "
                              "(DeepSeek-V3 trains EP64 over 8 nodes, one group per node)")
    return out


def _qwen_extras(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Qwen2-MoE's one shared expert of width ``shared_expert_intermediate_size`` = dessim's
    ``shared_experts`` experts of width ``moe_intermediate_size`` (a gated MLP's parameters
    and FLOPs are linear in its width, so the two are exact equals when the width divides).
    Not counted: the shared expert's sigmoid gate (``shared_expert_gate``, ``hidden``
    parameters per layer) and the q/k/v biases (as Qwen2)."""
    width = _count0(cfg, "shared_expert_intermediate_size", where)
    expert = _count(cfg, "moe_intermediate_size", where)
    if width % expert:
        raise SpecError(f"{where}: not supported yet: shared_expert_intermediate_size={width!r} is "
                        f"not a multiple of moe_intermediate_size={expert!r} (dessim's shared "
                        "experts are as wide as the routed ones)")
    return {"shared_experts": width // expert}


_TF = "github.com/huggingface/transformers, src/transformers/models"

#: DeepSeek-V2/V3: Llama's keys without ``num_key_value_heads`` (MLA has no grouped heads),
#: with routed experts of width ``moe_intermediate_size``.
_DEEPSEEK_KEYS = {**{k: v for k, v in _LLAMA_KEYS.items() if k != "kv_heads"},
                  "experts": "n_routed_experts", "top_k": "num_experts_per_tok",
                  "moe_ffn_hidden": "moe_intermediate_size"}

#: Supported families by ``model_type``.
HF_FAMILIES: Mapping[str, HFFamily] = MappingProxyType({f.name: f for f in (
    HFFamily("llama", _LLAMA_KEYS, _LLAMA_DEFAULTS, gated=True, norm="rmsnorm",
             position_embedding="rope", bias=_llama_bias,
             source=f"{_TF}/llama/configuration_llama.py, modeling_llama.py"),
    HFFamily("mistral", _LLAMA_KEYS, _LLAMA_DEFAULTS, gated=True, norm="rmsnorm",
             position_embedding="rope", bias=_no_bias,
             source=f"{_TF}/mistral/configuration_mistral.py, modeling_mistral.py"),
    HFFamily("mixtral", {**_LLAMA_KEYS, "experts": "num_local_experts", "top_k": "num_experts_per_tok"},
             {**_LLAMA_DEFAULTS, "num_local_experts": 8, "num_experts_per_tok": 2}, gated=True,
             norm="rmsnorm", position_embedding="rope", bias=_no_bias,
             source=f"{_TF}/mixtral/configuration_mixtral.py, modeling_mixtral.py"),
    HFFamily("qwen2", _LLAMA_KEYS, _LLAMA_DEFAULTS, gated=True, norm="rmsnorm",
             position_embedding="rope", bias=_no_bias,
             source=f"{_TF}/qwen2/configuration_qwen2.py, modeling_qwen2.py (q/k/v biases: "
                    "module docstring)"),
    HFFamily("qwen2_moe", {**_LLAMA_KEYS, "experts": "num_experts", "top_k": "num_experts_per_tok",
                           "moe_ffn_hidden": "moe_intermediate_size"},
             {**_LLAMA_DEFAULTS, "num_experts": 60, "num_experts_per_tok": 4,
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}, gated=True,
             norm="rmsnorm", position_embedding="rope", bias=_no_bias, unsupported=_MOE_ONLY,
             source=f"{_TF}/qwen2_moe/configuration_qwen2_moe.py, modeling_qwen2_moe.py",
             extras=_qwen_extras),
    HFFamily("deepseek_v2", _DEEPSEEK_KEYS, _LLAMA_DEFAULTS, gated=True, norm="rmsnorm",
             position_embedding="rope", bias=_llama_bias, unsupported=_MOE_ONLY,
             source=f"{_TF}/deepseek_v2/configuration_deepseek_v2.py", extras=_deepseek_extras),
    HFFamily("deepseek_v3", _DEEPSEEK_KEYS, _LLAMA_DEFAULTS, gated=True, norm="rmsnorm",
             position_embedding="rope", bias=_llama_bias, unsupported=_MOE_ONLY,
             source=f"{_TF}/deepseek_v3/configuration_deepseek_v3.py", extras=_deepseek_extras),
    HFFamily("gpt2", {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head",
                      "ffn_hidden": "n_inner", "vocab": "vocab_size", "seq_len": "n_positions",
                      "tied_embeddings": "tie_word_embeddings", "activation": "activation_function"},
             {"n_inner": None, "tie_word_embeddings": True, "activation_function": "gelu_new"},
             gated=False, norm="layernorm", position_embedding="learned", bias=_all_bias,
             source=f"{_TF}/gpt2/configuration_gpt2.py (n_inner None = 4 × n_embd), modeling_gpt2.py"),
    HFFamily("gpt_neox", {"layers": "num_hidden_layers", "hidden": "hidden_size",
                          "heads": "num_attention_heads", "ffn_hidden": "intermediate_size",
                          "vocab": "vocab_size", "seq_len": "max_position_embeddings",
                          "tied_embeddings": "tie_word_embeddings", "activation": "hidden_act"},
             {"tie_word_embeddings": False, "hidden_act": "gelu"}, gated=False, norm="layernorm",
             position_embedding="rope", bias=_neox_bias,
             source=f"{_TF}/gpt_neox/configuration_gpt_neox.py, modeling_gpt_neox.py"),
)})


def is_hf_config(data: Any) -> bool:
    """True for a parsed document that is a Hugging Face model config (it has ``model_type``
    or ``architectures`` and no workload sections)."""
    return (isinstance(data, dict) and ("model_type" in data or "architectures" in data)
            and "model" not in data)


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed JSON of a ``config.json`` (a file, or a directory holding ``config.json``)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise SpecError(f"Hugging Face config {str(path)!r} does not exist (a local config.json or "
                        "the directory holding it; dessim does not download)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"Hugging Face config {str(p)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"Hugging Face config {str(p)!r}: expected a JSON object, got {type(data).__name__}")
    return data


def hf_workload_name(path: str | Path) -> str:
    """A workload name for a config file: its directory's name for ``config.json`` (model
    repositories are checked out as ``<model>/config.json``), else the file's stem."""
    p = Path(path)
    if p.is_dir():
        return p.resolve().name
    return p.resolve().parent.name if p.name == "config.json" else p.stem


def _count(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{where}: {key}={value!r} must be a whole number >= 1")
    return value


def _activation(family: HFFamily, name: Any, key: str, where: str) -> str:
    pair = _ACTIVATIONS.get(name) if isinstance(name, str) else None
    found = None if pair is None else pair[1] if family.gated else pair[0]
    if found is None:
        valid = ", ".join(k for k, v in _ACTIVATIONS.items() if v[1 if family.gated else 0])
        raise SpecError(f"{where}: not supported yet: {key}={name!r} ({'gated' if family.gated else 'plain'} "
                        f"MLP); supported: {valid}")
    return found


def hf_model_section(cfg: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """The workload ``model:`` section (dessim field names, counts; see
    :mod:`dessim.workload.transformer.model`) of a parsed Hugging Face config; ``origin``
    names the file in errors."""
    model_type = cfg.get("model_type")
    if model_type is None:
        raise SpecError(f"{origin}: a Hugging Face config needs 'model_type' (the architecture "
                        f"family); supported: {', '.join(HF_FAMILIES)}")
    family = HF_FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise SpecError(f"{origin}: model_type {model_type!r} is not supported; supported: "
                        f"{', '.join(HF_FAMILIES)}")
    where = f"{origin} ({model_type})"
    unsupported = [f"{key}={cfg[key]!r} ({why})" for key, (used, why) in family.unsupported.items()
                   if key in cfg and used(cfg[key])]
    values = {**family.defaults, **cfg}
    hidden_key, heads_key = family.keys["hidden"], family.keys["heads"]
    for key in (hidden_key, heads_key):
        if key not in values:
            raise SpecError(f"{where}: missing key {key!r}")
    head_dim = cfg.get("head_dim")
    hidden, heads = _count(values, hidden_key, where), _count(values, heads_key, where)
    extras = family.extras(values, where) if family.extras else {}
    if head_dim is not None and "mla" not in extras and head_dim * heads != hidden:
        unsupported.append(f"head_dim={head_dim!r} (heads × head_dim ≠ hidden: dessim's head_dim is "
                           f"hidden / heads = {hidden / heads:g})")
    bias = family.bias(cfg)
    if bias is None:
        unsupported.append("attention_bias/mlp_bias (biases on some projections only)")
    if unsupported:
        raise SpecError(f"{where}: not supported yet: {'; '.join(unsupported)}")
    model: dict[str, Any] = {}
    for name, key in family.keys.items():
        if key not in values:
            if name == "kv_heads":
                continue                        # multi-head attention
            raise SpecError(f"{where}: missing key {key!r} (dessim's {name})")
        value = values[key]
        if name == "activation":
            model[name] = _activation(family, value, key, where)
        elif name == "tied_embeddings":
            if not isinstance(value, bool):
                raise SpecError(f"{where}: {key}={value!r} must be true or false")
            model[name] = value
        elif name == "ffn_hidden" and value is None:
            model[name] = 4 * hidden                            # GPT-2's n_inner default
        elif name == "kv_heads" and value is None:
            continue
        else:
            model[name] = _count(values, key, where)
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window", True) and isinstance(window, int) and 0 < window < model["seq_len"]:
        model["seq_len"] = window               # full attention is exact up to the window
    model.update(norm=family.norm, position_embedding=family.position_embedding, bias=bias,
                 dropout=bool(cfg.get("attention_dropout") or cfg.get("attn_pdrop")
                              or cfg.get("hidden_dropout") or cfg.get("resid_pdrop")))
    model.update(extras)
    return model
