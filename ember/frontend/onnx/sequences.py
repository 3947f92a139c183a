"""Exporter sequence idioms turned into tensor ops: SplitToSequence read back by SequenceAt.

PyTorch's dynamo exporter writes ``torch.split``/``torch.chunk`` as a ``SplitToSequence``
whose pieces are read back one by one with ``SequenceAt`` at constant positions; its optimizer
usually rewrites that into a ``Split``, but not when it is turned off
(``torch.onnx.export(..., dynamo=True, optimize=False)``).  A compiled model holds tensors
only, so such a sequence would keep the whole model off the compiled path although nothing in
it needs a sequence: when the number of pieces is known at import and every use of the
sequence is a ``SequenceAt`` at a constant position, the pair is exactly a ``Split`` (plus a
``Squeeze`` per piece where SplitToSequence drops the split axis), which this module writes
instead.  Anything else (a sequence that is a graph output, is read by a subgraph or by another
sequence op, a run-time position or split) stays as it is, for the reference executor.
"""

from __future__ import annotations

import numpy as np

from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import get_op


def split_sequences_to_tensors(graph: Graph) -> int:
    """Rewrite the graph's readable-back SplitToSequence nodes (in place); how many.

    The graph's types must be inferred: the piece count of a scalar or absent ``split`` comes
    from the static size of the split axis.  A split of a piece of another split needs that
    piece's type, so callers repeat (inferring the new types in between) while this rewrites
    anything.
    """
    consumers = graph.consumers()
    read_by_subgraphs = {name for node in graph.nodes for name in node.implicit_inputs()}
    replaced: dict[int, list[Node]] = {}  # id of a node -> the nodes that take its place
    count = 0
    for node in graph.nodes:
        if node.op != "SplitToSequence" or node.outputs[0] in graph.outputs or \
                node.outputs[0] in read_by_subgraphs:
            continue
        readers = consumers.get(node.outputs[0], [])
        plan = _plan(graph, node, readers)
        if plan is None:
            continue
        replaced.update(_split_nodes(graph, node, readers, *plan))
        count += 1
    graph.nodes = [new for node in graph.nodes for new in replaced.get(id(node), [node])]
    return count


def _plan(graph: Graph, node: Node, readers: list[Node]
          ) -> tuple[list[int], int, bool, list[int]] | None:
    """(piece sizes, the split axis, whether pieces drop it, the position each reader reads),
    or None when the node is not a plain split read back at constant positions."""
    if not readers or any(r.op != "SequenceAt" or r.inputs[0] != node.outputs[0]
                          for r in readers):
        return None
    data_type = graph.types.get(node.inputs[0])
    if not isinstance(data_type, TensorType) or data_type.shape is None:
        return None
    rank = len(data_type.shape)
    attrs = get_op(node.op).resolve_attrs(node)  # valid: inference resolved them already
    axis = attrs["axis"]
    if not -rank <= axis < rank:
        return None  # malformed: the reference reports it
    dim = data_type.shape[axis % rank]
    split_name = node.inputs[1] if len(node.inputs) > 1 else ""
    split = graph.constants.get(split_name) if split_name else None
    if split_name and split is None:
        return None  # sizes known only at run time
    sizes = _sizes(split, dim)
    if sizes is None:
        return None
    positions = []
    for reader in readers:
        position = graph.constants.get(reader.inputs[1])
        if position is None or np.asarray(position).size != 1 or \
                np.asarray(position).dtype.kind not in "iu":
            return None
        index = int(np.asarray(position).reshape(-1)[0])
        if not -len(sizes) <= index < len(sizes):
            return None  # out of range: the reference reports it
        positions.append(index % len(sizes))
    squeeze = not split_name and not attrs["keepdims"]
    return sizes, axis, squeeze, positions


def _sizes(split: np.ndarray | None, dim) -> list[int] | None:
    """The piece lengths SplitToSequence cuts a static axis of length ``dim`` into."""
    if split is not None:
        split = np.asarray(split)
        if split.dtype.kind not in "iu" or split.ndim > 1:
            return None
        if split.ndim == 1:
            sizes = [int(s) for s in split]
            if any(s < 0 for s in sizes) or (isinstance(dim, int) and sum(sizes) != dim):
                return None
            return sizes or None
    if not isinstance(dim, int) or dim == 0:
        return None
    if split is None:
        return [1] * dim
    size = int(split)
    if size <= 0:
        return None
    return [size] * (dim // size) + ([dim % size] if dim % size else [])


def _split_nodes(graph: Graph, node: Node, readers: list[Node], sizes: list[int], axis: int,
                 squeeze: bool, positions: list[int]) -> dict[int, list[Node]]:
    """What replaces ``node`` and each of its readers (by id): a Split for the node; for a
    reader nothing (the Split writes its output directly), an Identity (a second reader of the
    same piece) or a Squeeze of the split axis.  Readers follow the node, so all of these
    follow the Split."""
    pieces = [graph.fresh_name(f"{node.name}_piece{i}") for i in range(len(sizes))]
    result: dict[int, list[Node]] = {}
    claimed: set[int] = set()
    for reader, position in zip(readers, positions):
        output = reader.outputs[0]
        if squeeze:
            axes = graph.add_constant(np.array([axis], np.int64), hint=f"{node.name}_axes")
            result[id(reader)] = [Node("Squeeze", [pieces[position], axes], [output],
                                       name=f"{reader.name}_squeeze")]
        elif position not in claimed:
            claimed.add(position)
            pieces[position] = output
            result[id(reader)] = []
        else:
            result[id(reader)] = [Node("Identity", [pieces[position]], [output],
                                       name=f"{reader.name}_identity")]
    lengths = graph.add_constant(np.array(sizes, np.int64), hint=f"{node.name}_lengths")
    result[id(node)] = [Node("Split", [node.inputs[0], lengths], pieces, {"axis": axis},
                             name=f"{node.name}_split")]
    for name in [node.outputs[0]] + [r.outputs[0] for r in readers]:
        graph.types.pop(name, None)  # re-inferred for their new producers
    return result
