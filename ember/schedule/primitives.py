"""Schedule primitives on the loop IR, recorded as a replayable trace.

A :class:`Schedule` wraps a PrimFunc and rewrites it step by step; loops are named by their
loop variable (unique within a function).  Every primitive appends a :class:`Step` to the
schedule's :class:`Trace`, and ``Trace.replay(func)`` applies the same steps to a fresh copy of
the function, which is how a tuner stores and reuses a schedule.

Primitives: ``split`` (with a guarded or a peeled tail), ``reorder``, ``fuse``, ``parallel``,
``vectorize``, ``unroll``, and ``cache_accumulator`` (register tiling of an accumulation nest,
see :mod:`ember.schedule.tiling`).  Whole-kernel steps record the decisions they took as their
arguments, so that a trace replays a whole kernel schedule: ``gemm_template`` (matrix products
onto the GEMM template with the listed knobs, :mod:`ember.schedule.gemm`),
``rfactor_reductions`` (row reductions into the listed counts of partial accumulators,
:mod:`ember.schedule.reductions`), ``partition_guarded_loops``, ``simplify_indices`` and
``hoist_invariant_divisions``.  Those that need the machine (the GEMM template) take the
schedule's ``target``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ember.core.traced import as_size, may_be_nonzero
from ember.core.errors import EmberError
from ember.ir.loop.expr import INDEX, Const, Expr, Var
from ember.ir.loop.functor import rewrite_stmts, substitute, walk, walk_stmts
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, seq

if TYPE_CHECKING:
    from ember.core.target import Target


class ScheduleError(EmberError):
    """A primitive was applied where it cannot be (names the loop and the reason)."""


@dataclass(frozen=True)
class Step:
    primitive: str
    args: tuple[Any, ...]


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)

    def replay(self, func: PrimFunc, target: "Target | None" = None,
               constant_params: frozenset[int] = frozenset()) -> "Schedule":
        """The steps applied to ``func`` (an unscheduled kernel); ``target`` and
        ``constant_params`` as the kernel was scheduled with (whole-kernel steps need them)."""
        schedule = Schedule(func, target, constant_params)
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
    def __init__(self, func: PrimFunc, target: "Target | None" = None,
                 constant_params: frozenset[int] = frozenset()):
        self.func = func
        self.target = target
        # parameters that receive compile-time constants (the GEMM template packs them)
        self.constant_params = frozenset(constant_params)
        self.trace = Trace()
        # the packings of constant operands the caller must apply (see schedule/gemm.py)
        self.prepacks: list = []
        self._names = set(self.loops())  # every loop name used so far (never reused)

    # ------------------------------------------------------------------ queries
    def loops(self) -> list[str]:
        """Names of every loop, outer before inner."""
        return [n.var.name for n in walk_stmts(self.func.body) if isinstance(n, For)]

    def get_loop(self, name: str) -> For:
        for node in walk_stmts(self.func.body):
            if isinstance(node, For) and node.var.name == name:
                return node
        raise ScheduleError(f"{self.func.name}: no loop named '{name}' "
                            f"(loops: {', '.join(self.loops()) or 'none'})")

    def _replace_loop(self, name: str, new: Stmt) -> None:
        self.get_loop(name)
        self.func = self.func.with_body(rewrite_stmts(
            self.func.body, lambda n: new if isinstance(n, For) and n.var.name == name else None))
        self._names.update(self.loops())

    def _check_new_names(self, primitive: str, name: str, *new_names: str) -> None:
        taken = set(self.loops())
        for new in new_names:
            if new in taken:
                raise ScheduleError(f"{self.func.name}: {primitive} of loop '{name}' would "
                                    f"create loop '{new}', which already exists")

    def _rename_copied_loops(self, body: Stmt) -> Stmt:
        """Fresh names for the loops of a copy of a loop body (a peeled tail), so that loop
        names stay unique and later primitives address exactly one loop."""
        mapping: dict[Var, Var] = {}
        for node in walk(body):
            if isinstance(node, For) and node.var not in mapping:
                base, number = f"{node.var.name}_p", 1
                fresh = base
                while fresh in self._names:
                    number += 1
                    fresh = f"{base}{number}"
                self._names.add(fresh)
                mapping[node.var] = Var(fresh, node.var.dtype)
        return substitute(body, mapping) if mapping else body

    def _record(self, primitive: str, *args: Any) -> None:
        self.trace.steps.append(Step(primitive, args))

    # ------------------------------------------------------------------ primitives
    def split(self, name: str, factor: int, tail: str = "guard") -> tuple[str, str]:
        """Split loop ``name`` into ``name_o`` × ``name_i`` (inner extent ``factor``).

        ``tail="guard"`` wraps the body in a bounds check when ``factor`` does not divide the
        extent; ``tail="peel"`` instead emits the remainder as a separate loop, keeping the main
        loops free of conditions (better for vectorization); loops inside the body are copied
        into that tail loop under fresh names (``j`` becomes ``j_p``).  Either way the returned
        loops exist afterwards (with ``peel`` and ``factor`` above the extent, the main loops
        run zero times), so later steps of a trace naming them apply to any extent.
        """
        loop = self.get_loop(name)
        extent = _const_extent(loop, self.func.name)
        if factor <= 0:
            raise ScheduleError(f"{self.func.name}: split of loop '{name}': the factor must be "
                                f"positive, got {factor}")
        if tail not in ("guard", "peel"):
            raise ScheduleError(f"{self.func.name}: split of loop '{name}': unknown tail policy "
                                f"{tail!r} (expected 'guard' or 'peel')")
        outer, inner = Var(f"{name}_o"), Var(f"{name}_i")
        index = outer * factor + inner
        # (a traced extent leaves a remainder whatever its sample: the code for one is kept)
        full, remainder = extent // factor, extent % factor
        has_remainder = may_be_nonzero(remainder)
        self._check_new_names("split", name, outer.name, inner.name,
                              *([f"{name}_t"] if has_remainder and tail == "peel" else []))
        start = loop.start
        body = substitute(loop.body, {loop.var: simplify(start + index)})
        if has_remainder and tail == "guard":
            body = IfThenElse(simplify((outer * factor + inner).lt(extent)), body)
            outer_extent = (extent + factor - 1) // factor
        else:
            outer_extent = full
        new: Stmt = For(outer, Const(0, INDEX), Const(outer_extent, INDEX), loop.kind,
                        For(inner, Const(0, INDEX), Const(factor, INDEX), ForKind.SERIAL, body))
        if has_remainder and tail == "peel":
            rest = Var(f"{name}_t")
            tail_body = substitute(loop.body, {loop.var: simplify(start + full * factor + rest)})
            tail_body = self._rename_copied_loops(tail_body)
            new = seq(new, For(rest, Const(0, INDEX), Const(remainder, INDEX), ForKind.SERIAL,
                               tail_body))
        self._replace_loop(name, new)
        self._record("split", name, factor, tail)
        return outer.name, inner.name

    def reorder(self, *names: str) -> None:
        """Reorder perfectly nested loops: ``names`` lists them in the new outer-to-inner order."""
        outermost = None
        chain: list[For] = []
        for name in names:
            self.get_loop(name)  # names an unknown loop in the error
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
        """Fuse two perfectly nested loops into one over the product of their extents (it
        keeps the outer loop's annotations: a nest's role stays on the nest)."""
        outer = self.get_loop(outer_name)
        inner = outer.body
        if not (isinstance(inner, For) and inner.var.name == inner_name):
            raise ScheduleError(f"fuse: '{inner_name}' is not directly inside '{outer_name}'")
        n_outer = _const_extent(outer, self.func.name)
        n_inner = _const_extent(inner, self.func.name)
        fused = Var(f"{outer_name}_{inner_name}_f")
        self._check_new_names("fuse", outer_name, fused.name)
        body = substitute(inner.body, {
            outer.var: simplify(outer.start + fused // n_inner),
            inner.var: simplify(inner.start + fused % n_inner),
        })
        self._replace_loop(outer_name, For(fused, Const(0, INDEX), Const(n_outer * n_inner, INDEX),
                                           outer.kind, body, outer.annotations))
        self._record("fuse", outer_name, inner_name)
        return fused.name

    def fuse_nests(self, *names: str) -> str:
        """Make consecutive top-level loops of equal extent one loop, named after the first,
        whose body runs theirs in order (each with its variable renamed).  Iteration ``r`` of
        a later loop then runs right after iteration ``r`` of the earlier ones, not after all
        of them: the caller checks that no later iteration depends on an earlier loop's later
        rows (see :mod:`ember.schedule.row_fusion`)."""
        body = self.func.body
        statements = list(body.stmts) if isinstance(body, Seq) else [body]
        positions = []
        for name in names:
            position = next((i for i, s in enumerate(statements)
                             if isinstance(s, For) and s.var.name == name), None)
            if position is None:
                raise ScheduleError(f"{self.func.name}: fuse_nests: '{name}' is not a "
                                    f"top-level loop")
            positions.append(position)
        if len(names) < 2 or positions != list(range(positions[0], positions[0] + len(names))):
            raise ScheduleError(f"{self.func.name}: fuse_nests needs two or more consecutive "
                                f"top-level loops, got {list(names)}")
        loops = [statements[p] for p in positions]
        first = loops[0]
        if any(l.extent != first.extent or l.start != first.start for l in loops[1:]):
            raise ScheduleError(f"{self.func.name}: fuse_nests: loops {list(names)} do not "
                                f"have the same bounds")
        parts = [first.body] + [substitute(l.body, {l.var: first.var}) for l in loops[1:]]
        fused = replace(first, body=seq(*parts))
        statements[positions[0]:positions[-1] + 1] = [fused]
        self.func = self.func.with_body(seq(*statements))
        self._names.update(self.loops())
        self._record("fuse_nests", *names)
        return first.var.name

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

    def cache_accumulator(self, row: str, col: str, rows: int, cols: int,
                          fuse_passes: bool = False) -> tuple[str, str]:
        """Register-tile the accumulation nest ``row`` / reduction loops / ``col``: tiles of
        ``rows`` x ``cols`` output elements accumulate in a ``local`` buffer (loaded from the
        output before the reduction loops, stored back after them); tails are peeled.
        ``fuse_passes`` folds lowering's init and epilogue passes into the tiles.  Returns
        the row-tile and column-tile loops (``row_o``, ``col_o``); see
        :mod:`ember.schedule.tiling`."""
        from ember.schedule.tiling import cache_accumulator

        return cache_accumulator(self, row, col, rows, cols, fuse_passes)


    # ------------------------------------------------------------------ whole-kernel steps
    def gemm_template(self, knobs: list[dict[str, Any] | None] | None = None,
                      chooser: Any = None) -> None:
        """Matrix-product nests onto the GEMM template.  Replaying, ``knobs`` lists each
        product's knobs (None: its plain loops stay); scheduling, ``chooser`` (a
        :class:`~ember.schedule.gemm.GemmChooser`) decides them.  Records the knobs used."""
        from ember.schedule.gemm import RecordingChooser, ReplayChooser, use_gemm_template

        target = self._need_target("gemm_template")
        inner = ReplayChooser(target, knobs, self.func.name) if knobs is not None else chooser
        recording = RecordingChooser(target, inner)
        self.func, prepacks = use_gemm_template(self.func, target, self.constant_params,
                                                recording)
        self.prepacks.extend(prepacks)
        self._names.update(self.loops())
        self._record("gemm_template", recording.used())

    def rfactor_reductions(self, partials: list[int] | None = None,
                           choose: Any = None) -> None:
        """Row reductions accumulated in partial vectors (TVM's rfactor).  Replaying,
        ``partials`` lists each qualifying reduction's count (0: scalar); scheduling,
        ``choose(index, proposed, legal)`` decides.  Records the counts used."""
        from ember.schedule.reductions import vectorize_reductions

        target = self._need_target("rfactor_reductions")
        used: list[int] = []

        def decide(index: int, proposed: int, legal: list[int]) -> int:
            if partials is not None:
                if index >= len(partials) or partials[index] not in (0, *legal):
                    raise ScheduleError(
                        f"{self.func.name}: rfactor_reductions: reduction {index} cannot take "
                        f"{partials[index] if index < len(partials) else 'no'} partials "
                        f"(legal: 0, {', '.join(map(str, legal))})")
                count = partials[index]
            else:
                count = choose(index, proposed, legal) if choose is not None else proposed
            used.append(count)
            return count

        self.func = vectorize_reductions(self.func, target, decide)
        self._names.update(self.loops())
        self._record("rfactor_reductions", used)

    def partition_guarded_loops(self) -> None:
        """Split guarded loops where their border tests are decided (schedule/partition.py)."""
        from ember.schedule.partition import partition_guarded_loops

        self.func = partition_guarded_loops(self.func)
        self._names.update(self.loops())
        self._record("partition_guarded_loops")

    def simplify_indices(self) -> None:
        """Remove the divisions of buffer indices that loop bounds make exact."""
        from ember.ir.loop.index_simplify import simplify_indices

        self.func = simplify_indices(self.func)
        self._record("simplify_indices")

    def hoist_invariant_loads(self) -> None:
        """Read the loads a vectorized loop does not move before it (schedule/hoist.py)."""
        from ember.schedule.hoist import hoist_invariant_loads

        self.func = hoist_invariant_loads(self.func)
        self._record("hoist_invariant_loads")

    def hoist_invariant_divisions(self) -> None:
        """Compute integer divisions before the loops they do not depend on."""
        from ember.schedule.hoist import hoist_invariant_divisions

        self.func = hoist_invariant_divisions(self.func)
        self._record("hoist_invariant_divisions")

    def _need_target(self, step: str) -> "Target":
        if self.target is None:
            raise ScheduleError(f"{self.func.name}: {step} needs the schedule's target")
        return self.target


def _const_extent(loop: For, func_name: str) -> int:
    if not isinstance(loop.extent, Const):
        raise ScheduleError(f"{func_name}: loop '{loop.var.name}' has a non-constant extent")
    return as_size(loop.extent.value)


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


def is_reduction_loop(loop: For) -> bool:
    """Whether lowering annotated ``loop`` as a reduction (its iterations accumulate)."""
    return bool(dict(loop.annotations).get("reduce"))


def perfect_chain(loop: For) -> list[For]:
    """The loops perfectly nested from ``loop`` down (each body is exactly the next For)."""
    chain = [loop]
    while isinstance(chain[-1].body, For):
        chain.append(chain[-1].body)
    return chain


def expr_uses(expr: Expr, var: Var) -> bool:
    return any(n == var for n in walk(expr))
