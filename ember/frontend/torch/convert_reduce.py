"""Converters of ATen reductions, scans and sorts: sum, mean, max, var, softmax, cumsum, topk.

A missing or empty ``dim`` list reduces every dim, as PyTorch does; ember's reductions take
the axes as an input, so those become the full axis list (a 0-d input reduces nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.core.dtypes import DType
from ember.frontend.torch.context import ImportContext, Unsupported, static_int, static_ints

_FLOATS = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


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


def sort_stable(ctx: ImportContext, node, x, *, stable=None, dim=-1, descending=False
                ) -> list[str]:
    """sort.stable: TopK keeps tied values in index order, ascending or descending, which is
    what a stable sort gives."""
    return sort(ctx, node, x, dim, descending)


def norm(ctx: ImportContext, node, x, p=2, dims=None, keepdim=False, *, dtype=None) -> str:
    """linalg_vector_norm of any order p."""
    out = ctx.out_dtype()
    if out not in _FLOATS:
        raise Unsupported(f"vector norm of {out}")
    if isinstance(dims, int):
        dims = [dims]
    return vector_norm(ctx, ctx.tensor_as(x, out), _axes(ctx, x, dims), p, keepdim, out)


def vector_norm(ctx: ImportContext, value: str, axes: list[int], p: Any, keepdim: bool,
                dtype: DType) -> str:
    """The p-norm of ``value`` over ``axes``: (sum |x|^p)^(1/p), with the limits p = inf
    (max |x|), -inf (min |x|) and 0 (the count of non-zeros).  No axes (a 0-d input) is
    the norm of each element alone."""
    p = float(p)
    magnitude = ctx.add("Abs", [value])
    if p == 0:
        nonzero = ctx.add("Not", [ctx.add("Equal", [value, ctx.scalar(0, dtype)])])
        return _reduce(ctx, "ReduceSum", ctx.cast(nonzero, dtype, DType.BOOL), axes, keepdim)
    if not axes:
        return ctx.add("Identity", [magnitude])
    if p == 2:
        return _reduce(ctx, "ReduceL2", value, axes, keepdim)
    if p == 1:
        return _reduce(ctx, "ReduceL1", value, axes, keepdim)
    if p == float("inf"):
        return _reduce(ctx, "ReduceMax", magnitude, axes, keepdim)
    if p == float("-inf"):
        return _reduce(ctx, "ReduceMin", magnitude, axes, keepdim)
    powers = ctx.add("Pow", [magnitude, ctx.scalar(p, dtype)])
    total = _reduce(ctx, "ReduceSum", powers, axes, keepdim)
    return ctx.add("Pow", [total, ctx.scalar(1.0 / p, dtype)])


def dist(ctx: ImportContext, node, a, b, p=2) -> str:
    """The p-norm of a - b (broadcast), over every element."""
    out = ctx.out_dtype()
    if out not in _FLOATS:
        raise Unsupported(f"dist of {out}")
    difference = ctx.add("Sub", [ctx.tensor_as(a, out), ctx.tensor_as(b, out)])
    rank = max(ctx.rank(a), ctx.rank(b))
    return vector_norm(ctx, difference, list(range(rank)), p, False, out)


# ---------------------------------------------------------------------------- scans by doubling

def _scan_by_doubling(ctx: ImportContext, values: list[str], axis: int, length: int,
                      combine) -> list[str]:
    """An inclusive scan along ``axis`` (static ``length``) with an associative
    ``combine(earlier, later)`` of tuples of values: log2(length) rounds in which every
    position combines with the one ``step`` before it (Hillis and Steele)."""
    axes = ctx.constant(np.array([axis], dtype=np.int64))

    def part(value: str, start: int, end: int) -> str:
        return ctx.add("Slice", [value, ctx.constant(np.array([start], dtype=np.int64)),
                                 ctx.constant(np.array([end], dtype=np.int64)), axes])

    step = 1
    while step < length:
        heads = [part(v, 0, step) for v in values]
        combined = combine([part(v, 0, length - step) for v in values],
                           [part(v, step, length) for v in values])
        values = [ctx.add("Concat", [head, tail], axis=axis)
                  for head, tail in zip(heads, combined)]
        step *= 2
    return values


def _scan_axis(ctx: ImportContext, x, dim) -> tuple[int, int]:
    shape = ctx.static_shape(x)
    if not shape:
        return 0, 1
    axis = static_int(dim, "scan dim") % len(shape)
    return axis, shape[axis]


def logcumsumexp(ctx: ImportContext, node, x, dim) -> str:
    """log(cumsum(exp(x))) without overflow: a scan of logaddexp(a, b) = max + log(1 +
    exp(-|a - b|)), which is exact for infinite operands too."""
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS:
        raise Unsupported(f"logcumsumexp of {dtype}")
    value = ctx.tensor_as(x, dtype)
    if ctx.rank(x) == 0:
        return ctx.add("Identity", [value])
    axis, length = _scan_axis(ctx, x, dim)

    def combine(earlier: list[str], later: list[str]) -> list[str]:
        a, b = earlier[0], later[0]
        big = ctx.add("Max", [a, b])
        gap = ctx.add("Neg", [ctx.add("Abs", [ctx.add("Sub", [a, b])])])
        summed = ctx.add("Add", [big, ctx.add("Log", [
            ctx.add("Add", [ctx.scalar(1.0, dtype), ctx.add("Exp", [gap])])])])
        # an infinite maximum is the result (inf - inf would make the gap NaN)
        return [ctx.add("Where", [ctx.add("IsInf", [big]), big, summed])]

    return _scan_by_doubling(ctx, [value], axis, length, combine)[0]


def cummax_cummin(compare: str):
    """cummax/cummin: the running extreme and the index where it was last reached (ties take
    the later index); a NaN wins over every number and the latest NaN over earlier ones."""

    def convert(ctx: ImportContext, node, x, dim) -> list[str]:
        dtype = ctx.torch_dtype(x)
        value = ctx.tensor(x)
        if ctx.rank(x) == 0:
            return [ctx.add("Identity", [value]),
                    ctx.constant(np.array(0, dtype=np.int64))]
        shape = ctx.static_shape(x)
        axis, length = _scan_axis(ctx, x, dim)
        positions = np.arange(length, dtype=np.int64).reshape(
            [length if a == axis else 1 for a in range(len(shape))])
        index = ctx.add("Expand", [ctx.constant(positions),
                                   ctx.constant(np.array(shape, dtype=np.int64))])
        compare_value = value
        if dtype == DType.BOOL:
            compare_value = ctx.cast(value, DType.INT32, DType.BOOL)
        floats = dtype in _FLOATS

        def combine(earlier: list[str], later: list[str]) -> list[str]:
            take_later = ctx.add(compare, [later[0], earlier[0]])
            if floats:
                earlier_nan = ctx.add("IsNaN", [earlier[0]])
                take_later = ctx.add("And", [take_later, ctx.add("Not", [earlier_nan])])
                take_later = ctx.add("Or", [take_later, ctx.add("IsNaN", [later[0]])])
            return [ctx.add("Where", [take_later, l, e]) for e, l in zip(earlier, later)]

        values, indices = _scan_by_doubling(ctx, [compare_value, index], axis, length, combine)
        return [ctx.cast(values, dtype), indices]

    return convert


# ---------------------------------------------------------------------------- order statistics

def _sorted_along(ctx: ImportContext, value: str, axis: int, count: int) -> list[str]:
    """The ``count`` smallest values along ``axis`` in ascending order (NaN last), with
    their indices."""
    k = ctx.constant(np.array([count], dtype=np.int64))
    return ctx.add("TopK", [value, k], outputs=2, axis=axis, largest=0, sorted=1)


def _pick(ctx: ImportContext, value: str, axis: int, position: int, keepdim: bool) -> str:
    index = np.array([position] if keepdim else position, dtype=np.int64)
    return ctx.add("Gather", [value, ctx.constant(index)], axis=axis)


def kthvalue(ctx: ImportContext, node, x, k, dim=-1, keepdim=False) -> list[str]:
    """The k-th smallest value along ``dim`` and its index (NaN counts as the largest)."""
    k = static_int(k, "kthvalue k")
    value = ctx.tensor(x)
    if ctx.rank(x) == 0:
        if k != 1:
            raise Unsupported(f"kthvalue k={k} of a 0-d tensor")
        return [ctx.add("Identity", [value]), ctx.constant(np.array(0, dtype=np.int64))]
    axis, length = _scan_axis(ctx, x, dim)
    if not 1 <= k <= length:
        raise Unsupported(f"kthvalue k={k} out of range for size {length}")
    values, indices = _sorted_along(ctx, value, axis, k)
    return [_pick(ctx, values, axis, k - 1, keepdim), _pick(ctx, indices, axis, k - 1, keepdim)]


def median_all(ignore_nan: bool):
    """median()/nanmedian() of every element: the lower median of the sorted values; with a
    NaN median gives NaN, nanmedian the median of the other values."""

    def convert(ctx: ImportContext, node, x) -> str:
        numel = int(np.prod(ctx.static_shape(x)))
        if numel == 0:
            raise Unsupported("median of an empty tensor")
        flat = ctx.add("Reshape", [ctx.tensor(x), ctx.ints([-1])])
        values, indices = _median_along(ctx, flat, 0, numel, ignore_nan, ctx.torch_dtype(x),
                                        keepdim=False)
        return values

    return convert


def median_dim(ignore_nan: bool):
    def convert(ctx: ImportContext, node, x, dim=-1, keepdim=False) -> list[str]:
        value = ctx.tensor(x)
        if ctx.rank(x) == 0:
            return [ctx.add("Identity", [value]), ctx.constant(np.array(0, dtype=np.int64))]
        axis, length = _scan_axis(ctx, x, dim)
        if length == 0:
            raise Unsupported("median along an empty dim")
        return _median_along(ctx, value, axis, length, ignore_nan, ctx.torch_dtype(x),
                             bool(keepdim))

    return convert


def _median_along(ctx: ImportContext, value: str, axis: int, length: int, ignore_nan: bool,
                  dtype: DType, keepdim: bool) -> list[str]:
    values, indices = _sorted_along(ctx, value, axis, length)
    if dtype not in _FLOATS:
        position = (length - 1) // 2
        return [_pick(ctx, values, axis, position, keepdim),
                _pick(ctx, indices, axis, position, keepdim)]
    is_nan = ctx.add("IsNaN", [value])
    axes = ctx.constant(np.array([axis], dtype=np.int64))
    if ignore_nan:
        # the lower median of the values that are not NaN (they sort first); all NaN: NaN
        # (the count is halved in float64, exactly: ember's compiler fails on an integer
        # Div fused after a ReduceSum)
        valid = ctx.add("ReduceSum", [ctx.cast(ctx.add("Not", [is_nan]), DType.FLOAT64,
                                               DType.BOOL), axes], keepdims=1)
        half = ctx.add("Mul", [ctx.add("Sub", [valid, ctx.scalar(1.0, DType.FLOAT64)]),
                               ctx.scalar(0.5, DType.FLOAT64)])
        position = ctx.add("Max", [ctx.cast(ctx.add("Floor", [half]), DType.INT64,
                                            DType.FLOAT64), ctx.scalar(0, DType.INT64)])
        picked = [ctx.add("GatherElements", [values, position], axis=axis),
                  ctx.add("GatherElements", [indices, position], axis=axis)]
        if not keepdim:
            picked = [ctx.add("Squeeze", [p, axes]) for p in picked]
        return picked
    position = (length - 1) // 2
    median = _pick(ctx, values, axis, position, keepdim)
    index = _pick(ctx, indices, axis, position, keepdim)
    # any NaN makes the median NaN, at the index of the first NaN
    nan_flags = ctx.cast(is_nan, DType.INT32, DType.BOOL)
    has_nan = ctx.add("Greater", [ctx.add("ReduceMax", [nan_flags, axes],
                                          keepdims=int(keepdim)), ctx.scalar(0, DType.INT32)])
    first_nan = ctx.add("ArgMax", [nan_flags], axis=axis, keepdims=int(keepdim))
    return [ctx.add("Where", [has_nan, ctx.scalar(float("nan"), dtype), median]),
            ctx.add("Where", [has_nan, first_nan, index])]


# ---------------------------------------------------------------------------- binary search

def searchsorted(ctx: ImportContext, node, sorted_sequence, values, *, out_int32=False,
                 right=False, side=None, sorter=None) -> str:
    """The insertion points of ``values`` in the sorted last dim of ``sorted_sequence`` (one
    1-D sequence for all values, or one per leading index): how many entries are before
    each value, counted by comparing with all of them.  The count is of the entries for
    which PyTorch's binary search moves right, !(entry >= value) (or !(entry > value) for
    the right side), so a NaN value goes after everything."""
    from ember.frontend.torch.convert_elementwise import promoted

    right = bool(right) or side == "right"
    compute = promoted(sorted_sequence, values)
    sequence = ctx.tensor_as(sorted_sequence, compute)
    if sorter is not None:
        sequence = ctx.add("GatherElements", [sequence, ctx.tensor_as(sorter, DType.INT64)],
                           axis=-1)
    value = ctx.tensor_as(values, compute)
    value_rank = ctx.rank(values) if not isinstance(values, (int, float)) else 0
    if ctx.rank(sorted_sequence) == 1:
        # every value against the one sequence: values[..., None] vs sequence[M]
        if value_rank == 0:
            value = ctx.add("Reshape", [value, ctx.ints([1])])
        else:
            value = ctx.add("Unsqueeze", [value, ctx.constant(np.array([-1], dtype=np.int64))])
    else:
        # values[..., K, None] vs sequence[..., None, M]
        value = ctx.add("Unsqueeze", [value, ctx.constant(np.array([-1], dtype=np.int64))])
        sequence = ctx.add("Unsqueeze", [sequence,
                                         ctx.constant(np.array([-2], dtype=np.int64))])
    passed = ctx.add("Greater" if right else "GreaterOrEqual", [sequence, value])
    before = ctx.cast(ctx.add("Not", [passed]), DType.INT64, DType.BOOL)
    scalar_result = ctx.rank(sorted_sequence) == 1 and value_rank == 0
    counts = ctx.add("ReduceSum", [before, ctx.constant(np.array([-1], dtype=np.int64))],
                     keepdims=0)
    if scalar_result:  # a scalar value: a 0-d result
        counts = ctx.add("Reshape", [counts, ctx.ints([])])
    return ctx.cast(counts, ctx.out_dtype(), DType.INT64)


def bucketize(ctx: ImportContext, node, values, boundaries, *, out_int32=False, right=False
              ) -> str:
    """bucketize is searchsorted with the arguments swapped (1-D boundaries)."""
    return searchsorted(ctx, node, boundaries, values, out_int32=out_int32, right=right)


# ---------------------------------------------------------------------------- histograms

def histc(ctx: ImportContext, node, x, bins=100, min=0, max=0) -> str:
    """``histc``: counts of the elements in ``bins`` equal bins over [min, max] (the data's
    own range when min == max, widened by 1 around a single value), outside elements and NaN
    left out.  The bin is PyTorch's, computed without looking at the edges:
    int((x - min) * bins / (max - min)) in the input's precision, the maximum in the last
    bin.  Counting is a comparison of every element with every bin, summed."""
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS:
        raise Unsupported(f"histc of {dtype}")
    bins = static_int(bins, "histc bins")
    low, high = float(min), float(max)
    numel = int(np.prod(ctx.static_shape(x)))
    if bins <= 0 or low > high:
        raise Unsupported(f"histc with {bins} bins over [{low}, {high}]")
    if numel == 0:
        return ctx.constant(np.zeros(bins, dtype=dtype.numpy))
    value = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1])])
    first, last = _histogram_range(ctx, value, None if low == high else (low, high), dtype)
    inside = ctx.add("And", [ctx.add("GreaterOrEqual", [value, first]),
                             ctx.add("LessOrEqual", [value, last])])
    position = ctx.add("Div", [ctx.add("Mul", [ctx.add("Sub", [value, first]),
                                               ctx.scalar(float(bins), dtype)]),
                               ctx.add("Sub", [last, first])])
    position = ctx.add("Where", [inside, position, ctx.scalar(0, dtype)])
    index = ctx.add("Min", [ctx.cast(position, DType.INT64, dtype),
                            ctx.scalar(bins - 1, DType.INT64)])
    return _count_bins(ctx, index, inside, None, bins, dtype)


def _histogram_range(ctx: ImportContext, value: str, bounds: tuple[float, float] | None,
                     dtype: DType) -> tuple[str, str]:
    """The outer edges: ``bounds``, or without them the data's minimum and maximum; 0.5
    further apart when they are equal."""
    if bounds is not None:
        low, high = bounds
        if low == high:
            low, high = low - 0.5, high + 0.5
        return ctx.scalar(low, dtype), ctx.scalar(high, dtype)
    axis = ctx.constant(np.array([0], dtype=np.int64))
    first = ctx.add("ReduceMin", [value, axis], keepdims=0)
    last = ctx.add("ReduceMax", [value, axis], keepdims=0)
    same = ctx.add("Equal", [first, last])
    half = ctx.scalar(0.5, dtype)
    return (ctx.add("Where", [same, ctx.add("Sub", [first, half]), first]),
            ctx.add("Where", [same, ctx.add("Add", [last, half]), last]))


def _count_bins(ctx: ImportContext, index: str, inside: str, weight: str | None, bins: int,
                dtype: DType) -> str:
    """Per bin, the number (or the weights' sum) of the elements whose bin is ``index`` and
    that are ``inside``: a (elements, bins) comparison summed over the elements."""
    column = ctx.constant(np.array([1], dtype=np.int64))
    hits = ctx.add("And", [
        ctx.add("Equal", [ctx.add("Unsqueeze", [index, column]),
                          ctx.constant(np.arange(bins, dtype=np.int64)[None, :])]),
        ctx.add("Unsqueeze", [inside, column])])
    if weight is None:
        counted = ctx.cast(hits, dtype, DType.BOOL)
    else:
        counted = ctx.add("Where", [hits, ctx.add("Unsqueeze", [weight, column]),
                                    ctx.scalar(0, dtype)])
    return ctx.add("ReduceSum", [counted, ctx.constant(np.array([0], dtype=np.int64))],
                   keepdims=0)


def histogram(ctx: ImportContext, node, x, bins, *, range=None, weight=None, density=False
              ) -> list[str]:
    """``histogram.bin_ct``: (hist, bin_edges) over ``bins`` equal bins, whose edges are
    PyTorch's linspace (from the start for the first half, from the end for the rest)."""
    dtype = _histogram_dtype(ctx)
    bins = static_int(bins, "histogram bins")
    bounds = None if range is None else (float(range[0]), float(range[1]))
    if bins <= 0 or (bounds is not None and bounds[0] > bounds[1]):
        raise Unsupported(f"histogram of {bins} bins over {range}")
    empty = 0 in ctx.static_shape(x)
    if empty and bounds is None:  # no data to take the range from: [0, 1], as PyTorch does
        bounds = (0.0, 1.0)
    value = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1])])
    edges = _linspace_edges(ctx, *_histogram_range(ctx, value, bounds, dtype), bins, dtype)
    if empty:  # no counts; a density of none is 0 / 0
        fill = np.nan if density else 0.0
        return [ctx.constant(np.full(bins, fill, dtype=dtype.numpy)), edges]
    return [_histogram_over(ctx, value, edges, bins, weight, density, dtype), edges]


