"""Tampering with the safetensors header of the weights file, rehashed so that the damage
reaches the reader: header length past the file, JSON that is not a header, tensors whose
dtype, shape or byte range disagree with the data.

The runtime parses this file itself (numpy only); a byte range taken on trust becomes an
out-of-bounds read or silently different weights.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

from fuzz.tamper.base import ArtifactContext, NotApplicable, pick, rehash

WEIGHTS_SUFFIX = ".safetensors"


def _split(data: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def _join(header: object, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _tensor_names(header: dict) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


def _variants(header: dict, body: bytes, data: bytes, rng: random.Random) -> dict[str, bytes]:
    names = _tensor_names(header)
    if not names:
        raise NotApplicable("no tensors in the header")
    name = pick(rng, names)
    entry = header[name]
    start, end = entry["data_offsets"]

    def edited(**changes: object) -> bytes:
        copy = json.loads(json.dumps(header))
        copy[name].update(changes)
        return _join(copy, body)

    without = {k: v for k, v in header.items() if k != name}
    length = struct.unpack("<Q", data[:8])[0]
    return {
        "header-length-huge": struct.pack("<Q", 2**63) + data[8:],
        "header-length-zero": struct.pack("<Q", 0) + data[8:],
        "header-length-past-end": struct.pack("<Q", len(data)) + data[8:],
        "header-length-minus-one": struct.pack("<Q", length - 1) + data[8:],
        "header-not-json": struct.pack("<Q", 4) + b"{{{{" + body,
        "header-list": _join([header], body),
        "header-null": _join(None, body),
        "metadata-not-dict": _join({**header, "__metadata__": [1, 2]}, body),
        f"{name}-dtype-F16": edited(dtype="F16"),
        f"{name}-dtype-F64": edited(dtype="F64"),
        f"{name}-dtype-BF16": edited(dtype="BF16"),
        f"{name}-dtype-unknown": edited(dtype="X99"),
        f"{name}-shape-bigger": edited(shape=[x * 1000 for x in entry["shape"]] or [1000]),
        f"{name}-shape-negative": edited(shape=[-1]),
        f"{name}-shape-empty-list": edited(shape=[]),
        f"{name}-offsets-past-end": edited(data_offsets=[start, end + 2**40]),
        f"{name}-offsets-reversed": edited(data_offsets=[end, start]),
        f"{name}-offsets-negative": edited(data_offsets=[-8, end]),
        f"{name}-offsets-shifted": edited(data_offsets=[start + 4, end + 4]),
        f"{name}-offsets-not-ints": edited(data_offsets=["0", "4"]),
        f"{name}-missing-dtype": _join({**without, name: {k: v for k, v in entry.items()
                                                          if k != "dtype"}}, body),
        f"{name}-removed": _join(without, body),
        "extra-tensor": _join({**header, "fuzz": {"dtype": "F32", "shape": [2**20],
                                                  "data_offsets": [0, 2**22]}}, body),
        "body-truncated": data[:len(data) - max(1, len(body) // 2)],
        "body-extended": data + bytes(4096),
    }


def tamper_header(case_dir: Path, context: ArtifactContext, base: str,
                  rng: random.Random) -> str:
    files = sorted(p for p in case_dir.iterdir() if p.name.endswith(WEIGHTS_SUFFIX))
    path = pick(rng, files, "weights file")
    data = path.read_bytes()
    header, body = _split(data)
    variants = _variants(header, body, data, rng)
    variant = pick(rng, sorted(variants))
    path.write_bytes(variants[variant])
    rehash(case_dir)
    return f"{path.name}: {variant} (rehashed)"
