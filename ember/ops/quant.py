"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the helpers
that the quantized matmul and convolution ops (QLinearMatMul, QLinearConv, MatMulInteger,
ConvInteger) share.

Scales and zero points come in three granularities: per tensor (a scalar), per axis (a 1-D
tensor along ``axis``) and blocked (the input's shape with dim ``axis`` divided into blocks of
``block_size``).  Quantized types include the sub-byte integers (int4/uint4/int2/uint2), the
float8 family and float4e2m1/float6, all through ``ml_dtypes``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, RefContext, op
from ember.ops.shape_infer import normalize_axis

Context = InferContext | RefContext

_INT_QUANT_TYPES = (DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.UINT4,
                    DType.INT4, DType.UINT2, DType.INT2)
_FLOAT8_TYPES = (DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2,
                 DType.FLOAT8E5M2FNUZ)
_SMALL_FLOAT_TYPES = (DType.FLOAT4E2M1, DType.FLOAT6E2M3, DType.FLOAT6E3M2)
QUANT_TYPES = _INT_QUANT_TYPES + _FLOAT8_TYPES + _SMALL_FLOAT_TYPES
DEQUANT_OUTPUT_TYPES = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)

# ----------------------------------------------------------------------------- shared helpers


def is_integer(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is an integer type, the ml_dtypes sub-byte ones included."""
    dtype = np.dtype(dtype)
    return dtype.kind in "iu" or DType.from_numpy(dtype) in (DType.INT4, DType.UINT4,
                                                             DType.INT2, DType.UINT2)


def integer_range(dtype: np.dtype) -> tuple[int, int]:
    """Smallest and largest value of an integer dtype, sub-byte ones included."""
    info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


def saturate_cast(values: np.ndarray, dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    """Cast real ``values`` to a quantized dtype.

    Integers round half to even and clip.  Floats round to nearest even; with ``saturate``
    out-of-range values (infinities included) clip to the largest finite value, otherwise they
    become what the type has for overflow (inf or NaN), as ONNX's Cast tables specify.
    """
    dtype = np.dtype(dtype)
    if is_integer(dtype):
        low, high = integer_range(dtype)
        return np.clip(np.rint(values), low, high).astype(dtype)
    if saturate or DType.from_numpy(dtype) in _SMALL_FLOAT_TYPES:
        limit = float(ml_dtypes.finfo(dtype).max)
        values = np.clip(values, -limit, limit)  # NaN stays NaN
    return values.astype(dtype)


def widen(x: np.ndarray) -> np.ndarray:
    """Quantized values in a type where their arithmetic is exact: int32 for the integers,
    float32 for the float8/float4 types."""
    return x.astype(np.int32 if is_integer(x.dtype) else np.float32)


def subtract_zero_point(ctx: Context, x: np.ndarray, zero_point: np.ndarray | None,
                        channel_axis: int) -> np.ndarray:
    """``x - zero_point``, exact (see :func:`widen`).

    The zero point is a scalar (per tensor) or a 1-D tensor along ``channel_axis`` of ``x``.
    """
    result = widen(x)
    if zero_point is None:
        return result
    zero_point = widen(np.asarray(zero_point))
    if zero_point.size == 1:
        return result - zero_point.reshape(())
    if zero_point.ndim == 1 and zero_point.size == x.shape[channel_axis]:
        shape = [1] * x.ndim
        shape[channel_axis] = zero_point.size
        return result - zero_point.reshape(shape)
    raise ctx.error(f"zero point of shape {zero_point.shape} must be a scalar or have one "
                    f"value per channel ({x.shape[channel_axis]}) of the input {x.shape}")


def requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray | None,
               out_dtype: np.dtype) -> np.ndarray:
    """``saturate(acc * multiplier + zero_point)`` in ``out_dtype``.

    ``multiplier`` (the combined scale) is computed by the caller in the scales' own precision,
    as ONNX's QLinear ops do; the product is then formed in float64.
    """
    values = acc.astype(np.float64) * np.asarray(multiplier).astype(np.float64)
    if zero_point is not None:
        values = values + np.asarray(zero_point).astype(np.float64)
    return saturate_cast(values, out_dtype)


def broadcast_param(ctx: Context, param: np.ndarray, shape: tuple[int, ...], axis: int,
                    block_size: int, name: str) -> np.ndarray:
    """A scale or zero point expanded to broadcast against an input of ``shape``."""
    param = np.asarray(param)
    if param.ndim == 0 or (param.ndim == 1 and param.size == 1 and block_size == 0):
        return param.reshape(())
    if block_size == 0:
        if param.ndim != 1:
            raise ctx.error(f"{name} of shape {param.shape} must be a scalar or 1-D (per-axis) "
                            f"unless block_size is set")
        if param.size != shape[axis]:
            raise ctx.error(f"{name} has {param.size} values; the input has {shape[axis]} "
                            f"along axis {axis}")
        dims = [1] * len(shape)
        dims[axis] = param.size
        return param.reshape(dims)
    if block_size < 0:
        raise ctx.error(f"block_size must be positive, got {block_size}")
    if param.ndim != len(shape):
        raise ctx.error(f"blocked {name} of shape {param.shape} must have the input's rank "
                        f"{len(shape)}")
    blocks = param.shape[axis]
    if not (blocks - 1) * block_size < shape[axis] <= blocks * block_size:
        raise ctx.error(f"{name} has {blocks} blocks of {block_size} along axis {axis}, which "
                        f"does not cover the input's {shape[axis]} elements exactly")
    expected = tuple(blocks if i == axis else d for i, d in enumerate(shape))
    if param.shape != expected:
        raise ctx.error(f"blocked {name} must have shape {expected}, got {param.shape}")
    expanded = np.repeat(param, block_size, axis=axis)
    return np.take(expanded, np.arange(shape[axis]), axis=axis)


def _dtype_attr(ctx: Context, code: int, name: str) -> DType | None:
    if not code:
        return None
    try:
        return DType.from_onnx(int(code))
    except EmberError:
        raise ctx.error(f"{name}={code} is not an ONNX element type code") from None


def _param_axis(ctx: Context, x_rank: int | None, scale_rank: int | None, axis: int) -> int:
    """The normalized quantization axis (only meaningful for non-scalar scales)."""
    if x_rank is None or not scale_rank:
        return axis
    return normalize_axis(axis, x_rank, ctx)


def _per_tensor(t: TensorType) -> bool:
    """A scalar or single-element parameter (both mean per-tensor in practice)."""
    return t.shape is not None and all(d == 1 for d in t.shape)


def _check_param_shapes(ctx: InferContext, x: TensorType, block_size: int) -> None:
    scale = ctx.inputs[1] if len(ctx.inputs) > 1 else None
    zero = ctx.inputs[2] if ctx.has_input(2) else None
    if isinstance(scale, TensorType) and isinstance(zero, TensorType) \
            and not _per_tensor(scale) and not _per_tensor(zero) \
            and scale.shape is not None and zero.shape is not None \
            and len(scale.shape) != len(zero.shape):
        raise ctx.error(f"scale {scale} and zero point {zero} must have the same shape")
    if isinstance(scale, TensorType) and scale.shape is not None and x.shape is not None:
        rank = len(scale.shape)
        if block_size == 0 and rank > 1:
            raise ctx.error(f"scale {scale} must be a scalar or 1-D unless block_size is set")
        if block_size and rank != len(x.shape):
            raise ctx.error(f"blocked scale {scale} must have the rank of the input {x}")
        _param_axis(ctx, len(x.shape), rank, ctx.attrs["axis"])


# ----------------------------------------------------------------------------- QuantizeLinear


def _quantize_output_dtype(ctx: Context, zero_point_dtype: DType | None,
                           output_dtype: int) -> DType:
    requested = _dtype_attr(ctx, output_dtype, "output_dtype")
    if zero_point_dtype is not None and requested is not None \
            and zero_point_dtype != requested:
        raise ctx.error(f"output_dtype {requested} differs from the zero point's type "
                        f"{zero_point_dtype}")
    dtype = zero_point_dtype or requested or DType.UINT8
    if dtype not in QUANT_TYPES:
        raise ctx.error(f"{dtype} is not a quantized type ({', '.join(map(str, QUANT_TYPES))})")
    return dtype


def _quantize_linear_type(ctx: InferContext) -> list[ValueType | None]:
    x = ctx.inputs[0]
    if not isinstance(x, TensorType):
        return [None]
    zero = ctx.inputs[2] if ctx.has_input(2) else None
    zero_dtype = zero.dtype if isinstance(zero, TensorType) else None
    _check_param_shapes(ctx, x, ctx.attrs["block_size"])
    dtype = _quantize_output_dtype(ctx, zero_dtype, ctx.attrs["output_dtype"])
    return [TensorType(dtype, x.shape)]


@op("QuantizeLinear", family="quant", infer=_quantize_linear_type,
    attrs={"axis": Attr.int(1), "block_size": Attr.int(0), "output_dtype": Attr.int(0),
           "precision": Attr.int(0), "saturate": Attr.int(1)})
def quantize_linear(ctx, x, y_scale, y_zero_point=None, *, axis, block_size, output_dtype,
                    precision, saturate):
    """saturate(round_half_even(x / y_scale) + y_zero_point) in the quantized type."""
    zero_dtype = DType.from_numpy(y_zero_point.dtype) if y_zero_point is not None else None
    dtype = _quantize_output_dtype(ctx, zero_dtype, output_dtype).numpy
    axis = _param_axis(ctx, x.ndim, np.ndim(y_scale), axis)
    scale = broadcast_param(ctx, y_scale, x.shape, axis, block_size, "y_scale")
    division = _dtype_attr(ctx, precision, "precision")
    work = division.numpy if division is not None else np.dtype(y_scale.dtype)
    if is_integer(work) or work.itemsize < 2:
        work = np.dtype(np.float32)  # an integer or float8e8m0 scale divides in float32
    scaled = (x.astype(work) / scale.astype(work)).astype(np.float32)
    if y_zero_point is not None:
        zero = broadcast_param(ctx, y_zero_point, x.shape, axis, block_size, "y_zero_point")
        if is_integer(dtype):
            return saturate_cast(np.rint(scaled) + zero.astype(np.float32), dtype)
        if np.any(zero.astype(np.float32) != 0):  # keeps the sign of -0.0 when it is 0
            scaled = scaled + zero.astype(np.float32)
    return saturate_cast(scaled, dtype, bool(saturate))


# ----------------------------------------------------------------------------- DequantizeLinear


def _dequantize_output_dtype(ctx: Context, scale_dtype: DType | None,
                             output_dtype: int) -> DType | None:
    dtype = _dtype_attr(ctx, output_dtype, "output_dtype") or scale_dtype
    if dtype is not None and dtype not in DEQUANT_OUTPUT_TYPES:
        raise ctx.error(f"the output type {dtype} must be one of "
                        f"{', '.join(map(str, DEQUANT_OUTPUT_TYPES))}; set output_dtype")
    return dtype


def _dequantize_linear_type(ctx: InferContext) -> list[ValueType | None]:
    x = ctx.inputs[0]
    scale = ctx.inputs[1]
    if not isinstance(x, TensorType):
        return [None]
    zero = ctx.inputs[2] if ctx.has_input(2) else None
    if isinstance(zero, TensorType) and zero.dtype != x.dtype:
        raise ctx.error(f"x ({x.dtype}) and x_zero_point ({zero.dtype}) must have one type")
    _check_param_shapes(ctx, x, ctx.attrs["block_size"])
    scale_dtype = scale.dtype if isinstance(scale, TensorType) else None
    dtype = _dequantize_output_dtype(ctx, scale_dtype, ctx.attrs["output_dtype"])
    return [TensorType(dtype, x.shape) if dtype is not None else None]


@op("DequantizeLinear", family="quant", infer=_dequantize_linear_type,
    attrs={"axis": Attr.int(1), "block_size": Attr.int(0), "output_dtype": Attr.int(0)})
def dequantize_linear(ctx, x, x_scale, x_zero_point=None, *, axis, block_size, output_dtype):
    """(x - x_zero_point) * x_scale in the scale's type (or output_dtype)."""
    dtype = _dequantize_output_dtype(ctx, DType.from_numpy(x_scale.dtype), output_dtype)
    axis = _param_axis(ctx, x.ndim, np.ndim(x_scale), axis)
    scale = broadcast_param(ctx, x_scale, x.shape, axis, block_size, "x_scale")
    values = x.astype(np.float32)
    if x_zero_point is not None:
        if x_zero_point.dtype != x.dtype:
            raise ctx.error(f"x ({x.dtype}) and x_zero_point ({x_zero_point.dtype}) must have "
                            f"one type")
        zero = broadcast_param(ctx, x_zero_point, x.shape, axis, block_size, "x_zero_point")
        values = values - zero.astype(np.float32)
    return (values * scale.astype(np.float32)).astype(dtype.numpy)


# ----------------------------------------------------------------------------- dynamic


def _dynamic_quantize_type(ctx: InferContext) -> list[ValueType | None]:
    x = ctx.inputs[0]
    if not isinstance(x, TensorType):
        return [None, None, None]
    if x.dtype != DType.FLOAT32:
        raise ctx.error(f"input must be f32, got {x.dtype}")
    return [TensorType(DType.UINT8, x.shape), TensorType(DType.FLOAT32, ()),
            TensorType(DType.UINT8, ())]


@op("DynamicQuantizeLinear", family="quant", infer=_dynamic_quantize_type, outputs=(3, 3))
def dynamic_quantize_linear(ctx, x):
    """uint8 quantization with scale and zero point chosen from x's range (including 0)."""
    qmin, qmax = 0, 255
    x = x.astype(np.float32, copy=False)
    high = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    low = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    # All-zero input: any scale works; 1 keeps the division finite (what runtimes do).
    scale = np.float32(1.0) if high == low else np.float32((high - low) / np.float32(qmax))
    zero = np.rint(np.clip(np.float32(qmin) - low / scale, qmin, qmax))
    y = np.clip(np.rint(x / scale) + zero, qmin, qmax)
    return (y.astype(np.uint8), np.asarray(scale, dtype=np.float32),
            np.asarray(zero, dtype=np.uint8))
