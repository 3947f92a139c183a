"""Normalizations (softmax family, Batch/Instance/Layer/Group/RMS norm, LRN, Lp, MVN, Dropout)
and the losses: symbolic shape inference, numbers against numpy, errors, and upgrades."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import node_graph, node_types, run_node

from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType, tensor

F32 = DType.FLOAT32
RNG = np.random.default_rng(0)


def _standardized(x: np.ndarray, axes: tuple[int, ...], epsilon: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + epsilon)


def _vec(n: int) -> TensorType:
    return tensor(F32, n)


# ----------------------------------------------------------------------------- shape inference


def test_layer_norm_statistics_shapes_follow_axis_and_stash_type():
    inputs = {"x": tensor(F32, "N", "S", 64), "scale": _vec(64)}
    assert node_types("LayerNormalization", inputs, 3) == \
        ["f32[N, S, 64]", "f32[N, S, 1]", "f32[N, S, 1]"]
    assert node_types("LayerNormalization", inputs, 3, axis=1, stash_type=11)[1] == \
        "f64[N, 1, 1]"


def test_normalizations_keep_symbolic_shapes():
    x = tensor(F32, "N", 4, "H", "W")
    assert node_types("BatchNormalization", {"x": x, **{p: _vec(4) for p in "sbmv"}}) == \
        ["f32[N, 4, H, W]"]
    assert node_types("InstanceNormalization", {"x": x, "s": _vec(4), "b": _vec(4)}) == \
        ["f32[N, 4, H, W]"]
    assert node_types("GroupNormalization", {"x": x, "s": _vec(4), "b": _vec(4)},
                      num_groups=2) == ["f32[N, 4, H, W]"]
    assert node_types("RMSNormalization", {"x": x, "s": _vec(1)}) == ["f32[N, 4, H, W]"]
    assert node_types("LRN", {"x": x}, size=3) == ["f32[N, 4, H, W]"]
    assert node_types("Softmax", {"x": x}, axis=1) == ["f32[N, 4, H, W]"]
    assert node_types("Dropout", {"x": x}, 2) == ["f32[N, 4, H, W]", "bool[N, 4, H, W]"]


def test_batch_norm_training_outputs_are_per_channel():
    inputs = {"x": tensor(F32, "N", "C", 8), **{p: tensor(F32, "C") for p in "sbmv"}}
    assert node_types("BatchNormalization", inputs, 3, training_mode=1) == \
        ["f32[N, C, 8]", "f32[C]", "f32[C]"]


def test_loss_shapes():
    scores = {"x": tensor(F32, "N", 5, "D"), "t": tensor(DType.INT64, "N", "D")}
    assert node_types("NegativeLogLikelihoodLoss", scores, reduction="none") == ["f32[N, D]"]
    assert node_types("SoftmaxCrossEntropyLoss", scores, 2) == ["f32[]", "f32[N, 5, D]"]


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("BatchNormalization", {"x": tensor(F32, "N", 3, 8), **{p: _vec(4) for p in "sbmv"}}, {},
     "scale must have shape \\[3\\]"),
    ("BatchNormalization", {"x": tensor(F32, "N", 3), **{p: _vec(3) for p in "sbmv"}}, {},
     None),
    ("GroupNormalization", {"x": tensor(F32, "N", 6, 8), "s": _vec(6), "b": _vec(6)},
     {"num_groups": 4}, "6 channels cannot be split into 4 groups"),
    ("LayerNormalization", {"x": tensor(F32, "N", 8), "s": _vec(5)}, {},
     "does not broadcast"),
    ("Softmax", {"x": tensor(F32, "N", 8)}, {"axis": 2}, "out of range"),
    ("LpNormalization", {"x": tensor(F32, "N", 8)}, {"p": 3}, "p must be 1 or 2"),
    ("LRN", {"x": tensor(F32, "N", 8)}, {"size": 0}, "size must be positive"),
    ("NegativeLogLikelihoodLoss", {"x": tensor(F32, "N", 5), "t": tensor(DType.INT64, "N", 3)},
     {}, "without its class axis"),
    ("SoftmaxCrossEntropyLoss", {"x": tensor(F32, 2, 5), "t": tensor(DType.INT64, 2)},
     {"reduction": "average"}, "reduction must be one of"),
])
def test_inconsistent_inputs_are_shape_errors(op, inputs, attrs, message):
    if message is None:  # the valid variant of the case above
        node_graph(op, inputs, **attrs)
        return
    with pytest.raises(ShapeError, match=f"node 'n' \\({op}\\).*{message}"):
        node_graph(op, inputs, **attrs)


# ----------------------------------------------------------------------------- values


def test_layer_norm_matches_numpy():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    scale, bias = (RNG.standard_normal(4).astype(np.float32) for _ in range(2))
    y, mean, inv_std = run_node("LayerNormalization", x, scale, bias, outputs=3)
    np.testing.assert_allclose(y, _standardized(x, (2,)) * scale + bias, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, x.mean(2, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv_std, 1 / np.sqrt(x.var(2, keepdims=True) + 1e-5), rtol=1e-5)


def test_group_norm_matches_numpy():
    x = RNG.standard_normal((2, 6, 5)).astype(np.float32)
    scale, bias = (RNG.standard_normal(6).astype(np.float32) for _ in range(2))
    y = run_node("GroupNormalization", x, scale, bias, num_groups=3)
    grouped = _standardized(x.reshape(2, 3, 10), (2,)).reshape(x.shape)
    np.testing.assert_allclose(y, grouped * scale[:, None] + bias[:, None], rtol=1e-5,
                               atol=1e-6)


def test_batch_norm_training_mode_uses_batch_statistics():
    x = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    scale, bias = np.ones(3, np.float32), np.zeros(3, np.float32)
    mean, var = np.zeros(3, np.float32), np.ones(3, np.float32)
    y, running_mean, running_var = run_node("BatchNormalization", x, scale, bias, mean, var,
                                            outputs=3, training_mode=1, momentum=0.5)
    np.testing.assert_allclose(y, _standardized(x, (0, 2)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(running_mean, 0.5 * x.mean((0, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(running_var, 0.5 + 0.5 * x.var((0, 2)), rtol=1e-5)


def test_lrn_matches_a_direct_window_sum():
    x = RNG.standard_normal((1, 5, 2)).astype(np.float32)
    size, alpha, beta, bias = 4, 0.1, 0.75, 2.0
    expected = np.empty_like(x)
    for c in range(5):
        window = x[:, max(0, c - 1):min(5, c + 3)]  # floor(3/2)=1 before, ceil(3/2)=2 after
        expected[:, c] = x[:, c] / (bias + alpha / size * (window ** 2).sum(1)) ** beta
    np.testing.assert_allclose(run_node("LRN", x, size=size, alpha=alpha, beta=beta, bias=bias),
                               expected, rtol=1e-5)


def test_lp_normalization_of_a_zero_vector_is_zero():
    x = np.array([[3.0, -4.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(run_node("LpNormalization", x, p=1), [[3 / 7, -4 / 7], [0, 0]])


def test_softmax_family_half_precision_keeps_dtype():
    x = np.array([[1.0, 2.0, 3.0], [3.0, 3.0, -1.0]], dtype=np.float16)
    soft = run_node("Softmax", x)
    assert soft.dtype == np.float16
    np.testing.assert_allclose(soft.sum(-1), 1, rtol=1e-3)
    np.testing.assert_array_equal(run_node("Hardmax", x), [[0, 0, 1], [1, 0, 0]])


def test_dropout_is_deterministic_only_without_dropping():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    y, mask = run_node("Dropout", x, np.array(0.0, np.float32), np.array(True), outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()
    with pytest.raises(ShapeError, match="random"):
        run_node("Dropout", x, np.array(0.3, np.float32), np.array(True))


def test_losses_with_weights_and_ignore_index():
    log_prob = np.log(np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]], dtype=np.float32))
    target = np.array([1, 0, 1], dtype=np.int64)
    weight = np.array([2.0, 1.0], dtype=np.float32)
    loss = run_node("NegativeLogLikelihoodLoss", log_prob, target, weight, ignore_index=0)
    expected = -(np.log(0.8) + np.log(0.5)) / 2  # sample 1 is ignored; weights 1 and 1
    assert loss.shape == () and loss == pytest.approx(expected, rel=1e-6)
    scores = np.log(np.array([[0.2, 0.8], [0.6, 0.4]], dtype=np.float32))
    sce, log_softmax = run_node("SoftmaxCrossEntropyLoss", scores, target[:2], outputs=2,
                                reduction="sum")
    np.testing.assert_allclose(log_softmax, scores, rtol=1e-6)
    assert sce == pytest.approx(-(np.log(0.8) + np.log(0.6)), rel=1e-6)


def test_loss_target_out_of_range_is_an_error():
    with pytest.raises(ShapeError, match="target value 5 is not a class"):
        run_node("NegativeLogLikelihoodLoss", np.zeros((2, 3), np.float32),
                 np.array([0, 5], np.int64))


# ----------------------------------------------------------------------------- upgrades


def _import(node, inputs, outputs, opset: int):
    graph = helper.make_graph([node], "g", inputs, outputs)
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _info(name: str, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_old_softmax_coerces_to_2d_and_restores_the_shape():
    model = _import(helper.make_node("Softmax", ["x"], ["y"], axis=1),
                    [_info("x", ["N", 3, 4])], [_info("y", None)], opset=11)
    assert [n.op for n in model.nodes] == ["Flatten", "Shape", "Softmax", "Reshape"]
    assert str(model.types["y"]) == "f32[N, 3, 4]"
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    flat = x.reshape(2, 12)
    expected = (np.exp(flat) / np.exp(flat).sum(1, keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(ReferenceExecutor(model).run({"x": x})["y"], expected,
                               rtol=1e-5)


def test_old_batch_norm_is_test_and_dropout_ratio():
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1,
                          epsilon=1e-3)
    model = _import(bn, [_info("x", ["N", 2])] + [_info(p, [2]) for p in "sbmv"],
                    [_info("y", None)], opset=6)
    (node,) = model.nodes
    assert set(node.attrs) == {"epsilon"} and len(node.outputs) == 1
    drop = helper.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.2)
    model = _import(drop, [_info("x", ["N", 2])],
                    [_info("y", None), _info("mask", None, TensorProto.BOOL)],
                    opset=10)
    (node,) = model.nodes
    assert "ratio" not in node.attrs and len(node.inputs) == 2
    assert str(model.types["mask"]) == "bool[N, 2]"


def test_old_group_norm_repeats_per_group_params_over_channels():
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    model = _import(node, [_info("x", ["N", 4, 3]), _info("s", [2]), _info("b", [2])],
                    [_info("y", None)], opset=18)
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    scale, bias = np.array([2.0, -1.0], np.float32), np.array([0.5, 1.0], np.float32)
    y = ReferenceExecutor(model).run({"x": x, "s": scale, "b": bias})["y"]
    normalized = _standardized(x.reshape(2, 2, 6), (2,)).reshape(x.shape)
    expected = normalized * np.repeat(scale, 2)[:, None] + np.repeat(bias, 2)[:, None]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_old_non_spatial_batch_norm_normalizes_per_feature():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0)
    model = _import(node, [_info("x", ["N", 2, 3])] + [_info(p, [2, 3]) for p in "sbmv"],
                    [_info("y", None)], opset=7)
    assert str(model.types["y"]) == "f32[N, 2, 3]"
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    scale, bias, mean = (RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    var = np.full((2, 3), 0.5, np.float32)
    y = ReferenceExecutor(model).run({"x": x, "s": scale, "b": bias, "m": mean, "v": var})["y"]
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-5)
