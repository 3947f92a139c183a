"""Indexing ops: reading and writing elements at computed positions.

* gathers: Gather, GatherElements, GatherND, Compress;
* scatters: ScatterElements, ScatterND (with reductions), TensorScatter (KV-cache update);
* data-dependent selections: NonZero, Unique, TopK;
* position-based masks and reorderings: OneHot, Trilu, ReverseSequence.

Indices may be negative (counted from the end) wherever ONNX allows it; an index out of range
is an error naming the node rather than a numpy IndexError.  Output sizes that depend on the
data (NonZero, Unique, Compress) are unknown dims in shape inference.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ember.core.traced import is_traced
from ember.core.dims import Dim, dim_product
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape import Ctx, Shape, check_attr, known_ints, scalar_int
from ember.ops.shape_infer import normalize_axis, tensor_input

# ----------------------------------------------------------------------------- helpers


def normalized_indices(ctx: Ctx, indices: np.ndarray, dim: int, what: str) -> np.ndarray:
    """Integer ``indices`` into a dim of size ``dim`` with negatives wrapped; out of range is an
    error."""
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise ctx.error(f"{what} must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64)
    # (Python ints against the dim: a run-time dim of a traced build decides with guards)
    if idx.size and (int(idx.min()) < -dim or int(idx.max()) >= dim):
        bad = next(i for i in idx.reshape(-1).tolist() if i < -dim or i >= dim)
        raise ctx.error(f"{what} {bad} is out of range for a dim of size {dim}")
    if not bool((idx < 0).any()):
        return idx
    if is_traced(dim):
        return np.array([i + dim if i < 0 else i for i in idx.reshape(-1).tolist()],
                        dtype=object).reshape(idx.shape)
    return np.where(idx < 0, idx + dim, idx)


def _element_coords(ctx: Ctx, data_shape: Sequence[int], indices: np.ndarray, axis: int
                    ) -> tuple[np.ndarray, ...]:
    """Index arrays addressing ``data[..., indices[i], ...]`` element by element along ``axis``
    (GatherElements/ScatterElements); the other coordinates are the element's own."""
    if indices.ndim != len(data_shape):
        raise ctx.error(f"indices have rank {indices.ndim}, data has rank {len(data_shape)}")
    for i, (n, limit) in enumerate(zip(indices.shape, data_shape)):
        if i != axis and n > limit:
            raise ctx.error(f"indices shape {list(indices.shape)} exceeds data shape "
                            f"{list(data_shape)} in dim {i}")
    coords = list(np.ix_(*[np.arange(n) for n in indices.shape])) if indices.ndim else []
    coords[axis] = normalized_indices(ctx, indices, data_shape[axis], "index")
    return tuple(coords)


def _tuple_coords(ctx: Ctx, data_shape: Sequence[int], indices: np.ndarray
                  ) -> tuple[np.ndarray, ...]:
    """The last axis of ``indices`` as k index arrays into the first k dims of data (ND ops)."""
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim == 0 or k > len(data_shape):
        raise ctx.error(f"indices of shape {list(indices.shape)} cannot index data of rank "
                        f"{len(data_shape)}: their last dim must be at most the data rank")
    return tuple(normalized_indices(ctx, indices[..., j], data_shape[j], f"index (dim {j})")
                 for j in range(k))


_REDUCTIONS = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter(out: np.ndarray, coords: tuple[np.ndarray, ...], updates: np.ndarray,
             reduction: str) -> np.ndarray:
    """Write (or combine with ``reduction``) ``updates`` into ``out`` at ``coords``."""
    ufunc = _REDUCTIONS[reduction]
    if ufunc is None:
        out[coords] = updates
    else:
        ufunc.at(out, coords, updates)
    return out


def _axis_dim_type(data: TensorType, axis: int, dim: Dim) -> TensorType:
    """data's type with dim ``axis`` replaced."""
    assert data.shape is not None
    return TensorType(data.dtype, data.shape[:axis] + (dim,) + data.shape[axis + 1:])


# ----------------------------------------------------------------------------- Gather


