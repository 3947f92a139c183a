"""Recognize SiLU / Swish written as ``x * Sigmoid(alpha * x)`` and replace it by ``Swish``.

PyTorch exports ``nn.SiLU`` (EfficientNet, YOLO, the MLPs of LLaMA-style models) as
``Mul(x, Sigmoid(x))``; Keras' swish with a ``beta`` as ``x * sigmoid(beta * x)``.  ONNX
(opset 24) has the op: ``Swish(x, alpha) = x * sigmoid(alpha * x)``, SiLU being ``alpha = 1``,
and ember computes it in one kernel.  Operand order, association and the form of the
constants are free; the rewrite applies when nothing else reads the Sigmoid or the scaled
input and the result has x's type.
"""

from __future__ import annotations

from ember.ir.graph import Graph, Node
from ember.passes.patterns import Op, Product, Rewrite, Value, match_float_map, rewrite_matches
from ember.passes.rewrite import GraphIndex

_X = Value("x")
SWISH = Product(_X, Op("Sigmoid", Product(_X, scale=None, scale_name="alpha")))


def recognize_swish(graph: Graph) -> int:
    """Replace ``x * sigmoid(alpha * x)`` by Swish nodes; returns how many."""
    return rewrite_matches(graph, ("Mul",), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    matched = match_float_map(SWISH, index, root)
    if matched is None:
        return None
    found, _ = matched
    x = found.values["x"]
    alpha = found.scales["alpha"]
    attrs = {} if alpha == 1.0 else {"alpha": alpha}
    return Rewrite(found, [Node("Swish", [x], [root], attrs, name=node.name or "swish")])
