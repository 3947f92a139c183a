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


def addmv(ctx: ImportContext, node, bias, mat, vec, *, beta=1, alpha=1) -> str:
    dtype = ctx.out_dtype()
    if dtype == DType.BOOL:
        raise Unsupported("matrix product of bools")
    product = ctx.add("MatMul", [ctx.tensor_as(mat, dtype), ctx.tensor_as(vec, dtype)])
    return _scaled_sum(ctx, bias, product, beta, alpha, dtype)


def addbmm(ctx: ImportContext, node, bias, a, b, *, beta=1, alpha=1) -> str:
    """bias + the sum over the batch of the matrix products."""
    dtype = ctx.out_dtype()
    if dtype == DType.BOOL:
        raise Unsupported("matrix product of bools")
    products = ctx.add("MatMul", [ctx.tensor_as(a, dtype), ctx.tensor_as(b, dtype)])
    total = ctx.add("ReduceSum", [products, ctx.constant(np.array([0], dtype=np.int64))],
                    keepdims=0)
    return _scaled_sum(ctx, bias, total, beta, alpha, dtype)


def trilinear(ctx: ImportContext, node, i1, i2, i3, expand1, expand2, expand3, sumdim,
              unroll_dim=1) -> str:
    """``_trilinear`` (bilinear layers): the three inputs, unsqueezed at their ``expand``
    dims, multiplied with broadcasting and summed over ``sumdim``."""
    dtype = _float_out(ctx)
    factors = []
    for arg, dims in ((i1, expand1), (i2, expand2), (i3, expand3)):
        value = ctx.tensor_as(arg, dtype)
        dims = static_ints(dims, "trilinear expand dims")
        if dims:
            value = ctx.add("Unsqueeze", [value, ctx.constant(np.array(sorted(dims),
                                                                       dtype=np.int64))])
        factors.append(value)
    product = ctx.add("Mul", [ctx.add("Mul", [factors[0], factors[1]]), factors[2]])
    axes = sorted(static_ints(sumdim, "trilinear sum dims"))
    if not axes:
        return product
    return ctx.add("ReduceSum", [product, ctx.constant(np.array(axes, dtype=np.int64))],
                   keepdims=0)


def _scaled_sum(ctx: ImportContext, bias, product: str, beta, alpha, dtype: DType) -> str:
    if alpha != 1:
        product = ctx.add("Mul", [product, ctx.scalar(alpha, dtype)])
    if beta == 0:  # PyTorch ignores the bias then, NaN included
        return ctx.add("Identity", [product])
    bias_value = ctx.tensor_as(bias, dtype)
    if beta != 1:
        bias_value = ctx.add("Mul", [bias_value, ctx.scalar(beta, dtype)])
    return ctx.add("Add", [bias_value, product])


# ---------------------------------------------------------------------------- distances

def cdist(ctx: ImportContext, node, x1, x2, p, compute_mode=None) -> str:
    """``_cdist_forward``: the p-norm of every row difference, x1[..., i, None, :] -
    x2[..., None, j, :] (the matmul-based mode of PyTorch is a faster way to the same
    Euclidean distances)."""
    from ember.frontend.torch.convert_reduce import vector_norm

    dtype = _float_out(ctx)
    left = ctx.add("Unsqueeze", [ctx.tensor_as(x1, dtype),
                                 ctx.constant(np.array([-2], dtype=np.int64))])
    right = ctx.add("Unsqueeze", [ctx.tensor_as(x2, dtype),
                                  ctx.constant(np.array([-3], dtype=np.int64))])
    difference = ctx.add("Sub", [left, right])
    rank = max(ctx.rank(x1), ctx.rank(x2)) + 1
    if ctx.shape(x1)[-1] == 0:  # no coordinates: every distance is 0
        return ctx.add("ReduceSum", [difference, ctx.constant(np.array([rank - 1]))],
                       keepdims=0)
    return vector_norm(ctx, difference, [rank - 1], p, False, dtype)


