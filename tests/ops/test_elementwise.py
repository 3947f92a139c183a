"""Elementwise, activation and logical ops: symbolic shape inference, errors, the integer and
edge-case semantics the ONNX suite leaves out, shape-value folding, and the opset upgrades."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import positional_graph, run_positional

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, tensor
from ember.ops import RefContext, get_op
from ember.passes.infer_shapes import infer_shapes

F32, F16, I32, I64, BOOL = DType.FLOAT32, DType.FLOAT16, DType.INT32, DType.INT64, DType.BOOL


def _type(op: str, *inputs: TensorType | None, **attrs) -> str:
    return str(positional_graph(op, *inputs, **attrs).types.get("out"))


def _reference(op: str, *args, **attrs):
    """Call an op's reference directly, as shape inference does when it folds values."""
    opdef = get_op(op)
    ctx = RefContext(Node(op, [], ["out"], name="n"), opdef, lambda *a: [])
    return opdef.reference(ctx, *args, **attrs)


def _onnx_run(node, inputs: dict[str, np.ndarray], opset: int) -> np.ndarray:
    """Import a one-node ONNX model of ``opset`` (upgrades apply) and run it."""
    infos = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype),
                                           v.shape) for name, v in inputs.items()]
    graph = helper.make_graph([node], "g", infos,
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceExecutor(import_onnx(model)).run(inputs)["y"]


# ----------------------------------------------------------------------------- shape inference


@pytest.mark.parametrize("op, inputs, attrs, expected", [
    ("Pow", [tensor(F32, "N", 3), tensor(I64, 3)], {}, "f32[N, 3]"),
    ("Mod", [tensor(I32, "N", 1), tensor(I32, 1, "S")], {}, "i32[N, S]"),
    ("BitShift", [tensor(DType.UINT8, "N"), tensor(DType.UINT8)], {"direction": "LEFT"},
     "u8[N]"),
    ("BitwiseNot", [tensor(I32, "N", None)], {}, "i32[N, ?]"),
    ("Max", [tensor(F32, "N", 1, 3), tensor(F32, 4, 1), tensor(F32, 3)], {}, "f32[N, 4, 3]"),
    ("Sum", [tensor(F16, "N", "S")], {}, "f16[N, S]"),
    ("Mean", [tensor(F32, "N", 1), tensor(F32, 1, "S")], {}, "f32[N, S]"),
    ("Clip", [tensor(I64, "N", 2), tensor(I64), tensor(I64)], {}, "i64[N, 2]"),
    ("Erf", [tensor(F32, "B", "T")], {}, "f32[B, T]"),
    ("Equal", [tensor(I64, "N"), tensor(I64, 1)], {}, "bool[N]"),
    ("GreaterOrEqual", [tensor(F32, 2, "N"), tensor(F32, "N")], {}, "bool[2, N]"),
    ("Xor", [tensor(BOOL, "N", 1), tensor(BOOL, 3)], {}, "bool[N, 3]"),
    ("Not", [tensor(BOOL, "N")], {}, "bool[N]"),
    ("Where", [tensor(BOOL, "N", 1), tensor(F16, 1, "S"), tensor(F16)], {}, "f16[N, S]"),
    ("IsNaN", [tensor(F16, "N", 3)], {}, "bool[N, 3]"),
    ("IsInf", [tensor(F32, "N")], {"detect_negative": 0}, "bool[N]"),
    ("Relu", [tensor(I32, "N", None)], {}, "i32[N, ?]"),
    ("Gelu", [tensor(F32, "B", "T", 768)], {"approximate": "tanh"}, "f32[B, T, 768]"),
    ("PRelu", [tensor(F32, "N", 3, "H", "W"), tensor(F32, 3, 1, 1)], {}, "f32[N, 3, H, W]"),
    ("SwiGLU", [tensor(F32, "N", 8), tensor(F32, "N", None)], {}, "f32[N, 8]"),
    ("Pow", [TensorType(F32, None), tensor(F32, 3)], {}, "f32[*]"),
    ("Less", [None, tensor(I64, 3)], {}, "bool[*]"),
])
def test_symbolic_shape_inference(op, inputs, attrs, expected):
    assert _type(op, *inputs, **attrs) == expected


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("Less", [tensor(F32, "N", 3), tensor(F32, 4)], {}, "cannot broadcast"),
    ("Max", [tensor(F32, 3), tensor(F16, 3)], {}, "share one element type"),
    ("BitwiseAnd", [tensor(F32, 3), tensor(F32, 3)], {}, "integer tensor"),
    ("And", [tensor(I32, 3), tensor(I32, 3)], {}, "bool tensor"),
    ("Where", [tensor(F32, 3), tensor(F32, 3), tensor(F32, 3)], {}, "condition"),
    ("Sigmoid", [tensor(I64, "N")], {}, "float tensor"),
    ("PRelu", [tensor(F32, "N", 3, 5), tensor(F32, 4)], {}, "does not broadcast"),
    ("SwiGLU", [tensor(F32, "N", 8), tensor(F32, "N", 4)], {}, "same shape"),
    ("Clip", [tensor(F32, "N"), tensor(F32, 2)], {}, "min must be a scalar"),
])
def test_invalid_inputs_name_the_node(op, inputs, attrs, message):
    with pytest.raises(ShapeError, match=f"node 'n' \\({op}\\).*{message}"):
        positional_graph(op, *inputs, **attrs)


