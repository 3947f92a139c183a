"""Lane-parallel row reductions (``ember.schedule.reductions``): the printed IR of the
transformation (Before/Expected), its results in the reference interpreter (which also checks
that the vectorized loop's iterations are independent) and in compiled C against numpy,
including tails, NaN and infinities, and the loops it must leave alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import expect, run_outputs  # noqa: E402

import ember  # noqa: E402
from ember.core.dtypes import DType  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.ir.compute import (compute, placeholder, reduce_axis, reduce_max,  # noqa: E402
                              reduce_min, reduce_sum)
from ember.ir.loop import For, ForKind, walk  # noqa: E402
from ember.lower import lower_compute  # noqa: E402
from ember.schedule.reductions import vectorize_reductions  # noqa: E402

F32 = DType.FLOAT32
SSE = Target.parse("x86_64")  # 128-bit vectors: 4 float lanes, partials of 8


def _row_reduction(reducer, rows: int, length: int, name: str = "r", axis: int = 1):
    shape = (rows, length) if axis == 1 else (length, rows)
    x = placeholder(shape, F32, "x")
    k = reduce_axis(length, "k")
    if axis == 1:
        y = compute((rows,), lambda i: reducer(x[i, k], k), name)
    else:
        y = compute((rows,), lambda i: reducer(x[k, i], k), name)
    return lower_compute(name, [x], [y])


def test_a_row_sum_accumulates_in_two_vectors_of_partials_then_its_tail():
    func = vectorize_reductions(_row_reduction(reduce_sum, 3, 20, "rowsum"), SSE)
    expect(func, """
        func rowsum(x: f32[3, 20], out0: f32[3]) {
          for i0 in [0, 3) {
            alloc t0: f32[1] local
            t0[0] = 0.0f
            alloc t0_lanes: f32[8] local
            for i1_l in [0, 8) {
              t0_lanes[i1_l] = 0.0f
            }
            for i1_o in [0, 2) {
              vectorized for i1_l in [0, 8) {
                t0_lanes[i1_l] = t0_lanes[i1_l] + x[(i0 * 20) + ((i1_o * 8) + i1_l)]
              }
            }
            for i1_c in [0, 8) {
              t0[0] = t0[0] + t0_lanes[i1_c]
            }
            for i1_t in [16, 16 + 4) {
              t0[0] = t0[0] + x[(i0 * 20) + i1_t]
            }
            out0[i0] = t0[0]
          }
        }
    """)


@pytest.mark.parametrize("reducer, reference", [
    (reduce_sum, np.sum), (reduce_max, np.max), (reduce_min, np.min)])
@pytest.mark.parametrize("length", [16, 23, 64])
def test_lane_parallel_reductions_compute_the_row_reduction(reducer, reference, length):
    func = vectorize_reductions(_row_reduction(reducer, 4, length), SSE)
    assert any(isinstance(n, For) and n.kind is ForKind.VECTORIZED for n in walk(func.body))
    x = np.random.default_rng(length).standard_normal((4, length)).astype(np.float32)
    x[1, length - 1] = 50.0  # an extreme in the tail (or the last vector)
    x[2, 0] = -50.0
    (out,) = run_outputs(func, [x])
    np.testing.assert_allclose(out, reference(x, axis=1), rtol=1e-5, atol=1e-5)


def test_short_rows_and_strided_rows_stay_scalar():
    short = _row_reduction(reduce_sum, 4, 15)  # fewer than two vectors of partials
    assert vectorize_reductions(short, SSE) is short
    strided = _row_reduction(reduce_max, 4, 64, axis=0)  # a column: a gather per lane
    assert vectorize_reductions(strided, SSE) is strided


def test_integer_sums_are_lane_parallel_and_wrap_as_the_scalar_loop_does():
    """A wrapping sum is exact in any order: int32 rows whose sums overflow give the same
    wrapped result as numpy's int32 sum."""
    x = placeholder((2, 64), DType.INT32, "x")
    k = reduce_axis(64, "k")
    ints = lower_compute("isum", [x], [compute((2,), lambda i: reduce_sum(x[i, k], k), "s")])
    func = vectorize_reductions(ints, SSE)
    assert any(isinstance(n, For) and n.kind is ForKind.VECTORIZED for n in walk(func.body))
    values = np.random.default_rng(5).integers(-2**31, 2**31, (2, 64)).astype(np.int32)
    (out,) = run_outputs(func, [values])
    np.testing.assert_array_equal(out, values.sum(axis=1, dtype=np.int32))


