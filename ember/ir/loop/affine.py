"""The one affine analysis of index expressions, shared by lowering, schedules and codegen.

Lowering asks how far an access moves when a loop variable steps (to decide whether a
reduction can be accumulated in its output and vectorized), the register-tiling schedule
needs an output index as exact integer coefficients per loop variable, and code generation
recognizes a vector index that is ``base + stride * lane`` (a contiguous load instead of a
gather).  All three read the same expression forms -- sums, differences and products by
constants of variables, as ``Buffer.flat_index`` builds them -- so they are answered here.
"""

from __future__ import annotations

from ember.core.traced import as_size
from ember.ir.loop.expr import INDEX, Binary, Broadcast, Const, Expr, Ramp, Var
from ember.ir.loop.functor import substitute, walk
from ember.ir.loop.simplify import simplify


def affine_coefficients(expr: Expr) -> dict[Var | None, int] | None:
    """``expr`` as ``{var: coefficient, None: constant}`` if it is an integer affine
    combination of variables (sums, differences, products by constants), else None."""
    if isinstance(expr, Const):
        return {None: as_size(expr.value)} if expr.dtype.is_int and expr.lanes == 1 else None
    if isinstance(expr, Var):
        return {expr: 1}
    if isinstance(expr, Binary) and expr.op in ("add", "sub"):
        a, b = affine_coefficients(expr.a), affine_coefficients(expr.b)
        if a is None or b is None:
            return None
        sign = 1 if expr.op == "add" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if isinstance(expr, Binary) and expr.op == "mul":
        a, b = affine_coefficients(expr.a), affine_coefficients(expr.b)
        if a is None or b is None:
            return None
        for c, other in ((a, b), (b, a)):
            if set(c) <= {None}:
                factor = c.get(None, 0)
                return {k: v * factor for k, v in other.items()}
        return None
    return None


def split_affine(expr: Expr, var: Var) -> tuple[int | None, Expr]:
    """``(a, rest)`` with ``expr == a * var + rest`` and ``rest`` free of ``var``, whatever
    else ``rest`` holds (a division of other variables, a load); ``a`` is None when ``var``
    enters otherwise (under a division, a product of variables...)."""
    if not any(node == var for node in walk(expr)):
        return 0, expr
    if expr == var:
        return 1, Const(0, INDEX)
    if isinstance(expr, Binary) and expr.op in ("add", "sub"):
        (ca, ra), (cb, rb) = split_affine(expr.a, var), split_affine(expr.b, var)
        if ca is None or cb is None:
            return None, expr
        return (ca + cb if expr.op == "add" else ca - cb), Binary(expr.op, ra, rb)
    if isinstance(expr, Binary) and expr.op == "mul":
        for factor, other in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(factor, Const) and factor.dtype.is_int and factor.lanes == 1:
                coefficient, rest = split_affine(other, var)
                if coefficient is None:
                    return None, expr
                return coefficient * as_size(factor.value), Binary("mul", rest, factor)
    return None, expr


def local_stride(index: Expr, var: Var, extents: dict) -> int | None:
    """How far ``index`` moves when ``var`` steps by one, at an interior point of the loop
    space (every variable at half its extent): the stride of affine indices, and that of
    clamped/padded ones away from the borders.  None if it cannot be evaluated."""
    coefficients = affine_coefficients(index)
    if coefficients is not None and all(v is None or v in extents for v in coefficients):
        return coefficients.get(var, 0)
    point = {v: Const(max(e // 2, 0), INDEX) for v, e in extents.items()}
    here = simplify(substitute(index, point))
    point[var] = Const(max(extents.get(var, 2) // 2, 0) + 1, INDEX)
    there = simplify(substitute(index, point))
    if isinstance(here, Const) and isinstance(there, Const):
        return as_size(there.value) - as_size(here.value)
    return None


def affine_ramp(index: Expr) -> tuple[Expr, Expr] | None:
    """``(base, stride)`` when the vector ``index`` is ``base + stride * lane``, as a sum or
    difference of Ramps and Broadcasts (how ``flat_index`` combines a vector column with a
    broadcast row offset), so that it can be a contiguous access instead of a gather."""
    if isinstance(index, Ramp):
        return index.base, index.stride
    if isinstance(index, Broadcast):
        return index.value, Const(0, index.dtype)
    if isinstance(index, Binary) and index.op in ("add", "sub"):
        a, b = affine_ramp(index.a), affine_ramp(index.b)
        if a is not None and b is not None:
            return (simplify(Binary(index.op, a[0], b[0])),
                    simplify(Binary(index.op, a[1], b[1])))
    return None
