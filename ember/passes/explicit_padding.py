"""Move a convolution's zero padding, and a max pool's, into a separate Pad node.

A padded convolution must test every tap against the borders, which turns its input loads
into clamped gathers; padding the input once (a cheap copy into the workspace) leaves a
convolution whose loads are affine and vectorize.  This is what libraries do too (or they
handle borders in separate loops).  Only explicit ``pads`` are moved (``auto_pad=NOTSET``),
and not those of depthwise convolutions that stride or whose images are small: their
borders cost less to test than a copy of their input (``_tests_its_own_borders``).

A MaxPool's padding is the same with a value that never wins a maximum (NaN, which its
maximum ignores; -inf for PyTorch's NaN-propagating pool), and every window holds at least
one input element, since pads are smaller than the kernel: ResNet's
stem pool went from 7.5 ms of clamped, unvectorized gathers to a plain strided maximum.  Only
pools whose result cannot tell the difference are rewritten: float, ``ceil_mode=0`` (else
windows run past the padded input), and no ``Indices`` output (it would count the padding).
"""

from __future__ import annotations

import math

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType


# What the padding holds, per op: the value that leaves the op's result unchanged.
_PAD_VALUE = {"Conv": 0.0, "MaxPool": -np.inf}

# A depthwise convolution with at most this many output pixels per channel keeps its padding
# (see _tests_its_own_borders).
BORDER_TESTS_MAX_PIXELS = 256


def _pad_value(node: Node) -> float:
    """What the padding of ``node`` holds.  A MaxPool ignores NaN (ONNX Runtime and the
    reference do: ``ember/ops/pool.py``), so NaN is the value that never wins and leaves a
    window of NaNs NaN (-inf would make it -inf); PyTorch's pool (``propagate_nan``) lets a
    NaN win, so there -inf is the neutral value."""
    if node.op == "MaxPool" and not node.attrs.get("propagate_nan", 0):
        return float("nan")
    return _PAD_VALUE[node.op]


def _tests_its_own_borders(node: Node, graph: Graph, x_type: TensorType) -> bool:
    """Whether ``node`` is a depthwise convolution (one output channel per input channel)
    that keeps its padding: one that strides or whose output is small
    (``BORDER_TESTS_MAX_PIXELS``).  Its kernel then tests the
    borders -- split off into loops of their own by ``partition_guarded_loops``, the
    interior is the same code as over a padded input -- instead of reading a copy: a Pad
    kernel over a depthwise convolution's input is a pass over a tensor as large as the
    convolution's own work, whose fixed cost dominates small images.  Measured per op (Zen
    4, with the Clip after it; padded copy + convolution against border tests): 96 channels
    at 112x112 stride 2 273 vs 195 us, 144 at 56x56 stride 2 116 vs 80, 384 at 14x14 128 vs
    46, 576 at 14x14 93 vs 51; at stride 1 over 28x28 and 56x56 the copy wins (92 vs 110,
    118 vs 197 us: the padded input's rows run as whole vector loops, 56 columns against
    the 54 between two border columns -- measured, not yet explained further).
    MobileNetV2 at batch 1 5.30 -> 4.93 ms."""
    group = node.attrs.get("group", 1)
    weights = graph.types.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if node.op != "Conv" or group == 1 or group != x_type.shape[1] or \
            not isinstance(weights, TensorType) or weights.shape[0] != group:
        return False  # (not one output channel per input channel)
    if max(node.attrs.get("strides") or [1]) > 1:
        return True
    out_type = graph.types.get(node.outputs[0])
    return isinstance(out_type, TensorType) and out_type.is_static and \
        math.prod(out_type.shape[2:]) <= BORDER_TESTS_MAX_PIXELS


def make_padding_explicit(graph: Graph) -> int:
    """Rewrite in place; returns how many convolutions and pools were changed."""
    changed = 0
    new_nodes: list[Node] = []
    for node in graph.nodes:
        pads = node.attrs.get("pads")
        if node.op not in _PAD_VALUE or not pads or not any(pads) or \
                node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") or \
                (node.op == "MaxPool" and (node.attrs.get("ceil_mode", 0) or
                                           len([o for o in node.outputs if o]) > 1)):
            new_nodes.append(node)
            continue
        x_type = graph.types.get(node.inputs[0])
        if not isinstance(x_type, TensorType) or not x_type.is_static or \
                not x_type.dtype.is_float:
            new_nodes.append(node)
            continue
        if _tests_its_own_borders(node, graph, x_type):
            new_nodes.append(node)
            continue
        spatial = len(pads) // 2
        full_pads = [0, 0] + list(pads[:spatial]) + [0, 0] + list(pads[spatial:])
        padded = graph.fresh_name(f"{node.inputs[0]}_padded")
        pads_name = graph.add_constant(np.asarray(full_pads, dtype=np.int64),
                                       hint=f"{node.name or 'conv'}_pads")
        value = graph.add_constant(np.asarray(_pad_value(node), dtype=x_type.dtype.numpy),
                                   hint=f"{node.name or 'conv'}_pad_value")
        new_nodes.append(Node("Pad", [node.inputs[0], pads_name, value], [padded],
                              {"mode": "constant"}, name=f"{node.name or 'conv'}_pad"))
        # (sizes as the type has them: one a traced build takes at run time stays one)
        shape = tuple(d + (pads[i - 2] + pads[i - 2 + spatial] if i >= 2 else 0)
                      for i, d in enumerate(x_type.shape))
        graph.types[padded] = TensorType(x_type.dtype, shape)
        attrs = dict(node.attrs)
        attrs.pop("pads")
        new_nodes.append(Node(node.op, [padded] + node.inputs[1:], node.outputs, attrs,
                              name=node.name, domain=node.domain))
        changed += 1
    graph.nodes = new_nodes
    return changed
