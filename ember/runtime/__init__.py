"""Loads and runs compiled artifacts.  Imports only the standard library and numpy.

    import ember.runtime
    model = ember.runtime.load("resnet.ember")
    outputs = model.run({"input": x})        # dict name -> array
    y = model(x)                             # the array (a tuple for several outputs)
    times = model.profile({"input": x})      # per-step medians: times.step_seconds
"""

from ember.runtime.errors import EmberError, ExecutionError, InputError, ModelLoadError
from ember.runtime.manifest import TensorSpec
from ember.runtime.model import CompiledModel, load
from ember.runtime.profiling import StepTimes

__all__ = ["CompiledModel", "EmberError", "ExecutionError", "InputError", "ModelLoadError",
           "StepTimes", "TensorSpec", "load"]
