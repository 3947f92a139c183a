"""Shape ops: ops that move, select or replicate elements without computing new values.

* layout: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, DepthToSpace, SpaceToDepth;
* describing a layout: Shape, Size;
* building a tensor out of (parts of) others: Concat, Split, Slice, Expand, Tile, Pad,
  CenterCropPad.

Their shape inference is exact with symbolic dims (``N x 512 x 1 x 1`` reshaped by ``[0, -1]``
is ``N x 512``) and uses the known values of shape tensors (``ctx.value``).  Several references
here also run during shape inference on such known values: object arrays that hold ints and
:class:`~ember.core.dims.SymDim` symbols.  They therefore stick to numpy indexing, reshape,
concatenate and broadcast_to, which work on object arrays, and read integer parameters through
:func:`int_list`, which refuses symbols with a clear error.

The helpers of the first section are shared with ``indexing.py`` and ``generator.py``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ember.core.traced import as_size
from ember.core.dims import Dim, SymDim, dim_product, dims_equal, exact_divide
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, InferFn, RefContext, op
from ember.ops.shape_infer import (
    broadcast_shapes,
    normalize_axis,
    shape_from_constant,
    tensor_input,
)

Ctx = InferContext | RefContext
Shape = tuple[Dim, ...]

# Slice ends at or beyond this mean "to the end" even for a symbolic dim (exporters pass
# INT32_MAX or INT64_MAX there).
SLICE_TO_END = 2**31 - 1

# ----------------------------------------------------------------------------- shared helpers


def check_index_tensor(ctx: Ctx, value: np.ndarray, what: str) -> None:
    """An index-like input (axes, starts, shape, repeats ...) must be a scalar or 1-D tensor of
    integers: ONNX types these int32/int64, and a bool or float tensor, or a matrix, is a
    malformed model rather than something to flatten or round."""
    array = np.asarray(value)
    if array.ndim > 1:
        raise ctx.error(f"{what} must be a 1-D tensor, got shape {list(array.shape)}")
    if array.dtype.kind not in "iuO":  # object arrays hold symbolic dims during inference
        raise ctx.error(f"{what} must hold integers, got a tensor of {array.dtype}")


def int_list(ctx: Ctx, value: np.ndarray | None, what: str) -> list[int]:
    """An integer tensor (1-D or scalar) as Python ints; a clear error for symbols or floats."""
    if value is None:
        raise ctx.error(f"{what} is required")
    check_index_tensor(ctx, value, what)
    values = np.asarray(value).reshape(-1).tolist()
    for v in values:
        if isinstance(v, SymDim):
            raise ctx.error(f"{what} holds the symbolic value {v}, a concrete integer is needed")
        if not isinstance(v, (int, np.integer)):
            raise ctx.error(f"{what} must hold integers, got {v!r}")
    return [as_size(v) for v in values]   # a traced size stays traced


def scalar_int(ctx: Ctx, value: np.ndarray | None, what: str) -> int:
    """A scalar (or one-element) integer tensor as a Python int."""
    values = int_list(ctx, value, what)
    if len(values) != 1:
        raise ctx.error(f"{what} must hold exactly one value, got {len(values)}")
    return values[0]


def known_ints(ctx: InferContext, index: int) -> list[int] | None:
    """The known value of integer input ``index`` as Python ints; None if unknown or symbolic."""
    value = ctx.value(index)
    if value is None:
        return None
    check_index_tensor(ctx, value, f"input {index}")
    values = np.asarray(value).reshape(-1).tolist()
    if not all(isinstance(v, (int, np.integer)) for v in values):
        return None
    return [int(v) for v in values]


def known_dims(ctx: InferContext, index: int) -> Shape | None:
    """The known value of a shape-like input ``index`` as dims (ints or symbols), or None."""
    value = ctx.value(index)
    if value is None:
        return None
    check_index_tensor(ctx, value, f"input {index}")
    return shape_from_constant(value)


def vector_length(ctx: InferContext, index: int) -> int | None:
    """The static length of the 1-D input ``index`` (from its type), or None."""
    t = ctx.inputs[index] if index < len(ctx.inputs) else None
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    if len(t.shape) == 0:
        return 1
    length = t.shape[0]
    return length if isinstance(length, int) else None


def unknown_dims(rank: int | None) -> Shape | None:
    """A shape of ``rank`` unknown dims (None if the rank is unknown too)."""
    return None if rank is None else (None,) * rank


def normalize_axes(ctx: Ctx, axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Axes in [-rank, rank-1] made non-negative; repeated axes are an error."""
    normalized = [normalize_axis(a, rank, ctx) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"{what} {list(axes)} repeat an axis")
    return normalized


