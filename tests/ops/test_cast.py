"""Cast, CastLike, BitCast and Identity: type inference, errors, and the conversion rules the
ONNX suite exercises little (wrap-around, sub-byte types, float8 saturation, float8e8m0
rounding modes, strings) plus folding of symbolic shape values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import positional_graph, run_positional

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Node
from ember.ir.types import SequenceType, TensorType, tensor
from ember.ops import RefContext, get_op

F32 = DType.FLOAT32


def _cast(values, to: DType, dtype=np.float32, **attrs) -> np.ndarray:
    result = run_positional("Cast", np.array(values, dtype=dtype), to=to.onnx, **attrs)
    assert result.dtype == to.numpy
    return result


def _bits(array: np.ndarray) -> list[int]:
    return array.view(np.uint8).tolist()


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize("op, inputs, attrs, expected", [
    ("Cast", [tensor(F32, "N", 3)], {"to": TensorProto.INT64}, "i64[N, 3]"),
    ("Cast", [TensorType(DType.STRING, None)], {"to": TensorProto.FLOAT16}, "f16[*]"),
    ("CastLike", [tensor(DType.FLOAT16, "N"), tensor(DType.BFLOAT16)], {}, "bf16[N]"),
    ("BitCast", [tensor(F32, "N", None)], {"to": TensorProto.INT32}, "i32[N, ?]"),
    ("BitCast", [tensor(DType.INT4, "N")], {"to": TensorProto.FLOAT4E2M1}, "f4e2m1[N]"),
    ("Identity", [SequenceType(tensor(F32, "N"))], {}, "seq<f32[N]>"),
])
def test_type_inference(op, inputs, attrs, expected):
    assert str(positional_graph(op, *inputs, **attrs).types["out"]) == expected


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("Cast", [tensor(F32, 3)], {"to": 99}, "to=99 is not a tensor element type"),
    ("Cast", [tensor(F32, 3)], {"to": 1, "round_mode": "sideways"}, "round_mode must be"),
    ("BitCast", [tensor(F32, 3)], {"to": TensorProto.INT16}, "same bit width"),
    ("BitCast", [tensor(F32, 3)], {"to": TensorProto.STRING}, "strings"),
])
def test_invalid_casts_name_the_node(op, inputs, attrs, message):
    with pytest.raises(ShapeError, match=f"node 'n' \\({op}\\).*{message}"):
        positional_graph(op, *inputs, **attrs)


def test_unparsable_string_names_the_node():
    with pytest.raises(ShapeError, match="node 'n' \\(Cast\\).*'hello'"):
        _cast(["1.5", "hello"], DType.FLOAT32, dtype=object)


# ----------------------------------------------------------------------------- numbers


def test_float_to_integer_truncates_then_wraps():
    values = [2.9, -2.9, 300.7, -1.5, 2.0 ** 63]
    np.testing.assert_array_equal(_cast(values, DType.UINT8, dtype=np.float64),
                                  [2, 254, 44, 255, 0])
    np.testing.assert_array_equal(_cast(values, DType.INT8, dtype=np.float64),
                                  [2, -2, 44, -1, 0])
    assert _cast([2.0 ** 63 + 2048], DType.UINT64, dtype=np.float64)[0] == 2 ** 63 + 2048


@pytest.mark.parametrize("source, to, expected", [
    (np.int64, DType.INT4, [7, -8, -1, 0]),
    (np.int64, DType.UINT2, [3, 0, 3, 0]),
    (ml_dtypes.int4, DType.UINT4, [7, 8, 15, 0]),
    (ml_dtypes.uint4, DType.INT2, [-1, 0, -1, 0]),
])
def test_sub_byte_integers_wrap(source, to, expected):
    values = np.array([7, 8, -1, 16]).astype(np.int64).astype(source)
    np.testing.assert_array_equal(run_positional("Cast", values, to=to.onnx).astype(np.int64),
                                  expected)


def test_bool_conversions():
    np.testing.assert_array_equal(_cast([0.0, -0.0, 0.1, np.nan], DType.BOOL),
                                  [False, False, True, True])
    np.testing.assert_array_equal(_cast([True, False], DType.FLOAT16, dtype=bool), [1.0, 0.0])


@pytest.mark.parametrize("to, saturate, expected", [
    (DType.FLOAT8E4M3FN, 1, [448.0, -448.0, 448.0, np.nan, -0.0]),
    (DType.FLOAT8E4M3FN, 0, [np.nan, np.nan, np.nan, np.nan, -0.0]),
    (DType.FLOAT8E5M2, 0, [np.inf, -np.inf, np.inf, np.nan, -0.0]),
    (DType.FLOAT8E5M2FNUZ, 1, [57344.0, -57344.0, 57344.0, np.nan, 0.0]),
    (DType.FLOAT8E4M3FNUZ, 0, [np.nan, np.nan, np.nan, np.nan, 0.0]),
])
def test_float8_saturation(to, saturate, expected):
    result = _cast([1e6, -1e6, np.inf, np.nan, -0.0], to, saturate=saturate)
    np.testing.assert_array_equal(result.astype(np.float32), expected)
    assert np.signbit(result.astype(np.float32)[-1]) == np.signbit(expected[-1])


def test_integers_saturate_into_float8():
    np.testing.assert_array_equal(
        _cast([1000, -3], DType.FLOAT8E4M3FN, dtype=np.int32).astype(np.float32), [448, -3])


E8M0_INPUTS = [0.0, 2.0 ** -130, 0.124, 0.1875, 0.19, 0.25, 1.5, 3.0, 2.0 ** 127 * 1.5, np.inf,
               np.nan]


@pytest.mark.parametrize("round_mode, saturate, expected", [
    ("up", 1, [0, 0, 124, 125, 125, 125, 128, 129, 254, 254, 255]),
    ("down", 1, [0, 0, 123, 124, 124, 125, 127, 128, 254, 254, 255]),
    ("nearest", 1, [0, 0, 124, 125, 125, 125, 128, 129, 254, 254, 255]),
    ("nearest", 0, [255, 255, 124, 125, 125, 125, 128, 129, 255, 255, 255]),
])
def test_float8e8m0_rounding_modes(round_mode, saturate, expected):
    """Codes of 2**(code - 127); 255 is NaN.  'nearest' rounds halfway (0.1875) up."""
    result = _cast(E8M0_INPUTS, DType.FLOAT8E8M0, round_mode=round_mode, saturate=saturate)
    assert _bits(result) == expected


# ----------------------------------------------------------------------------- strings


def test_numbers_to_strings():
    floats = _cast([0.47892547, 1e10, -2.5, np.nan, np.inf, -np.inf], DType.STRING)
    assert floats.tolist() == ["0.47892547", "1e+10", "-2.5", "NaN", "INF", "-INF"]
    assert _cast([-7, 2 ** 40], DType.STRING, dtype=np.int64).tolist() == ["-7", "1099511627776"]
    assert _cast([True, False], DType.STRING, dtype=bool).tolist() == ["1", "0"]


def test_strings_to_numbers():
    texts = ["3.5", "1e-5", "1E8", "+INF", "-inf", "NaN", " 42 "]
    result = _cast(texts, DType.FLOAT32, dtype=object)
    np.testing.assert_array_equal(result, np.array([3.5, 1e-5, 1e8, np.inf, -np.inf, np.nan,
                                                    42], dtype=np.float32))
    ints = _cast(["100.5", "-2.7", "18446744073709551615", "1e3"], DType.UINT64, dtype=object)
    np.testing.assert_array_equal(ints, [100, 2 ** 64 - 2, 2 ** 64 - 1, 1000])
    np.testing.assert_array_equal(_cast(["0", "0.0", "2"], DType.BOOL, dtype=object),
                                  [False, False, True])
    saturated = _cast(["1e6"], DType.FLOAT8E4M3FN, dtype=object)
    assert saturated.astype(np.float32)[0] == 448.0


def test_cast_like_takes_the_type_of_its_second_input():
    result = run_positional("CastLike", np.array([1.7, -1.7], np.float32), np.zeros(5, np.int16))
    assert result.dtype == np.int16
    np.testing.assert_array_equal(result, [1, -1])


# ----------------------------------------------------------------------------- BitCast


def test_bit_cast_keeps_bits():
    x = np.array([1.0, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(run_positional("BitCast", x, to=TensorProto.INT32),
                                  x.view(np.int32))
    scalar = run_positional("BitCast", np.array(1.0, np.float16), to=TensorProto.UINT16)
    assert scalar.shape == () and scalar == 0x3C00


def test_bit_cast_of_sub_byte_types():
    x = np.array([-1, -8, 7], dtype=ml_dtypes.int4)
    as_uint4 = run_positional("BitCast", x, to=TensorProto.UINT4)
    np.testing.assert_array_equal(as_uint4.astype(np.int64), [15, 8, 7])
    as_float4 = run_positional("BitCast", x, to=TensorProto.FLOAT4E2M1)
    np.testing.assert_array_equal(as_float4.astype(np.float32), [-6.0, -0.0, 6.0])


def test_bit_cast_to_bool_keeps_truth():
    result = run_positional("BitCast", np.array([0, 1, 7], np.uint8), to=TensorProto.BOOL)
    np.testing.assert_array_equal(result, [False, True, True])


# ----------------------------------------------------------------------------- folding


def test_integer_casts_keep_symbolic_shape_values():
    """Shape inference folds Cast(Shape(x), INT64): symbolic dims pass integer casts."""
    opdef = get_op("Cast")
    ctx = RefContext(Node("Cast", [], ["out"], name="n"), opdef, lambda *a: [])
    shape = np.array([sym("N"), 3], dtype=object)
    folded = opdef.reference(ctx, shape, to=TensorProto.INT32, saturate=1, round_mode="up")
    assert folded.tolist() == [sym("N"), 3]


def test_cast_1_takes_a_type_name():
    node = helper.make_node("Cast", ["x"], ["y"], to="INT32")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)])
    result = ReferenceExecutor(import_onnx(model)).run({"x": np.array([1.5, -2.5], np.float32)})
    assert result["y"].dtype == np.int32
    np.testing.assert_array_equal(result["y"], [1, -2])
