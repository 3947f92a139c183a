"""Compute definitions of ops (how lowering builds their kernels), one module per family.

Each module attaches its definitions with :func:`ember.ops.registry.compute_of`.  Ops without
one run their numpy reference from compiled code (a reported fallback).
"""

import importlib
import pkgutil

import ember.ops.families  # noqa: F401  (the ops must exist before computes attach to them)

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
