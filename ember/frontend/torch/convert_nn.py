"""Converters of ATen's neural-network ops: matrix products, convolutions, normalizations,
pooling, resizing, attention.

Weights reach these as constants (parameters and buffers are frozen at import), which is what
lets ember pack GEMM panels and fold BatchNorm into the convolution before it at compile time.
"""

from __future__ import annotations

import itertools
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
    if not str(node.target).startswith("aten._native_batch_norm_legit_no_training"):
        return [result, None, None]
    # PyTorch on CPU saves no statistics in eval mode: empty tensors
    return [result] + [_empty_output(ctx, i) if _output_used(node, i) else None
                       for i in (1, 2)]


def batch_norm_functional(ctx: ImportContext, node, x, weight, bias, mean, var, training,
                          momentum, eps) -> list[str | None]:
    """``_native_batch_norm_legit_functional``: (output, save_mean, save_rstd, new running
    mean, new running var).  In eval mode PyTorch (on CPU) saves no statistics, empty
    tensors, and returns the running ones unchanged."""
    if training:
        return _batch_norm_training(ctx, node, x, weight, bias, mean, var, momentum, eps,
                                    stats_at=(3, 4))
    output = batch_norm_inference(ctx, node, x, weight, bias, mean, var, eps)[0]
    empty = [_empty_output(ctx, i) if _output_used(node, i) else None for i in (1, 2)]
    return [output] + empty + [ctx.add("Identity", [ctx.tensor(mean)]),
                               ctx.add("Identity", [ctx.tensor(var)])]


def batch_norm_no_stats(ctx: ImportContext, node, x, weight, bias, training, momentum, eps
                        ) -> list[str | None]:
    """``_native_batch_norm_legit.no_stats``: normalized with the batch's statistics, no
    running statistics to update (in eval mode too: there are none)."""
    return _batch_norm_training(ctx, node, x, weight, bias, None, None, momentum, eps,
                                stats_at=())


def batch_norm_with_update(ctx: ImportContext, node, x, weight, bias, mean, var, momentum,
                           eps) -> list[str | None]:
    """``_batch_norm_with_update_functional`` (training mode always): (output, save_mean,
    save_invstd, reserve -- an empty byte tensor on CPU --, new running mean, new running
    var)."""
    result = _batch_norm_training(ctx, node, x, weight, bias, mean, var, momentum, eps,
                                  stats_at=(4, 5))
    reserve = _empty_output(ctx, 3) if _output_used(node, 3) else None
    return result[:3] + [reserve] + result[3:]


def _batch_norm_training(ctx: ImportContext, node, x, weight, bias, running_mean,
                         running_var, momentum, eps, stats_at: tuple[int, ...]
                         ) -> list[str | None]:
    """Batch norm over the batch's statistics, as PyTorch computes it in training mode: the
    mean and biased variance over every dim but the channels (dim 1) normalize the input;
    ``save_mean`` and ``save_rstd`` (1 / sqrt(var + eps)) are per channel; the running
    statistics move by ``momentum`` towards the batch's mean and *unbiased* variance
    (n / (n - 1) times the biased one, n the elements per channel).  16-bit floats are
    normalized in float32, as PyTorch's kernels do."""
    dtype = _float_out(ctx)
    shape = ctx.shape(x)
    if len(shape) < 2 or not isinstance(shape[1], int):
        raise Unsupported("batch norm needs a static channel dim")
    channels = int(shape[1])
    rank = len(shape)
    compute = DType.FLOAT32 if dtype in (DType.FLOAT16, DType.BFLOAT16) else dtype
    axes = ctx.constant(np.array([0] + list(range(2, rank)), dtype=np.int64))
    value = ctx.tensor_as(x, compute)
    mean = ctx.add("ReduceMean", [value, axes], keepdims=1)
    centered = ctx.add("Sub", [value, mean])
    variance = ctx.add("ReduceMean", [ctx.add("Mul", [centered, centered]), axes], keepdims=1)
    rstd = ctx.add("Reciprocal", [ctx.add("Sqrt", [
        ctx.add("Add", [variance, ctx.scalar(float(eps), compute)])])])
    output = ctx.add("Mul", [centered, rstd])
    per_channel = ctx.constant(np.array([channels] + [1] * (rank - 2), dtype=np.int64))
    if weight is not None:
        output = ctx.add("Mul", [output, ctx.add("Reshape", [ctx.tensor_as(weight, compute),
                                                             per_channel])])
    if bias is not None:
        output = ctx.add("Add", [output, ctx.add("Reshape", [ctx.tensor_as(bias, compute),
                                                             per_channel])])
    output = ctx.cast(output, dtype, compute)
    flat = ctx.constant(np.array([channels], dtype=np.int64))
    save_mean = ctx.cast(ctx.add("Reshape", [mean, flat]), ctx.out_dtype(1), compute)
    save_rstd = ctx.cast(ctx.add("Reshape", [rstd, flat]), ctx.out_dtype(2), compute)
    results: list[str | None] = [output, save_mean, save_rstd]
    if not stats_at:
        return results
    mean_at, var_at = stats_at
    momentum = float(momentum)
    count = ctx.add("Div", [ctx.add("Size", [ctx.tensor(x)]),
                            ctx.scalar(channels, DType.INT64)])
    count = ctx.cast(count, compute, DType.INT64)
    # n / (n - 1): inf for a single element per channel, which makes the variance NaN
    bessel = ctx.add("Div", [count, ctx.add("Sub", [count, ctx.scalar(1.0, compute)])])
    unbiased = ctx.add("Mul", [ctx.add("Reshape", [variance, flat]), bessel])
    for batch_value, running, at in ((ctx.add("Reshape", [mean, flat]), running_mean, mean_at),
                                     (unbiased, running_var, var_at)):
        stat_dtype = ctx.out_dtype(at)
        moved = ctx.add("Add", [
            ctx.add("Mul", [batch_value, ctx.scalar(momentum, compute)]),
            ctx.add("Mul", [ctx.tensor_as(running, compute),
                            ctx.scalar(1.0 - momentum, compute)])])
        results.append(ctx.cast(moved, stat_dtype, compute))
    return results


