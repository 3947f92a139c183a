"""Upgrades of shape ops (Squeeze, Unsqueeze, Split, Slice, Pad, ...)."""

from __future__ import annotations

from ember.frontend.onnx.table import Builder, upgrade
from ember.frontend.onnx.upgrades.common import attr_to_input
from ember.ir.graph import Node


@upgrade("Squeeze", before=13)
def squeeze_axes_to_input(node: Node, b: Builder, opset: int) -> None:
    """Squeeze-13 takes ``axes`` as an input instead of an attribute."""
    attr_to_input(node, b, "axes", 1)


@upgrade("Unsqueeze", before=13)
def unsqueeze_axes_to_input(node: Node, b: Builder, opset: int) -> None:
    """Unsqueeze-13 takes ``axes`` as an input instead of an attribute."""
    attr_to_input(node, b, "axes", 1)
