"""Traced sizes: compile once for every value of a symbolic dimension.

ember compiles for concrete shapes.  To let one build serve many sequence lengths, the
compiler runs on a *traced* size instead of a plain one: a :class:`TracedInt` is an ``int``
holding a sample value (the size of the call that triggered the build) and the expression it
stands for (``2*S + 1``).  Arithmetic on it (``+ - * // %``) gives traced results, so the
sizes, strides and loop extents that reach the generated C are printed as expressions of the
run-time dims (``em_dims[0]``), and every *decision* the compiler takes on it (a comparison,
a truth test) is recorded in the active :class:`SizeTrace` as a **guard**: the condition
under which the code is the same.  A later call whose dims satisfy every guard reuses the
build; one that does not gets a new build, and the failed guard says why.  This is the
approach of symbolic shapes with guards in PyTorch's Dynamo, applied to the whole ember
pipeline.

Some reads escape the trace: a size converted to a plain int (numpy shapes, ``range``) is
only the sample value.  The module therefore traces every build twice, at two samples that
satisfy the same guards, and keeps the build only when both give the same code and weights
(``ember.api``): a size read as a plain number would print differently in the two.

Expressions are small trees (:class:`SizeExpr`); they are evaluated in Python (guards,
output shapes, workspace size) and printed as C.  Division and remainder are floor
operations, as in Python; C prints them through ``EM_FLOORDIV``/``EM_FLOORMOD``.
"""

from __future__ import annotations

import contextvars
import math
import operator
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

# C identifier of the run-time dims array (``const int64_t *``), in the entry and in kernels.
DIMS_ARRAY = "em_dims"

_ARITHMETIC: dict[str, Callable[[int, int], int]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul,
    "//": operator.floordiv, "%": operator.mod,
}
_COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


@dataclass(frozen=True)
class SizeExpr:
    """``op`` is ``"sym"`` (args: index, name), ``"const"`` (args: value) or an arithmetic
    operator of :data:`_ARITHMETIC` over two SizeExprs."""

    op: str
    args: tuple

    @staticmethod
    def symbol(index: int, name: str) -> "SizeExpr":
        return SizeExpr("sym", (index, name))

    @staticmethod
    def const(value: int) -> "SizeExpr":
        return SizeExpr("const", (int.__int__(value),))

    @staticmethod
    def combine(op: str, a: "SizeExpr", b: "SizeExpr") -> "SizeExpr":
        """``a op b``, folding constants and the identities of 0 and 1."""
        if a.op == "const" and b.op == "const":
            return SizeExpr.const(_ARITHMETIC[op](a.args[0], b.args[0]))
        if op == "+" and a.is_const(0):
            return b
        if op in ("+", "-") and b.is_const(0):
            return a
        if op == "*" and (a.is_const(0) or b.is_const(0)):
            return SizeExpr.const(0)
        if op == "*" and a.is_const(1):
            return b
        if op in ("*", "//") and b.is_const(1):
            return a
        if op == "%" and b.is_const(1) or op in ("//", "%") and a.is_const(0):
            return SizeExpr.const(0)  # (0 // 0 would fail at run time; it is 0 here)
        if op == "//":
            return _divide_products(a, b)
        if op in ("+", "-"):
            return _sum(a, b, 1 if op == "+" else -1)
        return SizeExpr(op, (a, b))

    def is_const(self, value: int) -> bool:
        return self.op == "const" and self.args[0] == value

    @property
    def named_symbols(self) -> frozenset[tuple[int, str]]:
        """(index, name) of every symbol the expression reads."""
        if self.op == "sym":
            return frozenset((self.args,))
        if self.op == "const":
            return frozenset()
        return self.args[0].named_symbols | self.args[1].named_symbols

    @property
    def symbols(self) -> frozenset[int]:
        if self.op == "sym":
            return frozenset((self.args[0],))
        if self.op == "const":
            return frozenset()
        return self.args[0].symbols | self.args[1].symbols

    def evaluate(self, dims: tuple[int, ...] | list[int]) -> int:
        """The value for run-time ``dims`` (indexed like the trace's symbols)."""
        if self.op == "sym":
            return int(dims[self.args[0]])
        if self.op == "const":
            return self.args[0]
        a, b = self.args[0].evaluate(dims), self.args[1].evaluate(dims)
        if self.op in ("//", "%") and b == 0:
            raise ZeroDivisionError(f"{self} divides by zero")
        return _ARITHMETIC[self.op](a, b)

    def c_code(self) -> str:
        """The expression in C (``int64_t`` arithmetic over ``em_dims``)."""
        if self.op == "sym":
            return f"{DIMS_ARRAY}[{self.args[0]}]"
        if self.op == "const":
            value = self.args[0]
            return f"INT64_C({value})" if value >= 0 else f"(-INT64_C({-value}))"
        a, b = self.args[0].c_code(), self.args[1].c_code()
        if self.op == "//":
            return f"EM_FLOORDIV({a}, {b})"
        if self.op == "%":
            return f"EM_FLOORMOD({a}, {b})"
        return f"({a} {self.op} {b})"

    def __str__(self) -> str:
        if self.op == "sym":
            return str(self.args[1])
        if self.op == "const":
            return str(self.args[0])
        return f"({self.args[0]} {self.op} {self.args[1]})"


