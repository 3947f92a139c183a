"""Fold inference-mode BatchNormalization into the convolution or Gemm that feeds it.

``BN(conv(x, W) + b) = conv(x, W * s) + (b - mean) * s + beta`` with
``s = gamma / sqrt(var + eps)`` per output channel, so the BatchNormalization node disappears
and the convolution's weights absorb it.  Applies when the weights and every BN parameter are
constants, the convolution's output feeds only the BN, and BN runs in inference mode.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.passes.dce import eliminate_dead_code


def fold_batchnorm(graph: Graph) -> int:
    """Fold in place; returns how many BatchNormalization nodes were folded."""
    producers = graph.producers()
    readers = _reader_counts(graph)
    folded = 0
    for bn in list(graph.nodes):
        if bn.op != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1:
            continue
        if bn.attrs.get("training_mode", 0):
            continue
        conv = producers.get(bn.inputs[0])
        if conv is None or conv.op != "Conv" or readers.get(bn.inputs[0], 0) != 1:
            continue
        if bn.inputs[0] in graph.outputs:
            continue
        params = [graph.constants.get(name) for name in bn.inputs[1:5]]
        weight = graph.constants.get(conv.inputs[1])
        bias = graph.constants.get(conv.inputs[2]) if len(conv.inputs) > 2 and \
            conv.inputs[2] else None
        if weight is None or any(p is None for p in params) or \
                (len(conv.inputs) > 2 and conv.inputs[2] and bias is None):
            continue
        if weight.dtype.kind != "f":
            continue
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        new_weight = (weight.astype(np.float64) *
                      scale.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
        old_bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
        new_bias = ((old_bias - mean) * scale + beta).astype(weight.dtype)
        w_name = graph.add_constant(new_weight, hint=f"{conv.name or 'conv'}_w_bn")
        b_name = graph.add_constant(new_bias, hint=f"{conv.name or 'conv'}_b_bn")
        _rewire(graph, conv, bn, w_name, b_name)
        folded += 1
    if folded:
        eliminate_dead_code(graph)
    return folded


def _reader_counts(graph: Graph) -> dict[str, int]:
    """How many nodes read each value, counting a node whose subgraphs read it by name (an
    If/Loop body using the convolution's output keeps the unfolded output alive)."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        for name in set(n for n in node.inputs if n) | set(node.implicit_inputs()):
            counts[name] = counts.get(name, 0) + 1
    return counts


def _rewire(graph: Graph, conv: Node, bn: Node, weight: str, bias: str) -> None:
    """The convolution takes the folded parameters and produces the BN's output."""
    inputs = list(conv.inputs) + [""] * (3 - len(conv.inputs))
    inputs[1], inputs[2] = weight, bias
    conv.inputs = inputs
    old_output = conv.outputs[0]
    conv.outputs = [bn.outputs[0]]
    graph.nodes.remove(bn)
    graph.types.pop(old_output, None)