def _linspace_edges(ctx: ImportContext, first: str, last: str, bins: int, dtype: DType
                    ) -> str:
    """linspace(first, last, bins + 1) as PyTorch computes it: from the start for the first
    half, from the end for the rest."""
    steps = np.arange(bins + 1)
    step = ctx.add("Div", [ctx.add("Sub", [last, first]), ctx.scalar(float(bins), dtype)])
    half = (bins + 1) // 2
    from_start = ctx.add("Add", [first, ctx.add("Mul", [
        step, ctx.constant(steps[:half].astype(dtype.numpy))])])
    from_end = ctx.add("Sub", [last, ctx.add("Mul", [
        step, ctx.constant((bins - steps[half:]).astype(dtype.numpy))])])
    return ctx.add("Concat", [from_start, from_end], axis=0)


def histogram_edges(ctx: ImportContext, node, x, bins, *, weight=None, density=False
                    ) -> list[str]:
    """``histogram.bins_tensor``: (hist, bin_edges) over the given (increasing) edges."""
    dtype = _histogram_dtype(ctx)
    count = ctx.static_shape(bins)
    if len(count) != 1 or count[0] < 2:
        raise Unsupported("histogram edges must be a 1-D tensor of at least 2")
    value = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1])])
    edges = ctx.tensor_as(bins, dtype)
    return [_histogram_over(ctx, value, edges, count[0] - 1, weight, density, dtype),
            ctx.add("Identity", [edges])]


