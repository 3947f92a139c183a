"""Type and shape inference over a whole graph, symbolic dims included.

Each node's types come from its op's ``infer``.  Besides constants, the pass tracks *known
values* of small integer tensors that describe shapes: ``Shape`` of an ``N x 3 x 224 x 224``
tensor is the known value ``[N, 3, 224, 224]`` (an object array of ints and symbols), and the
Gather/Concat/Unsqueeze/Slice/arithmetic that exporters wrap around it are folded by running
their numpy reference on those values.  That is how ``Reshape(x, Concat(Shape(x)[0], -1))``
infers ``N x 512`` instead of an unknown shape.

Declared types (ONNX value_info, graph outputs) fill what inference leaves unknown.  Where both
know a dim they must agree: a declared ``float32[3]`` for a value inferred ``int64[5]`` is a
broken model, and every such value is listed in one ShapeError.  A declared dim that is a symbol
or unknown agrees with anything, and so does an inferred one that is; where a declared number
meets an inferred symbol of the model's named input dims, the symbol stays (the number is an
exporter's sample), and where it meets a symbol inference made up, the number wins.

Which nodes fold depends on what their inputs hold.  Values with symbols (object arrays) go only
through the ops of ``_SYMBOLIC_FOLDABLE``, whose references are written to handle symbols
exactly.  Values that are plain numbers -- every shape tensor once ``specialize`` has bound the
input shapes -- go through *any* op without subgraphs: exporters compute Reshape and Expand
targets with whatever ops they like (the TorchScript exporter's ``Mod`` of a head count,
``Cast``, ``Less``, ``ReduceProd``, ``CumSum`` ...), and a target that stays unknown leaves the
Reshape without a static shape, that is without a kernel.  Running the reference is exact, as in
constant folding.

Known values are folded only when every output is a small static tensor, checked *before* the
reference runs: a ConstantOfShape or Range whose size inference could not bound never
materializes here (constant folding proper, with the memory budget, is ``fold_constants.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.core.dims import Dim, SymDim
from ember.core.errors import EmberError, ShapeError
from ember.core.traced import (as_size, has_traced_dims, is_traced, remember_traced,
                               traced_value)
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.registry import InferContext, RefContext, get_op

# Ops whose reference is exact on arrays that hold symbolic dims (object arrays); any op
# without subgraphs folds values that are plain numbers.
_SYMBOLIC_FOLDABLE = {
    "Shape", "Size", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Cast", "Identity",
    "Add", "Sub", "Mul", "Div", "Reshape", "Equal", "Where", "ConstantOfShape", "Range", "Neg",
    "Max", "Min", "Abs", "ReduceProd", "Expand", "Tile", "Flatten", "Transpose",
}
_MAX_FOLD_ELEMENTS = 4096


def infer_shapes(graph: Graph, outer_known: dict[str, Any] | None = None,
                 outer_types: dict[str, ValueType | None] | None = None, *,
                 check_declared: bool = True,
                 known_out: dict[str, Any] | None = None) -> Graph:
    """Fill ``graph.types`` for every value (in place; also returns the graph).

    ``outer_known``/``outer_types`` are the known values and types of enclosing graphs, for
    subgraphs (If/Loop/Scan bodies), which may read those values by name.
    ``check_declared=False`` lets inferred types replace contradicting recorded ones silently:
    specialization uses it, because by then the recorded types are ember's own inference for
    symbolic shapes (the file's declarations were checked at import), and a dim that a stale
    declaration pinned to the export batch size must yield to the shapes being compiled.
    ``known_out``, when given, receives the known values of this graph's values (symbolic
    dims as ``SymDim`` objects), for analyses that ask what a shape computation depends on.
    """
    known: dict[str, Any] = dict(outer_known or {})
    # a constant that a traced build computed from run-time sizes is known by its sizes
    known.update({k: traced_value(k, v) for k, v in graph.constants.items() if _small(v)})
    outer_types = dict(outer_types or {})
    types = {**outer_types, **graph.types}
    mismatches: list[str] = []
    for node in graph.nodes:
        _infer_node(graph, node, types, known, mismatches, check_declared)
    if known_out is not None:
        known_out.update(known)
    for name, vtype in types.items():
        if vtype is not None and (name not in outer_types or name in graph.types):
            graph.types[name] = vtype
    if mismatches:
        raise ShapeError(f"graph '{graph.name}': {len(mismatches)} value(s) have a declared "
                         f"type that contradicts the inferred one:\n  - "
                         + "\n  - ".join(mismatches)
                         + "\nfix the declared types (value_info / graph outputs) or the "
                           "nodes that produce these values")
    return graph


def _infer_node(graph: Graph, node: Node, types: dict[str, ValueType | None],
                known: dict[str, Any], mismatches: list[str], check_declared: bool) -> None:
    opdef = get_op(node.op)
    if opdef is None:
        return
    opdef.check_arity(node)
    attrs = opdef.resolve_attrs(node)
    input_types = [types.get(name) if name else None for name in node.inputs]

    def constant_of(name: str) -> np.ndarray | None:
        return known.get(name)

    def infer_subgraph(body: Graph, body_input_types: list[ValueType | None]):
        for name, vtype in zip(body.inputs, body_input_types):
            if vtype is not None and body.types.get(name) is None:
                body.types[name] = vtype
        try:
            infer_shapes(body, known, types, check_declared=check_declared)
        except ShapeError:
            # A body may be invalid for shapes it never runs with (the untaken If branch):
            # its outputs are then simply unknown; running it would report the real error.
            return [None] * len(body.outputs)
        return [body.types.get(o) or types.get(o) for o in body.outputs]

    ctx = InferContext(node, opdef, input_types, attrs, constant_of, infer_subgraph)
    try:
        inferred = opdef.infer(ctx)
    except EmberError:
        raise
    except Exception as error:
        raise ShapeError(f"node '{node.name}' ({node.op}): shape inference failed: "
                         f"{type(error).__name__}: {error}") from error
    for index, name in enumerate(node.outputs):
        if not name:
            continue
        new = inferred[index] if index < len(inferred) else None
        declared = types.get(name)
        problem = type_mismatch(declared, new)
        if problem and check_declared:
            mismatches.append(f"value '{name}' (output {index} of node '{node.name}' "
                              f"({node.op})) is declared {declared} but inferred {new}: "
                              f"{problem}")
        types[name] = new if problem else merge_types(new, declared)
    if next(node.subgraphs(), None) is None:  # a body's values are not the node's to know
        _fold_known_value(node, opdef, attrs, known, types)
        for name in node.outputs:
            if name in known:
                remember_traced(name, known[name])


def _fold_known_value(node: Node, opdef, attrs: dict[str, Any], known: dict[str, Any],
                      types: dict[str, ValueType | None]) -> None:
    if node.op == "Shape" and node.inputs:
        _fold_shape(node, attrs, known, types)
        return
    if node.op == "Size" and node.inputs:
        _fold_size(node, known, types)
        return
    if any(name and name not in known for name in node.inputs):
        return  # an input of unknown value: nothing to fold
    for name in node.outputs:  # never materialize a large tensor just to learn its value
        if not name:
            continue
        vtype = types.get(name)
        if not (isinstance(vtype, TensorType) and vtype.is_static):
            return  # of unknown size: running the reference could allocate anything
        if has_traced_dims(vtype.shape):
            return  # (before comparing its size, which would guard the traced dims)
        if _count(vtype.shape) > _MAX_FOLD_ELEMENTS:
            return  # large: never materialize it just to learn its value
    args = []
    for name in node.inputs:
        if not name:
            args.append(None)
            continue
        if name not in known:
            return
        args.append(known[name])
    if node.op not in _SYMBOLIC_FOLDABLE and any(_has_symbols(a) for a in args):
        return  # a reference written for numbers could mistake a symbol for one
    try:
        with np.errstate(all="ignore"):
            result = opdef.reference(RefContext(node, opdef, lambda *a: []), *args, **attrs)
    except Exception:
        return  # folding only sharpens inference; a failure just loses precision
    outputs = list(result) if isinstance(result, tuple) else [result]
    outputs = [np.asarray(v) if isinstance(v, np.generic) else v for v in outputs]
    for name, value in zip(node.outputs, outputs):
        if name and isinstance(value, np.ndarray) and _small(value):
            known[name] = _simplify(value)


def _fold_shape(node: Node, attrs: dict[str, Any], known: dict[str, Any],
                types: dict[str, ValueType | None]) -> None:
    """Shape(x) is known whenever x's shape has no unknown dim, symbolic or not."""
    vtype = types.get(node.inputs[0])
    if not isinstance(vtype, TensorType) or vtype.shape is None:
        return
    rank = len(vtype.shape)
    start = attrs.get("start") or 0
    end = attrs.get("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    dims = vtype.shape[start:end]
    if any(d is None for d in dims):
        return
    known[node.outputs[0]] = _simplify(np.array(list(dims) or [], dtype=object).reshape(len(dims)))


def _fold_size(node: Node, known: dict[str, Any], types: dict[str, ValueType | None]) -> None:
    """Size(x) is known whenever x's shape has no unknown dim."""
    vtype = types.get(node.inputs[0])
    if not isinstance(vtype, TensorType) or vtype.shape is None or None in vtype.shape:
        return
    total: Any = 1
    for d in vtype.shape:
        total = total * d
    known[node.outputs[0]] = _simplify(np.array(total, dtype=object))


def _count(shape) -> int:
    total = 1
    for d in shape:
        total *= as_size(d)
    return total


def _simplify(value: np.ndarray) -> np.ndarray:
    """Object arrays that hold only plain ints become int64 arrays again (a traced size
    stays an object, so that a Reshape of it to the shape of a Shape keeps it traced)."""
    if value.dtype == object and all(isinstance(v, (int, np.integer)) and not is_traced(v)
                                     for v in value.flat):
        return value.astype(np.int64)
    return value


def _has_symbols(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object and \
        any(isinstance(v, SymDim) for v in value.flat)


def _small(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.size <= _MAX_FOLD_ELEMENTS


def type_mismatch(declared: ValueType | None, inferred: ValueType | None) -> str | None:
    """How a declared type contradicts an inferred one, or None when they agree.

    Unknown parts agree with anything, and so do symbolic dims (``N`` may well be 3); only
    concrete disagreements count: element type, kind (tensor/sequence/optional), rank, or a
    dim known on both sides.
    """
    if declared is None or inferred is None:
        return None
    if isinstance(declared, TensorType) and isinstance(inferred, TensorType):
        if declared.dtype != inferred.dtype:
            return f"element type {declared.dtype} is not {inferred.dtype}"
        if declared.shape is None or inferred.shape is None:
            return None
        if len(declared.shape) != len(inferred.shape):
            return f"rank {len(declared.shape)} is not {len(inferred.shape)}"
        for axis, (want, got) in enumerate(zip(declared.shape, inferred.shape)):
            if isinstance(want, int) and isinstance(got, int) and want != got:
                return f"dimension {axis} is {want}, not {got}"
        return None
    for kind in (SequenceType, OptionalType):
        if isinstance(declared, kind) and isinstance(inferred, kind):
            return type_mismatch(declared.elem, inferred.elem)
    return f"a {_kind_name(declared)} is not a {_kind_name(inferred)}"


def types_compatible(declared: ValueType | None, inferred: ValueType | None) -> bool:
    return type_mismatch(declared, inferred) is None


def _kind_name(vtype: ValueType) -> str:
    return {TensorType: "tensor", SequenceType: "sequence", OptionalType: "optional"}.get(
        type(vtype), type(vtype).__name__)


def merge_types(inferred: ValueType | None, declared: ValueType | None) -> ValueType | None:
    """Combine an inferred and a declared type, keeping the most precise knowledge."""
    if inferred is None:
        return declared
    if declared is None:
        return inferred
    if isinstance(inferred, TensorType) and isinstance(declared, TensorType):
        if inferred.shape is None:
            return TensorType(inferred.dtype, declared.shape)
        if declared.shape is None or len(declared.shape) != len(inferred.shape):
            return inferred
        return TensorType(inferred.dtype,
                          tuple(_merge_dim(a, b) for a, b in zip(inferred.shape, declared.shape)))
    if isinstance(inferred, SequenceType) and isinstance(declared, SequenceType):
        return SequenceType(merge_types(inferred.elem, declared.elem))
    if isinstance(inferred, OptionalType) and isinstance(declared, OptionalType):
        return OptionalType(merge_types(inferred.elem, declared.elem))
    return inferred


def _merge_dim(inferred: Dim, declared: Dim) -> Dim:
    if inferred is None:
        return declared
    if isinstance(inferred, SymDim) and isinstance(declared, int):
        # A dim that follows the model's named input dims keeps its symbol: the number is the
        # exporter's sample (the TorchScript exporter declares outputs at the traced sizes
        # unless they are named dynamic too); a size inference could not name (a fresh
        # symbol) takes the declared number.
        if inferred.symbols and not any(s.startswith("_") for s in inferred.symbols):
            return inferred
        return declared
    if isinstance(inferred, SymDim) and isinstance(declared, SymDim) and \
            all(s.startswith("_") for s in inferred.symbols):
        return declared  # prefer the user's symbol names over fresh ones
    return inferred
