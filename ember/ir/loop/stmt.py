"""Statements and functions of the loop-level IR.

A :class:`PrimFunc` is one kernel: buffer (and scalar) parameters and a statement body.  Loops
carry a :class:`ForKind` that schedules set (``parallel`` over threads, ``vectorized`` into SIMD
lanes, ``unrolled``) and codegen honours.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Expr, Var


class ForKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"


class Stmt:
    """Base of all statements."""

    def __str__(self) -> str:
        from ember.ir.loop.printer import format_stmt

        return format_stmt(self)


@dataclass(frozen=True)
class For(Stmt):
    """``for var in [start, start + extent)``; ``annotations`` are (key, value) pairs."""

    var: Var
    start: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    annotations: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[index] = value``; vector index and value store lanes; ``mask`` disables lanes."""

    buffer: Buffer
    index: Expr
    value: Expr
    mask: Expr | None = None


@dataclass(frozen=True)
class LetStmt(Stmt):
    """Bind ``var = value`` for the statements of ``body``."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True)
class IfThenElse(Stmt):
    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True)
class Allocate(Stmt):
    """A ``local`` buffer that exists for the duration of ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class Evaluate(Stmt):
    """Evaluate an expression for its effect (an intrinsic call such as a prefetch)."""

    value: Expr


Param = Union[Buffer, Var]


@dataclass(frozen=True)
class PrimFunc:
    """One kernel.  ``attrs`` are (key, value) pairs (e.g. the op it came from)."""

    name: str
    params: tuple[Param, ...]
    body: Stmt
    attrs: tuple[tuple[str, object], ...] = field(default=())

    def attr(self, key: str, default: object = None) -> object:
        return dict(self.attrs).get(key, default)

    def with_body(self, body: Stmt) -> "PrimFunc":
        return PrimFunc(self.name, self.params, body, self.attrs)

    def __str__(self) -> str:
        from ember.ir.loop.printer import format_func

        return format_func(self)


def seq(*stmts: Stmt) -> Stmt:
    """A sequence, flattening nested ones; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
