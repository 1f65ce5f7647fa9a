"""Megatron-LM launch arguments (``pretrain_gpt.py``) → a transformer workload.

``dessim megatron -t TOPOLOGY -- --num-layers 96 --hidden-size 12288 ...`` simulates what that
launch would run on the topology's GPUs (``data-parallel size = GPUs / (TP·PP·CP)``, as
Megatron computes it from the world size). Every flag is in exactly one table:

* :data:`MAPPED` — flags that set the model, the layout or the training step;
* :data:`NO_EFFECT` — flags that do not change one training iteration (learning rate, data
  paths, logging, checkpointing, the batch-size ramp-up: dessim simulates a steady-state
  iteration at the full global batch);
* :data:`UNSUPPORTED` — Megatron features dessim does not model (yet), with the reason;
* anything else is *unknown*.

Unsupported and unknown flags are never dropped silently: :func:`megatron_workload` raises a
:class:`~dessim.errors.SpecError` listing them all unless ``allow_unsupported`` is set, and
then returns them for the caller to print.

Defaults and derived values follow Megatron-LM's ``megatron/training/arguments.py``
(github.com/NVIDIA/Megatron-LM; docs/references.md "Megatron-LM arguments"):

* ``--ffn-hidden-size`` defaults to ``4·h``, or ``int(4·h·2/3 / 64)·64`` with ``--swiglu``;
* ``--global-batch-size`` defaults to ``micro-batch-size × data-parallel size``;
* the vocabulary is padded to a multiple of ``--make-vocab-size-divisible-by`` (128) ×
  TP (``_vocab_size_with_padding``, ``megatron/training/tokenizer/tokenizer.py``); with
  ``--vocab-file`` and the GPT-2 BPE tokenizer its size is the file's entry count, or GPT-2's
  50,257 when the file is not on this machine;
* dropout 0.1, LayerNorm, learned absolute positions, biases, tied embeddings, fp32 without
  ``--bf16``/``--fp16``, ``--moe-router-topk`` 2, ``--num-query-groups`` 1 with
  ``--group-query-attention``;
* ``--num-layers-per-virtual-pipeline-stage N`` gives ``layers / PP / N`` model chunks per
  stage (the interleaved schedule); ``--use-distributed-optimizer`` is ZeRO stage 1 (optimizer
  state sharded over data parallelism, gradients reduce-scattered, parameters all-gathered);
* gradient buckets (``megatron/core/distributed/distributed_data_parallel.py``): with
  ``--overlap-grad-reduce``, ``max(40,000,000, 1,000,000 × DP)`` parameters per bucket
  (``--ddp-bucket-size`` overrides), each reduced as soon as the backward fills it; without it,
  one reduction after the backward (dessim ``bucket_size: 0``);
* gradients (``accumulate_allreduce_grads_in_fp32``): fp32 with ``--bf16`` unless
  ``--grad-reduce-in-bf16`` (``training.grad_precision: bf16``), fp16 with ``--fp16`` unless
  ``--accumulate-allreduce-grads-in-fp32`` (``training.grad_precision: fp32``);
* DeepSeek-style models: ``--multi-latent-attention`` and its dimensions (Megatron's defaults,
  :data:`_MLA_FLAGS`), ``--moe-layer-freq`` with the dense layers first, shared experts as
  ``--moe-shared-expert-intermediate-size`` / ``--moe-ffn-hidden-size`` experts of the routed
  width, ``--mtp-num-layers`` (:func:`_mla`, :func:`_moe_layers`).
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from dessim.errors import SpecError
from dessim.workload.common.precision import PRECISIONS, Precision

__all__ = ["MegatronLaunch", "MAPPED", "NO_EFFECT", "UNSUPPORTED", "parse_megatron_args",
           "megatron_workload", "GPT2_VOCAB"]

#: Entries of GPT-2's BPE vocabulary (``gpt2-vocab.json``), the default tokenizer of the GPT
#: recipes (Radford et al. 2019; the vocab_size of openai-community/gpt2's config.json).
GPT2_VOCAB = 50257

#: Flags that set the model, the layout or the training step → number of values (0: a switch).
MAPPED: Mapping[str, int] = MappingProxyType({
    "num-layers": 1, "hidden-size": 1, "ffn-hidden-size": 1, "num-attention-heads": 1,
    "group-query-attention": 0, "num-query-groups": 1, "seq-length": 1,
    "max-position-embeddings": 1, "micro-batch-size": 1, "global-batch-size": 1,
    "tensor-model-parallel-size": 1, "pipeline-model-parallel-size": 1,
    "context-parallel-size": 1, "expert-model-parallel-size": 1, "expert-tensor-parallel-size": 1,
    "num-layers-per-virtual-pipeline-stage": 1, "virtual-pipeline-model-parallel-size": 1,
    "num-virtual-stages-per-pipeline-rank": 1, "sequence-parallel": 0,
    "recompute-granularity": 1, "recompute-method": 1, "recompute-num-layers": 1,
    "recompute-activations": 0, "use-distributed-optimizer": 0, "bf16": 0, "fp16": 0,
    "fp8-format": 1, "fp8-recipe": 1, "swiglu": 0, "untie-embeddings-and-output-weights": 0, "num-experts": 1,
    "moe-router-topk": 1, "moe-ffn-hidden-size": 1, "moe-token-dispatcher-type": 1,
    "moe-enable-deepep": 0, "decoder-first-pipeline-num-layers": 1,
    "decoder-last-pipeline-num-layers": 1, "account-for-embedding-in-pipeline-split": 0,
    "account-for-loss-in-pipeline-split": 0, "vocab-size": 1,
    "make-vocab-size-divisible-by": 1, "vocab-file": 1, "merge-file": 1, "tokenizer-type": 1,
    "normalization": 1, "position-embedding-type": 1, "use-rotary-position-embeddings": 0,
    "disable-bias-linear": 0, "hidden-dropout": 1, "attention-dropout": 1,
    "attention-backend": 1, "use-flash-attn": 0, "overlap-grad-reduce": 0,
    "ddp-bucket-size": 1, "accumulate-allreduce-grads-in-fp32": 0, "kv-channels": 1,
    "grad-reduce-in-bf16": 0,
    "multi-latent-attention": 0, "q-lora-rank": 1, "kv-lora-rank": 1, "qk-head-dim": 1,
    "qk-pos-emb-head-dim": 1, "v-head-dim": 1, "qk-layernorm": 0,
    "moe-shared-expert-intermediate-size": 1, "moe-layer-freq": 1, "mtp-num-layers": 1,
    "moe-grouped-gemm": 0, "moe-shared-expert-overlap": 0, "tp-comm-overlap": 0,
    # older Megatron's switch for what dessim always does: pipeline sends on their own streams
    "overlap-p2p-communication": 0,
})

#: Flags that do not change one steady-state iteration → number of values (-1: any).
NO_EFFECT: Mapping[str, int] = MappingProxyType({
    "train-iters": 1, "train-samples": 1, "rampup-batch-size": 3, "lr": 1, "min-lr": 1,
    "lr-decay-style": 1, "lr-decay-iters": 1, "lr-decay-samples": 1, "lr-warmup-fraction": 1,
    "lr-warmup-iters": 1, "lr-warmup-samples": 1, "weight-decay": 1, "adam-beta1": 1,
    "adam-beta2": 1, "adam-eps": 1, "init-method-std": 1, "clip-grad": 1, "seed": 1,
    "loss-scale": 1, "initial-loss-scale": 1, "min-loss-scale": 1, "loss-scale-window": 1,
    "hysteresis": 1, "data-path": -1, "split": 1, "data-cache-path": 1, "mock-data": 0,
    "log-interval": 1, "save-interval": 1, "eval-interval": 1, "eval-iters": 1, "save": 1,
    "load": 1, "tensorboard-dir": 1, "log-throughput": 0, "log-timers-to-tensorboard": 0,
    "log-validation-ppl-to-tensorboard": 0, "log-memory-to-tensorboard": 0, "wandb-project": 1,
    "wandb-exp-name": 1, "no-load-optim": 0, "no-load-rng": 0, "distributed-backend": 1,
    "distributed-timeout-minutes": 1, "exit-duration-in-mins": 1, "exit-interval": 1,
    "tokenizer-model": 1, "ckpt-format": 1, "use-checkpoint-args": 0, "finetune": 0,
    "no-masked-softmax-fusion": 0, "no-bias-gelu-fusion": 0, "no-bias-dropout-fusion": 0,
    "no-gradient-accumulation-fusion": 0, "no-async-tensor-model-parallel-allreduce": 0,
    "use-legacy-models": 0, "timing-log-level": 1, "norm-epsilon": 1, "rotary-base": 1,
    "rotary-percent": 1, "apply-query-key-layer-scaling": 0, "attention-softmax-in-fp32": 0,
    "moe-aux-loss-coeff": 1, "moe-router-load-balancing-type": 1, "moe-z-loss-coeff": 1,
    "use-mcore-models": 0, "transformer-impl": 1, "fp8-margin": 1, "fp8-interval": 1,
    "fp8-amax-history-len": 1, "fp8-amax-compute-algo": 1, "num-workers": 1,
    "dataloader-type": 1, "eod-mask-loss": 0, "no-create-attention-mask-in-dataloader": 0,
    "manual-gc": 0, "manual-gc-interval": 1, "no-rope-fusion": 0, "use-distributed-sampler": 0,
    "moe-router-pre-softmax": 0, "moe-router-score-function": 1, "log-params-norm": 0,
    "log-num-zeros-in-grad": 0, "tensorboard-log-interval": 1,
    # the router's numerics and aux-loss-free balancing (DeepSeek-V3 §2.1.2) and YaRN's
    # RoPE scaling change no kernel's size; the drop policy matters only with a capacity
    "moe-router-dtype": 1, "moe-router-bias-update-rate": 1, "moe-router-enable-expert-bias": 0,
    "moe-router-topk-scaling-factor": 1, "moe-token-drop-policy": 1, "mscale": 1,
    "mscale-all-dim": 1, "rotary-scaling-factor": 1,
})

#: Megatron features dessim does not model → (values, reason).
UNSUPPORTED: Mapping[str, tuple[int, str]] = MappingProxyType({
    "overlap-param-gather": (0, "dessim all-gathers parameters after the optimizer step, not "
                                "during the next forward: without the flag the iteration is "
                                "longer by up to that all-gather"),
    "moe-router-num-groups": (1, "node-limited (group) routing: dessim routes each token's "
                                 "top-k over all experts"),
    "moe-router-group-topk": (1, "node-limited (group) routing: dessim routes each token's "
                                 "top-k over all experts"),
    "moe-layer-recompute": (0, "recomputation of the MoE layers"),
    "no-overlap-p2p-communication": (0, "dessim's pipeline sends always overlap compute (they run "
                                        "on their own streams)"),
    "squared-relu": (0, "squared-ReLU MLP"),
    "add-qkv-bias": (0, "biases on the QKV projection only"),
    "fp8-param-gather": (0, "FP8 parameter all-gather"),
    "cpu-offloading": (0, "Megatron's activation offloading"),
    "num-layers-per-stage": (1, "uneven pipeline stages"),
    "recompute-modules": (-1, "selective recompute of chosen modules (dessim: attention core)"),
    "use-torch-fsdp2": (0, "PyTorch FSDP2 instead of Megatron's DDP"),
    "use-custom-fsdp": (0, "Megatron FSDP"),
})


@dataclass
class MegatronLaunch:
    """What a Megatron-LM argument list means for dessim.

    ``document``: the workload document (``model``, ``parallelism``, ``training``; SI units).
    ``notes``: assumptions made (a default derived, a value dessim approximates).
    ``no_effect`` / ``unsupported`` / ``unknown``: the flags of each kind, as given."""

    document: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _split(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``--flag v1 v2 --switch`` → ``[("flag", ["v1", "v2"]), ("switch", [])]``; ``--k=v`` too."""
    out: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            out.append((name, [value] if eq else []))
        elif out:
            out[-1][1].append(token)
        else:
            raise SpecError(f"megatron arguments: {token!r} is not a --flag (arguments start with "
                            "a flag such as --num-layers)")
    return out