def _histogram_dtype(ctx: ImportContext) -> DType:
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS:
        raise Unsupported(f"histogram of {dtype}")
    return dtype


def _histogram_over(ctx: ImportContext, value: str, edges: str, bins: int, weight,
                    density: bool, dtype: DType) -> str:
    """The histogram of the flat ``value`` over ``edges``.  An element's bin is found
    against the edges, as PyTorch's search does: the number of edges at or below it, minus
    one, the last edge in the last bin; elements outside the edges (and NaN) count nowhere.
    ``density`` divides by the total and the bin widths."""
    index, inside = _bin_of(ctx, value, edges, bins)
    weights = None
    if weight is not None:
        weights = ctx.add("Reshape", [ctx.tensor_as(weight, dtype), ctx.ints([-1])])
    hist = _count_bins(ctx, index, inside, weights, bins, dtype)
    if not density:
        return hist
    total = ctx.add("ReduceSum", [hist, ctx.constant(np.array([0], dtype=np.int64))],
                    keepdims=0)
    return ctx.add("Div", [hist, ctx.add("Mul", [total, _widths(ctx, edges, bins)])])


def _widths(ctx: ImportContext, edges: str, bins: int) -> str:
    return ctx.add("Sub", [ctx.add("Slice", [edges, ctx.ints([1]), ctx.ints([bins + 1])]),
                           ctx.add("Slice", [edges, ctx.ints([0]), ctx.ints([bins])])])


