"""Compiled softmax family, normalizations, MatMul/Gemm, convolutions and poolings
(ember/ops/compute/nn.py) against the numpy references.

As in test_compute_reduce.py (whose helpers these tests share), each test compiles one graph
of independent single-node cases, requires every node to be a compiled kernel and compares
every output with the reference executor.
"""

from __future__ import annotations

import numpy as np
import pytest
from compute_cases import Case, build_graph
from onnx import TensorProto, helper, numpy_helper
from test_compute_reduce import (BF16, FLOAT_DTYPES, check_cases, compile_cases, floats,
                                 integers)

import ember
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

F32 = np.float32
# Sums of products and statistics: more rounding than one reduction of the inputs.
ACCUMULATED = {np.dtype(np.float32): (1e-4, 1e-4), np.dtype(np.float64): (1e-10, 1e-10),
               np.dtype(np.float16): (1e-2, 1e-2), BF16: (5e-2, 5e-2)}


def _tolerance(dtype) -> tuple[float, float]:
    return ACCUMULATED[np.dtype(dtype)]


# ----------------------------------------------------------------------------- softmax family


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_softmax_family(dtype):
    x = floats((3, 7, 5), dtype, scale=3.0)
    extreme = np.array([[1000, -1000, 1000], [-np.inf, 0, 1], [2, 2, 2]], F32).astype(dtype)
    cases = [Case(op, [x], {"axis": axis}) for op in ("Softmax", "LogSoftmax", "Hardmax")
             for axis in (0, 1, -1)]
    cases += [Case(op, [extreme]) for op in ("Softmax", "LogSoftmax", "Hardmax")]
    cases += [Case(op, [np.zeros((2, 0, 3), dtype)], {"axis": 1})
              for op in ("Softmax", "LogSoftmax", "Hardmax")]
    cases += [Case("Softmax", [floats((1, 33), dtype)])]
    check_cases(cases, _tolerance(dtype))


# ----------------------------------------------------------------------------- normalizations


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16],
                         ids=lambda d: np.dtype(d).name)
def test_normalizations(dtype):
    x = floats((2, 4, 5, 3), dtype)
    vec = lambda n=4: floats((n,), dtype)  # noqa: E731
    var = lambda n=4: (np.abs(floats((n,))) + 0.5).astype(dtype)  # noqa: E731
    cases = [
        Case("BatchNormalization", [x, vec(), vec(), vec(), var()], {"epsilon": 1e-3}),
        Case("BatchNormalization", [x, vec(), vec(), vec(), var()], constants={1, 2, 3, 4}),
        Case("BatchNormalization", [floats((7,), dtype), vec(1), vec(1), vec(1), var(1)]),
        Case("BatchNormalization", [floats((7, 4), dtype), vec(), vec(), vec(), var()]),
        Case("InstanceNormalization", [x, vec(), vec()], {"epsilon": 1e-2}),
        Case("InstanceNormalization", [floats((1, 4, 33), dtype), vec(), vec()]),
        Case("GroupNormalization", [x, vec(), vec()], {"num_groups": 2}),
        Case("GroupNormalization", [x, vec(), vec()], {"num_groups": 4}),
        Case("GroupNormalization", [x, vec(), vec()], {"num_groups": 1, "epsilon": 0.1}),
        Case("RMSNormalization", [x, vec(3)]),
        Case("RMSNormalization", [x, floats((5, 3), dtype)], {"axis": 2}),
        Case("RMSNormalization", [x, floats((4, 1, 1), dtype)], {"axis": -3}),
    ]
    for axis in (-1, 1, 0, 2):
        shape = x.shape[axis:] if axis >= 0 else x.shape[-1:]
        cases.append(Case("LayerNormalization", [x, floats(shape, dtype), floats(shape, dtype)],
                          {"axis": axis}, outputs=3))
    cases += [Case("LayerNormalization", [x[:0], floats((3,), dtype)], outputs=3),
              Case("InstanceNormalization", [x[:0], vec(), vec()]),
              Case("LayerNormalization", [x, floats((3,), dtype)]),  # no bias, one output
              Case("LayerNormalization", [x, floats((1, 3), dtype), floats((3,), dtype)],
                   {"stash_type": 11}, outputs=2)]
    for axis in (0, -1, 1):
        cases += [Case("LpNormalization", [x], {"axis": axis, "p": p}) for p in (1, 2)]
    cases += [Case("LpNormalization", [np.zeros((2, 3), dtype)])]  # zero norm gives 0
    # The default stash_type keeps float64 inputs' statistics in float32.
    check_cases(cases, _tolerance(np.float32 if dtype == np.float64 else dtype))


