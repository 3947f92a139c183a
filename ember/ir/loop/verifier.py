"""Checks the invariants of loop-IR functions.

* every Var is a parameter, a loop variable or a let binding in scope;
* every buffer is a parameter or allocated by an enclosing Allocate;
* indices are integer-typed, with as many lanes as the value loaded/stored;
* operands of a binary op agree in dtype and lanes (broadcast explicitly with Broadcast);
* a Store's value has the buffer's dtype; a For's extent is an integer.
"""

from __future__ import annotations

import math

from ember.core.traced import may_be_nonzero
from ember.core.dtypes import DType
from ember.core.errors import VerificationError
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr, Load, Ramp,
                                Select, Unary, Var)
from ember.ir.loop.stmt import (Allocate, Evaluate, For, Gemm, IfThenElse, LetStmt, PrimFunc,
                                Seq, Stmt, Store)


def verify_func(func: PrimFunc) -> None:
    vars_in_scope = {p for p in func.params if isinstance(p, Var)}
    buffers = {p for p in func.params if isinstance(p, Buffer)}
    _Checker(func.name).stmt(func.body, vars_in_scope, buffers)


class _Checker:
    def __init__(self, func_name: str):
        self.func_name = func_name

    def fail(self, message: str) -> VerificationError:
        return VerificationError(f"loop IR of '{self.func_name}': {message}")

    def stmt(self, s: Stmt, scope: set, buffers: set) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x, scope, buffers)
        elif isinstance(s, For):
            if s.var in scope:
                raise self.fail(f"loop variable '{s.var.name}' shadows a variable in scope")
            for e in (s.start, s.extent):
                self.expr(e, scope, buffers)
                if not e.dtype.is_int or e.lanes != 1:
                    raise self.fail(f"loop '{s.var.name}' bounds must be scalar integers")
            self.stmt(s.body, scope | {s.var}, buffers)
        elif isinstance(s, Store):
            self._buffer(s.buffer, buffers)
            self.expr(s.index, scope, buffers)
            self.expr(s.value, scope, buffers)
            if not s.index.dtype.is_int:
                raise self.fail(f"store to '{s.buffer.name}' has a non-integer index")
            if s.value.dtype != s.buffer.dtype:
                raise self.fail(f"store of {s.value.dtype} into {s.buffer.dtype} buffer "
                                f"'{s.buffer.name}': {s.value}")
            if s.value.lanes != s.index.lanes:
                raise self.fail(f"store to '{s.buffer.name}': {s.value.lanes} value lanes, "
                                f"{s.index.lanes} index lanes")
            if s.mask is not None:
                self.expr(s.mask, scope, buffers)
        elif isinstance(s, LetStmt):
            self.expr(s.value, scope, buffers)
            if s.value.dtype != s.var.dtype:
                raise self.fail(f"let '{s.var.name}: {s.var.dtype}' bound to {s.value.dtype}")
            self.stmt(s.body, scope | {s.var}, buffers)
        elif isinstance(s, IfThenElse):
            self.expr(s.cond, scope, buffers)
            self.stmt(s.then_body, scope, buffers)
            if s.else_body is not None:
                self.stmt(s.else_body, scope, buffers)
        elif isinstance(s, Allocate):
            if s.buffer.scope != "local":
                raise self.fail(f"Allocate of non-local buffer '{s.buffer.name}'")
            self.stmt(s.body, scope, buffers | {s.buffer})
        elif isinstance(s, Evaluate):
            self.expr(s.value, scope, buffers)
        elif isinstance(s, Gemm):
            self.gemm(s, scope, buffers)
        else:
            raise self.fail(f"unknown statement {type(s).__name__}")

    def gemm(self, s: Gemm, scope: set, buffers: set) -> None:
        for buffer in (s.out, s.a, s.b) + ((s.pack,) if s.pack is not None else ()):
            self._buffer(buffer, buffers)
        if s.b_direct:
            if s.b_packed or not s.b_is_matrix or s.b_j_dims[0][1] != 1 or \
                    (s.pack is not None) != may_be_nonzero(s.n % s.knobs.nr):
                raise self.fail("a Gemm reading B in place needs contiguous rows, and scratch "
                                "exactly for a partial last panel")
        elif s.b_packed == (s.pack is not None):
            raise self.fail("a Gemm reads B either pre-packed or packs it into scratch")
        inner = scope | set(v for v, _ in s.batch)
        for base in (s.out_base, s.a_base, s.b_base):
            self.expr(base, inner, buffers)
        if s.finish is not None:
            self.expr(s.finish, inner | {s.row, s.col, s.result}, buffers)
            if s.finish.dtype != s.out.dtype:
                raise self.fail(f"Gemm epilogue gives {s.finish.dtype}, the output is "
                                f"{s.out.dtype}")
        walks = (s.b_k_dims, s.b_j_dims)
        if [math.prod(e for e, _ in dims) for dims in walks] != [s.k, s.n] or \
                (s.b_packed and not s.b_is_matrix):
            raise self.fail(f"Gemm B walk {walks} does not cover {s.k} x {s.n}")
        if s.a_gathered and (math.prod(e for e, _ in s.a_k_dims) != s.k or s.a_packed or
                             s.knobs.pack_a or s.knobs.vector_rows):
            raise self.fail(f"Gemm A walk {s.a_k_dims} must cover {s.k} terms, read in place")
        if any(size < 1 for size in (s.m, s.n, s.k)) or s.knobs.vector_width % s.knobs.lanes:
            raise self.fail(f"Gemm of {s.m}x{s.n}x{s.k} with tile {s.knobs}")
        if s.knobs.vector_rows and (s.b_direct or s.knobs.fold_batch or
                                    s.knobs.b_panels_in_place or not s.a_packed):
            raise self.fail("a Gemm with its rows along the vectors reads A in compile-time "
                            "strips and B in packed panels, one batch element at a time")

    def _buffer(self, buffer: Buffer, buffers: set) -> None:
        if buffer not in buffers:
            raise self.fail(f"buffer '{buffer.name}' is neither a parameter nor allocated")

    def expr(self, e: Expr, scope: set, buffers: set) -> None:
        if isinstance(e, Var):
            if e not in scope:
                raise self.fail(f"variable '{e.name}' used out of scope")
        elif isinstance(e, Const):
            pass
        elif isinstance(e, Binary):
            self.expr(e.a, scope, buffers)
            self.expr(e.b, scope, buffers)
            if e.a.dtype != e.b.dtype:
                raise self.fail(f"operands of {e.op} differ in dtype ({e.a.dtype} vs "
                                f"{e.b.dtype}): {e}")
            if e.a.lanes != e.b.lanes:
                raise self.fail(f"operands of {e.op} differ in lanes ({e.a.lanes} vs "
                                f"{e.b.lanes}): {e}")
        elif isinstance(e, Unary):
            self.expr(e.a, scope, buffers)
        elif isinstance(e, Select):
            for x in (e.cond, e.true_value, e.false_value):
                self.expr(x, scope, buffers)
            if e.cond.dtype != DType.BOOL:
                raise self.fail(f"select condition must be bool: {e}")
            if e.true_value.dtype != e.false_value.dtype:
                raise self.fail(f"select branches differ in dtype: {e}")
        elif isinstance(e, Cast):
            self.expr(e.value, scope, buffers)
        elif isinstance(e, Load):
            self._buffer(e.buffer, buffers)
            self.expr(e.index, scope, buffers)
            if not e.index.dtype.is_int:
                raise self.fail(f"load from '{e.buffer.name}' has a non-integer index")
            if e.mask is not None:
                self.expr(e.mask, scope, buffers)
        elif isinstance(e, BufferLoad):
            raise self.fail(f"N-d access {e.buffer.name}[...] was not flattened (lowering "
                            f"flattens every BufferLoad into a Load)")
        elif isinstance(e, Ramp):
            self.expr(e.base, scope, buffers)
            self.expr(e.stride, scope, buffers)
            if e.base.lanes != 1 or e.stride.lanes != 1:
                raise self.fail("ramp base and stride must be scalars")
        elif isinstance(e, Broadcast):
            self.expr(e.value, scope, buffers)
            if e.value.lanes != 1:
                raise self.fail("broadcast of a vector")
        elif isinstance(e, Call):
            for a in e.args:
                self.expr(a, scope, buffers)
        else:
            raise self.fail(f"unknown expression {type(e).__name__}")
