"""Pooling: MaxPool (with its Indices output), AveragePool, LpPool, their Global forms, and
MaxUnpool.

Window geometry (kernel, strides, dilations, pads, auto_pad, ceil_mode) is shared with the
convolutions through :class:`ember.ops.conv.Window`.  The references fold one strided view of
the padded input per kernel tap (``window_taps``), so they loop over kernel taps only, never
over output pixels.

Padding semantics follow ONNX: padded positions never win a max, are excluded from an
average unless ``count_include_pad``, and add zero to an Lp sum; in ceil mode, the part of
the last window that lies beyond the end padding is ignored by every pooling kind.

NaN in a MaxPool window.  The ONNX spec says nothing, and its two oracles are not consistent
with themselves: ``onnx.reference`` skips NaNs in its general path (and fails on an all-NaN
window) but keeps a NaN that comes first in a window in its strided/dilated path; ONNX
Runtime skips NaNs in 1-D pools (an all-NaN window gives -FLT_MAX) and its 2-D/3-D kernels
depend on where the NaN falls.  Where the two agree, they skip NaN.  ember's MaxPool therefore
*ignores NaN* (as ``np.fmax``): a window's maximum is that of its numbers, and NaN only when
it holds none.  PyTorch's pooling propagates NaN instead, so the PyTorch frontend sets the
ember attribute ``propagate_nan=1`` (a NaN anywhere in the window wins, as ``np.maximum``).
GlobalMaxPool, ReduceMax and Max keep numpy's propagation (the reference's; ONNX Runtime's
GlobalMaxPool skips NaN).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ember.core.dims import Dim
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.conv import (Plan, Window, compute_dtype, pad_for_windows, pad_spatial,
                            spatial_out_dims, spatial_rank, window_taps)
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import shape_from_constant

POOL_ATTRS = {
    "auto_pad": Attr.string("NOTSET"),
    "ceil_mode": Attr.int(0),
    "dilations": Attr.ints(),
    "kernel_shape": Attr.ints(REQUIRED),
    "pads": Attr.ints(),
    "strides": Attr.ints(),
}

# ----------------------------------------------------------------------------- helpers


def _pool_type(ctx: InferContext, with_indices: bool = False) -> list[ValueType | None]:
    """Output type(s) of a windowed pooling of input 0 (plus int64 indices if asked)."""
    x = ctx.inputs[0]
    if not isinstance(x, TensorType):
        return [None, None]
    kernel = [int(k) for k in ctx.attrs["kernel_shape"]]
    rank = spatial_rank(ctx, x, kernel=kernel)
    if x.shape is not None and rank != len(kernel):
        raise ctx.error(f"kernel_shape {kernel} has {len(kernel)} dims; the input {x} has "
                        f"{rank} spatial dims")
    out = spatial_out_dims(ctx, x, kernel, len(kernel), ceil_mode=bool(ctx.attrs["ceil_mode"]))
    shape = None if x.shape is None else tuple(x.shape[:2]) + tuple(out)
    result = [TensorType(x.dtype, shape)]
    if with_indices:
        result.append(TensorType(DType.INT64, shape))
    return result


def _window(ctx: RefContext, x: np.ndarray, attrs: dict) -> tuple[Window, Plan]:
    """The pooling window of ``attrs`` (the POOL_ATTRS) resolved against ``x``."""
    kernel = attrs["kernel_shape"]
    if x.ndim != len(kernel) + 2:
        raise ctx.error(f"kernel_shape {list(kernel)} needs an input of rank "
                        f"{len(kernel) + 2}, got shape {x.shape}")
    window = Window.from_attrs(ctx, kernel, attrs, ceil_mode=bool(attrs.get("ceil_mode")))
    return window, window.plan(ctx, x.shape[2:])


def _reduce_windows(x: np.ndarray, window: Window, plan: Plan, combine: np.ufunc,
                    fill: float | int = 0) -> np.ndarray:
    """Fold ``combine`` (np.maximum, np.add) over every window of ``x`` padded with ``fill``."""
    taps = window_taps(pad_for_windows(x, window, plan, fill), window, plan)
    result = np.array(next(taps))
    for view in taps:
        combine(result, view, out=result)
    return result


def _counts(spatial: tuple[int, ...], window: Window, plan: Plan,
            include_pad: bool) -> np.ndarray:
    """How many positions of each window an average divides by: those inside the input, or
    inside the input plus its pads when ``include_pad`` (never the ceil-mode overhang)."""
    ones = np.ones((1, 1) + spatial, dtype=np.float64)
    if include_pad:
        ones = pad_spatial(ones, plan.pads_begin, plan.pads_end, 1.0)
        plan = Plan(plan.out, (0,) * window.rank, (0,) * window.rank)
    return _reduce_windows(ones, window, plan, np.add)[0, 0]


# ----------------------------------------------------------------------------- MaxPool


def _lowest(dtype: np.dtype) -> float | int:
    """The padding value that never wins a max."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _max_fill(dtype: np.dtype, propagate_nan: bool) -> float | int:
    """The padding value that never wins a max: the lowest value, or for a float pool that
    ignores NaN, NaN itself (ignored like the input's NaNs, so a window of padding and NaNs
    is NaN)."""
    if _floating(dtype) and not propagate_nan:
        return np.nan
    return _lowest(dtype)


