"""Bind a graph's input shapes to concrete sizes before compilation.

ember compiles for static shapes: symbolic dims of the inputs (``N``) are bound from the shapes
the user gives (or that the first call brings), and shape inference then makes every value
static where the graph allows it.

The graph is verified first (a Graph may come from anywhere, not only from the ONNX importer,
which verifies too), and once every size is known no value may exceed the memory budget
(``ember.passes.memory_budget``): a 96 GB intermediate is refused here, by name, before any
pass tries to allocate it.
"""

from __future__ import annotations

import copy
from typing import Mapping, Sequence

from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.dims import SymDim
from ember.core.traced import is_traced
from ember.core.errors import InputError
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.passes.memory_budget import check_value_sizes
from ember.passes.verify import verify_graph


def specialize(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
               memory_limit: int | None = None) -> Graph:
    """A copy of ``graph`` with static input shapes and re-inferred types.

    ``memory_limit`` (bytes; default ``ember.core.config.memory_limit()``) bounds every value.
    """
    from ember.passes.infer_shapes import infer_shapes

    verify_graph(graph, stage="before specialization")
    bound = copy.deepcopy(graph)
    bindings: dict[str, int] = {}
    for name in graph.inputs:
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType):
            continue
        shape = input_shapes.get(name)
        if shape is None:
            if vtype.is_static:
                continue
            raise InputError(f"input '{name}' has a dynamic shape {vtype}; give its concrete "
                             f"shape (input_shapes={{'{name}': (...)}})")
        # A traced size (ember.core.traced) stays traced: the build is then valid for every
        # size its guards allow, not for this one only.
        shape = tuple(d if is_traced(d) else int(d) for d in shape)
        if any(size < 0 for size in shape):
            raise InputError(f"input '{name}': shape {shape} has a negative dimension")
        if vtype.shape is not None:
            if len(shape) != len(vtype.shape):
                raise InputError(f"input '{name}': shape {shape} has rank {len(shape)}, the "
                                 f"model expects {vtype}")
            for axis, (dim, size) in enumerate(zip(vtype.shape, shape)):
                if isinstance(dim, int) and dim != size:
                    raise InputError(f"input '{name}': dimension {axis} must be {dim}, "
                                     f"got {size}")
                if isinstance(dim, SymDim) and len(dim.symbols) == 1 and \
                        dim.terms == ((((next(iter(dim.symbols)),)), 1),):
                    symbol = next(iter(dim.symbols))
                    if bindings.setdefault(symbol, size) != size:
                        raise InputError(f"input '{name}': dimension {axis} ('{symbol}') is "
                                         f"{size} but another input binds it to "
                                         f"{bindings[symbol]}")
        bound.types[name] = TensorType(vtype.dtype, shape)
    inputs = set(bound.inputs)
    for name in list(bound.types):
        declared = bound.types[name]
        if name in inputs or name in bound.constants:
            continue
        if not (isinstance(declared, TensorType) and declared.is_static):
            del bound.types[name]  # symbolic or partial: inference recomputes it
    infer_shapes(bound, check_declared=False)
    check_value_sizes(bound, resolve_memory_limit(memory_limit))
    return bound
