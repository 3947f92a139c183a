"""C11 code generation: C translation units from loop-IR kernels.

ember compiles a model into one native shared library; this module writes its source.  The
compile pipeline gives a :class:`CModule` -- the kernels (PrimFuncs), C source of its own that
is appended verbatim (the entry point, calling kernels by :func:`kernel_symbol`) and the names
to export -- and :func:`generate_c` returns the source as one translation unit, which
``ember.toolchain`` compiles.  :func:`generate_units` writes one unit per distinct kernel plus
an entry unit instead, named so that equal kernels share a unit: the toolchain compiles them
in parallel, caches each and links them into the library.

Why C: every platform has a C compiler, GCC and Clang vectorize and schedule well, and C is
auditable.  The price is that C is full of undefined behaviour; the generated code has none:
integer arithmetic goes through helpers with defined results (see :mod:`c_helpers`), shifts
and divisions are total, float->int conversions saturate, f16/bf16 round to nearest even,
vector loads/stores go through ``memcpy`` (no alignment or aliasing assumptions beyond those
stated below).  It uses two GNU C extensions that GCC and Clang share: vector types
(``vector_size``) and ``__builtin_*`` functions.

The C ABI of a generated module:

* kernel ``f(params)`` -> ``static void f(...)`` (or exported, if named in ``exports``), C name
  :func:`kernel_symbol` (the IR name when it is a valid, unreserved identifier); parameters in
  PrimFunc order: a Buffer is ``T* restrict`` (``const T* restrict`` when the kernel only reads
  it) of the storage type :func:`storage_ctype`, a Var is a value of the storage type;
* storage types: f32 ``float``, f64 ``double``, f16/bf16 ``uint16_t`` (IEEE binary16 /
  bfloat16 bits), iN ``intN_t``, uN ``uintN_t``, bool ``uint8_t`` (0/1; any non-zero reads true);
* global buffers are assumed aligned to ``Buffer.align`` bytes (``__builtin_assume_aligned``),
  except the parameters listed by the PrimFunc attr ``("element_aligned", (positions...))``,
  which may sit at any address their element type allows (a model's inputs: a caller's array
  is used where it lies, not copied to an aligned one); distinct buffer parameters must not
  overlap (``restrict``; a PrimFunc attr ``("noalias", False)`` drops it);
* exported ``void ember_set_num_threads(int n)`` (n <= 0: the CPUs the process may use),
  ``int ember_get_num_threads(void)`` and ``int ember_thread_stats(int64_t *out, int n)``
  control and count PARALLEL loops, which run on ember's own thread pool (see
  :mod:`c_threads`);
* ``EMBER_EXPORT`` marks exported definitions; compile with ``-fvisibility=hidden`` so nothing
  else is exported.

Loops: a PARALLEL loop's body becomes a static function of a range of iterations (its free
names passed in a struct, by value) that the kernel hands to ``em_parallel_for``: the pool
runs it in chunks on the calling thread and its workers; VECTORIZED asserts independent
iterations to the compiler (``GCC ivdep`` / ``clang loop vectorize(assume_safety)``), as the
IR's schedule promised; UNROLLED is ``#pragma GCC unroll`` (the constant extent, or the
loop's ``unroll`` annotation, else 8).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ember.core.target import Target
from ember.core.traced import C_HELPERS as TRACED_SIZE_HELPERS, DIMS_ARRAY
from ember.codegen.c_expr import ExprEmitter, ModuleContext
from ember.codegen.c_fast_math import UNIT_FLAGS as FAST_FLOAT_UNIT_FLAGS, uses_fast_float
from ember.codegen.c_gemm import emit_gemm, gemm_buffers, shared_gemm_unit
from ember.codegen.c_names import Names, c_comment, c_identifier
from ember.codegen.c_threads import (POOL_DECLARATIONS, POOL_FEATURES, POOL_INCLUDES,
                                     POOL_SOURCE, THREAD_FUNCTIONS)
from ember.codegen.c_types import CodegenError, compute_ctype, storage_ctype
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Call, Const, Expr, Load, Var
from ember.ir.loop.functor import walk
from ember.ir.loop.stmt import (Allocate, Evaluate, For, ForKind, Gemm, IfThenElse, LetStmt,
                                PrimFunc, Seq, Stmt, Store)
from ember.ir.loop.verifier import verify_func

DEFAULT_MAX_STACK_BYTES = 1 << 20
_UNROLL_DEFAULT = 8
_MAX_UNROLL = 64


@dataclass
class CModule:
    """Everything one shared library is generated from.

    ``kernels`` become C functions; ``extra_source`` is appended after them verbatim (it may
    call kernels by :func:`kernel_symbol` and use every ``em_*`` helper); ``exports`` names the
    symbols the library exports: kernels (by IR or C name) and functions that ``extra_source``
    defines with ``EMBER_EXPORT``.  ``max_stack_bytes`` bounds the ``local`` buffers live at
    once in a kernel (they live on the stack; bigger scratch belongs in an arena buffer).
    """

    kernels: list[PrimFunc]
    target: Target
    extra_source: str = ""
    exports: Sequence[str] = ()
    max_stack_bytes: int = DEFAULT_MAX_STACK_BYTES


def kernel_symbol(func: PrimFunc | str) -> str:
    """The C name of a kernel."""
    return c_identifier(func if isinstance(func, str) else func.name)


def generate_c(module: CModule) -> str:
    """The complete C11 (+ GNU vector extensions) source of ``module``."""
    symbols = [kernel_symbol(k) for k in module.kernels]
    duplicates = sorted({s for s in symbols if symbols.count(s) > 1})
    if duplicates:
        raise CodegenError(f"kernel names collide in C: {duplicates}")
    exported = _check_exports(module, symbols)
    ctx = ModuleContext(module.target)
    reserved = set(symbols) | set(THREAD_FUNCTIONS)  # beside c_names.RESERVED_NAMES
    kernels = []
    for func, symbol in zip(module.kernels, symbols):
        verify_func(func)
        emitter = _KernelEmitter(ctx, func, reserved, module.max_stack_bytes)
        kernels.append(emitter.emit(symbol, symbol in exported))
    parts = [_prelude(module.target, ctx, entry=True), POOL_SOURCE, *kernels]
    if module.extra_source:
        parts.append("/* ---- pipeline source ---- */\n" + module.extra_source.rstrip() + "\n")
    return "\n\n".join(p.rstrip() for p in parts if p) + "\n"


KERNEL_UNIT_PREFIX = "ember_k_"
_UNIT_PLACEHOLDER = "ember_kernel_unit_symbol"


@dataclass(frozen=True)
class KernelUnit:
    """One kernel as a C translation unit of its own.

    The unit defines the kernel as ``symbol``: ``ember_k_`` and a digest of the unit's text,
    which depends on the kernel's code only (not its IR name), so kernels with the same code,
    in one model or in several, are one unit, compiled once and cached once."""

    symbol: str
    source: str
    # compiler flags this unit needs beyond the module's (see c_fast_math.UNIT_FLAGS)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class CUnits:
    """A module as separately compiled translation units (see :func:`generate_units`).

    ``entry`` holds the thread controls and ``extra_source``, and declares every kernel under
    its :func:`kernel_symbol` name bound to the symbol of its unit (``links``)."""

    entry: str
    kernels: tuple[KernelUnit, ...]
    links: dict[str, str]

    def sources(self) -> list[str]:
        """Every unit's source, the entry's first."""
        return [self.entry, *(unit.source for unit in self.kernels)]

    def flagged_sources(self) -> list[tuple[str, tuple[str, ...]]]:
        """Every unit's source with the extra compiler flags it needs, the entry's first."""
        return [(self.entry, ()), *((unit.source, unit.flags) for unit in self.kernels)]

    def listing(self) -> str:
        """All units in one text, for readers (it is not one valid translation unit)."""
        return "\n".join(f"/* ==== translation unit {n} ==== */\n{source}"
                         for n, source in enumerate(self.sources()))


@dataclass(frozen=True)
class KernelUnitOf:
    """A kernel's unit, with the prototype the entry unit declares it by (its readable
    name bound to the unit's symbol)."""

    unit: KernelUnit
    prototype: str
    # units it calls into (the shared GEMM micro-kernels), linked with it
    shared: tuple[KernelUnit, ...] = ()


