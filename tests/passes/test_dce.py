"""Dead-code elimination (ember/passes/dce.py): dead nodes and unused constants go, results stay
the same (reference executor before the pass is the oracle), and values that If/Loop bodies
read from the enclosing graph are live."""

from __future__ import annotations

import copy

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.passes.dce import eliminate_dead_code

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _graph(nodes, inputs, outputs, initializers=None, opset=17):
    inits = [numpy_helper.from_array(np.asarray(a), name)
             for name, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "dce", inputs, outputs, initializer=inits)
    return import_onnx(helper.make_model(graph,
                                         opset_imports=[helper.make_opsetid("", opset)]))


def _vi(name, elem=F32, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _eliminate_and_compare(graph, feeds):
    expected = ReferenceExecutor(graph).run(feeds)
    pruned = copy.deepcopy(graph)
    removed = eliminate_dead_code(pruned)
    actual = ReferenceExecutor(pruned).run(feeds)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
    return pruned, removed


def _names(graph):
    return [node.name for node in graph.nodes]


def test_dead_nodes_and_unused_constants_are_removed():
    graph = _graph(
        [helper.make_node("Add", ["x", "w"], ["a"], name="live_add"),
         helper.make_node("Mul", ["x", "dead_w"], ["m"], name="dead_mul"),
         helper.make_node("Relu", ["m"], ["r"], name="dead_relu"),
         helper.make_node("Abs", ["a"], ["y"], name="live_abs"),
         helper.make_node("Neg", ["y"], ["unused"], name="dead_neg")],
        [_vi("x", F32, [3])], [_vi("y")],
        {"w": np.ones(3, np.float32), "dead_w": np.full(3, 2, np.float32),
         "never_read": np.zeros(5, np.int64)})
    x = np.array([-3, 0, 2], np.float32)
    pruned, removed = _eliminate_and_compare(graph, {"x": x})
    assert removed == 3
    assert _names(pruned) == ["live_add", "live_abs"]
    assert set(pruned.constants) == {"w"}
    assert pruned.inputs == ["x"]  # graph inputs are the signature: never removed


def test_nothing_to_remove_returns_zero_and_keeps_order():
    graph = _graph([helper.make_node("Relu", ["x"], ["a"], name="n0"),
                    helper.make_node("Neg", ["a"], ["y"], name="n1")],
                   [_vi("x", F32, [2])], [_vi("y")])
    pruned, removed = _eliminate_and_compare(graph, {"x": np.ones(2, np.float32)})
    assert removed == 0 and _names(pruned) == ["n0", "n1"]
    assert eliminate_dead_code(pruned) == 0  # idempotent


def test_a_node_with_one_live_output_stays_whole():
    graph = _graph([helper.make_node("Split", ["x"], ["p", "q"], axis=0, num_outputs=2,
                                     name="split"),
                    helper.make_node("Neg", ["q"], ["y"], name="neg")],
                   [_vi("x", F32, [4])], [_vi("y")], opset=18)
    pruned, removed = _eliminate_and_compare(graph, {"x": np.arange(4, dtype=np.float32)})
    assert removed == 0 and _names(pruned) == ["split", "neg"]


def test_outputs_that_are_constants_or_inputs_are_kept():
    graph = _graph([helper.make_node("Neg", ["x"], ["dead"], name="dead")],
                   [_vi("x", F32, [2])], [_vi("x"), _vi("c", I64)],
                   {"c": np.arange(3, dtype=np.int64), "other": np.zeros(1, np.float32)})
    pruned, removed = _eliminate_and_compare(graph, {"x": np.ones(2, np.float32)})
    assert removed == 1 and pruned.nodes == []
    assert set(pruned.constants) == {"c"}


def _if_node(cond, then_nodes, then_out, else_nodes, else_out, output, name="if"):
    then_branch = helper.make_graph(then_nodes, "then", [], [_vi(then_out)])
    else_branch = helper.make_graph(else_nodes, "else", [], [_vi(else_out)])
    return helper.make_node("If", [cond], [output], then_branch=then_branch,
                            else_branch=else_branch, name=name)


def test_values_read_only_inside_if_branches_are_kept():
    graph = _graph(
        [helper.make_node("Mul", ["x", "scale"], ["scaled"], name="outer_mul"),
         helper.make_node("Neg", ["x"], ["negated"], name="outer_neg"),
         helper.make_node("Abs", ["x"], ["dead"], name="dead_abs"),
         _if_node("cond",
                  [helper.make_node("Add", ["scaled", "offset"], ["t"])], "t",
                  [helper.make_node("Sub", ["negated", "offset"], ["e"])], "e", "y")],
        [_vi("x", F32, [3]), _vi("cond", BOOL, [])], [_vi("y")],
        {"scale": np.full(3, 3, np.float32), "offset": np.float32(0.5),
         "unused": np.ones(2, np.float32)})
    x = np.array([1, -2, 3], np.float32)
    for cond in (True, False):
        pruned, removed = _eliminate_and_compare(graph, {"x": x, "cond": np.array(cond)})
        assert removed == 1
        assert _names(pruned) == ["outer_mul", "outer_neg", "if"]
        # "offset" is read only by the branches, "scale" by a node the branch needs.
        assert set(pruned.constants) == {"scale", "offset"}


def test_a_dead_if_goes_with_everything_only_it_read():
    graph = _graph(
        [helper.make_node("Neg", ["x"], ["negated"], name="only_for_if"),
         _if_node("cond", [helper.make_node("Add", ["negated", "k"], ["t"])], "t",
                  [helper.make_node("Identity", ["negated"], ["e"])], "e", "unused_if"),
         helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [_vi("x", F32, [3]), _vi("cond", BOOL, [])], [_vi("y")], {"k": np.float32(1)})
    pruned, removed = _eliminate_and_compare(
        graph, {"x": np.ones(3, np.float32), "cond": np.array(True)})
    assert removed == 2 and _names(pruned) == ["relu"]
    assert pruned.constants == {}


def _loop_body(nodes, carried_out, scan_out=None):
    outputs = [_vi("cond_out", BOOL, []), _vi(carried_out)]
    if scan_out:
        outputs.append(_vi(scan_out))
    return helper.make_graph(nodes, "body",
                             [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("acc_in")],
                             outputs)


def test_values_read_inside_a_loop_body_and_nested_subgraphs_are_kept():
    # body: acc = acc + step (outer node output) ; an If nested in the body reads "bias"
    nested_if = _if_node("cond_in",
                         [helper.make_node("Mul", ["acc_next", "bias"], ["t"])], "t",
                         [helper.make_node("Identity", ["acc_next"], ["e"])], "e", "scan",
                         name="nested_if")
    body = _loop_body([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                       helper.make_node("Add", ["acc_in", "step"], ["acc_next"]),
                       nested_if], "acc_next", "scan")
    graph = _graph(
        [helper.make_node("Abs", ["x"], ["step"], name="make_step"),
         helper.make_node("Neg", ["x"], ["dead"], name="dead_neg"),
         helper.make_node("Loop", ["trips", "", "x"], ["final", "stacked"], body=body,
                          name="loop")],
        [_vi("x", F32, [2])], [_vi("final"), _vi("stacked")],
        {"trips": np.array(3, np.int64), "bias": np.float32(2),
         "unused": np.zeros(4, np.float32)})
    x = np.array([1, -1], np.float32)
    pruned, removed = _eliminate_and_compare(graph, {"x": x})
    assert removed == 1 and _names(pruned) == ["make_step", "loop"]
    assert set(pruned.constants) == {"trips", "bias"}
    np.testing.assert_array_equal(ReferenceExecutor(pruned).run({"x": x})["final"],
                                  x + 3 * np.abs(x))
