"""Element types as an artifact names them (numpy dtype names), for the runtime.

The manifest and the library's signature spell every buffer's element type as its numpy dtype
name.  The runtime accepts only the names below: an unknown name is a malformed artifact, never
something handed to ``np.dtype`` (which would accept ``"object"``, ``"U5"`` or ``"V1000000"``).
The table mirrors the storable types of ``ember.core.dtypes`` (a test keeps the two in step);
it lives here because the runtime may not import the compiler.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# name -> bytes per element
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn": 1, "float6_e2m3fn": 1, "float6_e3m2fn": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
    "int4": 1, "uint4": 1, "int2": 1, "uint2": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
}

# Names numpy knows without ml_dtypes.
_NUMPY_NATIVE = frozenset({"float64", "float32", "float16", "int64", "int32", "int16", "int8",
                           "uint64", "uint32", "uint16", "uint8", "bool", "complex64",
                           "complex128"})


def is_known(name: object) -> bool:
    return isinstance(name, str) and name in ITEMSIZE


@lru_cache(maxsize=None)
def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a known element type name (ml_dtypes only for the exotic ones)."""
    if name not in ITEMSIZE:
        raise KeyError(name)
    if name in _NUMPY_NATIVE:
        return np.dtype(name)
    import ml_dtypes  # only artifacts with exotic element types need it

    return np.dtype(getattr(ml_dtypes, name))
