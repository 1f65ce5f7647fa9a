"""Vision models as layer lists with FLOPs and bytes: ResNet-50 and Vision Transformers.

Every :class:`~dessim.workload.dataparallel.graph.Layer` holds the kernels of one layer for a
micro-batch of ``n`` images on one GPU and its parameter count.

Convolutions (implicit GEMM, NHWC)
    A ``kh×kw`` convolution from ``C_in`` to ``C_out`` channels with output ``Ho×Wo`` is a GEMM
    ``(m, n, k) = (n·Ho·Wo, C_out, C_in·kh·kw)``: FLOPs ``2mnk`` (2 per multiply-add). Bytes:
    read the input activation ``n·H·W·C_in`` (not the ``kh·kw``-times expanded im2col
    matrix, which implicit-GEMM kernels never store) and the weights, write the output. The
    backward has the data gradient (same FLOPs, shape ``(n·H·W, C_in, C_out·kh·kw)``; skipped
    for the first layer, whose input is the image) and the weight gradient (same FLOPs,
    shape ``(C_in·kh·kw, C_out, n·Ho·Wo)``).
Batch norm + ReLU (training mode), fused as cuDNN does
    Reads the activation twice (statistics, then normalisation), writes it once; ≈ 5 FLOPs per
    element (an estimate; not model FLOPs). Backward: the transformer kernels' convention
    (2× FLOPs, :class:`~dessim.workload.common.kernels.KernelBuilder`). Parameters: 2 per channel.
ResNet-50 (torchvision ``resnet50``, v1.5: the stride of a down-sampling bottleneck is on its
3×3 convolution)
    He et al. 2016, Table 1; torchvision's model card: 25,557,032 parameters and 4.09 GFLOPS
    — multiply-adds, i.e. ≈ 8.2e9 FLOPs in our 2-per-multiply-add count — per 224² image
    (tested: parameters exact, multiply-adds within 1 %).
ViT (Dosovitskiy et al. 2021, Table 1: ViT-B/16 86M, ViT-L/16 307M parameters)
    A ``p×p`` stride-``p`` patch embedding (a GEMM over ``(image/p)²`` patches), a class token
    and learned position embeddings (``seq = (image/p)² + 1`` tokens), ``layers`` pre-norm
    encoder layers whose kernels are the transformer generator's
    (:func:`~dessim.workload.transformer.kernels.layer_kernels` with a
    :class:`~dessim.workload.transformer.model.TransformerConfig`: GELU MLP, LayerNorm, biases; full
    bidirectional attention, which is what its ``s²`` FLOP convention counts), a final
    LayerNorm and a linear classifier on the class token. ViT-B/16 at 224²: 86,567,656
    parameters (timm ``vit_base_patch16_224``) and 17.6 G multiply-adds (DeiT, Touvron et al.
    2021, Table 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from dessim.errors import WorkloadError
from dessim.workload.dataparallel.graph import Layer, layer_from_forward
from dessim.workload.common.kernels import MATMUL, NORM, Kernel, KernelBuilder
from dessim.workload.common.precision import PRECISIONS, Precision
from dessim.workload.transformer.kernels import layer_kernels
from dessim.workload.transformer.layout import ParallelLayout
from dessim.workload.transformer.model import TransformerConfig

__all__ = ["conv_layer", "resnet50", "vit", "ARCHS", "BN_RELU_FLOPS", "VitShape", "total_params", "macs"]

#: FLOPs per element of a fused batch-norm + ReLU (an estimate: subtract, multiply, scale,
#: shift, max).
BN_RELU_FLOPS = 5.0


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def conv_layer(name: str, n: int, hw: int, c_in: int, c_out: int, k: int, stride: int, pad: int,
               precision: Precision, bn: bool = True, relu: bool = True, first: bool = False,
               extra: tuple[Kernel, ...] = ()) -> tuple[Layer, int]:
    """One convolution (+ batch norm + ReLU) on ``n`` images of ``hw×hw×c_in``; returns the
    layer and the output size (module docstring for the conventions)."""
    ho = _out(hw, k, stride, pad)
    m, nn, kk = n * ho * ho, c_out, c_in * k * k
    op, act, grad = precision.element_bytes, precision.activation_bytes, precision.grad_bytes
    x_bytes, w_bytes, y_bytes = n * hw * hw * c_in * op, kk * nn * op, m * nn * act
    flops = 2.0 * m * nn * kk
    fwd = [Kernel(f"{name}.conv", MATMUL, "fwd", flops, x_bytes + w_bytes, y_bytes, (m, nn, kk))]
    b = KernelBuilder(precision)
    post: list[Kernel] = []
    params = kk * nn
    if bn:
        flops_bn = (BN_RELU_FLOPS if relu else BN_RELU_FLOPS - 1) * m * nn
        post.append(b.elementwise(f"{name}.bn", 2 * m * nn, m * nn, flops_bn, NORM))
        params += 2 * c_out
    post += list(extra)
    bwd: list[Kernel] = []
    for p in reversed(post):
        bwd += b.backward(p)
    if not first:
        bwd.append(Kernel(f"{name}.conv.dgrad", MATMUL, "bwd", flops, y_bytes + w_bytes,
                          n * hw * hw * c_in * act, (n * hw * hw, c_in, nn * k * k)))
    bwd.append(Kernel(f"{name}.conv.wgrad", MATMUL, "bwd", flops, x_bytes + y_bytes, kk * nn * grad,
                      (kk, nn, m)))
    return Layer(name, tuple(fwd + post), tuple(bwd), float(params)), ho


#: ResNet-50 stages: (bottleneck width, blocks, stride of the first block).
RESNET50_STAGES: tuple[tuple[int, int, int], ...] = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))


def resnet50(n: int, precision: Precision, image: int = 224, classes: int = 1000) -> list[Layer]:
    """ResNet-50 v1.5 for a micro-batch of ``n`` images (module docstring)."""
    b = KernelBuilder(precision)
    layers: list[Layer] = []
    stem, hw = conv_layer("stem.conv", n, image, 3, 64, 7, 2, 3, precision, first=True)
    pooled = _out(hw, 3, 2, 1)
    pool = b.elementwise("stem.maxpool", n * hw * hw * 64, n * pooled * pooled * 64, 9.0 * n * pooled * pooled * 64)
    layers.append(Layer(stem.name, stem.forward + (pool,), b.backward(pool) + stem.backward, stem.params))
    hw, c_in = pooled, 64
    for s, (width, blocks, stride) in enumerate(RESNET50_STAGES, start=1):
        for i in range(blocks):
            st = stride if i == 0 else 1
            p = f"layer{s}.{i}"
            l1, _ = conv_layer(f"{p}.conv1", n, hw, c_in, width, 1, 1, 0, precision)
            l2, ho = conv_layer(f"{p}.conv2", n, hw, width, width, 3, st, 1, precision)
            out = n * ho * ho * 4 * width
            add = b.elementwise(f"{p}.add_relu", 2 * out, out, 2.0 * out)
            l3, _ = conv_layer(f"{p}.conv3", n, ho, width, 4 * width, 1, 1, 0, precision, relu=False,
                               extra=(add,))
            layers += [l1, l2, l3]
            if i == 0:
                down, _ = conv_layer(f"{p}.downsample", n, hw, c_in, 4 * width, 1, st, 0, precision, relu=False)
                layers.append(down)
            hw, c_in = ho, 4 * width
    pool = b.elementwise("head.avgpool", n * hw * hw * c_in, n * c_in, float(n * hw * hw * c_in))
    fc = b.matmul("head.fc", n, classes, c_in)
    layers.append(layer_from_forward("head", [pool, fc], c_in * classes + classes, b))
    return layers


@dataclass(frozen=True)
class VitShape:
    """A ViT's shape: patch size, encoder depth and widths."""

    patch: int = 16
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn_hidden: int = 3072