def _bin_of(ctx: ImportContext, value: str, edges: str, bins: int) -> tuple[str, str]:
    """The bin of every element of the flat ``value`` (int64) and whether it is inside the
    outer edges."""
    first = ctx.add("Gather", [edges, ctx.constant(np.array(0, dtype=np.int64))], axis=0)
    last = ctx.add("Gather", [edges, ctx.constant(np.array(bins, dtype=np.int64))], axis=0)
    inside = ctx.add("And", [ctx.add("GreaterOrEqual", [value, first]),
                             ctx.add("LessOrEqual", [value, last])])
    at_or_below = ctx.add("LessOrEqual", [
        ctx.add("Unsqueeze", [edges, ctx.constant(np.array([0], dtype=np.int64))]),
        ctx.add("Unsqueeze", [value, ctx.constant(np.array([1], dtype=np.int64))])])
    index = ctx.add("Sub", [
        ctx.add("ReduceSum", [ctx.cast(at_or_below, DType.INT64, DType.BOOL),
                              ctx.constant(np.array([1], dtype=np.int64))], keepdims=0),
        ctx.scalar(1, DType.INT64)])
    return ctx.add("Min", [index, ctx.scalar(bins - 1, DType.INT64)]), inside


def histogramdd_edges(ctx: ImportContext, node, x, bins, range=None, weight=None,
                      density=False) -> list[str]:
    """``_histogramdd_bin_edges``: the edges of each of the D dims of the (..., D) samples,
    as ``histogram`` makes them from the dim's range (given, or the data's)."""
    dtype, value, counts, empty = _histogramdd_setup(ctx, x, bins)
    return [edges for edges, _ in _histogramdd_dims(ctx, value, counts, range, empty, dtype)]