def _floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds NaNs (numpy's floats and ml_dtypes' bfloat16, kind 'V')."""
    return dtype.kind not in "iub"


def _max_with_taps(x: np.ndarray, window: Window, plan: Plan,
                   propagate_nan: bool) -> tuple[np.ndarray, np.ndarray]:
    """Window maxima and, for each, the kernel tap it came from (the first one on ties).

    With ``propagate_nan`` the first NaN wins, as in ``np.maximum`` (the path without
    indices); without, NaN never wins over a number (``np.fmax``) and an all-NaN window
    points at its first tap.
    """
    taps = window_taps(pad_for_windows(x, window, plan, _max_fill(x.dtype, propagate_nan)),
                       window, plan)
    best = np.array(next(taps))
    best_tap = np.zeros(best.shape, dtype=np.int64)
    floating = _floating(x.dtype)
    for k, view in enumerate(taps, start=1):
        better = view > best
        if floating and propagate_nan:
            better |= np.isnan(view) & ~np.isnan(best)
        elif floating:
            better |= np.isnan(best) & ~np.isnan(view)
        np.copyto(best, view, where=better)
        best_tap[better] = k
    return best, best_tap


def _flat_indices(x_shape: tuple[int, ...], window: Window, plan: Plan, best_tap: np.ndarray,
                  storage_order: int) -> np.ndarray:
    """Flat input index (over N, C and the spatial axes) of the element each tap reads."""
    n, c = x_shape[:2]
    spatial = x_shape[2:]
    rank = window.rank
    taps = np.unravel_index(best_tap, window.kernel)
    coords = []
    for axis in range(rank):
        starts = np.arange(plan.out[axis]) * window.strides[axis] - plan.pads_begin[axis]
        starts = starts.reshape((-1,) + (1,) * (rank - 1 - axis))
        coords.append(np.clip(starts + taps[axis] * window.dilations[axis], 0,
                              spatial[axis] - 1))
    axes = reversed(range(rank)) if storage_order else range(rank)  # column or row major
    index = np.zeros(best_tap.shape, dtype=np.int64)
    for axis in axes:
        index = index * spatial[axis] + coords[axis]
    plane = int(np.prod(spatial))
    return np.arange(n * c, dtype=np.int64).reshape((n, c) + (1,) * rank) * plane + index


@op("MaxPool", family="pool", infer=lambda ctx: _pool_type(ctx, with_indices=True),
    attrs={**POOL_ATTRS, "storage_order": Attr.int(0), "propagate_nan": Attr.int(0)},
    outputs=(1, 2))
def max_pool(ctx, x, *, storage_order, propagate_nan, **window_attrs):
    """Maximum over each window; optionally the flat input index of each maximum.

    NaNs are ignored unless ``propagate_nan`` (an ember attribute: see the module doc)."""
    window, plan = _window(ctx, x, window_attrs)
    propagate = bool(propagate_nan)
    if not ctx.output_requested(1):
        combine = np.fmax if _floating(x.dtype) and not propagate else np.maximum
        return _reduce_windows(x, window, plan, combine, _max_fill(x.dtype, propagate))
    y, best_tap = _max_with_taps(x, window, plan, propagate)
    return y, _flat_indices(x.shape, window, plan, best_tap, storage_order)


# ----------------------------------------------------------------------------- AveragePool


@op("AveragePool", family="pool", infer=_pool_type,
    attrs={**POOL_ATTRS, "count_include_pad": Attr.int(0)})
def average_pool(ctx, x, *, count_include_pad, **window_attrs):
    """Mean over each window, of the input elements only unless count_include_pad."""
    window, plan = _window(ctx, x, window_attrs)
    acc = compute_dtype(x.dtype)
    sums = _reduce_windows(x.astype(acc, copy=False), window, plan, np.add)
    counts = _counts(x.shape[2:], window, plan, bool(count_include_pad))
    return (sums / counts.astype(acc)).astype(x.dtype)


# ----------------------------------------------------------------------------- LpPool


def _lp_power(x: np.ndarray, p: int) -> np.ndarray:
    """|x|^p in the accumulation type."""
    x = x.astype(compute_dtype(x.dtype), copy=False)
    return np.square(x) if p == 2 else np.power(np.abs(x), p)


def _lp_root(sums: np.ndarray, p: int) -> np.ndarray:
    return np.sqrt(sums) if p == 2 else np.power(sums, 1.0 / p)


@op("LpPool", family="pool", infer=_pool_type, attrs={**POOL_ATTRS, "p": Attr.int(2)})
def lp_pool(ctx, x, *, p, **window_attrs):
    """Lp norm of each window; padding contributes zeros."""
    if p < 1:
        raise ctx.error(f"p must be a positive integer, got {p}")
    window, plan = _window(ctx, x, window_attrs)
    sums = _reduce_windows(_lp_power(x, p), window, plan, np.add)
    return _lp_root(sums, p).astype(x.dtype)


# ----------------------------------------------------------------------------- global pools


def _global_type(ctx: InferContext) -> list[ValueType | None]:
    x = ctx.inputs[0]
    if not isinstance(x, TensorType):
        return [None]
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    if len(x.shape) < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, spatial...), got {x}")
    return [TensorType(x.dtype, tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2))]


def _spatial_axes(ctx: RefContext, x: np.ndarray) -> tuple[int, ...]:
    if x.ndim < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, spatial...), got shape {x.shape}")
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", family="pool", infer=_global_type)
def global_average_pool(ctx, x):
    """Mean over all spatial axes, kept as size-1 dims."""
    axes = _spatial_axes(ctx, x)
    return x.astype(compute_dtype(x.dtype)).mean(axis=axes, keepdims=True).astype(x.dtype)


@op("GlobalMaxPool", family="pool", infer=_global_type)
def global_max_pool(ctx, x):
    """Maximum over all spatial axes, kept as size-1 dims."""
    return x.max(axis=_spatial_axes(ctx, x), keepdims=True)


@op("GlobalLpPool", family="pool", infer=_global_type, attrs={"p": Attr.int(2)})
def global_lp_pool(ctx, x, *, p):
    """Lp norm over all spatial axes, kept as size-1 dims."""
    if p < 1:
        raise ctx.error(f"p must be a positive integer, got {p}")
    sums = _lp_power(x, p).sum(axis=_spatial_axes(ctx, x), keepdims=True)
    return _lp_root(sums, p).astype(x.dtype)


# ----------------------------------------------------------------------------- MaxUnpool


def _unpool_dims(in_dims: Sequence[Dim], window: Window) -> list[Dim]:
    """Spatial dims MaxPool's input had: the inverse of its output-size formula."""
    rank, pads = window.rank, window.pads
    return [None if d is None else (d - 1) * s - (pads[i] + pads[i + rank]) + k
            for i, (d, k, s) in enumerate(zip(in_dims, window.kernel, window.strides))]


