"""Elementwise arithmetic and math: unary functions, broadcasting binary ops, n-ary ops.

The family holds the unary math functions (Abs ... Erf), the broadcasting binary ops
(Add/Sub/Mul/Div, Pow, Mod, BitShift, BitwiseAnd/Or/Xor and BitwiseNot), the variadic
Max/Min/Sum/Mean, and Clip.

Integer semantics follow ONNX, not numpy, where the two differ (Div truncates toward zero,
Mod follows the sign of the divisor unless ``fmod=1``, an integer Pow with a negative exponent
truncates like C, a shift by the bit width or more gives the sign fill).

The helpers in the first section (``broadcast_infer``, ``expect_dtype``, ``compute_dtype``)
are shared with the activation and logical families.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ember.core.traced import is_traced
from ember.core.dims import SymDim
from ember.core.dtypes import DType
from ember.core.errors import ExecutionError, ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, InferFn, RefContext, op
from ember.ops.shape_infer import broadcast_shapes, same_as_input

# ----------------------------------------------------------------------------- shared helpers


def input_tensor_type(ctx: InferContext, index: int) -> TensorType | None:
    """Input ``index`` as a TensorType; None when absent or of unknown type.

    A sequence or optional where a tensor belongs is an error naming the node.
    """
    if not ctx.has_input(index) or index >= len(ctx.inputs):
        return None
    vtype = ctx.inputs[index]
    if vtype is not None and not isinstance(vtype, TensorType):
        raise ctx.error(f"input {index} must be a tensor, got {vtype}")
    return vtype


def expect_dtype(ctx: InferContext, index: int, accepts: Callable[[DType], bool],
                 what: str) -> None:
    """Raise a node error if input ``index`` has a known dtype that ``accepts`` rejects."""
    vtype = input_tensor_type(ctx, index)
    if vtype is not None and not accepts(vtype.dtype):
        raise ctx.error(f"input {index} must be {what}, got {vtype.dtype}")


FLOAT_TENSOR = "a float tensor"
INTEGER_TENSOR = "an integer tensor"
BOOL_TENSOR = "a bool tensor"


def is_float(dtype: DType) -> bool:
    return dtype.is_float


def is_integer(dtype: DType) -> bool:
    return dtype.is_int


def is_bool(dtype: DType) -> bool:
    return dtype is DType.BOOL


def check_same_dtype(ctx: InferContext, indices: Sequence[int]) -> DType | None:
    """The dtype shared by the inputs at ``indices`` (None if none is known); an error if two
    known dtypes differ."""
    found: DType | None = None
    for index in indices:
        vtype = input_tensor_type(ctx, index)
        if vtype is None:
            continue
        if found is not None and vtype.dtype is not found:
            raise ctx.error(f"inputs must share one element type, got {found} and "
                            f"{vtype.dtype} (input {index})")
        found = vtype.dtype
    return found


def broadcast_infer(dtype: DType | None = None, *, dtype_from: int = 0,
                    same_dtype: bool = True, accepts: Callable[[DType], bool] | None = None,
                    what: str = "") -> InferFn:
    """infer: numpy-style broadcast of every input, symbolic dims included.

    The output dtype is ``dtype`` if given, else the dtype of the inputs from ``dtype_from``
    on, which must all agree when ``same_dtype`` (else that of input ``dtype_from``).
    ``accepts``/``what`` restrict those inputs' dtype.  An input of unknown type makes the
    shape unknown rather than failing.
    """

    def infer(ctx: InferContext) -> list[ValueType | None]:
        types = [input_tensor_type(ctx, i) for i in range(ctx.num_inputs)]
        typed = range(dtype_from, ctx.num_inputs)
        if accepts is not None:
            for index in typed:
                expect_dtype(ctx, index, accepts, what)
        if same_dtype:
            operand_dtype = check_same_dtype(ctx, typed)
        else:
            first = types[dtype_from] if dtype_from < len(types) else None
            operand_dtype = first.dtype if first is not None else None
        out_dtype = dtype or operand_dtype
        if out_dtype is None:
            return [None]
        present = [t for i, t in enumerate(types) if ctx.has_input(i)]
        if any(t is None for t in present):
            return [TensorType(out_dtype, None)]
        try:
            shape = broadcast_shapes([t.shape for t in present])
        except ShapeError as error:
            raise ctx.error(str(error)) from None
        return [TensorType(out_dtype, shape)]

    return infer


def same_type_infer(accepts: Callable[[DType], bool] | None = None, what: str = "",
                    dtype: DType | None = None) -> InferFn:
    """infer: the shape of input 0 with its dtype (or ``dtype``); ``accepts`` checks input 0."""

    def infer(ctx: InferContext) -> list[ValueType | None]:
        if accepts is not None:
            expect_dtype(ctx, 0, accepts, what)
        vtype = input_tensor_type(ctx, 0)
        if dtype is None:
            return [vtype]
        return [TensorType(dtype, vtype.shape if vtype is not None else None)]

    return infer


def has_symbols(array: np.ndarray) -> bool:
    """Whether ``array`` is a shape value (being folded by shape inference) holding symbols."""
    return array.dtype == object and any(isinstance(v, SymDim) for v in array.flat)


def like_input(result: object, x: np.ndarray) -> np.ndarray:
    """``result`` as an array of x's dtype; shape values holding symbols stay object arrays."""
    if is_traced(result):  # numpy gives 0-d object arrays' results as bare scalars
        return np.array(result, dtype=object)
    result = np.asarray(result)
    if result.dtype == object and any(is_traced(v) for v in result.flat):
        return result   # sizes a traced build takes at run time stay traced
    return result if has_symbols(result) else result.astype(x.dtype, copy=False)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The float type to compute a float function in: float64 stays, narrower floats
    (float16, bfloat16, float8 ...) widen to float32 and are rounded once at the end."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def in_compute_dtype(fn: Callable[..., np.ndarray], *arrays: np.ndarray) -> np.ndarray:
    """``fn`` applied to float ``arrays`` widened to their compute dtype; the result has the
    dtype of the first array."""
    wide = compute_dtype(arrays[0].dtype)
    result = fn(*(np.asarray(a).astype(wide, copy=False) for a in arrays))
    return np.asarray(result).astype(arrays[0].dtype, copy=False)


