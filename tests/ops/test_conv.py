"""Convolutions (Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im,
CausalConvWithState): symbolic shape inference, numbers against plain-numpy oracles, and the
errors a user gets for inconsistent inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from op_helpers import node_types, run_node

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.ir.types import TensorType, tensor

F32 = DType.FLOAT32
RNG = np.random.default_rng(0)


def _naive_conv(x, w, strides, pads, dilations, group):
    """Direct-loop 2-D convolution, the oracle for the im2col reference."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    for b, o, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = o // (m // group)
        patch = xp[b, g * cg:(g + 1) * cg,
                   i * strides[0]:i * strides[0] + (kh - 1) * dilations[0] + 1:dilations[0],
                   j * strides[1]:j * strides[1] + (kw - 1) * dilations[1] + 1:dilations[1]]
        y[b, o, i, j] = np.sum(patch * w[o])
    return y


# ----------------------------------------------------------------------------- inference


def test_conv_symbolic_batch_resnet_stem():
    types = node_types("Conv", {"x": tensor(F32, "N", 3, 224, 224), "w": tensor(F32, 64, 3, 7, 7)},
                       strides=[2, 2], pads=[3, 3, 3, 3])
    assert types == ["f32[N, 64, 112, 112]"]


def test_conv_symbolic_spatial_dims():
    x = {"x": tensor(F32, "N", 8, "H", "W"), "w": tensor(F32, 16, 8, 3, 3)}
    assert node_types("Conv", x, pads=[1, 1, 1, 1]) == ["f32[N, 16, H, W]"]
    assert node_types("Conv", x) == ["f32[N, 16, H - 2, W - 2]"]
    assert node_types("Conv", x, auto_pad="SAME_UPPER") == ["f32[N, 16, H, W]"]
    # H // 2 is not a polynomial of H: unknown rather than a guess.
    assert node_types("Conv", x, strides=[2, 2], pads=[1, 1, 1, 1]) == ["f32[N, 16, ?, ?]"]
    doubled = {"x": TensorType(F32, (sym("N"), 8, 2 * sym("H"), 4)),
               "w": tensor(F32, 16, 8, 3, 3)}
    assert node_types("Conv", doubled, strides=[2, 2], auto_pad="SAME_LOWER") == \
        ["f32[N, 16, H, 2]"]


def test_conv_unknown_weight_shape_and_rank():
    assert node_types("Conv", {"x": tensor(F32, "N", 3, 32, 32), "w": TensorType(F32, None)},
                      kernel_shape=[3, 3]) == ["f32[N, ?, 30, 30]"]
    assert node_types("Conv", {"x": TensorType(F32, None), "w": tensor(F32, 4, 3, 3)}) == \
        ["f32[?, 4, ?]"]


def test_conv_family_types():
    u8, i8 = DType.UINT8, DType.INT8
    assert node_types("ConvInteger", {"x": tensor(u8, "N", 2, 5, 5), "w": tensor(u8, 4, 2, 2, 2)}) \
        == ["i32[N, 4, 4, 4]"]
    scalars = {name: tensor(F32) for name in ("xs", "ws", "ys")}
    inputs = {"x": tensor(u8, "N", 2, 5, 5), "xs": scalars["xs"], "xz": tensor(u8),
              "w": tensor(i8, 4, 2, 3, 3), "ws": scalars["ws"], "wz": tensor(i8),
              "ys": scalars["ys"], "yz": tensor(i8)}
    assert node_types("QLinearConv", inputs, pads=[1, 1, 1, 1]) == ["i8[N, 4, 5, 5]"]
    deform = {"x": tensor(F32, "N", 4, 9, 9), "w": tensor(F32, 6, 2, 3, 3),
              "offset": tensor(F32, "N", 36, 4, 4)}
    assert node_types("DeformConv", deform, group=2, offset_group=2, strides=[2, 2]) == \
        ["f32[N, 6, 4, 4]"]


