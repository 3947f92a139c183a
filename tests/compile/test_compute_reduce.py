"""Compiled reductions (ember/ops/compute/reduce.py) against the numpy references.

Each test compiles ONE graph of many independent single-node cases (one C compile per test,
so the file stays fast), asserts that no node fell back to numpy, and compares every output
with the reference executor: exactly for integers and bools, within a tolerance of the dtype
for floats (the kernels accumulate sequentially, numpy pairwise; libm and numpy's SIMD math
differ by a few ulp).

The helpers at the top are shared with test_compute_nn.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import ml_dtypes
import numpy as np
import pytest
from compute_cases import Case, assert_cases_close, build_graph

import ember
from ember.core.dtypes import DType
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType
from ember.ops.compute.reduce import _chunk_size, _selects

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(20240612)
FLOAT_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]

# (rtol, atol) per float dtype of an output.
TOLERANCE = {
    np.dtype(np.float32): (1e-5, 1e-5),
    np.dtype(np.float64): (1e-12, 1e-12),
    np.dtype(np.float16): (4e-3, 4e-3),
    BF16: (3e-2, 3e-2),
}

# ----------------------------------------------------------------------------- shared helpers


def compile_cases(cases: Sequence[Case]):
    """The compiled module of the cases' graph, its feeds and the reference outputs."""
    graph, feeds = build_graph(cases)
    with np.errstate(all="ignore"):
        expected = ReferenceExecutor(graph).run(feeds)
    return ember.compile(graph), feeds, expected


def check_cases(cases: Sequence[Case], tolerance: tuple[float, float] | None = None) -> None:
    """Compile the cases as one graph: every node must be a compiled kernel and every output
    must match the reference executor."""
    module, feeds, expected = compile_cases(cases)
    assert module.build.host_nodes == [], module.build.report()
    assert_cases_close(cases, module.run(feeds), expected, TOLERANCE, tolerance)


def floats(shape: Sequence[int], dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(tuple(shape)) * scale).astype(dtype)


def integers(shape: Sequence[int], dtype: Any, low: int = -20, high: int = 20) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(max(low, info.min), min(high, info.max), tuple(shape),
                        endpoint=True).astype(dtype)


def axes(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ----------------------------------------------------------------------------- Reduce*

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"]
# (axes or None for "every axis", attributes)
AXES_VARIANTS = [
    (None, {}), (axes(0), {}), (axes(-1), {"keepdims": 0}), (axes(0, 2), {}),
    (axes(2, -2), {"keepdims": 0}), (axes(), {"noop_with_empty_axes": 1}),
]


def _reduce_case(op: str, x: np.ndarray, reduce_axes: np.ndarray | None, **attrs) -> Case:
    if reduce_axes is None:
        return Case(op, [x], attrs)
    return Case(op, [x, reduce_axes], attrs, constants={1})


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_reduce_floats(dtype):
    x = floats((3, 7, 5), dtype)
    cases = [_reduce_case(op, x, a, **attrs) for op in REDUCE_OPS for a, attrs in AXES_VARIANTS]
    positive = (np.abs(floats((4, 33, 2))) + 0.1).astype(dtype)
    cases += [_reduce_case("ReduceLogSum", positive, a, **attrs) for a, attrs in AXES_VARIANTS[:4]]
    check_cases(cases)


def test_reduce_odd_shapes():
    empty = np.zeros((0, 3), np.float32)
    ones = floats((1, 7, 1))
    scalar = np.array(2.5, np.float32)
    cases = [_reduce_case(op, empty, axes(0), keepdims=1) for op in REDUCE_OPS]  # identities
    cases += [_reduce_case(op, empty, axes(1), keepdims=0) for op in REDUCE_OPS]  # empty out
    cases += [_reduce_case(op, ones, axes(0, 2), keepdims=0) for op in REDUCE_OPS]
    cases += [_reduce_case(op, scalar, None) for op in REDUCE_OPS]
    cases += [_reduce_case("ReduceSum", floats((33, 2)), axes(-2))]
    check_cases(cases)


def test_reduce_special_values():
    x = np.array([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0],
                  [1000.0, 1000.0, -1000.0]], np.float32)
    cases = [_reduce_case(op, x, axes(1)) for op in ("ReduceMax", "ReduceMin", "ReduceSum",
                                                    "ReduceLogSumExp")]
    check_cases(cases)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32],
                         ids=lambda d: np.dtype(d).name)
