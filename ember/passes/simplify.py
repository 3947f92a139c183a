"""Algebraic simplification: remove nodes that compute nothing, merge pairs that compose.

Exporters leave many nodes whose output equals their input: a Reshape to the shape the tensor
already has, a Transpose by the identity, a Cast to the type it already is, a Dropout at
inference, ``x * 1`` from a folded scale, a Squeeze undoing an Unsqueeze.  Each costs a kernel
launch and a copy through memory, and each hides the real producer of a value from the passes
that match patterns (composites, scale folding, fusion).  This pass removes them and composes
the pairs that reduce to one node:

=========================================  =================================================
``Identity(x)``, inference ``Dropout(x)``  ``x``
``Cast(x, to=type of x)``, ``CastLike``     ``x``
``Cast(Cast(x, T1), T2)``                  ``Cast(x, T2)`` when T1 holds every value of x
``Transpose(x, identity perm)``            ``x``
``Transpose(Transpose(x, p), q)``          ``Transpose(x, p[q])``
Reshape/Flatten/Squeeze/Unsqueeze chain    ``x`` when the shape is x's, else one Reshape
``Pad(x, zero pads)``                      ``x``
``Expand(x, s)``, ``Slice(x, ...)``         ``x`` when the result has x's shape (Slice: step 1)
``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``  ``x`` when the constant leaves x's shape and type
``x ** 1``, ``x and True``, ``x or False``  ``x`` likewise
``Concat(x)``                              ``x``
=========================================  =================================================

Only rewrites whose result is exactly the original's are made: types must be provably equal
(dtype and every dim; a broadcasting ``1`` that changes the shape is not a no-op), and a
double Cast merges only when its middle type represents every value of the source type, so
that converting directly gives the same value.  One IEEE subtlety is accepted: ``x + 0`` gives
``+0.0`` for ``x = -0.0`` where ``x`` stays ``-0.0``, which compares equal.

A removed node whose output is a graph output keeps that name by renaming its input's
producer (see :func:`ember.passes.rewrite.replace_value`); where even that is impossible
(the output is a graph input passed through) the node stays.
"""

from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from ember.core.dtypes import DType
from ember.ir.graph import Graph, Node
from ember.passes.dce import eliminate_dead_code, live_values
from ember.passes.rewrite import GraphIndex, remove_and_replace, rename_reads, same_type

# A rule looks at one node and either rewrites the graph (returning True) or returns False.
Rule = Callable[[Graph, GraphIndex, Node], bool]

_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def simplify(graph: Graph) -> int:
    """Apply the rules until none applies; returns how many rewrites were made.

    The nodes a rewrite bypasses (the inner Cast of a merged pair) are left without readers;
    dead-code elimination removes them at the end."""
    rewrites = 0
    progress = True
    while progress:
        progress = False
        index = _SweepIndex(graph)
        for node in list(graph.nodes):
            if id(node) in index.bypassed:
                continue
            rule = _RULES.get(node.op)
            index.maintained = False
            if rule is not None and not node.domain and rule(graph, index, node):
                rewrites += 1
                progress = True
                if not index.maintained:  # a rewrite the index does not follow: rebuild
                    index.drop_bypassed()
                    index = _SweepIndex(graph)
        index.drop_bypassed()
    if rewrites:
        eliminate_dead_code(graph)
    return rewrites


class _SweepIndex(GraphIndex):
    """The index of one sweep, kept up to date by :func:`_bypass` (the most common rewrite)
    instead of rebuilt after every rewrite (a rebuild per rewrite made the pass quadratic:
    a chain of 4,000 nodes with 500 removable Transpose pairs took most of a minute).
    Bypassed nodes leave the node list when the sweep ends or the index is rebuilt."""

    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.bypassed: set[int] = set()
        self.maintained = False

    def reroute(self, node: Node, old: str, new: str) -> None:
        """Make the readers of ``old`` (``node``'s first output) read ``new`` and forget
        ``node``, which no longer has readers."""
        readers = self.readers.pop(old, [])
        for reader in readers:
            reader.inputs = [new if name == old else name for name in reader.inputs]
            for sub in reader.subgraphs():
                rename_reads(sub, {old: new}, outputs=True)
        known = self.readers.setdefault(new, [])
        known.extend(r for r in readers if all(r is not k for k in known))
        for name in dict.fromkeys([n for n in node.inputs if n] + node.implicit_inputs()):
            held = self.readers.get(name)
            if held is not None:
                self.readers[name] = [r for r in held if r is not node]
        for name in node.outputs:
            if name and self.producer.get(name) is node:
                del self.producer[name]
        self.graph.types.pop(old, None)
        self.bypassed.add(id(node))
        self.maintained = True

    def retarget(self, node: Node, old: str, new: str) -> None:
        """Record that ``node``, which read ``old`` through one input, now reads ``new``."""
        held = self.readers.get(old)
        if held is not None:
            self.readers[old] = [r for r in held if r is not node]
        known = self.readers.setdefault(new, [])
        if all(r is not node for r in known):
            known.append(node)
        self.maintained = True

    def drop_bypassed(self) -> None:
        if self.bypassed:
            self.graph.nodes = [n for n in self.graph.nodes if id(n) not in self.bypassed]
            self.bypassed = set()


