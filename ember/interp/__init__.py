"""The reference executor: runs a Graph node by node with each op's numpy reference."""

from ember.interp.reference import NodeInterpreter, ReferenceExecutor, check_inputs

__all__ = ["NodeInterpreter", "ReferenceExecutor", "check_inputs"]
