"""Loop partitioning: split a loop where its border guards stop mattering.

A padded convolution or pool tests every tap against the input's borders, and clamps the index
it loads from, so that it never reads outside the input::

    for oh in [0, 56):
      for kh in [0, 3):
        vectorized for ow in [0, 56):
          out[..] = select(0 <= oh - 1 + kh < 56 && ..., out[..] + x[min(max(oh - 1 + kh, 0), 55)..] * w, out[..])

Only the first and last rows and columns need those tests.  :func:`partition_guarded_loops`
splits such a loop in three -- before, inside and after the range where every comparison and
clamp of the body that involves the loop's variable is decided, over the whole range of the
other variables -- and in the middle copy replaces the decided comparisons by constants and
the clamps by their operand.  The middle loop is then a plain affine loop nest that vectorizes;
the two border loops keep the guarded body.  TVM's ``LoopPartition`` does the same.

A concatenation tests instead which piece each element belongs to, a balanced tree of
``select(i < start_k, ..)`` on the position along its axis, each piece's load masked to its
range; every element then evaluated every piece's load.  When no single middle range decides
a loop's tests, the loop is split instead at every value where one of its comparisons flips
whatever the other variables are (up to ``MAX_PIECES`` parts): each part decides those
comparisons and keeps only its piece's load, and its inner loops are partitioned again, now
that this loop's range is known (a Concat of Concats), until every part is a plain copy.

Only serial and vectorized loops with constant bounds are split (a parallel loop would fork
three times).  Every rewrite is exact: a comparison is replaced only when interval arithmetic
proves its value over the whole middle range.
"""

from __future__ import annotations

from dataclasses import replace

from ember.core.traced import as_size, may_be_nonzero
from ember.core.dtypes import DType
from ember.ir.loop.affine import split_affine
from ember.ir.loop.expr import INDEX, Binary, Const, Expr, Load, Select, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.index_simplify import interval
from ember.ir.loop.stmt import For, ForKind, PrimFunc, Seq, Stmt
from ember.schedule.primitives import expr_uses

Interval = tuple[int, int]  # inclusive

# A loop is split only when its middle part keeps at least this many iterations.
MIN_MIDDLE = 4
# A loop is split at its tests' breakpoints (a concatenation's pieces) into at most this many
# parts, holding at most this many loops in all.
MAX_PIECES = 64
MAX_PIECE_LOOPS = 256
# ... and, with the parts' inner loops split in turn, at most this many loops in all.
MAX_SPLIT_LOOPS = 1024
# ... and when its body holds at most this many loops: every split triples the body, so a
# kernel guarded along many axes (a Pad of every axis of a 5-D tensor) would grow as 3^axes.
MAX_BODY_LOOPS = 32


def partition_guarded_loops(func: PrimFunc) -> PrimFunc:
    """``func`` with each guarded loop split around the range where its guards are decided."""
    ranges = _loop_ranges(func.body)
    body = _partition(func.body, ranges, set())
    return func if body is func.body else func.with_body(body)


def _partition(stmt: Stmt, ranges: dict[Var, Interval], taken: set[str]) -> Stmt:
    def visit(node):
        if isinstance(node, For):
            return _split(node, ranges, taken)
        return None

    return rewrite(stmt, visit)


def _split(loop: For, ranges: dict[Var, Interval], taken: set[str]) -> Stmt | None:
    if loop.kind not in (ForKind.SERIAL, ForKind.VECTORIZED) or \
            not isinstance(loop.start, Const) or not isinstance(loop.extent, Const):
        return None
    start, end = as_size(loop.start.value), as_size(loop.start.value) + as_size(loop.extent.value)
    guards = [g for g in _guards(loop.body) if expr_uses(g, loop.var)]
    if not guards or sum(isinstance(n, For) for n in walk(loop.body)) > MAX_BODY_LOOPS:
        return None
    low, high = start, end - 1
    for guard in guards:
        decided = _decided_range(guard, loop.var, ranges)
        if decided is None:
            return None
        low, high = max(low, decided[0]), min(high, decided[1])
    if high - low + 1 < MIN_MIDDLE:
        return _split_in_pieces(loop, guards, ranges, taken)
    inner = dict(ranges)
    inner[loop.var] = (low, high)
    middle_body = _fold(loop.body, inner)
    if middle_body is loop.body:
        return None
    parts: list[Stmt] = []
    if low > start:
        parts.append(_copy(loop, start, low, "lo", taken, ranges))
    parts.append(replace(loop, start=Const(low, INDEX), extent=Const(high + 1 - low, INDEX),
                         body=middle_body))
    if high + 1 < end:
        parts.append(_copy(loop, high + 1, end, "hi", taken, ranges))
    return Seq(tuple(parts)) if len(parts) > 1 else parts[0]


