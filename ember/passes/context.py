"""What a run of graph passes knows and records: the :class:`PassContext`.

A pipeline (``ember.passes.pipeline``) is a list of :class:`GraphPass` run in order by
:func:`run_passes`.  Around every pass the runner does the same bookkeeping, so no pass has to:

* shape inference after a pass that changed the graph, so that the next pass (and lowering)
  sees exact types;
* the IR verifier after every pass (``verify``; linear in the graph, cheap enough to leave on),
  so that a pass that breaks an invariant is named where it did, not found later as a crash;
* the time of each pass, and of the inference and verification after it (``records``);
* the printed graph before and after the passes named in ``dump`` (or all of them), appended
  to ``dumps`` and given to ``on_dump`` if set, which is how ``ember inspect`` can show each
  stage of the optimization.

Passes receive the context too: the memory budget (``memory_limit``) bounds what constant
folding may allocate, the ``target`` lets a pass decide what pays on the machine compiled for,
and ``kernel_support`` tells fusion which nodes the compile driver can turn into kernels (a
node it cannot stays a group of its own and runs its numpy reference).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable

from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.errors import CompileError, EmberError
from ember.core.target import Target
from ember.ir.graph import Graph, Node
from ember.ir.printer import format_graph
from ember.passes.infer_shapes import infer_shapes
from ember.passes.verify import verify_graph

ALL_PASSES = "all"


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: how many things it changed and how long it and its checks took."""

    name: str
    changed: int
    seconds: float
    infer_seconds: float = 0.0
    verify_seconds: float = 0.0

    def __str__(self) -> str:
        return f"{self.name}: {self.changed}"


@dataclass(frozen=True)
class IRDump:
    """The printed graph ``when`` ("before" or "after") the pass ``pass_name`` ran."""

    pass_name: str
    when: str
    text: str
    changed: int | None = None  # for "after": what the pass reported


@dataclass
class PassContext:
    """Settings of one optimization run and what it records.

    ``dump`` names the passes whose input and output graphs are printed (a name, several, or
    ``"all"``); with ``"all"`` a pass that changed nothing adds no "after" dump, since it would
    repeat the one before it.
    """

    opt_level: int = 2
    target: Target | None = None
    memory_limit: int | None = None  # bytes; None: ember.core.config.memory_limit()
    verify: bool = True
    dump: str | Collection[str] | None = None
    # node -> ember.passes.fuse.NodeSupport; None: a node compiles when its op has a compute
    kernel_support: Callable[[Node], object] | None = None
    on_dump: Callable[[IRDump], None] | None = None
    records: list[PassRecord] = field(default_factory=list)
    dumps: list[IRDump] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.memory_limit = resolve_memory_limit(self.memory_limit)

    @property
    def dumps_every_pass(self) -> bool:
        return self.dump == ALL_PASSES or (self.dump is not None and
                                           not isinstance(self.dump, str) and
                                           ALL_PASSES in self.dump)

    def dumps_pass(self, name: str) -> bool:
        if self.dump is None:
            return False
        if isinstance(self.dump, str):
            return self.dump in (ALL_PASSES, name)
        return ALL_PASSES in self.dump or name in self.dump

    def record_dump(self, pass_name: str, when: str, graph: Graph,
                    changed: int | None = None) -> None:
        entry = IRDump(pass_name, when, format_graph(graph), changed)
        self.dumps.append(entry)
        if self.on_dump is not None:
            self.on_dump(entry)

    def timing_report(self) -> str:
        """One line per pass: what it changed and the time it, inference and the verifier took."""
        lines = [f"{'pass':32s} {'changed':>8s} {'pass ms':>9s} {'infer ms':>9s} "
                 f"{'verify ms':>9s}"]
        for r in self.records:
            lines.append(f"{r.name:32s} {r.changed:8d} {r.seconds * 1e3:9.2f} "
                         f"{r.infer_seconds * 1e3:9.2f} {r.verify_seconds * 1e3:9.2f}")
        return "\n".join(lines)


PassFn = Callable[[Graph, PassContext], int]


@dataclass(frozen=True)
class GraphPass:
    """A named graph pass: ``run(graph, ctx)`` rewrites in place and returns how many things
    it changed (0: the graph is untouched)."""

    name: str
    run: PassFn
    doc: str = ""


def graph_pass(fn: Callable[[Graph], int], name: str | None = None) -> GraphPass:
    """A pass that needs nothing of the context (most of them), under its function's name."""
    return GraphPass(name or fn.__name__, lambda graph, ctx: fn(graph),
                     (fn.__doc__ or "").strip().split("\n")[0])


def run_passes(graph: Graph, passes: Iterable[GraphPass], ctx: PassContext) -> Graph:
    """Run ``passes`` in order on ``graph`` (in place), with inference, verification, timing
    and dumps around each as the context asks; returns the graph."""
    passes = list(passes)
    every = ctx.dumps_every_pass
    if every and passes:
        ctx.record_dump(passes[0].name, "before", graph)
    for graph_pass_ in passes:
        named = not every and ctx.dumps_pass(graph_pass_.name)
        if named:
            ctx.record_dump(graph_pass_.name, "before", graph)
        started = time.perf_counter()
        changed = _run_one(graph_pass_, graph, ctx)
        ran = time.perf_counter()
        if changed:
            _forget_stale_types(graph)
            infer_shapes(graph)
        inferred = time.perf_counter()
        if ctx.verify:
            verify_graph(graph, stage=f"after graph pass '{graph_pass_.name}'")
        verified = time.perf_counter()
        ctx.records.append(PassRecord(graph_pass_.name, changed, ran - started,
                                      inferred - ran, verified - inferred))
        if named or (every and changed):
            ctx.record_dump(graph_pass_.name, "after", graph, changed)
    return graph


def _run_one(graph_pass_: GraphPass, graph: Graph, ctx: PassContext) -> int:
    """Run one pass; an unexpected exception in it becomes a CompileError naming the pass
    (ember's own errors, which already say what is wrong with the model, pass through)."""
    try:
        return int(graph_pass_.run(graph, ctx) or 0)
    except EmberError:
        raise
    except Exception as error:  # noqa: BLE001 -- a pass bug must not escape unexplained
        lower = f" (opt_level {ctx.opt_level - 1} or lower may avoid it)" if ctx.opt_level else ""
        raise CompileError(f"internal compiler error in graph pass '{graph_pass_.name}': "
                           f"{type(error).__name__}: {error}. This is a bug in ember{lower}."
                           ) from error


def _forget_stale_types(graph: Graph) -> None:
    """Drop the types of values a pass removed, so that a later value of the same name is
    inferred afresh rather than checked against a type that no longer describes anything."""
    defined = graph.all_value_names()
    for name in [n for n in graph.types if n not in defined]:
        del graph.types[name]
