"""Move a convolution's zero padding, and a max pool's, into a separate Pad node.

A padded convolution must test every tap against the borders, which turns its input loads
into clamped gathers; padding the input once (a cheap copy into the workspace) leaves a
convolution whose loads are affine and vectorize.  This is what libraries do too (or they
handle borders in separate loops).  Only explicit ``pads`` are moved (``auto_pad=NOTSET``).

A MaxPool's padding is the same with a value that never wins a maximum (NaN, which its
maximum ignores; -inf for PyTorch's NaN-propagating pool), and every window holds at least
one input element, since pads are smaller than the kernel: ResNet's
stem pool went from 7.5 ms of clamped, unvectorized gathers to a plain strided maximum.  Only
pools whose result cannot tell the difference are rewritten: float, ``ceil_mode=0`` (else
windows run past the padded input), and no ``Indices`` output (it would count the padding).
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType


# What the padding holds, per op: the value that leaves the op's result unchanged.
_PAD_VALUE = {"Conv": 0.0, "MaxPool": -np.inf}


def _pad_value(node: Node) -> float:
    """What the padding of ``node`` holds.  A MaxPool ignores NaN (ONNX Runtime and the
    reference do: ``ember/ops/pool.py``), so NaN is the value that never wins and leaves a
    window of NaNs NaN (-inf would make it -inf); PyTorch's pool (``propagate_nan``) lets a
    NaN win, so there -inf is the neutral value."""
    if node.op == "MaxPool" and not node.attrs.get("propagate_nan", 0):
        return float("nan")
    return _PAD_VALUE[node.op]


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
        spatial = len(pads) // 2
        full_pads = [0, 0] + list(pads[:spatial]) + [0, 0] + list(pads[spatial:])
        padded = graph.fresh_name(f"{node.inputs[0]}_padded")
        pads_name = graph.add_constant(np.asarray(full_pads, dtype=np.int64),
                                       hint=f"{node.name or 'conv'}_pads")
        value = graph.add_constant(np.asarray(_pad_value(node), dtype=x_type.dtype.numpy),
                                   hint=f"{node.name or 'conv'}_pad_value")
        new_nodes.append(Node("Pad", [node.inputs[0], pads_name, value], [padded],
                              {"mode": "constant"}, name=f"{node.name or 'conv'}_pad"))
        shape = tuple(int(d) + (pads[i - 2] + pads[i - 2 + spatial] if i >= 2 else 0)
                      for i, d in enumerate(x_type.shape))
        graph.types[padded] = TensorType(x_type.dtype, shape)
        attrs = dict(node.attrs)
        attrs.pop("pads")
        new_nodes.append(Node(node.op, [padded] + node.inputs[1:], node.outputs, attrs,
                              name=node.name, domain=node.domain))
        changed += 1
    graph.nodes = new_nodes
    return changed
