"""Matrix products (MatMul, Gemm, Einsum, Det, MatMulInteger, QLinearMatMul) and the linear
quantization ops they pair with (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear):
symbolic shape inference, numbers against numpy, dtypes, errors, and upgrades."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import node_types, run_node

from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import tensor

F32 = DType.FLOAT32
RNG = np.random.default_rng(0)


def _run(op: str, *values, outputs: int = 1, **attrs):
    """``run_node`` on inputs that may also be lists or Python scalars."""
    return run_node(op, *map(np.asarray, values), outputs=outputs, **attrs)


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize("a, b, expected", [
    (("N", "S", 64), (64, 128), "f32[N, S, 128]"),
    ((64,), ("N", 64, 10), "f32[N, 10]"),
    (("N", 3, 64), (64,), "f32[N, 3]"),
    ((7,), (7,), "f32[]"),
    (("B", 1, "M", 8), ("H", 8, 5), "f32[B, H, M, 5]"),
])
def test_matmul_symbolic_shapes(a, b, expected):
    assert node_types("MatMul", {"a": tensor(F32, *a), "b": tensor(F32, *b)}) == [expected]


def test_gemm_and_quantized_matmul_types():
    gemm = {"a": tensor(F32, 64, "N"), "b": tensor(F32, 10, 64), "c": tensor(F32, 10)}
    assert node_types("Gemm", gemm, transA=1, transB=1) == ["f32[N, 10]"]
    u8 = DType.UINT8
    assert node_types("MatMulInteger", {"a": tensor(u8, "N", 4), "b": tensor(u8, 4, 3)}) == \
        ["i32[N, 3]"]
    scalar = tensor(F32)
    qlinear = {"a": tensor(u8, "N", 4), "as": scalar, "az": tensor(u8), "b": tensor(u8, 4, 3),
               "bs": scalar, "bz": tensor(u8), "ys": scalar, "yz": tensor(DType.INT8)}
    assert node_types("QLinearMatMul", qlinear) == ["i8[N, 3]"]


def test_einsum_and_det_symbolic_shapes():
    inputs = {"a": tensor(F32, "B", "I", 4), "b": tensor(F32, "B", 4, "K")}
    assert node_types("Einsum", inputs, equation="bij,bjk->bik") == ["f32[B, I, K]"]
    assert node_types("Einsum", inputs, equation="bij,bjk") == ["f32[I, K]"]  # implicit: i, k
    ellipsis = {"a": tensor(F32, "N", 3, 5, 5)}
    assert node_types("Einsum", ellipsis, equation="...ii->...i") == ["f32[N, 3, 5]"]
    assert node_types("Det", {"x": tensor(F32, "N", 3, 3)}) == ["f32[N]"]


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("MatMul", {"a": tensor(F32, "N", 3), "b": tensor(F32, 4, 5)}, {}, "inner dimensions"),
    ("MatMul", {"a": tensor(F32, 2, 3, 4), "b": tensor(F32, 3, 4, 5)}, {}, "do not broadcast"),
    ("Gemm", {"a": tensor(F32, 3, 4), "b": tensor(F32, 4, 5), "c": tensor(F32, 3, 2)}, {},
     "does not broadcast"),
    ("Gemm", {"a": tensor(F32, 3, 4, 1), "b": tensor(F32, 4, 5)}, {}, "2-D"),
    ("Einsum", {"a": tensor(F32, 3, 4)}, {"equation": "ij,jk->ik"}, "2 operand terms"),
    ("Einsum", {"a": tensor(F32, 3, 4), "b": tensor(F32, 5, 6)}, {"equation": "ij,jk"},
     "index 'j'"),
    ("Det", {"x": tensor(F32, 2, 3, 4)}, {}, "not square"),
])
def test_errors_name_the_node(op, inputs, attrs, message):
    with pytest.raises(ShapeError, match=message) as info:
        node_types(op, inputs, **attrs)
    assert f"node 'n' ({op})" in str(info.value)


# ----------------------------------------------------------------------------- numbers


def test_matmul_half_precision_and_integers():
    a = RNG.standard_normal((2, 3, 8)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((8, 5)).astype(ml_dtypes.bfloat16)
    y = _run("MatMul", a, b)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(y.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-2, atol=2e-2)
    big = np.array([[2 ** 31 - 1]], np.int32)
    assert _run("MatMul", big, np.array([[2]], np.int32))[0, 0] == -2  # wraps, as int32 does


def test_gemm_all_attributes_and_int64_exactness():
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((5, 4)).astype(np.float32)
    c = RNG.standard_normal((1, 5)).astype(np.float32)
    y = _run("Gemm", a, b, c, transA=1, transB=1, alpha=0.5, beta=-2.0)
    np.testing.assert_allclose(y, 0.5 * a.T @ b.T - 2.0 * c, rtol=1e-5)
    a64 = np.array([[2 ** 40 + 1]], np.int64)
    assert _run("Gemm", a64, np.array([[3]], np.int64), np.array([1], np.int64))[0, 0] == \
        3 * (2 ** 40 + 1) + 1


def test_einsum_contractions():
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    c = RNG.standard_normal((5,)).astype(np.float32)
    y = _run("Einsum", a, b, c, equation="bij, jk, k -> bi")
    np.testing.assert_allclose(y, np.einsum("bij,jk,k->bi", a, b, c), rtol=1e-5)
    i = RNG.integers(-3, 3, (3, 3)).astype(np.int32)
    assert _run("Einsum", i, equation="ii").dtype == np.int32


def test_det_batches_and_half_precision():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float16)
    y = _run("Det", x)
    assert y.dtype == np.float16 and y.shape == (2, 3)
    np.testing.assert_allclose(y, np.linalg.det(x.astype(np.float64)), rtol=1e-2, atol=1e-2)


def test_integer_matmuls_with_zero_points():
    a = RNG.integers(0, 255, (4, 6)).astype(np.uint8)
    b = RNG.integers(-128, 127, (6, 3)).astype(np.int8)
    a_zero = np.array([1, 2, 3, 4], np.uint8)  # per row of A
    b_zero = np.array([-1, 0, 1], np.int8)  # per column of B
    y = _run("MatMulInteger", a, b, a_zero, b_zero)
    expected = (a.astype(np.int64) - a_zero[:, None]) @ (b.astype(np.int64) - b_zero)
    np.testing.assert_array_equal(y, expected)
    q = _run("QLinearMatMul", a, np.float32(0.02), np.uint8(3), b, np.float32(0.05), np.int8(0),
             np.float32(0.4), np.uint8(100))
    exact = (a.astype(np.int64) - 3) @ b.astype(np.int64)
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, np.clip(np.rint(exact * (0.02 * 0.05 / 0.4)) + 100, 0, 255))


# ----------------------------------------------------------------------------- quantization


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 300.0, -300.0], np.float32)
    np.testing.assert_array_equal(_run("QuantizeLinear", x, np.float32(1.0), np.int8(0)),
                                  [0, 2, 2, 0, -2, 127, -128])
    y = _run("QuantizeLinear", x, np.float32(1.0), output_dtype=TensorProto.INT4)
    assert y.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(y.astype(np.int8), [0, 2, 2, 0, -2, 7, -8])
    assert _run("QuantizeLinear", x, np.float32(1.0)).dtype == np.uint8  # the default type


def test_quantize_float8_saturate_flag():
    x = np.array([1000.0, -np.inf, 1.0], np.float32)
    e4m3 = TensorProto.FLOAT8E4M3FN
    saturated = _run("QuantizeLinear", x, np.float32(1.0), output_dtype=e4m3)
    np.testing.assert_array_equal(saturated.astype(np.float32), [448.0, -448.0, 1.0])
    wrapped = _run("QuantizeLinear", x, np.float32(1.0), output_dtype=e4m3, saturate=0)
    assert np.isnan(wrapped.astype(np.float32)[:2]).all()


def test_per_axis_and_blocked_quantization_round_trip():
    x = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    scale = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    zero = np.array([10, 20, 30, 40], np.uint8)
    q = _run("QuantizeLinear", x, scale, zero, axis=-1)
    np.testing.assert_array_equal(q, np.clip(np.rint(x / scale) + zero, 0, 255))
    back = _run("DequantizeLinear", q, scale, zero, axis=2)
    np.testing.assert_allclose(back, (q.astype(np.float32) - zero) * scale, rtol=1e-6)
    blocked = RNG.random((2, 2, 4)).astype(np.float32) + 0.5  # blocks of 4 along axis 1
    q = _run("QuantizeLinear", x, blocked, block_size=4, axis=1, output_dtype=TensorProto.INT8)
    expanded = np.repeat(blocked, 4, axis=1)[:, :6]
    np.testing.assert_array_equal(q, np.clip(np.rint(x / expanded), -128, 127))


def test_dequantize_output_dtype_and_errors():
    x = np.array([0, 128, 255], np.uint8)
    y = _run("DequantizeLinear", x, np.float32(0.5), np.uint8(128),
             output_dtype=TensorProto.FLOAT16)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, [-64.0, 0.0, 63.5])
    with pytest.raises(EmberError, match="blocks of 4"):
        _run("DequantizeLinear", np.zeros((2, 9), np.uint8), np.ones((2, 2), np.float32),
             axis=1, block_size=4)
    with pytest.raises(ShapeError, match="zero point's type"):
        node_types("QuantizeLinear", {"x": tensor(F32, 3), "s": tensor(F32),
                                      "z": tensor(DType.INT8)}, output_dtype=TensorProto.UINT8)


def test_dynamic_quantize_linear():
    x = np.array([-1.0, 0.0, 2.0, 4.0], np.float32)
    y, scale, zero = _run("DynamicQuantizeLinear", x, outputs=3)
    assert scale == np.float32(5.0 / 255) and zero == 51
    np.testing.assert_array_equal(y, np.clip(np.rint(x / scale) + 51, 0, 255))
    y, scale, zero = _run("DynamicQuantizeLinear", np.zeros(3, np.float32), outputs=3)
    assert (y == 0).all() and zero == 0 and np.isfinite(scale)
    assert node_types("DynamicQuantizeLinear", {"x": tensor(F32, "N", 4)}, outputs=3) == \
        ["u8[N, 4]", "f32[]", "u8[]"]


# ----------------------------------------------------------------------------- upgrades


def test_gemm_6_broadcast_attribute_is_dropped():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], broadcast=1, beta=2.0)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in (("a", [2, 3]), ("b", [3, 4]), ("c", [4]))]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    imported = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)]))
    assert "broadcast" not in imported.nodes[0].attrs
    assert str(imported.types["y"]) == "f32[2, 4]"
    a, b, c = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 3), (3, 4), (4,)))
    y = ReferenceExecutor(imported).run({"a": a, "b": b, "c": c})["y"]
    np.testing.assert_allclose(y, a @ b + 2 * c, rtol=1e-5)
