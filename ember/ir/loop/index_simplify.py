"""Range-aware simplification of buffer indices: the divisions the loop bounds make exact.

A Reshape between fused ops, a Flatten, or loops fused for parallelism write an element's
index through its flat position: ``((i * 3072 + j) // 3072) * 3072 + (i * 3072 + j) % 3072``,
or ``(f // 128) * 128 + f % 128`` for a fused loop ``f``.  With ``j`` in ``[0, 3072)`` the first
is ``i * 3072 + j`` and the second is ``f``, but the generic simplifier knows no ranges, and in C
every division is a call of a helper that defines division by zero and overflow: GCC's
data-reference analysis then gives up on the access, and the loop stays scalar (GPT-2's GELU,
between two Reshapes, ran at 0.3 GFLOP/s for that reason alone).

:func:`simplify_indices` walks a kernel with the interval of every loop variable (and of every
``LetStmt`` whose value is index arithmetic) and rewrites the index of each Load and Store:

* a floor division by a positive constant ``c`` of ``c * q + r`` becomes ``q + r // c`` and
  its modulo ``r % c`` (exact whatever ``r``); then ``r // c`` is 0 and ``r % c`` is ``r``
  when ``r`` provably lies in ``[0, c)``, and a provably non-negative ``r`` is divided with
  C's truncating ``div``/``mod``, which code generation writes as plain ``/`` and ``%``
  (truncating ``div``/``mod`` of the IR are rewritten only when their whole dividend is
  provably non-negative);
* ``(x // c) * c * k + (x % c) * k`` becomes ``x * k``.

The operands of comparisons of positions (int64 arithmetic of loop variables only, as a
Concat tests which piece an element is in, through a fused Reshape's flat index) are
simplified the same way, so that loop partitioning can decide them.

Only buffer indices (and such positions) are rewritten: they are int64 values that address memory, so bounded by the
buffer's size, and the rewrite is exact integer arithmetic on them.  Values computed in int64
(a model's own integer arithmetic, with its wrapping semantics) are left alone.  An index that
nothing simplifies is returned as the very same object.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from ember.core.traced import (as_size, constant_factor, exact_quotient, is_traced,
                               may_be_nonzero, plain)
from ember.core.dtypes import DType
from ember.ir.loop.expr import Binary, Const, Expr, Load, Var
from ember.ir.loop.functor import rewrite, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import (Allocate, Evaluate, For, IfThenElse, LetStmt, PrimFunc, Seq,
                                Stmt, Store)

Interval = tuple[int, int]  # inclusive bounds
Ranges = Mapping[Var, Interval]

_DIVISIONS = {"floordiv": "floor", "floormod": "floor", "div": "trunc", "mod": "trunc"}


def simplify_indices(func: PrimFunc) -> PrimFunc:
    """``func`` with the divisions of its buffer indices that loop bounds make exact removed."""
    body = _stmt(func.body, {})
    return func if body is func.body else func.with_body(body)


def simplify_index(expr: Expr, ranges: Ranges) -> Expr:
    """``expr``, an int64 index, simplified given the inclusive ``ranges`` of variables."""
    if not _is_index(expr):
        return expr

    def visit(node):
        if isinstance(node, Binary) and node.op in _DIVISIONS and _is_index(node):
            return _exact_division(node, ranges)
        if isinstance(node, Binary) and node.op in ("add", "sub") and _is_index(node):
            return _recombine(node)
        return None

    result = rewrite(expr, visit)
    return expr if result is expr else simplify(result)  # fold what the rewrites exposed


# --------------------------------------------------------------------------- statements
def _stmt(stmt: Stmt, ranges: dict[Var, Interval]) -> Stmt:
    if isinstance(stmt, For):
        inner = dict(ranges)
        start, extent = stmt.start, stmt.extent
        if isinstance(start, Const) and isinstance(extent, Const) and \
                may_be_nonzero(extent.value) and extent.value >= 0:  # (as in the body)
            inner[stmt.var] = (as_size(start.value),
                               as_size(start.value) + as_size(extent.value) - 1)
        else:
            inner.pop(stmt.var, None)
        body = _stmt(stmt.body, inner)
        return stmt if body is stmt.body else replace(stmt, body=body)
    if isinstance(stmt, LetStmt):
        inner = dict(ranges)
        value = _exprs(stmt.value, ranges)
        bound = interval(value, ranges) if _is_index(value) else None
        if bound is not None and stmt.var.dtype is DType.INT64:
            inner[stmt.var] = bound
        else:
            inner.pop(stmt.var, None)
        body = _stmt(stmt.body, inner)
        if value is stmt.value and body is stmt.body:
            return stmt
        return replace(stmt, value=value, body=body)
    if isinstance(stmt, Seq):
        parts = tuple(_stmt(s, ranges) for s in stmt.stmts)
        return stmt if all(a is b for a, b in zip(parts, stmt.stmts)) else Seq(parts)
    if isinstance(stmt, IfThenElse):
        cond = _exprs(stmt.cond, ranges)
        then_body = _stmt(stmt.then_body, ranges)
        else_body = _stmt(stmt.else_body, ranges) if stmt.else_body is not None else None
        if cond is stmt.cond and then_body is stmt.then_body and else_body is stmt.else_body:
            return stmt
        return IfThenElse(cond, then_body, else_body)
    if isinstance(stmt, Allocate):
        body = _stmt(stmt.body, ranges)
        return stmt if body is stmt.body else replace(stmt, body=body)
    if isinstance(stmt, Store):
        index = simplify_index(stmt.index, ranges) if stmt.index.lanes == 1 else stmt.index
        value = _exprs(stmt.value, ranges)
        mask = _exprs(stmt.mask, ranges) if stmt.mask is not None else None
        if index is stmt.index and value is stmt.value and mask is stmt.mask:
            return stmt
        return replace(stmt, index=index, value=value, mask=mask)
    if isinstance(stmt, Evaluate):
        value = _exprs(stmt.value, ranges)
        return stmt if value is stmt.value else Evaluate(value)
    return stmt  # a Gemm: its bases are affine already


def _exprs(expr: Expr, ranges: Ranges) -> Expr:
    """``expr`` with the index of every scalar Load in it simplified, and the operands of its
    comparisons of positions (a Concat's piece tests, a Pad's border tests: int64 arithmetic
    of loop variables and constants only, no loaded value)."""
    def visit(node):
        if isinstance(node, Load) and node.index.lanes == 1:
            index = simplify_index(node.index, ranges)
            return None if index is node.index else replace(node, index=index)
        if isinstance(node, Binary) and node.op in _COMPARISONS and _is_position(node.a) and \
                _is_position(node.b):
            a, b = simplify_index(node.a, ranges), simplify_index(node.b, ranges)
            return None if a is node.a and b is node.b else replace(node, a=a, b=b)
        return None

    return rewrite(expr, visit)


_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def _is_position(expr: Expr) -> bool:
    """An int64 expression of loop variables and constants: a position, which lowering
    computed, not a value of the model (those come from loads)."""
    return _is_index(expr) and not any(isinstance(n, Load) for n in walk(expr))


def _is_index(expr: Expr) -> bool:
    return expr.dtype is DType.INT64 and expr.lanes == 1


# --------------------------------------------------------------------------- intervals
def interval(expr: Expr, ranges: Ranges) -> Interval | None:
    """Inclusive bounds of an int64 ``expr`` given the ``ranges`` of its variables; None if
    they are not known."""
    if isinstance(expr, Const):
        return (as_size(expr.value), as_size(expr.value)) if expr.dtype.is_int else None
    if isinstance(expr, Var):
        return ranges.get(expr)
    if not isinstance(expr, Binary):
        return None
    divisor = _positive_constant(expr.b)
    if expr.op in ("floordiv", "floormod", "div", "mod") and divisor is not None:
        a = interval(expr.a, ranges)
        if expr.op in ("div", "mod") and (a is None or a[0] < 0):
            return (-(divisor - 1), divisor - 1) if expr.op == "mod" else None
        if expr.op in ("floordiv", "div"):
            return None if a is None else (a[0] // divisor, a[1] // divisor)
        if a is not None and a[0] // divisor == a[1] // divisor:
            return (a[0] % divisor, a[1] % divisor)
        return (0, divisor - 1)
    a, b = interval(expr.a, ranges), interval(expr.b, ranges)
    if a is None or b is None:
        return None
    if expr.op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if expr.op == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if expr.op == "mul":
        corners = [x * y for x in a for y in b]
        return (min(corners), max(corners))
    if expr.op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if expr.op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    return None


def _positive_constant(expr: Expr) -> int | None:
    if isinstance(expr, Const) and expr.dtype.is_int and as_size(expr.value) > 0:
        return as_size(expr.value)
    return None


# --------------------------------------------------------------------------- linear forms
# An index as {term: coefficient} plus a constant, where a term is a variable or any other
# subexpression (a division, a load) taken as a whole.
Linear = tuple[dict[Expr, int], int]


def _linear(expr: Expr) -> Linear:
    if isinstance(expr, Const) and expr.dtype.is_int:
        return {}, as_size(expr.value)
    if isinstance(expr, Binary) and expr.op in ("add", "sub") and _is_index(expr):
        (ta, ca), (tb, cb) = _linear(expr.a), _linear(expr.b)
        sign = 1 if expr.op == "add" else -1
        terms = dict(ta)
        for term, coefficient in tb.items():
            terms[term] = terms.get(term, 0) + sign * coefficient
        return {t: c for t, c in terms.items() if c}, ca + sign * cb
    if isinstance(expr, Binary) and expr.op == "mul" and _is_index(expr):
        for factor, other in ((expr.b, expr.a), (expr.a, expr.b)):
            if isinstance(factor, Const) and factor.dtype.is_int:
                terms, constant = _linear(other)
                k = as_size(factor.value)
                return {t: c * k for t, c in terms.items() if c * k}, constant * k
    return {expr: 1}, 0


def _build(terms: dict[Expr, int], constant: int) -> Expr:
    """The sum of ``coefficient * term`` (in the terms' order) plus ``constant``."""
    result: Expr | None = None
    for term, coefficient in terms.items():
        if coefficient == 0:
            continue
        if result is None:
            result = term if coefficient == 1 else Binary("mul", term, _int(coefficient))
        elif coefficient < 0:
            magnitude = -coefficient
            result = Binary("sub", result,
                            term if magnitude == 1 else Binary("mul", term, _int(magnitude)))
        else:
            result = Binary("add", result,
                            term if coefficient == 1 else Binary("mul", term, _int(coefficient)))
    if result is None:
        return _int(constant)
    if constant > 0:
        return Binary("add", result, _int(constant))
    if constant < 0:
        return Binary("sub", result, _int(-constant))
    return result


def _int(value: int) -> Const:
    return Const(value, DType.INT64)


def _range_of(terms: dict[Expr, int], constant: int, ranges: Ranges) -> Interval | None:
    low = high = constant
    for term, coefficient in terms.items():
        bounds = interval(term, ranges)
        if bounds is None:
            return None
        a, b = bounds[0] * coefficient, bounds[1] * coefficient
        if is_traced(coefficient):
            a, b = min(a, b), max(a, b)
        elif coefficient < 0:  # the bounds are ordered: no comparison of run-time sizes
            a, b = b, a
        low, high = low + a, high + b
    return low, high


# --------------------------------------------------------------------------- rewrites
def _exact_division(node: Binary, ranges: Ranges) -> Expr | None:
    """``c * q + r`` divided by a positive constant ``c``: ``q + r // c`` and ``r % c``
    (exact for floor division, whatever ``r``); then ``r // c`` is 0 and ``r % c`` is ``r``
    when ``r`` lies in ``[0, c)``, and a non-negative ``r`` divides with C's truncating
    ``div``/``mod``, which code generation writes as plain ``/`` and ``%``."""
    divisor = _positive_constant(node.b)
    if divisor is None:
        return None
    terms, constant = _linear(node.a)
    if node.op in ("div", "mod"):  # truncation agrees with floor for a non-negative dividend
        whole = _range_of(terms, constant, ranges)
        if whole is None or whole[0] < 0:
            return None
    quotients = {t: exact_quotient(c, divisor) for t, c in terms.items()}
    quotient_terms = {t: q for t, q in quotients.items() if q is not None}
    rest_terms = {t: c for t, c in terms.items() if quotients[t] is None}
    quotient_constant, rest_constant = _split_multiple(constant, divisor)
    rest = _range_of(rest_terms, rest_constant, ranges)
    split = bool(quotient_terms) or quotient_constant != 0
    within = rest is not None and 0 <= rest[0] and rest[1] < divisor
    non_negative = rest is not None and rest[0] >= 0
    if not within and rest is not None:
        factored = _factor_division(node, rest_terms, rest_constant, ranges)
        if factored is not None:
            if node.op in ("floormod", "mod"):
                return factored
            terms = dict(quotient_terms)
            terms[factored] = terms.get(factored, 0) + 1
            return _build(terms, quotient_constant)
    if not (split or within or (non_negative and node.op in ("floordiv", "floormod"))):
        return None
    remainder = _build(rest_terms, rest_constant)
    if node.op in ("floordiv", "div"):
        if within:
            return _build(quotient_terms, quotient_constant)
        op = "div" if non_negative else "floordiv"
        divided = Binary(op, remainder, node.b)
        terms = dict(quotient_terms)
        terms[divided] = terms.get(divided, 0) + 1
        return _build(terms, quotient_constant)
    if within:
        return remainder
    return Binary("mod" if non_negative else "floormod", remainder, node.b)


def _factor_division(node: Binary, terms: dict[Expr, int], constant: int,
                     ranges: Ranges) -> Expr | None:
    """``(g * a + b) // (g * d)`` as ``a // d`` and ``(g * a + b) % (g * d)`` as
    ``(a % d) * g + b``, when ``b`` lies in ``[0, g)``: exact for floor division (and for C's
    truncating one on a non-negative dividend), since ``a`` is an integer and ``b / g < 1``.

    This is the division a Reshape that splits a fused axis writes: ``(i * 1536 + j) //
    196608`` with ``j`` in ``[0, 1536)`` is ``i // 128``.  ``g`` is tried among the common
    divisors of the divisor and each coefficient, largest first."""
    divisor = _positive_constant(node.b)
    for g, divisor_over_g in _common_factors(divisor, list(terms.values())):
        quotients = {t: exact_quotient(c, g) for t, c in terms.items()}
        big = {t: q for t, q in quotients.items() if q is not None}
        small = {t: c for t, c in terms.items() if quotients[t] is None}
        big_constant, small_constant = _split_multiple(constant, g)
        bounds = _range_of(small, small_constant, ranges)
        if not big or bounds is None or bounds[0] < 0 or bounds[1] >= g:
            continue
        reduced = Binary(node.op, _build(big, big_constant), _int(divisor_over_g))
        reduced = _exact_division(reduced, ranges) or reduced
        if node.op in ("floordiv", "div"):
            return reduced
        return _build({reduced: g, **small}, small_constant)
    return None


def _common_factors(divisor: int, coefficients: list[int]) -> list[tuple[int, int]]:
    """``(g, divisor / g)`` for the factors ``g`` of the divisor shared with a coefficient,
    largest first, without 1 and the divisor itself.  Plain numbers give their common
    divisors; a traced size divides only as an expression (``16*S`` of ``32*S``), so the
    sample never decides which rewrite a build of every size gets."""
    if not is_traced(divisor) and not any(is_traced(c) for c in coefficients):
        shared = {math.gcd(divisor, c) for c in coefficients}
        return [(g, divisor // g) for g in sorted(shared, reverse=True) if 1 < g < divisor]
    found: dict[object, tuple[int, int]] = {}
    for c in coefficients:
        # the coefficient itself (16*S of 32*S), or the constants both are multiples of
        for g in (c, -c, math.gcd(constant_factor(divisor), constant_factor(c))):
            quotient = exact_quotient(divisor, g)
            if quotient is not None and not _at_most_one(g) and not _at_most_one(quotient):
                found.setdefault(str(g), (g, quotient))
    return sorted(found.values(), key=lambda pair: plain(pair[0]), reverse=True)


def _at_most_one(value: int) -> bool:
    """A plain number at most 1 (a traced size is taken as larger: ruling it out would take a
    guard, and a factor of 1 only makes a rewrite that changes nothing)."""
    return not is_traced(value) and value <= 1


def _split_multiple(value: int, divisor: int) -> tuple[int, int]:
    """``(q, r)`` with ``value == q * divisor + r``: floor division for plain numbers; a
    traced value splits only when the divisor divides it as an expression, else it stays
    whole in ``r`` (``q = 0``), which is as exact and needs no guard."""
    quotient = exact_quotient(value, divisor)
    if quotient is not None:
        return quotient, 0
    if not is_traced(value) and not is_traced(divisor):
        return divmod(value, divisor)
    return 0, value


# remainder op -> its quotient op: (x // c) * c + x % c == x for floor division, and for C's
# truncating division too
_QUOTIENT_OF = {"floormod": "floordiv", "mod": "div"}


def _recombine(node: Binary) -> Expr | None:
    """``(x // c) * (c * k) + (x % c) * k`` (within a sum) as ``x * k``; the two ``x`` may be
    written differently (one already simplified), so they are compared as linear forms."""
    terms, constant = _linear(node)
    quotients = {}
    for term in terms:
        key = _division_key(term, ("floordiv", "div"))
        if key is not None:
            quotients.setdefault(key, term)
    changed = False
    for term in list(terms):
        key = _division_key(term, ("floormod", "mod"))
        if key is None or term not in terms:
            continue
        key = (_QUOTIENT_OF[key[0]],) + key[1:]
        if key not in quotients:
            continue
        quotient, k = quotients[key], terms[term]
        if quotient not in terms or terms[quotient] != k * key[1]:
            continue
        del terms[term], terms[quotient]
        inner_terms, inner_constant = _linear(term.a)
        for inner, coefficient in inner_terms.items():
            terms[inner] = terms.get(inner, 0) + coefficient * k
        constant += inner_constant * k
        changed = True
    if not changed:
        return None
    return _build({t: c for t, c in terms.items() if c}, constant)


def _division_key(term: Expr, ops: tuple[str, ...]) -> tuple | None:
    """(op, divisor, dividend as a linear form) of ``term`` if it is one of ``ops`` by a
    positive constant."""
    if not (isinstance(term, Binary) and term.op in ops):
        return None
    divisor = _positive_constant(term.b)
    if divisor is None:
        return None
    inner_terms, inner_constant = _linear(term.a)
    return term.op, divisor, frozenset(inner_terms.items()), inner_constant
