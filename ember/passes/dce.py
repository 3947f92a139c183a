"""Dead-code elimination: drop nodes and constants that no graph output depends on."""

from __future__ import annotations

from ember.ir.graph import Graph, Node


def eliminate_dead_code(graph: Graph) -> int:
    """Remove dead nodes and unused constants in place; returns how many nodes went."""
    kept, live = _live_nodes(graph)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = kept
    for name in list(graph.constants):
        if name not in live:
            del graph.constants[name]
    return removed


def live_values(graph: Graph) -> set[str]:
    """The values some graph output depends on (a value read only by dead nodes is dead)."""
    return _live_nodes(graph)[1]


def _live_nodes(graph: Graph) -> tuple[list[Node], set[str]]:
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(i for i in node.inputs if i)
            live.update(node.implicit_inputs())
    return list(reversed(kept)), live