def kernel_unit(func: PrimFunc, target: Target,
                max_stack_bytes: int = DEFAULT_MAX_STACK_BYTES) -> KernelUnitOf:
    """The translation unit of one kernel.  It depends on the kernel alone, so a caller may
    make it -- and start compiling it -- as soon as the kernel is final, before the others
    (see ``ember.driver.pipeline``)."""
    verify_func(func)
    ctx = ModuleContext(target, shared_gemm=True)
    emitter = _KernelEmitter(ctx, func, {_UNIT_PLACEHOLDER, *THREAD_FUNCTIONS}, max_stack_bytes)
    kernel = emitter.emit(_UNIT_PLACEHOLDER, exported=False, linkage="EMBER_INTERNAL ")
    parts = [_prelude(target, ctx), POOL_DECLARATIONS, kernel]
    if "EM_FLOOR" in kernel:  # sizes of a build traced over run-time dims
        parts.insert(1, TRACED_SIZE_HELPERS)
    text = "\n\n".join(parts) + "\n"
    link = KERNEL_UNIT_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    flags = FAST_FLOAT_UNIT_FLAGS if uses_fast_float(ctx.helpers) else ()
    prototype = (f'EMBER_INTERNAL void {kernel_symbol(func)}({emitter.param_decls}) '
                 f'__asm__("{link}");')
    shared = tuple(_shared_gemm_unit(target, *tile) for tile in sorted(ctx.shared_gemm_tiles))
    return KernelUnitOf(KernelUnit(link, text.replace(_UNIT_PLACEHOLDER, link), flags),
                        prototype, shared)


