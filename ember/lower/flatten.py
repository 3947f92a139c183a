"""Flatten N-d accesses: every ``BufferLoad`` becomes a ``Load`` of one element offset.

Compute definitions and inlining work with per-axis indices (``x[n, c, h, w]``); only once a
kernel's loop nests are built are they turned into offsets, through each buffer's layout
(``Buffer.flat_index``), so that the layout lives in one place: the buffer.
"""

from __future__ import annotations

from ember.ir.loop.expr import INDEX, BufferLoad, Const, Expr, Load
from ember.ir.loop.functor import rewrite


def element_offset(access: BufferLoad) -> Expr:
    """The element offset an N-d (or row-major ``flat``) access reads."""
    buffer = access.buffer
    if access.flat:
        return buffer.row_major_offset(access.indices[0])
    if not access.indices:
        return Const(0, INDEX)
    return buffer.flat_index(access.indices)


def flatten(node):
    """``node`` (an Expr, Stmt or PrimFunc body) with every BufferLoad flattened."""
    return rewrite(node, lambda n: Load(n.buffer, element_offset(n), n.mask)
                   if isinstance(n, BufferLoad) else None)
