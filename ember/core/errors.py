"""The exception hierarchy of ember.

Every failure that a user can cause (a bad model file, an op ember does not know, an input of
the wrong shape) surfaces as a subclass of :class:`EmberError` whose message names the cause
and, where possible, what to do about it.  Internal bugs stay ordinary Python exceptions.
"""

from __future__ import annotations

from ember.runtime.errors import EmberError, ExecutionError, InputError, ModelLoadError

__all__ = ["CompileError", "ConfigError", "EmberError", "ExecutionError", "InputError", "MemoryBudgetError",
           "ModelLoadError", "OpAttributeError", "ShapeError", "UnsupportedOpError",
           "VerificationError"]


class UnsupportedOpError(EmberError):
    """One or more ops of a model have no ember implementation.

    ``unsupported`` lists ``(op_type, node_name, reason)`` for every such node so that a
    user sees all of them at once instead of fixing them one by one.
    """

    def __init__(self, unsupported: list[tuple[str, str, str]], advice: str = ""):
        self.unsupported = list(unsupported)
        lines = [f"  - {op} (node '{node}'): {reason}" for op, node, reason in self.unsupported]
        ops = sorted({op for op, _, _ in self.unsupported})
        super().__init__(
            f"the model uses {len(ops)} unsupported op type(s) "
            f"({', '.join(ops)}) in {len(self.unsupported)} node(s):\n" + "\n".join(lines)
            + (f"\n{advice}" if advice else "")
        )


class OpAttributeError(EmberError):
    """A node's attribute is missing, of the wrong kind or out of range."""


class ShapeError(EmberError):
    """Shapes or dtypes of a node's inputs are inconsistent with what the op accepts."""


class VerificationError(EmberError):
    """The IR violates an invariant (dangling value, duplicate definition, bad type)."""


class CompileError(EmberError):
    """The graph cannot be compiled to native code.

    Also what an internal failure of the compiler becomes (a pass, the lowering of a node, the
    schedule or code generation of a kernel raising something unexpected): its message names
    the stage, node, op and value where that happened, and the original exception is chained.
    """


class ConfigError(EmberError):
    """An option or environment variable of ember has a value it cannot use."""


class MemoryBudgetError(EmberError):
    """Compiling or running a model would need more memory than the budget allows.

    Raised before the memory is allocated, so that an oversized model fails with the size, the
    limit and how to raise it instead of dying inside numpy.  ``needed`` and ``limit`` are in
    bytes.
    """

    def __init__(self, message: str, needed: int, limit: int):
        super().__init__(message)
        self.needed = needed
        self.limit = limit
