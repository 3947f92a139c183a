"""Sequences of tensors and optional values.

At run time a sequence is a Python list of numpy arrays and an optional is either its value
(an array or a list) or None when empty.  Sequence ops never modify a list in place: each
returns a new list, since a list may still be read elsewhere (a loop-carried value, a graph
input).

A :class:`~ember.ir.types.SequenceType` describes every element with one type; where elements
of several origins meet (SequenceConstruct, SequenceInsert) that type is their join, so dims
that may differ between elements are unknown.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import Dim, exact_divide
from ember.core.dtypes import DType
from ember.ir.graph import Graph
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.control import infer_body, join_types
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import normalize_axis

_INT64_SCALAR = TensorType(DType.INT64, ())
_BOOL_SCALAR = TensorType(DType.BOOL, ())


def _sequence_input(ctx: InferContext, index: int) -> SequenceType:
    """Input ``index`` as a SequenceType (with an unknown element type if not known)."""
    vtype = ctx.inputs[index] if index < len(ctx.inputs) else None
    if vtype is None:
        return SequenceType(None)
    if not isinstance(vtype, SequenceType):
        raise ctx.error(f"input {index} must be a sequence, got {vtype}")
    return vtype


def _tensor_or_unknown(ctx: InferContext, index: int) -> TensorType | None:
    """Input ``index`` as a TensorType, None if its type is unknown; any other type is an
    error."""
    vtype = ctx.inputs[index] if index < len(ctx.inputs) else None
    if vtype is not None and not isinstance(vtype, TensorType):
        raise ctx.error(f"input {index} must be a tensor, got {vtype}")
    return vtype


def _element_tensor(ctx: InferContext, index: int) -> TensorType | None:
    """The element type of sequence input ``index`` if it is a known tensor type."""
    elem = _sequence_input(ctx, index).elem
    return elem if isinstance(elem, TensorType) else None


def _position(ctx: RefContext, position: np.ndarray, length: int, *, inserting: bool) -> int:
    """A sequence position in [-n, n-1] (or [-n, n] when inserting) as an index from 0."""
    array = np.asarray(position)
    if array.size != 1:
        raise ctx.error(f"position must be a scalar, got shape {array.shape}")
    value = int(array.reshape(-1)[0])
    upper = length if inserting else length - 1
    if not -length <= value <= upper:
        raise ctx.error(f"position {value} is out of range for a sequence of {length} "
                        f"tensor(s) (accepted: [{-length}, {upper}])")
    return value + length if value < 0 else value


def _check_sequence(ctx: RefContext, value: object) -> list:
    """A new list holding the elements of the sequence ``value``."""
    if not isinstance(value, (list, tuple)):
        raise ctx.error(f"the input must be a sequence, got {type(value).__name__}")
    return list(value)


# ----------------------------------------------------------------------------- building


def _infer_sequence_empty(ctx: InferContext) -> list[ValueType | None]:
    dtype = DType.from_onnx(ctx.attrs["dtype"])
    return [SequenceType(TensorType(dtype, None))]


@op("SequenceEmpty", family="sequence", infer=_infer_sequence_empty,
    attrs={"dtype": Attr.int(DType.FLOAT32.onnx)})
def sequence_empty(ctx, *, dtype):
    """An empty sequence of tensors of element type ``dtype``."""
    return []


def _infer_sequence_construct(ctx: InferContext) -> list[ValueType | None]:
    elems = [_tensor_or_unknown(ctx, index) for index in range(len(ctx.inputs))]
    dtypes = {elem.dtype for elem in elems if elem is not None}
    if len(dtypes) > 1:
        raise ctx.error(f"the inputs have element types {sorted(map(str, dtypes))}; a "
                        f"sequence holds tensors of one element type")
    joined = elems[0]
    for elem in elems[1:]:
        joined = join_types(joined, elem)
    if joined is None and dtypes:
        joined = TensorType(dtypes.pop(), None)
    return [SequenceType(joined)]


@op("SequenceConstruct", family="sequence", infer=_infer_sequence_construct)
def sequence_construct(ctx, first, *others):
    """The sequence of the input tensors, in order."""
    return [first, *others]


def _infer_sequence_insert(ctx: InferContext) -> list[ValueType | None]:
    sequence = _sequence_input(ctx, 0)
    tensor = _tensor_or_unknown(ctx, 1)
    if tensor is None:
        return [sequence]
    if isinstance(sequence.elem, TensorType) and sequence.elem.dtype != tensor.dtype:
        raise ctx.error(f"cannot insert a {tensor.dtype} tensor into a sequence of "
                        f"{sequence.elem.dtype} tensors")
    elem = join_types(sequence.elem, tensor) if sequence.elem is not None else \
        TensorType(tensor.dtype, None)
    return [SequenceType(elem)]


@op("SequenceInsert", family="sequence", infer=_infer_sequence_insert)
def sequence_insert(ctx, sequence, tensor, position=None):
    """A copy of the sequence with ``tensor`` inserted at ``position`` (default: the end)."""
    items = _check_sequence(ctx, sequence)
    index = len(items) if position is None else \
        _position(ctx, position, len(items), inserting=True)
    items.insert(index, tensor)
    return items


@op("SequenceErase", family="sequence", infer=lambda ctx: [_sequence_input(ctx, 0)])
def sequence_erase(ctx, sequence, position=None):
    """A copy of the sequence without the tensor at ``position`` (default: the last one)."""
    items = _check_sequence(ctx, sequence)
    if not items:
        raise ctx.error("cannot erase from an empty sequence")
    index = len(items) - 1 if position is None else \
        _position(ctx, position, len(items), inserting=False)
    del items[index]
    return items


# ----------------------------------------------------------------------------- reading


@op("SequenceAt", family="sequence", infer=lambda ctx: [_sequence_input(ctx, 0).elem])
def sequence_at(ctx, sequence, position):
    """The tensor at ``position`` (negative counts from the back)."""
    items = _check_sequence(ctx, sequence)
    return items[_position(ctx, position, len(items), inserting=False)]


@op("SequenceLength", family="sequence", infer=lambda ctx: [_INT64_SCALAR])
def sequence_length(ctx, sequence):
    """The number of tensors in the sequence, as an int64 scalar."""
    return np.array(len(_check_sequence(ctx, sequence)), dtype=np.int64)


# ----------------------------------------------------------------------------- split / concat


def _split_sizes(ctx: RefContext, split: np.ndarray | None, total: int) -> list[int]:
    """Chunk lengths along the split axis, from SplitToSequence's ``split`` input."""
    if split is None:
        return [1] * total
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise ctx.error(f"split must be positive, got {size}")
        return [size] * (total // size) + ([total % size] if total % size else [])
    if split.ndim != 1:
        raise ctx.error(f"split must be a scalar or a 1-D tensor, got shape {split.shape}")
    sizes = [int(s) for s in split]
    if any(s < 0 for s in sizes) or sum(sizes) != total:
        raise ctx.error(f"split {sizes} must be non-negative and sum to the split dimension "
                        f"{total}")
    return sizes


def _infer_split_to_sequence(ctx: InferContext) -> list[ValueType | None]:
    data = _tensor_or_unknown(ctx, 0)
    if data is None:
        return [SequenceType(None)]
    if data.shape is None:
        return [SequenceType(TensorType(data.dtype, None))]
    axis = normalize_axis(ctx.attrs["axis"], len(data.shape), ctx)
    dim: Dim = None
    if not ctx.has_input(1):
        if not ctx.attrs["keepdims"]:
            return [SequenceType(TensorType(data.dtype, data.shape[:axis] +
                                            data.shape[axis + 1:]))]
        dim = 1
    else:
        split = ctx.value(1)
        if split is not None and np.asarray(split).dtype != object:
            split = np.asarray(split)
            total = data.shape[axis]
            if split.ndim == 0:
                size = int(split)
                whole = exact_divide(total, size) if total is not None and size > 0 else None
                dim = size if whole is not None else None
            elif split.size and np.all(split == split.reshape(-1)[0]):
                dim = int(split.reshape(-1)[0])
    shape = list(data.shape)
    shape[axis] = dim
    return [SequenceType(TensorType(data.dtype, tuple(shape)))]


@op("SplitToSequence", family="sequence", infer=_infer_split_to_sequence,
    attrs={"axis": Attr.int(0), "keepdims": Attr.int(1)})
def split_to_sequence(ctx, data, split=None, *, axis, keepdims):
    """Split ``data`` along ``axis`` into a sequence of chunks (of size 1 by default)."""
    axis = normalize_axis(axis, data.ndim, ctx)
    sizes = _split_sizes(ctx, split, data.shape[axis])
    bounds = np.cumsum(sizes)[:-1] if sizes else []
    chunks = np.split(data, bounds, axis=axis) if sizes else []
    if split is None and not keepdims:
        chunks = [np.squeeze(chunk, axis=axis) for chunk in chunks]
    return chunks


def _infer_concat_from_sequence(ctx: InferContext) -> list[ValueType | None]:
    elem = _element_tensor(ctx, 0)
    if elem is None:
        return [None]
    if elem.shape is None:
        return [TensorType(elem.dtype, None)]
    new_axis = bool(ctx.attrs["new_axis"])
    rank = len(elem.shape) + (1 if new_axis else 0)
    axis = normalize_axis(ctx.attrs["axis"], rank, ctx)
    shape = list(elem.shape)
    if new_axis:
        shape.insert(axis, None)  # the sequence length is not known at compile time
    else:
        shape[axis] = None
    return [TensorType(elem.dtype, tuple(shape))]


@op("ConcatFromSequence", family="sequence", infer=_infer_concat_from_sequence,
    attrs={"axis": Attr.int(REQUIRED), "new_axis": Attr.int(0)})
def concat_from_sequence(ctx, sequence, *, axis, new_axis):
    """Concatenate the tensors of the sequence along ``axis`` (stack on a new axis if
    ``new_axis``)."""
    items = _check_sequence(ctx, sequence)
    if not items:
        raise ctx.error("cannot concatenate an empty sequence")
    rank = items[0].ndim + (1 if new_axis else 0)
    axis = normalize_axis(axis, rank, ctx)
    if new_axis:
        if len({item.shape for item in items}) > 1:
            raise ctx.error(f"tensors of shapes {[item.shape for item in items]} cannot be "
                            f"stacked")
        return np.stack(items, axis=axis)
    for item in items:
        if item.ndim != items[0].ndim or \
                item.shape[:axis] + item.shape[axis + 1:] != \
                items[0].shape[:axis] + items[0].shape[axis + 1:]:
            raise ctx.error(f"tensors of shapes {[i.shape for i in items]} cannot be "
                            f"concatenated on axis {axis}")
    return np.concatenate(items, axis=axis)


# ----------------------------------------------------------------------------- SequenceMap


def _infer_sequence_map(ctx: InferContext) -> list[ValueType | None]:
    body: Graph = ctx.attrs["body"]
    per_sample: list[ValueType | None] = []
    for index, vtype in enumerate(ctx.inputs):
        if index == 0 or isinstance(vtype, SequenceType):
            per_sample.append(_sequence_input(ctx, index).elem)
        else:
            per_sample.append(vtype)  # a tensor is passed whole to every sample
    outputs = infer_body(ctx, body, per_sample)
    if len(outputs) != ctx.num_outputs:
        raise ctx.error(f"the body produces {len(outputs)} output(s), the node has "
                        f"{ctx.num_outputs}")
    return [SequenceType(elem) for elem in outputs]


@op("SequenceMap", family="sequence", infer=_infer_sequence_map, outputs=(1, -1),
    foldable=False, attrs={"body": Attr.graph(REQUIRED)})
def sequence_map(ctx, sequence, *additional, body):
    """Apply body to each sample: the i-th tensor of every sequence input, tensors as they
    are; each output is the sequence of the body's results."""
    items = _check_sequence(ctx, sequence)
    for index, extra in enumerate(additional, start=1):
        if isinstance(extra, (list, tuple)) and len(extra) != len(items):
            raise ctx.error(f"input {index} is a sequence of {len(extra)} tensors, input 0 "
                            f"has {len(items)}")
    results: list[list] = [[] for _ in range(ctx.num_outputs)]
    for i, item in enumerate(items):
        sample = [item] + [extra[i] if isinstance(extra, (list, tuple)) else extra
                           for extra in additional]
        for collected, value in zip(results, ctx.run_subgraph(body, sample)):
            collected.append(value)
    return tuple(results)


# ----------------------------------------------------------------------------- optionals


def _infer_optional(ctx: InferContext) -> list[ValueType | None]:
    if ctx.has_input(0):
        return [OptionalType(ctx.inputs[0])]
    declared = ctx.attrs["type"]
    if declared is None:
        raise ctx.error("an Optional without input needs the 'type' attribute")
    return [OptionalType(declared)]


@op("Optional", family="sequence", infer=_infer_optional, attrs={"type": Attr("type", None)})
def optional(ctx, value=None, *, type):  # noqa: A002  (the ONNX attribute name)
    """An optional holding ``value``, or an empty optional (None) when there is no input."""
    return value


def _infer_optional_get_element(ctx: InferContext) -> list[ValueType | None]:
    vtype = ctx.inputs[0]
    return [vtype.elem if isinstance(vtype, OptionalType) else vtype]


@op("OptionalGetElement", family="sequence", infer=_infer_optional_get_element)
def optional_get_element(ctx, value):
    """The value an optional holds (a tensor or sequence input is returned as is)."""
    if value is None:
        raise ctx.error("the optional input is empty: it holds no element to get")
    return value


@op("OptionalHasElement", family="sequence", infer=lambda ctx: [_BOOL_SCALAR])
def optional_has_element(ctx, value=None):
    """True if the input is given and is not an empty optional."""
    return np.array(value is not None)
