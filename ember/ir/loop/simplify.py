"""Arithmetic simplification of loop-IR expressions.

Folds constants and removes identities (``x + 0``, ``x * 1``, ``x * 0``) so that lowered and
scheduled index expressions stay readable and cheap; it never changes a value.  Integer folding
uses the op's own semantics (C truncation for ``div``/``mod``, floor for ``floordiv``).
"""

from __future__ import annotations

import math

from ember.ir.loop.expr import Binary, Const, Expr
from ember.ir.loop.functor import rewrite


def _fold(op: str, a, b, is_int: bool):
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
            return int(math.trunc(a / b)) if abs(a) < 2**52 else None
        if op == "mod":
            return a - b * int(math.trunc(a / b)) if abs(a) < 2**52 else None
    return None


def _simplify_binary(node: Binary) -> Expr | None:
    a, b = node.a, node.b
    a_const = isinstance(a, Const) and a.lanes == 1
    b_const = isinstance(b, Const) and b.lanes == 1
    is_int = node.dtype.is_int
    if a_const and b_const and node.dtype == a.dtype:
        value = _fold(node.op, a.value, b.value, is_int)
        if value is not None:
            return Const(value, node.dtype)
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
        folded = _fold(node.op, a.b.value, b.value, True)
        return _simplify_binary(Binary(node.op, a.a, Const(folded, node.dtype))) or \
            Binary(node.op, a.a, Const(folded, node.dtype))
    return None


def simplify(node):
    """Simplify an expression or statement tree."""
    return rewrite(node, lambda n: _simplify_binary(n) if isinstance(n, Binary) else None)
