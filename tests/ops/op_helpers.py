"""Helpers shared by the op tests: one-node graphs with shapes inferred, their output types, and
their results from the reference executor."""

from __future__ import annotations

import numpy as np

from ember.core.dtypes import DType
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, ValueType
from ember.passes.infer_shapes import infer_shapes


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def type_of(value: np.ndarray) -> TensorType:
    return TensorType(DType.from_numpy(value.dtype), value.shape)


def add_constants(graph: Graph, constants: dict[str, np.ndarray]) -> None:
    for name, value in constants.items():
        graph.constants[name] = value
        graph.types[name] = type_of(value)


# ----------------------------------------------------------------------------- named inputs


def node_graph(op: str, inputs: dict[str, TensorType | np.ndarray | None], outputs: int = 1,
               constants: dict[str, np.ndarray] | None = None, **attrs) -> Graph:
    """A one-node graph ``op(*inputs, *constants)`` with outputs ``out0, out1, ...``, shapes
    inferred.  An input given as an array is a constant in its place, None an absent input."""
    graph = Graph(outputs=[f"out{i}" for i in range(outputs)])
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            add_constants(graph, {name: value})
        elif value is not None:
            graph.inputs.append(name)
            graph.types[name] = value
    add_constants(graph, constants or {})
    names = [name if value is not None else "" for name, value in inputs.items()]
    graph.nodes.append(Node(op, names + list(constants or {}), list(graph.outputs), attrs,
                            name="n"))
    return infer_shapes(graph)


def node_types(op: str, inputs: dict, outputs: int = 1, **kwargs) -> list[str]:
    """The printed output types of ``node_graph(op, inputs, outputs, **kwargs)``."""
    graph = node_graph(op, inputs, outputs, **kwargs)
    return [str(graph.types.get(name)) for name in graph.outputs]


def _results(graph: Graph, feeds: dict[str, np.ndarray], outputs: int):
    result = ReferenceExecutor(graph).run(feeds)
    return [result[name] for name in graph.outputs] if outputs > 1 else result["out0"]


def run_node(op: str, *values: np.ndarray, outputs: int = 1, **attrs):
    """Run ``op`` on ``values`` (run-time inputs ``in0, in1, ...``): the output, or the list of
    outputs if there are several."""
    inputs = {f"in{i}": value for i, value in enumerate(values)}
    graph = node_graph(op, {n: type_of(v) for n, v in inputs.items()}, outputs=outputs, **attrs)
    return _results(graph, inputs, outputs)


def run_named(op: str, inputs: dict[str, np.ndarray | None], outputs: int = 1, **attrs):
    """Run ``op`` with every array given as a run-time input (None: an absent input)."""
    types = {k: None if v is None else type_of(v) for k, v in inputs.items()}
    graph = node_graph(op, types, outputs, **attrs)
    return _results(graph, {k: v for k, v in inputs.items() if v is not None}, outputs)


# ----------------------------------------------------------------------------- positional inputs


def positional_graph(op: str, *inputs: ValueType | None, **attrs) -> Graph:
    """A one-node graph ``out = op(in0, in1, ...)`` with shapes inferred (None: unknown type)."""
    names = [f"in{i}" for i in range(len(inputs))]
    graph = Graph(inputs=names, outputs=["out"],
                  types={n: t for n, t in zip(names, inputs) if t is not None},
                  nodes=[Node(op, names, ["out"], attrs, name="n")])
    return infer_shapes(graph)


def run_positional(op: str, *values: np.ndarray, **attrs) -> np.ndarray:
    """The output of ``positional_graph`` run on ``values``."""
    graph = positional_graph(op, *map(type_of, values), **attrs)
    return ReferenceExecutor(graph).run({f"in{i}": v for i, v in enumerate(values)})["out"]
