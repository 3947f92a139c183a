"""A reference interpreter of the loop IR: the oracle that checks a scheduled kernel against
the unscheduled one.

It lives in the package (not only in the tests) so that the compiler itself, and an
auto-tuner trying schedules, can run any :class:`~ember.ir.loop.PrimFunc` on small inputs and
compare.  It executes a PrimFunc on numpy arrays with the semantics the IR documents and the
C backend implements:

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
  it never wraps like numpy's negative indices); a masked-off lane loads 0 and is not accessed;
* ``Evaluate(prefetch(...))`` is a hint and does nothing (its address is not even computed:
  C's ``__builtin_prefetch`` never faults);
* a :class:`~ember.ir.loop.stmt.Gemm` is computed with numpy, per batch element: A and B are
  gathered as matrices (through their strides, B's im2col walks ``b_k_dims``/``b_j_dims``, or
  from the compile-time packed layouts ``a_packed``/``b_packed``), multiplied in float64 and
  rounded once to the output type, then ``finish`` is evaluated per element like any
  expression.  The ``pack`` scratch buffer is the C kernel's business and stays untouched.
  The C template sums in float32 in its own order, so compare its results with a tolerance.

Vectors (``lanes > 1``) are lists of lane values; Ramp, Broadcast and ``vector.reduce_*``
calls are supported.

Loops marked ``parallel`` or ``vectorized`` promise independent iterations (codegen emits
``omp parallel for`` / ``ivdep``), so with ``check_independence`` (the default) the interpreter
checks the promise: a memory location written by one iteration must not be read or written by
another one.  Buffers allocated inside an iteration are private to it.  A Gemm's tasks run in
parallel too, so it must not write one output element twice.  Violations raise
:class:`IndependenceError`.

Uninitialised memory (output buffers, Allocate) is filled with a poison value (NaN for
floats) so that reading it before writing shows in the results.

Every node is translated once, so that a loop body is not re-dispatched on node types at
every iteration: an oracle is only useful if it runs in test time (a 64x64x64 matmul as plain
loops, 262k multiply-adds, takes well under a second; it took six when every node was
dispatched at every evaluation).  A statement becomes a closure that runs it; a scalar
expression tree becomes one generated Python function (:class:`_ScalarSource`), vectors
nested closures.  Errors a node can only cause when it runs (an unknown intrinsic, operands
of different types) are raised when it runs, never while translating, so that dead code
behaves as before.
"""

from __future__ import annotations

import itertools
import math
import operator
import struct
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (COMPARISONS, Binary, Broadcast, Call, Cast, Const, Expr, Load,
                                Ramp, Select, Unary, Var)
from ember.ir.loop.stmt import (Allocate, Evaluate, For, ForKind, Gemm, IfThenElse, LetStmt,
                                PrimFunc, Seq, Stmt, Store)

__all__ = ["IndependenceError", "Interpreter", "InterpreterError", "binary_op", "cast_value",
           "eval_expr", "normalize", "run", "run_outputs", "unary_op"]

INT_POISON = 0x5A5A5A5A

# A scalar value is a Python int, float or bool; a vector is a list of them.
Value = Any
Thunk = Callable[[], Value]
Action = Callable[[], None]


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


def _wrapper(dtype: DType) -> Callable[[int], int]:
    """``_wrap`` for one integer type, with the common in-range case a comparison."""
    lo, hi = _int_range(dtype)
    span = hi - lo + 1

    def wrap(value: int) -> int:
        return value if lo <= value <= hi else (int(value) - lo) % span + lo

    return wrap


_F32 = struct.Struct("f")
_F32_PACK, _F32_UNPACK = _F32.pack, _F32.unpack


