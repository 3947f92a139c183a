"""SplitToSequence read back by SequenceAt at constant positions (how the dynamo exporter
writes torch.split without its optimizer) imports as tensor ops, so it compiles; other uses of
sequences are left as they are.  Oracle: onnx's ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import SequenceType

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.asarray(v), k)
                                           for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _read_back(name: str, split: str | None, positions: list[int], **attrs):
    """A SplitToSequence of x and one SequenceAt per position (outputs name_0, name_1 ...)."""
    inputs = ["x"] + ([split] if split else [])
    nodes = [helper.make_node("SplitToSequence", inputs, [f"{name}_seq"], name=name, **attrs)]
    initializers = []
    for k, position in enumerate(positions):
        initializers.append((f"{name}_pos{k}", np.array(position, np.int64)))
        nodes.append(helper.make_node("SequenceAt", [f"{name}_seq", f"{name}_pos{k}"],
                                      [f"{name}_{k}"], name=f"{name}_at{k}"))
    return nodes, initializers, [f"{name}_{k}" for k in range(len(positions))]


def test_split_read_back_at_constant_positions_becomes_split():
    x = np.random.default_rng(0).standard_normal((2, 7, 3)).astype(np.float32)
    nodes, initializers, outputs = [], [("sizes", np.array([2, 4, 1], np.int64)),
                                        ("three", np.array(3, np.int64))], []
    for name, split, positions, attrs in [
            ("sizes", "sizes", [0, 2, -2], {"axis": 1}),  # like torch.split([2, 4, 1])
            ("chunks", "three", [2, 0, 0], {"axis": 1}),  # 3 + 3 + 1, a piece read twice
            ("units", None, [1, -1], {"axis": -1, "keepdims": 0}),  # each piece squeezed
            ("kept", None, [0], {"axis": 0})]:
        more_nodes, more_initializers, names = _read_back(name, split, positions, **attrs)
        nodes += more_nodes
        initializers += more_initializers
        outputs += names
    # A split of a piece of another split (torch.chunk of v after q, k, v = x.split(...)):
    # rewritten once the piece has its type.
    nested, more_initializers, names = _read_back("nested", "three", [1, 0], axis=1)
    nodes += [helper.make_node("Identity", ["sizes_2"], ["x_of_nested"])] + [
        helper.make_node(n.op_type, ["x_of_nested" if i == "x" else i for i in n.input],
                         n.output, name=n.name, **{a.name: helper.get_attribute_value(a)
                                                   for a in n.attribute}) for n in nested]
    initializers += more_initializers
    outputs += names
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [2, 7, 3])],
                   [helper.make_tensor_value_info(o, F32, None) for o in outputs], initializers)
    expected = ReferenceEvaluator(model).run(None, {"x": x})

    graph = import_onnx(model)
    assert {node.op for node in graph.nodes} == {"Split", "Squeeze", "Identity"}
    assert not any(isinstance(t, SequenceType) for t in graph.types.values())
    got = ReferenceExecutor(graph).run({"x": x})
    module = ember.compile(graph)
    assert module.build.host_nodes == [], module.report()
    compiled = module.run({"x": x})
    for name, want in zip(outputs, expected):
        np.testing.assert_array_equal(got[name], want, err_msg=name)
        np.testing.assert_array_equal(compiled[name], want, err_msg=name)


@pytest.mark.parametrize("variant", ["sequence_output", "other_reader", "run_time_position",
                                     "dynamic_axis"])
def test_other_sequences_are_left_alone(variant):
    """Only a split whose every use is a SequenceAt at a constant position, with a piece
    count known at import, is rewritten; the rest still runs (on the reference)."""
    x_shape = ["N", 3] if variant == "dynamic_axis" else [4, 3]
    nodes = [helper.make_node("SplitToSequence", ["x", "two"], ["seq"], axis=0)]
    inputs = [helper.make_tensor_value_info("x", F32, x_shape)]
    initializers = [("two", np.array(2, np.int64)), ("zero", np.array(0, np.int64))]
    outputs = [helper.make_tensor_value_info("first", F32, None)]
    position = "zero"
    if variant == "run_time_position":
        inputs.append(helper.make_tensor_value_info("at", I64, []))
        position = "at"
    nodes.append(helper.make_node("SequenceAt", ["seq", position], ["first"]))
    if variant == "sequence_output":
        outputs.append(helper.make_tensor_sequence_value_info("seq", F32, None))
    if variant == "other_reader":
        nodes.append(helper.make_node("SequenceLength", ["seq"], ["count"]))
        outputs.append(helper.make_tensor_value_info("count", I64, []))
    graph = import_onnx(_model(nodes, inputs, outputs, initializers))
    assert [node.op for node in graph.nodes][:2] == ["SplitToSequence", "SequenceAt"]
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
    if variant == "run_time_position":
        feeds["at"] = np.array(1, np.int64)
    want = feeds["x"][2:] if variant == "run_time_position" else feeds["x"][:2]
    np.testing.assert_array_equal(ReferenceExecutor(graph).run(feeds)["first"], want)