def check_attr(ctx: Ctx, name: str, value: object, allowed: Sequence[object]) -> None:
    """An error unless attribute ``name`` is one of ``allowed``."""
    if value not in allowed:
        raise ctx.error(f"attribute {name}={value!r} is not supported; use one of "
                        f"{', '.join(repr(a) for a in allowed)}")


def is_int(dim: Dim, value: int | None = None) -> bool:
    """``dim`` is a static int (equal to ``value`` if given); False for symbols and None."""
    return isinstance(dim, int) and (value is None or dim == value)


def _merge_equal_dims(ctx: InferContext, dims: Sequence[Dim], what: str) -> Dim:
    """Dims that must be equal at run time: the most precise one; an error if they differ."""
    chosen: Dim = None
    for d in dims:
        if is_int(chosen) and is_int(d) and chosen != d:
            raise ctx.error(f"{what}: {chosen} != {d}")
        if chosen is None or (isinstance(d, int) and not isinstance(chosen, int)):
            chosen = d
    return chosen


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


# ----------------------------------------------------------------------------- Reshape


def reshape_dims(ctx: Ctx, in_shape: Sequence[Dim], target: Sequence[Dim],
                 allowzero: int) -> Shape:
    """Resolve the 0 (copy) and -1 (infer) entries of a Reshape target shape.

    Dims may be symbolic or None; an inferred dim that does not divide exactly is None, and
    static sizes that cannot match are an error.
    """
    ints = [d for d in target if isinstance(d, int)]
    if ints.count(-1) > 1:
        raise ctx.error(f"shape {list(target)} has more than one -1")
    if allowzero and 0 in ints and -1 in ints:
        raise ctx.error(f"shape {list(target)} has both 0 and -1, which allowzero=1 forbids")
    out: list[Dim] = []
    for i, d in enumerate(target):
        if is_int(d, 0) and not allowzero:
            if i >= len(in_shape):
                raise ctx.error(f"shape[{i}] is 0 (copy the input dim) but the input has rank "
                                f"{len(in_shape)}")
            d = in_shape[i]
        elif isinstance(d, int) and d < -1:
            raise ctx.error(f"shape {list(target)} has the invalid dim {d}")
        out.append(d)
    total = dim_product(in_shape)
    if -1 in ints:
        pos = next(i for i, d in enumerate(target) if is_int(d, -1))
        rest = dim_product(d for i, d in enumerate(out) if i != pos)
        out[pos] = _inferred_dim(ctx, total, rest, in_shape, target)
    elif is_int(total) and is_int(dim_product(out)) and total != dim_product(out):
        raise ctx.error(f"cannot reshape a tensor of shape {_fmt(in_shape)} ({total} elements) "
                        f"to {_fmt(out)} ({dim_product(out)} elements)")
    return tuple(out)


def _inferred_dim(ctx: Ctx, total: Dim, rest: Dim, in_shape: Sequence[Dim],
                  target: Sequence[Dim]) -> Dim:
    if total is None or rest is None:
        return None
    if is_int(rest, 0):
        if is_int(total, 0):
            raise ctx.error(f"shape {list(target)}: the -1 dim is ambiguous for a tensor with "
                            f"no elements")
        raise ctx.error(f"cannot reshape a tensor of shape {_fmt(in_shape)} to {list(target)}")
    quotient = exact_divide(total, rest)
    if quotient is None and is_int(total) and is_int(rest):
        raise ctx.error(f"cannot reshape a tensor of shape {_fmt(in_shape)} ({total} elements) "
                        f"to {list(target)}")
    return quotient


