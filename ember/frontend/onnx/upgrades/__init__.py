"""Rewrites of older ONNX op versions into the newest form, one module per op family.

Each module registers its functions with :func:`ember.frontend.onnx.table.upgrade`.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
