"""``ember.explain(model, *inputs)``: what ran where when ``torch.compile(backend="ember")``
runs ``model`` on ``inputs``.

It compiles ``model`` once, with the ember backend wrapped in Dynamo's ``ExplainWithBackend``
(which records the graph breaks), runs it on ``inputs``, and reports: Dynamo's graph breaks,
and why it captured nothing if it did not; for every graph ember received, the ATen calls
that PyTorch ran instead and those that ran as numpy references inside ember's parts, with
their reasons; and the share of the model's operations that ember compiled (every call
counts: see ``partition.flops_of``).  Dynamo's caches are not reset, so other compiled
models keep theirs, and the compiled model comes back with the report
(``Explanation.compiled``) to be used instead of compiling again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ember.torch_backend.backend import REPORTS, GraphReport, ember_backend


@dataclass
class Explanation:
    graph_count: int
    graph_breaks: list[str] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)
    # why Dynamo left code to Python (its "unimplemented" reasons): the story when it
    # captured no graph at all
    not_captured: list[str] = field(default_factory=list)
    # the model compiled with the ember backend, warm: call it instead of compiling again
    compiled: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def fallbacks(self):
        """Every ATen call that ember did not compile: run by PyTorch, or as a numpy
        reference inside an ember part."""
        return [f for g in self.graphs for f in (*g.fallbacks, *g.references)]

    @property
    def flops_total(self) -> int:
        return sum(g.flops_total for g in self.graphs)

    @property
    def flops_compiled(self) -> int:
        return sum(g.flops_compiled for g in self.graphs if g.compiled)

    @property
    def compiled_flop_share(self) -> float:
        """Share of the model's operations (``partition.flops_of``) that ember compiled;
        0 when Dynamo captured nothing (the whole model ran in PyTorch)."""
        total = self.flops_total
        if total:
            return self.flops_compiled / total
        nodes = sum(g.compute_nodes for g in self.graphs)
        compiled = sum(g.compiled_nodes for g in self.graphs if g.compiled)
        if nodes:
            return compiled / nodes
        return 1.0 if self.graphs else 0.0

    def __str__(self) -> str:
        lines = [f"ember.explain: {self.graph_count} graph(s), "
                 f"{len(self.graph_breaks)} graph break(s), "
                 f"{self.compiled_flop_share:.1%} of FLOPs compiled by ember"]
        if not self.graphs:
            lines.append("  Dynamo captured no graph: the whole model ran in PyTorch")
            lines += [f"    {reason}" for reason in self.not_captured]
        for i, reason in enumerate(self.graph_breaks):
            lines.append(f"  graph break {i + 1}: {reason}")
        lines += [format_graph_report(g, i) for i, g in enumerate(self.graphs)]
        return "\n".join(lines)


def format_graph_report(report: GraphReport, number: int | None = None) -> str:
    """One graph's lines; ``number`` is its place in an explanation (default: its number
    in the process, as the log names it)."""
    label = report.index if number is None else number
    if not report.compiled:
        return f"  graph {label}: runs in PyTorch: {report.reason}"
    share = report.flops_compiled / report.flops_total if report.flops_total else 1.0
    inside = f" ({len(report.references)} as numpy references)" if report.references else ""
    lines = [f"  graph {label}: {report.compiled_nodes}/{report.compute_nodes} ATen "
             f"ops compiled in {report.kernels} ember part(s){inside}; {share:.1%} of its "
             f"FLOPs"]
    for fallback in report.fallbacks:
        lines.append(f"    fell back: {fallback.op} ({fallback.node}): {fallback.reason}")
    for reference in report.references:
        lines.append(f"    numpy reference: {reference.op} ({reference.node}): "
                     f"{reference.reason}")
    for reason in report.recompiles:
        lines.append(f"    recompiled: {reason}")
    return "\n".join(lines)


def explain(model: Any, *inputs: Any, **kwargs: Any) -> Explanation:
    """Compile ``model`` with the ember backend, run it once on ``inputs`` (without
    autograd), and report graph breaks, fallbacks and the share of FLOPs compiled."""
    import torch
    from torch._dynamo.backends.debugging import ExplainWithBackend
    from torch._dynamo.utils import counters

    recorder = ExplainWithBackend(ember_backend)
    unimplemented = Counter(counters["unimplemented"])
    start = len(REPORTS)
    compiled = torch.compile(model, backend=recorder)
    with torch.no_grad():
        compiled(*inputs, **kwargs)
    left = Counter(counters["unimplemented"]) - unimplemented
    return Explanation(graph_count=len(recorder.graphs),
                       graph_breaks=[f"{b.reason} ({_where(b)})"
                                     for b in recorder.break_reasons],
                       graphs=REPORTS.since(start),
                       not_captured=[_first_lines(reason) for reason in left],
                       compiled=compiled)


def _first_lines(reason: str) -> str:
    """Dynamo's reason without its debug context and links: its first two lines."""
    return " ".join(line.strip() for line in str(reason).splitlines()[:2])


def _where(reason: Any) -> str:
    stack = getattr(reason, "user_stack", None)
    if stack:
        frame = stack[-1]
        return f"{frame.filename}:{frame.lineno}"
    return "unknown location"
