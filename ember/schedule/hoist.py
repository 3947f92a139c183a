"""Hoist loop invariants out of loops: integer divisions, and loads of vectorized loops.

Fusing loops for parallelism (``n`` and ``c`` into one parallel loop, say) writes the original
indices back as ``fused // 64`` and ``fused % 64``.  In C those are calls to the helpers that
give division defined results (``em_floordiv_i64``: branches for a zero or -1 divisor), and
where they sit inside an inner loop GCC's data-reference analysis gives up on every access
they address: the loop stays scalar.  ResNet's stem max pool ran at 0.4 GFLOP/s for that
reason alone.  This pass binds each such division, at the outermost loop it does not depend
on, to a variable computed once before that loop (a ``LetStmt``), leaving inner loops affine
in their own variables.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ember.core.traced import as_size
from ember.ir.loop.expr import Binary, Const, Expr, Load, Select, Var
from ember.ir.loop.functor import children, rewrite, walk
from ember.ir.loop.stmt import For, ForKind, Gemm, LetStmt, PrimFunc, Stmt, Store

_DIVISIONS = frozenset({"floordiv", "floormod", "div", "mod"})


def hoist_invariant_divisions(func: PrimFunc) -> PrimFunc:
    """``func`` with integer divisions computed before the loops they do not depend on."""
    taken = {n.name for n in walk(func.body) if isinstance(n, Var)}
    names = (f"inv{i}" for i in itertools.count() if f"inv{i}" not in taken)
    body = _hoist(func.body, names)
    return func if body is func.body else func.with_body(body)


def _hoist(stmt: Stmt, names) -> Stmt:
    def visit(node):
        if isinstance(node, For):
            return _hoist_from_loop(node, names)
        return None

    # children first (rewrite is post-order): inner loops bind what depends on outer ones
    return rewrite(stmt, visit)


def _hoist_from_loop(loop: For, names) -> Stmt:
    inner = _bound_inside(loop)
    found: dict[Expr, Var] = {}

    def candidate(node) -> bool:
        return isinstance(node, Binary) and node.op in _DIVISIONS and node.dtype.is_int and \
            node.lanes == 1 and _index_arithmetic(node) and not (_vars(node) & inner)

    def replace_division(node):
        if candidate(node):
            if node not in found:
                found[node] = Var(next(names), node.dtype)
            return found[node]
        return None

    body = rewrite(loop.body, replace_division)
    if not found:
        return loop
    hoisted: Stmt = replace(loop, body=body)
    for expr, var in reversed(list(found.items())):
        hoisted = LetStmt(var, expr, hoisted)
    return hoisted


def _bound_inside(loop: For) -> set[Var]:
    """The loop's variable and every variable bound within its body."""
    bound = {loop.var}
    for node in walk(loop.body):
        if isinstance(node, For):
            bound.add(node.var)
        elif isinstance(node, LetStmt):
            bound.add(node.var)
        elif isinstance(node, Gemm):
            bound.update(node.bound_vars)
    return bound


def _index_arithmetic(expr: Expr) -> bool:
    """Whether ``expr`` computes on variables and constants only.  A division that reads
    memory stays where it is: the loop may write what it reads (a reduction's accumulator
    divided by a scalar, say), and a load moved before a loop that runs zero times could read
    out of bounds."""
    return not any(isinstance(n, Load) for n in walk(expr))


def _vars(expr: Expr) -> set[Var]:
    return {n for n in walk(expr) if isinstance(n, Var)}



# ---------------------------------------------------------------------- loads


def hoist_invariant_loads(func: PrimFunc) -> PrimFunc:
    """``func`` with the loads of a vectorized loop that do not depend on it -- a row's
    statistic in a fused softmax or LayerNorm, ``x[r] / sum[r]`` -- read once before it.

    The C compiler does not move them itself when the loop stores through another pointer
    (it cannot rule out that the store changes them), and then keeps the loop scalar.  A load
    moves only when it would have run anyway: the loop has a constant extent of at least
    one, the load is not under a condition (a Select arm, an if, a mask), and nothing in the
    loop stores to its buffer."""
    taken = {n.name for n in walk(func.body) if isinstance(n, Var)}
    names = (f"ld{i}" for i in itertools.count() if f"ld{i}" not in taken)

    def visit(node):
        if isinstance(node, For) and node.kind is ForKind.VECTORIZED:
            return _hoist_loads(node, names)
        return None

    body = rewrite(func.body, visit)
    return func if body is func.body else func.with_body(body)


def _hoist_loads(loop: For, names) -> Stmt:
    if not (isinstance(loop.extent, Const) and as_size(loop.extent.value) >= 1) or \
            not isinstance(loop.body, Store):
        return loop
    inner = _bound_inside(loop)
    stored = {n.buffer for n in walk(loop.body) if isinstance(n, Store)}
    found: dict[Expr, Var] = {}
    for load in _unconditional_loads(loop.body.value):
        if load.mask is None and load.lanes == 1 and load.buffer not in stored and \
                load.buffer.scope != "local" and not (_vars(load.index) & inner) and \
                not any(isinstance(n, Load) for n in walk(load.index)):
            found.setdefault(load, Var(next(names), load.dtype))
    if not found:
        return loop
    body = rewrite(loop.body, lambda n: found.get(n) if isinstance(n, Load) else None)
    hoisted: Stmt = replace(loop, body=body)
    for load, var in reversed(list(found.items())):
        hoisted = LetStmt(var, load, hoisted)
    return hoisted


def _unconditional_loads(expr: Expr) -> list[Load]:
    """The loads ``expr`` evaluates on every path (not inside a Select's arms)."""
    loads: list[Load] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Load):
            loads.append(node)
            continue
        if isinstance(node, Select):
            stack.append(node.cond)
            continue
        stack.extend(c for c in children(node) if isinstance(c, Expr))
    return loads
