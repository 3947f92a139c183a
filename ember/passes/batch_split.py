"""Whether a graph computes every sample of its batch on its own.

When it does, one compiled specialization serves every batch size: a call with ``n`` samples
runs the code compiled for a block of ``B`` samples on rows ``[i*B, (i+1)*B)`` of the inputs
and writes the matching rows of the outputs (``ember.runtime.blocks``).  That is how a model
with a dynamic batch stops compiling a new variant for every size it is called with.

The analysis is a forward walk over the graph with symbolic shapes, before specialization.
The batch symbol ``N`` is the one dim every batch-carrying input has first; each value is

* ``STATIC``: does not depend on ``N`` at all (weights, constants, inputs without ``N``);
* ``BATCH``: its first dim is ``N*k`` (``k`` free of ``N``), no other dim mentions ``N``, and
  in row-major order sample ``i`` owns the ``i``-th contiguous chunk of it;
* ``SIZE``: a small value computed from the batch size (``Shape(x)[0]``, a target shape built
  from it), which may only feed the shape argument of Reshape, Expand or ConstantOfShape:
  there, evaluating it for ``B`` instead of ``N`` gives exactly the block's shape.

Every op that reads a BATCH or SIZE value must keep samples apart, which is a property of the
op and its attributes, not of shapes: Softmax over axis 0 or Concat along axis 0 keep the
shape rules intact yet mix samples.  So the ops are an explicit table (:data:`RULES`); an op
not in it, or used in a way its rule does not accept, makes the whole graph "not separable",
and the reason names the node.  The model then compiles a specialization per batch size, as
it always did: the analysis may be conservative, never wrong.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ember.core.dims import SymDim, exact_divide, sym
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import get_op
from ember.passes.batch_index import (IndexKind, gathers_own_rows, index_kind_of,
                                      is_sample_range, slice_keeps_rows)


class Kind(enum.Enum):
    STATIC = "static"
    BATCH = "batch"
    SIZE = "size"
    # computed from batch data but read only by Shape/Size: its values never matter (the
    # dynamo exporter's broadcast of two index ranges through Max, to take its shape)
    SHAPE_ONLY = "shape only"


@dataclass(frozen=True)
class Moved:
    """Batch data with the batch at ``axis`` (not first).

    The SDPA decomposition of core ATen writes ``[B,H,S,D] -> [S,B,H,D] -> [B,H,S,D]`` around
    a copy to pick a memory layout; a recurrent layer takes its sequence and states with the
    batch second.  Such a value keeps its samples apart as long as only layout ops and
    recurrent layers touch it; a Transpose that brings the batch back first makes it BATCH
    again.  Any other op reading it makes the graph not separable (the analysis stays
    conservative)."""

    axis: int


# Ops that may read a Moved value: they carry the batch axis along unchanged.
_AXIS_PRESERVING = frozenset({"Identity", "Cast", "Neg", "Relu", "Abs"})


@dataclass(frozen=True)
class BatchSplit:
    """How to run a separable graph block by block.

    ``inputs``: the inputs whose first dim is the batch (split along axis 0); the others are
    passed whole to every block.  ``batch_outputs``: the outputs whose first dim is ``k*N``
    (their blocks are concatenated); the other outputs do not depend on the batch and are
    taken from the first block.  ``output_axes``: the batch outputs whose batch is another
    axis (a recurrent layer's final states, ``[layers, N, hidden]``), with that axis; their
    blocks are concatenated along it.
    """

    symbol: str
    inputs: tuple[str, ...]
    batch_outputs: tuple[str, ...]
    output_axes: tuple[tuple[str, int], ...] = ()


class NotSeparable(Exception):
    """The graph may combine samples; the message says where."""


def analyze_batch_split(graph: Graph, known: dict[str, object] | None = None) -> BatchSplit:
    """The :class:`BatchSplit` of ``graph``, or :class:`NotSeparable` saying why not.
    ``known``: the values shape inference knows, when the caller has just inferred them."""
    symbol = batch_symbol(graph)
    if known is None:
        known = _known_values(graph)
    kinds: dict[str, Kind | IndexKind] = {name: Kind.STATIC for name in graph.constants}
    batch_inputs = []
    for name in graph.inputs:
        vtype = _tensor_type(graph, name)
        if _mentions(vtype, symbol):
            if _batch_factor(vtype, symbol) != 1:
                raise NotSeparable(f"input '{name}' is {vtype}: the batch symbol '{symbol}' "
                                   f"must be its first dim and appear nowhere else")
            kinds[name] = Kind.BATCH
            batch_inputs.append(name)
        else:
            kinds[name] = Kind.STATIC
    shape_only = _read_for_shape_only(graph)
    for node in graph.nodes:
        if id(node) in shape_only:
            _visit_shape_only(node, kinds)
            continue
        _visit(graph, node, kinds, known, symbol)
        for name in node.outputs:
            # a shape computation whose value is known and free of N (the sequence length
            # read from the input's shape, a Range over it) is the same for every block
            if name in known and kinds.get(name) is Kind.SIZE and \
                    not _value_mentions(known[name], symbol):
                kinds[name] = Kind.STATIC
    batch_outputs = []
    output_axes = []
    for name in graph.outputs:
        kind = kinds.get(name, Kind.STATIC)
        if kind is Kind.SIZE or isinstance(kind, IndexKind):
            raise NotSeparable(f"output '{name}' is computed from the batch size itself")
        if isinstance(kind, Moved):
            batch_outputs.append(name)
            output_axes.append((name, kind.axis))
        elif kind is Kind.BATCH:
            batch_outputs.append(name)
    return BatchSplit(symbol, tuple(batch_inputs), tuple(batch_outputs), tuple(output_axes))


def analyze_batch_split_at(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> BatchSplit:
    """:func:`analyze_batch_split` of ``graph`` with every input dim but the batch bound to
    ``shapes`` (the sizes of a call).

    Without the other sizes some shapes are unknowable: ``x[:, :1]`` of a dim ``S`` has ``1``
    element only when ``S >= 1``, and a graph with such a value cannot be analysed at all.
    Bound, they are plain numbers and only the batch stays symbolic; the answer then holds
    for calls with these other sizes (the caller asks again for others).
    """
    from ember.passes.infer_shapes import infer_shapes

    symbol = batch_symbol(graph)
    bound = Graph(name=graph.name, inputs=list(graph.inputs), outputs=list(graph.outputs),
                  nodes=list(graph.nodes), types={}, constants=dict(graph.constants),
                  metadata=dict(graph.metadata))
    for name, vtype in graph.types.items():
        if name in graph.constants or (isinstance(vtype, TensorType) and vtype.is_static):
            bound.types[name] = vtype  # symbolic or partial types are inferred again
    for name in graph.inputs:
        vtype = graph.types.get(name)
        shape = shapes.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None or shape is None or \
                len(shape) != len(vtype.shape):
            raise NotSeparable(f"input '{name}' has no shape to bind ({vtype})")
        bound.types[name] = TensorType(vtype.dtype, tuple(
            dim if isinstance(dim, SymDim) and symbol in dim.symbols else int(size)
            for dim, size in zip(vtype.shape, shape)))
    known: dict[str, object] = {}
    infer_shapes(bound, check_declared=False, known_out=known)
    return analyze_batch_split(bound, known)


def batch_split_for(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> BatchSplit:
    """How calls with ``shapes`` are served in blocks: decided on the symbolic graph, or,
    when other dynamic dims hide it, with them bound to ``shapes``
    (:func:`analyze_batch_split_at`).  :class:`NotSeparable` says why not."""
    try:
        return analyze_batch_split(graph)
    except NotSeparable:
        if not mentions_other_symbols(graph):
            raise
    return analyze_batch_split_at(graph, shapes)


def mentions_other_symbols(graph: Graph) -> bool:
    """Whether an input has a symbolic dim other than the batch symbol (so that binding the
    other dims, :func:`analyze_batch_split_at`, may decide what the symbolic graph cannot)."""
    try:
        symbol = batch_symbol(graph)
    except NotSeparable:
        return False
    return any(isinstance(d, SymDim) and d.symbols - {symbol}
               for name in graph.inputs
               for d in (getattr(graph.types.get(name), "shape", None) or ()))


# ----------------------------------------------------------------------------- values
def _known_values(graph: Graph) -> dict[str, object]:
    """The values shape inference knows (shape computations, with symbols), per name."""
    from ember.passes.infer_shapes import infer_shapes

    known: dict[str, object] = {}
    scratch = Graph(name=graph.name, inputs=list(graph.inputs), outputs=list(graph.outputs),
                    nodes=list(graph.nodes), types=dict(graph.types),
                    constants=dict(graph.constants), metadata=dict(graph.metadata))
    infer_shapes(scratch, check_declared=False, known_out=known)
    return known


def _value_mentions(value: object, symbol: str) -> bool:
    return any(isinstance(v, SymDim) and symbol in v.symbols
               for v in np.asarray(value, dtype=object).reshape(-1))


def batch_symbol(graph: Graph) -> str:
    """The one symbol that starts the shapes of the inputs that have symbolic dims."""
    leading = set()
    for name in graph.inputs:
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            raise NotSeparable(f"input '{name}' has no known shape")
        if vtype.shape and _is_symbol(vtype.shape[0]):
            leading.add(next(iter(vtype.shape[0].symbols)))
    if len(leading) != 1:
        raise NotSeparable("no input has a symbolic batch dim first" if not leading else
                           f"the inputs start with different symbols {sorted(leading)}")
    return leading.pop()


def _is_symbol(dim: object) -> bool:
    return isinstance(dim, SymDim) and len(dim.terms) == 1 and dim.terms[0][1] == 1 and \
        len(dim.terms[0][0]) == 1


def _tensor_type(graph: Graph, name: str) -> TensorType:
    vtype = graph.types.get(name)
    if not isinstance(vtype, TensorType) or vtype.shape is None or \
            any(d is None for d in vtype.shape):
        raise NotSeparable(f"value '{name}' has no known shape ({vtype})")
    return vtype


def _mentions(vtype: TensorType, symbol: str) -> bool:
    return any(isinstance(d, SymDim) and symbol in d.symbols for d in vtype.shape)


def _batch_factor(vtype: TensorType, symbol: str) -> object | None:
    """``k`` when the first dim is ``k*N`` with ``k`` free of ``N`` and no other dim mentions
    ``N``; None otherwise."""
    if not vtype.shape:
        return None
    first = vtype.shape[0]
    if not isinstance(first, SymDim):
        return None
    k = exact_divide(first, sym(symbol))
    if k is None or (isinstance(k, SymDim) and symbol in k.symbols) or k == 0:
        return None
    if any(isinstance(d, SymDim) and symbol in d.symbols for d in vtype.shape[1:]):
        return None
    return k


# ----------------------------------------------------------------------------- the walk
@dataclass
class _Use:
    """What a rule sees of one node."""

    graph: Graph
    node: Node
    attrs: dict
    kinds: list[Kind | None]  # per input; None for an empty optional input
    symbol: str
    known: dict  # known values of shape computations (``infer_shapes``)

    def kind(self, index: int) -> Kind | None:
        return self.kinds[index] if index < len(self.kinds) else None

    def rank(self, index: int) -> int:
        return len(_tensor_type(self.graph, self.node.inputs[index]).shape)

    def out_rank(self) -> int:
        return len(_tensor_type(self.graph, self.node.outputs[0]).shape)

    def const(self, index: int) -> np.ndarray | None:
        """The constant at input ``index`` (None when it is absent or not a constant)."""
        if index >= len(self.node.inputs) or not self.node.inputs[index]:
            return None
        return self.graph.constants.get(self.node.inputs[index])

    def fail(self, why: str) -> NotSeparable:
        return NotSeparable(f"node '{self.node.name}' ({self.node.op}) {why}")


Rule = Callable[[_Use], None]


def _visit(graph: Graph, node: Node, kinds: dict, known: dict, symbol: str) -> None:
    if any(True for _ in node.subgraphs()):
        if any(kinds.get(n) not in (None, Kind.STATIC) for n in node.implicit_inputs()) or \
                any(kinds.get(n, Kind.STATIC) is not Kind.STATIC for n in node.inputs if n):
            raise NotSeparable(f"node '{node.name}' ({node.op}) runs a subgraph on batch data")
    input_kinds = [kinds.get(n, Kind.STATIC) if n else None for n in node.inputs]
    if all(k in (None, Kind.STATIC) for k in input_kinds):
        for name in node.outputs:
            if name:
                kinds[name] = Kind.STATIC
        return
    if node.op in ("Shape", "Size") and Kind.SHAPE_ONLY in input_kinds:
        kinds[node.outputs[0]] = Kind.SIZE
        return
    own_rows = False  # a GatherND of each sample's own rows (the sample-index idiom)
    if any(isinstance(k, IndexKind) for k in input_kinds):
        if node.op in ("Shape", "Size"):
            kinds[node.outputs[0]] = Kind.SIZE  # the shape of an index tensor, not its values
            return
        if not gathers_own_rows(graph, node, kinds, known, symbol):
            kind = index_kind_of(graph, node, kinds, known, symbol)
            if kind is None:
                raise NotSeparable(f"node '{node.name}' ({node.op}) uses the index of each "
                                   f"sample other than to read that sample's own rows")
            kinds[node.outputs[0]] = kind
            return
        own_rows = True
        input_kinds = [Kind.BATCH, Kind.STATIC]
    elif is_sample_range(node, kinds, known, symbol):
        kinds[node.outputs[0]] = IndexKind.SAMPLE
        return
    if _follows_a_moved_batch(graph, node, input_kinds, kinds, symbol):
        return
    opdef = get_op(node.op)
    rule = RULES.get(node.op)
    if opdef is None or rule is None:
        raise NotSeparable(f"node '{node.name}' ({node.op}) reads batch data and is not known "
                           f"to keep samples apart")
    use = _Use(graph, node, opdef.resolve_attrs(node), input_kinds, symbol, known)
    if Kind.SIZE in input_kinds and Kind.BATCH not in input_kinds and \
            node.op not in SHAPE_ARGUMENT_OPS:
        if node.op not in SIZE_OPS:
            raise use.fail("computes with the batch size other than as a shape")
        for name in node.outputs:
            if name:
                if _mentions(_tensor_type(graph, name), symbol):
                    raise use.fail("makes a tensor whose size and values follow the batch size")
                kinds[name] = Kind.SIZE
        return
    if not own_rows:
        rule(use)
    for name in node.outputs:
        if not name:
            continue
        vtype = _tensor_type(graph, name)
        if _batch_factor(vtype, symbol) is not None:
            kinds[name] = Kind.BATCH
        elif node.op in SHAPE_ARGUMENT_OPS and Kind.BATCH not in input_kinds and \
                not _mentions(vtype, symbol):
            kinds[name] = Kind.STATIC  # a constant fill or broadcast of constants
        elif node.op in ("Shape", "Size") and not _mentions(vtype, symbol):
            kinds[name] = Kind.SIZE
        else:
            raise use.fail(f"makes '{name}' of shape {vtype} from batch data: its samples are "
                           f"no longer its leading rows")


def _read_for_shape_only(graph: Graph) -> set[int]:
    """Ids of the nodes whose outputs only Shape/Size nodes read, directly or through other
    such nodes (and no graph output is among them)."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in [*node.inputs, *node.implicit_inputs()]:
            if name:
                readers.setdefault(name, []).append(node)
    outputs = set(graph.outputs)
    found: set[int] = set()
    for node in reversed(graph.nodes):
        if node.op in ("Shape", "Size") or any(node.subgraphs()):
            continue
        names = [n for n in node.outputs if n]
        if names and not outputs.intersection(names) and all(
                reader.op in ("Shape", "Size") or id(reader) in found
                for name in names for reader in readers.get(name, [])) and \
                any(readers.get(name) for name in names):
            found.add(id(node))
    return found


def _visit_shape_only(node: Node, kinds: dict) -> None:
    """A node read only for its shape: its outputs' values do not matter (Shape of them is
    then SIZE, as Shape of any batch value is)."""
    static = all(kinds.get(n, Kind.STATIC) is Kind.STATIC for n in node.inputs if n)
    for name in node.outputs:
        if name:
            kinds[name] = Kind.STATIC if static else Kind.SHAPE_ONLY


def _follows_a_moved_batch(graph: Graph, node: Node, input_kinds: list, kinds: dict,
                           symbol: str) -> bool:
    """Set the kinds of a node that makes or reads values whose batch is not first (see
    :class:`Moved`): a Transpose that moves the batch axis, a fill shaped by the batch at
    another axis, a recurrent layer (its time axis first), and the layout ops that carry a
    moved batch along.  False for every other node."""
    moved = [k for k in input_kinds if isinstance(k, Moved)]
    if node.op in _RECURRENT and any(k not in (None, Kind.STATIC) for k in input_kinds):
        _recurrent(graph, node, input_kinds, kinds, symbol)
        return True
    if not moved:
        if node.op in ("Expand", "ConstantOfShape") and Kind.BATCH not in input_kinds:
            return _fill_shaped_by_the_batch(graph, node, kinds, symbol)
        transposes = node.op == "Transpose" and input_kinds[0] is Kind.BATCH and \
            _batch_axis_after(node, 0) not in (None, 0)
        reranks = node.op in ("Squeeze", "Unsqueeze") and input_kinds[0] is Kind.BATCH and \
            _only_batch_axis(graph, node.outputs[0], symbol) not in (None, 0)
        if not (transposes or reranks):
            return False
    axis = moved[0].axis if moved else 0
    if node.op in ("Shape", "Size"):
        kinds[node.outputs[0]] = Kind.SIZE  # as the shape of any batch data
        return True
    if moved:
        _check_moved_use(graph, node, input_kinds, axis)
    if node.op in ("Squeeze", "Unsqueeze"):
        # a rank change only: the batch is the one axis of the output that has it
        found = _only_batch_axis(graph, node.outputs[0], symbol)
        axis = -1 if found is None else found
    if node.op == "Transpose":
        axis = _batch_axis_after(node, axis)
        if axis is None:
            raise NotSeparable(f"node '{node.name}' (Transpose) reverses the axes of batch "
                               f"data")
    _set_batch_axis(graph, node, node.outputs[0], axis, kinds, symbol)
    return True


def _check_moved_use(graph: Graph, node: Node, input_kinds: list, axis: int) -> None:
    """Refuse a node that reads a moved batch other than as a layout op that keeps the
    batch axis where it is (or, a Transpose, moves it)."""
    def fail(why: str) -> NotSeparable:
        return NotSeparable(f"node '{node.name}' ({node.op}) reads batch data whose batch is "
                            f"at axis {axis}{why}")

    if node.op == "Transpose" or (node.op in _AXIS_PRESERVING and len(node.inputs) == 1):
        return
    if node.op in ("Squeeze", "Unsqueeze") and isinstance(input_kinds[0], Moved) and \
            all(k in (None, Kind.STATIC) for k in input_kinds[1:]):
        return
    data_moved = isinstance(input_kinds[0], Moved)
    others_static = all(k in (None, Kind.STATIC, Kind.SIZE) for k in input_kinds[1:])
    if node.op == "Slice" and data_moved and others_static:
        axes = _constant_ints(graph, node, 3)
        rank = len(_tensor_type(graph, node.inputs[0]).shape)
        if axes is None and len(node.inputs) > 3 and node.inputs[3]:
            raise fail(" (slice axes known only at run time)")
        sliced = range(rank) if axes is None else [a % rank for a in axes]
        if axis in sliced and not _keeps_axis(graph, node, axis):
            raise fail(" (slices along it)")
        return
    if node.op == "Expand" and data_moved and others_static:
        before = _tensor_type(graph, node.inputs[0]).shape
        after = _tensor_type(graph, node.outputs[0]).shape
        if len(before) != len(after) or str(before[axis]) != str(after[axis]):
            raise fail(" (broadcasts along it)")
        return
    if node.op == "Reshape" and data_moved and others_static:
        before = _tensor_type(graph, node.inputs[0]).shape[:axis + 1]
        after = _tensor_type(graph, node.outputs[0]).shape[:axis + 1]
        if len(after) != len(before) or any(str(a) != str(b) for a, b in zip(before, after)):
            raise fail(" (reshapes the axes up to it)")
        return
    if node.op == "Concat" and all(k in (None, Kind.STATIC) or k == Moved(axis)
                                   for k in input_kinds) and \
            all(isinstance(k, Moved) for k in input_kinds if k is not None):
        rank = len(_tensor_type(graph, node.outputs[0]).shape)
        if int(node.attrs.get("axis", 0)) % rank == axis:
            raise fail(" (joins along it)")
        return
    raise fail("")


def _keeps_axis(graph: Graph, node: Node, axis: int) -> bool:
    """Whether a Slice leaves axis ``axis`` whole (its size unchanged)."""
    before = _tensor_type(graph, node.inputs[0]).shape[axis]
    after = _tensor_type(graph, node.outputs[0]).shape[axis]
    return str(before) == str(after)


def _constant_ints(graph: Graph, node: Node, index: int) -> list[int] | None:
    if index >= len(node.inputs) or not node.inputs[index]:
        return None
    value = graph.constants.get(node.inputs[index])
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def _set_batch_axis(graph: Graph, node: Node, name: str, axis: int, kinds: dict,
                    symbol: str) -> None:
    """``name`` is batch data with its batch at ``axis`` (BATCH at 0, else Moved), which its
    type must confirm."""
    vtype = _tensor_type(graph, name)
    if axis == 0 and _batch_factor(vtype, symbol) is not None:
        kinds[name] = Kind.BATCH
    elif 0 < axis < len(vtype.shape) and \
            _batch_factor(_axis_first(vtype, axis), symbol) is not None:
        kinds[name] = Moved(axis)
    else:
        raise NotSeparable(f"node '{node.name}' ({node.op}) makes '{name}' of shape {vtype} "
                           f"from batch data: its batch axis is lost")


def _only_batch_axis(graph: Graph, name: str, symbol: str) -> int | None:
    """The one axis of ``name``'s type whose size mentions the batch (None: none or more)."""
    vtype = _tensor_type(graph, name)
    axes = [a for a, d in enumerate(vtype.shape or ())
            if isinstance(d, SymDim) and symbol in d.symbols]
    return axes[0] if len(axes) == 1 else None


def _fill_shaped_by_the_batch(graph: Graph, node: Node, kinds: dict, symbol: str) -> bool:
    """A constant fill (zero initial states) whose shape has the batch at one axis other
    than the first: the same values for every sample, so a moved batch."""
    axis = _only_batch_axis(graph, node.outputs[0], symbol)
    if axis in (None, 0):
        return False
    _set_batch_axis(graph, node, node.outputs[0], axis, kinds, symbol)
    return True


# ONNX recurrent layers: X is (steps, batch, features) with layout 0, (batch, steps, ...) with 1
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})


