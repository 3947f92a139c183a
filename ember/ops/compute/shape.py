"""Compute definitions of the data-movement ops: layout changes, joins and cuts, padding,
gathers and the generators.

None of these computes new values: each output element is an input element at an index that
is an affine (or, for Gather, data-dependent) function of the output index, or a constant.
Writing them as compute definitions makes them kernels like any other (fusable and
vectorizable later) instead of numpy callbacks.

Parameters that decide the output shape (Reshape's shape, Slice's starts, Pad's pads ...) must
be compile-time constants (``ctx.value``): the pipeline compiles static shapes, so they are.
Parameters that only pick values (Gather's indices, Pad's fill value, Trilu's k, Range's start)
may also be run-time tensors and are loaded.

Where an index may fall outside its tensor for some output elements (Concat's pieces, Pad's
border) the load is masked, so that vectorized code never touches memory out of bounds.  A
*data-dependent* index (Gather's) is an error when out of range, as in the reference: the
definition declares the valid range (``ctx.require_in_range``), the compiled model checks the
index input before the kernel runs and reports the node, and the kernel still clamps its loads
so that no value can make it read outside its input.  The index rules themselves come from the references' helpers in
``ember/ops/shape.py`` so the two cannot drift apart.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

import ember.ops.families  # noqa: F401  (registers the ops these definitions attach to)
from ember.core.traced import as_size, expr_of, holds_traced
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.compute import ComputeContext, Tensor, compute, const_like
from ember.ir.loop.expr import INDEX, Cast, Const, Expr, Select, maximum, minimum
from ember.ir.loop.simplify import simplify
from ember.ops.compute.elementwise import (NUMERIC, broadcast_load, convert, logical_and, require,
                                           require_dtypes)
from ember.ops.registry import RefContext, compute_of, get_op
# The references' own index rules (private there, shared on purpose: the two must agree).
from ember.ops.shape import pad_widths, permutation, slice_bounds, slice_spec, int_list
from ember.ops.shape_infer import normalize_axis

# ----------------------------------------------------------------------------- helpers


def out_shape(ctx: ComputeContext, index: int = 0) -> tuple[int, ...]:
    """The static shape of output ``index``, as shape inference computed it."""
    return tuple(as_size(d) for d in ctx.output_types[index].shape)


def ref_ctx(ctx: ComputeContext) -> RefContext:
    """A context for the reference helpers (their errors name the node)."""
    return RefContext(ctx.node, get_op(ctx.node.op), lambda *args: [])


def idx(value: int) -> Const:
    return Const(as_size(value), INDEX)


def flat_index(indices: Sequence[Expr], shape: Sequence[int]) -> Expr:
    """Row-major flat index of ``indices`` in ``shape``."""
    total: Expr = idx(0)
    for index, dim in zip(indices, shape):
        total = total * idx(dim) + index
    return simplify(total)


def masked_load(tensor: Tensor, indices: Sequence[Expr], mask: Expr) -> Expr:
    """``tensor[indices]`` where ``mask`` holds; lanes where it does not are never read."""
    return tensor.masked(indices, mask)


def clamp_index(index: Expr, extent: int) -> Expr:
    return minimum(maximum(index, idx(0)), idx(max(extent - 1, 0)))


def as_index(value: Expr) -> Expr:
    """An element of an index tensor as a loop index (int64)."""
    return value if value.dtype == INDEX else Cast(INDEX, value)


def wrap_negative(index: Expr, extent: int) -> Expr:
    """A possibly negative index counted from the end, made non-negative."""
    return Select(index.lt(idx(0)), index + idx(extent), index)


def first_element(tensor: Tensor) -> Expr:
    return tensor.flat(idx(0))


def constant_ints(ctx: ComputeContext, index: int) -> list[int]:
    """The compile-time value of integer input ``index``; NoCompute if it is not known."""
    value = ctx.value(index)
    require(value is not None and (np.asarray(value).dtype.kind in "iu" or holds_traced(value)))
    return int_list(ref_ctx(ctx), value, f"input {index}")


def optional_constant_ints(ctx: ComputeContext, tensor: Tensor | None,
                           index: int) -> list[int] | None:
    """Like :func:`constant_ints` for an optional input: None when it is absent."""
    return None if tensor is None else constant_ints(ctx, index)


def python_scalar(value: np.ndarray, dtype: DType) -> float | int | bool:
    """The first element of ``value`` converted to ``dtype`` as numpy does, as a Python
    number for :func:`const_like`."""
    item = np.asarray(value).reshape(-1)[0].astype(dtype.numpy)
    if dtype == DType.BOOL:
        return bool(item)
    return float(item) if dtype.is_float else int(item)


def require_storable(*tensors: Tensor | None) -> None:
    require_dtypes(tensors, lambda d: d in NUMERIC)


# ----------------------------------------------------------------------------- layout


@compute_of("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(ctx, data, *_shape_inputs, **_attrs):
    """The same elements in the same row-major order: a copy by flat index."""
    require_storable(data)
    shape = out_shape(ctx)
    return compute(shape, lambda *i: data.flat(flat_index(i, shape)), name="reshape")


@compute_of("Transpose")
def transpose(ctx, data, *, perm):
    require_storable(data)
    order = permutation(ref_ctx(ctx), perm, data.ndim)

    def body(*i: Expr) -> Expr:
        source: list[Expr] = [idx(0)] * data.ndim
        for out_axis, in_axis in enumerate(order):
            source[in_axis] = i[out_axis]
        return data[tuple(source)]

    return compute(out_shape(ctx), body, name="transpose")


@compute_of("Expand")
def expand(ctx, data, shape):
    require_storable(data)
    target = out_shape(ctx)
    return compute(target, lambda *i: broadcast_load(data, target, i), name="expand")


@compute_of("Tile")
def tile(ctx, data, repeats):
    require_storable(data)

    def body(*i: Expr) -> Expr:  # (an empty axis makes the output empty: any index will do)
        return data[tuple(index % idx(dim) if dim > 1 else idx(0)
                          for index, dim in zip(i, data.shape))]

    return compute(out_shape(ctx), body, name="tile")


def _depth_space_mode(mode: str, blocksize: int) -> None:
    require(mode in ("DCR", "CRD") and blocksize >= 1)


@compute_of("DepthToSpace")
def depth_to_space(ctx, data, *, blocksize, mode):
    """out[b, c, y, x] = data[b, channel, y // bs, x // bs], the channel picking the block
    offset (y % bs, x % bs): block-major (DCR) or channel-major (CRD)."""
    require_storable(data)
    _depth_space_mode(mode, blocksize)
    bs = idx(blocksize)
    depth = out_shape(ctx)[1]

    def body(b: Expr, c: Expr, y: Expr, x: Expr) -> Expr:
        block = (y % bs) * bs + x % bs
        channel = block * idx(depth) + c if mode == "DCR" else c * idx(blocksize ** 2) + block
        return data[b, channel, y // bs, x // bs]

    return compute(out_shape(ctx), body, name="depth_to_space")


@compute_of("SpaceToDepth")
def space_to_depth(ctx, data, *, blocksize, mode):
    """The inverse layout of DepthToSpace: out[b, channel, y, x] with the channel naming the
    input channel and the offset inside the blocksize x blocksize block."""
    require_storable(data)
    _depth_space_mode(mode, blocksize)
    bs, channels = idx(blocksize), data.shape[1]

    def body(b: Expr, channel: Expr, y: Expr, x: Expr) -> Expr:
        if mode == "DCR":
            block, c = channel // idx(channels), channel % idx(channels)
        else:
            c, block = channel // idx(blocksize ** 2), channel % idx(blocksize ** 2)
        return data[b, c, y * bs + block // bs, x * bs + block % bs]

    return compute(out_shape(ctx), body, name="space_to_depth")


# ----------------------------------------------------------------------------- join, cut


@compute_of("Concat")
def concat(ctx, *inputs, axis):
    """Selects on the position along ``axis``; each piece's load is masked to its own range."""
    require_storable(*inputs)
    shape = out_shape(ctx)
    axis = normalize_axis(axis, len(shape))
    pieces: list[tuple[int, Tensor]] = []
    offset = 0
    for tensor in inputs:
        if tensor.shape[axis]:
            pieces.append((offset, tensor))
        offset += tensor.shape[axis]

    total = offset

    def piece(k: int, i: tuple[Expr, ...]) -> Expr:
        """Piece ``k``'s element, its load masked to its own range (a vector select
        evaluates both sides, so neither may read outside its tensor)."""
        start, tensor = pieces[k]
        position = i[axis]
        local = list(i)
        local[axis] = position - idx(start)
        end = start + tensor.shape[axis]
        inside = position.ge(idx(start)) if start else None
        if end < total:
            below = position.lt(idx(end))
            inside = below if inside is None else logical_and(inside, below)
        return masked_load(tensor, local, inside)

    def select_tree(lo: int, hi: int, i: tuple[Expr, ...]) -> Expr:
        """Pieces ``lo..hi-1`` as a balanced tree of selects on the position (a Concat of a
        thousand inputs is 10 selects deep, not 1,000)."""
        if hi - lo == 1:
            return piece(lo, i)
        middle = (lo + hi) // 2
        return Select(i[axis].lt(idx(pieces[middle][0])), select_tree(lo, middle, i),
                      select_tree(middle, hi, i))

    def body(*i: Expr) -> Expr:
        return select_tree(0, len(pieces), i)

    if not pieces:  # every input is empty along the axis: so is the output
        return compute(shape, lambda *i: const_like(0, inputs[0].dtype), name="concat")
    return compute(shape, body, name="concat")


@compute_of("Split")
def split(ctx, data, split=None, *, axis, num_outputs):
    """Each output reads its range of the input along ``axis`` (sizes from the output types)."""
    require_storable(data)
    axis = normalize_axis(axis, data.ndim)
    outputs, start = [], 0
    for k in range(ctx.num_outputs):
        shape = out_shape(ctx, k)

        def body(*i: Expr, start: int = start) -> Expr:
            return data[i[:axis] + (i[axis] + idx(start),) + i[axis + 1:]]

        outputs.append(compute(shape, body, name="split"))
        start += shape[axis]
    return tuple(outputs)


@compute_of("Slice")
def slice_(ctx, data, starts, ends, axes=None, steps=None):
    """out[..., i, ...] = data[..., start + i * step, ...] along each sliced axis, with the
    bounds clamped as the reference clamps them."""
    require_storable(data)
    spec = slice_spec(ref_ctx(ctx), data.ndim, constant_ints(ctx, 1), constant_ints(ctx, 2),
                       optional_constant_ints(ctx, axes, 3),
                       optional_constant_ints(ctx, steps, 4))
    begin, stride = [0] * data.ndim, [1] * data.ndim
    for axis, start, end, step in spec:
        begin[axis] = slice_bounds(data.shape[axis], start, end, step)[0]
        stride[axis] = step

    def body(*i: Expr) -> Expr:
        return data[tuple(simplify(idx(b) + index * idx(s))
                          for index, b, s in zip(i, begin, stride))]

    return compute(out_shape(ctx), body, name="slice")


# ----------------------------------------------------------------------------- Pad

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


class _PadAxis(NamedTuple):
    """How Pad treats one axis: the input is cropped (``crop`` elements dropped in front,
    ``kept`` left), then grown by ``grow`` in front; ``padded`` if any element is added."""

    grow: int
    crop: int
    kept: int
    padded: bool


def _pad_source(index: Expr, axis: _PadAxis, mode: str) -> tuple[Expr, Expr]:
    """(input index, whether it lies inside the kept input) of output ``index`` along
    ``axis``; outside, the mode decides which input element is repeated."""
    j = index - idx(axis.grow)  # position in the kept part
    inside = logical_and(j.ge(idx(0)), j.lt(idx(axis.kept)))
    if mode == "edge":
        j = clamp_index(j, axis.kept)
    elif mode == "wrap":
        j = j % idx(axis.kept)
    elif mode == "reflect":
        if axis.kept == 1:
            j = idx(0)
        else:
            period = 2 * (axis.kept - 1)
            m = j % idx(period)
            j = Select(m.lt(idx(axis.kept)), m, idx(period) - m)
    return simplify(j + idx(axis.crop)), inside


@compute_of("Pad")
def pad(ctx, data, pads, constant_value=None, axes=None, *, mode):
    require_storable(data, constant_value)
    require(mode in _PAD_MODES)
    widths = pad_widths(ref_ctx(ctx), data.ndim, constant_ints(ctx, 1),
                         optional_constant_ints(ctx, axes, 3))
    spec: list[_PadAxis] = []
    for dim, out_dim, (before, after) in zip(data.shape, out_shape(ctx), widths):
        crop, kept = max(-before, 0), dim - max(-before, 0) - max(-after, 0)
        require(kept >= 0)
        if mode != "constant":  # the reference rejects these: let it say why
            require(kept > 0 or (before <= 0 and after <= 0))
        if mode == "reflect":
            require(max(before, after) < max(kept, 1))
        spec.append(_PadAxis(max(before, 0), crop, kept, out_dim != kept))
    fill = _pad_fill(ctx, data, constant_value)
    if any(axis.kept == 0 for axis in spec):
        # Nothing of the input survives: all fill (in the other modes the output is empty).
        return compute(out_shape(ctx), lambda *i: fill, name="pad")

    def body(*i: Expr) -> Expr:
        sources = [_pad_source(index, axis, mode) for index, axis in zip(i, spec)]
        indices = [source for source, _ in sources]
        inside: Expr | None = None
        if mode == "constant":
            for (_, axis_inside), axis in zip(sources, spec):
                if axis.padded:
                    inside = axis_inside if inside is None else logical_and(inside, axis_inside)
        if inside is None:  # every output element is an input element
            return data[tuple(indices)]
        return Select(inside, masked_load(data, indices, inside), fill)

    return compute(out_shape(ctx), body, name="pad")


def constant_padding(ctx: ComputeContext, data_dtype: DType
                     ) -> tuple[tuple[int, ...], Expr] | None:
    """(elements added in front along each axis, the value they hold) of a Pad that only
    adds elements of one compile-time value around its input -- constant mode, known
    non-negative pads, a known fill --, or None.  Such a Pad can be the store of its
    input's producer (``ember.lower.group``)."""
    if ctx.attrs.get("mode", "constant") != "constant":
        return None
    pads, axes = ctx.value(1), ctx.value(3) if len(ctx.node.inputs) > 3 else None
    if pads is None or holds_traced(pads) or np.asarray(pads).dtype.kind not in "iu" or \
            (len(ctx.node.inputs) > 3 and ctx.node.inputs[3] and
             (axes is None or holds_traced(axes))):
        return None
    rank = len(ctx.input_types[0].shape)
    try:
        widths = pad_widths(ref_ctx(ctx), rank, [int(v) for v in np.asarray(pads).reshape(-1)],
                            None if axes is None else
                            [int(v) for v in np.asarray(axes).reshape(-1)])
    except EmberError:
        return None  # the compute proper reports it
    if any(before < 0 or after < 0 for before, after in widths):
        return None
    if len(ctx.node.inputs) < 3 or not ctx.node.inputs[2]:
        return tuple(before for before, _ in widths), const_like(0, data_dtype)
    known = ctx.value(2)
    if known is None or holds_traced(known):
        return None
    if np.asarray(known).size == 0:
        return tuple(before for before, _ in widths), const_like(0, data_dtype)
    return tuple(before for before, _ in widths), \
        const_like(python_scalar(known, data_dtype), data_dtype)


def _pad_fill(ctx: ComputeContext, data: Tensor, constant_value: Tensor | None) -> Expr:
    """The value Pad fills with, in data's dtype (0 when absent or empty)."""
    if constant_value is None or constant_value.size == 0:
        return const_like(0, data.dtype)
    known = ctx.value(2)
    if known is not None:
        return const_like(python_scalar(known, data.dtype), data.dtype)
    return convert(first_element(constant_value), data.dtype)


# ----------------------------------------------------------------------------- gathers


@compute_of("Gather")
def gather(ctx, data, indices, *, axis):
    """out[pre, j, post] = data[pre, indices[j], post]; negative indices count from the end."""
    require_storable(data)
    require_dtypes([indices], lambda d: d.is_int)
    require(data.ndim > 0)
    axis = normalize_axis(axis, data.ndim)
    dim, count = data.shape[axis], indices.ndim
    known = ctx.value(1)
    constant: int | None = None
    if known is not None and np.ndim(known) == 0:  # one constant index: a plain slice
        constant = int(known) + dim if int(known) < 0 else int(known)
        require(0 <= constant < dim)  # else the reference reports the bad index
    if known is None:  # constant indices were range-checked by shape inference
        ctx.require_in_range(1, -dim, dim)

    def body(*i: Expr) -> Expr:
        pre, picked, post = i[:axis], i[axis:axis + count], i[axis + count:]
        if constant is not None:
            position: Expr = idx(constant)
        else:
            position = clamp_index(wrap_negative(as_index(indices[picked]), dim), dim)
        return data[pre + (position,) + post]

    return compute(out_shape(ctx), body, name="gather")


@compute_of("GatherElements")
def gather_elements(ctx, data, indices, *, axis):
    """out[i] = data[i with axis replaced by indices[i]]."""
    require_storable(data)
    require_dtypes([indices], lambda d: d.is_int)
    axis = normalize_axis(axis, data.ndim)
    dim = data.shape[axis]
    if ctx.value(1) is None:  # constant indices were range-checked by shape inference
        ctx.require_in_range(1, -dim, dim)

    def body(*i: Expr) -> Expr:
        position = clamp_index(wrap_negative(as_index(indices[i]), dim), dim)
        return data[i[:axis] + (position,) + i[axis + 1:]]

    return compute(out_shape(ctx), body, name="gather_elements")


@compute_of("GatherND")
def gather_nd(ctx, data, indices, *, batch_dims):
    """out[t, rest] = data[batch(t), indices[t, 0], ..., indices[t, k-1], rest]: the leading
    output axes walk the index tuples (the first ``batch_dims`` of them shared with data), the
    others the slice each tuple addresses."""
    require_storable(data)
    require_dtypes([indices], lambda d: d.is_int)
    b = batch_dims
    require(indices.ndim >= 1 and 0 <= b < min(data.ndim, indices.ndim))
    k = indices.shape[-1]
    require(b + k <= data.ndim and data.shape[:b] == indices.shape[:b])
    addressed = data.shape[b:b + k]
    if ctx.value(1) is None and addressed:  # constant tuples were checked by shape inference
        # sizes compared as expressions: comparing traced sizes would pin their samples
        if len({expr_of(dim) for dim in addressed}) == 1:
            ctx.require_in_range(1, -addressed[0], addressed[0])
        else:  # each component has the range of the dim it addresses
            for component, dim in enumerate(addressed):
                ctx.require_in_range(1, -dim, dim, start=component, stride=len(addressed))
    lead = indices.ndim - 1

    def body(*i: Expr) -> Expr:
        components = [clamp_index(wrap_negative(as_index(indices[i[:lead] + (idx(j),)]), dim),
                                  dim)
                      for j, dim in enumerate(addressed)]
        return data[i[:b] + tuple(components) + i[lead:]]

    return compute(out_shape(ctx), body, name="gather_nd")


# ----------------------------------------------------------------------------- masks


@compute_of("Trilu")
def trilu(ctx, data, k=None, *, upper):
    """Elements on the kept side of diagonal ``k`` of the last two dims, zeros elsewhere."""
    require_storable(data)
    require(data.ndim >= 2)
    if k is None:
        diagonal: Expr = idx(0)
    elif ctx.value(1) is not None:
        diagonal = idx(constant_ints(ctx, 1)[0])
    else:
        require_dtypes([k], lambda d: d.is_int)
        diagonal = as_index(first_element(k))

    def body(*i: Expr) -> Expr:
        offset = i[-1] - i[-2]
        keep = offset.ge(diagonal) if upper else offset.le(diagonal)
        return Select(keep, data[i], const_like(0, data.dtype))

    return compute(out_shape(ctx), body, name="trilu")


@compute_of("OneHot")
def one_hot(ctx, indices, depth, values, *, axis):
    """values[1] where the position along the new axis is the index, values[0] elsewhere."""
    require_storable(indices, values)
    require(values.size == 2)
    shape = out_shape(ctx)
    axis = normalize_axis(axis, len(shape))
    count = shape[axis]

    def body(*i: Expr) -> Expr:
        index = as_index(indices[i[:axis] + i[axis + 1:]])
        if not indices.dtype.is_int or indices.dtype.is_signed:
            index = wrap_negative(index, count)
        return Select(index.eq(i[axis]), values.flat(idx(1)), values.flat(idx(0)))

    return compute(shape, body, name="one_hot")


@compute_of("EyeLike")
def eye_like(ctx, data, *, dtype, k):
    out = ctx.output_types[0].dtype
    require(out in NUMERIC)

    def body(i: Expr, j: Expr) -> Expr:
        return Select((j - i).eq(idx(k)), const_like(1, out), const_like(0, out))

    return compute(out_shape(ctx), body, name="eye_like")


# ----------------------------------------------------------------------------- generators


@compute_of("ConstantOfShape")
def constant_of_shape(ctx, shape, *, value):
    out = ctx.output_types[0].dtype
    require(out in NUMERIC)
    fill = 0 if value is None else python_scalar(value, out)
    return compute(out_shape(ctx), lambda *i: const_like(fill, out), name="constant_of_shape")


@compute_of("Range")
def range_(ctx, start, limit, delta, *, stash_type):
    """start + i * delta, accumulated as the reference does: in int64 for integers, in the
    input type for floats (``stash_type`` for float16/bfloat16)."""
    out = ctx.output_types[0].dtype
    require(out in NUMERIC and out != DType.BOOL)
    if out.is_int:
        wide = DType.INT64
    elif out in (DType.FLOAT16, DType.BFLOAT16):
        require(stash_type in (DType.FLOAT32.onnx, DType.FLOAT64.onnx))
        wide = DType.from_onnx(stash_type)
    else:
        wide = out

    def body(i: Expr) -> Expr:
        first, step = (convert(first_element(t), wide) for t in (start, delta))
        return first + (i if wide == INDEX else Cast(wide, i)) * step

    return compute(out_shape(ctx), body, name="range", dtype=out)
