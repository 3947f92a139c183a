"""How loop-IR types and constants are spelled in the generated C (names: ``c_names``).

Every DType has three C spellings, kept apart because f16/bf16 and bool are stored in one type
and computed in another:

* **storage** -- the element type in memory and at the ABI (kernel parameters, buffers):
  ``float``, ``double``, ``uint16_t`` (f16 and bf16 bit patterns), ``intN_t``/``uintN_t``,
  ``uint8_t`` (bool, 0 or 1);
* **compute** -- the C type of a scalar expression's value: f16/bf16 values are ``float``s that
  always hold a value representable in the narrow type (every operation rounds, so results
  equal IEEE binary16/bfloat16 arithmetic), bool is ``bool``;
* **lane** -- the element type of a vector (``lanes > 1``) value; bool lanes are ``uint8_t``
  0/1 because GCC vectors cannot hold ``bool``.

Vector values are GCC/Clang vector-extension types (``em_f32x16``) padded to a power-of-two
number of lanes; the padding lanes are kept zero and never reach memory.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.compute import NARROW_FLOATS


class CodegenError(EmberError):
    """The loop IR cannot be expressed in C for this target (unsupported dtype, intrinsic,
    feature the target lacks, malformed module)."""


_INT_CTYPES = {
    DType.INT8: "int8_t", DType.INT16: "int16_t", DType.INT32: "int32_t", DType.INT64: "int64_t",
    DType.UINT8: "uint8_t", DType.UINT16: "uint16_t", DType.UINT32: "uint32_t",
    DType.UINT64: "uint64_t",
}
_STORAGE = {DType.FLOAT32: "float", DType.FLOAT64: "double", DType.FLOAT16: "uint16_t",
            DType.BFLOAT16: "uint16_t", DType.BOOL: "uint8_t", **_INT_CTYPES}
# Element types the C backend can store and compute on (others run on the host).
SUPPORTED_DTYPES = frozenset(_STORAGE)
_TAGS = {"float": "f32", "double": "f64", "int8_t": "i8", "int16_t": "i16", "int32_t": "i32",
         "int64_t": "i64", "uint8_t": "u8", "uint16_t": "u16", "uint32_t": "u32",
         "uint64_t": "u64"}
_SIGNED_OF_WIDTH = {1: "int8_t", 2: "int16_t", 4: "int32_t", 8: "int64_t"}
_UNSIGNED_OF_WIDTH = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
_WIDTH = {"float": 4, "double": 8, **{c: int(re.sub(r"\D", "", c)) // 8
                                      for c in _INT_CTYPES.values()}}


def check_supported(dtype: DType) -> None:
    if dtype not in _STORAGE:
        raise CodegenError(
            f"the C backend has no representation for {dtype} (supported: "
            f"{', '.join(sorted(str(d) for d in _STORAGE))}); lower it to a supported type "
            "first")


def storage_ctype(dtype: DType) -> str:
    """The C element type of ``dtype`` in memory and at the kernel ABI."""
    check_supported(dtype)
    return _STORAGE[dtype]


def compute_ctype(dtype: DType) -> str:
    """The C type of a scalar expression of ``dtype``."""
    check_supported(dtype)
    if dtype in NARROW_FLOATS:
        return "float"
    return "bool" if dtype is DType.BOOL else _STORAGE[dtype]


def lane_ctype(dtype: DType) -> str:
    """The element type of a vector expression of ``dtype``."""
    check_supported(dtype)
    return "float" if dtype in NARROW_FLOATS else _STORAGE[dtype]


def width(ctype: str) -> int:
    """Bytes of a scalar C type (``bool`` lanes are bytes)."""
    return 1 if ctype == "bool" else _WIDTH[ctype]


def tag(ctype: str) -> str:
    """Short name of a lane C type for helper and vector type names (``float`` -> ``f32``)."""
    return "b" if ctype == "bool" else _TAGS[ctype]


def wide_unsigned(dtype: DType) -> str:
    """The unsigned type integer arithmetic of ``dtype`` is done in (never promoted to int)."""
    return "uint64_t" if dtype.itemsize == 8 else "uint32_t"


def unsigned_lane(ctype: str) -> str:
    return _UNSIGNED_OF_WIDTH[width(ctype)]


def signed_lane(ctype: str) -> str:
    return _SIGNED_OF_WIDTH[width(ctype)]


def padded_lanes(lanes: int) -> int:
    """Lanes of the C vector type holding ``lanes`` lanes (GCC wants powers of two)."""
    return 1 << max(0, math.ceil(math.log2(lanes)))


def vector_name(lane: str, lanes: int) -> str:
    return f"em_{tag(lane)}x{padded_lanes(lanes)}"


def vector_typedef(lane: str, lanes: int) -> str:
    padded = padded_lanes(lanes)
    return (f"typedef {lane} {vector_name(lane, lanes)} "
            f"__attribute__((vector_size({padded * width(lane)})));")


# ------------------------------------------------------------------------------- constants
def int_literal(value: int, dtype: DType) -> str:
    info = np.iinfo(dtype.numpy)
    if not info.min <= value <= info.max:
        raise CodegenError(f"constant {value} does not fit {dtype}")
    ctype = _INT_CTYPES[dtype]
    if dtype.itemsize == 8:
        if dtype is DType.INT64 and value == info.min:
            return "INT64_MIN"
        macro = "UINT64_C" if ctype.startswith("u") else "INT64_C"
        return f"{macro}({value})"
    if dtype is DType.INT32 and value == info.min:
        return "INT32_MIN"
    suffix = "u" if ctype.startswith("u") and dtype.itemsize == 4 else ""
    text = f"{value}{suffix}"
    return f"(({ctype}){text})" if dtype.itemsize < 4 or value < 0 else text


def float_literal(value: float, ctype: str) -> str:
    """An exact C literal of ``value`` as a ``float`` or ``double``."""
    value = float(np.float32(value)) if ctype == "float" else float(value)
    suffix = "f" if ctype == "float" else ""
    if math.isnan(value):
        return f"(({ctype})NAN)"
    if math.isinf(value):
        return f"(({ctype})INFINITY)" if value > 0 else f"(-({ctype})INFINITY)"
    text = str(np.float32(value)) if ctype == "float" else repr(value)
    text = f"{text}{suffix}"
    return f"({text})" if text.startswith("-") else text


def narrow_float_value(value: float, dtype: DType) -> float:
    """``value`` rounded to ``dtype`` (f16/bf16) and widened back: what the kernel computes."""
    return float(np.asarray(value, dtype=np.float64).astype(dtype.numpy).astype(np.float32))