def check_constant_indices(ctx: InferContext, input_index: int, dims: Sequence[Dim],
                           what: str = "index") -> None:
    """Range-check a constant index input at compile time (out of range is an error in ONNX).

    ``dims`` are the sizes the indices address: one dim for Gather-like ops, or one per
    component of the index tuples in the last axis (GatherND/ScatterND).  Dims that are not
    static yet are skipped; run-time indices are checked by the compiled model instead."""
    known = ctx.value(input_index)
    if known is None or np.asarray(known).dtype.kind not in "iu":
        return
    known = np.asarray(known)
    if len(dims) == 1:
        if isinstance(dims[0], int):
            normalized_indices(ctx, known, dims[0], what)
        return
    if known.ndim == 0 or known.shape[-1] > len(dims):
        return  # the op's own inference reports the shape problem
    for component in range(known.shape[-1]):
        if isinstance(dims[component], int):
            normalized_indices(ctx, known[..., component], dims[component],
                               f"{what} (component {component})")


def _infer_gather(ctx: InferContext) -> list[ValueType | None]:
    data, indices = tensor_input(ctx, 0), tensor_input(ctx, 1)
    if data.shape is not None and not data.shape:
        raise ctx.error("cannot gather from a scalar")
    if data.shape is None or indices.shape is None:
        return [TensorType(data.dtype, None)]
    axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
    check_constant_indices(ctx, 1, [data.shape[axis]])
    return [TensorType(data.dtype, data.shape[:axis] + indices.shape + data.shape[axis + 1:])]


@op("Gather", family="indexing", infer=_infer_gather, attrs={"axis": Attr.int(0)})
def gather(ctx, data, indices, *, axis):
    """The slices of data along ``axis`` at ``indices``: data[..., indices, ...]."""
    if data.ndim == 0:
        raise ctx.error("cannot gather from a scalar")
    axis = normalize_axis(axis, data.ndim, ctx)
    idx = normalized_indices(ctx, indices, data.shape[axis], "index")
    return np.asarray(np.take(data, idx, axis=axis), dtype=data.dtype)


def _infer_gather_elements(ctx: InferContext) -> list[ValueType | None]:
    data, indices = tensor_input(ctx, 0), tensor_input(ctx, 1)
    if data.shape is not None:
        axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
        if indices.shape is not None and len(indices.shape) != len(data.shape):
            raise ctx.error(f"indices have rank {len(indices.shape)}, data has rank "
                            f"{len(data.shape)}")
        check_constant_indices(ctx, 1, [data.shape[axis]])
    return [TensorType(data.dtype, indices.shape)]


@op("GatherElements", family="indexing", infer=_infer_gather_elements,
    attrs={"axis": Attr.int(0)})
def gather_elements(ctx, data, indices, *, axis):
    """out[i][j] = data[indices[i][j]][j] (for axis 0): one element per index."""
    axis = normalize_axis(axis, data.ndim, ctx)
    return data[_element_coords(ctx, data.shape, np.asarray(indices), axis)]


def _check_tuple_length(ctx: Ctx, k: int) -> None:
    """ONNX requires index tuples of at least one component (the last dim of indices)."""
    if k < 1:
        raise ctx.error("the last dim of indices (the length of each index tuple) is 0; "
                        "GatherND needs at least one component per tuple")


def _infer_gather_nd(ctx: InferContext) -> list[ValueType | None]:
    data, indices = tensor_input(ctx, 0), tensor_input(ctx, 1)
    batch = ctx.attrs["batch_dims"]
    if data.shape is None or indices.shape is None or not indices.shape:
        return [TensorType(data.dtype, None)]
    k = indices.shape[-1]
    if not isinstance(k, int):
        return [TensorType(data.dtype, None)]
    _check_tuple_length(ctx, k)
    if batch + k > len(data.shape):
        raise ctx.error(f"batch_dims ({batch}) + index length ({k}) exceed the data rank "
                        f"({len(data.shape)})")
    check_constant_indices(ctx, 1, data.shape[batch:batch + k])
    return [TensorType(data.dtype, indices.shape[:-1] + data.shape[batch + k:])]


