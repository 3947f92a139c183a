"""Image ops (Resize, GridSample, AffineGrid, RoiAlign, NonMaxSuppression): symbolic shape
inference, numbers against numpy, errors, and the upgrades of their older ONNX versions."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from op_helpers import node_graph, node_types, run_named

from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import tensor
from ember.passes.infer_shapes import infer_shapes

F32, I64 = DType.FLOAT32, DType.INT64
RNG = np.random.default_rng(0)


def _import_and_run(node, inputs: dict[str, np.ndarray], opset: int,
                    initializers: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Import a one-node ONNX model of ``opset`` and run it on ``inputs``."""
    infos = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for k, v in inputs.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph([node], "g", infos, [helper.make_empty_tensor_value_info("y")],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return ReferenceExecutor(import_onnx(model)).run(inputs)["y"]


# ----------------------------------------------------------------------------- shape inference


def test_resize_by_constant_scales_keeps_symbols():
    x = tensor(F32, "N", 3, "H", "W")
    scales = np.array([1, 1, 2, 3], dtype=np.float32)
    assert node_types("Resize", {"x": x, "roi": None, "scales": scales}) == \
        ["f32[N, 3, 2*H, 3*W]"]
    # A fractional scale of a symbolic dim is not expressible: unknown, not a guess.
    half = np.array([1, 1, 0.5, 0.5], dtype=np.float32)
    assert node_types("Resize", {"x": tensor(F32, "N", 3, "H", 7), "roi": None, "scales": half}) \
        == ["f32[N, 3, ?, 3]"]


def test_resize_by_sizes_with_axes_and_aspect_policy():
    x = tensor(F32, "N", 3, 20, 40)
    sizes = np.array([10, 10], dtype=np.int64)
    assert node_types("Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes},
                      axes=[2, 3]) == ["f32[N, 3, 10, 10]"]
    assert node_types("Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes},
                      axes=[-2, -1], keep_aspect_ratio_policy="not_larger") == ["f32[N, 3, 5, 10]"]
    assert node_types("Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes},
                      axes=[2, 3], keep_aspect_ratio_policy="not_smaller") == ["f32[N, 3, 10, 20]"]


def test_resize_with_run_time_scales_knows_only_the_untouched_axes():
    x = tensor(F32, "N", 3, "H", "W")
    runtime_scales = tensor(F32, 2)
    assert node_types("Resize", {"x": x, "roi": None, "scales": runtime_scales}, axes=[2, 3]) == \
        ["f32[N, 3, ?, ?]"]
    assert node_types("Resize", {"x": tensor(F32, "N", 3), "roi": None, "scales": tensor(F32, 2)}) \
        == ["f32[?, ?]"]


def test_grid_sample_and_affine_grid_shapes():
    x4, x5 = tensor(F32, "N", "C", "H", "W"), tensor(F32, "N", "C", 4, "H", "W")
    assert node_types("GridSample", {"x": x4, "grid": tensor(F32, "N", 5, 6, 2)}) == \
        ["f32[N, C, 5, 6]"]
    assert node_types("GridSample", {"x": x5, "grid": tensor(F32, "N", 2, 5, 6, 3)},
                      mode="nearest") == ["f32[N, C, 2, 5, 6]"]
    theta = tensor(F32, "N", 2, 3)
    assert node_types("AffineGrid", {"theta": theta, "size": tensor(I64, 4)}) == \
        ["f32[N, ?, ?, 2]"]
    assert node_types("AffineGrid", {"theta": tensor(F32, 2, 3, 4),
                                     "size": np.array([2, 1, 4, 5, 6], dtype=np.int64)}) == \
        ["f32[2, 4, 5, 6, 3]"]


def test_affine_grid_size_from_a_symbolic_shape():
    graph = Graph(inputs=["theta", "x"], outputs=["grid"],
                  types={"theta": tensor(F32, "N", 2, 3), "x": tensor(F32, "N", 3, "H", "W")},
                  nodes=[Node("Shape", ["x"], ["size"], name="shape"),
                         Node("AffineGrid", ["theta", "size"], ["grid"], name="n")])
    assert str(infer_shapes(graph).types["grid"]) == "f32[N, H, W, 2]"


def test_roi_align_and_nms_shapes():
    inputs = {"x": tensor(F32, "N", "C", "H", "W"), "rois": tensor(F32, "R", 4),
              "idx": tensor(I64, "R")}
    assert node_types("RoiAlign", inputs, output_height=7, output_width=5) == ["f32[R, C, 7, 5]"]
    assert node_types("NonMaxSuppression", {"boxes": tensor(F32, "N", "B", 4),
                                            "scores": tensor(F32, "N", 3, "B")}) == ["i64[?, 3]"]


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("GridSample", {"x": tensor(F32, 1, 1, 4, 4), "grid": tensor(F32, 1, 3, 3, 3)}, {},
     "last dimension must be 2"),
    ("GridSample", {"x": tensor(F32, 1, 1, 4, 4), "grid": tensor(F32, 1, 3, 3, 2)},
     {"padding_mode": "wrap"}, "padding_mode"),
    ("Resize", {"x": tensor(F32, 1, 4), "roi": None, "scales": tensor(F32, 2)},
     {"mode": "area"}, "mode must be one of"),
    ("Resize", {"x": tensor(F32, 1, 4), "roi": None,
                "scales": np.ones(2, dtype=np.float32), "sizes": np.ones(2, dtype=np.int64)},
     {}, "only one of"),
    ("Resize", {"x": tensor(F32, 1, 4), "roi": None, "scales": np.ones(3, dtype=np.float32)},
     {}, "3 values for 2 resized axes"),
    ("RoiAlign", {"x": tensor(F32, 1, 2, 8, 8), "rois": tensor(F32, 3, 5),
                  "idx": tensor(I64, 3)}, {}, "rois must have shape"),
    ("RoiAlign", {"x": tensor(F32, 1, 2, 8, 8), "rois": tensor(F32, 3, 4),
                  "idx": tensor(I64, 2)}, {}, "numbers of rois and batch_indices"),
])
def test_inconsistent_inputs_are_shape_errors(op, inputs, attrs, message):
    with pytest.raises(ShapeError, match=message):
        node_graph(op, inputs, **attrs)