def _split_in_pieces(loop: For, guards: list[Binary], ranges: dict[Var, Interval],
                     taken: set[str]) -> Stmt | None:
    """``loop`` split at the values where those of its comparisons flip that flip at one
    value whatever the other variables are (a concatenation's piece tests), each part's body
    folded and partitioned again (an inner loop's tests may be decided once this loop's part
    is known: a Concat of Concats); None when no comparison flips so."""
    start, end = as_size(loop.start.value), as_size(loop.start.value) + as_size(loop.extent.value)
    cuts = set()
    for guard in guards:
        if guard.op not in ("lt", "le", "gt", "ge"):
            continue
        cut = _flip_point(guard, loop.var, ranges)
        if cut is not None and start < cut < end:
            cuts.add(cut)
    bounds = [start, *sorted(cuts), end]
    body_loops = 1 + sum(isinstance(n, For) for n in walk(loop.body))
    if len(bounds) < 3 or len(bounds) - 1 > MAX_PIECES or \
            (len(bounds) - 1) * body_loops > MAX_PIECE_LOOPS:
        return None
    parts: list[Stmt] = []
    for lo, hi in zip(bounds, bounds[1:]):
        piece = _copy(loop, lo, hi, "p", taken, ranges)
        inner = {**ranges, piece.var: (lo, hi - 1)}
        body = _partition(_fold(piece.body, inner), inner, taken)
        parts.append(replace(piece, body=body))
    if sum(isinstance(n, For) for part in parts for n in walk(part)) > MAX_SPLIT_LOOPS:
        return None
    return Seq(tuple(parts))


def _flip_point(guard: Binary, var: Var, ranges: dict[Var, Interval]) -> int | None:
    """The value of ``var`` from which ``guard`` (a comparison) has its other value whatever
    the other variables are -- it is decided on both sides of it, with no value in between
    where it depends on them -- else None."""
    negated = Binary(_NEGATION[guard.op], guard.a, guard.b)
    true, false = _decided_range(guard, var, ranges), _decided_range(negated, var, ranges)
    if true is None or false is None:
        return None
    if true[1] + 1 == false[0]:   # true below, false from false[0] on
        return false[0]
    if false[1] + 1 == true[0]:   # false below, true from true[0] on
        return true[0]
    return None


_NEGATION = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


def _copy(loop: For, start: int, end: int, suffix: str, taken: set[str],
          ranges: dict[Var, Interval]) -> For:
    """The loop over ``[start, end)`` with a variable of its own (a border part), whose range
    joins ``ranges``."""
    name, count = f"{loop.var.name}_{suffix}", 1
    while name in taken:
        count += 1
        name = f"{loop.var.name}_{suffix}{count}"
    taken.add(name)
    var = Var(name, loop.var.dtype)
    ranges[var] = (start, end - 1)
    return replace(loop, var=var, start=Const(start, INDEX), extent=Const(end - start, INDEX),
                   body=substitute(loop.body, {loop.var: var}))


# --------------------------------------------------------------------------- guards
def _guards(stmt: Stmt) -> list[Binary]:
    """The index comparisons and clamps by a constant in ``stmt``."""
    found = []
    for node in walk(stmt):
        if not isinstance(node, Binary):
            continue
        if node.op in ("lt", "le", "gt", "ge") and _is_index(node.a) and _is_index(node.b):
            found.append(node)
        elif node.op in ("min", "max") and _is_index(node) and isinstance(node.b, Const):
            found.append(node)
    return found