@op("GatherND", family="indexing", infer=_infer_gather_nd, attrs={"batch_dims": Attr.int(0)})
def gather_nd(ctx, data, indices, *, batch_dims):
    """Slices of data addressed by the index tuples in the last dim of ``indices``."""
    indices = np.asarray(indices)
    b = batch_dims
    if b < 0 or b >= min(data.ndim, indices.ndim):
        raise ctx.error(f"batch_dims={b} must be less than the ranks of data ({data.ndim}) "
                        f"and indices ({indices.ndim})")
    if data.shape[:b] != indices.shape[:b]:
        raise ctx.error(f"the first {b} (batch) dims of data {list(data.shape)} and indices "
                        f"{list(indices.shape)} differ")
    _check_tuple_length(ctx, indices.shape[-1])
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    flat_data = data.reshape((batch,) + data.shape[b:])
    flat_indices = indices.reshape((batch, -1, indices.shape[-1]))
    coords = _tuple_coords(ctx, flat_data.shape[1:], flat_indices)
    picked = flat_data[(np.arange(batch)[:, None],) + coords]
    return picked.reshape(indices.shape[:-1] + picked.shape[2:])


# ----------------------------------------------------------------------------- Scatter

_REDUCTION_ATTR = {"reduction": Attr.string("none")}


def _infer_scatter(ctx: InferContext) -> list[ValueType | None]:
    check_attr(ctx, "reduction", ctx.attrs["reduction"], tuple(_REDUCTIONS))
    data = tensor_input(ctx, 0)
    if data.shape is not None and "axis" in ctx.attrs:
        axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
        check_constant_indices(ctx, 1, [data.shape[axis]])
    elif data.shape is not None:  # ScatterND: index tuples address the leading dims
        check_constant_indices(ctx, 1, data.shape)
    return [data]


@op("ScatterElements", family="indexing", infer=_infer_scatter,
    attrs={"axis": Attr.int(0), **_REDUCTION_ATTR})
def scatter_elements(ctx, data, indices, updates, *, axis, reduction):
    """A copy of data with out[indices[i][j]][j] = updates[i][j] (axis 0), or reduced into."""
    check_attr(ctx, "reduction", reduction, tuple(_REDUCTIONS))
    axis = normalize_axis(axis, data.ndim, ctx)
    indices = np.asarray(indices)
    if updates.shape != indices.shape:
        raise ctx.error(f"updates shape {list(updates.shape)} differs from indices shape "
                        f"{list(indices.shape)}")
    coords = _element_coords(ctx, data.shape, indices, axis)
    return _scatter(data.copy(), coords, updates, reduction)


@op("ScatterND", family="indexing", infer=_infer_scatter, attrs=dict(_REDUCTION_ATTR))
def scatter_nd(ctx, data, indices, updates, *, reduction):
    """A copy of data with the slices at the index tuples replaced by (or reduced with) updates."""
    check_attr(ctx, "reduction", reduction, tuple(_REDUCTIONS))
    indices = np.asarray(indices)
    coords = _tuple_coords(ctx, data.shape, indices)
    expected = indices.shape[:-1] + data.shape[len(coords):]
    if updates.shape != expected:
        raise ctx.error(f"updates shape {list(updates.shape)} must be {list(expected)} "
                        f"(indices.shape[:-1] + data.shape[k:])")
    return _scatter(data.copy(), coords, updates, reduction)


def _infer_tensor_scatter(ctx: InferContext) -> list[ValueType | None]:
    check_attr(ctx, "mode", ctx.attrs["mode"], ("linear", "circular"))
    cache = tensor_input(ctx, 0)
    if cache.shape is not None:
        _cache_axis(ctx, ctx.attrs["axis"], len(cache.shape))
    return [cache]


def _cache_axis(ctx: Ctx, axis: int, rank: int) -> int:
    axis = normalize_axis(axis, rank, ctx)
    if axis == 0:
        raise ctx.error("axis cannot be 0, the batch dim")
    return axis


@op("TensorScatter", family="indexing", infer=_infer_tensor_scatter,
    attrs={"axis": Attr.int(-2), "mode": Attr.string("linear")})
