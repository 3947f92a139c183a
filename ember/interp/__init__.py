"""Reference executors, the oracles that compiled code is checked against.

* :mod:`ember.interp.reference` runs a Graph node by node with each op's numpy reference;
* :mod:`ember.interp.loops` runs one loop-IR kernel (a PrimFunc) on numpy arrays, so that a
  scheduled kernel can be compared with the unscheduled one (``loops.run_outputs``).
"""

from ember.interp import loops
from ember.interp.loops import IndependenceError, InterpreterError
from ember.interp.reference import NodeInterpreter, ReferenceExecutor, check_inputs

__all__ = ["IndependenceError", "InterpreterError", "NodeInterpreter", "ReferenceExecutor",
           "check_inputs", "loops"]
