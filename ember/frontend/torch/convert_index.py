"""Converters of ATen's indexing and scattering ops beyond plain gathers: advanced indexing
(``x[i, :, j]``), ``index_put``, diagonals, sliding windows, ``*_scatter`` and the ``*_copy``
variants of views.

Most of them compute a constant index at import time from static sizes and gather or scatter
with it; a size that is symbolic there raises ``Unsupported`` rather than guessing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ember.core.dtypes import DType
from ember.frontend.torch import convert_shape as sh
from ember.frontend.torch.context import (ImportContext, Unsupported, is_tensor_arg,
                                          static_int, static_ints)


def _axis(dim: Any, rank: int) -> int:
    return sh._axis(dim, rank)


def _axes(ctx: ImportContext, axes: list[int]) -> str:
    return ctx.constant(np.array(axes, dtype=np.int64))


# The largest slice bound (what Python's open end becomes).
INT64_MAX = (1 << 63) - 1


def _static_sizes(shape: Any, what: str) -> list[int]:
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"{what} needs static sizes, the traced ones are symbolic")
    return [int(d) for d in shape]


def _transpose(ctx: ImportContext, value: str, perm: list[int]) -> str:
    if perm == sorted(perm):
        return value
    return ctx.add("Transpose", [value], perm=perm)


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


# ---------------------------------------------------------------------------- advanced indexing

class _Layout:
    """Where the dims of ``x[indices]`` come from, with integer index tensors, by PyTorch's
    rules: the index tensors broadcast to ``broadcast`` (B); the result has B where the
    indexed dims were when those are adjacent (``place``), and in front otherwise, then the
    other dims in order.  GatherND/ScatterND address the indexed dims moved to the front of
    ``x`` (``perm``) with the index tuples, and their layout has B first (``to_front``)."""

    def __init__(self, ctx: ImportContext, x, index_args: list[Any]):
        shape = ctx.shape(x)
        rank = len(shape)
        if len(index_args) > rank:
            raise Unsupported(f"{len(index_args)} indices for a tensor of rank {rank}")
        self.positions = [i for i, idx in enumerate(index_args) if idx is not None]
        if any(ctx.torch_dtype(index_args[i]) == DType.BOOL for i in self.positions):
            raise Unsupported("boolean mask indexing (its result shape depends on the values)")
        self.perm = self.positions + [d for d in range(rank) if d not in self.positions]
        self.broadcast = list(torch.broadcast_shapes(*[ctx.shape(index_args[i])
                                                       for i in self.positions]))
        self.others = [shape[d] for d in range(rank) if d not in self.positions]
        first = self.positions[0]
        adjacent = self.positions == list(range(first, first + len(self.positions)))
        self.place = first if adjacent else 0

    def result_shape(self) -> list[Any]:
        """The shape of ``x[indices]``."""
        return self.others[:self.place] + self.broadcast + self.others[self.place:]

    def to_front(self) -> list[int]:
        """The permutation of the result that brings B to the front (GatherND's layout)."""
        b, lead = len(self.broadcast), self.place
        rank = b + len(self.others)
        return list(range(lead, lead + b)) + list(range(lead)) + list(range(lead + b, rank))

    def tuples(self, ctx: ImportContext, index_values: list[str | None]) -> str:
        """The index tensors broadcast to B and stacked on a last dim: ``B + [k]``."""
        pieces = []
        for i in self.positions:
            value = ctx.add("Expand", [index_values[i], ctx.ints(self.broadcast)])
            pieces.append(ctx.add("Unsqueeze", [value, _axes(ctx, [-1])]))
        return pieces[0] if len(pieces) == 1 else ctx.add("Concat", pieces, axis=-1)


def index(ctx: ImportContext, node, x, indices) -> str:
    """``x[..., idx, ...]`` with index tensors.  One index is a Gather along its dim; several
    become index tuples for a GatherND over the indexed dims moved to the front, and the
    result's dims are then placed as PyTorch places them."""
    indices = list(indices)
    positions = [i for i, idx in enumerate(indices) if idx is not None]
    if not positions:
        return ctx.add("Identity", [ctx.tensor(x)])
    if len(positions) == 1 and ctx.rank(x) > 0 \
            and ctx.torch_dtype(indices[positions[0]]) != DType.BOOL:
        axis = positions[0]
        return ctx.add("Gather", [ctx.tensor(x), ctx.tensor_as(indices[axis], DType.INT64)],
                       axis=axis)
    layout = _Layout(ctx, x, indices)
    normalized = [None if idx is None else _normalized_index(ctx, x, i, idx)
                  for i, idx in enumerate(indices)]
    data = _transpose(ctx, ctx.tensor(x), layout.perm)
    gathered = ctx.add("GatherND", [data, layout.tuples(ctx, normalized)])
    return ctx.add("Identity", [_transpose(ctx, gathered, _inverse(layout.to_front()))])


def _normalized_index(ctx: ImportContext, x, axis: int, index) -> str:
    """An index tensor as int64 with its negative entries counted from the end of ``axis``."""
    value = ctx.tensor_as(index, DType.INT64)
    size = ctx.dim_size(ctx.tensor(x), axis)
    negative = ctx.add("Less", [value, ctx.scalar(0, DType.INT64)])
    return ctx.add("Where", [negative, ctx.add("Add", [value, size]), value])


def index_put(ctx: ImportContext, node, x, indices, values, accumulate=False) -> str:
    """``x[indices] = values`` (or ``+=`` with accumulate): a ScatterND of the values,
    broadcast to the shape of ``x[indices]``, into ``x`` with its indexed dims in front.

    A single boolean mask with a one-element value (``x[mask] = v``) is a Where; other
    masks address a data-dependent number of elements and run in PyTorch."""
    dtype = ctx.out_dtype()
    indices = list(indices)
    positions = [i for i, idx in enumerate(indices) if idx is not None]
    if not positions:
        raise Unsupported("index_put without an index")
    if any(ctx.torch_dtype(indices[i]) == DType.BOOL for i in positions):
        return _mask_put(ctx, x, indices, values, accumulate, dtype)
    normalized = [None if idx is None else _normalized_index(ctx, x, i, idx)
                  for i, idx in enumerate(indices)]
    return _index_put_values(ctx, x, indices, normalized, ctx.tensor_as(values, dtype),
                             bool(accumulate))


def _mask_put(ctx: ImportContext, x, indices, values, accumulate, dtype: DType) -> str:
    """``x[mask] = values`` with one boolean mask over the dims from ``place``: the k-th
    position where the mask holds takes the k-th row of ``values`` (an exclusive running
    count of the mask picks it), or the one row that broadcasts to every position."""
    positions = [i for i, idx in enumerate(indices) if idx is not None]
    if len(positions) != 1:
        raise Unsupported("index_put with a boolean mask beside other indices")
    place = positions[0]
    mask = indices[place]
    shape = ctx.shape(x)
    mask_shape = ctx.shape(mask)
    if tuple(shape[place:place + len(mask_shape)]) != tuple(mask_shape):
        raise Unsupported("index_put with a mask whose shape differs from the dims it covers")
    if accumulate and dtype == DType.BOOL:
        raise Unsupported("index_put accumulate on bools")
    trailing = len(shape) - place - len(mask_shape)
    value_shape = _static_sizes(ctx.shape(values), "index_put") if is_tensor_arg(values) \
        else []
    data = ctx.tensor_as(x, dtype)
    # x[mask] has the dims shape[:place] + [count] + shape[place+mask dims:]
    rows = len(value_shape) - trailing  # 1 when values has the count dim
    if rows > 1:
        raise Unsupported("index_put with values of a higher rank than x[mask]")
    if rows == 1 and value_shape[0] != 1:
        # one row per masked position
        if place != 0:
            raise Unsupported("index_put of a boolean mask after other dims, with one value "
                              "per position")
        if value_shape[0] == 0:
            return ctx.add("Identity", [data])
        flat_mask = ctx.add("Reshape", [ctx.tensor_as(mask, DType.BOOL), ctx.ints([-1])])
        counts = ctx.add("CumSum", [ctx.cast(flat_mask, DType.INT64, DType.BOOL),
                                    ctx.constant(np.array(0, dtype=np.int64))], exclusive=1)
        # positions past the values (where the mask does not hold) are clamped: unused
        counts = ctx.add("Min", [counts, ctx.scalar(value_shape[0] - 1, DType.INT64)])
        picked = ctx.add("Gather", [ctx.tensor_as(values, dtype), counts], axis=0)
        value = ctx.add("Reshape", [picked, ctx.ints(list(mask_shape) + value_shape[1:])])
    else:
        value = ctx.tensor_as(values, dtype)
        if rows == 1:  # a count dim of 1 broadcasts
            value = ctx.add("Squeeze", [value, _axes(ctx, [0])])
    condition = ctx.tensor_as(mask, DType.BOOL)
    if trailing:
        condition = ctx.add("Unsqueeze", [condition, _axes(ctx, list(range(-trailing, 0)))])
    if accumulate:
        added = ctx.add("Add", [data, value])
        return ctx.add("Where", [condition, added, data])
    return ctx.add("Where", [condition, value, data])


def unsafe_masked_index_put_accumulate(ctx: ImportContext, node, x, mask, indices, values
                                       ) -> str:
    """``_unsafe_masked_index_put_accumulate``: index_put(accumulate) of the values where
    ``mask`` holds; the masked-out entries add 0, so their indices (which may be out of
    range) are only clamped into range."""
    dtype = ctx.out_dtype()
    kept = ctx.add("Where", [ctx.tensor_as(mask, DType.BOOL), ctx.tensor_as(values, dtype),
                             ctx.scalar(0, dtype)])
    clamped: list[str | None] = []
    for i, idx in enumerate(indices):
        if idx is None:
            clamped.append(None)
            continue
        size = ctx.dim_size(ctx.tensor(x), i)
        high = ctx.add("Sub", [size, ctx.scalar(1, DType.INT64)])
        value = ctx.add("Max", [_normalized_index(ctx, x, i, idx), ctx.scalar(0, DType.INT64)])
        clamped.append(ctx.add("Min", [value, high]))
    return _index_put_values(ctx, x, list(indices), clamped, kept, accumulate=True)


def _index_put_values(ctx: ImportContext, x, index_args: list[Any],
                      index_values: list[str | None], updates: str, accumulate: bool) -> str:
    """index_put with the index tensors already converted (``index_values``, in range),
    beside the FX arguments ``index_args`` that give their shapes: ``updates`` broadcast to
    the shape of ``x[indices]``, moved to ScatterND's layout and scattered into ``x`` with
    its indexed dims moved to the front."""
    dtype = ctx.out_dtype()
    if accumulate and dtype == DType.BOOL:
        raise Unsupported("index_put accumulate on bools")
    layout = _Layout(ctx, x, index_args)
    target = _static_sizes(layout.result_shape(), "index_put")
    expanded = ctx.add("Expand", [updates, ctx.ints(target)])
    expanded = _transpose(ctx, expanded, layout.to_front())
    moved = _transpose(ctx, ctx.tensor_as(x, dtype), layout.perm)
    scattered = ctx.add("ScatterND", [moved, layout.tuples(ctx, index_values), expanded],
                        reduction="add" if accumulate else "none")
    return ctx.add("Identity", [_transpose(ctx, scattered, _inverse(layout.perm))])


# ---------------------------------------------------------------------------- diagonals

def _diagonal_plan(ctx: ImportContext, x, offset, dim1, dim2
                   ) -> tuple[list[int], list[int], np.ndarray]:
    """The permutation that moves ``dim1, dim2`` last, the sizes of those two dims and the
    flat positions (row * cols + col) of the diagonal ``offset`` in them."""
    shape = ctx.shape(x)
    rank = len(shape)
    a, b = _axis(dim1, rank), _axis(dim2, rank)
    if a == b:
        raise Unsupported("diagonal of a dim with itself")
    offset = static_int(offset, "diagonal offset")
    rows, cols = _static_sizes([shape[a], shape[b]], "diagonal")
    first_row, first_col = max(0, -offset), max(0, offset)
    length = max(0, min(rows - first_row, cols - first_col))
    steps = np.arange(length, dtype=np.int64)
    flat = (steps + first_row) * cols + steps + first_col
    perm = [d for d in range(rank) if d not in (a, b)] + [a, b]
    return perm, [rows, cols], flat


def _merge_last_two(ctx: ImportContext, value: str, lead: int, rows: int, cols: int) -> str:
    # 0 copies the input's size (allowzero off): the leading dims may be symbolic
    return ctx.add("Reshape", [value, ctx.ints([0] * lead + [rows * cols])])


def diagonal(ctx: ImportContext, node, x, offset=0, dim1=0, dim2=1) -> str:
    """The diagonal of dims ``dim1, dim2`` as the last dim: those dims moved last, merged
    into one and gathered at the diagonal's flat positions."""
    perm, (rows, cols), flat = _diagonal_plan(ctx, x, offset, dim1, dim2)
    lead = len(perm) - 2
    moved = _transpose(ctx, ctx.tensor(x), perm)
    if len(flat) == 0:  # an empty diagonal: the leading dims and 0
        empty = ctx.add("Slice", [moved, ctx.ints([0]), ctx.ints([0]), _axes(ctx, [lead])])
        return ctx.add("ReduceSum", [empty, _axes(ctx, [lead + 1])], keepdims=0)
    merged = _merge_last_two(ctx, moved, lead, rows, cols)
    return ctx.add("Gather", [merged, ctx.constant(flat)], axis=lead)


def diagonal_scatter(ctx: ImportContext, node, x, src, offset=0, dim1=0, dim2=1) -> str:
    """``x`` with its diagonal replaced by ``src``: ScatterElements at the diagonal's flat
    positions of the two dims, merged as in :func:`diagonal`."""
    dtype = ctx.out_dtype()
    perm, (rows, cols), flat = _diagonal_plan(ctx, x, offset, dim1, dim2)
    if len(flat) == 0:
        return ctx.add("Identity", [ctx.tensor_as(x, dtype)])
    lead = len(perm) - 2
    moved = _transpose(ctx, ctx.tensor_as(x, dtype), perm)
    merged = _merge_last_two(ctx, moved, lead, rows, cols)
    updates = ctx.tensor_as(src, dtype)
    positions = ctx.constant(flat.reshape([1] * lead + [len(flat)]))
    positions = ctx.add("Expand", [positions, ctx.add("Shape", [updates])])
    scattered = ctx.add("ScatterElements", [merged, positions, updates], axis=lead)
    restored = ctx.add("Reshape", [scattered, ctx.ints([0] * lead + [rows, cols])])
    return ctx.add("Identity", [_transpose(ctx, restored, _inverse(perm))])


# ---------------------------------------------------------------------------- slices

def _slice_positions(size: int, start, end, step) -> np.ndarray:
    start = None if start is None else static_int(start, "slice start")
    end = None if end is None else static_int(end, "slice end")
    step = static_int(step, "slice step")
    if step <= 0:
        raise Unsupported(f"slice step {step}")
    return np.arange(*slice(start, end, step).indices(size), dtype=np.int64)


def _scatter_along(ctx: ImportContext, data: str, updates: str, axis: int, rank: int,
                   positions: np.ndarray) -> str:
    """``data`` with the slices at ``positions`` of ``axis`` replaced by ``updates``."""
    shape = [1] * rank
    shape[axis] = len(positions)
    index = ctx.add("Expand", [ctx.constant(positions.reshape(shape)),
                               ctx.add("Shape", [updates])])
    return ctx.add("ScatterElements", [data, index, updates], axis=axis)


def slice_scatter(ctx: ImportContext, node, x, src, dim=0, start=None, end=None, step=1
                  ) -> str:
    dtype = ctx.out_dtype()
    shape = ctx.shape(x)
    rank = len(shape)
    axis = _axis(dim, rank)
    if not isinstance(shape[axis], int) and step == 1:
        return _slice_replaced(ctx, ctx.tensor_as(x, dtype), ctx.tensor_as(src, dtype), axis,
                               start, end)
    size = _static_sizes([shape[axis]], "slice_scatter")[0]
    positions = _slice_positions(size, start, end, step)
    data = ctx.tensor_as(x, dtype)
    if len(positions) == 0:
        return ctx.add("Identity", [data])
    return _scatter_along(ctx, data, ctx.tensor_as(src, dtype), axis, rank, positions)


def _slice_replaced(ctx: ImportContext, data: str, src: str, axis: int, start, end) -> str:
    """``data[start:end]`` along ``axis`` replaced by ``src``, for a size known only at run
    time: what comes before the slice, ``src`` and what comes after it, concatenated (a
    scatter needs its positions at compile time; ``x[:, 1:] = y``, a decoder's shifted
    inputs).  Slice clamps the bounds and counts negative ones from the end, as Python's
    slices do; an end before the start is the start, which needs bounds of one sign."""
    first = 0 if start is None else static_int(start, "slice start")
    last = INT64_MAX if end is None else min(static_int(end, "slice end"), INT64_MAX)
    if first != 0 and last != INT64_MAX and (first < 0) != (last < 0):
        raise Unsupported("a slice_scatter whose bounds count from both ends of a size known "
                          "only at run time")
    axes = _axes(ctx, [axis])
    pieces = [src]
    if first != 0:  # (no empty pieces: an empty slice of a run-time size has no known size)
        pieces.insert(0, ctx.add("Slice", [data, ctx.ints([0]), ctx.ints([first]), axes]))
    if last != INT64_MAX:  # (from the start, the end as it is; else bounds of one sign)
        after = last if first == 0 else max(first, last)
        pieces.append(ctx.add("Slice", [data, ctx.ints([after]), ctx.ints([INT64_MAX]),
                                        axes]))
    if len(pieces) == 1:  # the whole axis replaced
        return ctx.add("Identity", [src])
    return ctx.add("Concat", pieces, axis=axis)


def select_scatter(ctx: ImportContext, node, x, src, dim, index) -> str:
    dtype = ctx.out_dtype()
    shape = ctx.shape(x)
    rank = len(shape)
    axis = _axis(dim, rank)
    size = _static_sizes([shape[axis]], "select_scatter")[0]
    position = static_int(index, "select index")
    if not -size <= position < size:
        raise Unsupported(f"index {position} out of range for size {size}")
    updates = ctx.add("Unsqueeze", [ctx.tensor_as(src, dtype), _axes(ctx, [axis])])
    return _scatter_along(ctx, ctx.tensor_as(x, dtype), updates, axis, rank,
                          np.array([position % size], dtype=np.int64))


def narrow_copy(ctx: ImportContext, node, x, dim, start, length) -> str:
    axis = _axis(dim, ctx.rank(x))
    start_value = ctx.symint(start)
    size = ctx.dim_size(ctx.tensor(x), axis)
    # a negative start counts from the end
    negative = ctx.add("Less", [start_value, ctx.scalar(0, DType.INT64)])
    start_value = ctx.add("Where", [negative, ctx.add("Add", [start_value, size]), start_value])
    end = ctx.add("Add", [start_value, ctx.symint(length)])
    one = ctx.constant(np.array([0]))
    return ctx.add("Slice", [ctx.tensor(x), ctx.add("Unsqueeze", [start_value, one]),
                             ctx.add("Unsqueeze", [end, one]), _axes(ctx, [axis])])


def unbind(ctx: ImportContext, node, x, dim=0) -> list[str]:
    shape = ctx.shape(x)
    axis = _axis(dim, len(shape))
    size = _static_sizes([shape[axis]], "unbind")[0]
    return [ctx.add("Gather", [ctx.tensor(x), ctx.constant(np.array(i, dtype=np.int64))],
                    axis=axis) for i in range(size)]


# ---------------------------------------------------------------------------- windows

def unfold(ctx: ImportContext, node, x, dim, size, step) -> str:
    """``x.unfold(dim, size, step)``: the windows along ``dim`` as a new last dim, gathered
    with a constant (windows, size) index."""
    shape = ctx.shape(x)
    rank = len(shape)
    size = static_int(size, "unfold size")
    step = static_int(step, "unfold step")
    value = ctx.tensor(x)
    if rank == 0:  # a 0-d tensor unfolds as a 1-element vector, into shape [size]
        return ctx.add("Reshape", [value, ctx.ints([size])])
    axis = _axis(dim, rank)
    length = _static_sizes([shape[axis]], "unfold")[0]
    count = (length - size) // step + 1
    windows = np.arange(count, dtype=np.int64)[:, None] * step + np.arange(size)[None, :]
    gathered = ctx.add("Gather", [value, ctx.constant(windows)], axis=axis)
    # gathered: shape[:axis] + [count, size] + shape[axis+1:]; the window dim goes last
    perm = list(range(axis + 1)) + list(range(axis + 2, rank + 1)) + [axis + 1]
    return ctx.add("Identity", [_transpose(ctx, gathered, perm)])


def as_strided(ctx: ImportContext, node, x, size, stride, storage_offset=None) -> str:
    """as_strided over the input's storage, which is its flattened values when PyTorch
    recorded the input as contiguous at offset 0; a view of other memory runs in PyTorch."""
    positions = _strided_positions(ctx, x, size, stride, storage_offset, "as_strided")
    flat = ctx.add("Reshape", [ctx.tensor(x), ctx.ints([-1])])
    return ctx.add("Gather", [flat, ctx.constant(positions)], axis=0)


def _strided_positions(ctx: ImportContext, x, size, stride, storage_offset, what: str
                       ) -> np.ndarray:
    """The flat element positions an as_strided view of ``x`` reads, checked to stay within
    its elements (``x`` must be recorded contiguous from offset 0)."""
    value = _meta(x)
    if not value.is_contiguous() or value.storage_offset() != 0:
        raise Unsupported(f"{what} of a tensor that is not contiguous from offset 0")
    sizes = static_ints(size, "as_strided size")
    strides = static_ints(stride, "as_strided stride")
    offset = 0 if storage_offset is None else static_int(storage_offset, "storage offset")
    numel = int(np.prod(_static_sizes(ctx.shape(x), what)))
    positions = np.full(sizes, offset, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(sizes, strides)):
        view = [1] * len(sizes)
        view[axis] = n
        positions = positions + (np.arange(n, dtype=np.int64) * s).reshape(view)
    if positions.size and (positions.max() >= numel or positions.min() < 0):
        raise Unsupported(f"{what} reaching past the input's elements")
    return positions


def as_strided_scatter(ctx: ImportContext, node, x, src, size, stride, storage_offset=None
                       ) -> str:
    dtype = ctx.out_dtype()
    positions = _strided_positions(ctx, x, size, stride, storage_offset,
                                   "as_strided_scatter")
    shape = _static_sizes(ctx.shape(x), "as_strided_scatter")
    if len(np.unique(positions)) != positions.size:
        raise Unsupported("as_strided_scatter onto overlapping positions")
    flat = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1])])
    updates = ctx.add("Reshape", [ctx.tensor_as(src, dtype), ctx.ints([-1])])
    scattered = ctx.add("ScatterElements", [flat, ctx.constant(positions.reshape(-1)),
                                            updates], axis=0)
    return ctx.add("Reshape", [scattered, ctx.ints(shape)])


