"""Linear anchors: Conv, Gemm and MatMul nodes whose output channels come from constant
weights, and the per-channel scale and shift they can absorb.

``y = conv(x, W) + b`` computes each output channel ``c`` from the slice ``W[c]`` and adds
``b[c]``; so ``y * s + t`` with ``s`` and ``t`` constant per channel is ``conv(x, W * s) + (b * s
+ t)``: the scale goes into the weights and the bias, the shift into the bias, and the Mul and
Add nodes disappear.  The same holds for Gemm (channels are the columns of ``op(B)``, the bias
is ``beta * C``) and for MatMul with a constant 2-D right operand (channels are its columns;
its bias is the constant operand of an ``Add`` that follows it alone).  Batch-norm folding and
scale/bias folding share this module.

The folded constants are computed in float64 and rounded once to the weights' type, so the
result differs from the unfolded graph by rounding only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.passes.rewrite import GraphIndex


@dataclass
class Linear:
    """An anchor with constant weights, seen as ``y[..., c, ...] = (x * W[c]) + bias[c]``.

    ``node`` is the Conv/Gemm/MatMul; ``bias_add`` the Add that carries a MatMul's bias (its
    output is then the anchor's output, ``output``).  ``out_axis`` is the output axis that
    indexes channels, ``weight_axis`` the weight axis that does.
    """

    node: Node
    output: str
    weight: np.ndarray
    weight_axis: int
    out_axis: int
    channels: int
    bias_add: Node | None = None

    @property
    def kind(self) -> str:
        return self.node.op


def linear_of(index: GraphIndex, value: str, with_bias_add: bool = True) -> Linear | None:
    """The linear anchor producing ``value`` (a Conv, Gemm or MatMul with constant float
    weights, or -- ``with_bias_add`` -- a MatMul followed by a constant bias Add that it
    alone feeds), or None."""
    node = index.producer.get(value)
    if node is None or node.domain:
        return None
    out_type = index.tensor_type(value)
    if out_type is None or out_type.shape is None or not out_type.dtype.is_float:
        return None
    if node.op == "Add" and len(node.inputs) == 2:
        if not with_bias_add:  # only one bias Add: a chain of Adds is not looked through
            return None
        for position in (0, 1):
            inner = linear_of(index, node.inputs[position], with_bias_add=False)
            bias = index.constant(node.inputs[1 - position])
            if inner is None or inner.kind != "MatMul" or inner.bias_add is not None or \
                    bias is None or index.sole_reader(inner.output) is not node:
                continue
            if channel_vector(bias, out_type, inner.out_axis, inner.channels) is None:
                continue
            inner_type = index.tensor_type(inner.output)
            if inner_type is None or inner_type.shape != out_type.shape:
                continue
            inner.bias_add, inner.output = node, value
            return inner
        return None
    weight = index.constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or weight.dtype.kind != "f" or weight.dtype != out_type.dtype.numpy:
        return None
    rank = len(out_type.shape)
    if node.op == "Conv":
        if weight.ndim < 3 or rank < 3 or not _constant_or_absent(index, node, 2):
            return None
        return Linear(node, value, weight, 0, 1, weight.shape[0])
    if node.op == "Gemm":
        if weight.ndim != 2 or not _constant_or_absent(index, node, 2):
            return None
        axis = 0 if node.attrs.get("transB", 0) else 1
        return Linear(node, value, weight, axis, 1, weight.shape[axis])
    if node.op == "MatMul":
        if weight.ndim != 2 or rank < 1:
            return None
        return Linear(node, value, weight, 1, rank - 1, weight.shape[1])
    return None


def _constant_or_absent(index: GraphIndex, node: Node, position: int) -> bool:
    return len(node.inputs) <= position or not node.inputs[position] or \
        index.constant(node.inputs[position]) is not None


def channel_vector(value: np.ndarray, out_type: TensorType, axis: int,
                   channels: int) -> np.ndarray | None:
    """``value`` as one number per channel (float64, length ``channels``) if, broadcast
    against an output of ``out_type``, it varies along the channel ``axis`` only and does not
    enlarge the output; else None."""
    if out_type.shape is None or value.dtype.kind not in "fiu":
        return None
    rank = len(out_type.shape)
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + tuple(value.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis):
        return None
    if shape[axis] not in (1, channels) or out_type.shape[axis] != channels:
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,)).copy()


def scale_channels(graph: Graph, linear: Linear, scale: np.ndarray) -> None:
    """Multiply every output channel ``c`` of ``linear`` by ``scale[c]`` (weights and bias)."""
    node, dtype = linear.node, linear.weight.dtype
    shape = [1] * linear.weight.ndim
    shape[linear.weight_axis] = linear.channels
    weight = (linear.weight.astype(np.float64) * scale.reshape(shape)).astype(dtype)
    node.inputs[1] = graph.add_constant(weight, hint=f"{node.name or node.op.lower()}_w")
    if linear.bias_add is not None:
        _set_bias_add(graph, linear, lambda bias: bias * scale)
    elif node.op in ("Conv", "Gemm") and _has_input(node, 2):
        # Conv's bias is [C]; Gemm's C broadcasts against [M, C], so it scales along its
        # last axis ([C], [1, C], [M, C], [M, 1] and scalars alike).
        bias = np.asarray(_constant_node_value(graph, node.inputs[2]), dtype=np.float64)
        node.inputs[2] = graph.add_constant((bias * scale).astype(dtype),
                                            hint=f"{node.name or node.op.lower()}_b")


def shift_channels(graph: Graph, linear: Linear, shift: np.ndarray) -> bool:
    """Add ``shift[c]`` to every output channel ``c``; False (nothing changed) for a MatMul
    without a bias Add, which has nowhere to put it."""
    node, dtype = linear.node, linear.weight.dtype
    if linear.bias_add is not None:
        _set_bias_add(graph, linear, lambda bias: bias + shift)
        return True
    if node.op == "MatMul":
        return False
    inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
    old = np.zeros(()) if not inputs[2] else \
        np.asarray(_constant_node_value(graph, inputs[2]), dtype=np.float64)
    if node.op == "Gemm":
        beta = float(node.attrs.get("beta", 1.0))
        new = beta * old + shift  # broadcasts along the columns, as C does
        node.attrs = {**node.attrs, "beta": 1.0}
    else:
        new = old + shift
    inputs[2] = graph.add_constant(np.asarray(new).astype(dtype),
                                   hint=f"{node.name or node.op.lower()}_b")
    node.inputs = inputs
    return True


def _has_input(node: Node, position: int) -> bool:
    return len(node.inputs) > position and bool(node.inputs[position])


def _constant_node_value(graph: Graph, name: str) -> np.ndarray:
    from ember.passes.rewrite import constant_value

    value = constant_value(graph, name)
    assert value is not None, f"'{name}' is not a constant"
    return value


def _set_bias_add(graph: Graph, linear: Linear, update) -> None:
    """Replace the constant operand of a MatMul's bias Add by ``update(old per-channel
    vector)``, keeping the operand's original shape."""
    add = linear.bias_add
    assert add is not None
    position = 0 if add.inputs[1] == linear.node.outputs[0] else 1
    old = _constant_node_value(graph, add.inputs[position])
    vector = np.broadcast_to(old.reshape(-1).astype(np.float64), (linear.channels,))
    shape = (1,) * (old.ndim - 1) + (linear.channels,) if old.ndim else (linear.channels,)
    new = update(vector).reshape(shape).astype(old.dtype)
    inputs = list(add.inputs)
    inputs[position] = graph.add_constant(new, hint=f"{add.name or 'bias'}_b")
    add.inputs = inputs