def parse_megatron_args(argv: Sequence[str]) -> tuple[dict[str, Any], MegatronLaunch]:
    """The flags of ``argv`` by name (a switch is True, a one-value flag its string, others a
    list; the last occurrence wins, as argparse) and a :class:`MegatronLaunch` with the
    no-effect, unsupported and unknown flags filled in."""
    launch = MegatronLaunch(document={})
    flags: dict[str, Any] = {}
    for name, values in _split(argv):
        shown = f"--{name}" + "".join(f" {v}" for v in values)
        if name in MAPPED:
            nargs = MAPPED[name]
        elif name in NO_EFFECT:
            nargs = NO_EFFECT[name]
            launch.no_effect.append(shown)
        elif name in UNSUPPORTED:
            nargs, why = UNSUPPORTED[name]
            launch.unsupported.append(f"{shown} ({why})")
        else:
            launch.unknown.append(shown)
            continue
        if nargs >= 0 and len(values) != nargs:
            raise SpecError(f"megatron arguments: --{name} takes {nargs or 'no'} value"
                            f"{'s' if nargs != 1 else ''}, got {values or 'none'}")
        flags[name] = True if nargs == 0 else values[0] if nargs == 1 else values
    return flags, launch


def _int(flags: Mapping[str, Any], name: str, default: int) -> int:
    """Flag ``name`` as a whole number >= 1 (``default`` when absent)."""
    if name not in flags:
        return default
    try:
        value = int(flags[name])
    except ValueError:
        raise SpecError(f"megatron arguments: --{name} {flags[name]!r} is not a whole number") from None
    if value < 1:
        raise SpecError(f"megatron arguments: --{name} {value} must be >= 1")
    return value


