"""Reductions: the Reduce* ops, ArgMax/ArgMin and the cumulative CumSum/CumProd.

The Reduce* ops take their axes as an optional second input (newest opsets; the frontend
moves the older ``axes`` attribute there).  Without axes they reduce over every axis, unless
``noop_with_empty_axes`` is set: then the reduction itself is the identity, but composite
reductions still apply their elementwise steps (ReduceSumSquare squares, ReduceLogSum takes
the log).  Reducing an empty set yields the identity of the reduction (0 for sums, 1 for
ReduceProd, -inf/+inf or the dtype's extreme for ReduceMax/ReduceMin, -inf for the log sums).

Half-precision floats are accumulated in float32 and rounded once at the end.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ember.core.dims import Dim
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape_infer import normalize_axis, tensor_input

# ----------------------------------------------------------------------------- shared helpers


def widened(x: np.ndarray) -> np.ndarray:
    """``x`` in a dtype fit for accumulating: float32 for floats narrower than 32 bits."""
    if x.dtype == object or x.dtype.kind in "iub":
        return x
    if x.dtype.itemsize < 4 and DType.from_numpy(x.dtype).is_float:
        return x.astype(np.float32)
    return x


def normalize_axes(ctx, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """``axes`` made non-negative and sorted; out-of-range or repeated axes are errors."""
    normalized = [normalize_axis(int(a), rank, ctx) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"axes {list(axes)} name the same axis twice")
    return tuple(sorted(normalized))


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """``shape`` with ``axes`` set to 1 (``keepdims``) or removed."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduction_axes(ctx, rank: int, axes: Sequence[int], noop_with_empty_axes: int
                    ) -> tuple[int, ...]:
    """The axes a Reduce* op runs over: () for the no-op case, every axis when none given."""
    if len(axes) == 0:
        return () if noop_with_empty_axes else tuple(range(rank))
    if rank == 0:
        # A scalar has nothing to reduce; axis 0 is accepted, as numpy does.
        normalize_axes(ctx, axes, 0)
        return ()
    return normalize_axes(ctx, axes, rank)


def _axes_list(axes: np.ndarray | None) -> list[int]:
    return [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


# ----------------------------------------------------------------------------- Reduce*

_REDUCE_ATTRS = {"keepdims": Attr.int(1), "noop_with_empty_axes": Attr.int(0)}

# compute(x, axes, keepdims) on the widened input; the result is cast back to x's dtype.
ReduceFn = Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]


