"""The loop-IR interpreter as the oracle of the GEMM template: kernels lowered the way the
compiler lowers them (op computes -> ``lower_group``), rewritten onto a ``Gemm`` statement by
``use_gemm_template`` (constant operands packed with the returned ``Prepack``), executed by
``ember.interp.loops`` both ways and compared with each other and with numpy in float64.

Targets differ in their register tile (``mr x nr``), so the packed layouts are exercised with
several strip heights and panel widths.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ember.core.dtypes import DType
from ember.core.target import Target
from ember.interp import loops
from ember.interp.loops import (IndependenceError, InterpreterError, eval_expr, run,
                                run_outputs)
from ember.ir.graph import FusedGroup, Graph
from ember.ir.loop import INDEX, Buffer, Const, For, ForKind, Load, PrimFunc, Store, Var
from ember.ir.loop.expr import Binary, Call, Cast, Ramp
from ember.ir.loop.functor import walk
from ember.ir.loop.stmt import Evaluate, Gemm, GemmKnobs, LetStmt
from ember.ir.parser import parse_graph
from ember.lower.group import lower_group
from ember.passes.infer_shapes import infer_shapes
from ember.schedule.gemm import use_gemm_template

F32 = DType.FLOAT32
TARGETS = ["x86_64-avx2", "x86_64-avx512", "aarch64"]
RNG = np.random.default_rng(11)


# ----------------------------------------------------------------------------- helpers
def _lower(text: str) -> tuple[Graph, PrimFunc, list[str]]:
    """The graph of ``text`` lowered as one kernel, as the compiler lowers a fused group."""
    graph = infer_shapes(parse_graph(text))
    group = FusedGroup(list(graph.nodes), list(graph.inputs) + list(graph.constants),
                       list(graph.outputs))
    lowered = lower_group(group, graph, "kernel")
    return graph, lowered.func, list(lowered.inputs)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _check(text: str, feeds: dict[str, np.ndarray], reference, target: str) -> Gemm:
    """Run the plain and the Gemm kernel of ``text``; both must give ``reference`` (a
    function of the graph's values by name, computed in float64).  Returns the Gemm."""
    graph, func, names = _lower(text)
    values = {**graph.constants, **feeds}
    arrays = [values[name] for name in names]
    constants = frozenset(i for i, name in enumerate(names) if name in graph.constants)
    gemm_func, prepacks = use_gemm_template(func, Target.parse(target), constants)
    gemms = [n for n in walk(gemm_func.body) if isinstance(n, Gemm)]
    assert len(gemms) == 1, gemm_func
    packed = list(arrays)
    for prepack in prepacks:
        packed[prepack.param] = prepack.apply(arrays[prepack.param])
    plain, = run_outputs(func, arrays)
    fast, = run_outputs(gemm_func, packed)
    expected = reference({k: np.asarray(v, np.float64) for k, v in values.items()})
    scale = max(1.0, float(np.abs(expected).max()))
    # the Gemm sums in float64 and rounds once: as close to the reference as float32 gets
    np.testing.assert_allclose(fast, expected, rtol=1e-5, atol=1e-6 * scale)
    # the plain loops sum in float32, term by term
    np.testing.assert_allclose(plain, fast, rtol=1e-5, atol=1e-5 * scale)
    assert not np.isnan(fast).any()  # every output element was written
    return gemms[0]


def _conv(x: np.ndarray, w: np.ndarray, stride: int, dilation: int) -> np.ndarray:
    n, _, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh = (h - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, m, oh, ow))
    for r in range(kh):
        for q in range(kw):
            patch = x[:, :, r * dilation:r * dilation + stride * oh:stride,
                      q * dilation:q * dilation + stride * ow:stride]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, r, q])
    return out


# ----------------------------------------------------------------------------- compiler path
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,n,k", [(13, 40, 64), (5, 17, 60), (64, 64, 64)])
def test_matmul_with_a_constant_weight_packed_at_compile_time(m, n, k, target):
    text = f"""
        graph g(%x: f32[{m}, {k}]) -> (%y: f32[{m}, {n}]) {{
          const %w: f32[{k}, {n}] = random
          %y = MatMul(%x, %w)
        }}"""
    gemm = _check(text, {"x": _randn(m, k)}, lambda v: v["x"] @ v["w"], target)
    assert gemm.b_packed and not gemm.a_packed and gemm.finish is None


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_trans_b_with_alpha_beta_bias_and_relu_epilogue(target):
    text = """
        graph g(%x: f32[19, 150]) -> (%y: f32[19, 70]) {
          const %w: f32[70, 150] = random
          const %b: f32[70] = random
          %t = Gemm(%x, %w, %b) {alpha=0.5, beta=2.0, transB=1}
          %y = Relu(%t)
        }"""
    gemm = _check(text, {"x": _randn(19, 150)},
                  lambda v: np.maximum(0.5 * (v["x"] @ v["w"].T) + 2.0 * v["b"], 0), target)
    assert gemm.b_packed and gemm.finish is not None  # B read transposed, packed once


