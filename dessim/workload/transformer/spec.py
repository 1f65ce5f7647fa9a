"""Workload specifications: YAML files (presets in ``workloads/``) → :class:`WorkloadSpec`.

File schema (every key optional unless marked *required*; unknown keys are errors that name
the key, the file and the valid keys)::

    name: gpt3-175b                  # defaults to the file name
    description: "..."               # free text
    source: "..."                    # where the architecture comes from
    model:                           # *required*: a TransformerConfig (dessim/workload/transformer/model.py)
      hf_config: llama/config.json   # a Hugging Face config.json (path relative to this file)
                                     # gives every key below; keys given here override it
                                     # (dessim/workload/transformer/hf_config.py)
      layers: 96                     # *required* (without hf_config)
      hidden: 12288                  # *required*
      heads: 96                      # *required*
      ffn_hidden: 49152              # *required*
      vocab: 51200                   # *required*
      seq_len: 2048                  # *required*
      kv_heads: 96                   # default: heads (multi-head attention)
      activation: gelu               # gelu | relu | swiglu | geglu
      norm: layernorm                # layernorm | rmsnorm
      position_embedding: learned    # learned | rope
      bias: true                     # biases on linear layers
      dropout: true
      tied_embeddings: true
      precision: bf16                # bf16 | fp16 | fp8 | fp32
      experts: 1                     # > 1: mixture of experts
      top_k: 1
      moe_ffn_hidden: 14336          # default: ffn_hidden
      dense_layers: 0                # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
      shared_experts: 0              # always-active experts of width moe_ffn_hidden (DeepSeekMoE)
      routing:                       # MoE load (dessim/workload/transformer/routing.py)
        distribution: uniform        # uniform | zipf | counts
        exponent: 1.0                # zipf exponent
        counts: [..] or FILE         # tokens per expert (distribution: counts; FILE relative to this file)
        capacity_factor: 1.25        # absent: dropless
        max_nodes: 4                 # node-limited routing: a token's experts on <= M nodes (absent: any)
      mla:                           # multi-head latent attention (dessim/workload/transformer/mla.py)
        q_lora_rank: 1536
        kv_lora_rank: 512
        qk_rope_head_dim: 64
        qk_nope_head_dim: 128
        v_head_dim: 128
      mtp_modules: 0                 # multi-token prediction depth (DeepSeek-V3)
    parallelism:
      tp: 8
      pp: 8
      dp: 16                         # with tp·pp·cp, fixes the default GPU count
      cp: 1
      ep: 1                          # expert parallel, over cp × dp
      etp: 1                         # expert tensor parallel (default: tp); != tp refolds the
                                     # experts' ranks into etp x ep x edp (layout.py)
      sp: true                       # sequence parallelism
      order: [tp, cp, dp, pp]        # placement, fastest-varying first
    training:
      micro_batch: 1
      global_batch: 1536             # sequences per iteration; default micro_batch × dp
                                     # (Megatron-LM's default for --global-batch-size)
      seq_len: 4096                  # overrides model.seq_len
      schedule: 1f1b                 # gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | dualpipe
      virtual_stages: 1              # > 1 with interleaved
      pipeline_layers: balanced      # layers per pipeline piece: balanced, or a list (model order)
      recompute: selective           # none | selective | full
      attention: flash2              # unfused | flash2 | flash3 (fused, Hopper)
      moe_dispatch: nccl             # nccl | deepep (MoE all-to-all: NCCL's, or DeepEP's rail one)
      moe_dispatch_precision: fp8    # fp8 | bf16: wire precision of the dispatch with an FP8
                                     # recipe (default fp8 there; layout.MOE_DISPATCH_PRECISIONS)
      grad_precision: bf16           # fp32 | bf16 | fp16: gradient accumulation and data-parallel
                                     # reduction; default the recipe's (bf16/fp8 recipes: fp32,
                                     # fp16: fp16); bf16 = Megatron's --grad-reduce-in-bf16
      zero_stage: 1                  # 0 | 1 | 2 | 3 | fsdp
      bucket_size: 25MiB             # gradient bucket (dessim.units sizes)
      tp_comm_overlap: false         # chunk TP collectives against their GEMMs (overlap.py)
      fuse_optimizer_allreduce: false  # per-bucket reduce-scatter + update + all-gather (overlap.py)
      offload:
        optimizer: none              # none | host | cxl
        activations: none            # none | host | cxl
      device: H100                   # a GPU name of dessim.catalog.devices (checked here)

Numbers accept dessim.units forms (``"1k"`` counts, ``"25MiB"`` sizes).

A Hugging Face ``config.json`` is itself accepted wherever a workload file is
(:func:`load_workload`): its model with the default parallelism and training above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, model_validator

from dessim.catalog.devices import get_device
from dessim.errors import DessimError, SpecError
from dessim.resources import data_files, find_data_file, read_yaml
from dessim.schema import (Count, Flag, Number, PositiveCount, Size, SpecModel, Text, choice, converted,
                           did_you_mean, validate)
from dessim.units import parse_count
from dessim.workload.common.precision import GRAD_PRECISIONS, PRECISIONS
from dessim.workload.common.gradsync import DEFAULT_BUCKET_SIZE
from dessim.workload.transformer.hf_config import (HF_CONFIG_KEY, hf_model_section, hf_workload_name,
                                                   is_hf_config, read_hf_config)
from dessim.workload.transformer.layout import (ATTENTION_IMPLS, DEFAULT_ORDER, MOE_DISPATCH, MOE_DISPATCH_PRECISIONS,
                                                PIPELINE_LAYER_RULES, RECOMPUTE_POLICIES, SCHEDULES,
                                                ParallelLayout, parse_pipeline_layers, parse_zero_stage)
from dessim.workload.transformer.memory import OFFLOAD_TARGETS, MemoryOptions
from dessim.workload.transformer.mla import MLAConfig
from dessim.workload.transformer.model import ACTIVATIONS, NORMS, POSITION_EMBEDDINGS, TransformerConfig
from dessim.workload.transformer.overlap import OverlapOptions
from dessim.workload.transformer.routing import DISTRIBUTIONS, MoERouting, read_counts

__all__ = [
    "ParallelismSpec",
    "TrainingSpec",
    "WorkloadSpec",
    "TransformerFile",
    "load_workload",
    "parse_workload",
    "shipped_workloads",
]


@dataclass(frozen=True, slots=True)
class ParallelismSpec:
    """The ``parallelism:`` section."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    #: sequence parallelism; None: not given — off, but ``dessim explore`` turns it on where a
    #: layout needs it (an explicit false is kept)
    sp: bool | None = None
    order: tuple[str, ...] = DEFAULT_ORDER
    etp: int | None = None

    @property
    def num_gpus(self) -> int:
        """Default GPU count: ``tp · pp · dp · cp``."""
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """The ``training:`` section. ``global_batch`` None: ``micro_batch × dp`` sequences (one
    micro-batch per data-parallel replica, Megatron-LM's default)."""

    global_batch: int | None = None
    micro_batch: int = 1
    seq_len: int | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1
    pipeline_layers: tuple[int, ...] | str = "balanced"
    recompute: str = "none"
    attention: str = "flash2"
    moe_dispatch: str = "nccl"
    moe_dispatch_precision: str | None = None
    #: None: the precision recipe's gradients (already applied to ``WorkloadSpec.model``)
    grad_precision: str | None = None
    zero_stage: int = 0
    bucket_size: int = DEFAULT_BUCKET_SIZE
    offload_optimizer: str = "none"
    offload_activations: str = "none"
    device: str | None = None
    tp_comm_overlap: bool = False
    fuse_optimizer_allreduce: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A model with its default parallelism and training options.

    ``model`` already carries ``training.seq_len`` and ``training.grad_precision`` when they
    are given.
    """

    name: str
    model: TransformerConfig
    parallelism: ParallelismSpec
    training: TrainingSpec
    description: str = ""
    source: str = ""
    path: Path | None = None

    @property
    def num_gpus(self) -> int:
        return self.parallelism.num_gpus

    def layout(self, num_gpus: int | None = None, **overrides: Any) -> ParallelLayout:
        """The :class:`ParallelLayout` of this spec, validated against the model.

        ``num_gpus``: scale data parallelism to that many GPUs (``dp = num_gpus / (tp·pp·cp)``,
        global batch unchanged). ``overrides``: any ParallelLayout field (``tp=4``, ...).
        """
        par, tr = self.parallelism, self.training
        kwargs: dict[str, Any] = dict(
            tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, ep=par.ep, sp=bool(par.sp), order=par.order,
            zero_stage=tr.zero_stage, schedule=tr.schedule, virtual_stages=tr.virtual_stages,
            micro_batch=tr.micro_batch, global_batch=tr.global_batch, recompute=tr.recompute,
            attention=tr.attention, pipeline_layers=tr.pipeline_layers,
            moe_dispatch=tr.moe_dispatch, etp=par.etp, moe_dispatch_precision=tr.moe_dispatch_precision)
        kwargs.update(overrides)
        if num_gpus is not None:
            model_par = kwargs["tp"] * kwargs["pp"] * kwargs["cp"]
            if "dp" not in overrides:
                if num_gpus % model_par:
                    raise SpecError(f"workload {self.name!r}: {num_gpus} GPUs are not divisible by "
                                    f"tp × pp × cp = {model_par}{self._topology_hint(model_par)}")
                kwargs["dp"] = num_gpus // model_par
        layout = ParallelLayout(**kwargs)
        return layout.validate(self.model, num_gpus)

    def _topology_hint(self, model_par: int) -> str:
        """'; its own layout runs on N GPUs: --topology SPEC' (empty when no preset fits)."""
        from dessim.topology.presets import suggested_topology

        gpus = model_par * (self.parallelism.dp or 1)
        spec = suggested_topology(gpus, self.training.device)
        return f"; its own layout runs on {gpus} GPUs: --topology {spec}" if spec else ""

    def overlap_options(self) -> OverlapOptions:
        """Computation–communication overlap of ``training`` (:mod:`dessim.workload.transformer.overlap`)."""
        tr = self.training
        return OverlapOptions(tr.tp_comm_overlap, tr.fuse_optimizer_allreduce)

    def memory_options(self, **overrides: Any) -> MemoryOptions:
        tr = self.training
        kwargs: dict[str, Any] = dict(bucket_size=tr.bucket_size, offload_optimizer=tr.offload_optimizer,
                                      offload_activations=tr.offload_activations)
        kwargs.update(overrides)
        return MemoryOptions(**kwargs)


# ---------------------------------------------------------------------- schema
def _order(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.replace("-", ",").split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{what}: expected a list of dimension names such as [tp, cp, dp, pp], got {value!r}")
    return tuple(value)


def _pipeline_layers(value: Any, what: str) -> tuple[int, ...] | str:
    """A rule name or a list of layer counts (each a dessim.units count)."""
    if isinstance(value, list):
        value = [parse_count(n, f"{what}[{i}]") for i, n in enumerate(value)]
    return parse_pipeline_layers(value, what)


_COUNTS_SCHEMA = {"anyOf": [{"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
                            {"type": "string"}],
                  "description": "tokens per expert: a list, or a file with one number per line"}
_ORDER_SCHEMA = {"anyOf": [{"type": "array", "items": {"enum": list(DEFAULT_ORDER)}},
                           {"type": "string"}],
                 "description": "placement of the parallel dimensions, fastest-varying first",
                 "examples": [list(DEFAULT_ORDER)]}
_PIPELINE_LAYERS_SCHEMA = {"anyOf": [{"enum": list(PIPELINE_LAYER_RULES)},
                                     {"type": "array", "items": {"type": "integer", "minimum": 1},
                                      "minItems": 1}],
                           "description": "layers per pipeline piece: a rule, or counts in model order"}
_ZERO_SCHEMA = {"enum": [0, 1, 2, 3, "fsdp"], "description": "ZeRO stage (fsdp = 3)"}
_DEVICE_SCHEMA = {"type": "string", "description": "a GPU of dessim.catalog.devices", "examples": ["H100"]}


class RoutingSection(SpecModel):
    """``model.routing``: the routed load of an MoE model (:mod:`dessim.workload.transformer.routing`)."""

    distribution: choice(DISTRIBUTIONS) = "uniform"
    exponent: Number = 1.0                      #: zipf exponent, >= 0
    counts: converted(read_counts, _COUNTS_SCHEMA, tuple) = ()
    capacity_factor: Number | None = None       #: None: dropless
    max_nodes: PositiveCount | None = Field(None, description="node-limited routing: a token's experts "
                                            "on at most this many nodes (absent: any)")


class MLASection(SpecModel):
    """``model.mla``: multi-head latent attention dimensions (counts; :mod:`dessim.workload.transformer.mla`)."""

    q_lora_rank: Count = 0
    kv_lora_rank: PositiveCount
    qk_rope_head_dim: PositiveCount
    qk_nope_head_dim: PositiveCount
    v_head_dim: PositiveCount


#: Keys of ``model:`` required unless ``hf_config`` gives them.
_MODEL_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len")


class ModelSection(SpecModel):
    """``model:``: a :class:`~dessim.workload.transformer.model.TransformerConfig` (sizes are
    counts, not bytes). ``layers`` … ``seq_len`` are required unless ``hf_config`` gives them."""

    hf_config: Text | None = Field(None, description="a Hugging Face config.json (path relative to "
                                   "the workload file) giving every other key; keys here override it")
    layers: PositiveCount | None = None
    hidden: PositiveCount | None = None
    heads: PositiveCount | None = None
    ffn_hidden: PositiveCount | None = None
    vocab: PositiveCount | None = None
    seq_len: PositiveCount | None = Field(None, description="tokens per sequence")
    kv_heads: PositiveCount | None = Field(None, description="default: heads (multi-head attention)")
    activation: choice(ACTIVATIONS) = "gelu"
    norm: choice(NORMS) = "layernorm"
    position_embedding: choice(POSITION_EMBEDDINGS) = "learned"
    bias: Flag = True
    dropout: Flag = True
    tied_embeddings: Flag = True
    precision: choice(PRECISIONS) = "bf16"
    experts: PositiveCount = Field(1, description="> 1: mixture of experts")
    top_k: PositiveCount = 1
    moe_ffn_hidden: PositiveCount | None = Field(None, description="default: ffn_hidden")
    dense_layers: Count = Field(0, description="leading layers with a dense MLP")
    shared_experts: Count = 0
    routing: RoutingSection | None = None
    mla: MLASection | None = None
    mtp_modules: Count = Field(0, description="multi-token prediction depth")
    description: Text = ""

    @model_validator(mode="after")
    def _required(self) -> "ModelSection":
        missing = [k for k in _MODEL_REQUIRED if getattr(self, k) is None]
        if missing and self.hf_config is None:
            raise ValueError(f"lacks {', '.join(missing)} (give them, or hf_config)")
        return self


class ParallelismSection(SpecModel):
    """``parallelism:``: the default layout; ``tp·pp·dp·cp`` fixes the default GPU count."""

    tp: PositiveCount = 1
    pp: PositiveCount = 1
    dp: PositiveCount = 1
    cp: PositiveCount = 1
    ep: PositiveCount = Field(1, description="expert parallel, over the cp × dp ranks (tp × cp × dp with etp != tp)")
    etp: PositiveCount | None = Field(None, description="expert tensor parallel; default tp")
    sp: Flag | None = Field(None, description="sequence parallelism (default off)")
    order: converted(_order, _ORDER_SCHEMA, tuple) = DEFAULT_ORDER


class OffloadSection(SpecModel):
    """``training.offload``: where optimizer states / activations go."""

    optimizer: choice(OFFLOAD_TARGETS) = "none"
    activations: choice(OFFLOAD_TARGETS) = "none"


class TrainingSection(SpecModel):
    """``training:``: batch (sequences), schedule and memory options."""

    micro_batch: PositiveCount = Field(1, description="sequences per micro-batch")
    global_batch: PositiveCount | None = Field(None, description="sequences per iteration; default "
                                               "micro_batch × dp")
    seq_len: PositiveCount | None = Field(None, description="overrides model.seq_len")
    schedule: choice(SCHEDULES) = "1f1b"
    virtual_stages: PositiveCount = 1
    pipeline_layers: converted(_pipeline_layers, _PIPELINE_LAYERS_SCHEMA) = "balanced"
    recompute: choice(RECOMPUTE_POLICIES) = "none"
    attention: choice(ATTENTION_IMPLS) = "flash2"
    moe_dispatch: choice(MOE_DISPATCH) = "nccl"
    moe_dispatch_precision: choice(MOE_DISPATCH_PRECISIONS) | None = Field(
        None, description="wire precision of the MoE dispatch with an FP8 recipe; default fp8")
    grad_precision: choice(GRAD_PRECISIONS) | None = Field(
        None, description="precision of the gradient accumulation buffer and of its data-parallel "
        "reduction; default the recipe's (fp32 for bf16/fp8/fp8-block, fp16 for fp16); bf16 = "
        "Megatron-LM's --grad-reduce-in-bf16, FSDP reduce_dtype=bfloat16")
    zero_stage: converted(parse_zero_stage, _ZERO_SCHEMA, int) = 0
    bucket_size: Size = Field(DEFAULT_BUCKET_SIZE, description="gradient bucket, bytes (25MiB)")
    offload: OffloadSection = OffloadSection()
    device: converted(lambda v, what: get_device(v, what).name, _DEVICE_SCHEMA, str) | None = None
    tp_comm_overlap: Flag = False
    fuse_optimizer_allreduce: Flag = False


class TransformerFile(SpecModel):
    """A transformer workload file (``kind: transformer``, the default)."""

    kind: Literal["transformer"] = "transformer"
    name: Text | None = Field(None, description="default: the file name")
    description: Text = ""
    source: Text = Field("", description="where the architecture comes from")
    model: ModelSection
    parallelism: ParallelismSection = ParallelismSection()
    training: TrainingSection = TrainingSection()


#: Value of the optional ``kind:`` key of a transformer file; other kinds (``dlrm``, ``cnn``)
#: are parsed by :mod:`dessim.workload.kinds`.
TRANSFORMER_KIND = "transformer"


def _expand_hf(data: Any, origin: str, base: Path | None) -> Any:
    """``data`` with a ``model.hf_config`` (path relative to ``base``) expanded: the Hugging
    Face config's keys, overridden by the section's own."""
    raw = data["model"]
    path = Path(raw[HF_CONFIG_KEY]).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    hf = hf_model_section(read_hf_config(path), str(path))
    return {**data, "model": {**hf, **{k: v for k, v in raw.items() if k != HF_CONFIG_KEY}}}


def _anchor_counts_file(data: Any, base: Path | None) -> Any:
    """``data`` with a relative ``model.routing.counts`` file name made relative to ``base``
    (the workload file's folder), as ``hf_config`` is: a file names its neighbours, wherever
    dessim runs from. Anything else is left to validation."""
    model = data.get("model") if isinstance(data, Mapping) else None
    routing = model.get("routing") if isinstance(model, Mapping) else None
    counts = routing.get("counts") if isinstance(routing, Mapping) else None
    if base is None or not isinstance(counts, str) or Path(counts).expanduser().is_absolute():
        return data
    routing = {**routing, "counts": str(base / counts)}
    return {**data, "model": {**model, "routing": routing}}


def parse_workload(data: Any, origin: str = "<workload>", default_name: str = "workload",
                   base: Path | None = None) -> WorkloadSpec:
    """A :class:`WorkloadSpec` from already-parsed YAML/JSON data (validated by
    :class:`TransformerFile`); ``origin`` names the file in error messages; ``base``: the
    directory relative ``model.hf_config`` and ``model.routing.counts`` paths start from
    (default: the current directory)."""
    if isinstance(data, Mapping) and data.get("kind", TRANSFORMER_KIND) != TRANSFORMER_KIND:
        raise SpecError(f"{origin}: kind {data['kind']!r} is not a transformer workload; load it with "
                        "dessim.workload.kinds.load_any_workload (simulate_workload accepts every kind)")
    data = _anchor_counts_file(data, base)
    doc = validate(TransformerFile, data, origin)
    if doc.model.hf_config is not None:
        doc = validate(TransformerFile, _expand_hf(data, origin, base), origin)
    name = doc.name if doc.name is not None else default_name
    m, tr = doc.model, doc.training
    model_kw = m.model_dump(exclude_unset=True, exclude={"hf_config", "routing", "mla"})
    try:
        model = TransformerConfig(
            name=name, **model_kw, grad_precision=tr.grad_precision,
            **({"routing": MoERouting(**m.routing.model_dump(exclude_unset=True))} if m.routing else {}),
            **({"mla": MLAConfig(**m.mla.model_dump())} if m.mla else {}))
        if tr.seq_len is not None:
            model = model.with_seq_len(tr.seq_len)
        tr_kw = tr.model_dump(exclude={"offload"})
        tr_kw.update({f"offload_{k}": v for k, v in tr.offload.model_dump().items()})
        spec = WorkloadSpec(name=name, model=model, parallelism=ParallelismSpec(**doc.parallelism.model_dump()),
                            training=TrainingSpec(**tr_kw), description=doc.description, source=doc.source)
        spec.layout(spec.num_gpus)      # the defaults must form a valid layout
        spec.memory_options()
    except SpecError:
        raise
    except DessimError as exc:
        raise SpecError(f"{origin}: {exc}") from None
    return spec


def shipped_workloads(kind: str | None = TRANSFORMER_KIND) -> dict[str, Path]:
    """Preset workload files (``workloads/*.yaml``) by name: those of ``kind`` (a file's
    ``kind:`` key, default ``transformer``), or every file with ``kind=None``."""
    files = data_files("workloads")
    if kind is None:
        return files
    return {name: p for name, p in files.items() if file_kind(p) == kind}


def file_kind(path: Path) -> str | None:
    """The ``kind:`` of a workload file (``transformer`` when absent); None if unreadable."""
    try:
        data = read_yaml(path, "workload file")
    except SpecError:
        return None
    return data.get("kind", TRANSFORMER_KIND) if isinstance(data, dict) else None


def load_workload(path_or_name: str | Path) -> WorkloadSpec:
    """Load a workload from a YAML file path, a preset by name (``"gpt3-175b"``) or a Hugging
    Face ``config.json`` or the directory holding it (the model with the default parallelism
    and training; named after its directory).

    Raises :class:`~dessim.errors.SpecError` naming the file and what is wrong in it.
    """
    text = str(path_or_name)
    path = Path(text)
    if path.is_dir() and (path / "config.json").is_file():     # a Hugging Face model checkout
        path = path / "config.json"
    if not path.is_file():
        found = find_data_file("workloads", text)
        if found is None:
            if path.suffix in (".yaml", ".yml") or "/" in text:
                raise SpecError(f"workload file {text!r} does not exist")
            presets = [n for n, p in data_files("workloads").items() if file_kind(p) not in (None, "cluster")]
            raise SpecError(f"unknown workload {text!r}{did_you_mean(text, presets)}: not a file and not "
                            f"a preset; presets: {', '.join(presets) or '(none found)'} (every kind)")
        path = found
    data = read_yaml(path, "workload file")
    name = path.stem
    if is_hf_config(data):
        name = hf_workload_name(path)
        data = {"name": name, "source": f"Hugging Face config {path}",
                "model": {HF_CONFIG_KEY: path.name}}
    spec = parse_workload(data, origin=str(path), default_name=name, base=path.parent)
    return WorkloadSpec(spec.name, spec.model, spec.parallelism, spec.training,
                        spec.description, spec.source, path)

