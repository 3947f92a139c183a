"""Constant folding: evaluate nodes whose inputs are all known at compile time.

A node folds when every input is a constant, or when it only asks for metadata that the
static types already answer (``Shape``, ``Size`` of a statically shaped tensor).  Its outputs
become graph constants and the node disappears.  Folding uses each op's numpy reference, so it
is exact by construction.

What a fold may allocate is decided from the output types *before* the reference runs (after
specialization every type is static): large results are not folded (they would bloat the
weights) unless their inputs were just as large, results of unknown size are not folded at all,
and the folded constants together stay within the memory budget
(``ember.passes.memory_budget``); a node that does not fit is left to run time, where the
workspace check of the build bounds it.
"""

from __future__ import annotations

import numpy as np

from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.errors import EmberError, ShapeError
from ember.core.traced import has_traced_dims
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import RefContext, get_op
from ember.passes.memory_budget import FoldBudget, output_nbytes

_MAX_GROWTH_ELEMENTS = 1 << 20


def fold_constants(graph: Graph, memory_limit: int | None = None) -> int:
    """Fold in place; returns the number of nodes folded.

    ``memory_limit`` bounds the bytes of all constants folding creates (default:
    ``ember.core.config.memory_limit()``).
    """
    budget = FoldBudget(resolve_memory_limit(memory_limit))
    folded = 0
    kept: list[Node] = []
    for node in graph.nodes:
        values = _try_fold(graph, node, budget)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values):
            if name:
                graph.constants[name] = value
        folded += 1
    graph.nodes = kept
    return folded


def _try_fold(graph: Graph, node: Node, budget: FoldBudget) -> list[np.ndarray] | None:
    opdef = get_op(node.op)
    if opdef is None or not opdef.foldable or any(True for _ in node.subgraphs()):
        return None
    if node.op in ("Shape", "Size"):
        return _fold_metadata(graph, node)
    if not node.inputs or not all((not name) or name in graph.constants
                                  for name in node.inputs):
        return None
    if any(has_traced_dims(getattr(graph.types.get(name), "shape", None))
           for name in node.outputs if name):
        return None
    args = [graph.constants[name] if name else None for name in node.inputs]
    if not _worth_folding(graph, node, args, budget):
        return None
    try:
        with np.errstate(all="ignore"):
            result = opdef.reference(RefContext(node, opdef, lambda *a: []), *args,
                                     **opdef.resolve_attrs(node))
    except EmberError:
        return None  # left to run time, where the same error names the node again
    except Exception as error:  # numpy refused the inputs: a malformed node, named here
        raise ShapeError(f"node '{node.name}' ({node.op}) cannot be evaluated on its constant "
                         f"inputs: {type(error).__name__}: {error}") from error
    outputs = list(result) if isinstance(result, tuple) else [result]
    if not all(isinstance(o, np.ndarray) for o in outputs[:len(node.outputs)]):
        return None
    budget.spend(sum(o.nbytes for o, name in zip(outputs, node.outputs) if name))
    return outputs


def _worth_folding(graph: Graph, node: Node, args: list, budget: FoldBudget) -> bool:
    """Whether the node's outputs, sized from their types, may be materialized."""
    named = [name for name in node.outputs if name]
    nbytes = output_nbytes(graph, named)
    if nbytes is None:
        return False  # size unknown until the reference has run, and then it is too late
    elements = sum(_elements(graph.types[name]) for name in named)
    input_elements = sum(np.asarray(a).size for a in args if a is not None)
    if elements > max(_MAX_GROWTH_ELEMENTS, 4 * input_elements):
        return False
    return budget.admits(nbytes)


def _elements(vtype: TensorType) -> int:
    count = 1
    for dim in vtype.shape:
        count *= dim
    return count


def _fold_metadata(graph: Graph, node: Node) -> list[np.ndarray] | None:
    vtype = graph.types.get(node.inputs[0])
    if not isinstance(vtype, TensorType) or not vtype.is_static:
        return None
    # A traced shape folds to its sample's sizes here; shape inference keeps the traced
    # value beside it (ember.core.traced.traced_value).
    opdef = get_op(node.op)
    attrs = opdef.resolve_attrs(node) if opdef else {}
    try:
        # A zero-stride view answers Shape/Size through the reference without allocating.
        dummy = np.lib.stride_tricks.as_strided(np.zeros(1, vtype.dtype.numpy),
                                                shape=vtype.shape,
                                                strides=(0,) * len(vtype.shape))
    except ValueError:
        return None  # more dims or elements than numpy can describe: not ours to fold
    result = opdef.reference(RefContext(node, opdef, lambda *a: []), dummy, **attrs)
    return [np.asarray(result)]
