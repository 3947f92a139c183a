"""Converters of ATen's neural-network ops: matrix products, convolutions, normalizations,
pooling, resizing, attention.

Weights reach these as constants (parameters and buffers are frozen at import), which is what
lets ember pack GEMM panels and fold BatchNorm into the convolution before it at compile time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.core.dtypes import DType
from ember.frontend.torch.context import (ImportContext, Unsupported, meta_value, static_int,
                                          static_ints)

_FLOATS = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


def _float_out(ctx: ImportContext) -> DType:
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS:
        raise Unsupported(f"only for floating-point tensors, this one is {dtype}")
    return dtype


# ---------------------------------------------------------------------------- matmul

def matmul(ctx: ImportContext, node, a, b) -> str:
    """mm, bmm and matmul: one MatMul (same semantics for ranks >= 1)."""
    dtype = ctx.out_dtype()
    if dtype == DType.BOOL:
        raise Unsupported("matrix product of bools")
    return ctx.add("MatMul", [ctx.tensor_as(a, dtype), ctx.tensor_as(b, dtype)])


def addmm(ctx: ImportContext, node, bias, a, b, *, beta=1, alpha=1) -> str:
    dtype = ctx.out_dtype()
    if ctx.rank(a) == 2 and ctx.rank(b) == 2 and dtype in _FLOATS and ctx.rank(bias) <= 2:
        return ctx.add("Gemm", [ctx.tensor_as(a, dtype), ctx.tensor_as(b, dtype),
                                ctx.tensor_as(bias, dtype)], alpha=float(alpha),
                       beta=float(beta))
    return _scaled_sum(ctx, bias, ctx.add("MatMul", [ctx.tensor_as(a, dtype),
                                                     ctx.tensor_as(b, dtype)]),
                       beta, alpha, dtype)


def baddbmm(ctx: ImportContext, node, bias, a, b, *, beta=1, alpha=1) -> str:
    dtype = ctx.out_dtype()
    product = ctx.add("MatMul", [ctx.tensor_as(a, dtype), ctx.tensor_as(b, dtype)])
    return _scaled_sum(ctx, bias, product, beta, alpha, dtype)


def _scaled_sum(ctx: ImportContext, bias, product: str, beta, alpha, dtype: DType) -> str:
    if alpha != 1:
        product = ctx.add("Mul", [product, ctx.scalar(alpha, dtype)])
    if beta == 0:  # PyTorch ignores the bias then, NaN included
        return ctx.add("Identity", [product])
    bias_value = ctx.tensor_as(bias, dtype)
    if beta != 1:
        bias_value = ctx.add("Mul", [bias_value, ctx.scalar(beta, dtype)])
    return ctx.add("Add", [bias_value, product])


# ---------------------------------------------------------------------------- convolution

def convolution(ctx: ImportContext, node, x, weight, bias, stride, padding, dilation,
                transposed, output_padding, groups) -> str:
    dtype = _float_out(ctx)
    spatial = ctx.rank(x) - 2
    if spatial < 1:
        raise Unsupported("convolution of an unbatched input")
    pads = static_ints(padding, "padding")
    if len(pads) == 1:
        pads = pads * spatial
    attrs: dict[str, Any] = dict(
        strides=_expand(static_ints(stride, "stride"), spatial),
        dilations=_expand(static_ints(dilation, "dilation"), spatial),
        pads=pads + pads, group=static_int(groups, "groups"))
    inputs = [ctx.tensor_as(x, dtype), ctx.tensor_as(weight, dtype)]
    if bias is not None:
        inputs.append(ctx.tensor_as(bias, dtype))
    if transposed:
        attrs["output_padding"] = _expand(static_ints(output_padding, "output_padding"),
                                          spatial)
        return ctx.add("ConvTranspose", inputs, **attrs)
    return ctx.add("Conv", inputs, **attrs)


def _expand(values: list[int], count: int) -> list[int]:
    return values * count if len(values) == 1 else values


# ---------------------------------------------------------------------------- normalization

def _per_channel(ctx: ImportContext, arg, channels: int, fill: float, dtype: DType) -> str:
    if arg is None:
        return ctx.constant(np.full(channels, fill, dtype=dtype.numpy))
    return ctx.tensor_as(arg, dtype)


def batch_norm_inference(ctx: ImportContext, node, x, weight, bias, mean, var, *rest
                         ) -> list[str | None]:
    """``_native_batch_norm_legit_no_training`` (and ``_legit`` with training=False)."""
    eps = rest[-1]
    dtype = _float_out(ctx)
    shape = ctx.shape(x)
    if len(shape) < 2 or not isinstance(shape[1], int):
        raise Unsupported("batch norm needs a static channel dim")
    channels = int(shape[1])
    inputs = [ctx.tensor_as(x, dtype), _per_channel(ctx, weight, channels, 1.0, dtype),
              _per_channel(ctx, bias, channels, 0.0, dtype), ctx.tensor_as(mean, dtype),
              ctx.tensor_as(var, dtype)]
    result = ctx.add("BatchNormalization", inputs, epsilon=float(eps))
    return [result, None, None]


def batch_norm_functional(ctx: ImportContext, node, x, weight, bias, mean, var, training,
                          momentum, eps) -> list[str | None]:
    """``_native_batch_norm_legit_functional`` / ``native_batch_norm`` in eval mode."""
    if training:
        raise Unsupported("batch norm in training mode (statistics of the batch)")
    return batch_norm_inference(ctx, node, x, weight, bias, mean, var, eps) + [None, None]


def layer_norm(ctx: ImportContext, node, x, normalized_shape, weight, bias, eps
               ) -> list[str]:
    dtype = _float_out(ctx)
    dims = static_ints(normalized_shape, "normalized_shape")
    shape = ctx.shape(x)
    if not dims:
        raise Unsupported("layer norm over no dims")
    scale = ctx.tensor_as(weight, dtype) if weight is not None else \
        ctx.constant(np.ones(dims, dtype=dtype.numpy))
    inputs = [ctx.tensor_as(x, dtype), scale]
    if bias is not None:
        inputs.append(ctx.tensor_as(bias, dtype))
    del shape
    outputs = ctx.add("LayerNormalization", inputs, outputs=3, axis=-len(dims),
                      epsilon=float(eps))
    return list(outputs)


def group_norm(ctx: ImportContext, node, x, weight, bias, n, channels, hw, groups, eps
               ) -> list[str | None]:
    dtype = _float_out(ctx)
    channels = static_int(channels, "channels")
    inputs = [ctx.tensor_as(x, dtype), _per_channel(ctx, weight, channels, 1.0, dtype),
              _per_channel(ctx, bias, channels, 0.0, dtype)]
    result = ctx.add("GroupNormalization", inputs, num_groups=static_int(groups, "groups"),
                     epsilon=float(eps))
    return [result, None, None]


def rms_norm(ctx: ImportContext, node, x, normalized_shape, weight=None, eps=None) -> str:
    dtype = _float_out(ctx)
    dims = static_ints(normalized_shape, "normalized_shape")
    epsilon = float(eps) if eps is not None else float(np.finfo(dtype.numpy).eps) \
        if dtype != DType.BFLOAT16 else 0.0078125
    scale = ctx.tensor_as(weight, dtype) if weight is not None else \
        ctx.constant(np.ones(dims, dtype=dtype.numpy))
    return ctx.add("RMSNormalization", [ctx.tensor_as(x, dtype), scale], axis=-len(dims),
                   epsilon=epsilon)


# ---------------------------------------------------------------------------- pooling

def max_pool(ctx: ImportContext, node, x, kernel_size, stride=(), padding=0, dilation=1,
             ceil_mode=False) -> list[str | None]:
    """max_pool{1,2,3}d_with_indices: the values (the indices run in PyTorch if used: their
    numbering differs from ONNX's)."""
    spatial = len(static_ints(kernel_size, "kernel_size"))
    spatial = max(spatial, 1)
    kernel = _expand(static_ints(kernel_size, "kernel_size"), spatial)
    strides = _expand(static_ints(stride, "stride"), spatial) if stride else kernel
    pads = _expand(static_ints(padding, "padding"), spatial)
    if ctx.rank(x) != spatial + 2:
        raise Unsupported("pooling of an unbatched input")
    result = ctx.add("MaxPool", [ctx.tensor(x)], kernel_shape=kernel, strides=strides,
                     pads=pads + pads, dilations=_expand(static_ints(dilation, "dilation"),
                                                         spatial),
                     ceil_mode=int(bool(ceil_mode)))
    return [result, None]


def avg_pool(ctx: ImportContext, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
             count_include_pad=True, divisor_override=None) -> str:
    if divisor_override is not None:
        raise Unsupported("avg_pool with divisor_override")
    kernel = static_ints(kernel_size, "kernel_size")
    spatial = len(kernel)
    if ctx.rank(x) != spatial + 2:
        raise Unsupported("pooling of an unbatched input")
    strides = _expand(static_ints(stride, "stride"), spatial) if stride else kernel
    pads = _expand(static_ints(padding, "padding"), spatial)
    if ceil_mode and any(pads):
        # PyTorch and ONNX count the padding of a ceil-mode window that hangs over the edge
        # differently.
        raise Unsupported("avg_pool with ceil_mode and padding")
    return ctx.add("AveragePool", [ctx.tensor(x)], kernel_shape=kernel, strides=strides,
                   pads=pads + pads, ceil_mode=int(bool(ceil_mode)),
                   count_include_pad=int(bool(count_include_pad)))


def adaptive_avg_pool(ctx: ImportContext, node, x, output_size) -> str:
    """An output of 1 per dim is a global mean; an output that divides the input is a plain
    average pool; other sizes overlap unevenly and run in PyTorch."""
    shape = ctx.shape(x)
    sizes = static_ints(output_size, "output_size")
    spatial = shape[len(shape) - len(sizes):]
    if all(s == 1 for s in sizes):
        axes = list(range(len(shape) - len(sizes), len(shape)))
        return ctx.add("ReduceMean", [ctx.tensor(x), ctx.constant(np.array(axes))],
                       keepdims=1)
    if not all(isinstance(d, int) for d in spatial):
        raise Unsupported("adaptive pooling of a symbolic size")
    if any(d % s for d, s in zip(spatial, sizes)):
        raise Unsupported(f"adaptive pooling from {list(spatial)} to {sizes} (uneven windows)")
    kernel = [d // s for d, s in zip(spatial, sizes)]
    return ctx.add("AveragePool", [ctx.tensor(x)], kernel_shape=kernel, strides=kernel)


def upsample(mode: str):
    """upsample_{nearest,bilinear,bicubic}{1,2,3}d.vec -> Resize."""

    def convert(ctx: ImportContext, node, x, output_size, *rest) -> str:
        align_corners = False
        scales = rest[-1] if rest else None
        if mode != "nearest":
            align_corners = bool(rest[0]) if rest else False
        out_shape = ctx.static_shape(node)
        in_shape = ctx.static_shape(x)
        attrs: dict[str, Any] = {"mode": mode}
        if mode == "nearest":
            attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            attrs["coordinate_transformation_mode"] = \
                "align_corners" if align_corners else "pytorch_half_pixel"
            if mode == "cubic":
                attrs["cubic_coeff_a"] = -0.75
        if scales is not None and output_size is None and mode != "nearest" \
                and not align_corners:
            # PyTorch maps coordinates with the given scale, not the size ratio
            scale_values = [1.0, 1.0] + [float(s) for s in scales]
            return ctx.add("Resize", [ctx.tensor(x), "",
                                      ctx.constant(np.array(scale_values, dtype=np.float32))],
                           **attrs)
        del in_shape
        return ctx.add("Resize", [ctx.tensor(x), "", "",
                                  ctx.constant(np.array(out_shape, dtype=np.int64))], **attrs)

    return convert


# ---------------------------------------------------------------------------- attention

def sdpa(ctx: ImportContext, node, q, k, v, *args, **kwargs) -> list[str | None]:
    """scaled_dot_product_attention (and its CPU flash variant): written out as MatMul,
    Softmax, MatMul, which fuse; a boolean mask becomes additive."""
    names = ["attn_mask", "dropout_p", "is_causal"]
    params = dict(zip(names, args))
    params.update(kwargs)
    if str(node.target).startswith("aten._scaled_dot_product_flash_attention_for_cpu"):
        params = dict(zip(["dropout_p", "is_causal"], args))
        params.update(kwargs)
    if params.get("dropout_p", 0.0):
        raise Unsupported("attention with dropout")
    if params.get("enable_gqa"):
        raise Unsupported("attention with grouped query heads")
    dtype = _float_out(ctx)
    q_shape, k_shape = ctx.shape(q), ctx.shape(k)
    head_dim = q_shape[-1]
    scale = params.get("scale")
    if scale is None:
        if not isinstance(head_dim, int):
            raise Unsupported("attention with a symbolic head size")
        scale = 1.0 / math.sqrt(head_dim)
    rank = len(k_shape)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    keys_t = ctx.add("Transpose", [ctx.tensor_as(k, dtype)], perm=perm)
    scores = ctx.add("MatMul", [ctx.tensor_as(q, dtype), keys_t])
    scores = ctx.add("Mul", [scores, ctx.scalar(float(scale), dtype)])
    mask = params.get("attn_mask")
    if params.get("is_causal"):
        query_len, key_len = q_shape[-2], k_shape[-2]
        if not (isinstance(query_len, int) and isinstance(key_len, int)):
            raise Unsupported("causal attention over symbolic lengths")
        keep = np.tril(np.ones((query_len, key_len), dtype=bool))
        scores = ctx.add("Where", [ctx.constant(keep), scores,
                                   ctx.scalar(float("-inf"), dtype)])
    if mask is not None:
        if ctx.torch_dtype(mask) == DType.BOOL:
            scores = ctx.add("Where", [ctx.tensor(mask), scores,
                                       ctx.scalar(float("-inf"), dtype)])
        else:
            scores = ctx.add("Add", [scores, ctx.tensor_as(mask, dtype)])
    weights = ctx.add("Softmax", [scores], axis=-1)
    output = ctx.add("MatMul", [weights, ctx.tensor_as(v, dtype)])
    return [output, None] if isinstance(meta_value(node), (tuple, list)) else output


def native_dropout(ctx: ImportContext, node, x, p, train) -> list[str | None]:
    if train:
        raise Unsupported("dropout in training mode (random)")
    return [ctx.add("Identity", [ctx.tensor(x)]), None]
