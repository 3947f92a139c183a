"""The sample-index idiom of the batch-split analysis (``batch_split.py``).

transformers builds its attention masks with index arithmetic over the batch: through
``torch.export`` (and so ``torch.compile`` and the dynamo ONNX exporter) the padding mask is
read as ``mask[arange(N)[:, None, None, None], kv_index]``, which becomes

    i    = Range(0, N, 1)                       # the index of each sample
    i4   = Unsqueeze(i) ...                     # [N, 1, 1, 1]
    i4'  = Where(Less(i4, 0), Add(i4, N), i4)   # Python's negative-index wrap: never taken
    idx  = Concat(Expand(i4'), kv, axis=-1)     # (sample, kv) pairs
    out  = GatherND(mask, idx)                  # mask[i, kv] for the rows of sample i

The TorchScript exporter writes the same read with flat indices into the flattened mask:

    i    = Unsqueeze(Range(0, N, 1)) ...         # [N, 1, 1, 1]
    flat = Add(Mul(i, S), Unsqueeze(Range(0, S, 1)))   # i*S + kv, kv in [0, S)
    out  = Gather(Flatten(mask), flat, axis=0)   # rows i*S .. i*S + S - 1: sample i's own

Every sample reads only its own row of ``mask``, so blocks are fine -- but the values of ``i``
follow the global sample number, so the general rules refuse Range(0, N).  The kinds here
follow such an index exactly: ``SAMPLE`` (every element of row ``i`` is ``i``), ``FALSE`` (a
comparison that cannot hold, since ``0 <= i``), ``UNUSED`` (arithmetic on ``i`` that only the
never-taken branch of a Where reads), ``SAMPLE_TUPLE`` (index tuples whose first component
is ``SAMPLE``), ``SCALED`` (``i * R`` for a row stride ``R``) and ``FLAT_ROWS`` (``i * R + k``
with every ``k`` in ``[0, R)``: flat indices of the ``R`` rows of sample ``i``, which a Gather
may read from data of ``R * N`` rows).  In a block the indices count from 0 within the block,
and the block's rows of the data are exactly the rows they address.  Any other use of these
values is refused.
"""

from __future__ import annotations

import enum

import numpy as np

from ember.core.dims import SymDim, sym
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType


class IndexKind(enum.Enum):
    SAMPLE = "sample"
    FALSE = "false"
    UNUSED = "unused"
    SAMPLE_TUPLE = "sample tuple"
    SCALED = "scaled sample"
    FLAT_ROWS = "flat sample rows"


# Kinds that ops in _ROW_PRESERVING carry along unchanged.
_CARRIED = frozenset({IndexKind.SAMPLE, IndexKind.SCALED, IndexKind.FLAT_ROWS})


# Ops that carry a sample index along unchanged, row by row (their other inputs are shapes).
_ROW_PRESERVING = frozenset({"Unsqueeze", "Identity", "Cast", "Expand", "Reshape"})
_ARITHMETIC = frozenset({"Add", "Sub", "Mul"})
_WIDE_INTEGERS = (6, 7)  # ONNX INT32, INT64


def is_sample_range(node: Node, kinds: dict, known: dict, symbol: str) -> bool:
    """``Range(0, N, 1)`` with ``N`` the batch symbol itself."""
    if node.op != "Range" or len(node.inputs) != 3:
        return False
    start, limit, delta = (known.get(name) for name in node.inputs)
    if start is None or delta is None or limit is None:
        return False
    limit = np.asarray(limit, dtype=object).reshape(-1)
    return _is_int(start, 0) and _is_int(delta, 1) and limit.size == 1 and \
        isinstance(limit[0], SymDim) and limit[0] == sym(symbol)


def _is_int(value: object, expected: int) -> bool:
    flat = np.asarray(value, dtype=object).reshape(-1)
    return flat.size == 1 and isinstance(flat[0], (int, np.integer)) and int(flat[0]) == expected