# ----------------------------------------------------------------------------- numbers


def test_resize_nearest_integer_upsample_repeats_pixels():
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    y = run_named("Resize", {"x": x, "roi": None, "scales": np.array([1, 1, 2, 3], np.float32)})
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(3, axis=3))


def test_resize_linear_half_pixel_downsample_by_two_averages_pairs():
    x = RNG.standard_normal((2, 8)).astype(np.float64)
    y = run_named("Resize", {"x": x, "roi": None, "scales": np.array([1, 0.5], np.float32)},
                  mode="linear")
    np.testing.assert_allclose(y, (x[:, 0::2] + x[:, 1::2]) / 2)


def test_resize_linear_antialias_downsample_is_a_box_filter_average():
    # Downsampling by 4 with antialias stretches the triangle kernel to 4 pixels each side.
    x = np.arange(16, dtype=np.float64).reshape(1, 16)
    y = run_named("Resize", {"x": x, "roi": None, "scales": None,
                             "sizes": np.array([1, 4], np.int64)}, mode="linear", antialias=1)
    # Inner outputs see a symmetric window, so they equal the window centre.
    np.testing.assert_allclose(y[0, 1:3], [5.5, 9.5])


def test_resize_integer_data_is_rounded_and_saturated():
    # Cubic interpolation of a step overshoots: -23.9 and 278.9 saturate, 127.5 rounds to even.
    x = np.array([[0, 0, 255, 255]], dtype=np.uint8)
    y = run_named("Resize",
                  {"x": x, "roi": None, "scales": None, "sizes": np.array([1, 7], np.int64)},
                  mode="cubic", coordinate_transformation_mode="align_corners")
    assert y.dtype == np.uint8
    assert y.tolist() == [[0, 0, 0, 128, 255, 255, 255]]


def test_resize_nearest_works_for_strings_and_crop_extrapolates():
    x = np.array([["a", "b"]], dtype=object)
    y = run_named("Resize", {"x": x, "roi": None, "scales": np.array([1, 2], np.float32)})
    assert y.tolist() == [["a", "a", "b", "b"]]
    crop = run_named("Resize", {"x": np.ones((1, 4), np.float32),
                                "roi": np.array([0, -1, 1, 1], np.float32), "scales": None,
                                "sizes": np.array([1, 3], np.int64)},
                     mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                     extrapolation_value=7.0)
    assert crop.tolist() == [[7.0, 1.0, 1.0]]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("spatial", [(5, 7), (3, 4, 5)])
def test_grid_sample_of_the_identity_affine_grid_returns_the_input(mode, spatial):
    r = len(spatial)
    x = RNG.standard_normal((2, 3) + spatial).astype(np.float32)
    theta = np.tile(np.eye(r, r + 1, dtype=np.float32), (2, 1, 1))
    size = np.array((2, 3) + spatial, dtype=np.int64)
    for align in (0, 1):
        grid = run_named("AffineGrid", {"theta": theta, "size": size}, align_corners=align)
        assert grid.shape == (2,) + spatial + (r,)
        y = run_named("GridSample", {"x": x, "grid": grid}, mode=mode, align_corners=align)
        np.testing.assert_allclose(y, x, atol=1e-5)


