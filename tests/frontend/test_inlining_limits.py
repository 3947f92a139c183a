"""Local functions and nested subgraphs of a model file cannot make the importer work without
end, and inlining keeps the semantics of ONNX.

A 2 KB file of functions that each call the next twice expands to 2**30 nodes; a chain of a
thousand functions, each calling the next, used to exhaust Python's stack; subgraphs nested a
thousand deep did too.  Each is refused with a ModelLoadError that names the function or graph,
the bound and how to raise it, or (a legitimate deep chain) imported.  Results are compared
with onnx's own reference: ``ReferenceEvaluator`` on the model, or on the model as onnx's
inliner (``onnx.inliner.inline_local_functions``) expands it where the evaluator itself does not
handle a construct (attribute references, left-out inputs).
"""

from __future__ import annotations

import time

import numpy as np
import onnx.inliner
import pytest
from onnx import AttributeProto, TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.core.config import DEFAULT_MAX_INLINED_NODES, MAX_INLINED_NODES_ENV
from ember.core.errors import ConfigError, EmberError, ModelLoadError
from ember.frontend.onnx import import_onnx
from ember.frontend.onnx.importer import MAX_SUBGRAPH_DEPTH, MAX_TYPE_DEPTH, _Importer
from ember.interp import ReferenceExecutor

F32, BOOL = TensorProto.FLOAT, TensorProto.BOOL
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
X = np.array([1.5, -2.0], np.float32)


@pytest.fixture(autouse=True)
def _default_bound(monkeypatch):
    """Every test starts from the default bound, whatever the environment says."""
    monkeypatch.delenv(MAX_INLINED_NODES_ENV, raising=False)


def _vi(name: str, elem: int = F32, shape=(2,)):
    return helper.make_tensor_value_info(name, elem, shape)


def _ref(name: str, kind: int, refers_to: str) -> AttributeProto:
    """An attribute of a function body's node that takes the function's ``refers_to``."""
    attr = AttributeProto()
    attr.name, attr.type, attr.ref_attr_name = name, kind, refers_to
    return attr


def _function(name: str, inputs, outputs, nodes, attributes=()):
    return helper.make_function("local", name, list(inputs), list(outputs), nodes, OPSETS,
                                attributes=list(attributes))


def _call(function: str, inputs, outputs, name: str = "", **attrs):
    return helper.make_node(function, list(inputs), list(outputs), name=name or None,
                            domain="local", **attrs)


def _model(nodes, inputs, outputs, functions):
    """A model of ``nodes``; ``functions`` listed callees first, as ReferenceEvaluator needs."""
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, functions=list(functions), opset_imports=OPSETS)


def _oracle(model, feeds, inline: bool = False) -> list[np.ndarray]:
    if inline:
        model = onnx.inliner.inline_local_functions(model)
    return ReferenceEvaluator(model).run(None, feeds)


def _ember(model, feeds, **kwargs) -> list[np.ndarray]:
    graph = import_onnx(model, **kwargs)
    result = ReferenceExecutor(graph).run(feeds)
    return [result[name] for name in graph.outputs]


def _doubling_model(levels: int):
    """F0 calls F1 twice, F1 calls F2 twice, ...; the last is a Relu: 2**(levels-1) nodes."""
    last = _function(f"F{levels - 1}", ["i"], ["o"], [helper.make_node("Relu", ["i"], ["o"])])
    functions = [last]
    for k in range(levels - 2, -1, -1):
        functions.append(_function(f"F{k}", ["i"], ["o"], [_call(f"F{k + 1}", ["i"], ["t"]),
                                                           _call(f"F{k + 1}", ["t"], ["o"])]))
    return _model([_call("F0", ["x"], ["y"], name="top")], [_vi("x")], [_vi("y")], functions)


# ----------------------------------------------------------------------------- expansion size


def test_an_exponential_expansion_is_refused_before_any_of_it_is_made(deadline):
    data = _doubling_model(31).SerializeToString()
    assert len(data) < 2600  # a 2 KB file ...
    with deadline(20):
        start = time.perf_counter()
        with pytest.raises(ModelLoadError) as error:
            import_onnx(data)
        elapsed = time.perf_counter() - start
    message = str(error.value)
    for fragment in ("model-local function 'local.F0'", "node 'top'", "1,073,741,824 nodes",
                     f"{DEFAULT_MAX_INLINED_NODES:,}", MAX_INLINED_NODES_ENV, "max_inlined_nodes"):
        assert fragment in message, message
    assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s: the expansion was made"


