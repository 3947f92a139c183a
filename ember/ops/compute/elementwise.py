"""Compute definitions of the elementwise ops: unary math, broadcasting binary ops, the
variadic ops, logic and comparisons, Where, Clip, Cast and the activations.

Every op here is "one output element from the elements at the same (broadcast) position of
the inputs", so they share two helpers: :func:`broadcast_load` maps output indices to input
indices by numpy's broadcasting rules, and :func:`elementwise` builds the single stage.

The definitions follow the numpy references (``ember/ops/elementwise.py``, ``activation.py``,
``logical.py``, ``cast.py``) rather than C where the two differ:

* float16/bfloat16 math is evaluated in float32 and rounded once at the end, as the references'
  ``in_compute_dtype`` does (:func:`widen`);
* float -> integer Cast truncates, and converts NaN, infinities and out-of-range values as
  x86-64's scalar conversions do (:func:`convert`; the reasons are in ``ember/ops/cast.py``:
  ``float_to_integer``), with explicit range tests, so the C never converts a value its
  type cannot hold (the loop IR's own conversion saturates, NaN -> 0: also defined, but
  not what ONNX Runtime gives);
* integer Div/Mod by zero is an error, as in the reference and ONNX Runtime: the definition
  declares that the divisor holds no 0 (:func:`_require_nonzero_divisor`) and the compiled
  model checks it before the kernel runs, failing with an error that names the node (the
  loop IR's own division still gives 0 for it, so the C is defined whatever happens).
  ``INT_MIN / -1`` wraps to ``INT_MIN`` and ``INT_MIN % -1`` is 0, as numpy and the ONNX
  reference give (ONNX Runtime dies of SIGFPE there): both defined in the loop IR;
* shifts by out-of-range counts and NaN in Max/Min/Clip need nothing here: the loop IR
  defines them as numpy does (see ``ember/codegen/c_helpers.py``).

Cases outside that (strings, float8, integer Pow with a run-time exponent ...) raise
:class:`NoCompute` and run the numpy reference.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

import ember.ops.families  # noqa: F401  (registers the ops these definitions attach to)
from ember.core.traced import as_size, holds_traced
from ember.core.dtypes import DType
from ember.ir.compute import (ComputeContext, Tensor, compute, const_like,
                              reduce_axis, reduce_prod, widen)
from ember.ir.loop.expr import (INDEX, Binary, Cast, Const, Expr, Select, Unary, call, maximum,
                                minimum)
from ember.ops.elementwise import is_integer
from ember.ops.registry import NoCompute, compute_of

# Element types compiled kernels compute on (the others never get here: the pipeline runs
# them on the host, but a compute definition must not rely on that).
NUMERIC = frozenset({
    DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16, DType.INT8, DType.INT16,
    DType.INT32, DType.INT64, DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64, DType.BOOL,
})

Fn = Callable[..., Expr]


# ----------------------------------------------------------------------------- shared helpers


def broadcast_indices(tensor: Tensor, out_shape: Sequence[int],
                      indices: Sequence[Expr]) -> tuple[Expr, ...]:
    """The indices into ``tensor`` of the output element at ``indices`` when ``tensor`` is
    broadcast (numpy rules: trailing axes aligned, size-1 axes repeated) to ``out_shape``."""
    offset = len(out_shape) - tensor.ndim
    if offset < 0:
        raise ValueError(f"tensor {tensor.name} of rank {tensor.ndim} does not broadcast to "
                         f"rank {len(out_shape)}")
    return tuple(Const(0, INDEX) if dim == 1 else indices[offset + axis]
                 for axis, dim in enumerate(tensor.shape))


def broadcast_load(tensor: Tensor, out_shape: Sequence[int], indices: Sequence[Expr]) -> Expr:
    """The element of ``tensor`` that broadcasting puts at ``indices`` of ``out_shape``."""
    return tensor[broadcast_indices(tensor, out_shape, indices)]


def elementwise(ctx: ComputeContext, operands: Sequence[Tensor], fn: Fn, name: str,
                transform: Callable[[Expr], Expr] | None = None) -> Tensor:
    """Output 0 of the node as ``fn`` of the broadcast elements of ``operands``.

    ``transform`` is applied to each loaded element first (e.g. :func:`widen`); the result is
    cast to the output dtype the graph expects.
    """
    out = ctx.output_types[0]
    shape = tuple(as_size(d) for d in out.shape)

    def body(*indices: Expr) -> Expr:
        values = [broadcast_load(t, shape, indices) for t in operands]
        if transform is not None:
            values = [transform(v) for v in values]
        return fn(*values)

    return compute(shape, body, name=name, dtype=out.dtype)


def lit(value: float | int | bool, like: Expr) -> Const:
    """A constant of ``like``'s dtype."""
    return const_like(value, like.dtype)