def pdist(ctx: ImportContext, node, x, p=2.0) -> str:
    """``_pdist_forward``: the p-norm distances of the rows i < j, in row-major order of
    the pairs, gathered with constant index lists."""
    from ember.frontend.torch.convert_reduce import vector_norm

    dtype = _float_out(ctx)
    rows = ctx.static_shape(x)[0]
    first, second = np.triu_indices(rows, k=1)
    value = ctx.tensor_as(x, dtype)
    difference = ctx.add("Sub", [
        ctx.add("Gather", [value, ctx.constant(first.astype(np.int64))], axis=0),
        ctx.add("Gather", [value, ctx.constant(second.astype(np.int64))], axis=0)])
    return vector_norm(ctx, difference, [1], p, False, dtype)


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
    if not (_output_used(node, 1) or _output_used(node, 2)):
        return [result, None, None]
    # the statistics PyTorch returns: each (sample, group)'s mean and 1 / sqrt(var + eps),
    # the biased variance
    grouped = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([n, groups, -1])])
    last = ctx.constant(np.array([2], dtype=np.int64))
    mean = ctx.add("ReduceMean", [grouped, last], keepdims=1)
    centered = ctx.add("Sub", [grouped, mean])
    variance = ctx.add("ReduceMean", [ctx.add("Mul", [centered, centered]), last], keepdims=0)
    rstd = ctx.add("Reciprocal", [ctx.add("Sqrt", [
        ctx.add("Add", [variance, ctx.scalar(float(eps), dtype)])])])
    return [result, ctx.add("Squeeze", [mean, last]), rstd]


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
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads + pads,
                 dilations=_expand(static_ints(dilation, "dilation"), spatial),
                 ceil_mode=int(bool(ceil_mode)))
    if not _output_used(node, 1):
        return [ctx.add("MaxPool", [ctx.tensor(x)], **attrs), None]
    # MaxPool numbers the elements over N, C and the spatial dims, PyTorch within each
    # (N, C) plane: the remainder by the plane's size.
    plane = int(np.prod(ctx.static_shape(x)[2:]))
    result, flat = ctx.add("MaxPool", [ctx.tensor(x)], outputs=2, **attrs)
    return [result, ctx.add("Mod", [flat, ctx.scalar(max(plane, 1), DType.INT64)], fmod=0)]


def _output_used(node, index: int) -> bool:
    """Whether output ``index`` of a tuple-valued FX node is read (through getitem)."""
    import operator

    return any(user.target is operator.getitem and user.args[1] == index
               for user in node.users)


def avg_pool(ctx: ImportContext, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
             count_include_pad=True, divisor_override=None) -> str:
    kernel = static_ints(kernel_size, "kernel_size")
    spatial = len(kernel)
    strides = _expand(static_ints(stride, "stride"), spatial) if stride else kernel
    pads = _expand(static_ints(padding, "padding"), spatial)
    rank = ctx.rank(x)
    if rank not in (spatial + 1, spatial + 2):
        raise Unsupported(f"avg_pool of rank {rank} with {spatial} spatial dims")
    if (ceil_mode and any(pads)) or divisor_override is not None or rank == spatial + 1:
        return _avg_pool_by_sums(ctx, x, kernel, strides, pads, bool(ceil_mode),
                                 bool(count_include_pad), divisor_override)
    return ctx.add("AveragePool", [ctx.tensor(x)], kernel_shape=kernel, strides=strides,
                   pads=pads + pads, ceil_mode=int(bool(ceil_mode)),
                   count_include_pad=int(bool(count_include_pad)))