def _infer_reduce(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    keepdims = bool(ctx.attrs["keepdims"])
    noop = bool(ctx.attrs["noop_with_empty_axes"])
    axes_value = ctx.value(1)
    axes: list[int] | None = []
    if ctx.has_input(1):
        axes_type = ctx.inputs[1]
        empty_axes = (isinstance(axes_type, TensorType) and axes_type.shape is not None
                      and axes_type.shape == (0,))
        if empty_axes:
            axes = []
        elif axes_value is None or any(not isinstance(a, (int, np.integer))
                                       for a in np.asarray(axes_value).reshape(-1)):
            axes = None  # only known at run time
        else:
            axes = _axes_list(axes_value)
    if axes is None:
        return [data.with_shape(_shape_for_unknown_axes(ctx, data, keepdims))]
    if data.shape is None:
        if not axes and noop:
            return [data]
        if not axes and not keepdims:
            return [data.with_shape(())]
        return [data.with_shape(None)]
    reduced = _reduction_axes(ctx, len(data.shape), axes, noop)
    return [data.with_shape(reduced_shape(data.shape, reduced, keepdims))]


def _shape_for_unknown_axes(ctx: InferContext, data: TensorType, keepdims: bool
                            ) -> tuple[Dim, ...] | None:
    """Output shape of a reduction whose axes input is computed at run time."""
    if data.shape is None:
        return None
    if keepdims:  # each dim is kept or becomes 1: only dims that already are 1 are known
        return tuple(1 if d == 1 else None for d in data.shape)
    axes_type = ctx.inputs[1]
    if isinstance(axes_type, TensorType) and axes_type.shape is not None \
            and len(axes_type.shape) == 1 and isinstance(axes_type.shape[0], int):
        return (None,) * max(len(data.shape) - axes_type.shape[0], 0)
    return None


def _register_reduce(name: str, compute: ReduceFn, doc: str) -> None:
    def reference(ctx, data, axes=None, *, keepdims, noop_with_empty_axes):
        reduced = _reduction_axes(ctx, data.ndim, _axes_list(axes), noop_with_empty_axes)
        result = compute(widened(data), reduced, bool(keepdims))
        return np.asarray(result).astype(data.dtype, copy=False)

    reference.__name__ = name
    reference.__doc__ = doc
    op(name, family="reduce", infer=_infer_reduce, attrs=_REDUCE_ATTRS)(reference)


def _count(x: np.ndarray, axes: tuple[int, ...]) -> int:
    return int(np.prod([x.shape[a] for a in axes], dtype=np.int64))


def _sum(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims)


def _mean(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # Integers: the float quotient truncated toward zero (the cast back does the truncation).
    return np.true_divide(_sum(x, axes, keepdims), _count(x, axes))


def _lowest(dtype: np.dtype):
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _highest(dtype: np.dtype):
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        return np.iinfo(dtype).max
    return np.inf


def _max(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    initial = {"initial": _lowest(x.dtype)} if x.size == 0 else {}
    return np.max(x, axis=axes, keepdims=keepdims, **initial)


def _min(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    initial = {"initial": _highest(x.dtype)} if x.size == 0 else {}
    return np.min(x, axis=axes, keepdims=keepdims, **initial)


def _prod(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    # Also folds shape values (object arrays of ints and SymDims) during shape inference.
    return np.prod(x, axis=axes, keepdims=keepdims)


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    peak = _max(x, axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0).astype(x.dtype)  # all -inf or an inf: no shift
    total = np.sum(np.exp(x - peak), axis=axes, keepdims=True)
    result = np.log(total) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


_register_reduce("ReduceSum", _sum, "Sum over the axes.")
_register_reduce("ReduceMean", _mean, "Arithmetic mean over the axes.")
_register_reduce("ReduceMax", _max, "Maximum over the axes (False < True for bool).")
_register_reduce("ReduceMin", _min, "Minimum over the axes (False < True for bool).")
_register_reduce("ReduceProd", _prod, "Product over the axes.")
_register_reduce("ReduceL1", lambda x, a, k: _sum(np.abs(x), a, k), "Sum of |x| over the axes.")
_register_reduce("ReduceL2", lambda x, a, k: np.sqrt(_sum(x * x, a, k)),
                 "Euclidean norm over the axes.")
_register_reduce("ReduceSumSquare", lambda x, a, k: _sum(x * x, a, k),
                 "Sum of x**2 over the axes.")
_register_reduce("ReduceLogSum", lambda x, a, k: np.log(_sum(x, a, k)),
                 "log of the sum over the axes.")
_register_reduce("ReduceLogSumExp", _log_sum_exp,
                 "log(sum(exp(x))) over the axes, computed without overflow.")


# ----------------------------------------------------------------------------- ArgMax, ArgMin

_ARG_ATTRS = {"axis": Attr.int(0), "keepdims": Attr.int(1), "select_last_index": Attr.int(0)}


def _infer_arg(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(DType.INT64, None)]
    if not data.shape:
        raise ctx.error("the input must have rank >= 1")
    axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
    return [TensorType(DType.INT64, reduced_shape(data.shape, (axis,),
                                                  bool(ctx.attrs["keepdims"])))]


def _arg_extreme(ctx, data: np.ndarray, axis: int, keepdims: int, select_last_index: int,
                 pick: Callable[..., np.ndarray]) -> np.ndarray:
    """Index of the first (or last) extreme along ``axis``, as int64."""
    if data.ndim == 0:
        raise ctx.error("the input must have rank >= 1")
    axis = normalize_axis(axis, data.ndim, ctx)
    length = data.shape[axis]
    if length == 0:
        raise ctx.error(f"axis {axis} has length 0: there is no index to return")
    values = widened(data)
    if select_last_index:
        index = length - 1 - pick(np.flip(values, axis), axis=axis)
    else:
        index = pick(values, axis=axis)
    if keepdims:
        index = np.expand_dims(index, axis)
    return np.asarray(index, dtype=np.int64)


@op("ArgMax", family="reduce", infer=_infer_arg, attrs=_ARG_ATTRS)
def arg_max(ctx, data, *, axis, keepdims, select_last_index):
    """Index of the maximum along ``axis`` (first one, or last with select_last_index)."""
    return _arg_extreme(ctx, data, axis, keepdims, select_last_index, np.argmax)


@op("ArgMin", family="reduce", infer=_infer_arg, attrs=_ARG_ATTRS)
def arg_min(ctx, data, *, axis, keepdims, select_last_index):
    """Index of the minimum along ``axis`` (first one, or last with select_last_index)."""
    return _arg_extreme(ctx, data, axis, keepdims, select_last_index, np.argmin)


# ----------------------------------------------------------------------------- CumSum, CumProd

_CUMULATIVE_ATTRS = {"exclusive": Attr.int(0), "reverse": Attr.int(0)}


def _scalar_axis(ctx, axis: np.ndarray, rank: int) -> int:
    values = np.asarray(axis).reshape(-1)
    if values.size != 1:
        raise ctx.error(f"the axis input must hold one integer, got shape {np.shape(axis)}")
    if rank == 0:
        raise ctx.error("the input must have rank >= 1")
    return normalize_axis(int(values[0]), rank, ctx)


def _infer_cumulative(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    axis = ctx.value(1)
    if x.shape is not None and axis is not None:
        _scalar_axis(ctx, axis, len(x.shape))
    return [x]


def _cumulative(ctx, x: np.ndarray, axis: np.ndarray, exclusive: int, reverse: int,
                ufunc: np.ufunc) -> np.ndarray:
    """Running ``ufunc`` (add or multiply) along ``axis``."""
    axis = _scalar_axis(ctx, axis, x.ndim)
    if x.shape[axis] == 0:
        return x.copy()
    work = widened(x)
    if reverse:
        work = np.flip(work, axis)
    result = ufunc.accumulate(work, axis=axis, dtype=work.dtype)
    if exclusive:  # shift by one along the axis, the identity entering first
        head = [slice(None)] * x.ndim
        head[axis] = slice(0, 1)
        body = [slice(None)] * x.ndim
        body[axis] = slice(0, -1)
        identity = np.full_like(result[tuple(head)], ufunc.identity)
        result = np.concatenate([identity, result[tuple(body)]], axis=axis)
    if reverse:
        result = np.flip(result, axis)
    return result.astype(x.dtype, copy=False)


@op("CumSum", family="reduce", infer=_infer_cumulative, attrs=_CUMULATIVE_ATTRS)
def cum_sum(ctx, x, axis, *, exclusive, reverse):
    """Running sum along ``axis`` (optionally exclusive and/or from the end)."""
    return _cumulative(ctx, x, axis, exclusive, reverse, np.add)


@op("CumProd", family="reduce", infer=_infer_cumulative, attrs=_CUMULATIVE_ATTRS)
def cum_prod(ctx, x, axis, *, exclusive, reverse):
    """Running product along ``axis`` (optionally exclusive and/or from the end)."""
    return _cumulative(ctx, x, axis, exclusive, reverse, np.multiply)
