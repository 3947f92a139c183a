"""Common-subexpression elimination: compute each value once.

Two nodes compute the same value when they apply the same op (and domain) to the same inputs
with the same attributes (defaults filled in, so ``Softmax(x)`` and ``Softmax(x, axis=-1)``
agree).  Exported graphs are full of these: every attention layer recomputing
``Shape(x)[0]``, a mask broadcast once per layer, the same ``Transpose`` of a weight taken
by two readers.  The later node is removed and its readers read the earlier node's outputs.

Constants are deduplicated first, by value (dtype, shape and bytes, and in a traced build the
run-time sizes they stand for), so that nodes reading two copies of the same weight or scalar
compare equal too.  The two inputs of a node of a commutative op (``OpDef.commutative``: Add,
Mul, And, Or, Xor, Equal, the bitwise ones, and Sum and Mean of two inputs) are compared as a
set: IEEE addition and multiplication are commutative, so ``a + b`` and ``b + a`` are the
same value.

Never merged: ops that draw random numbers (``OpDef.random``: each call is a new sample), and
nodes with subgraphs unless the subgraphs are identical (same printed form, same
constants).
"""

from __future__ import annotations

from typing import Any, Hashable

import numpy as np

from ember.core.traced import expr_of, holds_traced, traced_value
from ember.ir.graph import Graph, Node
from ember.ir.printer import format_graph
from ember.ops.registry import get_op
from ember.passes.rewrite import remove_and_replace, rename_reads


def eliminate_common_subexpressions(graph: Graph) -> int:
    """Merge duplicate constants and nodes in place; returns how many were removed.

    One pass in graph order, linear in the graph: a duplicate's outputs join a mapping of
    pending renames that each later node applies to itself when it is visited (its key then
    sees the merged inputs), and the duplicates leave the node list at the end -- not one
    scan of the whole graph per merge.  A duplicate that produces a graph output keeps its
    name through :func:`remove_and_replace`, after the pending renames are applied."""
    removed = _merge_constants(graph)
    seen: dict[Hashable, Node] = {}
    pending: dict[str, str] = {}
    dropped: set[int] = set()

    def apply_pending() -> None:
        rename_reads(graph, pending)
        for old in pending:
            graph.types.pop(old, None)
        graph.nodes = [n for n in graph.nodes if id(n) not in dropped]
        pending.clear()
        dropped.clear()

    for node in list(graph.nodes):
        if pending:
            _rename_node_reads(node, pending)
        key = _node_key(node)
        if key is None:
            continue
        original = seen.get(key)
        if original is None:
            seen[key] = node
            continue
        replacements = {dup: orig for dup, orig in zip(node.outputs, original.outputs) if dup}
        if any(dup in graph.outputs for dup in replacements):
            apply_pending()
            if remove_and_replace(graph, node, replacements):
                removed += 1
            continue
        pending.update(replacements)
        dropped.add(id(node))
        removed += 1
    if pending or dropped:
        apply_pending()
    return removed


def _rename_node_reads(node: Node, mapping: dict[str, str]) -> None:
    """``node`` reading ``mapping[name]`` for ``name``, in its subgraphs too."""
    node.inputs = [mapping.get(name, name) if name else name for name in node.inputs]
    for sub in node.subgraphs():
        rename_reads(sub, mapping, outputs=True)


# ---------------------------------------------------------------------- constants


