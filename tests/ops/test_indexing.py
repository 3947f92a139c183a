"""Indexing ops (Gather*, Scatter*, TopK, Unique, OneHot, ...): symbolic shape inference,
semantics the ONNX suite covers thinly (ties, negative indices, reductions, unsorted Unique)
and errors.  The oracle is numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from op_helpers import ints, node_types, run_node

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Node
from ember.ir.types import tensor
from ember.ops import get_op
from ember.ops.registry import RefContext

F32, I64 = DType.FLOAT32, DType.INT64


X = {"x": tensor(F32, "N", 3, "S")}


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize("op, inputs, attrs, outputs, expected", [
    ("Gather", {"i": tensor(I64, "B", 2)}, {"axis": 1}, 1, ["f32[N, B, 2, S]"]),
    ("Gather", {"i": tensor(I64)}, {"axis": -1}, 1, ["f32[N, 3]"]),
    ("GatherElements", {"i": tensor(I64, "N", 1, "S")}, {"axis": 1}, 1, ["f32[N, 1, S]"]),
    ("GatherND", {"i": tensor(I64, "N", 4, 1)}, {"batch_dims": 1}, 1, ["f32[N, 4, S]"]),
    ("GatherND", {"i": tensor(I64, 5, 2)}, {}, 1, ["f32[5, S]"]),
    ("ScatterND", {"i": tensor(I64, 5, 2), "u": tensor(F32, 5, "S")}, {}, 1,
     ["f32[N, 3, S]"]),
    ("NonZero", {}, {}, 1, ["i64[3, ?]"]),
    ("Compress", {"c": tensor(DType.BOOL, 2)}, {"axis": 1}, 1, ["f32[N, ?, S]"]),
    ("Compress", {"c": tensor(DType.BOOL, 2)}, {}, 1, ["f32[?]"]),
    ("Unique", {}, {}, 4, ["f32[?]", "i64[?]", "i64[3*N*S]", "i64[?]"]),
    ("Unique", {}, {"axis": -1}, 4, ["f32[N, 3, ?]", "i64[?]", "i64[S]", "i64[?]"]),
    ("TopK", {"k": tensor(I64, 1)}, {"axis": 1}, 2, ["f32[N, ?, S]", "i64[N, ?, S]"]),
    ("Trilu", {}, {}, 1, ["f32[N, 3, S]"]),
    ("ReverseSequence", {"l": tensor(I64, 3)}, {}, 1, ["f32[N, 3, S]"]),
    ("TensorScatter", {"u": tensor(F32, "N", 1, "S")}, {"axis": 1}, 1, ["f32[N, 3, S]"]),
])
def test_symbolic_inference(op, inputs, attrs, outputs, expected):
    assert node_types(op, {**X, **inputs}, outputs=outputs, **attrs) == expected


def test_inference_uses_known_values():
    assert node_types("TopK", X, outputs=2, constants={"k": ints(2)}) == \
        ["f32[N, 3, 2]", "i64[N, 3, 2]"]
    assert node_types("OneHot", {"i": tensor(I64, "N", "S")}, axis=1,
                      constants={"depth": np.array(10.0, np.float32),
                                 "v": np.array([0, 1], np.int8)}) == ["i8[N, 10, S]"]
    assert node_types("Compress", X, axis=1,
                      constants={"c": np.array([True, False, True])}) == ["f32[N, 2, S]"]


def test_gather_folds_symbolic_shape_values():
    opdef = get_op("Gather")
    node = Node("Gather", [], ["out"], {}, name="fold")
    value = np.array([sym("N"), 3], dtype=object)
    picked = opdef.reference(RefContext(node, opdef, lambda *a: []), value,
                             np.array(-2, np.int64), axis=0)
    assert isinstance(picked, np.ndarray) and picked.shape == () and picked.item() == sym("N")


# ----------------------------------------------------------------------------- errors


def test_inference_errors():
    with pytest.raises(ShapeError, match="K=5 exceeds the 3 elements"):
        node_types("TopK", X, outputs=2, axis=1, constants={"k": ints(5)})
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        node_types("Gather", {**X, "i": tensor(I64, 2)}, axis=3)
    with pytest.raises(ShapeError, match="reduction='sum'"):
        node_types("ScatterElements", {**X, "i": tensor(I64, 1, 1, 1), "u": tensor(F32, 1, 1, 1)},
                   reduction="sum")
    with pytest.raises(ShapeError, match="rank >= 1"):
        node_types("OneHot", {"i": tensor(I64), "d": tensor(I64), "v": tensor(F32, 2)})
    with pytest.raises(ShapeError, match="must be 0 and 1"):
        node_types("ReverseSequence", {**X, "l": tensor(I64, 3)}, batch_axis=1, time_axis=1)


@pytest.mark.parametrize("op, args, attrs, message", [
    ("Gather", (np.zeros((2, 3), np.float32), ints(3)), {"axis": 1}, "index 3 is out of range"),
    ("GatherElements", (np.zeros((2, 3), np.float32), np.array([[-4]])), {"axis": 1},
     "index -4 is out of range"),
    ("ScatterND", (np.zeros(4, np.float32), np.array([[4]]), np.ones(1, np.float32)), {},
     "index \\(dim 0\\) 4 is out of range"),
    ("ScatterElements", (np.zeros(4, np.float32), ints(1, 2), np.ones(3, np.float32)), {},
     "updates shape"),
    ("TensorScatter", (np.zeros((1, 4), np.float32), np.ones((1, 2), np.float32), ints(3)),
     {"axis": 1}, "linear mode writes past the cache"),
])
def test_run_time_errors_name_the_node(op, args, attrs, message):
    with pytest.raises(ShapeError, match=f"'n' \\({op}\\).*{message}"):
        run_node(op, *args, **attrs)


# ----------------------------------------------------------------------------- semantics


def test_top_k_ties_go_to_the_lower_index():
    x = np.array([[3, 1, 3, 2, 1]], dtype=np.uint64)
    values, indices = run_node("TopK", x, ints(3), outputs=2)
    assert values.tolist() == [[3, 3, 2]] and indices.tolist() == [[0, 2, 3]]
    assert values.dtype == np.uint64 and indices.dtype == np.int64
    values, indices = run_node("TopK", x, ints(3), outputs=2, largest=0)
    assert values.tolist() == [[1, 1, 2]] and indices.tolist() == [[1, 4, 3]]


def test_unique_unsorted_with_axis_follows_first_occurrence():
    x = np.array([[2, 1, 2, 0], [5, 4, 5, 3]], dtype=np.int32)
    y, first, inverse, counts = run_node("Unique", x, outputs=4, axis=1, sorted=0)
    assert y.tolist() == [[2, 1, 0], [5, 4, 3]]
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2]
    assert counts.tolist() == [2, 1, 1]
    y, first, inverse, counts = run_node("Unique", x, outputs=4, axis=1)
    expected = np.unique(x, axis=1, return_index=True, return_inverse=True, return_counts=True)
    for got, want in zip((y, first, inverse, counts), expected):
        np.testing.assert_array_equal(got, np.asarray(want).reshape(got.shape))


def test_unique_of_strings_and_nans():
    words = np.array(["b", "a", "b"], dtype=object)
    assert run_node("Unique", words, outputs=4, sorted=0)[0].tolist() == ["b", "a"]
    y, _, inverse, counts = run_node("Unique", np.array([np.nan, 1, np.nan], np.float32),
                                     outputs=4)
    assert y.tolist()[0] == 1 and np.isnan(y[1]) and counts.tolist() == [1, 2]
    assert inverse.tolist() == [1, 0, 1]


def test_scatter_reductions_combine_duplicates():
    data = np.ones((2, 3), np.float32)
    indices = np.array([[0, 0], [2, 2]])
    updates = np.array([[2, 3], [4, 5]], np.float32)
    expected = {"add": [[6, 1, 1], [1, 1, 10]], "mul": [[6, 1, 1], [1, 1, 20]],
                "max": [[3, 1, 1], [1, 1, 5]], "min": [[1, 1, 1], [1, 1, 1]]}
    for reduction, want in expected.items():
        got = run_node("ScatterElements", data, indices, updates, axis=1, reduction=reduction)
        assert got.tolist() == want, reduction
    got = run_node("ScatterND", data, np.array([[1], [-1]]), np.full((2, 3), 2, np.float32),
                   reduction="add")
    assert got.tolist() == [[1, 1, 1], [5, 5, 5]]


def test_gather_nd_with_batch_dims_matches_a_loop():
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    indices = np.array([[[2, 1], [0, -1]], [[1, 3], [-1, 0]]])
    got = run_node("GatherND", data, indices, batch_dims=1)
    want = [[data[b][tuple(idx)] for idx in indices[b]] for b in range(2)]
    np.testing.assert_array_equal(got, want)


def test_gather_nd_index_tuples_need_a_component():
    """ONNX allows tuples of 1 to rank components; empty ones are a malformed model, named at
    inference and in the reference alike (numpy would fail on an ambiguous reshape)."""
    with pytest.raises(ShapeError, match="at least one component"):
        node_types("GatherND", {**X, "i": tensor(I64, 5, 0)})
    with pytest.raises(ShapeError, match="at least one component"):
        run_node("GatherND", np.ones((2, 3), np.float32), np.zeros((4, 0), np.int64))


def test_one_hot_negative_and_out_of_range_indices():
    got = run_node("OneHot", np.array([[-1, 3, 7]]), np.array(4.0, np.float32),
                   np.array(["off", "on"], dtype=object), axis=0)
    assert got.shape == (4, 1, 3)
    assert got[:, 0, :].T.tolist() == [["off", "off", "off", "on"], ["off", "off", "off", "on"],
                                       ["off"] * 4]


def test_reverse_sequence_and_trilu_match_numpy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)  # time x batch
    got = run_node("ReverseSequence", x, ints(3, 2, 1, 0))
    want = x.copy()
    for b, length in enumerate([3, 2, 1, 0]):
        want[:length, b] = x[:length, b][::-1]
    np.testing.assert_array_equal(got, want)
    stack = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4) + 1
    np.testing.assert_array_equal(run_node("Trilu", stack, np.array(-1, np.int64), upper=0),
                                  np.tril(stack, -1))


def test_tensor_scatter_circular_wraps():
    cache = np.zeros((2, 4, 1), np.float32)
    update = np.array([[[1], [2], [3]], [[4], [5], [6]]], np.float32)
    got = run_node("TensorScatter", cache, update, ints(2, 0), mode="circular", axis=1)
    assert got[..., 0].tolist() == [[3, 0, 1, 2], [4, 5, 6, 0]]


def test_scatter_9_imports_as_scatter_elements():
    node = helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=1)
    x, i, u = np.zeros((1, 3), np.float32), np.array([[2]]), np.ones((1, 1), np.float32)
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in (("x", x), ("i", i), ("u", u))]
    model = helper.make_model(
        helper.make_graph([node], "g", infos, [helper.make_empty_tensor_value_info("y")]),
        opset_imports=[helper.make_opsetid("", 9)])
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes] == ["ScatterElements"]
    assert ReferenceExecutor(graph).run({"x": x, "i": i, "u": u})["y"].tolist() == [[0, 0, 1]]