# ----------------------------------------------------------------------------- MatMul, Gemm

MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (5, 4, 6)), ((2, 4), (4,)),
                 ((4,), (4,)), ((7, 33), (33, 1)), ((1, 0), (0, 3)), ((2, 3, 4), (4, 2)),
                 ((1, 1), (1, 1))]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.dtype(np.int32), np.dtype(np.int8)],
                         ids=str)
def test_matmul(dtype):
    def make(shape):
        return integers(shape, dtype, -5, 5) if dtype.kind in "iu" else floats(shape, dtype)

    cases = [Case("MatMul", [make(a), make(b)]) for a, b in MATMUL_SHAPES]
    cases.append(Case("MatMul", [make((3, 4)), make((4, 6))], constants={1}))
    check_cases(cases, None if dtype.kind in "iu" else _tolerance(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64],
                         ids=lambda d: np.dtype(d).name)
def test_gemm(dtype):
    def make(*shape):
        if np.dtype(dtype).kind == "f":
            return floats(shape, dtype)
        return integers(shape, dtype, -5, 5)

    cases = []
    for trans_a in (0, 1):
        for trans_b in (0, 1):
            a = make(4, 3) if trans_a else make(3, 4)
            b = make(5, 4) if trans_b else make(4, 5)
            attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}
            cases += [Case("Gemm", [a, b, c], attrs)
                      for c in (None, make(5), make(1, 5), make(3, 1), make(3, 5), make())]
            cases.append(Case("Gemm", [a, b, make(5)], {"transA": trans_a, "transB": trans_b}))
    cases.append(Case("Gemm", [make(3, 4), make(4, 5), make(3, 5)], {"beta": 0.0}))
    cases.append(Case("Gemm", [make(1, 33), make(7, 33), make(7)], {"transB": 1},
                      constants={1, 2}))
    tolerance = _tolerance(dtype) if np.dtype(dtype).kind == "f" else None
    check_cases(cases, tolerance)


# ----------------------------------------------------------------------------- convolutions