def _empty_output(ctx: ImportContext, index: int) -> str:
    """An empty tensor PyTorch returns in place of statistics it does not save."""
    value = meta_value(ctx.current)[index]
    shape = tuple(int(d) for d in value.shape)
    return ctx.constant(np.zeros(shape, dtype=ctx.out_dtype(index).numpy))


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
    # PyTorch's pooling propagates NaN; ember's MaxPool ignores it unless told (ONNX's
    # oracles skip it: see ember/ops/pool.py).
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads + pads,
                 dilations=_expand(static_ints(dilation, "dilation"), spatial),
                 ceil_mode=int(bool(ceil_mode)), propagate_nan=1)
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


# ---------------------------------------------------------------------------- grid sampling

_GRID_INTERPOLATIONS = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def grid_sampler(ctx: ImportContext, node, x, grid, interpolation_mode, padding_mode,
                 align_corners) -> str:
    """``grid_sampler_{2,3}d``: x (N, C, spatial...) sampled at the grid's normalized
    positions (N, out..., d; the last dim lists x first), written out as PyTorch's kernels
    compute it.  Each position is unnormalized to an input coordinate per axis; bilinear and
    nearest apply the padding mode to that coordinate (border: clamped; reflection: mirrored
    at the borders, then clamped), bicubic to each of its taps.  The taps (the rounded
    coordinate, the 2 or the 4 around it per axis) are gathered from the flattened spatial
    dims with GatherElements; a tap outside the input adds nothing, the others add value
    times the product of the axes' weights (2-D multiplies the masked value by the weight,
    3-D skips the tap, so a NaN weight from a non-finite grid shows as PyTorch's do).
    ONNX's GridSample differs in where bicubic pads, and has no compiled kernel."""
    dtype = _float_out(ctx)
    mode = _GRID_INTERPOLATIONS.get(static_int(interpolation_mode, "interpolation_mode"))
    padding = _GRID_PADDINGS.get(static_int(padding_mode, "padding_mode"))
    if mode is None or padding is None:
        raise Unsupported(f"grid sampling mode {interpolation_mode}, padding "
                          f"{padding_mode}")
    align = bool(align_corners)
    x_shape, grid_shape = ctx.shape(x), ctx.shape(grid)
    spatial = len(x_shape) - 2
    sizes = x_shape[2:]
    if not all(isinstance(d, int) for d in sizes):
        raise Unsupported("grid sampling of symbolic spatial sizes")
    if mode == "bicubic" and spatial != 2:
        raise Unsupported("bicubic grid sampling is 2-D only")
    batch, channels = x_shape[0], x_shape[1]
    # the grid as (N, 1, P, d) and the input as (N, C, S): positions and sizes flattened
    points = ctx.add("Reshape", [ctx.tensor_as(grid, dtype), ctx.ints([batch, 1, -1, spatial])])
    values = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([batch, channels, -1])])
    full = ctx.add("Concat", [ctx.add("Shape", [values], start=0, end=2),
                              ctx.add("Shape", [points], start=2, end=3)], axis=0)
    axes = []  # per spatial axis (outermost first): its taps as (float position, weight)
    for axis, size in enumerate(sizes):
        component = ctx.add("Gather", [points, ctx.constant(np.array(spatial - 1 - axis))],
                            axis=3)
        coordinate = _unnormalize(ctx, component, size, align, dtype)
        if mode != "bicubic":
            coordinate = _pad_coordinate(ctx, coordinate, size, padding, align, dtype,
                                         nan_at=0 if spatial == 2 else size - 1)
        axes.append(_grid_taps(ctx, coordinate, size, mode, padding, align, dtype))
    result = None
    strides = [int(np.prod(sizes[axis + 1:])) for axis in range(spatial)]
    for combination in itertools.product(*axes):
        inside, flat, weight = None, None, None
        for axis, (position, tap_weight) in enumerate(combination):
            size = sizes[axis]
            within = ctx.add("And", [
                ctx.add("GreaterOrEqual", [position, ctx.scalar(0, dtype)]),
                ctx.add("LessOrEqual", [position, ctx.scalar(size - 1, dtype)])])
            inside = within if inside is None else ctx.add("And", [inside, within])
            index = ctx.cast(ctx.add("Clip", [position, ctx.scalar(0, dtype),
                                              ctx.scalar(size - 1, dtype)]), DType.INT64, dtype)
            if strides[axis] != 1:
                index = ctx.add("Mul", [index, ctx.scalar(strides[axis], DType.INT64)])
            flat = index if flat is None else ctx.add("Add", [flat, index])
            if tap_weight is not None:
                weight = tap_weight if weight is None else ctx.add("Mul", [weight, tap_weight])
        gathered = ctx.add("GatherElements", [values, ctx.add("Expand", [flat, full])], axis=2)
        if weight is not None and spatial == 3:
            gathered = ctx.add("Mul", [gathered, weight])
        term = ctx.add("Where", [inside, gathered, ctx.scalar(0, dtype)])
        if weight is not None and spatial != 3:
            term = ctx.add("Mul", [term, weight])
        result = term if result is None else ctx.add("Add", [result, term])
    out_shape = [batch, channels] + list(grid_shape[1:-1])
    return ctx.add("Reshape", [result, ctx.ints(out_shape)])