def histogramdd_counts(ctx: ImportContext, node, x, bins, range=None, weight=None,
                       density=False) -> str:
    """``_histogramdd_from_bin_cts``: the D-dimensional histogram over those edges."""
    dtype, value, counts, empty = _histogramdd_setup(ctx, x, bins)
    dims = _histogramdd_dims(ctx, value, counts, range, empty, dtype)
    return _histogramdd(ctx, value, [e for e, _ in dims], counts, weight, density, empty,
                        dtype)


def histogramdd_tensors(ctx: ImportContext, node, x, bins, weight=None, density=False) -> str:
    """``_histogramdd_from_bin_tensors``: the D-dimensional histogram over given edges."""
    counts = [ctx.static_shape(b)[0] - 1 for b in bins]
    dtype, value, counts, empty = _histogramdd_setup(ctx, x, counts)
    edges = [ctx.tensor_as(b, dtype) for b in bins]
    return _histogramdd(ctx, value, edges, counts, weight, density, empty, dtype)


def _histogramdd_setup(ctx: ImportContext, x, bins) -> tuple[DType, str, list[int], bool]:
    """The samples as (N, D), the bins per dim, and whether there are no samples."""
    dtype = ctx.torch_dtype(x)
    if dtype not in _FLOATS:
        raise Unsupported(f"histogramdd of {dtype}")
    shape = ctx.static_shape(x)
    counts = static_ints(bins, "histogramdd bins")
    if not shape or len(counts) != shape[-1] or min(counts, default=0) <= 0:
        raise Unsupported(f"histogramdd of {shape} in {counts} bins")
    value = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1, shape[-1]])])
    return dtype, value, counts, int(np.prod(shape[:-1])) == 0


