"""Buffers: the memory that loop-IR functions read and write.

A buffer is a typed, possibly multi-dimensional array with a *layout*: the element stride of
every axis (row-major unless ``layout`` says otherwise, e.g. a transposed view or a padded
row).  Compute definitions address it per axis (``BufferLoad``); lowering flattens those
accesses to a Load/Store of one element offset (``flat_index``) through the layout, so a
re-laid-out weight or a blocked activation is an ordinary buffer.  ``scope`` says where it
lives: ``global`` (a function parameter: model input/output, weight or arena slice), ``local``
(a small per-thread array, e.g. a register tile or packed panel, declared by Allocate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ember.core.dtypes import DType
from ember.ir.loop.expr import INDEX, Expr, ExprLike, as_expr

SCOPES = ("global", "local")


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    scope: str = "global"
    align: int = 64  # bytes; the memory planner and allocator guarantee it
    # Element stride of each axis; None is row-major (contiguous, last axis fastest).
    layout: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"unknown buffer scope {self.scope!r}")
        if self.layout is not None and len(self.layout) != len(self.shape):
            raise ValueError(f"buffer {self.name}: layout {self.layout} does not give one "
                             f"stride per axis of shape {self.shape}")

    @property
    def row_major(self) -> bool:
        return self.layout is None or self.layout == self._row_major_strides()

    @property
    def size(self) -> int:
        total = 1
        for d in self.shape:
            total *= d
        return total

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def strides(self) -> tuple[int, ...]:
        """Element stride of every axis (the layout)."""
        return self.layout if self.layout is not None else self._row_major_strides()

    def _row_major_strides(self) -> tuple[int, ...]:
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))

    def flat_index(self, indices: Sequence[ExprLike]) -> Expr:
        """The element offset of ``indices`` (one per axis), through the layout."""
        if len(indices) != len(self.shape):
            raise ValueError(f"buffer {self.name} has rank {len(self.shape)}, "
                             f"got {len(indices)} indices")
        total: Expr = as_expr(0)
        for index, stride in zip(indices, self.strides()):
            term = as_expr(index, INDEX) * stride if stride != 1 else as_expr(index, INDEX)
            total = term if _is_zero(total) else total + term
        from ember.ir.loop.simplify import simplify

        return simplify(total)

    def load(self, *indices: ExprLike) -> Expr:
        from ember.ir.loop.expr import Load

        return Load(self, self.flat_index(indices))

    def row_major_offset(self, flat: Expr) -> Expr:
        """The element offset of the ``flat``-th element in row-major order (a reshape's
        view of the buffer): ``flat`` itself for a row-major buffer, else through the
        layout."""
        if self.row_major:
            return flat
        from ember.ir.loop.simplify import simplify

        indices, rest = [], flat
        for stride in self._row_major_strides():
            indices.append(rest // stride if stride != 1 else rest)
            rest = rest % stride if stride != 1 else rest
        return simplify(self.flat_index([simplify(i) for i in indices]))

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def _is_zero(expr: Expr) -> bool:
    from ember.ir.loop.expr import Const

    return isinstance(expr, Const) and expr.value == 0 and expr.lanes == 1
