"""Dead-code elimination: drop nodes and constants that no graph output depends on."""

from __future__ import annotations

from ember.ir.graph import Graph


def eliminate_dead_code(graph: Graph) -> int:
    """Remove dead nodes and unused constants in place; returns how many nodes went."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(i for i in node.inputs if i)
            live.update(node.implicit_inputs())
    removed = len(graph.nodes) - len(kept)
    graph.nodes = list(reversed(kept))
    for name in list(graph.constants):
        if name not in live:
            del graph.constants[name]
    return removed
