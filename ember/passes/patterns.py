"""A small matcher for patterns of ops, shared by the passes that recognize composites.

A pattern is a tree built from four kinds of leaves and nodes::

    x = Value("x")                                   # any value; the same name, the same value
    half = Constant("half", scalar(0.5))             # a constant (initializers and ONNX
                                                     # Constant nodes both are, once imported)
    p = Op("Mul", x, Op("Sigmoid", x), name="gate")  # an op applied to sub-patterns
    q = AnyOf(p, Op("Swish", x))                     # alternatives, tried in order

and two that absorb the freedom exporters take with arithmetic:

* :class:`Op` matches a two-input node of a commutative op (``OpDef.commutative``: Add, Mul,
  And, Equal ...) with its operands either way;
* :class:`Product` matches a tree of Mul (and Div by a constant) nodes in any association and
  order, as a list of factors and a scalar scale: ``Product(x, t, scale=0.5)`` matches
  ``0.5 * x * t``, ``(x * 0.5) * t``, ``x * (t * 0.5)``, ``x * t / 2`` and the like.

:func:`match` returns a :class:`Match`: the values, constants and nodes bound by name, and the
nodes the match covers.  A pattern matches no matter who else reads its intermediate values;
a pass that replaces the pattern's root by one node must also check that nothing outside reads
them (:meth:`Match.is_private`), or the values it removes would still be needed.

Scalars are constants of one element, whatever their rank ([], [1], [1, 1]); compared with a
tolerance of a few units in the last place of the constant's own type, since exporters write
``sqrt(2)`` or ``1/sqrt(2)`` rounded to float32 or float16.  A ``[1, 1, 1]`` scalar can
broadcast a result to a higher rank, so passes also check that the root has the type their
replacement will have.

:func:`rewrite_matches` drives a recognizer over the graph: it offers each candidate root node,
and replaces the nodes a returned :class:`Rewrite` covers by its new nodes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ops.registry import get_op
from ember.ir.types import TensorType
from ember.passes.rewrite import GraphIndex, same_type


class Pattern:
    """Base of the pattern kinds below."""


@dataclass(frozen=True)
class Value(Pattern):
    """Any value, bound to ``name``; a second occurrence of the name must be the same value."""

    name: str
    check: Callable[[GraphIndex, str], bool] | None = None


@dataclass(frozen=True)
class Constant(Pattern):
    """A compile-time constant accepted by ``check`` (an array predicate), bound to ``name``."""

    name: str | None = None
    check: Callable[[np.ndarray], bool] | None = None


@dataclass(frozen=True)
class Op(Pattern):
    """A node of op ``op`` (or one of several) whose inputs match ``inputs``.

    The node may have further inputs only if they are empty (absent optional inputs).
    ``attrs`` is a predicate on the node's attributes with defaults filled in.  A ``name``
    binds the node; a second occurrence of the name must be the same node (a value read twice
    inside a pattern, such as the ``exp(x)`` of a softmax).
    """

    op: str | tuple[str, ...]
    inputs: tuple[Pattern, ...]
    name: str | None = None
    attrs: Callable[[dict], bool] | None = None

    def __init__(self, op: str | tuple[str, ...], *inputs: Pattern, name: str | None = None,
                 attrs: Callable[[dict], bool] | None = None):
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "attrs", attrs)


@dataclass(frozen=True)
class AnyOf(Pattern):
    """The first of ``options`` that matches (each is tried, with backtracking)."""

    options: tuple[Pattern, ...]

    def __init__(self, *options: Pattern):
        object.__setattr__(self, "options", tuple(options))


@dataclass(frozen=True)
class Product(Pattern):
    """A product of ``factors`` (in any order and association) times a scalar ``scale``.

    The product is a tree of Mul nodes, and Div nodes whose divisor is a scalar constant;
    interior nodes are followed only while their output has one reader.  Scalar constant
    factors multiply into the scale, which must equal ``scale``; with ``scale=None`` any scale
    matches and is bound to ``scale_name`` (:attr:`Match.scales`).
    """

    factors: tuple[Pattern, ...]
    scale: float | None = 1.0
    scale_name: str | None = None

    def __init__(self, *factors: Pattern, scale: float | None = 1.0,
                 scale_name: str | None = None):
        object.__setattr__(self, "factors", tuple(factors))
        object.__setattr__(self, "scale", None if scale is None else float(scale))
        object.__setattr__(self, "scale_name", scale_name)


@dataclass
class Match:
    """What a pattern bound: values, constants and nodes by name, and every node it covers."""

    root: str
    values: dict[str, str] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    covered: list[Node] = field(default_factory=list)
    scales: dict[str, float] = field(default_factory=dict)

    def copy(self) -> "Match":
        return Match(self.root, dict(self.values), dict(self.constants), dict(self.nodes),
                     list(self.covered), dict(self.scales))

    def cover(self, node: Node) -> "Match":
        result = self.copy()
        if all(n is not node for n in result.covered):
            result.covered.append(node)
        return result

    def is_private(self, index: GraphIndex) -> bool:
        """Whether only covered nodes read the covered nodes' outputs (the root's excepted),
        none of which is a graph output: replacing the root then removes them all."""
        for node in self.covered:
            for name in node.outputs:
                if name and name != self.root and not index.used_only_by(name, self.covered):
                    return False
        return True

    def scalar(self, name: str) -> float:
        return float(np.asarray(self.constants[name]).reshape(-1)[0])


def match(pattern: Pattern, index: GraphIndex, value: str) -> Match | None:
    """The first way ``pattern`` matches the computation of ``value``, or None."""
    return next(_match(pattern, index, value, Match(value)), None)


def match_float_map(pattern: Pattern, index: GraphIndex,
                    root: str) -> tuple[Match, TensorType] | None:
    """A match of ``pattern`` at ``root`` that one op ``root = Op(x)`` can replace: private
    (nothing else reads what it covers), with ``x`` a float tensor of ``root``'s type -- the
    shape of every composite recognized as a single op (GELU, SiLU, HardSwish, softmax).
    Returns the match and ``x``'s type."""
    found = match(pattern, index, root)
    if found is None or not found.is_private(index):
        return None
    x_type = index.tensor_type(found.values["x"])
    if x_type is None or not x_type.dtype.is_float or not same_type(index.type_of(root), x_type):
        return None
    return found, x_type


