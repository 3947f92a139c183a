"""Small ONNX models for the tests of the call path (``__call__``, ``run``, ``out=``), and
the two forms a user calls a model in: the compiled Module and its loaded artifact."""

from __future__ import annotations

from onnx import TensorProto, helper

import ember
import ember.runtime

F32 = TensorProto.FLOAT


def onnx_model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def value_info(name, shape, dtype=F32):
    return helper.make_tensor_value_info(name, dtype, shape)


ADD = onnx_model([helper.make_node("Add", ["x", "y"], ["z"])],
                 [value_info("x", [2, 3]), value_info("y", [2, 3])], [value_info("z", [2, 3])])
# two outputs: the sum and the difference
SUM_DIFF = onnx_model([helper.make_node("Add", ["x", "y"], ["s"]),
                       helper.make_node("Sub", ["x", "y"], ["d"])],
                      [value_info("x", [2, 3]), value_info("y", [2, 3])],
                      [value_info("s", [2, 3]), value_info("d", [2, 3])])


def module_and_artifact(model, tmp_path_factory):
    """The model as a Module (compiled) and as its saved artifact loaded by the runtime."""
    module = ember.compile(model)
    loaded = ember.runtime.load(module.save(tmp_path_factory.mktemp("call") / "m.ember"))
    return module, loaded