@pytest.mark.parametrize("dtype", [DType.INT32, DType.INT64])
@pytest.mark.parametrize("reducer, reference", [(reduce_max, np.max), (reduce_min, np.min)])
def test_integer_extremes_and_conditioned_terms_are_lane_parallel(dtype, reducer, reference):
    """Integer maxima and minima (exact in any order), and a term only some iterations
    contribute (a TopK's "not chosen yet"): the condition becomes the identity in the term."""
    length, rows = 37, 3
    x = placeholder((rows, length), dtype, "x")
    skip = placeholder((rows,), DType.INT64, "skip")
    k = reduce_axis(length, "k")
    y = compute((rows,), lambda i: reducer(x[i, k], k, condition=k.ne(skip[i])), "r")
    func = vectorize_reductions(lower_compute("masked", [x, skip], [y]), SSE)
    assert any(isinstance(n, For) and n.kind is ForKind.VECTORIZED for n in walk(func.body))
    rng = np.random.default_rng(3)
    values = rng.integers(-1000, 1000, (rows, length)).astype(dtype.numpy)
    skipped = np.array([0, 5, length - 1], np.int64)
    values[np.arange(rows), skipped] = 5000 if reducer is reduce_max else -5000
    (out,) = run_outputs(func, [values, skipped])  # the interpreter checks independence
    kept = np.ma.masked_array(values, np.arange(length)[None, :] == skipped[:, None])
    np.testing.assert_array_equal(out, reference(kept, axis=1).data)


def _reduce_model(op: str, length: int):
    """A one-node ONNX model reducing (or, for Softmax, normalizing) the rows of 5 x length."""
    if op == "Softmax":
        node, shape_out, initializers = helper.make_node("Softmax", ["x"], ["y"], axis=-1), \
            [5, length], []
    else:
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
        shape_out, initializers = [5], [helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


# 141: a few vectors of twice the lanes of AVX2 (16) and of AVX-512 (32), plus a tail
@pytest.mark.parametrize("length", [141, 128])
def test_compiled_reductions_match_numpy_with_nan_and_infinities(length):
    """The compiled C of ReduceMax/ReduceMin/ReduceSum and Softmax over rows that hold a NaN,
    an infinity, or extremes at the first and last position."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((5, length)).astype(np.float32) * 4
    x[0, length // 2] = np.nan
    x[1, length - 1] = np.inf
    x[2, 0] = -np.inf
    x[3, length - 1] = 1e4
    x[4, 3] = -1e4
    expected = {"ReduceMax": np.max(x, axis=1), "ReduceMin": np.min(x, axis=1),
                "ReduceSum": np.sum(x.astype(np.float64), axis=1).astype(np.float32)}
    for op, want in expected.items():
        module = ember.compile(_reduce_model(op, length))
        assert "_lanes[" in module.build.units.kernels[0].source  # the partials are there
        got = module(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=op)
    finite = x[3:]
    shifted = np.exp(finite - finite.max(axis=1, keepdims=True))
    got = ember.compile(_reduce_model("Softmax", length))(x)
    np.testing.assert_allclose(got[3:], shifted / shifted.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    assert np.isnan(got[0]).all()


def test_the_stride_of_a_load_sees_through_divisions_of_other_loops():
    """A fused parallel loop indexes rows through divisions (before index simplification):
    the row reduction's stride along its own loop is still 1; a division of the reduced
    variable itself has no constant stride."""
    from ember.ir.loop.expr import Binary, Const, Var
    from ember.ir.loop.affine import split_affine

    f, k = Var("f"), Var("k")
    c = lambda v: Const(v, DType.INT64)  # noqa: E731
    row = Binary("add", Binary("mul", Binary("floordiv", f, c(128)), c(128)),
                 Binary("floormod", f, c(128)))
    index = Binary("add", Binary("mul", row, c(768)), k)
    assert split_affine(index, k)[0] == 1
    assert split_affine(Binary("sub", index, Binary("mul", k, c(3))), k)[0] == -2
    assert split_affine(row, k)[0] == 0
    assert split_affine(Binary("floordiv", index, c(2)), k)[0] is None
