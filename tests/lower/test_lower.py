"""Lowering of compute definitions to loop IR: the printed loop nests, and their results when
executed by the reference interpreter (``loop_interpreter``) against numpy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from loop_interpreter import (CASES, IndependenceError, InterpreterError, expect,  # noqa: E402
                              binary_op, cast_value, eval_expr, run, run_outputs)

from ember.core.dtypes import DType  # noqa: E402
from ember.ir.compute import (compute, const_like, placeholder, reduce_axis,  # noqa: E402
                              reduce_min, reduce_prod, reduce_sum)
from ember.ir.loop import (INDEX, Binary, Buffer, Const, For, ForKind, Load,  # noqa: E402
                           PrimFunc, Store, Var, verify_func)
from ember.ir.loop.expr import Call, Cast  # noqa: E402
from ember.lower.lower import LoweringError, Placement, lower_compute  # noqa: E402
from ember.ir.loop.affine import local_stride  # noqa: E402

F32, I32, I8 = DType.FLOAT32, DType.INT32, DType.INT8


# ----------------------------------------------------------------------------- printed IR
def test_matmul_accumulates_into_the_output_with_annotated_reduction_loops():
    expect(CASES["matmul"]().lower(), """
        func matmul(a: f32[5, 7], b: f32[7, 9], out0: f32[5, 9]) {
          for i0 in [0, 5) @accumulation=init {
            for i1 in [0, 9) {
              out0[(i0 * 9) + i1] = 0.0f
            }
          }
          for i2 in [0, 5) @accumulation=update {
            for i3 in [0, 9) {
              for i4 in [0, 7) @reduce=True @accumulate_init=0.0f {
                out0[(i2 * 9) + i3] = out0[(i2 * 9) + i3] + (a[(i2 * 7) + i4] * b[(i4 * 9) + i3])
              }
            }
          }
        }
    """)


def test_convolution_epilogue_is_a_last_elementwise_pass_and_an_annotation():
    # Unscheduled, the epilogue is its own pass over the output; the annotations on the
    # reduction loop let cache_accumulator apply it to the register tile before the store.
    x, w, b = placeholder((2, 8), F32, "x"), placeholder((3, 2, 3), F32, "w"), \
        placeholder((3,), F32, "b")
    c, k = reduce_axis(2, "c"), reduce_axis(3, "k")
    y = compute((3, 6), lambda o, i: reduce_sum(x[c, i + k] * w[o, c, k], (c, k)) + b[o], "cv")
    expect(lower_compute("conv1d", [x, w, b], [y]), """
        func conv1d(x: f32[2, 8], w: f32[3, 2, 3], b: f32[3], out0: f32[3, 6]) {
          for i0 in [0, 3) @accumulation=init {
            for i1 in [0, 6) {
              out0[(i0 * 6) + i1] = 0.0f
            }
          }
          for i2 in [0, 3) @accumulation=update {
            for i3 in [0, 6) {
              for i4 in [0, 2) @reduce=True @accumulate_init=0.0f @accumulate_epilogue=acc + b[i2] @accumulate_result=acc {
                for i5 in [0, 3) @reduce=True {
                  out0[(i2 * 6) + i3] = out0[(i2 * 6) + i3] + (x[(i4 * 8) + (i3 + i5)] * w[((i2 * 6) + (i4 * 3)) + i5])
                }
              }
            }
          }
          for i6 in [0, 3) @accumulation=epilogue {
            for i7 in [0, 6) {
              out0[(i6 * 6) + i7] = out0[(i6 * 6) + i7] + b[i6]
            }
          }
        }
    """)  # noqa: E501


def test_row_reduction_uses_a_scalar_accumulator_and_applies_the_epilogue():
    expect(CASES["rms"]().lower(), """
        func rms(x: f32[6, 10], out0: f32[6]) {
          for i0 in [0, 6) {
            alloc t0: f32[1] local
            t0[0] = 0.0f
            for i1 in [0, 10) {
              t0[0] = t0[0] + (x[(i0 * 10) + i1] * x[(i0 * 10) + i1])
            }
            out0[i0] = sqrt((t0[0] / 10.0f))
          }
        }
    """)


def test_multi_stage_compute_keeps_intermediate_stages_in_scratch_buffers():
    """Stages read at other indices than their own (a row maximum) or read twice and
    expensive to recompute (exp) are materialized: in scratch parameters, which the caller
    places in the workspace arena, or -- the exponentials, which the last stage reads only
    at its own index -- in the output's buffer; the reduction accumulators stay in
    registers."""
    expect(CASES["softmax"]().lower(), """
        func softmax(x: f32[5, 11], out0: f32[5, 11], scratch0: f32[5], scratch1: f32[5]) {
          for i0 in [0, 5) {
            alloc t0: f32[1] local
            t0[0] = -inff
            for i1 in [0, 11) {
              t0[0] = max(t0[0], x[(i0 * 11) + i1])
            }
            scratch0[i0] = t0[0]
          }
          for i2 in [0, 5) {
            for i3 in [0, 11) {
              out0[(i2 * 11) + i3] = exp((x[(i2 * 11) + i3] - scratch0[i2]))
            }
          }
          for i4 in [0, 5) {
            alloc t1: f32[1] local
            t1[0] = 0.0f
            for i5 in [0, 11) {
              t1[0] = t1[0] + out0[(i4 * 11) + i5]
            }
            scratch1[i4] = t1[0]
          }
          for i6 in [0, 5) {
            for i7 in [0, 11) {
              out0[(i6 * 11) + i7] = out0[(i6 * 11) + i7] / scratch1[i6]
            }
          }
        }
    """)


def test_conditional_reduction_selects_the_accumulator():
    expect(CASES["cummax"]().lower(), """
        func cummax(x: i32[3, 6], out0: i32[3, 6]) {
          for i0 in [0, 3) {
            for i1 in [0, 6) {
              alloc t0: i32[1] local
              t0[0] = -2147483648:i32
              for i2 in [0, 6) {
                t0[0] = select((i2 <= i1), max(t0[0], x[(i0 * 6) + i2]), t0[0])
              }
              out0[(i0 * 6) + i1] = t0[0] * 2:i32
            }
          }
        }
    """)


def test_scalar_output_reduction():
    expect(CASES["total"]().lower(), """
        func total(x: f32[4, 8], out0: f32[]) {
          alloc t0: f32[1] local
          t0[0] = 0.0f
          for i0 in [0, 4) {
            for i1 in [0, 8) {
              t0[0] = t0[0] + x[(i0 * 8) + i1]
            }
          }
          out0[0] = t0[0]
        }
    """)


def test_output_that_is_an_input_is_copied():
    x = placeholder((2, 3), F32, "x")
    func = lower_compute("ident", [x], [x])
    expect(func, """
        func ident(x: f32[2, 3], out0: f32[2, 3]) {
          for i0 in [0, 6) {
            out0[i0] = x[i0]
          }
        }
    """)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_outputs(func, [data])[0], data)


def test_repeated_output_is_copied_from_where_the_stage_was_stored():
    """The stage is stored in its first output buffer; later repeats copy that buffer (the
    copy used to read the stage's own buffer, which is neither a parameter nor allocated)."""
    x = placeholder((4,), F32, "x")
    y = compute((4,), lambda i: x[i] * const_like(2, F32), "twice")
    func = lower_compute("dup", [x], [y, y])
    expect(func, """
        func dup(x: f32[4], out0: f32[4], out1: f32[4]) {
          for i0 in [0, 4) {
            out0[i0] = x[i0] * 2.0f
          }
          for i1 in [0, 4) {
            out1[i1] = out0[i1]
          }
        }
    """)
    verify_func(func)
    data = np.array([1, -2, 3, 0.5], np.float32)
    out0, out1 = run_outputs(func, [data])
    np.testing.assert_array_equal(out0, data * 2)
    np.testing.assert_array_equal(out1, data * 2)


def test_output_consumed_by_another_output_is_read_from_its_output_buffer():
    x = placeholder((3,), F32, "x")
    y = compute((3,), lambda i: x[i] + const_like(1, F32), "y")
    z = compute((3,), lambda i: y[i] * y[i], "z")
    func = lower_compute("chain", [x], [z, y])
    expect(func, """
        func chain(x: f32[3], out0: f32[3], out1: f32[3]) {
          for i0 in [0, 3) {
            out1[i0] = x[i0] + 1.0f
          }
          for i1 in [0, 3) {
            out0[i1] = out1[i1] * out1[i1]
          }
        }
    """)
    data = np.array([1, 2, -3], np.float32)
    z_out, y_out = run_outputs(func, [data])
    np.testing.assert_array_equal(y_out, data + 1)
    np.testing.assert_array_equal(z_out, (data + 1) ** 2)


def test_identical_kernels_lower_to_identical_functions():
    """Stage names come from a global counter; loop and local names are canonical."""
    for make in CASES.values():
        first, second = make().lower(), make().lower()
        assert first == second
        assert str(first) == str(second)


def test_two_reductions_in_one_stage_are_rejected():
    x = placeholder((4, 5), F32, "x")
    k1, k2 = reduce_axis(5, "k"), reduce_axis(5, "k")
    y = compute((4,), lambda i: reduce_sum(x[i, k1], k1) + reduce_sum(x[i, k2], k2), "two")
    with pytest.raises(LoweringError, match="at most one Reduce"):
        lower_compute("two", [x], [y])


# ----------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_compute_matches_numpy(name):
    case = CASES[name]()
    func = case.lower()
    verify_func(func)
    case.check(run_outputs(func, case.arrays))


def test_strided_convolution_choice_of_accumulation_and_results():
    """Stride 2 still accumulates into the output (vectorizable), stride 5 does not; both
    compute the same convolution."""
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((2, 40)).astype(np.float32)
    ws = rng.standard_normal((3, 2, 3)).astype(np.float32)
    for stride, accumulates in ((2, True), (5, False)):
        x, w = placeholder((2, 40), F32, "x"), placeholder((3, 2, 3), F32, "w")
        c, k = reduce_axis(2, "c"), reduce_axis(3, "k")
        y = compute((3, 7), lambda o, i: reduce_sum(x[c, i * stride + k] * w[o, c, k], (c, k)))
        func = lower_compute("sconv", [x, w], [y])
        assert ("@reduce=True" in str(func)) is accumulates
        want = np.zeros((3, 7), np.float64)
        for i in range(7):
            want[:, i] = np.einsum("ck,ock->o", xs[:, i * stride:i * stride + 3], ws)
        np.testing.assert_allclose(run_outputs(func, [xs, ws])[0], want, rtol=1e-5, atol=1e-5)


def test_other_combiners_and_integer_wrapping():
    x8 = placeholder((3, 5), I8, "x")
    k = reduce_axis(5, "k")
    prod = compute((3,), lambda i: reduce_prod(x8[i, k], k), "prod")
    xs = np.array([[3, 5, 7, 2, 9], [-4, 4, 4, 4, 1], [1, 1, 1, 1, -1]], np.int8)
    (got,) = run_outputs(lower_compute("prod", [x8], [prod]), [xs])
    np.testing.assert_array_equal(got, np.prod(xs, axis=1, dtype=np.int8))  # wraps in int8

    x = placeholder((4, 6), F32, "x")
    k = reduce_axis(4, "k")
    low = compute((6,), lambda j: reduce_min(x[k, j], k), "colmin")  # into-output, min
    mean = compute((6,), lambda j: Cast(DType.FLOAT64, low[j]) / Const(2.0, DType.FLOAT64),
                   "half")
    func = lower_compute("colmin", [x], [low, mean])
    assert "@reduce=True" in str(func)
    xs = np.random.default_rng(12).standard_normal((4, 6)).astype(np.float32)
    got_min, got_half = run_outputs(func, [xs])
    np.testing.assert_array_equal(got_min, xs.min(axis=0))
    np.testing.assert_array_equal(got_half, xs.min(axis=0).astype(np.float64) / 2)


def test_local_stride():
    i, j, k = Var("i"), Var("j"), Var("k")
    extents = {i: 4, j: 10, k: 3}
    assert local_stride(i * 10 + j, j, extents) == 1
    assert local_stride(i * 10 + j, i, extents) == 10
    assert local_stride(i * 10 + j * 2 + k, j, extents) == 2
    assert local_stride(i * 10 + k, j, extents) == 0
    assert local_stride(Load(Buffer("idx", INDEX, (10,)), j), j, extents) is None


# ----------------------------------------------------------------------------- the oracle
def test_interpreter_integer_semantics_agree_with_numpy():
    rng = np.random.default_rng(13)
    a = rng.integers(-2**31, 2**31, 300).astype(np.int32)
    b = np.concatenate([rng.integers(-40, 40, 150), rng.integers(-2**31, 2**31, 150)])
    b = b.astype(np.int32)
    b[:5] = [0, -1, 1, 0, -1]
    a[:5] = [7, -2**31, -2**31, -7, 5]
    with np.errstate(all="ignore"):
        expected = {
            "add": a + b, "sub": a - b, "mul": a * b,
            "floordiv": np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b))),
            "floormod": np.where(b == 0, 0, np.remainder(a, np.where(b == 0, 1, b))),
            "mod": np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))),
            "min": np.minimum(a, b), "max": np.maximum(a, b),
            "bitxor": a ^ b,
        }
    for op, want in expected.items():
        got = [binary_op(op, I32, int(x), int(y)) for x, y in zip(a, b)]
        np.testing.assert_array_equal(np.array(got, np.int64), want.astype(np.int64), op)
    assert binary_op("div", I32, -7, 2) == -3 and binary_op("floordiv", I32, -7, 2) == -4
    assert binary_op("div", I32, -2**31, -1) == -2**31  # wraps, like the C helper
    assert binary_op("shl", I32, 1, 40) == 0 and binary_op("shr", I32, -8, 99) == -1
    assert cast_value(I8, F32, 1e9) == 127 and cast_value(I8, F32, float("nan")) == 0
    assert cast_value(I8, I32, 300) == 44 and cast_value(DType.UINT8, I32, -1) == 255