def _fmt(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _infer_reshape(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    target = known_dims(ctx, 1)
    if target is None:
        return [TensorType(data.dtype, unknown_dims(vector_length(ctx, 1)))]
    allowzero = ctx.attrs["allowzero"]
    if data.shape is None:  # 0 and -1 depend on the input shape
        dims = tuple(None if (is_int(d, -1) or (is_int(d, 0) and not allowzero)) else d
                     for d in target)
        return [TensorType(data.dtype, dims)]
    return [TensorType(data.dtype, reshape_dims(ctx, data.shape, target, allowzero))]


@op("Reshape", family="shape", infer=_infer_reshape, attrs={"allowzero": Attr.int(0)})
def reshape(ctx, data, shape, *, allowzero):
    """data in a new shape; a 0 entry copies the input dim (unless allowzero), -1 is inferred."""
    target = int_list(ctx, shape, "the shape input")
    return data.reshape(reshape_dims(ctx, data.shape, target, allowzero))


# ----------------------------------------------------------------------------- Flatten


def _flatten_dims(ctx: Ctx, shape: Sequence[Dim], axis: int) -> Shape:
    rank = len(shape)
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range [-{rank}, {rank}] for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return dim_product(shape[:axis]), dim_product(shape[axis:])


def _infer_flatten(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(data.dtype, (None, None))]
    return [TensorType(data.dtype, _flatten_dims(ctx, data.shape, ctx.attrs["axis"]))]


@op("Flatten", family="shape", infer=_infer_flatten, attrs={"axis": Attr.int(1)})
def flatten(ctx, data, *, axis):
    """data as a matrix: dims before ``axis`` form the rows, the others the columns."""
    return data.reshape(_flatten_dims(ctx, data.shape, axis))


# ----------------------------------------------------------------------------- Squeeze


def _squeezed(ctx: Ctx, shape: Sequence[Dim], axes: list[int] | None) -> Shape | None:
    """``shape`` without ``axes`` (all size-1 dims if None); None if that is not knowable."""
    if axes is None:
        if not all(isinstance(d, int) for d in shape):
            return None  # whether a symbolic or unknown dim is 1 decides the rank
        return tuple(d for d in shape if d != 1)
    axes = normalize_axes(ctx, axes, len(shape))
    for a in axes:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of shape {_fmt(shape)}: its size is "
                            f"{shape[a]}, not 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _infer_squeeze(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    has_axes = ctx.has_input(1)
    axes = known_ints(ctx, 1) if has_axes else None
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    if has_axes and axes is None:
        count = vector_length(ctx, 1)
        return [TensorType(data.dtype, None if count is None else
                           unknown_dims(len(data.shape) - count))]
    return [TensorType(data.dtype, _squeezed(ctx, data.shape, axes))]


@op("Squeeze", family="shape", infer=_infer_squeeze)
def squeeze(ctx, data, axes=None):
    """data without the size-1 dims listed in ``axes`` (all size-1 dims when absent)."""
    axis_list = None if axes is None else int_list(ctx, axes, "axes")
    return data.reshape(_squeezed(ctx, data.shape, axis_list))


# ----------------------------------------------------------------------------- Unsqueeze


def _unsqueezed(ctx: Ctx, shape: Sequence[Dim], axes: list[int]) -> Shape:
    rank = len(shape) + len(axes)
    inserted = set(normalize_axes(ctx, axes, rank))
    dims = iter(shape)
    return tuple(1 if i in inserted else next(dims) for i in range(rank))


def _infer_unsqueeze(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    axes = known_ints(ctx, 1)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    if axes is None:
        count = vector_length(ctx, 1)
        return [TensorType(data.dtype, None if count is None else
                           unknown_dims(len(data.shape) + count))]
    return [TensorType(data.dtype, _unsqueezed(ctx, data.shape, axes))]


@op("Unsqueeze", family="shape", infer=_infer_unsqueeze)
def unsqueeze(ctx, data, axes):
    """data with size-1 dims inserted at ``axes`` (positions in the output)."""
    return data.reshape(_unsqueezed(ctx, data.shape, int_list(ctx, axes, "axes")))


# ----------------------------------------------------------------------------- Transpose


def permutation(ctx: Ctx, perm: list[int] | None, rank: int) -> list[int]:
    if perm is None:
        return list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of the {rank} axes of the input")
    return list(perm)


def _infer_transpose(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        perm = ctx.attrs["perm"]
        return [TensorType(data.dtype, None if perm is None else unknown_dims(len(perm)))]
    perm = permutation(ctx, ctx.attrs["perm"], len(data.shape))
    return [TensorType(data.dtype, tuple(data.shape[p] for p in perm))]


@op("Transpose", family="shape", infer=_infer_transpose, attrs={"perm": Attr.ints(None)})
def transpose(ctx, data, *, perm):
    """data with its axes permuted by ``perm`` (reversed when absent)."""
    return np.transpose(data, permutation(ctx, perm, data.ndim))


# ----------------------------------------------------------------------------- Shape, Size


def _shape_bounds(rank: int, start: int, end: int | None) -> tuple[int, int]:
    """Shape's start/end attributes clamped to [0, rank] as ONNX specifies."""
    start = _clamp(start + rank if start < 0 else start, 0, rank)
    end = rank if end is None else _clamp(end + rank if end < 0 else end, 0, rank)
    return start, max(start, end)


def _infer_shape(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(DType.INT64, (None,))]
    start, end = _shape_bounds(len(data.shape), ctx.attrs["start"], ctx.attrs["end"])
    return [TensorType(DType.INT64, (end - start,))]


@op("Shape", family="shape", infer=_infer_shape,
    attrs={"start": Attr.int(0), "end": Attr.int(None)})
def shape(ctx, data, *, start, end):
    """The dims of data (those from ``start`` to ``end``) as a 1-D int64 tensor."""
    start, end = _shape_bounds(data.ndim, start, end)
    return np.array(data.shape[start:end], dtype=np.int64)


def _infer_size(ctx: InferContext) -> list[ValueType | None]:
    tensor_input(ctx, 0)
    return [TensorType(DType.INT64, ())]


@op("Size", family="shape", infer=_infer_size)
def size(ctx, data):
    """The number of elements of data as an int64 scalar."""
    return np.array(np.asarray(data).size, dtype=np.int64)


# ----------------------------------------------------------------------------- Concat


def _infer_concat(ctx: InferContext) -> list[ValueType | None]:
    types = [tensor_input(ctx, i) for i in range(len(ctx.inputs))]
    dtypes = list(dict.fromkeys(str(t.dtype) for t in types))
    if len(dtypes) > 1:
        raise ctx.error(f"inputs must share one element type, got {', '.join(dtypes)}")
    shapes = [t.shape for t in types if t.shape is not None]
    if not shapes:
        return [TensorType(types[0].dtype, None)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ctx.error(f"inputs have different ranks: {[_fmt(s) for s in shapes]}")
    if rank == 0:
        raise ctx.error("cannot concatenate scalars (rank-0 inputs)")
    axis = normalize_axis(ctx.attrs["axis"], rank, ctx)
    dims: list[Dim] = []
    for i in range(rank):
        if i == axis:
            axis_dims = [s[i] for s in shapes]
            known = len(shapes) == len(types) and all(d is not None for d in axis_dims)
            dims.append(sum(axis_dims) if known else None)
        else:
            dims.append(_merge_equal_dims(ctx, [s[i] for s in shapes],
                                          f"inputs differ in dim {i} outside the concat axis"))
    return [TensorType(types[0].dtype, tuple(dims))]


@op("Concat", family="shape", infer=_infer_concat, attrs={"axis": Attr.int(REQUIRED)})
def concat(ctx, *inputs, axis):
    """The inputs joined along ``axis``; all other dims must agree."""
    rank = inputs[0].ndim
    if any(x.ndim != rank for x in inputs):
        raise ctx.error(f"inputs have different ranks: {[list(x.shape) for x in inputs]}")
    if rank == 0:
        raise ctx.error("cannot concatenate scalars (rank-0 inputs)")
    axis = normalize_axis(axis, rank, ctx)
    for x in inputs[1:]:
        if any(a != b for i, (a, b) in enumerate(zip(x.shape, inputs[0].shape)) if i != axis):
            raise ctx.error(f"input shapes {[list(x.shape) for x in inputs]} differ outside "
                            f"the concat axis {axis}")
    return np.concatenate(inputs, axis=axis)


# ----------------------------------------------------------------------------- Split


def split_sizes(ctx: Ctx, dim: Dim, split: list[int] | None, num_outputs: int | None,
                count: int, lenient: bool = False) -> list[Dim]:
    """The sizes of the ``count`` parts of a dim of size ``dim``.

    ``split`` gives them explicitly; otherwise the parts are ceil(dim / count) long and the last
    one takes the remainder (Split-18's ``num_outputs`` rule, also used when neither is given).
    A dim too small for ``count`` such parts is an error, or (``lenient``, for shape inference,
    which also visits If branches that never run) an unknown last part.
    """
    if split is not None:
        if num_outputs is not None:
            raise ctx.error("give either the split input or num_outputs, not both")
        if len(split) != count:
            raise ctx.error(f"split {split} has {len(split)} entries for {count} outputs")
        if any(s < 0 for s in split):
            raise ctx.error(f"split {split} has a negative size")
        if dims_equal(dim, sum(split)) is False:
            raise ctx.error(f"split {split} sums to {sum(split)}, the split dim is {dim}")
        return list(split)
    if num_outputs is not None and num_outputs != count:
        raise ctx.error(f"num_outputs={num_outputs} but the node has {count} outputs")
    if count < 1:
        raise ctx.error("Split needs at least one output")
    if not isinstance(dim, int):
        part = exact_divide(dim, count) if dim is not None else None
        return [part] * count
    part = -(-dim // count)
    last = dim - part * (count - 1)
    if last < 0:
        if lenient:
            return [part] * (count - 1) + [None]
        raise ctx.error(f"cannot split a dim of size {dim} into {count} parts")
    return [part] * (count - 1) + [last]


def _infer_split(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    count = ctx.num_outputs
    if data.shape is None:
        return [TensorType(data.dtype, None)] * count
    axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
    split = known_ints(ctx, 1) if ctx.has_input(1) else None
    if ctx.has_input(1) and split is None:
        sizes: list[Dim] = [None] * count
    else:
        sizes = split_sizes(ctx, data.shape[axis], split, ctx.attrs["num_outputs"], count,
                            lenient=True)
    return [TensorType(data.dtype, data.shape[:axis] + (s,) + data.shape[axis + 1:])
            for s in sizes]


@op("Split", family="shape", infer=_infer_split, outputs=(1, -1),
    attrs={"axis": Attr.int(0), "num_outputs": Attr.int(None)})
def split(ctx, data, split=None, *, axis, num_outputs):
    """data cut along ``axis`` into parts of the sizes ``split`` (or equal parts)."""
    axis = normalize_axis(axis, data.ndim, ctx)
    sizes = split_sizes(ctx, data.shape[axis],
                        None if split is None else int_list(ctx, split, "split"),
                        num_outputs, ctx.num_outputs)
    bounds = np.cumsum([0] + sizes).tolist()
    return tuple(data[(slice(None),) * axis + (slice(begin, end),)]
                 for begin, end in zip(bounds[:-1], bounds[1:]))


# ----------------------------------------------------------------------------- Slice


def slice_spec(ctx: Ctx, rank: int, starts: list[Dim], ends: list[Dim],
                axes: list[int] | None, steps: list[int] | None) -> list[tuple[int, Dim, Dim, int]]:
    """(axis, start, end, step) per sliced axis, checked against each other."""
    count = len(starts)
    if len(ends) != count:
        raise ctx.error(f"starts has {count} entries but ends has {len(ends)}")
    axes = list(range(count)) if axes is None else axes
    steps = [1] * count if steps is None else steps
    if len(axes) != count or len(steps) != count:
        raise ctx.error(f"starts, ends, axes and steps must have the same length, got "
                        f"{count}, {len(ends)}, {len(axes)}, {len(steps)}")
    if any(s == 0 for s in steps):
        raise ctx.error(f"steps {steps} contain 0")
    axes = normalize_axes(ctx, axes, rank)
    return list(zip(axes, starts, ends, steps))


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """start/end made non-negative and clamped as ONNX specifies (end may become -1)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return _clamp(start, 0, dim), _clamp(end, 0, dim)
    return _clamp(start, 0, dim - 1), _clamp(end, -1, dim - 1)


def _slice_length(dim: Dim, start: Dim, end: Dim, step: int) -> Dim:
    """Number of elements a slice takes from a dim; None when it depends on unknown sizes.

    For a symbolic dim only slices that span the whole dim are known (``x[::2]``,
    ``x[::-1]``): a partial one depends on whether the dim is smaller than its bounds.
    """
    if isinstance(dim, int) and isinstance(start, int) and isinstance(end, int):
        start, end = slice_bounds(dim, start, end, step)
        return max(0, -(-(end - start) // step))
    if dim is None:
        return None
    if step > 0:
        whole = is_int(start, 0) and (dims_equal(end, dim) or
                                      (isinstance(end, int) and end >= SLICE_TO_END))
    else:
        whole = ((is_int(start, -1) or (isinstance(start, int) and start >= SLICE_TO_END))
                 and isinstance(end, int) and end <= -SLICE_TO_END)
    return _ceil_divide(dim, abs(step)) if whole else None


def _ceil_divide(dim: Dim, divisor: int) -> Dim:
    """ceil(dim / divisor) when it is a polynomial (``2*N`` / 2, ``2*N + 1`` / 2), else None."""
    if isinstance(dim, int):
        return -(-dim // divisor)
    for remainder in range(min(divisor, 64)):  # dim + r divisible for one r < divisor, if any
        quotient = exact_divide(dim + remainder, divisor)
        if quotient is not None:
            return quotient
    return None


def _infer_slice(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    starts, ends = known_dims(ctx, 1), known_dims(ctx, 2)
    axes = known_ints(ctx, 3) if ctx.has_input(3) else None
    steps = known_ints(ctx, 4) if ctx.has_input(4) else None
    axes_unknown = ctx.has_input(3) and axes is None
    if axes_unknown or starts is None or ends is None or (ctx.has_input(4) and steps is None):
        if axes is None and not axes_unknown:
            count = vector_length(ctx, 1)
            if count is not None:  # the slices touch only the first `count` axes
                return [TensorType(data.dtype, (None,) * count + data.shape[count:])]
        if axes is not None:
            touched = set(normalize_axes(ctx, axes, rank))
            return [TensorType(data.dtype, tuple(None if i in touched else d
                                                 for i, d in enumerate(data.shape)))]
        return [TensorType(data.dtype, unknown_dims(rank))]
    dims = list(data.shape)
    for axis, start, end, step in slice_spec(ctx, rank, starts, ends, axes, steps):
        dims[axis] = _slice_length(data.shape[axis], start, end, step)
    return [TensorType(data.dtype, tuple(dims))]


@op("Slice", family="shape", infer=_infer_slice)
def slice_(ctx, data, starts, ends, axes=None, steps=None):
    """The elements of data from ``starts`` to ``ends`` (exclusive) by ``steps`` along ``axes``."""
    spec = slice_spec(ctx, data.ndim, int_list(ctx, starts, "starts"),
                       int_list(ctx, ends, "ends"),
                       None if axes is None else int_list(ctx, axes, "axes"),
                       None if steps is None else int_list(ctx, steps, "steps"))
    index = [slice(None)] * data.ndim
    for axis, start, end, step in spec:
        start, end = slice_bounds(data.shape[axis], start, end, step)
        index[axis] = slice(start, end if end >= 0 else None, step)
    return data[tuple(index)]


# ----------------------------------------------------------------------------- Expand, Tile


def _expanded_shape(ctx: Ctx, shape: Sequence[Dim], target: Sequence[Dim]) -> Shape | None:
    try:
        return broadcast_shapes([tuple(shape), tuple(target)])
    except ShapeError:
        raise ctx.error(f"cannot expand shape {_fmt(shape)} to {_fmt(target)}") from None


def _infer_expand(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    target = known_dims(ctx, 1)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    if target is None:
        length = vector_length(ctx, 1)
        if length is None:
            return [TensorType(data.dtype, None)]
        # Dims of the input other than 1 survive broadcasting; the rest comes from the target.
        rank = max(length, len(data.shape))
        padded = (1,) * (rank - len(data.shape)) + data.shape
        return [TensorType(data.dtype, tuple(d if is_int(d) and d != 1 else None
                                             for d in padded))]
    return [TensorType(data.dtype, _expanded_shape(ctx, data.shape, target))]


@op("Expand", family="shape", infer=_infer_expand)
def expand(ctx, data, shape):
    """data broadcast (numpy rules, in both directions) with the given shape."""
    target = _expanded_shape(ctx, data.shape, int_list(ctx, shape, "the shape input"))
    return np.broadcast_to(data, target).copy()


def _infer_tile(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    repeats = known_dims(ctx, 1)
    if repeats is None:
        return [TensorType(data.dtype, tuple(d if is_int(d, 0) else None for d in data.shape))]
    _check_repeats(ctx, repeats, len(data.shape))
    return [TensorType(data.dtype, tuple(d * r if d is not None else (0 if is_int(r, 0) else None)
                                         for d, r in zip(data.shape, repeats)))]


def _check_repeats(ctx: Ctx, repeats: Sequence[Dim], rank: int) -> None:
    if len(repeats) != rank:
        raise ctx.error(f"repeats {_fmt(repeats)} must have one entry per input dim ({rank})")
    if any(isinstance(r, int) and r < 0 for r in repeats):
        raise ctx.error(f"repeats {_fmt(repeats)} must not be negative")


@op("Tile", family="shape", infer=_infer_tile)
def tile(ctx, data, repeats):
    """data repeated ``repeats[i]`` times along each axis i."""
    counts = int_list(ctx, repeats, "repeats")
    _check_repeats(ctx, counts, data.ndim)
    return np.tile(data, counts)


# ----------------------------------------------------------------------------- Pad

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_widths(ctx: Ctx, rank: int, pads: list[int], axes: list[int] | None
                ) -> list[tuple[int, int]]:
    """(before, after) per axis from ONNX pads ``[b_1, ..., b_n, e_1, ..., e_n]``."""
    axes = list(range(rank)) if axes is None else normalize_axes(ctx, axes, rank)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must hold 2 values per padded axis ({len(axes)} axes)")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[len(axes) + i])
    return widths


def _padded_dim(ctx: Ctx, dim: Dim, before: int, after: int) -> Dim:
    if dim is None:
        return None
    result = dim + before + after
    if isinstance(result, int) and result < 0:
        raise ctx.error(f"pads ({before}, {after}) remove more than the {dim} elements of a dim")
    return result


def _infer_pad(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    check_attr(ctx, "mode", ctx.attrs["mode"], _PAD_MODES)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    pads = known_ints(ctx, 1)
    axes = known_ints(ctx, 3) if ctx.has_input(3) else None
    if ctx.has_input(3) and axes is None:
        return [TensorType(data.dtype, unknown_dims(rank))]
    if pads is None:
        touched = set(range(rank) if axes is None else normalize_axes(ctx, axes, rank))
        return [TensorType(data.dtype, tuple(None if i in touched else d
                                             for i, d in enumerate(data.shape)))]
    widths = pad_widths(ctx, rank, pads, axes)
    return [TensorType(data.dtype, tuple(_padded_dim(ctx, d, b, a)
                                         for d, (b, a) in zip(data.shape, widths)))]


def _fill_value(data: np.ndarray, constant_value: np.ndarray | None) -> object:
    """The constant to pad with, in data's dtype (0, False or '' by default)."""
    if constant_value is None or np.asarray(constant_value).size == 0:
        return "" if data.dtype == object else np.zeros((), data.dtype)
    value = np.asarray(constant_value).reshape(-1)[0]
    return value if data.dtype == object else np.asarray(value).astype(data.dtype)


@op("Pad", family="shape", infer=_infer_pad, attrs={"mode": Attr.string("constant")})
def pad(ctx, data, pads, constant_value=None, axes=None, *, mode):
    """data padded (negative pads crop) with a constant, its reflection, edge or wrap-around."""
    check_attr(ctx, "mode", mode, _PAD_MODES)
    widths = pad_widths(ctx, data.ndim, int_list(ctx, pads, "pads"),
                         None if axes is None else int_list(ctx, axes, "axes"))
    for dim, (before, after) in zip(data.shape, widths):
        _padded_dim(ctx, dim, before, after)
    crop = tuple(slice(max(-before, 0), dim - max(-after, 0))
                 for dim, (before, after) in zip(data.shape, widths))
    data = data[crop]
    grow = [(max(before, 0), max(after, 0)) for before, after in widths]
    if mode == "constant":
        out_shape = [dim + before + after for dim, (before, after) in zip(data.shape, grow)]
        out = np.full(out_shape, _fill_value(data, constant_value), dtype=data.dtype)
        out[tuple(slice(before, before + dim) for dim, (before, _) in zip(data.shape, grow))] = data
        return out
    for dim, (before, after) in zip(data.shape, grow):
        if dim == 0 and (before or after):
            raise ctx.error(f"mode '{mode}' cannot pad an axis that has no elements")
        if mode == "reflect" and max(before, after) > dim - 1:
            raise ctx.error(f"reflect pads ({before}, {after}) must be less than the size of "
                            f"the axis ({dim}) after cropping")
    return np.pad(data, grow, mode=mode)


# ----------------------------------------------------------------------------- CenterCropPad


def _crop_pad_axes(ctx: Ctx, rank: int, axes: list[int] | None, count: int) -> list[int]:
    axes = list(range(rank)) if axes is None else normalize_axes(ctx, axes, rank)
    if len(axes) != count:
        raise ctx.error(f"the shape input has {count} entries for {len(axes)} axes")
    return axes


def _infer_center_crop_pad(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is None:
        return [TensorType(data.dtype, None)]
    rank = len(data.shape)
    target = known_dims(ctx, 1)
    count = len(target) if target is not None else vector_length(ctx, 1)
    axes_attr = ctx.attrs["axes"]
    if count is None:
        if axes_attr is None:
            return [TensorType(data.dtype, unknown_dims(rank))]
        count = len(axes_attr)
    axes = _crop_pad_axes(ctx, rank, axes_attr, count)
    dims = list(data.shape)
    for i, axis in enumerate(axes):
        dims[axis] = None if target is None else target[i]
    return [TensorType(data.dtype, tuple(dims))]


@op("CenterCropPad", family="shape", infer=_infer_center_crop_pad, attrs={"axes": Attr.ints()})
def center_crop_pad(ctx, data, shape, *, axes):
    """data centre-cropped or zero-padded to ``shape`` along ``axes``."""
    target = int_list(ctx, shape, "the shape input")
    axes = _crop_pad_axes(ctx, data.ndim, axes, len(target))
    if any(t < 0 for t in target):
        raise ctx.error(f"the target shape {target} has a negative dim")
    out_shape = list(data.shape)
    source = [slice(None)] * data.ndim
    dest = [slice(None)] * data.ndim
    for axis, size in zip(axes, target):
        dim = data.shape[axis]
        out_shape[axis] = size
        if size < dim:
            begin = (dim - size) // 2
            source[axis] = slice(begin, begin + size)
        elif size > dim:
            begin = (size - dim) // 2
            dest[axis] = slice(begin, begin + dim)
    out = np.zeros(out_shape, dtype=data.dtype)
    out[tuple(dest)] = data[tuple(source)]
    return out


# ----------------------------------------------------------------------------- DepthToSpace

_BLOCK_MODES = ("DCR", "CRD")


def _block_layout(ctx: Ctx, shape: Sequence[Dim] | None, blocksize: int, mode: str) -> None:
    check_attr(ctx, "mode", mode, _BLOCK_MODES)
    if blocksize < 1:
        raise ctx.error(f"blocksize must be positive, got {blocksize}")
    if shape is not None and len(shape) != 4:
        raise ctx.error(f"the input must have rank 4 (N, C, H, W), got {_fmt(shape)}")


def _depth_to_space_dims(ctx: Ctx, shape: Sequence[Dim], bs: int) -> Shape:
    n, c, h, w = shape
    depth = None if c is None else exact_divide(c, bs * bs)
    if depth is None and is_int(c):
        raise ctx.error(f"channels ({c}) must be a multiple of blocksize**2 ({bs * bs})")
    return (n, depth, None if h is None else h * bs, None if w is None else w * bs)


def _block_infer(dims: Callable[[Ctx, Sequence[Dim], int], Shape]) -> InferFn:
    """infer of DepthToSpace/SpaceToDepth: the output shape is ``dims(ctx, shape, blocksize)``
    of the (N, C, H, W) input shape."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        data = tensor_input(ctx, 0)
        bs = ctx.attrs["blocksize"]
        _block_layout(ctx, data.shape, bs, ctx.attrs["mode"])
        if data.shape is None:
            return [TensorType(data.dtype, unknown_dims(4))]
        return [TensorType(data.dtype, dims(ctx, data.shape, bs))]

    return infer


@op("DepthToSpace", family="shape", infer=_block_infer(_depth_to_space_dims),
    attrs={"blocksize": Attr.int(REQUIRED), "mode": Attr.string("DCR")})
def depth_to_space(ctx, data, *, blocksize, mode):
    """Channels moved into blocksize x blocksize spatial blocks (DCR or CRD order)."""
    _block_layout(ctx, data.shape, blocksize, mode)
    n, c, h, w = data.shape
    bs = blocksize
    out_shape = _depth_to_space_dims(ctx, data.shape, bs)
    if mode == "DCR":
        blocks = data.reshape(n, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = data.reshape(n, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return blocks.reshape(out_shape)


def _space_to_depth_dims(ctx: Ctx, shape: Sequence[Dim], bs: int) -> Shape:
    n, c, h, w = shape
    spatial = []
    for name, d in (("height", h), ("width", w)):
        q = None if d is None else exact_divide(d, bs)
        if q is None and is_int(d):
            raise ctx.error(f"{name} ({d}) must be a multiple of blocksize ({bs})")
        spatial.append(q)
    return (n, None if c is None else c * bs * bs, spatial[0], spatial[1])


@op("SpaceToDepth", family="shape", infer=_block_infer(_space_to_depth_dims),
    attrs={"blocksize": Attr.int(REQUIRED), "mode": Attr.string("DCR")})
def space_to_depth(ctx, data, *, blocksize, mode):
    """blocksize x blocksize spatial blocks moved into channels (DCR or CRD order)."""
    _block_layout(ctx, data.shape, blocksize, mode)
    n, c, h, w = data.shape
    bs = blocksize
    out_shape = _space_to_depth_dims(ctx, data.shape, bs)
    blocks = data.reshape(n, c, h // bs, bs, w // bs, bs)
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return blocks.transpose(order).reshape(out_shape)