def test_the_count_is_exact_so_a_model_at_the_bound_imports():
    model = _doubling_model(8)  # 128 Relu nodes
    graph = import_onnx(model, max_inlined_nodes=128)
    assert len(graph.nodes) == 128
    np.testing.assert_array_equal(ReferenceExecutor(graph).run({"x": X})["y"],
                                  _oracle(model, {"x": X})[0])
    with pytest.raises(ModelLoadError, match=r"expands to 128 nodes: more than the 127 .*"
                                             r"\(N >= 128\)"):
        import_onnx(model, max_inlined_nodes=127)


def test_the_bound_comes_from_the_environment_and_the_argument_wins(monkeypatch):
    model = _doubling_model(8)
    monkeypatch.setenv(MAX_INLINED_NODES_ENV, "100")
    with pytest.raises(ModelLoadError, match="more than the 100 that ember inlines"):
        import_onnx(model)
    assert len(import_onnx(model, max_inlined_nodes=1000).nodes) == 128
    monkeypatch.setenv(MAX_INLINED_NODES_ENV, "lots")
    with pytest.raises(ConfigError, match=MAX_INLINED_NODES_ENV):
        import_onnx(model)


def test_all_calls_of_a_model_share_one_bound():
    functions = _doubling_model(7).functions  # F0 expands to 64 nodes
    nodes = [_call("F0", ["x"], ["a"], name="first"), _call("F0", ["a"], ["b"], name="second"),
             _call("F0", ["b"], ["y"], name="third")]
    model = _model(nodes, [_vi("x")], [_vi("y")], functions)
    assert len(import_onnx(model, max_inlined_nodes=192).nodes) == 192
    with pytest.raises(ModelLoadError, match=r"node 'third' of graph 'g', expands to 64 nodes "
                                             r"\(and 128 were inlined before it\)"):
        import_onnx(model, max_inlined_nodes=150)


def _higher_order_model(levels: int):
    """``Apply`` runs the graph given as its attribute ``body`` in both branches of an If;
    F_k passes Apply a body calling F_(k-1): each level doubles the nodes through attribute
    references, and Apply is expanded inside a graph given to Apply (which is not recursion)."""
    if_node = helper.make_node("If", ["c"], ["o"])
    if_node.attribute.extend([_ref("then_branch", AttributeProto.GRAPH, "body"),
                              _ref("else_branch", AttributeProto.GRAPH, "body")])
    functions = [_function("Apply", ["i", "c"], ["o"], [if_node], attributes=["body"]),
                 _function("F0", ["i", "c"], ["o"], [helper.make_node("Neg", ["i"], ["o"])])]
    for k in range(1, levels):
        body = helper.make_graph([_call(f"F{k - 1}", ["i", "c"], ["r"])], f"body{k}", [],
                                 [_vi("r")])
        functions.append(_function(f"F{k}", ["i", "c"], ["o"],
                                   [_call("Apply", ["i", "c"], ["o"], body=body)]))
    return _model([_call(f"F{levels - 1}", ["x", "c"], ["y"], name="top")],
                  [_vi("x"), _vi("c", BOOL, ())], [_vi("y")], functions)


def test_graphs_passed_as_attributes_count_once_per_copy(deadline):
    model = _higher_order_model(5)  # 15 If nodes and 16 Neg nodes, in nested branches
    graph = import_onnx(model, max_inlined_nodes=31)
    assert sum(1 for _ in graph.walk()) == 31
    feeds = {"x": X, "c": np.array(True)}
    np.testing.assert_array_equal(ReferenceExecutor(graph).run(feeds)["y"],
                                  _oracle(model, feeds, inline=True)[0])
    with pytest.raises(ModelLoadError, match="expands to 31 nodes"):
        import_onnx(model, max_inlined_nodes=30)
    with deadline(20), pytest.raises(ModelLoadError, match="expands to 1,099,511,627,775 nodes"):
        import_onnx(_higher_order_model(40))  # 2**40 - 1


