"""Element types of tensors.

ember names its element types once, here, and maps them to numpy dtypes (with ``ml_dtypes``
for bfloat16, the float8 family and sub-byte integers) and to ONNX's ``TensorProto`` codes.
Everything above ``core`` speaks in :class:`DType`; numpy dtypes appear only at the edges.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """An element type.  The value is the canonical lowercase name used in printed IR."""

    FLOAT32 = "f32"
    FLOAT64 = "f64"
    FLOAT16 = "f16"
    BFLOAT16 = "bf16"
    FLOAT8E4M3FN = "f8e4m3fn"
    FLOAT8E4M3FNUZ = "f8e4m3fnuz"
    FLOAT8E5M2 = "f8e5m2"
    FLOAT8E5M2FNUZ = "f8e5m2fnuz"
    FLOAT8E8M0 = "f8e8m0"
    FLOAT4E2M1 = "f4e2m1"
    FLOAT6E2M3 = "f6e2m3"
    FLOAT6E3M2 = "f6e3m2"
    INT8 = "i8"
    INT16 = "i16"
    INT32 = "i32"
    INT64 = "i64"
    UINT8 = "u8"
    UINT16 = "u16"
    UINT32 = "u32"
    UINT64 = "u64"
    INT4 = "i4"
    UINT4 = "u4"
    INT2 = "i2"
    UINT2 = "u2"
    BOOL = "bool"
    COMPLEX64 = "c64"
    COMPLEX128 = "c128"
    STRING = "str"

    # ----------------------------------------------------------------- conversions
    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds values of this type (object for strings)."""
        return _TO_NUMPY[self]

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> "DType":
        dtype = np.dtype(dtype)
        if dtype.kind in ("U", "S", "O"):
            return cls.STRING
        try:
            return _FROM_NUMPY[dtype]
        except KeyError:
            from ember.core.errors import ShapeError

            raise ShapeError(f"numpy dtype {dtype} has no ember element type") from None

    @property
    def onnx(self) -> int:
        """The ``onnx.TensorProto`` data type code."""
        return _TO_ONNX[self]

    @classmethod
    def from_onnx(cls, code: int) -> "DType":
        try:
            return _FROM_ONNX[code]
        except KeyError:
            from ember.core.errors import ModelLoadError

            raise ModelLoadError(f"ONNX tensor element type code {code} is not supported") from None

    @classmethod
    def parse(cls, name: str) -> "DType":
        """Parse the printed name (``f32``) or a numpy-style name (``float32``)."""
        for member in cls:
            if member.value == name:
                return member
        return cls.from_numpy(np.dtype(name))

    # ----------------------------------------------------------------- classification
    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _SIGNED or self in _UNSIGNED

    @property
    def is_signed(self) -> bool:
        return self in _SIGNED or self in _FLOATS

    @property
    def itemsize(self) -> int:
        """Bytes per element in memory (sub-byte types occupy one byte each in numpy)."""
        return self.numpy.itemsize

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"DType.{self.name}"


_TO_NUMPY: dict[DType, np.dtype] = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT64: np.dtype(np.float64),
    DType.FLOAT16: np.dtype(np.float16),
    DType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DType.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.FLOAT6E2M3: np.dtype(ml_dtypes.float6_e2m3fn),
    DType.FLOAT6E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
    DType.INT8: np.dtype(np.int8),
    DType.INT16: np.dtype(np.int16),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.UINT8: np.dtype(np.uint8),
    DType.UINT16: np.dtype(np.uint16),
    DType.UINT32: np.dtype(np.uint32),
    DType.UINT64: np.dtype(np.uint64),
    DType.INT4: np.dtype(ml_dtypes.int4),
    DType.UINT4: np.dtype(ml_dtypes.uint4),
    DType.INT2: np.dtype(ml_dtypes.int2),
    DType.UINT2: np.dtype(ml_dtypes.uint2),
    DType.BOOL: np.dtype(np.bool_),
    DType.COMPLEX64: np.dtype(np.complex64),
    DType.COMPLEX128: np.dtype(np.complex128),
    DType.STRING: np.dtype(object),
}
_FROM_NUMPY: dict[np.dtype, DType] = {v: k for k, v in _TO_NUMPY.items()}

_TO_ONNX: dict[DType, int] = {
    DType.FLOAT32: 1,
    DType.UINT8: 2,
    DType.INT8: 3,
    DType.UINT16: 4,
    DType.INT16: 5,
    DType.INT32: 6,
    DType.INT64: 7,
    DType.STRING: 8,
    DType.BOOL: 9,
    DType.FLOAT16: 10,
    DType.FLOAT64: 11,
    DType.UINT32: 12,
    DType.UINT64: 13,
    DType.COMPLEX64: 14,
    DType.COMPLEX128: 15,
    DType.BFLOAT16: 16,
    DType.FLOAT8E4M3FN: 17,
    DType.FLOAT8E4M3FNUZ: 18,
    DType.FLOAT8E5M2: 19,
    DType.FLOAT8E5M2FNUZ: 20,
    DType.UINT4: 21,
    DType.INT4: 22,
    DType.FLOAT4E2M1: 23,
    DType.FLOAT8E8M0: 24,
    DType.UINT2: 25,
    DType.INT2: 26,
    DType.FLOAT6E2M3: 27,
    DType.FLOAT6E3M2: 28,
}
_FROM_ONNX: dict[int, DType] = {v: k for k, v in _TO_ONNX.items()}

_FLOATS = frozenset(
    {
        DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT8E4M3FN,
        DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2, DType.FLOAT8E5M2FNUZ, DType.FLOAT8E8M0,
        DType.FLOAT4E2M1, DType.FLOAT6E2M3, DType.FLOAT6E3M2,
    }
)
_SIGNED = frozenset({DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.INT4, DType.INT2})
_UNSIGNED = frozenset({DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64, DType.UINT4, DType.UINT2})