def _merge_constants(graph: Graph) -> int:
    """Make readers of equal constants read one of them; returns how many copies went.

    Constants are bucketed by type and shape first, so only candidates are hashed (weights
    are large and rarely equal)."""
    buckets: dict[Hashable, list[str]] = {}
    for name, array in graph.constants.items():
        array = np.asarray(array)
        buckets.setdefault((array.dtype.str, array.dtype.name, array.shape), []).append(name)
    mapping: dict[str, str] = {}
    for names in buckets.values():
        if len(names) < 2:
            continue
        kept: dict[Hashable, list[str]] = {}  # fingerprint -> distinct constants with it
        for name in names:
            key = _fingerprint(graph.constants[name])
            if key is None:
                continue
            key = (key, _sizes_spelled(name, graph.constants[name]))
            same = next((other for other in kept.get(key, [])
                         if _equal_bits(graph.constants[other], graph.constants[name])), None)
            if same is None:
                kept.setdefault(key, []).append(name)
            elif name not in graph.outputs:
                mapping[name] = same
    rename_reads(graph, mapping)
    for name in mapping:
        del graph.constants[name]
        graph.types.pop(name, None)
    return len(mapping)


def _sizes_spelled(name: str, array: np.ndarray) -> tuple[str, ...] | None:
    """The run-time sizes a traced build's constant stands for (``[4, S, 16]``), which its
    sample does not tell apart from another's (``[4, 16, S]`` at S = 16); None for a constant
    that is just its values."""
    value = traced_value(name, array)
    if not holds_traced(value):
        return None
    return tuple(str(expr_of(v)) for v in np.asarray(value).flat)


def _fingerprint(array: np.ndarray) -> Hashable | None:
    """A cheap key that equal arrays share (a sample of their bytes); None for arrays of
    Python objects other than strings."""
    array = np.asarray(array)
    if array.dtype == object:
        if not all(isinstance(v, str) for v in array.flat):
            return None
        return tuple(array.flat)
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if data.size <= 1024:
        return data.tobytes()
    return data[::max(1, data.size // 512)].tobytes() + data[-64:].tobytes()


def _equal_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit the same values (NaN equals NaN, -0.0 differs from 0.0)."""
    if a.dtype == object or b.dtype == object:
        return a.dtype == b.dtype and a.shape == b.shape and \
            all(x == y for x, y in zip(a.flat, b.flat))
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _array_key(array: np.ndarray) -> Hashable | None:
    """Equal exactly when the arrays are bit for bit the same values of the same type (for
    small arrays such as attribute tensors)."""
    array = np.asarray(array)
    fingerprint = _fingerprint(array)
    if fingerprint is None:
        return None
    data = np.ascontiguousarray(array).tobytes() if array.dtype != object else fingerprint
    return (array.dtype.str, array.dtype.name, array.shape, data)


# ---------------------------------------------------------------------- nodes


def _node_key(node: Node) -> Hashable | None:
    opdef = get_op(node.op)
    if opdef is None or opdef.random:
        return None
    try:
        attrs = opdef.resolve_attrs(node)
    except Exception:  # noqa: BLE001 - a malformed node is the verifier's to report
        return None
    inputs: tuple[str, ...] = tuple(node.inputs)
    if opdef.commutative and len(inputs) == 2:
        inputs = tuple(sorted(inputs))
    attr_key = tuple(sorted((k, _attr_key(v)) for k, v in attrs.items()))
    outputs = tuple(bool(o) for o in node.outputs)
    return (node.op, node.domain, inputs, attr_key, len(node.outputs), outputs)


def _attr_key(value: Any) -> Hashable:
    if isinstance(value, Graph):
        return ("graph", format_graph(value),
                tuple((n, _array_key(a)) for n, a in value.constants.items()),
                _nested_constants(value))
    if isinstance(value, np.ndarray):
        return ("array", _array_key(value))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_attr_key(v) for v in value))
    if isinstance(value, float) and value != value:
        return ("nan",)
    return (type(value).__name__, value) if isinstance(value, Hashable) else ("repr", repr(value))


def _nested_constants(graph: Graph) -> tuple:
    """The constants of the subgraphs of ``graph``'s nodes, which its printed form omits when
    they are large."""
    keys = []
    for node in graph.walk():
        for sub in node.subgraphs():
            keys.extend((n, _array_key(a)) for n, a in sub.constants.items())
    return tuple(keys)


__all__ = ["eliminate_common_subexpressions"]