@pytest.mark.parametrize("target", TARGETS)
def test_residual_epilogue_reads_another_input_at_the_element(target):
    text = """
        graph g(%x: f32[37, 64], %r: f32[37, 50]) -> (%y: f32[37, 50]) {
          const %w: f32[64, 50] = random
          %t = MatMul(%x, %w)
          %y = Add(%t, %r)
        }"""
    gemm = _check(text, {"x": _randn(37, 64), "r": _randn(37, 50)},
                  lambda v: v["x"] @ v["w"] + v["r"], target)
    assert any(isinstance(n, Load) for n in walk(gemm.finish))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [35, 32])
def test_batched_matmul_where_b_moves_with_the_batch(n, target):
    text = f"""
        graph g(%x: f32[3, 2, 29, 40], %z: f32[3, 2, 40, {n}]) -> (%y: f32[3, 2, 29, {n}]) {{
          %y = MatMul(%x, %z)
        }}"""
    gemm = _check(text, {"x": _randn(3, 2, 29, 40), "z": _randn(3, 2, 40, n)},
                  lambda v: v["x"] @ v["z"], target)
    assert gemm.b_moves_with_batch and gemm.batch and not gemm.b_packed


@pytest.mark.parametrize("target", TARGETS)
def test_batched_matmul_with_a_shared_run_time_b(target):
    text = """
        graph g(%x: f32[3, 29, 40], %z: f32[40, 35]) -> (%y: f32[3, 29, 35]) {
          %y = MatMul(%x, %z)
        }"""
    gemm = _check(text, {"x": _randn(3, 29, 40), "z": _randn(40, 35)},
                  lambda v: v["x"] @ v["z"], target)
    assert not gemm.b_moves_with_batch and not gemm.b_packed


@pytest.mark.parametrize("target", TARGETS)
def test_pointwise_convolution_with_bias_packs_the_weights_as_a(target):
    text = """
        graph g(%x: f32[2, 24, 9, 11]) -> (%y: f32[2, 40, 9, 11]) {
          const %w: f32[40, 24, 1, 1] = random
          const %b: f32[40] = random
          %y = Conv(%x, %w, %b) {kernel_shape=[1, 1]}
        }"""
    gemm = _check(text, {"x": _randn(2, 24, 9, 11)},
                  lambda v: np.einsum("nchw,oc->nohw", v["x"], v["w"][:, :, 0, 0]) +
                  v["b"][None, :, None, None], target)
    assert gemm.a_packed and gemm.n == 9 * 11 and gemm.b_moves_with_batch


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stride,dilation", [(1, 1), (2, 1), (1, 2)])
def test_convolution_3x3_with_bias_and_relu_is_an_im2col_gemm(stride, dilation, target):
    oh, ow = (13 - 2 * dilation - 1) // stride + 1, (12 - 2 * dilation - 1) // stride + 1
    text = f"""
        graph g(%x: f32[2, 8, 13, 12]) -> (%y: f32[2, 20, {oh}, {ow}]) {{
          const %w: f32[20, 8, 3, 3] = random
          const %b: f32[20] = random
          %t = Conv(%x, %w, %b) {{kernel_shape=[3, 3], strides=[{stride}, {stride}],
                                 dilations=[{dilation}, {dilation}]}}
          %y = Relu(%t)
        }}"""
    gemm = _check(text, {"x": _randn(2, 8, 13, 12)},
                  lambda v: np.maximum(_conv(v["x"], v["w"], stride, dilation) +
                                       v["b"][None, :, None, None], 0), target)
    assert gemm.k == 8 * 9 and len(gemm.b_k_dims) > 1  # B gathered through b_k_dims
    assert gemm.a_packed and gemm.finish is not None


# ----------------------------------------------------------------------------- Gemm semantics
def _product(m: int = 3, n: int = 4, k: int = 5, *, out_rs: int | None = None,
             a_rs: int | None = None, b_k_dims=None, finish=None, batch=(),
             b_base=None) -> tuple[PrimFunc, Gemm]:
    """``out = a @ b`` for row-major matrices, as a hand-built Gemm (optionally batched)."""
    size = 1
    for _, extent in batch:
        size *= extent
    a = Buffer("a", F32, (size * m * k,))
    b = Buffer("b", F32, (size * k * n,))
    out = Buffer("out", F32, (size * m * n,))
    row, col, result = Var("i"), Var("j"), Var("acc", F32)
    base = Const(0, INDEX)
    element: Binary | Const = base
    for var, extent in batch:
        element = var if isinstance(element, Const) else element * extent + var
    gemm = Gemm(out, a, b, None, tuple(batch), m, n, k,
                element * (m * n) if batch else base, element * (m * k) if batch else base,
                b_base if b_base is not None else base,
                n if out_rs is None else out_rs, k if a_rs is None else a_rs, 1,
                b_k_dims if b_k_dims is not None else ((k, n),), ((n, 1),), False,
                row, col, result, finish, GemmKnobs(2, 4, k, 2, 4, 4))
    return PrimFunc("gemm", (a, b, out), gemm), gemm


