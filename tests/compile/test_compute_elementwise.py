"""Compiled elementwise ops (ember/ops/compute/elementwise.py) against the numpy references.

Each test compiles ONE graph holding many single-node cases (one C compile per test, so the
file stays fast), asserts that no node fell back to numpy, and compares every output with the
reference executor: exactly for integers and bools, within a tolerance of the dtype for floats
(libm and numpy's own SIMD math differ by a few ulp).

The helpers at the top are shared with test_compute_shape.py.
"""

from __future__ import annotations

import zlib
from typing import Any, Collection, Sequence

import compute_cases
import ml_dtypes
import numpy as np
import onnx
import pytest
from compute_cases import Case, assert_cases_close, build_graph
from onnx import TensorProto, helper

import ember
from ember.core.dtypes import DType
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng()  # reseeded for every test by fixed_seed

# (rtol, atol) per float dtype: a few ulp of the type, more for the narrow ones.
TOLERANCE = {
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-12, 1e-14),
    np.dtype(np.float16): (2e-3, 1e-4),
    BF16: (1.6e-2, 1e-3),
}


# ----------------------------------------------------------------------------- shared helpers


@pytest.fixture(autouse=True)
def fixed_seed(request: pytest.FixtureRequest) -> None:
    """Each test draws the same data whichever tests run, in whatever order."""
    seeded = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    RNG.bit_generator.state = seeded.bit_generator.state


def check_cases(cases: Sequence[Case], tolerance: tuple[float, float] | None = None,
                opt_level: int = 2, host_ops: Collection[str] = ()) -> None:
    """Compile the cases as one graph: every node must be a compiled kernel (but those of
    ``host_ops``) and every output must match the reference executor."""
    graph, feeds = build_graph(cases)
    with np.errstate(all="ignore"):
        expected = ReferenceExecutor(graph).run(feeds)
    module = ember.compile(graph, opt_level=opt_level)
    build = module.build
    assert [i for i in build.host_nodes if i.node.op not in host_ops] == [], build.report()
    assert_cases_close(cases, module.run(feeds), expected, TOLERANCE, tolerance)


def assert_close(got: np.ndarray, want: np.ndarray, what: str,
                 tolerance: tuple[float, float] | None = None) -> None:
    compute_cases.assert_close(got, want, what, TOLERANCE, tolerance)


def floats(shape: Sequence[int], dtype: Any = np.float32, scale: float = 2.0) -> np.ndarray:
    return (RNG.standard_normal(tuple(shape)) * scale).astype(dtype)


def integers(shape: Sequence[int], dtype: Any, low: int = -20, high: int = 20) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(max(low, info.min), min(high, info.max), tuple(shape),
                        endpoint=True).astype(dtype)


