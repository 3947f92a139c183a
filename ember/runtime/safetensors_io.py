"""Read safetensors data with numpy alone, trusting nothing in it.

The format is an 8-byte little-endian header length, a UTF-8 JSON header mapping tensor names
to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``
object of strings), then the raw little-endian data.  The compiler writes it with the
``safetensors`` package; the runtime reads it here so that a deployment needs only numpy.

The header is checked as the format's specification demands: bounded size, valid UTF-8 JSON
without duplicate keys, known dtypes, shapes of non-negative ints, and offsets that match each
tensor's dtype and shape and tile the data section exactly (no overlap, no gap, nothing past
the end).  Any violation is a :class:`ModelLoadError` naming the file and the tensor.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ember.runtime.errors import ModelLoadError
from ember.runtime.manifest import strict_json

MAX_HEADER_BYTES = 100 << 20  # the reference implementation's limit

# safetensors dtype -> (bytes per element, numpy dtype or None for raw bytes)
_DTYPES: dict[str, tuple[int, type | None]] = {
    "F64": (8, np.float64), "F32": (4, np.float32), "F16": (2, np.float16),
    "BF16": (2, None), "F8_E4M3": (1, None), "F8_E5M2": (1, None),
    "I64": (8, np.int64), "I32": (4, np.int32), "I16": (2, np.int16), "I8": (1, np.int8),
    "U64": (8, np.uint64), "U32": (4, np.uint32), "U16": (2, np.uint16), "U8": (1, np.uint8),
    "BOOL": (1, np.bool_),
}
_MAX_RANK = 32


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file (see :func:`parse_safetensors`)."""
    from ember.runtime.files import ArtifactDirectory

    path = Path(path)
    with ArtifactDirectory(path.parent) as directory:
        data = directory.read(path.name, MAX_HEADER_BYTES + (1 << 40))
    return parse_safetensors(data, str(path))


def parse_safetensors(data: bytes, source: str) -> dict[str, np.ndarray]:
    """The tensors of safetensors ``data``: read-only numpy views of it.  Dtypes numpy lacks
    (BF16, F8_*) come back as flat uint8 arrays of their bytes."""
    if len(data) < 8:
        raise _error(source, f"is {len(data)} bytes, too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES:
        raise _error(source, f"declares a header of {header_len:,} bytes, more than the "
                             f"{MAX_HEADER_BYTES:,} the format allows")
    if header_len > len(data) - 8:
        raise _error(source, f"declares a header of {header_len:,} bytes, past the end of the "
                             f"file ({len(data):,} bytes)")
    header = strict_json(bytes(data[8:8 + header_len]), f"the header of {source}")
    if not isinstance(header, dict):
        raise _error(source, "has a header that is not a JSON object")
    body = memoryview(data)[8 + header_len:]
    spans: list[tuple[int, int, str]] = []
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            _check_metadata(info, source)
            continue
        begin, end, dtype, shape = _entry(name, info, len(body), source)
        spans.append((begin, end, name))
        raw = np.frombuffer(body[begin:end], dtype=np.uint8)
        numpy_type = _DTYPES[dtype][1]
        tensors[name] = raw.view(numpy_type).reshape(shape) if numpy_type else raw
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            what = "overlaps the previous tensor" if begin < cursor else \
                f"leaves bytes [{cursor}, {begin}) of the data unused"
            raise _error(source, f"tensor {name!r}: data_offsets {what}")
        cursor = end
    if cursor != len(body):
        raise _error(source, f"has {len(body) - cursor:,} bytes of data after the last tensor")
    return tensors


def _entry(name: str, info: object, body_size: int,
           source: str) -> tuple[int, int, str, tuple[int, ...]]:
    where = f"tensor {name!r}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _error(source, f"{where} must be an object of dtype, shape and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise _error(source, f"{where} has the unknown dtype {dtype!r}")
    if not isinstance(shape, list) or len(shape) > _MAX_RANK or not all(
            _is_int(d) and d >= 0 for d in shape):
        raise _error(source, f"{where} has the shape {shape!r}; a shape is a list of "
                             f"non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets)):
        raise _error(source, f"{where} has data_offsets {offsets!r}; expected [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= body_size:
        raise _error(source, f"{where} has data_offsets [{begin}, {end}] outside the data "
                             f"section of {body_size:,} bytes")
    count = 1
    for dim in shape:
        count *= dim
    expected = count * _DTYPES[dtype][0]
    if end - begin != expected:
        raise _error(source, f"{where}: data_offsets span {end - begin} bytes, but {dtype}"
                             f"{shape} takes {expected}")
    return begin, end, dtype, tuple(shape)


def _check_metadata(info: object, source: str) -> None:
    if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        raise _error(source, "has __metadata__ that is not an object of strings")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _error(source: str, problem: str) -> ModelLoadError:
    return ModelLoadError(f"{source} {problem}; the weights file is malformed or was edited, "
                          f"save the artifact again")