def _avg_pool_by_sums(ctx: ImportContext, x, kernel: list[int], strides: list[int],
                      pads: list[int], ceil_mode: bool, count_include_pad: bool,
                      divisor_override) -> str:
    """Average pooling as PyTorch defines it, where ONNX's AveragePool differs: the window
    sums (an AveragePool over the zero-padded input, times the window size) divided by a
    constant tensor of PyTorch's divisors.  Those count the padding but not a ceil-mode
    window's overhang past it (or only the input's elements, without count_include_pad),
    or are the override.  An unbatched input gets a batch dim of 1 meanwhile."""
    dtype = _float_out(ctx)
    shape = ctx.static_shape(x)
    value = ctx.tensor_as(x, dtype)
    unbatched = len(shape) == len(kernel) + 1
    if unbatched:
        value = ctx.add("Unsqueeze", [value, ctx.constant(np.array([0], dtype=np.int64))])
    sizes = shape[-len(kernel):]
    outputs, extras, divisors = [], [], np.ones([1] * len(kernel), dtype=np.float64)
    for axis, (n, k, s, p) in enumerate(zip(sizes, kernel, strides, pads)):
        span = n + 2 * p - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= n + p:  # the last window would start in the padding
            out -= 1
        starts = np.arange(out) * s - p
        ends = np.minimum(starts + k, n + p)
        if not count_include_pad:
            starts, ends = np.maximum(starts, 0), np.minimum(ends, n)
        view = [1] * len(kernel)
        view[axis] = out
        divisors = divisors * (ends - starts).reshape(view)
        outputs.append(out)
        extras.append(max(0, (out - 1) * s + k - (n + 2 * p)))
    if divisor_override is not None:
        divisors = np.full(outputs, static_int(divisor_override, "divisor_override"),
                           dtype=np.float64)
    lead = [0, 0]
    padded = ctx.add("Pad", [value, ctx.ints(lead + pads + lead + [p + e for p, e in
                                                                    zip(pads, extras)]),
                             ctx.scalar(0, dtype)], mode="constant")
    means = ctx.add("AveragePool", [padded], kernel_shape=kernel, strides=strides,
                    count_include_pad=1)
    sums = ctx.add("Mul", [means, ctx.scalar(float(np.prod(kernel)), dtype)])
    result = ctx.add("Div", [sums, ctx.constant(divisors.astype(dtype.numpy))])
    if unbatched:
        result = ctx.add("Squeeze", [result, ctx.constant(np.array([0], dtype=np.int64))])
    return result