def test_interpreter_float_semantics():
    nan = float("nan")
    assert binary_op("add", F32, 0.1, 0.2) == float(np.float32(0.1) + np.float32(0.2))
    assert binary_op("mul", F32, 1e30, 1e30) == float("inf")
    assert np.isnan(binary_op("min", F32, nan, 1.0))
    assert np.isnan(binary_op("min", F32, 1.0, nan))
    assert np.copysign(1, binary_op("max", F32, -0.0, 0.0)) == 1  # b on ties
    assert binary_op("div", F32, 1.0, 0.0) == float("inf")
    assert np.isnan(binary_op("mod", F32, 1.0, 0.0))
    assert binary_op("floormod", F32, -1.0, 3.0) == 2.0
    assert binary_op("add", DType.BOOL, True, True) is True
    assert binary_op("sub", DType.BOOL, True, True) is False


def test_interpreter_checks_bounds_instead_of_wrapping():
    x, y = Buffer("x", F32, (4,)), Buffer("y", F32, (4,))
    i = Var("i")
    func = PrimFunc("shift", (x, y), For(i, Const(0, INDEX), Const(4, INDEX), ForKind.SERIAL,
                                        Store(y, i, Load(x, i - 1))))
    with pytest.raises(InterpreterError, match=r"load from x\[-1\]: out of bounds"):
        run(func, [np.zeros(4, np.float32)])


