"""The pass pipeline verifies the graph after every pass: a pass that breaks an invariant is
named in the error instead of surfacing later as a crash or a wrong result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ember.core.errors import VerificationError
from ember.frontend.onnx import import_onnx
from ember.ir.graph import Graph
from ember.passes import pipeline
from ember.passes.context import graph_pass
from ember.passes.specialize import specialize


def _graph() -> Graph:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Neg", ["a"], ["y"], name="neg")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    return specialize(import_onnx(model), {})


def drop_first_node(graph: Graph) -> int:
    """A broken pass: removes a node whose output is still read."""
    graph.nodes.pop(0)
    return 1


def retype_a_constant(graph: Graph) -> int:
    """A broken pass that reports no change but leaves a constant whose array is not its type."""
    graph.constants["a"] = np.zeros(4, np.float64)
    return 0


@pytest.mark.parametrize("broken, fragment", [
    (drop_first_node, "node 'neg' (Neg): input 'a' is not defined"),
    (retype_a_constant, "value 'a' is defined twice: by a constant and by node 'relu'"),
])
def test_a_pass_that_breaks_the_graph_is_named(monkeypatch, broken, fragment):
    monkeypatch.setitem(pipeline.PIPELINES, 1,
                        pipeline.Pipeline("broken", (graph_pass(broken),)))
    with pytest.raises(VerificationError) as info:
        pipeline.optimize(_graph(), 1)
    message = str(info.value)
    assert f"after graph pass '{broken.__name__}'" in message
    assert fragment in message


def test_correct_passes_verify_cleanly():
    graph = _graph()
    log: list[str] = []
    pipeline.optimize(graph, 2, log)
    assert [entry.split(":")[0] for entry in log] == [p.name for p in pipeline.passes_for(2)]