def _recurrent(graph: Graph, node: Node, input_kinds: list, kinds: dict, symbol: str) -> None:
    """A recurrent layer runs each sample's sequence on its own: X, the initial states and
    sequence_lens carry the batch (moved to axis 1 with layout 0), the weights are static;
    Y has it at axis 2 (layout 0) or 0, Y_h and Y_c at axis 1 or 0."""
    batch_first = int(node.attrs.get("layout", 0)) == 1
    state_kind = Kind.BATCH if batch_first else Moved(1)
    expected = {0: state_kind, 4: Kind.BATCH, 5: state_kind, 6: state_kind}
    for index, kind in enumerate(input_kinds):
        if kind is None or (kind is Kind.STATIC and index not in (0, 4, 5, 6)):
            continue
        if index not in expected or kind != expected[index]:
            raise NotSeparable(f"node '{node.name}' ({node.op}) reads batch data at input "
                               f"{index} other than as a sequence, sequence lengths or "
                               f"initial states of each sample")
    for position, name in enumerate(node.outputs):
        if name:
            axis = (0 if batch_first else 2) if position == 0 else (0 if batch_first else 1)
            _set_batch_axis(graph, node, name, axis, kinds, symbol)


def _batch_axis_after(node: Node, axis: int) -> int | None:
    """Where a Transpose puts input axis ``axis`` (None: a reversal without ``perm``)."""
    perm = node.attrs.get("perm")
    if perm is None or not len(perm):
        return None
    return [int(p) for p in perm].index(axis)


