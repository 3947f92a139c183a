"""The auto-tuner: search each kernel's schedule configs on this machine, keep the results.

    import ember
    ember.tune("model.onnx", budget="10m", db="tune.db")      # or: ember tune model.onnx
    module = ember.compile("model.onnx", tuning_db="tune.db")

The pieces, from the bottom: ``database`` (SQLite records of every measurement, per workload
and target), ``space`` (a kernel's configs, explored by asking its schedule), ``measure``
(candidates built by worker processes, timed by an isolated runner, checked against the
reference executor), ``tuner`` (tasks, evolutionary search, the budget, the confirmation of
the finalists), ``report`` (progress, tables, the tuning curve) and ``session``
(:func:`tune`).  The package itself is callable: ``ember.tune(model, ...)`` is
:func:`ember.tune.session.tune`.

Submodules are imported when used: the runner and build worker processes start from here
and import only what they need.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def tune(*args: Any, **kwargs: Any) -> Any:
    """See :func:`ember.tune.session.tune`."""
    from ember.tune.session import tune as run

    return run(*args, **kwargs)


class _CallablePackage(types.ModuleType):
    """``ember.tune`` is this package *and* the function users call: the package attribute
    ``ember.tune`` is bound to the package as soon as any submodule is imported, so the
    package forwards calls to :func:`tune`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