def test_a_plain_gemm_stores_the_rounded_product():
    func, _ = _product()
    a, b = _randn(3, 5), _randn(5, 4)
    out, = run_outputs(func, [a, b])
    np.testing.assert_array_equal(out, (a.astype(np.float64) @ b).astype(np.float32)
                                  .reshape(-1))


def test_finish_sees_row_column_result_and_batch_variables():
    batch = Var("bt")
    row, col, result = Var("i"), Var("j"), Var("acc", F32)  # the names _product binds
    finish = result * Const(2.0, F32) + Cast(F32, row * 100 + col * 10 + batch)
    func, _ = _product(finish=finish, batch=((batch, 2),))
    a, b = _randn(2, 3, 5), _randn(2, 5, 4)
    out, = run_outputs(func, [a, b])
    # B here does not move with the batch (b_base 0): every element multiplies b[0]
    expected = 2 * (a.astype(np.float64) @ b[0]) + \
        (np.arange(3)[:, None] * 100 + np.arange(4)[None, :] * 10)[None] + \
        np.arange(2)[:, None, None]
    np.testing.assert_allclose(out.reshape(2, 3, 4), expected, rtol=1e-6)


def test_an_out_of_bounds_operand_is_an_error_not_a_wrap():
    func, _ = _product(a_rs=6)  # rows of A 6 apart: the last row runs past the buffer
    with pytest.raises(InterpreterError, match=r"load from a\[\d+\]: out of bounds"):
        run_outputs(func, [_randn(3, 5), _randn(5, 4)])


def test_two_elements_stored_to_one_place_break_the_parallel_tasks():
    func, _ = _product(out_rs=0)  # every row stores to row 0
    with pytest.raises(IndependenceError, match="stored by two"):
        run_outputs(func, [_randn(3, 5), _randn(5, 4)])
    out, = run_outputs(func, [_randn(3, 5), _randn(5, 4)], check_independence=False)
    assert np.isnan(out[4:]).all()  # rows 1 and 2 of the output were never written


def test_a_b_walk_that_does_not_cover_k_is_reported():
    func, _ = _product(b_k_dims=((2, 4), (2, 8)))  # 4 terms, k is 5
    with pytest.raises(InterpreterError, match="b_k_dims"):
        run_outputs(func, [_randn(3, 5), _randn(5, 4)])


def test_a_gemm_inside_a_parallel_loop_is_checked_like_any_access():
    """Two iterations of a parallel loop running the same Gemm write the same outputs."""
    func, gemm = _product()
    loop = For(Var("p"), Const(0, INDEX), Const(2, INDEX), ForKind.PARALLEL, gemm)
    with pytest.raises(IndependenceError, match="parallel loop 'p'"):
        run_outputs(func.with_body(loop), [_randn(3, 5), _randn(5, 4)])


# ----------------------------------------------------------------------------- other statements
def test_every_statement_class_of_the_loop_ir_is_executed():
    import ember.ir.loop.stmt as stmt_module

    statements = {cls for cls in vars(stmt_module).values()
                  if isinstance(cls, type) and issubclass(cls, stmt_module.Stmt) and
                  cls is not stmt_module.Stmt}
    assert statements <= set(loops._STMT_COMPILERS), statements - set(loops._STMT_COMPILERS)


def test_a_prefetch_is_a_hint_that_touches_nothing():
    x = Buffer("x", F32, (4,))
    body = Evaluate(Call("prefetch", (Load(x, Const(99, INDEX)), Const(0, INDEX)), F32))
    run(PrimFunc("hint", (x,), body), [np.zeros(4, np.float32)])  # index 99: no error


def test_a_let_of_a_vector_is_refused():
    x = Buffer("x", DType.INT64, (4,))
    v = Var("v")
    body = LetStmt(v, Ramp(Const(0, INDEX), Const(1, INDEX), 4), Store(x, v, v))
    with pytest.raises(InterpreterError, match="vector"):
        run(PrimFunc("let", (x,), body), [np.zeros(4, np.int64)])


def test_generated_expressions_keep_the_semantics_of_the_type():
    i = Var("i", DType.INT32)
    assert eval_expr(i * Const(2, DType.INT32) + Const(1, DType.INT32), {"i": 2**30}) == \
        -2**31 + 1  # wraps once, as every step would
    with pytest.raises(InterpreterError, match="'i' is not bound"):
        eval_expr(i + Const(1, DType.INT32))


def test_the_test_tree_module_reexports_the_package():
    sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))
    import loop_interpreter

    assert loop_interpreter.run is loops.run and loop_interpreter.InterpreterError is \
        InterpreterError and loop_interpreter.run_outputs is run_outputs