# ----------------------------------------------------------------------------- unary math


def _unary(name: str, fn: Callable[[np.ndarray], np.ndarray], doc: str) -> None:
    def reference(ctx, x):
        return np.asarray(fn(x)).astype(x.dtype, copy=False)

    reference.__doc__ = doc
    op(name, family="elementwise", infer=same_as_input(0))(reference)


def erf_of(x: np.ndarray) -> np.ndarray:
    """The error function, evaluated in float64 with the C library's erf."""
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    values = np.fromiter(map(math.erf, flat.tolist()), dtype=np.float64, count=flat.size)
    return values.reshape(np.shape(x))


_unary("Abs", np.abs, "|x|.")
_unary("Neg", np.negative, "-x.")
_unary("Exp", np.exp, "e**x.")
_unary("Sqrt", np.sqrt, "Square root; NaN for negative inputs.")
_unary("Reciprocal", np.reciprocal, "1/x.")
_unary("Ceil", np.ceil, "Round up.")
_unary("Floor", np.floor, "Round down.")
_unary("Round", np.round, "Round half to even, as ONNX specifies.")
_unary("Sin", np.sin, "Sine.")
_unary("Cos", np.cos, "Cosine.")
_unary("Tan", np.tan, "Tangent.")
_unary("Asin", np.arcsin, "Arcsine.")
_unary("Acos", np.arccos, "Arccosine.")
_unary("Atan", np.arctan, "Arctangent.")
_unary("Sinh", np.sinh, "Hyperbolic sine.")
_unary("Cosh", np.cosh, "Hyperbolic cosine.")
_unary("Asinh", np.arcsinh, "Inverse hyperbolic sine.")
_unary("Acosh", np.arccosh, "Inverse hyperbolic cosine.")
_unary("Atanh", np.arctanh, "Inverse hyperbolic tangent.")
_unary("Tanh", np.tanh, "Hyperbolic tangent.")
_unary("Log", np.log, "Natural logarithm.")
_unary("Sign", np.sign, "-1, 0 or 1.")
_unary("Erf", erf_of, "Gauss error function erf(x) (Erf-9 also took integers: truncated).")


# ----------------------------------------------------------------------------- binary


# Add, Sub and Mul also fold shape values, whose elements may be symbolic dims.


@op("Add", family="elementwise", infer=broadcast_infer(), commutative=True)
def add(ctx, a, b):
    """a + b with broadcasting (integers wrap around)."""
    return like_input(np.add(a, b), a)


@op("Sub", family="elementwise", infer=broadcast_infer())
def sub(ctx, a, b):
    """a - b with broadcasting."""
    return like_input(np.subtract(a, b), a)


