"""Fold inference-mode BatchNormalization into the Conv, Gemm or MatMul that feeds it.

``BN(y) = (y - mean) * s + beta`` with ``s = gamma / sqrt(var + eps)`` per channel (axis 1),
so for a linear anchor ``y`` with constant weights (:mod:`ember.passes.anchors`) the scale goes
into the weights and bias, the shift into the bias, and the BatchNormalization node
disappears: ``conv(x, W * s) + (b - mean) * s + beta``.  A MatMul has no bias of its own: its
BN becomes a bias ``Add`` (cheaper, and an epilogue the fusion pass can merge) unless an Add
bias follows it already.

Applies when the weights and every BN parameter are constants, BN runs in inference mode with
one output, its channel axis (1) is the anchor's channel axis, and the anchor's output feeds
only the BN (no other node, no subgraph, not a graph output).
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.passes.anchors import linear_of, scale_channels, shift_channels
from ember.passes.dce import eliminate_dead_code
from ember.passes.rewrite import GraphIndex, remove_and_replace


def fold_batchnorm(graph: Graph) -> int:
    """Fold in place; returns how many BatchNormalization nodes were folded."""
    folded = 0
    for bn in list(graph.nodes):
        if bn.op == "BatchNormalization" and not bn.domain and _fold(graph, bn):
            folded += 1
    if folded:
        eliminate_dead_code(graph)
    return folded


def _fold(graph: Graph, bn: Node) -> bool:
    if len([o for o in bn.outputs if o]) != 1 or not bn.outputs[0] or \
            bn.attrs.get("training_mode", 0):
        return False
    index = GraphIndex(graph)
    y = bn.inputs[0]
    linear = linear_of(index, y)
    if linear is None or linear.out_axis != 1 or index.sole_reader(y) is not bn:
        return False
    params = [index.constant(name) for name in bn.inputs[1:5]]
    if any(p is None or p.shape != (linear.channels,) for p in params):
        return False
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    shift = beta - mean * scale
    if not np.all(np.isfinite(scale)) or not np.all(np.isfinite(shift)):
        return False
    scale_channels(graph, linear, scale)
    if shift_channels(graph, linear, shift):
        return remove_and_replace(graph, bn, {bn.outputs[0]: linear.output})
    # A MatMul without a bias: the BN becomes the bias Add.
    y_type = index.tensor_type(y)
    assert y_type is not None and y_type.shape is not None
    shape = (linear.channels,) + (1,) * (len(y_type.shape) - 2)
    bias = graph.add_constant(shift.reshape(shape).astype(linear.weight.dtype),
                              hint=f"{bn.name or 'bn'}_bias")
    bn.op, bn.inputs, bn.attrs = "Add", [y, bias], {}
    return True