X = np.array([-1.5, 0.5, 2.0], dtype=np.float32)


@pytest.mark.parametrize("op, values, attrs, message", [
    ("Mod", [X, X], {"fmod": 2}, "fmod must be 0 or 1"),
    ("BitShift", [np.arange(3, dtype=np.uint8)] * 2, {"direction": "UP"}, "LEFT' or 'RIGHT"),
    ("Gelu", [X], {"approximate": "erf"}, "approximate must be one of"),
    ("Celu", [X], {"alpha": 0.0}, "alpha must not be 0"),
])
def test_invalid_attributes_name_the_node(op, values, attrs, message):
    with pytest.raises(ShapeError, match=f"node 'n' \\({op}\\).*{message}"):
        run_positional(op, *values, **attrs)


# ----------------------------------------------------------------------------- values


def test_integer_pow_truncates_like_c():
    base = np.array([2, 1, -1, -1, 3, 2], dtype=np.int64)
    exponent = np.array([-1, -3, -3, -2, 2, 62], dtype=np.int64)
    np.testing.assert_array_equal(run_positional("Pow", base, exponent), [0, 1, -1, 1, 9, 2 ** 62])
    fractional = run_positional("Pow", np.array([2, 3], np.int32), np.array([0.5, 1.5], np.float32))
    assert fractional.dtype == np.int32
    np.testing.assert_array_equal(fractional, [1, 5])


def test_float16_pow_keeps_its_type():
    result = run_positional("Pow", np.array([2, 3], np.float16), np.array([10, 2], np.int64))
    assert result.dtype == np.float16
    np.testing.assert_array_equal(result, [1024, 9])


@pytest.mark.parametrize("fmod, expected", [(0, [2, -2, -1, 1]), (1, [-1, 1, -1, 1])])
def test_integer_mod_sign_follows_divisor_or_dividend(fmod, expected):
    a = np.array([-7, 7, -7, 7], dtype=np.int8)
    b = np.array([3, -3, -3, 3], dtype=np.int8)
    np.testing.assert_array_equal(run_positional("Mod", a, b, fmod=fmod), expected)


@pytest.mark.parametrize("direction, x, y, expected", [
    ("RIGHT", [-8, -8, -8, 8], [1, 8, -1, 9], [-4, -1, -1, 0]),
    ("LEFT", [64, 1, 1, -1], [1, 7, 8, -2], [-128, -128, 0, 0]),
])
def test_signed_bit_shifts(direction, x, y, expected):
    result = run_positional("BitShift", np.array(x, np.int8), np.array(y, np.int8),
                            direction=direction)
    assert result.dtype == np.int8
    np.testing.assert_array_equal(result, expected)


def test_clip_bounds_are_optional_and_min_over_max_gives_max():
    x = np.array([-5, 0, 5], dtype=np.int16)
    np.testing.assert_array_equal(run_positional("Clip", x), x)
    low = np.array(-1, np.int16)
    graph = infer_shapes(Graph(  # min absent, max given
        inputs=["x", "high"], outputs=["out"],
        types={"x": tensor(DType.INT16, 3), "high": tensor(DType.INT16)},
        nodes=[Node("Clip", ["x", "", "high"], ["out"], name="n")]))
    assert str(graph.types["out"]) == "i16[3]"
    result = ReferenceExecutor(graph).run({"x": x, "high": low})["out"]
    np.testing.assert_array_equal(result, [-5, -1, -1])
    np.testing.assert_array_equal(run_positional("Clip", x, np.array(3, np.int16), low),
                                  [-1, -1, -1])


def test_max_and_min_propagate_nan():
    a = np.array([1.0, np.nan], np.float32)
    b = np.array([np.nan, 2.0], np.float32)
    assert np.isnan(run_positional("Max", a, b)).all()
    assert np.isnan(run_positional("Min", a, b)).all()


def test_erf_is_exact_in_float64():
    x = np.array([-3.0, -0.1, 1e-10, 0.5, 2.0, 7.0], dtype=np.float64)
    np.testing.assert_array_equal(run_positional("Erf", x), [math.erf(v) for v in x])