def test_grid_sample_padding_modes_outside_the_image():
    x = np.array([[[[1.0, 2.0, 3.0, 4.0]]]], dtype=np.float32)  # (1, 1, 1, 4)
    grid = np.array([[[[-2.0, 0.0], [2.0, 0.0]]]], dtype=np.float32)  # far left, far right
    zeros = run_named("GridSample", {"x": x, "grid": grid}, mode="nearest")
    border = run_named("GridSample", {"x": x, "grid": grid}, mode="nearest", padding_mode="border")
    assert zeros.ravel().tolist() == [0.0, 0.0]
    assert border.ravel().tolist() == [1.0, 4.0]
    # align_corners=1: -2 maps to pixel -1.5, rounds half to even to -2 and reflects about 0
    # to 2; 2 maps to 4.5, rounds to 4 and reflects about 3 to 2.
    mirrored = run_named("GridSample", {"x": x, "grid": grid}, mode="nearest",
                         padding_mode="reflection", align_corners=1)
    assert mirrored.ravel().tolist() == [3.0, 3.0]


def test_roi_align_of_a_linear_ramp_samples_bin_centres():
    # On f(y, x) = x the bilinear samples are exact, so each bin averages its centre column.
    x = np.tile(np.arange(8, dtype=np.float32), (1, 1, 8, 1))
    rois = np.array([[0, 0, 4, 4]], dtype=np.float32)
    y = run_named("RoiAlign", {"x": x, "rois": rois, "idx": np.array([0], np.int64)},
                  output_height=2, output_width=2, sampling_ratio=2)
    np.testing.assert_allclose(y[0, 0], [[0.5, 2.5], [0.5, 2.5]])


def test_nms_keeps_the_best_of_overlapping_boxes_per_class():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], dtype=np.float32)
    scores = np.array([[[0.9, 0.95, 0.5], [0.1, 0.2, 0.3]]], dtype=np.float32)
    selected = run_named("NonMaxSuppression", {
        "boxes": boxes, "scores": scores, "limit": np.array([2], np.int64),
        "iou": np.array([0.5], np.float32), "min_score": np.array([0.15], np.float32)})
    assert selected.tolist() == [[0, 0, 1], [0, 0, 2], [0, 1, 2], [0, 1, 1]]


def test_resize_of_bool_data_cannot_interpolate():
    with pytest.raises(EmberError, match="node 'n'.*only nearest mode"):
        run_named("Resize", {"x": np.ones((1, 2), bool), "roi": None,
                             "scales": np.array([1, 2], np.float32)}, mode="linear")


# ----------------------------------------------------------------------------- upgrades


def test_resize_10_and_upsample_sample_like_upsample():
    x = RNG.standard_normal((1, 1, 2, 3)).astype(np.float32)
    scales = np.array([1, 1, 2, 2], dtype=np.float32)
    expected = x.repeat(2, axis=2).repeat(2, axis=3)
    resize10 = helper.make_node("Resize", ["x", "scales"], ["y"])
    np.testing.assert_array_equal(
        _import_and_run(resize10, {"x": x}, 10, {"scales": scales}), expected)
    upsample9 = helper.make_node("Upsample", ["x", "scales"], ["y"])
    np.testing.assert_array_equal(
        _import_and_run(upsample9, {"x": x}, 9, {"scales": scales}), expected)
    upsample7 = helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0])
    np.testing.assert_array_equal(_import_and_run(upsample7, {"x": x}, 7), expected)
    # Asymmetric linear upsampling interpolates towards the next pixel, clamping at the end.
    linear = _import_and_run(helper.make_node("Upsample", ["x"], ["y"], mode="linear",
                                              scales=[1.0, 1.0, 1.0, 2.0]), {"x": x}, 7)
    row = x[0, 0, 0]
    np.testing.assert_allclose(linear[0, 0, 0], [row[0], (row[0] + row[1]) / 2, row[1],
                                                 (row[1] + row[2]) / 2, row[2], row[2]])


def test_grid_sample_16_and_roi_align_10_upgrades():
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1.2, 1.2, (1, 3, 3, 2)).astype(np.float32)
    old = _import_and_run(helper.make_node("GridSample", ["x", "grid"], ["y"], mode="bicubic"),
                          {"x": x, "grid": grid}, 16)
    new = run_named("GridSample", {"x": x, "grid": grid}, mode="cubic")
    np.testing.assert_array_equal(old, new)
    rois = np.array([[0.3, 0.4, 2.5, 3.1]], dtype=np.float32)
    idx = np.array([0], dtype=np.int64)
    old = _import_and_run(helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"]),
                          {"x": x, "rois": rois, "idx": idx}, 10)
    new = run_named("RoiAlign", {"x": x, "rois": rois, "idx": idx},
                    coordinate_transformation_mode="output_half_pixel")
    np.testing.assert_array_equal(old, new)


def test_resize_11_empty_roi_and_scales_and_its_legacy_coordinate_mode():
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    empty = np.zeros(0, dtype=np.float32)
    sizes = np.array([1, 1, 1, 8], dtype=np.int64)
    node = helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"],
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    y = _import_and_run(node, {"x": x}, 11, {"roi": empty, "scales": empty, "sizes": sizes})
    # x_original = (i + 0.5) / 2 rounds half down: 0.25, 0.75 -> 0, 1; 1.25, 1.75 -> 1, 2 ...
    assert y.ravel().tolist() == [0, 1, 1, 2, 2, 3, 3, 3]
