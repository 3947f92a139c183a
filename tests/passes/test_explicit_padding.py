"""Making convolution padding explicit (ember/passes/explicit_padding.py): a Conv with ``pads``
becomes Pad + Conv computing the same values (reference executor before the pass, and ONNX
Runtime, are the oracles); auto_pad convolutions, unpadded ones, ones of unknown input
shape and depthwise ones that test their borders more cheaply are left alone.  A MaxPool's
padding becomes a Pad with -inf, where the pool cannot tell the difference."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.core.dtypes import DType
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType
from ember.passes.explicit_padding import make_padding_explicit
from ember.passes.infer_shapes import infer_shapes

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE
RNG = np.random.default_rng(7)


def _model(x_shape, w_shape, attrs, bias=False, elem=F32, x_dims=None):
    dtype = np.float64 if elem == F64 else np.float32
    inits = [numpy_helper.from_array(RNG.standard_normal(w_shape).astype(dtype), "W")]
    inputs = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(w_shape[0]).astype(dtype),
                                             "B"))
        inputs.append("B")
    graph = helper.make_graph(
        [helper.make_node("Conv", inputs, ["c"], name="conv", **attrs),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "pad",
        [helper.make_tensor_value_info("x", elem, x_dims or list(x_shape))],
        [helper.make_tensor_value_info("y", elem, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=10)


def _rewrite_and_compare(model, x):
    graph = import_onnx(model)
    expected = ReferenceExecutor(graph).run({"x": x})["y"]
    rewritten = copy.deepcopy(graph)
    changed = make_padding_explicit(rewritten)
    actual = ReferenceExecutor(rewritten).run({"x": x})["y"]
    tolerance = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance)
    if x.dtype == np.float32:  # ONNX Runtime has no float64 Conv
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(actual, session.run(None, {"x": x})[0], rtol=1e-4,
                                   atol=1e-4)
    return graph, rewritten, changed


CASES = {
    "2d_symmetric": ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_asymmetric": ((2, 3, 7, 9), (5, 3, 3, 2), {"pads": [0, 2, 3, 1]}),
    "2d_strided_dilated": ((1, 2, 11, 10), (3, 2, 3, 3),
                           {"pads": [2, 1, 1, 2], "strides": [2, 3], "dilations": [2, 1]}),
    "2d_grouped": ((1, 4, 6, 6), (8, 2, 3, 3), {"pads": [1, 0, 1, 0], "group": 2}),
    "1d": ((2, 3, 10), (4, 3, 3), {"pads": [2, 1]}),
    "3d": ((1, 2, 4, 5, 6), (3, 2, 2, 3, 3), {"pads": [1, 0, 1, 0, 2, 1]}),
}


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_padded_conv_becomes_pad_then_conv(case, bias):
    x_shape, w_shape, attrs = CASES[case]
    x = RNG.standard_normal(x_shape).astype(np.float32)
    graph, rewritten, changed = _rewrite_and_compare(_model(x_shape, w_shape, attrs, bias), x)
    assert changed == 1
    assert [n.op for n in rewritten.nodes] == ["Pad", "Conv", "Relu"]
    pad, conv = rewritten.nodes[:2]
    assert pad.inputs[0] == "x" and conv.inputs[0] == pad.outputs[0]
    assert conv.outputs == ["c"] and conv.inputs[1:] == graph.nodes[0].inputs[1:]
    assert "pads" not in conv.attrs
    assert conv.attrs == {k: v for k, v in graph.nodes[0].attrs.items() if k != "pads"}
    # Pad's pads cover every axis: none on batch and channels.
    spatial = len(x_shape) - 2
    pads = list(attrs["pads"])
    np.testing.assert_array_equal(rewritten.constants[pad.inputs[1]],
                                  [0, 0] + pads[:spatial] + [0, 0] + pads[spatial:])
    # The padded value's recorded type is what shape inference says it is.
    recorded = rewritten.types[pad.outputs[0]]
    infer_shapes(rewritten)
    assert recorded == rewritten.types[pad.outputs[0]]
    assert recorded.shape == tuple(
        d + (pads[i - 2] + pads[i - 2 + spatial] if i >= 2 else 0) for i, d in enumerate(x_shape))
    assert rewritten.types["c"] == graph.types["c"]


@pytest.mark.parametrize("size,strides,explicit", [
    (20, [1, 1], True),     # 400 output pixels, stride 1: the padded copy's whole rows pay
    (16, [1, 1], False),    # 256 pixels: the borders cost less than a copy
    (20, [2, 2], False),    # strided: likewise
    (9, [1, 2], False),
])
def test_a_depthwise_convolution_tests_its_own_borders_where_a_copy_costs_more(
        size, strides, explicit):
    x = RNG.standard_normal((1, 6, size, size)).astype(np.float32)
    _, rewritten, changed = _rewrite_and_compare(
        _model(x.shape, (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6, "strides": strides},
               bias=True), x)
    assert changed == int(explicit)
    assert [n.op for n in rewritten.nodes] == (["Pad", "Conv", "Relu"] if explicit else
                                               ["Conv", "Relu"])


def test_float64_conv_is_rewritten_too():
    x = RNG.standard_normal((1, 2, 5, 5))
    _, rewritten, changed = _rewrite_and_compare(
        _model((1, 2, 5, 5), (2, 2, 3, 3), {"pads": [1, 1, 1, 1]}, elem=F64), x)
    assert changed == 1
    assert rewritten.types[rewritten.nodes[0].outputs[0]] == TensorType(DType.FLOAT64,
                                                                         (1, 2, 7, 7))


@pytest.mark.parametrize("attrs", [
    {"auto_pad": "SAME_UPPER"},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"auto_pad": "VALID"},
    {"pads": [0, 0, 0, 0]},
    {},
], ids=["same_upper", "same_lower", "valid", "zero_pads", "no_pads"])
def test_auto_pad_and_unpadded_convs_are_untouched(attrs):
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    graph, rewritten, changed = _rewrite_and_compare(
        _model((1, 3, 8, 8), (4, 3, 3, 3), attrs), x)
    assert changed == 0
    assert [n.op for n in rewritten.nodes] == ["Conv", "Relu"]
    assert rewritten.nodes[0].attrs == graph.nodes[0].attrs
    assert set(rewritten.constants) == set(graph.constants)


def test_conv_of_unknown_input_shape_is_untouched():
    # With a symbolic batch the padded shape is not static: the pass waits for specialize.
    model = _model((2, 3, 6, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]},
                   x_dims=["N", 3, 6, 6])
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    _, rewritten, changed = _rewrite_and_compare(model, x)
    assert changed == 0 and [n.op for n in rewritten.nodes] == ["Conv", "Relu"]


def test_every_padded_conv_of_a_graph_is_rewritten():
    w1 = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["a", "W2"], ["b"], auto_pad="SAME_UPPER"),
         helper.make_node("Conv", ["b", "W3"], ["y"], pads=[2, 0, 0, 2])], "three",
        [helper.make_tensor_value_info("x", F32, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", F32, None)],
        initializer=[numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
                     numpy_helper.from_array(w2[:, :2], "W3")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    _, rewritten, changed = _rewrite_and_compare(model, x)
    assert changed == 2
    assert [n.op for n in rewritten.nodes] == ["Pad", "Conv", "Conv", "Pad", "Conv"]
    # fresh names: the two Pads and their pads constants do not collide
    assert len({n.outputs[0] for n in rewritten.nodes}) == 5
    assert len(rewritten.constants) == 7  # 3 weights, 2 x (pads, pad value)


def _pool_model(attrs, outputs=("y",)):
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], list(outputs), name="pool", **attrs)], "pool",
        [helper.make_tensor_value_info("x", F32, [2, 3, 9, 8])],
        [helper.make_tensor_value_info(o, F32 if o == "y" else TensorProto.INT64, None)
         for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=10)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "pads": [2, 0, 0, 1], "dilations": [1, 2]},
])
def test_max_pool_padding_becomes_a_pad_with_nan(attrs):
    # A MaxPool ignores NaN, so NaN padding never wins and leaves an all-NaN border window
    # NaN (-inf padding made it -inf).  (Random values only: ONNX Runtime's pools differ
    # from the reference on NaN and all -inf windows; tests/ops/test_maxpool_nan.py covers
    # NaN inputs against a numpy oracle.)
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    _, rewritten, changed = _rewrite_and_compare(_pool_model(attrs), x)
    assert changed == 1 and [n.op for n in rewritten.nodes] == ["Pad", "MaxPool"]
    value = rewritten.constants[rewritten.nodes[0].inputs[2]]
    assert value.dtype == np.float32 and np.isnan(value)


@pytest.mark.parametrize("attrs,outputs", [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
     ("y",)),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, ("y", "i")),
])
def test_max_pools_that_could_tell_are_untouched(attrs, outputs):
    rewritten = import_onnx(_pool_model(attrs, outputs))
    assert make_padding_explicit(rewritten) == 0
    assert [n.op for n in rewritten.nodes] == ["MaxPool"]