def adaptive_avg_pool(ctx: ImportContext, node, x, output_size) -> str:
    """An output of 1 per dim is a global mean; an output that divides the input is a plain
    average pool; other sizes have uneven, overlapping windows (see :func:`_adaptive`)."""
    shape = ctx.shape(x)
    sizes = static_ints(output_size, "output_size")
    spatial = shape[len(shape) - len(sizes):]
    if all(s == 1 for s in sizes):
        axes = list(range(len(shape) - len(sizes), len(shape)))
        return ctx.add("ReduceMean", [ctx.tensor(x), ctx.constant(np.array(axes))],
                       keepdims=1)
    if not all(isinstance(d, int) for d in spatial):
        raise Unsupported("adaptive pooling of a symbolic size")
    if any(d % s for d, s in zip(spatial, sizes)) or len(shape) != len(sizes) + 2:
        return _adaptive(ctx, x, sizes, "mean")
    kernel = [d // s for d, s in zip(spatial, sizes)]
    return ctx.add("AveragePool", [ctx.tensor(x)], kernel_shape=kernel, strides=kernel)


def adaptive_max_pool(ctx: ImportContext, node, x, output_size) -> list[str | None]:
    """adaptive_max_pool{1,2,3}d: the values, and when they are read the indices (see
    :func:`_adaptive_max_with_indices`)."""
    sizes = static_ints(output_size, "output_size")
    if _output_used(node, 1):
        return _adaptive_max_with_indices(ctx, x, sizes)
    return [_adaptive(ctx, x, sizes, "max"), None]


def _windows(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The (Out, K) input positions of adaptive pooling's windows along one dim, K the
    longest window; positions past a shorter window repeat its last input.  Also whether
    each position is inside its window."""
    starts = np.array([(i * n_in) // n_out for i in range(n_out)], dtype=np.int64)
    ends = np.array([-(-((i + 1) * n_in) // n_out) for i in range(n_out)], dtype=np.int64)
    longest = int((ends - starts).max())
    offsets = starts[:, None] + np.arange(longest, dtype=np.int64)[None, :]
    return np.minimum(offsets, ends[:, None] - 1), offsets < ends[:, None]


def _adaptive_max_with_indices(ctx: ImportContext, x, sizes: list[int]) -> list[str]:
    """Adaptive max pooling with PyTorch's indices (flat within each spatial plane): every
    window's box is gathered whole, as a last dim of candidates next to a constant tensor of
    their flat positions.  The index is the first maximum's, or the last NaN's when there
    is one (PyTorch's scan takes every NaN)."""
    shape = ctx.static_shape(x)
    rank, count = len(shape), len(sizes)
    lead = rank - count
    if any(s <= 0 for s in sizes) or lead < 1:
        raise Unsupported(f"adaptive max pooling to {sizes}")
    windows = [_windows(shape[lead + i], sizes[i])[0] for i in range(count)]
    # the flat position of every candidate, as (O1, K1, O2, K2, ..): the last dim fastest
    flat = np.zeros([1] * (2 * count), dtype=np.int64)
    stride = 1
    for i in reversed(range(count)):
        view = [1] * (2 * count)
        view[2 * i], view[2 * i + 1] = windows[i].shape
        flat = flat + windows[i].reshape(view) * stride
        stride *= shape[lead + i]
    value = ctx.tensor(x)
    for i in range(count):  # dim i is at lead + 2 i once the dims before it became pairs
        value = ctx.add("Gather", [value, ctx.constant(windows[i])], axis=lead + 2 * i)
    # (.., O1, K1, .., Od, Kd) -> (.., O1..Od, K1*..*Kd)
    perm = list(range(lead)) + [lead + 2 * i for i in range(count)] + \
        [lead + 2 * i + 1 for i in range(count)]
    value = ctx.add("Transpose", [value], perm=perm)
    candidates = ctx.add("Reshape", [value, ctx.ints([0] * (lead + count) + [-1])])
    positions = flat.transpose([2 * i for i in range(count)] +
                               [2 * i + 1 for i in range(count)])
    positions = positions.reshape(sizes + [-1])
    last = ctx.constant(np.array([-1], dtype=np.int64))
    values = ctx.add("ReduceMax", [candidates, last], keepdims=0)
    choice = ctx.add("ArgMax", [candidates], axis=-1, keepdims=1)
    if ctx.torch_dtype(x) in _FLOATS:
        nan_flags = ctx.cast(ctx.add("IsNaN", [candidates]), DType.INT32, DType.BOOL)
        has_nan = ctx.add("Greater", [ctx.add("ReduceMax", [nan_flags, last], keepdims=1),
                                      ctx.scalar(0, DType.INT32)])
        last_nan = ctx.add("ArgMax", [nan_flags], axis=-1, keepdims=1, select_last_index=1)
        choice = ctx.add("Where", [has_nan, last_nan, choice])
    all_positions = ctx.add("Expand", [ctx.constant(positions),
                                       ctx.add("Shape", [candidates])])
    indices = ctx.add("GatherElements", [all_positions, choice], axis=-1)
    return [values, ctx.add("Squeeze", [indices, last])]


def _adaptive(ctx: ImportContext, x, sizes: list[int], reduce: str) -> str:
    """Adaptive pooling one spatial dim at a time (a box's mean or max is the mean or max
    over each of its dims in turn).  Output i of a dim covers the inputs from
    floor(i * In / Out) to ceil((i + 1) * In / Out); the windows are gathered with a constant
    (Out, K) index (:func:`_windows`), whose repeated positions are harmless to a max and
    left out of a sum."""
    shape = ctx.static_shape(x)
    rank = len(shape)
    if any(s <= 0 for s in sizes):
        raise Unsupported(f"adaptive pooling to {sizes}")
    value = ctx.tensor(x)
    dtype = ctx.torch_dtype(x)
    for axis, n_out in zip(range(rank - len(sizes), rank), sizes):
        n_in = shape[axis]
        if n_in == n_out:
            continue
        index, inside = _windows(n_in, n_out)
        windows = ctx.add("Gather", [value, ctx.constant(index)], axis=axis)
        window_axis = ctx.constant(np.array([axis + 1], dtype=np.int64))
        if reduce == "max":
            value = ctx.add("ReduceMax", [windows, window_axis], keepdims=0)
            continue
        trailing = [1] * (rank - axis - 1)
        mask = ctx.constant(inside.reshape(list(inside.shape) + trailing))
        kept = ctx.add("Where", [mask, windows, ctx.scalar(0, dtype)])
        total = ctx.add("ReduceSum", [kept, window_axis], keepdims=0)
        counts = inside.sum(axis=1).reshape([n_out] + trailing)
        value = ctx.add("Div", [total, ctx.constant(counts.astype(dtype.numpy))])
    return ctx.add("Identity", [value])


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
