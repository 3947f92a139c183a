"""Recognize layer normalization written as reductions and replace it by
``LayerNormalization``.

Before opset 17 every exporter wrote layer normalization out, and TF/Keras converters still
do, in a handful of arrangements::

    m = ReduceMean(x, axes, keepdims=1)             mean over the trailing axes
    d = x - m
    v = ReduceMean(d ** 2, axes)                    or ReduceMean(d * d, axes)
    s = Sqrt(v + eps)                               or (v + eps) ** 0.5
    n = d / s                                       or d * Reciprocal(s)
    y = n * gamma + beta                            gamma and beta optional

which is ``LayerNormalization(x, gamma, beta, axis, epsilon)``: one kernel instead of eight
or ten, and statistics that accumulate in double precision.  The axes must be the trailing
ones (LayerNormalization normalizes over ``[axis, rank)``), the same for both means; epsilon
may be a scalar or one-element tensor on either side of the Add; gamma and beta may be
constants or computed values of the same type as x that broadcast over the normalized axes
only.  Without gamma the scale is a constant of ones.  Float64 inputs keep float64 statistics
(``stash_type``); others compute them in float32, as the op specifies.

Nothing else may read the intermediate values (a model that also outputs the variance keeps
its ops).
"""

from __future__ import annotations

import numpy as np

from ember.core.dtypes import DType
from ember.ir.graph import Graph, Node
from ember.passes.patterns import (AnyOf, Constant, Op, Rewrite, Value, any_scalar,
                                   match, rewrite_matches, scalar)
from ember.passes.rewrite import GraphIndex, same_type


def _keepdims(attrs: dict) -> bool:
    return attrs.get("keepdims") == 1


def _int_array(array: np.ndarray) -> bool:
    return array.dtype.kind in "iu" and array.size >= 1


_X = Value("x")
_MEAN = Op("ReduceMean", _X, Constant("mean_axes", _int_array), attrs=_keepdims, name="mean")
_CENTERED = Op("Sub", _X, _MEAN, name="centered")
_SQUARE = AnyOf(Op("Pow", _CENTERED, Constant(check=scalar(2.0))),
                Op("Mul", _CENTERED, _CENTERED))
_VARIANCE = Op("ReduceMean", _SQUARE, Constant("var_axes", _int_array), attrs=_keepdims)
_SHIFTED = Op("Add", _VARIANCE, Constant("epsilon", any_scalar))
_STD = AnyOf(Op("Sqrt", _SHIFTED), Op("Pow", _SHIFTED, Constant(check=scalar(0.5))))
NORMALIZED = AnyOf(Op("Div", _CENTERED, _STD), Op("Mul", _CENTERED, Op("Reciprocal", _STD)))


def recognize_layer_norm(graph: Graph) -> int:
    """Replace written-out layer normalization by LayerNormalization nodes; returns how many."""
    return rewrite_matches(graph, ("Div", "Mul"), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    found = match(NORMALIZED, index, node.outputs[0])
    if found is None:
        return None
    x = found.values["x"]
    x_type = index.tensor_type(x)
    if x_type is None or x_type.shape is None or not x_type.dtype.is_float:
        return None
    rank = len(x_type.shape)
    axes = _trailing_axes(found.constants["mean_axes"], rank)
    if axes is None or _trailing_axes(found.constants["var_axes"], rank) != axes:
        return None
    count = rank - axes
    scale, bias, root, extra = _affine_tail(index, found.root, x_type.dtype, count)
    found.root = root
    for tail in extra:
        found = found.cover(tail)
    if not found.is_private(index) or not same_type(index.type_of(root), x_type):
        return None
    graph = index.graph
    if scale is None:
        normalized_shape = x_type.shape[axes:]
        if not all(isinstance(d, int) for d in normalized_shape):
            return None
        scale = graph.add_constant(np.ones(normalized_shape, dtype=x_type.dtype.numpy),
                                   hint=f"{node.name or 'layer_norm'}_scale")
    attrs = {"axis": axes, "epsilon": found.scalar("epsilon")}
    if x_type.dtype == DType.FLOAT64:
        attrs["stash_type"] = DType.FLOAT64.onnx
    inputs = [x, scale] + ([bias] if bias is not None else [])
    return Rewrite(found, [Node("LayerNormalization", inputs, [root], attrs,
                                name=node.name or "layer_norm")])


def _trailing_axes(array: np.ndarray, rank: int) -> int | None:
    """The first axis if ``array`` lists the trailing axes ``[a, rank)``, else None."""
    values = [int(a) for a in array.reshape(-1)]
    if not rank or any(not -rank <= a < rank for a in values):
        return None
    axes = sorted({a % rank for a in values})
    if len(axes) != len(values) or axes != list(range(axes[0], rank)):
        return None
    return axes[0]


def _affine_tail(index: GraphIndex, normalized: str, dtype: DType, count: int
                 ) -> tuple[str | None, str | None, str, list[Node]]:
    """The ``* gamma + beta`` after the normalization, as far as it is there: (gamma, beta,
    the value that ends it, the Mul/Add nodes taken)."""
    taken: list[Node] = []
    end = normalized
    found: dict[str, str | None] = {}
    for op, what in (("Mul", "scale"), ("Add", "bias")):
        found[what] = None
        reader = index.sole_reader(end)
        if reader is None or reader.op != op or reader.domain or len(reader.inputs) != 2:
            continue
        other = reader.inputs[1] if reader.inputs[0] == end else reader.inputs[0]
        parameter = _parameter(index.graph, index, other, dtype, count, what)
        if parameter is not None and other != end:
            found[what] = parameter
            taken.append(reader)
            end = reader.outputs[0]
    return found["scale"], found["bias"], end, taken


def _parameter(graph: Graph, index: GraphIndex, name: str, dtype: DType, count: int,
               what: str) -> str | None:
    """``name`` as a LayerNormalization scale/bias over the last ``count`` axes: as is when it
    has at most ``count`` dims, a reshaped constant when its extra leading dims are 1."""
    vtype = index.tensor_type(name)
    if vtype is None or vtype.dtype != dtype or vtype.shape is None:
        return None
    if len(vtype.shape) <= count:
        return name
    leading = vtype.shape[:len(vtype.shape) - count]
    value = index.constant(name)
    if value is None or any(d != 1 for d in leading):
        return None
    return graph.add_constant(value.reshape(value.shape[len(leading):]),
                              hint=f"{name}_{what}")