def vit(n: int, precision: Precision, image: int = 224, classes: int = 1000,
        shape: VitShape = VitShape()) -> list[Layer]:
    """A Vision Transformer for a micro-batch of ``n`` images (module docstring)."""
    if image % shape.patch:
        raise WorkloadError(f"vit: image size {image} is not divisible by the patch size {shape.patch}")
    prec_name = next(k for k, v in PRECISIONS.items() if v == precision)
    patches = (image // shape.patch) ** 2
    seq, h = patches + 1, shape.hidden
    b = KernelBuilder(precision)
    embed, _ = conv_layer("patch_embed", n, image, 3, h, shape.patch, shape.patch, 0, precision,
                          bn=False, relu=False, first=True)
    pos = b.elementwise("patch_embed.pos", 2 * n * seq * h, n * seq * h, float(n * seq * h))
    layers = [Layer("patch_embed", embed.forward + (pos,), b.backward(pos) + embed.backward,
                    embed.params + h + h + seq * h)]          # + conv bias, class token, positions
    cfg = TransformerConfig(name="vit", layers=shape.layers, hidden=h, heads=shape.heads,
                            ffn_hidden=shape.ffn_hidden, vocab=classes, seq_len=seq, activation="gelu",
                            norm="layernorm", position_embedding="learned", bias=True, dropout=False,
                            precision=prec_name)
    ks = layer_kernels(cfg, ParallelLayout(micro_batch=n, global_batch=n))
    for i in range(shape.layers):
        layers.append(Layer(f"encoder{i}", ks.forward, ks.backward, float(cfg.layer_params())))
    norm = b.elementwise("head.norm", n * h, n * h, 8.0 * n * h, NORM)
    fc = b.matmul("head.fc", n, classes, h)
    layers.append(layer_from_forward("head", [norm, fc], 2 * h + h * classes + classes, b))
    return layers


#: Architectures by name: builder(n, precision, image, classes) -> layers.
ARCHS = {
    "resnet50": resnet50,
    "vit-b16": lambda n, p, image=224, classes=1000: vit(n, p, image, classes, VitShape(16, 12, 768, 12, 3072)),
    "vit-l16": lambda n, p, image=224, classes=1000: vit(n, p, image, classes, VitShape(16, 24, 1024, 16, 4096)),
}


def total_params(layers: list[Layer]) -> int:
    return int(sum(l.params for l in layers))


def macs(layers: list[Layer]) -> float:
    """Forward GEMM multiply-adds (FLOPs / 2) — the figure model cards call "FLOPs"."""
    return sum(k.flops for l in layers for k in l.forward if k.kind in (MATMUL, "attention")) / 2

