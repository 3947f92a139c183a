"""Upgrades of elementwise, activation, logical and cast ops to their newest form.

* opset < 6: the ``consumed_inputs`` attribute (a legacy memory hint) is dropped; Selu-1 had
  other attribute defaults;
* opset < 7: binary ops had ``broadcast``/``axis`` attributes instead of numpy broadcasting,
  and PRelu applied a 1-D slope per channel (axis 1);
* opset < 11: Clip took ``min``/``max`` as attributes, not inputs;
* opset < 6: Cast named its target type by a string (``to="FLOAT"``).
"""

from __future__ import annotations

import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import ModelLoadError
from ember.frontend.onnx.table import Builder, upgrade
from ember.ir.graph import Node

_CONSUMED_INPUTS_OPS = (
    "Abs", "Add", "Ceil", "Clip", "Div", "Elu", "Exp", "Floor", "HardSigmoid", "LeakyRelu",
    "Log", "Max", "Mean", "Min", "Mul", "Neg", "PRelu", "Reciprocal", "Relu", "Selu", "Sigmoid",
    "Sqrt", "Sub", "Sum", "Tanh",
)
_LEGACY_BROADCAST_OPS = (
    "Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater",
)
_FLT_MAX = float(np.finfo(np.float32).max)


def _drop_consumed_inputs(node: Node, b: Builder, opset: int) -> None:
    """Version 1 of these ops had a ``consumed_inputs`` memory hint without meaning today."""
    node.attrs.pop("consumed_inputs", None)


for _op in _CONSUMED_INPUTS_OPS:
    upgrade(_op, before=6)(_drop_consumed_inputs)


# ----------------------------------------------------------------------------- broadcasting


def align_at_axis(b: Builder, operand: str, reference: str, axis: int) -> str:
    """``operand`` reshaped so that numpy broadcasting aligns its dims with those of
    ``reference`` starting at ``axis`` (trailing 1-dims appended).

    The number of 1-dims depends on both ranks, which the importer does not know yet, so it is
    computed in the graph: ``Unsqueeze(operand, Range(rank(operand), rank(reference) - axis))``;
    shape inference folds it when the ranks are known.
    """
    ranks = []
    for value in (operand, reference):
        shape, rank = b.fresh("shape"), b.fresh("rank")
        b.add_node("Shape", [value], [shape])
        b.add_node("Size", [shape], [rank])
        ranks.append(rank)
    limit, axes, aligned = b.fresh("limit"), b.fresh("axes"), b.fresh("aligned")
    b.add_node("Sub", [ranks[1], b.constant(np.array(axis, np.int64), "axis")], [limit])
    b.add_node("Range", [ranks[0], limit, b.constant(np.array(1, np.int64), "one")], [axes])
    b.add_node("Unsqueeze", [operand, axes], [aligned])
    return aligned


def _legacy_broadcast(node: Node, b: Builder, opset: int) -> None:
    """``broadcast=1, axis=k`` aligned B with A from axis k; without ``axis`` B matched A's
    trailing dims, which numpy broadcasting already does."""
    broadcast = node.attrs.pop("broadcast", 0)
    axis = node.attrs.pop("axis", None)
    if broadcast and axis is not None and len(node.inputs) == 2:
        node.inputs[1] = align_at_axis(b, node.inputs[1], node.inputs[0], axis)


for _op in _LEGACY_BROADCAST_OPS:
    upgrade(_op, before=7)(_legacy_broadcast)


@upgrade("PRelu", before=7)
def prelu_channel_slope(node: Node, b: Builder, opset: int) -> None:
    """PRelu-6 applied a slope of shape [C] per channel (axis 1); PRelu-7 broadcasts."""
    node.inputs[1] = align_at_axis(b, node.inputs[1], node.inputs[0], 1)


# ----------------------------------------------------------------------------- attributes


@upgrade("Selu", before=6)
def selu_v1_defaults(node: Node, b: Builder, opset: int) -> None:
    """Selu-1 defaulted to the rounded constants alpha=1.6732, gamma=1.0507."""
    node.attrs.setdefault("alpha", 1.6732)
    node.attrs.setdefault("gamma", 1.0507)


@upgrade("Clip", before=11)
def clip_bounds_to_inputs(node: Node, b: Builder, opset: int) -> None:
    """Clip-11 takes min and max as inputs of the input's type.  Clip-6 defaulted them to
    -/+FLT_MAX; in Clip-1 an absent bound did not clip."""
    defaults = (-_FLT_MAX, _FLT_MAX) if opset >= 6 else (None, None)
    bounds = []
    for attr, default in zip(("min", "max"), defaults):
        value = node.attrs.pop(attr, default)
        if value is None:
            bounds.append("")
            continue
        typed = b.fresh(attr)
        constant = b.constant(np.array(value, dtype=np.float32), attr)
        b.add_node("CastLike", [constant, node.inputs[0]], [typed])
        bounds.append(typed)
    while bounds and not bounds[-1]:
        bounds.pop()
    node.inputs[1:] = bounds


# The element type names of TensorProto that Cast-1 took as strings.
_CAST_V1_TYPES = {
    "FLOAT": DType.FLOAT32, "DOUBLE": DType.FLOAT64, "FLOAT16": DType.FLOAT16,
    "INT8": DType.INT8, "INT16": DType.INT16, "INT32": DType.INT32, "INT64": DType.INT64,
    "UINT8": DType.UINT8, "UINT16": DType.UINT16, "UINT32": DType.UINT32,
    "UINT64": DType.UINT64, "BOOL": DType.BOOL, "STRING": DType.STRING,
}


@upgrade("Cast", before=6)
def cast_type_name_to_code(node: Node, b: Builder, opset: int) -> None:
    """Cast-1 named its target type (``to="FLOAT"``); Cast-6 takes the TensorProto code."""
    to = node.attrs.get("to")
    if isinstance(to, str):
        dtype = _CAST_V1_TYPES.get(to.upper())
        if dtype is None:
            raise ModelLoadError(f"Cast node '{node.name}': unknown target type {to!r}; "
                                 f"expected one of {sorted(_CAST_V1_TYPES)}")
        node.attrs["to"] = dtype.onnx