def _meta(arg: Any) -> torch.Tensor:
    from ember.frontend.torch.context import meta_value

    value = meta_value(arg)
    if not isinstance(value, torch.Tensor):
        raise Unsupported("expected a tensor")
    return value


# ---------------------------------------------------------------------------- flat scatters

def put(ctx: ImportContext, node, x, index, source, accumulate=False) -> str:
    """``x.put(index, source)``: a scatter into the flattened ``x``."""
    dtype = ctx.out_dtype()
    shape = ctx.shape(x)
    flat = ctx.add("Reshape", [ctx.tensor_as(x, dtype), ctx.ints([-1])])
    positions = ctx.add("Reshape", [ctx.tensor_as(index, DType.INT64), ctx.ints([-1])])
    updates = ctx.add("Reshape", [ctx.tensor_as(source, dtype), ctx.ints([-1])])
    if accumulate and dtype == DType.BOOL:
        raise Unsupported("put accumulate on bools")
    scattered = ctx.add("ScatterElements", [flat, positions, updates], axis=0,
                        reduction="add" if accumulate else "none")
    return ctx.add("Reshape", [scattered, ctx.ints(list(shape))], allowzero=1)


def masked_scatter(ctx: ImportContext, node, x, mask, source) -> str:
    """``x`` with the positions where ``mask`` holds taken from ``source``'s elements in
    order: the k-th true position (an exclusive running count) reads ``source.flat[k]``."""
    dtype = ctx.out_dtype()
    shape = _static_sizes(ctx.shape(node), "masked_scatter")
    if int(np.prod(_static_sizes(ctx.shape(source), "masked_scatter"))) == 0:
        raise Unsupported("masked_scatter from an empty source")
    condition = ctx.add("Expand", [ctx.tensor_as(mask, DType.BOOL), ctx.ints(shape)])
    flat_mask = ctx.add("Reshape", [condition, ctx.ints([-1])])
    counts = ctx.add("CumSum", [ctx.cast(flat_mask, DType.INT64, DType.BOOL),
                                ctx.constant(np.array(0, dtype=np.int64))], exclusive=1)
    flat_source = ctx.add("Reshape", [ctx.tensor_as(source, dtype), ctx.ints([-1])])
    # positions past the source (where the mask is false) are clamped: they are not used
    last = ctx.add("Sub", [ctx.add("Size", [flat_source]), ctx.scalar(1, DType.INT64)])
    counts = ctx.add("Min", [counts, last])
    picked = ctx.add("Gather", [flat_source, counts], axis=0)
    picked = ctx.add("Reshape", [picked, ctx.ints(shape)], allowzero=1)
    data = ctx.add("Expand", [ctx.tensor_as(x, dtype), ctx.ints(shape)])
    return ctx.add("Where", [condition, picked, data])


