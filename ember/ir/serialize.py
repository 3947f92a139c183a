"""A JSON form of the graph IR that round-trips exactly.

``graph_to_json`` / ``graph_from_json`` convert between a :class:`Graph` and plain JSON data;
``save_graph`` / ``load_graph`` write and read it as a file.  Printing a graph before and after a
round trip gives the same text, and constants come back bit for bit (bfloat16 and the float8
family included).  The document looks like::

    {"format": "ember.graph", "version": 1, "graph": {
        "name": "main", "inputs": ["x"], "outputs": ["y"],
        "types": {"x": {"tensor": "f32", "shape": ["N", 3]}, ...},
        "constants": [{"name": "w", "value": {"dtype": "f32", "shape": [3], "data": [...]}}],
        "nodes": [{"op": "Add", "name": "add_0", "domain": "", "inputs": ["x", "w"],
                   "outputs": ["y"], "attrs": {}}],
        "metadata": {...}}}

Encoding rules:

* Dims are ints, ``"?"`` for unknown, or :func:`~ember.core.dims.format_dim` text for symbolic
  dims (``"2*N + 1"``); a polynomial whose text would not parse back (a symbol named ``"a*b"``)
  is written as its terms, ``{"terms": [[["N"], 2], [[], 1]]}``.
* Arrays are ``{"dtype", "shape"}`` plus either ``"data"`` (the flattened values, for small
  arrays whose values survive JSON exactly, and for string arrays) or ``"base64"`` (the raw
  little-endian bytes).
* Attribute and metadata values that JSON holds natively (int, finite float, str, bool, None,
  lists of them) are written as is; everything else is a one-key object naming its kind:
  ``{"array": ...}``, ``{"graph": ...}``, ``{"type": ...}``, ``{"tuple": [...]}``,
  ``{"dict": {...}}``, ``{"float": "nan"}``, ``{"scalar": ...}`` (a numpy scalar),
  ``{"dtype": "f32"}``, ``{"dim": ...}``.

The output is strict JSON (no NaN/Infinity literals).
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ember.core.dims import Dim, SymDim, format_dim, parse_dim
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ModelLoadError
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType

FORMAT = "ember.graph"
VERSION = 1
# Arrays with at most this many elements are written as JSON lists (when exact).
INLINE_MAX_ELEMENTS = 64

_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class _Malformed(Exception):
    """A JSON document that is not a valid ember graph (reported as ModelLoadError)."""


# ---------------------------------------------------------------------- public API


def graph_to_json(graph: Graph) -> dict[str, Any]:
    """The JSON data of ``graph`` and all its subgraphs (a dict of lists, strings, numbers)."""
    return {"format": FORMAT, "version": VERSION, "graph": _encode_graph(graph)}


def graph_from_json(data: Mapping[str, Any]) -> Graph:
    """The Graph that :func:`graph_to_json` turned into ``data``."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ModelLoadError(f"not an ember graph: the JSON document has no "
                             f"\"format\": \"{FORMAT}\" field")
    if data.get("version") != VERSION:
        raise ModelLoadError(f"ember graph JSON version {data.get('version')!r} is not "
                             f"supported (this ember reads version {VERSION})")
    try:
        return _decode_graph(data["graph"])
    except (_Malformed, KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ModelLoadError(f"malformed ember graph JSON: {detail}") from None


def save_graph(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` as an ember graph JSON file."""
    text = json.dumps(graph_to_json(graph), indent=1, allow_nan=False)
    Path(path).write_text(text + "\n", encoding="utf-8")


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Read a graph written by :func:`save_graph`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelLoadError(f"graph file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"cannot read graph file '{path}': {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"'{path}' is not valid JSON (truncated?): {error}") from None
    try:
        return graph_from_json(data)
    except ModelLoadError as error:
        raise ModelLoadError(f"'{path}': {error}") from None


# ---------------------------------------------------------------------- graphs and nodes


def _encode_graph(graph: Graph) -> dict[str, Any]:
    where = f"graph '{graph.name}'"
    return {
        "name": graph.name,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "types": {name: _encode_type(vtype) for name, vtype in graph.types.items()},
        "constants": [{"name": name, "value": _encode_array(array, f"constant '{name}'")}
                      for name, array in graph.constants.items()],
        "nodes": [_encode_node(node) for node in graph.nodes],
        "metadata": {key: _encode_value(value, f"{where} metadata '{key}'")
                     for key, value in graph.metadata.items()},
    }


def _decode_graph(data: Mapping[str, Any]) -> Graph:
    return Graph(
        name=_expect(data["name"], str, "graph name"),
        inputs=_string_list(data["inputs"], "graph inputs"),
        outputs=_string_list(data["outputs"], "graph outputs"),
        nodes=[_decode_node(node) for node in data["nodes"]],
        types={name: _decode_type(vtype) for name, vtype in data["types"].items()},
        constants={_expect(c["name"], str, "constant name"): _decode_array(c["value"])
                   for c in data["constants"]},
        metadata={key: _decode_value(value) for key, value in data["metadata"].items()},
    )


def _encode_node(node: Node) -> dict[str, Any]:
    def where(key: str) -> str:
        return f"attribute '{key}' of node '{node.name}' ({node.op})"

    return {
        "op": node.op,
        "name": node.name,
        "domain": node.domain,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "attrs": {key: _encode_value(value, where(key))
                  for key, value in node.attrs.items()},
    }


def _decode_node(data: Mapping[str, Any]) -> Node:
    return Node(
        op=_expect(data["op"], str, "node op"),
        inputs=_string_list(data["inputs"], "node inputs"),
        outputs=_string_list(data["outputs"], "node outputs"),
        attrs={key: _decode_value(value) for key, value in data["attrs"].items()},
        name=_expect(data["name"], str, "node name"),
        domain=_expect(data["domain"], str, "node domain"),
    )


# ---------------------------------------------------------------------- types and dims


def _encode_type(vtype: ValueType | None) -> Any:
    if vtype is None:
        return None
    if isinstance(vtype, TensorType):
        shape = None if vtype.shape is None else [_encode_dim(d) for d in vtype.shape]
        return {"tensor": vtype.dtype.value, "shape": shape}
    if isinstance(vtype, SequenceType):
        return {"sequence": _encode_type(vtype.elem)}
    if isinstance(vtype, OptionalType):
        return {"optional": _encode_type(vtype.elem)}
    raise EmberError(f"cannot serialize value type {vtype!r}")


def _decode_type(data: Any) -> ValueType | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise _Malformed(f"a value type must be an object or null, got {data!r}")
    if "tensor" in data:
        shape = data["shape"]
        dims = None if shape is None else tuple(_decode_dim(d) for d in shape)
        return TensorType(DType(data["tensor"]), dims)
    if "sequence" in data:
        return SequenceType(_decode_type(data["sequence"]))
    if "optional" in data:
        return OptionalType(_decode_type(data["optional"]))
    raise _Malformed(f"unknown value type {data!r}")


def _encode_dim(dim: Dim) -> Any:
    if isinstance(dim, SymDim):
        text = format_dim(dim)
        if parse_dim(text) == dim:
            return text
        return {"terms": [[list(monomial), coefficient] for monomial, coefficient in dim.terms]}
    if dim is None:
        return format_dim(dim)
    return int(dim)


def _decode_dim(data: Any) -> Dim:
    if isinstance(data, bool):
        raise _Malformed(f"dimension {data!r} is not an int, a string or terms")
    if isinstance(data, int):
        return data
    if isinstance(data, str):
        return parse_dim(data)
    if isinstance(data, Mapping) and "terms" in data:
        terms = tuple(sorted((tuple(_string_list(m, "dimension symbols")), int(c))
                             for m, c in data["terms"]))
        return SymDim(terms)
    raise _Malformed(f"dimension {data!r} is not an int, a string or terms")


# ---------------------------------------------------------------------- arrays


def _encode_array(array: np.ndarray, where: str) -> dict[str, Any]:
    array = np.asarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        dtype = DType.from_numpy(array.dtype)
    except EmberError as error:
        raise EmberError(f"cannot serialize {where}: {error}") from None
    encoded: dict[str, Any] = {"dtype": dtype.value, "shape": list(array.shape)}
    if dtype is DType.STRING:
        encoded["data"] = [_string_element(v, where) for v in array.reshape(-1).tolist()]
    elif array.size <= INLINE_MAX_ELEMENTS and _survives_json(array, dtype):
        encoded["data"] = array.reshape(-1).tolist()
    else:
        raw = _swap_if_big_endian(np.ascontiguousarray(array)).tobytes()
        encoded["base64"] = base64.b64encode(raw).decode("ascii")
    return encoded


def _decode_array(data: Mapping[str, Any]) -> np.ndarray:
    dtype = DType(data["dtype"])
    shape = tuple(int(d) for d in data["shape"])
    size = int(np.prod(shape, dtype=np.int64))
    if "data" in data:
        values = list(data["data"])
        if len(values) != size:
            raise _Malformed(f"array of shape {list(shape)} lists {len(values)} values")
        if dtype is DType.STRING:
            flat = np.empty(size, dtype=object)
            flat[:] = [_expect(v, str, "string array element") for v in values]
            return flat.reshape(shape)
        return np.array(values, dtype=dtype.numpy).reshape(shape)
    raw = base64.b64decode(data["base64"], validate=True)
    if len(raw) != size * dtype.itemsize:
        raise _Malformed(f"array of shape {list(shape)} and dtype {dtype} needs "
                         f"{size * dtype.itemsize} bytes, the data has {len(raw)}")
    flat = np.frombuffer(raw, dtype=dtype.numpy)
    return _swap_if_big_endian(flat).reshape(shape).copy()  # copy: writable, owns its memory


def _swap_if_big_endian(array: np.ndarray) -> np.ndarray:
    """Raw data in the file is little-endian; numpy's native order may not be."""
    return array.byteswap() if sys.byteorder == "big" else array


def _survives_json(array: np.ndarray, dtype: DType) -> bool:
    """Whether writing the values as a JSON list and reading them back is bit-exact."""
    if dtype in (DType.COMPLEX64, DType.COMPLEX128):
        return False
    if dtype.is_float and not np.isfinite(array.astype(np.float64)).all():
        return False  # strict JSON has no NaN/Infinity (and NaN payloads would be lost)
    again = np.array(array.reshape(-1).tolist(), dtype=array.dtype)
    return again.tobytes() == np.ascontiguousarray(array).reshape(-1).tobytes()


def _string_element(value: Any, where: str) -> str:
    if isinstance(value, bytes):
        raise EmberError(f"cannot serialize {where}: it holds bytes; ember string tensors "
                         f"hold str")
    if not isinstance(value, str):
        raise EmberError(f"cannot serialize {where}: it holds a {type(value).__name__}, "
                         f"not a str")
    return value


# ---------------------------------------------------------------------- attribute values


def _encode_value(value: Any, where: str) -> Any:
    """JSON for an attribute or metadata value; exact Python types are preserved."""
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if kind is list:
        return [_encode_value(v, where) for v in value]
    if kind is tuple:
        return {"tuple": [_encode_value(v, where) for v in value]}
    if kind is dict:
        if not all(isinstance(k, str) for k in value):
            raise EmberError(f"cannot serialize {where}: a dict with non-string keys")
        return {"dict": {k: _encode_value(v, where) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        return {"array": _encode_array(value, where)}
    if isinstance(value, np.generic) and value.dtype.kind not in "OUS":
        return {"scalar": _encode_array(np.asarray(value), where)}
    if isinstance(value, Graph):
        return {"graph": _encode_graph(value)}
    if isinstance(value, (TensorType, SequenceType, OptionalType)):
        return {"type": _encode_type(value)}
    if isinstance(value, DType):
        return {"dtype": value.value}
    if isinstance(value, SymDim):
        return {"dim": _encode_dim(value)}
    raise EmberError(f"cannot serialize {where}: values of type {kind.__name__} have no JSON "
                     f"form")


def _decode_value(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode_value(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise _Malformed(f"a tagged value must have exactly one key, got {sorted(data)}")
    (tag, payload), = data.items()
    decoders = {
        "float": _decode_special_float,
        "tuple": lambda p: tuple(_decode_value(v) for v in p),
        "dict": lambda p: {k: _decode_value(v) for k, v in p.items()},
        "array": _decode_array,
        "scalar": lambda p: _decode_array(p)[()],
        "graph": _decode_graph,
        "type": _decode_type,
        "dtype": DType,
        "dim": _decode_dim,
    }
    if tag not in decoders:
        raise _Malformed(f"unknown value tag {tag!r}")
    return decoders[tag](payload)


def _decode_special_float(data: Any) -> float:
    if data not in _SPECIAL_FLOATS:
        raise _Malformed(f"special float must be one of {sorted(_SPECIAL_FLOATS)}, got {data!r}")
    return _SPECIAL_FLOATS[data]


# ---------------------------------------------------------------------- validation helpers


def _expect(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise _Malformed(f"{what} must be a {kind.__name__}, got {value!r}")
    return value


def _string_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise _Malformed(f"{what} must be a list of strings, got {value!r}")
    return [_expect(v, str, what) for v in value]
