"""The IRs: the high-level graph (``graph``, ``types``) and, later, the loop-level IR."""

from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType, tensor

__all__ = ["Graph", "Node", "OptionalType", "SequenceType", "TensorType", "ValueType", "tensor"]