def with_specials(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN, +-inf, -0 and round-half cases in its first elements."""
    x = x.copy()
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.5, 2.5, -1.5, 0.0]
    x.reshape(-1)[:len(specials)] = np.array(specials[:x.size]).astype(x.dtype)
    return x


# ----------------------------------------------------------------------------- unary

FLOAT_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]

UNARY_ANY_DOMAIN = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Ceil", "Floor", "Round",
                    "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Tanh", "Sign", "Erf",
                    "IsNaN", "IsInf"]
ACTIVATIONS = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
    ("Celu", {"alpha": 2.0}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Mish", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}), ("Softplus", {}),
    ("Softsign", {}), ("Sigmoid", {}), ("Swish", {"alpha": 1.5}),
    ("ThresholdedRelu", {"alpha": 0.5}), ("Shrink", {"bias": 0.3, "lambd": 0.6}),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_unary_math_and_activations(dtype):
    x = with_specials(floats((3, 7), dtype))
    unit = np.clip(floats((33,), scale=0.5), -0.99, 0.99).astype(dtype)
    wide = np.array([-200, -90, -20, -1, 0, 1, 20, 90, 200], np.float32).astype(dtype)
    cases = [Case(op, [x]) for op in UNARY_ANY_DOMAIN]
    cases += [Case(op, [unit]) for op in ("Asin", "Acos", "Atanh")]
    cases += [Case("Acosh", [(np.abs(unit) + 1).astype(dtype)])]
    cases += [Case("IsInf", [x], {"detect_negative": 0}),
              Case("IsInf", [x], {"detect_positive": 0}),
              Case("IsInf", [x], {"detect_negative": 0, "detect_positive": 0})]
    cases += [Case(op, [x], attrs) for op, attrs in ACTIVATIONS]
    cases += [Case(op, [wide]) for op in ("Sigmoid", "Softplus", "Mish", "Swish", "Gelu")]
    check_cases(cases)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32], ids=str)
def test_unary_integers(dtype):
    x = integers((4, 9), dtype, -128, 127)
    x.reshape(-1)[0] = np.iinfo(dtype).min  # abs/neg wrap around like numpy
    x.reshape(-1)[1] = np.iinfo(dtype).max
    cases = [Case(op, [x]) for op in ("Abs", "Neg", "Sign", "Relu", "BitwiseNot", "Erf")]
    cases += [Case("Shrink", [x], {"bias": 1.5, "lambd": 2.0}),
              Case("PRelu", [x, integers((9,), dtype, -3, 3)])]
    check_cases(cases)


# ----------------------------------------------------------------------------- binary

ARITHMETIC = ["Add", "Sub", "Mul", "Div"]
COMPARISONS = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
VARIADIC = ["Max", "Min", "Sum"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_binary_floats_broadcast(dtype):
    a = with_specials(floats((2, 3, 7), dtype))
    b = floats((3, 1), dtype)
    b[1, 0] = 0  # division and remainder by zero
    c = floats((7,), dtype)
    scalar = np.array(1.25, dtype)
    cases = [Case(op, [a, b]) for op in ARITHMETIC + COMPARISONS + VARIADIC]
    cases += [Case(op, [b, a]) for op in ("Sub", "Div", "Less")]  # broadcast the other way
    cases += [Case(op, [a, b, c]) for op in VARIADIC + ["Mean"]]
    cases += [Case("Mean", [a, b]), Case("Max", [c]), Case("Add", [a, scalar])]
    cases += [Case("Mod", [a, b], {"fmod": 1}), Case("Mod", [a, b], {"fmod": 0}),
              Case("Mod", [floats((5,), dtype), np.array([-2.5], dtype)], {"fmod": 0})]
    cases += [Case("Pow", [np.abs(a), b]), Case("Pow", [a, c]),
              Case("Pow", [a, np.array(2.0, dtype)], constants={1}),
              Case("Pow", [a, np.array(3.0, dtype)], constants={1}),  # a cube: multiplies
              Case("Pow", [a, np.array([1, 2, 3, 0, -1, 2, 3], np.int64)])]
    cases += [Case("PRelu", [a, c]), Case("PRelu", [a, b])]
    cases += [Case("Where", [RNG.random((3, 1)) > 0.5, a, c]),
              Case("Clip", [a, np.array(-0.5, dtype), np.array(0.7, dtype)]),
              Case("Clip", [a, np.array([-0.5], dtype), None]),
              Case("Clip", [a, None, np.array(0.2, dtype)]),
              Case("Clip", [a, np.array(1.0, dtype), np.array(-1.0, dtype)]),
              Case("Clip", [a])]
    tolerance = (4e-5, 1e-6) if dtype == np.float32 else None  # powf vs pow in float64
    check_cases(cases, tolerance)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64],
                         ids=str)
def test_binary_integers(dtype):
    signed = np.dtype(dtype).kind == "i"
    info = np.iinfo(dtype)
    a = integers((2, 3, 7), dtype, -100, 100)
    b = integers((3, 1), dtype, -9, 9)
    b[0, 0] = 0
    # a divisor of 0 is an error (tests/runtime/test_int_division.py), so not in divisors
    divisor = np.where(b == 0, np.array(3, dtype), b)
    if signed:
        b[1, 0] = divisor[1, 0] = -1
        a[0, 1, 0] = info.min  # MIN / -1 wraps
    amounts = integers((3, 1), dtype, 0, 9)
    amounts[0, 0] = info.bits + 3  # out of range: 0 or the sign fill
    cases = [Case(op, [a, divisor if op == "Div" else b])
             for op in ARITHMETIC + COMPARISONS + VARIADIC]
    cases += [Case(op, [a, b]) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    cases += [Case("Mod", [a, divisor], {"fmod": 0}), Case("Mod", [a, divisor], {"fmod": 1}),
              Case("BitShift", [a, amounts], {"direction": "LEFT"}),
              Case("BitShift", [a, amounts], {"direction": "RIGHT"}),
              Case("Sum", [a, b, amounts]), Case("Max", [a, b, amounts]),
              Case("Where", [RNG.random((7,)) > 0.5, a, b]),
              Case("Clip", [a, np.array(-3 if signed else 3, dtype), np.array(5, dtype)])]
    exponent = np.array([0, 1, 2, 3, 7, 9, 1], dtype)
    if signed:
        exponent[-1] = -1
    cases.append(Case("Pow", [integers((2, 7), dtype, -5, 5), exponent], constants={1}))
    check_cases(cases)


def test_integer_pow_edge_cases():
    """Negative exponents truncate (1, -1 and 0 bases), big exponents wrap."""
    base = np.array([[-2, -1, 0, 1, 2, 3, 7]], np.int32).repeat(4, axis=0)
    exponent = np.array([[-3], [-2], [31], [64]], np.int64)
    check_cases([Case("Pow", [base, exponent], constants={1}),
                 Case("Pow", [base.astype(np.int64), np.array(63, np.int64)], constants={1})])


def test_logical_and_bool_ops():
    p = RNG.random((2, 3, 4)) > 0.5
    q = RNG.random((3, 1)) > 0.5
    cases = [Case(op, [p, q]) for op in ("And", "Or", "Xor", "Equal", "Less", "Greater")]
    cases += [Case("Not", [p]), Case("Where", [p, p, q]),
              Case("Where", [q, integers((3, 4), np.int64), integers((1,), np.int64)]),
              Case("Identity", [p])]
    check_cases(cases)


# ----------------------------------------------------------------------------- Cast

CAST_TARGETS = [DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.UINT8, DType.UINT16,
                DType.UINT32, DType.UINT64, DType.BOOL, DType.FLOAT16, DType.BFLOAT16,
                DType.FLOAT32, DType.FLOAT64]


def test_cast_from_floats():
    """Truncation toward zero, wrap-around modulo 2**64 (through int64), NaN/inf to 0, bool is
    x != 0 (NaN is true), float narrowing rounds to nearest even with overflow to inf."""
    values = np.array([0, 1.5, -1.5, 2.5, -7.9, 300.7, -300.2, 70000.5, np.nan, np.inf,
                       -np.inf, 1e20, -1e19, -0.0, 3e38, 1.0009765625], np.float64)
    cases = []
    for source in (np.float32, np.float64, np.float16):
        with np.errstate(all="ignore"):
            x = values.astype(source)
        cases += [Case("Cast", [x], {"to": to.onnx}) for to in CAST_TARGETS]
    check_cases(cases)


def test_cast_from_integers_and_bools():
    values = np.array([0, 1, -1, 127, -128, 255, 256, 65535, 70000, -70000, 2**31 - 1, -2**31,
                       2**40 + 1, 2**62 + 3], np.int64)
    bools = np.array([True, False, True])
    cases = [Case("Cast", [values], {"to": to.onnx}) for to in CAST_TARGETS]
    cases += [Case("Cast", [values.astype(np.uint8)], {"to": to.onnx}) for to in CAST_TARGETS]
    cases += [Case("Cast", [bools], {"to": to.onnx}) for to in CAST_TARGETS]
    cases += [Case("CastLike", [values, np.zeros(1, np.float16)]),
              Case("CastLike", [floats((5,)), np.zeros((2, 2), np.int16)]),
              Case("Identity", [values])]
    check_cases(cases)


# ----------------------------------------------------------------------------- shapes


def test_odd_shapes():
    """Sizes 1, 7 and 33, rank 0, empty tensors and broadcasting from size-1 dims."""
    cases = [
        Case("Add", [floats((1,)), floats((33,))]),
        Case("Mul", [floats(()), floats(())]),
        Case("Relu", [floats(())]),
        Case("Sub", [floats((7, 1, 33)), floats((1, 5, 1))]),
        Case("Add", [floats((0, 3)), floats((3,))]),
        Case("Where", [np.zeros((0, 1), bool), floats((0, 4)), floats((1, 4))]),
        Case("Sigmoid", [floats((1, 1, 1))]),
        Case("Max", [floats((33, 1)), floats((1,)), floats((1, 7))]),
        Case("Exp", [floats((1025,))]),  # long enough to be split across threads
    ]
    check_cases(cases)


@pytest.mark.parametrize("shape", [(3, 4, 5), (4, 4, 4), (5, 3, 6)], ids=str)
def test_where_and_prelu_data_dependent_selects(shape):
    """The shapes for which GCC 12 miscompiled a C ternary with a conditional load (wrong
    results, not a crash); codegen now evaluates both operands before selecting."""
    x, y = floats(shape), floats(shape)
    cases = [Case("Where", [RNG.random(shape) > 0.5, x, y]), Case("PRelu", [x, y]),
             Case("PRelu", [integers(shape, np.int32), integers(shape, np.int32)])]
    graph, _ = build_graph(cases)
    check_cases(cases)


def test_onnx_model_compiles_without_fallback():
    """The ONNX frontend path: a small model of elementwise ops and activations."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Gelu", ["scaled"], ["gelu"], approximate="tanh"),
        helper.make_node("Clip", ["gelu", "lo", "hi"], ["clipped"]),
        helper.make_node("Greater", ["clipped", "lo"], ["mask"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mask_f", "clipped"], ["picked"]),
        helper.make_node("Cast", ["picked"], ["y"], to=TensorProto.FLOAT16),
    ]
    graph = helper.make_graph(
        nodes, "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 7])],
        initializer=[helper.make_tensor("scale", TensorProto.FLOAT, [7], floats((7,)).tolist()),
                     helper.make_tensor("lo", TensorProto.FLOAT, [], [-0.25]),
                     helper.make_tensor("hi", TensorProto.FLOAT, [], [1.5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    imported = import_onnx(model)
    x = floats((2, 7))
    module = ember.compile(imported)
    assert module.build.host_nodes == [], module.report()
    expected = ReferenceExecutor(imported).run({"x": x})["y"]
    assert_close(module(x), expected, "onnx model")


def test_uncovered_configurations_fall_back_and_say_so():
    """An integer Pow with a run-time exponent has no kernel: it runs the reference."""
    graph, feeds = build_graph([Case("Pow", [integers((5,), np.int32, -3, 3),
                                             integers((5,), np.int32, 0, 4)])])
    module = ember.compile(graph)
    assert [impl.node.op for impl in module.build.host_nodes] == ["Pow"]
    assert "compute does not cover" in module.report()
    expected = ReferenceExecutor(graph).run(feeds)
    assert_close(module.run(feeds)["c0_out0"], expected["c0_out0"], "fallback Pow")