def _factors(expr: SizeExpr) -> tuple[int, list[SizeExpr]]:
    """``expr`` as a constant times a list of other factors (a product flattened)."""
    if expr.op == "const":
        return expr.args[0], []
    if expr.op != "*":
        return 1, [expr]
    left_coefficient, left = _factors(expr.args[0])
    right_coefficient, right = _factors(expr.args[1])
    return left_coefficient * right_coefficient, left + right


def _terms(expr: SizeExpr, sign: int, into: dict[SizeExpr | None, int]) -> None:
    """Add ``sign * expr`` to the linear combination ``into`` (term -> coefficient; the
    constant under None), a sum's terms each with its constant factor taken out."""
    if expr.op in ("+", "-"):
        _terms(expr.args[0], sign, into)
        _terms(expr.args[1], sign if expr.op == "+" else -sign, into)
        return
    coefficient, factors = _factors(expr)
    term = _product(1, sorted(factors, key=str)) if factors else None
    into[term] = into.get(term, 0) + sign * coefficient


def _sum(a: SizeExpr, b: SizeExpr, sign: int) -> SizeExpr:
    """``a + sign*b`` with like terms collected: ``0 - (0 - S)`` is ``S``, ``(S + 1) - 1``
    is ``S``; the same sum is always printed the same way."""
    terms: dict[SizeExpr | None, int] = {}
    _terms(a, 1, terms)
    _terms(b, sign, terms)
    constant = terms.pop(None, 0)
    result: SizeExpr | None = None
    # added terms first, then subtracted ones, each by name: one sum, one spelling
    ordered = sorted(((term, coefficient) for term, coefficient in terms.items() if coefficient),
                     key=lambda item: (item[1] < 0, str(item[0])))
    for term, coefficient in ordered:
        magnitude = _product(abs(coefficient), [term])
        if result is None and coefficient > 0:
            result = magnitude
        elif result is None:  # only subtracted terms: ``c - S``
            result, constant = SizeExpr("-", (SizeExpr.const(constant), magnitude)), 0
        else:
            result = SizeExpr("+" if coefficient > 0 else "-", (result, magnitude))
    if result is None:
        return SizeExpr.const(constant)
    if constant > 0:
        return SizeExpr("+", (result, SizeExpr.const(constant)))
    if constant < 0:
        return SizeExpr("-", (result, SizeExpr.const(-constant)))
    return result


def _product(coefficient: int, factors: list[SizeExpr]) -> SizeExpr:
    result = SizeExpr.const(coefficient)
    for factor in factors:
        result = SizeExpr.combine("*", result, factor)
    return result


