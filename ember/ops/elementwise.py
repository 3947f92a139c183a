"""Elementwise arithmetic and math: unary functions, broadcasting binary ops, n-ary ops.

Integer semantics follow ONNX, not numpy, where the two differ (Div truncates toward zero,
Mod follows the sign of the divisor unless ``fmod=1``).
"""

from __future__ import annotations

import numpy as np

from ember.ops.registry import Attr, op
from ember.ops.shape_infer import broadcast_to_dtype, same_as_input

# ----------------------------------------------------------------------------- unary math


def _unary(name: str, fn, doc: str) -> None:
    def reference(ctx, x):
        return np.asarray(fn(x)).astype(x.dtype, copy=False)

    reference.__doc__ = doc
    op(name, family="elementwise", infer=same_as_input(0))(reference)


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


# ----------------------------------------------------------------------------- binary


@op("Add", family="elementwise", infer=broadcast_to_dtype())
def add(ctx, a, b):
    """a + b with broadcasting (integers wrap around)."""
    return np.add(a, b).astype(a.dtype, copy=False)


@op("Sub", family="elementwise", infer=broadcast_to_dtype())
def sub(ctx, a, b):
    """a - b with broadcasting."""
    return np.subtract(a, b).astype(a.dtype, copy=False)


@op("Mul", family="elementwise", infer=broadcast_to_dtype())
def mul(ctx, a, b):
    """a * b with broadcasting."""
    return np.multiply(a, b).astype(a.dtype, copy=False)


@op("Div", family="elementwise", infer=broadcast_to_dtype())
def div(ctx, a, b):
    """a / b; integer division truncates toward zero as in C."""
    if a.dtype.kind in "iu":
        return np.trunc(np.true_divide(a, b)).astype(a.dtype)
    return np.true_divide(a, b).astype(a.dtype, copy=False)
