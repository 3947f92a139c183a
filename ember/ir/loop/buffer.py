"""Buffers: the memory that loop-IR functions read and write.

A buffer is a typed, row-major, possibly multi-dimensional array; Load/Store address it with a
flat element index (``flat_index`` builds one from per-axis indices).  ``scope`` says where it
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

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"unknown buffer scope {self.scope!r}")

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
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        return tuple(reversed(strides))

    def flat_index(self, indices: Sequence[ExprLike]) -> Expr:
        """Row-major flat index of ``indices`` (one per axis)."""
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

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def _is_zero(expr: Expr) -> bool:
    from ember.ir.loop.expr import Const

    return isinstance(expr, Const) and expr.value == 0 and expr.lanes == 1
