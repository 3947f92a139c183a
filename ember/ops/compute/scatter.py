"""Compute definitions of the scatters: ScatterElements, ScatterND and TensorScatter.

Each is a copy of its data input followed by writes at positions read from an index input
(:func:`ember.ir.compute.scatter`): the writes run one after another in the order of the
updates, as the numpy references apply them, so with repeated positions the last write wins
(reduction ``none``) or every write is combined (``add``, ``mul``, ``max``, ``min``).  The loop
of writes is never run in parallel or on SIMD lanes where its positions come from data.

As for the gathers (``shape.py``), an index out of range is an error naming the node: the
definition declares the valid range (``ctx.require_in_range``), the compiled model checks the
index input before the kernel runs, and the kernel still clamps every position so that no
value can make it write outside its output.
"""

from __future__ import annotations

from ember.core.dtypes import DType
from ember.core.traced import expr_of
from ember.ir.compute import scatter
from ember.ir.loop.expr import Expr
from ember.ops.compute.elementwise import require, require_dtypes
from ember.ops.compute.shape import (as_index, clamp_index, idx, out_shape, require_storable,
                                     wrap_negative)
from ember.ops.registry import compute_of
from ember.ops.shape_infer import normalize_axis

# ONNX's reduction attribute -> the combiner of the writes (None: the update replaces)
COMBINERS = {"none": None, "add": "sum", "mul": "prod", "max": "max", "min": "min"}


def _combiner(data, reduction: str) -> str | None:
    """The writes' combiner; NoCompute for a reduction of booleans (numpy's ``add.at`` on
    bool is a logical or: left to the reference)."""
    require(reduction in COMBINERS)
    combiner = COMBINERS[reduction]
    require(combiner is None or data.dtype != DType.BOOL)
    return combiner


def _position(indices, at: tuple[Expr, ...], dim) -> Expr:
    """The index element at ``at`` as a position along a dim of size ``dim``: negatives
    counted from the end, clamped (out-of-range values were refused before the kernel)."""
    return clamp_index(wrap_negative(as_index(indices[at]), dim), dim)


@compute_of("ScatterElements")
def scatter_elements(ctx, data, indices, updates, *, axis, reduction):
    """out = data; out[u with axis replaced by indices[u]] = updates[u] for every u."""
    require_storable(data, updates)
    require_dtypes([indices], lambda d: d.is_int)
    combiner = _combiner(data, reduction)
    require(data.ndim >= 1 and indices.ndim == data.ndim and updates.shape == indices.shape)
    axis = normalize_axis(axis, data.ndim)
    # (the other dims of the updates must fit the data's: else the reference reports it)
    require(all(u <= d for a, (u, d) in enumerate(zip(indices.shape, data.shape))
                if a != axis))
    dim = data.shape[axis]
    if ctx.value(1) is None:  # constant indices were range-checked by shape inference
        ctx.require_in_range(1, -dim, dim)

    def target(*u: Expr) -> tuple[Expr, ...]:
        return u[:axis] + (_position(indices, u, dim),) + u[axis + 1:]

    return scatter(lambda *i: data[i], out_shape(ctx), indices.shape, target,
                   lambda *u: updates[u], combiner, name="scatter_elements", dtype=data.dtype)


@compute_of("ScatterND")
def scatter_nd(ctx, data, indices, updates, *, reduction):
    """out = data; the slice of out at index tuple ``indices[q]`` = ``updates[q]`` for every
    q (leading dims of ``indices``), element by element."""
    require_storable(data, updates)
    require_dtypes([indices], lambda d: d.is_int)
    combiner = _combiner(data, reduction)
    require(indices.ndim >= 1)
    k = int(indices.shape[-1])
    require(1 <= k <= data.ndim)
    lead = indices.ndim - 1
    require(updates.shape == indices.shape[:-1] + data.shape[k:])
    addressed = data.shape[:k]
    if ctx.value(1) is None:  # constant tuples were checked by shape inference
        # sizes compared as expressions: comparing traced sizes would pin their samples
        if len({expr_of(dim) for dim in addressed}) == 1:
            ctx.require_in_range(1, -addressed[0], addressed[0])
        else:  # each component has the range of the dim it addresses
            for component, dim in enumerate(addressed):
                ctx.require_in_range(1, -dim, dim, start=component, stride=k)

    def target(*u: Expr) -> tuple[Expr, ...]:
        tuple_at = u[:lead]
        return tuple(_position(indices, tuple_at + (idx(j),), dim)
                     for j, dim in enumerate(addressed)) + u[lead:]

    return scatter(lambda *i: data[i], out_shape(ctx), updates.shape, target,
                   lambda *u: updates[u], combiner, name="scatter_nd", dtype=data.dtype)


@compute_of("TensorScatter")
def tensor_scatter(ctx, past_cache, update, write_indices=None, *, axis, mode):
    """out = past_cache; ``update`` written along ``axis`` from each batch's write index
    (``linear``: the index must leave room for the whole update; ``circular``: positions wrap
    around the cache)."""
    require_storable(past_cache, update)
    require(mode in ("linear", "circular"))
    require(past_cache.ndim >= 2 and update.ndim == past_cache.ndim)
    axis = normalize_axis(axis, past_cache.ndim)
    require(axis != 0)
    require(all(u == c for a, (u, c) in enumerate(zip(update.shape, past_cache.shape))
                if a != axis))
    length, steps = past_cache.shape[axis], update.shape[axis]
    if write_indices is not None:
        require_dtypes([write_indices], lambda d: d.is_int)
        require(write_indices.ndim == 1 and write_indices.shape[0] == past_cache.shape[0])
        if mode == "linear":
            require(steps <= length)
            ctx.require_in_range(2, 0, length - steps + 1)
    else:
        require(mode == "circular" or steps <= length)

    def target(*u: Expr) -> tuple[Expr, ...]:
        start = idx(0) if write_indices is None else as_index(write_indices[(u[0],)])
        position = start + u[axis]
        if mode == "circular":
            position = position % idx(length)  # (floor modulo: never negative)
        return u[:axis] + (clamp_index(position, length),) + u[axis + 1:]

    return scatter(lambda *i: past_cache[i], out_shape(ctx), update.shape, target,
                   lambda *u: update[u], name="tensor_scatter", dtype=past_cache.dtype)