# ---------------------------------------------------------------------- predicates


def scalar_of(array: np.ndarray) -> float | None:
    """The value of a one-element numeric constant, else None."""
    array = np.asarray(array)
    if array.size != 1 or array.dtype == object or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(-1)[0])


def close_to(actual: float, expected: float, dtype: np.dtype | None = None) -> bool:
    """Equal up to a few units in the last place of ``dtype`` (float32 if not given)."""
    kind = np.dtype(dtype) if dtype is not None and np.dtype(dtype).kind == "f" else \
        np.dtype(np.float32)
    try:
        eps = float(np.finfo(kind).eps)
    except ValueError:
        eps = float(np.finfo(np.float32).eps)
    return math.isclose(actual, expected, rel_tol=8 * eps, abs_tol=8 * eps * 1e-3)


def scalar(expected: float) -> Callable[[np.ndarray], bool]:
    """A Constant check: a one-element constant close to ``expected``."""

    def check(array: np.ndarray) -> bool:
        value = scalar_of(array)
        return value is not None and close_to(value, expected, np.asarray(array).dtype)

    return check


def any_scalar(array: np.ndarray) -> bool:
    return scalar_of(array) is not None


def attr_equals(**expected) -> Callable[[dict], bool]:
    """An Op attrs check: each named attribute has the given value."""
    return lambda attrs: all(attrs.get(k) == v for k, v in expected.items())


# ---------------------------------------------------------------------- matching


def _match(pattern: Pattern, index: GraphIndex, value: str, m: Match) -> Iterator[Match]:
    if not value:
        return
    if isinstance(pattern, Value):
        bound = m.values.get(pattern.name)
        if bound is None:
            if pattern.check is None or pattern.check(index, value):
                result = m.copy()
                result.values[pattern.name] = value
                yield result
        elif bound == value:
            yield m
    elif isinstance(pattern, Constant):
        yield from _match_constant(pattern, index, value, m)
    elif isinstance(pattern, Op):
        yield from _match_op(pattern, index, value, m)
    elif isinstance(pattern, AnyOf):
        for option in pattern.options:
            yield from _match(option, index, value, m)
    elif isinstance(pattern, Product):
        yield from _match_product(pattern, index, value, m)
    else:
        raise TypeError(f"not a pattern: {pattern!r}")


def _match_constant(pattern: Constant, index: GraphIndex, value: str,
                    m: Match) -> Iterator[Match]:
    array = index.constant(value)
    if array is None or (pattern.check is not None and not pattern.check(array)):
        return
    if pattern.name is None:
        yield m
        return
    if pattern.name in m.values and m.values[pattern.name] != value:
        return
    result = m.copy()
    result.values[pattern.name] = value
    result.constants[pattern.name] = array
    yield result


def _match_op(pattern: Op, index: GraphIndex, value: str, m: Match) -> Iterator[Match]:
    node = index.producer.get(value)
    ops = (pattern.op,) if isinstance(pattern.op, str) else pattern.op
    if node is None or node.op not in ops or node.domain or node.outputs[0] != value:
        return
    if pattern.name is not None and pattern.name in m.nodes:
        if m.nodes[pattern.name] is node:
            yield m
        return
    count = len(pattern.inputs)
    if len(node.inputs) < count or any(node.inputs[count:]):
        return
    if pattern.attrs is not None:
        opdef = get_op(node.op)
        if opdef is None or not pattern.attrs(opdef.resolve_attrs(node)):
            return
    start = m.cover(node)
    if pattern.name is not None:
        start.nodes[pattern.name] = node
    orders = [node.inputs[:count]]
    if count == 2 and node.inputs[0] != node.inputs[1]:
        opdef = get_op(node.op)
        if opdef is not None and opdef.commutative:
            orders.append(node.inputs[1::-1])
    for inputs in orders:
        yield from _match_all(pattern.inputs, inputs, index, start)