def index_reduce(ctx: ImportContext, node, x, dim, index, source, reduce, *,
                 include_self=True) -> str:
    """``index_reduce``: scatter_reduce of ``source`` along ``dim`` at ``index`` repeated
    over the other dims of ``source`` (a 0-d ``x`` and ``source`` act as 1-element
    vectors)."""
    rank = ctx.rank(x)
    dtype = ctx.out_dtype()
    updates = ctx.tensor_as(source, dtype)
    data = ctx.tensor_as(x, dtype)
    if rank == 0:
        data = ctx.add("Reshape", [data, ctx.ints([1])])
        updates = ctx.add("Reshape", [updates, ctx.ints([1])])
    axis = _axis(dim, max(rank, 1))
    shape = [1] * max(rank, 1)
    shape[axis] = -1
    positions = ctx.add("Reshape", [ctx.tensor_as(index, DType.INT64), ctx.ints(shape)])
    positions = ctx.add("Expand", [positions, ctx.add("Shape", [updates])])
    result = sh.scatter_reduce_values(ctx, data, axis, positions, updates, reduce,
                                      include_self)
    if rank == 0:
        result = ctx.add("Reshape", [result, ctx.ints([])])
    return result


# ---------------------------------------------------------------------------- embedding bags

_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def embedding_bag(ctx: ImportContext, node, weight, indices, offsets, scale_grad_by_freq=False,
                  mode=0, sparse=False, per_sample_weights=None, include_last_offset=False,
                  padding_idx=-1) -> list[str | None]:
    """``_embedding_bag(_forward_only)``: the output, each bag's sum, mean or max of the
    weight rows its indices pick (bag b holds the indices from ``offsets[b]`` to the next
    offset, the last one to the end unless ``include_last_offset``); rows of
    ``padding_idx`` are left out (and not counted by the mean), an empty bag gives zeros,
    ``per_sample_weights`` scale the rows of a sum.  (With ``include_last_offset`` the last
    offset must be the number of indices, as documented: PyTorch's kernels disagree with
    each other about indices past it.)  The bag of every index is a running
    count of the offsets at or before it (marks scattered at the offsets, summed); rows
    are scatter-reduced into their bags, linear in the number of indices.  The other
    outputs (offset2bag, bag_size, max_indices: bookkeeping for the backward) are not
    computed."""
    dtype = ctx.out_dtype(0)
    mode_name = _BAG_MODES.get(static_int(mode, "embedding_bag mode"))
    if dtype not in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16) or \
            mode_name is None:
        raise Unsupported(f"embedding_bag mode {mode} of {dtype}")
    if ctx.rank(indices) != 1 or ctx.rank(offsets) != 1:
        raise Unsupported("embedding_bag with indices and offsets that are not 1-D")
    count = _static_sizes(ctx.shape(indices), "embedding_bag")[0]
    bags = _static_sizes(ctx.shape(offsets), "embedding_bag")[0] - int(bool(include_last_offset))
    width = _static_sizes(ctx.shape(weight), "embedding_bag")[1]
    if count == 0 or bags <= 0:
        raise Unsupported(f"embedding_bag of {count} indices in {bags} bags")
    index = ctx.tensor_as(indices, DType.INT64)
    rows = ctx.add("Gather", [ctx.tensor_as(weight, dtype), index], axis=0)
    # the bag of every index: how many offsets are at or before it, minus one
    starts = ctx.add("Slice", [ctx.tensor_as(offsets, DType.INT64), ctx.ints([0]),
                               ctx.ints([bags])])
    marks = ctx.add("ScatterElements", [ctx.constant(np.zeros(count + 1, dtype=np.int64)),
                                        starts, ctx.constant(np.ones(bags, dtype=np.int64))],
                    axis=0, reduction="add")
    bag = ctx.add("Sub", [ctx.add("CumSum", [marks, ctx.constant(np.array(0))]),
                          ctx.scalar(1, DType.INT64)])
    bag = ctx.add("Slice", [bag, ctx.ints([0]), ctx.ints([count])])
    valid = None
    if static_int(padding_idx, "padding_idx") >= 0:
        valid = ctx.add("Not", [ctx.add("Equal", [index, ctx.scalar(int(padding_idx),
                                                                     DType.INT64)])])
    column = ctx.constant(np.array([1], dtype=np.int64))
    targets = ctx.add("Expand", [ctx.add("Unsqueeze", [bag, column]), ctx.ints([count, width])])
    fill = -np.inf if mode_name == "max" else 0.0
    if per_sample_weights is not None and mode_name == "sum":
        rows = ctx.add("Mul", [rows, ctx.add("Unsqueeze", [
            ctx.tensor_as(per_sample_weights, dtype), column])])
    if valid is not None:
        rows = ctx.add("Where", [ctx.add("Unsqueeze", [valid, column]), rows,
                                 ctx.scalar(fill, dtype)])
    start = ctx.constant(np.full((bags, width), fill, dtype=dtype.numpy))
    result = ctx.add("ScatterElements", [start, targets, rows], axis=0,
                     reduction="max" if mode_name == "max" else "add")
    if mode_name == "sum" and valid is None:
        return [result, None, None, None]
    ones = ctx.constant(np.ones(count, dtype=dtype.numpy)) if valid is None else \
        ctx.cast(valid, dtype, DType.BOOL)
    sizes = ctx.add("ScatterElements", [ctx.constant(np.zeros(bags, dtype=dtype.numpy)), bag,
                                        ones], axis=0, reduction="add")
    sizes = ctx.add("Unsqueeze", [sizes, column])
    empty = ctx.add("Equal", [sizes, ctx.scalar(0, dtype)])
    if mode_name == "mean":
        result = ctx.add("Div", [result, ctx.add("Max", [sizes, ctx.scalar(1, dtype)])])
    return [ctx.add("Where", [empty, ctx.scalar(0, dtype), result]), None, None, None]


