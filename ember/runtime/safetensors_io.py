"""Read safetensors files with numpy alone.

The format is an 8-byte little-endian header length, a JSON header mapping tensor names to
``{dtype, shape, data_offsets}``, then raw little-endian data.  The compiler writes it with the
``safetensors`` package; the runtime reads it here so that a deployment needs only numpy.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
    "U8": np.uint8, "BOOL": np.bool_,
}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file (numpy dtypes; other dtypes come back as raw bytes)."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise ValueError(f"{path}: header length {header_len} exceeds the file")
    header = json.loads(data[8:8 + header_len])
    body = memoryview(data)[8 + header_len:]
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES.get(info["dtype"], np.uint8))
        raw = np.frombuffer(body[start:end], dtype=dtype)
        tensors[name] = raw.reshape(info["shape"]) if info["dtype"] in _DTYPES else raw
    return tensors
