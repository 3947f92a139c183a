"""The IR verifier: scoping, single definition, outputs, ops/arity/attributes, types, subgraphs."""

from __future__ import annotations

import numpy as np
import pytest

from ember.core.dtypes import DType
from ember.core.errors import VerificationError
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, tensor
from ember.ir.verifier import verify
from ember.ops.registry import REQUIRED, Attr, OpDef, get_op
from ember.passes.infer_shapes import infer_shapes

F32 = DType.FLOAT32

# An op with a body graph, so that subgraph scoping is tested whatever control-flow ops exist.
BODY_OP = OpDef(name="test.WithBody", family="test", reference=lambda ctx, x, *, body: x,
                infer=lambda ctx: [ctx.inputs[0]], attrs={"body": Attr.graph(REQUIRED)},
                min_inputs=1, max_inputs=1)


def ops(name: str):
    return BODY_OP if name == BODY_OP.name else get_op(name)


def _graph(nodes: list[Node], outputs: list[str], constants: dict | None = None) -> Graph:
    graph = Graph(name="main", inputs=["x"], outputs=outputs, nodes=nodes,
                  types={"x": tensor(F32, "N", 3)})
    for name, array in (constants or {}).items():
        graph.constants[name] = array
        graph.types[name] = TensorType(DType.from_numpy(array.dtype), array.shape)
    return graph


def _problems(graph: Graph, **kwargs) -> list[str]:
    with pytest.raises(VerificationError) as info:
        verify(graph, ops, **kwargs)
    return info.value.problems


def test_valid_graph_passes_with_and_without_types():
    graph = _graph([Node("Add", ["x", "w"], ["y"], name="add"),
                    Node("Abs", ["y"], ["z"], name="abs")], ["z"],
                   constants={"w": np.ones(3, np.float32)})
    verify(graph, ops)
    with pytest.raises(VerificationError, match="value 'y' .*has no type"):
        verify(graph, ops, require_types=True)
    infer_shapes(graph)
    verify(graph, ops, require_types=True)


def test_use_before_definition_names_node_value_and_producer():
    graph = _graph([Node("Abs", ["y"], ["z"], name="abs"),
                    Node("Neg", ["x"], ["y"], name="neg")], ["z"])
    [problem] = _problems(graph)
    assert "graph 'main'" in problem and "node 'abs' (Abs)" in problem
    assert "input 'y' is used before it is defined (by node 'neg' (Neg))" in problem


def test_undefined_input_and_output():
    graph = _graph([Node("Abs", ["ghost"], ["z"], name="abs")], ["z", "nowhere"])
    problems = _problems(graph)
    assert len(problems) == 2
    assert "node 'abs' (Abs): input 'ghost' is not defined" in problems[0]
    assert "graph output 'nowhere' is not defined" in problems[1]


def test_missing_optional_input_is_allowed():
    graph = _graph([Node("Abs", ["x"], ["y", ""], name="abs")], ["y"])
    verify(graph)  # structure only: "" outputs and inputs are absent optionals


def test_values_defined_twice():
    graph = _graph([Node("Abs", ["x"], ["y"], name="first"),
                    Node("Neg", ["x"], ["y"], name="second"),
                    Node("Neg", ["x"], ["w"], name="third")], ["y"],
                   constants={"w": np.ones(3, np.float32)})
    problems = _problems(graph)
    assert any("value 'y' is defined twice: by node 'first' (Abs) and by node 'second' (Neg)"
               in p for p in problems)
    assert any("value 'w' is defined twice: by a constant and by node 'third'" in p
               for p in problems)


def test_unknown_op_and_bad_arity_and_attributes():
    graph = _graph([Node("NoSuchOp", ["x"], ["a"], name="mystery", domain="com.example"),
                    Node("Add", ["x"], ["b"], name="lonely_add"),
                    Node("Abs", ["x"], ["c"], name="abs", attrs={"alpha": 1.0})], ["a"])
    problems = _problems(graph)
    assert len(problems) == 3
    assert "node 'mystery' (NoSuchOp): op 'NoSuchOp' from domain 'com.example' is not " \
           "registered" in problems[0]
    assert "node 'lonely_add' (Add) has 1 inputs; Add takes 2" in problems[1]
    assert "unknown attribute(s) ['alpha']" in problems[2]
    verify(graph)  # without the registry only the structure is checked