def logical_or(a: Expr, b: Expr) -> Expr:
    return Binary("or", a, b)


def logical_and(a: Expr, b: Expr) -> Expr:
    return Binary("and", a, b)


def is_nan(value: Expr) -> Expr:
    return call("isnan", value, dtype=DType.BOOL)


def require(condition: bool) -> None:
    """NoCompute unless ``condition``: the configuration is left to the numpy reference."""
    if not condition:
        raise NoCompute()


def require_dtypes(tensors: Sequence[Tensor | None], accepts: Callable[[DType], bool]) -> None:
    require(all(t is None or (t.dtype in NUMERIC and accepts(t.dtype)) for t in tensors))


def is_float(dtype: DType) -> bool:
    return dtype.is_float


def is_number(dtype: DType) -> bool:
    return dtype.is_float or dtype.is_int


def any_dtype(dtype: DType) -> bool:
    return True


# ----------------------------------------------------------------------------- conversion


def convert(value: Expr, target: DType) -> Expr:
    """``value`` converted to ``target`` by ONNX Cast rules (numeric and bool types)."""
    source = value.dtype
    if source == target:
        return value
    if target == DType.BOOL:
        return value.ne(lit(0, value))
    if source.is_float and target.is_int:
        if target in _VIA_SIGNED:
            return _x86_float_to_int(value, target)
        as_int64 = Cast(DType.INT64, _wrapped_whole(value))  # sub-byte types: the reference's
        return as_int64 if target == DType.INT64 else Cast(target, as_int64)
    return Cast(target, value)


# Integer type -> the signed conversion x86 builds it from (see _x86_float_to_int).
_VIA_SIGNED = {DType.INT8: DType.INT32, DType.INT16: DType.INT32, DType.UINT8: DType.INT32,
               DType.UINT16: DType.INT32, DType.INT32: DType.INT32, DType.UINT32: DType.INT64,
               DType.INT64: DType.INT64, DType.UINT64: DType.INT64}


def _truncate_signed(whole: Expr, signed: DType) -> Expr:
    """x86's truncating conversion of a whole float64 to int32/int64: the value when it fits,
    else (NaN, infinities, out of range) the type's lowest value ("integer indefinite").  The
    range test comes first, so the C conversion only ever sees values that fit."""
    limit = 2.0 ** (8 * signed.itemsize - 1)
    fits = Binary("and", whole.ge(lit(-limit, whole)), whole.lt(lit(limit, whole)))
    return Select(fits, Cast(signed, whole), Const(-(2 ** (8 * signed.itemsize - 1)), signed))


def _x86_float_to_int(value: Expr, target: DType) -> Expr:
    """``value`` (a float) converted to an 8- to 64-bit integer type as x86-64's scalar
    conversions do, as the reference does (``ember.ops.cast.float_to_integer``): int32 and
    int64 directly, narrower types and uint32 through the int32/int64 conversion, keeping its
    low bits; uint64 from the int64 conversion of ``x`` or of ``x - 2**63`` with the top bit
    set again."""
    whole = call("trunc", value if value.dtype == DType.FLOAT64 else Cast(DType.FLOAT64, value))
    signed = _VIA_SIGNED[target]
    if target is DType.UINT64:
        top = lit(2.0 ** 63, whole)
        high = whole.ge(top)
        lower = Cast(DType.UINT64, _truncate_signed(Select(high, whole - top, whole), signed))
        return Select(high, Binary("bitxor", lower, Const(2 ** 63, DType.UINT64)), lower)
    converted = _truncate_signed(whole, signed)
    return converted if target == signed else Cast(target, converted)  # the low bits


