"""Pooling (MaxPool with Indices, AveragePool, LpPool, the Global pools, MaxUnpool): symbolic
shape inference, padding and ceil-mode edge cases against plain numpy, errors, and upgrades."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import node_types, run_node

from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import tensor

F32 = DType.FLOAT32
RNG = np.random.default_rng(0)


X = {"x": tensor(F32, "N", 64, 112, 112)}

# ----------------------------------------------------------------------------- inference


def test_max_pool_symbolic_batch_with_indices():
    assert node_types("MaxPool", X, outputs=2, kernel_shape=[3, 3], strides=[2, 2],
                      pads=[1, 1, 1, 1]) == ["f32[N, 64, 56, 56]", "i64[N, 64, 56, 56]"]


def test_pool_symbolic_spatial_dims():
    x = {"x": tensor(F32, "N", 3, "H", "W")}
    assert node_types("AveragePool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1]) == \
        ["f32[N, 3, H, W]"]
    assert node_types("LpPool", x, kernel_shape=[2, 2], ceil_mode=1) == ["f32[N, 3, H - 1, W - 1]"]
    assert node_types("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2]) == ["f32[N, 3, ?, ?]"]
    assert node_types("MaxPool", x, kernel_shape=[3, 3], auto_pad="SAME_UPPER") == \
        ["f32[N, 3, H, W]"]


def test_pool_ceil_mode_drops_a_window_starting_in_the_padding():
    x = {"x": tensor(F32, 1, 1, 5)}
    # ceil((5 + 0 + 2 - 2) / 3) + 1 = 3, but the third window would start at 6, in the pad.
    assert node_types("MaxPool", x, kernel_shape=[2], strides=[3], pads=[0, 2], ceil_mode=1) == \
        ["f32[1, 1, 2]"]
    assert node_types("MaxPool", x, kernel_shape=[2], strides=[2], ceil_mode=1) == ["f32[1, 1, 3]"]


def test_global_pools_and_unpool_types():
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        assert node_types(op, {"x": tensor(F32, "N", 8, "H", "W", 3)}) == ["f32[N, 8, 1, 1, 1]"]
    inputs = {"x": tensor(F32, "N", 2, 4, 4), "i": tensor(DType.INT64, "N", 2, 4, 4)}
    assert node_types("MaxUnpool", inputs, kernel_shape=[2, 2], strides=[2, 2]) == \
        ["f32[N, 2, 8, 8]"]
    shape = {"shape": np.array([1, 2, 9, 9], np.int64)}
    assert node_types("MaxUnpool", inputs, constants=shape, kernel_shape=[2, 2],
                      strides=[2, 2]) == ["f32[1, 2, 9, 9]"]


@pytest.mark.parametrize("op, attrs, message", [
    ("MaxPool", {"kernel_shape": [3]}, "spatial"),
    ("AveragePool", {"kernel_shape": [2, 2], "pads": [1, -1, 1, 1]}, "negative"),
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [0, 1]}, "positive"),
    ("LpPool", {"kernel_shape": [9, 9]}, "smaller than the window"),
])
def test_pool_errors_name_the_node(op, attrs, message):
    with pytest.raises(ShapeError, match=message) as info:
        node_types(op, {"x": tensor(F32, "N", 2, 8, 8)}, **attrs)
    assert f"node 'n' ({op})" in str(info.value)


def test_global_pool_needs_spatial_axes():
    with pytest.raises(ShapeError, match="rank >= 3"):
        node_types("GlobalAveragePool", {"x": tensor(F32, 4, 5)})


# ----------------------------------------------------------------------------- numbers


def test_average_pool_count_include_pad():
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    attrs = dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    corner = run_node("AveragePool", x, **attrs)[0, 0, 0, 0]
    with_pad = run_node("AveragePool", x, count_include_pad=1, **attrs)[0, 0, 0, 0]
    assert corner == 1.0 and with_pad == 0.25  # the window holds x[0, 0] and three pads


def test_average_pool_ceil_overhang_is_never_counted():
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 5)
    y = run_node("AveragePool", x, kernel_shape=[2], strides=[2], ceil_mode=1, count_include_pad=1)
    np.testing.assert_allclose(y[0, 0], [0.5, 2.5, 4.0])  # the last window holds x[4] only


def test_max_pool_indices_row_and_column_major():
    x = RNG.permutation(2 * 3 * 4 * 5).astype(np.float32).reshape(2, 3, 4, 5)
    attrs = dict(kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 0, 1])
    y, rows = run_node("MaxPool", x, outputs=2, **attrs)
    _, cols = run_node("MaxPool", x, outputs=2, storage_order=1, **attrs)
    np.testing.assert_array_equal(x.reshape(-1)[rows], y)
    n, c, h, w = np.unravel_index(rows, x.shape)
    np.testing.assert_array_equal(cols, (n * 3 + c) * 20 + h + w * 4)


def test_max_pool_integer_input_and_dilation():
    x = RNG.integers(-128, 127, (1, 2, 7)).astype(np.int8)
    y = run_node("MaxPool", x, kernel_shape=[3], dilations=[2], pads=[2, 2])
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (2, 2)), constant_values=-1000)
    expected = np.max([padded[..., t * 2:t * 2 + 7] for t in range(3)], axis=0)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, expected)


def test_lp_pools_match_numpy_norms():
    x = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    y = run_node("LpPool", x, kernel_shape=[2, 3], strides=[2, 3], p=3)
    blocks = x.reshape(2, 3, 2, 2, 2, 3)
    np.testing.assert_allclose(y, (np.abs(blocks) ** 3).sum(axis=(3, 5)) ** (1 / 3), rtol=1e-5)
    g = run_node("GlobalLpPool", x, p=1)
    np.testing.assert_allclose(g, np.abs(x).sum(axis=(2, 3), keepdims=True), rtol=1e-5)


def test_global_average_pool_float16():
    x = RNG.standard_normal((1, 2, 30, 30)).astype(np.float16)
    y = run_node("GlobalAveragePool", x)
    assert y.dtype == np.float16 and y.shape == (1, 2, 1, 1)
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               atol=1e-3)


def test_max_unpool_inverts_max_pool():
    x = RNG.random((1, 2, 4, 6)).astype(np.float32) + 1  # positive: pooling zeros back is exact
    y, indices = run_node("MaxPool", x, outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    unpooled = run_node("MaxUnpool", y, indices, kernel_shape=[2, 2], strides=[2, 2])
    assert unpooled.shape == x.shape
    np.testing.assert_array_equal(unpooled.reshape(-1)[indices.reshape(-1)], y.reshape(-1))
    assert np.count_nonzero(unpooled) == y.size
    np.testing.assert_array_equal(
        run_node("MaxPool", unpooled, kernel_shape=[2, 2], strides=[2, 2]), y)


# ----------------------------------------------------------------------------- upgrades


def test_lp_pool_1_float_p_is_upgraded():
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2], p=3.0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [1, 1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    imported = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)]))
    assert imported.nodes[0].attrs["p"] == 3
    x = np.array([[[1, -2, 3, 0]]], np.float32)
    y = ReferenceExecutor(imported).run({"x": x})["y"]
    np.testing.assert_allclose(y[0, 0], [9 ** (1 / 3), 35 ** (1 / 3), 3.0], rtol=1e-6)
