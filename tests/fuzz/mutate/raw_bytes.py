"""Mutations of the serialized protobuf (``bytes``): bit flips, truncation, deleted,
duplicated and inserted chunks, overwritten length bytes.

These reach the protobuf parser and then whatever half-sensible model it hands back (a flipped
bit in a varint length or a field tag often still parses).  Positions are drawn from the
start of the file half of the time, where the graph structure lives, since the tail of a real
model is mostly weight bytes whose damage only changes values.
"""

from __future__ import annotations

import random

import onnx

from fuzz.mutate.base import Mutant, apply_sub_mutations, pick


def _position(data: bytes, rng: random.Random) -> int:
    if not data:
        return 0
    if rng.random() < 0.5:
        return rng.randrange(min(len(data), 2048))
    return rng.randrange(len(data))


def _bit_flips(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = bytearray(model.SerializeToString())
    count = pick(rng, [1, 2, 4, 16, 64])
    positions = []
    for _ in range(count):
        position, bit = _position(data, rng), rng.randrange(8)
        data[position] ^= 1 << bit
        positions.append(f"{position}.{bit}")
    return Mutant(bytes(data), f"{count} bit flip(s) at byte.bit {', '.join(positions[:8])}")


def _truncate(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = model.SerializeToString()
    keep = pick(rng, [0, 1, len(data) - 1, _position(data, rng)])
    return Mutant(data[:keep], f"truncated {len(data)} -> {keep} bytes")


def _delete_chunk(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = model.SerializeToString()
    start = _position(data, rng)
    size = pick(rng, [1, 2, 8, 64])
    return Mutant(data[:start] + data[start + size:], f"deleted bytes [{start}, {start + size})")


def _duplicate_chunk(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = model.SerializeToString()
    start = _position(data, rng)
    size = pick(rng, [1, 4, 32, 256])
    chunk = data[start:start + size]
    return Mutant(data[:start] + chunk + data[start:],
                  f"bytes [{start}, {start + len(chunk)}) duplicated")


def _insert_random(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = model.SerializeToString()
    start = _position(data, rng)
    size = pick(rng, [1, 4, 16])
    chunk = bytes(rng.randrange(256) for _ in range(size))
    return Mutant(data[:start] + chunk + data[start:],
                  f"{size} random bytes {chunk.hex()} inserted at {start}")


def _overwrite(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    data = bytearray(model.SerializeToString())
    start = _position(data, rng)
    value = pick(rng, [0x00, 0xFF, 0x7F, 0x80])
    count = pick(rng, [1, 5, 10])
    for i in range(start, min(start + count, len(data))):
        data[i] = value
    return Mutant(bytes(data), f"{count} byte(s) at {start} set to 0x{value:02x}")


def mutate_bytes(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "bit-flips": _bit_flips, "truncate": _truncate, "delete-chunk": _delete_chunk,
        "duplicate-chunk": _duplicate_chunk, "insert-random": _insert_random,
        "overwrite": _overwrite,
    })