def _conv_cases(dtype) -> list[Case]:
    t = lambda *shape: floats(shape, dtype)  # noqa: E731
    cases = [
        Case("Conv", [t(1, 3, 7, 7), t(4, 3, 3, 3)]),
        Case("Conv", [t(2, 3, 7, 7), t(4, 3, 3, 3), t(4)], {"pads": [1, 1, 1, 1]}),
        Case("Conv", [t(1, 4, 9, 8), t(6, 2, 3, 2), t(6)],
             {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 3], "dilations": [2, 1]}),
        Case("Conv", [t(1, 4, 9, 8), t(4, 1, 3, 3)], {"group": 4, "pads": [1, 1, 1, 1]}),
        Case("Conv", [t(1, 2, 33), t(3, 2, 5), t(3)], {"strides": [3], "pads": [2, 1]}),
        Case("Conv", [t(1, 2, 5, 6, 7), t(3, 2, 2, 3, 2)],
             {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
        Case("Conv", [t(1, 2, 7, 6), t(3, 2, 1, 1)]),
        Case("Conv", [t(1, 2, 7, 6), t(3, 2, 3, 3)], {"kernel_shape": [3, 3]}, constants={1}),
        Case("Conv", [t(1, 1, 1, 1), t(1, 1, 1, 1)]),
        Case("Conv", [t(0, 2, 5, 5), t(3, 2, 3, 3)], {"pads": [1, 1, 1, 1]}),
    ]
    cases += [Case("Conv", [t(1, 2, 7, 6), t(3, 2, 3, 4)], {"auto_pad": pad, "strides": [2, 2]})
              for pad in ("SAME_UPPER", "SAME_LOWER", "VALID")]
    cases += [
        Case("ConvTranspose", [t(1, 3, 3, 3), t(3, 2, 3, 3)]),
        Case("ConvTranspose", [t(1, 3, 3, 4), t(3, 2, 3, 3), t(2)], {"strides": [3, 2]}),
        Case("ConvTranspose", [t(1, 3, 3, 4), t(3, 2, 3, 3)],
             {"strides": [3, 2], "output_padding": [1, 1], "pads": [1, 2, 0, 1]}),
        Case("ConvTranspose", [t(1, 4, 3, 4), t(4, 2, 3, 2)],
             {"strides": [2, 2], "group": 2, "dilations": [2, 1]}),
        Case("ConvTranspose", [t(1, 3, 3, 3), t(3, 2, 3, 3)],
             {"strides": [3, 2], "output_shape": [10, 8]}),
        Case("ConvTranspose", [t(1, 2, 5), t(2, 3, 3)], {"strides": [2]}),
        Case("ConvTranspose", [t(1, 2, 3, 4, 2), t(2, 3, 3, 2, 2)], {"strides": [2, 1, 2]}),
    ]
    cases += [Case("ConvTranspose", [t(1, 3, 3, 3), t(3, 2, 3, 3)],
                   {"strides": [2, 2], "auto_pad": pad}) for pad in ("SAME_UPPER", "SAME_LOWER")]
    return cases


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_convolutions(dtype):
    check_cases(_conv_cases(dtype), _tolerance(dtype))


# ----------------------------------------------------------------------------- pooling

WINDOWS = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1], "strides": [2, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"},
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_pools(dtype):
    x = floats((2, 3, 8, 7), dtype)
    line = floats((1, 2, 33), dtype)
    cube = floats((1, 2, 5, 4, 6), dtype)
    variants = [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
                ("AveragePool", {"count_include_pad": 1}), ("LpPool", {"p": 2}),
                ("LpPool", {"p": 1}), ("LpPool", {"p": 3})]
    cases = [Case(op, [x], {**window, **extra}) for op, extra in variants for window in WINDOWS]
    cases += [Case(op, [line], {"kernel_shape": [4], "strides": [3], "pads": [1, 2], **extra})
              for op, extra in variants]
    cases += [Case(op, [cube], {"kernel_shape": [2, 3, 2], "pads": [0, 1, 0, 1, 1, 1],
                                **extra}) for op, extra in variants]
    cases += [Case(op, [t]) for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
              for t in (x, line, cube[:, :, :1, :1, :1])]
    cases += [Case(op, [x[:0]], WINDOWS[4]) for op, _ in variants[:2]]  # empty batch
    check_cases(cases, _tolerance(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=lambda d: np.dtype(d).name)
def test_max_pool_integers(dtype):
    x = integers((1, 2, 6, 6), dtype, -128, 127)
    check_cases([Case("MaxPool", [x], window) for window in WINDOWS])


# ----------------------------------------------------------------------------- fallbacks, ONNX


def test_uncovered_configurations_fall_back():
    x = floats((1, 2, 4, 4))
    stats = [floats((2,)), floats((2,)), floats((2,)), np.abs(floats((2,))) + 1]
    cases = [Case("MaxPool", [x], {"kernel_shape": [2, 2]}, outputs=2),  # Indices output
             Case("BatchNormalization", [x, *stats], {"training_mode": 1}, outputs=3)]
    module, feeds, expected = compile_cases(cases)
    assert sorted(h.node.op for h in module.build.host_nodes) == ["BatchNormalization",
                                                                   "MaxPool"]
    got = module.run(feeds)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)


def test_onnx_model_with_initializers():
    """A small ONNX network: weights are initializers, so they reach the kernels as
    compile-time constants (Conv, Gemm) and its pieces compose in one library."""
    w = floats((4, 3, 3, 3))
    fc = floats((10, 4 * 2 * 2))
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("InstanceNormalization", ["p", "s", "b"], ["n"]),
        helper.make_node("Flatten", ["n"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["g"], transB=1),
        helper.make_node("LogSoftmax", ["g"], ["y"], axis=1),
        helper.make_node("ReduceMean", ["y", "axes"], ["m"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(v, name) for name, v in
             (("w", w), ("b", floats((4,))), ("s", floats((4,))), ("fc", fc),
              ("fb", floats((10,))), ("axes", np.array([1], np.int64)))]
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    g = import_onnx(model)
    module = ember.compile(g)
    fallbacks = {h.node.op for h in module.build.host_nodes}
    assert fallbacks <= {"Flatten"}, module.build.report()  # Flatten belongs to shape.py
    x = floats((2, 3, 8, 8))
    want = ReferenceExecutor(g).run({"x": x})
    got = module.run({"x": x})
    for name in ("y", "m"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


def test_softmax_statistics_of_many_rows_live_in_the_workspace():
    """Softmax over many rows materializes per-row statistics; they are scratch in the
    workspace arena (not the kernel's stack), so any row count compiles."""
    rows = 70_000  # 2 float32 statistics per row: 560 KB, more than a stack frame should hold
    x = floats((rows, 4))
    graph, feeds = build_graph([Case("Softmax", [x]), Case("ReduceSum", [x])])
    module = ember.compile(graph)
    assert module.build.host_nodes == [], module.build.report()
    assert any(offsets for offsets in module.build.memory.scratch_offsets.values())
    got = module.run(feeds)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got["c0_out0"], e / e.sum(axis=-1, keepdims=True), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(got["c1_out0"], x.sum(dtype=np.float64), rtol=1e-4)