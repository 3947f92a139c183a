"""Constant folding (ember/passes/fold_constants.py): every fold preserves what the graph
computes (the reference executor on the graph before the pass is the oracle), metadata of
static tensors folds, chains of constant ops fold to one constant, and large results stay
nodes."""

from __future__ import annotations

import copy

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.passes.dce import eliminate_dead_code
from ember.passes.fold_constants import fold_constants
from ember.passes.specialize import specialize

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _graph(nodes, inputs, outputs, initializers=None, opset=17):
    inits = [numpy_helper.from_array(np.asarray(a), name)
             for name, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "fold", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return import_onnx(model)


def _vi(name, elem=F32, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _fold_and_compare(graph, feeds, dce=True):
    """Fold a copy of ``graph``; its outputs must equal the unfolded graph's, bit for bit."""
    expected = ReferenceExecutor(graph).run(feeds)
    folded = copy.deepcopy(graph)
    count = fold_constants(folded)
    if dce:
        eliminate_dead_code(folded)
    actual = ReferenceExecutor(folded).run(feeds)
    assert list(actual) == list(expected)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
        assert np.asarray(actual[name]).dtype == np.asarray(expected[name]).dtype, name
    return folded, count


def _ops(graph):
    return [node.op for node in graph.nodes]


def test_shape_and_size_of_static_tensor_fold():
    graph = _graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Size", ["x"], ["size"]),
         helper.make_node("Cast", ["size"], ["size_f"], to=F32),
         helper.make_node("Mul", ["x", "size_f"], ["y"])],
        [_vi("x", F32, [2, 3, 4])], [_vi("y"), _vi("shape", I64)])
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    folded, count = _fold_and_compare(graph, {"x": x})
    assert count == 3  # Shape, Size and the Cast of the folded Size
    assert _ops(folded) == ["Mul"]
    np.testing.assert_array_equal(folded.constants["shape"], [2, 3, 4])
    assert folded.constants["shape"].dtype == np.int64
    assert folded.constants["size_f"] == np.float32(24)
    assert "x" in folded.inputs  # still read by Mul


def test_shape_with_start_and_end_folds_to_the_slice():
    graph = _graph([helper.make_node("Shape", ["x"], ["s"], start=1, end=-1)],
                   [_vi("x", F32, [2, 3, 4, 5])], [_vi("s", I64)], opset=15)
    folded, count = _fold_and_compare(graph, {"x": np.zeros((2, 3, 4, 5), np.float32)})
    assert count == 1 and folded.nodes == []
    np.testing.assert_array_equal(folded.constants["s"], [3, 4])


def test_shape_of_a_symbolic_tensor_folds_only_once_specialized():
    graph = _graph([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Cast", ["s"], ["sf"], to=F32),
                    helper.make_node("ReduceSum", ["sf"], ["y"], keepdims=0)],
                   [_vi("x", F32, ["N", 3])], [_vi("y")])
    dynamic = copy.deepcopy(graph)
    assert fold_constants(dynamic) == 0
    assert _ops(dynamic) == ["Shape", "Cast", "ReduceSum"]

    static = specialize(graph, {"x": (5, 3)})
    x = np.ones((5, 3), np.float32)
    folded, count = _fold_and_compare(static, {"x": x})
    assert count == 3 and folded.nodes == []
    assert folded.constants["y"] == np.float32(8)


def test_chain_of_constant_ops_folds_into_one_constant():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    graph = _graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
         helper.make_node("Mul", ["wt", "two"], ["w2"]),
         helper.make_node("Relu", ["w2"], ["wr"]),
         helper.make_node("Reshape", ["wr", "shape"], ["wflat"]),
         helper.make_node("Slice", ["wflat", "starts", "ends"], ["wpart"]),
         helper.make_node("Add", ["x", "wpart"], ["y"])],
        [_vi("x", F32, [6])], [_vi("y")],
        {"w": w, "two": np.float32(2), "shape": np.array([-1], np.int64),
         "starts": np.array([3], np.int64), "ends": np.array([9], np.int64)})
    x = rng.standard_normal(6).astype(np.float32)
    folded, count = _fold_and_compare(graph, {"x": x})
    assert count == 5
    assert _ops(folded) == ["Add"]
    # Only the final folded value survives dead-code elimination; w and the rest are gone.
    assert set(folded.constants) == {folded.nodes[0].inputs[1]}
    np.testing.assert_array_equal(folded.constants["wpart"],
                                  np.maximum(w.T * 2, 0).reshape(-1)[3:9])


