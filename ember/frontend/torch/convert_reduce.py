"""Converters of ATen reductions, scans and sorts: sum, mean, max, var, softmax, cumsum, topk.

A missing or empty ``dim`` list reduces every dim, as PyTorch does; ember's reductions take
the axes as an input, so those become the full axis list (a 0-d input reduces nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.core.dtypes import DType
from ember.frontend.torch.context import ImportContext, Unsupported, static_int, static_ints


def _axes(ctx: ImportContext, x, dims) -> list[int]:
    rank = ctx.rank(x)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    axes = []
    for d in static_ints(dims, "reduction dims"):
        if rank == 0 and d in (0, -1):
            continue
        if not -rank <= d < rank:
            raise Unsupported(f"dim {d} out of range for rank {rank}")
        axes.append(d % rank)
    return sorted(set(axes))


def _reduce(ctx: ImportContext, op: str, value: str, axes: list[int], keepdim: bool) -> str:
    if not axes:
        return ctx.add("Identity", [value])
    return ctx.add(op, [value, ctx.constant(np.array(axes, dtype=np.int64))],
                   keepdims=int(bool(keepdim)))


def reduction(op: str, *, bool_as: str | None = None):
    """sum/mean/amax/amin/prod over ``dims`` (``.dim_IntList``, ``.default``, ``.dim_int``)."""

    def convert(ctx: ImportContext, node, x, dims=None, keepdim=False, *, dtype=None,
                **kwargs) -> str:
        out = ctx.out_dtype()
        compute = out
        value = ctx.tensor(x)
        source = ctx.torch_dtype(x)
        if source == DType.BOOL and out == DType.BOOL:
            # any/all-like reductions of bools: max/min over 0/1
            compute = DType.INT32
        value = ctx.cast(value, compute, source)
        if isinstance(dims, int):
            dims = [dims]
        result = _reduce(ctx, op, value, _axes(ctx, x, dims), keepdim)
        return ctx.cast(result, out, compute)

    return convert


def any_all(op: str):
    """any/all: ReduceMax/ReduceMin over the values as 0/1."""

    def convert(ctx: ImportContext, node, x, dims=None, keepdim=False) -> str:
        value = ctx.add("Not", [ctx.add("Equal", [ctx.tensor(x),
                                                  ctx.scalar(0, ctx.torch_dtype(x))])]) \
            if ctx.torch_dtype(x) != DType.BOOL else ctx.tensor(x)
        value = ctx.cast(value, DType.INT32, DType.BOOL)
        if isinstance(dims, int):
            dims = [dims]
        result = _reduce(ctx, op, value, _axes(ctx, x, dims), keepdim)
        return ctx.cast(result, DType.BOOL, DType.INT32)

    return convert


def max_min_dim(op: str, arg_op: str):
    """max.dim/min.dim: (values, indices) along one dim."""

    def convert(ctx: ImportContext, node, x, dim, keepdim=False) -> list[str]:
        axes = _axes(ctx, x, [dim])
        if not axes:  # 0-d input
            value = ctx.add("Identity", [ctx.tensor(x)])
            return [value, ctx.constant(np.array(0, dtype=np.int64))]
        value = ctx.tensor(x)
        values = _reduce(ctx, op, value, axes, keepdim)
        indices = ctx.add(arg_op, [value], axis=axes[0], keepdims=int(bool(keepdim)))
        return [values, indices]

    return convert


def argmax_min(arg_op: str):
    def convert(ctx: ImportContext, node, x, dim=None, keepdim=False) -> str:
        value = ctx.tensor(x)
        if ctx.rank(x) == 0:
            return ctx.add("Identity", [ctx.constant(np.array(0, dtype=np.int64))])
        if dim is None:  # over the flattened tensor
            flat = ctx.add("Reshape", [value, ctx.ints([-1])])
            result = ctx.add(arg_op, [flat], axis=0, keepdims=0)
            if keepdim:
                ones = [1] * ctx.rank(x)
                result = ctx.add("Reshape", [result, ctx.ints(ones)])
            return result
        axis = _axes(ctx, x, [dim])[0]
        return ctx.add(arg_op, [value], axis=axis, keepdims=int(bool(keepdim)))

    return convert


def var(ctx: ImportContext, node, x, dims=None, *, correction=None, keepdim=False) -> str:
    return _variance(ctx, x, dims, 1 if correction is None else correction, keepdim)


def _variance(ctx: ImportContext, x, dims, correction, keepdim: bool) -> str:
    dtype = ctx.out_dtype()
    if dtype not in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16):
        raise Unsupported(f"variance of {dtype}")
    value = ctx.tensor_as(x, dtype)
    if isinstance(dims, int):
        dims = [dims]
    axes = _axes(ctx, x, dims)
    shape = ctx.static_shape(x)
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    mean = _reduce(ctx, "ReduceMean", value, axes, True)
    centered = ctx.add("Sub", [value, mean])
    squares = _reduce(ctx, "ReduceSum", ctx.add("Mul", [centered, centered]), axes, keepdim)
    divisor = max(count - float(correction), 0.0)
    # count <= correction: PyTorch gives inf/nan from the division by zero
    return ctx.add("Div", [squares, ctx.scalar(divisor, dtype)])


def var_mean(ctx: ImportContext, node, x, dims=None, *, correction=None, keepdim=False
             ) -> list[str]:
    variance = _variance(ctx, x, dims, 1 if correction is None else correction, keepdim)
    if isinstance(dims, int):
        dims = [dims]
    mean = _reduce(ctx, "ReduceMean", ctx.tensor_as(x, ctx.out_dtype()), _axes(ctx, x, dims),
                   keepdim)
    return [variance, mean]


def logsumexp(ctx: ImportContext, node, x, dims, keepdim=False) -> str:
    dtype = ctx.out_dtype()
    value = ctx.tensor_as(x, dtype)
    if isinstance(dims, int):
        dims = [dims]
    return _reduce(ctx, "ReduceLogSumExp", value, _axes(ctx, x, dims), keepdim)


def softmax(op: str):
    def convert(ctx: ImportContext, node, x, dim, half_to_float=False) -> str:
        dtype = ctx.out_dtype()
        rank = ctx.rank(x)
        value = ctx.tensor_as(x, dtype)
        if rank == 0:
            reshaped = ctx.add("Reshape", [value, ctx.ints([1])])
            result = ctx.add(op, [reshaped], axis=0)
            return ctx.add("Reshape", [result, ctx.ints([])])
        axis = static_int(dim, "softmax dim")
        return ctx.add(op, [value], axis=axis % rank)
    return convert


def scan(op: str):
    def convert(ctx: ImportContext, node, x, dim, *, dtype=None) -> str:
        out = ctx.out_dtype()
        rank = ctx.rank(x)
        value = ctx.tensor_as(x, out)
        if rank == 0:
            return ctx.add("Identity", [value])
        axis = static_int(dim, "scan dim") % rank
        return ctx.add(op, [value, ctx.constant(np.array(axis, dtype=np.int64))])
    return convert


def topk(ctx: ImportContext, node, x, k, dim=-1, largest=True, sorted=True) -> list[str]:
    rank = ctx.rank(x)
    if rank == 0:
        raise Unsupported("topk of a 0-d tensor")
    axis = static_int(dim, "topk dim") % rank
    k_value = ctx.add("Unsqueeze", [ctx.symint(k), ctx.constant(np.array([0]))])
    values, indices = ctx.add("TopK", [ctx.tensor(x), k_value], outputs=2, axis=axis,
                              largest=int(bool(largest)), sorted=1)
    return [values, indices]


def sort(ctx: ImportContext, node, x, dim=-1, descending=False, stable=None) -> list[str]:
    shape = ctx.static_shape(x)
    if not shape:
        raise Unsupported("sort of a 0-d tensor")
    axis = static_int(dim, "sort dim") % len(shape)
    k = ctx.constant(np.array([shape[axis]], dtype=np.int64))
    values, indices = ctx.add("TopK", [ctx.tensor(x), k], outputs=2, axis=axis,
                              largest=int(bool(descending)), sorted=1)
    return [values, indices]


def norm(ctx: ImportContext, node, x, p=2, dims=None, keepdim=False, *, dtype=None) -> str:
    """linalg_vector_norm with p in {1, 2, inf, -inf} (others run in PyTorch)."""
    out = ctx.out_dtype()
    value = ctx.tensor_as(x, out)
    if isinstance(dims, int):
        dims = [dims]
    axes = _axes(ctx, x, dims)
    if p == 2:
        return _reduce(ctx, "ReduceL2", value, axes, keepdim)
    if p == 1:
        return _reduce(ctx, "ReduceL1", value, axes, keepdim)
    if p == float("inf"):
        return _reduce(ctx, "ReduceMax", ctx.add("Abs", [value]), axes, keepdim)
    if p == float("-inf"):
        return _reduce(ctx, "ReduceMin", ctx.add("Abs", [value]), axes, keepdim)
    raise Unsupported(f"vector norm of order {p}")


def mean_any(ctx: ImportContext, node, x, *args: Any, **kwargs: Any) -> str:
    return reduction("ReduceMean")(ctx, node, x, *args, **kwargs)
