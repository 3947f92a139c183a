"""Lowering: an op's compute definition → a loop-IR PrimFunc for concrete shapes."""

from ember.lower.lower import LoweringError, lower_compute, lower_node

__all__ = ["LoweringError", "lower_compute", "lower_node"]