def _unnormalize(ctx: ImportContext, value: str, size: int, align: bool, dtype: DType) -> str:
    """A normalized position (-1 .. 1 across the input) as a coordinate along an axis of
    ``size``: -1 and 1 are the corner pixels' centers with ``align_corners``, their outer
    edges without."""
    shifted = ctx.add("Add", [value, ctx.scalar(1, dtype)])
    if align:
        return ctx.add("Mul", [ctx.add("Div", [shifted, ctx.scalar(2, dtype)]),
                               ctx.scalar(size - 1, dtype)])
    return ctx.add("Div", [ctx.add("Sub", [ctx.add("Mul", [shifted, ctx.scalar(size, dtype)]),
                                           ctx.scalar(1, dtype)]), ctx.scalar(2, dtype)])


def _pad_coordinate(ctx: ImportContext, value: str, size: int, padding: str, align: bool,
                    dtype: DType, nan_at: int = 0) -> str:
    """PyTorch's ``compute_coordinates``: border clamps to the axis; reflection mirrors at
    the corner pixels' centers (``align_corners``) or outer edges, then clamps (a NaN to
    ``nan_at``: 0 in PyTorch's vectorized 2-D kernel, the last pixel in its 3-D one); zeros
    keeps the coordinate (its taps outside the input read nothing)."""
    if padding == "zeros":
        return value
    if padding == "reflection":
        low, high = (0.0, float(size - 1)) if align else (-0.5, size - 0.5)
        if high <= low:
            return ctx.add("Mul", [value, ctx.scalar(0, dtype)])
        span = high - low
        distance = ctx.add("Abs", [ctx.add("Sub", [value, ctx.scalar(low, dtype)])])
        extra = ctx.add("Mod", [distance, ctx.scalar(span, dtype)], fmod=1)
        flips = ctx.add("Floor", [ctx.add("Div", [distance, ctx.scalar(span, dtype)])])
        even = ctx.add("Equal", [ctx.add("Mod", [flips, ctx.scalar(2, dtype)], fmod=1),
                                 ctx.scalar(0, dtype)])
        value = ctx.add("Where", [even, ctx.add("Add", [extra, ctx.scalar(low, dtype)]),
                                  ctx.add("Sub", [ctx.scalar(span + low, dtype), extra])])
    clamped = ctx.add("Clip", [value, ctx.scalar(0, dtype), ctx.scalar(size - 1, dtype)])
    return ctx.add("Where", [ctx.add("IsNaN", [value]), ctx.scalar(nan_at, dtype), clamped])