def _opt_int(flags: Mapping[str, Any], name: str) -> int | None:
    """Flag ``name`` as a whole number >= 1, or None when absent."""
    return _int(flags, name, 0) or None


def _float(flags: Mapping[str, Any], name: str, default: float) -> float:
    try:
        return float(flags.get(name, default))
    except ValueError:
        raise SpecError(f"megatron arguments: --{name} {flags[name]!r} is not a number") from None


def _choice(flags: Mapping[str, Any], name: str, valid: Mapping[str, Any], default: str) -> Any:
    value = flags.get(name, default)
    if value not in valid:
        raise SpecError(f"megatron arguments: --{name} {value!r} is not supported; supported: "
                        f"{', '.join(valid)}")
    return valid[value]


_NORMS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
_POSITIONS = {"learned_absolute": "learned", "rope": "rope"}
_ATTENTION = {"auto": "flash2", "flash": "flash2", "fused": "flash2", "unfused": "unfused",
              "local": "unfused"}
_RECOMPUTE = {"selective": "selective", "full": "full"}
_FP8 = {"hybrid": "fp8", "e4m3": "fp8"}
#: ``--fp8-recipe`` (Megatron-core's ``TransformerConfig.fp8_recipe``, default ``delayed``;
#: ``get_fp8_recipe`` in ``megatron/core/fp8_utils.py``) → dessim precision: the per-tensor
#: scalings (``DelayedScaling``, ``Float8CurrentScaling``) → ``fp8``; Transformer Engine's
#: ``Float8BlockScaling`` (1×128 activation and 128×128 weight blocks, one fp32 scale each,
#: "inspired by DeepSeek-V3") → ``fp8-block``.
_FP8_RECIPES = {"delayed": "fp8", "tensorwise": "fp8", "blockwise": "fp8-block"}
#: What a recipe mapped to a dessim precision does not share with it (a note in every output).
_FP8_RECIPE_NOTES = {
    "tensorwise": "--fp8-recipe tensorwise (current scaling) costed as dessim's fp8 per-tensor casts; "
                  "the amax pass over each tensor before its cast is not modelled",
    "blockwise": "--fp8-recipe blockwise → precision fp8-block: the same 1×128 / 128×128 block casts and "
                 "FP8 GEMMs, but fp8-block also carries DeepSeek-V3's memory recipe (fp32 gradients, bf16 "
                 "Adam moments, FP8-cached activations with the norms and SwiGLU recomputed in the "
                 "backward), which Megatron's blockwise recipe does not: memory and those recomputes "
                 "are DeepSeek-V3's",
}