def _axis_first(vtype: TensorType, axis: int) -> TensorType:
    shape = list(vtype.shape)
    return TensorType(vtype.dtype, (shape[axis], *shape[:axis], *shape[axis + 1:]))


# ----------------------------------------------------------------------------- rules
def _per_element(use: _Use) -> None:
    """Elementwise and broadcasting ops: every batch input lines up with the output."""
    if Kind.SIZE in use.kinds:
        raise use.fail("computes with the batch size other than as a shape")
    out_type = _tensor_type(use.graph, use.node.outputs[0])
    for index, kind in enumerate(use.kinds):
        if kind is Kind.BATCH:
            in_type = _tensor_type(use.graph, use.node.inputs[index])
            if len(in_type.shape) != len(out_type.shape) or in_type.shape[0] != out_type.shape[0]:
                raise use.fail(f"broadcasts batch input {index} {in_type} to {out_type}")


def _data_batched(use: _Use) -> None:
    """Ops that work on each sample (``N C ...`` or row by row) when the batch data is their
    first input and every other input (weights, axes, sizes) is a constant."""
    if use.kind(0) is not Kind.BATCH:
        raise use.fail("reads batch data other than as its first input")
    for index, kind in enumerate(use.kinds[1:], start=1):
        if kind not in (None, Kind.STATIC):
            raise use.fail(f"reads batch data or the batch size as input {index}")