def _shared_gemm_unit(target: Target, vectors: int, lanes: int, mr: int) -> KernelUnit:
    text = shared_gemm_unit(_prelude(target, ModuleContext(target)), vectors, lanes, mr)
    return KernelUnit("ember_gemm_shared_" + hashlib.sha256(text.encode()).hexdigest()[:32],
                      text)


def generate_units(module: CModule,
                   made: Sequence[tuple[PrimFunc, KernelUnitOf]] = ()) -> CUnits:
    """``module`` as one translation unit per distinct kernel plus the entry unit.

    Units compile in parallel and are cached one by one, so a model builds as fast as its
    biggest kernel on enough cores and a rebuild compiles only the kernels that changed.
    Kernels are internal to the library (hidden visibility): ``exports`` may name only
    functions of ``extra_source``.  ``made`` pairs kernels with the units
    :func:`kernel_unit` already made of them; a kernel that is not (the same object) in it
    gets its unit made here."""
    symbols = [kernel_symbol(k) for k in module.kernels]
    duplicates = sorted({s for s in symbols if symbols.count(s) > 1})
    if duplicates:
        raise CodegenError(f"kernel names collide in C: {duplicates}")
    if _check_exports(module, symbols):
        raise CodegenError("a kernel compiled in a unit of its own cannot be exported; use "
                           "generate_c for a single translation unit")
    units: dict[str, KernelUnit] = {}
    links: dict[str, str] = {}
    prototypes = []
    known = {id(func): (func, of) for func, of in made}  # the pairs keep their ids alive
    for func, name in zip(module.kernels, symbols):
        pair = known.get(id(func))
        of = pair[1] if pair is not None and pair[0] is func else \
            kernel_unit(func, module.target, module.max_stack_bytes)
        units.setdefault(of.unit.symbol, of.unit)
        for shared in of.shared:
            units.setdefault(shared.symbol, shared)
        links[name] = of.unit.symbol
        prototypes.append(of.prototype)
    declarations = ("/* ---- kernels, each compiled in a unit of its own ---- */\n" +
                    "\n".join(prototypes)) if prototypes else ""
    parts = [_prelude(module.target, ModuleContext(module.target), entry=True), POOL_SOURCE,
             declarations]
    if module.extra_source:
        parts.append("/* ---- pipeline source ---- */\n" + module.extra_source.rstrip() + "\n")
    entry = "\n\n".join(p.rstrip() for p in parts if p) + "\n"
    return CUnits(entry, tuple(units.values()), links)


