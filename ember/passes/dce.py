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
            for sub in node.subgraphs():
                live.update(_free_names(sub))
    removed = len(graph.nodes) - len(kept)
    graph.nodes = list(reversed(kept))
    for name in list(graph.constants):
        if name not in live:
            del graph.constants[name]
    return removed


def _free_names(graph: Graph) -> set[str]:
    """Names a subgraph reads from enclosing scopes."""
    defined = set(graph.inputs) | set(graph.constants)
    free: set[str] = set()
    for node in graph.nodes:
        free.update(i for i in node.inputs if i and i not in defined)
        for sub in node.subgraphs():
            free.update(n for n in _free_names(sub) if n not in defined)
        defined.update(o for o in node.outputs if o)
    free.update(o for o in graph.outputs if o not in defined)
    return free
