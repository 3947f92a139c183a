"""The reference executor: runs a Graph node by node with each op's numpy reference."""

from ember.interp.reference import ReferenceExecutor, check_inputs

__all__ = ["ReferenceExecutor", "check_inputs"]