# ---------------------------------------------------------------------- helpers


def _bypass(graph: Graph, index: GraphIndex, node: Node, replacement: str) -> bool:
    """Remove ``node`` (whose first output equals ``replacement``) if nothing needs its other
    outputs (a Dropout mask read only by a dead Cast is not needed)."""
    extra = [o for o in node.outputs[1:] if o]
    if extra and any(o in live_values(graph) for o in extra):
        return False
    old = node.outputs[0]
    if isinstance(index, _SweepIndex) and old != replacement and \
            old not in graph.outputs and not extra:
        index.reroute(node, old, replacement)
        return True
    return remove_and_replace(graph, node, {old: replacement})


def _keeps_type(graph: Graph, node: Node, source: str) -> bool:
    """Whether ``node``'s first output has provably the type of ``source``."""
    return bool(node.outputs) and same_type(graph.types.get(node.outputs[0]),
                                            graph.types.get(source))


def _int_list(value: np.ndarray | None) -> list[int] | None:
    if value is None or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


# ---------------------------------------------------------------------- rules


def _identity(graph: Graph, index: GraphIndex, node: Node) -> bool:
    return _bypass(graph, index, node, node.inputs[0])


def _dropout(graph: Graph, index: GraphIndex, node: Node) -> bool:
    """Dropout at inference (training_mode absent or a constant false) is the identity."""
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = index.constant(node.inputs[2])
        if mode is None or mode.size != 1 or bool(mode.reshape(-1)[0]):
            return False
    return _bypass(graph, index, node, node.inputs[0])


def _cast(graph: Graph, index: GraphIndex, node: Node) -> bool:
    source = index.tensor_type(node.inputs[0])
    target = index.tensor_type(node.outputs[0])
    if source is None or target is None:
        return False
    if source.dtype == target.dtype and source.dtype != DType.STRING:
        return _keeps_type(graph, node, node.inputs[0]) and \
            _bypass(graph, index, node, node.inputs[0])
    inner = index.producer_of(node.inputs[0], "Cast")
    if node.op != "Cast" or inner is None or inner.domain:
        return False
    original = index.tensor_type(inner.inputs[0])
    if original is None or target.dtype == DType.STRING or \
            not lossless_cast(original.dtype, source.dtype):
        return False
    node.inputs = [inner.inputs[0]]
    return True


def lossless_cast(source: DType, middle: DType) -> bool:
    """Whether ``middle`` represents every value of ``source`` exactly, so that converting
    through ``middle`` gives what the direct conversion gives (conversions depend only on the
    value converted)."""
    if source == middle:
        return True
    excluded = (DType.STRING, DType.COMPLEX64, DType.COMPLEX128)
    if source in excluded or middle in excluded or middle == DType.FLOAT8E8M0:
        return False  # float8e8m0 has no zero and no sign
    if source == DType.BOOL:
        return True
    if middle == DType.BOOL:
        return False
    if middle.is_float and source.is_float:
        wide, narrow = ml_dtypes.finfo(middle.numpy), ml_dtypes.finfo(source.numpy)
        return (wide.nmant >= narrow.nmant and float(wide.max) >= float(narrow.max)
                and float(wide.smallest_subnormal) <= float(narrow.smallest_subnormal)
                and (_has_inf(middle) or not _has_inf(source)))
    if middle.is_float and source.is_int:
        exact = 2 ** (ml_dtypes.finfo(middle.numpy).nmant + 1)  # every integer up to this
        limits = ml_dtypes.iinfo(source.numpy)
        return -exact <= int(limits.min) and int(limits.max) <= exact
    if middle.is_int and source.is_int:
        wide_int, narrow_int = ml_dtypes.iinfo(middle.numpy), ml_dtypes.iinfo(source.numpy)
        return int(wide_int.min) <= int(narrow_int.min) and \
            int(narrow_int.max) <= int(wide_int.max)
    return False


def _has_inf(dtype: DType) -> bool:
    return bool(np.isinf(np.array(np.inf).astype(dtype.numpy)))


