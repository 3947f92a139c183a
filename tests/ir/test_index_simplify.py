"""Range-aware index simplification (``ember.ir.loop.index_simplify``): every rewrite is
checked against brute-force evaluation of the original index over the whole loop space."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.dtypes import DType
from ember.core.traced import SizeTrace, expr_of, is_traced, tracing
from ember.ir.loop.expr import Binary, Const, Expr, Var
from ember.ir.loop.functor import walk
from ember.ir.loop.index_simplify import interval, simplify_index

I64 = DType.INT64


def _c(value: int) -> Const:
    return Const(value, I64)


def _evaluate(expr: Expr, env: dict[Var, int], dims: tuple[int, ...] = ()) -> int:
    """Exact integer semantics of the IR: floor for floordiv/floormod, C truncation for
    div/mod; a traced build's run-time sizes take the values ``dims``."""
    if isinstance(expr, Const):
        return expr_of(expr.value).evaluate(dims) if is_traced(expr.value) else int(expr.value)
    if isinstance(expr, Var):
        return env[expr]
    assert isinstance(expr, Binary), expr
    a, b = _evaluate(expr.a, env, dims), _evaluate(expr.b, env, dims)
    if expr.op == "add":
        return a + b
    if expr.op == "sub":
        return a - b
    if expr.op == "mul":
        return a * b
    if expr.op == "floordiv":
        return a // b
    if expr.op == "floormod":
        return a % b
    if expr.op == "div":
        return abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
    if expr.op == "mod":
        return a - b * _evaluate(Binary("div", _c(a), _c(b)), env)
    if expr.op == "min":
        return min(a, b)
    if expr.op == "max":
        return max(a, b)
    raise AssertionError(expr.op)


def _divisions(expr: Expr) -> int:
    return sum(isinstance(n, Binary) and n.op in ("floordiv", "floormod", "div", "mod")
               for n in walk(expr))


def _check_equal_everywhere(original: Expr, simplified: Expr, ranges: dict[Var, tuple]) -> None:
    names = list(ranges)
    for point in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges.values())):
        env = dict(zip(names, point))
        assert _evaluate(simplified, env) == _evaluate(original, env), (env, original,
                                                                        simplified)


def _flat(indices: list[Expr], shape: list[int]) -> Expr:
    flat: Expr = _c(0)
    for index, size in zip(indices, shape):
        flat = flat * _c(size) + index
    return flat


def _unflat(flat: Expr, shape: list[int]) -> list[Expr]:
    out = []
    for axis in range(len(shape)):
        stride = int(np.prod(shape[axis + 1:]))
        out.append(Binary("floormod", Binary("floordiv", flat, _c(stride)), _c(shape[axis])))
    return out


def test_a_reshape_round_trip_becomes_the_plain_flat_index():
    """GPT-2's GELU between two Reshapes: (1, 128, 3072) -> (128, 3072) -> back."""
    f, j = Var("f"), Var("j")
    ranges = {f: (0, 127), j: (0, 3071)}
    outer = [Binary("floordiv", f, _c(128)), Binary("floormod", f, _c(128)), j]  # fused loop
    source = _unflat(_flat(outer, [1, 128, 3072]), [128, 3072])
    index = _flat(source, [128, 3072])
    simplified = simplify_index(index, ranges)
    assert _divisions(simplified) == 0, simplified
    _check_equal_everywhere(index, simplified, {f: (0, 127), j: (0, 40)})