def _not_axis_zero(axis_of: Callable[[_Use], list[int] | None]) -> Rule:
    """Ops that combine elements along some axes: none of them may be axis 0."""
    def rule(use: _Use) -> None:
        _data_batched(use)
        axes = axis_of(use)
        rank = use.rank(0)
        if axes is None:
            raise use.fail("has axes that are not constants")
        if any(a % max(rank, 1) == 0 for a in axes):
            raise use.fail(f"works along axis 0, the batch (axes {axes})")
    return rule


def _attr_axis(name: str = "axis") -> Callable[[_Use], list[int] | None]:
    return lambda use: [int(use.attrs[name])]


def _from_axis(name: str = "axis") -> Callable[[_Use], list[int] | None]:
    """Every axis from ``axis`` on (LayerNormalization's normalized axes)."""
    def axes(use: _Use) -> list[int]:
        rank = use.rank(0)
        start = int(use.attrs[name]) % max(rank, 1)
        return list(range(start, rank))
    return axes


def _reduce_axes(use: _Use) -> list[int] | None:
    """ReduceX's axes: the attribute (older opsets) or input 1; none given is every axis."""
    if "axes" in use.attrs and use.attrs["axes"] is not None:
        axes = list(use.attrs["axes"])
    elif len(use.node.inputs) > 1 and use.node.inputs[1]:
        constant = use.const(1)
        if constant is None:
            return None
        axes = [int(a) for a in np.asarray(constant).reshape(-1)]
    else:
        axes = []
    if not axes:
        if use.attrs.get("noop_with_empty_axes"):
            return []
        return list(range(use.rank(0)))
    return axes