def slice_keeps_rows(node: Node, known: dict, rank: int) -> bool:
    """Whether ``Slice`` leaves axis 0 whole or cuts it only at its end: starts, axes and
    steps known, and on axis 0 a start of 0 and a step of 1 (the caller checks the output
    still has ``N`` rows, which rules out an end short of ``N``)."""
    def values(index: int) -> list | None:
        if index >= len(node.inputs) or not node.inputs[index]:
            return []
        value = known.get(node.inputs[index])
        return None if value is None else list(np.asarray(value, dtype=object).reshape(-1))

    starts, axes, steps = values(1), values(3), values(4)
    if starts is None or axes is None or steps is None:
        return False
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    for position, axis in enumerate(axes):
        if not isinstance(axis, (int, np.integer)):
            return False
        if int(axis) % rank == 0:
            start, step = starts[position], steps[position]
            if not (_is_int(start, 0) and _is_int(step, 1)):
                return False
    return True


def index_kind_of(graph: Graph, node: Node, kinds: dict, known: dict,
                  symbol: str) -> IndexKind | None:
    """The kind of ``node``'s output when it continues the idiom, or None (refused).

    ``kinds`` maps values to a ``batch_split.Kind`` or an :class:`IndexKind`; only the
    names of the former are needed here ("static", "batch", "size").
    """
    kind_names = [_name(kinds.get(n)) if n else None for n in node.inputs]
    out_type = graph.types.get(node.outputs[0]) if node.outputs else None
    if not isinstance(out_type, TensorType) or out_type.shape is None:
        return None
    batch_first = bool(out_type.shape) and isinstance(out_type.shape[0], SymDim) and \
        out_type.shape[0] == sym(symbol)
    others_plain = all(k in (None, "static", "size") for k in kind_names[1:])
    first = kinds.get(node.inputs[0]) if node.inputs else None
    if node.op in _ROW_PRESERVING and first in _CARRIED and others_plain and \
            batch_first and len(node.outputs) == 1:
        # a cast to a narrower or float type would not hold every index exactly
        if node.op == "Cast" and int(node.attrs.get("to", 0)) not in _WIDE_INTEGERS:
            return None
        return first
    if node.op == "Mul" and batch_first and _scaling(node, kinds, known) is not None:
        return IndexKind.SCALED
    if node.op == "Add" and batch_first and _flat_rows_stride(graph, node, kinds, known):
        return IndexKind.FLAT_ROWS
    if node.op == "Slice" and kind_names[0] == "sample" and others_plain and batch_first:
        in_type = graph.types.get(node.inputs[0])
        if isinstance(in_type, TensorType) and in_type.shape and \
                slice_keeps_rows(node, known, len(in_type.shape)):
            return IndexKind.SAMPLE
        return None
    if node.op == "Less" and kind_names == ["sample", "static"]:
        bound = known.get(node.inputs[1])
        if bound is not None and all(isinstance(v, (int, np.integer)) and v <= 0
                                     for v in np.asarray(bound, dtype=object).reshape(-1)):
            return IndexKind.FALSE
        return None
    if node.op in _ARITHMETIC and "sample" in kind_names and \
            all(k in ("sample", "static", "size") for k in kind_names):
        return IndexKind.UNUSED
    if node.op == "Where" and kind_names[0] == "false" and kind_names[2] == "sample" and \
            graph.types.get(node.inputs[2]) == out_type:
        return IndexKind.SAMPLE
    if node.op == "Concat" and kind_names[0] == "sample" and \
            all(k in ("static", "batch") for k in kind_names[1:]) and batch_first:
        rank = len(out_type.shape)
        first = graph.types.get(node.inputs[0])
        axis = int(node.attrs.get("axis", 0)) % rank
        if axis == rank - 1 and isinstance(first, TensorType) and first.shape[-1] == 1:
            return IndexKind.SAMPLE_TUPLE
    return None


def gathers_own_rows(graph: Graph, node: Node, kinds: dict, known: dict, symbol: str) -> bool:
    """``GatherND(data, tuples)``: data whose rows are the samples, indexed by tuples that
    start with the sample's own index; or ``Gather(data, flat, axis=0)``: data of ``R * N``
    rows, ``R`` per sample, indexed by ``FLAT_ROWS`` of stride ``R``."""
    if node.op == "Gather" and len(node.inputs) == 2 and \
            kinds.get(node.inputs[1]) is IndexKind.FLAT_ROWS and \
            _name(kinds.get(node.inputs[0])) == "batch":
        data = graph.types.get(node.inputs[0])
        stride = _stride_behind(graph, node.inputs[1], IndexKind.FLAT_ROWS, kinds, known)
        return isinstance(data, TensorType) and bool(data.shape) and stride is not None and \
            symbol not in getattr(stride, "symbols", ()) and \
            int(node.attrs.get("axis", 0)) % len(data.shape) == 0 and \
            data.shape[0] == stride * sym(symbol)
    if node.op != "GatherND" or len(node.inputs) != 2 or int(node.attrs.get("batch_dims", 0)):
        return False
    data = graph.types.get(node.inputs[0])
    return _name(kinds.get(node.inputs[0])) == "batch" and \
        kinds.get(node.inputs[1]) is IndexKind.SAMPLE_TUPLE and \
        isinstance(data, TensorType) and bool(data.shape) and \
        data.shape[0] == sym(symbol)