def _cancel_common(a_factors: list[SizeExpr], b_factors: list[SizeExpr]) -> list[SizeExpr]:
    """Remove from ``a_factors`` (in place) each factor of ``b_factors`` it has; returns the
    factors of ``b`` that were not there."""
    kept = []
    for factor in b_factors:
        if factor in a_factors:
            a_factors.remove(factor)
        else:
            kept.append(factor)
    return kept


def _divide_products(a: SizeExpr, b: SizeExpr) -> SizeExpr:
    """``a // b`` with the factors common to both products cancelled: a Reshape's ``-1``
    divides the element count by the other dims, ``(2*S*32) // (2*S*16)``, which is the
    constant 2 (exactly, as rationals, whenever the divisor is not zero; at zero both sides
    divide by zero), and ``(S*32) // 32`` is ``S``.  What does not cancel stays a floor
    division."""
    a_coefficient, a_factors = _factors(a)
    b_coefficient, b_factors = _factors(b)
    kept = _cancel_common(a_factors, b_factors)
    cancelled = len(kept) < len(b_factors)
    # a constant divisor of the coefficient: (S*32) // 32 is S
    divides_coefficient = not b_factors and b_coefficient != 0 and \
        a_coefficient % b_coefficient == 0
    if b_coefficient == 0 or not (cancelled or divides_coefficient):
        return SizeExpr("//", (a, b))
    common = math.gcd(a_coefficient, b_coefficient)
    a_coefficient //= common
    b_coefficient //= common
    if b_coefficient < 0:
        a_coefficient, b_coefficient = -a_coefficient, -b_coefficient
    numerator = _product(a_coefficient, a_factors)
    if not kept and b_coefficient == 1:
        return numerator
    return SizeExpr("//", (numerator, _product(b_coefficient, kept)))


# C definitions of the floor operations the printed expressions use (Python semantics, so
# that a negative intermediate cannot make C's truncating division disagree with the trace).
C_HELPERS = """\
#ifndef EM_FLOORDIV
#define EM_FLOORDIV(a, b) ((a) / (b) - (((a) % (b) != 0) & (((a) < 0) != ((b) < 0))))
#define EM_FLOORMOD(a, b) ((a) - EM_FLOORDIV(a, b) * (b))
#endif
"""


@dataclass(frozen=True)
class Guard:
    """``lhs op rhs`` held when the build was traced; ``where`` is the compiler's line that
    decided on it (for the message of a failed guard)."""

    lhs: SizeExpr
    op: str
    rhs: SizeExpr
    where: str = field(compare=False, default="")

    def holds(self, dims: tuple[int, ...] | list[int]) -> bool:
        try:
            return _COMPARISONS[self.op](self.lhs.evaluate(dims), self.rhs.evaluate(dims))
        except (ZeroDivisionError, IndexError):  # (IndexError: a symbol of another trace)
            return False

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


