"""Composites as exporters write them in ONNX files of older opsets (axes as attributes,
Constant nodes, 1-element initializers): imported, optimized at O2, they become single ops and
compute what the file computes (ember's reference on the O0 graph, and ONNX Runtime)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.passes.pipeline import optimize
from ember.passes.specialize import specialize

F32 = TensorProto.FLOAT


def _const(name: str, value) -> object:
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(value, np.float32)))


def _model(nodes, shape, opset, initializers=()):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", F32, shape)],
                              [helper.make_tensor_value_info("y", F32, shape)],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _layer_norm_opset13():
    rng = np.random.default_rng(0)
    return _model([
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        _const("two", 2.0),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        _const("eps", [1e-5]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["y"]),
    ], [2, 6, 16], 13, [
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "beta")])


def _softmax_opset11():
    return _model([
        helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["s"]),
        helper.make_node("Exp", ["s"], ["e"]),
        helper.make_node("ReduceSum", ["e"], ["t"], axes=[1], keepdims=1),
        helper.make_node("Div", ["e", "t"], ["y"]),
    ], [3, 10], 11)


def _hard_swish_opset13():
    return _model([
        helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["x", "h"], ["y"]),
    ], [2, 8, 4, 4], 13)


def _silu_opset13():
    return _model([
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ], [2, 32], 13)


def _gelu_tanh_opset13():
    return _model([
        _const("three", 3.0), _const("c", 0.044715), _const("k", 0.7978846),
        _const("one", 1.0), _const("half", 0.5),
        helper.make_node("Pow", ["x", "three"], ["cube"]),
        helper.make_node("Mul", ["cube", "c"], ["t"]),
        helper.make_node("Add", ["x", "t"], ["i"]),
        helper.make_node("Mul", ["i", "k"], ["j"]),
        helper.make_node("Tanh", ["j"], ["th"]),
        helper.make_node("Add", ["th", "one"], ["p"]),
        helper.make_node("Mul", ["half", "x"], ["h"]),
        helper.make_node("Mul", ["h", "p"], ["y"]),
    ], [4, 8], 13)


@pytest.mark.parametrize("build, op", [
    (_layer_norm_opset13, "LayerNormalization"),
    (_softmax_opset11, "Softmax"),
    (_hard_swish_opset13, "HardSwish"),
    (_silu_opset13, "Swish"),
    (_gelu_tanh_opset13, "Gelu"),
], ids=["layer_norm", "softmax", "hard_swish", "silu", "gelu_tanh"])
def test_exported_composites_become_one_op_at_o2(build, op):
    import onnxruntime as ort

    model = build()
    graph = specialize(import_onnx(model), {})
    x = np.random.default_rng(1).standard_normal(
        tuple(int(d) for d in graph.types["x"].shape)).astype(np.float32)
    expected = ReferenceExecutor(graph).run({"x": x})["y"]
    optimized = optimize(copy.deepcopy(graph), 2)
    assert [n.op for n in optimized.nodes] == [op]
    actual = ReferenceExecutor(optimized).run({"x": x})["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(actual, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
