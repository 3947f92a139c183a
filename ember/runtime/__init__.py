"""Loads and runs compiled artifacts.  Imports only the standard library and numpy.

    import ember.runtime
    model = ember.runtime.load("resnet.ember")
    outputs = model.run({"input": x})
"""

from ember.runtime.errors import EmberError, ExecutionError, InputError, ModelLoadError
from ember.runtime.model import CompiledModel, load

__all__ = ["CompiledModel", "EmberError", "ExecutionError", "InputError", "ModelLoadError",
           "load"]
