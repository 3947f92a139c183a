"""Hostile or malformed ONNX files get one clear EmberError naming what is wrong.

Each case is a model that ember used to accept silently (returning a wrong result) or to crash
on with an unrelated exception (KeyError, AttributeError, IndexError, RecursionError).  The
expected fragments name the node and value concerned; the oracle is the ONNX specification of a
valid model (single static assignment, topological order, declared types that hold).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.errors import ModelLoadError, ShapeError, VerificationError
from ember.frontend.onnx import import_onnx

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _vi(name, shape=(3,), elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, *, initializers=(), sparse=(), opsets=(("", 17),),
           functions=(), value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers),
                              sparse_initializer=list(sparse), value_info=list(value_info))
    return helper.make_model(graph, functions=list(functions),
                             opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _relu_model(**kwargs):
    return _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")],
                  [_vi("a")], **kwargs)


def _recursive_function_model():
    calls_b = helper.make_function("local", "A", ["i"], ["o"],
                                   [helper.make_node("B", ["i"], ["o"], domain="local")],
                                   [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    calls_a = helper.make_function("local", "B", ["i"], ["o"],
                                   [helper.make_node("A", ["i"], ["o"], domain="local")],
                                   [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    return _model([helper.make_node("A", ["x"], ["a"], domain="local", name="call")],
                  [_vi("x")], [_vi("a")], opsets=(("", 17), ("local", 1)),
                  functions=[calls_b, calls_a])


def _tensor_with_dims(array, name, dims):
    """A TensorProto whose dims say something else than its data (onnx.helper refuses)."""
    tensor = numpy_helper.from_array(array, name)
    del tensor.dims[:]
    tensor.dims.extend(dims)
    return tensor


def _sparse(indices, dims=(3,)):
    return helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, np.float32), "w"),
                                     numpy_helper.from_array(np.asarray(indices, np.int64),
                                                             "w_idx"), list(dims))


def _with_sparse(sparse):
    return _model([helper.make_node("Add", ["x", "w"], ["a"], name="add")], [_vi("x")],
                  [_vi("a")], sparse=[sparse])


# (model, error class, fragments the message must contain)
CASES = {
    "self_loop": (
        _model([helper.make_node("Add", ["x", "y"], ["y"], name="add")], [_vi("x")], [_vi("y")]),
        VerificationError, ["node 'add' (Add)", "input 'y' is an output of the same node"]),
    "redefined_graph_input": (
        _model([helper.make_node("Relu", ["x"], ["x"], name="relu")], [_vi("x")], [_vi("x")]),
        VerificationError, ["value 'x' is defined twice", "graph input", "node 'relu'"]),
    "duplicate_value_name": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                helper.make_node("Neg", ["x"], ["y"], name="second")], [_vi("x")], [_vi("y")]),
        VerificationError, ["value 'y' is defined twice", "node 'first'", "node 'second'"]),
    "cycle": (
        _model([helper.make_node("Relu", ["b"], ["a"], name="relu"),
                helper.make_node("Neg", ["a"], ["b"], name="neg")], [_vi("x")], [_vi("b")]),
        VerificationError, ["node 'relu' (Relu): input 'b' is used before it is defined",
                            "node 'neg'", "cycles"]),
    "unsorted_nodes": (
        _model([helper.make_node("Neg", ["a"], ["b"], name="neg"),
                helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")], [_vi("b")]),
        VerificationError, ["node 'neg' (Neg): input 'a' is used before it is defined",
                            "topological order"]),
    "output_nobody_produces": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")], [_vi("b")]),
        VerificationError, ["graph output 'b' is not defined"]),
    "input_nobody_produces": (
        _model([helper.make_node("Add", ["x", "ghost"], ["a"], name="add")], [_vi("x")],
               [_vi("a")]),
        VerificationError, ["node 'add' (Add): input 'ghost' is not defined"]),
    "constant_without_output": (
        _model([helper.make_node("Constant", [], [], name="const",
                                 value=numpy_helper.from_array(np.ones(3, np.float32))),
                helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")], [_vi("a")]),
        VerificationError, ["Constant node 'const'", "exactly one output"]),
    "constant_with_two_outputs": (
        _model([helper.make_node("Constant", [], ["c1", "c2"], name="const",
                                 value=numpy_helper.from_array(np.ones(3, np.float32))),
                helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")], [_vi("a")]),
        VerificationError, ["Constant node 'const'", "['c1', 'c2']"]),
    "duplicate_initializer": (
        _model([helper.make_node("Add", ["x", "w"], ["a"], name="add")], [_vi("x")], [_vi("a")],
               initializers=[numpy_helper.from_array(np.ones(3, np.float32), "w"),
                             numpy_helper.from_array(np.zeros(3, np.float32), "w")]),
        VerificationError, ["value 'w' is defined twice", "initializer"]),
    "sparse_linear_index_out_of_range": (
        _with_sparse(_sparse([0, 99])), ModelLoadError,
        ["sparse initializer 'w'", "sparse index 99", "out of range for shape [3]"]),
    "sparse_coordinate_out_of_range": (
        _with_sparse(_sparse([[0], [-1]])), ModelLoadError,
        ["sparse initializer 'w'", "sparse index [-1]", "out of range"]),
    "sparse_indices_of_wrong_shape": (
        _with_sparse(_sparse([0, 1, 2])), ModelLoadError,
        ["sparse initializer 'w'", "do not fit 2 values"]),
    "recursive_function": (
        _recursive_function_model(), ModelLoadError,
        ["function 'A' calls itself", "local.A -> local.B -> local.A"]),
    "negative_input_dim": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x", (-3,))],
               [_vi("a")]),
        VerificationError, ["input 'x': dimension 0", "negative (-3)"]),
    "huge_input_dim": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x", (2**40,))],
               [_vi("a")]),
        VerificationError, ["input 'x': dimension 0", "1,099,511,627,776"]),
    "huge_output_dim": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")],
               [_vi("a", (2**40,))]),
        VerificationError, ["value 'a': dimension 0", "largest dimension ember accepts"]),
    "negative_initializer_dim": (
        _model([helper.make_node("Add", ["x", "w"], ["a"], name="add")], [_vi("x")], [_vi("a")],
               initializers=[_tensor_with_dims(np.ones(3, np.float32), "w", [-3])]),
        ModelLoadError, ["initializer 'w': dimension 0 is negative"]),
    "float_perm": (
        _model([helper.make_node("Transpose", ["x"], ["a"], name="transpose", perm=[0.0])],
               [_vi("x")], [_vi("a")]),
        VerificationError, ["node 'transpose' (Transpose)",
                            "attribute 'perm' must be of kind ints, got list [0.0]"]),
    "opset_0": (_relu_model(opsets=(("", 0),)), ModelLoadError,
                ["opset 0 of the default domain", "1 to"]),
    "opset_999": (_relu_model(opsets=(("", 999),)), ModelLoadError,
                  ["opset 999 of the default domain", "1 to"]),
    "ml_opset_0": (_relu_model(opsets=(("", 17), ("ai.onnx.ml", 0))), ModelLoadError,
                   ["opset 0 of domain 'ai.onnx.ml'"]),
    "ml_opset_999": (_relu_model(opsets=(("", 17), ("ai.onnx.ml", 999))), ModelLoadError,
                     ["opset 999 of domain 'ai.onnx.ml'"]),
    "wrong_declared_output_type": (
        _model([helper.make_node("Shape", ["x"], ["s"], name="shape"),
                helper.make_node("Concat", ["s"] * 5, ["a"], name="concat", axis=0)],
               [_vi("x")], [_vi("a", (3,), F32)]),
        ShapeError, ["value 'a'", "node 'concat' (Concat)", "declared f32[3] but inferred i64[5]"]),
    "wrong_declared_value_info_dim": (
        _model([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                helper.make_node("Neg", ["h"], ["a"], name="neg")], [_vi("x")], [_vi("a")],
               value_info=[_vi("h", (4,))]),
        ShapeError, ["value 'h'", "node 'relu' (Relu)", "dimension 0 is 4, not 3"]),
    "output_type_of_an_input_contradicted": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")],
               [_vi("a"), _vi("x", (3,), I64)]),
        VerificationError, ["value 'x' is declared i64[3] but is f32[3]"]),
    "no_graph_outputs": (
        _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x")], []),
        VerificationError, ["the graph has no outputs"]),
    # ---- found by the fuzzer (tests/fuzz) ----
    "invalid_utf8_name": (
        _relu_model().SerializeToString().replace(b"relu", b"\xffelu", 1),
        ModelLoadError, ["model.graph.node[0].name", "not valid UTF-8"]),
    "required_input_left_empty": (
        _model([helper.make_node("Relu", [""], ["a"], name="relu")], [_vi("x")], [_vi("a")]),
        VerificationError, ["node 'relu' (Relu): input(s) [0] are empty"]),
    "constant_of_the_wrong_kind": (
        _model([helper.make_node("Constant", [], ["c"], name="const", value_float=1.0),
                helper.make_node("Add", ["x", "c"], ["a"], name="add")], [_vi("x")],
               [_vi("a")]), None, []),  # filled below: a string where a float belongs
    "type_attribute_without_a_type": (None, ModelLoadError, ["attribute 'epsilon'",
                                                             "holds none"]),
    "concat_of_two_element_types": (
        _model([helper.make_node("Concat", ["x", "i"], ["a"], name="concat", axis=0)],
               [_vi("x", (2,)), _vi("i", (2,), I64)], [_vi("a", (4,))]),
        ShapeError, ["node 'concat' (Concat)", "share one element type", "i64"]),
    "opset_imported_twice": (_relu_model(opsets=(("", 17), ("", 13))), ModelLoadError,
                             ["imported twice"]),
    "no_opset_import": (_relu_model(opsets=()), ModelLoadError, ["imports no opset"]),
    "domain_not_imported": (
        _model([helper.make_node("Binarizer", ["x"], ["a"], name="binarize",
                                 domain="ai.onnx.ml")], [_vi("x")], [_vi("a")]),
        VerificationError, ["node 'binarize'", "domain 'ai.onnx.ml'", "does not import"]),
    "op_newer_than_the_opset": (
        _model([helper.make_node("Gelu", ["x"], ["a"], name="gelu")], [_vi("x")], [_vi("a")]),
        VerificationError, ["node 'gelu' (Gelu) does not exist in opset 17"]),
    "attribute_given_twice": (None, VerificationError, ["attribute(s) ['alpha'] more than once"]),
    "attribute_reference_outside_a_function": (None, VerificationError,
                                               ["refers to function attribute(s)"]),
    "function_called_with_extra_inputs": (None, VerificationError,
                                          ["calls function 'Double' with 2 input(s)"]),
    "slice_starts_of_bools": (
        _model([helper.make_node("Slice", ["x", "s", "e"], ["a"], name="slice")], [_vi("x")],
               [_vi("a", (1,))], initializers=[numpy_helper.from_array(np.array([True]), "s"),
                                               numpy_helper.from_array(np.array([2]), "e")]),
        ShapeError, ["node 'slice' (Slice)", "must hold integers", "bool"]),
    "unsqueeze_axes_as_a_matrix": (
        _model([helper.make_node("Unsqueeze", ["x", "axes"], ["a"], name="unsqueeze")],
               [_vi("x")], [_vi("a", (1, 3))],
               initializers=[numpy_helper.from_array(np.array([[0]]), "axes")]),
        ShapeError, ["node 'unsqueeze' (Unsqueeze)", "must be a 1-D tensor"]),
    "conv_with_an_integer_weight": (
        _model([helper.make_node("Conv", ["x", "w"], ["a"], name="conv")],
               [_vi("x", (1, 1, 3, 3))], [_vi("a", (1, 1, 3, 3))],
               initializers=[numpy_helper.from_array(np.ones((1, 1, 1, 1), np.int32), "w")]),
        ShapeError, ["node 'conv' (Conv)", "input 1 ('w') is tensor(int32)",
                     "Conv does not take"]),
    "layer_norm_scale_of_another_type": (
        _model([helper.make_node("LayerNormalization", ["x", "s"], ["a"], name="norm")],
               [_vi("x"), _vi("s", (3,), TensorProto.DOUBLE)], [_vi("a")]),
        ShapeError, ["node 'norm' (LayerNormalization)", "input 1 ('s') is tensor(double) but "
                     "input 0 ('x') is tensor(float)", "must be the same type"]),
    "empty_bytes": (b"", ModelLoadError, ["empty"]),
    "bytes_without_graph": (onnx.ModelProto(ir_version=8).SerializeToString(), ModelLoadError,
                            ["no graph"]),
}


def _constant_of_the_wrong_kind():
    model = CASES["constant_of_the_wrong_kind"][0]
    attribute = model.graph.node[0].attribute[0]
    attribute.type = onnx.AttributeProto.STRING
    attribute.s = b"one"
    return model


def _type_attribute_without_a_type():
    node = helper.make_node("LeakyRelu", ["x"], ["a"], name="leaky")
    model = _model([node], [_vi("x")], [_vi("a")])
    attribute = model.graph.node[0].attribute.add()
    attribute.name, attribute.type = "epsilon", onnx.AttributeProto.TYPE_PROTO
    model.graph.node[0].op_type = "BatchNormalization"  # a float attribute, typed as a type
    return model


def _attribute_given_twice():
    model = _model([helper.make_node("LeakyRelu", ["x"], ["a"], name="leaky", alpha=0.1)],
                   [_vi("x")], [_vi("a")])
    model.graph.node[0].attribute.extend([helper.make_attribute("alpha", 0.2)])
    return model


def _attribute_reference_outside_a_function():
    model = _model([helper.make_node("LeakyRelu", ["x"], ["a"], name="leaky")], [_vi("x")],
                   [_vi("a")])
    reference = helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT)
    model.graph.node[0].attribute.extend([reference])
    return model


def _function_called_with_extra_inputs():
    double = helper.make_function("local", "Double", ["i"], ["o"],
                                  [helper.make_node("Add", ["i", "i"], ["o"])],
                                  [helper.make_opsetid("", 17)])
    return _model([helper.make_node("Double", ["x", "x"], ["a"], domain="local", name="call")],
                  [_vi("x")], [_vi("a")], opsets=(("", 17), ("local", 1)), functions=[double])


CASES["constant_of_the_wrong_kind"] = (_constant_of_the_wrong_kind(), ModelLoadError,
                                       ["Constant node 'const'", "must be a float", "str"])
CASES["type_attribute_without_a_type"] = (_type_attribute_without_a_type(),
                                          *CASES["type_attribute_without_a_type"][1:])
CASES["attribute_given_twice"] = (_attribute_given_twice(), *CASES["attribute_given_twice"][1:])
CASES["attribute_reference_outside_a_function"] = (
    _attribute_reference_outside_a_function(),
    *CASES["attribute_reference_outside_a_function"][1:])
CASES["function_called_with_extra_inputs"] = (
    _function_called_with_extra_inputs(), *CASES["function_called_with_extra_inputs"][1:])


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_model_is_refused_by_name(case):
    model, error_class, fragments = CASES[case]
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()  # what a file would hold
    with pytest.raises(error_class) as info:
        ember.compile(model)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"


def test_every_problem_of_a_graph_is_listed_at_once():
    model = _model([helper.make_node("Add", ["x", "ghost"], ["a"], name="add"),
                    helper.make_node("Transpose", ["a"], ["t"], name="transpose", perm=[0.5]),
                    helper.make_node("Neg", ["x"], ["a"], name="again"),
                    helper.make_node("Constant", [], [], name="const", value_float=1.0)],
                   [_vi("x", (-1,))], [_vi("t"), _vi("missing")])
    with pytest.raises(VerificationError) as info:
        import_onnx(model)
    problems = info.value.problems
    expected = ["input 'x': dimension 0 of its declared type is negative",
                "Constant node 'const'", "input 'ghost' is not defined",
                "attribute 'perm' must be of kind ints", "value 'a' is defined twice",
                "graph output 'missing' is not defined"]
    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    assert str(info.value).startswith(f"IR verification failed after ONNX import with "
                                      f"{len(expected)} problems")


def test_every_declared_type_mismatch_is_listed_at_once():
    model = _model([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                    helper.make_node("Cast", ["h"], ["a"], name="cast", to=I64)],
                   [_vi("x")], [_vi("a", (3,), F32)], value_info=[_vi("h", (3, 1))])
    with pytest.raises(ShapeError) as info:
        import_onnx(model)
    message = str(info.value)
    assert "2 value(s)" in message
    assert "value 'h' (output 0 of node 'relu' (Relu)) is declared f32[3, 1] but inferred " \
           "f32[3]: rank 2 is not 1" in message
    assert "value 'a' (output 0 of node 'cast' (Cast)) is declared f32[3] but inferred " \
           "i64[3]" in message


@pytest.mark.parametrize("declared", [("N",), (None,), (3,)])
def test_declared_types_that_agree_are_accepted(declared):
    """A symbolic or unknown declared dim agrees with anything; a concrete one must match."""
    model = _model([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                    helper.make_node("Neg", ["h"], ["a"], name="neg")], [_vi("x")],
                   [_vi("a", declared)], value_info=[_vi("h", declared)])
    graph = import_onnx(model)
    assert str(graph.types["a"]) == "f32[3]"


def test_declared_concrete_dim_of_a_symbolic_value_is_no_contradiction():
    """An inferred symbol against a declared size is no contradiction (N may be 1), and the
    value keeps the symbol of the input it follows: the number is an exporter's sample (the
    TorchScript exporter declares its outputs at the traced sizes), and a pinned batch would
    cost a build per batch size.  A size inference cannot name takes the declared number."""
    model = _model([helper.make_node("Relu", ["x"], ["a"], name="relu")], [_vi("x", ("N", 3))],
                   [_vi("a", (1, 3))])
    assert str(import_onnx(model).types["a"]) == "f32[N, 3]"
    unnamed = _model([helper.make_node("NonZero", ["x"], ["a"], name="nonzero")],
                     [_vi("x", (2, 3))], [_vi("a", (2, 4), TensorProto.INT64)])
    assert str(import_onnx(unnamed).types["a"]) == "i64[2, 4]"


def test_valid_sparse_initializers_still_import_exactly():
    """The sparse checks keep what was right: COO and linear indices fill the dense tensor."""
    dense = np.zeros((2, 3), np.float32)
    dense[0, 2], dense[1, 0] = 5.0, 7.0
    for indices in ([[0, 2], [1, 0]], [2, 3]):
        sparse = helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "w"),
            numpy_helper.from_array(np.array(indices, np.int64), "w_idx"), [2, 3])
        model = _model([helper.make_node("Add", ["x", "w"], ["a"], name="add")],
                       [_vi("x", (2, 3))], [_vi("a", (2, 3))], sparse=[sparse])
        np.testing.assert_array_equal(import_onnx(model).constants["w"], dense)


def test_hand_built_graph_is_verified_before_compiling():
    """ember.compile accepts a Graph too; a broken one fails before shape inference."""
    from ember.ir.graph import Graph, Node
    from ember.ir.types import tensor
    from ember.core.dtypes import DType

    graph = Graph(name="hand", inputs=["x"], outputs=["b"],
                  nodes=[Node("Relu", ["b"], ["a"], name="relu"),
                         Node("Neg", ["a"], ["b"], name="neg")],
                  types={"x": tensor(DType.FLOAT32, 3)})
    with pytest.raises(VerificationError, match="before specialization: graph 'hand': node "
                                                "'relu' \\(Relu\\): input 'b' is used before"):
        ember.compile(graph)

