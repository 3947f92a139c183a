"""Text form of the loop IR (stable, so tests compare printed Before/Expected).

    func relu(x: f32[1024], y: f32[1024]) {
      parallel for i in [0, 1024) {
        y[i] = max(x[i], 0.0f)
      }
    }
"""

from __future__ import annotations

from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr, Load,
                                Ramp, Select, Unary, Var)
from ember.ir.loop.stmt import (Allocate, Evaluate, For, ForKind, Gemm, IfThenElse, LetStmt,
                                PrimFunc, Seq, Stmt, Store)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
          "floormod": "%%", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
          "ne": "!=", "and": "&&", "or": "||", "bitand": "&", "bitor": "|", "bitxor": "^",
          "shl": "<<", "shr": ">>"}
_UNARY = {"neg": "-", "not": "!", "bitnot": "~"}


def format_expr(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        text = _const_text(e)
        return text if e.lanes == 1 else f"x{e.lanes}({text})"
    if isinstance(e, Binary):
        if e.op in ("min", "max"):
            return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
        return f"({format_expr(e.a)} {_INFIX[e.op]} {format_expr(e.b)})"
    if isinstance(e, Unary):
        return f"{_UNARY[e.op]}{format_expr(e.a)}"
    if isinstance(e, Select):
        return (f"select({format_expr(e.cond)}, {format_expr(e.true_value)}, "
                f"{format_expr(e.false_value)})")
    if isinstance(e, Cast):
        suffix = f"x{e.lanes}" if e.lanes > 1 else ""
        return f"{e.dtype}{suffix}({format_expr(e.value)})"
    if isinstance(e, Load):
        mask = f" if {format_expr(e.mask)}" if e.mask is not None else ""
        return f"{e.buffer.name}[{_strip(format_expr(e.index))}{mask}]"
    if isinstance(e, BufferLoad):
        mask = f" if {format_expr(e.mask)}" if e.mask is not None else ""
        indices = ", ".join(_strip(format_expr(i)) for i in e.indices)
        return f"{e.buffer.name}[{'flat ' if e.flat else ''}{indices}{mask}]"
    if isinstance(e, Ramp):
        return f"ramp({format_expr(e.base)}, {format_expr(e.stride)}, {e.lanes})"
    if isinstance(e, Broadcast):
        return f"x{e.lanes}({format_expr(e.value)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"
    return repr(e)


def _const_text(e: Const) -> str:
    if e.dtype.is_float:
        suffix = "f" if e.dtype.value == "f32" else f":{e.dtype}"
        return f"{float(e.value)!r}{suffix}"
    if isinstance(e.value, bool):
        return "true" if e.value else "false"
    return str(e.value) if e.dtype.value == "i64" else f"{e.value}:{e.dtype}"


def _strip(text: str) -> str:
    return text[1:-1] if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]) \
        else text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def format_stmt(s: Stmt, indent: str = "") -> str:
    if isinstance(s, Seq):
        return "\n".join(format_stmt(x, indent) for x in s.stmts)
    if isinstance(s, For):
        kind = "" if s.kind is ForKind.SERIAL else s.kind.value + " "
        notes = "".join(f" @{k}={_strip(format_expr(v)) if isinstance(v, Expr) else v}"
                        for k, v in s.annotations)
        start = format_expr(s.start)
        end = format_expr(s.extent) if start == "0" else f"{start} + {format_expr(s.extent)}"
        return (f"{indent}{kind}for {s.var.name} in [{start}, {_strip(end)}){notes} {{\n"
                f"{format_stmt(s.body, indent + '  ')}\n{indent}}}")
    if isinstance(s, Store):
        mask = f" if {format_expr(s.mask)}" if s.mask is not None else ""
        return (f"{indent}{s.buffer.name}[{_strip(format_expr(s.index))}] = "
                f"{_strip(format_expr(s.value))}{mask}")
    if isinstance(s, LetStmt):
        return (f"{indent}let {s.var.name}: {s.var.dtype} = {_strip(format_expr(s.value))}\n"
                f"{format_stmt(s.body, indent)}")
    if isinstance(s, IfThenElse):
        text = (f"{indent}if {_strip(format_expr(s.cond))} {{\n"
                f"{format_stmt(s.then_body, indent + '  ')}\n{indent}}}")
        if s.else_body is not None:
            text += f" else {{\n{format_stmt(s.else_body, indent + '  ')}\n{indent}}}"
        return text
    if isinstance(s, Allocate):
        return (f"{indent}alloc {s.buffer} {s.buffer.scope}\n"
                f"{format_stmt(s.body, indent)}")
    if isinstance(s, Evaluate):
        return f"{indent}{format_expr(s.value)}"
    if isinstance(s, Gemm):
        return _format_gemm(s, indent)
    return f"{indent}{s!r}"


def _format_gemm(s: Gemm, indent: str) -> str:
    batch = "".join(f"[{v.name} < {e}]" for v, e in s.batch)
    def walk(dims) -> str:
        return "(" + ", ".join(f"{e}:{stride}" for e, stride in dims) + ")"
    b_read = f"packed {s.b.name}" if s.b_packed else \
        f"{s.b.name}[{_strip(format_expr(s.b_base))} + k{walk(s.b_k_dims)} + " \
        f"j{walk(s.b_j_dims)}]"
    finish = _strip(format_expr(s.finish)) if s.finish is not None else s.result.name
    a_k = f"k{walk(s.a_k_dims)}" if s.a_gathered else f"k*{s.a_cs}"
    a_read = f"packed {s.a.name}" if s.a_packed else \
        f"{s.a.name}[{_strip(format_expr(s.a_base))} + i*{s.a_rs} + {a_k}]"
    knobs = s.knobs
    return (f"{indent}gemm{batch} {s.m}x{s.n}x{s.k} "
            f"(tile {knobs.mr}x{knobs.nr}, kc {knobs.kc}, tasks {knobs.mc}x{knobs.nc}"
            f"{', batch folded into the columns' if knobs.fold_batch else ''}) {{\n"
            f"{indent}  {s.result.name} = sum_k {a_read} * {b_read}\n"
            f"{indent}  {s.out.name}[{_strip(format_expr(s.out_base))} + i*{s.out_rs} + "
            f"j{walk(s.out_j_dims) if s.out_j_dims else ''}] = "
            f"{finish}   (i = {s.row.name}, j = {s.col.name})\n{indent}}}")


def format_func(f: PrimFunc) -> str:
    params = ", ".join(str(p) if isinstance(p, Buffer) else f"{p.name}: {p.dtype}"
                       for p in f.params)
    return f"func {f.name}({params}) {{\n{format_stmt(f.body, '  ')}\n}}"
