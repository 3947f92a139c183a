"""Upgrades of reductions: the ``axes`` attribute of the Reduce* ops became an input.

ReduceSum changed at opset 13, the other Reduce* ops at opset 18.  ArgMax/ArgMin and
CumSum only widened their type lists, so they need no upgrade.
"""

from __future__ import annotations

from ember.frontend.onnx.table import Builder, upgrade
from ember.frontend.onnx.upgrades.common import attr_to_input
from ember.ir.graph import Node

_AXES_INPUT_SINCE = {
    "ReduceSum": 13,
    "ReduceMean": 18,
    "ReduceMax": 18,
    "ReduceMin": 18,
    "ReduceProd": 18,
    "ReduceL1": 18,
    "ReduceL2": 18,
    "ReduceLogSum": 18,
    "ReduceLogSumExp": 18,
    "ReduceSumSquare": 18,
}


def axes_to_input(node: Node, b: Builder, opset: int) -> None:
    """The newest Reduce* ops take ``axes`` as their optional second input."""
    attr_to_input(node, b, "axes", 1)


for _op_type, _since in _AXES_INPUT_SINCE.items():
    upgrade(_op_type, before=_since)(axes_to_input)