def test_the_bound_holds_even_if_the_count_were_wrong(monkeypatch, deadline):
    """Every node an expansion makes is counted too, so an undercount (a bug) cannot lift the
    bound: here the count is made to say 0."""
    monkeypatch.setattr(_Importer, "_expanded_size", lambda self, nodes, uses: 0)
    with deadline(20), pytest.raises(ModelLoadError, match=r"model-local function 'local.F0', "
                                                           r"called by node 'top' .* makes "
                                                           r"more than 100 nodes"):
        import_onnx(_doubling_model(20), max_inlined_nodes=100)


# ----------------------------------------------------------------------------- deep nesting


def _chain_model(depth: int):
    """F0 adds 1 and calls F1, which adds 1 and calls F2, ...; the last adds 1: x + depth."""
    one = helper.make_node("Constant", [], ["one"], value_float=1.0)
    functions = [_function(f"F{depth - 1}", ["i"], ["o"],
                           [one, helper.make_node("Add", ["i", "one"], ["o"])])]
    for k in range(depth - 2, -1, -1):
        functions.append(_function(f"F{k}", ["i"], ["o"], [
            one, helper.make_node("Add", ["i", "one"], ["t"]), _call(f"F{k + 1}", ["t"], ["o"])]))
    return _model([_call("F0", ["x"], ["y"])], [_vi("x")], [_vi("y")], functions)


def test_a_chain_of_a_thousand_nested_functions_is_inlined():
    np.testing.assert_array_equal(_ember(_chain_model(10), {"x": X})[0],
                                  _oracle(_chain_model(10), {"x": X})[0])
    model = _chain_model(1000)
    (result,) = _ember(model.SerializeToString(), {"x": X})
    np.testing.assert_allclose(result, X + 1000)


def _cycle_model(length: int, through_subgraph: bool = False):
    """F0 calls F1 ... calls F(length-1), which calls F0; optionally inside an If branch."""
    functions = []
    for k in range(length):
        call = _call(f"F{(k + 1) % length}", ["i", "c"], ["o"])
        if through_subgraph:
            branch = helper.make_graph([_call(f"F{(k + 1) % length}", ["i", "c"], ["r"])],
                                       "then", [], [_vi("r")])
            other = helper.make_graph([helper.make_node("Identity", ["i"], ["e"])], "else", [],
                                      [_vi("e")])
            call = helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=other)
        functions.append(_function(f"F{k}", ["i", "c"], ["o"], [call]))
    return _model([_call("F0", ["x", "c"], ["y"])], [_vi("x"), _vi("c", BOOL, ())], [_vi("y")],
                  functions)


@pytest.mark.parametrize("length, through_subgraph, chain", [
    (1, False, "(local.F0 -> local.F0)"),
    (2, False, "(local.F0 -> local.F1 -> local.F0)"),
    (2, True, "(local.F0 -> local.F1 -> local.F0)"),
    (1000, False, "(local.F0 -> local.F1 -> local.F2 -> local.F3 -> ... (993 more) -> "
                  "local.F997 -> local.F998 -> local.F999 -> local.F0)"),
])
def test_recursive_functions_are_refused_with_their_cycle(length, through_subgraph, chain):
    with pytest.raises(ModelLoadError) as error:
        import_onnx(_cycle_model(length, through_subgraph))
    message = str(error.value)
    assert message.startswith("model-local function 'F0' calls itself"), message
    assert chain in message, message
    assert "ONNX does not allow them" in message


def _nested_if_model(depth: int):
    """If(c) whose then-branch holds an If(c) whose then-branch ... ``depth`` levels deep; the
    innermost branch negates x.  Built in place: protobuf would not parse such a file."""
    model = _model([], [_vi("c", BOOL, ()), _vi("x")], [_vi("y")], [])
    graph, out = model.graph, "y"
    for k in range(depth):
        node = graph.node.add()
        node.CopyFrom(helper.make_node("If", ["c"], [out], name=f"if{k}",
                                       else_branch=helper.make_graph(
                                           [helper.make_node("Identity", ["x"], [f"e{k}"])],
                                           f"else{k}", [], [_vi(f"e{k}")])))
        then = node.attribute.add()
        then.name, then.type = "then_branch", AttributeProto.GRAPH
        then.g.name, out = f"then{k}", f"t{k}"
        then.g.output.add().CopyFrom(_vi(out))
        graph = then.g
    graph.node.add().CopyFrom(helper.make_node("Neg", ["x"], [out]))
    return model


