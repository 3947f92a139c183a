"""Generator ops: tensors made from a shape or from scalars rather than from input elements.

ConstantOfShape (a filled tensor of a given shape), Range (an arithmetic sequence) and EyeLike
(an identity-like matrix).  ConstantOfShape and Range also run during shape inference on known
values; a symbolic shape or bound cannot produce an array, so they fail there with a clear
error and inference keeps the symbolic type instead.
"""

from __future__ import annotations

import math

import numpy as np

from ember.core.dims import Dim, SymDim, dims_equal
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.traced import as_size, is_traced
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape import Ctx, int_list, known_dims, unknown_dims, vector_length
from ember.ops.shape_infer import tensor_input

# ----------------------------------------------------------------------------- ConstantOfShape

_DEFAULT_FILL = np.zeros(1, dtype=np.float32)


def _fill(ctx: Ctx, value: np.ndarray | None) -> np.ndarray:
    """The one-element tensor ConstantOfShape fills with (float32 0 by default)."""
    fill = _DEFAULT_FILL if value is None else np.asarray(value)
    if fill.size != 1:
        raise ctx.error(f"the value attribute must hold exactly one element, got {fill.size}")
    return fill


def _infer_constant_of_shape(ctx: InferContext) -> list[ValueType | None]:
    dtype = DType.from_numpy(_fill(ctx, ctx.attrs["value"]).dtype)
    dims = known_dims(ctx, 0)
    if dims is None:
        return [TensorType(dtype, unknown_dims(vector_length(ctx, 0)))]
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.error(f"the shape {list(dims)} has a negative dim")
    return [TensorType(dtype, dims)]


@op("ConstantOfShape", family="generator", infer=_infer_constant_of_shape,
    attrs={"value": Attr.tensor()})
def constant_of_shape(ctx, shape, *, value):
    """A tensor of the given shape filled with ``value`` (float32 0 by default)."""
    fill = _fill(ctx, value)
    dims = int_list(ctx, shape, "the shape input")
    if any(d < 0 for d in dims):
        raise ctx.error(f"the shape {dims} has a negative dim")
    return np.full(dims, fill.reshape(-1)[0], dtype=fill.dtype)


# ----------------------------------------------------------------------------- Range

_LOW_PRECISION = (DType.FLOAT16, DType.BFLOAT16)


def _range_scalar(ctx: Ctx, value: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.size != 1:
        raise ctx.error(f"{name} must be a scalar, got shape {list(array.shape)}")
    item = array.reshape(-1)[0]
    if isinstance(item, SymDim):
        raise ctx.error(f"{name} is the symbolic value {item}, a concrete number is needed")
    return array.reshape(())


def _range_count(start: int | np.ndarray, limit: int | np.ndarray,
                 delta: int | np.ndarray) -> int:
    """max(ceil((limit - start) / delta), 0), exactly for integers."""
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        return max(-((start - limit) // delta), 0)
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


def _compute_dtype(ctx: Ctx, dtype: np.dtype, stash_type: int) -> np.dtype:
    """Where Range accumulates: ``stash_type`` for float16/bfloat16, the input type otherwise."""
    if DType.from_numpy(dtype) not in _LOW_PRECISION:
        return dtype
    try:
        stash = DType.from_onnx(stash_type)
    except EmberError:
        stash = None
    if stash is None or not stash.is_float:
        raise ctx.error(f"stash_type={stash_type} is not a floating-point type code")
    return stash.numpy


def _infer_range(ctx: InferContext) -> list[ValueType | None]:
    types = [tensor_input(ctx, i) for i in range(3)]
    if len({t.dtype for t in types}) != 1:
        raise ctx.error(f"start, limit and delta must have one type, got "
                        f"{', '.join(str(t.dtype) for t in types)}")
    dtype = types[0].dtype
    values = [ctx.value(i) for i in range(3)]
    return [TensorType(dtype, (_range_length(ctx, values),))]


def _range_length(ctx: InferContext, values: list[np.ndarray | None]) -> Dim:
    if any(v is None or np.asarray(v).size != 1 for v in values):
        return None
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in values)
    if any(isinstance(v, SymDim) for v in (start, limit, delta)):
        # Range(0, n, 1) has n elements, whatever n is; other symbolic bounds are unknown.
        if dims_equal(start, 0) and dims_equal(delta, 1):
            return limit
        return None
    if delta == 0:
        raise ctx.error("delta must not be 0")
    if any(is_traced(v) for v in (start, limit, delta)):  # integers sized at run time
        return _range_count(as_size(start), as_size(limit), as_size(delta))
    dtype = np.asarray(values[0]).dtype
    if dtype.kind in "iu":
        return _range_count(int(start), int(limit), int(delta))
    compute = _compute_dtype(ctx, dtype, ctx.attrs["stash_type"])
    return _range_count(*(np.asarray(v).astype(compute) for v in (start, limit, delta)))


@op("Range", family="generator", infer=_infer_range, attrs={"stash_type": Attr.int(1)})
def range_(ctx, start, limit, delta, *, stash_type):
    """start, start + delta, ... up to limit (exclusive); f16/bf16 computed in ``stash_type``."""
    first, last, step = (_range_scalar(ctx, v, name)
                         for v, name in ((start, "start"), (limit, "limit"), (delta, "delta")))
    dtype = first.dtype
    if step == 0:
        raise ctx.error("delta must not be 0")
    if dtype.kind in "iu":
        count = _range_count(int(first), int(last), int(step))
        return (int(first) + np.arange(count, dtype=np.int64) * int(step)).astype(dtype)
    compute = _compute_dtype(ctx, dtype, stash_type)
    first, last, step = (v.astype(compute) for v in (first, last, step))
    count = _range_count(first, last, step)
    return (first + np.arange(count).astype(compute) * step).astype(dtype)


# ----------------------------------------------------------------------------- EyeLike


def _eye_dtype(ctx: Ctx, dtype_code: int | None, input_dtype: DType) -> DType:
    if dtype_code is None:
        return input_dtype
    try:
        dtype = DType.from_onnx(dtype_code)
    except EmberError:
        raise ctx.error(f"dtype={dtype_code} is not a known tensor type code") from None
    if dtype == DType.STRING:
        raise ctx.error("EyeLike cannot produce strings")
    return dtype


def _infer_eye_like(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    if data.shape is not None and len(data.shape) != 2:
        raise ctx.error(f"the input must be a matrix (rank 2), got rank {len(data.shape)}")
    dtype = _eye_dtype(ctx, ctx.attrs["dtype"], data.dtype)
    return [TensorType(dtype, data.shape if data.shape is not None else (None, None))]


@op("EyeLike", family="generator", infer=_infer_eye_like,
    attrs={"dtype": Attr.int(), "k": Attr.int(0)})
def eye_like(ctx, data, *, dtype, k):
    """A matrix shaped like the input with ones on diagonal ``k`` and zeros elsewhere."""
    if data.ndim != 2:
        raise ctx.error(f"the input must be a matrix (rank 2), got rank {data.ndim}")
    out = _eye_dtype(ctx, dtype, DType.from_numpy(data.dtype))
    rows, cols = data.shape
    return np.eye(rows, cols, k=k, dtype=out.numpy)