def test_reduce_integers(dtype):
    x = integers((3, 7, 5), dtype, -9, 9)
    ops = ["ReduceSum", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceMax"]
    cases = [_reduce_case(op, x, a, **attrs) for op in ops for a, attrs in AXES_VARIANTS[:4]]
    big = integers((2, 40), dtype, -128, 127)  # sums that overflow int8 wrap like numpy
    cases += [_reduce_case(op, big, axes(1)) for op in ("ReduceSum", "ReduceMean")]
    check_cases(cases)


def test_reduce_bools():
    x = RNG.random((3, 4, 5)) > 0.5
    cases = [_reduce_case(op, x, a, **attrs) for op in ("ReduceMax", "ReduceMin")
             for a, attrs in AXES_VARIANTS]
    check_cases(cases)


def test_reduce_with_runtime_axes_falls_back():
    x = floats((3, 4))
    graph, feeds = build_graph([Case("ReduceSum", [x, axes(1)], {"keepdims": 1})])
    graph.types["c0_out0"] = TensorType(DType.FLOAT32, (3, 1))  # as a model would declare it
    module = ember.compile(graph)
    [host] = module.build.host_nodes
    assert "run time" in host.reason
    np.testing.assert_allclose(module.run(feeds)["c0_out0"], x.sum(axis=1, keepdims=True),
                               rtol=1e-6)


# ----------------------------------------------------------------------------- ArgMax, ArgMin


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int64, np.uint8, bool],
                         ids=lambda d: np.dtype(d).name)
def test_arg_extremes(dtype):
    if np.dtype(dtype) == np.bool_:
        x = RNG.random((3, 7, 5)) > 0.5
    elif np.dtype(dtype).kind == "f":
        x = np.round(floats((3, 7, 5), dtype) * 2)  # ties
    else:
        x = integers((3, 7, 5), dtype, -3, 3)
    cases = [Case(op, [x], {"axis": axis, "keepdims": keep, "select_last_index": last})
             for op in ("ArgMax", "ArgMin") for axis in (0, 1, -1) for keep in (0, 1)
             for last in (0, 1)]
    cases += [Case("ArgMax", [x[:1, :1]], {"axis": 1})]
    check_cases(cases)


def test_arg_extremes_nan_and_inf():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 2.0, -np.inf, -np.inf],
                  [np.inf, 1.0, np.inf, 0.0]], np.float32)
    cases = [Case(op, [x], {"axis": 1, "select_last_index": last})
             for op in ("ArgMax", "ArgMin") for last in (0, 1)]
    check_cases(cases)


# ----------------------------------------------------------------------------- TopK