def _name(kind: object) -> str | None:
    return None if kind is None else getattr(kind, "value", None)


# ----------------------------------------------------------------------------- flat rows
def _scaling(node: Node, kinds: dict, known: dict) -> object | None:
    """The row stride ``R`` of ``Mul(SAMPLE, R)`` (either order), a known positive scalar."""
    if len(node.inputs) != 2:
        return None
    for sample, other in ((0, 1), (1, 0)):
        if kinds.get(node.inputs[sample]) is IndexKind.SAMPLE and \
                _name(kinds.get(node.inputs[other])) in ("static", "size"):
            return _positive_scalar(known.get(node.inputs[other]))
    return None


def _flat_rows_stride(graph: Graph, node: Node, kinds: dict, known: dict) -> object | None:
    """The stride ``R`` of ``Add(SCALED by R, offsets)`` when every offset is in ``[0, R)``."""
    if len(node.inputs) != 2:
        return None
    for scaled, other in ((0, 1), (1, 0)):
        if kinds.get(node.inputs[scaled]) is IndexKind.SCALED and \
                _name(kinds.get(node.inputs[other])) == "static":
            stride = _stride_behind(graph, node.inputs[scaled], IndexKind.SCALED, kinds, known)
            if stride is not None and _offsets_below(graph, node.inputs[other], known, stride):
                return stride
    return None


def _stride_behind(graph: Graph, name: str, kind: IndexKind, kinds: dict,
                   known: dict) -> object | None:
    """The stride of the Mul (for ``SCALED``) or Add (for ``FLAT_ROWS``) that made ``name``,
    found through the row-preserving ops in between."""
    producers = graph.producers()
    node = producers.get(name)
    while node is not None and node.op in _ROW_PRESERVING:
        node = producers.get(node.inputs[0])
    if node is None:
        return None
    if kind is IndexKind.SCALED and node.op == "Mul":
        return _scaling(node, kinds, known)
    if kind is IndexKind.FLAT_ROWS and node.op == "Add":
        return _flat_rows_stride(graph, node, kinds, known)
    return None


def _offsets_below(graph: Graph, name: str, known: dict, stride: object) -> bool:
    """Whether every value of ``name`` is in ``[0, stride)``: known integers, or a
    ``Range(0, stride, 1)`` seen through ops that keep values (Unsqueeze, Reshape, ...)."""
    value = known.get(name)
    if value is not None and isinstance(stride, (int, np.integer)):
        flat = np.asarray(value, dtype=object).reshape(-1)
        return all(isinstance(v, (int, np.integer)) and 0 <= v < stride for v in flat)
    producers = graph.producers()
    node = producers.get(name)
    while node is not None and node.op in _ROW_PRESERVING:
        if node.op == "Cast" and int(node.attrs.get("to", 0)) not in _WIDE_INTEGERS:
            return False
        node = producers.get(node.inputs[0])
    if node is None or node.op != "Range" or len(node.inputs) != 3:
        return False
    start, limit, delta = (known.get(n) for n in node.inputs)
    return start is not None and delta is not None and _is_int(start, 0) and \
        _is_int(delta, 1) and _positive_scalar(limit) == stride


def _positive_scalar(value: object) -> object | None:
    """A one-element known value that is a positive int or a symbolic dim, else None."""
    if value is None:
        return None
    flat = np.asarray(value, dtype=object).reshape(-1)
    if flat.size != 1:
        return None
    item = flat[0]
    if isinstance(item, SymDim):
        return item
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool) and item > 0:
        return int(item)
    return None