def _decided_range(guard: Binary, var: Var, ranges: dict[Var, Interval]) -> Interval | None:
    """The values of ``var`` for which ``guard`` is decided (a comparison always true, or a
    clamp that never clamps), whatever the other variables are; None if it cannot be said."""
    if guard.op in ("min", "max"):
        # min(e, c) is e where e <= c; max(e, c) is e where e >= c.  A clamp inside (the
        # max of min(max(e, 0), 55)) is looked through: this only proposes the range, which
        # _fold then proves rewrite by rewrite.
        operand = guard.a
        while isinstance(operand, Binary) and operand.op in ("min", "max") and \
                isinstance(operand.b, Const):
            operand = operand.a
        difference = Binary("sub", operand, guard.b)
        op = "le" if guard.op == "min" else "ge"
    else:
        difference, op = Binary("sub", guard.a, guard.b), guard.op
    coefficient, rest = split_affine(difference, var)
    if coefficient is None or coefficient == 0:
        return None
    others = interval(rest, {v: r for v, r in ranges.items() if v != var})
    if others is None:
        return None
    unbounded = (-(1 << 62), 1 << 62)
    # difference = coefficient * var + rest with rest in [others]; solve per op for "true
    # for every rest"
    if op in ("lt", "le"):
        limit = -1 if op == "lt" else 0   # coefficient*var + others_max <= limit
        bound = limit - others[1]
        return (unbounded[0], bound // coefficient) if coefficient > 0 else \
            (_ceil_div(bound, coefficient), unbounded[1])
    limit = 1 if op == "gt" else 0        # coefficient*var + others_min >= limit
    bound = limit - others[0]
    return (_ceil_div(bound, coefficient), unbounded[1]) if coefficient > 0 else \
        (unbounded[0], bound // coefficient)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


# --------------------------------------------------------------------------- folding
def _fold(stmt: Stmt, ranges: dict[Var, Interval]) -> Stmt:
    """``stmt`` with the comparisons and clamps that ``ranges`` decide folded away."""
    def visit(node):
        if isinstance(node, Binary) and node.op in ("lt", "le", "gt", "ge") and \
                _is_index(node.a) and _is_index(node.b):
            a, b = interval(node.a, ranges), interval(node.b, ranges)
            if a is None or b is None:
                return None
            value = _compare(node.op, a, b)
            return None if value is None else Const(value, DType.BOOL)
        if isinstance(node, Binary) and node.op in ("min", "max") and _is_index(node):
            a, b = interval(node.a, ranges), interval(node.b, ranges)
            if a is None or b is None:
                return None
            if node.op == "min":
                return node.a if a[1] <= b[0] else node.b if b[1] <= a[0] else None
            return node.a if a[0] >= b[1] else node.b if b[0] >= a[1] else None
        if isinstance(node, Binary) and node.op in ("and", "or"):
            return _fold_logic(node)
        if isinstance(node, Select) and isinstance(node.cond, Const) and node.cond.lanes == 1:
            return node.true_value if node.cond.value else node.false_value
        if isinstance(node, Load) and isinstance(node.mask, Const) and node.mask.value:
            return replace(node, mask=None)
        return None

    return rewrite(stmt, visit)


def _compare(op: str, a: Interval, b: Interval) -> bool | None:
    if op == "lt":
        return True if a[1] < b[0] else False if a[0] >= b[1] else None
    if op == "le":
        return True if a[1] <= b[0] else False if a[0] > b[1] else None
    if op == "gt":
        return True if a[0] > b[1] else False if a[1] <= b[0] else None
    return True if a[0] >= b[1] else False if a[1] < b[0] else None  # ge


def _fold_logic(node: Binary) -> Expr | None:
    for known, other in ((node.a, node.b), (node.b, node.a)):
        if isinstance(known, Const) and known.lanes == 1 and other.lanes == 1:
            if node.op == "and":
                return other if known.value else Const(False, DType.BOOL)
            return Const(True, DType.BOOL) if known.value else other
    return None


# --------------------------------------------------------------------------- helpers
def _loop_ranges(stmt: Stmt) -> dict[Var, Interval]:
    """The range of every loop variable with constant bounds in ``stmt`` (the hull of its
    loops' ranges, should one variable run several loops)."""
    ranges: dict[Var, Interval] = {}
    for node in walk(stmt):
        if isinstance(node, For) and isinstance(node.start, Const) and \
                isinstance(node.extent, Const) and may_be_nonzero(node.extent.value) and \
                node.extent.value >= 0:   # (a traced extent: the range when the body runs)
            start = as_size(node.start.value)
            low, high = start, start + as_size(node.extent.value) - 1
            if node.var in ranges:
                low, high = min(low, ranges[node.var][0]), max(high, ranges[node.var][1])
            ranges[node.var] = (low, high)
    return ranges


def _is_index(expr: Expr) -> bool:
    return expr.dtype is DType.INT64 and expr.lanes == 1
