"""Upgrades of normalization ops (Softmax family, BatchNormalization, Dropout, ...).

* Softmax, LogSoftmax, Hardmax before 13 coerce their input to 2-D at ``axis`` (default 1):
  rewritten as Flatten -> op(axis=1) -> Reshape back to the input's shape.
* BatchNormalization: ``consumed_inputs``/``is_test`` (before 7), ``spatial`` (before 9) and
  the five-output training form (before 14) become the newest form with ``training_mode``.
* Dropout: ``is_test``/``consumed_inputs`` (before 7), a mask of the data's type (before 10)
  and the ``ratio`` attribute (before 12, now an input).
* InstanceNormalization: ``consumed_inputs`` (before 6).
* GroupNormalization before 21 has one scale/bias per group; 21 has one per channel.
"""

from __future__ import annotations

import numpy as np

from ember.core.errors import ModelLoadError
from ember.frontend.onnx.table import Builder, upgrade
from ember.frontend.onnx.upgrades.common import attr_to_input
from ember.ir.graph import Node


def _node_after(node: Node, op: str, inputs: list[str], outputs: list[str], **attrs) -> Node:
    """A node that must run after ``node`` (``Builder.add_node`` places nodes before it)."""
    return Node(op=op, inputs=inputs, outputs=outputs, attrs=attrs,
                name=f"{node.name}_{op}_{outputs[0]}")


def _shape_of(b: Builder, value: str) -> str:
    """A new value holding ``Shape(value)``."""
    shape = b.fresh(f"{value}_shape")
    b.add_node("Shape", [value], [shape])
    return shape


def _reshape_output(node: Node, b: Builder, index: int, shape: str) -> Node:
    """Redirect output ``index`` of ``node`` and reshape it to ``shape`` afterwards."""
    final = node.outputs[index]
    computed = b.fresh(f"{final}_flat")
    node.outputs[index] = computed
    return _node_after(node, "Reshape", [computed, shape], [final], allowzero=1)


# ----------------------------------------------------------------------------- softmax family


def coerce_to_2d(node: Node, b: Builder, opset: int) -> list[Node] | None:
    """Before 13: op(x, axis) is op over x flattened to 2-D at ``axis``, reshaped back."""
    axis = node.attrs.pop("axis", 1)
    if axis == -1:  # flattening at the last axis changes nothing
        node.attrs["axis"] = -1
        return None
    x = node.inputs[0]
    flat = b.fresh(f"{x}_2d")
    b.add_node("Flatten", [x], [flat], axis=axis)
    node.inputs[0] = flat
    node.attrs["axis"] = 1
    return [node, _reshape_output(node, b, 0, _shape_of(b, x))]


for _op_type in ("Softmax", "LogSoftmax", "Hardmax"):
    upgrade(_op_type, before=13)(coerce_to_2d)


# ----------------------------------------------------------------------------- BatchNormalization


@upgrade("BatchNormalization", before=7)
def batch_norm_drop_is_test(node: Node, b: Builder, opset: int) -> None:
    """``consumed_inputs`` is gone; ``is_test=1`` means the one-output inference form."""
    node.attrs.pop("consumed_inputs", None)
    if node.attrs.pop("is_test", 0):
        del node.outputs[1:]


@upgrade("BatchNormalization", before=9)
def batch_norm_non_spatial(node: Node, b: Builder, opset: int) -> list[Node] | None:
    """``spatial=0`` (statistics per feature, params shaped C x D1 x ...) is the spatial op on
    X flattened to (N, C*D1*...) with flattened params, as the ONNX spec suggests."""
    if node.attrs.pop("spatial", 1):
        return None
    x = node.inputs[0]
    flat_x = b.fresh(f"{x}_2d")
    b.add_node("Flatten", [x], [flat_x], axis=1)
    minus_one = b.constant(np.array([-1], dtype=np.int64), hint="flat")
    params = []
    for name in node.inputs[1:5]:
        flat = b.fresh(f"{name}_flat")
        b.add_node("Reshape", [name, minus_one], [flat])
        params.append(flat)
    after = [_reshape_output(node, b, 0, _shape_of(b, x))]
    running = [i for i in (1, 2) if i < len(node.outputs) and node.outputs[i]]
    if running:  # the running mean and variance are shaped like the input statistics
        stats_shape = _shape_of(b, node.inputs[3])
        after += [_reshape_output(node, b, i, stats_shape) for i in running]
    node.inputs[:5] = [flat_x, *params]
    return [node, *after]


