"""Generic traversal and rewriting of loop-IR trees.

:func:`rewrite` rebuilds a tree bottom-up, calling ``fn`` on every Expr and Stmt after its
children were rewritten; ``fn`` returns a replacement or None to keep the node.  Because the IR
is immutable, unchanged subtrees are shared, not copied.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterator, TypeVar

from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Expr
from ember.ir.loop.stmt import PrimFunc, Stmt

Node = TypeVar("Node", Expr, Stmt)
RewriteFn = Callable[[object], object | None]


def _children_fields(node: object) -> tuple[str, ...]:
    return _fields_of_type(type(node))


@functools.cache
def _fields_of_type(node_type: type) -> tuple[str, ...]:
    """The fields that may hold children (cached per type: traversals are the hot loop of
    lowering and scheduling, and ``dataclasses.fields`` is slow)."""
    if not dataclasses.is_dataclass(node_type):
        return ()
    return tuple(f.name for f in dataclasses.fields(node_type) if f.name != "buffer")


def rewrite(node, fn: RewriteFn):
    """Post-order rewrite of an Expr/Stmt tree (buffers are not visited)."""
    return _rewrite(node, fn, (Expr, Stmt))


def rewrite_stmts(node, fn: RewriteFn):
    """:func:`rewrite` over statements only: expressions are kept as they are, unvisited (a
    structural change -- replacing a loop -- costs the statement count, not the expression
    size)."""
    return _rewrite(node, fn, (Stmt,))


def _rewrite(node, fn: RewriteFn, kinds: tuple[type, ...]):
    if isinstance(node, tuple):
        items = tuple(_rewrite(x, fn, kinds) for x in node)
        return items if any(a is not b for a, b in zip(items, node)) else node
    if not isinstance(node, kinds):
        return node
    changes = {}
    for name in _children_fields(node):
        value = getattr(node, name)
        if isinstance(value, (*kinds, tuple)):
            new = _rewrite(value, fn, kinds)
            if new is not value:
                changes[name] = new
    rebuilt = dataclasses.replace(node, **changes) if changes else node
    replaced = fn(rebuilt)
    return rebuilt if replaced is None else replaced


def walk(node) -> Iterator[object]:
    """Every Expr and Stmt in the tree, pre-order (iterative: no recursion, and no chain of
    nested generators whose cost grows with the depth of the tree)."""
    return _walk(node, (Expr, Stmt))


def walk_stmts(node) -> Iterator[Stmt]:
    """Every Stmt in the tree, pre-order, without entering expressions (loop and statement
    queries need not visit every arithmetic node of every body)."""
    return _walk(node, (Stmt,))


def _walk(node, kinds: tuple[type, ...]) -> Iterator[object]:
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, tuple):
            pending.extend(reversed(current))
            continue
        if not isinstance(current, kinds):
            continue
        yield current
        for name in reversed(_children_fields(current)):
            value = getattr(current, name)
            if isinstance(value, (*kinds, tuple)):
                pending.append(value)


def children(node) -> list[object]:
    """The Exprs and Stmts directly under ``node`` (tuples of them flattened), in order."""
    found: list[object] = []
    for name in _children_fields(node):
        value = getattr(node, name)
        if isinstance(value, (Expr, Stmt)):
            found.append(value)
        elif isinstance(value, tuple):
            _flatten_into(value, found)
    return found


def _flatten_into(items: tuple, found: list[object]) -> None:
    for item in items:
        if isinstance(item, (Expr, Stmt)):
            found.append(item)
        elif isinstance(item, tuple):
            _flatten_into(item, found)


def buffers_used(func_or_stmt) -> set[Buffer]:
    """Buffers that a function body loads from or stores to."""
    body = func_or_stmt.body if isinstance(func_or_stmt, PrimFunc) else func_or_stmt
    return {n.buffer for n in walk(body) if hasattr(n, "buffer") and isinstance(
        getattr(n, "buffer"), Buffer)}


def substitute(node, mapping: dict) -> object:
    """Replace Vars (keys) by expressions (values) throughout ``node``."""
    from ember.ir.loop.expr import Var

    return rewrite(node, lambda n: mapping.get(n) if isinstance(n, Var) else None)