def _reshape_like(graph: Graph, index: GraphIndex, node: Node) -> bool:
    """A chain of pure reshapes is the identity or one Reshape."""
    source = node.inputs[0]
    if _keeps_type(graph, node, source):
        return _bypass(graph, index, node, source)
    inner = index.producer_of(source, *_RESHAPES)
    if inner is None or inner.domain:
        return False
    origin = inner.inputs[0]
    if _keeps_type(graph, node, origin):
        return _bypass(graph, index, node, origin)
    target = index.tensor_type(node.outputs[0])
    if target is None or not target.is_static:
        return False
    shape = graph.add_shape_constant(target.shape, hint=f"{node.name or 'reshape'}_shape")
    # allowzero: a 0 in the target is an empty dim, not "copy the input's dim"
    node.op, node.inputs = "Reshape", [origin, shape]
    node.attrs = {"allowzero": 1} if 0 in target.shape else {}
    return True


def _transpose(graph: Graph, index: GraphIndex, node: Node) -> bool:
    source = index.tensor_type(node.inputs[0])
    if source is None or source.shape is None:
        return False
    rank = len(source.shape)
    perm = _perm(node, rank)
    if perm == list(range(rank)):
        return _bypass(graph, index, node, node.inputs[0])
    inner = index.producer_of(node.inputs[0], "Transpose")
    if inner is None or inner.domain:
        return False
    inner_perm = _perm(inner, rank)
    if isinstance(index, _SweepIndex):
        index.retarget(node, node.inputs[0], inner.inputs[0])
    node.inputs = [inner.inputs[0]]
    node.attrs = {**node.attrs, "perm": [inner_perm[axis] for axis in perm]}
    return True


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attrs.get("perm")
    return [int(p) % rank for p in perm] if perm is not None else list(range(rank))[::-1]


def _pad(graph: Graph, index: GraphIndex, node: Node) -> bool:
    pads = _int_list(index.constant(node.inputs[1]))
    if pads is None or any(pads) or not _keeps_type(graph, node, node.inputs[0]):
        return False
    return _bypass(graph, index, node, node.inputs[0])


def _same_shape_result(graph: Graph, index: GraphIndex, node: Node) -> bool:
    """Expand to the shape x already has."""
    source = node.inputs[0]
    return _keeps_type(graph, node, source) and _bypass(graph, index, node, source)


def _slice(graph: Graph, index: GraphIndex, node: Node) -> bool:
    """A step-1 slice as long as the tensor along every axis takes the whole tensor."""
    if len(node.inputs) > 4 and node.inputs[4]:
        steps = _int_list(index.constant(node.inputs[4]))
        if steps is None or any(step != 1 for step in steps):
            return False
    source = index.tensor_type(node.inputs[0])
    if source is None or not source.is_static or not _keeps_type(graph, node, node.inputs[0]):
        return False
    return _bypass(graph, index, node, node.inputs[0])


# The constant operand that makes each binary op the identity, and on which sides it may be.
_NEUTRAL: dict[str, tuple[float | bool, tuple[int, ...]]] = {
    "Mul": (1, (0, 1)), "Add": (0, (0, 1)), "Sub": (0, (1,)), "Div": (1, (1,)),
    "Pow": (1, (1,)), "And": (True, (0, 1)), "Or": (False, (0, 1)),
}


def _neutral_operand(graph: Graph, index: GraphIndex, node: Node) -> bool:
    neutral, sides = _NEUTRAL[node.op]
    if len(node.inputs) != 2:
        return False
    for side in sides:
        value = index.constant(node.inputs[side])
        other = node.inputs[1 - side]
        if value is None or value.dtype == object or not value.size or \
                not np.all(value == neutral):
            continue
        if _keeps_type(graph, node, other):
            return _bypass(graph, index, node, other)
    return False


def _concat(graph: Graph, index: GraphIndex, node: Node) -> bool:
    if len(node.inputs) != 1 or not _keeps_type(graph, node, node.inputs[0]):
        return False
    return _bypass(graph, index, node, node.inputs[0])


_RULES: dict[str, Rule] = {
    "Identity": _identity,
    "Dropout": _dropout,
    "Cast": _cast,
    "CastLike": _cast,
    "Reshape": _reshape_like,
    "Flatten": _reshape_like,
    "Squeeze": _reshape_like,
    "Unsqueeze": _reshape_like,
    "Transpose": _transpose,
    "Pad": _pad,
    "Expand": _same_shape_result,
    "Slice": _slice,
    "Concat": _concat,
    **{op: _neutral_operand for op in _NEUTRAL},
}


__all__ = ["simplify", "lossless_cast"]
