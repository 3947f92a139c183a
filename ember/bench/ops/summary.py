"""One-line names of op configurations, for the table and the log.

Batch-1 leading dims are dropped from MatMul operands, Gemm shows M x K -> N after its
transposes, and a convolution shows its window (kernel, stride, dilation, padding when it is
not the usual k // 2), its channels, grouping and input image -- the way layers are talked
about, not the way ONNX stores them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ember.bench.ops.configs import OpConfig, Shape


def summarize(config: OpConfig) -> str:
    """``MatMul 128x768 @ 768x3072``, ``Gemm transB 16x784 -> 1024``,
    ``Conv 3x3/s2 64->128 @ 56x56``: what a reader needs to recognize the layer."""
    if config.op == "MatMul":
        return (f"MatMul {_dims(_squeeze_leading(config.shapes[0]))} @ "
                f"{_dims(_squeeze_leading(config.shapes[1]))}")
    if config.op == "Gemm":
        return _gemm_summary(config)
    return _conv_summary(config)


def _dims(shape: Sequence[int] | None) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def shape_text(shape: Sequence[int | None] | None) -> str:
    """An inferred shape with its unknowns, for a skip reason: ``[?, 128, 768]``."""
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _squeeze_leading(shape: Shape | None) -> Shape:
    """Drop leading 1s (batch 1) down to a matrix: ``1x128x768`` reads as ``128x768``."""
    dims = tuple(shape or ())
    while len(dims) > 2 and dims[0] == 1:
        dims = dims[1:]
    return dims


def _gemm_summary(config: OpConfig) -> str:
    a, b = config.shapes[0] or (), config.shapes[1] or ()
    trans_a, trans_b = config.attribute("transA"), config.attribute("transB")
    m, k = (a[1], a[0]) if trans_a else (a[0], a[1])
    n = b[0] if trans_b else b[1]
    flags = [name for name, on in (("transA", trans_a), ("transB", trans_b)) if on]
    scales = [f"{name}={config.attribute(name):g}" for name in ("alpha", "beta")
              if config.attribute(name) != 1.0]
    bias = "" if len(config.shapes) > 2 and config.shapes[2] is not None else " no-bias"
    return " ".join(["Gemm", *flags, f"{m}x{k} -> {n}", *scales]) + bias


def _conv_summary(config: OpConfig) -> str:
    x, w = config.shapes[0] or (), config.shapes[1] or ()
    group = int(config.attribute("group", 1))
    kernel = tuple(config.attribute("kernel_shape"))
    strides, dilations = config.attribute("strides"), config.attribute("dilations")
    if config.op == "Conv":
        channels_in, channels_out = w[1] * group, w[0]
    else:  # ConvTranspose's weight is [C_in, C_out / group, k...]
        channels_in, channels_out = w[0], w[1] * group
    window = _dims(kernel) + _per_axis("s", strides) + _per_axis("d", dilations)
    window += _padding(config, kernel, dilations)
    grouping = (" dw" if group > 1 and group == channels_in == channels_out
                else f" g{group}" if group > 1 else "")
    batch = f" b{x[0]}" if x and x[0] != 1 else ""
    return (f"{config.op} {window} {channels_in}->{channels_out}{grouping} @ "
            f"{_dims(x[2:])}{batch}")


def _per_axis(prefix: str, values: Sequence[int]) -> str:
    """``/s2`` for strides (2, 2), ``/s2x1`` for (2, 1), nothing when all are 1."""
    if all(v == 1 for v in values):
        return ""
    return f"/{prefix}{values[0]}" if len(set(values)) == 1 else f"/{prefix}{_dims(values)}"


def _padding(config: OpConfig, kernel: Sequence[int], dilations: Sequence[int]) -> str:
    """Nothing for the usual "same" padding (k // 2 on each side, stride aside), else the
    pads (``/p0``, ``/p(0,1,0,1)``) or the auto_pad mode."""
    auto_pad = config.attribute("auto_pad", "NOTSET")
    if auto_pad != "NOTSET":
        return f"/{auto_pad.lower()}"
    pads = tuple(config.attribute("pads"))
    usual = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilations)) * 2
    if pads == usual:
        return ""
    return f"/p{pads[0]}" if len(set(pads)) == 1 else "/p(" + ",".join(map(str, pads)) + ")"
