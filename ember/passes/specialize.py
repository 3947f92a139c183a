"""Bind a graph's input shapes to concrete sizes before compilation.

ember compiles for static shapes: symbolic dims of the inputs (``N``) are bound from the shapes
the user gives (or that the first call brings), and shape inference then makes every value
static where the graph allows it.
"""

from __future__ import annotations

import copy
from typing import Mapping, Sequence

from ember.core.dims import SymDim
from ember.core.errors import InputError
from ember.ir.graph import Graph
from ember.ir.types import TensorType


def specialize(graph: Graph, input_shapes: Mapping[str, Sequence[int]]) -> Graph:
    """A copy of ``graph`` with static input shapes and re-inferred types."""
    from ember.passes.infer_shapes import infer_shapes

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
        shape = tuple(int(d) for d in shape)
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
    return infer_shapes(bound)
