"""Tiny MoE workload documents shared by the DeepEP / routing tests."""

from __future__ import annotations


def moe_doc(routing: dict, dispatch: str = "deepep", *, hidden: int = 1024, experts: int = 64,
            top_k: int = 8, ranks: int = 32) -> dict:
    """A 2-layer MoE workload (``hidden`` wide, ``ffn_hidden`` 4×, ``moe_ffn_hidden`` ½×,
    ``vocab`` 4×, ``seq_len`` 1×) with data and expert parallelism ``ranks`` and one sequence
    per rank, on H100s."""
    return {"name": "moe",
            "model": {"layers": 2, "hidden": hidden, "heads": 8, "ffn_hidden": 4 * hidden,
                      "vocab": 4 * hidden, "seq_len": hidden, "experts": experts, "top_k": top_k,
                      "moe_ffn_hidden": hidden // 2, "routing": routing},
            "parallelism": {"dp": ranks, "ep": ranks},
            "training": {"global_batch": ranks, "moe_dispatch": dispatch, "device": "H100"}}