def _match_all(patterns: tuple[Pattern, ...], values: list[str], index: GraphIndex,
               m: Match) -> Iterator[Match]:
    if not patterns:
        yield m
        return
    for first in _match(patterns[0], index, values[0], m):
        yield from _match_all(patterns[1:], values[1:], index, first)


# The most Mul/Div nodes a Product pattern walks through (the patterns' products have a few
# factors and scalar constants; a longer product is not theirs).
MAX_PRODUCT_NODES = 16


def _match_product(pattern: Product, index: GraphIndex, value: str,
                   m: Match) -> Iterator[Match]:
    flat = flatten_product(index, value, max_nodes=MAX_PRODUCT_NODES)
    if flat is None:
        return
    factors, scale, nodes = flat
    if pattern.scale is not None and not close_to(scale, pattern.scale,
                                                  _scale_dtype(index, value)):
        return
    if len(factors) != len(pattern.factors):
        return
    start = m
    if pattern.scale_name is not None:
        start = start.copy()
        start.scales[pattern.scale_name] = scale
    for node in nodes:
        start = start.cover(node)
    seen: set[tuple[str, ...]] = set()
    for order in itertools.permutations(factors):
        if order in seen:
            continue
        seen.add(order)
        yield from _match_all(pattern.factors, list(order), index, start)


def _scale_dtype(index: GraphIndex, value: str) -> np.dtype | None:
    vtype = index.tensor_type(value)
    return vtype.dtype.numpy if vtype is not None and vtype.dtype.is_float else None


def flatten_product(index: GraphIndex, value: str, max_nodes: int | None = None
                    ) -> tuple[list[str], float, list[Node]] | None:
    """``value`` as ``scale * factor_1 * ... * factor_n``: the non-scalar factors, the scale
    (product of the scalar constants, divisors inverted) and the Mul/Div nodes walked; None
    when the product spans more than ``max_nodes`` Mul/Div nodes (a pattern of a few factors
    cannot match it, and walking every long chain from every node would be quadratic).
    Iterative, factors in left-to-right order: a chain of any length walks without
    recursion."""
    factors: list[str] = []
    nodes: list[Node] = []
    scale = 1.0
    pending: list[tuple[str, bool]] = [(value, True)]
    while pending:
        name, top = pending.pop()
        constant = index.constant(name)
        if constant is not None and scalar_of(constant) is not None:
            scale *= scalar_of(constant)
            continue
        node = index.producer.get(name)
        if node is None or node.domain or node.op not in ("Mul", "Div") or \
                len(node.inputs) != 2 or (not top and index.sole_reader(name) is None):
            factors.append(name)
            continue
        if node.op == "Div":
            divisor = index.constant(node.inputs[1])
            value_of = scalar_of(divisor) if divisor is not None else None
            if not value_of:
                factors.append(name)
                continue
            scale /= value_of
            operands = [node.inputs[0]]
        else:
            operands = [node.inputs[0], node.inputs[1]]
        nodes.append(node)
        if max_nodes is not None and len(nodes) > max_nodes:
            return None
        pending.extend((operand, False) for operand in reversed(operands))
    return factors, scale, nodes


# ---------------------------------------------------------------------- rewriting


@dataclass
class Rewrite:
    """Replace the nodes ``match`` covers by ``nodes``, the last of which produces the root."""

    match: Match
    nodes: list[Node]


def rewrite_matches(graph: Graph, root_ops: Collection[str],
                    recognize: Callable[[GraphIndex, Node], Rewrite | None]) -> int:
    """Offer every node whose op is in ``root_ops`` to ``recognize`` and apply the rewrites it
    returns, in topological order; returns how many were applied.

    The new nodes take the root's place in the node list (their inputs are the pattern's
    leaves, all defined before it), the covered nodes go, and so do the types of the values
    only they produced.  ``recognize`` must check :meth:`Match.is_private` itself.
    """
    applied = 0
    gone: set[int] = set()
    index = GraphIndex(graph)
    for node in list(graph.nodes):
        if id(node) in gone or node.op not in root_ops or node.domain:
            continue
        rewrite = recognize(index, node)
        if rewrite is None:
            continue
        covered = {id(n) for n in rewrite.match.covered}
        root_producer = index.producer[rewrite.match.root]
        new_nodes: list[Node] = []
        for existing in graph.nodes:
            if existing is root_producer:
                new_nodes.extend(rewrite.nodes)
            if id(existing) not in covered:
                new_nodes.append(existing)
        graph.nodes = new_nodes
        for old in rewrite.match.covered:
            for name in old.outputs:
                if name and name != rewrite.match.root:
                    graph.types.pop(name, None)
        gone |= covered
        applied += 1
        index = GraphIndex(graph)
    return applied


__all__ = ["AnyOf", "Constant", "Match", "Op", "Pattern", "Product", "Rewrite", "Value",
           "any_scalar", "attr_equals", "close_to", "flatten_product", "match",
           "rewrite_matches", "scalar", "scalar_of"]