def _histogramdd_dims(ctx: ImportContext, value: str, counts: list[int], bounds, empty: bool,
                      dtype: DType) -> list[tuple[str, str]]:
    """Per dim, its edges and its column of the samples."""
    dims = []
    for d, bins in enumerate(counts):
        column = ctx.add("Gather", [value, ctx.constant(np.array(d, dtype=np.int64))], axis=1)
        pair = None if bounds is None else (float(bounds[2 * d]), float(bounds[2 * d + 1]))
        if pair is None and empty:  # no data: [0, 1], as PyTorch
            pair = (0.0, 1.0)
        first, last = _histogram_range(ctx, column, pair, dtype)
        dims.append((_linspace_edges(ctx, first, last, bins, dtype), column))
    return dims


def _histogramdd(ctx: ImportContext, value: str, edges: list[str], counts: list[int], weight,
                 density: bool, empty: bool, dtype: DType) -> str:
    """Every sample's cell (its bin in each dim, flattened row-major) gets its weight, or 1,
    scattered into the cells; a sample outside any dim's edges goes to a spare cell,
    dropped."""
    total = int(np.prod(counts))
    if empty:  # no samples; a density of none is 0 / 0
        return ctx.constant(np.full(counts, np.nan if density else 0.0, dtype=dtype.numpy))
    flat, inside = None, None
    for d, (dim_edges, bins) in enumerate(zip(edges, counts)):
        column = ctx.add("Gather", [value, ctx.constant(np.array(d, dtype=np.int64))], axis=1)
        index, within = _bin_of(ctx, column, dim_edges, bins)
        stride = int(np.prod(counts[d + 1:]))
        if stride != 1:
            index = ctx.add("Mul", [index, ctx.scalar(stride, DType.INT64)])
        flat = index if flat is None else ctx.add("Add", [flat, index])
        inside = within if inside is None else ctx.add("And", [inside, within])
    cells = ctx.add("Where", [inside, flat, ctx.scalar(total, DType.INT64)])
    if weight is None:
        amounts = ctx.add("Expand", [ctx.scalar(1, dtype), ctx.add("Shape", [cells])])
    else:
        amounts = ctx.add("Reshape", [ctx.tensor_as(weight, dtype), ctx.ints([-1])])
    hist = ctx.add("ScatterElements", [ctx.constant(np.zeros(total + 1, dtype=dtype.numpy)),
                                       cells, amounts], axis=0, reduction="add")
    hist = ctx.add("Slice", [hist, ctx.ints([0]), ctx.ints([total])])
    hist = ctx.add("Reshape", [hist, ctx.ints(counts)])
    if not density:
        return hist
    everything = ctx.constant(np.arange(len(counts), dtype=np.int64))
    volume = None
    for d, (dim_edges, bins) in enumerate(zip(edges, counts)):
        view = [1] * len(counts)
        view[d] = bins
        width = ctx.add("Reshape", [_widths(ctx, dim_edges, bins), ctx.ints(view)])
        volume = width if volume is None else ctx.add("Mul", [volume, width])
    return ctx.add("Div", [hist, ctx.add("Mul", [
        ctx.add("ReduceSum", [hist, everything], keepdims=0), volume])])


