"""Schedule primitives on the loop IR, recorded as a replayable trace.

A :class:`Schedule` wraps a PrimFunc and rewrites it step by step; loops are named by their
loop variable (unique within a function).  Every primitive appends a :class:`Step` to the
schedule's :class:`Trace`, and ``Trace.replay(func)`` applies the same steps to a fresh copy of
the function, which is how a tuner stores and reuses a schedule.

Primitives: ``split`` (with a guarded or a peeled tail), ``reorder``, ``fuse``, ``parallel``,
``vectorize``, ``unroll``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ember.core.errors import EmberError
from ember.ir.loop.expr import INDEX, Const, Expr, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import For, ForKind, IfThenElse, PrimFunc, Stmt, seq


class ScheduleError(EmberError):
    """A primitive was applied where it cannot be (names the loop and the reason)."""


@dataclass(frozen=True)
class Step:
    primitive: str
    args: tuple[Any, ...]


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)

    def replay(self, func: PrimFunc) -> "Schedule":
        schedule = Schedule(func)
        for step in self.steps:
            getattr(schedule, step.primitive)(*step.args)
        return schedule

    def to_json(self) -> str:
        return json.dumps([[s.primitive, list(s.args)] for s in self.steps])

    @staticmethod
    def from_json(text: str) -> "Trace":
        return Trace([Step(p, tuple(a)) for p, a in json.loads(text)])

    def __str__(self) -> str:
        return "\n".join(f"{s.primitive}({', '.join(map(repr, s.args))})" for s in self.steps)


class Schedule:
    def __init__(self, func: PrimFunc):
        self.func = func
        self.trace = Trace()

    # ------------------------------------------------------------------ queries
    def loops(self) -> list[str]:
        """Names of every loop, outer before inner."""
        return [n.var.name for n in walk(self.func.body) if isinstance(n, For)]

    def get_loop(self, name: str) -> For:
        for node in walk(self.func.body):
            if isinstance(node, For) and node.var.name == name:
                return node
        raise ScheduleError(f"{self.func.name}: no loop named '{name}' "
                            f"(loops: {', '.join(self.loops()) or 'none'})")

    def _replace_loop(self, name: str, new: Stmt) -> None:
        self.get_loop(name)
        self.func = self.func.with_body(rewrite(
            self.func.body, lambda n: new if isinstance(n, For) and n.var.name == name else None))

    def _record(self, primitive: str, *args: Any) -> None:
        self.trace.steps.append(Step(primitive, args))

    # ------------------------------------------------------------------ primitives
    def split(self, name: str, factor: int, tail: str = "guard") -> tuple[str, str]:
        """Split loop ``name`` into ``name_o`` × ``name_i`` (inner extent ``factor``).

        ``tail="guard"`` wraps the body in a bounds check when ``factor`` does not divide the
        extent; ``tail="peel"`` instead emits the remainder as a separate loop, keeping the main
        loops free of conditions (better for vectorization).
        """
        loop = self.get_loop(name)
        extent = _const_extent(loop, self.func.name)
        if factor <= 0:
            raise ScheduleError(f"split factor must be positive, got {factor}")
        outer, inner = Var(f"{name}_o"), Var(f"{name}_i")
        index = outer * factor + inner
        full, remainder = divmod(extent, factor)
        start = loop.start
        body = substitute(loop.body, {loop.var: simplify(start + index)})
        if remainder and tail == "guard":
            body = IfThenElse(simplify((outer * factor + inner).lt(extent)), body)
            outer_extent = full + 1
        elif tail in ("guard", "peel"):
            outer_extent = full
        else:
            raise ScheduleError(f"unknown tail policy {tail!r}")
        new: Stmt = For(outer, Const(0, INDEX), Const(outer_extent, INDEX), loop.kind,
                        For(inner, Const(0, INDEX), Const(factor, INDEX), ForKind.SERIAL, body))
        if remainder and tail == "peel":
            rest = Var(f"{name}_t")
            tail_body = substitute(loop.body, {loop.var: simplify(start + full * factor + rest)})
            new = seq(new, For(rest, Const(0, INDEX), Const(remainder, INDEX), ForKind.SERIAL,
                               tail_body))
        if full == 0 and tail == "peel":
            new = For(Var(f"{name}_t"), Const(0, INDEX), Const(remainder, INDEX), ForKind.SERIAL,
                      substitute(loop.body, {loop.var: simplify(start + Var(f"{name}_t"))}))
        self._replace_loop(name, new)
        self._record("split", name, factor, tail)
        return outer.name, inner.name

    def reorder(self, *names: str) -> None:
        """Reorder perfectly nested loops: ``names`` lists them in the new outer-to-inner order."""
        outermost = None
        chain: list[For] = []
        for candidate in self.loops():
            if candidate in names:
                outermost = self.get_loop(candidate)
                break
        if outermost is None:
            raise ScheduleError(f"reorder: none of {names} is a loop")
        node: Stmt = outermost
        while isinstance(node, For) and len(chain) < len(names):
            chain.append(node)
            node = node.body
        if sorted(l.var.name for l in chain) != sorted(names):
            raise ScheduleError(f"reorder: loops {names} are not perfectly nested in "
                                f"{self.func.name}")
        by_name = {l.var.name: l for l in chain}
        body = node
        for name in reversed(names):
            l = by_name[name]
            body = replace(l, body=body)
        self._replace_loop(outermost.var.name, body)
        self._record("reorder", *names)

    def fuse(self, outer_name: str, inner_name: str) -> str:
        """Fuse two perfectly nested loops into one over the product of their extents."""
        outer = self.get_loop(outer_name)
        inner = outer.body
        if not (isinstance(inner, For) and inner.var.name == inner_name):
            raise ScheduleError(f"fuse: '{inner_name}' is not directly inside '{outer_name}'")
        n_outer = _const_extent(outer, self.func.name)
        n_inner = _const_extent(inner, self.func.name)
        fused = Var(f"{outer_name}_{inner_name}_f")
        body = substitute(inner.body, {
            outer.var: simplify(outer.start + fused // n_inner),
            inner.var: simplify(inner.start + fused % n_inner),
        })
        self._replace_loop(outer_name, For(fused, Const(0, INDEX), Const(n_outer * n_inner, INDEX),
                                           outer.kind, body))
        self._record("fuse", outer_name, inner_name)
        return fused.name

    def _set_kind(self, name: str, kind: ForKind) -> None:
        loop = self.get_loop(name)
        self._replace_loop(name, replace(loop, kind=kind))

    def parallel(self, name: str) -> None:
        """Run iterations of loop ``name`` on the thread pool."""
        self._set_kind(name, ForKind.PARALLEL)
        self._record("parallel", name)

    def vectorize(self, name: str) -> None:
        """Map loop ``name`` onto SIMD lanes (codegen emits vector code for it)."""
        self._set_kind(name, ForKind.VECTORIZED)
        self._record("vectorize", name)

    def unroll(self, name: str) -> None:
        self._set_kind(name, ForKind.UNROLLED)
        self._record("unroll", name)


def _const_extent(loop: For, func_name: str) -> int:
    if not isinstance(loop.extent, Const):
        raise ScheduleError(f"{func_name}: loop '{loop.var.name}' has a non-constant extent")
    return int(loop.extent.value)


def loop_nests(body: Stmt) -> list[For]:
    """The top-level loop nests of a function body (looking through Allocate/Seq)."""
    from ember.ir.loop.stmt import Allocate, Seq

    if isinstance(body, For):
        return [body]
    if isinstance(body, Seq):
        return [nest for s in body.stmts for nest in loop_nests(s)]
    if isinstance(body, Allocate):
        return loop_nests(body.body)
    return []


def perfect_chain(loop: For) -> list[For]:
    """The loops perfectly nested from ``loop`` down (each body is exactly the next For)."""
    chain = [loop]
    while isinstance(chain[-1].body, For):
        chain.append(chain[-1].body)
    return chain


def expr_uses(expr: Expr, var: Var) -> bool:
    return any(n == var for n in walk(expr))
