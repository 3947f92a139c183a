"""Type conversions: Cast, CastLike, BitCast, and Identity (the conversion that changes nothing).

Cast follows the newest ONNX rules, summarized:

* float -> integer truncates toward zero; integer -> narrower integer keeps the low bits (two's
  complement), so out-of-range values wrap around, sub-byte types (int4, uint2 ...) included;
* a float that is NaN, infinite or out of range for the integer type: ONNX leaves the result
  undefined and C makes the conversion undefined behaviour.  ember defines it as x86-64's
  scalar conversion (``cvttss2si``/``cvttsd2si``, what compilers emit for a C cast) does,
  which is what ONNX Runtime, numpy and the ONNX reference give on x86 (see
  :func:`float_to_integer`): int32 and int64 get their lowest value (the "integer
  indefinite"), 8- and 16-bit types the low bits of the int32 conversion (NaN -> 0), uint32
  the low bits of the int64 conversion, uint64 the int64 conversion of ``x`` or ``x - 2**63``;
* anything -> bool is ``x != 0`` (NaN is True); bool -> number is 1 or 0;
* float -> float rounds to nearest even, out of range gives +-inf; for the float8 types with
  ``saturate=1`` (the default) out-of-range values and infinities clamp to the largest finite
  value instead, with ``saturate=0`` they become NaN (or inf for E5M2);
* -> float8e8m0 (powers of two) rounds as ``round_mode`` says (up, down, nearest);
* number -> string prints the shortest round-trip form, with ``NaN``, ``INF``, ``-INF`` for
  the special values; string -> number parses decimal and scientific forms and those literals
  (case-insensitive).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.traced import holds_traced
from ember.ir.types import TensorType, ValueType
from ember.ops.elementwise import has_symbols, input_tensor_type
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import same_as_input

_FLOAT8 = frozenset({DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2,
                     DType.FLOAT8E5M2FNUZ})
_SUB_BYTE_BITS = {DType.INT4: 4, DType.UINT4: 4, DType.FLOAT4E2M1: 4, DType.INT2: 2,
                  DType.UINT2: 2, DType.FLOAT6E2M3: 6, DType.FLOAT6E3M2: 6}
_ROUND_MODES = ("up", "down", "nearest")
_E8M0_MAX_CODE = 254  # 2**127; code 255 is NaN and code 0 is 2**-127
_E8M0_BIAS = 127

_Context = InferContext | RefContext


def bit_width(dtype: DType) -> int:
    """Bits per element in ONNX terms (bool is 8 bits, int4 is 4)."""
    return _SUB_BYTE_BITS.get(dtype, dtype.itemsize * 8)


def target_dtype(ctx: _Context, code: object) -> DType:
    """The DType of an ONNX ``to`` attribute, or an error naming the node."""
    try:
        if isinstance(code, int):
            return DType.from_onnx(code)
    except EmberError:
        pass
    raise ctx.error(f"attribute to={code!r} is not a tensor element type ember supports")


def _check_round_mode(ctx: _Context, round_mode: str) -> None:
    if round_mode not in _ROUND_MODES:
        raise ctx.error(f"attribute round_mode must be one of {_ROUND_MODES}, "
                        f"got {round_mode!r}")


# ----------------------------------------------------------------------------- conversions


def cast_array(ctx: RefContext, x: np.ndarray, target: DType, *, saturate: bool = True,
               round_mode: str = "up") -> np.ndarray:
    """``x`` converted to ``target`` by the ONNX Cast rules (see the module docstring)."""
    if x.dtype == object:
        if (has_symbols(x) or holds_traced(x)) and target.is_int:
            return x  # a shape value being folded: its symbolic dims are integers already
        if holds_traced(x) and target.is_float:
            # a size used as data (a scale of 1/S): it stays the size, computed where it is
            # read (``lower/group.py``); arithmetic that cannot stay traced refuses the build
            return x
        return _from_strings(ctx, x, target, saturate, round_mode)
    if target is DType.STRING:
        return _to_strings(x)
    if target is DType.BOOL:
        return np.asarray(x != 0)
    if target.is_int:
        return _to_integer(x, target)
    if target is DType.FLOAT8E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if target in _FLOAT8 and saturate:
        return _clamp_to_finite(x, target).astype(target.numpy)
    return x.astype(target.numpy)


def _to_integer(x: np.ndarray, target: DType) -> np.ndarray:
    """Integers and bools keep their low bits; floats truncate toward zero, with NaN,
    infinities and out-of-range values as :func:`float_to_integer` says."""
    if x.dtype.kind in "biu":
        return x.astype(target.numpy)
    if DType.from_numpy(x.dtype).is_int:  # int4, uint2 ...: ml_dtypes casts them via int64
        return x.astype(np.int64).astype(target.numpy)
    if target in _X86_CONVERSION:
        return float_to_integer(x, target)
    # sub-byte targets (int4, uint2 ...): truncate, wrap through int64 (NaN, inf: 0)
    whole = np.trunc(x.astype(np.float64))
    whole = np.where(np.isfinite(whole), np.fmod(whole, 2.0 ** 64), 0.0)  # NaN/inf: undefined
    whole = np.where(whole >= 2.0 ** 63, whole - 2.0 ** 64, whole)
    whole = np.where(whole < -(2.0 ** 63), whole + 2.0 ** 64, whole)
    return whole.astype(np.int64).astype(target.numpy)


# Integer type -> (bits of the signed conversion it goes through, whether it is that
# conversion itself).  See float_to_integer.
_X86_CONVERSION = {DType.INT8: 32, DType.INT16: 32, DType.UINT8: 32, DType.UINT16: 32,
                   DType.INT32: 32, DType.UINT32: 64, DType.INT64: 64, DType.UINT64: 64}


def _truncate_signed(whole: np.ndarray, bits: int) -> np.ndarray:
    """x86's truncating conversion of the whole numbers ``whole`` (float64) to a signed
    integer of ``bits``: the value when it fits, else (NaN, infinities, out of range) the
    lowest value of the type, which the instruction returns as "integer indefinite"."""
    limit = 2.0 ** (bits - 1)
    fits = (whole >= -limit) & (whole < limit)  # False for NaN
    dtype = np.int32 if bits == 32 else np.int64
    return np.where(fits, np.where(fits, whole, 0.0).astype(dtype), np.iinfo(dtype).min)


def float_to_integer(x: np.ndarray, target: DType) -> np.ndarray:
    """``x`` (a float array) converted to the 8- to 64-bit integer type ``target`` the way
    x86-64's scalar conversions do, for every value, NaN and infinities included.

    ONNX says nothing of NaN or out-of-range values and C leaves them undefined; x86 defines
    its truncating conversions to int32 and int64 (``cvttss2si``/``cvttsd2si``) to return the
    lowest value for them, and a C compiler builds every other conversion from those two:
    8- and 16-bit targets keep the low bits of the int32 conversion, uint32 those of the
    int64 one, uint64 converts ``x`` (below 2**63) or ``x - 2**63`` (above, the top bit set
    again) to int64.  ONNX Runtime, numpy and the ONNX reference evaluator give exactly this
    on x86 -- except float -> uint32, where their vectorized loops (the int32 conversion of
    ``x`` or ``x - 2**31``) and their scalar tails (this one) disagree with each other.  The
    compiled kernels compute the same (``ember/ops/compute/elementwise.py: convert``)."""
    whole = np.trunc(np.asarray(x, dtype=np.float64))
    bits = _X86_CONVERSION[target]
    if target is DType.UINT64:
        high = whole >= 2.0 ** 63
        lower = _truncate_signed(np.where(high, whole - 2.0 ** 63, whole), 64)
        as_unsigned = lower.view(np.uint64)
        return np.where(high, as_unsigned ^ np.uint64(2 ** 63), as_unsigned)
    return _truncate_signed(whole, bits).astype(target.numpy)  # low bits (two's complement)


def _clamp_to_finite(x: np.ndarray, target: DType) -> np.ndarray:
    """``x`` (as float) clamped to the finite range of ``target``; NaN stays NaN."""
    limit = float(ml_dtypes.finfo(target.numpy).max)
    wide = x.astype(np.float64 if x.dtype == np.float64 or x.dtype.kind in "iu" else np.float32)
    return np.asarray(np.clip(wide, -limit, limit))


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """Round |x| to a power of two 2**(code - 127), code in [0, 254]; 255 is NaN.

    Out of range (zero, infinities included) saturates to the extreme codes, or is NaN
    without ``saturate``.
    """
    magnitude = np.abs(x.astype(np.float64))
    mantissa, exponent = np.frexp(magnitude)  # magnitude = mantissa * 2**exponent, m in [.5, 1)
    code = exponent.astype(np.int64) - 1 + _E8M0_BIAS  # the power of two at or below
    if round_mode == "up":
        code += mantissa > 0.5
    elif round_mode == "nearest":
        code += mantissa >= 0.75  # halfway between 2**k and 2**(k + 1) rounds up
    too_large = (code > _E8M0_MAX_CODE) | np.isinf(magnitude)
    too_small = (code < 0) | (magnitude == 0)
    if saturate:
        code = np.where(too_large, _E8M0_MAX_CODE, np.where(too_small, 0, code))
    else:
        code = np.where(too_large | too_small, 255, code)
    code = np.where(np.isnan(magnitude), 255, code)
    return code.astype(np.uint8).view(DType.FLOAT8E8M0.numpy)


def _format_number(value: object, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "1" if value else "0"
    if dtype.is_int:
        return str(int(value))  # type: ignore[call-overload]
    if dtype.is_float:
        as_float = float(value)  # type: ignore[arg-type]
        if math.isnan(as_float):
            return "NaN"
        if math.isinf(as_float):
            return "INF" if as_float > 0 else "-INF"
    return str(value)


def _to_strings(x: np.ndarray) -> np.ndarray:
    dtype = DType.from_numpy(x.dtype)
    texts = [_format_number(v, dtype) for v in x.flat]
    return np.array(texts, dtype=object).reshape(x.shape)


def _parse_number(ctx: RefContext, text: object) -> int | float:
    stripped = str(text).strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        return float(stripped)  # also "INF", "+inf", "-INF", "NaN" in any case
    except ValueError:
        raise ctx.error(f"cannot cast the string {text!r} to a number") from None


def _from_strings(ctx: RefContext, x: np.ndarray, target: DType, saturate: bool,
                  round_mode: str) -> np.ndarray:
    if target is DType.STRING:
        return x
    values = [_parse_number(ctx, v) for v in x.flat]
    if target is DType.BOOL:
        return np.array([v != 0 for v in values], dtype=bool).reshape(x.shape)
    if target.is_int:
        whole = [v if isinstance(v, int) else int(v) if math.isfinite(v) else 0 for v in values]
        low_bits = [(v + 2 ** 63) % 2 ** 64 - 2 ** 63 for v in whole]  # wrap like int64
        return np.array(low_bits, dtype=np.int64).reshape(x.shape).astype(target.numpy)
    floats = np.array([float(v) for v in values], dtype=np.float64).reshape(x.shape)
    return cast_array(ctx, floats, target, saturate=saturate, round_mode=round_mode)


# ----------------------------------------------------------------------------- Cast, CastLike


def _cast_infer(ctx: InferContext) -> list[ValueType | None]:
    _check_round_mode(ctx, ctx.attrs["round_mode"])
    target = target_dtype(ctx, ctx.attrs["to"])
    source = input_tensor_type(ctx, 0)
    return [TensorType(target, source.shape if source is not None else None)]


@op("Cast", family="cast", infer=_cast_infer,
    attrs={"to": Attr.int(REQUIRED), "saturate": Attr.int(1), "round_mode": Attr.string("up")})
def cast(ctx, x, *, to, saturate, round_mode):
    """x converted to the element type ``to`` (an ONNX TensorProto code)."""
    _check_round_mode(ctx, round_mode)
    return cast_array(ctx, x, target_dtype(ctx, to), saturate=bool(saturate),
                      round_mode=round_mode)


def _cast_like_infer(ctx: InferContext) -> list[ValueType | None]:
    _check_round_mode(ctx, ctx.attrs["round_mode"])
    source, like = input_tensor_type(ctx, 0), input_tensor_type(ctx, 1)
    if like is None:
        return [None]
    return [TensorType(like.dtype, source.shape if source is not None else None)]


@op("CastLike", family="cast", infer=_cast_like_infer,
    attrs={"saturate": Attr.int(1), "round_mode": Attr.string("up")})
def cast_like(ctx, x, like, *, saturate, round_mode):
    """x converted to the element type of ``like`` (whose values are ignored)."""
    _check_round_mode(ctx, round_mode)
    return cast_array(ctx, x, DType.from_numpy(like.dtype), saturate=bool(saturate),
                      round_mode=round_mode)


# ----------------------------------------------------------------------------- BitCast


def _check_bitcast(ctx: _Context, source: DType, target: DType) -> None:
    if DType.STRING in (source, target):
        raise ctx.error("BitCast does not apply to strings")
    if bit_width(source) != bit_width(target):
        raise ctx.error(f"BitCast needs types of the same bit width; {source} has "
                        f"{bit_width(source)} bits, {target} has {bit_width(target)}")


def _bitcast_infer(ctx: InferContext) -> list[ValueType | None]:
    target = target_dtype(ctx, ctx.attrs["to"])
    source = input_tensor_type(ctx, 0)
    if source is None:
        return [TensorType(target, None)]
    _check_bitcast(ctx, source.dtype, target)
    return [source.with_dtype(target)]


@op("BitCast", family="cast", infer=_bitcast_infer, attrs={"to": Attr.int(REQUIRED)})
def bit_cast(ctx, x, *, to):
    """The bits of x reinterpreted as the element type ``to`` of the same bit width."""
    source, target = DType.from_numpy(x.dtype), target_dtype(ctx, to)
    _check_bitcast(ctx, source, target)
    if target is DType.BOOL:  # a byte other than 0 and 1 is no valid bool: keep its truth
        return np.asarray(x.view(np.uint8) != 0)
    if source in _SUB_BYTE_BITS:  # one element per byte, in the low bits
        low_bits = np.asarray(x.view(np.uint8) & np.uint8((1 << bit_width(source)) - 1))
        return low_bits.view(target.numpy)
    return x.view(target.numpy)  # same item size, so any strides will do


# ----------------------------------------------------------------------------- Identity


@op("Identity", family="cast", infer=same_as_input(0))
def identity(ctx, x):
    """x unchanged (a tensor, a sequence or an optional)."""
    return x
