"""Data-parallel passes over a stack of layers, for the DLRM and CNN/ViT generators.

A :class:`Layer` holds the kernels of one layer for one micro-batch on one rank (forward in
execution order, backward in execution order) and its data-parallel parameter count. The
emitters below produce, on one rank:

* :func:`emit_forward` — one compute task per layer, in order;
* :func:`emit_backward` — one compute task per layer, in reverse order; with a
  :class:`~dessim.workload.dataparallel.compression.GradSync`, the layers' gradients are packed into
  buckets with :func:`~dessim.workload.common.gradsync.fill_buckets` (the same policy as the
  transformer generator) and each bucket's exchange is emitted right after the layer that
  fills it, so it overlaps the rest of the backward (PyTorch DDP);
* :func:`emit_optimizer` — the memory-bound optimizer step (same kernel as the transformer
  generator's: read gradient + state, write state + weights; mixed-precision Adam's
  ``K`` bytes of state per parameter, :class:`~dessim.workload.common.precision.Precision`).

Gradient accumulation: with several micro-batches, only the last backward reduces (DDP's
``no_sync`` for the others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from dessim.workload.dataparallel.compression import GradSync
from dessim.workload.dataparallel.paramserver import PSSync, bucket_of_layers, emit_iterations
from dessim.workload.common.emitter import TaskEmitter
from dessim.workload.common.gradsync import fill_buckets
from dessim.workload.common.kernels import Kernel, KernelBuilder
from dessim.workload.common.precision import Precision

__all__ = ["Layer", "mlp_layers", "emit_forward", "emit_backward", "emit_optimizer", "optimizer_kernel",
           "layer_from_forward", "memory_breakdown", "emit_training"]

#: FLOPs per element of ReLU (one compare) — an estimate, not model FLOPs.
RELU_FLOPS = 1.0


@dataclass(frozen=True)
class Layer:
    """One layer: kernels for one micro-batch on one rank and data-parallel parameters."""

    name: str
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    params: float = 0.0

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.forward + self.backward)

    @property
    def model_flops(self) -> float:
        return sum(k.flops for k in self.forward + self.backward if k.is_model_flops)


def layer_from_forward(name: str, forward: Sequence[Kernel], params: float, builder: KernelBuilder,
                       skip_dgrad: bool = False) -> Layer:
    """A layer whose backward follows the transformer kernels' conventions
    (:class:`~dessim.workload.common.kernels.KernelBuilder`): GEMM → dgrad + wgrad, others 2× FLOPs.
    ``skip_dgrad``: the layer's input needs no gradient (the network's first layer)."""
    backward = [k for fwd in reversed(forward) for k in builder.backward(fwd)]
    if skip_dgrad:
        backward = [k for k in backward if not k.name.endswith(".dgrad")]
    return Layer(name, tuple(forward), tuple(backward), float(params))


def mlp_layers(prefix: str, sizes: Sequence[int], batch: int, precision: Precision,
               final_relu: bool = True) -> list[Layer]:
    """Fully connected layers ``sizes[0] → sizes[1] → ...`` on ``batch`` rows, each a GEMM
    ``(batch, out, in)`` with bias and ReLU (none after the last when ``final_relu`` is off);
    parameters ``in·out + out``."""
    b = KernelBuilder(precision)
    out = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        ks = [b.matmul(f"{prefix}{i}.fc", batch, n_out, n_in)]
        if final_relu or i < len(sizes) - 2:
            ks.append(b.elementwise(f"{prefix}{i}.relu", batch * n_out, batch * n_out, RELU_FLOPS * batch * n_out))
        out.append(layer_from_forward(f"{prefix}{i}", ks, n_in * n_out + n_out, b))
    return out


def emit_forward(em: TaskEmitter, rank: int, layers: Sequence[Layer], deps: Sequence[str], mb: int,
                 extra_deps: Mapping[str, Sequence[str]] | None = None) -> str:
    """Forward tasks of ``layers``; returns the last task id. ``extra_deps[name]``: more
    tasks layer ``name`` waits for."""
    extra = extra_deps or {}
    last = list(deps)
    for layer in layers:
        last = [em.compute(rank, layer.forward, f"fwd {layer.name} mb{mb}", "fwd",
                           last + list(extra.get(layer.name, ())))]
    return last[0] if last else ""


def emit_backward(em: TaskEmitter, rank: int, layers: Sequence[Layer], deps: Sequence[str], mb: int,
                  sync: GradSync | None = None, bucket_size: float = 0.0,
                  after: Mapping[str, Callable[[str], None]] | None = None,
                  extra_deps: Mapping[str, Sequence[str]] | None = None) -> str:
    """Backward tasks of ``layers`` (given in forward order), with bucketed gradient sync
    when ``sync`` is given (module docstring). ``after[name](task id)`` is called once the
    layer's backward task exists (e.g. to start an all-to-all); returns the last task id."""
    buckets: dict[str, list[float]] = {}
    if sync is not None:
        ready = ((l.name, {"dp": l.params * sync.grad_bytes}) for l in reversed(layers) if l.backward)
        for b in fill_buckets(ready, bucket_size):
            buckets.setdefault(b.after, []).append(b.nbytes)
    hooks = after or {}
    extra = extra_deps or {}
    last = list(deps)
    for layer in reversed(layers):
        if not layer.backward:
            continue
        tid = em.compute(rank, layer.backward, f"bwd {layer.name} mb{mb}", "bwd",
                         last + list(extra.get(layer.name, ())))
        last = [tid]
        for nbytes in buckets.get(layer.name, ()):
            n = em.count(rank, "bucket")
            sync.bucket(em, rank, nbytes, [tid], f"bucket{n}")  # type: ignore[union-attr]
        if layer.name in hooks:
            hooks[layer.name](tid)
    return last[0] if last else ""


