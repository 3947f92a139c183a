"""C code of loop-IR expressions, scalar and vector.

A scalar expression becomes a C expression of its compute type (see :mod:`c_types`).  A vector
expression (``lanes > 1``) becomes a value of a GCC/Clang vector-extension type.  Operations
that C vectors do natively and without undefined behaviour (float arithmetic, integer
add/sub/mul on the unsigned twin type, bitwise ops, comparisons, blends) use vector operators;
everything else is a generated ``static inline`` helper that loops over the lanes calling the
scalar code (the compiler's SLP vectorizer turns most of those loops back into SIMD).  So every
operation has exactly one scalar definition and vectors can never disagree with scalars.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ember.core.traced import as_size, is_traced
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.codegen import c_helpers as H
from ember.codegen.c_math import (BOOL_RESULT, MATH_FUNCTIONS, REDUCTIONS, is_target_intrinsic,
                                  math_arity, math_call, target_intrinsic)
from ember.codegen.c_types import (NARROW_FLOATS, CodegenError, compute_ctype, float_literal,
                                   int_literal, lane_ctype, narrow_float_value, padded_lanes,
                                   signed_lane, storage_ctype, tag, unsigned_lane, vector_name,
                                   vector_typedef)
from ember.ir.loop.affine import affine_ramp
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import (COMPARISONS, Binary, Broadcast, Call, Cast, Const, Expr, Load,
                                Ramp, Select, Unary, Var)

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^"}
# bool operands: arithmetic as numpy does it on booleans (add = or, mul = and, ...)
_BOOL_OPS = {"add": "|", "max": "|", "bitor": "|", "or": "|", "mul": "&", "min": "&",
             "bitand": "&", "and": "&", "sub": "^", "bitxor": "^"}


def vector_builder(name: str, params: str, vt: str, lane: str, lanes: int, element: str,
                   guard: str = "") -> str:
    """A helper building a vector lane by lane.

    The lanes are computed into a plain array and copied into the vector: GCC 12 at -O2+
    miscompiles the direct form ``r[i] = (p[i] != 0)`` on vector-extension elements (it keeps
    the comparison's -1 instead of 1 when the vector is then combined, e.g. ``r ^ 1``).
    """
    return (f"static inline {vt} {name}({params}) {{\n"
            f"  {lane} t[{padded_lanes(lanes)}] = {{0}};\n"
            f"  for (int i = 0; i < {lanes}; ++i) {guard}t[i] = {element};\n"
            f"  {vt} r;\n  memcpy(&r, t, sizeof r);\n  return r;\n}}")


@dataclass
class ModuleContext:
    """What all functions of one C module share: helpers, vector typedefs, headers."""

    target: Target
    helpers: H.HelperSet = field(default_factory=H.HelperSet)
    typedefs: dict[str, str] = field(default_factory=dict)
    headers: set[str] = field(default_factory=set)
    # A module of separate units: GEMMs over packed A call the micro-kernels of a shared
    # unit (codegen/c_gemm.py), whose tile shapes (vectors, lanes, mr) are collected here.
    shared_gemm: bool = False
    shared_gemm_tiles: set[tuple[int, int, int]] = field(default_factory=set)

    def vtype(self, lane: str, lanes: int) -> str:
        name = vector_name(lane, lanes)
        self.typedefs.setdefault(name, vector_typedef(lane, lanes))
        return name

    def vtype_of(self, dtype: DType, lanes: int) -> str:
        return self.vtype(lane_ctype(dtype), lanes)


_PLAIN_INDEX_OPS = {"add": "+", "sub": "-", "mul": "*"}


class ExprEmitter:
    """Turns expressions into C; the caller supplies the C names of variables and buffers."""

    def __init__(self, ctx: ModuleContext, var_name: Callable[[Var], str],
                 buffer_name: Callable[[Buffer], str]):
        self.ctx = ctx
        self.hs = ctx.helpers
        self.var_name = var_name
        self.buffer_name = buffer_name

    # =========================================================================== dispatch
    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.var_name(e)
        if isinstance(e, Const):
            scalar = self.const(e.value, e.dtype)
            return scalar if e.lanes == 1 else self.splat(scalar, e.dtype, e.lanes)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Ramp):
            return self.ramp(e)
        if isinstance(e, Broadcast):
            if e.value.lanes != 1:
                raise CodegenError(f"broadcast of a vector: {e}")
            return self.splat(self.expr(e.value), e.dtype, e.lanes)
        if e.lanes == 1:
            return self.scalar(e)
        return self.vector(e)

    def index(self, e: Expr) -> str:
        """A scalar element index in plain C arithmetic.

        Elsewhere signed integer arithmetic goes through wrapping helpers (signed overflow is
        undefined in C).  An index into a buffer is bounded by the buffer's size (< 2**63), and
        so is every partial sum of the affine forms lowering builds, so plain arithmetic cannot
        overflow here for any in-bounds access; and it lets the C compiler analyse the access
        pattern, which is what vectorizes loops.
        """
        if isinstance(e, Binary) and e.lanes == 1 and e.dtype is DType.INT64 and \
                e.op in _PLAIN_INDEX_OPS:
            return f"({self.index(e.a)} {_PLAIN_INDEX_OPS[e.op]} {self.index(e.b)})"
        # C's truncating division by a positive constant is defined for every dividend;
        # the IR's div/mod are that division (range analysis writes floor division of a
        # non-negative index so, see ember.ir.loop.index_simplify)
        if isinstance(e, Binary) and e.lanes == 1 and e.dtype is DType.INT64 and \
                e.op in ("div", "mod") and isinstance(e.b, Const) and as_size(e.b.value) > 0:
            return f"({self.index(e.a)} {'/' if e.op == 'div' else '%'} {self.index(e.b)})"
        return self.expr(e)

    def scalar(self, e: Expr) -> str:
        if isinstance(e, Binary):
            self._check_operands(e)
            return self.binary_code(e.op, e.a.dtype, self.expr(e.a), self.expr(e.b))
        if isinstance(e, Unary):
            return self.unary_code(e.op, e.a.dtype, self.expr(e.a))
        if isinstance(e, Select):
            return self.scalar_select(e)
        if isinstance(e, Cast):
            return self.cast_code(e.dtype, e.value.dtype, self.expr(e.value))
        if isinstance(e, Call):
            return self.call(e)
        raise CodegenError(f"unknown expression {type(e).__name__}: {e!r}")

    def scalar_select(self, e: Select) -> str:
        """``cond ? a : b`` through an inline function, so both operands are evaluated first.

        GCC 12 miscompiles a vectorized ``c ? x[i] : y[i]`` whose condition depends on loaded
        data (with AVX-512 it reuses the first chunk's mask for later chunks).  Evaluating
        both operands before selecting gives it a plain blend.  Compute definitions therefore
        never rely on a Select to keep a load in bounds: they clamp indices instead (and the
        sanitizer tests would catch an out-of-bounds read).
        """
        ct = "bool" if e.dtype is DType.BOOL else compute_ctype(e.dtype)
        name = f"em_select_{tag(ct)}"
        self.hs.need(name, lambda: (
            f"static inline {ct} {name}(bool c, {ct} a, {ct} b) {{ return c ? a : b; }}"))
        return (f"{name}({self.expr(e.cond)}, {self.expr(e.true_value)}, "
                f"{self.expr(e.false_value)})")

    @staticmethod
    def _check_operands(e: Binary) -> None:
        if e.a.dtype != e.b.dtype:
            raise CodegenError(f"operands of {e.op} differ in dtype: {e}")

    # =========================================================================== constants
    def const(self, value: int | float | bool, dtype: DType) -> str:
        if is_traced(value) and dtype is not DType.BOOL:
            # a size of a build traced over run-time dims: its expression of em_dims
            return f"(({compute_ctype(dtype)}){value.expr.c_code()})"
        if dtype is DType.BOOL:
            return "true" if value else "false"
        if dtype.is_float:
            if dtype in NARROW_FLOATS:
                return float_literal(narrow_float_value(float(value), dtype), "float")
            return float_literal(float(value), compute_ctype(dtype))
        if isinstance(value, float) and not value.is_integer():
            raise CodegenError(f"non-integral constant {value} of integer type {dtype}")
        return int_literal(int(value), dtype)

    # =========================================================================== scalar code
    def binary_code(self, op: str, dtype: DType, a: str, b: str) -> str:
        """C code of ``a op b`` for scalar operands of ``dtype`` (also used inside lane loops)."""
        hs = self.hs
        if op in COMPARISONS:
            return f"(({a}) {_CMP[op]} ({b}))"
        if dtype is DType.BOOL:
            if op not in _BOOL_OPS:
                raise CodegenError(f"'{op}' is not defined on bool operands")
            return f"(bool)(({a}) {_BOOL_OPS[op]} ({b}))"
        if op in ("and", "or"):
            return f"(({a}) {'&&' if op == 'and' else '||'} ({b}))"
        ct = compute_ctype(dtype)
        if dtype.is_float:
            if op in ("min", "max"):
                return f"{H.minmax(hs, op, dtype)}({a}, {b})"
            if op in _ARITH:
                code = f"(({a}) {_ARITH[op]} ({b}))"
            elif op == "mod":
                code = f"fmod{'f' if ct == 'float' else ''}({a}, {b})"
            elif op in ("floordiv", "floormod"):
                code = f"{H.float_divmod(hs, op, ct)}({a}, {b})"
            else:
                raise CodegenError(f"'{op}' is not defined on {dtype} operands")
            return H.round_narrow(hs, dtype, code) if dtype in NARROW_FLOATS else code
        if op in ("add", "sub", "mul"):
            fn = H.int_arith(hs, op, dtype)
        elif op in ("div", "mod", "floordiv", "floormod"):
            fn = H.int_divmod(hs, op, dtype)
        elif op in ("shl", "shr"):
            fn = H.int_shift(hs, op, dtype)
        elif op in ("min", "max"):
            fn = H.minmax(hs, op, dtype)
        elif op in _BITWISE:
            return f"(({ct})(({a}) {_BITWISE[op]} ({b})))"
        else:
            raise CodegenError(f"'{op}' is not defined on {dtype} operands")
        return f"{fn}({a}, {b})"

    def unary_code(self, op: str, dtype: DType, a: str) -> str:
        if op == "not" or (op == "bitnot" and dtype is DType.BOOL):
            return f"(!({a}))"
        if op == "neg" and dtype.is_float:
            return f"(-({a}))"  # exact, also for f16/bf16
        if op == "neg" and dtype.is_int:
            return f"{H.int_neg(self.hs, dtype)}({a})"
        if op == "bitnot" and dtype.is_int:
            return f"(({compute_ctype(dtype)})~({a}))"
        raise CodegenError(f"'{op}' is not defined on {dtype}")

    def cast_code(self, to: DType, frm: DType, x: str) -> str:
        """C code converting scalar ``x`` of ``frm`` to ``to`` (defined for every value)."""
        if to == frm:
            return x
        if to is DType.BOOL:
            return f"(({x}) != 0)"
        if to in NARROW_FLOATS:
            if frm is DType.BOOL:
                return f"((float)({x}))"
            if compute_ctype(frm) == "float":  # f32, f16, bf16: one rounding from float
                return H.round_narrow(self.hs, to, x)
            return H.round_narrow(self.hs, to, f"(double)({x})", from_double=True)
        ct = compute_ctype(to)
        if to.is_float or not frm.is_float:
            return f"(({ct})({x}))"  # exact, IEEE rounding, or modular narrowing
        return f"{H.float_to_int(self.hs, to, compute_ctype(frm))}({x})"

    def math_code(self, name: str, arg_dtypes: list[DType], result: DType,
                  args: list[str]) -> str:
        dtype = arg_dtypes[0]
        if any(d != dtype for d in arg_dtypes):
            raise CodegenError(f"arguments of '{name}' differ in dtype: {arg_dtypes}")
        if name == "fabs" and dtype.is_int:
            return self.cast_code(result, dtype, f"{H.int_abs(self.hs, dtype)}({args[0]})")
        if not dtype.is_float:
            raise CodegenError(f"math intrinsic '{name}' needs float arguments, got {dtype}")
        code = math_call(name, compute_ctype(dtype), args, self.hs)
        natural = DType.BOOL if name in BOOL_RESULT else dtype
        if natural in NARROW_FLOATS:
            code = H.round_narrow(self.hs, natural, code)
        return self.cast_code(result, natural, code)

    # =========================================================================== calls
    def call(self, e: Call) -> str:
        if e.name in REDUCTIONS:
            return self.reduction(e)
        if is_target_intrinsic(e.name):
            return self.target_call(e)
        if e.name not in MATH_FUNCTIONS:
            raise CodegenError(
                f"unknown intrinsic '{e.name}': expected a math function "
                f"({', '.join(sorted(MATH_FUNCTIONS))}), one of {', '.join(REDUCTIONS)}, "
                "or a target instruction x86.*/arm.*/wasm.* of codegen.c_math.TARGET_INTRINSICS")
        if len(e.args) != math_arity(e.name):
            raise CodegenError(f"'{e.name}' takes {math_arity(e.name)} argument(s): {e}")
        dtypes = [a.dtype for a in e.args]
        if e.lanes == 1:
            if any(a.lanes != 1 for a in e.args):
                raise CodegenError(f"scalar call with vector arguments: {e}")
            return self.math_code(e.name, dtypes, e.dtype, [self.expr(a) for a in e.args])
        return self.lanewise(
            e.name, e.dtype, e.lanes, [(self.vec(a, e.lanes), a.dtype) for a in e.args],
            lambda xs: self.math_code(e.name, dtypes, e.dtype, xs))

    def reduction(self, e: Call) -> str:
        op = REDUCTIONS[e.name]
        if len(e.args) != 1 or e.lanes != 1:
            raise CodegenError(f"{e.name} takes one vector and returns a scalar: {e}")
        (v,) = e.args
        if v.dtype != e.dtype:
            raise CodegenError(f"{e.name} of {v.dtype} lanes must return {v.dtype}: {e}")
        vt, ct = self.ctx.vtype_of(v.dtype, v.lanes), compute_ctype(v.dtype)
        name = f"em_{e.name.split('.')[1]}_{v.dtype}x{v.lanes}"
        step = self.binary_code(op, v.dtype, "acc", "v[i]")
        self.hs.need(name, lambda: (
            f"static inline {ct} {name}({vt} v) {{\n  {ct} acc = v[0];\n"
            f"  for (int i = 1; i < {v.lanes}; ++i) acc = {step};\n  return acc;\n}}"))
        return f"{name}({self.expr(v)})"

    def target_call(self, e: Call) -> str:
        entry = target_intrinsic(e.name, e.dtype, e.lanes, [(a.dtype, a.lanes) for a in e.args],
                                 self.ctx.target)
        self.ctx.headers.add(entry.header)
        args = ", ".join(f"({ct})({self.expr(a)})" for ct, a in zip(entry.c_args, e.args))
        return f"(({self.ctx.vtype_of(e.dtype, e.lanes)}){entry.c_name}({args}))"

    # =========================================================================== memory
    def load_value(self, dtype: DType, element: str) -> str:
        """Compute value of one storage element."""
        if dtype in NARROW_FLOATS:
            return f"{H.conversion(self.hs, f'em_{H.narrow_suffix(dtype)}_to_f32')}({element})"
        if dtype is DType.BOOL:
            return f"(({element}) != 0)"
        return element

    def store_value(self, dtype: DType, value: str) -> str:
        """Storage element of a compute value."""
        if dtype in NARROW_FLOATS:
            return f"{H.conversion(self.hs, f'em_f32_to_{H.narrow_suffix(dtype)}')}({value})"
        if dtype is DType.BOOL:
            return f"(uint8_t)({value})"
        return value

    def load(self, e: Load) -> str:
        buf = self.buffer_name(e.buffer)
        dtype = e.buffer.dtype
        if e.lanes == 1:
            value = self.load_value(dtype, f"{buf}[{self.index(e.index)}]")
            return value if e.mask is None else f"(({self.expr(e.mask)}) ? {value} : 0)"
        access = self._access(buf, e.index, e.mask, e.lanes)
        st, vt = storage_ctype(dtype), self.ctx.vtype_of(dtype, e.lanes)
        name = f"em_vload{access.suffix}_{dtype}x{e.lanes}"
        element = self.load_value(dtype, f"p[{access.element}]")

        def build() -> str:
            params = ", ".join([f"const {st}* p", *access.params])
            if access.plain and dtype not in NARROW_FLOATS and dtype is not DType.BOOL:
                return (f"static inline {vt} {name}({params}) {{\n  {vt} r = {{0}};\n"
                        f"  memcpy(&r, p, {e.lanes} * sizeof({st}));\n  return r;\n}}")
            return vector_builder(name, params, vt, lane_ctype(dtype), e.lanes, element,
                                  access.guard)

        self.hs.need(name, build)
        return f"{name}({', '.join(access.args)})"

    def store(self, buffer: Buffer, index: Expr, value: Expr, mask: Expr | None) -> str:
        """The C statement of a Store."""
        buf, dtype = self.buffer_name(buffer), buffer.dtype
        if index.lanes == 1:
            if value.lanes != 1:
                raise CodegenError(f"store of {value.lanes} lanes to scalar index of {buf}")
            stmt = f"{buf}[{self.index(index)}] = {self.store_value(dtype, self.expr(value))};"
            return stmt if mask is None else f"if ({self.expr(mask)}) {stmt}"
        lanes = index.lanes
        access = self._access(buf, index, mask, lanes)
        st, vt = storage_ctype(dtype), self.ctx.vtype_of(dtype, lanes)
        name = f"em_vstore{access.suffix}_{dtype}x{lanes}"
        element = self.store_value(dtype, "v[i]")

        def build() -> str:
            params = ", ".join([f"{st}* p", f"{vt} v", *access.params])
            if access.plain and dtype not in NARROW_FLOATS:  # bool lanes are already 0/1
                body = f"memcpy(p, &v, {lanes} * sizeof({st}));"
            else:
                body = f"for (int i = 0; i < {lanes}; ++i) {access.guard}p[{access.element}] " \
                       f"= {element};"
            return f"static inline void {name}({params}) {{\n  {body}\n}}"

        self.hs.need(name, build)
        args = [access.args[0], self.vec(value, lanes), *access.args[1:]]
        return f"{name}({', '.join(args)});"

    def _access(self, buf: str, index: Expr, mask: Expr | None, lanes: int) -> "_Access":
        """A vector access: contiguous from ``p + base`` (a Ramp of stride 1) or a gather /
        scatter through an index vector; optionally masked."""
        affine = affine_ramp(index)
        if affine is not None and isinstance(affine[1], Const) and affine[1].value == 1:
            access = _Access(f"{buf} + ({self.expr(affine[0])})", "i")
        else:
            idx_t = self.ctx.vtype_of(index.dtype, lanes)
            access = _Access(buf, "idx[i]", f"_gather_{index.dtype}")
            access.add(self.vec(index, lanes), f"{idx_t} idx")
        if mask is not None:
            if mask.dtype is not DType.BOOL:
                raise CodegenError(f"mask of an access to {buf} must be bool, got {mask.dtype}")
            access.add(self.vec(mask, lanes), f"{self.ctx.vtype_of(DType.BOOL, lanes)} m")
            access.suffix += "_masked"
            access.guard = "if (m[i]) "
        return access

    # =========================================================================== vectors
    def vec(self, e: Expr, lanes: int) -> str:
        """``e`` as a vector of ``lanes`` lanes (scalars are splatted)."""
        if e.lanes == lanes:
            return self.expr(e)
        if e.lanes == 1:
            return self.splat(self.expr(e), e.dtype, lanes)
        raise CodegenError(f"expression of {e.lanes} lanes used where {lanes} are needed: {e}")

    def splat(self, scalar: str, dtype: DType, lanes: int) -> str:
        lane = lane_ctype(dtype)
        vt = self.ctx.vtype(lane, lanes)
        name = f"em_splat_{tag(lane)}x{lanes}"
        self.hs.need(name, lambda: vector_builder(name, f"{lane} x", vt, lane, lanes, "x"))
        return f"{name}({scalar})"

    def ramp(self, e: Ramp) -> str:
        if e.base.lanes != 1 or e.stride.lanes != 1:
            raise CodegenError(f"ramp base and stride must be scalars: {e}")
        if not e.dtype.is_int or e.stride.dtype != e.dtype:
            raise CodegenError(f"ramp needs integer base and stride of one dtype: {e}")
        lane = lane_ctype(e.dtype)
        vt = self.ctx.vtype(lane, e.lanes)
        name = f"em_ramp_{tag(lane)}x{e.lanes}"
        step = self.binary_code("add", e.dtype, "base",
                                self.binary_code("mul", e.dtype, f"({lane})i", "stride"))
        self.hs.need(name, lambda: vector_builder(name, f"{lane} base, {lane} stride", vt, lane,
                                                  e.lanes, step))
        return f"{name}({self.expr(e.base)}, {self.expr(e.stride)})"

    def lanewise(self, op: str, result: DType, lanes: int, args: list[tuple[str, DType]],
                 scalar_code: Callable[[list[str]], str]) -> str:
        """A helper applying ``scalar_code`` lane by lane; returns the call."""
        rt = self.ctx.vtype_of(result, lanes)
        arg_sig = "".join(f"_{d}" for _, d in args if d != result)
        name = f"em_{op.replace('.', '_')}_{result}x{lanes}{arg_sig}"
        params = [f"{self.ctx.vtype_of(d, lanes)} a{k}" for k, (_, d) in enumerate(args)]
        if name not in self.hs:
            body = scalar_code([f"a{k}[i]" for k in range(len(args))])
            self.hs.need(name, lambda: vector_builder(name, ", ".join(params), rt,
                                                      lane_ctype(result), lanes, body))
        return f"{name}({', '.join(code for code, _ in args)})"

    def to_bool(self, mask_code: str, lanes: int) -> str:
        """A vector comparison result (0/-1 lanes) as a bool vector (0/1 lanes)."""
        bt = self.ctx.vtype_of(DType.BOOL, lanes)
        return f"(__builtin_convertvector({mask_code}, {bt}) & 1)"

    def vector(self, e: Expr) -> str:
        n = e.lanes
        if isinstance(e, Binary):
            self._check_operands(e)
            return self.vector_binary(e.op, e.a.dtype, self.vec(e.a, n), self.vec(e.b, n), n)
        if isinstance(e, Unary):
            return self.vector_unary(e.op, e.a.dtype, self.vec(e.a, n), n)
        if isinstance(e, Select):
            return self.vector_select(e)
        if isinstance(e, Cast):
            return self.vector_cast(e.dtype, e.value.dtype, self.vec(e.value, n), n)
        if isinstance(e, Call):
            return self.call(e)
        raise CodegenError(f"unknown vector expression {type(e).__name__}: {e!r}")

    def vector_binary(self, op: str, dtype: DType, a: str, b: str, n: int) -> str:
        if op in COMPARISONS:
            return self.to_bool(f"(({a}) {_CMP[op]} ({b}))", n)
        if dtype is DType.BOOL and op in _BOOL_OPS:
            return f"(({a}) {_BOOL_OPS[op]} ({b}))"
        if dtype.is_float and op in _ARITH:
            code = f"(({a}) {_ARITH[op]} ({b}))"
            if dtype not in NARROW_FLOATS:
                return code
            return self.lanewise("rnd", dtype, n, [(code, dtype)],
                                 lambda xs: H.round_narrow(self.hs, dtype, xs[0]))
        if dtype.is_int and op in ("add", "sub", "mul"):
            return self._unsigned_op(dtype, n, f"({{0}}) {_ARITH[op]} ({{1}})", a, b)
        if dtype.is_int and op in _BITWISE:
            return f"(({a}) {_BITWISE[op]} ({b}))"
        result = DType.BOOL if op in ("and", "or") else dtype
        return self.lanewise(op, result, n, [(a, dtype), (b, dtype)],
                             lambda xs: self.binary_code(op, dtype, *xs))

    def _unsigned_op(self, dtype: DType, n: int, template: str, *operands: str) -> str:
        """Integer vector arithmetic on the unsigned twin type (wraps, never overflows)."""
        if not dtype.is_signed:
            return "(" + template.format(*operands) + ")"
        ut = self.ctx.vtype(unsigned_lane(lane_ctype(dtype)), n)
        vt = self.ctx.vtype_of(dtype, n)
        return f"(({vt})({template.format(*(f'({ut})({x})' for x in operands))}))"

    def vector_unary(self, op: str, dtype: DType, a: str, n: int) -> str:
        if op == "not" or (op == "bitnot" and dtype is DType.BOOL):
            if dtype is DType.BOOL:
                return f"(({a}) ^ 1)"
            return self.to_bool(f"(({a}) == 0)", n)
        if op == "neg" and dtype.is_float:
            return f"(-({a}))"
        if op == "neg" and dtype.is_int:
            return self._unsigned_op(dtype, n, "-({0})", a)
        if op == "bitnot" and dtype.is_int:
            return f"(~({a}))"
        raise CodegenError(f"'{op}' is not defined on {dtype}")

    def vector_select(self, e: Select) -> str:
        n = e.lanes
        if e.cond.dtype is not DType.BOOL:
            raise CodegenError(f"select condition must be bool: {e}")
        a, b = self.vec(e.true_value, n), self.vec(e.false_value, n)
        if e.cond.lanes == 1:
            return f"(({self.expr(e.cond)}) ? ({a}) : ({b}))"
        lane = lane_ctype(e.dtype)
        vt, bt = self.ctx.vtype(lane, n), self.ctx.vtype_of(DType.BOOL, n)
        it = self.ctx.vtype(signed_lane(lane), n)
        name = f"em_select_{tag(lane)}x{n}"
        self.hs.need(name, lambda: (
            f"static inline {vt} {name}({bt} c, {vt} a, {vt} b) {{\n"
            f"  const {it} m = -__builtin_convertvector(c, {it});\n"
            f"  return ({vt})((m & ({it})a) | (~m & ({it})b));\n}}"))
        return f"{name}({self.expr(e.cond)}, {a}, {b})"

    def vector_cast(self, to: DType, frm: DType, x: str, n: int) -> str:
        if to == frm:
            return x
        if to is DType.BOOL:
            return self.to_bool(f"(({x}) != 0)", n)
        rounds = to in NARROW_FLOATS and frm is not DType.BOOL
        if rounds or (to.is_int and frm.is_float):  # rounding or saturation: lane by lane
            return self.lanewise("cast", to, n, [(x, frm)],
                                 lambda xs: self.cast_code(to, frm, xs[0]))
        to_lane, frm_lane = lane_ctype(to), lane_ctype(frm)
        if to_lane == frm_lane:  # e.g. f16 -> f32: the float value is already exact
            return x
        return f"__builtin_convertvector({x}, {self.ctx.vtype(to_lane, n)})"


class _Access:
    """Arguments and addressing of one vector load/store helper (see ExprEmitter._access)."""

    def __init__(self, pointer: str, element: str, suffix: str = ""):
        self.args = [pointer]
        self.params: list[str] = []
        self.element = element
        self.suffix = suffix
        self.guard = ""

    def add(self, arg: str, param: str) -> None:
        self.args.append(arg)
        self.params.append(param)

    @property
    def plain(self) -> bool:
        """Contiguous and unmasked: one memcpy."""
        return not self.params
