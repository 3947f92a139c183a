"""Reductions (Reduce*, ArgMax/ArgMin, CumSum/CumProd): symbolic shape inference, edge cases
the ONNX suite leaves out (empty sets, no-op axes, half precision), errors, and upgrades."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import node_graph, node_types, run_node

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType, tensor
from ember.ops import get_op

F32 = DType.FLOAT32


AXES_1 = {"axes": np.array([1], dtype=np.int64)}
X = {"x": tensor(F32, "N", 3, "S")}


# ----------------------------------------------------------------------------- shape inference


@pytest.mark.parametrize("attrs, constants, expected", [
    ({}, AXES_1, "f32[N, 1, S]"),
    ({"keepdims": 0}, AXES_1, "f32[N, S]"),
    ({"keepdims": 0}, {"axes": np.array([-1, 0], dtype=np.int64)}, "f32[3]"),
    ({}, {}, "f32[1, 1, 1]"),
    ({"keepdims": 0}, {}, "f32[]"),
    ({"noop_with_empty_axes": 1}, {}, "f32[N, 3, S]"),
    ({"noop_with_empty_axes": 1, "keepdims": 0}, {"axes": np.zeros(0, np.int64)},
     "f32[N, 3, S]"),
])
def test_reduce_symbolic_shapes(attrs, constants, expected):
    assert node_types("ReduceSum", X, constants=constants, **attrs) == [expected]


def test_reduce_with_run_time_axes():
    inputs = {"x": tensor(F32, "N", 1, "S"), "axes": tensor(DType.INT64, 2)}
    assert node_types("ReduceMean", inputs) == ["f32[?, 1, ?]"]
    assert node_types("ReduceMean", inputs, keepdims=0) == ["f32[?]"]


def test_reduce_of_unknown_rank():
    inputs = {"x": TensorType(F32, None)}
    assert node_types("ReduceMax", inputs, keepdims=0) == ["f32[]"]
    assert node_types("ReduceMax", inputs, constants=AXES_1) == ["f32[*]"]


def test_arg_and_cumulative_shapes():
    assert node_types("ArgMax", X, axis=-1, keepdims=0) == ["i64[N, 3]"]
    assert node_types("ArgMin", X, axis=1) == ["i64[N, 1, S]"]
    axis = {"axis": np.array(2, dtype=np.int32)}
    assert node_types("CumSum", X, constants=axis) == ["f32[N, 3, S]"]


@pytest.mark.parametrize("op, attrs, constants, message", [
    ("ReduceSum", {}, {"axes": np.array([1, -2], np.int64)}, "same axis twice"),
    ("ReduceL2", {}, {"axes": np.array([3], np.int64)}, "out of range"),
    ("ArgMax", {"axis": 5}, {}, "out of range"),
    ("CumProd", {}, {"axis": np.array([0, 1], np.int64)}, "one integer"),
])
def test_invalid_axes_name_the_node(op, attrs, constants, message):
    with pytest.raises(ShapeError, match=f"node 'n' \\({op}\\).*{message}"):
        node_graph(op, X, constants=constants, **attrs)


# ----------------------------------------------------------------------------- values

DATA = np.array([[1.5, -2.0, 3.0], [0.25, 4.0, -1.0]], dtype=np.float32)


@pytest.mark.parametrize("op, expected", [
    ("ReduceSum", DATA.sum(1)),
    ("ReduceMean", DATA.mean(1)),
    ("ReduceMax", DATA.max(1)),
    ("ReduceMin", DATA.min(1)),
    ("ReduceProd", DATA.prod(1)),
    ("ReduceL1", np.abs(DATA).sum(1)),
    ("ReduceL2", np.sqrt((DATA ** 2).sum(1))),
    ("ReduceSumSquare", (DATA ** 2).sum(1)),
    ("ReduceLogSumExp", np.log(np.exp(DATA).sum(1))),
])
def test_reductions_match_numpy(op, expected):
    result = run_node(op, DATA, np.array([-1], np.int64), keepdims=0)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=1e-6)


@pytest.mark.parametrize("op, data, expected", [
    ("ReduceSum", np.zeros((2, 0), np.float32), [0, 0]),
    ("ReduceProd", np.zeros((2, 0), np.int32), [1, 1]),
    ("ReduceMax", np.zeros((2, 0), np.float32), [-np.inf, -np.inf]),
    ("ReduceMax", np.zeros((2, 0), np.int8), [-128, -128]),
    ("ReduceMin", np.zeros((2, 0), np.bool_), [True, True]),
    ("ReduceLogSum", np.zeros((2, 0), np.float32), [-np.inf, -np.inf]),
    ("ReduceLogSumExp", np.zeros((2, 0), np.float64), [-np.inf, -np.inf]),
])
def test_empty_set_reductions_give_the_identity(op, data, expected):
    result = run_node(op, data, np.array([1], np.int64), keepdims=0)
    assert result.dtype == data.dtype
    np.testing.assert_array_equal(result, np.array(expected, dtype=data.dtype))


def test_noop_with_empty_axes_still_applies_elementwise_steps():
    square = run_node("ReduceSumSquare", DATA, noop_with_empty_axes=1)
    np.testing.assert_array_equal(square, DATA * DATA)
    log = run_node("ReduceLogSum", np.abs(DATA), noop_with_empty_axes=1)
    np.testing.assert_allclose(log, np.log(np.abs(DATA)), rtol=1e-6)


def test_log_sum_exp_does_not_overflow():
    data = np.array([1000.0, 1000.0], dtype=np.float32)
    assert run_node("ReduceLogSumExp", data, keepdims=0) == pytest.approx(1000 + np.log(2))


def test_half_precision_sums_accumulate_in_float32():
    data = np.full(4096, 0.1, dtype=np.float16)
    result = run_node("ReduceSum", data, keepdims=0)
    assert result.dtype == np.float16
    assert float(result) == pytest.approx(409.6, rel=1e-3)


def test_reduce_mean_of_integers_truncates_toward_zero():
    data = np.array([[-3, -4], [3, 4]], dtype=np.int32)
    np.testing.assert_array_equal(run_node("ReduceMean", data, np.array([1], np.int64)),
                                  [[-3], [3]])


def test_reduce_prod_folds_symbolic_dims():
    """infer_shapes folds ReduceProd over Shape values, which may hold symbols."""
    opdef = get_op("ReduceProd")
    dims = np.array([sym("N"), 3, sym("S")], dtype=object)
    folded = opdef.reference(None, dims, None, keepdims=0, noop_with_empty_axes=0)
    assert folded.item() == sym("N") * sym("S") * 3


def test_arg_max_select_last_index():
    data = np.array([[2, 7, 7], [5, 5, 1]], dtype=np.int32)
    np.testing.assert_array_equal(run_node("ArgMax", data, axis=1, keepdims=0), [1, 0])
    np.testing.assert_array_equal(
        run_node("ArgMax", data, axis=1, keepdims=0, select_last_index=1), [2, 1])
    np.testing.assert_array_equal(
        run_node("ArgMin", data, axis=0, select_last_index=1), [[0, 1, 1]])


def test_arg_max_over_an_empty_axis_is_an_error():
    with pytest.raises(ShapeError, match="length 0"):
        run_node("ArgMax", np.zeros((2, 0), np.float32), axis=1)


@pytest.mark.parametrize("exclusive, reverse, expected", [
    (0, 0, [2, 6, 24]), (1, 0, [1, 2, 6]), (0, 1, [24, 12, 4]), (1, 1, [12, 4, 1]),
])
def test_cum_prod_modes(exclusive, reverse, expected):
    result = run_node("CumProd", np.array([2, 3, 4], np.int64), np.array(0, np.int32),
                      exclusive=exclusive, reverse=reverse)
    np.testing.assert_array_equal(result, expected)


# ----------------------------------------------------------------------------- upgrades


def test_old_reduce_axes_attribute_becomes_an_input():
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    imported = import_onnx(model)
    (reduce_node,) = imported.nodes
    assert len(reduce_node.inputs) == 2 and "axes" not in reduce_node.attrs
    assert str(imported.types["y"]) == "f32[N]"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(ReferenceExecutor(imported).run({"x": x})["y"], [1, 4])
