"""Upgrades of shape and indexing ops (Reshape, Concat, Split, Slice, Pad, Tile, TopK, ...).

Each function bridges one change of the ONNX changelog; they run oldest first, so an upgrade
for opset < 13 can assume the one for opset < 2 already ran.
"""

from __future__ import annotations

import numpy as np

from ember.frontend.onnx.table import Builder, rename, upgrade
from ember.frontend.onnx.upgrades.common import attr_to_input
from ember.ir.graph import Node

# Scatter (deprecated at opset 11) is ScatterElements without the reduction attribute.
rename("Scatter", "ScatterElements")


@upgrade("Squeeze", before=13)
def squeeze_axes_to_input(node: Node, b: Builder, opset: int) -> None:
    """Squeeze-13 takes ``axes`` as an input instead of an attribute."""
    attr_to_input(node, b, "axes", 1)


@upgrade("Unsqueeze", before=13)
def unsqueeze_axes_to_input(node: Node, b: Builder, opset: int) -> None:
    """Unsqueeze-13 takes ``axes`` as an input instead of an attribute."""
    attr_to_input(node, b, "axes", 1)


@upgrade("Reshape", before=5)
def reshape_shape_to_input(node: Node, b: Builder, opset: int) -> None:
    """Reshape-5 takes the target ``shape`` as an input; ``consumed_inputs`` is gone."""
    node.attrs.pop("consumed_inputs", None)
    attr_to_input(node, b, "shape", 1)


@upgrade("Concat", before=4)
def concat_default_axis(node: Node, b: Builder, opset: int) -> None:
    """Concat-1's ``axis`` defaulted to 1; from Concat-4 on it is required."""
    node.attrs.setdefault("axis", 1)


@upgrade("Split", before=2)
def split_input_to_int64(node: Node, b: Builder, opset: int) -> None:
    """Split-1 may take the sizes as a second input of the data's type: make it int64."""
    node.attrs.setdefault("axis", 0)
    if len(node.inputs) > 1 and node.inputs[1]:
        sizes = b.fresh("split")
        b.add_node("Cast", [node.inputs[1]], [sizes], to=7)  # TensorProto.INT64
        node.inputs[1] = sizes


@upgrade("Split", before=13)
def split_sizes_to_input(node: Node, b: Builder, opset: int) -> None:
    """Split-13 takes ``split`` as an input instead of an attribute."""
    if "split" in node.attrs:
        attr_to_input(node, b, "split", 1)


@upgrade("Split", before=18)
def split_equal_parts(node: Node, b: Builder, opset: int) -> None:
    """Without sizes, Split < 18 made one equal part per output: num_outputs in Split-18."""
    if len(node.inputs) < 2 or not node.inputs[1]:
        node.attrs["num_outputs"] = len(node.outputs)


@upgrade("Slice", before=10)
def slice_attrs_to_inputs(node: Node, b: Builder, opset: int) -> None:
    """Slice-10 takes ``starts``, ``ends`` and ``axes`` as inputs."""
    for index, name in enumerate(("starts", "ends", "axes"), start=1):
        attr_to_input(node, b, name, index)


@upgrade("Pad", before=2)
def pad_paddings_renamed(node: Node, b: Builder, opset: int) -> None:
    """Pad-2 renamed ``paddings`` to ``pads``."""
    if "paddings" in node.attrs:
        node.attrs["pads"] = node.attrs.pop("paddings")


@upgrade("Pad", before=11)
def pad_attrs_to_inputs(node: Node, b: Builder, opset: int) -> None:
    """Pad-11 takes ``pads`` and the fill ``value`` as inputs.

    The fill becomes a float32 constant: the attribute was a float whatever the data type,
    and Pad casts its constant_value to the data type.
    """
    value = node.attrs.pop("value", 0.0)
    attr_to_input(node, b, "pads", 1)
    if node.attrs.get("mode", "constant") == "constant" and value != 0.0:
        node.inputs.append(b.constant(np.asarray(value, dtype=np.float32), hint="value"))


@upgrade("TopK", before=10)
def top_k_k_to_input(node: Node, b: Builder, opset: int) -> None:
    """TopK-10 takes ``k`` as a 1-D int64 input instead of an attribute."""
    if "k" in node.attrs:
        node.attrs["k"] = [node.attrs["k"]]
    attr_to_input(node, b, "k", 1)


@upgrade("Tile", before=6)
def tile_one_axis(node: Node, b: Builder, opset: int) -> None:
    """Tile-1 repeated along one ``axis`` (both float inputs); Tile-6 takes one repeat count
    per axis: ``repeats = OneHot([axis], rank, [1, tiles])`` flattened and cast to int64."""
    data, tiles, axis = node.inputs[:3]
    one_1d = b.constant(np.asarray([1], dtype=np.int64), hint="one")
    shape, rank, flat_tiles, one, on_off, flat_axis, hot, hot_1d, repeats = (
        b.fresh(hint) for hint in ("shape", "rank", "tiles", "one", "on_off", "axis", "hot",
                                   "hot_1d", "repeats"))
    b.add_node("Shape", [data], [shape])
    b.add_node("Size", [shape], [rank])
    b.add_node("Reshape", [tiles, one_1d], [flat_tiles])
    b.add_node("Reshape", [axis, one_1d], [flat_axis])
    b.add_node("CastLike", [b.constant(np.asarray([1.0], dtype=np.float32), hint="one_f"),
                            flat_tiles], [one])
    b.add_node("Concat", [one, flat_tiles], [on_off], axis=0)
    b.add_node("OneHot", [flat_axis, rank, on_off], [hot], axis=-1)
    b.add_node("Reshape", [hot, b.constant(np.asarray([-1], dtype=np.int64), hint="flat")],
               [hot_1d])
    b.add_node("Cast", [hot_1d], [repeats], to=7)  # TensorProto.INT64
    node.inputs[:] = [data, repeats]