def test_subgraphs_nested_a_thousand_deep_are_refused():
    with pytest.raises(ModelLoadError) as error:
        import_onnx(_nested_if_model(1000))
    message = str(error.value)
    for fragment in (f"graph 'else{MAX_SUBGRAPH_DEPTH}' (attribute 'else_branch' of node "
                     f"'if{MAX_SUBGRAPH_DEPTH}') is nested {MAX_SUBGRAPH_DEPTH + 1} subgraphs "
                     f"deep", f"more than the {MAX_SUBGRAPH_DEPTH} levels"):
        assert fragment in message, message


def test_subgraphs_nested_through_functions_are_refused_naming_them():
    """Each function's body is an If calling the next function: a small, parseable file whose
    subgraphs nest a thousand deep once inlined."""
    functions = [_function("F999", ["i", "c"], ["o"], [helper.make_node("Neg", ["i"], ["o"])])]
    for k in range(998, -1, -1):
        branch = helper.make_graph([_call(f"F{k + 1}", ["i", "c"], ["r"])], f"then{k}", [],
                                   [_vi("r")])
        other = helper.make_graph([helper.make_node("Identity", ["i"], ["e"])], f"else{k}", [],
                                  [_vi("e")])
        functions.append(_function(f"F{k}", ["i", "c"], ["o"], [
            helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=other)]))
    model = _model([_call("F0", ["x", "c"], ["y"])], [_vi("x"), _vi("c", BOOL, ())], [_vi("y")],
                   functions)
    with pytest.raises(ModelLoadError, match=rf"inside model-local function\(s\) local.F0 -> "
                                             rf"local.F1 -> .* is nested "
                                             rf"{MAX_SUBGRAPH_DEPTH + 1} subgraphs deep"):
        import_onnx(model.SerializeToString())


def _nested_loop_model(depth: int):
    """A Loop (one iteration) whose body is a Loop whose body ...; the innermost adds 1."""
    model = _model([], [_vi("x")], [_vi("y")], [])
    model.graph.initializer.extend([helper.make_tensor("trips", TensorProto.INT64, [], [1]),
                                    helper.make_tensor("yes", BOOL, [], [True]),
                                    helper.make_tensor("one", F32, [], [1.0])])
    graph, carried_in, carried_out = model.graph, "x", "y"
    for k in range(depth):
        node = graph.node.add()
        node.CopyFrom(helper.make_node("Loop", ["trips", "yes", carried_in], [carried_out],
                                       name=f"loop{k}"))
        attr = node.attribute.add()
        attr.name, attr.type = "body", AttributeProto.GRAPH
        body = attr.g
        body.name = f"body{k}"
        body.input.extend([_vi(f"i{k}", TensorProto.INT64, ()), _vi(f"c{k}", BOOL, ()),
                           _vi(f"v{k}")])
        body.output.extend([_vi(f"co{k}", BOOL, ()), _vi(f"vo{k}")])
        body.node.add().CopyFrom(helper.make_node("Identity", [f"c{k}"], [f"co{k}"]))
        graph, carried_in, carried_out = body, f"v{k}", f"vo{k}"
    graph.node.add().CopyFrom(helper.make_node("Add", [carried_in, "one"], [carried_out]))
    return model


def test_subgraphs_nested_to_the_bound_import_compile_and_run():
    """The bound is one every later stage handles: a model nesting Loops that deep runs in the
    reference executor and compiles."""
    model = _nested_loop_model(MAX_SUBGRAPH_DEPTH)
    expected = _oracle(model, {"x": X})[0]
    np.testing.assert_array_equal(_ember(model, {"x": X})[0], expected)
    np.testing.assert_array_equal(ember.compile(model)(X), expected)
    with pytest.raises(ModelLoadError, match=f"nested {MAX_SUBGRAPH_DEPTH + 1} subgraphs deep"):
        import_onnx(_nested_loop_model(MAX_SUBGRAPH_DEPTH + 1))


