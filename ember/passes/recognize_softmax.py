"""Recognize softmax written as ``Exp / ReduceSum(Exp)`` and replace it by ``Softmax``.

Exporters and hand-written models spell softmax out, with or without the subtraction of the
row maximum that keeps ``exp`` from overflowing::

    e = Exp(x - ReduceMax(x, [a], keepdims=1))      or   e = Exp(x)
    y = e / ReduceSum(e, [a], keepdims=1)           or   y = e * Reciprocal(ReduceSum(...))

Both are ``Softmax(x, axis=a)``; the one node computes the maximum, the exponentials and the
sum in one kernel (and always subtracts the maximum, so where the written-out form without it
overflowed to inf/NaN the Softmax gives the finite answer).  The reduction must be over one
axis, the same for the maximum and the sum, with ``keepdims``; nothing else may read the
intermediate values.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.passes.patterns import (AnyOf, Constant, Op, Rewrite, Value, match_float_map,
                                   rewrite_matches)
from ember.passes.rewrite import GraphIndex


def _keepdims(attrs: dict) -> bool:
    return attrs.get("keepdims") == 1


def _int_array(array: np.ndarray) -> bool:
    return array.dtype.kind in "iu" and array.size >= 1


_X = Value("x")
_EXP = Op("Exp", AnyOf(Op("Sub", _X, Op("ReduceMax", _X, Constant("max_axes", _int_array),
                                        attrs=_keepdims, name="max")),
                       _X), name="exp")
_SUM = Op("ReduceSum", _EXP, Constant("sum_axes", _int_array), attrs=_keepdims, name="sum")
SOFTMAX = AnyOf(Op("Div", _EXP, _SUM), Op("Mul", _EXP, Op("Reciprocal", _SUM)))


def recognize_softmax(graph: Graph) -> int:
    """Replace written-out softmax by Softmax nodes; returns how many."""
    return rewrite_matches(graph, ("Div", "Mul"), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    matched = match_float_map(SOFTMAX, index, root)
    if matched is None:
        return None
    found, x_type = matched
    if x_type.shape is None:
        return None
    rank = len(x_type.shape)
    axes = _axes(found.constants["sum_axes"], rank)
    if axes is None or len(axes) != 1:
        return None
    if "max" in found.nodes and _axes(found.constants["max_axes"], rank) != axes:
        return None
    return Rewrite(found, [Node("Softmax", [found.values["x"]], [root], {"axis": axes[0]},
                                name=node.name or "softmax")])


def _axes(array: np.ndarray, rank: int) -> list[int] | None:
    axes = sorted({int(a) % rank for a in array.reshape(-1)}) if rank else None
    if axes is None or any(not -rank <= int(a) < rank for a in array.reshape(-1)):
        return None
    return axes
