"""The Open Inference Protocol (KServe V2) over HTTP: requests in, responses out.

A request body is a JSON object::

    {"id": "42", "parameters": {...},
     "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}],
     "outputs": [{"name": "y", "parameters": {"binary_data": true}}]}

``data`` is the tensor's elements in row-major order, flat or nested.  The binary tensor data
extension (what ``tritonclient``'s HTTP client sends by default) puts the JSON first and the
raw bytes of some tensors after it: the ``Inference-Header-Content-Length`` header gives the
JSON's length, and such an input carries ``"parameters": {"binary_data_size": N}`` instead of
``data``; the inputs' bytes follow in input order.  A response sends an output the same way
when the request asks for it (``binary_data`` on the output, or ``binary_data_output`` on the
request).

Everything here is parsing and formatting only: a malformed body is a :class:`ProtocolError`
(HTTP 400) whose message names the field, the input and what was expected; whether the
tensors fit the model is the served model's business (:mod:`ember.serve.model`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The header of the binary tensor data extension: the byte length of the JSON part.
HEADER_LENGTH = "inference-header-content-length"

# KServe V2 datatype <-> numpy element type (BYTES, strings, has no ember counterpart).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
MAX_RANK = 32


class ProtocolError(Exception):
    """A request that breaks the protocol or does not fit the model: HTTP ``status`` with a
    message for the client; ``kind`` labels it in the metrics."""

    def __init__(self, message: str, status: int = 400, kind: str = "bad_request"):
        super().__init__(message)
        self.status = status
        self.kind = kind


def datatype_of(dtype: np.dtype | str) -> str:
    """The protocol's name of a numpy element type (``bfloat16`` and other types outside the
    protocol are a ProtocolError: such a model cannot be served over it)."""
    name = _NAMES.get(np.dtype(dtype))
    if name is None:
        raise ProtocolError(f"element type {np.dtype(dtype).name} has no Open Inference "
                            f"Protocol datatype", status=500, kind="unsupported")
    return name


@dataclass
class InferRequest:
    """A parsed inference request: the input arrays by name and which outputs to return.

    ``outputs`` is None when the request names none (all of them); ``binary_outputs`` the
    outputs to send as raw bytes.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None = None
    binary_outputs: set[str] = field(default_factory=set)
    binary_by_default: bool = False

    def wants_binary(self, name: str) -> bool:
        return name in self.binary_outputs or self.binary_by_default


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an infer request body (JSON, then raw tensor bytes when ``header_length``, the
    ``Inference-Header-Content-Length`` header, is given)."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise ProtocolError(f"header Inference-Header-Content-Length is "
                                f"{header_length[:40]!r}, not a byte count") from None
        if not 0 <= length <= len(body):
            raise ProtocolError(f"header Inference-Header-Content-Length is {length}, but the "
                                f"body has {len(body)} bytes")
        json_part, binary = body[:length], body[length:]
    try:
        document = json.loads(json_part)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise ProtocolError("the request body nests JSON deeper than Python's parser "
                            "goes") from None
    if not isinstance(document, dict):
        raise ProtocolError("the request body must be a JSON object with an 'inputs' list")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError("field 'id' must be a string")
    parameters = _object(document.get("parameters", {}), "parameters")
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("field 'inputs' must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for position, raw in enumerate(raw_inputs):
        name, array, used = _input_tensor(raw, position, binary, offset)
        if name in inputs:
            raise ProtocolError(f"input '{name}' is given twice")
        inputs[name] = array
        offset += used
    if offset != len(binary):
        raise ProtocolError(f"the body holds {len(binary)} bytes of binary tensor data, but "
                            f"the inputs' binary_data_size add up to {offset}")
    request = InferRequest(request_id, inputs,
                           binary_by_default=_flag(parameters, "binary_data_output",
                                                   "parameters"))
    if "outputs" in document:
        raw_outputs = document["outputs"]
        if not isinstance(raw_outputs, list):
            raise ProtocolError("field 'outputs' must be a list of {\"name\": ...} objects")
        request.outputs = []
        for position, raw in enumerate(raw_outputs):
            where = f"outputs[{position}]"
            raw = _object(raw, where)
            name = raw.get("name")
            if not isinstance(name, str):
                raise ProtocolError(f"{where}.name must be a string")
            if name in request.outputs:
                raise ProtocolError(f"output '{name}' is requested twice")
            request.outputs.append(name)
            output_parameters = _object(raw.get("parameters", {}), f"{where}.parameters")
            if _flag(output_parameters, "binary_data", f"{where}.parameters"):
                request.binary_outputs.add(name)
    return request


def _input_tensor(raw: Any, position: int, binary: bytes, offset: int
                  ) -> tuple[str, np.ndarray, int]:
    """One entry of ``inputs``: its name, array, and the binary bytes it took."""
    where = f"inputs[{position}]"
    raw = _object(raw, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}.name must be a non-empty string")
    where = f"input '{name}'"
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        known = ", ".join(DATATYPES)
        raise ProtocolError(f"{where}: datatype {str(datatype)[:20]!r} is not one of {known}")
    dtype = DATATYPES[datatype]
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"{where}: shape must be a list of non-negative integers")
    count = math.prod(shape)
    parameters = _object(raw.get("parameters", {}), f"{where}.parameters")
    if "binary_data_size" in parameters:
        size = parameters["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"{where}: binary_data_size must be a non-negative integer")
        if "data" in raw:
            raise ProtocolError(f"{where} has both 'data' and binary_data_size")
        if size != count * dtype.itemsize:
            raise ProtocolError(f"{where}: binary_data_size is {size} bytes, but {datatype} "
                                f"of shape {shape} takes {count * dtype.itemsize}")
        if offset + size > len(binary):
            raise ProtocolError(f"{where}: its {size} bytes of binary data run past the end "
                                f"of the body")
        array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset)
        if datatype == "BOOL" and array.view(np.uint8).max(initial=0) > 1:
            raise ProtocolError(f"{where}: BOOL bytes must be 0 or 1")
        return name, array.reshape(shape), size
    if "data" not in raw:
        raise ProtocolError(f"{where} has neither 'data' nor binary_data_size")
    return name, _array_from_json(raw["data"], dtype, shape, where), 0


