"""Upgrades of image and signal ops: Resize-10 and Upsample, GridSample-16, RoiAlign-10, DFT-17.

* Resize-10 took only ``(X, scales)`` and sampled like Upsample: asymmetric coordinates, and
  nearest mode rounding down (the rewrite ONNX's own version converter applies).
* Upsample (deprecated at opset 10, removed since) becomes that same Resize.
* GridSample-20 renamed the modes ``bilinear``/``bicubic`` to ``linear``/``cubic``.
* RoiAlign-16 added ``coordinate_transformation_mode`` whose default ``half_pixel`` shifts
  the input; RoiAlign-10 behaved as ``output_half_pixel``.
* DFT-20 turned the ``axis`` attribute (default 1) into an input (default -2).

Resize-11's ``tf_half_pixel_for_nn`` coordinate mode has no newest-form equivalent; the
Resize reference keeps accepting it, so opset-11 models need no rewrite.
"""

from __future__ import annotations

import numpy as np

from ember.core.errors import OpAttributeError
from ember.frontend.onnx.table import Builder, upgrade
from ember.frontend.onnx.upgrades.common import attr_to_input
from ember.ir.graph import Node

# Upsample exists in no current opset: every version of it is rewritten.
_EVERY_VERSION = 1 << 30


def _legacy_resize_attrs(mode: str) -> dict[str, str]:
    """Attributes that make the newest Resize sample as Upsample / Resize-10 did."""
    attrs = {"mode": "linear" if mode in ("linear", "bilinear") else mode,
             "coordinate_transformation_mode": "asymmetric"}
    if attrs["mode"] == "nearest":
        attrs["nearest_mode"] = "floor"
    return attrs


@upgrade("Resize", before=11)
def resize_10_to_newest(node: Node, b: Builder, opset: int) -> None:
    """Resize-10 (X, scales) becomes Resize(X, roi="", scales) with Upsample's sampling."""
    node.inputs = [node.inputs[0], "", node.inputs[1]]
    node.attrs.update(_legacy_resize_attrs(node.attrs.get("mode", "nearest")))


@upgrade("Upsample", before=_EVERY_VERSION)
def upsample_to_resize(node: Node, b: Builder, opset: int) -> None:
    """Upsample becomes Resize: scales come from the input (opset 9), the ``scales``
    attribute (opset 7) or ``height_scale``/``width_scale`` (opset 1, 4-D NCHW only)."""
    attrs = dict(node.attrs)
    if opset >= 9:
        scales = node.inputs[1]
    else:
        required = ["scales"] if opset >= 7 else ["height_scale", "width_scale"]
        missing = [name for name in required if name not in attrs]
        if missing:
            raise OpAttributeError(f"node '{node.name}' (Upsample-{opset}): required "
                                   f"attribute(s) {missing} missing")
        values = attrs["scales"] if opset >= 7 else \
            [1.0, 1.0, attrs["height_scale"], attrs["width_scale"]]
        scales = b.constant(np.asarray(values, dtype=np.float32), hint="scales")
    node.op = "Resize"
    node.inputs = [node.inputs[0], "", scales]
    node.attrs = _legacy_resize_attrs(attrs.get("mode", "nearest"))


@upgrade("GridSample", before=20)
def grid_sample_mode_names(node: Node, b: Builder, opset: int) -> None:
    """GridSample-20 calls the modes ``linear`` and ``cubic``."""
    renamed = {"bilinear": "linear", "bicubic": "cubic"}
    mode = node.attrs.get("mode")
    if mode in renamed:
        node.attrs["mode"] = renamed[mode]


@upgrade("RoiAlign", before=16)
def roi_align_output_half_pixel(node: Node, b: Builder, opset: int) -> None:
    """RoiAlign-10 did not shift the input by half a pixel."""
    node.attrs["coordinate_transformation_mode"] = "output_half_pixel"


@upgrade("DFT", before=20)
def dft_axis_to_input(node: Node, b: Builder, opset: int) -> None:
    """DFT-20 takes ``axis`` as its third input; DFT-17's default axis was 1."""
    node.attrs.setdefault("axis", 1)
    attr_to_input(node, b, "axis", 2)
