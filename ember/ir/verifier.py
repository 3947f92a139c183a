"""Structural checks of the graph IR: the invariants every pass may rely on.

:func:`verify` checks a graph and, recursively, every subgraph (If/Loop/Scan bodies):

* every node input is defined before it is used: by a graph input, a constant, an output of an
  earlier node, or a value of an enclosing graph (for subgraphs);
* no value is defined twice, in one graph or across a subgraph and its enclosing graphs;
* every graph output is defined, and the top-level graph has at least one output (a model
  that computes nothing is a broken file, not an empty result);
* every node names a registered op with a valid number of inputs/outputs and attributes of the
  declared kinds (when the op registry is passed in, see below);
* every type is well formed, constants have the type of their array, and, with
  ``require_types=True`` (after shape inference), every value has a type.

``ember.ir`` sits below ``ember.ops`` in the layering (pyproject.toml), so the verifier cannot
import the op registry itself: callers pass it, ``verify(graph, ops=get_op)`` with
``ember.ops.registry.get_op``.  Without it the op, arity and attribute checks are skipped.

All problems are collected and reported at once in one :class:`VerificationError`, each naming
the graph, node and value concerned.

The compile path runs it after ONNX import (before shape inference, so that a dangling value is
reported as such rather than as whatever inference trips over), when a graph is specialized,
and after every graph pass.  It is linear in the size of the graph and cheap enough to leave on:
measured at 1.3 ms per check on ResNet-18 (69 nodes) and 2.7 ms on BERT-base (416 nodes); the
seven checks of one compile are 15 ms of the 27 s it takes to compile ResNet-18 (0.06%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np

from ember.core.dims import SymDim
from ember.core.dtypes import DType
from ember.core.errors import EmberError, VerificationError
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType

# Problems listed in the error message; the exception's ``problems`` keeps all of them.
_MAX_LISTED = 30


class OpSchema(Protocol):
    """What the verifier needs of an op definition (``ember.ops.registry.OpDef``)."""

    def check_arity(self, node: Node) -> None: ...

    def resolve_attrs(self, node: Node) -> dict[str, Any]: ...


OpLookup = Callable[[str], "OpSchema | None"]


def verify(graph: Graph, ops: OpLookup | None = None, *, require_types: bool = False,
           stage: str = "", prior_problems: Iterable[str] = ()) -> None:
    """Check the invariants of ``graph`` and its subgraphs; raise VerificationError if broken.

    ``ops`` looks up an op by name (``ember.ops.registry.get_op``); without it, op existence,
    arity and attributes are not checked.  ``require_types=True`` also demands a type for every
    value, which holds after shape inference.  ``stage`` says when the check ran ("after graph
    pass 'fold_constants'"), for the message; ``prior_problems`` are problems a caller found
    itself (the ONNX importer's), listed first in the same error.
    """
    checker = _Checker(ops, require_types)
    checker.problems.extend(prior_problems)
    where = f"graph '{graph.name}'"
    checker.check_graph(graph, where=where, outer={}, outer_types={})
    if not graph.outputs:
        checker.report(where, "the graph has no outputs; a model must compute at least one "
                              "value")
    if checker.problems:
        raise _error(checker.problems, stage)


def _error(problems: list[str], stage: str = "") -> VerificationError:
    """One VerificationError listing ``problems`` (all of them in its ``problems``)."""
    when = f" {stage}" if stage else ""
    if len(problems) == 1:
        error = VerificationError(f"IR verification failed{when}: {problems[0]}")
    else:
        listed = [f"  - {p}" for p in problems[:_MAX_LISTED]]
        if len(problems) > _MAX_LISTED:
            listed.append(f"  ... and {len(problems) - _MAX_LISTED} more")
        error = VerificationError(f"IR verification failed{when} with {len(problems)} "
                                  f"problems:\n" + "\n".join(listed))
    error.problems = list(problems)  # type: ignore[attr-defined]
    return error


def node_label(node: Node, index: int) -> str:
    """``node 'add_0' (Add)``, or ``node #3 (Add)`` for an unnamed node."""
    name = f"'{node.name}'" if node.name else f"#{index}"
    return f"node {name} ({node.op})"


@dataclass
class _Checker:
    ops: OpLookup | None
    require_types: bool

    def __post_init__(self) -> None:
        self.problems: list[str] = []

    def report(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    # ------------------------------------------------------------------ graphs
    def check_graph(self, graph: Graph, where: str, outer: Mapping[str, str],
                    outer_types: Mapping[str, Any]) -> None:
        """``outer`` maps each value visible from enclosing graphs to what defines it."""
        defined: dict[str, str] = {}  # value name -> what defines it, for messages

        def define(name: str, what: str) -> None:
            if not name:
                self.report(where, f"{what} has an empty name")
            elif name in defined:
                self.report(where, f"value '{name}' is defined twice: by {defined[name]} and "
                                   f"by {what}")
            elif name in outer:
                self.report(where, f"value '{name}' ({what}) shadows a value of an enclosing "
                                   f"graph ({outer[name]})")
            else:
                defined[name] = what

        for name in graph.inputs:
            define(name, "a graph input")
        for name, array in graph.constants.items():
            define(name, "a constant")
            self.check_constant(graph, name, array, where)

        producers = {out: (index, node) for index, node in enumerate(graph.nodes)
                     for out in node.outputs if out}
        for index, node in enumerate(graph.nodes):
            label = node_label(node, index)
            for name in node.inputs:
                if name and name not in defined and name not in outer:
                    self.report(where, f"{label}: input '{name}' "
                                       + _why_undefined(name, index, producers))
            self.check_op(node, label, where)
            for key, sub in _subgraph_attrs(node):
                # A body sees the values defined before its node, not the node's own outputs.
                self.check_graph(sub, f"{where}, {label} attribute '{key}' (graph '{sub.name}')",
                                 {**outer, **defined}, {**outer_types, **graph.types})
            for name in node.outputs:
                if name:
                    define(name, label)

        for name in graph.outputs:
            if not name:
                self.report(where, "a graph output has an empty name")
            elif name not in defined and name not in outer:
                self.report(where, f"graph output '{name}' is not defined")
        self.check_types(graph, where, defined, outer_types)

    # ------------------------------------------------------------------ nodes
    def check_op(self, node: Node, label: str, where: str) -> None:
        if self.ops is None:
            return
        opdef = self.ops(node.op)
        if opdef is None:
            domain = f" from domain '{node.domain}'" if node.domain else ""
            self.report(where, f"{label}: op '{node.op}'{domain} is not registered")
            return
        # The registry checks attribute kinds (one place for what a kind accepts) and lists
        # every attribute problem of the node in one error.
        for check in (opdef.check_arity, opdef.resolve_attrs):
            try:
                check(node)
            except EmberError as error:
                self.report(where, str(error))

    # ------------------------------------------------------------------ types
    def check_constant(self, graph: Graph, name: str, array: Any, where: str) -> None:
        if not isinstance(array, np.ndarray):
            self.report(where, f"constant '{name}' is a {type(array).__name__}, not a numpy array")
            return
        vtype = graph.types.get(name)
        if vtype is None:
            return  # a missing type is reported by check_types when types are required
        try:
            expected = TensorType(DType.from_numpy(array.dtype), tuple(array.shape))
        except EmberError as error:
            self.report(where, f"constant '{name}': {error}")
            return
        if vtype != expected:
            self.report(where, f"constant '{name}' has type {vtype} but its array is {expected}")

    def check_types(self, graph: Graph, where: str, defined: Mapping[str, str],
                    outer_types: Mapping[str, Any]) -> None:
        for name in defined:
            vtype = graph.types.get(name)
            if vtype is not None:
                problem = _type_problem(vtype)
                if problem:
                    self.report(where, f"value '{name}' has a malformed type: {problem}")
            elif self.require_types:
                self.report(where, f"value '{name}' (defined by {defined[name]}) has no type")
        if self.require_types:
            for name in graph.outputs:
                if name and name not in defined and outer_types.get(name) is None \
                        and graph.types.get(name) is None:
                    self.report(where, f"graph output '{name}' has no type")


# ---------------------------------------------------------------------- helpers


def _why_undefined(name: str, index: int, producers: Mapping[str, tuple[int, Node]]) -> str:
    if name in producers:
        later, producer = producers[name]
        if later == index:
            return "is an output of the same node"
        return (f"is used before it is defined (by {node_label(producer, later)}); nodes must "
                f"be in topological order, without cycles")
    return "is not defined (no graph input, constant, node output or enclosing-graph value)"


def _subgraph_attrs(node: Node) -> Iterable[tuple[str, Graph]]:
    for key, value in node.attrs.items():
        if isinstance(value, Graph):
            yield key, value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Graph):
                    yield f"{key}[{i}]", item


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _type_problem(vtype: Any) -> str | None:
    """Why ``vtype`` is not a well-formed ValueType, or None if it is."""
    if isinstance(vtype, TensorType):
        if not isinstance(vtype.dtype, DType):
            return f"element type {vtype.dtype!r} is not a DType"
        if vtype.shape is None:
            return None
        if not isinstance(vtype.shape, tuple):
            return f"shape {vtype.shape!r} is not a tuple"
        for dim in vtype.shape:
            if not (dim is None or isinstance(dim, SymDim) or (_is_int(dim) and dim >= 0)):
                return f"dimension {dim!r} is not a non-negative int, a symbol or None"
        return None
    if isinstance(vtype, (SequenceType, OptionalType)):
        return None if vtype.elem is None else _type_problem(vtype.elem)
    return f"{vtype!r} is not a TensorType, SequenceType or OptionalType"
