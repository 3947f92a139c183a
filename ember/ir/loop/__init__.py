"""The loop-level IR: PrimFunc / Stmt / Expr / Buffer, immutable and structurally comparable."""

from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (INDEX, Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr,
                                Load, Ramp, Select, Unary, Var, as_expr, call, const, maximum,
                                minimum)
from ember.ir.loop.functor import buffers_used, rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import (Allocate, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc,
                                Seq, Stmt, Store, seq)
from ember.ir.loop.verifier import verify_func

__all__ = [
    "INDEX", "Allocate", "Binary", "Broadcast", "Buffer", "BufferLoad", "Call", "Cast", "Const",
    "Evaluate", "Expr", "For", "ForKind", "IfThenElse", "LetStmt", "Load", "PrimFunc", "Ramp", "Select",
    "Seq", "Stmt", "Store", "Unary", "Var", "as_expr", "buffers_used", "call", "const",
    "maximum", "minimum", "rewrite", "seq", "simplify", "substitute", "verify_func", "walk",
]
