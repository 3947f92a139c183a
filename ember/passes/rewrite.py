"""Graph editing shared by the rewriting passes: who produces and who reads a value, and how
to route a value's readers to another value.

Every rewrite ends the same way: some value ``old`` is now computed by another value ``new``,
and ``old``'s readers must read ``new``.  Readers include the bodies of If/Loop/Scan nodes,
which read enclosing values by name, and the graph's outputs, whose names are the model's
interface and must not change; :func:`replace_value` handles all three so that no pass gets
one of them wrong.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, ValueType


class GraphIndex:
    """Producers and readers of the values of one graph (not of its subgraphs).

    A node reads a value if it is one of its inputs or if one of its subgraphs reads it by
    name; each reader is listed once per value.  Graph outputs are not readers but count as
    uses (:meth:`is_output`).  The index describes the graph when it was built: passes rebuild
    it after a rewrite or keep it up to date themselves.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer: dict[str, Node] = {}
        self.readers: dict[str, list[Node]] = {}
        self.position: dict[int, int] = {}
        for index, node in enumerate(graph.nodes):
            self.position[id(node)] = index
            for name in dict.fromkeys([n for n in node.inputs if n] + node.implicit_inputs()):
                self.readers.setdefault(name, []).append(node)
            for name in node.outputs:
                if name:
                    self.producer[name] = node
        self.outputs = set(graph.outputs)

    def readers_of(self, name: str) -> list[Node]:
        return self.readers.get(name, [])

    def is_output(self, name: str) -> bool:
        return name in self.outputs

    def sole_reader(self, name: str) -> Node | None:
        """The one node reading ``name``, if exactly one does and it is not a graph output."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.outputs:
            return None
        return readers[0]

    def used_only_by(self, name: str, nodes: Iterable[Node]) -> bool:
        """Whether every reader of ``name`` is one of ``nodes`` and it is no graph output."""
        allowed = {id(n) for n in nodes}
        return name not in self.outputs and all(id(r) in allowed
                                                for r in self.readers.get(name, []))

    def constant(self, name: str) -> np.ndarray | None:
        return constant_value(self.graph, name)

    def type_of(self, name: str) -> ValueType | None:
        return self.graph.types.get(name)

    def tensor_type(self, name: str) -> TensorType | None:
        vtype = self.graph.types.get(name)
        return vtype if isinstance(vtype, TensorType) else None

    def producer_of(self, name: str, *ops: str) -> Node | None:
        """The node producing ``name``, if there is one (and its op is one of ``ops``)."""
        node = self.producer.get(name)
        if node is None or (ops and node.op not in ops):
            return None
        return node


def constant_value(graph: Graph, name: str) -> np.ndarray | None:
    """The compile-time value of ``name``, if it is a graph constant.

    Every constant is one by the time passes run: the ONNX importer turns initializers and
    ``Constant`` nodes (all their ``value_*`` forms) into graph constants, and constant folding
    turns computed ones (``Cast`` of a constant, ``ConstantOfShape``) into constants too."""
    if not name:
        return None
    return graph.constants.get(name)


def rename_reads(graph: Graph, mapping: dict[str, str], *, outputs: bool = False) -> None:
    """Make every node of ``graph`` and of its subgraphs read ``mapping[name]`` for ``name``.

    Subgraph bodies cannot redefine an enclosing value (the verifier forbids shadowing), so a
    name of ``mapping`` found in a body is always the enclosing value.  The graph's own
    outputs are renamed only with ``outputs=True`` (subgraph outputs always are).
    """
    if not mapping:
        return
    for node in graph.nodes:
        node.inputs = [mapping.get(name, name) if name else name for name in node.inputs]
        for sub in node.subgraphs():
            rename_reads(sub, mapping, outputs=True)
    if outputs:
        graph.outputs = [mapping.get(name, name) for name in graph.outputs]


def replace_value(graph: Graph, old: str, new: str) -> bool:
    """Route every reader of ``old`` to ``new``, which must compute the same value.

    ``old`` keeps no reader and its producer becomes dead code.  When ``old`` is a graph
    output its name must survive: then ``new``'s producing node is made to produce ``old``
    instead, if ``new`` is a node output that is itself no graph output (and not a graph
    input or constant).  Returns False, changing nothing, when neither is possible.

    The node producing ``old`` must not be in the graph any more when the rename path is taken
    (the caller removes it first, or before calling passes a node that is not ``old``'s
    producer): callers use :func:`remove_and_replace`.
    """
    if old == new:
        return True
    if old not in graph.outputs:
        rename_reads(graph, {old: new})
        return True
    producers = graph.producers()
    producer = producers.get(new)
    if producer is None or new in graph.outputs or new in graph.inputs:
        return False
    producer.outputs = [old if name == new else name for name in producer.outputs]
    rename_reads(graph, {new: old})
    if new in graph.types:
        graph.types[old] = graph.types.pop(new)
    return True


def can_replace(graph: Graph, old: str, new: str) -> bool:
    """Whether :func:`replace_value` would succeed (checked before removing anything)."""
    if old == new or old not in graph.outputs:
        return True
    producer = graph.producers().get(new)
    return producer is not None and new not in graph.outputs and new not in graph.inputs


def remove_and_replace(graph: Graph, node: Node, replacements: dict[str, str]) -> bool:
    """Remove ``node`` and route the readers of each of its outputs to its replacement.

    Every output of ``node`` that has readers or is a graph output must be in
    ``replacements``.  Returns False, changing nothing, when a graph output could not keep
    its name (see :func:`replace_value`).
    """
    if not all(can_replace(graph, old, new) for old, new in replacements.items()):
        return False
    graph.nodes = [n for n in graph.nodes if n is not node]
    for old, new in replacements.items():
        replaced = replace_value(graph, old, new)
        assert replaced
        if old not in graph.outputs:
            graph.types.pop(old, None)
    return True


def insert_before(graph: Graph, anchor: Node, new_nodes: list[Node]) -> None:
    """Insert ``new_nodes`` (in order) just before ``anchor``."""
    index = next(i for i, n in enumerate(graph.nodes) if n is anchor)
    graph.nodes[index:index] = new_nodes


def insert_after(graph: Graph, anchor: Node, new_nodes: list[Node]) -> None:
    """Insert ``new_nodes`` (in order) just after ``anchor``."""
    index = next(i for i, n in enumerate(graph.nodes) if n is anchor)
    graph.nodes[index + 1:index + 1] = new_nodes


def same_type(a: ValueType | None, b: ValueType | None) -> bool:
    """Whether two known tensor types are provably the same: dtype and every dim (symbolic
    dims compare as polynomials; an unknown dim is not known to be equal)."""
    from ember.core.dims import dims_equal

    if not isinstance(a, TensorType) or not isinstance(b, TensorType):
        return False
    if a.dtype != b.dtype or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(dims_equal(x, y) is True for x, y in zip(a.shape, b.shape))


def expand_nodes(graph: Graph, op: str | Iterable[str],
                 expand: Callable[[Node], list[Node]], declined: type[Exception]) -> int:
    """Replace every node of ``op`` (default domain) by the nodes ``expand`` makes of it, in
    its place; a node whose expansion raises ``declined`` stays as it is.  Returns how many
    were replaced.  (The passes that write one op as others: recurrent layers, Einsum.)"""
    ops = {op} if isinstance(op, str) else set(op)
    replaced = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.op in ops and node.domain in ("", "ai.onnx"):
            try:
                nodes.extend(expand(node))
                replaced += 1
                continue
            except declined:
                pass
        nodes.append(node)
    graph.nodes = nodes
    return replaced