@upgrade("BatchNormalization", before=14)
def batch_norm_training_outputs(node: Node, b: Builder, opset: int) -> None:
    """Before 14, asking for more than Y meant training mode; saved_mean/var are gone."""
    while node.outputs and not node.outputs[-1]:
        node.outputs.pop()
    if len(node.outputs) > 3:
        raise ModelLoadError(
            f"node '{node.name}' (BatchNormalization-{opset}): the training outputs "
            f"saved_mean/saved_var do not exist since opset 14 and ember does not compute them; "
            f"export the model for inference")
    if len(node.outputs) > 1:
        node.attrs["training_mode"] = 1


# ----------------------------------------------------------------------------- Dropout


@upgrade("Dropout", before=7)
def dropout_drop_is_test(node: Node, b: Builder, opset: int) -> None:
    """``is_test``/``consumed_inputs`` are gone; ember runs Dropout in inference mode."""
    node.attrs.pop("consumed_inputs", None)
    node.attrs.pop("is_test", None)


@upgrade("Dropout", before=10)
def dropout_mask_to_bool(node: Node, b: Builder, opset: int) -> list[Node] | None:
    """Before 10 the mask had the data's type; it is bool now, so cast it back."""
    if len(node.outputs) < 2 or not node.outputs[1]:
        return None
    mask = node.outputs[1]
    bool_mask = b.fresh(f"{mask}_bool")
    node.outputs[1] = bool_mask
    return [node, _node_after(node, "CastLike", [bool_mask, node.inputs[0]], [mask])]


@upgrade("Dropout", before=12)
def dropout_ratio_to_input(node: Node, b: Builder, opset: int) -> None:
    """Dropout-12 takes ``ratio`` as its optional second input."""
    attr_to_input(node, b, "ratio", 1, dtype=np.float32)


# ----------------------------------------------------------------------------- Instance, Group


@upgrade("InstanceNormalization", before=6)
def instance_norm_drop_consumed_inputs(node: Node, b: Builder, opset: int) -> None:
    """``consumed_inputs`` was a legacy optimization hint."""
    node.attrs.pop("consumed_inputs", None)


@upgrade("GroupNormalization", before=21)
def group_norm_params_per_channel(node: Node, b: Builder, opset: int) -> None:
    """Repeat each group's scale/bias over the group's channels (like ``np.repeat``)."""
    groups = node.attrs.get("num_groups")
    if groups is None:
        return  # the missing required attribute is reported when the node is checked
    x = node.inputs[0]
    channels = b.fresh("channels")
    b.add_node("Shape", [x], [channels], start=1, end=2)
    per_group = b.fresh("channels_per_group")
    b.add_node("Div", [channels, b.constant(np.array([groups], dtype=np.int64), "groups")],
               [per_group])
    expand_shape = b.fresh("expand_shape")
    b.add_node("Concat", [b.constant(np.array([1], dtype=np.int64), "one"), per_group],
               [expand_shape], axis=0)
    column = b.constant(np.array([-1, 1], dtype=np.int64), "column")
    flat = b.constant(np.array([-1], dtype=np.int64), "flat")
    for index in (1, 2):
        name = node.inputs[index]
        as_column, repeated, per_channel = (b.fresh(f"{name}_{s}")
                                            for s in ("column", "repeated", "per_channel"))
        b.add_node("Reshape", [name, column], [as_column])
        b.add_node("Expand", [as_column, expand_shape], [repeated])
        b.add_node("Reshape", [repeated, flat], [per_channel])
        node.inputs[index] = per_channel