@dataclass
class SizeTrace:
    """The symbols a build is traced over (name -> sample value) and the guards it recorded."""

    names: tuple[str, ...]
    samples: tuple[int, ...]
    guards: dict[Guard, Guard] = field(default_factory=dict)
    # compiler lines that read a traced size as a plain number (``int(size)``): the size is
    # compiled in there.  Not an error by itself (the value may only name something), but
    # the first place to look when two traces disagree.
    plain_reads: dict[str, SizeExpr] = field(default_factory=dict)
    # values computed from traced sizes (a Shape, the arithmetic on it), by graph value
    # name, as object arrays of traced ints.  The graph keeps their samples as int64
    # constants, which stay valid tensors; whoever reads such a constant for its meaning (a
    # Reshape's target, a Slice's ends) asks :func:`traced_value` first.
    values: dict[str, Any] = field(default_factory=dict)

    def symbol(self, name: str) -> "TracedInt":
        index = self.names.index(name)
        return TracedInt(self.samples[index], SizeExpr.symbol(index, name))

    def record(self, guard: Guard) -> None:
        if guard.lhs.symbols or guard.rhs.symbols:
            self.guards.setdefault(guard, guard)

    def owns(self, value: int) -> bool:
        """Whether a decision on ``value`` is this trace's to record: False for a size of
        another trace over the same names at another sample (one compared while the garbage
        collector drops its buffers would otherwise pin this trace to that sample).  A size
        over other names is recorded, and the build refused (``foreign_guard``)."""
        expr = getattr(value, "expr", None)
        if expr is None:
            return True
        try:
            if any(self.names[index] != name for index, name in expr.named_symbols):
                return True     # other names: recorded, and refused (``foreign_guard``)
            return expr.evaluate(self.samples) == int.__int__(value)
        except (IndexError, ZeroDivisionError):
            return True

    def foreign_guard(self) -> Guard | None:
        """A guard on a size of another trace (one kept from an earlier build, e.g. in a
        cache): the build would read that trace's dims, so it cannot be kept."""
        own = set(enumerate(self.names))
        for guard in self.guards:
            if not (guard.lhs.named_symbols | guard.rhs.named_symbols) <= own:
                return guard
        return None

    def failed_guard(self, dims: tuple[int, ...] | list[int]) -> Guard | None:
        """The first guard ``dims`` break, or None when the build serves them."""
        for guard in self.guards:
            if not guard.holds(dims):
                return guard
        return None


_ACTIVE: contextvars.ContextVar[SizeTrace | None] = contextvars.ContextVar(
    "ember_size_trace", default=None)


@contextmanager
def tracing(trace: SizeTrace) -> Iterator[SizeTrace]:
    """Record the guards of the decisions taken on traced sizes inside the block."""
    token = _ACTIVE.set(trace)
    try:
        yield trace
    finally:
        _ACTIVE.reset(token)


def active_trace() -> SizeTrace | None:
    return _ACTIVE.get()


def has_traced_dims(shape: Any) -> bool:
    """Whether a shape (or None) has a dim taken at run time: a value of that shape
    cannot be computed at compile time, numpy would give it the traced sample's size."""
    return any(is_traced(d) for d in shape or ())


def holds_traced(value: Any) -> bool:
    """Whether ``value`` is an object array with a traced size in it."""
    return getattr(value, "dtype", None) == object and any(is_traced(v) for v in value.flat)


def traced_value(name: str, value: Any) -> Any:
    """The value of graph value ``name`` with its traced sizes, when the active trace
    computed one; else ``value`` (its constant)."""
    trace = _ACTIVE.get()
    if trace is None:
        return value
    return trace.values.get(name, value)


def remember_traced(name: str, value: Any) -> None:
    """Keep ``value`` as the traced value of ``name`` when it holds traced sizes."""
    trace = _ACTIVE.get()
    if trace is not None and holds_traced(value):
        trace.values[name] = value


# The package's directory: guards name the line of ember that decided (not numpy's).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _where() -> str:
    """The innermost line of ember outside this module that decided (for guard messages);
    the innermost caller outside this module when no line of ember is on the stack."""
    frame = sys._getframe(2)
    outside = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path != __file__:
            if path.startswith(_PACKAGE):
                return f"{path[len(_PACKAGE):]}:{frame.f_lineno}"
            outside = outside or f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return outside or ""


def expr_of(value: int) -> SizeExpr:
    return value.expr if isinstance(value, TracedInt) else SizeExpr.const(value)