def optimizer_kernel(params: float, precision: Precision, name: str = "optimizer.step") -> Kernel:
    """The optimizer step over ``params`` parameters: reads gradient and state, writes state
    and weights (memory-bound)."""
    p = precision
    return Kernel(name, "optimizer", "optimizer", 0.0, params * (p.grad_bytes + p.optimizer_bytes),
                  params * (p.optimizer_bytes + p.param_bytes))


def emit_optimizer(em: TaskEmitter, rank: int, params: float, precision: Precision,
                   deps: Sequence[str]) -> str:
    """The optimizer step after ``deps`` and after everything on the rank's ``dp`` stream."""
    waits = list(deps) + [em.last(rank, "dp")]
    return em.compute(rank, [optimizer_kernel(params, precision)], "optimizer step", "optimizer", waits)


def emit_training(em: TaskEmitter, ranks: int, layers: Sequence[Layer], params: float, precision: Precision,
                  bucket_size: float, ps: PSSync | None,
                  iteration: Callable[[int, list[str], dict[str, list[str]]], str]) -> None:
    """Every rank's training: ``iteration(rank, start deps, extra deps by layer)`` emits one
    rank's forward and backward and returns its last task. All-reduce (``ps`` None): one
    iteration, then the optimizer step; parameter servers: several iterations with pushes and
    pulls (:func:`~dessim.workload.dataparallel.paramserver.emit_iterations`)."""
    if ps is None:
        for rank in range(ranks):
            emit_optimizer(em, rank, params, precision, [iteration(rank, [], {})])
    else:
        emit_iterations(ps, em, bucket_of_layers(layers, precision.grad_bytes, bucket_size), iteration)


def memory_breakdown(params: float, precision: Precision, layers: Sequence[Layer], bucket_size: float,
                     extra: Mapping[str, float] | None = None, servers: bool = False) -> dict[str, float]:
    """Per-GPU memory of a data-parallel replica (bytes): weights, gradients and optimizer
    state (``param_bytes + grad_bytes + K`` per parameter, :class:`Precision`), stored
    activations (every forward kernel's output of one micro-batch, kept for the backward —
    an upper bound, no in-place reuse), two gradient buckets in flight (the transformer
    estimate's assumption), plus ``extra`` categories; ``total`` last. ``servers``: parameter
    servers hold the optimizer state (none on the GPU)."""
    p = precision
    out = {"weights": params * p.param_bytes, "gradients": params * p.grad_bytes,
           "optimizer": 0.0 if servers else params * p.optimizer_bytes,
           "activations": float(sum(k.bytes_written for l in layers for k in l.forward)),
           "comm_buffers": 2.0 * bucket_size}
    out.update(extra or {})
    out["total"] = sum(out.values())
    return out