# ----------------------------------------------------------------------------- semantics


def _branching_function():
    """F(i, c) = c ? i + i*i : i - i*i, the branches reading the body's values i and t."""
    then = helper.make_graph([helper.make_node("Add", ["i", "t"], ["a"])], "then", [], [_vi("a")])
    other = helper.make_graph([helper.make_node("Sub", ["i", "t"], ["b"])], "else", [],
                              [_vi("b")])
    return _function("F", ["i", "c"], ["o"], [
        helper.make_node("Mul", ["i", "i"], ["t"]),
        helper.make_node("If", ["c"], ["o"], then_branch=then, else_branch=other)])


@pytest.mark.parametrize("cond", [True, False])
def test_subgraphs_of_a_function_read_the_values_of_its_body(cond):
    """The branches name the body's ``i`` and ``t``; the main graph has a value ``t`` of its
    own, which they must not read."""
    nodes = [_call("F", ["x", "c"], ["a"]), _call("F", ["a", "c"], ["b"]),
             helper.make_node("Add", ["b", "t"], ["y"])]
    model = _model(nodes, [_vi("x"), _vi("c", BOOL, ()), _vi("t")], [_vi("y")],
                   [_branching_function()])
    feeds = {"x": X, "c": np.array(cond), "t": np.array([100.0, 200.0], np.float32)}
    np.testing.assert_array_equal(_ember(model, feeds)[0], _oracle(model, feeds)[0])


def test_attribute_references_inside_subgraphs_of_a_function_resolve():
    leaky = helper.make_node("LeakyRelu", ["i"], ["r"])
    leaky.attribute.append(_ref("alpha", AttributeProto.FLOAT, "alpha"))
    then = helper.make_graph([leaky], "then", [], [_vi("r")])
    other = helper.make_graph([helper.make_node("Identity", ["i"], ["e"])], "else", [],
                              [_vi("e")])
    function = _function("Leaky", ["i", "c"], ["o"], [
        helper.make_node("If", ["c"], ["o"], then_branch=then, else_branch=other)],
        attributes=["alpha"])
    model = _model([_call("Leaky", ["x", "c"], ["y"], alpha=0.25)],
                   [_vi("x"), _vi("c", BOOL, ())], [_vi("y")], [function])
    feeds = {"x": X, "c": np.array(True)}
    np.testing.assert_array_equal(_ember(model, feeds)[0], _oracle(model, feeds, inline=True)[0])


def test_inputs_and_outputs_a_call_leaves_out():
    """A left-out trailing input is a missing optional input (Clip without bounds); an output
    the call does not take is still a value of the body that later nodes read."""
    clip = _function("MyClip", ["i", "lo", "hi"], ["o"],
                     [helper.make_node("Clip", ["i", "lo", "hi"], ["o"])])
    model = _model([_call("MyClip", ["x"], ["y"])], [_vi("x")], [_vi("y")], [clip])
    np.testing.assert_array_equal(_ember(model, {"x": X})[0],
                                  _oracle(model, {"x": X}, inline=True)[0])
    two = _function("Two", ["i"], ["a", "b"], [helper.make_node("Neg", ["i"], ["a"]),
                                               helper.make_node("Abs", ["a"], ["b"])])
    model = _model([_call("Two", ["x"], ["", "y"])], [_vi("x")], [_vi("y")], [two])
    np.testing.assert_array_equal(_ember(model, {"x": X})[0], _oracle(model, {"x": X})[0])


def test_types_nested_a_thousand_deep_are_refused():
    """A declared type of sequences and optionals nested a thousand deep (built in place:
    protobuf would not parse it) is a problem of the input, not a RecursionError."""
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [], [_vi("y")], [])
    declared = model.graph.input.add()
    declared.name = "x"
    vtype = declared.type
    for level in range(1000):
        vtype = vtype.sequence_type.elem_type if level % 2 else vtype.optional_type.elem_type
    vtype.tensor_type.elem_type = F32
    with pytest.raises(EmberError, match=f"input 'x': its declared type nests sequences and "
                                         f"optionals more than {MAX_TYPE_DEPTH} deep"):
        import_onnx(model)
