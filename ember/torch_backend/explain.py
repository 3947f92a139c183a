"""``ember.explain(model, *inputs)``: what ran where when ``torch.compile(backend="ember")``
runs ``model`` on ``inputs``.

It reports Dynamo's graph breaks (from ``torch._dynamo.explain``) and, for every graph ember
received, the ATen ops that fell back to PyTorch with their reasons, and the share of the
matmul/conv/attention FLOPs (PyTorch's FLOP formulas) that ember compiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.torch_backend.backend import REPORTS, GraphReport, ember_backend


@dataclass
class Explanation:
    graph_count: int
    graph_breaks: list[str] = field(default_factory=list)
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def fallbacks(self):
        return [f for g in self.graphs for f in g.fallbacks]

    @property
    def flops_total(self) -> int:
        return sum(g.flops_total for g in self.graphs)

    @property
    def flops_compiled(self) -> int:
        return sum(g.flops_compiled for g in self.graphs if g.compiled)

    @property
    def compiled_flop_share(self) -> float:
        """Share of the matmul/conv/attention FLOPs that ember compiled; for a model
        without those, the share of its ATen ops."""
        total = self.flops_total
        if total:
            return self.flops_compiled / total
        nodes = sum(g.compute_nodes for g in self.graphs)
        compiled = sum(g.compiled_nodes for g in self.graphs if g.compiled)
        return compiled / nodes if nodes else 1.0

    def __str__(self) -> str:
        lines = [f"ember.explain: {self.graph_count} graph(s), "
                 f"{len(self.graph_breaks)} graph break(s), "
                 f"{self.compiled_flop_share:.1%} of FLOPs compiled by ember"]
        for i, reason in enumerate(self.graph_breaks):
            lines.append(f"  graph break {i + 1}: {reason}")
        lines += [format_graph_report(g) for g in self.graphs]
        return "\n".join(lines)


def format_graph_report(report: GraphReport) -> str:
    if not report.compiled:
        return f"  graph {report.index}: runs in PyTorch: {report.reason}"
    share = report.flops_compiled / report.flops_total if report.flops_total else 1.0
    lines = [f"  graph {report.index}: {report.compiled_nodes}/{report.compute_nodes} ATen "
             f"ops compiled in {report.kernels} ember part(s); {share:.1%} of its FLOPs"]
    for fallback in report.fallbacks:
        lines.append(f"    fell back: {fallback.op} ({fallback.node}): {fallback.reason}")
    for reason in report.recompiles:
        lines.append(f"    recompiled: {reason}")
    return "\n".join(lines)


def explain(model: Any, *inputs: Any, **kwargs: Any) -> Explanation:
    """Compile ``model`` with the ember backend, run it once on ``inputs``, and report
    graph breaks, fallbacks and the share of FLOPs compiled."""
    import torch
    import torch._dynamo

    # Inference, as the backend compiles it: without autograd.
    with torch.no_grad():
        torch._dynamo.reset()
        dynamo = torch._dynamo.explain(model)(*inputs, **kwargs)
        breaks = [f"{b.reason} ({_where(b)})" for b in dynamo.break_reasons]
        torch._dynamo.reset()
        start = len(REPORTS)
        torch.compile(model, backend=ember_backend)(*inputs, **kwargs)
    return Explanation(graph_count=dynamo.graph_count, graph_breaks=breaks,
                       graphs=REPORTS.since(start))


def _where(reason: Any) -> str:
    stack = getattr(reason, "user_stack", None)
    if stack:
        frame = stack[-1]
        return f"{frame.filename}:{frame.lineno}"
    return "unknown location"
