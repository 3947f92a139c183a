"""Symbolic dimensions.

A dimension is either a plain ``int`` or a :class:`SymDim`: a polynomial with integer
coefficients over named symbols (``N``, ``2*N``, ``N*S + 1``).  That is enough to carry a
dynamic batch or sequence length through Reshape/Flatten/Concat/Slice arithmetic, which is what
real exported models need.  A result that is not a polynomial (``N // 3`` where 3 does not divide
``N``) becomes a fresh opaque symbol rather than a wrong answer.  ``None`` is an unknown dim.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Union

from ember.core.traced import exact_quotient, is_traced

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers; () is the constant term


@dataclass(frozen=True)
class SymDim:
    """A polynomial over symbol names; build with :func:`sym` and arithmetic operators."""

    terms: tuple[tuple[Monomial, int], ...]  # sorted, no zero coefficients

    # --------------------------------------------------------------- construction
    @staticmethod
    def _make(terms: dict[Monomial, int]) -> "Dim":
        cleaned = tuple(sorted((m, c) for m, c in terms.items() if c != 0))
        if not cleaned:
            return 0
        if len(cleaned) == 1 and cleaned[0][0] == ():
            return cleaned[0][1]
        return SymDim(cleaned)

    def _as_dict(self) -> dict[Monomial, int]:
        return dict(self.terms)

    # --------------------------------------------------------------- arithmetic
    def __add__(self, other: "Dim") -> "Dim":
        result = self._as_dict()
        for m, c in _terms_of(other).items():
            result[m] = result.get(m, 0) + c
        return SymDim._make(result)

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return SymDim._make({m: -c for m, c in self.terms})

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-_to_sym(other))

    def __rsub__(self, other: "Dim") -> "Dim":
        return _to_sym(other) + (-self)

    def __mul__(self, other: "Dim") -> "Dim":
        result: dict[Monomial, int] = {}
        for (m1, c1), (m2, c2) in itertools.product(self.terms, _terms_of(other).items()):
            m = tuple(sorted(m1 + m2))
            result[m] = result.get(m, 0) + c1 * c2
        return SymDim._make(result)

    __rmul__ = __mul__

    def __floordiv__(self, other: "Dim") -> "Dim":
        quotient = exact_divide(self, other)
        return quotient if quotient is not None else fresh_symbol("div")

    # --------------------------------------------------------------- queries
    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s in m)

    def evaluate(self, bindings: dict[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            value = c
            for s in m:
                value *= bindings[s]
            total += value
        return total

    def __str__(self) -> str:
        parts = []
        for m, c in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            factors = ([str(c)] if c != 1 or not m else []) + list(m)
            parts.append("*".join(factors) if c != -1 or not m else "-" + "*".join(m))
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self) -> str:
        return f"SymDim({self})"


Dim = Union[int, SymDim, None]

_fresh_counter = itertools.count()


def sym(name: str) -> SymDim:
    """The symbolic dimension named ``name``."""
    return SymDim(((((name,), 1),)))


def fresh_symbol(hint: str = "d") -> SymDim:
    """A new symbol no other dimension shares (for results ember cannot express)."""
    return sym(f"_{hint}{next(_fresh_counter)}")


def _to_sym(value: "Dim") -> SymDim:
    if isinstance(value, SymDim):
        return value
    return SymDim(((((), int(value)),)))


def _terms_of(value: "Dim") -> dict[Monomial, int]:
    return _to_sym(value)._as_dict() if isinstance(value, SymDim) else {(): int(value)}


def exact_divide(numerator: "Dim", denominator: "Dim") -> "Dim | None":
    """``numerator / denominator`` when it divides exactly as a polynomial, else None."""
    if isinstance(numerator, int) and isinstance(denominator, int):
        # sizes of a traced build divide as expressions when they can, with no guard
        quotient = exact_quotient(numerator, denominator)
        if quotient is not None or not (is_traced(numerator) or is_traced(denominator)):
            return quotient
        return numerator // denominator if denominator and numerator % denominator == 0 else None
    den = _terms_of(denominator)
    if len(den) != 1:
        return 1 if _terms_of(numerator) == den else None
    (dm, dc), = den.items()
    result: dict[Monomial, int] = {}
    for m, c in _terms_of(numerator).items():
        remaining = list(m)
        for s in dm:
            if s not in remaining:
                return None
            remaining.remove(s)
        if c % dc:
            return None
        result[tuple(remaining)] = c // dc
    return SymDim._make(result)


def single_symbol(dim: Dim) -> str | None:
    """The name of ``dim`` when it is one symbol alone (``N``, not ``2*N`` or ``N + 1``)."""
    if isinstance(dim, SymDim) and len(dim.terms) == 1:
        monomial, coefficient = dim.terms[0]
        if coefficient == 1 and len(monomial) == 1:
            return monomial[0]
    return None


def is_static(dim: Dim) -> bool:
    return isinstance(dim, int)


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True/False when provably equal/different, None when unknown."""
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = _to_sym(a) - _to_sym(b)
    if diff == 0:
        return True
    if isinstance(diff, int):
        return False
    # Symbols are sizes, never negative: N + 1 (a dim against -1, an exporter's "infer this
    # dim" marker) or 2*N + 3 cannot be zero when every coefficient has the constant's sign.
    coefficients = dict(diff.terms)
    constant = coefficients.get((), 0)
    if constant and all(c * constant > 0 for c in coefficients.values()):
        return False
    return None


def dim_product(dims) -> Dim:
    """Product of dims; None if any is unknown."""
    total: Dim = 1
    for d in dims:
        if d is None:
            return None
        total = total * d
    return total


def format_dim(dim: Dim) -> str:
    if dim is None:
        return "?"
    return str(dim)


def parse_dim(text: str) -> Dim:
    """Inverse of :func:`format_dim` for single symbols, ints and ``?`` (printed IR, JSON)."""
    text = text.strip()
    if text == "?":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    return _parse_polynomial(text)


def _parse_polynomial(text: str) -> Dim:
    total: Dim = 0
    for sign, chunk in _split_signed(text):
        term: Dim = sign
        for factor in chunk.split("*"):
            factor = factor.strip()
            term = term * (int(factor) if factor.lstrip("-").isdigit() else sym(factor))
        total = total + term
    return total


def _split_signed(text: str) -> list[tuple[int, str]]:
    pieces: list[tuple[int, str]] = []
    for token in text.replace(" - ", " + -").split(" + "):
        token = token.strip()
        if token.startswith("-"):
            pieces.append((-1, token[1:]))
        else:
            pieces.append((1, token))
    return pieces