def _array_from_json(data: Any, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """The elements of ``data`` (flat or nested lists of JSON numbers or booleans) as an array
    of ``shape``; a wrong count, a wrong kind of element or an out-of-range integer is an
    error naming the input."""
    if not isinstance(data, list):
        raise ProtocolError(f"{where}: 'data' must be a list of elements")
    flat = _flatten(data, where)
    count = math.prod(shape)
    if len(flat) != count:
        raise ProtocolError(f"{where}: 'data' holds {len(flat)} elements, but shape {shape} "
                            f"takes {count}")
    name = _NAMES[dtype]
    types = set(map(type, flat))  # one pass at C speed, then whole-array work
    if not types <= {bool, int, float}:
        bad = next(value for value in flat if type(value) not in (bool, int, float))
        raise ProtocolError(f"{where}: element {str(bad)[:20]!r} is not a number")
    if dtype.kind == "b":
        if types - {bool}:
            raise ProtocolError(f"{where}: a BOOL tensor takes true/false, not numbers")
    elif bool in types:
        raise ProtocolError(f"{where}: true/false given for a {name} tensor")
    try:
        if dtype.kind in "iu":
            if float in types:
                raise ProtocolError(f"{where}: a {name} tensor takes integers, not fractions")
            parsed = np.array(flat)
            if parsed.dtype.kind not in "iu":  # past int64: numpy made floats or objects
                parsed = np.array(flat, dtype=object)
            info = np.iinfo(dtype)
            if parsed.size and (int(parsed.min()) < info.min or int(parsed.max()) > info.max):
                raise ProtocolError(f"{where}: an element is outside the range of {name}")
        array = np.array(flat, dtype=dtype)
    except OverflowError:  # an integer too large even for a float
        raise ProtocolError(f"{where}: an element is outside the range of {name}") from None
    return array.reshape(shape)


def _flatten(data: list, where: str) -> list:
    """Nested lists to one flat list (row-major), iteratively: no recursion limit to hit."""
    if not any(isinstance(item, list) for item in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > MAX_RANK:
                    raise ProtocolError(f"{where}: 'data' is nested deeper than {MAX_RANK}")
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where} must be a JSON object")
    return value


def _flag(parameters: dict, key: str, where: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}.{key} must be true or false")
    return value


def encode_response(model_name: str, request: InferRequest, outputs: dict[str, np.ndarray]
                    ) -> tuple[bytes, dict[str, str]]:
    """The response body for ``outputs`` (in the order given) and its extra headers: JSON
    alone, or JSON then the raw bytes of the outputs the request wants in binary."""
    entries = []
    chunks = []
    for name, array in outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype),
                                 "shape": list(array.shape)}
        if request.wants_binary(name):
            data = np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    document: dict[str, Any] = {"model_name": model_name, "model_version": "1",
                                "outputs": entries}
    if request.id is not None:
        document["id"] = request.id
    header = json.dumps(document, separators=(",", ":")).encode()
    if not chunks:
        return header, {}
    return header + b"".join(chunks), {"Inference-Header-Content-Length": str(len(header))}


def error_body(message: str) -> bytes:
    """The protocol's error response: ``{"error": message}``."""
    return json.dumps({"error": message}).encode()
