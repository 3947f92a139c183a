"""Parsing and formatting the Open Inference Protocol, against numpy's own arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ember.serve.protocol import InferRequest, ProtocolError, encode_response, parse_request


def _parse(inputs: list[dict], **document) -> InferRequest:
    return parse_request(json.dumps({"inputs": inputs, **document}).encode(), None)


@pytest.mark.parametrize("datatype, data, dtype", [
    ("FP32", [[1.5, 2], [3, -4.25]], np.float32),
    ("FP16", [1.0, 2.5, -3.0, 65504.0], np.float16),
    ("FP64", [1e300, -2.0, 0.0, 1.0], np.float64),
    ("INT8", [[-128, 127], [0, 1]], np.int8),
    ("UINT64", [0, 1, 2**64 - 1, 7], np.uint64),
    ("INT64", [[-2**63, 2**63 - 1], [0, 1]], np.int64),
    ("BOOL", [[True, False], [False, True]], np.bool_),
])
def test_json_data_nested_or_flat_gives_numpys_array(datatype, data, dtype):
    expected = np.array(data, dtype=dtype).reshape(2, 2)
    for given in (data, np.array(data, dtype=object).ravel().tolist()):
        request = _parse([{"name": "t", "shape": [2, 2], "datatype": datatype, "data": given}])
        np.testing.assert_array_equal(request.inputs["t"], expected)
        assert request.inputs["t"].dtype == dtype


@pytest.mark.parametrize("datatype, data, named", [
    ("INT8", [1, 2, 3, 128], "outside the range of INT8"),
    ("UINT8", [1, 2, 3, -1], "outside the range of UINT8"),
    ("INT64", [1, 2, 3, 2**64], "outside the range of INT64"),
    ("INT32", [1, 2, 3, 1.5], "not fractions"),
    ("BOOL", [True, False, 1, 0], "true/false"),
    ("FP32", [True, 1.0, 2.0, 3.0], "true/false given"),
    ("FP32", [1.0, None, 2.0, 3.0], "not a number"),
    ("FP32", [[1.0, 2.0], [3.0]], "elements"),
    ("FP32", [1.0, 2.0, 3.0], "holds 3 elements"),
])
def test_wrong_json_data_names_the_input_and_the_problem(datatype, data, named):
    with pytest.raises(ProtocolError) as error:
        _parse([{"name": "t", "shape": [2, 2], "datatype": datatype, "data": data}])
    assert "input 't'" in str(error.value) and named in str(error.value)
    assert error.value.status == 400


def test_binary_inputs_follow_the_json_in_input_order():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[True, False]])
    header = json.dumps({"id": "7", "inputs": [
        {"name": "a", "shape": [2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "c", "shape": [2], "datatype": "INT64", "data": [4, 5]},
        {"name": "b", "shape": [1, 2], "datatype": "BOOL",
         "parameters": {"binary_data_size": b.nbytes}}]}).encode()
    request = parse_request(header + a.tobytes() + b.tobytes(), str(len(header)))
    assert request.id == "7"
    np.testing.assert_array_equal(request.inputs["a"], a)
    np.testing.assert_array_equal(request.inputs["b"], b)
    np.testing.assert_array_equal(request.inputs["c"], [4, 5])
    with pytest.raises(ProtocolError, match="BOOL bytes must be 0 or 1"):
        parse_request(header + a.tobytes() + bytes([1, 2]), str(len(header)))
    with pytest.raises(ProtocolError, match="takes 24"):
        bad = header.replace(b'"binary_data_size": 24', b'"binary_data_size": 20')
        parse_request(bad + a.tobytes()[:20] + b.tobytes(), str(len(bad)))
    for length in ("abc", "-1", str(len(header) + 100)):
        with pytest.raises(ProtocolError, match="Inference-Header-Content-Length"):
            parse_request(header, length)


@pytest.mark.parametrize("document, named", [
    ({"inputs": []}, "non-empty list"),
    ({"inputs": [{"name": "t", "shape": [1], "datatype": "FP32"}]}, "neither 'data'"),
    ({"inputs": [{"name": "t", "shape": [-1], "datatype": "FP32", "data": []}]},
     "non-negative integers"),
    ({"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]},
                 {"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
     "given twice"),
    ({"id": 5, "inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
     "'id' must be a string"),
    ({"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]}],
      "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}, "true or false"),
])
def test_malformed_documents_are_refused(document, named):
    with pytest.raises(ProtocolError, match=named.replace("(", r"\(")):
        parse_request(json.dumps(document).encode(), None)


def test_nesting_deeper_than_any_tensor_is_refused():
    nested = b"[" * 40 + b"1.0" + b"]" * 40
    body = b'{"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": ' + nested + \
        b"}]}"
    with pytest.raises(ProtocolError, match="nested deeper"):
        parse_request(body, None)
    # deeper than the JSON parser itself goes: still a 400, not a crash
    with pytest.raises(ProtocolError, match="nests JSON deeper") as error:
        parse_request(b"[" * 200_000 + b"]" * 200_000, None)
    assert error.value.status == 400


def test_responses_send_each_output_as_the_request_asks():
    request = InferRequest("r1", {}, outputs=None, binary_outputs={"b"})
    a = np.array([[1.5, -2.0]], np.float32)
    b = np.arange(4, dtype=np.int64)
    body, headers = encode_response("m", request, {"a": a, "b": b})
    length = int(headers["Inference-Header-Content-Length"])
    document = json.loads(body[:length])
    assert document["id"] == "r1" and document["model_name"] == "m"
    assert document["outputs"][0] == {"name": "a", "datatype": "FP32", "shape": [1, 2],
                                      "data": [1.5, -2.0]}
    assert document["outputs"][1]["parameters"] == {"binary_data_size": 32}
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.int64), b)
    plain, headers = encode_response("m", InferRequest(None, {}), {"a": a})
    assert headers == {} and "id" not in json.loads(plain)


def test_mutated_bodies_are_parsed_or_refused_never_crash():
    """Random byte edits, truncations and type swaps of valid bodies (JSON and binary): the
    parser returns a request or raises ProtocolError, nothing else."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    header = json.dumps({"id": "a", "inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": x.nbytes}},
        {"name": "k", "shape": [2], "datatype": "INT64", "data": [1, 2]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    bodies = [(header + x.tobytes(), str(len(header))),
              (json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                       "data": x.tolist()}]}).encode(), None)]
    swaps = [b"null", b"true", b"-1", b"1e999", b'"s"', b"[]", b"{}", b"[[[]]]", b"2.5"]
    for case in range(3000):
        body, length = bodies[case % 2]
        data = bytearray(body)
        kind = case % 3
        if kind == 0:
            for _ in range(rng.integers(1, 4)):
                data[rng.integers(len(data))] = rng.integers(256)
        elif kind == 1:
            data = data[:rng.integers(len(data))]
        else:
            start = rng.integers(len(data))
            data[start:start + rng.integers(1, 8)] = swaps[rng.integers(len(swaps))]
        try:
            parse_request(bytes(data), length)
        except ProtocolError as error:
            assert error.status == 400
