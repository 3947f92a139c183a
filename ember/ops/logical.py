"""Logical ops and predicates: And/Or/Xor/Not, the comparisons, Where, IsNaN and IsInf.

Comparisons and predicates produce bool tensors; all binary ops broadcast numpy-style.
Equal and Where also fold the small integer tensors that describe shapes during shape
inference, where an element may be a symbolic dim: Equal then answers only when the two dims
are provably equal or different, and refuses (so folding gives up) otherwise.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import dims_equal
from ember.core.dtypes import DType
from ember.ir.types import ValueType
from ember.ops.elementwise import (
    BOOL_TENSOR,
    FLOAT_TENSOR,
    broadcast_infer,
    expect_dtype,
    has_symbols,
    is_bool,
    is_float,
    like_input,
    same_type_infer,
)
from ember.ops.registry import Attr, InferContext, InferFn, RefContext, op



def _binary(name: str, ufunc: np.ufunc, doc: str, infer: InferFn,
            commutative: bool = False) -> None:
    """Register ``ufunc(a, b)`` (a bool result) as op ``name``."""

    def reference(ctx, a, b):
        return np.asarray(ufunc(a, b))

    reference.__doc__ = doc
    op(name, family="logical", infer=infer, commutative=commutative)(reference)


# ----------------------------------------------------------------------------- boolean logic

_bool_broadcast = broadcast_infer(accepts=is_bool, what=BOOL_TENSOR)

_binary("And", np.logical_and, "a AND b with broadcasting.", _bool_broadcast, commutative=True)
_binary("Or", np.logical_or, "a OR b with broadcasting.", _bool_broadcast, commutative=True)
_binary("Xor", np.logical_xor, "a XOR b with broadcasting.", _bool_broadcast, commutative=True)


@op("Not", family="logical", infer=same_type_infer(is_bool, BOOL_TENSOR))
def not_(ctx, x):
    """NOT x."""
    return np.asarray(np.logical_not(x))


# ----------------------------------------------------------------------------- comparisons


def _symbolic_equal(ctx: RefContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal over shape values holding symbolic dims; an error where equality is unknown."""
    a, b = np.broadcast_arrays(a, b)
    answers = [dims_equal(x, y) for x, y in zip(a.flat, b.flat)]
    if any(answer is None for answer in answers):
        raise ctx.error("the comparison of symbolic dims is not decidable at compile time")
    return np.array(answers, dtype=bool).reshape(a.shape)


_comparison = broadcast_infer(DType.BOOL)


@op("Equal", family="logical", infer=_comparison, commutative=True)
def equal(ctx, a, b):
    """a == b with broadcasting (numbers, bools or strings)."""
    if has_symbols(a) or has_symbols(b):
        return _symbolic_equal(ctx, a, b)
    return np.asarray(np.equal(a, b), dtype=bool)


_binary("Less", np.less, "a < b with broadcasting.", _comparison)
_binary("LessOrEqual", np.less_equal, "a <= b with broadcasting.", _comparison)
_binary("Greater", np.greater, "a > b with broadcasting.", _comparison)
_binary("GreaterOrEqual", np.greater_equal, "a >= b with broadcasting.", _comparison)


# ----------------------------------------------------------------------------- selection


_broadcast_x_and_y = broadcast_infer(dtype_from=1)


def _where_infer(ctx: InferContext) -> list[ValueType | None]:
    expect_dtype(ctx, 0, is_bool, f"{BOOL_TENSOR} (the condition)")
    return _broadcast_x_and_y(ctx)


@op("Where", family="logical", infer=_where_infer)
def where(ctx, condition, x, y):
    """x where condition holds, else y; all three broadcast."""
    return like_input(np.where(condition, x, y), x)


# ----------------------------------------------------------------------------- predicates

_float_predicate = same_type_infer(is_float, FLOAT_TENSOR, dtype=DType.BOOL)


@op("IsNaN", family="logical", infer=_float_predicate)
def is_nan(ctx, x):
    """True where x is NaN."""
    return np.asarray(np.isnan(x))


@op("IsInf", family="logical", infer=_float_predicate,
    attrs={"detect_negative": Attr.int(1), "detect_positive": Attr.int(1)})
def is_inf(ctx, x, *, detect_negative, detect_positive):
    """True where x is +inf (if detect_positive) or -inf (if detect_negative)."""
    infinite = np.isinf(x)
    positive = x > 0
    wanted = (positive & bool(detect_positive)) | (~positive & bool(detect_negative))
    return np.asarray(infinite & wanted)
