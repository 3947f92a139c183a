"""Constant folding: evaluate nodes whose inputs are all known at compile time.

A node folds when every input is a constant, or when it only asks for metadata that the
static types already answer (``Shape``, ``Size`` of a statically shaped tensor).  Its outputs
become graph constants and the node disappears.  Folding uses each op's numpy reference, so it
is exact by construction.  Large results are not folded (they would bloat the weights) unless
their inputs were just as large.
"""

from __future__ import annotations

import numpy as np

from ember.core.errors import EmberError
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import RefContext, get_op

# Folding these on constant inputs is never worth it or not meaningful.
_NEVER_FOLD = {"If", "Loop", "Scan", "SequenceMap"}
_MAX_GROWTH_ELEMENTS = 1 << 20


def fold_constants(graph: Graph) -> int:
    """Fold in place; returns the number of nodes folded."""
    folded = 0
    kept: list[Node] = []
    for node in graph.nodes:
        values = _try_fold(graph, node)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values):
            if name:
                graph.constants[name] = value
        folded += 1
    graph.nodes = kept
    return folded


def _try_fold(graph: Graph, node: Node) -> list[np.ndarray] | None:
    if node.op in _NEVER_FOLD or any(True for _ in node.subgraphs()):
        return None
    if node.op in ("Shape", "Size"):
        return _fold_metadata(graph, node)
    if not all((not name) or name in graph.constants for name in node.inputs):
        return None
    opdef = get_op(node.op)
    if opdef is None or not node.inputs:
        return None
    args = [graph.constants[name] if name else None for name in node.inputs]
    try:
        with np.errstate(all="ignore"):
            result = opdef.reference(RefContext(node, opdef, lambda *a: []), *args,
                                     **opdef.resolve_attrs(node))
    except EmberError:
        return None
    outputs = list(result) if isinstance(result, tuple) else [result]
    if not all(isinstance(o, np.ndarray) for o in outputs[:len(node.outputs)]):
        return None
    input_size = sum(np.asarray(a).size for a in args if a is not None)
    if sum(o.size for o in outputs) > max(_MAX_GROWTH_ELEMENTS, 4 * input_size):
        return None
    return outputs


def _fold_metadata(graph: Graph, node: Node) -> list[np.ndarray] | None:
    vtype = graph.types.get(node.inputs[0])
    if not isinstance(vtype, TensorType) or not vtype.is_static:
        return None
    opdef = get_op(node.op)
    attrs = opdef.resolve_attrs(node) if opdef else {}
    dummy = np.lib.stride_tricks.as_strided(np.zeros(1, vtype.dtype.numpy), shape=vtype.shape,
                                            strides=(0,) * len(vtype.shape))
    result = opdef.reference(RefContext(node, opdef, lambda *a: []), dummy, **attrs)
    return [np.asarray(result)]
