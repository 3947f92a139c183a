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
from ember.passes.patterns import Op, Product, Rewrite, Value, match, rewrite_matches
from ember.passes.rewrite import GraphIndex, same_type

_X = Value("x")
SWISH = Product(_X, Op("Sigmoid", Product(_X, scale=None, scale_name="alpha")))


def recognize_swish(graph: Graph) -> int:
    """Replace ``x * sigmoid(alpha * x)`` by Swish nodes; returns how many."""
    return rewrite_matches(graph, ("Mul",), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    found = match(SWISH, index, root)
    if found is None or not found.is_private(index):
        return None
    x = found.values["x"]
    x_type = index.tensor_type(x)
    if x_type is None or not x_type.dtype.is_float or \
            not same_type(index.type_of(root), x_type):
        return None
    alpha = found.scales["alpha"]
    attrs = {} if alpha == 1.0 else {"alpha": alpha}
    return Rewrite(found, [Node("Swish", [x], [root], attrs, name=node.name or "swish")])