def tensor_scatter(ctx, past_cache, update, write_indices=None, *, axis, mode):
    """past_cache with update written along ``axis`` from each batch's write index (KV cache)."""
    check_attr(ctx, "mode", mode, ("linear", "circular"))
    axis = _cache_axis(ctx, axis, past_cache.ndim)
    if update.ndim != past_cache.ndim or any(
            u != c for i, (u, c) in enumerate(zip(update.shape, past_cache.shape)) if i != axis):
        raise ctx.error(f"update shape {list(update.shape)} must match the cache shape "
                        f"{list(past_cache.shape)} except in the sequence axis {axis}")
    batch, length = past_cache.shape[0], past_cache.shape[axis]
    seq = update.shape[axis]
    starts = (np.zeros(batch, np.int64) if write_indices is None
              else np.asarray(write_indices, dtype=np.int64).reshape(-1))
    if starts.shape != (batch,):
        raise ctx.error(f"write_indices must hold one index per batch ({batch}), "
                        f"got {starts.size}")
    positions = starts[:, None] + np.arange(seq)[None, :]
    if mode == "circular":
        positions %= max(length, 1)
    elif positions.size and (positions.min() < 0 or positions.max() >= length):
        raise ctx.error(f"linear mode writes past the cache: write index + update length must "
                        f"be at most {length}")
    out = np.moveaxis(past_cache.copy(), axis, 1)
    moved = np.moveaxis(update, axis, 1)
    out[np.arange(batch)[:, None], positions] = moved
    return np.moveaxis(out, 1, axis)


# ----------------------------------------------------------------------------- selections