def test_interpreter_detects_dependent_iterations_of_parallel_and_vectorized_loops():
    x, acc = Buffer("x", F32, (8,)), Buffer("acc", F32, (1,))
    i = Var("i")
    for kind in (ForKind.PARALLEL, ForKind.VECTORIZED):
        body = Store(acc, Const(0, INDEX), Binary("add", Load(acc, Const(0, INDEX)), Load(x, i)))
        func = PrimFunc("sum", (x, acc), For(i, Const(0, INDEX), Const(8, INDEX), kind, body))
        with pytest.raises(IndependenceError, match=f"{kind.value} loop 'i'"):
            run(func, {"x": np.ones(8), "acc": np.zeros(1)})
        # the same loop run serially is fine
        serial = PrimFunc("sum", (x, acc), For(i, Const(0, INDEX), Const(8, INDEX),
                                               ForKind.SERIAL, body))
        assert run(serial, {"x": np.ones(8), "acc": np.zeros(1)})["acc"][0] == 8
    # reading what another iteration writes is a dependence too
    shift = Store(x, i, Load(x, Binary("floormod", i + 1, Const(8, INDEX))))
    func = PrimFunc("rot", (x,), For(i, Const(0, INDEX), Const(8, INDEX), ForKind.PARALLEL,
                                     shift))
    with pytest.raises(IndependenceError):
        run(func, [np.arange(8)])


