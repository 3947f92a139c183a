"""The loop-IR reference interpreter, re-exported for the tests that import it by this name,
and the compute cases and printed-IR oracle that the lowering and schedule tests share.

The interpreter itself is :mod:`ember.interp.loops` (the compiler and the tuner use it too);
the cases stay here because they are test data, and lowering them needs ``ember.lower``,
which the interpreter's layer may not import.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.interp.loops import *  # noqa: F401,F403
from ember.interp.loops import (IndependenceError, Interpreter, InterpreterError,  # noqa: F401
                                binary_op, cast_value, eval_expr, normalize, run, run_outputs,
                                unary_op)


# ----------------------------------------------------------------------------- compute cases
# Compute definitions shared by the lowering and schedule tests: each builds fresh tensors
# and gives numpy inputs and the numpy reference of its outputs.
class ComputeCase:
    def __init__(self, name, inputs, outputs, arrays, reference, rtol=1e-5, atol=1e-5):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.arrays = arrays
        self.reference = reference
        self.rtol, self.atol = rtol, atol

    def lower(self):
        from ember.lower import lower_compute

        return lower_compute(self.name, self.inputs, self.outputs)

    def check(self, results: Sequence[np.ndarray]) -> None:
        expected = self.reference(*self.arrays)
        expected = expected if isinstance(expected, (tuple, list)) else [expected]
        assert len(results) == len(expected)
        for got, want in zip(results, expected):
            assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, \
                (self.name, got.shape, got.dtype, np.shape(want))
            np.testing.assert_allclose(got, want, rtol=self.rtol, atol=self.atol,
                                       err_msg=self.name)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def case_matmul() -> ComputeCase:
    from ember.ir.compute import compute, placeholder, reduce_axis, reduce_sum

    f32 = DType.FLOAT32
    a, b = placeholder((5, 7), f32, "a"), placeholder((7, 9), f32, "b")
    k = reduce_axis(7, "k")
    c = compute((5, 9), lambda i, j: reduce_sum(a[i, k] * b[k, j], k), "matmul")
    rng = _rng(1)
    arrays = [rng.standard_normal((5, 7)).astype(np.float32),
              rng.standard_normal((7, 9)).astype(np.float32)]
    return ComputeCase("matmul", [a, b], [c], arrays, lambda x, y: x @ y)


def case_conv() -> ComputeCase:
    """A 2-D convolution (NCHW, stride 1, no padding) with a bias epilogue."""
    from ember.ir.compute import compute, placeholder, reduce_axis, reduce_sum

    f32 = DType.FLOAT32
    x = placeholder((1, 2, 5, 7), f32, "x")
    w = placeholder((3, 2, 3, 3), f32, "w")
    bias = placeholder((3,), f32, "bias")
    c, kh, kw = reduce_axis(2, "c"), reduce_axis(3, "kh"), reduce_axis(3, "kw")
    y = compute((1, 3, 3, 5), lambda n, o, h, v: reduce_sum(
        x[n, c, h + kh, v + kw] * w[o, c, kh, kw], (c, kh, kw)) + bias[o], "conv")
    rng = _rng(2)
    arrays = [rng.standard_normal((1, 2, 5, 7)).astype(np.float32),
              rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
              rng.standard_normal(3).astype(np.float32)]

    def reference(xs, ws, bs):
        out = np.zeros((1, 3, 3, 5), np.float64)
        for i in range(3):
            for j in range(3):
                out += np.einsum("nchw,oc->nohw", xs[:, :, i:i + 3, j:j + 5], ws[:, :, i, j])
        return (out + bs[None, :, None, None]).astype(np.float32)

    return ComputeCase("conv", [x, w, bias], [y], arrays, reference, rtol=1e-4, atol=1e-4)


def case_softmax() -> ComputeCase:
    """Four stages: row max, exp(x - max), row sum, normalise (three live in local buffers)."""
    from ember.ir.compute import compute, placeholder, reduce_axis, reduce_max, reduce_sum
    from ember.ir.loop.expr import call

    f32 = DType.FLOAT32
    x = placeholder((5, 11), f32, "x")
    k1, k2 = reduce_axis(11, "k"), reduce_axis(11, "k")
    m = compute((5,), lambda i: reduce_max(x[i, k1], k1), "max")
    e = compute((5, 11), lambda i, j: call("exp", x[i, j] - m[i]), "exp")
    s = compute((5,), lambda i: reduce_sum(e[i, k2], k2), "sum")
    y = compute((5, 11), lambda i, j: e[i, j] / s[i], "softmax")
    arrays = [(_rng(3).standard_normal((5, 11)) * 3).astype(np.float32)]

    def reference(xs):
        z = np.exp(xs - xs.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)

    return ComputeCase("softmax", [x], [y], arrays, reference)


def case_rms() -> ComputeCase:
    """A row reduction with an epilogue: sqrt(sum(x^2) / n) (the scalar-accumulator path)."""
    from ember.ir.compute import compute, const_like, placeholder, reduce_axis, reduce_sum
    from ember.ir.loop.expr import call

    f32 = DType.FLOAT32
    x = placeholder((6, 10), f32, "x")
    k = reduce_axis(10, "k")
    y = compute((6,), lambda i: call("sqrt", reduce_sum(x[i, k] * x[i, k], k)
                                     / const_like(10, f32)), "rms")
    arrays = [_rng(4).standard_normal((6, 10)).astype(np.float32)]
    return ComputeCase("rms", [x], [y], arrays,
                       lambda xs: np.sqrt((xs * xs).sum(axis=1) / 10).astype(np.float32))


def case_masked_max() -> ComputeCase:
    """An int32 reduction with a condition (running max over ``k <= j``) and an epilogue."""
    from ember.ir.compute import compute, placeholder, reduce_axis, reduce_max

    i32 = DType.INT32
    x = placeholder((3, 6), i32, "x")
    k = reduce_axis(6, "k")
    y = compute((3, 6), lambda i, j: reduce_max(x[i, k], k, condition=k.le(j)) * 2, "cummax")
    arrays = [_rng(5).integers(-100, 100, (3, 6)).astype(np.int32)]
    return ComputeCase("cummax", [x], [y], arrays,
                       lambda xs: (np.maximum.accumulate(xs, axis=1) * 2).astype(np.int32),
                       rtol=0, atol=0)


def case_total() -> ComputeCase:
    """A reduction of a whole tensor to a scalar output."""
    from ember.ir.compute import compute, placeholder, reduce_axis, reduce_sum

    f32 = DType.FLOAT32
    x = placeholder((4, 8), f32, "x")
    r, s = reduce_axis(4, "r"), reduce_axis(8, "s")
    y = compute((), lambda: reduce_sum(x[r, s], (r, s)), "total")
    arrays = [_rng(6).standard_normal((4, 8)).astype(np.float32)]
    return ComputeCase("total", [x], [y], arrays,
                       lambda xs: np.asarray(xs.sum(), dtype=np.float32))


def case_elementwise() -> ComputeCase:
    """Broadcasting elementwise ops with a Select and a Cast: leaky relu of x + row bias."""
    from ember.ir.compute import compute, const_like, placeholder
    from ember.ir.loop.expr import Cast, Select

    f32, i64 = DType.FLOAT32, DType.INT64
    x = placeholder((6, 13), f32, "x")
    b = placeholder((6,), i64, "b")

    def body(i, j):
        v = x[i, j] + Cast(f32, b[i])
        return Select(v.gt(const_like(0, f32)), v, v * const_like(0.125, f32))

    y = compute((6, 13), body, "leaky")
    rng = _rng(7)
    arrays = [rng.standard_normal((6, 13)).astype(np.float32),
              rng.integers(-1, 2, 6).astype(np.int64)]

    def reference(xs, bs):
        v = xs + bs[:, None].astype(np.float32)
        return np.where(v > 0, v, v * np.float32(0.125)).astype(np.float32)

    return ComputeCase("leaky", [x, b], [y], arrays, reference)


CASES = {"matmul": case_matmul, "conv": case_conv, "softmax": case_softmax, "rms": case_rms,
         "cummax": case_masked_max, "total": case_total, "leaky": case_elementwise}


def expect(node, text: str) -> None:
    """The printed IR of ``node`` is exactly ``text`` (dedented): the Before/Expected oracle."""
    assert str(node) == textwrap.dedent(text).strip()
