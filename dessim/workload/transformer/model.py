"""Transformer model configurations (dense and mixture-of-experts) and their parameter counts.

A :class:`TransformerConfig` is the architecture of a decoder-only transformer: what the
parameter counts, the kernel list (:mod:`dessim.workload.transformer.kernels`), the FLOP counts
(:mod:`dessim.workload.transformer.flops`) and the memory estimates (:mod:`dessim.workload.transformer.memory`) are
computed from. Presets of published models live as YAML files in ``workloads/`` and are
loaded with :func:`dessim.workload.load_workload`.

Conventions and assumptions
    * ``head_dim = hidden / heads``; queries use ``heads`` heads, keys and values
      ``kv_heads`` heads (grouped-query attention; ``kv_heads == heads`` is multi-head).
    * The MLP has 2 weight matrices for GeLU (up ``h×f``, down ``f×h``) and 3 for SwiGLU
      (gate and up ``h×f``, down ``f×h``) — the LLaMA / PaLM form.
    * Mixture of experts (``experts > 1``): every layer's MLP but the first ``dense_layers``
      (DeepSeek's ``first_k_dense_replace``; 0 = every layer, Mixtral style) is replaced by
      ``experts`` routed MLPs of width ``moe_ffn_hidden`` and a bias-free linear router
      ``h×experts``; each token goes through ``top_k`` of them (``routing``: how evenly,
      :mod:`dessim.workload.transformer.routing`) and through all ``shared_experts`` MLPs of
      width ``moe_ffn_hidden`` (DeepSeekMoE, Dai et al. 2024: fine-grained experts are the
      narrow ``moe_ffn_hidden``, shared experts are always active).
    * ``mla``: multi-head latent attention (DeepSeek-V2/V3,
      :mod:`dessim.workload.transformer.mla`) instead of Q/K/V projections.
    * ``mtp_modules``: multi-token prediction depth (DeepSeek-V3 report §2.2): each module is
      a projection ``2h×h`` of [norm(h), norm(embedding)] (two RMSNorms), one transformer
      layer (an MoE layer) and a final norm; it shares the embedding and LM head with the main
      model. Published totals ("671B") leave the MTP modules out; :meth:`num_params` has
      ``include_mtp``.
    * Biases (``bias: true``, GPT-2/3 and Megatron GPT style) are on every linear layer
      except the router and the LM head; norms have a weight (RMSNorm) or a weight and a
      bias (LayerNorm). There are two norms per layer plus a final norm.
    * Learned position embeddings hold ``seq_len × hidden`` parameters; RoPE holds none.
    * ``tied_embeddings``: the LM head reuses the input embedding matrix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dessim.errors import WorkloadError
from dessim.workload.common.precision import PRECISIONS, Precision
from dessim.workload.transformer.mla import MLAConfig
from dessim.workload.transformer.routing import MoERouting

__all__ = [
    "Activation",
    "ACTIVATIONS",
    "Norm",
    "NORMS",
    "POSITION_EMBEDDINGS",
    "TransformerConfig",
]


@dataclass(frozen=True, slots=True)
class Activation:
    """An MLP activation function.

    ``matrices``: weight matrices of the MLP (2 for ``act(xW1)W2``, 3 for gated units
    ``(act(xWg) * xWu)Wd``). ``flops_per_element``: rough FLOPs per element of the
    activation kernel (tanh-GeLU ≈ 8, SiLU-and-multiply ≈ 5: our estimates from counting
    the arithmetic of the formulas; these kernels are memory-bound, so the exact count barely
    matters and they are not part of model FLOPs).
    """

    name: str
    matrices: int
    flops_per_element: float

    @property
    def gated(self) -> bool:
        return self.matrices == 3


ACTIVATIONS: Mapping[str, Activation] = MappingProxyType({
    "gelu": Activation("gelu", 2, 8.0),
    "relu": Activation("relu", 2, 1.0),
    "swiglu": Activation("swiglu", 3, 5.0),
    "geglu": Activation("geglu", 3, 9.0),
})


@dataclass(frozen=True, slots=True)
class Norm:
    """A normalisation layer: ``params_per_hidden`` parameters per hidden unit (LayerNorm has
    weight and bias, RMSNorm only a weight) and rough FLOPs per element (LayerNorm ≈ 8: mean,
    subtract, square, sum, scale, weight, bias; RMSNorm ≈ 4: square, sum, scale, weight)."""

    name: str
    params_per_hidden: int
    flops_per_element: float


NORMS: Mapping[str, Norm] = MappingProxyType({
    "layernorm": Norm("layernorm", 2, 8.0),
    "rmsnorm": Norm("rmsnorm", 1, 4.0),
})

#: Position embeddings: "learned" (a seq_len × hidden table, GPT) or "rope" (no parameters).
POSITION_EMBEDDINGS: tuple[str, ...] = ("learned", "rope")


def _choice(value: object, registry: Mapping[str, object] | tuple[str, ...], what: str) -> None:
    if value not in registry:
        raise WorkloadError(f"{what}={value!r} is unknown; valid: {', '.join(sorted(registry))}")


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    """A decoder-only transformer (see the module docstring for the conventions).

    Sizes are counts (not bytes). ``kv_heads=None`` means multi-head attention
    (``kv_heads = heads``); ``moe_ffn_hidden=None`` means ``ffn_hidden``. ``experts=1`` is a
    dense model. Invalid values raise :class:`~dessim.errors.WorkloadError` naming the model,
    the field and the value.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    activation: str = "gelu"
    norm: str = "layernorm"
    position_embedding: str = "learned"
    bias: bool = True
    dropout: bool = True
    tied_embeddings: bool = True
    precision: str = "bf16"
    experts: int = 1
    top_k: int = 1
    moe_ffn_hidden: int | None = None
    dense_layers: int = 0
    shared_experts: int = 0
    routing: MoERouting = MoERouting()
    mla: MLAConfig | None = None
    mtp_modules: int = 0
    #: gradient precision (``training.grad_precision`` of a workload file, carried here as
    #: ``training.seq_len`` is): None = the recipe's (fp32 for the bf16 recipes, fp16 for fp16;
    #: :mod:`dessim.workload.common.precision`, "Gradients")
    grad_precision: str | None = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for name in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len", "experts", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{where}: {name}={value!r} must be a whole number >= 1")
        for name in ("kv_heads", "moe_ffn_hidden"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise WorkloadError(f"{where}: {name}={value!r} must be a whole number >= 1")
        for name in ("bias", "dropout", "tied_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise WorkloadError(f"{where}: {name}={getattr(self, name)!r} must be true or false")
        _choice(self.activation, ACTIVATIONS, f"{where}: activation")
        _choice(self.norm, NORMS, f"{where}: norm")
        _choice(self.position_embedding, POSITION_EMBEDDINGS, f"{where}: position_embedding")
        _choice(self.precision, PRECISIONS, f"{where}: precision")
        PRECISIONS[self.precision].with_grad_precision(self.grad_precision, f"{where}: training.grad_precision")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.moe_ffn_hidden is None:
            object.__setattr__(self, "moe_ffn_hidden", self.ffn_hidden)
        if self.hidden % self.heads:
            raise WorkloadError(f"{where}: hidden={self.hidden} is not divisible by heads={self.heads} "
                                "(head_dim = hidden / heads must be whole)")
        if self.heads % self.kv_heads:
            raise WorkloadError(f"{where}: heads={self.heads} is not divisible by kv_heads="
                                f"{self.kv_heads} (each key/value head serves a whole group of query heads)")
        if self.top_k > self.experts:
            raise WorkloadError(f"{where}: top_k={self.top_k} exceeds experts={self.experts}")
        for name in ("dense_layers", "shared_experts", "mtp_modules"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"{where}: {name}={value!r} must be a whole number >= 0")
        if not self.is_moe and (self.dense_layers or self.shared_experts):
            raise WorkloadError(f"{where}: dense_layers/shared_experts need a mixture of experts "
                                f"(experts > 1; got experts={self.experts})")
        if self.dense_layers >= self.layers and self.is_moe:
            raise WorkloadError(f"{where}: dense_layers={self.dense_layers} leaves no MoE layer "
                                f"of layers={self.layers}")
        if self.mla is not None and (self.bias or self.kv_heads != self.heads):
            raise WorkloadError(f"{where}: mla (multi-head latent attention) has no biases and "
                                "no kv_heads (give bias: false and leave kv_heads out)")
        if not isinstance(self.routing, MoERouting):
            raise WorkloadError(f"{where}: routing must be a MoERouting, got {self.routing!r}")
        shares = self.routing.shares(self.experts)        # counts: one per expert
        used = sum(x > 0 for x in shares)
        if self.is_moe and used < self.top_k:
            raise WorkloadError(f"{where}: routing sends tokens to {used} of {self.experts} "
                                f"experts (the others have count 0), fewer than "
                                f"top_k={self.top_k}: a token picks top_k distinct experts")

    # ------------------------------------------------------------------ derived figures
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: ``kv_heads * head_dim`` (MLA: the
        keys' ``heads · (qk_nope_head_dim + qk_rope_head_dim)``)."""
        if self.mla is not None:
            return self.heads * self.mla.qk_head_dim
        return self.kv_heads * self.head_dim  # type: ignore[operator]

    @property
    def attention_core_width(self) -> int:
        """``heads · (query/key width + value width)`` per head summed: attention-core FLOPs
        per query-key pair are twice this (``2h`` for standard attention)."""
        if self.mla is not None:
            return self.mla.core_width(self.heads)
        return 2 * self.hidden

    @property
    def moe_layers(self) -> int:
        """Layers with a routed MLP (0 for a dense model)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def is_dense_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) has a dense MLP."""
        return not self.is_moe or index < self.dense_layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def precision_spec(self) -> Precision:
        """The precision recipe with the gradients of ``grad_precision``."""
        return PRECISIONS[self.precision].with_grad_precision(self.grad_precision)

    @property
    def activation_spec(self) -> Activation:
        return ACTIVATIONS[self.activation]

    @property
    def norm_spec(self) -> Norm:
        return NORMS[self.norm]

    def with_seq_len(self, seq_len: int) -> "TransformerConfig":
        """The same model trained on sequences of ``seq_len`` tokens."""
        return dataclasses.replace(self, seq_len=seq_len)

    # ------------------------------------------------------------------ parameter counts
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer (+ their biases; MLA: its projections
        and latent norms)."""
        if self.mla is not None:
            return self.mla.params(self.hidden, self.heads)
        h, kv = self.hidden, self.kv_dim
        weights = h * (h + 2 * kv) + h * h
        biases = (h + 2 * kv) + h if self.bias else 0
        return weights + biases

    def attention_matmul_params(self) -> int:
        """Weights of the attention block's GEMMs (no biases, no norms)."""
        if self.mla is not None:
            return self.mla.matmul_params(self.hidden, self.heads)
        h = self.hidden
        return h * (h + 2 * self.kv_dim) + h * h

    def mlp_params(self, ffn: int | None = None) -> int:
        """One MLP (or one expert) of width ``ffn`` (default ``ffn_hidden``)."""
        f = self.ffn_hidden if ffn is None else ffn
        mats = self.activation_spec.matrices
        weights = mats * self.hidden * f
        biases = (mats - 1) * f + self.hidden if self.bias else 0
        return weights + biases

    def norm_params(self) -> int:
        """One norm layer."""
        return self.norm_spec.params_per_hidden * self.hidden

    def router_params(self) -> int:
        """The MoE router of one layer (0 for a dense model)."""
        return self.hidden * self.experts if self.is_moe else 0

    def moe_mlp_params(self) -> int:
        """The MLP part of one MoE layer: routed and shared experts and the router."""
        return ((self.experts + self.shared_experts) * self.mlp_params(self.moe_ffn_hidden)
                + self.router_params())

    def layer_params(self, dense: bool = False) -> int:
        """All parameters of one transformer layer (every expert counted): an MoE layer of an
        MoE model unless ``dense`` (one of its ``dense_layers``)."""
        mlp = self.moe_mlp_params() if self.is_moe and not dense else self.mlp_params()
        return self.attention_params() + mlp + 2 * self.norm_params()

    def layer_active_params(self) -> int:
        """Parameters of one (MoE) layer that one token passes through (``top_k`` routed
        and every shared expert)."""
        if not self.is_moe:
            return self.layer_params()
        return self.layer_params() - (self.experts - self.top_k) * self.mlp_params(self.moe_ffn_hidden)

    def mtp_module_params(self) -> int:
        """One multi-token-prediction module without the shared embedding and head: its
        ``2h×h`` projection, 3 norms (two inputs, one output) and one layer."""
        h = self.hidden
        return 2 * h * h + 3 * self.norm_params() + self.layer_params()

    def embedding_params(self) -> int:
        """Token embedding (+ learned position embedding)."""
        pos = self.seq_len * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """LM head (output projection to the vocabulary); 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def param_breakdown(self) -> dict[str, int]:
        """Exact parameter count per component of the whole model (``mtp``: the
        multi-token-prediction modules, 0 without)."""
        dense = self.layers - self.moe_layers
        return {
            "embedding": self.embedding_params(),
            "attention": self.layers * self.attention_params(),
            "mlp": self.moe_layers * self.moe_mlp_params() + dense * self.mlp_params(),
            "norms": (2 * self.layers + 1) * self.norm_params(),
            "lm_head": self.head_params(),
            "mtp": self.mtp_modules * self.mtp_module_params(),
        }

    def num_params(self, include_mtp: bool = True) -> int:
        """Total parameter count (every expert counted; the MTP modules unless
        ``include_mtp`` is false, as published totals count them)."""
        parts = self.param_breakdown()
        return sum(parts.values()) - (0 if include_mtp else parts["mtp"])

    def num_active_params(self, include_mtp: bool = True) -> int:
        """Parameters used per token (``top_k`` of the routed experts); equals
        :meth:`num_params` for a dense model."""
        moe = self.moe_layers + (self.mtp_modules if include_mtp else 0)
        return (self.num_params(include_mtp)
                - moe * (self.layer_params() - self.layer_active_params()))
