"""Move a convolution's zero padding into a separate Pad node.

A padded convolution must test every tap against the borders, which turns its input loads
into clamped gathers; padding the input once (a cheap copy into the workspace) leaves a
convolution whose loads are affine and vectorize.  This is what libraries do too (or they
handle borders in separate loops).  Only explicit ``pads`` are moved (``auto_pad=NOTSET``).
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType


def make_padding_explicit(graph: Graph) -> int:
    """Rewrite in place; returns how many convolutions were changed."""
    changed = 0
    new_nodes: list[Node] = []
    for node in graph.nodes:
        pads = node.attrs.get("pads")
        if node.op != "Conv" or not pads or not any(pads) or \
                node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
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
        new_nodes.append(Node("Pad", [node.inputs[0], pads_name], [padded],
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