def _check_exports(module: CModule, symbols: list[str]) -> set[str]:
    """The kernel symbols to export; every other export must be defined by extra_source."""
    by_name = {k.name: s for k, s in zip(module.kernels, symbols)} | {s: s for s in symbols}
    kernel_exports = set()
    for name in module.exports:
        if name in by_name:
            kernel_exports.add(by_name[name])
        elif name not in THREAD_FUNCTIONS and not re.search(
                rf"\bEMBER_EXPORT\b[^;{{}}]*\b{re.escape(name)}\s*\(", module.extra_source):
            raise CodegenError(
                f"export '{name}' is neither a kernel nor defined in extra_source as "
                f"'EMBER_EXPORT <type> {name}(...)'")
    return kernel_exports


_INCLUDES = ("stdbool.h", "stddef.h", "stdint.h", "stdlib.h", "string.h", "math.h",
             "stdatomic.h")

def _prelude(target: Target, ctx: ModuleContext, entry: bool = False) -> str:
    """The head of a unit; the ``entry`` unit (which defines the thread pool) also gets the
    pool's feature macro and headers."""
    includes = [f"#include <{h}>" for h in _INCLUDES + tuple(sorted(ctx.headers))]
    return "\n".join([
        *([POOL_FEATURES] if entry else []),
        f"/* Generated by ember.codegen.c for target {c_comment(str(target))}.  Do not edit.",
        "   Compile as C11 with GNU extensions (gcc/clang), -fvisibility=hidden. */",
        *includes,
        *([POOL_INCLUDES] if entry else []),
        '#define EMBER_EXPORT __attribute__((visibility("default")))',
        '#define EMBER_INTERNAL __attribute__((visibility("hidden")))',
        "",
        "/* ---- vector types ---- */",
        *ctx.typedefs.values(),
        "",
        "/* ---- helpers ---- */",
        ctx.helpers.source(),
    ])


