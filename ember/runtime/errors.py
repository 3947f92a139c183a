"""The base errors of ember, defined at the bottom layer.

They live here, not in ``ember.core``, because the runtime imports nothing else of ember yet
must raise errors that ``except ember.EmberError`` catches; ``ember.core.errors`` re-exports
them and adds the compiler's own.
"""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ModelLoadError(EmberError):
    """A model or artifact could not be read: missing, truncated, malformed, corrupted, or
    built for a CPU this machine is not."""


class InputError(EmberError):
    """Run-time inputs do not match the model's signature (count, name, shape or dtype)."""


class ExecutionError(EmberError):
    """An op or compiled kernel failed while running; the message names the node and op."""