def _top_k(x: np.ndarray, k: int, **attrs) -> Case:
    return Case("TopK", [x, np.array([k], np.int64)], attrs, constants={1}, outputs=2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_top_k(dtype):
    x = np.round(floats((3, 7, 5), dtype) * 2)  # ties: the lower index comes first
    cases = [_top_k(x, k, axis=axis) for axis in (0, 1, -1) for k in (1, 3)]
    cases += [_top_k(floats((2, 300), dtype), 8), _top_k(floats((4, 1000), dtype), 5)]
    check_cases(cases)


def test_top_k_nan_infinities_and_signed_zeros():
    x = np.array([[1.0, np.nan, 3.0, np.nan, -0.0, 0.0],
                  [2.0, 2.0, -np.inf, -np.inf, 0.0, -0.0],
                  [np.inf, 1.0, np.inf, 0.0, np.nan, 5.0]], np.float32)
    cases = [_top_k(x, k, axis=1) for k in (1, 2, 4, 6)]
    module, feeds, expected = compile_cases(cases)
    assert module.build.host_nodes == []
    outputs = module.run(feeds)
    for name, want in expected.items():  # exactly: the values are read back, not computed
        np.testing.assert_array_equal(outputs[name], want)
        assert np.array_equal(np.signbit(outputs[name]), np.signbit(want))


@pytest.mark.parametrize("largest", [1, 0], ids=["largest", "smallest"])
def test_top_k_selects_or_counts_ranks_for_either_order_and_integers(largest):
    """Both algorithms (selection passes where K is small against the line, counted ranks
    elsewhere: whole sorts, K > 8) in both orders, for floats and integers, with ties."""
    x = np.round(floats((4, 40)) * 3)  # ties: the lower index comes first
    whole = np.round(floats((3, 7, 5)) * 2)
    cases = [_top_k(x, k, axis=1, largest=largest) for k in (1, 3, 8, 9, 40)]
    cases += [_top_k(whole, whole.shape[axis], axis=axis, largest=largest)
              for axis in (0, 1, 2)]
    cases += [_top_k(integers((5, 64), dtype, -9, 9), k, axis=1, largest=largest)
              for dtype in (np.int32, np.int64, np.uint8) for k in (2, 64)]
    cases += [_top_k(integers((6, 5), np.int64, -3, 3), 4, axis=0, largest=largest)]
    module, feeds, expected = compile_cases(cases)
    assert module.build.host_nodes == [], module.build.report()
    outputs = module.run(feeds)
    for name, want in expected.items():  # exactly: the values are read back, not computed
        np.testing.assert_array_equal(outputs[name], want, err_msg=name)


@pytest.mark.parametrize("largest", [1, 0], ids=["largest", "smallest"])
def test_top_k_orders_nan_above_every_number_in_both_algorithms(largest):
    x = np.array([[1.0, np.nan, 3.0, np.nan, -0.0, 0.0, -np.inf, 2.0, np.inf, 1.0, -1.0, 7.0,
                   0.5, -2.0, np.nan, 4.0, 3.0, -5.0, 6.0, -0.0]], np.float32)
    x = np.concatenate([x, x[:, ::-1], np.full_like(x, np.nan)])
    # K=1..3 select (K * (K / 2 + 2) < 20), K=5 and the whole line count ranks
    assert [_selects(k, 20) for k in (1, 2, 3, 5, 20)] == [True, True, True, False, False]
    cases = [_top_k(x, k, axis=1, largest=largest) for k in (1, 2, 3, 5, 20)]
    module, feeds, expected = compile_cases(cases)
    assert module.build.host_nodes == []
    outputs = module.run(feeds)
    for name, want in expected.items():
        np.testing.assert_array_equal(outputs[name], want, err_msg=name)
        assert np.array_equal(np.signbit(outputs[name]), np.signbit(want)), name


@pytest.mark.parametrize("largest", [1, 0], ids=["largest", "smallest"])
def test_top_k_of_long_lines_selects_through_chunks(largest):
    """Long lines select from the chunks whose bests are the K best (``_chunk_size``): ties
    within and across chunks, NaN, infinities, signed zeros, a line of one value, a partial
    last chunk, integers, another axis -- exactly the reference's stable sort."""
    rng = np.random.default_rng(30)
    length = 1000  # K = 2 and 5: chunks of 16, the last holding 8 elements; K = 8: of 8
    assert [_chunk_size(k, length) for k in (1, 2, 5, 8)] == [None, 16, 16, 8]
    x = np.round(rng.standard_normal((6, length)) * 2).astype(np.float32)  # many ties
    x[1, rng.choice(length, 40, replace=False)] = np.nan
    x[2] = np.nan
    x[2, [3, 500, 997, 999]] = [-np.inf, 2.0, np.inf, -0.0]  # numbers in a line of NaN
    x[3] = -np.inf
    x[3, [17, 998]] = [0.0, -0.0]
    x[4] = 1.0  # one value: the first K indices
    x[5, 990:] = 50.0  # the best all in the partial last chunk
    cases = [_top_k(x, k, axis=1, largest=largest) for k in (1, 2, 5, 8)]
    cases += [_top_k(np.ascontiguousarray(x[:3].T), 7, axis=0, largest=largest)]
    cases += [_top_k(integers((3, 777), dtype, -4, 4), 6, axis=1, largest=largest)
              for dtype in (np.int32, np.uint8)]
    module, feeds, expected = compile_cases(cases)
    assert module.build.host_nodes == [], module.build.report()
    outputs = module.run(feeds)
    for name, want in expected.items():  # exactly: the values are read back, not computed
        np.testing.assert_array_equal(outputs[name], want, err_msg=name)
        if want.dtype.kind == "f":
            assert np.array_equal(np.signbit(outputs[name]), np.signbit(want)), name


def test_top_k_beyond_the_compiled_cases_keeps_the_reference():
    """K > 8 of a line longer than 512 elements (neither algorithm: selection needs K <= 8,
    counting ranks is quadratic in the line)."""
    x = floats((3, 600))
    cases = [_top_k(x, 9), _top_k(x, 9, largest=0), _top_k(x.astype(np.int64), 20)]
    module, feeds, expected = compile_cases(cases)
    assert [impl.node.op for impl in module.build.host_nodes] == ["TopK"] * 3
    assert all("a line of 600 elements" in impl.reason for impl in module.build.host_nodes)
    outputs = module.run(feeds)
    for name, want in expected.items():
        np.testing.assert_array_equal(outputs[name], want)


# ----------------------------------------------------------------------------- CumSum


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8], ids=lambda d: np.dtype(d).name)
def test_cumsum(dtype):
    x = floats((3, 7, 5), dtype) if np.dtype(dtype).kind == "f" else \
        integers((3, 7, 5), dtype, 0, 60)
    cases = [Case("CumSum", [x, np.array(axis, np.int32)],
                  {"exclusive": exclusive, "reverse": reverse}, constants={1})
             for axis in (0, 1, -1) for exclusive in (0, 1) for reverse in (0, 1)]
    cases += [Case("CumSum", [x.reshape(-1), np.array([0], np.int64)], constants={1}),
              Case("CumSum", [x[:, :0], np.array(1, np.int64)], constants={1})]
    check_cases(cases)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8], ids=lambda d: np.dtype(d).name)
def test_cumprod(dtype):
    """Running products (integers wrap in int64 as numpy's do, then cast back)."""
    x = (1 + floats((3, 7, 5), dtype, 0.3)).astype(dtype) if np.dtype(dtype).kind == "f" else \
        integers((3, 7, 5), dtype, -7 if np.dtype(dtype).kind == "i" else 0, 9)
    cases = [Case("CumProd", [x, np.array(axis, np.int32)],
                  {"exclusive": exclusive, "reverse": reverse}, constants={1})
             for axis in (0, 1, -1) for exclusive in (0, 1) for reverse in (0, 1)]
    cases += [Case("CumProd", [x.reshape(-1), np.array([0], np.int64)], constants={1}),
              Case("CumProd", [x[:, :0], np.array(1, np.int64)], constants={1})]
    check_cases(cases)