class TracedInt(int):
    """An int that remembers which expression of the symbolic dims it is (see module doc)."""

    expr: SizeExpr

    def __new__(cls, value: int, expr: SizeExpr) -> "TracedInt":
        self = super().__new__(cls, value)
        self.expr = expr
        return self

    # ------------------------------------------------------------------ arithmetic
    def _apply(self, other: Any, op: str, reflected: bool = False) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        value = _ARITHMETIC[op](int.__int__(a), int.__int__(b))
        expr = SizeExpr.combine(op, expr_of(a), expr_of(b))
        return value if expr.op == "const" else TracedInt(value, expr)

    def __add__(self, other: Any) -> Any:
        return self._apply(other, "+")

    def __radd__(self, other: Any) -> Any:
        return self._apply(other, "+", True)

    def __sub__(self, other: Any) -> Any:
        return self._apply(other, "-")

    def __rsub__(self, other: Any) -> Any:
        return self._apply(other, "-", True)

    def __mul__(self, other: Any) -> Any:
        return self._apply(other, "*")

    def __rmul__(self, other: Any) -> Any:
        return self._apply(other, "*", True)

    def __floordiv__(self, other: Any) -> Any:
        return self._apply(other, "//")

    def __rfloordiv__(self, other: Any) -> Any:
        return self._apply(other, "//", True)

    def __mod__(self, other: Any) -> Any:
        return self._apply(other, "%")

    def __rmod__(self, other: Any) -> Any:
        return self._apply(other, "%", True)

    def __divmod__(self, other: Any) -> Any:
        quotient = self._apply(other, "//")
        return quotient if quotient is NotImplemented else (quotient, self._apply(other, "%"))

    def __rdivmod__(self, other: Any) -> Any:
        quotient = self._apply(other, "//", True)
        return quotient if quotient is NotImplemented else \
            (quotient, self._apply(other, "%", True))

    # operations whose results cannot stay traced read the sample (see ``__int__``)
    def __truediv__(self, other: Any) -> Any:
        return int(self) / other

    def __rtruediv__(self, other: Any) -> Any:
        return other / int(self)

    def __float__(self) -> float:
        return float(int(self))

    def __pow__(self, other: Any, modulo: Any = None) -> Any:
        return pow(int(self), other, modulo)

    def __neg__(self) -> Any:
        return TracedInt(-int.__int__(self), SizeExpr.combine("-", SizeExpr.const(0), self.expr))

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __pos__(self) -> "TracedInt":
        return self

    # ------------------------------------------------------------------ decisions
    def _decide(self, other: Any, op: str) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        result = _COMPARISONS[op](int.__int__(self), int.__int__(other))
        trace = _ACTIVE.get()
        if trace is not None and trace.owns(self) and trace.owns(other):
            recorded = op if result else _NEGATED[op]
            trace.record(Guard(self.expr, recorded, expr_of(other), _where()))
        return result

    def __eq__(self, other: Any) -> Any:
        return self._decide(other, "==")

    def __ne__(self, other: Any) -> Any:
        return self._decide(other, "!=")

    def __lt__(self, other: Any) -> Any:
        return self._decide(other, "<")

    def __le__(self, other: Any) -> Any:
        return self._decide(other, "<=")

    def __gt__(self, other: Any) -> Any:
        return self._decide(other, ">")

    def __ge__(self, other: Any) -> Any:
        return self._decide(other, ">=")

    def __bool__(self) -> bool:
        return bool(self._decide(0, "!="))

    __hash__ = int.__hash__

    def __int__(self) -> int:
        trace = _ACTIVE.get()
        if trace is not None:
            trace.plain_reads.setdefault(_where(), self.expr)
        return int.__int__(self)

    # ------------------------------------------------------------------ printing
    def __format__(self, spec: str) -> str:
        return self.expr.c_code() if not spec else format(int.__int__(self), spec)

    def __repr__(self) -> str:
        return f"{int.__int__(self)}<{self.expr}>"

    def __str__(self) -> str:
        return self.expr.c_code()

    def __deepcopy__(self, memo: dict) -> "TracedInt":
        return self

    def __copy__(self) -> "TracedInt":
        return self

    def __reduce__(self) -> tuple:
        return (TracedInt, (int.__int__(self), self.expr))


