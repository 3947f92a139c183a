"""A reference interpreter of the loop IR, the oracle of the lowering and schedule tests.

It executes a :class:`~ember.ir.loop.PrimFunc` on numpy arrays with the semantics the IR
documents and the C backend implements:

* integer ``add``/``sub``/``mul``/``neg`` wrap in the operand type; ``div`` truncates, ``mod``
  is C's ``%``, ``floordiv``/``floormod`` round towards -inf; every division by zero gives 0;
  shifts by out-of-range counts give 0 (or -1 for a negative value shifted right);
* float arithmetic is rounded to the operand type after every operation (f32 is computed in
  double and rounded once, which is exactly IEEE single arithmetic for + - * /);
  ``min``/``max`` propagate NaN and return ``b`` on ties; ``mod`` is ``fmod``, ``floordiv`` and
  ``floormod`` are numpy's ``floor_divide`` and ``remainder``;
* bool operands: ``add``/``max``/``or`` are or, ``mul``/``min``/``and`` are and, ``sub`` is xor;
* ``Cast`` to an integer saturates floats (NaN -> 0) and wraps integers; ``Select`` evaluates
  both operands;
* loads and stores are bounds-checked (an out-of-range index raises :class:`InterpreterError`,
  it never wraps like numpy's negative indices); a masked-off lane loads 0 and is not accessed.

Vectors (``lanes > 1``) are lists of lane values; Ramp, Broadcast and ``vector.reduce_*``
calls are supported.

Loops marked ``parallel`` or ``vectorized`` promise independent iterations (codegen emits
``omp parallel for`` / ``ivdep``), so with ``check_independence`` (the default) the interpreter
checks the promise: a memory location written by one iteration must not be read or written by
another one.  Buffers allocated inside an iteration are private to it.  Violations raise
:class:`IndependenceError`.

Uninitialised memory (output buffers, Allocate) is filled with a poison value (NaN for
floats) so that reading it before writing shows in the results.
"""

from __future__ import annotations

import textwrap

import itertools
import math
import struct
from typing import Mapping, Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (COMPARISONS, Binary, Broadcast, Call, Cast, Const, Expr, Load,
                                Ramp, Select, Unary, Var)
from ember.ir.loop.stmt import (Allocate, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc,
                                Seq, Stmt, Store)

__all__ = ["IndependenceError", "InterpreterError", "binary_op", "cast_value", "eval_expr",
           "normalize", "run", "run_outputs", "unary_op"]

INT_POISON = 0x5A5A5A5A


class InterpreterError(Exception):
    """The program does something undefined (out-of-bounds access, unbound variable...)."""


class IndependenceError(InterpreterError):
    """A parallel/vectorized loop has iterations that depend on each other."""


# ----------------------------------------------------------------------------- scalar values
def _int_range(dtype: DType) -> tuple[int, int]:
    cached = _RANGES.get(dtype)
    if cached is not None:
        return cached
    bits = 8 * dtype.itemsize if dtype not in _SUB_BYTE else _SUB_BYTE[dtype]
    if dtype.is_signed:
        result = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        result = 0, (1 << bits) - 1
    _RANGES[dtype] = result
    return result


_RANGES: dict[DType, tuple[int, int]] = {}
_SUB_BYTE = {DType.INT4: 4, DType.UINT4: 4, DType.INT2: 2, DType.UINT2: 2}


def _wrap(value: int, dtype: DType) -> int:
    lo, hi = _int_range(dtype)
    span = hi - lo + 1
    return (int(value) - lo) % span + lo


_F32 = struct.Struct("f")


def _round(value: float, dtype: DType) -> float:
    if dtype is DType.FLOAT64:
        return float(value)
    if dtype is DType.FLOAT32:
        try:  # C's (float) conversion: round to nearest even
            return _F32.unpack(_F32.pack(value))[0]
        except OverflowError:
            return math.copysign(math.inf, value)
    with np.errstate(all="ignore"):
        return float(dtype.numpy.type(value))