def test_conv_transpose_symbolic():
    x = {"x": tensor(F32, "N", 8, "H", "W"), "w": tensor(F32, 8, 2, 4, 4)}
    assert node_types("ConvTranspose", x, strides=[2, 2], pads=[1, 1, 1, 1], group=2) == \
        ["f32[N, 4, 2*H, 2*W]"]
    assert node_types("ConvTranspose", x, strides=[2, 2], auto_pad="SAME_UPPER") == \
        ["f32[N, 2, 2*H, 2*W]"]
    assert node_types("ConvTranspose", x, output_shape=[10, 12]) == ["f32[N, 2, 10, 12]"]
    assert node_types("ConvTranspose", x, strides=[3, 2], output_padding=[1, 1]) == \
        ["f32[N, 2, 3*H + 2, 2*W + 3]"]


def test_col2im_and_causal_conv_types():
    constants = {"image": np.array([5, 6], np.int64), "block": np.array([2, 3], np.int64)}
    assert node_types("Col2Im", {"x": tensor(F32, "N", 12, 16)}, constants=constants) == \
        ["f32[N, 2, 5, 6]"]
    inputs = {"x": tensor(F32, "B", 8, "L"), "w": tensor(F32, 8, 1, 4)}
    assert node_types("CausalConvWithState", inputs, outputs=2) == ["f32[B, 8, L]", "f32[B, 8, 3]"]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("x_shape, w_shape, attrs, message", [
    ((1, 3, 8, 8), (4, 4, 3, 3), {}, "3 channels"),
    ((1, 4, 8, 8), (6, 1, 3, 3), {"group": 4}, "not divisible by group"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": [1, 1]}, "pads has 2 values"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"auto_pad": "SAME"}, "auto_pad 'SAME'"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "smaller than the window extent"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"kernel_shape": [3]}, "does not match"),
])
def test_conv_errors_name_the_node(x_shape, w_shape, attrs, message):
    with pytest.raises(ShapeError, match=message) as info:
        node_types("Conv", {"x": tensor(F32, *x_shape), "w": tensor(F32, *w_shape)}, **attrs)
    assert "node 'n' (Conv)" in str(info.value)


def test_reference_errors_are_clear():
    x = RNG.standard_normal((1, 2, 4)).astype(np.float32)
    with pytest.raises(EmberError, match="past_state"):
        run_node("CausalConvWithState", x, np.ones((2, 1, 3), np.float32),
                 np.zeros(2, np.float32), np.zeros((1, 2, 5), np.float32), outputs=2)
    with pytest.raises(EmberError, match="blocks"):
        run_node("Col2Im", np.ones((1, 4, 5), np.float32), np.array([3, 3]), np.array([2, 2]))


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("group, strides, pads, dilations", [
    (1, [1, 1], [0, 0, 0, 0], [1, 1]),
    (2, [2, 1], [1, 0, 2, 1], [1, 2]),
    (4, [1, 3], [2, 2, 0, 1], [2, 1]),
])
def test_conv_matches_direct_loops(group, strides, pads, dilations):
    x = RNG.standard_normal((2, 4, 7, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 4 // group, 3, 2)).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32)
    y = run_node("Conv", x, w, b, group=group, strides=strides, pads=pads, dilations=dilations)
    expected = _naive_conv(x, w, strides, pads, dilations, group) + b[:, None, None]
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_conv_float16_keeps_its_dtype():
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float16)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float16)
    y = run_node("Conv", x, w)
    assert y.dtype == np.float16
    expected = _naive_conv(x.astype(np.float64), w.astype(np.float64), [1, 1], [0] * 4, [1, 1], 1)
    np.testing.assert_allclose(y, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("strides, pads, dilations, group", [
    ([2, 2], [1, 1, 1, 1], [1, 1], 1),
    ([3, 1], [0, 2, 1, 0], [2, 1], 2),
])
def test_conv_transpose_is_the_adjoint_of_conv(strides, pads, dilations, group):
    """<Conv(x), y> == <x, ConvTranspose(y)> for the same weights (the defining property)."""
    x = RNG.standard_normal((1, 4, 9, 8))
    w = RNG.standard_normal((6, 4 // group, 3, 3))
    attrs = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    conv = run_node("Conv", x, w, **attrs)
    y = RNG.standard_normal(conv.shape)
    # Conv's W (M, C / group, k...) is read by ConvTranspose as (C_in, M_out / group, k...);
    # output_padding restores the input rows the strided Conv never reached.
    output_padding = [size - (s * (n - 1) + (3 - 1) * d + 1 - p0 - p1) for size, s, n, d, p0, p1
                      in zip(x.shape[2:], strides, conv.shape[2:], dilations, pads[:2], pads[2:])]
    back = run_node("ConvTranspose", y, w, output_padding=output_padding, **attrs)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.vdot(conv, y), np.vdot(x, back), rtol=1e-9)


def test_col2im_counts_block_coverage():
    """Col2Im of all-ones columns counts how many blocks cover each pixel."""
    image, block, strides, pads = (5, 4), (2, 3), (1, 1), (1, 0, 0, 1)
    blocks = [(i + p0 + p1 - k) // s + 1
              for i, k, s, p0, p1 in zip(image, block, strides, pads[:2], pads[2:])]
    cols = np.ones((1, 6, blocks[0] * blocks[1]), np.float32)
    y = run_node("Col2Im", cols, np.array(image), np.array(block), strides=list(strides),
                 pads=list(pads))
    expected = np.zeros(image)
    for i, j in itertools.product(range(blocks[0]), range(blocks[1])):
        top, left = i - pads[0], j - pads[1]
        for di, dj in itertools.product(range(block[0]), range(block[1])):
            if 0 <= top + di < image[0] and 0 <= left + dj < image[1]:
                expected[top + di, left + dj] += 1
    np.testing.assert_array_equal(y[0, 0], expected)


def test_deform_conv_with_zero_offsets_is_conv():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    offset = np.zeros((1, 2 * 9 * 2, 6, 6), np.float32)
    y = run_node("DeformConv", x, w, offset, group=2, offset_group=2, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(y, run_node("Conv", x, w, group=2, pads=[1, 1, 1, 1]),
                               rtol=1e-5, atol=1e-5)
    # A whole-pixel offset samples the neighbouring pixel exactly: moving every tap one pixel
    # right is a convolution whose windows start one pixel later.
    shifted = offset.copy()
    shifted[:, 1::2] = 1.0
    y = run_node("DeformConv", x, w, shifted, group=2, offset_group=2, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(y, run_node("Conv", x, w, group=2, pads=[1, 0, 1, 2]),
                               rtol=1e-5, atol=1e-5)


def test_causal_conv_streams_in_chunks():
    """Two calls carrying the state equal one call over the whole sequence."""
    x = RNG.standard_normal((2, 3, 10)).astype(np.float32)
    w = RNG.standard_normal((3, 1, 4)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    whole, _ = run_node("CausalConvWithState", x, w, b, outputs=2, activation="silu")
    first, state = run_node("CausalConvWithState", x[..., :6], w, b, outputs=2, activation="silu")
    second, _ = run_node("CausalConvWithState", x[..., 6:], w, b, state, outputs=2,
                         activation="silu")
    np.testing.assert_allclose(np.concatenate([first, second], axis=2), whole, rtol=1e-5)


def test_conv_integer_and_qlinear_conv():
    x = RNG.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    w = RNG.integers(-128, 127, (3, 2, 2, 2)).astype(np.int8)
    w_zero = np.array([1, -2, 3], np.int8)  # per output channel
    y = run_node("ConvInteger", x, w, np.uint8(10), w_zero)
    centred_w = w.astype(np.int64) - w_zero[:, None, None, None]
    expected = _naive_conv(x.astype(np.int64) - 10, centred_w, [1, 1], [0] * 4, [1, 1], 1)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expected)
    q = run_node("QLinearConv", x, np.float32(0.1), np.uint8(10), w, np.float32(0.01), w_zero,
                 np.float32(0.5), np.uint8(128))
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, np.clip(np.rint(expected * 0.1 * 0.01 / 0.5) + 128, 0, 255))
