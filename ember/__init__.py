"""ember: a deep-learning compiler.

The public surface is imported lazily, so that ``import ember.runtime`` in a deployment
process never drags in the compiler (onnx, the op registry, the passes).

    import ember
    graph = ember.import_onnx("model.onnx")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "compile": ("ember.api", "compile"),
    "load": ("ember.api", "load"),
    "export": ("ember.api", "export"),
    "Module": ("ember.api", "Module"),
    "Target": ("ember.core.target", "Target"),
    "import_onnx": ("ember.frontend.onnx", "import_onnx"),
    "Graph": ("ember.ir.graph", "Graph"),
    "Node": ("ember.ir.graph", "Node"),
    "DType": ("ember.core.dtypes", "DType"),
    "EmberError": ("ember.core.errors", "EmberError"),
    "CompileError": ("ember.core.errors", "CompileError"),
    "ReferenceExecutor": ("ember.interp.reference", "ReferenceExecutor"),
    "explain": ("ember.torch_backend", "explain"),
}
# ``ember.tune`` is a subpackage that is also callable: ``ember.tune(model, budget="10m")``.
_SUBPACKAGES = {"tune"}

__all__ = sorted(_LAZY | dict.fromkeys(_SUBPACKAGES)) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"ember.{name}")
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ember' has no attribute '{name}'") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