def test_interpreter_poisons_uninitialised_memory():
    x, y = Buffer("x", F32, (3,)), Buffer("y", F32, (3,))
    i = Var("i")
    func = PrimFunc("partial", (x, y), For(i, Const(0, INDEX), Const(2, INDEX), ForKind.SERIAL,
                                          Store(y, i, Load(x, i))))
    out = run(func, [np.ones(3, np.float32)])["y"]
    assert out[0] == 1 and out[1] == 1 and np.isnan(out[2])


def test_interpreter_vectors():
    x = Buffer("x", F32, (8,))
    from ember.ir.loop import Broadcast, Call, Ramp

    ramp = Ramp(Const(1, INDEX), Const(2, INDEX), 3)
    data = np.arange(8, dtype=np.float32)
    assert eval_expr(Load(x, ramp), buffers={x: data}) == [1.0, 3.0, 5.0]
    total = Call("vector.reduce_add", (Binary("mul", Load(x, ramp), Broadcast(Const(2.0, F32),
                                                                              3)),), F32)
    assert eval_expr(total, buffers={x: data}) == 18.0


# ----------------------------------------------------------------------------- placements
@pytest.mark.parametrize("before, after", [
    ((0, 1, 1), (0, 1, 1)),      # a convolution's padding
    ((1, 0, 2), (0, 3, 0)),      # every axis, each side on its own
    ((0, 0, 0), (0, 0, 0)),      # nothing around: the output is the tensor
    ((2, 0, 0), (1, 0, 0)),      # only the leading axis
])
def test_a_placed_output_is_stored_inside_its_border(before, after):
    """A reduction stored at an offset inside a larger buffer whose border holds one value;
    outputs start poisoned in the interpreter, so an element left unwritten fails."""
    rng = np.random.default_rng(21)
    xs = rng.standard_normal((3, 5, 4)).astype(np.float32)
    ws = rng.standard_normal((4, 2)).astype(np.float32)
    x, w = placeholder((3, 5, 4), F32, "x"), placeholder((4, 2), F32, "w")
    k = reduce_axis(4, "k")
    y = compute((3, 5, 2), lambda b, i, j: reduce_sum(x[b, i, k] * w[k, j], k) * 2.0, "mm")
    shape = tuple(d + b + a for d, b, a in zip((3, 5, 2), before, after))
    placement = Placement(before, shape, const_like(-1.5, F32))
    func = lower_compute("placed", [x, w], [y], placements={0: placement})
    verify_func(func)
    (got,) = run_outputs(func, [xs, ws])
    want = np.pad(2.0 * np.einsum("bik,kj->bij", xs, ws), list(zip(before, after)),
                  constant_values=-1.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_output_placed_twice_is_rejected():
    x = placeholder((4,), F32, "x")
    y = compute((4,), lambda i: x[i] * 2.0, "twice")
    with pytest.raises(LoweringError, match="computed once"):
        lower_compute("bad", [x], [y, y],
                      placements={0: Placement((1,), (5,), const_like(0.0, F32))})


# ----------------------------------------------------------------------------- short windows
def _window_case(channels_summed: int, size: int = 3):
    """A 2-D convolution over size x size taps of a (C, 13, 16) input; with one channel summed
    it is depthwise-like (the taps slide along the output rows and columns), with several it
    is dense (a channel loop of its own)."""
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((channels_summed, 13, 16)).astype(np.float32)
    ws = rng.standard_normal((channels_summed, size, size)).astype(np.float32)
    x, w = placeholder(xs.shape, F32, "x"), placeholder(ws.shape, F32, "w")
    c = reduce_axis(channels_summed, "c")
    kh, kw = reduce_axis(size, "kh"), reduce_axis(size, "kw")
    rows, cols = 14 - size, 17 - size
    y = compute((rows, cols), lambda i, j: reduce_sum(x[c, i + kh, j + kw] * w[c, kh, kw],
                                                       (c, kh, kw)), "win")
    want = sum(xs[cc, r:r + rows, q:q + cols].astype(np.float64) * ws[cc, r, q]
               for cc in range(channels_summed) for r in range(size) for q in range(size))
    return lower_compute("win", [x, w], [y]), [xs, ws], want


def test_a_short_window_is_summed_in_a_register_per_output_element():
    """A depthwise-like window (taps sliding along the output) keeps a local accumulator per
    output element with its taps inside the output loops -- taps marked to be unrolled past
    25 of them (7x7), which the C compiler does not unroll by itself; a dense convolution
    (channels summed too) and a window of more than 49 taps accumulate into the output row.
    All compute the convolution."""
    for size, unrolled in ((3, False), (7, True)):
        window, arrays, want = _window_case(1, size)
        assert "@reduce=True" not in str(window) and "local" in str(window)
        assert ("unrolled for" in str(window)) is unrolled
        np.testing.assert_allclose(run_outputs(window, arrays)[0], want, rtol=1e-5,
                                   atol=1e-5)
    for channels, size in ((4, 3), (1, 9)):
        accumulated, arrays, want = _window_case(channels, size)
        assert "@reduce=True" in str(accumulated)
        np.testing.assert_allclose(run_outputs(accumulated, arrays)[0], want, rtol=1e-5,
                                   atol=1e-5)


def test_an_intermediate_the_last_stage_reads_elementwise_lives_in_the_output():
    """A softmax's exponentials: summed by one stage, divided elementwise by the last.  They
    are stored in the output buffer (divided there in place), not in a scratch of the output's
    size; the result is numpy's.  A last stage that reads the intermediate elsewhere than at
    its own index (shifted by one) keeps the scratch."""
    rng = np.random.default_rng(9)
    xs = rng.standard_normal((6, 10)).astype(np.float32)

    def softmax(shift: int):
        x = placeholder((6, 10), F32, "x")
        e = compute((6, 10), lambda i, j: Call("exp", (x[i, j],), F32), "e")
        k = reduce_axis(10, "k")
        total = compute((6,), lambda i: reduce_sum(e[i, k], k), "total")
        y = compute((6, 10), lambda i, j: (e[i, (j + shift) % 10] if shift else e[i, j]) /
                    total[i], "y")
        return lower_compute("softmax", [x], [y])

    func = softmax(0)
    assert [p.shape for p in func.params[2:]] == [(6,)]  # only the sums are scratch
    want = np.exp(xs.astype(np.float64))
    want /= want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(run_outputs(func, [xs])[0], want, rtol=1e-5)
    shifted = softmax(1)
    assert [p.shape for p in shifted.params[2:]] == [(6, 10), (6,)]
    np.testing.assert_allclose(run_outputs(shifted, [xs])[0], np.roll(want, -1, axis=1),
                               rtol=1e-5)