def _const_axis(index: int) -> Callable[[_Use], list[int] | None]:
    def axes(use: _Use) -> list[int] | None:
        constant = use.const(index)
        return None if constant is None else [int(a) for a in np.asarray(constant).reshape(-1)]
    return axes


def _view(use: _Use) -> None:
    """Reshape-like ops: row-major order is kept, so sample ``i`` stays the ``i``-th chunk
    (the output-shape check after the rule makes sure the batch still leads)."""
    if use.kind(0) is not Kind.BATCH:
        raise use.fail("takes the batch size as data")
    for index in range(1, len(use.kinds)):
        if use.kind(index) is Kind.BATCH:
            raise use.fail(f"takes batch data as its shape (input {index})")
        if use.kind(index) is Kind.SIZE and use.node.op not in ("Reshape",):
            raise use.fail(f"takes axes computed from the batch size (input {index})")


def _shape_argument(data: int, shape: int) -> Rule:
    """Expand and ConstantOfShape: the shape may come from the batch size (a block then
    builds its own rows); the data, if batched, must line up with the output."""
    def rule(use: _Use) -> None:
        if use.kind(shape) is Kind.BATCH:
            raise use.fail("takes batch data as a shape")
        if data >= 0 and use.kind(data) is Kind.SIZE:
            raise use.fail("takes the batch size as data")
        if data >= 0 and use.kind(data) is Kind.BATCH:
            out_rank = use.out_rank()
            in_type = _tensor_type(use.graph, use.node.inputs[data])
            out_type = _tensor_type(use.graph, use.node.outputs[0])
            if len(in_type.shape) != out_rank or in_type.shape[0] != out_type.shape[0]:
                raise use.fail(f"broadcasts batch data {in_type} to {out_type}")
    return rule