def _unpool_window(ctx: InferContext | RefContext, rank: int, attrs: dict) -> Window:
    window = Window.from_attrs(ctx, attrs["kernel_shape"], attrs)
    if rank != window.rank:
        raise ctx.error(f"kernel_shape {list(window.kernel)} needs {window.rank} spatial dims, "
                        f"the input has {rank}")
    return window


def _max_unpool_type(ctx: InferContext) -> list[ValueType | None]:
    x = ctx.inputs[0]
    if not isinstance(x, TensorType):
        return [None]
    if ctx.has_input(2):
        value = ctx.value(2)
        shape_type = ctx.inputs[2]
        rank = None
        if isinstance(shape_type, TensorType) and shape_type.shape is not None \
                and len(shape_type.shape) == 1 and isinstance(shape_type.shape[0], int):
            rank = shape_type.shape[0]
        return [TensorType(x.dtype, shape_from_constant(value, rank)
                           if value is not None or rank is not None else None)]
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    dims = _unpool_dims(x.shape[2:], _unpool_window(ctx, len(x.shape) - 2, ctx.attrs))
    return [TensorType(x.dtype, tuple(x.shape[:2]) + tuple(dims))]


@op("MaxUnpool", family="pool", infer=_max_unpool_type,
    attrs={"kernel_shape": Attr.ints(REQUIRED), "pads": Attr.ints(), "strides": Attr.ints()})
def max_unpool(ctx, x, indices, output_shape=None, *, kernel_shape, pads, strides):
    """Scatter X to the positions MaxPool's indices name; zeros elsewhere.

    As in the ONNX reference and backend suite, indices address the unpooled shape implied by
    kernel, strides and pads; a larger ``output_shape`` extends it with zeros at the end.
    """
    if indices.shape != x.shape:
        raise ctx.error(f"indices {indices.shape} must have the shape of X {x.shape}")
    window = _unpool_window(ctx, x.ndim - 2, dict(kernel_shape=kernel_shape, strides=strides,
                                                  pads=pads))
    implied = tuple(x.shape[:2]) + tuple(_unpool_dims(x.shape[2:], window))
    size = int(np.prod(implied))
    flat_indices = indices.reshape(-1).astype(np.int64)
    if flat_indices.size and (flat_indices.min() < 0 or flat_indices.max() >= size):
        raise ctx.error(f"indices must lie in [0, {size}) for the unpooled shape {implied}")
    y = np.zeros(size, dtype=x.dtype)
    y[flat_indices] = x.reshape(-1)
    y = y.reshape(implied)
    if output_shape is None:
        return y
    target = tuple(int(d) for d in np.asarray(output_shape).reshape(-1))
    if len(target) != x.ndim or any(t < i for t, i in zip(target, implied)):
        raise ctx.error(f"output_shape {list(target)} must have rank {x.ndim} and be at least "
                        f"the unpooled shape {list(implied)}")
    out = np.zeros(target, dtype=x.dtype)
    out[tuple(slice(0, d) for d in implied)] = y
    return out
