"""Recognize HardSwish written out and replace it by one ``HardSwish`` node.

MobileNetV3-style models export ``nn.Hardswish`` (before opset 14, or through other tools) as

    x * HardSigmoid(x, alpha=1/6, beta=0.5)
    x * Clip(x + 3, 0, 6) / 6            (the ReLU6 form, in any association)

both of which are ONNX's ``HardSwish(x) = x * max(0, min(1, x/6 + 1/2))``.  The rewrite
applies when nothing else reads the intermediate values and the result has x's type.
"""

from __future__ import annotations

from ember.ir.graph import Graph, Node
from ember.passes.patterns import (AnyOf, Constant, Op, Product, Rewrite, Value, close_to,
                                   match_float_map, rewrite_matches, scalar)
from ember.passes.rewrite import GraphIndex

_X = Value("x")


def _is_hard_sigmoid_of_hard_swish(attrs: dict) -> bool:
    return close_to(attrs["alpha"], 1 / 6) and close_to(attrs["beta"], 0.5)


HARD_SWISH = AnyOf(
    Product(_X, Op("HardSigmoid", _X, attrs=_is_hard_sigmoid_of_hard_swish)),
    Product(_X, Op("Clip", Op("Add", _X, Constant(check=scalar(3.0))),
                   Constant(check=scalar(0.0)), Constant(check=scalar(6.0))), scale=1 / 6),
)


def recognize_hard_swish(graph: Graph) -> int:
    """Replace written-out HardSwish by HardSwish nodes; returns how many."""
    return rewrite_matches(graph, ("Mul", "Div"), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    matched = match_float_map(HARD_SWISH, index, root)
    if matched is None:
        return None
    found, _ = matched
    x = found.values["x"]
    return Rewrite(found, [Node("HardSwish", [x], [root], name=node.name or "hard_swish")])
