"""Hand-built loop-IR kernels with numpy references, shared by the in-process tests and the
sanitizer run (which imports this file in a subprocess).

A :class:`Case` is a kernel, a way to make its inputs and the outputs numpy says it must
produce.  :func:`run_case` calls the compiled kernel through ctypes and compares.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from ember.core.dtypes import DType
from ember.ir.loop import (Allocate, Binary, Broadcast, Buffer, Call, Cast, Const, Evaluate, Expr,
                           For, ForKind, IfThenElse, LetStmt, Load, PrimFunc, Ramp, Select, Store,
                           Unary, Var, seq)

F32, F64, F16, BF16, BOOL = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16,
                             DType.BOOL)
I8, I16, I32, I64 = DType.INT8, DType.INT16, DType.INT32, DType.INT64
U8, U16, U32, U64 = DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64

CTYPES = {F32: ctypes.c_float, F64: ctypes.c_double, F16: ctypes.c_uint16,
          BF16: ctypes.c_uint16, BOOL: ctypes.c_uint8, I8: ctypes.c_int8, I16: ctypes.c_int16,
          I32: ctypes.c_int32, I64: ctypes.c_int64, U8: ctypes.c_uint8, U16: ctypes.c_uint16,
          U32: ctypes.c_uint32, U64: ctypes.c_uint64}

Inputs = dict[str, object]


@dataclass
class Case:
    """A kernel; ``inputs(rng)`` gives its input arrays/scalars by parameter name,
    ``expected(inputs)`` the outputs by buffer name; ``ulps`` is the tolerance (0: exact)."""

    func: PrimFunc
    inputs: Callable[[np.random.Generator], Inputs]
    expected: Callable[[Inputs], dict[str, np.ndarray]]
    ulps: float | dict[str, float] = 0  # per output name, or one for all
    needs: tuple[str, ...] = field(default=())  # CPU features of the host

    @property
    def name(self) -> str:
        return self.func.name


# ------------------------------------------------------------------------------ IR helpers
def buf(name: str, dtype: DType, n: int | tuple[int, ...], align: int) -> Buffer:
    return Buffer(name, dtype, n if isinstance(n, tuple) else (n,), align=align)


def c(value, dtype: DType = I64, lanes: int = 1) -> Const:
    return Const(value, dtype, lanes)


def ramp(base: Expr, lanes: int, stride: int = 1) -> Ramp:
    return Ramp(base, c(stride), lanes)


def bcast(value: Expr, lanes: int) -> Expr:
    return value if lanes == 1 else Broadcast(value, lanes)


def index(i: Var, lanes: int) -> Expr:
    """Element index of iteration ``i``: ``i`` or the vector ``ramp(i * lanes, 1, lanes)``."""
    return i if lanes == 1 else ramp(i * lanes, lanes)


def loop(i: Var, extent: int, body, kind: ForKind = ForKind.SERIAL) -> For:
    return For(i, c(0), c(extent), kind, body)


def elementwise(name: str, ins: list[Buffer], outs: list[tuple[Buffer, Callable]],
                n: int, lanes: int, kind: ForKind = ForKind.SERIAL) -> PrimFunc:
    """``out[k] = fn(*[in[k]])`` for every output, ``lanes`` elements per iteration."""
    assert n % lanes == 0
    i = Var("i")
    idx = index(i, lanes)
    loads = [Load(b, idx) for b in ins]
    body = seq(*[Store(o, idx, fn(*loads)) for o, fn in outs])
    return PrimFunc(name, tuple(ins) + tuple(o for o, _ in outs), loop(i, n // lanes, body, kind))


# ------------------------------------------------------------------------------ references
def info(dtype: DType):
    return np.iinfo(dtype.numpy)


def wrap(value: int, dtype: DType) -> int:
    bits = 8 * dtype.itemsize
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.is_signed and value >> (bits - 1) else value


def ref_int(op: str, a: int, b: int, dtype: DType) -> int:
    """The defined integer semantics of the C backend (numpy's, with total division)."""
    a, b = int(a), int(b)
    bits = 8 * dtype.itemsize
    if op in ("div", "mod", "floordiv", "floormod") and b == 0:
        return 0
    if op == "div":
        q = abs(a) // abs(b)
        return wrap(q if (a < 0) == (b < 0) else -q, dtype)
    if op == "mod":  # sign of the dividend, like C's %
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    if op == "floordiv":
        return wrap(a // b, dtype)
    if op == "floormod":
        return a % b
    if op == "shl":
        return 0 if not 0 <= b < bits else wrap(a << b, dtype)
    if op == "shr":
        if not 0 <= b < bits:
            return -1 if a < 0 else 0
        return a >> b
    raise ValueError(op)


def vectorize_ref(fn, *arrays, dtype: DType) -> np.ndarray:
    return np.array([fn(*vals) for vals in zip(*arrays)], dtype=dtype.numpy)


def special_ints(dtype: DType, n: int, rng: np.random.Generator) -> np.ndarray:
    i = info(dtype)
    edge = [i.min, i.max, 0, 1, -1, 2, -2, 7, -7, i.min + 1, i.max - 1] if dtype.is_signed \
        else [0, 1, 2, 7, i.max, i.max - 1]
    rest = rng.integers(i.min, i.max, n - len(edge), dtype=dtype.numpy, endpoint=True)
    return np.concatenate([np.array(edge, dtype=dtype.numpy), rest])


# ------------------------------------------------------------------------------ cases
def case_vector_tail(align: int) -> Case:
    """16-lane select/exp/add with a masked tail: 1000 is not a multiple of 16."""
    n, lanes = 1000, 16
    x, y = buf("x", F32, n, align), buf("y", F32, n, align)
    i = Var("i")
    idx = ramp(i * lanes, lanes)
    mask = idx.lt(bcast(c(n), lanes))
    xv = Load(x, idx, mask)
    one, two, zero = (bcast(Const(v, F32), lanes) for v in (1.0, 2.0, 0.0))
    value = Select(xv.gt(zero), xv * two, Call("exp", (xv,), F32, lanes)) + one
    body = loop(i, (n + lanes - 1) // lanes, Store(y, idx, value, mask))
    return Case(PrimFunc("vector_tail", (x, y), body),
                lambda rng: {"x": rng.uniform(-5, 5, n).astype(np.float32)},
                lambda a: {"y": np.where(a["x"] > 0, a["x"] * 2, np.exp(a["x"])) + 1},
                ulps=2)


def case_vectorized_scalar_body(align: int) -> Case:
    n = 999
    x, y, z = (buf(name, F32, n, align) for name in "xyz")
    fn = lambda a, b: a * b + Call("sqrt", (Call("fabs", (a,), F32),), F32)  # noqa: E731
    func = elementwise("vectorized_scalar_body", [x, y], [(z, fn)], n, 1, ForKind.VECTORIZED)

    def inputs(rng):  # x * y >= 0: no cancellation, so fused (FMA) and unfused agree
        xv = rng.standard_normal(n).astype(np.float32)
        return {"x": xv, "y": (np.sign(xv) * rng.uniform(0.1, 2, n)).astype(np.float32)}

    return Case(func, inputs, lambda a: {
        "z": a["x"].astype(np.float64) * a["y"] + np.sqrt(np.abs(a["x"]))}, ulps=2)


def case_row_sum(align: int) -> Case:
    """Parallel rows; a 16-lane local accumulator with a masked last chunk; reduce_add."""
    rows, cols, lanes = 64, 100, 16
    x, out = buf("x", F32, (rows, cols), align), buf("out", F32, rows, align)
    acc = Buffer("acc", F32, (lanes,), scope="local")
    r, j = Var("r"), Var("j")
    col = ramp(j * lanes, lanes)
    mask = col.lt(bcast(c(cols), lanes))
    acc_idx = ramp(c(0), lanes)
    add = Store(acc, acc_idx, Load(acc, acc_idx) + Load(x, bcast(r * cols, lanes) + col, mask))
    body = Allocate(acc, seq(
        Store(acc, acc_idx, bcast(Const(0.0, F32), lanes)),
        loop(j, (cols + lanes - 1) // lanes, add),
        Store(out, r, Call("vector.reduce_add", (Load(acc, acc_idx),), F32))))
    func = PrimFunc("row_sum", (x, out), loop(r, rows, body, ForKind.PARALLEL))
    return Case(func, lambda rng: {"x": rng.standard_normal((rows, cols)).astype(np.float32)},
                lambda a: {"out": a["x"].astype(np.float64).sum(axis=1)}, ulps=64)


def case_int_divmod(dtype: DType, lanes: int, align: int) -> Case:
    n = 64
    a, b = buf("a", dtype, n, align), buf("b", dtype, n, align)
    ops = ("div", "mod", "floordiv", "floormod")
    outs = [(buf(op, dtype, n, align), lambda p, q, op=op: Binary(op, p, q)) for op in ops]
    func = elementwise(f"divmod_{dtype}x{lanes}", [a, b], outs, n, lanes)

    def inputs(rng):
        av = special_ints(dtype, n, rng)
        bv = np.roll(special_ints(dtype, n, rng), 3)
        bv[::5] = 0
        if dtype.is_signed:
            av[:4], bv[:4] = info(dtype).min, [-1, 0, 1, -7]
        return {"a": av, "b": bv}

    return Case(func, inputs, lambda v: {
        op: vectorize_ref(lambda p, q, op=op: ref_int(op, p, q, dtype), v["a"], v["b"],
                          dtype=dtype) for op in ops})


def case_shifts(dtype: DType, lanes: int, align: int) -> Case:
    n, bits = 64, 8 * dtype.itemsize
    a, b = buf("a", dtype, n, align), buf("b", dtype, n, align)
    outs = [(buf(op, dtype, n, align), lambda p, q, op=op: Binary(op, p, q))
            for op in ("shl", "shr")]
    func = elementwise(f"shifts_{dtype}x{lanes}", [a, b], outs, n, lanes)

    def inputs(rng):
        low = -3 if dtype.is_signed else 0
        counts = np.arange(n) % (bits + 8 - low) + low
        return {"a": special_ints(dtype, n, rng), "b": counts.astype(dtype.numpy)}

    return Case(func, inputs, lambda v: {
        op: vectorize_ref(lambda p, q, op=op: ref_int(op, p, q, dtype), v["a"], v["b"],
                          dtype=dtype) for op in ("shl", "shr")})


def case_wrapping(dtype: DType, lanes: int, align: int) -> Case:
    n = 64
    a, b = buf("a", dtype, n, align), buf("b", dtype, n, align)
    outs = [(buf(op, dtype, n, align), lambda p, q, op=op: Binary(op, p, q))
            for op in ("add", "sub", "mul")]
    outs.append((buf("neg", dtype, n, align), lambda p, q: Unary("neg", p)))
    func = elementwise(f"wrapping_{dtype}x{lanes}", [a, b], outs, n, lanes)
    with np.errstate(over="ignore"):
        return Case(func, lambda rng: {"a": special_ints(dtype, n, rng),
                                       "b": np.roll(special_ints(dtype, n, rng), 1)},
                    lambda v: {"add": v["a"] + v["b"], "sub": v["a"] - v["b"],
                               "mul": v["a"] * v["b"],
                               "neg": (np.zeros_like(v["a"]) - v["a"])})


_CAST_TARGETS = ((I8, 16), (U8, 16), (I32, 1), (I64, 1), (U64, 1), (U16, 8))


def saturate(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Truncate toward zero, clamp to the range of ``dtype``; NaN -> 0."""
    i = info(dtype)
    out = []
    for v in x.astype(np.float64).tolist():
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(i.max if v > 0 else i.min)
        else:
            out.append(min(max(math.trunc(v), int(i.min)), int(i.max)))
    return np.array(out, dtype=dtype.numpy)


def case_float_to_int(align: int) -> Case:
    """Out-of-range float -> int casts saturate (NaN -> 0), vector and scalar."""
    n = 64
    x = buf("x", F32, n, align)
    i = Var("i")
    stores = [loop(i, n // lanes, Store(buf(f"to_{d}", d, n, align), index(i, lanes),
                                        Cast(d, Load(x, index(i, lanes)))))
              for d, lanes in _CAST_TARGETS]
    func = PrimFunc("float_to_int", (x,) + tuple(s.body.buffer for s in stores), seq(*stores))
    special = [np.nan, np.inf, -np.inf, 1e10, -1e10, 300, -300, 127.5, -128.5, 255.9, -0.9,
               3e9, -3e9, 1.8e19, 9.3e18, -9.3e18, 2.0 ** 63, -(2.0 ** 63), 65535.5, 65536]

    def inputs(rng):
        rest = rng.uniform(-400, 400, n - len(special))
        return {"x": np.concatenate([special, rest]).astype(np.float32)}

    return Case(func, inputs, lambda v: {f"to_{d}": saturate(v["x"], d)
                                         for d, _ in _CAST_TARGETS})


def narrow_type(dtype: DType):
    return np.float16 if dtype is F16 else ml_dtypes.bfloat16


def case_narrow_roundtrip(dtype: DType, align: int) -> Case:
    """Every f16/bf16 bit pattern -> f32 -> back (scalar); random f32 bits -> narrow (x16)."""
    n, lanes = 1 << 16, 16
    h, back, narrowed = (buf(name, dtype, n, align) for name in ("h", "back", "narrowed"))
    f, wide = buf("f", F32, n, align), buf("wide", F32, n, align)
    i, k = Var("i"), Var("k")
    vk = index(k, lanes)
    body = seq(
        loop(i, n, seq(Store(wide, i, Cast(F32, Load(h, i))),
                       Store(back, i, Cast(dtype, Cast(F32, Load(h, i)))))),
        loop(k, n // lanes, Store(narrowed, vk, Cast(dtype, Load(f, vk)))))
    func = PrimFunc(f"roundtrip_{dtype}", (h, f, wide, back, narrowed), body)
    np_type = narrow_type(dtype)

    def inputs(rng):
        bits = rng.integers(0, 2 ** 32, n, dtype=np.uint32)
        bits[:8] = [0x3f800000 + 0x1000, 0x3f801000, 0x7f7fffff, 0x477ff000, 0x477fefff,
                    0x33000000, 0x33000001, 0x80000001]  # ties, overflow, tiny
        return {"h": np.arange(n, dtype=np.uint16).view(np_type), "f": bits.view(np.float32)}

    return Case(func, inputs, lambda v: {"wide": v["h"].astype(np.float32), "back": v["h"],
                                         "narrowed": v["f"].astype(np_type)})


def case_f64_to_narrow(align: int) -> Case:
    n = 4096
    d = buf("d", F64, n, align)
    h, b = buf("h", F16, n, align), buf("b", BF16, n, align)
    func = elementwise("f64_to_narrow", [d], [(h, lambda v: Cast(F16, v)),
                                              (b, lambda v: Cast(BF16, v))], n, 1)
    ties = [1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
            65520.0, 65519.99, 2 ** -25, 2 ** -25 + 2 ** -60, 1e-300, -0.0, np.nan, -np.inf,
            2.0 ** 128]

    def inputs(rng):
        rest = rng.standard_normal(n - len(ties)) * np.exp2(rng.integers(-30, 30, n - len(ties)))
        return {"d": np.concatenate([ties, rest])}

    def expected(v):
        bf = v["d"].astype(ml_dtypes.bfloat16)  # ml_dtypes rounds twice (via f32) here:
        bf[0] = ml_dtypes.bfloat16(1 + 2 ** -7)  # 1 + 2^-8 + 2^-30 rounds up, not to 1.0
        return {"h": v["d"].astype(np.float16), "b": bf}

    return Case(func, inputs, expected)


def case_narrow_arith(dtype: DType, lanes: int, align: int) -> Case:
    """f16/bf16 arithmetic rounds after every operation, as numpy's does."""
    n = 512
    x, y, z, w = (buf(name, dtype, n, align) for name in "xyzw")
    func = elementwise(f"arith_{dtype}x{lanes}", [x, y],
                       [(z, lambda a, b: a * b + a - b / a),
                        (w, lambda a, b: Call("exp", (a,), dtype, a.lanes))], n, lanes)
    np_type = narrow_type(dtype)

    def expected(v):
        a, b = v["x"], v["y"]
        return {"z": (a * b + a - b / a).astype(np_type), "w": np.exp(a.astype(np.float32))
                .astype(np_type)}

    return Case(func, lambda rng: {"x": rng.uniform(-4, 4, n).astype(np_type),
                                   "y": rng.uniform(-4, 4, n).astype(np_type)}, expected,
                ulps={"w": 1})  # numpy's own float32 exp may differ from libm's by an ulp


def case_float_divmod(dtype: DType, lanes: int, align: int) -> Case:
    n = 64
    a, b = buf("a", dtype, n, align), buf("b", dtype, n, align)
    ops = {"div": np.divide, "mod": np.fmod, "floordiv": np.floor_divide,
           "floormod": np.remainder, "min": np.minimum, "max": np.maximum}
    outs = [(buf(op, dtype, n, align), lambda p, q, op=op: Binary(op, p, q)) for op in ops]
    func = elementwise(f"float_divmod_{dtype}x{lanes}", [a, b], outs, n, lanes)
    special = [(7.5, 2.0), (-7.5, 2.0), (7.5, -2.0), (-7.5, -2.0), (1.0, 0.0), (-1.0, 0.0),
               (0.0, 0.0), (-0.0, 3.0), (1.0, np.inf), (1.0, -np.inf), (np.inf, 2.0),
               (np.nan, 1.0), (1.0, np.nan), (-0.0, 0.0), (0.0, -0.0), (5.0, 5.0)]

    def inputs(rng):
        m = n - len(special)
        av = np.concatenate([[s[0] for s in special], rng.uniform(-100, 100, m)])
        bv = np.concatenate([[s[1] for s in special], rng.uniform(-10, 10, m)])
        return {"a": av.astype(dtype.numpy), "b": bv.astype(dtype.numpy)}

    def expected(v):
        with np.errstate(all="ignore"):
            return {op: fn(v["a"], v["b"]) for op, fn in ops.items()}

    return Case(func, inputs, expected)


def case_mixed_nodes(align: int) -> Case:
    """Let, if/else, strided gather, scatter, bool buffers, unary ops, scalar params (f16,
    bool, i64), f64 math, isnan, int -> f64 casts, prefetch, an unrolled loop."""
    n, lanes = 48, 8
    x = buf("x", F32, n, align)
    flags = buf("flags", BOOL, n, align)
    ints = buf("ints", I32, n, align)
    g = buf("gathered", F32, n, align)
    sc = buf("scattered", F32, n, align)
    nan = buf("nan", BOOL, n, align)
    neg = buf("negflags", BOOL, n, align)
    d = buf("d", F64, n, align)
    bn = buf("bitnot", I32, n, align)
    alpha, flip, count = Var("alpha", F16), Var("flip", BOOL), Var("count", I64)
    i, j, k = Var("i"), Var("j"), Var("k")
    t = Var("t", F32)
    groups = n // lanes
    # gathered[8j + l] = x[(8j + l * 3) % n] (stride-3 ramp, wrapped with floormod)
    src = Binary("floormod", ramp(j * lanes, lanes, 3), bcast(c(n), lanes))
    # scattered[n - 1 - m] = x[m] * alpha  (reversed scatter)
    dst = bcast(c(n - 1), lanes) - ramp(j * lanes, lanes)
    scaled = Load(x, ramp(j * lanes, lanes)) * bcast(Cast(F32, alpha), lanes)
    body = seq(
        Evaluate(Call("prefetch", (Load(x, c(0)),), I32)),
        loop(j, groups, seq(Store(g, ramp(j * lanes, lanes), Load(x, src)),
                            Store(sc, dst, scaled))),
        loop(k, n, seq(
            LetStmt(t, Load(x, k) * Const(2.0, F32), IfThenElse(
                Binary("and", Load(flags, k), Unary("not", flip)),
                Store(d, k, Call("tanh", (Cast(F64, t),), F64)),
                Store(d, k, Call("pow", (Cast(F64, Load(ints, k)), Const(2.0, F64)), F64)))),
            Store(nan, k, Call("isnan", (Load(x, k),), BOOL)),
            Store(bn, k, Select(k.lt(count), Unary("bitnot", Load(ints, k)), Load(ints, k))),
        ), ForKind.UNROLLED),
        loop(i, groups, Store(neg, ramp(i * lanes, lanes),
                              Unary("not", Load(flags, ramp(i * lanes, lanes))))),
    )
    func = PrimFunc("mixed_nodes", (x, flags, ints, alpha, flip, count, g, sc, nan, neg, d, bn),
                    body)

    def inputs(rng):
        xv = rng.standard_normal(n).astype(np.float32)
        xv[::7] = np.nan
        return {"x": xv, "flags": rng.integers(0, 2, n).astype(bool),
                "ints": rng.integers(-50, 50, n).astype(np.int32),
                "alpha": np.float16(0.3), "flip": False, "count": 20}

    def expected(v):
        xv, fl, iv = v["x"], v["flags"], v["ints"]
        m = np.arange(n)
        alpha16 = np.float32(np.float16(v["alpha"]))
        tanh = np.tanh((xv * np.float32(2)).astype(np.float64))
        return {"gathered": xv[(m // lanes * lanes + (m % lanes) * 3) % n],
                "scattered": (xv * alpha16)[::-1],
                "nan": np.isnan(xv), "negflags": ~fl,
                "d": np.where(fl & (not v["flip"]), tanh, iv.astype(np.float64) ** 2),
                "bitnot": np.where(m < v["count"], ~iv, iv)}

    return Case(func, inputs, expected, ulps=2)


def case_vector_misc(align: int) -> Case:
    """Vector conversions (convertvector and lane loops), bool vector logic, a select with a
    scalar condition, reductions, negation and modular integer narrowing."""
    n, lanes = 64, 8
    a, b, f = buf("a", I32, n, align), buf("b", I32, n, align), buf("f", F32, n, align)
    flags = buf("flags", BOOL, n, align)
    prod, mixed, logic = buf("prod", F64, n, align), buf("mixed", F32, n, align), \
        buf("logic", BOOL, n, align)
    chosen, narrowed = buf("chosen", I32, n, align), buf("narrowed", U8, n, align)
    rmax, rmin = buf("rmax", I32, n // lanes, align), buf("rmin", F32, n // lanes, align)
    use_a = Var("use_a", BOOL)
    i = Var("i")
    v = index(i, lanes)
    av, bv, fv, flv = Load(a, v), Load(b, v), Load(f, v), Load(flags, v)
    body = loop(i, n // lanes, seq(
        Store(prod, v, Cast(F64, av) * Cast(F64, bv)),
        Store(mixed, v, Select(Binary("and", av.lt(bv), flv), Unary("neg", fv),
                               Cast(F32, flv))),
        Store(logic, v, Binary("or", Cast(BOOL, fv), Unary("not", flv))),
        Store(chosen, v, Select(use_a, av, bv)),
        Store(narrowed, v, Cast(U8, av)),
        Store(rmax, i, Call("vector.reduce_max", (av,), I32)),
        Store(rmin, i, Call("vector.reduce_min", (fv,), F32)),
    ))
    func = PrimFunc("vector_misc", (a, b, f, flags, use_a, prod, mixed, logic, chosen,
                                    narrowed, rmax, rmin), body)

    def inputs(rng):
        fv = rng.standard_normal(n).astype(np.float32)
        fv[::5] = 0
        return {"a": special_ints(I32, n, rng), "b": rng.integers(-9, 9, n).astype(np.int32),
                "f": fv, "flags": rng.integers(0, 2, n).astype(bool), "use_a": True}

    def expected(v):
        av, bv, fv, fl = v["a"], v["b"], v["f"], v["flags"]
        return {"prod": av.astype(np.float64) * bv, "logic": (fv != 0) | ~fl,
                "mixed": np.where((av < bv) & fl, -fv, fl.astype(np.float32)),
                "chosen": av if v["use_a"] else bv, "narrowed": av.astype(np.uint8),
                "rmax": av.reshape(-1, lanes).max(axis=1),
                "rmin": fv.reshape(-1, lanes).min(axis=1)}

    return Case(func, inputs, expected)


def case_x86_intrinsics(align: int) -> Case:
    n = 64
    a, b, acc, out = (buf(name, F32, n, align) for name in ("a", "b", "acc", "out"))
    ua, sb, s32, dot = (buf("ua", U8, 4 * n, align), buf("sb", I8, 4 * n, align),
                        buf("s32", I32, n, align), buf("dot", I32, n, align))
    i = Var("i")
    v = ramp(i * 16, 16)
    fma = Call("x86.fmadd", (Load(a, v), Load(b, v), Load(acc, v)), F32, 16)
    dp = Call("x86.vpdpbusd", (Load(s32, v), Load(ua, ramp(i * 64, 64)),
                               Load(sb, ramp(i * 64, 64))), I32, 16)
    func = PrimFunc("x86_intrinsics", (a, b, acc, ua, sb, s32, out, dot),
                    loop(i, n // 16, seq(Store(out, v, fma), Store(dot, v, dp))))

    def inputs(rng):
        return {"a": rng.standard_normal(n).astype(np.float32),
                "b": rng.standard_normal(n).astype(np.float32),
                "acc": rng.standard_normal(n).astype(np.float32),
                "ua": rng.integers(0, 256, 4 * n).astype(np.uint8),
                "sb": rng.integers(-128, 128, 4 * n).astype(np.int8),
                "s32": rng.integers(-1000, 1000, n).astype(np.int32)}

    def expected(v):
        prods = v["ua"].astype(np.int64) * v["sb"].astype(np.int64)
        return {"out": (v["a"].astype(np.float64) * v["b"] + v["acc"]).astype(np.float32),
                "dot": (v["s32"] + prods.reshape(n, 4).sum(axis=1)).astype(np.int32)}

    return Case(func, inputs, expected, ulps={"out": 1}, needs=("avx512f", "avx512_vnni"))


def all_cases(align: int = 64) -> list[Case]:
    cases = [case_vector_tail(align), case_vectorized_scalar_body(align), case_row_sum(align),
             case_vector_misc(align),
             case_float_to_int(align), case_f64_to_narrow(align), case_mixed_nodes(align),
             case_x86_intrinsics(align)]
    cases += [case_int_divmod(d, lanes, align)
              for d, lanes in ((I32, 8), (I8, 1), (I64, 4), (U16, 1), (U8, 16))]
    cases += [case_shifts(d, lanes, align) for d, lanes in ((U8, 16), (I32, 1), (I64, 4),
                                                            (U32, 1))]
    cases += [case_wrapping(d, lanes, align) for d, lanes in ((I8, 16), (U16, 1), (I32, 8),
                                                              (I64, 1), (U64, 4), (I16, 2))]
    cases += [case_narrow_roundtrip(d, align) for d in (F16, BF16)]
    cases += [case_narrow_arith(d, lanes, align) for d, lanes in ((F16, 1), (BF16, 16),
                                                                  (F16, 8))]
    cases += [case_float_divmod(d, lanes, align) for d, lanes in ((F32, 1), (F64, 4),
                                                                  (F32, 16))]
    return cases


def runnable_cases(align: int = 64) -> list[Case]:
    """The cases this host can run."""
    return [c for c in all_cases(align) if host_has(c.needs)]


# ------------------------------------------------------------------------------ running
def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def host_has(features: tuple[str, ...]) -> bool:
    from ember.core.target import Target

    return Target.native().has(*features)


def run_case(lib: ctypes.CDLL, case: Case, seed: int = 0, align: int = 64) -> None:
    """Run ``case``'s kernel from ``lib`` on fresh inputs; assert its outputs match."""
    rng = np.random.default_rng(seed)
    inputs = case.inputs(rng)
    expected = case.expected(inputs)
    args, argtypes, outputs = [], [], {}
    for p in case.func.params:
        if isinstance(p, Var):
            value = np.asarray(inputs[p.name], dtype=p.dtype.numpy)
            storage = value.view(np.uint16) if p.dtype in (F16, BF16) else value
            args.append(CTYPES[p.dtype](storage.item()))
            argtypes.append(CTYPES[p.dtype])
            continue
        if align > 16:
            array = aligned_empty(p.shape, p.dtype.numpy, align)
        else:  # exactly the array's bytes, so that ASan notices any access past its end
            array = np.empty(p.shape, p.dtype.numpy)
            assert array.ctypes.data % align == 0, "malloc gave less than 16-byte alignment"
        if p.name in inputs:
            array[...] = np.asarray(inputs[p.name]).reshape(p.shape)
        else:
            array.view(np.uint8)[...] = 0xA5  # garbage: every output element must be written
            outputs[p.name] = array
        args.append(array.ctypes.data_as(ctypes.c_void_p))
        argtypes.append(ctypes.c_void_p)
    fn = getattr(lib, case.func.name)
    fn.argtypes, fn.restype = argtypes, None
    fn(*args)
    for name, want in expected.items():
        ulps = case.ulps.get(name, 0) if isinstance(case.ulps, dict) else case.ulps
        compare(f"{case.name}.{name}", outputs[name], np.asarray(want), ulps)


def compare(what: str, got: np.ndarray, want: np.ndarray, ulps: float) -> None:
    got = got.reshape(-1)
    want = want.astype(got.dtype).reshape(-1)
    if got.dtype.kind in "biu":
        bad = np.flatnonzero(got != want)
    else:
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        same_nan = np.isnan(g64) & np.isnan(w64)
        if ulps == 0:
            bits = got.dtype.itemsize * 8
            view = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
            equal = (got.view(view) == want.view(view)) | same_nan
        else:  # within ulps units in the last place of the output type
            finfo = ml_dtypes.finfo(got.dtype)
            scale = np.maximum(np.abs(w64), float(finfo.tiny))
            tolerance = ulps * float(finfo.eps) * scale
            equal = same_nan | (g64 == w64) | (np.abs(g64 - w64) <= tolerance)
        bad = np.flatnonzero(~equal)
    if bad.size:
        k = bad[:5]
        raise AssertionError(f"{what}: {bad.size} of {got.size} elements differ; first at "
                             f"{k.tolist()}: got {got[k].tolist()}, want {want[k].tolist()}")