def _wrapped_whole(value: Expr) -> Expr:
    """A float truncated toward zero and wrapped into the int64 range modulo 2**64, in float64
    (exact), as the reference converts; NaN and infinities become NaN, which the loop IR's
    float -> integer conversion turns into 0."""
    whole = call("trunc", value if value.dtype == DType.FLOAT64 else Cast(DType.FLOAT64, value))
    limit, span = lit(2.0 ** 63, whole), lit(2.0 ** 64, whole)
    wrapped = call("fmod", whole, span)
    wrapped = Select(wrapped.ge(limit), wrapped - span,
                     Select(wrapped.lt(-limit), wrapped + span, wrapped))
    return Select(call("fabs", whole).lt(limit), whole, wrapped)


def _cast(ctx: ComputeContext, x: Tensor, target: DType) -> Tensor:
    require(x.dtype in NUMERIC and target in NUMERIC)
    return elementwise(ctx, [x], lambda v: convert(v, target), name="cast")


@compute_of("Cast")
def cast(ctx, x, *, to, saturate, round_mode):
    return _cast(ctx, x, ctx.output_types[0].dtype)


@compute_of("CastLike")
def cast_like(ctx, x, like, *, saturate, round_mode):
    return _cast(ctx, x, like.dtype)


@compute_of("Identity")
def identity(ctx, x):
    require_dtypes([x], any_dtype)
    return x


# ----------------------------------------------------------------------------- unary math


def _abs(x: Expr) -> Expr:
    return call("fabs", x) if x.dtype.is_signed else x  # wrapping for integers


def _sign(x: Expr) -> Expr:
    zero = lit(0, x)
    negative = lit(-1, x) if x.dtype.is_signed else zero
    sign = Select(x.gt(zero), lit(1, x), Select(x.lt(zero), negative, zero))
    if x.dtype.is_float:  # NaN stays NaN
        sign = Select(is_nan(x), x, sign)
    return sign


def _intrinsic(name: str) -> Fn:
    return lambda x: call(name, x)


_FLOAT_UNARY: dict[str, Fn] = {
    "Exp": _intrinsic("exp"), "Log": _intrinsic("log"), "Sqrt": _intrinsic("sqrt"),
    "Ceil": _intrinsic("ceil"), "Floor": _intrinsic("floor"),
    "Round": _intrinsic("nearbyint"),  # half to even in the default rounding mode
    "Sin": _intrinsic("sin"), "Cos": _intrinsic("cos"), "Tan": _intrinsic("tan"),
    "Asin": _intrinsic("asin"), "Acos": _intrinsic("acos"), "Atan": _intrinsic("atan"),
    "Sinh": _intrinsic("sinh"), "Cosh": _intrinsic("cosh"), "Asinh": _intrinsic("asinh"),
    "Acosh": _intrinsic("acosh"), "Atanh": _intrinsic("atanh"), "Tanh": _intrinsic("tanh"),
    "Reciprocal": lambda x: lit(1.0, x) / x,
}
_NUMBER_UNARY: dict[str, Fn] = {"Abs": _abs, "Neg": lambda x: -x, "Sign": _sign}


def _define_unary(op_name: str, fn: Fn, accepts: Callable[[DType], bool]) -> None:
    def unary(ctx, x):
        require_dtypes([x], accepts)
        return elementwise(ctx, [x], fn, name=op_name.lower(), transform=widen)

    unary.__name__ = unary.__qualname__ = f"{op_name.lower()}_compute"
    compute_of(op_name)(unary)


for _name, _fn in _FLOAT_UNARY.items():
    _define_unary(_name, _fn, is_float)
for _name, _fn in _NUMBER_UNARY.items():
    _define_unary(_name, _fn, is_number)


