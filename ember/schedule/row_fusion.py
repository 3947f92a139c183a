"""Row fusion: consecutive loop nests over the same rows become one loop over those rows.

A softmax, a LayerNorm or a GroupNorm lowers to one nest per stage, each over the whole
tensor: the row maxima, then the sums of exponentials, then the normalized output::

    for r in [0, 12288): max[r] = max over j of x[r*128 + j]
    for r in [0, 12288): sum[r] = sum over j of exp(x[r*128 + j] - max[r])
    for r in [0, 12288): for j in [0, 128): y[r*128 + j] = exp(x[..] - max[r]) / sum[r]

Each pass streams the tensor through memory again.  Fused, every row is read three times
while it is in L1::

    for r in [0, 12288):
      max[r] = ...; sum[r] = ...; for j: y[r*128 + j] = ...

A nest's *rows* are its leading loops that every access walks as one (the loops
``coalesce`` would merge); nests are grouped when they follow each other and have the same
number of rows.  The fusion is legal when every buffer that one nest of the group writes and
another one accesses is touched *row by row*: each access moves by one stride S per row and
the rest of its index stays within ``[0, S)``, the same S everywhere -- then row ``r`` of a
later nest reads only what row ``r`` of the earlier ones wrote, and fused, it still runs
after them.  Accumulation nests (the GEMM-like init/update/epilogue passes, which register
tiling folds together) are left alone.

The decision is the knob ``rows<g>.fuse`` of the ``g``-th group (see ember.schedule.config).
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.core.traced import is_traced
from ember.ir.loop.affine import affine_coefficients
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Const, Load, Var
from ember.ir.loop.functor import walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import Allocate, For, Gemm, Seq, Stmt, Store
from ember.schedule.config import Decisions
from ember.schedule.primitives import Schedule, perfect_chain


@dataclass
class _Nest:
    loop: For
    prefix: list[For]   # the leading loops walked as one (the rows)
    rows: int


def fuse_row_nests(schedule: Schedule, decisions: Decisions) -> None:
    """Fuse the groups of consecutive nests over the same rows where that is legal and the
    config (by default: always) says so."""
    body = schedule.func.body
    if not isinstance(body, Seq):
        return
    groups: list[list[_Nest]] = []
    current: list[_Nest] = []
    for stmt in body.stmts:
        nest = _as_nest(stmt)
        if nest is not None and current and nest.rows == current[0].rows:
            current.append(nest)
            continue
        if len(current) > 1:
            groups.append(current)
        current = [nest] if nest is not None else []
    if len(current) > 1:
        groups.append(current)
    for index, group in enumerate(g for g in groups if _row_local(g)):
        if decisions.choose(f"rows{index}.fuse", True, [False, True],
                            f"run the {len(group)} nests over the same {group[0].rows} rows "
                            f"as one loop over those rows"):
            names = []
            for nest in group:
                name = nest.prefix[0].var.name
                for following in nest.prefix[1:]:
                    name = schedule.fuse(name, following.var.name)
                names.append(name)
            schedule.fuse_nests(*names)


def _as_nest(stmt: Stmt) -> _Nest | None:
    """A top-level nest and its rows (None: not a candidate)."""
    if not isinstance(stmt, For) or "accumulation" in dict(stmt.annotations):
        return None
    if any(isinstance(n, Gemm) for n in walk(stmt)):
        return None
    chain = perfect_chain(stmt)
    accesses = [n.index for n in walk(stmt) if isinstance(n, (Load, Store))]
    coefficients = [affine_coefficients(simplify(index)) for index in accesses]
    if any(c is None for c in coefficients):
        return None
    prefix: list[For] = []
    steps: list[int] | None = None
    rows = 1
    for loop in chain:
        extent = _const_extent(loop)
        if extent is None or not _starts_at_zero(loop):
            break
        if extent > 1:
            moves = [c.get(loop.var, 0) for c in coefficients]
            if steps is not None and steps != [m * extent for m in moves]:
                break
            steps = moves
        prefix.append(loop)
        rows *= extent
        if loop is chain[-1]:
            break
    if not prefix or rows < 2 or len(prefix) == len(chain) and \
            isinstance(chain[-1].body, Store):
        return None  # no rows, or an elementwise nest walked whole (nothing per row)
    return _Nest(stmt, prefix, rows)


def _row_local(group: list[_Nest]) -> bool:
    """Whether every buffer written by one nest of ``group`` and accessed by another is
    touched row by row with one stride (see the module docstring)."""
    written: dict[Buffer, set[int]] = {}
    accessed: dict[Buffer, set[int]] = {}
    private = {n.buffer for nest in group for n in walk(nest.loop) if isinstance(n, Allocate)}
    for position, nest in enumerate(group):
        for node in walk(nest.loop):
            if isinstance(node, (Load, Store)) and node.buffer not in private:
                accessed.setdefault(node.buffer, set()).add(position)
                if isinstance(node, Store):
                    written.setdefault(node.buffer, set()).add(position)
    shared = {b for b, nests in written.items() if len(accessed[b]) > 1}
    for buffer in shared:
        strides: set[int] = set()
        for nest in group:
            ranges = _loop_ranges(nest.loop)
            row_vars = {loop.var for loop in nest.prefix}
            innermost_row = next((l for l in reversed(nest.prefix) if _const_extent(l) != 1),
                                 nest.prefix[-1])
            for node in walk(nest.loop):
                if not isinstance(node, (Load, Store)) or node.buffer != buffer:
                    continue
                c = affine_coefficients(simplify(node.index))
                if c is None or ranges is None:
                    return False
                stride = c.get(innermost_row.var, 0)
                low = high = c.get(None, 0)
                for var, coefficient in c.items():
                    if var is None or var in row_vars:
                        continue
                    if var not in ranges:
                        return False
                    first, last = ranges[var]
                    low += min(coefficient * first, coefficient * last)
                    high += max(coefficient * first, coefficient * last)
                if stride <= 0 or low < 0 or high >= stride:
                    return False
                strides.add(stride)
        if len(strides) != 1:
            return False
    return True


def _loop_ranges(nest: For) -> dict[Var, tuple[int, int]] | None:
    """The first and last value of every loop variable in ``nest`` (None: one is unknown)."""
    ranges: dict[Var, tuple[int, int]] = {}
    for node in walk(nest):
        if isinstance(node, For):
            extent = _const_extent(node)
            if extent is None or not isinstance(node.start, Const) or extent < 1:
                return None
            start = int(node.start.value)
            ranges[node.var] = (start, start + extent - 1)
    return ranges


def _const_extent(loop: For) -> int | None:
    value = loop.extent.value if isinstance(loop.extent, Const) else None
    if value is None or is_traced(value):
        return None
    return int(value)


def _starts_at_zero(loop: For) -> bool:
    return isinstance(loop.start, Const) and loop.start.value == 0