class _KernelEmitter:
    """Statements of one PrimFunc; names every binding uniquely (see c_names.Names)."""

    def __init__(self, ctx: ModuleContext, func: PrimFunc, reserved: set[str],
                 max_stack_bytes: int):
        self.ctx = ctx
        self.func = func
        self.names = Names(reserved)
        self.vars: dict[Var, str] = {}
        self.buffers: dict[Buffer, str] = {}
        self.max_stack_bytes = max_stack_bytes
        self.stack_bytes = 0
        self.lines: list[str] = []
        self.param_decls = ""
        self.exprs = ExprEmitter(ctx, self._var, self._buffer)
        # the functions PARALLEL loop bodies became, defined before the kernel
        self.outlined: list[str] = []
        self.symbol = ""
        self.written: set[Buffer] = set()
        self.restrict = ""
        self.assumed_align: dict[str, int] = {}  # C name -> alignment asserted

    def _var(self, v: Var) -> str:
        if v not in self.vars:
            raise CodegenError(f"variable '{v.name}' used out of scope in '{self.func.name}'")
        return self.vars[v]

    def _buffer(self, b: Buffer) -> str:
        if b not in self.buffers:
            raise CodegenError(f"buffer '{b.name}' is not visible in '{self.func.name}'")
        return self.buffers[b]

    # ------------------------------------------------------------------ function
    def emit(self, symbol: str, exported: bool, linkage: str | None = None) -> str:
        """The C definition of the kernel under ``symbol``.

        ``linkage`` is the definition's prefix; by default ``EMBER_EXPORT`` when ``exported``,
        else ``static``, and a comment names the IR function when ``symbol`` differs from it.
        With an explicit ``linkage`` the text depends on the kernel's structure only, not its
        IR name (see :func:`generate_units`).  :attr:`param_decls` holds the parameter
        declarations afterwards, for a caller in another translation unit."""
        func = self.func
        nodes = list(walk(func.body))
        written = {n.buffer for n in nodes if isinstance(n, Store)}
        used_buffers = {n.buffer for n in nodes if isinstance(n, (Load, Store))}
        for gemm in (n for n in nodes if isinstance(n, Gemm)):
            reads, writes = gemm_buffers(gemm)
            written |= writes
            used_buffers |= reads | writes
        used = {n for n in nodes if isinstance(n, Var)}
        restrict = " restrict" if func.attr("noalias", True) else ""
        self.symbol, self.written, self.restrict = symbol, written, restrict
        params, prologue = [], []
        element_aligned = set(func.attr("element_aligned", ()))
        for position, p in enumerate(func.params):
            if p in self.vars or p in self.buffers:
                raise CodegenError(f"parameter '{p.name}' of '{func.name}' appears twice")
            # the run-time dims array of a traced build keeps the name its sizes print with
            name = DIMS_ARRAY if isinstance(p, Buffer) and p.name == DIMS_ARRAY else \
                self.names.fresh(p.name)
            if isinstance(p, Buffer):
                self.buffers[p] = name
                const = "" if p in written else "const "
                params.append(f"{const}{storage_ctype(p.dtype)}*{restrict} {name}")
                if p.align > p.dtype.itemsize and p.align & (p.align - 1) == 0 and \
                        position not in element_aligned:
                    prologue.append(f"{name} = __builtin_assume_aligned({name}, {p.align});")
                    self.assumed_align[name] = p.align
                if p not in used_buffers:
                    prologue.append(f"(void){name};")
            else:
                self.vars[p] = name
                params.append(f"{storage_ctype(p.dtype)} {name}")
                if p not in used:
                    prologue.append(f"(void){name};")
                elif compute_ctype(p.dtype) != storage_ctype(p.dtype):  # f16, bf16, bool
                    self.vars[p] = self.names.fresh(p.name)
                    prologue.append(f"const {compute_ctype(p.dtype)} {self.vars[p]} = "
                                    f"{self.exprs.load_value(p.dtype, name)};")
        self.lines = [f"  {line}" for line in prologue]
        self.stmt(func.body, 1)
        self.param_decls = ", ".join(params) or "void"
        header = ""
        if linkage is None:
            linkage = "EMBER_EXPORT " if exported else "static "
            header = f"/* {c_comment(func.name)} */\n" if symbol != func.name else ""
        signature = f"{linkage}void {symbol}({self.param_decls})"
        body = signature + " {\n" + "\n".join(self.lines) + "\n}"
        return "\n\n".join([*self.outlined, header + body])

    # ------------------------------------------------------------------ statements
    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def stmt(self, s: Stmt, depth: int) -> None:
        e = self.exprs
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x, depth)
        elif isinstance(s, For):
            self.loop(s, depth)
        elif isinstance(s, Store):
            if s.value.dtype != s.buffer.dtype:
                raise CodegenError(f"store of {s.value.dtype} into {s.buffer}: {s}")
            self.line(depth, e.store(s.buffer, s.index, s.value, s.mask))
        elif isinstance(s, LetStmt):
            self.let(s, depth)
        elif isinstance(s, IfThenElse):
            if s.cond.lanes != 1:
                raise CodegenError(f"if condition must be a scalar: {s.cond}")
            self.line(depth, f"if ({e.expr(s.cond)}) {{")
            self.stmt(s.then_body, depth + 1)
            if s.else_body is not None:
                self.line(depth, "} else {")
                self.stmt(s.else_body, depth + 1)
            self.line(depth, "}")
        elif isinstance(s, Allocate):
            self.allocate(s, depth)
        elif isinstance(s, Evaluate):
            self.line(depth, self.evaluate(s.value))
        elif isinstance(s, Gemm):
            emit_gemm(self, s, depth)
        else:
            raise CodegenError(f"unknown statement {type(s).__name__}: {s!r}")

    def let(self, s: LetStmt, depth: int) -> None:
        if s.value.lanes != 1:
            raise CodegenError(f"let '{s.var.name}' binds a vector; a Var is a scalar: {s}")
        if s.value.dtype != s.var.dtype:
            raise CodegenError(f"let '{s.var.name}: {s.var.dtype}' bound to {s.value.dtype}")
        value = self.exprs.expr(s.value)
        with _Binding(self.vars, s.var, self.names.fresh(s.var.name)) as name:
            self.line(depth, f"const {compute_ctype(s.var.dtype)} {name} = {value};")
            self.stmt(s.body, depth)

    def allocate(self, s: Allocate, depth: int) -> None:
        buf = s.buffer
        if buf.scope != "local":
            raise CodegenError(f"Allocate of non-local buffer '{buf.name}'")
        nbytes = buf.nbytes
        if self.stack_bytes + nbytes > self.max_stack_bytes:
            raise CodegenError(
                f"local buffers of '{self.func.name}' need {self.stack_bytes + nbytes} bytes "
                f"of stack at '{buf.name}', over the limit of {self.max_stack_bytes}: "
                "allocate large scratch in a global (arena) buffer instead")
        self.stack_bytes += nbytes
        with _Binding(self.buffers, buf, self.names.fresh(buf.name)) as name:
            align = f" __attribute__((aligned({buf.align})))" if buf.align > 1 else ""
            self.line(depth, f"{storage_ctype(buf.dtype)} {name}[{max(buf.size, 1)}]{align};")
            self.stmt(s.body, depth)
        self.stack_bytes -= nbytes

    def evaluate(self, value: Expr) -> str:
        if isinstance(value, Call) and value.name == "prefetch":
            return self.prefetch(value)
        return f"(void)({self.exprs.expr(value)});"

    def prefetch(self, call: Call) -> str:
        target, *hints = call.args
        if not isinstance(target, Load) or target.lanes != 1 or len(hints) > 2 or \
                not all(isinstance(h, Const) for h in hints):
            raise CodegenError(f"prefetch takes a scalar load and constant rw/locality: {call}")
        address = f"&{self._buffer(target.buffer)}[{self.exprs.expr(target.index)}]"
        return f"__builtin_prefetch({', '.join([address] + [str(int(h.value)) for h in hints])});"

    def loop(self, s: For, depth: int) -> None:
        e = self.exprs
        for bound in (s.start, s.extent):
            if not bound.dtype.is_int or bound.lanes != 1:
                raise CodegenError(f"loop '{s.var.name}' bounds must be scalar integers")
        if not s.var.dtype.is_int:
            raise CodegenError(f"loop variable '{s.var.name}' must be an integer")
        dtype, ct = s.var.dtype, compute_ctype(s.var.dtype)
        start = e.cast_code(dtype, s.start.dtype, e.expr(s.start))
        extent = e.cast_code(dtype, s.extent.dtype, e.expr(s.extent))
        constant = isinstance(s.start, Const) and isinstance(s.extent, Const)
        if isinstance(s.start, Const) and s.start.value == 0:
            end = extent
        else:
            end = e.binary_code("add", dtype, start, extent)
        if not constant:  # bounds are evaluated once, on entry, whatever the body does
            end_name = self.names.fresh(f"{s.var.name}_end")
            self.line(depth, f"const {ct} {end_name} = {end};")
            end = end_name
        else:
            end = e.const(s.start.value + s.extent.value, dtype)
        if s.kind is ForKind.PARALLEL:
            self.parallel_ir_loop(s, depth, start, end)
            return
        for pragma in self._pragmas(s):
            self.lines.append(pragma)
        with _Binding(self.vars, s.var, self.names.fresh(s.var.name)) as var:
            self.line(depth, f"for ({ct} {var} = {start}; {var} < {end}; ++{var}) {{")
            self.stmt(s.body, depth + 1)
            self.line(depth, "}")

    def parallel_ir_loop(self, s: For, depth: int, start: str, end: str) -> None:
        """A PARALLEL loop of the IR: its iterations ``start .. end`` run on the pool."""
        ct = compute_ctype(s.var.dtype)
        first = self.names.fresh(f"{s.var.name}_first")
        count = self.names.fresh(f"{s.var.name}_count")
        self.line(depth, f"const int64_t {first} = (int64_t)({start});")
        self.line(depth, f"const int64_t {count} = (int64_t)({end}) - {first};")
        offset = self.names.fresh(f"{s.var.name}_offset")
        extra = {first: "int64_t"}

        def body(inner: int) -> None:
            with _Binding(self.vars, s.var, self.names.fresh(s.var.name)) as var:
                self.line(inner, f"const {ct} {var} = ({ct})({first} + {offset});")
                self.stmt(s.body, inner)

        self.parallel(depth, count, offset, body, chunk=0, extra=extra)

    def parallel(self, depth: int, count: str, index: str, body: Callable[[int], None],
                 chunk: int = 0, extra: dict[str, str] | None = None) -> None:
        """Emit ``for (int64_t index = 0; index < count; ++index) { body }`` as a loop run
        on the thread pool (:mod:`c_threads`): ``body(depth)`` emits the statements of one
        iteration, which become a static function of a range of iterations; every name of
        the enclosing scopes it uses (a scalar, or a buffer's pointer) reaches that function
        through a struct, by value.  ``chunk`` iterations are claimed at a time (0: the pool
        splits the loop into a few chunks per thread); ``extra`` declares C names the caller
        defined outside the IR's bindings (name -> C type)."""
        scope = self._scope() | (extra or {})
        outer, self.lines = self.lines, []
        body(2)
        inner_lines, self.lines = self.lines, outer
        used = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(inner_lines)))
        captured = [(name, ctype) for name, ctype in scope.items() if name in used]
        number = len(self.outlined)
        function = f"em_par{number}_{self.symbol}"
        fields = [f"  {ctype} {name};" for name, ctype in captured] or ["  char em_unused;"]
        unpack = []
        for name, ctype in captured:
            if ctype.endswith("*"):
                align = self.assumed_align.get(name)
                value = f"em_c->{name}" if align is None else \
                    f"__builtin_assume_aligned(em_c->{name}, {align})"
                unpack.append(f"  {ctype}{self.restrict} {name} = {value};")
            else:
                unpack.append(f"  const {ctype} {name} = em_c->{name};")
        self.outlined.append("\n".join([
            f"struct {function} {{", *fields, "};",
            f"static void {function}(void *em_context, int64_t em_begin, int64_t em_end) {{",
            f"  const struct {function} *em_c = (const struct {function} *)em_context;",
            *unpack,
            f"  for (int64_t {index} = em_begin; {index} < em_end; ++{index}) {{",
            *inner_lines,
            "  }",
            "}"]))
        values = ", ".join(f".{name} = {name}" for name, _ in captured) or "0"
        context = f"em_par{number}"
        self.line(depth, f"{{ /* parallel: {function} */")
        self.line(depth + 1, f"struct {function} {context} = {{{values}}};")
        self.line(depth + 1, f"em_parallel_for({function}, &{context}, {count}, {chunk});")
        self.line(depth, "}")

    def _scope(self) -> dict[str, str]:
        """The C names bound at this point of the kernel, with their C types (a buffer's is
        its pointer type, const when the kernel never writes it)."""
        scope = {name: compute_ctype(var.dtype) for var, name in self.vars.items()}
        for buffer, name in self.buffers.items():
            const = "" if buffer in self.written else "const "
            scope[name] = f"{const}{storage_ctype(buffer.dtype)} *"
        return scope


    @staticmethod
    def _pragmas(s: For) -> list[str]:
        if s.kind is ForKind.VECTORIZED:
            # (an "unroll" annotation keeps GCC from unrolling the loop before it vectorizes:
            # a loop of one vector's length, unrolled, left GCC vectorizing the loop around
            # it instead, through transposes)
            keep = ["#pragma GCC unroll 1"] if dict(s.annotations).get("unroll") == 1 else []
            return ["#if defined(__clang__)", "#pragma clang loop vectorize(assume_safety)",
                    "#elif defined(__GNUC__)", "#pragma GCC ivdep", *keep, "#endif"]
        if s.kind is ForKind.UNROLLED:
            factor = dict(s.annotations).get("unroll")
            if factor is None:
                factor = s.extent.value if isinstance(s.extent, Const) else _UNROLL_DEFAULT
            return [f"#pragma GCC unroll {max(1, min(int(factor), _MAX_UNROLL))}"]
        return []


class _Binding:
    """Bind ``key`` to a C name in a scope dict for the duration of a ``with`` block."""

    _MISSING = object()

    def __init__(self, scope: dict, key: object, name: str):
        self.scope, self.key, self.name = scope, key, name

    def __enter__(self) -> str:
        self.saved = self.scope.get(self.key, self._MISSING)
        self.scope[self.key] = self.name
        return self.name

    def __exit__(self, *exc: object) -> None:
        if self.saved is self._MISSING:
            del self.scope[self.key]
        else:
            self.scope[self.key] = self.saved
