"""Run a graph with the numpy reference of every op.

This is ember's oracle: it defines what a model computes, independently of any compiled code,
and it is the fallback for ops that have no kernel.  It is deliberately simple: values live in
a dict keyed by name; subgraphs (If/Loop/Scan bodies) see their enclosing scopes through a
ChainMap.
"""

from __future__ import annotations

from collections import ChainMap
from typing import Any, Mapping, MutableMapping

import numpy as np

from ember.core.dims import SymDim
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ExecutionError, InputError, UnsupportedOpError
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.registry import OpDef, RefContext, get_op


class NodeInterpreter:
    """Runs nodes with their numpy references; subgraphs see enclosing values by name."""

    def run_node(self, graph: Graph, node: Node, args: list[Any],
                 env: MutableMapping[str, Any]) -> list[Any]:
        """Run one node of ``graph`` on ``args``; ``env`` holds the values its subgraphs may
        read from enclosing scopes."""
        opdef = get_op(node.op)
        if opdef is None:
            raise UnsupportedOpError([(node.op, node.name, "no ember op of this name")])
        return self._run_node(graph, node, opdef, args, env)

    def _run_nodes(self, graph: Graph, env: MutableMapping[str, Any]) -> None:
        for node in graph.nodes:
            opdef = get_op(node.op)
            assert opdef is not None  # checked when the executor was made
            args = [env[name] if name else None for name in node.inputs]
            results = self._run_node(graph, node, opdef, args, env)
            for name, value in zip(node.outputs, results):
                if name:
                    env[name] = value

    def _run_node(self, graph: Graph, node: Node, opdef: OpDef, args: list[Any],
                  env: MutableMapping[str, Any]) -> list[Any]:
        def run_subgraph(body: Graph, inputs: list[Any]) -> list[Any]:
            scope = ChainMap(dict(body.constants), env)
            for name, value in zip(body.inputs, inputs):
                scope[name] = value
            self._run_nodes(body, scope)
            return [scope[name] for name in body.outputs]

        ctx = RefContext(node, opdef, run_subgraph,
                         [graph.types.get(o) for o in node.outputs])
        attrs = opdef.resolve_attrs(node)
        try:
            with np.errstate(all="ignore"):
                result = opdef.reference(ctx, *args, **attrs)
        except EmberError:
            raise
        except Exception as error:  # a numpy failure deep inside: name the node instead
            raise ExecutionError(
                f"node '{node.name}' ({node.op}) failed: {type(error).__name__}: {error}"
            ) from error
        outputs = list(result) if isinstance(result, tuple) else [result]
        outputs = [np.asarray(v) if isinstance(v, np.generic) else v for v in outputs]
        if len(outputs) < len([o for o in node.outputs if o]):
            raise ExecutionError(f"node '{node.name}' ({node.op}) produced {len(outputs)} "
                                 f"outputs, the node names {len(node.outputs)}")
        return outputs


class ReferenceExecutor(NodeInterpreter):
    """Executes ``graph`` with numpy; reusable across calls."""

    def __init__(self, graph: Graph):
        self.graph = graph
        missing = [(n.op, n.name, "no ember op of this name") for n in graph.walk()
                   if get_op(n.op) is None]
        if missing:
            raise UnsupportedOpError(missing)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run on named inputs; returns every graph output by name."""
        check_inputs(self.graph, feeds)
        env: MutableMapping[str, Any] = dict(self.graph.constants)
        env.update(feeds)
        self._run_nodes(self.graph, env)
        return {name: env[name] for name in self.graph.outputs}


def check_inputs(graph: Graph, feeds: Mapping[str, Any]) -> None:
    """Validate run-time inputs against the graph signature; raise InputError naming the issue.

    Symbolic dims must bind consistently across inputs (two inputs sharing ``N`` must agree).
    """
    expected = list(graph.inputs)
    missing = [name for name in expected if name not in feeds]
    extra = [name for name in feeds if name not in expected]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing}")
        if extra:
            parts.append(f"unknown input(s) {extra}")
        raise InputError(f"{'; '.join(parts)}; the model takes {expected}")
    bindings: dict[str, int] = {}
    for name in expected:
        _check_value(name, feeds[name], graph.types.get(name), bindings)


def _check_value(name: str, value: Any, vtype: ValueType | None, bindings: dict[str, int]) -> None:
    if vtype is None:
        return
    if isinstance(vtype, OptionalType):
        if value is not None:
            _check_value(name, value, vtype.elem, bindings)
        return
    if isinstance(vtype, SequenceType):
        if not isinstance(value, (list, tuple)):
            raise InputError(f"input '{name}' must be a sequence (list of arrays), "
                             f"got {type(value).__name__}")
        for item in value:
            _check_value(name, item, vtype.elem, dict(bindings))
        return
    assert isinstance(vtype, TensorType)
    if not isinstance(value, np.ndarray):
        if np.isscalar(value) and vtype.rank == 0:
            value = np.asarray(value)
        else:
            raise InputError(f"input '{name}' must be a numpy array of {vtype}, "
                             f"got {type(value).__name__}")
    try:
        got_dtype = DType.from_numpy(value.dtype)
    except EmberError:
        got_dtype = None
    if got_dtype != vtype.dtype:
        raise InputError(f"input '{name}' has dtype {value.dtype}; the model expects "
                         f"{vtype.dtype.numpy} ({vtype})")
    if vtype.shape is None:
        return
    if value.ndim != len(vtype.shape):
        raise InputError(f"input '{name}' has shape {value.shape} (rank {value.ndim}); the model "
                         f"expects rank {len(vtype.shape)}: {vtype}")
    for axis, (dim, actual) in enumerate(zip(vtype.shape, value.shape)):
        if isinstance(dim, int) and dim != actual:
            raise InputError(f"input '{name}' has shape {value.shape}; dimension {axis} must be "
                             f"{dim} ({vtype})")
        if isinstance(dim, SymDim) and len(dim.terms) == 1 and dim.terms[0][1] == 1 \
                and len(dim.terms[0][0]) == 1:
            symbol = dim.terms[0][0][0]
            if symbol.startswith("_"):
                continue  # a fresh, unnamed symbol: any size
            if bindings.setdefault(symbol, actual) != actual:
                raise InputError(f"input '{name}' has shape {value.shape}; dimension {axis} "
                                 f"('{symbol}') must equal {bindings[symbol]} as in an earlier "
                                 f"input")
