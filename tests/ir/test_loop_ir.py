"""The loop IR: expressions, buffers, statements, the printer, traversal, simplification and
the verifier.  Values are checked by executing IR with the reference interpreter."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import eval_expr, expect, normalize, run  # noqa: E402

from ember.core.dtypes import DType  # noqa: E402
from ember.core.errors import VerificationError  # noqa: E402
from ember.ir.loop import (INDEX, Allocate, Binary, Broadcast, Buffer, Call, Cast,  # noqa: E402
                           Const, Evaluate, For, ForKind, IfThenElse, LetStmt, Load, PrimFunc,
                           Ramp, Select, Seq, Store, Unary, Var, as_expr, buffers_used, call,
                           const, maximum, minimum, rewrite, seq, simplify, substitute,
                           verify_func, walk)

F32, F64, I32, I64, U8, I8, BOOL = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64,
                                    DType.UINT8, DType.INT8, DType.BOOL)


def c(value, dtype=INDEX) -> Const:
    return Const(value, dtype)


def loop(var, extent, body, kind=ForKind.SERIAL, start=0, annotations=()):
    return For(var, c(start), c(extent), kind, body, annotations)


# ----------------------------------------------------------------------------- expressions
def test_operators_build_binary_nodes_with_matching_constants():
    i = Var("i")
    x = Var("x", F32)
    assert i + 1 == Binary("add", i, c(1))
    assert 1 - i == Binary("sub", c(1), i)
    assert 3 * i == Binary("mul", c(3), i)
    assert i // 4 == Binary("floordiv", i, c(4))
    assert i % 4 == Binary("floormod", i, c(4))
    assert i / 4 == Binary("div", i, c(4))
    assert -i == Unary("neg", i)
    assert x * 2 == Binary("mul", x, Const(2, F32))  # ints adopt the float dtype
    assert (x + 0.5).b == Const(0.5, F32)
    assert Var("n", I32) + 1.5 == Binary("add", Var("n", I32), Const(1.5, F32))
    assert i.lt(3).dtype is BOOL and i.lt(3) == Binary("lt", i, c(3))
    assert [e.op for e in (i.le(1), i.gt(1), i.ge(1), i.eq(1), i.ne(1))] == \
        ["le", "gt", "ge", "eq", "ne"]
    assert minimum(i, 3) == Binary("min", i, c(3))
    assert maximum(x, 0) == Binary("max", x, Const(0, F32))


def test_expression_types_and_lanes():
    i = Var("i")
    x = Buffer("x", F32, (16,))
    ramp = Ramp(i, c(1), 4)
    assert (ramp.dtype, ramp.lanes) == (INDEX, 4)
    load = Load(x, ramp)
    assert (load.dtype, load.lanes) == (F32, 4)
    vec = load + Broadcast(Const(1.0, F32), 4)
    assert (vec.dtype, vec.lanes) == (F32, 4)
    assert Unary("not", i.lt(2)).dtype is BOOL
    assert Select(i.lt(2), Const(1.0, F32), Const(2.0, F32)).dtype is F32
    assert Cast(F64, load).lanes == 4 and Cast(F64, load).dtype is F64
    assert Binary("and", i.lt(2), i.gt(0)).dtype is BOOL
    assert Binary("shl", Var("n", I32), Const(2, I32)).dtype is I32
    e = call("exp", load)
    assert (e.dtype, e.lanes, e.args) == (F32, 4, (load,))
    assert call("isnan", Var("v", F32), dtype=BOOL).dtype is BOOL


def test_structural_equality_and_hashing():
    assert Var("i") == Var("i") and Var("i") != Var("i", I32)
    assert hash(Var("i") + 1) == hash(Var("i") + 1)
    assert {Var("i") * 2: "a"}[Var("i") * 2] == "a"
    a, b = Buffer("a", F32, (4,)), Buffer("a", F32, (4,))
    assert Load(a, Var("i")) == Load(b, Var("i"))
    assert Load(a, Var("i")) != Load(Buffer("a", F32, (4,), scope="local"), Var("i"))


def test_constructors_reject_unknown_operations():
    with pytest.raises(ValueError, match="unknown binary op 'pow'"):
        Binary("pow", c(1), c(2))
    with pytest.raises(ValueError, match="unknown"):
        Unary("abs", c(1))
    with pytest.raises(ValueError, match="unknown buffer scope 'shared'"):
        Buffer("s", F32, (4,), scope="shared")
    with pytest.raises(TypeError):
        as_expr("text")


def test_as_expr_and_const():
    assert as_expr(True) == Const(True, BOOL)
    assert as_expr(3) == Const(3, INDEX)
    assert as_expr(3, I32) == Const(3, I32)
    assert as_expr(3, BOOL) == Const(3, INDEX)
    assert as_expr(2.5) == Const(2.5, F32)
    assert as_expr(2.5, F64) == Const(2.5, F64)
    assert as_expr(2.5, I32) == Const(2.5, F32)
    assert const(4) == Const(4, INDEX)
    v = Var("v")
    assert as_expr(v) is v


# ----------------------------------------------------------------------------- buffers
def test_buffer_geometry_and_flat_index():
    b = Buffer("b", F32, (2, 3, 4))
    assert b.size == 24 and b.nbytes == 96 and b.strides() == (12, 4, 1)
    i, j, k = Var("i"), Var("j"), Var("k")
    assert str(b.flat_index([i, j, k])) == "(((i * 12) + (j * 4)) + k)"
    assert str(b.flat_index([0, j, 0])) == "(j * 4)"
    assert b.flat_index([1, 2, 3]) == c(23)
    assert str(b.load(i, 0, k)) == "b[(i * 12) + k]"
    assert str(b) == "b: f32[2, 3, 4]"
    assert Buffer("s", I32, ()).size == 1 and Buffer("s", I32, ()).strides() == ()
    with pytest.raises(ValueError, match="buffer b has rank 3, got 2 indices"):
        b.flat_index([i, j])


def test_flat_index_addresses_every_element_once():
    b = Buffer("b", F32, (3, 4, 5))
    i, j, k = Var("i"), Var("j"), Var("k")
    index = b.flat_index([i, j, k])
    seen = [eval_expr(index, {"i": a, "j": d, "k": e})
            for a in range(3) for d in range(4) for e in range(5)]
    assert seen == list(range(60))


# ----------------------------------------------------------------------------- statements
def test_seq_flattens_and_unwraps():
    a = Store(Buffer("y", F32, (1,)), c(0), Const(1.0, F32))
    b = Evaluate(call("exp", Const(1.0, F32)))
    assert seq(a) is a
    assert seq(a, seq(b, a)) == Seq((a, b, a))
    assert seq(a, None, b) == Seq((a, b))


def test_prim_func_attrs_and_with_body():
    y = Buffer("y", F32, (1,))
    f = PrimFunc("f", (y,), Store(y, c(0), Const(1.0, F32)), attrs=(("op", "Relu"),))
    assert f.attr("op") == "Relu" and f.attr("missing", 7) == 7
    g = f.with_body(Store(y, c(0), Const(2.0, F32)))
    assert g.attrs == f.attrs and g.params == f.params and g != f


# ----------------------------------------------------------------------------- printer
def _demo() -> PrimFunc:
    x, y = Buffer("x", F32, (4, 8)), Buffer("y", F32, (32,))
    t = Buffer("t", F32, (8,), scope="local")
    i, j, k = Var("i"), Var("j"), Var("k")
    n, v = Var("n", I32), Var("v", F32)
    body = Allocate(t, seq(
        loop(i, 3, loop(j, 8, LetStmt(v, x.load(i, j) * 2.0, IfThenElse(
            v.gt(0.0), Store(t, j, maximum(v, 1.5)),
            Store(t, j, Select(v.lt(-1.0), -v, Cast(F32, n))))), ForKind.VECTORIZED),
            ForKind.PARALLEL, start=1, annotations=(("reduce", True),)),
        loop(k, 2, Store(y, Ramp(k * 4, c(1), 4),
                         Load(t, Ramp(k * 4, c(1), 4), mask=Broadcast(k.lt(1), 4))
                         + Broadcast(Const(1.0, F32), 4)), ForKind.UNROLLED),
        Evaluate(call("exp", Const(0.5, F64))),
        Store(y, c(0), Cast(F32, Binary("floormod", Const(7, I32), Const(-2, I32))),
              mask=Const(True, BOOL)),
    ))
    return PrimFunc("demo", (x, y, n), body)


def test_printer_shows_every_statement_kind():
    expect(_demo(), """
        func demo(x: f32[4, 8], y: f32[32], n: i32) {
          alloc t: f32[8] local
          parallel for i in [1, 1 + 3) @reduce=True {
            vectorized for j in [0, 8) {
              let v: f32 = x[(i * 8) + j] * 2.0f
              if v > 0.0f {
                t[j] = max(v, 1.5f)
              } else {
                t[j] = select((v < -1.0f), -v, f32(n))
              }
            }
          }
          unrolled for k in [0, 2) {
            y[ramp((k * 4), 1, 4)] = t[ramp((k * 4), 1, 4) if x4((k < 1))] + x4(1.0f)
          }
          exp(0.5:f64)
          y[0] = f32((7:i32 %% -2:i32)) if true
        }
    """)


def test_printer_constants_and_parentheses():
    i = Var("i")
    assert str(Const(3, I32)) == "3:i32"
    assert str(Const(3, INDEX)) == "3"
    assert str(Const(1, F32)) == "1.0f"
    assert str(Const(0.25, F64)) == "0.25:f64"
    assert str(Const(float("inf"), F32)) == "inff"
    assert str(Const(False, BOOL)) == "false"
    assert str(Const(2.0, F32, lanes=4)) == "x4(2.0f)"
    assert str((i + 1) * (i - 1)) == "((i + 1) * (i - 1))"
    assert str(Cast(F32, Ramp(i, c(2), 4))) == "f32x4(ramp(i, 2, 4))"
    y = Buffer("y", INDEX, (4,))
    assert str(Store(y, i, (i + 1) * (i - 1))) == "y[i] = (i + 1) * (i - 1)"
    assert str(Store(y, (i + 1) * 2, i)) == "y[(i + 1) * 2] = i"
    assert str(Unary("bitnot", i)) == "~i" and str(Unary("not", i.lt(1))) == "!(i < 1)"


# ----------------------------------------------------------------------------- traversal
def test_rewrite_shares_unchanged_subtrees():
    func = _demo()
    assert rewrite(func.body, lambda n: None) is func.body
    y = Buffer("y", F32, (1,))
    first = Store(y, c(0), Const(1.0, F32))
    second = Store(y, c(0), Var("v", F32) * 3.0)
    body = Seq((first, second))
    new = rewrite(body, lambda n: Const(4.0, F32) if n == Const(3.0, F32) else None)
    assert new.stmts[0] is first and new.stmts[1] == Store(y, c(0), Var("v", F32) * 4.0)


def test_substitute_walk_and_buffers_used():
    i, j = Var("i"), Var("j")
    x, y = Buffer("x", F32, (8,)), Buffer("y", F32, (8,))
    stmt = Store(y, i + j, Load(x, i * 2))
    assert substitute(stmt, {i: c(3)}) == Store(y, c(3) + j, Load(x, c(3) * 2))
    assert str(simplify(substitute(stmt, {i: c(3), j: c(1)}))) == "y[4] = x[6]"
    kinds = [type(n).__name__ for n in walk(stmt)]
    assert kinds == ["Store", "Binary", "Var", "Var", "Load", "Binary", "Var", "Const"]
    assert buffers_used(stmt) == {x, y}
    assert buffers_used(_demo()) == {Buffer("x", F32, (4, 8)), Buffer("y", F32, (32,)),
                                     Buffer("t", F32, (8,), scope="local")}


# ----------------------------------------------------------------------------- simplify
def test_simplify_folds_constants_and_identities():
    i = Var("i")
    assert str(simplify((i * 4 + 0) * 2 + 3 + 5)) == "((i * 8) + 8)"
    assert simplify(i * 1 // 1) == i
    assert simplify(0 + i - 0) == i
    assert simplify(i * 0) == c(0) and simplify(0 * i) == c(0)
    assert simplify(i % 1) == c(0)
    assert simplify(c(7) // c(2)) == c(3) and simplify(c(-7) // c(2)) == c(-4)
    assert simplify(Binary("div", c(-7), c(2))) == c(-3)
    assert simplify(Binary("mod", c(-7), c(2))) == c(-1)
    assert simplify(c(-7) % c(2)) == c(1)
    assert simplify(minimum(c(3), c(-2))) == c(-2)
    assert simplify(c(5) // c(0)) == c(5) // c(0)  # division by zero is left alone
    # statements are simplified throughout
    y = Buffer("y", F32, (8,))
    assert str(simplify(Store(y, i * 1 + 2 * 3, Load(y, i + 0)))) == "y[i + 6] = y[i]"


def test_simplify_leaves_float_identities():
    v = Var("v", F32)
    for e in (v + 0.0, v * 1.0, v * 0.0, v - 0.0):
        assert simplify(e) == e
    assert simplify(Const(1.5, F32) * Const(2.0, F32)) == Const(3.0, F32)


def test_simplify_folds_with_the_semantics_of_the_type():
    """Folding must give what the generated code computes: wrapping integers, arithmetic in
    the float type's own precision, NaN-propagating min/max that return b on ties, logical
    bools (it used to fold in unbounded Python ints and doubles)."""
    assert simplify(Const(2**31 - 1, I32) + Const(1, I32)) == Const(-2**31, I32)
    assert simplify(Const(3, U8) - Const(5, U8)) == Const(254, U8)
    assert simplify(Const(100, I8) * Const(3, I8)) == Const(44, I8)
    assert simplify(Binary("div", Const(-2**31, I32), Const(-1, I32))) == Const(-2**31, I32)
    assert simplify((Var("n", I8) + Const(100, I8)) + Const(100, I8)) == \
        Var("n", I8) + Const(-56, I8)
    big = Const(2**62, I64)
    assert simplify(big * Const(4, I64)) == Const(0, I64)
    # f32: the operands round to f32 (as the C literals do) and so does the result
    folded = simplify(Const(16777216.0, F32) + Const(1.000000000001, F32))
    assert folded == Const(16777216.0, F32)
    assert simplify(Const(0.1, F32) + Const(0.2, F32)).value == \
        float(np.float32(0.1) + np.float32(0.2))
    assert simplify(Const(1e30, F32) * Const(1e30, F32)) == Const(math.inf, F32)
    nan_min = simplify(minimum(Const(1.0, F32), Const(math.nan, F32)))
    assert math.isnan(nan_min.value)
    zero = simplify(maximum(Const(-0.0, F32), Const(0.0, F32)))
    assert math.copysign(1.0, zero.value) == 1.0
    assert simplify(Const(True, BOOL) + Const(True, BOOL)) == Const(True, BOOL)
    assert simplify(Const(True, BOOL) - Const(True, BOOL)) == Const(False, BOOL)


_POOLS = {
    I64: [0, 1, -1, 2, 3, 7, -8, 1000, 2**63 - 1, -2**63, 2**40],
    I32: [0, 1, -1, 2, 3, 7, -8, 100000, 2**31 - 1, -2**31],
    I8: [0, 1, -1, 2, 3, 100, -100, 127, -128],
    U8: [0, 1, 2, 3, 7, 200, 255],
    F32: [0.0, -0.0, 1.0, -1.0, 0.1, 3.5, 1e30, -1e30, math.inf, -math.inf, math.nan,
          16777216.0, 1.000000000001, 1e-45],
    F64: [0.0, -0.0, 1.0, -1.0, 0.1, 3.5, 1e300, math.inf, math.nan, 2.0**53],
}
_INT_OPS = ["add", "sub", "mul", "div", "mod", "floordiv", "floormod", "min", "max"]
_FLOAT_OPS = ["add", "sub", "mul", "div", "min", "max"]
_VARS = {dtype: [Var(f"a_{dtype}", dtype), Var(f"b_{dtype}", dtype)] for dtype in _POOLS}


def _random_expr(rng: random.Random, dtype: DType, depth: int):
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.35:
            return rng.choice(_VARS[dtype])
        return Const(rng.choice(_POOLS[dtype]), dtype)
    if rng.random() < 0.1:
        cond = Binary(rng.choice(["lt", "le", "eq", "ne"]), _random_expr(rng, dtype, depth - 1),
                      _random_expr(rng, dtype, depth - 1))
        return Select(cond, _random_expr(rng, dtype, depth - 1),
                      _random_expr(rng, dtype, depth - 1))
    ops = _INT_OPS if dtype.is_int else _FLOAT_OPS
    return Binary(rng.choice(ops), _random_expr(rng, dtype, depth - 1),
                  _random_expr(rng, dtype, depth - 1))


def _same(a, b) -> bool:
    if isinstance(a, float):
        return (a != a and b != b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("dtype", list(_POOLS), ids=str)
def test_simplify_never_changes_values_of_random_expressions(dtype):
    rng = random.Random(f"simplify-{dtype}")
    changed = 0
    for _ in range(250):
        e = _random_expr(rng, dtype, 4)
        s = simplify(e)
        changed += s != e
        for _ in range(4):
            env = {v.name: normalize(rng.choice(_POOLS[dtype] + [rng.randint(-300, 300)]),
                                     dtype) for v in _VARS[dtype]}
            assert _same(eval_expr(e, env), eval_expr(s, env)), f"{e}  ->  {s}  with {env}"
    assert changed > 50  # the test exercises folding, not only untouched trees


# ----------------------------------------------------------------------------- verifier
def test_verifier_accepts_well_formed_functions():
    verify_func(_demo())
    out = run(_demo(), {"x": np.arange(32, dtype=np.float32).reshape(4, 8) - 9},
              scalars={"n": 5}, check_independence=False)["y"]  # i races on t
    # the last i (3) wins: t[j] = max((15 + j) * 2, 1.5); k = 1 loads masked-off zeros;
    # y[0] is then overwritten with 7 floormod -2 = -1
    np.testing.assert_array_equal(out[:8], [-1, 33, 35, 37, 1, 1, 1, 1])
    assert np.isnan(out[8:]).all()  # never written


def _fn(body, *params):
    return PrimFunc("bad", params, body)


X, Y = Buffer("x", F32, (8,)), Buffer("y", F32, (8,))
I, J = Var("i"), Var("j")


@pytest.mark.parametrize("func, message", [
    pytest.param(_fn(seq(loop(I, 8, Store(Y, I, Load(X, I))), Store(Y, I, Load(X, I))), X, Y),
                 "variable 'i' used out of scope", id="loop-var-after-loop"),
    pytest.param(_fn(Store(Y, J, Load(X, c(0))), X, Y),
                 "variable 'j' used out of scope", id="unbound-var"),
    pytest.param(_fn(seq(LetStmt(Var("v", F32), Load(X, c(0)), Store(Y, c(0), Load(X, c(1)))),
                         Store(Y, c(1), Var("v", F32))), X, Y),
                 "variable 'v' used out of scope", id="let-var-after-let"),
    pytest.param(_fn(loop(I, 8, loop(I, 8, Store(Y, I, Load(X, I)))), X, Y),
                 "loop variable 'i' shadows", id="shadowing"),
    pytest.param(_fn(loop(I, 8, Store(Y, I, Load(X, I))), Y),
                 "buffer 'x' is neither a parameter nor allocated", id="unknown-buffer"),
    pytest.param(_fn(seq(Allocate(Buffer("t", F32, (8,), "local"), loop(
        I, 8, Store(Buffer("t", F32, (8,), "local"), I, Load(X, I)))),
        loop(I, 8, Store(Y, I, Load(Buffer("t", F32, (8,), "local"), I)))), X, Y),
                 "buffer 't' is neither a parameter nor allocated", id="local-after-alloc"),
    pytest.param(_fn(Allocate(Buffer("g", F32, (8,)), Store(Y, c(0), Const(0.0, F32))), Y),
                 "Allocate of non-local buffer 'g'", id="global-alloc"),
    pytest.param(_fn(loop(I, 8, Store(Y, I, Load(X, I) + Const(1.0, F64))), X, Y),
                 r"operands of add differ in dtype \(f32 vs f64\)", id="binary-dtype"),
    pytest.param(_fn(loop(I, 8, Store(Y, I + Const(1, I32), Load(X, I))), X, Y),
                 r"operands of add differ in dtype \(i64 vs i32\)", id="index-dtype"),
    pytest.param(_fn(loop(I, 2, Store(Y, Ramp(I, c(1), 4), Load(X, Ramp(I, c(1), 4))
                                      + Const(1.0, F32))), X, Y),
                 r"operands of add differ in lanes \(4 vs 1\)", id="binary-lanes"),
    pytest.param(_fn(loop(I, 8, Store(Y, I, Cast(F64, Load(X, I)))), X, Y),
                 "store of f64 into f32 buffer 'y'", id="store-dtype"),
    pytest.param(_fn(Store(Y, c(0), Load(X, Ramp(c(0), c(1), 4))), X, Y),
                 "store to 'y': 4 value lanes, 1 index lanes", id="store-lanes"),
    pytest.param(_fn(Store(Y, Const(0.0, F32), Const(0.0, F32)), Y),
                 "store to 'y' has a non-integer index", id="float-store-index"),
    pytest.param(_fn(Store(Y, c(0), Load(X, Const(0.0, F32))), X, Y),
                 "load from 'x' has a non-integer index", id="float-load-index"),
    pytest.param(_fn(Store(Y, c(0), Select(c(1), Const(0.0, F32), Const(1.0, F32))), Y),
                 "select condition must be bool", id="select-cond"),
    pytest.param(_fn(Store(Y, c(0), Select(Const(True, BOOL), Const(0.0, F32),
                                           Const(1.0, F64))), Y),
                 "select branches differ in dtype", id="select-branches"),
    pytest.param(_fn(LetStmt(Var("v", I32), c(1), Store(Y, c(0), Const(0.0, F32))), Y),
                 "let 'v: i32' bound to i64", id="let-dtype"),
    pytest.param(_fn(For(I, c(0), Const(8.0, F32), ForKind.SERIAL,
                         Store(Y, I, Const(0.0, F32))), Y),
                 "loop 'i' bounds must be scalar integers", id="float-extent"),
    pytest.param(_fn(Store(Y, Ramp(Ramp(c(0), c(1), 2), c(1), 2), Load(X, Ramp(c(0), c(1), 2))),
                     X, Y),
                 "ramp base and stride must be scalars", id="vector-ramp"),
])
def test_verifier_rejects(func, message):
    with pytest.raises(VerificationError, match=message) as info:
        verify_func(func)
    assert "loop IR of 'bad'" in str(info.value)


def test_scalar_parameters_are_in_scope():
    n = Var("n", I64)
    verify_func(_fn(loop(I, 8, Store(Y, Binary("min", I, n), Load(X, I))), X, Y, n))
    f = _fn(loop(I, 8, Store(Y, Binary("min", I, n), Load(X, I))), X, Y, n)
    out = run(f, {"x": np.arange(8)}, scalars={"n": 3})["y"]
    np.testing.assert_array_equal(out[:3], [0, 1, 2])
    assert out[3] == 7  # the last iteration clamped to index 3 wins


def test_call_and_vector_expressions_verify():
    verify_func(_fn(seq(
        Evaluate(Call("vector.reduce_add", (Load(X, Ramp(c(0), c(1), 4)),), F32)),
        Store(Y, Ramp(c(0), c(2), 4), Broadcast(Const(1.0, F32), 4)),
    ), X, Y))
    with pytest.raises(VerificationError, match="broadcast of a vector"):
        verify_func(_fn(Store(Y, Ramp(c(0), c(1), 2), Broadcast(Load(X, Ramp(c(0), c(1), 2)),
                                                                 2)), X, Y))