def test_graph_of_constants_only_folds_entirely():
    graph = _graph([helper.make_node("Add", ["a", "b"], ["s"]),
                    helper.make_node("Neg", ["s"], ["y"])],
                   [], [_vi("y", TensorProto.INT32)],
                   {"a": np.arange(4, dtype=np.int32), "b": np.int32(3)})
    folded, count = _fold_and_compare(graph, {})
    assert count == 2 and folded.nodes == []
    assert set(folded.constants) == {"y"}
    assert folded.constants["y"].dtype == np.int32


def test_multi_output_node_with_constant_inputs_folds():
    graph = _graph([helper.make_node("Split", ["w", "sizes"], ["p", "q"], axis=0),
                    helper.make_node("Sub", ["q", "x"], ["y"]),
                    helper.make_node("Add", ["p", "x"], ["z"])],
                   [_vi("x", F32, [2])], [_vi("y"), _vi("z")],
                   {"w": np.arange(4, dtype=np.float32), "sizes": np.array([2, 2], np.int64)})
    folded, count = _fold_and_compare(graph, {"x": np.ones(2, np.float32)})
    assert count == 1 and _ops(folded) == ["Sub", "Add"]


def test_large_results_are_not_materialized():
    # ConstantOfShape of a 3-element constant would make 2M floats: it stays a node.
    graph = _graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                          value=numpy_helper.from_array(np.array([0.5], np.float32))),
         helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
         helper.make_node("Tile", ["row", "reps"], ["tiled"]),
         helper.make_node("ReduceMax", ["tiled"], ["tmax"], keepdims=0),
         helper.make_node("Add", ["x", "total"], ["y"]),
         helper.make_node("Add", ["y", "tmax"], ["z"])],
        [_vi("x", F32, [1])], [_vi("z")],
        {"shape": np.array([1024, 1024, 2], np.int64), "row": np.arange(4, dtype=np.float32),
         "reps": np.array([1 << 19], np.int64)})
    folded = copy.deepcopy(graph)
    assert fold_constants(folded) == 0
    assert _ops(folded) == _ops(graph)
    assert max(a.size for a in folded.constants.values()) <= 4


def test_large_result_of_an_equally_large_constant_folds():
    # Folding does not grow the weights here: Neg of a big constant is as big as its input.
    big = np.arange((1 << 20) + 8, dtype=np.float32)
    graph = _graph([helper.make_node("Neg", ["w"], ["nw"]),
                    helper.make_node("ReduceSum", ["nw"], ["s"], keepdims=0),
                    helper.make_node("Add", ["x", "s"], ["y"])],
                   [_vi("x", F32, [1])], [_vi("y")], {"w": big})
    folded, count = _fold_and_compare(graph, {"x": np.zeros(1, np.float32)})
    assert count == 2 and _ops(folded) == ["Add"]
    assert "w" not in folded.constants and "nw" not in folded.constants


def test_control_flow_is_never_folded():
    then_branch = helper.make_graph([helper.make_node("Neg", ["c"], ["t"])], "then", [],
                                    [_vi("t", F32, [2])])
    else_branch = helper.make_graph([helper.make_node("Abs", ["c"], ["e"])], "else", [],
                                    [_vi("e", F32, [2])])
    graph = _graph([helper.make_node("If", ["cond"], ["r"], then_branch=then_branch,
                                     else_branch=else_branch),
                    helper.make_node("Add", ["r", "x"], ["y"])],
                   [_vi("x", F32, [2])], [_vi("y")],
                   {"cond": np.array(True), "c": np.array([1.5, -2], np.float32)})
    folded, count = _fold_and_compare(graph, {"x": np.ones(2, np.float32)})
    assert count == 0 and _ops(folded) == ["If", "Add"]
    assert "c" in folded.constants  # read inside the branches: DCE keeps it


def test_nodes_reading_run_time_inputs_are_kept():
    graph = _graph([helper.make_node("Mul", ["x", "w"], ["y"]),
                    helper.make_node("Shape", ["y"], ["s"])],
                   [_vi("x", F32, [3])], [_vi("y"), _vi("s", I64)],
                   {"w": np.arange(3, dtype=np.float32)})
    folded, count = _fold_and_compare(graph, {"x": np.ones(3, np.float32)})
    assert count == 1 and _ops(folded) == ["Mul"]  # the Shape of a static value folds