def test_required_attribute_and_attribute_kind():
    body = Graph(name="body", inputs=["b_in"], outputs=["b_in"],
                 types={"b_in": tensor(F32, 3)})
    missing = _graph([Node(BODY_OP.name, ["x"], ["y"], name="loop")], ["y"])
    assert "required attribute 'body' is missing" in _problems(missing)[0]
    wrong = _graph([Node(BODY_OP.name, ["x"], ["y"], name="loop", attrs={"body": [body]})],
                   ["y"])
    assert "node 'loop' (test.WithBody): attribute 'body' must be of kind graph, got list" \
        in _problems(wrong)[0]


def test_subgraph_sees_outer_values_defined_before_its_node():
    body = Graph(name="body", inputs=["b_in"], outputs=["b_out"],
                 nodes=[Node("Add", ["b_in", "y"], ["b_out"], name="body_add")])
    graph = _graph([Node("Abs", ["x"], ["y"], name="abs"),
                    Node(BODY_OP.name, ["x"], ["z"], name="loop", attrs={"body": body})], ["z"])
    verify(graph, ops)


def test_subgraph_errors_name_the_path_to_the_body():
    body = Graph(name="body", inputs=["b_in"], outputs=["b_out"],
                 nodes=[Node("Add", ["b_in", "later"], ["b_out"], name="body_add"),
                        Node("Abs", ["b_in"], ["x"], name="shadowing")])
    graph = _graph([Node(BODY_OP.name, ["x"], ["z"], name="loop", attrs={"body": body}),
                    Node("Abs", ["z"], ["later"], name="after")], ["later"])
    problems = _problems(graph)
    assert len(problems) == 2
    where = "graph 'main', node 'loop' (test.WithBody) attribute 'body' (graph 'body')"
    assert problems[0].startswith(where + ": node 'body_add' (Add): input 'later' is not defined")
    assert problems[1].startswith(where + ": value 'x' (node 'shadowing' (Abs)) shadows a value "
                                          "of an enclosing graph (a graph input)")


def test_constant_type_must_match_its_array():
    graph = _graph([Node("Add", ["x", "w"], ["y"], name="add")], ["y"],
                   constants={"w": np.ones(3, np.float32)})
    graph.types["w"] = tensor(F32, 4)
    assert "constant 'w' has type f32[4] but its array is f32[3]" in _problems(graph)[0]


def test_malformed_types_are_reported():
    graph = _graph([Node("Abs", ["x"], ["y"], name="abs")], ["y"])
    graph.types["y"] = TensorType(F32, (-1, 3))
    assert "value 'y' has a malformed type: dimension -1" in _problems(graph)[0]


def test_message_lists_every_problem():
    graph = _graph([Node("Abs", [f"missing_{i}"], [f"y{i}"], name=f"abs{i}") for i in range(3)],
                   ["y0"])
    with pytest.raises(VerificationError) as info:
        verify(graph, ops)
    message = str(info.value)
    assert message.startswith("IR verification failed with 3 problems:")
    assert all(f"missing_{i}" in message for i in range(3))


def test_graph_without_outputs_is_invalid():
    graph = _graph([Node("Abs", ["x"], ["y"], name="abs")], [])
    assert "graph 'main': the graph has no outputs" in _problems(graph)[0]


def test_float_for_an_ints_attribute_is_reported_with_other_attribute_problems():
    graph = _graph([Node("Transpose", ["x"], ["y"], name="t", attrs={"perm": [1.0, 0.0],
                                                                     "colour": 1})], ["y"])
    [problem] = _problems(graph)
    assert "node 't' (Transpose): unknown attribute(s) ['colour']" in problem
    assert "attribute 'perm' must be of kind ints, got list [1.0, 0.0]" in problem


def test_stage_and_prior_problems_are_part_of_the_error():
    graph = _graph([Node("Abs", ["ghost"], ["y"], name="abs")], ["y"])
    with pytest.raises(VerificationError) as info:
        verify(graph, ops, stage="after graph pass 'p'", prior_problems=["found earlier"])
    assert str(info.value).startswith("IR verification failed after graph pass 'p' with 2 "
                                      "problems:")
    assert info.value.problems[0] == "found earlier"
    assert "input 'ghost' is not defined" in info.value.problems[1]
