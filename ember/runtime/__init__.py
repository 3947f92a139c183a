"""Loads and runs compiled artifacts.  Imports only the standard library and numpy.

    import ember.runtime
    model = ember.runtime.load("resnet.ember")   # a CompiledModel, or a BatchBlockedModel
                                                 # for a model saved to run any batch size
    outputs = model.run({"input": x})        # dict name -> array
    y = model(x)                             # the array (a tuple for several outputs)
    model(x2, out=y)                         # written into y (a list/dict for several), y back
    times = model.profile({"input": x})      # per-step medians: times.step_seconds
"""

from ember.runtime.blocked import BatchBlockedModel
from ember.runtime.errors import EmberError, ExecutionError, InputError, ModelLoadError
from ember.runtime.loader import load
from ember.runtime.manifest import TensorSpec
from ember.runtime.model import CompiledModel
from ember.runtime.profiling import StepTimes

__all__ = ["BatchBlockedModel", "CompiledModel", "EmberError", "ExecutionError", "InputError",
           "ModelLoadError", "StepTimes", "TensorSpec", "load"]
