"""Helpers shared by the ``infer`` functions of op families.

They work on :class:`~ember.ir.types.TensorType` with symbolic dims and return ``None`` dims (or
a ``None`` shape) where the answer is not knowable at compile time, rather than guessing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ember.core.traced import as_size
from ember.core.dims import Dim, SymDim, dims_equal
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import InferContext


def broadcast_shapes(shapes: Sequence[tuple[Dim, ...] | None]) -> tuple[Dim, ...] | None:
    """Numpy-style multidirectional broadcasting over possibly symbolic shapes."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    result: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        result.append(_broadcast_dim(dims))
    return tuple(result)


def _broadcast_dim(dims: list[Dim]) -> Dim:
    non_one = [d for d in dims if d != 1]
    if not non_one:
        return 1
    chosen = non_one[0]
    for d in non_one[1:]:
        same = dims_equal(chosen, d)
        if same is False:
            if isinstance(chosen, int) and isinstance(d, int):
                raise ShapeError(f"cannot broadcast dimensions {chosen} and {d}")
            # One of them is symbolic: at run time it must be equal or 1; keep the static one.
            if isinstance(d, int):
                chosen = d
        elif chosen is None:
            chosen = d
    return chosen


def tensor_input(ctx: InferContext, index: int) -> TensorType:
    """Input ``index`` as a TensorType, or a clear error if it is not a tensor."""
    t = ctx.inputs[index] if index < len(ctx.inputs) else None
    if not isinstance(t, TensorType):
        raise ctx.error(f"input {index} must be a tensor with a known type, got {t}")
    return t


def same_as_input(index: int = 0):
    """infer: one output with the type of input ``index``."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        return [ctx.inputs[index]]

    return infer


def broadcast_to_dtype(dtype: DType | None = None):
    """infer: broadcast every tensor input; output dtype is ``dtype`` or that of input 0."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        if any(not isinstance(t, TensorType) for t in ctx.inputs if t is not None) or \
                not any(t is not None for t in ctx.inputs):
            known = [t for t in ctx.inputs if isinstance(t, TensorType)]
            out_dtype = dtype or (known[0].dtype if known else None)
            return [TensorType(out_dtype, None) if out_dtype is not None else None]
        types = [tensor_input(ctx, i) for i in range(len(ctx.inputs)) if ctx.inputs[i] is not None]
        try:
            shape = broadcast_shapes([t.shape for t in types])
        except ShapeError as error:
            raise ctx.error(str(error)) from None
        return [TensorType(dtype or types[0].dtype, shape)]

    return infer


def unknown_shape(dtype_from_input: int | None = 0, dtype: DType | None = None, count: int = 1):
    """infer: dtype known, shape unknown (data-dependent ops such as NonZero)."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        dt = dtype if dtype is not None else tensor_input(ctx, dtype_from_input).dtype
        return [TensorType(dt, None)] * max(count, 1)

    return infer


def normalize_axis(axis: int, rank: int, ctx: InferContext | None = None) -> int:
    if not -rank <= axis < max(rank, 1):
        message = f"axis {axis} is out of range for rank {rank}"
        raise ctx.error(message) if ctx is not None else ShapeError(message)
    return axis % rank if rank else 0


def shape_from_constant(value: np.ndarray | None, rank: int | None = None) -> tuple[Dim, ...] | None:
    """A shape given as a constant int tensor, or None if the tensor is not constant."""
    if value is None:
        return None if rank is None else tuple(None for _ in range(rank))
    return tuple(v if isinstance(v, SymDim) else as_size(v) for v in np.asarray(value).reshape(-1))