def embedding_renorm(ctx: ImportContext, node, weight, indices, max_norm, norm_type) -> str:
    """``embedding_renorm`` (functional): the rows that ``indices`` reference and whose
    ``norm_type``-norm exceeds ``max_norm`` scaled by max_norm / (norm + 1e-7)."""
    from ember.frontend.torch.convert_reduce import vector_norm

    dtype = ctx.out_dtype()
    shape = _static_sizes(ctx.shape(weight), "embedding_renorm")
    if len(shape) != 2:
        raise Unsupported("embedding_renorm of a weight that is not 2-D")
    value = ctx.tensor_as(weight, dtype)
    flat = ctx.add("Reshape", [ctx.tensor_as(indices, DType.INT64), ctx.ints([-1])])
    used = ctx.add("ScatterElements", [
        ctx.constant(np.zeros(shape[0], dtype=dtype.numpy)), flat,
        ctx.add("Expand", [ctx.scalar(1, dtype), ctx.add("Shape", [flat])])], axis=0,
        reduction="max")
    norms = vector_norm(ctx, value, [1], norm_type, True, dtype)
    limit = ctx.scalar(float(max_norm), dtype)
    over = ctx.add("And", [ctx.add("Greater", [norms, limit]), ctx.add("Greater", [
        ctx.add("Unsqueeze", [used, ctx.constant(np.array([1], dtype=np.int64))]),
        ctx.scalar(0, dtype)])])
    scale = ctx.add("Div", [limit, ctx.add("Add", [norms, ctx.scalar(1e-7, dtype)])])
    return ctx.add("Where", [over, ctx.add("Mul", [value, scale]), value])