def _transpose(use: _Use) -> None:
    perm = use.attrs.get("perm")
    if perm is not None and len(perm) and int(perm[0]) != 0:
        raise use.fail(f"moves the batch axis (perm {list(perm)})")
    if perm is None and use.rank(0) > 1:
        raise use.fail("reverses the axes, moving the batch")


def _slice(use: _Use) -> None:
    """Slices along other axes, or along the batch from 0 to its end (``x[:N]``, which
    Dynamo writes for ``x[:, ...]``): the bounds may be the batch size itself."""
    if use.kind(0) is not Kind.BATCH:
        raise use.fail("reads batch data other than as its first input")
    if any(k is Kind.BATCH for k in use.kinds[1:]):
        raise use.fail("has slice bounds computed from batch data")
    if not slice_keeps_rows(use.node, use.known, use.rank(0)):
        raise use.fail("slices along the batch axis (or has starts, axes or steps that are "
                       "not constants)")
    out_type = _tensor_type(use.graph, use.node.outputs[0])
    if out_type.shape[0] != _tensor_type(use.graph, use.node.inputs[0]).shape[0]:
        raise use.fail("cuts samples off the batch")


def _concat(use: _Use) -> None:
    if Kind.SIZE in use.kinds:
        raise use.fail("joins batch data with the batch size")
    if int(use.attrs["axis"]) % use.rank(0) == 0:
        raise use.fail("joins along the batch axis")
    _per_element(use)


