"""Recognize GELU written as elementwise ops and replace it by one ``Gelu`` node.

Before ONNX had Gelu (opset 20) every exporter wrote it out, and many still do::

    erf form:   0.5 * x * (1 + erf(x / sqrt(2)))                          -> Gelu(x)
    tanh form:  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))   -> Gelu(x, tanh)

in any association and operand order (``x * 0.5 * (...)``, ``(x * (...)) * 0.5``,
``x * (...) / 2``), with ``x / sqrt(2)`` or ``x * (1/sqrt(2))``, ``x**3`` as ``Pow(x, 3)`` or
``x * x * x``, and constants as initializers or Constant nodes, scalars or one-element
tensors.  Seven or nine kernels (each a pass over memory) become one.

The rewrite applies only when nothing else reads the intermediate values and the result has
x's type, so the Gelu node computes exactly the value its pattern did, up to rounding.
"""

from __future__ import annotations

import math

from ember.ir.graph import Graph, Node
from ember.passes.patterns import (AnyOf, Constant, Op, Product, Rewrite, Value,
                                   match_float_map, rewrite_matches, scalar)
from ember.passes.rewrite import GraphIndex

_X = Value("x")
_ONE = Constant(check=scalar(1.0))

ERF_FORM = Product(_X, Op("Add", _ONE, Op("Erf", Product(_X, scale=1 / math.sqrt(2)))),
                   scale=0.5)

_CUBE_TERM = AnyOf(Product(Op("Pow", _X, Constant(check=scalar(3.0))), scale=0.044715),
                   Product(_X, _X, _X, scale=0.044715))
TANH_FORM = Product(_X, Op("Add", _ONE, Op("Tanh", Product(Op("Add", _X, _CUBE_TERM),
                                                           scale=math.sqrt(2 / math.pi)))),
                    scale=0.5)


def recognize_gelu(graph: Graph) -> int:
    """Replace erf- and tanh-form GELU subgraphs by Gelu nodes; returns how many."""
    return rewrite_matches(graph, ("Mul", "Div"), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    for pattern, approximate in ((ERF_FORM, "none"), (TANH_FORM, "tanh")):
        matched = match_float_map(pattern, index, root)
        if matched is None:
            continue
        x = matched[0].values["x"]
        attrs = {} if approximate == "none" else {"approximate": "tanh"}
        return Rewrite(matched[0], [Node("Gelu", [x], [root], attrs, name=node.name or "gelu")])
    return None
