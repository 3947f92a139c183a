"""Fold constant per-channel Mul/Div/Add/Sub after a Conv, Gemm or MatMul into its weights.

Models apply a per-channel affine map after a linear op more often than it seems: a layer
scale (``x * gamma`` in ConvNeXt/CaiT), a folded normalization exported as Mul and Add, a
``Div`` by a temperature, a second bias, an attention-score scale applied to a projection.
With ``y = linear(x)`` computed from constant weights, ``y * s`` and ``y + t`` for constants
varying only along the output channel are absorbed by the weights and the bias
(:mod:`ember.passes.anchors`) and the Mul/Add node disappears:

* Conv: channels along axis 1 (``s`` shaped [C, 1, 1], [1, C, 1, 1], [1] or a scalar);
* Gemm: channels along the columns; the shift becomes the new ``C`` (and ``beta`` 1);
* MatMul with a constant 2-D right operand: channels along the last axis; a scale goes into
  the weights (and into the bias of an Add that follows the MatMul alone), a shift only into
  such a bias Add, since MatMul has no bias of its own.

Only when exact up to rounding: the constant must broadcast per output channel without
enlarging the output, the anchor's output must have no other reader (and not be a graph
output), and weights must be float.  Division folds as multiplication by the reciprocal;
``c - y`` and ``c / y`` do not fold.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.passes.anchors import channel_vector, linear_of, scale_channels, shift_channels
from ember.passes.rewrite import GraphIndex, remove_and_replace, same_type

_FOLDABLE = ("Mul", "Div", "Add", "Sub")


def fold_scale_bias(graph: Graph) -> int:
    """Fold per-channel constant Mul/Div/Add/Sub into linear anchors; returns how many."""
    folded = 0
    progress = True
    while progress:
        progress = False
        index = GraphIndex(graph)
        for node in list(graph.nodes):
            if node.op in _FOLDABLE and not node.domain and _fold(graph, index, node):
                folded += 1
                progress = True
                break
    return folded


def _fold(graph: Graph, index: GraphIndex, node: Node) -> bool:
    """Fold ``node`` into the anchor before it (``index`` describes the graph as it is)."""
    if len(node.inputs) != 2 or not node.outputs[0]:
        return False
    # The anchor's output on the left; a constant on the right (or either side for Mul/Add).
    positions = (0, 1) if node.op in ("Mul", "Add") else (0,)
    for position in positions:
        y, c = node.inputs[position], node.inputs[1 - position]
        constant = index.constant(c)
        if constant is None or y == c:
            continue
        linear = linear_of(index, y)
        if linear is None or index.sole_reader(y) is not node:
            continue
        y_type = index.tensor_type(y)
        if y_type is None or not same_type(index.type_of(node.outputs[0]), y_type):
            continue
        vector = channel_vector(constant, y_type, linear.out_axis, linear.channels)
        if vector is None or not np.all(np.isfinite(vector)):
            continue
        if not _apply(graph, node, linear, vector):
            continue
        replaced = remove_and_replace(graph, node, {node.outputs[0]: y})
        assert replaced, "y is not a graph output, so its producer can take the name"
        return True
    return False


def _apply(graph: Graph, node: Node, linear, vector: np.ndarray) -> bool:
    if node.op == "Mul":
        scale_channels(graph, linear, vector)
        return True
    if node.op == "Div":
        if np.any(vector == 0):
            return False
        scale_channels(graph, linear, 1.0 / vector)
        return True
    shift = vector if node.op == "Add" else -vector
    return shift_channels(graph, linear, shift)
