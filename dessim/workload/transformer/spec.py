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
        counts: [..] or FILE         # tokens per expert (distribution: counts)
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
      ep: 1                          # expert parallel, carved out of dp
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
from typing import Any, Callable, Mapping


from dessim.catalog.devices import get_device
from dessim.errors import DessimError, SpecError
from dessim.resources import data_files, find_data_file, read_yaml
from dessim.units import parse_count, parse_size
from dessim.workload.common.document import as_bool, as_str, check_keys, check_section
from dessim.workload.common.gradsync import DEFAULT_BUCKET_SIZE
from dessim.workload.transformer.hf_config import (HF_CONFIG_KEY, hf_model_section, hf_workload_name,
                                                   is_hf_config, read_hf_config)
from dessim.workload.transformer.layout import (DEFAULT_ORDER, ParallelLayout, parse_pipeline_layers,
                                                parse_zero_stage)
from dessim.workload.transformer.memory import MemoryOptions
from dessim.workload.transformer.mla import MLAConfig
from dessim.workload.transformer.model import TransformerConfig
from dessim.workload.transformer.overlap import OverlapOptions
from dessim.workload.transformer.routing import MoERouting, read_counts

__all__ = [
    "ParallelismSpec",
    "TrainingSpec",
    "WorkloadSpec",
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
    sp: bool = False
    order: tuple[str, ...] = DEFAULT_ORDER

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

    ``model`` already carries ``training.seq_len`` when that override is given.
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
            tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, ep=par.ep, sp=par.sp, order=par.order,
            zero_stage=tr.zero_stage, schedule=tr.schedule, virtual_stages=tr.virtual_stages,
            micro_batch=tr.micro_batch, global_batch=tr.global_batch, recompute=tr.recompute,
            attention=tr.attention, pipeline_layers=tr.pipeline_layers,
            moe_dispatch=tr.moe_dispatch)
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
Converter = Callable[[Any, str], Any]


def _count(minimum: int = 1) -> Converter:
    return lambda value, what: parse_count(value, what, minimum=minimum)


def _order(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.replace("-", ",").split(",")]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{what}: expected a list of dimension names such as [tp, cp, dp, pp], got {value!r}")
    return tuple(value)


def _size(value: Any, what: str) -> int:
    return parse_size(value, what)


def _zero(value: Any, what: str) -> int:
    return parse_zero_stage(value, what)


def _pipeline_layers(value: Any, what: str) -> tuple[int, ...] | str:
    """A rule name or a list of layer counts (each a dessim.units count)."""
    if isinstance(value, list):
        value = [parse_count(n, f"{what}[{i}]") for i, n in enumerate(value)]
    return parse_pipeline_layers(value, what)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{what}: expected a number, got {value!r}")
    return float(value)


_MLA_SCHEMA: Mapping[str, Converter] = {
    "q_lora_rank": _count(0), "kv_lora_rank": _count(), "qk_rope_head_dim": _count(),
    "qk_nope_head_dim": _count(), "v_head_dim": _count(),
}
_ROUTING_SCHEMA: Mapping[str, Converter] = {
    "distribution": as_str, "exponent": _number, "counts": read_counts,
    "capacity_factor": _number, "max_nodes": _count(),
}


def _mla(value: Any, what: str) -> MLAConfig:
    kw = check_section(value, _MLA_SCHEMA, what)
    missing = [k for k in _MLA_SCHEMA if k not in kw and k != "q_lora_rank"]
    if missing:
        raise SpecError(f"{what}: lacks {', '.join(missing)}")
    return MLAConfig(**kw)


def _routing(value: Any, what: str) -> MoERouting:
    return MoERouting(**check_section(value, _ROUTING_SCHEMA, what))


_MODEL_SCHEMA: Mapping[str, Converter] = {
    "layers": _count(), "hidden": _count(), "heads": _count(), "ffn_hidden": _count(),
    "vocab": _count(), "seq_len": _count(), "kv_heads": _count(), "activation": as_str, "norm": as_str,
    "position_embedding": as_str, "bias": as_bool, "dropout": as_bool, "tied_embeddings": as_bool,
    "precision": as_str, "experts": _count(), "top_k": _count(), "moe_ffn_hidden": _count(),
    "dense_layers": _count(0), "shared_experts": _count(0), "routing": _routing, "mla": _mla,
    "mtp_modules": _count(0), "description": as_str,
}
_MODEL_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len")