@pytest.mark.parametrize("op, attrs, fn", [
    ("Gelu", {}, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x))),
    ("Softplus", {}, lambda x: np.log1p(np.exp(x))),
    ("Mish", {}, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    ("Selu", {}, lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772
                                                           * np.expm1(x))),
])
def test_half_precision_activations_round_once(op, attrs, fn):
    """float16 in, float16 out, correctly rounded from a wide computation (no float16
    intermediates, which underflow for Gelu(-4))."""
    x = np.array([-6.0, -4.0, -1.0, -0.001, 0.0, 0.5, 3.0, 10.0], dtype=np.float16)
    result = run_positional(op, x, **attrs)
    assert result.dtype == np.float16
    np.testing.assert_allclose(result.astype(np.float64), fn(x.astype(np.float64)),
                               rtol=2 ** -10, atol=2 ** -24)


def test_activations_do_not_overflow():
    x = np.array([-1000.0, 1000.0], dtype=np.float32)
    np.testing.assert_array_equal(run_positional("Sigmoid", x), [0.0, 1.0])
    np.testing.assert_array_equal(run_positional("Softplus", x), [0.0, 1000.0])
    np.testing.assert_array_equal(run_positional("Swish", x), [-0.0, 1000.0])


def test_integer_relu_prelu_and_shrink():
    x = np.array([-5, -1, 0, 3], dtype=np.int32)
    np.testing.assert_array_equal(run_positional("Relu", x), [0, 0, 0, 3])
    np.testing.assert_array_equal(run_positional("PRelu", x, np.array([2], np.int32)),
                                  [-10, -2, 0, 3])
    np.testing.assert_array_equal(run_positional("Shrink", x, lambd=1.5, bias=1.5), [-3, 0, 0, 1])


def test_string_equal_and_where():
    a = np.array(["cat", "dog"], dtype=object)
    np.testing.assert_array_equal(run_positional("Equal", a, np.array(["dog"], dtype=object)),
                                  [False, True])
    chosen = run_positional("Where", np.array([True, False]), a, np.array(["-"], dtype=object))
    assert chosen.tolist() == ["cat", "-"]


def test_zero_dim_results_are_arrays():
    """0-d results stay arrays (not numpy scalars), so shape inference can fold them."""
    for op, args in [("Sub", (np.array(3), np.array(1))), ("Equal", (np.array(1), np.array(1))),
                     ("Max", (np.array(2.0), np.array(1.0))), ("Relu", (np.array(-1.0),))]:
        assert isinstance(_reference(op, *args), np.ndarray), op


def test_equal_folds_symbolic_dims_only_when_decidable():
    n = sym("N")
    shape = np.array([n, 3], dtype=object)
    decided = _reference("Equal", shape, np.array([n, 4], dtype=object))
    np.testing.assert_array_equal(decided, [True, False])
    with pytest.raises(ShapeError, match="not decidable"):
        _reference("Equal", shape, np.array([1, 3], dtype=object))
    picked = _reference("Where", np.array([True, False]), shape, np.array([7, 7]))
    assert picked.tolist() == [n, 7]


# ----------------------------------------------------------------------------- upgrades


def test_clip_6_attributes_become_inputs_of_the_input_type():
    node = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)
    x = np.array([-1.0, 0.25, 1.0], dtype=np.float16)
    result = _onnx_run(node, {"x": x}, opset=6)
    assert result.dtype == np.float16
    np.testing.assert_array_equal(result, [-0.5, 0.25, 0.5])


def test_clip_6_defaults_to_float_max_and_clip_1_to_no_bound():
    x = np.array([-np.inf, 1e300, 0.0], dtype=np.float64)
    limit = float(np.finfo(np.float32).max)
    clip_6 = _onnx_run(helper.make_node("Clip", ["x"], ["y"]), {"x": x}, opset=6)
    np.testing.assert_array_equal(clip_6, [-limit, limit, 0.0])
    clip_1 = _onnx_run(helper.make_node("Clip", ["x"], ["y"], consumed_inputs=[0]),
                       {"x": x}, opset=1)
    np.testing.assert_array_equal(clip_1, x)


def test_legacy_broadcast_with_axis_aligns_b():
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=0)
    a = np.zeros((2, 3, 4), dtype=np.float32)
    b = np.array([1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(_onnx_run(node, {"a": a, "b": b}, opset=6),
                                  a + b[:, None, None])


def test_prelu_6_slope_is_per_channel():
    node = helper.make_node("PRelu", ["x", "slope"], ["y"])
    x = -np.ones((1, 3, 2, 2), dtype=np.float32)
    slope = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    np.testing.assert_allclose(_onnx_run(node, {"x": x, "slope": slope}, opset=6),
                               x * slope[:, None, None])


def test_version_1_activations():
    x = np.array([-1.0, 2.0], dtype=np.float32)
    relu = helper.make_node("Relu", ["x"], ["y"], consumed_inputs=[0])
    np.testing.assert_array_equal(_onnx_run(relu, {"x": x}, opset=1), [0.0, 2.0])
    selu = helper.make_node("Selu", ["x"], ["y"])
    np.testing.assert_allclose(_onnx_run(selu, {"x": x}, opset=1),
                               [1.0507 * 1.6732 * math.expm1(-1.0), 1.0507 * 2.0], rtol=1e-6)