def normalize(value, dtype: DType):
    """A Python value of ``dtype``: wrapped int, rounded float or bool."""
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.is_int:
        return _wrap(value, dtype)
    if dtype.is_float:
        return _round(float(value), dtype)
    raise InterpreterError(f"dtype {dtype} is not supported by the interpreter")


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _float_div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _fmod(a: float, b: float) -> float:
    if b == 0 or math.isinf(a) or a != a or b != b:
        return math.nan
    return math.fmod(a, b)


_BOOL_OPS = {"add": "or", "max": "or", "bitor": "or", "or": "or", "mul": "and", "min": "and",
             "bitand": "and", "and": "and", "sub": "xor", "bitxor": "xor"}


def binary_op(op: str, dtype: DType, a, b):
    """``a op b`` for scalar operands of ``dtype`` (the operands' dtype)."""
    if op in COMPARISONS:
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                "ne": a != b}[op]
    if dtype is DType.BOOL:
        kind = _BOOL_OPS.get(op)
        if kind is None:
            raise InterpreterError(f"'{op}' is not defined on bool operands")
        return {"or": a or b, "and": a and b, "xor": a != b}[kind]
    if op == "and":
        return bool(a) and bool(b)
    if op == "or":
        return bool(a) or bool(b)
    if dtype.is_float:
        if op == "min":
            return a if (a < b or a != a) else b
        if op == "max":
            return a if (a > b or a != a) else b
        if op == "add":
            r = a + b
        elif op == "sub":
            r = a - b
        elif op == "mul":
            r = a * b
        elif op == "div":
            r = _float_div(a, b)
        elif op == "mod":
            r = _fmod(a, b)
        elif op in ("floordiv", "floormod"):
            with np.errstate(all="ignore"):
                fn = np.floor_divide if op == "floordiv" else np.remainder
                r = float(fn(dtype.numpy.type(a), dtype.numpy.type(b)))
        else:
            raise InterpreterError(f"'{op}' is not defined on {dtype} operands")
        return _round(r, dtype)
    if not dtype.is_int:
        raise InterpreterError(f"dtype {dtype} is not supported by the interpreter")
    if op == "add":
        return _wrap(a + b, dtype)
    if op == "sub":
        return _wrap(a - b, dtype)
    if op == "mul":
        return _wrap(a * b, dtype)
    if op in ("div", "mod", "floordiv", "floormod"):
        if b == 0:
            return 0
        if op == "div":
            return _wrap(_trunc_div(a, b), dtype)
        if op == "mod":
            return _wrap(a - b * _trunc_div(a, b), dtype)
        if op == "floordiv":
            return _wrap(a // b, dtype)
        return _wrap(a % b, dtype)
    if op == "min":
        return a if a < b else b
    if op == "max":
        return a if a > b else b
    if op == "bitand":
        return _wrap(a & b, dtype)
    if op == "bitor":
        return _wrap(a | b, dtype)
    if op == "bitxor":
        return _wrap(a ^ b, dtype)
    if op in ("shl", "shr"):
        bits = 8 * dtype.itemsize
        if b < 0 or b >= bits:
            return -1 if (op == "shr" and a < 0) else 0
        return _wrap(a << b, dtype) if op == "shl" else a >> b
    raise InterpreterError(f"unknown binary op {op!r}")


def unary_op(op: str, dtype: DType, a):
    if op == "not" or (op == "bitnot" and dtype is DType.BOOL):
        return not a
    if op == "neg":
        return _wrap(-a, dtype) if dtype.is_int else -a
    if op == "bitnot" and dtype.is_int:
        return _wrap(~a, dtype)
    raise InterpreterError(f"'{op}' is not defined on {dtype}")


def cast_value(to: DType, frm: DType, x):
    """C conversion as codegen emits it: defined for every value."""
    if to == frm:
        return x
    if to is DType.BOOL:
        return x != 0
    if to.is_float:
        return _round(float(x), to)
    if not to.is_int:
        raise InterpreterError(f"cast to {to} is not supported by the interpreter")
    if frm.is_float:
        if x != x:
            return 0
        lo, hi = _int_range(to)
        if x < lo:
            return lo
        if x >= hi + 1:
            return hi
        return int(math.trunc(x))
    return _wrap(int(x), to)


def _np_math(fn):
    def apply(*xs):
        with np.errstate(all="ignore"):
            return float(fn(*(np.float64(x) for x in xs)))
    return apply


def _erf(x: float) -> float:
    return math.erf(x) if x == x else math.nan


def _sigmoid(x: float) -> float:
    with np.errstate(all="ignore"):
        return float(1.0 / (1.0 + np.exp(np.float64(-x))))


def _round_half_away(x: float) -> float:
    if math.isinf(x) or x != x:
        return x
    return math.copysign(math.floor(abs(x) + 0.5), x)


MATH = {
    "exp": _np_math(np.exp), "log": _np_math(np.log), "sqrt": _np_math(np.sqrt),
    "rsqrt": _np_math(lambda x: 1.0 / np.sqrt(x)), "tanh": _np_math(np.tanh), "erf": _erf,
    "sigmoid": _sigmoid, "pow": _np_math(np.power), "fabs": _np_math(np.fabs),
    "floor": _np_math(np.floor), "ceil": _np_math(np.ceil), "round": _round_half_away,
    "nearbyint": _np_math(np.rint), "trunc": _np_math(np.trunc), "sin": _np_math(np.sin),
    "cos": _np_math(np.cos), "tan": _np_math(np.tan), "asin": _np_math(np.arcsin),
    "acos": _np_math(np.arccos), "atan": _np_math(np.arctan), "sinh": _np_math(np.sinh),
    "cosh": _np_math(np.cosh), "asinh": _np_math(np.arcsinh), "acosh": _np_math(np.arccosh),
    "atanh": _np_math(np.arctanh), "expm1": _np_math(np.expm1), "log1p": _np_math(np.log1p),
    "fmod": _fmod, "atan2": _np_math(np.arctan2), "copysign": _np_math(np.copysign),
    "fma": lambda a, b, c: a * b + c,
}
BOOL_MATH = {"isnan": lambda x: x != x, "isinf": lambda x: math.isinf(x)}
VECTOR_REDUCTIONS = {"vector.reduce_add": "add", "vector.reduce_mul": "mul",
                     "vector.reduce_min": "min", "vector.reduce_max": "max",
                     "vector.reduce_and": "bitand", "vector.reduce_or": "bitor",
                     "vector.reduce_xor": "bitxor"}


# ----------------------------------------------------------------------------- memory
class _Storage:
    """One buffer's memory: a flat numpy array (``serial`` tells allocations apart)."""

    __slots__ = ("buffer", "data", "serial")
    _serials = itertools.count()

    def __init__(self, buffer: Buffer, data: np.ndarray):
        self.buffer = buffer
        self.data = data
        self.serial = next(_Storage._serials)


def _poisoned(buffer: Buffer) -> np.ndarray:
    dtype = buffer.dtype
    data = np.empty(buffer.size, dtype=dtype.numpy)
    if dtype.is_float:
        data.fill(np.nan)
    elif dtype is DType.BOOL:
        data.fill(True)
    else:
        data.fill(_wrap(INT_POISON, dtype))
    return data


_MULTI = object()


class _Region:
    """Access log of one execution of a parallel/vectorized loop."""

    __slots__ = ("loop", "iteration", "writer", "readers")

    def __init__(self, loop: For):
        self.loop = loop
        self.iteration = None
        self.writer: dict = {}
        self.readers: dict = {}

    def conflict(self, storage: _Storage, index: int, what: str, other) -> IndependenceError:
        return IndependenceError(
            f"{self.loop.kind.value} loop '{self.loop.var.name}': iteration {self.iteration} "
            f"{what} {storage.buffer.name}[{index}], also accessed by iteration {other}")

    def read(self, storage: _Storage, index: int) -> None:
        key = (storage.serial, index)
        it = self.iteration
        w = self.writer.get(key, it)
        if w != it:
            raise self.conflict(storage, index, "reads", w)
        r = self.readers.get(key)
        if r is None:
            self.readers[key] = it
        elif r is not _MULTI and r != it:
            self.readers[key] = _MULTI

    def write(self, storage: _Storage, index: int) -> None:
        key = (storage.serial, index)
        it = self.iteration
        w = self.writer.get(key, it)
        if w != it:
            raise self.conflict(storage, index, "writes", w)
        r = self.readers.get(key, it)
        if r is _MULTI or r != it:
            raise self.conflict(storage, index, "writes", "another" if r is _MULTI else r)
        self.writer[key] = it


# ----------------------------------------------------------------------------- interpreter
class Interpreter:
    def __init__(self, func: PrimFunc, check_independence: bool = True):
        self.func = func
        self.check_independence = check_independence
        self.env: dict[str, object] = {}
        self.storage: dict[Buffer, _Storage] = {}
        self.regions: list[_Region] = []
        self.stores = 0  # number of executed store lanes (to check that code runs at all)

    # --------------------------------------------------------------- expressions
    def eval(self, e: Expr):
        method = _EXPR_DISPATCH.get(type(e))
        if method is None:
            for cls, m in _EXPR_DISPATCH.items():
                if isinstance(e, cls):
                    method = m
                    break
            else:
                raise InterpreterError(f"cannot evaluate {type(e).__name__}: {e!r}")
        return method(self, e)

    def _var(self, e: Var):
        try:
            return self.env[e.name]
        except KeyError:
            raise InterpreterError(f"variable '{e.name}' is not bound") from None

    def _const(self, e: Const):
        value = normalize(e.value, e.dtype)
        return value if e.lanes == 1 else [value] * e.lanes

    def _binary(self, e: Binary):
        a, b = self.eval(e.a), self.eval(e.b)
        dtype = e.a.dtype
        if dtype != e.b.dtype:
            raise InterpreterError(f"operands of {e.op} differ in dtype: {e}")
        if not isinstance(a, list) and not isinstance(b, list):
            return binary_op(e.op, dtype, a, b)
        lanes = e.lanes
        return [binary_op(e.op, dtype, x, y) for x, y in zip(_lanes(a, lanes), _lanes(b, lanes))]

    def _unary(self, e: Unary):
        a = self.eval(e.a)
        if e.lanes == 1:
            return unary_op(e.op, e.a.dtype, a)
        return [unary_op(e.op, e.a.dtype, x) for x in a]

    def _select(self, e: Select):
        c, t, f = self.eval(e.cond), self.eval(e.true_value), self.eval(e.false_value)
        if e.lanes == 1:
            return t if c else f
        return [x if k else y for k, x, y in zip(_lanes(c, e.lanes), _lanes(t, e.lanes),
                                                 _lanes(f, e.lanes))]

    def _cast(self, e: Cast):
        v = self.eval(e.value)
        if e.lanes == 1:
            return cast_value(e.dtype, e.value.dtype, v)
        return [cast_value(e.dtype, e.value.dtype, x) for x in v]

    def _ramp(self, e: Ramp):
        base, stride = self.eval(e.base), self.eval(e.stride)
        return [normalize(base + stride * k, e.dtype) for k in range(e.lanes)]

    def _broadcast(self, e: Broadcast):
        return [self.eval(e.value)] * e.lanes

    def _call(self, e: Call):
        args = [self.eval(a) for a in e.args]
        if e.name in VECTOR_REDUCTIONS:
            (v,) = args
            op = VECTOR_REDUCTIONS[e.name]
            acc = v[0]
            for x in v[1:]:
                acc = binary_op(op, e.args[0].dtype, acc, x)
            return acc
        if e.name in MATH:
            fn, natural = MATH[e.name], e.args[0].dtype
        elif e.name in BOOL_MATH:
            fn, natural = BOOL_MATH[e.name], DType.BOOL
        else:
            raise InterpreterError(f"the interpreter does not know the intrinsic '{e.name}'")

        def one(*xs):
            if e.name == "fabs" and e.args[0].dtype.is_int:
                return cast_value(e.dtype, e.args[0].dtype, _wrap(abs(xs[0]),
                                                                  e.args[0].dtype))
            value = normalize(fn(*xs), natural)
            return cast_value(e.dtype, natural, value)

        if e.lanes == 1:
            return one(*args)
        return [one(*xs) for xs in zip(*(_lanes(a, e.lanes) for a in args))]

    def _load(self, e: Load):
        storage = self._storage(e.buffer)
        index = self.eval(e.index)
        mask = self.eval(e.mask) if e.mask is not None else None
        if e.lanes == 1:
            if mask is not None and not mask:
                return normalize(0, e.dtype)
            return self._read(storage, index)
        mask = _lanes(mask, e.lanes) if mask is not None else [True] * e.lanes
        return [self._read(storage, i) if m else normalize(0, e.dtype)
                for i, m in zip(index, mask)]

    def _read(self, storage: _Storage, index: int):
        self._check_bounds(storage, index, "load from")
        for region in self.regions:
            region.read(storage, index)
        return storage.data[index].item()  # stored values are already of the dtype

    def _check_bounds(self, storage: _Storage, index, what: str) -> None:
        if not isinstance(index, int) or not 0 <= index < storage.data.size:
            raise InterpreterError(f"{what} {storage.buffer.name}[{index}]: out of bounds "
                                   f"(size {storage.data.size})")

    def _storage(self, buffer: Buffer) -> _Storage:
        try:
            return self.storage[buffer]
        except KeyError:
            raise InterpreterError(f"buffer '{buffer.name}' is not bound") from None

    # --------------------------------------------------------------- statements
    def exec(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.exec(x)
        elif isinstance(s, Store):
            self._store(s)
        elif isinstance(s, For):
            self._for(s)
        elif isinstance(s, LetStmt):
            self._bind(s.var, self.eval(s.value), lambda: self.exec(s.body))
        elif isinstance(s, IfThenElse):
            if self.eval(s.cond):
                self.exec(s.then_body)
            elif s.else_body is not None:
                self.exec(s.else_body)
        elif isinstance(s, Allocate):
            if s.buffer in self.storage:
                raise InterpreterError(f"buffer '{s.buffer.name}' allocated twice")
            self.storage[s.buffer] = _Storage(s.buffer, _poisoned(s.buffer))
            try:
                self.exec(s.body)
            finally:
                del self.storage[s.buffer]
        elif isinstance(s, Evaluate):
            self.eval(s.value)
        else:
            raise InterpreterError(f"cannot execute {type(s).__name__}")

    def _bind(self, var: Var, value, body) -> None:
        if var.name in self.env:
            raise InterpreterError(f"variable '{var.name}' is bound twice")
        self.env[var.name] = value
        try:
            body()
        finally:
            del self.env[var.name]

    def _store(self, s: Store) -> None:
        storage = self._storage(s.buffer)
        index = self.eval(s.index)
        value = self.eval(s.value)
        mask = self.eval(s.mask) if s.mask is not None else None
        if s.value.dtype != s.buffer.dtype:
            raise InterpreterError(f"store of {s.value.dtype} into {s.buffer}")
        if s.index.lanes == 1:
            if mask is None or mask:
                self._write(storage, index, value)
            return
        mask = _lanes(mask, s.index.lanes) if mask is not None else [True] * s.index.lanes
        for i, v, m in zip(index, _lanes(value, s.index.lanes), mask):
            if m:
                self._write(storage, i, v)

    def _write(self, storage: _Storage, index: int, value) -> None:
        self._check_bounds(storage, index, "store to")
        for region in self.regions:
            region.write(storage, index)
        storage.data[index] = value
        self.stores += 1

    def _for(self, s: For) -> None:
        start, extent = self.eval(s.start), self.eval(s.extent)
        region = None
        if self.check_independence and s.kind in (ForKind.PARALLEL, ForKind.VECTORIZED):
            region = _Region(s)
            self.regions.append(region)
        if s.var.name in self.env:
            raise InterpreterError(f"variable '{s.var.name}' is bound twice")
        try:
            for i in range(start, start + extent):
                if region is not None:
                    region.iteration = i
                self.env[s.var.name] = i
                self.exec(s.body)
        finally:
            self.env.pop(s.var.name, None)
            if region is not None:
                self.regions.remove(region)


def _lanes(value, lanes: int) -> list:
    return value if isinstance(value, list) else [value] * lanes


_EXPR_DISPATCH = {
    Var: Interpreter._var, Const: Interpreter._const, Binary: Interpreter._binary,
    Unary: Interpreter._unary, Select: Interpreter._select, Cast: Interpreter._cast,
    Load: Interpreter._load, Ramp: Interpreter._ramp, Broadcast: Interpreter._broadcast,
    Call: Interpreter._call,
}


# ----------------------------------------------------------------------------- entry points
def run(func: PrimFunc, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] = (),
        scalars: Mapping[str, object] | None = None,
        check_independence: bool = True) -> dict[str, np.ndarray]:
    """Execute ``func``; returns every buffer parameter's final contents by name (shaped).

    ``inputs`` gives buffer parameters by name, or positionally for the leading ones; buffers
    not given (the outputs) start poisoned.  ``scalars`` binds Var parameters by name.
    """
    interp = Interpreter(func, check_independence)
    buffers = [p for p in func.params if isinstance(p, Buffer)]
    if not isinstance(inputs, Mapping):
        inputs = {b.name: a for b, a in zip(buffers, inputs)}
    unknown = set(inputs) - {b.name for b in buffers}
    if unknown:
        raise InterpreterError(f"{func.name} has no buffer parameter(s) {sorted(unknown)}")
    for b in buffers:
        if b.name in inputs:
            array = np.asarray(inputs[b.name])
            if array.size != b.size:
                raise InterpreterError(f"{b.name} needs {b.size} elements, got {array.size}")
            data = np.array(array, dtype=b.dtype.numpy).reshape(-1)
        else:
            data = _poisoned(b)
        interp.storage[b] = _Storage(b, data)
    for p in func.params:
        if isinstance(p, Var):
            if scalars is None or p.name not in scalars:
                raise InterpreterError(f"scalar parameter '{p.name}' is not given")
            interp.env[p.name] = normalize(scalars[p.name], p.dtype)
    interp.exec(func.body)
    return {b.name: interp.storage[b].data.reshape(b.shape) for b in buffers}


def run_outputs(func: PrimFunc, inputs: Sequence[np.ndarray],
                check_independence: bool = True) -> list[np.ndarray]:
    """Execute a lowered kernel (inputs first, then outputs, then scratch buffers, whose
    count the ``scratch`` attribute gives); returns the outputs in order."""
    results = run(func, list(inputs), check_independence=check_independence)
    names = [p.name for p in func.params if isinstance(p, Buffer)][len(inputs):]
    scratch = int(func.attr("scratch", 0))
    return [results[n] for n in (names[:len(names) - scratch] if scratch else names)]


def eval_expr(e: Expr, env: Mapping[str, object] | None = None,
              buffers: Mapping[Buffer, np.ndarray] | None = None):
    """Evaluate one expression with variables bound by name (and optional buffers)."""
    dummy = PrimFunc("expr", (), Seq(()))
    interp = Interpreter(dummy)
    interp.env.update(env or {})
    for b, a in (buffers or {}).items():
        interp.storage[b] = _Storage(b, np.array(a, dtype=b.dtype.numpy).reshape(-1))
    return interp.eval(e)


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