def _infer_compress(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    axis = ctx.attrs["axis"]
    if axis is None:
        return [TensorType(data.dtype, (None,))]
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    axis = normalize_axis(axis, len(data.shape), ctx)
    condition = ctx.value(1)
    kept = None if condition is None else int(np.count_nonzero(condition))
    return [_axis_dim_type(data, axis, kept)]


@op("Compress", family="indexing", infer=_infer_compress, attrs={"axis": Attr.int()})
def compress(ctx, data, condition, *, axis):
    """The slices of data along ``axis`` (elements of flattened data) where condition is true."""
    keep = np.asarray(condition).astype(bool).reshape(-1)
    if axis is None:
        data, axis = data.reshape(-1), 0
    axis = normalize_axis(axis, data.ndim, ctx)
    dim = data.shape[axis]
    if keep.size > dim:
        if keep[dim:].any():
            raise ctx.error(f"condition selects index {dim + int(np.argmax(keep[dim:]))} "
                            f"beyond the {dim} entries of the axis")
        keep = keep[:dim]
    return np.compress(keep, data, axis=axis)


def _infer_nonzero(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    rank = None if data.shape is None else len(data.shape)
    return [TensorType(DType.INT64, (rank, None))]


@op("NonZero", family="indexing", infer=_infer_nonzero)
def nonzero(ctx, data):
    """The indices of the non-zero elements, one column per element: shape (rank, count)."""
    if data.ndim == 0:
        return np.zeros((0, int(bool(data))), dtype=np.int64)
    return np.array(np.nonzero(data), dtype=np.int64).reshape(data.ndim, -1)


def _unique_groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable ascending order of the rows of ``keys`` and where each group of equal rows starts.

    NaNs compare equal to each other, as numpy.unique does.
    """
    if keys.shape[1] == 0:  # slices without elements are all equal
        order = np.arange(len(keys))
    elif keys.shape[1] == 1:
        order = np.argsort(keys[:, 0], kind="stable")
    else:
        order = np.lexsort(keys.T[::-1])
    ranked = keys[order]
    same = np.asarray(ranked[1:] == ranked[:-1], dtype=bool)
    if _may_hold_nan(ranked.dtype):
        same |= np.isnan(ranked[1:]) & np.isnan(ranked[:-1])
    new_group = np.concatenate([[len(ranked) > 0], ~same.all(axis=1)])
    return order, np.flatnonzero(new_group)


def _may_hold_nan(dtype: np.dtype) -> bool:
    return dtype.kind == "c" or (dtype != object and DType.from_numpy(dtype).is_float)


def _infer_unique(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    axis = ctx.attrs["axis"]
    if axis is None:
        values: Shape | None = (None,)
        total = None if data.shape is None else dim_product(data.shape)
    elif data.shape is None:
        values, total = None, None
    else:
        axis = normalize_axis(axis, len(data.shape), ctx)
        values = data.shape[:axis] + (None,) + data.shape[axis + 1:]
        total = data.shape[axis]
    return [TensorType(data.dtype, values), TensorType(DType.INT64, (None,)),
            TensorType(DType.INT64, (total,)), TensorType(DType.INT64, (None,))]


@op("Unique", family="indexing", infer=_infer_unique, outputs=(1, 4),
    attrs={"axis": Attr.int(), "sorted": Attr.int(1)})
def unique(ctx, data, *, axis, sorted):
    """The unique elements (or slices along ``axis``) with first indices, inverse and counts."""
    if axis is None:
        slices = data.reshape(-1)
        keys = slices.reshape(-1, 1)
        axis = 0
    else:
        axis = normalize_axis(axis, data.ndim, ctx)
        slices = data
        keys = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)
    order, starts = _unique_groups(keys)
    is_start = np.zeros(len(order), dtype=bool)
    is_start[starts] = True
    group_of_rank = np.cumsum(is_start) - 1
    counts = np.diff(np.append(starts, len(order))).astype(np.int64)
    first = order[starts].astype(np.int64)  # stable sort: the earliest index of each group
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = group_of_rank
    if not sorted:  # groups in order of first occurrence
        by_first = np.argsort(first, kind="stable")
        renumber = np.empty_like(by_first)
        renumber[by_first] = np.arange(len(by_first))
        first, counts, inverse = first[by_first], counts[by_first], renumber[inverse]
    values = np.take(slices, first, axis=axis)
    return values, first, inverse.astype(np.int64), counts


def _infer_top_k(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(data.dtype, None), TensorType(DType.INT64, None)]
    axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
    k_values = known_ints(ctx, 1)
    k = None if k_values is None or len(k_values) != 1 else k_values[0]
    if k is not None:
        _check_k(ctx, k, data.shape[axis])
    values = _axis_dim_type(data, axis, k)
    return [values, values.with_dtype(DType.INT64)]


def _check_k(ctx: Ctx, k: int, dim: Dim) -> None:
    if k < 0:
        raise ctx.error(f"K must not be negative, got {k}")
    if isinstance(dim, int) and k > dim:
        raise ctx.error(f"K={k} exceeds the {dim} elements of the axis")


@op("TopK", family="indexing", infer=_infer_top_k, outputs=(2, 2),
    attrs={"axis": Attr.int(-1), "largest": Attr.int(1), "sorted": Attr.int(1)})
def top_k(ctx, data, k, *, axis, largest, sorted):
    """The k largest (or smallest) values along ``axis`` and their indices; ties: lower index."""
    axis = normalize_axis(axis, data.ndim, ctx)
    count = scalar_int(ctx, k, "K")
    _check_k(ctx, count, data.shape[axis])
    if largest:
        # Stable ascending sort of the reversed axis, read backwards: descending values with
        # ties in increasing index order.
        flipped = np.flip(data, axis=axis)
        order = np.flip(np.argsort(flipped, axis=axis, kind="stable"), axis=axis)
        order = data.shape[axis] - 1 - order
    else:
        order = np.argsort(data, axis=axis, kind="stable")
    indices = np.take(order, np.arange(count), axis=axis).astype(np.int64)
    return np.take_along_axis(data, indices, axis=axis), indices


# ----------------------------------------------------------------------------- masks, reorder


def _infer_one_hot(ctx: InferContext) -> list[ValueType | None]:
    indices, values = tensor_input(ctx, 0), tensor_input(ctx, 2)
    depth_value = ctx.value(1)
    depth = None
    if depth_value is not None and np.asarray(depth_value).dtype != object:
        depth = _depth(ctx, depth_value)
    if indices.shape is None:
        return [TensorType(values.dtype, None)]
    _check_one_hot_rank(ctx, len(indices.shape))
    axis = normalize_axis(ctx.attrs["axis"], len(indices.shape) + 1, ctx)
    return [TensorType(values.dtype, indices.shape[:axis] + (depth,) + indices.shape[axis:])]


def _check_one_hot_rank(ctx: Ctx, rank: int) -> None:
    if rank < 1:
        raise ctx.error("indices must have rank >= 1 (ONNX does not define OneHot of a scalar)")


def _depth(ctx: Ctx, depth: np.ndarray) -> int:
    array = np.asarray(depth)
    if array.size != 1:
        raise ctx.error(f"depth must hold exactly one value, got {array.size}")
    value = int(array.reshape(-1)[0].astype(np.int64))  # ONNX casts a float depth to int64
    if value < 1:
        raise ctx.error(f"depth must be positive, got {value}")
    return value


@op("OneHot", family="indexing", infer=_infer_one_hot, attrs={"axis": Attr.int(-1)})
def one_hot(ctx, indices, depth, values, *, axis):
    """values[1] where the position along the new ``axis`` equals the index, values[0] elsewhere."""
    count = _depth(ctx, depth)
    if values.size != 2:
        raise ctx.error(f"values must hold [off_value, on_value], got {values.size} values")
    idx = np.asarray(indices)
    _check_one_hot_rank(ctx, idx.ndim)
    idx = idx.astype(np.int64) if idx.dtype.kind != "u" else idx.astype(np.uint64)
    axis = normalize_axis(axis, idx.ndim + 1, ctx)
    if idx.dtype.kind == "i":
        idx = np.where(idx < 0, idx + count, idx)
    positions = np.arange(count).reshape((count,) + (1,) * (idx.ndim - axis))
    hot = np.expand_dims(idx, axis) == positions
    off, on = values.reshape(-1)
    return np.where(hot, on, off).astype(values.dtype)


def _infer_trilu(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is not None and len(data.shape) < 2:
        raise ctx.error(f"the input must have rank >= 2, got rank {len(data.shape)}")
    return [data]


@op("Trilu", family="indexing", infer=_infer_trilu, attrs={"upper": Attr.int(1)})
def trilu(ctx, data, k=None, *, upper):
    """The upper (or lower) triangle of the last two dims from diagonal ``k``; zeros elsewhere."""
    if data.ndim < 2:
        raise ctx.error(f"the input must have rank >= 2, got rank {data.ndim}")
    diagonal = 0 if k is None else scalar_int(ctx, k, "k")
    rows, cols = data.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= diagonal if upper else offset <= diagonal
    return np.where(keep, data, np.zeros((), dtype=data.dtype)).astype(data.dtype)


def _sequence_axes(ctx: Ctx, batch_axis: int, time_axis: int) -> None:
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.error(f"batch_axis ({batch_axis}) and time_axis ({time_axis}) must be 0 and 1 "
                        f"in some order")


def _infer_reverse_sequence(ctx: InferContext) -> list[ValueType | None]:
    _sequence_axes(ctx, ctx.attrs["batch_axis"], ctx.attrs["time_axis"])
    data = tensor_input(ctx, 0)
    if data.shape is not None and len(data.shape) < 2:
        raise ctx.error(f"the input must have rank >= 2, got rank {len(data.shape)}")
    return [data]


@op("ReverseSequence", family="indexing", infer=_infer_reverse_sequence,
    attrs={"batch_axis": Attr.int(1), "time_axis": Attr.int(0)})
def reverse_sequence(ctx, data, sequence_lens, *, batch_axis, time_axis):
    """Each batch entry's first sequence_lens[b] time steps reversed, the rest kept."""
    _sequence_axes(ctx, batch_axis, time_axis)
    lens = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    batch, steps = data.shape[batch_axis], data.shape[time_axis]
    if lens.shape != (batch,):
        raise ctx.error(f"sequence_lens must hold one length per batch entry ({batch}), "
                        f"got {lens.size}")
    if lens.size and (lens.min() < 0 or lens.max() > steps):
        raise ctx.error(f"sequence_lens {lens.tolist()} must lie in [0, {steps}]")
    t = np.arange(steps)[None, :]
    source = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)  # (batch, time)
    moved = np.moveaxis(data, (batch_axis, time_axis), (0, 1))
    out = moved[np.arange(batch)[:, None], source]
    return np.moveaxis(out, (0, 1), (batch_axis, time_axis))

