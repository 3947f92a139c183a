"""JSON round trip of the graph IR: printed text identical, constants equal bit for bit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.core.dims import SymDim, sym
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ModelLoadError
from ember.frontend.onnx import import_onnx
from ember.ir.graph import Graph, Node
from ember.ir.serialize import (INLINE_MAX_ELEMENTS, graph_from_json, graph_to_json, load_graph,
                                save_graph)
from ember.ir.types import OptionalType, SequenceType, TensorType, tensor

F32 = DType.FLOAT32
N, S = sym("N"), sym("S")


def _round_trip(graph: Graph) -> Graph:
    text = json.dumps(graph_to_json(graph), allow_nan=False)  # strict JSON
    return graph_from_json(json.loads(text))


def _assert_same_array(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == object:
        assert a.tolist() == b.tolist() and all(type(v) is str for v in b.flat)
    else:
        assert a.tobytes() == b.tobytes()


def _assert_same_value(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        _assert_same_array(a, b)
    elif isinstance(a, Graph):
        _assert_same_graph(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_value(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def _assert_same_graph(a: Graph, b: Graph) -> None:
    assert str(a) == str(b)
    assert (a.name, a.inputs, a.outputs, a.types, a.metadata) == \
           (b.name, b.inputs, b.outputs, b.types, b.metadata)
    assert list(a.constants) == list(b.constants)
    for name in a.constants:
        _assert_same_array(a.constants[name], b.constants[name])
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        assert (x.op, x.inputs, x.outputs, x.name, x.domain, list(x.attrs)) == \
               (y.op, y.inputs, y.outputs, y.name, y.domain, list(y.attrs))
        for key in x.attrs:
            _assert_same_value(x.attrs[key], y.attrs[key])


def _every_dtype_constant(dtype: DType, size: int) -> np.ndarray:
    if dtype is DType.STRING:
        return np.array([f"s{i}é" for i in range(size)], dtype=object).reshape(-1, 1)
    if dtype is DType.BOOL:
        return np.arange(size) % 3 == 0
    if dtype.is_float:
        return np.linspace(-2, 2, size).astype(np.float32).astype(dtype.numpy)
    if dtype in (DType.COMPLEX64, DType.COMPLEX128):
        return (np.arange(size) + 0.5j).astype(dtype.numpy)
    return (np.arange(size) % 2).astype(dtype.numpy)


@pytest.mark.parametrize("size", [3, INLINE_MAX_ELEMENTS + 5])
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_constants_of_every_dtype_are_bit_exact(dtype, size):
    graph = Graph(outputs=["c"])
    graph.add_constant(_every_dtype_constant(dtype, size), hint="c")
    _assert_same_graph(graph, _round_trip(graph))


def test_small_constants_are_inline_and_large_ones_base64():
    graph = Graph()
    graph.constants["small"] = np.arange(4, dtype=np.int64)
    graph.constants["large"] = np.zeros(INLINE_MAX_ELEMENTS + 1, np.float32)
    graph.constants["nan"] = np.array([np.nan, -0.0, np.inf], np.float32)
    graph.constants["text"] = np.array([["a", "b"], ["", "ü"]], dtype=object)
    encoded = {c["name"]: c["value"] for c in graph_to_json(graph)["graph"]["constants"]}
    assert encoded["small"] == {"dtype": "i64", "shape": [4], "data": [0, 1, 2, 3]}
    assert "base64" in encoded["large"] and "data" not in encoded["large"]
    assert "base64" in encoded["nan"]  # strict JSON has no NaN; bits are kept exactly
    assert encoded["text"]["data"] == ["a", "b", "", "ü"]
    _assert_same_graph(graph, _round_trip(graph))


def test_special_float_bits_survive():
    nan_payload = np.array([0x7FC00001, 0xFFC00000, 0x80000000], np.uint32).view(np.float32)
    graph = Graph()
    graph.constants["bits"] = nan_payload
    graph.constants["bf16"] = np.array([np.nan, -np.inf, -0.0], np.float32).astype(
        DType.BFLOAT16.numpy)
    _assert_same_graph(graph, _round_trip(graph))


def test_symbolic_types_of_every_kind():
    strange = sym("a*b") + 1  # a symbol whose printed name would not parse back
    graph = Graph(inputs=["x", "s", "o"], outputs=["x"], types={
        "x": TensorType(F32, (N, 2 * N + 1, N * S - 3, None, 7, strange)),
        "s": SequenceType(tensor(DType.INT64, "N")),
        "o": OptionalType(SequenceType(None)),
        "unranked": TensorType(DType.BFLOAT16, None),
        "untyped": None,
    })
    again = _round_trip(graph)
    assert again.types == graph.types
    assert isinstance(again.types["x"].shape[5], SymDim)
    _assert_same_graph(graph, again)


def test_attributes_of_every_kind_and_nested_graphs():
    body = Graph(name="body", inputs=["i"], outputs=["o"],
                 nodes=[Node("Neg", ["i"], ["o"], name="neg", attrs={"alpha": 0.5})],
                 types={"i": tensor(F32, "N"), "o": tensor(F32, "N")})
    body.constants["k"] = np.array([1.5], DType.FLOAT8E4M3FN.numpy)
    attrs = {
        "int": 3, "float": 0.1, "nan": float("nan"), "inf": -float("inf"), "string": "héllo",
        "bool": True, "none": None, "ints": [1, -2], "floats": [0.5, 1e-30], "empty": [],
        "strings": ["a", "b"], "tensor": np.arange(6, dtype=np.int32).reshape(2, 3),
        "tensors": [np.ones(2, np.float16), np.array(["x"], dtype=object)],
        "graph": body, "graphs": [body, body], "type": tensor(DType.INT8, "N", None),
        "types": [SequenceType(tensor(F32)), OptionalType(None)], "tuple": (1, "two"),
        "dict": {"k": [1.0]}, "scalar": np.float32(2.5), "int_scalar": np.int64(7),
        "dtype": DType.BFLOAT16, "dim": 2 * N,
    }
    graph = Graph(inputs=["x"], outputs=["y"], types={"x": tensor(F32, "N")},
                  nodes=[Node("Custom", ["x", ""], ["y", ""], attrs=attrs, name="custom",
                              domain="com.example")],
                  metadata={"producer": "test 1.0", "ir_version": 8, "opsets": {"": 21}})
    again = _round_trip(graph)
    _assert_same_graph(graph, again)
    assert again.nodes[0].attrs["graph"] is not again.nodes[0].attrs["graphs"][0]


def test_imported_model_round_trips_through_a_file(tmp_path):
    weight = numpy_helper.from_array(np.arange(100, dtype=np.float32).reshape(10, 10), "w")
    model = helper.make_model(
        helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add"),
                           helper.make_node("Abs", ["y"], ["z"], name="abs")], "imported",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                          initializer=[weight]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(model)
    path = tmp_path / "graph.json"
    save_graph(graph, path)
    again = load_graph(path)
    _assert_same_graph(graph, again)
    assert str(again.types["z"]) == "f32[N, 10]"
    assert again.fresh_name("y") not in again.all_value_names()


def test_unserializable_attribute_is_a_clear_error():
    graph = Graph(nodes=[Node("Custom", [], ["y"], attrs={"bad": object()}, name="n1")])
    with pytest.raises(EmberError, match="attribute 'bad' of node 'n1' .*object"):
        graph_to_json(graph)


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_graph(tmp_path / "missing.json")
    graph = Graph(outputs=["c"])
    graph.add_constant(np.arange(100, dtype=np.float32), hint="c")
    path = tmp_path / "g.json"
    save_graph(graph, path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_graph(path)
    with pytest.raises(ModelLoadError, match="not an ember graph"):
        graph_from_json({"nodes": []})
    data = graph_to_json(graph)
    data["version"] = 99
    with pytest.raises(ModelLoadError, match="version 99"):
        graph_from_json(data)
    data = graph_to_json(graph)
    data["graph"]["constants"][0]["value"]["shape"] = [101]
    with pytest.raises(ModelLoadError, match="needs 404 bytes, the data has 400"):
        graph_from_json(data)
    del data["graph"]["nodes"]
    with pytest.raises(ModelLoadError, match="missing field 'nodes'"):
        graph_from_json(data)