@compute_of("Erf")
def erf(ctx, x):
    """Erf-9 also took integers: erf in float64, truncated (so only -1, 0 or 1)."""
    require_dtypes([x], is_number)
    return elementwise(ctx, [x], _intrinsic("erf"), name="erf",
                       transform=lambda v: convert(v, DType.FLOAT64) if v.dtype.is_int
                       else widen(v))


@compute_of("IsNaN")
def isnan(ctx, x):
    require_dtypes([x], is_float)
    return elementwise(ctx, [x], is_nan, name="isnan", transform=widen)


@compute_of("IsInf")
def isinf(ctx, x, *, detect_negative, detect_positive):
    require_dtypes([x], is_float)

    def fn(v: Expr) -> Expr:
        inf = lit(math.inf, v)
        if detect_negative and detect_positive:
            return call("isinf", v, dtype=DType.BOOL)
        if detect_positive:
            return v.eq(inf)
        if detect_negative:
            return v.eq(-inf)
        return Const(False, DType.BOOL)

    return elementwise(ctx, [x], fn, name="isinf", transform=widen)


@compute_of("Not")
def not_(ctx, x):
    require_dtypes([x], lambda d: d == DType.BOOL)
    return elementwise(ctx, [x], lambda v: Unary("not", v), name="not")


@compute_of("BitwiseNot")
def bitwise_not(ctx, x):
    require_dtypes([x], is_integer)
    return elementwise(ctx, [x], lambda v: Unary("bitnot", v), name="bitnot")


# ----------------------------------------------------------------------------- binary


def _define_binary(op_name: str, fn: Fn, accepts: Callable[[DType], bool],
                   transform: Callable[[Expr], Expr] | None = None) -> None:
    """A broadcasting binary op whose operands share a dtype."""

    def binary(ctx, a, b):
        require_dtypes([a, b], accepts)
        require(a.dtype == b.dtype)
        return elementwise(ctx, [a, b], fn, name=op_name.lower(), transform=transform)

    binary.__name__ = binary.__qualname__ = f"{op_name.lower()}_compute"
    compute_of(op_name)(binary)


_COMPARISONS: dict[str, Fn] = {
    "Equal": lambda a, b: a.eq(b), "Less": lambda a, b: a.lt(b),
    "LessOrEqual": lambda a, b: a.le(b), "Greater": lambda a, b: a.gt(b),
    "GreaterOrEqual": lambda a, b: a.ge(b),
}

_define_binary("Add", lambda a, b: a + b, is_number)
_define_binary("Sub", lambda a, b: a - b, is_number)
_define_binary("Mul", lambda a, b: a * b, is_number)


def _require_nonzero_divisor(ctx: ComputeContext, divisor: Tensor) -> None:
    """An integer divisor must hold no 0: a compile-time constant is checked now (one with a
    0 leaves the node to the reference, which reports it when it runs), any other is checked
    by the compiled model before the kernel runs (``ComputeContext.require_nonzero``).  A
    divisor made of a traced build's run-time sizes is computed inside the kernel, where no
    check reaches it: a size of 0 there gives the loop IR's defined quotient, 0."""
    if not divisor.dtype.is_int:
        return
    known = ctx.value(1)
    if known is None:
        ctx.require_nonzero(1)
    elif not holds_traced(known) and np.any(np.asarray(known) == 0):
        raise NoCompute("a constant integer divisor holds 0: the reference reports it")


@compute_of("Div")
def div(ctx, a, b):
    """a / b; integer division truncates, and a divisor of 0 is an error (see the module
    doc)."""
    require_dtypes([a, b], is_number)
    require(a.dtype == b.dtype)
    _require_nonzero_divisor(ctx, b)
    return elementwise(ctx, [a, b], lambda x, y: x / y, name="div")