def size_class(value: int) -> int:
    """The size a heuristic (a blocking, a task count) should plan for: a plain size itself;
    for a traced one, the largest size of its class ``[2**k, 2**(k+1) - 1]``, with guards
    that keep later calls in that class.  Code planned for the top of the class must be
    correct for every size in it (loops run to the traced extent); it is tuned for the
    class, and a size outside it gets a build of its own.  (Classes start at powers of two
    because the compiler's thresholds do -- ``extent >= 16`` -- so that a threshold never
    cuts a class in two.)"""
    if not isinstance(value, TracedInt):
        return int(value)
    sample = int.__int__(value)
    low = 1 << (sample.bit_length() - 1) if sample > 0 else 0
    top = 2 * low - 1 if low else 0
    trace = _ACTIVE.get()
    if trace is not None:
        where = _where()
        trace.record(Guard(value.expr, "<=", SizeExpr.const(top), where))
        trace.record(Guard(value.expr, ">=", SizeExpr.const(low), where))
    return top


def class_bound(value: int) -> int:
    """A plain upper bound of a size over the classes of its symbols (see ``size_class``):
    its value with every symbol at the top of its class, with guards that each symbol stays
    in its class and that the size stays within the bound.  What a static memory plan
    reserves for a size that varies at run time: every call in the class fits."""
    if not isinstance(value, TracedInt):
        return int(value)
    trace = _ACTIVE.get()
    if trace is None:
        return int.__int__(value)
    tops = tuple(size_class(trace.symbol(name)) for name in trace.names)
    bound = max(value.expr.evaluate(tops), int.__int__(value))
    trace.record(Guard(value.expr, "<=", SizeExpr.const(bound), _where()))
    return bound


def may_be_nonzero(value: int) -> bool:
    """Whether code for ``value`` items must be emitted (a remainder loop, a tail): a traced
    value may be nonzero at run time whatever its sample, and such code runs zero times
    when it is not, so no guard is taken."""
    return isinstance(value, TracedInt) or value != 0


def plain(value: int) -> int:
    """The sample value of a possibly traced int, as a plain int (no guard)."""
    return int.__int__(value)


def exact_quotient(a: int, b: int) -> int | None:
    """``a / b`` when ``b`` divides ``a`` at every size a traced build can take, else None.

    Plain numbers divide as numbers.  With a traced operand the products are compared factor
    by factor (``32*S`` divided by ``16*S`` is 2, ``16*S`` by ``32`` is None whatever the
    sample), so nothing is decided on the sample and no guard is recorded.  A quotient that
    is a constant comes back as a plain int."""
    if not (isinstance(a, TracedInt) or isinstance(b, TracedInt)):
        a, b = int(a), int(b)
        return a // b if b != 0 and a % b == 0 else None
    a_coefficient, a_factors = _factors(expr_of(a))
    b_coefficient, b_factors = _factors(expr_of(b))
    if b_coefficient == 0 or a_coefficient % b_coefficient != 0 or \
            _cancel_common(a_factors, b_factors):
        return None
    if not a_factors:
        return a_coefficient // b_coefficient
    return TracedInt(int.__int__(a) // int.__int__(b),
                     _product(a_coefficient // b_coefficient, sorted(a_factors, key=str)))


def constant_factor(value: int) -> int:
    """The constant a size is a multiple of by its form (``32`` of ``32*S*N``, ``1`` of
    ``S + 1``); a plain number is its own."""
    return _factors(value.expr)[0] if isinstance(value, TracedInt) else int(value)


def evaluate_dims(values: Mapping[str, int] | None, trace: SizeTrace) -> tuple[int, ...]:
    """The dims tuple of ``trace`` from symbol values by name."""
    values = values or {}
    return tuple(int(values[name]) for name in trace.names)


def is_traced(value: Any) -> bool:
    return isinstance(value, TracedInt)


def as_size(value: Any) -> int:
    """``value`` as a size: a traced one stays traced, anything else becomes an ``int``."""
    return value if isinstance(value, TracedInt) else int(value)


__all__ = ["C_HELPERS", "DIMS_ARRAY", "Guard", "SizeExpr", "SizeTrace", "TracedInt",
           "active_trace", "as_size", "class_bound", "constant_factor", "size_class", "evaluate_dims",
           "exact_quotient",
           "expr_of", "is_traced", "may_be_nonzero", "plain", "tracing"]