def _grid_taps(ctx: ImportContext, coordinate: str, size: int, mode: str, padding: str,
               align: bool, dtype: DType) -> list[tuple[str, str | None]]:
    """The input positions a coordinate reads along one axis, with their weights: nearest the
    coordinate rounded half to even; bilinear floor and floor + 1, weighted 1 - t and t;
    bicubic floor - 1 .. floor + 2 with the cubic convolution weights (A = -0.75), each
    position padded on its own."""
    if mode == "nearest":
        return [(ctx.add("Round", [coordinate]), None)]
    base = ctx.add("Floor", [coordinate])
    t = ctx.add("Sub", [coordinate, base])
    one = ctx.scalar(1, dtype)
    if mode == "bilinear":
        return [(base, ctx.add("Sub", [one, t])), (ctx.add("Add", [base, one]), t)]
    a = -0.75

    def near(d: str) -> str:  # |d| <= 1: ((a + 2) d - (a + 3)) d d + 1
        inner = ctx.add("Sub", [ctx.add("Mul", [d, ctx.scalar(a + 2, dtype)]),
                                ctx.scalar(a + 3, dtype)])
        return ctx.add("Add", [ctx.add("Mul", [ctx.add("Mul", [inner, d]), d]), one])

    def far(d: str) -> str:  # 1 < |d| < 2: ((a d - 5 a) d + 8 a) d - 4 a
        inner = ctx.add("Sub", [ctx.add("Mul", [d, ctx.scalar(a, dtype)]),
                                ctx.scalar(5 * a, dtype)])
        inner = ctx.add("Add", [ctx.add("Mul", [inner, d]), ctx.scalar(8 * a, dtype)])
        return ctx.add("Sub", [ctx.add("Mul", [inner, d]), ctx.scalar(4 * a, dtype)])

    rest = ctx.add("Sub", [one, t])
    weights = [far(ctx.add("Add", [t, one])), near(t), near(rest),
               far(ctx.add("Add", [rest, one]))]
    taps = []
    for offset, weight in zip((-1, 0, 1, 2), weights):
        position = ctx.add("Add", [base, ctx.scalar(offset, dtype)]) if offset else base
        taps.append((_pad_coordinate(ctx, position, size, padding, align, dtype), weight))
    return taps


# ---------------------------------------------------------------------------- antialiased resize

