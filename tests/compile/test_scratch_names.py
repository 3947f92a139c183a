"""Values may be named anything, a leading '#' included: the memory planner's keys for
kernels' scratch buffers must not collide with them (they did: an internal error)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember


@pytest.mark.parametrize("names", [
    ["#0", "#1", "#2", "#3"],                                   # a leading '#'
    ["#0.scratch0", "#1.scratch0", "#2.scratch0", "#3.scratch0"],  # the old scratch keys
])
def test_values_named_like_scratch_buffers(names):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 96)).astype(np.float32)
    w2 = rng.standard_normal((96, 80)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], [names[0]]),
             helper.make_node("Relu", [names[0]], [names[1]]),
             helper.make_node("MatMul", [names[1], "w2"], [names[2]]),
             helper.make_node("ReduceSum", [names[2]], [names[3]], keepdims=1, axes=None),
             helper.make_node("Softmax", [names[2]], ["y"], axis=-1),
             helper.make_node("Add", ["y", names[3]], ["z"])]
    graph = helper.make_graph(nodes, "hash",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [48, 64])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [48, 80])],
                              initializer=[numpy_helper.from_array(w1, "w1"),
                                           numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.standard_normal((48, 64)).astype(np.float32)
    h = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    expected = e / e.sum(axis=-1, keepdims=True) + h.sum(keepdims=True)
    np.testing.assert_allclose(ember.compile(model)(x), expected, rtol=1e-4, atol=1e-2)
