"""The high-level graph IR.

A :class:`Graph` is a list of :class:`Node` in topological order over named values, in the
style of ONNX: every value has one producer (a graph input, a constant, or a node output) and a
:class:`~ember.ir.types.ValueType` recorded in ``Graph.types``.  Names make the IR easy to print,
diff and serialize; passes that rewrite the graph create fresh names with :meth:`Graph.fresh_name`.

Nodes carry an ``op`` that names an entry of the op registry (``ember.ops``) and a dict of
attributes whose values are Python scalars, lists, numpy arrays, or nested Graphs (the bodies
of If/Loop/Scan).  A subgraph may read values of its enclosing graphs by name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ember.ir.types import ValueType

AttrValue = Any  # int | float | str | list[...] | np.ndarray | Graph | list[Graph] | ValueType


@dataclass
class Node:
    """One op application.  A missing optional input is the empty string, as in ONNX."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    name: str = ""
    domain: str = ""  # "" for the default ONNX-derived op set; kept to name custom ops in errors

    def subgraphs(self) -> Iterator["Graph"]:
        for value in self.attrs.values():
            if isinstance(value, Graph):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, Graph))

    def implicit_inputs(self) -> list[str]:
        """Values of enclosing graphs that this node's subgraphs read by name (sorted)."""
        names: set[str] = set()
        for sub in self.subgraphs():
            names |= sub.free_names()
        return sorted(names)

    def __str__(self) -> str:
        from ember.ir.printer import format_node

        return format_node(self)


@dataclass
class FusedGroup:
    """Nodes that compile into one kernel, as the fusion pass (``passes/fuse.py``) formed them.

    ``nodes`` are in graph order; ``inputs`` are the values the kernel reads from outside
    (graph inputs, constants, other groups' outputs) and ``outputs`` those it writes for
    readers outside (or graph outputs), both in first-use order.  ``master`` names the node
    that decides the kernel's shape (the reduction or matmul/conv the others fuse around),
    empty for a group of elementwise and injective nodes only.
    """

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    master: str = ""

    @property
    def name(self) -> str:
        """A readable label: the master's (or first node's) name and the member count."""
        lead = next((n for n in self.nodes if n.name == self.master), self.nodes[0])
        extra = f" +{len(self.nodes) - 1}" if len(self.nodes) > 1 else ""
        return f"{lead.name or lead.op}{extra}"


@dataclass
class Graph:
    """A function from named inputs to named outputs."""

    name: str = "main"
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, ValueType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    # Producer metadata that is not semantics (opset, producer name): kept for reports.
    metadata: dict[str, Any] = field(default_factory=dict)
    # The kernels the fusion pass formed (None until it ran); any later rewrite of the nodes
    # must run it again.
    groups: list[FusedGroup] | None = None

    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False, compare=False)
    # fresh_name's cache of the names taken, valid while the stamp matches
    _taken: set[str] = field(default_factory=set, repr=False, compare=False)
    _taken_stamp: tuple = field(default=(), repr=False, compare=False)

    # ------------------------------------------------------------------ queries
    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        result: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    result.setdefault(name, []).append(node)
        return result

    def all_value_names(self) -> set[str]:
        names = set(self.inputs) | set(self.constants)
        for node in self.nodes:
            names.update(o for o in node.outputs if o)
        return names

    def free_names(self) -> set[str]:
        """Names this graph (or its subgraphs) reads without defining: enclosing-scope values."""
        defined = set(self.inputs) | set(self.constants)
        free: set[str] = set()
        for node in self.nodes:
            free.update(i for i in node.inputs if i and i not in defined)
            free.update(n for n in node.implicit_inputs() if n not in defined)
            defined.update(o for o in node.outputs if o)
        free.update(o for o in self.outputs if o not in defined)
        return free

    def op_histogram(self, recursive: bool = True) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.walk() if recursive else self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def walk(self) -> Iterator[Node]:
        """Every node of this graph and of its subgraphs, depth first."""
        for node in self.nodes:
            yield node
            for sub in node.subgraphs():
                yield from sub.walk()

    def parameter_count(self) -> int:
        return int(sum(np.asarray(c).size for c in self.constants.values()))

    # ------------------------------------------------------------------ building
    def fresh_name(self, hint: str = "v") -> str:
        """A value name no value of this graph has (``hint`` and a counter).

        The names the nodes produce are kept between calls while the node list is the same
        list of the same length (passes that add many values call this once per value: a
        fresh scan each time made them quadratic); inputs, constants and typed values are
        looked up as they are now, and names handed out are remembered."""
        stamp = (id(self.nodes), len(self.nodes))
        if self._taken_stamp != stamp:
            self._taken = self.all_value_names()
            self._taken_stamp = stamp
        while True:
            candidate = f"{hint}_{next(self._counter)}"
            if candidate in self._taken or candidate in self.types or \
                    candidate in self.constants or candidate in self.inputs:
                continue
            self._taken.add(candidate)
            return candidate

    def add_constant(self, array: np.ndarray, hint: str = "const") -> str:
        from ember.ir.types import TensorType
        from ember.core.dtypes import DType

        name = self.fresh_name(hint)
        array = np.asarray(array)
        self.constants[name] = array
        self.types[name] = TensorType(DType.from_numpy(array.dtype), tuple(array.shape))
        return name

    def add_shape_constant(self, dims: "Iterator[int] | tuple[int, ...] | list[int]",
                           hint: str = "shape") -> str:
        """An int64 constant of sizes (a Reshape's target).  In a traced build its sizes may
        be run-time ones: the constant holds their samples and the trace their expressions
        (``ember.core.traced.traced_value``), so that a pass's rewrite does not compile the
        sample in."""
        from ember.core.traced import plain, remember_traced

        dims = list(dims)
        name = self.add_constant(np.asarray([plain(d) for d in dims], dtype=np.int64), hint)
        remember_traced(name, np.array(dims, dtype=object))
        return name

    def __str__(self) -> str:
        from ember.ir.printer import format_graph

        return format_graph(self)