def _fp8_precision(flags: Mapping[str, Any], notes: list[str]) -> str:
    """The dessim precision of ``--fp8-format`` with ``--fp8-recipe`` (:data:`_FP8_RECIPES`)."""
    _choice(flags, "fp8-format", _FP8, "hybrid")
    recipe = flags.get("fp8-recipe", "delayed")
    if recipe in ("mxfp8", "custom"):
        what = ("MXFP8 (32-element blocks with E8M0 scales, Blackwell)" if recipe == "mxfp8"
                else "a user quantizer factory")
        raise SpecError(f"megatron arguments: not supported: --fp8-recipe {recipe}: {what} is not modelled; "
                        "use --fp8-recipe blockwise (dessim's fp8-block: 128-element blocks, fp32 scales) "
                        "or tensorwise / delayed (dessim's fp8: one scale per tensor)")
    if recipe not in _FP8_RECIPES:
        raise SpecError(f"megatron arguments: --fp8-recipe {recipe!r} is not one of Megatron's recipes "
                        "(tensorwise, delayed, mxfp8, blockwise, custom)")
    if recipe in _FP8_RECIPE_NOTES:
        notes.append(_FP8_RECIPE_NOTES[recipe])
    return _FP8_RECIPES[recipe]


def _vocab(flags: Mapping[str, Any], tp: int, notes: list[str]) -> int:
    size = _opt_int(flags, "vocab-size")
    if size is None:
        tokenizer = flags.get("tokenizer-type", "GPT2BPETokenizer")
        if "vocab-file" not in flags or tokenizer != "GPT2BPETokenizer":
            raise SpecError("megatron arguments: the vocabulary size is unknown: give --vocab-size N "
                            f"(dessim reads only GPT-2 BPE --vocab-file files; tokenizer {tokenizer!r})")
        path = Path(flags["vocab-file"])
        try:
            size = len(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            size = GPT2_VOCAB
            notes.append(f"--vocab-file {path} is not readable here: GPT-2's {GPT2_VOCAB} tokens assumed")
    multiple = _int(flags, "make-vocab-size-divisible-by", 128) * tp
    padded = math.ceil(size / multiple) * multiple
    if padded != size:
        notes.append(f"vocabulary {size} padded to {padded} (a multiple of "
                     f"--make-vocab-size-divisible-by × TP = {multiple})")
    return padded


def _require(flags: Mapping[str, Any], *names: str) -> None:
    """The required (whole-number) flags: a bad value given is named before what is missing."""
    for n in names:
        if n in flags:
            _int(flags, n, 0)
    missing = [f"--{n}" for n in names if n not in flags]
    if missing:
        raise SpecError(f"megatron arguments: missing {', '.join(missing)} (required by pretrain_gpt.py)")


def megatron_workload(argv: Sequence[str], num_gpus: int, *, allow_unsupported: bool = False,
                      name: str = "megatron") -> MegatronLaunch:
    """The workload a ``pretrain_gpt.py`` launch runs on ``num_gpus`` GPUs (module docstring).

    Raises :class:`SpecError` for a missing required flag, a bad value, or (unless
    ``allow_unsupported``) any unsupported or unknown flag — all of them listed."""
    flags, launch = parse_megatron_args(argv)
    if (launch.unsupported or launch.unknown) and not allow_unsupported:
        parts = ([f"unsupported: {'; '.join(launch.unsupported)}"] if launch.unsupported else []) + \
                ([f"unknown: {', '.join(launch.unknown)}"] if launch.unknown else [])
        raise SpecError("megatron arguments: " + " | ".join(parts) +
                        " (--allow-unsupported simulates without them)")
    _require(flags, "num-layers", "hidden-size", "num-attention-heads", "seq-length", "micro-batch-size")
    notes = launch.notes
    layers, hidden = _int(flags, "num-layers", 0), _int(flags, "hidden-size", 0)     # required
    tp, pp = _int(flags, "tensor-model-parallel-size", 1), _int(flags, "pipeline-model-parallel-size", 1)
    cp, ep = _int(flags, "context-parallel-size", 1), _int(flags, "expert-model-parallel-size", 1)
    if num_gpus % (tp * pp * cp):
        raise SpecError(f"megatron arguments: {num_gpus} GPUs are not divisible by TP × PP × CP = "
                        f"{tp * pp * cp}")
    dp = num_gpus // (tp * pp * cp)
    swiglu = bool(flags.get("swiglu"))
    ffn = _opt_int(flags, "ffn-hidden-size") or (int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden)
    position = "rope" if flags.get("use-rotary-position-embeddings") else \
        _choice(flags, "position-embedding-type", _POSITIONS, "learned_absolute")
    seq = _int(flags, "seq-length", 0)                                              # required
    max_pos = _int(flags, "max-position-embeddings", seq)
    if position == "learned" and max_pos != seq:
        notes.append(f"learned position table of --seq-length {seq} rows, not "
                     f"--max-position-embeddings {max_pos} ({abs(max_pos - seq) * hidden} parameters)")
    precision = (_fp8_precision(flags, notes) if "fp8-format" in flags
                 else "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else "fp32")
    grad_precision = _grad_precision(flags, notes)
    if "fp8-recipe" in flags and "fp8-format" not in flags:
        notes.append(f"--fp8-recipe {flags['fp8-recipe']} without --fp8-format: no FP8, as in Megatron "
                     "(the recipe applies only to FP8 training)")
    model: dict[str, Any] = {
        "layers": layers, "hidden": hidden, "heads": _int(flags, "num-attention-heads", 0),
        "ffn_hidden": ffn, "vocab": _vocab(flags, tp, notes), "seq_len": seq,
        "activation": "swiglu" if swiglu else "gelu",
        "norm": _choice(flags, "normalization", _NORMS, "LayerNorm"),
        "position_embedding": position, "bias": not flags.get("disable-bias-linear"),
        "dropout": _float(flags, "hidden-dropout", 0.1) > 0 or _float(flags, "attention-dropout", 0.1) > 0,
        "tied_embeddings": not flags.get("untie-embeddings-and-output-weights"),
        "precision": precision,
    }
    kv_channels = _opt_int(flags, "kv-channels")
    if kv_channels is not None and flags.get("multi-latent-attention"):
        kv_channels = None          # MLA's heads are --qk-head-dim/--v-head-dim wide
    if kv_channels is not None and kv_channels * model["heads"] != hidden:
        raise SpecError(f"megatron arguments: not supported yet: --kv-channels {kv_channels} ≠ "
                        f"--hidden-size / --num-attention-heads = {hidden / model['heads']:g}")
    if flags.get("group-query-attention"):
        model["kv_heads"] = _int(flags, "num-query-groups", 1)
    model.update(_mla(flags, notes))
    experts = _opt_int(flags, "num-experts")
    if experts:
        model.update(experts=experts, top_k=_int(flags, "moe-router-topk", 2))
        if "moe-ffn-hidden-size" in flags:
            model["moe_ffn_hidden"] = _int(flags, "moe-ffn-hidden-size", 0)
        model.update(_moe_layers(flags, layers, model.get("moe_ffn_hidden", ffn), notes))
    else:
        moe_only = [f"--{k}" for k in ("moe-shared-expert-intermediate-size", "moe-layer-freq",
                                       "moe-grouped-gemm") if k in flags]
        if moe_only:
            raise SpecError(f"megatron arguments: {', '.join(moe_only)} without --num-experts "
                            "(they configure a mixture of experts)")
    if "mtp-num-layers" in flags:
        model["mtp_modules"] = _int(flags, "mtp-num-layers", 0)
    dispatch = _moe_dispatch(flags)
    virtual = _virtual_stages(flags, layers, pp)
    training: dict[str, Any] = {
        "micro_batch": _int(flags, "micro-batch-size", 0),                       # required
        "schedule": "interleaved" if virtual > 1 else "1f1b", "virtual_stages": virtual,
        "recompute": _recompute(flags, layers // (pp * virtual), notes),
        "attention": "flash2" if flags.get("use-flash-attn") else
        _choice(flags, "attention-backend", _ATTENTION, "auto"),
        "zero_stage": 1 if flags.get("use-distributed-optimizer") else 0,
        "bucket_size": _bucket_bytes(flags, dp, PRECISIONS[precision].with_grad_precision(grad_precision)),
    }
    if flags.get("tp-comm-overlap"):
        if not flags.get("sequence-parallel"):
            # megatron/training/arguments.py: "Tensor parallel communication/GEMM overlap can
            # happen only when sequence parallelism is enabled"
            raise SpecError("megatron arguments: --tp-comm-overlap needs --sequence-parallel, as "
                            "in Megatron-LM (Transformer Engine's userbuffers overlap the sequence-"
                            "parallel all-gathers and reduce-scatters)")
        training["tp_comm_overlap"] = True
    if grad_precision is not None:
        training["grad_precision"] = grad_precision
    if "global-batch-size" in flags:
        training["global_batch"] = _int(flags, "global-batch-size", 0)
    if experts:
        training["moe_dispatch"] = dispatch
    stages = _uneven_stages(flags, layers, pp, virtual)
    if stages is not None:
        training["pipeline_layers"] = stages
    if not flags.get("use-flash-attn") and flags.get("attention-backend", "auto") in ("auto", "fused"):
        notes.append("attention backend auto/fused (Transformer Engine / cuDNN fused attention) "
                     "costed as FlashAttention-2")
    launch.document = {"name": name, "source": "Megatron-LM arguments: " + " ".join(argv),
                       "model": model,
                       "parallelism": {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep,
                                       "sp": bool(flags.get("sequence-parallel")),
                                       **({"etp": _int(flags, "expert-tensor-parallel-size", tp)}
                                          if "expert-tensor-parallel-size" in flags else {})},
                       "training": training}
    return launch


#: Megatron-LM's MLA defaults (``megatron/training/arguments.py``, ``_add_mla_args``):
#: flag → (``model.mla`` key of :class:`~dessim.workload.transformer.mla.MLAConfig`, default;
#: None: no query compression)
_MLA_FLAGS: Mapping[str, tuple[str, int | None]] = MappingProxyType({
    "q-lora-rank": ("q_lora_rank", None), "kv-lora-rank": ("kv_lora_rank", 32),
    "qk-head-dim": ("qk_nope_head_dim", 128), "qk-pos-emb-head-dim": ("qk_rope_head_dim", 64),
    "v-head-dim": ("v_head_dim", 128),
})


def _mla(flags: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """``model.mla`` (and ``bias: false``) of ``--multi-latent-attention`` with Megatron's
    defaults for the dimensions not given (``--qk-head-dim`` is the no-position part of a query
    head, ``--qk-pos-emb-head-dim`` its RoPE part: ``q_head_dim = qk_head_dim +
    qk_pos_emb_head_dim``, Megatron's help text)."""
    given = [f"--{k}" for k in _MLA_FLAGS if k in flags]
    if not flags.get("multi-latent-attention"):
        if given:
            raise SpecError(f"megatron arguments: {', '.join(given)} without "
                            "--multi-latent-attention (they set MLA's dimensions)")
        if flags.get("qk-layernorm"):
            raise SpecError("megatron arguments: not supported yet: --qk-layernorm without "
                            "--multi-latent-attention (per-head query/key norms)")
        return {}
    if flags.get("group-query-attention"):
        raise SpecError("megatron arguments: --multi-latent-attention with --group-query-attention: "
                        "MLA has no key/value groups")
    mla = {key: (_int(flags, flag, 0) if flag in flags else default or 0)
           for flag, (key, default) in _MLA_FLAGS.items()}
    if not flags.get("qk-layernorm"):
        notes.append("--multi-latent-attention without --qk-layernorm: dessim's MLA keeps the "
                     "RMSNorms of the compressed query and key/value (DeepSeek-V2/V3), "
                     f"{mla['q_lora_rank'] + mla['kv_lora_rank']} weights and two small norm "
                     "kernels per layer that Megatron builds only with --qk-layernorm")
    return {"mla": mla}


def _layer_pattern(text: str, layers: int) -> list[int]:
    """``--moe-layer-freq``'s list expression (``"([0]*3+[1]*58)"``: 1 = an MoE layer), as
    Megatron evaluates it (``moe_freq_type``), from lists of 0/1, ``+``, ``*`` and parentheses
    only."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and e.value in (0, 1)
                                              for e in node.elts):
            return [e.value for e in node.elts]           # type: ignore[attr-defined]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
                return left * right
        raise ValueError
    try:
        pattern = value(ast.parse(text.strip(), mode="eval").body)
        if not isinstance(pattern, list):
            raise ValueError
    except (SyntaxError, ValueError):
        raise SpecError(f"megatron arguments: --moe-layer-freq {text!r} is neither a whole number "
                        "nor a list expression of 0 and 1 such as \"([0]*3+[1]*58)\"") from None
    if len(pattern) != layers:
        raise SpecError(f"megatron arguments: --moe-layer-freq {text!r} gives {len(pattern)} layers, "
                        f"--num-layers is {layers}")
    return pattern


def _moe_layers(flags: Mapping[str, Any], layers: int, moe_ffn: int,
                notes: list[str]) -> dict[str, Any]:
    """``dense_layers`` and ``shared_experts`` of an MoE launch: ``--moe-layer-freq`` (an
    integer N: layer i is MoE when i % N == 0; a list: 1 = MoE) must make the first k layers
    dense and the rest MoE (DeepSeek's ``first_k_dense_replace``); Megatron's shared experts
    are one MLP of ``--moe-shared-expert-intermediate-size`` (``num_shared_experts ×
    ffn_size_of_each``, transformer_config.py), i.e. that size / ``--moe-ffn-hidden-size``
    shared experts."""
    out: dict[str, Any] = {}
    freq = str(flags.get("moe-layer-freq", "1"))
    if not freq.strip().isdigit():
        pattern = _layer_pattern(freq, layers)
    else:
        n = _int(flags, "moe-layer-freq", 1)
        pattern = [int(i % n == 0) for i in range(layers)]
    dense = pattern.index(1) if 1 in pattern else layers
    if pattern != [0] * dense + [1] * (layers - dense):
        raise SpecError(f"megatron arguments: not supported yet: --moe-layer-freq {freq} interleaves "
                        "dense and MoE layers; dessim's MoE models have their dense layers first "
                        "(DeepSeek's first_k_dense_replace), e.g. \"([0]*3+[1]*58)\"")
    if dense:
        out["dense_layers"] = dense
    if "moe-shared-expert-intermediate-size" in flags:
        size = _int(flags, "moe-shared-expert-intermediate-size", 0)
        if size % moe_ffn:
            raise SpecError(f"megatron arguments: not supported yet: --moe-shared-expert-intermediate-"
                            f"size {size} is not a multiple of the experts' width {moe_ffn}: dessim's "
                            "shared experts are as wide as the routed ones")
        out["shared_experts"] = size // moe_ffn
    if "shared_experts" in out and not flags.get("moe-shared-expert-overlap"):
        notes.append("shared experts run while the dispatch all-to-all is in flight, as Megatron's "
                     "--moe-shared-expert-overlap; without it Megatron runs them before the router")
    if not flags.get("moe-grouped-gemm"):
        notes.append("experts costed as grouped GEMMs; without --moe-grouped-gemm Megatron runs "
                     "SequentialMLP, one GEMM per local expert")
    return out


def _moe_dispatch(flags: Mapping[str, Any]) -> str:
    """``training.moe_dispatch`` of ``--moe-token-dispatcher-type``: ``alltoall`` (NCCL's
    all-to-all) → ``nccl``; ``flex`` with ``--moe-enable-deepep`` (DeepEP, as Megatron-LM's
    MoE README enables it) → ``deepep``; absent → ``nccl``. The ``allgather`` dispatcher and
    flex without DeepEP are not modelled: an error naming them."""
    kind = flags.get("moe-token-dispatcher-type", "alltoall")
    deepep = bool(flags.get("moe-enable-deepep"))
    if kind == "alltoall" and not deepep:
        return "nccl"
    if kind == "flex" and deepep:
        return "deepep"
    if deepep:
        raise SpecError("megatron arguments: --moe-enable-deepep needs --moe-token-dispatcher-type "
                        f"flex (got {flags.get('moe-token-dispatcher-type', 'none')}), as "
                        "Megatron-LM requires")
    raise SpecError(f"megatron arguments: not supported: --moe-token-dispatcher-type {kind} "
                    + ("without --moe-enable-deepep " if kind == "flex" else "")
                    + "(dessim models the alltoall dispatcher, NCCL's all-to-all, and flex with "
                      "--moe-enable-deepep, DeepEP)")


#: The ``--account-for-*-in-pipeline-split`` switches: the part of the model each counts as a layer.
_ACCOUNTED = {"account-for-embedding-in-pipeline-split": "embedding",
              "account-for-loss-in-pipeline-split": "loss"}


def _accounted(flags: Mapping[str, Any]) -> int:
    """How many of the embedding and the loss count as a layer in the pipeline split."""
    return sum(bool(flags.get(f)) for f in _ACCOUNTED)


def _accounted_pieces(flags: Mapping[str, Any], layers: int, pp: int, virtual: int) -> list[int] | None:
    """``training.pipeline_layers`` of ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``, as Megatron-core splits the layers
    (``get_num_layers_to_build``, ``megatron/core/transformer/transformer_block.py``): the
    embedding and/or the loss count as one more layer each, the count is split evenly over the
    ``pp × virtual`` pieces, and the first piece (the embedding's) and the last (the loss's)
    build one transformer layer fewer; an error where the count does not split evenly, as
    Megatron asserts. dessim's first and last pieces hold the embedding and the loss anyway, so
    the split is all these flags change. None with one stage."""
    if pp < 2:
        return None
    parts = [name for f, name in _ACCOUNTED.items() if flags.get(f)]
    counted = layers + len(parts)
    what = f"--num-layers {layers} + {' + '.join(f'1 ({p})' for p in parts)} = {counted} layers"
    pieces = pp * virtual
    if counted % pieces:
        raise SpecError(f"megatron arguments: {what} do not split evenly over --pipeline-model-parallel-size "
                        f"{pp}" + (f" × {virtual} virtual stages" if virtual > 1 else "")
                        + " (Megatron-core asserts they do)")
    out = [counted // pieces] * pieces
    out[0] -= "embedding" in parts
    out[-1] -= "loss" in parts
    if min(out) < 1:
        raise SpecError(f"megatron arguments: {what} over {pieces} pipeline pieces leave the first or last "
                        "with no transformer layer, which dessim does not model (each piece holds >= 1)")
    return out


def _uneven_stages(flags: Mapping[str, Any], layers: int, pp: int, virtual: int) -> list[int] | None:
    """``training.pipeline_layers`` of ``--decoder-first-pipeline-num-layers`` F and
    ``--decoder-last-pipeline-num-layers`` L, as Megatron-core splits the layers: F on the
    first stage, L on the last, the rest evenly over the other stages (an error where they do
    not split evenly, as Megatron asserts), or of the account-for flags
    (:func:`_accounted_pieces`; not together, as Megatron-core refuses); None without any. F
    and L not with an interleaved schedule (how Megatron spreads them over the virtual stages
    is not modelled)."""
    first = _opt_int(flags, "decoder-first-pipeline-num-layers")
    last = _opt_int(flags, "decoder-last-pipeline-num-layers")
    given = "--decoder-first/last-pipeline-num-layers"
    if _accounted(flags):
        if first is not None or last is not None:
            raise SpecError(f"megatron arguments: {given} cannot be combined with "
                            "--account-for-embedding/loss-in-pipeline-split (Megatron-core refuses both at once)")
        return _accounted_pieces(flags, layers, pp, virtual)
    if first is None and last is None:
        return None
    if virtual > 1:
        raise SpecError(f"megatron arguments: not supported yet: {given} with an interleaved schedule")
    if pp < 2:
        raise SpecError(f"megatron arguments: {given} needs --pipeline-model-parallel-size >= 2")
    fixed = [n for n in (first, last) if n is not None]
    others, rest = pp - len(fixed), layers - sum(fixed)
    if (others == 0 and rest != 0) or (others > 0 and (rest < others or rest % others)):
        raise SpecError(f"megatron arguments: {given}: --num-layers {layers} minus {' + '.join(map(str, fixed))} "
                        f"leaves {rest} layers, which do not split evenly over the other {others} "
                        "pipeline stages")
    per = rest // others if others else 0
    return [first or per, *[per] * (pp - 2), last or per]


def _virtual_stages(flags: Mapping[str, Any], layers: int, pp: int) -> int:
    """Model chunks per stage; the layers counted as Megatron counts them for the split (with
    the embedding and loss of the account-for flags, :func:`_accounted`)."""
    per_stage = _opt_int(flags, "num-layers-per-virtual-pipeline-stage")
    if per_stage is None:
        return _opt_int(flags, "virtual-pipeline-model-parallel-size") or \
            _int(flags, "num-virtual-stages-per-pipeline-rank", 1)
    extra = _accounted(flags)
    counted = layers + extra
    if counted % pp or (counted // pp) % per_stage:
        what = f"--num-layers {layers}" + (f" + {extra} (embedding/loss counted as layers)" if extra else "")
        raise SpecError(f"megatron arguments: {what} / --pipeline-model-parallel-size "
                        f"{pp} is not a multiple of --num-layers-per-virtual-pipeline-stage {per_stage}")
    return counted // pp // per_stage


def _recompute(flags: Mapping[str, Any], layers_per_chunk: int, notes: list[str]) -> str:
    if flags.get("recompute-activations"):
        return "selective"                      # the older spelling of selective recompute
    granularity = _choice(flags, "recompute-granularity", {**_RECOMPUTE, "none": "none"}, "none")
    if granularity != "full":
        return granularity
    method = flags.get("recompute-method")
    if method not in ("uniform", "block"):
        raise SpecError("megatron arguments: --recompute-granularity full needs --recompute-method "
                        f"uniform or block, got {method!r}")
    n = _int(flags, "recompute-num-layers", 1)
    if method == "block" and n < layers_per_chunk:
        raise SpecError(f"megatron arguments: not supported yet: --recompute-method block "
                        f"--recompute-num-layers {n} recomputes {n} of the {layers_per_chunk} layers of "
                        "each model chunk; dessim recomputes all or none")
    if method == "uniform" and n > 1:
        # Megatron's CheckpointFunction over groups of n layers (transformer_block.py
        # _checkpointed_forward): one stored input per group, the group's activations held
        # while it is recomputed; the same recomputation work as n = 1
        notes.append(f"--recompute-method uniform --recompute-num-layers {n}: memory as with 1 "
                     f"(every layer's input stored, one layer's activations while it is "
                     f"recomputed); Megatron stores one input per {n} layers and holds {n} layers' "
                     "activations while recomputing them (the same recomputation)")
    return "full"


def _grad_precision(flags: Mapping[str, Any], notes: list[str]) -> str | None:
    """``training.grad_precision`` of the launch, as ``megatron/training/arguments.py`` sets
    ``accumulate_allreduce_grads_in_fp32``: on for ``--bf16`` ("bfloat16 requires gradient
    accumulation and all-reduce to be done in fp32": the bf16 recipes' own fp32 gradients,
    None) unless ``--grad-reduce-in-bf16`` (→ ``bf16``); off for ``--fp16`` (fp16 gradients,
    None) unless ``--accumulate-allreduce-grads-in-fp32`` (→ ``fp32``); fp32 training has fp32
    gradients either way."""
    if flags.get("bf16"):
        return "bf16" if flags.get("grad-reduce-in-bf16") else None
    if flags.get("grad-reduce-in-bf16"):
        notes.append("--grad-reduce-in-bf16 without --bf16: no effect, as in Megatron (it applies to "
                     "bf16 training only)")
    return "fp32" if flags.get("fp16") and flags.get("accumulate-allreduce-grads-in-fp32") else None


def _bucket_bytes(flags: Mapping[str, Any], dp: int, precision: Precision) -> int:
    """Bytes of one gradient bucket: Megatron sizes buckets in parameters (module docstring),
    each of the gradients' ``precision.grad_bytes``."""
    if not flags.get("overlap-grad-reduce"):
        return 0
    params = _opt_int(flags, "ddp-bucket-size") or max(40_000_000, 1_000_000 * dp)
    return params * precision.grad_bytes