_define_binary("BitwiseAnd", lambda a, b: Binary("bitand", a, b), is_integer)
_define_binary("BitwiseOr", lambda a, b: Binary("bitor", a, b), is_integer)
_define_binary("BitwiseXor", lambda a, b: Binary("bitxor", a, b), is_integer)
_define_binary("And", logical_and, lambda d: d == DType.BOOL)
_define_binary("Or", logical_or, lambda d: d == DType.BOOL)
_define_binary("Xor", lambda a, b: a.ne(b), lambda d: d == DType.BOOL)
for _name, _fn in _COMPARISONS.items():
    _define_binary(_name, _fn, any_dtype, transform=widen)


@compute_of("Mod")
def mod(ctx, a, b, *, fmod):
    require_dtypes([a, b], is_number)
    require(a.dtype == b.dtype and fmod in (0, 1))
    _require_nonzero_divisor(ctx, b)
    # fmod=1: C's remainder (the dividend's sign); fmod=0: floormod, numpy's remainder.
    op = "mod" if fmod else "floormod"
    fn = (lambda x, y: call("fmod", x, y)) if a.dtype.is_float and fmod else \
        (lambda x, y: Binary(op, x, y))
    return elementwise(ctx, [a, b], fn, name="mod", transform=widen)


@compute_of("BitShift")
def bit_shift(ctx, x, y, *, direction):
    require_dtypes([x, y], is_integer)
    require(x.dtype == y.dtype and direction in ("LEFT", "RIGHT"))
    op = "shl" if direction == "LEFT" else "shr"
    return elementwise(ctx, [x, y], lambda a, b: Binary(op, a, b), name="bitshift")


# ----------------------------------------------------------------------------- Pow

_MAX_INT_EXPONENT = 64  # integer powers with larger constant exponents run on the host


@compute_of("Pow")
def pow_(ctx, x, y):
    require_dtypes([x, y], is_number)
    if x.dtype.is_int and y.dtype.is_int:
        return _integer_pow(ctx, x, y)
    exponent = ctx.value(1)
    if x.dtype.is_float:
        wide = DType.FLOAT64 if DType.FLOAT64 in (x.dtype, y.dtype) else DType.FLOAT32
        if exponent is not None and exponent.size and (exponent == 2).all():
            return elementwise(ctx, [x], lambda v: v * v, name="square", transform=widen)
        # a cube (tanh-GELU written out, x ** 3): two multiplies where libm's pow costs ~20 ns
        # an element; within an ulp or two of pow
        if exponent is not None and exponent.size and (exponent == 3).all():
            return elementwise(ctx, [x], lambda v: v * v * v, name="cube", transform=widen)
        return elementwise(ctx, [x, y], lambda a, b: call("pow", a, b),
                           name="pow", transform=lambda v: Cast(wide, v)
                           if v.dtype != wide else v)
    # An integer base with a float exponent: in float64, truncated toward zero.
    return elementwise(ctx, [x, y], lambda a, b: convert(call("pow", a, b), x.dtype),
                       name="pow", transform=lambda v: convert(v, DType.FLOAT64))


def _integer_pow(ctx: ComputeContext, x: Tensor, y: Tensor) -> Tensor:
    """x ** y for integers with a constant exponent: a product over a reduction axis of
    max(y) steps (wrapping like numpy); a negative exponent truncates 1 / x**|y| as C."""
    exponent = ctx.value(1)
    require(exponent is not None)
    largest = int(exponent.max()) if exponent.size else 0
    require(largest <= _MAX_INT_EXPONENT)
    shape = tuple(as_size(d) for d in ctx.output_types[0].shape)
    k = reduce_axis(max(largest, 1), "e")

    def body(*indices: Expr) -> Expr:
        base = broadcast_load(x, shape, indices)
        count = Cast(INDEX, broadcast_load(y, shape, indices))
        power = reduce_prod(base, k, condition=k.lt(count))
        if not y.dtype.is_signed:
            return power
        # A negative exponent truncates to 0 unless |x| is 1; then the empty product (1) is
        # right, except for (-1) ** odd.  (Conditions, not branches, read the base.)
        negative = count.lt(Const(0, INDEX))
        unit = base.eq(lit(1, base))
        if base.dtype.is_signed:
            unit = logical_or(unit, base.eq(lit(-1, base)))
        result = Select(logical_and(negative, Unary("not", unit)), lit(0, base), power)
        if base.dtype.is_signed:
            odd = (count % 2).eq(Const(1, INDEX))
            flips = logical_and(logical_and(negative, odd), base.eq(lit(-1, base)))
            result = Select(flips, lit(-1, base), result)
        return result

    return compute(shape, body, name="ipow", dtype=x.dtype)


