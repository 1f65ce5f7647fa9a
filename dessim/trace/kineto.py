"""Kernel and collective times from a PyTorch profiler (Kineto) trace.

``torch.profiler``'s ``export_chrome_trace`` writes a Chrome trace-event JSON object whose
``traceEvents`` hold, among others (as in the libkineto output pytorch/kineto keeps in
``docs/traces/before_fix_trace.json``, commit 00a807b, and the traces cited in
tests/data/calibration/README.md):

* ``"cat": "cpu_op"`` complete events (``"ph": "X"``, ``ts``/``dur`` in µs) for ATen ops, with
  ``args`` ``External id``, and with ``record_shapes=True`` ``Input Dims``, ``Input type`` and
  ``Concrete Inputs``; ``record_param_comms`` ops carry ``Collective name``, ``In msg nelems``,
  ``Out msg nelems``, ``dtype`` and ``Group size``;
* ``"cat": "cuda_runtime"`` events for the launches (``cudaLaunchKernel``,
  ``hipModuleLaunchKernel``, ...), with ``args.correlation``;
* ``"cat": "kernel"`` events for GPU kernels, with ``args`` ``device``, ``stream``,
  ``correlation`` and ``External id``;
* ``ac2g`` flow events (``"ph": "s"`` at the launch, ``"ph": "f"`` at the kernel, same ``id``).

Older traces use ``Operator`` / ``Runtime`` / ``Kernel`` categories, lower-case
``external id`` and ``async``/``launch`` flows (pytorch/kineto
``tb_plugin/test/gpu_metrics_input.json``, commit 301f611, a 2021 trace); they are read the same
way.

Each GPU kernel is tied to the ATen op that launched it: through its launch (the runtime event
with the kernel's correlation id, else the flow's start) to the innermost ``cpu_op`` whose time
span contains the launch on the same thread; failing that, through ``External id``, which
Kineto sets to the launching op's id (in some traces it holds the correlation id instead:
facebookresearch/HolisticTraceAnalysis ``tests/data/call_stack/backward_thread.json``, commit
c1235b4). Then:

(a) GEMMs: kernels launched inside ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``,
    ``linear`` (the innermost one) become one ``matmul`` :class:`KernelMeasurement` per op call
    (the time adds up every kernel of that call, e.g. a split-K GEMM and its reduction), with the
    shape from ``Input Dims``; kernels whose name says GEMM (``gemm``, ``Cijk_``, ``nvjet``) but
    that no op claims become matmuls of unknown shape.
(b) Attention: kernels inside the SDPA ops (``aten::scaled_dot_product_attention``,
    ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`` and their ``_backward``,
    ``aten::_flash_attention_forward``/``_backward``, ``aten::_efficient_attention_*``,
    ``flash_attn::*``) or named like an attention kernel (``flash``, ``fmha``, ``attn``,
    ``sdpa``, ``mha``) become ``attention`` measurements, one per op call, with
    ``(B, H, Sq, Sk, D)`` from the query and key dims (BHSD for the SDPA ops, BSHD for the
    ``_flash_attention``/``_efficient_attention``/``flash_attn`` ones) and ``causal`` from
    ``Concrete Inputs`` where the op's signature is known (else None, and then no FLOPs).
(c) NCCL kernels (``ncclDevKernel_…``, ``ncclKernel_…``, ``nccl<Coll><Algo><Proto>Kernel_…``)
    become :class:`CollectiveMeasurement` s. CAUTION: the algorithm and protocol in an NCCL
    kernel name are those the kernel is *specialised* for; one kernel runs every algorithm and
    protocol, and since NCCL 2.19 only RING/TREE and LL kernels are built, so the name is not
    what ran (NVIDIA/nccl#1595, #502, #2196; NVIDIA/nccl ``src/device/generate.py``
    ``best_kernel``). The size comes from ``In msg nelems``/``Out msg nelems``/``dtype``/``Group
    size`` on the kernel or its ``record_param_comms`` op, as nccl-tests counts it:
    max(in, out) × element size (whole array for allgather/reducescatter, per-rank buffer
    otherwise).
(d) Every other kernel is a ``memory`` measurement under its own name, shape unknown (this
    includes convolutions and other compute kernels this reader does not recognise).

``phase`` is ``bwd`` when an enclosing op is an autograd backward node (a name ending in
``Backward0``/``Backward1`` or starting ``autograd::engine::evaluate_function``) or a
``*_backward`` op, else ``fwd``; ``dtype`` comes from the op's first tensor ``Input type``
(``float`` -> fp32: a TF32 math mode is not recorded in traces). Times are the kernels' ``dur``
(µs in the file, seconds here); zero is possible in old traces that round to whole µs.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dessim.catalog.devices import get_device
from dessim.errors import DessimError, TraceError
from dessim.trace.kernel_csv import KernelMeasurement
from dessim.trace.text_source import TextSource, load_json, load_text

__all__ = ["CollectiveMeasurement", "KinetoTrace", "read_kineto", "parse_nccl_kernel_name"]

_CPU_CATS = frozenset({"cpu_op", "operator"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
_KERNEL_CATS = frozenset({"kernel"})
_FLOW_CATS = frozenset({"ac2g", "async"})

_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                       "aten::linear"})
_GEMM_NAME = re.compile(r"gemm|^Cijk_|nvjet", re.IGNORECASE)
_ATTENTION_NAME = re.compile(r"flash|fmha|attn|attention|sdpa|mha", re.IGNORECASE)
#: SDPA-family ops: name -> (layout of query/key dims, index of is_causal in Concrete Inputs).
_ATTENTION_OPS: dict[str, tuple[str, int | None]] = {
    "aten::scaled_dot_product_attention": ("bhsd", 5),
    "aten::_scaled_dot_product_flash_attention": ("bhsd", 4),
    "aten::_scaled_dot_product_efficient_attention": ("bhsd", 6),
    "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 6),
    "aten::_flash_attention_forward": ("bshd", 8),
    "aten::_efficient_attention_forward": ("bshd", None),
}
_BACKWARD_OP = re.compile(r"Backward\d*$|^autograd::engine::evaluate_function|_backward\b")

_PRECISIONS = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16",
               "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
               "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}
#: torch ScalarType names (as ``record_param_comms`` writes ``dtype``) -> bytes.
_COMM_DTYPE_BYTES = {
    "Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Int": 4, "Long": 8, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
_NCCL_COLLS = {"allreduce": "allreduce", "allgather": "allgather", "allgatherv": "allgather",
               "reducescatter": "reducescatter", "broadcast": "broadcast", "reduce": "reduce",
               "sendrecv": "sendrecv", "alltoall": "alltoall"}
_TORCH_COLLS = [  # (regex on the torch collective name, dessim op); first match wins
    (re.compile(r"reduce_?scatter"), "reducescatter"),
    (re.compile(r"all_?reduce"), "allreduce"),
    (re.compile(r"all_?gather"), "allgather"),
    (re.compile(r"all_?to_?all"), "alltoall"),
    (re.compile(r"broadcast"), "broadcast"),
    (re.compile(r"^_?reduce"), "reduce"),
    (re.compile(r"^(send|recv)"), "sendrecv"),
]
_NCCL_NEW = re.compile(  # NCCL >= 2.19: ncclDevKernel_<Coll>[_<RedOp>_<type>][_<ALGO>_<PROTO>]
    r"^ncclDevKernel_(?P<coll>[A-Za-z]+?)(?:_(?P<redop>Sum|Prod|MinMax|PreMulSum|SumPostDiv)"
    r"_(?P<ty>[a-z0-9]+))?(?:_(?P<algo>TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)"
    r"_(?P<proto>LL128|LL|SIMPLE))?(?:_\d+)?(?:\(|$)")
_NCCL_MID = re.compile(  # NCCL 2.12-2.18: ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>
    r"^ncclKernel_(?P<coll>[A-Za-z]+)_(?P<algo>TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|"
    r"NVLS_TREE|NVLS)_(?P<proto>LL128|LL|SIMPLE)_(?P<redop>[A-Za-z]+)_(?P<ty>\w+?)(?:\(|$)")
_NCCL_OLD = re.compile(  # NCCL <= 2.11: nccl<Coll><Algo><Proto>Kernel_<redop>_<type>
    r"^nccl(?P<coll>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv)"
    r"(?P<algo>Ring|Tree|CollNet)?(?P<proto>LL128|LL|Simple)?Kernel(?:_(?P<redop>[a-z]+)"
    r"_(?P<ty>\w+?))?(?:\(|$)")


@dataclass(frozen=True)
class CollectiveMeasurement:
    """One NCCL kernel: which collective, how big, how long.

    ``op`` is dessim's op name (``allreduce``, ...), or the lower-cased NCCL name when dessim has
    no such op (``generic``); ``algorithm``/``protocol`` (lower case: ``ring``, ``tree``,
    ``nvls``, ...; ``ll``, ``ll128``, ``simple``) are those the kernel name is specialised for,
    NOT necessarily what ran (module docstring), None when the name has none. ``size_bytes`` is
    the nccl-tests size (None when the trace has no message metadata), ``ranks`` the group size
    (None if absent), ``time_s`` the kernel duration. ``name`` is the kernel name, ``dtype`` the
    torch dtype name of the message, ``source`` the trace file.
    """

    op: str
    algorithm: str | None
    protocol: str | None
    size_bytes: int | None
    ranks: int | None
    time_s: float
    source: str
    name: str = ""
    dtype: str | None = None


@dataclass(frozen=True)
class KinetoTrace:
    """What :func:`read_kineto` found: kernels (matmul, attention and memory kinds, in start-time
    order) and NCCL collectives, plus the device names listed in ``deviceProperties``."""

    kernels: tuple[KernelMeasurement, ...]
    collectives: tuple[CollectiveMeasurement, ...]
    source: str
    devices: tuple[str, ...] = ()

    @property
    def gemms(self) -> tuple[KernelMeasurement, ...]:
        return tuple(k for k in self.kernels if k.kind == "matmul")

    @property
    def attention(self) -> tuple[KernelMeasurement, ...]:
        return tuple(k for k in self.kernels if k.kind == "attention")

    @property
    def memory(self) -> tuple[KernelMeasurement, ...]:
        return tuple(k for k in self.kernels if k.kind == "memory")


def parse_nccl_kernel_name(name: str) -> tuple[str, str | None, str | None] | None:
    """``(op, algorithm, protocol)`` from an NCCL kernel name, None if it is not one.

    ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` -> ``("allreduce", "ring", "ll")``;
    ``ncclKernel_AllGather_RING_LL_Sum_int8_t`` -> ``("allgather", "ring", "ll")``;
    ``ncclAllReduceTreeLLKernel_sum_f32`` -> ``("allreduce", "tree", "ll")``;
    ``ncclDevKernel_Generic`` -> ``("generic", None, None)``. See the CAUTION in the module
    docstring about what the algorithm and protocol mean.
    """
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    for pattern in (_NCCL_NEW, _NCCL_MID, _NCCL_OLD):
        m = pattern.match(name)
        if m:
            coll = m.group("coll").lower()
            algo = (m.group("algo") or "").lower() or None
            proto = (m.group("proto") or "").lower() or None
            return _NCCL_COLLS.get(coll, coll), algo, proto
    return None


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------


@dataclass
class _Op:
    name: str
    ts: float
    end: float
    args: Mapping[str, Any]
    index: int
    parent: "_Op | None" = None


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, None if it is not a finite number (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _number(event: Mapping[str, Any], key: str, where: str, *, minimum: float | None = None
            ) -> float:
    value = _finite(event.get(key))
    if value is None:
        raise TraceError(f"{where}: {key!r} must be a finite number, got {event.get(key)!r}")
    if minimum is not None and value < minimum:
        raise TraceError(f"{where}: {key!r} is {value!r}; it must be >= {minimum:g}")
    return value


def _args(event: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    args = event.get("args", {})
    if not isinstance(args, dict):
        raise TraceError(f"{where}: 'args' must be an object, got {args!r}")
    return args


def _arg(args: Mapping[str, Any], key: str) -> Any:
    """``args[key]``, matching the key case-insensitively (old traces write 'external id')."""
    if key in args:
        return args[key]
    lower = key.lower()
    for k, v in args.items():
        if isinstance(k, str) and k.lower() == lower:
            return v
    return None


def _id(value: Any) -> int | str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, str)):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    return None


def _thread_key(event: Mapping[str, Any]) -> tuple[str, str]:
    return str(event.get("pid")), str(event.get("tid"))


def _link_parents(ops: list[_Op]) -> None:
    """Set each op's parent: the innermost op of the same thread whose span contains it."""
    stack: list[_Op] = []
    for op in sorted(ops, key=lambda o: (o.ts, -o.end, o.index)):
        while stack and not (stack[-1].ts <= op.ts and op.end <= stack[-1].end):
            stack.pop()
        op.parent = stack[-1] if stack else None
        stack.append(op)


class _Timeline:
    """The cpu ops of one thread, for 'innermost op containing time t' queries."""

    def __init__(self, ops: list[_Op]) -> None:
        self.ops = sorted(ops, key=lambda o: (o.ts, -o.end, o.index))
        self.starts = [o.ts for o in self.ops]

    def innermost(self, t: float) -> _Op | None:
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0:
            op = self.ops[i]
            if op.ts <= t <= op.end:
                # the latest-starting op containing t; a later sibling may share its start
                return op
            i -= 1
        return None


def _chain(op: _Op | None) -> list[_Op]:
    out = []
    while op is not None and len(out) < 10_000:
        out.append(op)
        op = op.parent
    return out


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------


def _dims(args: Mapping[str, Any]) -> list[list[int]] | None:
    dims = _arg(args, "Input Dims")
    if not isinstance(dims, list):
        return None
    out = []
    for d in dims:
        if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and x >= 0 for x in d):
            out.append([])       # a scalar, a list of tensors, a symbolic size: not a tensor dim
        else:
            out.append(d)
    return out


def _gemm_shape(name: str, args: Mapping[str, Any]) -> tuple[int, ...]:
    """(B, M, N, K) from an ATen GEMM op's Input Dims, or () if they do not fit."""
    dims = _dims(args)
    if dims is None:
        return ()
    first = next((d for d in dims if d), None)
    try:
        if name == "aten::mm":
            (m, k), (k2, n) = dims[0], dims[1]
            return (1, m, n, k) if k == k2 else ()
        if name == "aten::addmm":
            (m, k), (k2, n) = dims[1], dims[2]
            return (1, m, n, k) if k == k2 else ()
        if name == "aten::bmm":
            (b, m, k), (b2, k2, n) = dims[0], dims[1]
            return (b, m, n, k) if (b, k) == (b2, k2) else ()
        if name == "aten::baddbmm":
            (b, m, k), (b2, k2, n) = dims[1], dims[2]
            return (b, m, n, k) if (b, k) == (b2, k2) else ()
        if name == "aten::linear":
            x, w = dims[0], dims[1]
            n, k = w
            if len(x) < 1 or x[-1] != k:
                return ()
            return (1, math.prod(x[:-1]), n, k)
        if name == "aten::matmul" and first is not None:
            a, b = dims[0], dims[1]
            if len(a) >= 2 and len(b) == 2 and a[-1] == b[0]:
                return (1, math.prod(a[:-1]), b[1], a[-1])
            if len(a) >= 3 and len(b) >= 3 and a[:-2] == b[:-2] and a[-1] == b[-2]:
                return (math.prod(a[:-2]), a[-2], b[-1], a[-1])
    except (ValueError, IndexError, TypeError):
        return ()
    return ()


def _attention_shape(name: str, args: Mapping[str, Any]) -> tuple[tuple[int, ...], bool | None]:
    """((B, H, Sq, Sk, D), causal) from an attention op, or ((), None)."""
    if name.startswith("flash_attn::"):
        layout, causal_index = "bshd", None
    else:
        base = name[:-len("_backward")] if name.endswith("_backward") else name
        if base not in _ATTENTION_OPS:
            return (), None
        layout, causal_index = _ATTENTION_OPS[base]
        if base != name:
            causal_index = None   # backward signatures differ; do not guess
    dims = _dims(args)
    offset = 1 if name.endswith("_backward") else 0   # backward ops take grad_out first
    if dims is None or len(dims) < offset + 2:
        return (), None
    q, k = dims[offset], dims[offset + 1]
    if len(q) != 4 or len(k) != 4:
        return (), None
    if layout == "bhsd":
        (b, h, sq, d), (b2, _, sk, d2) = q, k
    else:
        (b, sq, h, d), (b2, sk, _, d2) = q, k
    if (b, d) != (b2, d2):
        return (), None
    causal = None
    concrete = _arg(args, "Concrete Inputs")
    if causal_index is not None and isinstance(concrete, list) and len(concrete) > causal_index:
        causal = {"True": True, "False": False}.get(concrete[causal_index])
    return (b, h, sq, sk, d), causal


def _precision(args: Mapping[str, Any]) -> str | None:
    types = _arg(args, "Input type")
    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and t in _PRECISIONS:
                return _PRECISIONS[t]
    return None


def _device_name(devices: Mapping[Any, str], device: Any) -> str | None:
    raw = devices.get(device)
    if raw is None:
        return None
    for candidate in (raw, re.sub(r"^(NVIDIA|AMD Instinct|AMD|Tesla)\s+", "", raw)):
        try:
            return get_device(candidate).name
        except DessimError:
            continue
    return None


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _comm_metadata(args_list: Sequence[Mapping[str, Any]]) -> tuple[str | None, int | None,
                                                                  int | None, str | None]:
    """(torch collective name, size in bytes, group size, dtype) from the first args that have
    message metadata."""
    for args in args_list:
        nin, nout = _arg(args, "In msg nelems"), _arg(args, "Out msg nelems")
        if nin is None and nout is None:
            continue
        dtype = _arg(args, "dtype")
        counts = [v for v in (nin, nout) if isinstance(v, int) and not isinstance(v, bool)
                  and v >= 0]
        size = None
        if counts and isinstance(dtype, str) and dtype in _COMM_DTYPE_BYTES:
            size = max(counts) * _COMM_DTYPE_BYTES[dtype]
        group = _arg(args, "Group size")
        group = group if isinstance(group, int) and not isinstance(group, bool) and group >= 1 \
            else None
        coll = _arg(args, "Collective name")
        return (coll if isinstance(coll, str) else None), size, group, \
            (dtype if isinstance(dtype, str) else None)
    return None, None, None, None


def _torch_op(collective: str | None) -> str | None:
    if not collective:
        return None
    key = collective.lower()
    for pattern, op in _TORCH_COLLS:
        if pattern.search(key):
            return op
    return None


def _phase(chain: Sequence[_Op]) -> str:
    return "bwd" if any(_BACKWARD_OP.search(op.name) for op in chain) else "fwd"


def _decide(chain: Sequence[_Op], kernel_name: str) -> tuple[str, _Op | None]:
    """('matmul' | 'attention' | 'memory', the op that decided it)."""
    for op in chain:
        if op.name in _GEMM_OPS:
            return "matmul", op
        if op.name.startswith("flash_attn::") or op.name in _ATTENTION_OPS or (
                op.name.endswith("_backward") and op.name[:-9] in _ATTENTION_OPS):
            return "attention", op
    if _GEMM_NAME.search(kernel_name):
        return "matmul", None
    if _ATTENTION_NAME.search(kernel_name):
        return "attention", None
    return "memory", None


def read_kineto(path_or_text: TextSource) -> KinetoTrace:
    """Read a Kineto Chrome trace (``.json`` or ``.json.gz``; see the module docstring).

    ``path_or_text`` follows :mod:`dessim.trace.text_source`. Raises
    :class:`~dessim.errors.TraceError` when the file is not JSON, not a trace (an object with a
    ``traceEvents`` list, or a bare list of events), or when an event this reader uses (a kernel,
    an op, a runtime launch) lacks a finite ``ts``/``dur`` or has non-object ``args``; the
    message names the file and the event (``traceEvents[i]``).
    """
    loaded = load_text(path_or_text)
    name = loaded.name
    doc = load_json(loaded.text, name)
    if isinstance(doc, list):
        events, props = doc, []
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events, props = doc["traceEvents"], doc.get("deviceProperties", [])
    else:
        raise TraceError(f"{name}: not a Chrome trace (expected an object with a 'traceEvents' "
                         "list, or a list of events)")
    devices: dict[Any, str] = {}
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                devices[_id(p.get("id"))] = p["name"]

    ops: list[_Op] = []
    ops_by_thread: dict[tuple[str, str], list[_Op]] = defaultdict(list)
    launches: dict[Any, tuple[tuple[str, str], float]] = {}
    flow_starts: dict[Any, tuple[tuple[str, str], float]] = {}
    flow_ends: dict[tuple[tuple[str, str], float], Any] = {}
    kernels: list[tuple[int, Mapping[str, Any]]] = []
    for index, event in enumerate(events):
        where = f"{name}: traceEvents[{index}]"
        if not isinstance(event, dict):
            raise TraceError(f"{where}: an event must be an object, got {type(event).__name__}")
        cat = event.get("cat")
        cat = cat.lower() if isinstance(cat, str) else ""
        ph = event.get("ph")
        if cat in _FLOW_CATS and ph in ("s", "f"):
            flow_id = _id(event.get("id"))
            ts = _finite(event.get("ts"))
            if flow_id is None or ts is None:
                continue  # a flow arrow we cannot use; it only helps linking
            if ph == "s":
                flow_starts[flow_id] = (_thread_key(event), ts)
            else:
                flow_ends[(_thread_key(event), ts)] = flow_id
            continue
        if ph != "X" or not (cat in _CPU_CATS or cat in _RUNTIME_CATS or cat in _KERNEL_CATS):
            continue
        ts = _number(event, "ts", where)
        dur = _number(event, "dur", where, minimum=0)
        args = _args(event, where)
        label = event.get("name")
        if not isinstance(label, str):
            raise TraceError(f"{where}: 'name' must be a string, got {label!r}")
        if cat in _CPU_CATS:
            op = _Op(label, ts, ts + dur, args, index)
            ops.append(op)
            ops_by_thread[_thread_key(event)].append(op)
        elif cat in _RUNTIME_CATS:
            corr = _id(_arg(args, "correlation"))
            if corr is not None:
                launches[corr] = (_thread_key(event), ts)
        else:
            kernels.append((index, event))

    _link_parents(ops)
    timelines = {key: _Timeline(group) for key, group in ops_by_thread.items()}
    by_external: dict[Any, _Op | None] = {}
    for op in ops:
        ext = _id(_arg(op.args, "External id"))
        if ext is not None:
            by_external[ext] = None if ext in by_external else op   # ambiguous ids link nothing

    def launching_op(event: Mapping[str, Any], args: Mapping[str, Any]) -> _Op | None:
        launch = launches.get(_id(_arg(args, "correlation")))
        if launch is None:
            flow = flow_ends.get((_thread_key(event), float(event["ts"])))
            launch = flow_starts.get(flow) if flow is not None else None
        if launch is not None:
            timeline = timelines.get(launch[0])
            found = timeline.innermost(launch[1]) if timeline else None
            if found is not None:
                return found
        return by_external.get(_id(_arg(args, "External id")))

    measured: list[tuple[float, KernelMeasurement]] = []
    collectives: list[tuple[float, CollectiveMeasurement]] = []
    groups: dict[int, dict[str, Any]] = {}
    for index, event in kernels:
        args = event.get("args", {})
        label = event["name"]
        ts, time_s = float(event["ts"]), float(event["dur"]) / 1e6
        op = launching_op(event, args)
        chain = _chain(op)
        nccl = parse_nccl_kernel_name(label)
        if nccl is not None:
            coll, size, group, dtype = _comm_metadata([args, *(o.args for o in chain)])
            kind = _torch_op(coll) or nccl[0]
            collectives.append((ts, CollectiveMeasurement(kind, nccl[1], nccl[2], size, group,
                                                          time_s, name, label, dtype)))
            continue
        gpu = _device_name(devices, _id(_arg(args, "device")))
        kind, decider = _decide(chain, label)
        if decider is None:
            measured.append((ts, KernelMeasurement(
                kind, (), None, time_s, gpu, None, None, _phase(chain) if chain else None,
                label, 1, name, None)))
            continue
        group_state = groups.get(decider.index)
        if group_state is None:
            groups[decider.index] = {"ts": ts, "kind": kind, "op": decider, "chain": chain,
                                     "time": time_s, "names": [(time_s, label)], "gpu": gpu}
        else:
            group_state["time"] += time_s
            group_state["names"].append((time_s, label))
            group_state["ts"] = min(group_state["ts"], ts)
    for state in groups.values():
        decider: _Op = state["op"]
        chain = state["chain"][state["chain"].index(decider):]
        if state["kind"] == "matmul":
            shape, causal = _gemm_shape(decider.name, decider.args), False
        else:
            shape, causal = (), None
            for op in chain:   # the innermost attention op that yields a shape
                shape, causal = _attention_shape(op.name, op.args)
                if shape:
                    break
        main = max(state["names"], key=lambda item: item[0])[1]
        measured.append((state["ts"], KernelMeasurement(
            state["kind"], shape, _precision(decider.args), state["time"], state["gpu"], causal,
            None, _phase(state["chain"]), main, len(state["names"]), name, None)))
    measured.sort(key=lambda item: item[0])
    collectives.sort(key=lambda item: item[0])
    return KinetoTrace(tuple(m for _, m in measured), tuple(c for _, c in collectives), name,
                       tuple(devices.values()))
