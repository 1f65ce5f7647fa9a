"""Multi-head latent attention (MLA) of DeepSeek-V2/V3: parameters, activations, FLOPs.

MLA (DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, §2.1; DeepSeek-V3 report,
arXiv:2412.19437, §2.1.1) compresses keys and values into a latent of ``kv_lora_rank``
elements per token and queries into one of ``q_lora_rank``; every head then gets a
"no-position" part (``qk_nope_head_dim``) up-projected from the latent and a RoPE part
(``qk_rope_head_dim``; the key's RoPE part is one vector per token shared by all heads).
Weights of one layer (names of the released ``modeling_deepseek.py``), ``H`` heads::

    q_a_proj   h × q_lora_rank                  (absent when q_lora_rank = 0: q_proj h × H·d_qk)
    q_a_layernorm  q_lora_rank                  (RMSNorm)
    q_b_proj   q_lora_rank × H·d_qk             d_qk = qk_nope_head_dim + qk_rope_head_dim
    kv_a_proj_with_mqa  h × (kv_lora_rank + qk_rope_head_dim)
    kv_a_layernorm  kv_lora_rank                (RMSNorm)
    kv_b_proj  kv_lora_rank × H·(qk_nope_head_dim + v_head_dim)
    o_proj     H·v_head_dim × h

Training runs the up-projections explicitly (no weight absorption: that is an inference
trick), so attention itself is ordinary attention with ``H`` heads of query/key width
``d_qk`` and value width ``v_head_dim``: forward FLOPs ``2·s_q·s_k·(d_qk + v_head_dim)`` per
head (both GEMMs over the full ``s²``, as :mod:`dessim.workload.transformer.kernels`).
Tensor parallelism (Megatron-LM's MLA): the down-projections (``q_a``, ``kv_a``) are
replicated on every TP rank, the up-projections and ``o_proj`` are split by heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from dessim.errors import WorkloadError

__all__ = ["MLAConfig"]


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """The MLA dimensions of one model (counts, not bytes). DeepSeek-V3: 1536, 512, 64, 128,
    128 (its released ``config.json``)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0        #: 0: queries are projected directly (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank"):
            value = getattr(self, name)
            low = 0 if name == "q_lora_rank" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise WorkloadError(f"mla: {name}={value!r} must be a whole number >= {low}")

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    # ------------------------------------------------------------------ weights
    def replicated_weights(self, hidden: int) -> int:
        """Weights of the down-projections (``q_a``, ``kv_a``), whole on every TP rank."""
        q = hidden * self.q_lora_rank
        return q + hidden * (self.kv_lora_rank + self.qk_rope_head_dim)

    def split_weights(self, hidden: int, heads: int) -> int:
        """Weights split over TP by heads: ``q_b`` (or ``q_proj``), ``kv_b`` and ``o_proj``."""
        q_in = self.q_lora_rank or hidden
        return (q_in * heads * self.qk_head_dim
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
                + heads * self.v_head_dim * hidden)

    def norm_params(self) -> int:
        """The two latent RMSNorms (``q_a_layernorm`` only with a query latent)."""
        return self.q_lora_rank + self.kv_lora_rank

    def params(self, hidden: int, heads: int) -> int:
        """Every parameter of one MLA block."""
        return self.replicated_weights(hidden) + self.split_weights(hidden, heads) + self.norm_params()

    def matmul_params(self, hidden: int, heads: int) -> int:
        """Weights of its GEMMs (what ``2·params`` FLOPs per token count)."""
        return self.replicated_weights(hidden) + self.split_weights(hidden, heads)

    # ------------------------------------------------------------------ activations
    def core_width(self, heads: int) -> int:
        """``H·(d_qk + v_head_dim)``: attention core FLOPs per query-key pair / 2."""
        return heads * (self.qk_head_dim + self.v_head_dim)

    def stored_elements(self, tokens: int, heads: int, tp: int) -> float:
        """Activation elements one layer's attention keeps for the backward (no recompute),
        beyond the block input: the latents and their norms, Q, K, V and the attention
        output (the input of ``o_proj``)."""
        latents = 2 * tokens * (self.q_lora_rank + self.kv_lora_rank) + tokens * self.qk_rope_head_dim
        per_head = 2 * self.qk_head_dim + 2 * self.v_head_dim        # Q, K, V, O
        return float(latents + tokens * heads * per_head / tp)