@pytest.mark.parametrize("seed", range(40))
def test_random_reshape_chains_keep_their_value(seed):
    """Index through a random chain of reshapes (each a flatten and an unflatten of the same
    elements), some with an offset (padding) that must keep its divisions."""
    rng = random.Random(seed)
    rank = rng.randint(1, 3)
    shape = [rng.randint(1, 5) for _ in range(rank)]
    loops = [Var(f"i{k}") for k in range(rank)]
    ranges = {v: (0, size - 1) for v, size in zip(loops, shape)}
    indices: list[Expr] = list(loops)
    total = int(np.prod(shape))
    shifted = False
    for _ in range(rng.randint(1, 3)):
        flat = _flat(indices, shape)
        if rng.random() < 0.3:
            flat = flat + _c(rng.choice([-2, -1, 1, 3]))  # an offset: may leave the range
            shifted = True
        factors = [d for d in range(1, total + 1) if total % d == 0]
        first = rng.choice(factors)
        shape = [first, total // first]
        indices = _unflat(flat, shape)
    index = _flat(indices, shape)
    simplified = simplify_index(index, ranges)
    _check_equal_everywhere(index, simplified, ranges)
    if not shifted:  # a pure reshape chain is the flat index of the loops again
        assert _divisions(simplified) == 0, simplified


def test_rows_read_through_a_batched_view_index_without_divisions():
    """A (batch*seq, hidden) loop reading a (batch, seq, hidden) view of the same elements (a
    Reshape fused between a GEMM and GELU): the batch index (i*H + j) // (S*H) is i // S,
    and with the sequence index (i*H + j) // H % S it recombines to the flat i*H + j."""
    i, j = Var("i"), Var("j")
    batch, seq, hidden = 3, 4, 5
    ranges = {i: (0, batch * seq - 1), j: (0, hidden - 1)}
    flat = _flat([i, j], [batch * seq, hidden])
    index = _flat(_unflat(flat, [batch, seq, hidden]), [batch, seq, hidden])
    simplified = simplify_index(index, ranges)
    assert _divisions(simplified) == 0, simplified
    _check_equal_everywhere(index, simplified, ranges)
    quotient = simplify_index(Binary("floordiv", flat, _c(seq * hidden)), ranges)
    assert quotient == Binary("div", i, _c(seq)), quotient


@pytest.mark.parametrize("seed", range(60))
def test_divisions_by_a_multiple_of_a_common_factor_keep_their_value(seed):
    """(g*a + b) // (g*d) and its remainder, with random coefficients, offsets and ranges
    (some b leave [0, g): those must keep a division)."""
    rng = random.Random(seed)
    g, d = rng.choice([2, 3, 4, 6]), rng.choice([2, 3, 5])
    i, j, k = Var("i"), Var("j"), Var("k")
    ranges = {i: (rng.randint(-4, 0), rng.randint(0, 6)), j: (0, rng.randint(0, g)),
              k: (0, rng.randint(0, 3))}
    dividend = i * _c(g * rng.choice([1, 2, -1])) + j + k * _c(g * rng.choice([1, 3])) + \
        _c(rng.choice([0, g, 1, -g]))
    for op in ("floordiv", "floormod"):
        expr = Binary(op, dividend, _c(g * d))
        _check_equal_everywhere(expr, simplify_index(expr, ranges), ranges)
    non_negative = {i: (0, ranges[i][1]), j: ranges[j], k: ranges[k]}
    positive = i * _c(g) + j + k * _c(g * 2)
    for op in ("div", "mod"):
        expr = Binary(op, positive, _c(g * d))
        _check_equal_everywhere(expr, simplify_index(expr, non_negative), non_negative)


def test_divisions_by_run_time_sizes_are_simplified_for_every_size():
    """A traced build's rows of a (2*S, 16) view read as (N, 2, S, 16) (a Dynamo graph of
    attention): the dividend's coefficient 16*S and the divisor 32*S are run-time sizes, so the
    common factor is found as an expression (16*S of 32*S: the batch index is i // 2) and not
    from the sample, where gcd(128, 256) = 128 would hold at S = 8 alone."""
    trace = SizeTrace(("S",), (8,))
    s = trace.symbol("S")
    i, j, k = Var("i"), Var("j"), Var("k")
    index = Binary("floordiv", i * _c(16 * s) + j * _c(16) + k, _c(32 * s))
    with tracing(trace):
        simplified = simplify_index(index, {i: (0, 5), j: (0, s - 1), k: (0, 15)})
    assert _divisions(simplified) == 1 and not any(
        isinstance(n, Const) and is_traced(n.value) for n in walk(simplified)), simplified
    for size in (1, 3, 8, 13, 16):
        assert trace.failed_guard((size,)) is None, size
        for point in itertools.product(range(6), range(size), range(0, 16, 5)):
            env = dict(zip((i, j, k), point))
            assert _evaluate(simplified, env, (size,)) == _evaluate(index, env, (size,))


@pytest.mark.parametrize("form", range(6))
def test_rewrites_of_traced_divisions_hold_wherever_their_guards_do(form):
    """Dividends and divisors mixing run-time sizes and constants, simplified at S = 8: at
    every other S whose guards hold, the rewrite computes the original index."""
    trace = SizeTrace(("S",), (8,))
    s = trace.symbol("S")
    i, j, k = Var("i"), Var("j"), Var("k")
    dividend, divisor = [
        (i * _c(16 * s) + j, _c(128)),             # 16 of 16*S and of 128: (i*S) // 8
        (i * _c(48) + j * _c(16) + k, _c(32 * s)),  # a constant coefficient, a traced divisor
        (i * _c(32 * s) + j * _c(8) + k, _c(16 * s)),
        (i * _c(s * 6) + j * _c(3) + k, _c(12)),
        (i * _c(16 * s) + j * _c(16) + k - _c(3), _c(32 * s)),  # may leave [0, 16*S)
        (i * _c(s) + j, _c(s)),
    ][form]
    ranges = {i: (0, 5), j: (0, s - 1), k: (0, 15)}
    for op in ("floordiv", "floormod"):
        index = Binary(op, dividend, divisor)
        with tracing(trace):
            simplified = simplify_index(index, ranges)
        for size in (1, 2, 3, 5, 8, 12, 13, 16, 31):
            if trace.failed_guard((size,)) is not None:
                continue   # a build traced at 8 does not serve this size
            for point in itertools.product(range(6), range(size), range(0, 16, 3)):
                env = dict(zip((i, j, k), point))
                assert _evaluate(simplified, env, (size,)) == _evaluate(index, env, (size,)), \
                    (op, size, env, simplified)
    assert trace.failed_guard((9,)) is None   # a size near the sample is served


def test_divisions_the_ranges_do_not_make_exact_stay():
    i, j = Var("i"), Var("j")
    ranges = {i: (0, 4), j: (0, 2)}
    shifted = Binary("floordiv", i * _c(3) + j - _c(1), _c(3))  # j - 1 may be negative
    kept = simplify_index(shifted, ranges)  # i - 1 + (j + 2) / 3: a division remains
    assert _divisions(kept) == 1
    _check_equal_everywhere(shifted, kept, ranges)
    unknown = Binary("floormod", Var("k") * _c(3) + j, _c(3))  # k has no range, j does
    assert _divisions(simplify_index(unknown, ranges)) == 0  # k's multiple drops out anyway
    truncating = Binary("div", i * _c(3) + j - _c(2), _c(3))  # C division of a negative
    assert simplify_index(truncating, ranges) is truncating
    _check_equal_everywhere(truncating, simplify_index(truncating, ranges), ranges)


def test_a_division_of_a_non_negative_index_becomes_c_division():
    """A transpose's index: (i * 768 + j) // 64 % 12 with j in [0, 768) is j / 64 (C's
    division, as the dividend is non-negative), and the remainder j % 64."""
    i, j = Var("i"), Var("j")
    ranges = {i: (0, 127), j: (0, 767)}
    flat = i * _c(768) + j
    index = Binary("floormod", Binary("floordiv", flat, _c(64)), _c(12)) * _c(8192) + \
        i * _c(64) + Binary("floormod", flat, _c(64))
    simplified = simplify_index(index, ranges)
    ops = {n.op for n in walk(simplified) if isinstance(n, Binary)}
    assert "floordiv" not in ops and "floormod" not in ops and {"div", "mod"} <= ops
    _check_equal_everywhere(index, simplified, {i: (0, 3), j: (0, 767)})


def test_quotient_and_remainder_recombine_without_a_range():
    f = Var("f")
    index = Binary("floordiv", f, _c(128)) * _c(256) + Binary("floormod", f, _c(128)) * _c(2)
    simplified = simplify_index(index, {})
    assert _divisions(simplified) == 0
    _check_equal_everywhere(index, simplified, {f: (-300, 300)})


def test_values_that_are_not_indices_are_left_alone():
    x = Var("x", DType.INT32)
    value = Binary("floordiv", x * Const(4, DType.INT32), Const(4, DType.INT32))
    assert simplify_index(value, {x: (0, 3)}) is value


def test_interval_of_divisions():
    i = Var("i")
    assert interval(Binary("floordiv", i, _c(4)), {i: (0, 9)}) == (0, 2)
    assert interval(Binary("floormod", i, _c(4)), {i: (4, 6)}) == (0, 2)
    assert interval(Binary("floormod", i, _c(4)), {i: (0, 9)}) == (0, 3)
    assert interval(Binary("mod", i, _c(4)), {i: (-5, 9)}) == (-3, 3)
    assert interval(i * _c(-2) + _c(1), {i: (0, 3)}) == (-5, 1)


def test_a_fused_reshape_gelu_kernel_indexes_without_divisions_and_computes_gelu():
    shapes = [numpy_helper.from_array(np.array([12, 34], dtype=np.int64), "s1"),
              numpy_helper.from_array(np.array([1, 12, 34], dtype=np.int64), "s2")]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Gelu", ["a"], ["b"], approximate="tanh"),
             helper.make_node("Reshape", ["b", "s2"], ["y"])]
    graph = helper.make_graph(
        nodes, "reshape_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 34])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 34])], shapes)
    module = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))
    (unit,) = module.build.units.kernels
    assert "em_floordiv" not in unit.source and "em_floormod" not in unit.source
    x = np.linspace(-5, 5, 12 * 34, dtype=np.float32).reshape(1, 12, 34)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(module(x), want, rtol=1e-5, atol=1e-6)
