"""Bottom layer: element types, symbolic dimensions, errors.  Imports nothing else of ember."""

from ember.core.dims import Dim, SymDim, sym
from ember.core.dtypes import DType
from ember.core.errors import (
    EmberError,
    ExecutionError,
    InputError,
    ModelLoadError,
    OpAttributeError,
    ShapeError,
    UnsupportedOpError,
    VerificationError,
)

__all__ = [
    "Dim", "SymDim", "sym", "DType", "EmberError", "ExecutionError", "InputError",
    "ModelLoadError", "OpAttributeError", "ShapeError", "UnsupportedOpError", "VerificationError",
]
