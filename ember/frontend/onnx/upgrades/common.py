"""Small helpers shared by the upgrade modules."""

from __future__ import annotations

import numpy as np

from ember.frontend.onnx.table import Builder
from ember.ir.graph import Node


def attr_to_input(node: Node, b: Builder, attr: str, index: int, dtype=np.int64) -> None:
    """Move attribute ``attr`` into input slot ``index`` as a constant (when it is set)."""
    value = node.attrs.pop(attr, None)
    while len(node.inputs) < index:
        node.inputs.append("")
    name = b.constant(np.asarray(value, dtype=dtype), hint=attr) if value is not None else ""
    if len(node.inputs) == index:
        node.inputs.append(name)
    else:
        node.inputs[index] = name
    while node.inputs and node.inputs[-1] == "":
        node.inputs.pop()