def _gather(use: _Use) -> None:
    data, indices = use.kind(0), use.kind(1)
    if data is Kind.BATCH and indices is Kind.STATIC:
        if int(use.attrs["axis"]) % use.rank(0) == 0:
            raise use.fail("picks samples along the batch axis")
        return
    if data is Kind.STATIC and indices is Kind.BATCH:
        return  # a lookup per sample (an embedding); the output check wants the batch first
    raise use.fail("indexes batch data with batch data")


def _gather_nd(use: _Use) -> None:
    """A lookup per sample: constant data indexed by batch data (each tuple addresses the
    data, not the batch).  Batch data indexed by tuples is only the sample-index idiom,
    which ``_visit`` recognizes before any rule."""
    if use.kind(0) is not Kind.STATIC or use.kind(1) is not Kind.BATCH or \
            int(use.attrs.get("batch_dims", 0)):
        raise use.fail("indexes batch data along the batch axis")


def _gather_elements(use: _Use) -> None:
    if use.kind(0) is not Kind.BATCH or use.kind(1) is not Kind.BATCH:
        raise use.fail("needs batch data and batch indices")
    if int(use.attrs["axis"]) % use.rank(0) == 0:
        raise use.fail("picks along the batch axis")
    _per_element(use)


def _matmul(use: _Use) -> None:
    a, b = use.kind(0), use.kind(1)
    rank_a, rank_b = use.rank(0), use.rank(1)
    if Kind.SIZE in (a, b):
        raise use.fail("multiplies by the batch size")
    if b is Kind.BATCH and (rank_b < 3 or (a is Kind.BATCH and rank_a != rank_b)):
        raise use.fail("contracts over the batch (batch data as the right operand)")
    if a is Kind.BATCH and b is Kind.STATIC and rank_a < 2:
        raise use.fail("contracts over the batch (a batch vector as the left operand)")
    if a is Kind.BATCH and b is Kind.BATCH and \
            _tensor_type(use.graph, use.node.inputs[0]).shape[0] != \
            _tensor_type(use.graph, use.node.inputs[1]).shape[0]:
        raise use.fail("multiplies batches of different sizes")


def _einsum(use: _Use) -> None:
    """Every batch operand's first letter is one letter (the batch), the output's first; no
    static operand has it (that would make a weight per sample).  A term opening with
    ``...`` has the batch as its first ellipsis dim, which the output must open with too."""
    if Kind.SIZE in use.kinds:
        raise use.fail("multiplies by the batch size")
    text = str(use.attrs.get("equation", "")).replace(" ", "").replace("...", ".")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    if not arrow or len(terms) != len(use.kinds):
        raise use.fail("has an implicit output or a malformed equation")
    leads = {terms[i][:1] for i, kind in enumerate(use.kinds) if kind is Kind.BATCH}
    if len(leads) != 1 or not output.startswith(next(iter(leads))):
        raise use.fail("does not keep the batch as the first index of its operands and output")
    batch = next(iter(leads))
    for term, kind in zip(terms, use.kinds):
        if kind is Kind.STATIC and batch in term and batch != ".":
            raise use.fail("reads a static operand along the batch index")
        if kind is Kind.BATCH and (term.count(batch) != 1 if batch != "." else False):
            raise use.fail("repeats the batch index in a term")


def _gemm(use: _Use) -> None:
    if use.kind(0) is not Kind.BATCH or any(k not in (None, Kind.STATIC) for k in use.kinds[1:]):
        raise use.fail("takes batch data other than as A")
    if use.attrs.get("transA"):
        raise use.fail("contracts over the batch (transA)")


def _pad(use: _Use) -> None:
    _data_batched(use)
    pads = use.const(1) if len(use.node.inputs) > 1 else None
    if pads is None:
        pads = use.attrs.get("pads")
    if pads is None:
        raise use.fail("has pads that are not constants")
    flat = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = use.const(3)
    rank = use.rank(0)
    axes_list = list(range(rank)) if axes is None else \
        [int(a) % rank for a in np.asarray(axes).reshape(-1)]
    count = len(axes_list)
    for position, axis in enumerate(axes_list):
        if axis == 0 and (flat[position] or flat[position + count]):
            raise use.fail("pads the batch axis")