_PARALLELISM_SCHEMA: Mapping[str, Converter] = {
    "tp": _count(), "pp": _count(), "dp": _count(), "cp": _count(), "ep": _count(), "sp": as_bool,
    "order": _order,
}

_TRAINING_SCHEMA: Mapping[str, Converter] = {
    "micro_batch": _count(), "global_batch": _count(), "seq_len": _count(), "schedule": as_str,
    "virtual_stages": _count(), "pipeline_layers": _pipeline_layers, "recompute": as_str,
    "attention": as_str, "moe_dispatch": as_str, "zero_stage": _zero,
    "bucket_size": _size,
    "offload": None,  # nested section, see _OFFLOAD_SCHEMA  # type: ignore[dict-item]
    "device": lambda v, what: get_device(as_str(v, what), what).name, "tp_comm_overlap": as_bool, "fuse_optimizer_allreduce": as_bool,
}
_OFFLOAD_SCHEMA: Mapping[str, Converter] = {"optimizer": as_str, "activations": as_str}

_TOP_KEYS = ("name", "description", "source", "kind", "model", "parallelism", "training")
#: Value of the optional ``kind:`` key of a transformer file; other kinds (``dlrm``, ``cnn``)
#: are parsed by :mod:`dessim.workload.kinds`.
TRANSFORMER_KIND = "transformer"


def _model_section(raw: Any, origin: str, base: Path | None) -> dict[str, Any]:
    """The ``model:`` section with a ``hf_config`` (path relative to ``base``) expanded: the
    Hugging Face config's keys, overridden by the section's own."""
    if not isinstance(raw, dict) or HF_CONFIG_KEY not in raw:
        return raw
    where = f"{origin}: model.{HF_CONFIG_KEY}"
    ref = as_str(raw[HF_CONFIG_KEY], where)
    path = Path(ref).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    hf = hf_model_section(read_hf_config(path), str(path))
    return {**hf, **{k: v for k, v in raw.items() if k != HF_CONFIG_KEY}}


def parse_workload(data: Any, origin: str = "<workload>", default_name: str = "workload",
                   base: Path | None = None) -> WorkloadSpec:
    """A :class:`WorkloadSpec` from already-parsed YAML/JSON data; ``origin`` names the file
    in error messages; ``base``: the directory relative ``model.hf_config`` paths start from
    (default: the current directory)."""
    check_keys(data, _TOP_KEYS, origin,
               f"a workload file must be a mapping with keys {', '.join(_TOP_KEYS)}")
    if data.get("kind", TRANSFORMER_KIND) != TRANSFORMER_KIND:
        raise SpecError(f"{origin}: kind {data['kind']!r} is not a transformer workload; load it with "
                        "dessim.workload.kinds.load_any_workload (simulate_workload accepts every kind)")
    name = as_str(data.get("name", default_name), f"{origin}: name")
    if "model" not in data:
        raise SpecError(f"{origin}: missing the 'model' section")
    model_kw = check_section(_model_section(data["model"], origin, base), _MODEL_SCHEMA, f"{origin}: model")
    missing = [k for k in _MODEL_REQUIRED if k not in model_kw]
    if missing:
        raise SpecError(f"{origin}: model section lacks {', '.join(missing)}")
    par_kw = check_section(data.get("parallelism"), _PARALLELISM_SCHEMA, f"{origin}: parallelism")
    tr_kw = check_section(data.get("training"), _TRAINING_SCHEMA, f"{origin}: training")
    offload = check_section(tr_kw.pop("offload", None), _OFFLOAD_SCHEMA, f"{origin}: training.offload")
    tr_kw.update({f"offload_{k}": v for k, v in offload.items()})
    try:
        model = TransformerConfig(name=name, **model_kw)
        if tr_kw.get("seq_len") is not None:
            model = model.with_seq_len(tr_kw["seq_len"])
        spec = WorkloadSpec(name=name, model=model, parallelism=ParallelismSpec(**par_kw),
                            training=TrainingSpec(**tr_kw),
                            description=as_str(data.get("description", ""), f"{origin}: description"),
                            source=as_str(data.get("source", ""), f"{origin}: source"))
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
            names = ", ".join(n for n, p in data_files("workloads").items()
                              if file_kind(p) not in (None, "cluster")) or "(none found)"
            raise SpecError(f"unknown workload {text!r}: not a file and not a preset; presets: "
                            f"{names} (every kind)")
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