# ---------------------------------------------------------------------------- mode, segments

def mode(ctx: ImportContext, node, x, dim=-1, keepdim=False) -> list[str]:
    """``mode``: the most frequent value along ``dim`` (the smallest of equally frequent
    ones) and the index of its last occurrence, as PyTorch's CPU kernel gives.  Frequencies
    come from comparing every element with every other along the dim."""
    value = ctx.tensor(x)
    if ctx.rank(x) == 0:
        return [ctx.add("Identity", [value]), ctx.constant(np.array(0, dtype=np.int64))]
    axis, length = _scan_axis(ctx, x, dim)
    if length == 0:
        raise Unsupported("mode along an empty dim")
    dtype = ctx.torch_dtype(x)
    if dtype == DType.BOOL:
        raise Unsupported("mode of bools")
    rank = ctx.rank(x)
    pairs = ctx.add("Equal", [
        ctx.add("Unsqueeze", [value, ctx.constant(np.array([axis + 1], dtype=np.int64))]),
        ctx.add("Unsqueeze", [value, ctx.constant(np.array([axis], dtype=np.int64))])])
    counts = ctx.add("ReduceSum", [ctx.cast(pairs, DType.INT64, DType.BOOL),
                                   ctx.constant(np.array([axis + 1], dtype=np.int64))],
                     keepdims=0)
    axes = ctx.constant(np.array([axis], dtype=np.int64))
    most = ctx.add("Equal", [counts, ctx.add("ReduceMax", [counts, axes], keepdims=1)])
    largest = np.inf if dtype in _FLOATS else np.iinfo(dtype.numpy).max
    result = ctx.add("ReduceMin", [ctx.add("Where", [most, value, ctx.scalar(largest, dtype)]),
                                   axes], keepdims=1)
    shape = [1] * rank
    shape[axis] = length
    positions = ctx.constant(np.arange(length, dtype=np.int64).reshape(shape))
    index = ctx.add("ReduceMax", [ctx.add("Where", [ctx.add("Equal", [value, result]),
                                                    positions, ctx.scalar(-1, DType.INT64)]),
                                  axes], keepdims=int(bool(keepdim)))
    if not keepdim:
        result = ctx.add("Squeeze", [result, axes])
    return [result, index]


_SEGMENT_FILL = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}
_SEGMENT_REDUCE = {"sum": "ReduceSum", "mean": "ReduceSum", "prod": "ReduceProd",
                   "max": "ReduceMax", "min": "ReduceMin"}