def _triangle(x: np.ndarray) -> np.ndarray:
    return np.maximum(1.0 - np.abs(x), 0.0).astype(x.dtype)


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with a = -0.5 (PyTorch's antialiased bicubic)."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0)).astype(x.dtype)


def _aa_weights(in_len: int, out_len: int, align_corners: bool, scale_arg, taps: int,
                kernel, dtype: np.dtype) -> np.ndarray:
    """The (out, in) matrix of PyTorch's antialiased interpolation along one axis (its
    ``_compute_weights_aa``, in the input's precision): output i is centered at
    scale * (i + 0.5); when shrinking the kernel is stretched by the scale, so that every
    input contributes; each row's weights are normalized to sum to 1."""
    if align_corners:
        scale = (in_len - 1) / (out_len - 1) if out_len > 1 else 0.0
    elif scale_arg is not None and scale_arg > 0:
        scale = 1.0 / scale_arg
    else:
        scale = in_len / out_len
    scale = dtype.type(scale)
    support = dtype.type(taps * 0.5 * scale if scale >= 1.0 else taps * 0.5)
    max_size = int(math.ceil(support)) * 2 + 1
    invscale = dtype.type(1.0 / scale if scale >= 1.0 else 1.0)
    matrix = np.zeros((out_len, in_len), dtype=dtype)
    for i in range(out_len):
        center = dtype.type(scale * dtype.type(i + 0.5))
        low = max(int(center - support + dtype.type(0.5)), 0)
        size = min(int(center + support + dtype.type(0.5)), in_len) - low
        size = min(max(size, 0), max_size)
        positions = (np.arange(low, low + size).astype(dtype) - center + dtype.type(0.5))
        weights = kernel((positions * invscale).astype(dtype))
        total = weights.sum(dtype=dtype) if size else dtype.type(0)
        if total != 0:
            weights = (weights / total).astype(dtype)
        matrix[i, low:low + size] = weights
    return matrix


def upsample_aa(taps: int, kernel):
    """``_upsample_{bilinear,bicubic}2d_aa``: antialiased resizing of the last two dims.
    Separable: a constant (out, in) weight matrix per resized axis, computed at import time
    as PyTorch computes its weights, applied with MatMul -- the width first, then the
    height, an axis whose size does not change left alone (as PyTorch does)."""

    def convert(ctx: ImportContext, node, x, output_size, align_corners, scales_h=None,
                scales_w=None) -> str:
        dtype = _float_out(ctx)
        shape = ctx.static_shape(x)
        sizes = static_ints(output_size, "output_size")
        if len(shape) != 4 or len(sizes) != 2 or min(sizes) <= 0:
            raise Unsupported("antialiased resizing of a 4-D input to 2 sizes")
        compute = DType.FLOAT32 if dtype in (DType.FLOAT16, DType.BFLOAT16) else dtype
        value = ctx.tensor_as(x, compute)
        height, width = shape[2], shape[3]
        if sizes[1] != width:
            matrix = _aa_weights(width, sizes[1], bool(align_corners), scales_w, taps, kernel,
                                 np.dtype(compute.numpy))
            value = ctx.add("MatMul", [value, ctx.constant(np.ascontiguousarray(matrix.T))])
        if sizes[0] != height:
            matrix = _aa_weights(height, sizes[0], bool(align_corners), scales_h, taps, kernel,
                                 np.dtype(compute.numpy))
            value = ctx.add("MatMul", [ctx.constant(matrix), value])
        if sizes == [height, width]:
            value = ctx.add("Identity", [value])
        return ctx.cast(value, dtype, compute)

    return convert


def max_pool_backward(ctx: ImportContext, node, grad_output, x, kernel_size, stride, padding,
                      dilation, ceil_mode, indices) -> str:
    """``max_pool{2,3}d_with_indices_backward``: each output's gradient added at the input
    position its index names (flat within its spatial plane, as PyTorch numbers them),
    zeros elsewhere."""
    dtype = _float_out(ctx)
    spatial = 3 if "max_pool3d" in str(node.target) else 2
    shape = ctx.static_shape(x)
    lead = shape[:len(shape) - spatial]
    plane = int(np.prod(shape[len(shape) - spatial:]))
    flat = ctx.ints(list(lead) + [-1])
    grads = ctx.add("Reshape", [ctx.tensor_as(grad_output, dtype), flat])
    positions = ctx.add("Reshape", [ctx.tensor_as(indices, DType.INT64), flat])
    zeros = ctx.constant(np.zeros(list(lead) + [plane], dtype=dtype.numpy))
    summed = ctx.add("ScatterElements", [zeros, positions, grads], axis=len(lead),
                     reduction="add")
    return ctx.add("Reshape", [summed, ctx.ints(list(shape))])


# ---------------------------------------------------------------------------- fused losses

def linear_cross_entropy(ctx: ImportContext, node, x, linear_weight, target, linear_bias,
                         weight, reduction, ignore_index, label_smoothing, *rest
                         ) -> list[str | None]:
    """``torch_nn._linear_cross_entropy_batch_chunked``: cross entropy of the logits
    x @ W^T + b against class indices, with class ``weight``, ``ignore_index`` and
    ``label_smoothing`` as ``F.cross_entropy`` has them (the mean divides by the weight of
    the targets that are not ignored).  PyTorch computes it in chunks of the batch to save
    memory; ember in one piece.  The gradients it precomputes for training are not
    computed."""
    loss = _cross_entropy_of_linear(ctx, x, linear_weight, target, linear_bias, weight,
                                    str(reduction), int(ignore_index), float(label_smoothing))
    return [loss, None, None, None]


def linear_cross_entropy_none(ctx: ImportContext, node, x, linear_weight, target,
                              linear_bias, weight, ignore_index, *rest) -> str:
    """``torch_nn._linear_cross_entropy_batch_chunked_no_reduction``: the per-sample loss."""
    return _cross_entropy_of_linear(ctx, x, linear_weight, target, linear_bias, weight,
                                    "none", int(ignore_index), 0.0)


def _cross_entropy_of_linear(ctx: ImportContext, x, linear_weight, target, linear_bias,
                             weight, reduction: str, ignore_index: int, smoothing: float
                             ) -> str:
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS or reduction not in ("none", "mean", "sum"):
        raise Unsupported(f"linear cross entropy with reduction {reduction!r} of {dtype}")
    if ctx.rank(x) != 2 or ctx.rank(linear_weight) != 2 or ctx.rank(target) != 1 or \
            ctx.torch_dtype(target) in _FLOATS:
        raise Unsupported("linear cross entropy of (N, D) inputs and class-index targets")
    classes = ctx.static_shape(linear_weight)[0]
    value = ctx.tensor_as(x, dtype)
    logits = ctx.add("MatMul", [value, ctx.add("Transpose", [ctx.tensor_as(linear_weight, dtype)],
                                               perm=[1, 0])])
    if linear_bias is not None:
        logits = ctx.add("Add", [logits, ctx.tensor_as(linear_bias, dtype)])
    log_probs = ctx.add("LogSoftmax", [logits], axis=1)
    labels = ctx.tensor_as(target, DType.INT64)
    kept = ctx.add("Not", [ctx.add("Equal", [labels, ctx.scalar(ignore_index, DType.INT64)])])
    picked = ctx.add("Where", [kept, labels, ctx.scalar(0, DType.INT64)])
    column = ctx.constant(np.array([1], dtype=np.int64))
    class_weights = None if weight is None else ctx.tensor_as(weight, dtype)
    zero = ctx.scalar(0, dtype)
    if class_weights is None:
        target_weight = ctx.cast(kept, dtype, DType.BOOL)
    else:
        target_weight = ctx.add("Where", [kept, ctx.add("Gather", [class_weights, picked],
                                                        axis=0), zero])
    chosen = ctx.add("Squeeze", [ctx.add("GatherElements", [
        log_probs, ctx.add("Unsqueeze", [picked, column])], axis=1), column])
    loss = ctx.add("Neg", [ctx.add("Mul", [chosen, target_weight])])
    if smoothing:
        spread = log_probs if class_weights is None else \
            ctx.add("Mul", [log_probs, class_weights])
        smooth = ctx.add("Neg", [ctx.add("ReduceSum", [spread, column], keepdims=0)])
        smooth = ctx.add("Where", [kept, smooth, zero])
        loss = ctx.add("Add", [ctx.add("Mul", [loss, ctx.scalar(1.0 - smoothing, dtype)]),
                               ctx.add("Mul", [smooth, ctx.scalar(smoothing / classes, dtype)])])
    if reduction == "none":
        return loss
    everything = ctx.constant(np.array([0], dtype=np.int64))
    total = ctx.add("ReduceSum", [loss, everything], keepdims=0)
    if reduction == "sum":
        return total
    return ctx.add("Div", [total, ctx.add("ReduceSum", [target_weight, everything],
                                          keepdims=0)])


# ---------------------------------------------------------------------------- determinants

def linalg_det(ctx: ImportContext, node, a) -> list[str | None]:
    """``_linalg_det``: (det, LU, pivots); the determinant from Det over float64 (the LU
    factorization PyTorch also returns is not computed)."""
    dtype = _float_out(ctx)
    result = ctx.add("Det", [ctx.tensor_as(a, DType.FLOAT64)])
    return [ctx.cast(result, dtype, DType.FLOAT64), None, None]


def linalg_slogdet(ctx: ImportContext, node, a) -> list[str | None]:
    """``_linalg_slogdet``: (sign, log|det|, LU, pivots), from the determinant in float64
    (which holds what a float32 log-determinant can express); a singular matrix has sign 0
    and log|det| -inf."""
    dtype = _float_out(ctx)
    result = ctx.add("Det", [ctx.tensor_as(a, DType.FLOAT64)])
    sign = ctx.add("Sign", [result])
    magnitude = ctx.add("Log", [ctx.add("Abs", [result])])
    return [ctx.cast(sign, dtype, DType.FLOAT64), ctx.cast(magnitude, ctx.out_dtype(1),
                                                           DType.FLOAT64), None, None]
