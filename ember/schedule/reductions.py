"""Lane-parallel reductions: a row's sum, max or min accumulated in a vector of partials.

Lowering reduces a row into a one-element local accumulator (softmax's max and sum, the mean
and variance of LayerNorm, ReduceMean over the last axis)::

    t[0] = -inf
    for i in [0, 128):
      t[0] = max(t[0], x[row + i])

Every iteration depends on the previous one, so the loop stays scalar: the C compiler may not
reassociate floating-point operations on its own.  :func:`vectorize_reductions` gives such a
loop ``L`` partial accumulators (two vectors' worth, so that consecutive vector operations do
not wait on each other) and combines them at the end, which is what a vectorized reduction
does -- TVM calls the transformation ``rfactor``::

    alloc p: f32[16] local
    for l in [0, 16): p[l] = -inf                      (the operation's identity)
    for o in [0, 8):
      vectorized for l in [0, 16): p[l] = max(p[l], x[row + o*16 + l])
    for l in [0, 16): t[0] = max(t[0], p[l])           (into the initial value, whatever it is)
    for i in [128, 128): ...                           (the tail, when 16 does not divide)

Only sums, maxima and minima of floating-point values qualify, whose reassociation changes a
sum by rounding only (as every vectorized or multithreaded sum does) and a maximum or minimum
not at all (NaN still propagates: ember's max and min return a NaN operand), and integer
sums, maxima and minima, exact in any order (sums wrap modulo 2**bits, which is associative):
the index passes of a TopK, the rank counts of a sort.  A reduction under a
condition (``t[0] = select(c, max(t[0], x), t[0])``, a term that only some iterations
contribute) qualifies too: the condition moves into the term, which becomes the operation's
identity where it is false.  Each load of the reduced value must walk memory contiguously (or
not move) along the loop, so that the partials load one vector at a time; a gather would cost
more than the scalar loop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ember.core.traced import as_size, is_traced, may_be_nonzero, size_class
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.loop.affine import split_affine
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, Binary, Const, Expr, Load, Select, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import Allocate, For, ForKind, PrimFunc, Seq, Stmt, Store

_IDENTITY = {"add": 0.0, "max": float("-inf"), "min": float("inf")}
# A row shorter than this many partial vectors is left scalar: the combining loop would cost
# as much as it saves.
MIN_VECTORS_PER_ROW = 2


PartialsChooser = Callable[[int, int, list[int]], int]


def vectorize_reductions(func: PrimFunc, target: Target,
                         choose: PartialsChooser | None = None) -> PrimFunc:
    """``func`` with every qualifying row reduction accumulated lane-parallel.

    ``choose(index, proposed, legal)`` decides how many partial accumulators the ``index``-th
    qualifying reduction gets (0: it stays scalar), given the heuristic's proposal (two
    vectors' worth when the row holds at least ``MIN_VECTORS_PER_ROW`` of them) and the legal
    counts; by default the proposal is taken."""
    names = {b.name for b in func.params if isinstance(b, Buffer)}
    names |= {n.buffer.name for n in walk(func.body) if isinstance(n, Allocate)}
    counter = [0]

    def visit(node):
        if isinstance(node, For):
            return _lane_parallel(node, target, names, choose, counter)
        return None

    body = rewrite(func.body, visit)
    return func if body is func.body else func.with_body(body)


def _lane_parallel(loop: For, target: Target, taken: set[str],
                   choose: PartialsChooser | None, counter: list[int]) -> Stmt | None:
    reduction = _row_reduction(loop)
    if reduction is None:
        return None
    accumulator, op, term = reduction
    vector = target.lanes_for(accumulator.dtype)
    start, extent = as_size(loop.start.value), as_size(loop.extent.value)
    if vector < 2:
        return None
    legal = [vector * count for count in (1, 2, 4)]
    proposed = 2 * vector if size_class(extent) >= MIN_VECTORS_PER_ROW * 2 * vector else 0
    index = counter[0]
    counter[0] += 1
    lanes = choose(index, proposed, legal) if choose is not None else proposed
    if not lanes:
        return None
    name = _fresh(f"{accumulator.name}_lanes", taken)
    partials = Buffer(name, accumulator.dtype, (lanes,), scope="local")
    base = loop.var.name
    lane, outer = Var(f"{base}_l", INDEX), Var(f"{base}_o", INDEX)
    combine_lane, tail = Var(f"{base}_c", INDEX), Var(f"{base}_t", INDEX)
    identity = _identity(op, accumulator.dtype)
    at = Binary("add", Binary("mul", outer, Const(lanes, INDEX)), lane)
    if start:
        at = Binary("add", at, Const(start, INDEX))
    update = Store(partials, lane,
                   Binary(op, Load(partials, lane), simplify(substitute(term, {loop.var: at}))))
    whole = extent // lanes
    steps: list[Stmt] = [
        For(lane, Const(0, INDEX), Const(lanes, INDEX), ForKind.SERIAL,
            Store(partials, lane, identity)),
        For(outer, Const(0, INDEX), Const(whole, INDEX), ForKind.SERIAL,
            For(lane, Const(0, INDEX), Const(lanes, INDEX), ForKind.VECTORIZED, update)),
        For(combine_lane, Const(0, INDEX), Const(lanes, INDEX), ForKind.SERIAL,
            Store(accumulator, Const(0, INDEX),
                  Binary(op, Load(accumulator, Const(0, INDEX)), Load(partials, combine_lane)))),
    ]
    if may_be_nonzero(extent % lanes):
        steps.append(For(tail, Const(start + whole * lanes, INDEX),
                         Const(extent % lanes, INDEX), ForKind.SERIAL,
                         replace(loop.body, value=Binary(
                             op, Load(accumulator, Const(0, INDEX)),
                             simplify(substitute(term, {loop.var: tail}))))))
    return Allocate(partials, Seq(tuple(steps)))


def _row_reduction(loop: For) -> tuple[Buffer, str, Expr] | None:
    """(accumulator, op, reduced term) of ``for i: acc[0] = op(acc[0], term(i))`` with a
    one-element local float accumulator, constant bounds and contiguous loads; else None."""
    if loop.kind is not ForKind.SERIAL or not isinstance(loop.start, Const) or \
            not isinstance(loop.extent, Const):
        return None
    store = loop.body
    if not isinstance(store, Store) or store.mask is not None or store.value.lanes != 1:
        return None
    accumulator = store.buffer
    if accumulator.scope != "local" or accumulator.shape != (1,) or \
            not _is_zero(store.index):
        return None
    value, condition = store.value, None
    if isinstance(value, Select) and _is_accumulator(value.false_value, accumulator):
        value, condition = value.true_value, value.cond  # contributes where the condition holds
    if not isinstance(value, Binary) or value.op not in _IDENTITY:
        return None
    dtype = accumulator.dtype
    # (integer reductions over a traced extent stay scalar: in a masked attention model one
    # got a tail loop that partition_guarded_loops split on the extent's remainder, a guard
    # on `length % 16` that pinned the traced build to one size)
    if not (dtype in (DType.FLOAT32, DType.FLOAT64) or
            (dtype.is_int and dtype != DType.BOOL and not is_traced(loop.extent.value))):
        return None
    if _is_accumulator(value.a, accumulator):
        term = value.b
    elif _is_accumulator(value.b, accumulator):
        term = value.a
    else:
        return None
    if condition is not None:
        term = Select(condition, term, _identity(value.op, dtype))
    for node in walk(term):
        if isinstance(node, Load):
            if node.buffer == accumulator or node.index.lanes != 1 or node.mask is not None:
                return None
            if split_affine(node.index, loop.var)[0] not in (0, 1):
                return None
    return accumulator, value.op, term


def _identity(op: str, dtype: DType) -> Const:
    """The value that leaves the accumulator of ``op`` unchanged, in ``dtype``."""
    if dtype.is_float:
        return Const(_IDENTITY[op], dtype)
    if op == "add":
        return Const(0, dtype)
    info = np.iinfo(dtype.numpy)
    return Const(int(info.min if op == "max" else info.max), dtype)


def _is_accumulator(expr: Expr, accumulator: Buffer) -> bool:
    return isinstance(expr, Load) and expr.buffer == accumulator and _is_zero(expr.index)


def _is_zero(expr: Expr) -> bool:
    return isinstance(expr, Const) and expr.lanes == 1 and expr.value == 0


def _fresh(name: str, taken: set[str]) -> str:
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}{count}"
    taken.add(candidate)
    return candidate
