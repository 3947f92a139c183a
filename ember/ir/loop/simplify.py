"""Arithmetic simplification of loop-IR expressions.

Folds constants and removes identities (``x + 0``, ``x * 1``, ``x * 0``) so that lowered and
scheduled index expressions stay readable and cheap; it never changes a value.  Folding
uses the op's own semantics (C truncation for ``div``/``mod``, floor for ``floordiv``,
wrapping integer arithmetic, float arithmetic in the operands' precision).
"""

from __future__ import annotations

import numpy as np

from ember.core.traced import as_size, is_traced
from ember.core.dtypes import DType
from ember.ir.loop.expr import Binary, Const, Expr
from ember.ir.loop.functor import rewrite


def _fold(op: str, a, b, is_int: bool):
    """``a op b`` on exact Python integers (int folding) or numbers, None if not folded."""
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if is_int and b != 0:
        if op == "floordiv":
            return a // b
        if op == "floormod":
            return a % b
        if op == "div":
            return _trunc_div(a, b)
        if op == "mod":
            return a - b * _trunc_div(a, b)
    return None


def _trunc_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _fold_const(op: str, a: Const, b: Const, dtype: DType) -> Const | None:
    """The constant ``a op b`` of ``dtype`` with the IR's semantics, or None.

    Integers wrap to the type's width (as the C code computes them); floats are computed in
    their own precision (rounding the operands and the result to ``dtype``, not in Python's
    double) and ``min``/``max`` propagate NaN and return ``b`` on ties; bool arithmetic is
    logical (``add`` = or, ``mul`` = and, ``sub`` = xor)."""
    if dtype.is_int:
        try:
            info = np.iinfo(dtype.numpy)
        except ValueError:
            return None
        value = _fold(op, as_size(a.value), as_size(b.value), True)
        if value is None:
            return None
        if is_traced(value):  # a run-time size: it stays an expression, guarded in range
            return Const(value, dtype) if info.min <= value <= info.max else None
        span = int(info.max) - int(info.min) + 1
        return Const((value - int(info.min)) % span + int(info.min), dtype)
    if dtype.is_float:
        scalar = dtype.numpy.type
        with np.errstate(all="ignore"):
            x, y = scalar(a.value), scalar(b.value)
            if op in ("min", "max"):
                pick_x = (x < y if op == "min" else x > y) or x != x
                return Const(float(x if pick_x else y), dtype)
            if op not in ("add", "sub", "mul"):
                return None
            return Const(float(scalar(_fold(op, x, y, False))), dtype)
    if dtype == DType.BOOL and op in ("add", "sub", "mul", "min", "max"):
        return Const(bool(_fold(op, bool(a.value), bool(b.value), False)), dtype)
    return None


def _simplify_binary(node: Binary) -> Expr | None:
    a, b = node.a, node.b
    a_const = isinstance(a, Const) and a.lanes == 1
    b_const = isinstance(b, Const) and b.lanes == 1
    is_int = node.dtype.is_int
    if a_const and b_const and node.dtype == a.dtype == b.dtype:
        folded = _fold_const(node.op, a, b, node.dtype)
        if folded is not None:
            return folded
    if not is_int:
        return None  # float identities change NaN/-0 behaviour; leave them
    if node.op == "add":
        if b_const and b.value == 0:
            return a
        if a_const and a.value == 0:
            return b
    if node.op == "sub" and b_const and b.value == 0:
        return a
    if node.op == "mul":
        if (b_const and b.value == 0) or (a_const and a.value == 0):
            return Const(0, node.dtype) if node.lanes == 1 else None
        if b_const and b.value == 1:
            return a
        if a_const and a.value == 1:
            return b
    if node.op in ("floordiv", "div") and b_const and b.value == 1:
        return a
    if node.op in ("floormod", "mod") and b_const and b.value == 1 and node.lanes == 1:
        return Const(0, node.dtype)
    # (x * c1) * c2 -> x * (c1 * c2); (x + c1) + c2 -> x + (c1 + c2)
    if node.op in ("mul", "add") and b_const and isinstance(a, Binary) and a.op == node.op \
            and isinstance(a.b, Const) and a.b.lanes == 1:
        folded = _fold_const(node.op, a.b, b, node.dtype)
        if folded is None:
            return None
        return _simplify_binary(Binary(node.op, a.a, folded)) or Binary(node.op, a.a, folded)
    return None


def simplify(node):
    """Simplify an expression or statement tree."""
    return rewrite(node, lambda n: _simplify_binary(n) if isinstance(n, Binary) else None)