def nonzero_static(ctx: ImportContext, node, x, *, size, fill_value=-1) -> str:
    """``nonzero_static``: the coordinates of the first ``size`` non-zero elements in
    row-major order, as a (size, rank) int64 tensor padded with ``fill_value``.  Every
    non-zero element's rank among them (a running count) is the row it goes to; elements
    that are zero or past ``size`` go to a spare row, dropped.  Flat positions become
    coordinates through a constant table (no integer division)."""
    shape = _static_sizes(ctx.shape(x), "nonzero_static")
    size = static_int(size, "nonzero_static size")
    fill = static_int(fill_value, "nonzero_static fill_value")
    numel = int(np.prod(shape))
    if size == 0 or not shape or numel == 0:
        return ctx.constant(np.full((size, len(shape)), fill, dtype=np.int64))
    flat = ctx.add("Reshape", [ctx.tensor(x), ctx.ints([-1])])
    if ctx.torch_dtype(x) == DType.BOOL:
        nonzero = flat
    else:
        nonzero = ctx.add("Not", [ctx.add("Equal", [
            flat, ctx.scalar(0, ctx.torch_dtype(x))])])
    order = ctx.add("CumSum", [ctx.cast(nonzero, DType.INT64, DType.BOOL),
                               ctx.constant(np.array(0))])
    order = ctx.add("Sub", [order, ctx.scalar(1, DType.INT64)])
    spare = ctx.scalar(size, DType.INT64)
    rows = ctx.add("Where", [ctx.add("And", [nonzero, ctx.add("Less", [order, spare])]),
                             order, spare])
    positions = ctx.add("ScatterElements", [
        ctx.constant(np.full(size + 1, -1, dtype=np.int64)), rows,
        ctx.constant(np.arange(numel, dtype=np.int64))], axis=0)
    positions = ctx.add("Slice", [positions, ctx.ints([0]), ctx.ints([size])])
    table = np.stack(np.unravel_index(np.arange(numel), shape), axis=-1).astype(np.int64)
    coordinates = ctx.add("Gather", [ctx.constant(table), ctx.add("Max", [
        positions, ctx.scalar(0, DType.INT64)])], axis=0)
    found = ctx.add("Unsqueeze", [ctx.add("GreaterOrEqual", [positions,
                                                             ctx.scalar(0, DType.INT64)]),
                                  ctx.constant(np.array([1], dtype=np.int64))])
    return ctx.add("Where", [found, coordinates, ctx.scalar(fill, DType.INT64)])

