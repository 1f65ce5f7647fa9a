"""Record the per-rank pass order that DeepSeek's reference DualPipe executes.

Runs the unmodified ``DualPipe.step`` of a deepseek-ai/DualPipe checkout
(https://github.com/deepseek-ai/DualPipe, ``dualpipe/dualpipe.py`` and ``dualpipe/utils.py``)
with torch, torch.distributed and ``dualpipe.comm`` replaced by recording stand-ins: every
forward, backward and weight-gradient call the reference makes is written down in the order it
makes it, one rank after the other (communication is not needed to learn a rank's order:
each rank's order is fixed by the eight steps of ``step``). The reference's own
``WeightGradStore`` decides which backward passes are split (zero bubble) and when their
weight gradients run.

Usage (writes the ``rank`` lines of ``dualpipe_pp8_mb20.txt``)::

    python tests/data/dualpipe/record_reference.py /path/to/DualPipe [ranks] [micro_batches]

Tokens: ``F<d>.<k>`` forward of micro-batch ``k`` (0-based, per direction) of direction ``d``
(0: enters at rank 0, 1: enters at the last rank); ``B`` a whole backward; ``I`` the
backward for input of a zero-bubble split; ``W`` the backward for weights; ``X&Y`` the two
passes of one ``overlapped_forward_backward`` call (DualPipe's F&B).
Not part of dessim and not run by the tests (no torch needed for those).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path


class Tensor:
    """A stand-in tensor that remembers which pass produced it (direction, micro-batch)."""

    def __init__(self, tag: tuple[int, int] | None = None) -> None:
        self.tag, self.grad, self._base, self.data = tag, None, None, None

    def tensor_split(self, chunks: int, dim: int) -> list["Tensor"]:
        return [Tensor() for _ in range(chunks)]

    def backward(self) -> None:       # loss.backward() on a last stage
        _backward([self])

    def detach_(self) -> "Tensor":
        return self


LOG: list[str] = []
STORE = None          # the reference's WeightGradStore, once loaded


def _backward(outputs) -> None:
    d, k = outputs[0].tag
    if STORE.enabled:                 # the reference's zero-bubble switch
        LOG.append(f"I{d}.{k}")
        STORE.put(lambda: LOG.append(f"W{d}.{k}"))
    else:
        LOG.append(f"B{d}.{k}")


class Module:
    """One model chunk: ``direction`` is its index in ``DualPipe.module``."""

    def __init__(self, direction: int) -> None:
        self.direction, self.calls = direction, 0

    def parameters(self):
        yield types.SimpleNamespace(device=("cuda", 0))

    def _forward(self) -> Tensor:
        tag = (self.direction, self.calls)
        self.calls += 1
        return Tensor(tag)

    def __call__(self, *inputs):
        out = self._forward()
        LOG.append(f"F{out.tag[0]}.{out.tag[1]}")
        return out

    @staticmethod
    def overlapped_forward_backward(module0, inputs0, criterion0, labels0,
                                    module1, loss1, outputs1, output_grads1):
        out = module0._forward()
        loss0 = criterion0(out, *labels0) if criterion0 is not None else None
        LOG.append(f"F{out.tag[0]}.{out.tag[1]}")
        mark = len(LOG)
        _backward([loss1] if loss1 is not None else list(outputs1))
        LOG[mark - 1:mark + 1] = ["&".join(LOG[mark - 1:mark + 1])]
        return [out], loss0


class Group:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def _fake_modules() -> None:
    anything = type("Anything", (), {})
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.device = lambda i: ("cuda", i)
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0)
    torch.is_grad_enabled = lambda: True
    torch.stack = lambda xs: list(xs)
    torch.dtype = anything
    nn = types.ModuleType("torch.nn")
    nn.Module = type("Module", (), {"__init__": lambda self: None})
    nn.ModuleList = list
    dist = types.ModuleType("torch.distributed")
    dist.ProcessGroup = dist.P2POp = anything
    dist.batch_isend_irecv = lambda ops: []
    dist.irecv = dist.isend = None
    autograd = types.ModuleType("torch.autograd")
    autograd.Variable = anything
    torch.nn, torch.distributed, torch.autograd = nn, dist, autograd
    comm = types.ModuleType("dualpipe.comm")
    comm.TENSOR_SHAPES, comm.TENSOR_DTYPE = [(1,)], "bf16"
    comm.append_irecv = lambda ops, src, group: [Tensor()]
    comm.append_isend = lambda ops, tensors, dst, group: None
    package = types.ModuleType("dualpipe")
    package.comm = comm
    sys.modules.update({"torch": torch, "torch.nn": nn, "torch.distributed": dist,
                        "torch.autograd": autograd, "dualpipe": package, "dualpipe.comm": comm})


def record(checkout: Path, ranks: int = 8, micro_batches: int = 20) -> list[list[str]]:
    """Each rank's passes in the order the reference ``DualPipe.step`` runs them."""
    global STORE
    _fake_modules()
    utils = types.ModuleType("dualpipe.utils")
    exec(compile((checkout / "dualpipe/utils.py").read_text(), "dualpipe/utils.py", "exec"), utils.__dict__)
    utils.run_backward = lambda outputs, grads: _backward(list(outputs))
    sys.modules["dualpipe.utils"] = utils
    STORE = utils.WeightGradStore
    code = types.ModuleType("dualpipe.dualpipe")
    exec(compile((checkout / "dualpipe/dualpipe.py").read_text(), "dualpipe/dualpipe.py", "exec"), code.__dict__)
    orders = []
    for rank in range(ranks):
        pipe = code.DualPipe((Module(0), Module(1)), process_group=Group(rank, ranks))
        edge = rank in (0, ranks - 1)
        criterion = (lambda out, *labels: Tensor(out.tag)) if edge else None
        inputs = (Tensor(),) if edge else ()
        LOG.clear()
        pipe.step(*inputs, num_chunks=micro_batches, criterion=criterion)
        orders.append(list(LOG))
    return orders


if __name__ == "__main__":
    args = sys.argv[1:]
    size = [int(a) for a in args[1:3]] or [8, 20]
    for r, order in enumerate(record(Path(args[0]), *size)):
        print(f"rank {r}: {' '.join(order)}")
