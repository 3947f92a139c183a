"""Types of graph values: tensors, sequences of tensors, optionals.

A :class:`TensorType` has an element type and a shape whose dims may be ints, symbols or
unknown (``None``); the shape itself is ``None`` when even the rank is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ember.core.dims import Dim, format_dim
from ember.core.dtypes import DType


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of a tensor of this (static) type."""
        if not self.is_static:
            raise ValueError(f"{self} has no static size")
        count = 1
        for d in self.shape:
            count *= d
        return count * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, None if shape is None else tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype}[*]"
        return f"{self.dtype}[{', '.join(format_dim(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SequenceType:
    """An ONNX sequence of tensors; ``elem`` describes every element (shape may be None)."""

    elem: "ValueType | None"

    def __str__(self) -> str:
        return f"seq<{self.elem if self.elem is not None else '?'}>"


@dataclass(frozen=True)
class OptionalType:
    """An ONNX optional: either holds a value of ``elem`` or is empty."""

    elem: "ValueType | None"

    def __str__(self) -> str:
        return f"opt<{self.elem if self.elem is not None else '?'}>"


ValueType = Union[TensorType, SequenceType, OptionalType]


def tensor(dtype: DType, *shape: Dim) -> TensorType:
    """Shorthand used by tests and passes: ``tensor(DType.FLOAT32, 'N', 3)``."""
    from ember.core.dims import sym

    return TensorType(dtype, tuple(sym(d) if isinstance(d, str) else d for d in shape))