def _round_f32(value: float) -> float:
    try:  # C's (float) conversion: round to nearest even
        return _F32_UNPACK(_F32_PACK(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _round(value: float, dtype: DType) -> float:
    if dtype is DType.FLOAT64:
        return float(value)
    if dtype is DType.FLOAT32:
        return _round_f32(value)
    with np.errstate(all="ignore"):
        return float(dtype.numpy.type(value))


def _rounder(dtype: DType) -> Callable[[float], float]:
    """``_round`` for one float type."""
    if dtype is DType.FLOAT64:
        return float
    if dtype is DType.FLOAT32:
        return _round_f32
    return lambda value: _round(value, dtype)


def normalize(value: Value, dtype: DType) -> Value:
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
_COMPARE: dict[str, Callable[[Value, Value], bool]] = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne}


def binary_op(op: str, dtype: DType, a: Value, b: Value) -> Value:
    """``a op b`` for scalar operands of ``dtype`` (the operands' dtype)."""
    if op in COMPARISONS:
        return _COMPARE[op](a, b)
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


def _binary_fn(op: str, dtype: DType) -> Callable[[Value, Value], Value]:
    """``binary_op(op, dtype, ., .)`` specialised once per node, with the same results: the
    arithmetic of index expressions and of float kernels skips the op dispatch."""
    if op in COMPARISONS:
        return _COMPARE[op]
    if dtype is DType.BOOL and op in _BOOL_OPS:
        kind = _BOOL_OPS[op]
        if kind == "or":
            return lambda a, b: a or b
        if kind == "and":
            return lambda a, b: a and b
        return lambda a, b: a != b
    if op == "and":
        return lambda a, b: bool(a) and bool(b)
    if op == "or":
        return lambda a, b: bool(a) or bool(b)
    if dtype is not DType.BOOL:
        if dtype.is_float:
            rnd = _rounder(dtype)
            if op == "add":
                return lambda a, b: rnd(a + b)
            if op == "sub":
                return lambda a, b: rnd(a - b)
            if op == "mul":
                return lambda a, b: rnd(a * b)
            if op == "div":
                return lambda a, b: rnd(_float_div(a, b))
            if op == "min":
                return lambda a, b: a if (a < b or a != a) else b
            if op == "max":
                return lambda a, b: a if (a > b or a != a) else b
        elif dtype.is_int:
            wrap = _wrapper(dtype)
            if op == "add":
                return lambda a, b: wrap(a + b)
            if op == "sub":
                return lambda a, b: wrap(a - b)
            if op == "mul":
                return lambda a, b: wrap(a * b)
            if op == "min":
                return lambda a, b: a if a < b else b
            if op == "max":
                return lambda a, b: a if a > b else b
    return lambda a, b: binary_op(op, dtype, a, b)


def unary_op(op: str, dtype: DType, a: Value) -> Value:
    """``op a`` for a scalar operand of ``dtype``."""
    if op == "not" or (op == "bitnot" and dtype is DType.BOOL):
        return not a
    if op == "neg":
        return _wrap(-a, dtype) if dtype.is_int else -a
    if op == "bitnot" and dtype.is_int:
        return _wrap(~a, dtype)
    raise InterpreterError(f"'{op}' is not defined on {dtype}")


def cast_value(to: DType, frm: DType, x: Value) -> Value:
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


def _cast_fn(to: DType, frm: DType) -> Callable[[Value], Value]:
    """``cast_value(to, frm, .)`` specialised once per node, with the same results."""
    if to == frm:
        return lambda x: x
    if to.is_float:
        rnd = _rounder(to)
        return lambda x: rnd(float(x))
    return lambda x: cast_value(to, frm, x)


def _np_math(fn: Callable[..., Any]) -> Callable[..., float]:
    def apply(*xs: float) -> float:
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


MATH: dict[str, Callable[..., float]] = {
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
BOOL_MATH: dict[str, Callable[[float], bool]] = {
    "isnan": lambda x: x != x, "isinf": lambda x: math.isinf(x)}
VECTOR_REDUCTIONS = {"vector.reduce_add": "add", "vector.reduce_mul": "mul",
                     "vector.reduce_min": "min", "vector.reduce_max": "max",
                     "vector.reduce_and": "bitand", "vector.reduce_or": "bitor",
                     "vector.reduce_xor": "bitxor"}
# Calls that are hints without a value (only valid in an Evaluate): nothing to execute.
HINTS = frozenset({"prefetch"})


# ----------------------------------------------------------------------------- memory
class _Storage:
    """One buffer's memory: a flat numpy array (``serial`` tells allocations apart)."""

    __slots__ = ("buffer", "data", "serial")
    _serials = itertools.count()

    def __init__(self, buffer: Buffer, data: np.ndarray):
        self.buffer = buffer
        self.data = data
        self.serial = next(_Storage._serials)


class _Slot:
    """Where the accesses of one buffer find its current storage (None: not bound).

    Translated accesses hold the slot, looked up once by buffer, so running them does not
    hash a Buffer (a dataclass of several fields) at every load and store."""

    __slots__ = ("buffer", "storage")

    def __init__(self, buffer: Buffer):
        self.buffer = buffer
        self.storage: _Storage | None = None

    def get(self) -> _Storage:
        storage = self.storage
        if storage is None:
            raise InterpreterError(f"buffer '{self.buffer.name}' is not bound")
        return storage


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
        self.iteration: object = None
        self.writer: dict[tuple[int, int], object] = {}
        self.readers: dict[tuple[int, int], object] = {}

    def conflict(self, storage: _Storage, index: int, what: str,
                 other: object) -> IndependenceError:
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


def _failing(message: str, *first: Thunk) -> Thunk:
    """A closure that raises ``message`` when run (after running ``first``, whose errors
    come first as they would have in a node-by-node evaluation)."""
    def fail() -> Value:
        for thunk in first:
            thunk()
        raise InterpreterError(message)
    return fail


def _bounds_ok(index: object, size: int) -> bool:
    return isinstance(index, int) and 0 <= index < size


def _lanes(value: Value, lanes: int) -> list:
    return value if isinstance(value, list) else [value] * lanes


# ----------------------------------------------------------------------------- interpreter
class Interpreter:
    """Executes statements and expressions of one function; ``env`` binds variables by name.

    Buffers are bound with :meth:`bind`; :meth:`exec` and :meth:`eval` translate their node
    once (cached) and run it."""

    def __init__(self, func: PrimFunc, check_independence: bool = True):
        self.func = func
        self.check_independence = check_independence
        self.env: dict[str, Value] = {}
        self.regions: list[_Region] = []
        self.stores = 0  # number of executed store lanes (to check that code runs at all)
        self._slots: dict[Buffer, _Slot] = {}
        self._compiled: dict[int, tuple[object, Callable[[], Any]]] = {}

    # --------------------------------------------------------------- memory
    def bind(self, buffer: Buffer, data: np.ndarray) -> None:
        """Give ``buffer`` the flat array ``data`` (of its dtype) as its memory."""
        self._slot(buffer).storage = _Storage(buffer, data)

    def contents(self, buffer: Buffer) -> np.ndarray:
        """The flat array bound to ``buffer``."""
        return self._slot(buffer).get().data

    def _slot(self, buffer: Buffer) -> _Slot:
        slot = self._slots.get(buffer)
        if slot is None:
            slot = self._slots[buffer] = _Slot(buffer)
        return slot

    def _check_bounds(self, storage: _Storage, index: object, what: str) -> None:
        if not _bounds_ok(index, storage.data.size):
            raise InterpreterError(f"{what} {storage.buffer.name}[{index}]: out of bounds "
                                   f"(size {storage.data.size})")

    def _read(self, storage: _Storage, index: int) -> Value:
        self._check_bounds(storage, index, "load from")
        for region in self.regions:
            region.read(storage, index)
        return storage.data.item(index)  # stored values are already of the dtype

    def _write(self, storage: _Storage, index: int, value: Value) -> None:
        self._check_bounds(storage, index, "store to")
        for region in self.regions:
            region.write(storage, index)
        storage.data[index] = value
        self.stores += 1

    # --------------------------------------------------------------- entry points
    def eval(self, e: Expr) -> Value:
        """The value of ``e`` in the current environment."""
        return self.expr(e)()

    def exec(self, s: Stmt) -> None:
        """Run ``s`` in the current environment."""
        self.stmt(s)()

    def expr(self, e: Expr) -> Thunk:
        """``e`` translated into a closure returning its value (cached per node)."""
        hit = self._compiled.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        thunk = _ScalarSource(self).function(e) if _generated(e) else self._closure(e)
        self._compiled[id(e)] = (e, thunk)
        return thunk

    def _closure(self, e: Expr) -> Thunk:
        """``e`` translated node by node into nested closures (vectors, and what the
        generated source leaves to closures)."""
        method = _EXPR_COMPILERS.get(type(e))
        if method is None:
            method = next((m for cls, m in _EXPR_COMPILERS.items() if isinstance(e, cls)),
                          None)
        return method(self, e) if method is not None else _failing(
            f"cannot evaluate {type(e).__name__}: {e!r}")

    def stmt(self, s: Stmt) -> Action:
        """``s`` translated into a closure running it (cached per node)."""
        hit = self._compiled.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        method = _STMT_COMPILERS.get(type(s))
        if method is None:
            method = next((m for cls, m in _STMT_COMPILERS.items() if isinstance(s, cls)),
                          None)
        action = method(self, s) if method is not None else _failing(
            f"cannot execute {type(s).__name__}")
        self._compiled[id(s)] = (s, action)
        return action

    # --------------------------------------------------------------- expressions
    def _var(self, e: Var) -> Thunk:
        env, name = self.env, e.name

        def var() -> Value:
            try:
                return env[name]
            except KeyError:
                raise InterpreterError(f"variable '{name}' is not bound") from None
        return var

    def _const(self, e: Const) -> Thunk:
        try:
            value = normalize(e.value, e.dtype)
        except InterpreterError as error:
            return _failing(str(error))
        if e.lanes == 1:
            return lambda: value
        lanes = e.lanes
        return lambda: [value] * lanes

    def _binary(self, e: Binary) -> Thunk:
        a, b = self.expr(e.a), self.expr(e.b)
        dtype = e.a.dtype
        if dtype != e.b.dtype:
            return _failing(f"operands of {e.op} differ in dtype: {e}", a, b)
        fn = _binary_fn(e.op, dtype)
        lanes = e.lanes
        if isinstance(e.b, Const) and e.b.lanes == 1:
            # a scalar constant operand (index arithmetic: i * 64): one call less
            try:
                c = normalize(e.b.value, e.b.dtype)
            except InterpreterError as error:
                return _failing(str(error), a)

            def binary_const() -> Value:
                x = a()
                if x.__class__ is not list:
                    return fn(x, c)
                return [fn(p, c) for p in x]
            return binary_const

        def binary() -> Value:
            x, y = a(), b()
            if x.__class__ is not list and y.__class__ is not list:
                return fn(x, y)
            return [fn(p, q) for p, q in zip(_lanes(x, lanes), _lanes(y, lanes))]
        return binary

    def _unary(self, e: Unary) -> Thunk:
        a = self.expr(e.a)
        op, dtype = e.op, e.a.dtype
        if e.lanes == 1:
            return lambda: unary_op(op, dtype, a())
        return lambda: [unary_op(op, dtype, x) for x in a()]

    def _select(self, e: Select) -> Thunk:
        c, t, f = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
        lanes = e.lanes
        if lanes == 1:
            def select() -> Value:
                k, x, y = c(), t(), f()
                return x if k else y
            return select

        def select_lanes() -> Value:
            k, x, y = c(), t(), f()
            return [p if m else q for m, p, q in zip(_lanes(k, lanes), _lanes(x, lanes),
                                                     _lanes(y, lanes))]
        return select_lanes

    def _cast(self, e: Cast) -> Thunk:
        v = self.expr(e.value)
        fn = _cast_fn(e.dtype, e.value.dtype)
        if e.lanes == 1:
            return lambda: fn(v())
        return lambda: [fn(x) for x in v()]

    def _ramp(self, e: Ramp) -> Thunk:
        base, stride = self.expr(e.base), self.expr(e.stride)
        dtype, lanes = e.dtype, e.lanes

        def ramp() -> Value:
            b, s = base(), stride()
            return [normalize(b + s * k, dtype) for k in range(lanes)]
        return ramp

    def _broadcast(self, e: Broadcast) -> Thunk:
        value, lanes = self.expr(e.value), e.lanes
        return lambda: [value()] * lanes

    def _call(self, e: Call) -> Thunk:
        args = [self.expr(a) for a in e.args]
        name = e.name
        if name in VECTOR_REDUCTIONS:
            if len(args) != 1:
                return _failing(f"{name} takes one vector, got {len(args)} argument(s)", *args)
            op, dtype, (v,) = VECTOR_REDUCTIONS[name], e.args[0].dtype, args

            def reduce() -> Value:
                lanes = v()
                acc = lanes[0]
                for x in lanes[1:]:
                    acc = binary_op(op, dtype, acc, x)
                return acc
            return reduce
        if name not in MATH and name not in BOOL_MATH:
            return _failing(f"the interpreter does not know the intrinsic '{name}'", *args)
        if not args:
            return _failing(f"{name} takes arguments, got none")
        one = self._math_function(e)
        if e.lanes == 1:
            return lambda: one(*(a() for a in args))
        lanes = e.lanes
        return lambda: [one(*xs) for xs in zip(*(_lanes(a(), lanes) for a in args))]

    @staticmethod
    def _math_function(e: Call) -> Callable[..., Value]:
        """The function of math intrinsic ``e`` on scalar arguments (``e.name`` in MATH or
        BOOL_MATH)."""
        name, first, dtype = e.name, e.args[0].dtype, e.dtype
        if name in MATH:
            fn, natural = MATH[name], first
        else:
            fn, natural = BOOL_MATH[name], DType.BOOL

        def one(*xs: Value) -> Value:
            if name == "fabs" and first.is_int:
                return cast_value(dtype, first, _wrap(abs(xs[0]), first))
            value = normalize(fn(*xs), natural)
            return cast_value(dtype, natural, value)
        return one

    def _load(self, e: Load) -> Thunk:
        slot = self._slot(e.buffer)
        index = self.expr(e.index)
        mask = self.expr(e.mask) if e.mask is not None else None
        regions = self.regions
        try:
            zero = normalize(0, e.dtype)
        except InterpreterError as error:
            return _failing(str(error), index)
        if e.lanes == 1 and mask is None:
            def load() -> Value:
                storage = slot.storage
                if storage is None:
                    slot.get()
                i = index()
                data = storage.data
                if i.__class__ is not int or not 0 <= i < data.size:
                    self._check_bounds(storage, i, "load from")
                for region in regions:
                    region.read(storage, i)
                return data.item(i)
            return load
        lanes = e.lanes

        def masked_load() -> Value:
            storage = slot.get()
            i = index()
            m = mask() if mask is not None else None
            if lanes == 1:
                if m is not None and not m:
                    return zero
                return self._read(storage, i)
            m = _lanes(m, lanes) if m is not None else [True] * lanes
            return [self._read(storage, p) if k else zero for p, k in zip(i, m)]
        return masked_load

    def _scalar_load(self, e: Load) -> Callable[..., Value]:
        """The function a generated expression calls to load one element of ``e.buffer``
        (index, then mask when ``e`` has one)."""
        slot, regions = self._slot(e.buffer), self.regions
        check = self._check_bounds
        if e.mask is None:
            def load(i: int) -> Value:
                storage = slot.storage
                if storage is None:
                    slot.get()
                data = storage.data
                if i.__class__ is not int or not 0 <= i < data.size:
                    check(storage, i, "load from")
                for region in regions:
                    region.read(storage, i)
                return data.item(i)
            return load
        zero = normalize(0, e.dtype)

        def masked_load(i: int, m: bool) -> Value:
            storage = slot.get()
            return self._read(storage, i) if m else zero
        return masked_load

    # --------------------------------------------------------------- statements
    def _seq(self, s: Seq) -> Action:
        actions = tuple(self.stmt(x) for x in s.stmts)

        def run_seq() -> None:
            for action in actions:
                action()
        return run_seq

    def _store(self, s: Store) -> Action:
        slot = self._slot(s.buffer)
        index, value = self.expr(s.index), self.expr(s.value)
        mask = self.expr(s.mask) if s.mask is not None else None
        if s.value.dtype != s.buffer.dtype:
            return _failing(f"store of {s.value.dtype} into {s.buffer}", index, value)
        regions = self.regions
        lanes = s.index.lanes
        if lanes == 1 and mask is None:
            def store() -> None:
                storage = slot.storage
                if storage is None:
                    slot.get()
                i, v = index(), value()
                data = storage.data
                if i.__class__ is not int or not 0 <= i < data.size:
                    self._check_bounds(storage, i, "store to")
                for region in regions:
                    region.write(storage, i)
                data[i] = v
                self.stores += 1
            return store

        def masked_store() -> None:
            storage = slot.get()
            i, v = index(), value()
            m = mask() if mask is not None else None
            if lanes == 1:
                if m is None or m:
                    self._write(storage, i, v)
                return
            m = _lanes(m, lanes) if m is not None else [True] * lanes
            for p, x, k in zip(i, _lanes(v, lanes), m):
                if k:
                    self._write(storage, p, x)
        return masked_store

    def _let(self, s: LetStmt) -> Action:
        value, body = self.expr(s.value), self.stmt(s.body)
        env, name = self.env, s.var.name

        def let() -> None:
            v = value()
            if v.__class__ is list:
                raise InterpreterError(f"let binds a vector to the scalar variable '{name}'")
            if name in env:
                raise InterpreterError(f"variable '{name}' is bound twice")
            env[name] = v
            try:
                body()
            finally:
                del env[name]
        return let

    def _if(self, s: IfThenElse) -> Action:
        cond, then = self.expr(s.cond), self.stmt(s.then_body)
        otherwise = self.stmt(s.else_body) if s.else_body is not None else None

        def branch() -> None:
            if cond():
                then()
            elif otherwise is not None:
                otherwise()
        return branch

    def _allocate(self, s: Allocate) -> Action:
        slot, body, buffer = self._slot(s.buffer), self.stmt(s.body), s.buffer

        def allocate() -> None:
            if slot.storage is not None:
                raise InterpreterError(f"buffer '{buffer.name}' allocated twice")
            slot.storage = _Storage(buffer, _poisoned(buffer))
            try:
                body()
            finally:
                slot.storage = None
        return allocate

    def _evaluate(self, s: Evaluate) -> Action:
        if isinstance(s.value, Call) and s.value.name in HINTS:
            return lambda: None
        value = self.expr(s.value)

        def evaluate() -> None:
            value()
        return evaluate

    def _for(self, s: For) -> Action:
        start, extent, body = self.expr(s.start), self.expr(s.extent), self.stmt(s.body)
        env, name, regions = self.env, s.var.name, self.regions
        checked = self.check_independence and s.kind in (ForKind.PARALLEL, ForKind.VECTORIZED)

        def loop() -> None:
            first, count = start(), extent()
            if not (isinstance(first, int) and isinstance(count, int)):
                raise InterpreterError(f"loop '{name}' bounds [{first}, +{count}) are not "
                                       f"scalar integers")
            if name in env:
                raise InterpreterError(f"variable '{name}' is bound twice")
            if not checked:
                try:
                    for i in range(first, first + count):
                        env[name] = i
                        body()
                finally:
                    env.pop(name, None)
                return
            region = _Region(s)
            regions.append(region)
            try:
                for i in range(first, first + count):
                    region.iteration = i
                    env[name] = i
                    body()
            finally:
                env.pop(name, None)
                regions.remove(region)
        return loop

    def _gemm(self, s: Gemm) -> Action:
        try:
            plan = _GemmPlan(s)
        except InterpreterError as error:
            return _failing(str(error))
        slots = (self._slot(s.out), self._slot(s.a), self._slot(s.b))
        pack = self._slot(s.pack) if s.pack is not None else None
        bases = (self.expr(s.out_base), self.expr(s.a_base), self.expr(s.b_base))
        finish = self.expr(s.finish) if s.finish is not None else None
        return lambda: self._run_gemm(s, plan, slots, pack, bases, finish)

    def _run_gemm(self, s: Gemm, plan: "_GemmPlan", slots: tuple[_Slot, _Slot, _Slot],
                  pack: _Slot | None, bases: tuple[Thunk, Thunk, Thunk],
                  finish: Thunk | None) -> None:
        out, a, b = (slot.get() for slot in slots)
        if pack is not None:
            pack.get()  # the kernel's scratch must exist, though only C code fills it
        env = self.env
        names = [v.name for v, _ in s.batch]
        bound = names + [s.row.name, s.col.name, s.result.name]
        if len(set(bound)) != len(bound) or any(n in env for n in bound):
            raise InterpreterError(f"gemm into {s.out.name}: a variable of {bound} is bound "
                                   f"twice")
        # which output elements are stored so far: the template's tasks (batch elements
        # among them) run in parallel, so none may be stored twice
        stored = np.zeros(out.data.size, dtype=bool) if self.check_independence else None
        what = f"gemm into {s.out.name}:"
        try:
            for element in itertools.product(*(range(extent) for _, extent in s.batch)):
                env.update(zip(names, element))
                out_base, a_base, b_base = (int(base()) for base in bases)
                out_index = plan.out_index + out_base
                a_matrix = self._gather(a, plan.a_index + a_base, f"{what} load from")
                b_matrix = self._gather(b, plan.b_index + b_base, f"{what} load from")
                self._check_indices(out, out_index, f"{what} store to")
                total = (a_matrix.astype(np.float64) @ b_matrix.astype(np.float64)
                         ).astype(out.data.dtype)
                if finish is not None:
                    total = self._finish(s, total, finish, out.data.dtype)
                if stored is not None:
                    self._check_distinct(s, stored, out_index.reshape(-1))
                for region in self.regions:
                    for index in out_index.reshape(-1).tolist():
                        region.write(out, index)
                out.data[out_index] = total
                self.stores += total.size
        finally:
            for name in bound:
                env.pop(name, None)

    @staticmethod
    def _check_indices(storage: _Storage, index: np.ndarray, what: str) -> None:
        size = storage.data.size
        if index.size and (index.min() < 0 or index.max() >= size):
            bad = index[(index < 0) | (index >= size)].flat[0]
            raise InterpreterError(f"{what} {storage.buffer.name}[{bad}]: out of bounds "
                                   f"(size {size})")

    def _gather(self, storage: _Storage, index: np.ndarray, what: str) -> np.ndarray:
        """``storage``'s elements at ``index``, bounds-checked and logged as reads."""
        self._check_indices(storage, index, what)
        if self.regions:
            for i in np.unique(index).tolist():
                for region in self.regions:
                    region.read(storage, i)
        return storage.data[index]

    def _finish(self, s: Gemm, total: np.ndarray, finish: Thunk,
                dtype: np.dtype) -> np.ndarray:
        """``finish`` of every element of one batch element's product, row by row."""
        env = self.env
        row, col, result = s.row.name, s.col.name, s.result.name
        values = []
        for i, sums in enumerate(total.tolist()):
            env[row] = i
            line = []
            for j, value in enumerate(sums):
                env[col] = j
                env[result] = value
                line.append(finish())
            values.append(line)
        return np.array(values, dtype=dtype).reshape(total.shape)

    @staticmethod
    def _check_distinct(s: Gemm, stored: np.ndarray, index: np.ndarray) -> None:
        """Mark ``index`` stored; an element stored before (or twice in ``index``) breaks the
        independence of the template's parallel tasks."""
        unique, counts = np.unique(index, return_counts=True)
        twice = np.concatenate([unique[counts > 1], unique[stored[unique]]])
        if twice.size:
            raise IndependenceError(f"gemm into {s.out.name}: element "
                                    f"{s.out.name}[{int(twice[0])}] is stored by two (batch, "
                                    f"row, column) elements, whose tasks run in parallel")
        stored[unique] = True


class _GemmPlan:
    """The element offsets a :class:`Gemm` reads and writes, relative to its base offsets:
    ``a_index`` (m, k), ``b_index`` (k, n), ``out_index`` (m, n) (int64 arrays)."""

    def __init__(self, s: Gemm):
        for name in ("m", "n", "k"):
            size = getattr(s, name)
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
                raise InterpreterError(f"gemm into {s.out.name}: {name} = {size!r} is not a "
                                       f"size")
        m, n, k = int(s.m), int(s.n), int(s.k)
        for var, extent in s.batch:
            if not isinstance(extent, int) or extent < 0:
                raise InterpreterError(f"gemm into {s.out.name}: batch loop '{var.name}' has "
                                       f"extent {extent!r}")
        if not (s.out.dtype == s.a.dtype == s.b.dtype) or not s.out.dtype.is_float:
            raise InterpreterError(f"gemm into {s.out.name}: operands {s.a.dtype} x "
                                   f"{s.b.dtype} -> {s.out.dtype}; the template multiplies "
                                   f"floats of one type")
        if s.out in (s.a, s.b):
            raise InterpreterError(f"gemm into {s.out.name} reads its own output (the "
                                   f"template accumulates in it)")
        if s.finish is not None and (s.finish.dtype != s.out.dtype or s.finish.lanes != 1):
            raise InterpreterError(f"gemm into {s.out.name}: finish is {s.finish.dtype} x "
                                   f"{s.finish.lanes} lanes, the output one {s.out.dtype}")
        rows, terms, cols = (np.arange(extent, dtype=np.int64) for extent in (m, k, n))
        if s.a_packed:  # strips of mr rows: strip[i // mr, kk, i % mr]
            mr = _positive(s.knobs.mr, s, "knobs.mr")
            self.a_index = ((rows // mr) * (k * mr) + rows % mr)[:, None] + terms[None, :] * mr
        elif s.a_gathered:
            along_k = _walk(s.a_k_dims, k, s, "a_k_dims")
            self.a_index = rows[:, None] * s.a_rs + along_k[None, :]
        else:
            self.a_index = rows[:, None] * s.a_rs + terms[None, :] * s.a_cs
        if s.b_packed:  # panels of nr columns: panel[j // nr, kk, j % nr]
            nr = _positive(s.knobs.nr, s, "knobs.nr")
            self.b_index = terms[:, None] * nr + ((cols // nr) * (k * nr) + cols % nr)[None, :]
        else:
            along_k = _walk(s.b_k_dims, k, s, "b_k_dims")
            along_j = _walk(s.b_j_dims, n, s, "b_j_dims")
            self.b_index = along_k[:, None] + along_j[None, :]
        along_out = _walk(s.out_j_dims, n, s, "out_j_dims") if s.out_j_dims else cols
        self.out_index = rows[:, None] * s.out_rs + along_out[None, :]


def _positive(value: int, s: Gemm, what: str) -> int:
    if not isinstance(value, int) or value < 1:
        raise InterpreterError(f"gemm into {s.out.name}: {what} = {value!r} must be positive")
    return value


def _walk(dims: tuple[tuple[int, int], ...], size: int, s: Gemm, what: str) -> np.ndarray:
    """The offsets of a walk of (extent, stride) dims, outer to inner, in order."""
    offsets = np.zeros(1, dtype=np.int64)
    for extent, stride in dims:
        offsets = (offsets[:, None] + np.arange(extent, dtype=np.int64)[None, :] * stride
                   ).reshape(-1)
    if offsets.size != size:
        raise InterpreterError(f"gemm into {s.out.name}: {what} {dims} walk {offsets.size} "
                               f"elements, not {size}")
    return offsets


# ----------------------------------------------------------------------------- generated source
# Deeper scalar trees are cut into functions of their own: Python's parser limits nesting.
MAX_SOURCE_DEPTH = 40
_RING = {"add": "+", "sub": "-", "mul": "*"}
_COMPARE_SOURCE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _generated(e: Expr) -> bool:
    """Whether ``e`` is a scalar node that :class:`_ScalarSource` writes as Python source
    (its operands are scalars too; anything else is left to closures)."""
    if isinstance(e, (Var, Load, Unary, Cast, Select)):
        return e.lanes == 1
    if isinstance(e, Const):
        return e.lanes == 1 and (e.dtype is DType.BOOL or e.dtype.is_int or e.dtype.is_float)
    if isinstance(e, Binary):
        return e.lanes == 1 and e.a.dtype == e.b.dtype
    if isinstance(e, Call):
        return e.lanes == 1 and (e.name in MATH or e.name in BOOL_MATH) and \
            bool(e.args) and all(a.lanes == 1 for a in e.args)
    return False


def _unbound(error: KeyError) -> InterpreterError:
    return InterpreterError(f"variable '{error.args[0]}' is not bound")


def _select_value(cond: Value, true_value: Value, false_value: Value) -> Value:
    return true_value if cond else false_value


class _ScalarSource:
    """A scalar expression tree written as one Python function, so that evaluating it costs
    one call instead of one per node (index arithmetic dominates loop bodies).

    The source computes exactly what the closures compute: integer ``add``/``sub``/``mul``/
    ``neg`` chains are wrapped once at their root (wrapping commutes with ring operations),
    every other operation is the same function or an inlined equivalent, every operand is
    evaluated (a Select's both branches too) in the same order.  Variables are scalars (the
    IR's Var has one lane; the interpreter binds nothing else), read from the environment;
    a missing one raises InterpreterError like the closure does."""

    def __init__(self, interp: Interpreter):
        self.interp = interp
        self.names: dict[str, object] = {"env": interp.env, "_unbound": _unbound,
                                         "_sel": _select_value}
        self.temps = 0
        self.inlined: set[int] = set()  # ids of the compound nodes written out so far

    def function(self, e: Expr) -> Thunk:
        body = self.source(e, 0)
        code = (f"def _generated():\n    try:\n        return {body}\n"
                f"    except KeyError as error:\n        raise _unbound(error) from None\n")
        exec(compile(code, f"<loop IR: {type(e).__name__}>", "exec"), self.names)
        return self.names["_generated"]  # type: ignore[return-value]

    def name(self, value: object) -> str:
        name = f"_n{len(self.names)}"
        self.names[name] = value
        return name

    def temp(self) -> str:
        self.temps += 1
        return f"_t{self.temps}"

    def call(self, fn: Callable[..., Value], *args: str) -> str:
        return f"{self.name(fn)}({', '.join(args)})"

    def source(self, e: Expr, depth: int) -> str:
        if not _generated(e):
            return self.call(self.interp._closure(e))
        if not isinstance(e, (Var, Const)):
            # a subtree shared within the tree is written once and called elsewhere (its
            # own function, cached), so that a DAG does not become an exponential text
            if depth > MAX_SOURCE_DEPTH or id(e) in self.inlined:
                return self.call(self.interp.expr(e))
            self.inlined.add(id(e))
        depth += 1
        if isinstance(e, Var):
            return f"env[{e.name!r}]"
        if isinstance(e, Const):
            return self.const(normalize(e.value, e.dtype))
        if isinstance(e, Binary):
            return self.binary(e, depth)
        if isinstance(e, Unary):
            op, dtype = e.op, e.a.dtype
            if op == "neg" and dtype.is_int:
                return self.wrapped(f"(-{self.ring(e.a, dtype, depth)})", dtype)
            a = self.source(e.a, depth)
            if op == "not":
                return f"(not {a})"
            if op == "neg" and dtype.is_float:
                return f"(-{a})"
            return self.call(lambda x: unary_op(op, dtype, x), a)
        if isinstance(e, Select):
            return self.call(_select_value, self.source(e.cond, depth),
                             self.source(e.true_value, depth), self.source(e.false_value, depth))
        if isinstance(e, Cast):
            a = self.source(e.value, depth)
            if e.dtype == e.value.dtype:
                return a
            if e.dtype is DType.FLOAT64:
                return f"float({a})"
            return self.call(_cast_fn(e.dtype, e.value.dtype), a)
        if isinstance(e, Load):
            load = self.interp._scalar_load(e)
            index = self.source(e.index, depth)
            if e.mask is None:
                return self.call(load, index)
            return self.call(load, index, self.source(e.mask, depth))
        if isinstance(e, Call):
            return self.call(self.interp._math_function(e),
                             *(self.source(a, depth) for a in e.args))
        raise InterpreterError(f"no source for {type(e).__name__}")  # (_generated said yes)

    def const(self, value: Value) -> str:
        if isinstance(value, int) or math.isfinite(value):
            return f"({value!r})"  # repr round-trips every float, -0.0 included
        return self.name(value)  # inf and nan have no literal

    def binary(self, e: Binary, depth: int) -> str:
        op, dtype = e.op, e.a.dtype
        if op in _COMPARE_SOURCE:
            return f"({self.source(e.a, depth)} {_COMPARE_SOURCE[op]} {self.source(e.b, depth)})"
        if dtype.is_int and op in _RING:
            return self.wrapped(self.ring(e, dtype, depth - 1, root=True), dtype)
        if dtype is DType.BOOL and _BOOL_OPS.get(op) in ("and", "or"):
            # both operands evaluated (no short circuit), as by the closures
            x, y = self.temp(), self.temp()
            return (f"(({x} {_BOOL_OPS[op]} {y}) if (({x} := {self.source(e.a, depth)}), "
                    f"({y} := {self.source(e.b, depth)})) else None)")
        if (dtype.is_int or dtype.is_float) and op in ("min", "max"):
            a, b = self.source(e.a, depth), self.source(e.b, depth)
            x, y = self.temp(), self.temp()
            pick = f"({x} := {a}) {'<' if op == 'min' else '>'} ({y} := {b})"
            if dtype.is_float:
                pick = f"{pick} or {x} != {x}"
            return f"({x} if {pick} else {y})"
        a, b = self.source(e.a, depth), self.source(e.b, depth)
        if dtype.is_float and op in _RING:
            if dtype is DType.FLOAT64:
                return f"({a} {_RING[op]} {b})"
            return self.call(_rounder(dtype), f"{a} {_RING[op]} {b}")
        return self.call(_binary_fn(op, dtype), a, b)

    def wrapped(self, source: str, dtype: DType) -> str:
        """``source`` wrapped into ``dtype``'s range, the in-range case inline."""
        lo, hi = _int_range(dtype)
        x = self.temp()
        return f"({x} if {lo} <= ({x} := {source}) <= {hi} else {self.call(_wrapper(dtype), x)})"

    def ring(self, e: Expr, dtype: DType, depth: int, root: bool = False) -> str:
        """Source of a value congruent to ``e`` modulo ``dtype``'s range (unwrapped); the
        ``root`` of a chain is already written out by :meth:`source`."""
        if isinstance(e, Binary) and e.op in _RING and e.a.dtype == dtype == e.b.dtype and \
                self.inline(e, depth, root):
            return (f"({self.ring(e.a, dtype, depth + 1)} {_RING[e.op]} "
                    f"{self.ring(e.b, dtype, depth + 1)})")
        if isinstance(e, Unary) and e.op == "neg" and e.a.dtype == dtype and \
                self.inline(e, depth, root):
            return f"(-{self.ring(e.a, dtype, depth + 1)})"
        return self.source(e, depth)  # (also a shared or deep node: a call of its own)

    def inline(self, e: Expr, depth: int, root: bool) -> bool:
        """Whether a link of a ring chain is written out here (marking it so)."""
        if root:
            return True
        if depth > MAX_SOURCE_DEPTH or id(e) in self.inlined:
            return False
        self.inlined.add(id(e))
        return True


_EXPR_COMPILERS: dict[type, Callable[[Interpreter, Any], Thunk]] = {
    Var: Interpreter._var, Const: Interpreter._const, Binary: Interpreter._binary,
    Unary: Interpreter._unary, Select: Interpreter._select, Cast: Interpreter._cast,
    Load: Interpreter._load, Ramp: Interpreter._ramp, Broadcast: Interpreter._broadcast,
    Call: Interpreter._call,
}
_STMT_COMPILERS: dict[type, Callable[[Interpreter, Any], Action]] = {
    Seq: Interpreter._seq, Store: Interpreter._store, For: Interpreter._for,
    LetStmt: Interpreter._let, IfThenElse: Interpreter._if, Allocate: Interpreter._allocate,
    Evaluate: Interpreter._evaluate, Gemm: Interpreter._gemm,
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
        interp.bind(b, data)
    for p in func.params:
        if isinstance(p, Var):
            if scalars is None or p.name not in scalars:
                raise InterpreterError(f"scalar parameter '{p.name}' is not given")
            interp.env[p.name] = normalize(scalars[p.name], p.dtype)
    interp.exec(func.body)
    return {b.name: interp.contents(b).reshape(b.shape) for b in buffers}


def run_outputs(func: PrimFunc, inputs: Sequence[np.ndarray],
                check_independence: bool = True) -> list[np.ndarray]:
    """Execute a lowered kernel (inputs first, then outputs, then scratch buffers, whose
    count the ``scratch`` attribute gives); returns the outputs in order."""
    results = run(func, list(inputs), check_independence=check_independence)
    names = [p.name for p in func.params if isinstance(p, Buffer)][len(inputs):]
    scratch = int(func.attr("scratch", 0))
    return [results[n] for n in (names[:len(names) - scratch] if scratch else names)]


def eval_expr(e: Expr, env: Mapping[str, object] | None = None,
              buffers: Mapping[Buffer, np.ndarray] | None = None) -> Value:
    """Evaluate one expression with variables bound by name (and optional buffers)."""
    interp = Interpreter(PrimFunc("expr", (), Seq(())))
    for name, value in (env or {}).items():
        if isinstance(value, list):  # (a Var has one lane; generated code relies on it)
            raise InterpreterError(f"variable '{name}' bound to a vector")
        interp.env[name] = value
    for b, a in (buffers or {}).items():
        interp.bind(b, np.array(a, dtype=b.dtype.numpy).reshape(-1))
    return interp.eval(e)