def segment_reduce(ctx: ImportContext, node, data, reduce, *, lengths=None, indices=None,
                   offsets=None, axis=0, unsafe=False, initial=None) -> str:
    """``segment_reduce`` along ``axis``: segment s covers the rows from its offset to the
    next (``offsets``), or ``lengths[s]`` rows after the previous segment; the dims before
    ``axis`` have their own segments (lengths and offsets are batched over them).  Every
    segment reduces a masked copy of all rows (a (segments, rows) comparison with the
    boundaries); ``initial`` joins each reduction (the mean divides by the row count only),
    and an empty segment gives it, or what PyTorch gives without (-inf, inf, 0, 1, NaN for
    the mean)."""
    dtype = ctx.out_dtype()
    if dtype not in _FLOATS or reduce not in _SEGMENT_FILL or indices is not None:
        raise Unsupported(f"segment_reduce '{reduce}' of {dtype}")
    shape = ctx.static_shape(data)
    axis = static_int(axis, "segment axis")
    if not 0 <= axis < len(shape):
        raise Unsupported(f"segment_reduce along dim {axis} of rank {len(shape)}")
    rows, rest = shape[axis], len(shape) - axis - 1
    last = ctx.constant(np.array(axis, dtype=np.int64))
    if lengths is not None and ctx.rank(lengths) == axis + 1:
        sizes = ctx.tensor_as(lengths, DType.INT64)
        ends = ctx.add("CumSum", [sizes, last])
        starts = ctx.add("Sub", [ends, sizes])
    elif offsets is not None and ctx.rank(offsets) == axis + 1:
        bounds = ctx.tensor_as(offsets, DType.INT64)
        count = ctx.static_shape(offsets)[axis] - 1
        along = ctx.ints([axis])
        starts = ctx.add("Slice", [bounds, ctx.ints([0]), ctx.ints([count]), along])
        ends = ctx.add("Slice", [bounds, ctx.ints([1]), ctx.ints([count + 1]), along])
    else:
        raise Unsupported("segment_reduce needs lengths or offsets batched like the data")
    # (lead..., segments, rows): whether each row is in each segment
    rows_axis = ctx.constant(np.array([axis + 1], dtype=np.int64))
    row = ctx.constant(np.arange(rows, dtype=np.int64))
    member = ctx.add("And", [
        ctx.add("GreaterOrEqual", [row, ctx.add("Unsqueeze", [starts, rows_axis])]),
        ctx.add("Less", [row, ctx.add("Unsqueeze", [ends, rows_axis])])])
    trailing = ctx.constant(np.arange(axis + 2, axis + 2 + rest, dtype=np.int64))
    mask = ctx.add("Unsqueeze", [member, trailing]) if rest else member
    values = ctx.add("Unsqueeze", [ctx.tensor_as(data, dtype),
                                   ctx.constant(np.array([axis], dtype=np.int64))])
    kept = ctx.add("Where", [mask, values, ctx.scalar(_SEGMENT_FILL[reduce], dtype)])
    result = ctx.add(_SEGMENT_REDUCE[reduce], [kept, rows_axis], keepdims=0)
    start = None if initial is None else ctx.scalar(float(initial), dtype)
    if reduce != "mean":
        if start is None:
            return result
        combine = {"sum": "Add", "prod": "Mul", "max": "Max", "min": "Min"}[reduce]
        return ctx.add(combine, [result, start])
    counts = ctx.add("ReduceSum", [ctx.cast(mask, dtype, DType.BOOL), rows_axis], keepdims=0)
    total = result if start is None else ctx.add("Add", [result, start])
    mean = ctx.add("Div", [total, counts])
    empty = ctx.scalar(float("nan"), dtype) if start is None else start
    return ctx.add("Where", [ctx.add("Equal", [counts, ctx.scalar(0, dtype)]), empty, mean])


def hash_tensor(ctx: ImportContext, node, x, dim=(), *, keepdim=False, mode=0) -> str:
    """``hash_tensor`` (mode 0): the XOR of the elements' 64-bit patterns over ``dim`` (all
    dims when empty), floats widened to float64 and integers to int64 first.  The reduced
    dims are moved last and flattened, padded with zeros (XOR's identity) to a power of two
    and folded in halves."""
    if static_int(mode, "hash_tensor mode") != 0:
        raise Unsupported(f"hash_tensor mode {mode}")
    source = ctx.torch_dtype(x)
    wide = DType.FLOAT64 if source in _FLOATS else DType.INT64
    value = ctx.add("BitCast", [ctx.tensor_as(x, wide)], to=DType.UINT64.onnx)
    shape = ctx.static_shape(x)
    axes = _axes(ctx, x, dims_list(dim))
    if not axes:
        return ctx.add("Identity", [value])
    kept = [a for a in range(len(shape)) if a not in axes]
    count = int(np.prod([shape[a] for a in axes]))
    out_shape = [1 if a in axes else shape[a] for a in range(len(shape))] if keepdim else \
        [shape[a] for a in kept]
    if count == 0:
        return ctx.constant(np.zeros(out_shape, dtype=np.uint64))
    value = ctx.add("Transpose", [value], perm=kept + axes)
    value = ctx.add("Reshape", [value, ctx.ints([shape[a] for a in kept] + [count])])
    width = 1 << (count - 1).bit_length()
    last = len(kept)
    if width != count:
        pads = [0] * (last + 1) + [0] * last + [width - count]
        value = ctx.add("Pad", [value, ctx.ints(pads), ctx.scalar(0, DType.UINT64)],
                        mode="constant")
    along = ctx.ints([last])
    while width > 1:
        width //= 2
        value = ctx.add("BitwiseXor", [
            ctx.add("Slice", [value, ctx.ints([0]), ctx.ints([width]), along]),
            ctx.add("Slice", [value, ctx.ints([width]), ctx.ints([2 * width]), along])])
    return ctx.add("Reshape", [value, ctx.ints(out_shape)])


def dims_list(dim) -> list[int] | None:
    """A dim argument (an int, a list, or None/empty for all dims) as a list or None."""
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)