@op("Mul", family="elementwise", infer=broadcast_infer(), commutative=True)
def mul(ctx, a, b):
    """a * b with broadcasting."""
    return like_input(np.multiply(a, b), a)


def check_integer_divisor(ctx: RefContext, b: np.ndarray) -> None:
    """An integer divisor holding 0 is an error naming the node, as ONNX Runtime makes it
    (numpy would give 0 and a warning; C leaves it undefined).  The compiled model checks
    the same before its kernel runs (``ember/ops/compute/elementwise.py``)."""
    if b.dtype.kind in "iu" and b.size and not np.all(b):
        raise ExecutionError(f"{ctx.opdef.name}: integer division by zero in node "
                             f"'{ctx.node.name}': its divisor (input '{ctx.node.inputs[1]}') "
                             f"holds 0 at {int(np.count_nonzero(b == 0))} of {b.size} "
                             f"position(s); check the divisor's values (or guard it, e.g. "
                             f"with Where or Max) before it reaches the node")


@op("Div", family="elementwise", infer=broadcast_infer())
def div(ctx, a, b):
    """a / b; integer division truncates toward zero as in C (exactly, even for int64), a
    divisor of 0 is an error and ``INT_MIN / -1`` wraps to ``INT_MIN`` (as numpy)."""
    check_integer_divisor(ctx, b)
    if a.dtype.kind in "iu":
        # a - fmod(a, b) is a multiple of b, so floor division gives the truncated quotient.
        return np.asarray((a - np.fmod(a, b)) // b).astype(a.dtype, copy=False)
    return np.asarray(np.true_divide(a, b)).astype(a.dtype, copy=False)


def _integer_power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """base ** exponent for integers, wrapping on overflow; a negative exponent gives
    1 / base**|e| truncated toward zero as C's pow does (0 unless base is 1 or -1)."""
    exp = exponent.astype(np.int64)
    wide = np.uint64 if base.dtype.kind == "u" else np.int64
    result = np.asarray(np.power(base.astype(wide), np.maximum(exp, 0).astype(wide)))
    negative = exp < 0
    if np.any(negative):
        odd = (exp % 2) == 1
        inverse = np.where(base == 1, 1, np.where(base == -1, np.where(odd, -1, 1), 0))
        result = np.where(negative, inverse.astype(wide), result)
    return result.astype(base.dtype)


@op("Pow", family="elementwise", infer=broadcast_infer(same_dtype=False))
def pow_(ctx, x, y):
    """x ** y with broadcasting; the result has x's type (float powers of integers truncate)."""
    if x.dtype.kind in "iu" and y.dtype.kind in "iu":
        return _integer_power(x, y)
    result = np.asarray(np.power(x.astype(np.float64), y.astype(np.float64)))
    if x.dtype.kind in "iu":
        result = np.trunc(result)
    return result.astype(x.dtype)


@op("Mod", family="elementwise", infer=broadcast_infer(), attrs={"fmod": Attr.int(0)})
def mod(ctx, a, b, *, fmod):
    """Remainder of a / b: with the divisor's sign (floor), or the dividend's if fmod=1 (C);
    an integer divisor of 0 is an error, ``INT_MIN % -1`` is 0."""
    if fmod not in (0, 1):
        raise ctx.error(f"attribute fmod must be 0 or 1, got {fmod}")
    check_integer_divisor(ctx, b)
    remainder = np.fmod if fmod else np.mod
    if a.dtype.kind in "iu":
        return np.asarray(remainder(a, b)).astype(a.dtype, copy=False)
    return in_compute_dtype(remainder, a, b)


_integer_broadcast = broadcast_infer(accepts=is_integer, what=INTEGER_TENSOR)


@op("BitShift", family="elementwise", infer=_integer_broadcast,
    attrs={"direction": Attr.string(REQUIRED)})
def bit_shift(ctx, x, y, *, direction):
    """x shifted LEFT or RIGHT (arithmetic for signed x) by y bits; a shift amount outside
    [0, bits) gives the sign fill: -1 for a right shift of a negative x, else 0."""
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"attribute direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    bits = x.dtype.itemsize * 8
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    amount = y.astype(np.int64)
    in_range = (amount >= 0) & (amount < bits)
    safe_amount = np.where(in_range, amount, 0)
    if direction == "LEFT":  # in the unsigned view, so bits past the sign bit are dropped
        shifted = np.left_shift(x.view(unsigned), safe_amount.astype(unsigned))
    else:
        shifted = np.right_shift(x, safe_amount.astype(x.dtype))
    fill = np.zeros((), x.dtype)
    if direction == "RIGHT" and x.dtype.kind == "i":
        fill = np.where(x < 0, np.array(-1, x.dtype), fill)
    return np.where(in_range, shifted.astype(x.dtype), fill).astype(x.dtype, copy=False)


def _bitwise(name: str, ufunc: np.ufunc, doc: str) -> None:
    def reference(ctx, a, b):
        return np.asarray(ufunc(a, b)).astype(a.dtype, copy=False)

    reference.__doc__ = doc
    op(name, family="elementwise", infer=_integer_broadcast, commutative=True)(reference)


_bitwise("BitwiseAnd", np.bitwise_and, "Bitwise a & b with broadcasting.")
_bitwise("BitwiseOr", np.bitwise_or, "Bitwise a | b with broadcasting.")
_bitwise("BitwiseXor", np.bitwise_xor, "Bitwise a ^ b with broadcasting.")


@op("BitwiseNot", family="elementwise", infer=same_type_infer(is_integer, INTEGER_TENSOR))
def bitwise_not(ctx, x):
    """Bitwise ~x."""
    return np.asarray(np.invert(x))


# ----------------------------------------------------------------------------- variadic


def _reduce_inputs(ufunc: np.ufunc, inputs: Sequence[np.ndarray]) -> np.ndarray:
    result = inputs[0]
    for x in inputs[1:]:
        result = ufunc(result, x)
    return np.asarray(result).astype(inputs[0].dtype, copy=False)


# Max and Min are not declared commutative: on a tie they return the second operand, as numpy
# and the C helper (ember/codegen/c_helpers.py, minmax) do, so Max(-0.0, 0.0) is 0.0 but
# Max(0.0, -0.0) is -0.0 (a sign that 1/x or copysign can see).  NaN propagates either way.
@op("Max", family="elementwise", infer=broadcast_infer(), inputs=(1, -1))
def max_(ctx, *inputs):
    """Elementwise maximum of all inputs, with broadcasting (NaN propagates)."""
    return _reduce_inputs(np.maximum, inputs)


@op("Min", family="elementwise", infer=broadcast_infer(), inputs=(1, -1))
def min_(ctx, *inputs):
    """Elementwise minimum of all inputs, with broadcasting (NaN propagates)."""
    return _reduce_inputs(np.minimum, inputs)


@op("Sum", family="elementwise", infer=broadcast_infer(), inputs=(1, -1), commutative=True)
def sum_(ctx, *inputs):
    """Elementwise sum of all inputs, with broadcasting (floats accumulate in float32+)."""
    if DType.from_numpy(inputs[0].dtype).is_float:
        return in_compute_dtype(lambda *wide: _reduce_inputs(np.add, wide), *inputs)
    return _reduce_inputs(np.add, inputs)


@op("Mean", family="elementwise", inputs=(1, -1), commutative=True,
    infer=broadcast_infer(accepts=is_float, what=FLOAT_TENSOR))
def mean(ctx, *inputs):
    """Elementwise mean of all inputs, with broadcasting."""
    return in_compute_dtype(lambda *wide: _reduce_inputs(np.add, wide) / len(wide), *inputs)


# ----------------------------------------------------------------------------- clip


def _clip_infer(ctx: InferContext) -> list[ValueType | None]:
    check_same_dtype(ctx, range(ctx.num_inputs))
    for index, name in ((1, "min"), (2, "max")):
        bound = input_tensor_type(ctx, index)
        if bound is not None and bound.shape is not None and \
                any(isinstance(d, int) and d != 1 for d in bound.shape):
            raise ctx.error(f"{name} must be a scalar, got shape {bound}")
    return [input_tensor_type(ctx, 0)]


def _scalar_bound(ctx: RefContext, bound: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    if bound.size != 1:
        raise ctx.error(f"{name} must be a scalar, got shape {list(bound.shape)}")
    return bound.reshape(()).astype(dtype)


@op("Clip", family="elementwise", infer=_clip_infer)
def clip(ctx, x, low=None, high=None):
    """x limited to [min, max] (absent bounds do not clip; if min > max every value is max)."""
    result = x
    if low is not None:
        result = np.maximum(result, _scalar_bound(ctx, low, x.dtype, "min"))
    if high is not None:
        result = np.minimum(result, _scalar_bound(ctx, high, x.dtype, "max"))
    return np.asarray(result).astype(x.dtype, copy=False)