# ----------------------------------------------------------------------------- variadic


def combine_pairwise(values: list[Expr], combine: Fn) -> Expr:
    """``values`` combined as a balanced tree (``(a+b)+(c+d)``): a Sum of a thousand inputs
    is an expression 10 levels deep, not 1,000 (every later walk over it recurses that deep).
    Two or three values combine left to right, as a fold would."""
    while len(values) > 1:
        paired = [combine(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            if len(paired) == 1:  # three values: (a + b) + c, the fold's order
                paired[0] = combine(paired[0], values[-1])
            else:
                paired.append(values[-1])
        values = paired
    return values[0]


def _variadic(ctx: ComputeContext, inputs: Sequence[Tensor], combine: Fn, name: str,
              transform: Callable[[Expr], Expr] | None = None,
              finish: Callable[[Expr], Expr] | None = None) -> Tensor:
    require_dtypes(inputs, is_number)
    require(len({t.dtype for t in inputs}) == 1)

    def fn(*values: Expr) -> Expr:
        result = combine_pairwise(list(values), combine)
        return finish(result) if finish is not None else result

    return elementwise(ctx, inputs, fn, name=name, transform=transform)


@compute_of("Max")
def max_(ctx, *inputs):
    return _variadic(ctx, inputs, maximum, "max")


@compute_of("Min")
def min_(ctx, *inputs):
    return _variadic(ctx, inputs, minimum, "min")


@compute_of("Sum")
def sum_(ctx, *inputs):
    # float16/bfloat16 accumulate in float32 and round once, as the reference does
    return _variadic(ctx, inputs, lambda a, b: a + b, "sum", transform=widen)


@compute_of("Mean")
def mean(ctx, *inputs):
    require_dtypes(inputs, is_float)
    return _variadic(ctx, inputs, lambda a, b: a + b, "mean", transform=widen,
                     finish=lambda total: total / lit(float(len(inputs)), total))


# ----------------------------------------------------------------------------- Where, Clip


@compute_of("Where")
def where(ctx, condition, x, y):
    require_dtypes([condition], lambda d: d == DType.BOOL)
    require_dtypes([x, y], any_dtype)
    require(x.dtype == y.dtype)
    return elementwise(ctx, [condition, x, y], Select, name="where")


@compute_of("Clip")
def clip(ctx, x, low=None, high=None):
    require_dtypes([x, low, high], is_number)
    bounds = [b for b in (low, high) if b is not None]
    require(all(b.dtype == x.dtype and b.size == 1 for b in bounds))

    def fn(v: Expr) -> Expr:
        if low is not None:
            v = maximum(v, widen(low.flat(Const(0, INDEX))))
        if high is not None:
            v = minimum(v, widen(high.flat(Const(0, INDEX))))
        return v

    return elementwise(ctx, [x], fn, name="clip", transform=widen)


# ----------------------------------------------------------------------------- activations


def _define_activation(op_name: str, make: Callable[..., Fn],
                       accepts: Callable[[DType], bool] = is_float) -> None:
    """A unary activation: ``make(**attrs)`` gives the function of one (widened) element."""

    def activation(ctx, x, **attrs):
        require_dtypes([x], accepts)
        return elementwise(ctx, [x], make(**attrs), name=op_name.lower(), transform=widen)

    activation.__name__ = activation.__qualname__ = f"{op_name.lower()}_compute"
    compute_of(op_name)(activation)


def _relu(x: Expr) -> Expr:
    zero = lit(0, x)
    return Select(x.lt(zero), zero, x)  # NaN stays NaN, as np.maximum(x, 0)


def _sigmoid(x: Expr) -> Expr:
    return call("sigmoid", x)


def _softplus(x: Expr) -> Expr:
    """log(1 + e**x) without overflow: max(x, 0) + log1p(e**-|x|)."""
    zero = lit(0.0, x)
    return Select(x.gt(zero), x, zero) + call("log1p", call("exp", -call("fabs", x)))


def _clamp01(x: Expr) -> Expr:
    return minimum(maximum(x, lit(0.0, x)), lit(1.0, x))


def _leaky_relu(alpha: float) -> Fn:
    return lambda x: Select(x.ge(lit(0.0, x)), x, lit(alpha, x) * x)


def _thresholded_relu(alpha: float) -> Fn:
    return lambda x: Select(x.gt(lit(alpha, x)), x, lit(0.0, x))


def _elu(alpha: float) -> Fn:
    return lambda x: Select(x.ge(lit(0.0, x)), x, lit(alpha, x) * call("expm1", x))


def _selu(alpha: float, gamma: float) -> Fn:
    def fn(x: Expr) -> Expr:
        negative = lit(alpha, x) * call("expm1", x)
        return lit(gamma, x) * Select(x.gt(lit(0.0, x)), x, negative)

    return fn


def _celu(alpha: float) -> Fn:
    require(alpha != 0)

    def fn(x: Expr) -> Expr:
        zero = lit(0.0, x)
        negative = lit(alpha, x) * call("expm1", x / lit(alpha, x))
        return maximum(x, zero) + minimum(zero, negative)

    return fn


def _hard_sigmoid(alpha: float, beta: float) -> Fn:
    return lambda x: _clamp01(lit(alpha, x) * x + lit(beta, x))


def _hard_swish() -> Fn:
    return lambda x: x * _clamp01(x / lit(6.0, x) + lit(0.5, x))


def _swish(alpha: float) -> Fn:
    return lambda x: x * _sigmoid(lit(alpha, x) * x)


def _gelu(approximate: str) -> Fn:
    require(approximate in ("none", "tanh"))

    def fn(x: Expr) -> Expr:
        if approximate == "tanh":
            inner = lit(math.sqrt(2 / math.pi), x) * (x + lit(0.044715, x) * (x * x * x))
            gate = call("tanh", inner)
        else:
            gate = call("erf", x * lit(math.sqrt(0.5), x))
        return lit(0.5, x) * x * (lit(1.0, x) + gate)

    return fn


_define_activation("Relu", lambda: _relu, is_number)
_define_activation("LeakyRelu", _leaky_relu)
_define_activation("ThresholdedRelu", _thresholded_relu)
_define_activation("Elu", _elu)
_define_activation("Selu", _selu)
_define_activation("Celu", _celu)
_define_activation("Sigmoid", lambda: _sigmoid)
_define_activation("HardSigmoid", _hard_sigmoid)
_define_activation("HardSwish", _hard_swish)
_define_activation("Swish", _swish)
_define_activation("Softplus", lambda: _softplus)
_define_activation("Softsign", lambda: lambda x: x / (lit(1.0, x) + call("fabs", x)))
_define_activation("Mish", lambda: lambda x: x * call("tanh", _softplus(x)))
_define_activation("Gelu", _gelu)


@compute_of("PRelu")
def prelu(ctx, x, slope):
    require_dtypes([x, slope], is_number)
    require(x.dtype == slope.dtype)
    return elementwise(ctx, [x, slope],
                       lambda v, s: Select(v.lt(lit(0, v)), s * v, v),
                       name="prelu", transform=widen)


@compute_of("Shrink")
def shrink(ctx, x, *, bias, lambd):
    """Evaluated in float64 as the reference does; integer results truncate."""
    require_dtypes([x], is_number)

    def fn(v: Expr) -> Expr:
        wide = convert(v, DType.FLOAT64)
        b, limit = lit(bias, wide), lit(lambd, wide)
        result = Select(wide.lt(lit(-lambd, wide)), wide + b,
                        Select(wide.gt(limit), wide - b, lit(0.0, wide)))
        return convert(result, v.dtype)  # integers truncate (and wrap, as Cast does)

    return elementwise(ctx, [x], fn, name="shrink")