def _tile(use: _Use) -> None:
    _data_batched(use)
    repeats = use.const(1)
    if repeats is None or int(np.asarray(repeats).reshape(-1)[0]) != 1:
        raise use.fail("repeats along the batch axis")


def _resize(use: _Use) -> None:
    _data_batched(use)
    scales = use.const(2)
    if scales is None or np.asarray(scales).size == 0 or float(np.asarray(scales)[0]) != 1.0:
        raise use.fail("needs constant scales that keep the batch axis (sizes from the batch "
                       "are not followed)")


def _max_pool(use: _Use) -> None:
    _data_batched(use)
    if len(use.node.outputs) > 1 and use.node.outputs[1]:
        raise use.fail("returns indices flattened over the whole tensor, batch included")


def _batch_norm(use: _Use) -> None:
    if use.attrs.get("training_mode"):
        raise use.fail("computes statistics over the batch (training_mode)")
    _data_batched(use)


def _trilu(use: _Use) -> None:
    _data_batched(use)
    if use.rank(0) < 3:
        raise use.fail("masks by row index, and the rows are samples")


def _quantize(use: _Use) -> None:
    _data_batched(use)
    scale = use.const(1)
    if scale is None:
        raise use.fail("has a scale that is not a constant")
    if np.asarray(scale).size > 1 and int(use.attrs.get("axis", 1)) % use.rank(0) == 0:
        raise use.fail("has a scale per sample (axis 0)")


def _conv(use: _Use) -> None:
    _data_batched(use)


_ELEMENTWISE_FAMILIES = ("activation", "elementwise", "logical", "cast")

# Ops whose shape input may be a SIZE value while their data is not batch data: they make a
# batch of rows (each the same) whose count follows the batch size.
SHAPE_ARGUMENT_OPS = frozenset({"Expand", "ConstantOfShape"})

# Ops (with shape-only inputs) that may compute with SIZE values, the batch size read by
# Shape: their results stay SIZE, small N-free tensors of sizes.
SIZE_OPS = frozenset({
    "Gather", "Slice", "Concat", "Squeeze", "Unsqueeze", "Cast", "Add", "Sub", "Mul", "Div",
    "Equal", "Where", "Reshape", "Identity", "Max", "Min", "ReduceProd", "Neg", "Abs",
    "Floor", "Ceil", "Shape", "Size",
})

RULES: dict[str, Rule] = {
    # layout
    "Identity": _view, "Reshape": _view, "Flatten": _view, "Squeeze": _view,
    "Unsqueeze": _view, "Dropout": _data_batched,
    "Shape": lambda use: None, "Size": lambda use: None,
    "Transpose": _transpose, "Expand": _shape_argument(0, 1),
    "ConstantOfShape": _shape_argument(-1, 0),
    "Concat": _concat, "Split": _not_axis_zero(_attr_axis()), "Slice": _slice, "Pad": _pad, "Tile": _tile,
    "Gather": _gather, "GatherElements": _gather_elements,
    "DepthToSpace": _conv, "SpaceToDepth": _conv, "Trilu": _trilu, "Resize": _resize,
    "OneHot": _data_batched,
    # along an axis that must not be the batch
    "Softmax": _not_axis_zero(_attr_axis()), "LogSoftmax": _not_axis_zero(_attr_axis()),
    "Hardmax": _not_axis_zero(_attr_axis()),
    "LpNormalization": _not_axis_zero(_attr_axis()),
    "ArgMax": _not_axis_zero(_attr_axis()), "ArgMin": _not_axis_zero(_attr_axis()),
    "TopK": _not_axis_zero(_attr_axis()),
    "CumSum": _not_axis_zero(_const_axis(1)),
    "LayerNormalization": _not_axis_zero(_from_axis()),
    "RMSNormalization": _not_axis_zero(_from_axis()),
    "MeanVarianceNormalization": _not_axis_zero(lambda use: list(use.attrs["axes"])),
    # per sample by definition (N C spatial...)
    "Conv": _conv, "ConvTranspose": _conv, "AveragePool": _conv, "MaxPool": _max_pool,
    "LpPool": _conv, "GlobalAveragePool": _conv, "GlobalMaxPool": _conv,
    "GlobalLpPool": _conv, "InstanceNormalization": _conv, "GroupNormalization": _conv,
    "LRN": _conv, "BatchNormalization": _batch_norm,
    "MatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum,
    "GatherND": _gather_nd,
    "QuantizeLinear": _quantize, "DequantizeLinear": _quantize,
}
for _name in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
              "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"):
    RULES[_name] = _not_axis_zero(_reduce_axes)


def _register_elementwise() -> None:
    from ember.ops.registry import PatternKind, all_ops

    for name, opdef in all_ops().items():
        if opdef.family in _ELEMENTWISE_FAMILIES and name not in RULES and \
                opdef.pattern in (PatternKind.ELEMENTWISE, PatternKind.BROADCAST) and \
                not ({"axis", "axes"} & set(opdef.attrs)):
            RULES[name] = _per_element


_register_elementwise()
