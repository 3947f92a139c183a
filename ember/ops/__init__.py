"""The op registry and the op families.  ``get_op(name)`` loads every family on first use."""

from ember.ops.registry import REQUIRED, Attr, InferContext, OpDef, RefContext, all_ops, get_op, op

__all__ = ["REQUIRED", "Attr", "InferContext", "OpDef", "RefContext", "all_ops", "get_op", "op"]
