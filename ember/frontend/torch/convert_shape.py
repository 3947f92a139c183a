"""Converters of ATen ops that move, select or create data: views, concatenation, slicing,
indexing, padding, factories, and the arithmetic of symbolic sizes.

Views become copies: after functionalization (``torch.export`` and AOT autograd both run it)
no graph writes through a view, so a copy has the same values.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

from ember.core.dtypes import DType
from ember.frontend.torch.context import (INT64_MAX, ImportContext, Unsupported, same_size,
                                          is_tensor_arg, meta_value, static_int, static_ints)


def _axis(axis: Any, rank: int) -> int:
    axis = static_int(axis, "a dimension")
    if rank == 0 and axis in (0, -1):
        return 0
    if not -rank <= axis < rank:
        raise Unsupported(f"dimension {axis} is out of range for rank {rank}")
    return axis % rank


def _axes_tensor(ctx: ImportContext, axes: list[int]) -> str:
    return ctx.constant(np.array(axes, dtype=np.int64))


# ---------------------------------------------------------------------------- views

def reshape(ctx: ImportContext, node, x, shape) -> str:
    # A 0 in a torch shape is a zero-size dim, not "copy the input's" as in ONNX: allowzero.
    return ctx.add("Reshape", [ctx.tensor(x), ctx.ints(shape)], allowzero=1)


def permute(ctx: ImportContext, node, x, dims) -> str:
    rank = ctx.rank(x)
    perm = [_axis(d, rank) for d in dims]
    if rank == 0:
        return ctx.add("Identity", [ctx.tensor(x)])
    return ctx.add("Transpose", [ctx.tensor(x)], perm=perm)


def transpose(ctx: ImportContext, node, x, dim0, dim1) -> str:
    rank = ctx.rank(x)
    if rank < 2:
        return ctx.add("Identity", [ctx.tensor(x)])
    perm = list(range(rank))
    a, b = _axis(dim0, rank), _axis(dim1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.add("Transpose", [ctx.tensor(x)], perm=perm)


def t(ctx: ImportContext, node, x) -> str:
    return transpose(ctx, node, x, 0, -1) if ctx.rank(x) == 2 else \
        ctx.add("Identity", [ctx.tensor(x)])


def expand(ctx: ImportContext, node, x, sizes, *, implicit=False) -> str:
    rank = ctx.rank(x)
    sizes = list(sizes)
    # -1 keeps the input's size; Expand's broadcasting keeps it for a 1.
    lead = len(sizes) - rank
    target = [1 if (isinstance(s, int) and s == -1 and i >= lead) else s
              for i, s in enumerate(sizes)]
    return ctx.add("Expand", [ctx.tensor(x), ctx.ints(target)])


def squeeze(ctx: ImportContext, node, x, dims=None) -> str:
    """torch.squeeze leaves a dim whose size is not 1 alone (ONNX's Squeeze would fail)."""
    shape = ctx.shape(x)
    rank = len(shape)
    if dims is None:
        candidates = list(range(rank))
    else:
        candidates = [_axis(d, rank) for d in static_ints(dims, "squeeze dims")] if rank else []
    axes = []
    for axis in sorted(set(candidates)):
        size = shape[axis]
        if not isinstance(size, int):
            raise Unsupported("squeeze of a symbolic dim (its size decides whether it goes)")
        if size == 1:
            axes.append(axis)
    if not axes:
        return ctx.add("Identity", [ctx.tensor(x)])
    return ctx.add("Squeeze", [ctx.tensor(x), _axes_tensor(ctx, axes)])


def unsqueeze(ctx: ImportContext, node, x, dim) -> str:
    axis = _axis(dim, ctx.rank(x) + 1)
    return ctx.add("Unsqueeze", [ctx.tensor(x), _axes_tensor(ctx, [axis])])


def cat(ctx: ImportContext, node, tensors, dim=0) -> str:
    out = ctx.out_dtype()
    rank = len(ctx.shape(node))
    # Legacy torch.cat skips 1-D empty tensors beside tensors of another rank.
    kept = [t for t in tensors if not (rank != 1 and ctx.shape(t) == (0,))]
    if not kept:
        return ctx.add("Identity", [ctx.tensor(tensors[0])])
    inputs = [ctx.tensor_as(t, out) for t in kept]
    return ctx.add("Concat", inputs, axis=_axis(dim, rank))


def slice_(ctx: ImportContext, node, x, dim=0, start=None, end=None, step=1) -> str:
    rank = ctx.rank(x)
    axis = _axis(dim, rank)
    step = static_int(step, "slice step")
    if step <= 0:
        raise Unsupported(f"slice step {step}")
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if isinstance(end, int) and end > INT64_MAX:
        end = INT64_MAX
    return ctx.add("Slice", [ctx.tensor(x), ctx.ints([start]), ctx.ints([end]),
                             _axes_tensor(ctx, [axis]), ctx.ints([step])])


def select(ctx: ImportContext, node, x, dim, index) -> str:
    axis = _axis(dim, ctx.rank(x))
    return ctx.add("Gather", [ctx.tensor(x), ctx.symint(index)], axis=axis)


def split_with_sizes(ctx: ImportContext, node, x, sizes, dim=0) -> list[str]:
    axis = _axis(dim, ctx.rank(x))
    sizes = list(sizes)
    outputs = ctx.add("Split", [ctx.tensor(x), ctx.ints(sizes)], outputs=len(sizes), axis=axis)
    return outputs if isinstance(outputs, list) else [outputs]


def split(ctx: ImportContext, node, x, split_size, dim=0) -> list[str]:
    shape = ctx.shape(x)
    axis = _axis(dim, len(shape))
    size = shape[axis]
    split_size = static_int(split_size, "split size")
    if not isinstance(size, int):
        raise Unsupported("split of a symbolic dim")
    if split_size <= 0:
        raise Unsupported(f"split size {split_size}")
    sizes = [min(split_size, size - start) for start in range(0, size, split_size)] or [0]
    return split_with_sizes(ctx, node, x, sizes, axis)


def getitem(ctx: ImportContext, node, source, index) -> str:
    values = ctx.values.get(source)
    if not isinstance(values, (list, tuple)):
        raise Unsupported("getitem of a value that is not a tuple")
    index = static_int(index, "tuple index")
    if not 0 <= index < len(values) or values[index] is None:
        raise Unsupported(f"output {index} of '{source.name}' is not converted")
    return ctx.add("Identity", [values[index]])


def flip(ctx: ImportContext, node, x, dims) -> str:
    rank = ctx.rank(x)
    axes = sorted({_axis(d, rank) for d in static_ints(dims, "flip dims")})
    if not axes:
        return ctx.add("Identity", [ctx.tensor(x)])
    count = len(axes)
    return ctx.add("Slice", [ctx.tensor(x), ctx.constant(np.full(count, -1, dtype=np.int64)),
                             ctx.constant(np.full(count, -INT64_MAX, dtype=np.int64)),
                             _axes_tensor(ctx, axes),
                             ctx.constant(np.full(count, -1, dtype=np.int64))])


def roll(ctx: ImportContext, node, x, shifts, dims=()) -> str:
    shape = ctx.static_shape(x)
    shifts = static_ints(shifts, "roll shifts")
    dims = static_ints(dims, "roll dims") if dims is not None else []
    value = ctx.tensor(x)
    if not dims:  # roll the flattened tensor
        flat = ctx.add("Reshape", [value, ctx.ints([-1])])
        rolled = _roll_axis(ctx, flat, shifts[0], 0, int(np.prod(shape)))
        return ctx.add("Reshape", [rolled, ctx.ints(list(shape))], allowzero=1)
    for shift, dim in zip(shifts, dims):
        axis = _axis(dim, len(shape))
        value = _roll_axis(ctx, value, shift, axis, shape[axis])
    return ctx.add("Identity", [value])


def _roll_axis(ctx: ImportContext, value: str, shift: int, axis: int, size: int) -> str:
    if size == 0 or shift % size == 0:
        return value
    shift %= size
    axes = _axes_tensor(ctx, [axis])
    tail = ctx.add("Slice", [value, ctx.ints([size - shift]), ctx.ints([size]), axes])
    head = ctx.add("Slice", [value, ctx.ints([0]), ctx.ints([size - shift]), axes])
    return ctx.add("Concat", [tail, head], axis=axis)


def repeat(ctx: ImportContext, node, x, repeats) -> str:
    repeats = list(repeats)
    rank = ctx.rank(x)
    value = ctx.tensor(x)
    if len(repeats) > rank:
        lead = list(range(len(repeats) - rank))
        value = ctx.add("Unsqueeze", [value, _axes_tensor(ctx, lead)])
    return ctx.add("Tile", [value, ctx.ints(repeats)])


def trilu(upper: int):
    def convert(ctx: ImportContext, node, x, diagonal=0) -> str:
        return ctx.add("Trilu", [ctx.tensor(x), ctx.symint(diagonal)], upper=upper)
    return convert


def constant_pad(ctx: ImportContext, node, x, pad, value=0) -> str:
    return _pad(ctx, x, pad, "constant", value)


def pad_mode(mode: str):
    def convert(ctx: ImportContext, node, x, pad) -> str:
        return _pad(ctx, x, pad, mode, None)
    return convert


def _pad(ctx: ImportContext, x, pad, mode: str, value) -> str:
    rank = ctx.rank(x)
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise Unsupported(f"pad list of length {len(pad)} for rank {rank}")
    begins: list[Any] = [0] * rank
    ends: list[Any] = [0] * rank
    for i in range(len(pad) // 2):  # torch lists pairs from the last dim backwards
        begins[rank - 1 - i] = pad[2 * i]
        ends[rank - 1 - i] = pad[2 * i + 1]
    inputs = [ctx.tensor(x), ctx.ints(begins + ends)]
    if mode == "constant":
        inputs.append(ctx.scalar(value if value is not None else 0, ctx.out_dtype()))
    return ctx.add("Pad", inputs, mode=mode)


# ---------------------------------------------------------------------------- indexing

def index_select(ctx: ImportContext, node, x, dim, index) -> str:
    axis = _axis(dim, ctx.rank(x))
    indices = ctx.tensor_as(index, DType.INT64)
    if ctx.rank(x) == 0:
        return ctx.add("Reshape", [ctx.tensor(x), ctx.ints(list(ctx.shape(node)))])
    return ctx.add("Gather", [ctx.tensor(x), indices], axis=axis)


def gather(ctx: ImportContext, node, x, dim, index, *, sparse_grad=False) -> str:
    rank = ctx.rank(x)
    if rank == 0:
        raise Unsupported("gather on a 0-d tensor")
    index_shape, data_shape = ctx.shape(index), ctx.shape(x)
    if len(index_shape) != rank:
        raise Unsupported("gather with an index of another rank")
    axis = _axis(dim, rank)
    # torch lets the index be smaller than the input in the non-gathered dims: slice the
    # input down to it first.
    axes = [a for a in range(rank) if a != axis and not same_size(index_shape[a],
                                                                   data_shape[a])]
    data = ctx.tensor(x)
    if axes:
        ends = ctx.add("Gather", [ctx.add("Shape", [ctx.tensor(index)]),
                                  _axes_tensor(ctx, axes)], axis=0)
        data = ctx.add("Slice", [data, ctx.ints([0] * len(axes)), ends,
                                 _axes_tensor(ctx, axes)])
    return ctx.add("GatherElements", [data, ctx.tensor_as(index, DType.INT64)],
                   axis=_axis(dim, rank))


def embedding(ctx: ImportContext, node, weight, indices, padding_idx=-1,
              scale_grad_by_freq=False, sparse=False) -> str:
    return ctx.add("Gather", [ctx.tensor(weight), ctx.tensor_as(indices, DType.INT64)], axis=0)


def scatter(ctx: ImportContext, node, x, dim, index, src, *, reduce=None) -> str:
    """scatter.src/.value, and scatter.reduce/.value_reduce with reduce 'add' or
    'multiply'."""
    modes = {None: "none", "add": "add", "multiply": "mul"}
    if reduce not in modes:
        raise Unsupported(f"scatter reduce={reduce!r}")
    return _scatter(ctx, x, dim, index, src, modes[reduce])


def scatter_add(ctx: ImportContext, node, x, dim, index, src) -> str:
    return _scatter(ctx, x, dim, index, src, "add")


def scatter_reduce(ctx: ImportContext, node, x, dim, index, src, reduce, *,
                   include_self=True) -> str:
    rank = ctx.rank(x)
    if rank == 0:
        raise Unsupported("scatter into a 0-d tensor")
    dtype = ctx.out_dtype()
    updates = _scatter_updates(ctx, index, src, rank, dtype)
    return scatter_reduce_values(ctx, ctx.tensor_as(x, dtype), _axis(dim, rank),
                                 ctx.tensor_as(index, DType.INT64), updates, reduce,
                                 include_self)


def scatter_reduce_values(ctx: ImportContext, data: str, axis: int, positions: str,
                          updates: str, reduce: str, include_self: bool) -> str:
    """scatter_reduce of ``updates`` (shaped like ``positions``) into ``data``, ember values
    of the output's type.

    Without ``include_self``, the positions that receive updates first get the reduction's
    identity (0, 1, the lowest or highest value), so only the updates combine there.  The
    mean divides the sums by the counts of what was summed (1 where nothing was scattered),
    with floor division for integers, as PyTorch does."""
    modes = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}
    if reduce not in modes:
        raise Unsupported(f"scatter_reduce reduce={reduce!r}")
    dtype = ctx.out_dtype()
    if dtype == DType.BOOL:
        raise Unsupported("scatter_reduce of bools")
    shape_of_updates = ctx.add("Shape", [updates])
    if not include_self:
        identity = {"sum": 0, "mean": 0, "prod": 1, "amax": _lowest(dtype),
                    "amin": _highest(dtype)}[reduce]
        fill = ctx.add("Expand", [ctx.scalar(identity, dtype), shape_of_updates])
        data = ctx.add("ScatterElements", [data, positions, fill], axis=axis)
    result = ctx.add("ScatterElements", [data, positions, updates], axis=axis,
                     reduction=modes[reduce])
    if reduce != "mean":
        return result
    ones = ctx.add("Expand", [ctx.scalar(1, dtype), shape_of_updates])
    counts = ctx.add("Expand", [ctx.scalar(1, dtype), ctx.add("Shape", [data])])
    if not include_self:
        zeros = ctx.add("Expand", [ctx.scalar(0, dtype), shape_of_updates])
        counts = ctx.add("ScatterElements", [counts, positions, zeros], axis=axis)
    counts = ctx.add("ScatterElements", [counts, positions, ones], axis=axis, reduction="add")
    counts = ctx.add("Max", [counts, ctx.scalar(1, dtype)])  # nothing summed: keep x
    if dtype.is_float:
        return ctx.add("Div", [result, counts])
    remainder = ctx.add("Mod", [result, counts], fmod=0)
    return ctx.add("Div", [ctx.add("Sub", [result, remainder]), counts])


def _lowest(dtype: DType) -> Any:
    return float("-inf") if dtype.is_float else int(np.iinfo(dtype.numpy).min)


def _highest(dtype: DType) -> Any:
    return float("inf") if dtype.is_float else int(np.iinfo(dtype.numpy).max)


def _scatter_updates(ctx: ImportContext, index, src, rank: int, dtype: DType) -> str:
    """``src`` shaped like ``index``: torch lets a src tensor be larger (only its leading
    part is used) and a scalar src is broadcast."""
    updates = ctx.tensor_as(src, dtype)
    if not is_tensor_arg(src) or ctx.shape(src) != ctx.shape(index):
        if is_tensor_arg(src) and any(i != s for i, s in zip(ctx.shape(index), ctx.shape(src))):
            index_shape = ctx.static_shape(index)
            updates = ctx.add("Slice", [updates, ctx.ints([0] * rank), ctx.ints(index_shape),
                                        _axes_tensor(ctx, list(range(rank)))])
        else:
            updates = ctx.add("Expand", [updates, ctx.ints(list(ctx.shape(index)))])
    return updates


def _scatter(ctx: ImportContext, x, dim, index, src, reduction: str) -> str:
    rank = ctx.rank(x)
    if rank == 0:
        raise Unsupported("scatter into a 0-d tensor")
    dtype = ctx.out_dtype()
    updates = _scatter_updates(ctx, index, src, rank, dtype)
    return ctx.add("ScatterElements", [ctx.tensor_as(x, dtype),
                                       ctx.tensor_as(index, DType.INT64), updates],
                   axis=_axis(dim, rank), reduction=reduction)


# ---------------------------------------------------------------------------- factories

def _fill(ctx: ImportContext, shape: Any, value: Any, dtype: DType) -> str:
    if all(isinstance(d, int) for d in shape) and not isinstance(value, torch.fx.Node):
        array = np.full([int(d) for d in shape], value, dtype=dtype.numpy)
        return ctx.add("Identity", [ctx.constant(array)])
    scalar = ctx.scalar(value, dtype)
    return ctx.add("Expand", [scalar, ctx.ints(list(shape))])


def full(ctx: ImportContext, node, size, fill_value, **kwargs) -> str:
    return _fill(ctx, list(size), fill_value, ctx.out_dtype())


def filled(value: Any):
    """zeros/ones/empty (empty is filled with zeros: its values are unspecified)."""
    def convert(ctx: ImportContext, node, size, *args, **kwargs) -> str:
        return _fill(ctx, list(size), value, ctx.out_dtype())
    return convert


def filled_like(value: Any | None):
    """zeros_like/ones_like/empty_like, or full_like (value None: the argument)."""
    def convert(ctx: ImportContext, node, x, *args, **kwargs) -> str:
        fill_value = args[0] if value is None else value
        shape = ctx.shape(node)
        if all(isinstance(d, int) for d in shape):
            return _fill(ctx, shape, fill_value, ctx.out_dtype())
        scalar = ctx.scalar(fill_value, ctx.out_dtype())
        return ctx.add("Expand", [scalar, ctx.add("Shape", [ctx.tensor(x)])])
    return convert


def new_filled(value: Any | None):
    """new_zeros/new_ones/new_empty, or new_full (value None: the argument)."""
    def convert(ctx: ImportContext, node, x, size, *args, **kwargs) -> str:
        fill_value = args[0] if value is None else value
        return _fill(ctx, list(size), fill_value, ctx.out_dtype())
    return convert


def empty_shaped(ctx: ImportContext, node, size, *args, **kwargs) -> str:
    """empty_strided/empty_permuted: zeros (the values are unspecified, the strides and
    memory layout do not change them)."""
    return _fill(ctx, list(size), 0, ctx.out_dtype())


def new_empty_strided(ctx: ImportContext, node, x, size, *args, **kwargs) -> str:
    return _fill(ctx, list(size), 0, ctx.out_dtype())


def fill(ctx: ImportContext, node, x, value) -> str:
    scalar = ctx.tensor_as(value, ctx.out_dtype())
    if is_tensor_arg(value) and ctx.rank(value) != 0:
        raise Unsupported("fill with a tensor of rank > 0")
    return ctx.add("Expand", [scalar, ctx.add("Shape", [ctx.tensor(x)])])


def scalar_tensor(ctx: ImportContext, node, value, **kwargs) -> str:
    return ctx.add("Identity", [ctx.scalar(value, ctx.out_dtype())])


def arange(ctx: ImportContext, node, *args, **kwargs) -> str:
    """arange(end) / arange.start(start, end) / arange.start_step(start, end, step)."""
    numbers = list(args)
    if len(numbers) == 1:
        numbers = [0, numbers[0], 1]
    elif len(numbers) == 2:
        numbers = [numbers[0], numbers[1], 1]
    dtype = ctx.out_dtype()
    if all(isinstance(n, (int, float)) for n in numbers):
        array = torch.arange(*numbers, dtype=meta_value(node).dtype).numpy() \
            if dtype != DType.BFLOAT16 else None
        if array is not None:
            return ctx.add("Identity", [ctx.constant(array)])
    compute = DType.INT64 if dtype.is_int else DType.FLOAT64
    start, end, step = (ctx.scalar(n, compute) for n in numbers[:3])
    return ctx.cast(ctx.add("Range", [start, end, step]), dtype, compute)


def copy(ctx: ImportContext, node, destination, source, non_blocking=False) -> str:
    """The functional copy_: the source's values, cast and broadcast to the destination."""
    value = ctx.tensor_as(source, ctx.out_dtype())
    return ctx.add("Expand", [value, ctx.add("Shape", [ctx.tensor(destination)])])


# ---------------------------------------------------------------------------- sizes

def sym_size(ctx: ImportContext, node, x, dim) -> str:
    axis = _axis(dim, ctx.rank(x))
    return ctx.dim_size(ctx.tensor(x), axis)


def sym_numel(ctx: ImportContext, node, x) -> str:
    return ctx.add("Size", [ctx.tensor(x)])


_SYM_OPS = {
    operator.add: "Add", operator.sub: "Sub", operator.mul: "Mul",
    operator.floordiv: "Div", operator.mod: "Mod",
}


def sym_arithmetic(ctx: ImportContext, node, a, b) -> str:
    """Arithmetic on sizes (``s0 * 2``): int64 ops.  Sizes are never negative, so C's
    truncating division is floor division here."""
    op = _SYM_OPS.get(node.target)
    if op is None:
        raise Unsupported(f"size arithmetic {node.target}")
    for value in (a, b):
        if not isinstance(meta_value(value), (int, torch.SymInt)):
            raise Unsupported("size arithmetic on a value that is not an integer")
    return ctx.add(op, [ctx.symint(a), ctx.symint(b)])
