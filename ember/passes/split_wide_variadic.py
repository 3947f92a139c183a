"""Split a Concat, Sum, Max, Min or Mean of many inputs into a tree of at most
:data:`MAX_VARIADIC_INPUTS` inputs per node.

A variadic node is one kernel that reads every input for every output element: a Concat as
a tree of selects on the position (every piece's load masked to its own range), a Sum as a
tree of additions.  That is cheap for the usual two to eight inputs; with a thousand (a
model that gathers per-item branches), the kernel takes a thousand pointers, a Concat's
every vector evaluates all pieces, and the C compiler spends minutes on the one
expression.  A tree of narrow nodes reads the data once more per level
(``ceil(log16(n))`` levels), keeps every kernel small, and leaves common nodes untouched.

The rewrites are exact up to the order of floating-point additions (a Sum of partial sums,
which is what the balanced expression of a wide Sum computes anyway); a Mean becomes a Sum
tree divided by the input count.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType

MAX_VARIADIC_INPUTS = 16
_SPLIT = ("Concat", "Sum", "Max", "Min", "Mean")


def split_wide_variadics(graph: Graph) -> int:
    """Rewrite in place; returns how many nodes were split."""
    changed = 0
    new_nodes: list[Node] = []
    for node in graph.nodes:
        if node.op not in _SPLIT or node.domain or len(node.inputs) <= MAX_VARIADIC_INPUTS \
                or any(not name for name in node.inputs) or len(node.outputs) != 1:
            new_nodes.append(node)
            continue
        out_type = graph.types.get(node.outputs[0])
        if node.op == "Mean" and not (isinstance(out_type, TensorType)
                                      and out_type.dtype.is_float):
            new_nodes.append(node)  # the divisor needs the element type
            continue
        partial_op = "Sum" if node.op == "Mean" else node.op
        pieces = _reduce_levels(graph, node, partial_op, list(node.inputs), new_nodes)
        if node.op == "Mean":
            total = graph.fresh_name(f"{node.outputs[0]}_sum")
            count = graph.add_constant(np.asarray(len(node.inputs),
                                                  dtype=out_type.dtype.numpy),
                                       hint=f"{node.name or 'mean'}_count")
            new_nodes.append(Node("Sum", pieces, [total], name=f"{node.name or 'mean'}_sum"))
            new_nodes.append(Node("Div", [total, count], list(node.outputs), name=node.name))
        else:
            new_nodes.append(Node(node.op, pieces, list(node.outputs), dict(node.attrs),
                                  name=node.name))
        changed += 1
    if changed:
        graph.nodes[:] = new_nodes
    return changed


def _reduce_levels(graph: Graph, node: Node, op: str, pieces: list[str],
                   new_nodes: list[Node]) -> list[str]:
    """Join ``pieces`` in chunks, level by level, until at most MAX_VARIADIC_INPUTS are left;
    the remaining pieces, in order (order matters to a Concat)."""
    level = 0
    while len(pieces) > MAX_VARIADIC_INPUTS:
        joined = []
        for start in range(0, len(pieces), MAX_VARIADIC_INPUTS):
            chunk = pieces[start:start + MAX_VARIADIC_INPUTS]
            if len(chunk) == 1:
                joined.append(chunk[0])
                continue
            part = graph.fresh_name(f"{node.outputs[0]}_part")
            new_nodes.append(Node(op, chunk, [part], dict(node.attrs),
                                  name=f"{node.name or op.lower()}_l{level}_{start}"))
            joined.append(part)
        pieces = joined
        level += 1
    return pieces
