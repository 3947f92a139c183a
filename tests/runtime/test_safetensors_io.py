"""The runtime's safetensors reader: what the ``safetensors`` package writes reads back the
same (the package's own loader is the oracle), and every malformed header is a ModelLoadError
naming the file and the tensor, never a ValueError, KeyError or UnicodeDecodeError."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load as reference_load
from safetensors.numpy import save as reference_save

from ember.runtime.errors import ModelLoadError
from ember.runtime.safetensors_io import parse_safetensors

SOURCE = "weights.safetensors"


def _file(header: object, body: bytes = b"", raw_header: bytes | None = None,
          declared: int | None = None) -> bytes:
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    size = len(text) if declared is None else declared
    return size.to_bytes(8, "little") + text + body


def test_reads_what_the_safetensors_package_writes():
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)).astype(np.float32),
               "b": np.arange(7, dtype=np.int64), "c": np.array(True),
               "d": np.zeros((0, 5), np.float16), "e": rng.integers(0, 255, 9).astype(np.uint8)}
    data = reference_save(tensors, metadata={"who": "test"})
    ours = parse_safetensors(data, SOURCE)
    theirs = reference_load(data)
    assert set(ours) == set(theirs) == set(tensors)
    for name, expected in theirs.items():
        assert ours[name].dtype == expected.dtype and ours[name].shape == expected.shape
        np.testing.assert_array_equal(ours[name], expected)


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("data,fragment", [
    (b"\x01\x00", "too short"),
    (_file(None, raw_header=b"{}", declared=1 << 40), "declares a header of .* more than"),
    (_file(None, raw_header=b"{}", declared=64), "past the end of the file"),
    (_file(None, raw_header=b'{"a": {"dtype": "F32"'), "header of .* is not valid JSON"),
    (_file(None, raw_header=b'{"\xff": 1}'), "header of .* is not valid UTF-8"),
    (_file(None, raw_header=b'{"a": 1, "a": 2}'), "has the key 'a' twice"),
    (_file([1, 2]), "header that is not a JSON object"),
    (_file({"a": F32_2}, b"\0" * 4), r"tensor 'a' has data_offsets \[0, 8\] outside"),
    (_file({"a": {**F32_2, "data_offsets": [0, 1 << 62]}}, b"\0" * 8), "outside the data"),
    (_file({"a": {**F32_2, "data_offsets": [8, 0]}}, b"\0" * 8), "outside the data"),
    (_file({"a": {**F32_2, "data_offsets": [0, 4]}}, b"\0" * 4), "span 4 bytes, but F32"),
    (_file({"a": {**F32_2, "dtype": "F33"}}, b"\0" * 8), "unknown dtype 'F33'"),
    (_file({"a": {**F32_2, "shape": [-2]}}, b"\0" * 8), "shape .* non-negative"),
    (_file({"a": {**F32_2, "shape": [True, 2]}}, b"\0" * 8), "shape .* non-negative"),
    (_file({"a": {**F32_2, "data_offsets": [0.0, 8]}}, b"\0" * 8), "expected \\[begin, end\\]"),
    (_file({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "must be an object of dtype"),
    (_file({"a": F32_2, "b": F32_2}, b"\0" * 8), "tensor 'b': data_offsets overlaps"),
    (_file({"a": {**F32_2, "data_offsets": [4, 12]}}, b"\0" * 12), "leaves bytes \\[0, 4\\)"),
    (_file({"a": F32_2}, b"\0" * 12), "4 bytes of data after the last tensor"),
    (_file({"__metadata__": {"k": 1}}), "__metadata__ that is not an object of strings"),
], ids=["short", "huge-header", "header-past-end", "bad-json", "not-utf8", "duplicate",
        "not-object", "past-end", "far-past-end", "reversed", "span", "dtype", "negative-dim",
        "bool-dim", "float-offset", "missing-offsets", "overlap", "gap", "trailing",
        "metadata"])
def test_malformed_header_is_a_model_load_error(data, fragment):
    with pytest.raises(ModelLoadError, match=fragment) as error:
        parse_safetensors(data, SOURCE)
    assert SOURCE in str(error.value)
