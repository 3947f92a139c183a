"""Binding symbolic input dims (ember/passes/specialize.py): binding N of ``N x 3 x 8 x 8``
makes every value static through shape arithmetic, Reshape, Flatten and Gemm; bad bindings
raise InputError naming the input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.core.dims import SymDim
from ember.core.errors import InputError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType
from ember.passes.specialize import specialize

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(3)
W = RNG.standard_normal((10, 192)).astype(np.float32)


def _vi(name, elem=F32, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _classifier():
    """x: N x 3 x 8 x 8 -> Reshape(x, [Shape(x)[0], -1]) and Flatten(x) -> Gemm -> ... """
    consts = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
              "minus1": np.array([-1], np.int64), "W": W,
              "b": RNG.standard_normal(10).astype(np.float32),
              "pair": np.array([-1, 2, 5], np.int64)}
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["r"]),
        helper.make_node("Flatten", ["x"], ["f"], axis=1),
        helper.make_node("Add", ["r", "f"], ["rf"]),
        helper.make_node("Gemm", ["rf", "W", "b"], ["logits"], transB=1),
        helper.make_node("Reshape", ["logits", "pair"], ["pairs"]),
        helper.make_node("Mul", ["pairs", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "classifier", [_vi("x", F32, ["N", 3, 8, 8]), _vi("z", F32, ["N", 2, 5])],
        [_vi("y", F32, None), _vi("x_shape", TensorProto.INT64, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _symbolic(vtype):
    return vtype.shape is None or any(not isinstance(d, int) for d in vtype.shape)


def test_binding_n_makes_every_value_static():
    graph = _classifier()
    assert isinstance(graph.types["f"].shape[0], SymDim)  # N x 192 before binding
    bound = specialize(graph, {"x": (4, 3, 8, 8), "z": [4, 2, 5]})
    for name, vtype in bound.types.items():
        assert isinstance(vtype, TensorType) and vtype.is_static and not _symbolic(vtype), \
            (name, vtype)
    shapes = {name: bound.types[name].shape for name in
              ("x", "z", "x_shape", "flat_shape", "r", "f", "rf", "logits", "pairs", "y")}
    assert shapes == {"x": (4, 3, 8, 8), "z": (4, 2, 5), "x_shape": (4,), "flat_shape": (2,),
                      "r": (4, 192), "f": (4, 192), "rf": (4, 192), "logits": (4, 10),
                      "pairs": (4, 2, 5), "y": (4, 2, 5)}
    # The original graph is not touched: specialize works on a copy.
    assert isinstance(graph.types["x"].shape[0], SymDim)
    assert isinstance(graph.types["logits"].shape[0], SymDim)


@pytest.mark.parametrize("batch", [1, 3])
def test_specialized_graph_computes_the_same(batch):
    graph = _classifier()
    feeds = {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32),
             "z": RNG.standard_normal((batch, 2, 5)).astype(np.float32)}
    expected = ReferenceExecutor(graph).run(feeds)
    bound = specialize(graph, {name: value.shape for name, value in feeds.items()})
    assert bound.types["y"].shape == (batch, 2, 5)
    actual = ReferenceExecutor(bound).run(feeds)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name])


def test_static_inputs_need_no_shape():
    graph = import_onnx(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [_vi("x", F32, [2, 3])],
        [_vi("y", F32, None)]), opset_imports=[helper.make_opsetid("", 17)]))
    assert specialize(graph, {}).types["y"].shape == (2, 3)
    assert specialize(graph, {"x": (2, 3)}).types["y"].shape == (2, 3)


def test_inconsistent_bindings_name_the_input_and_the_dim():
    with pytest.raises(InputError) as error:
        specialize(_classifier(), {"x": (4, 3, 8, 8), "z": (5, 2, 5)})
    message = str(error.value)
    assert "'z'" in message and "'N'" in message and "5" in message and "4" in message


@pytest.mark.parametrize("shapes,culprit", [
    ({"x": (4, 3, 8), "z": (4, 2, 5)}, "x"),
    ({"x": (4, 3, 8, 8, 1), "z": (4, 2, 5)}, "x"),
    ({"x": (4, 3, 8, 8), "z": (4, 10)}, "z"),
], ids=["x_rank_3", "x_rank_5", "z_rank_2"])
def test_wrong_rank_names_the_input(shapes, culprit):
    with pytest.raises(InputError, match=f"input '{culprit}'.*rank"):
        specialize(_classifier(), shapes)


def test_fixed_dim_mismatch_names_the_input_and_axis():
    with pytest.raises(InputError, match=r"input 'x': dimension 1 must be 3, got 4"):
        specialize(_classifier(), {"x": (2, 4, 8, 8), "z": (2, 2, 5)})


def test_missing_shape_of_a_dynamic_input_names_it():
    with pytest.raises(InputError, match="input 'z' has a dynamic shape"):
        specialize(_classifier(), {"x": (2, 3, 8, 8)})



def test_a_value_info_pinned_to_the_export_batch_yields_to_the_bound_shapes():
    """Exporters often leave value_info with the batch of the dummy input while the input is
    dynamic; at import a declared 1 is no contradiction of N, and binding N=2 re-infers it."""
    graph = import_onnx(helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["h"], name="relu"),
                           helper.make_node("Neg", ["h"], ["y"], name="neg")], "g",
                          [_vi("x", F32, ["N", 3])], [_vi("y", F32, ["N", 3])],
                          value_info=[_vi("h", F32, [1, 3])]),
        opset_imports=[helper.make_opsetid("", 17)]))
    bound = specialize(graph, {"x": (2, 3)})
    assert str(bound.types["h"]) == str(bound.types["y"]) == "f32[2, 3]"
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(ReferenceExecutor(bound).run({"x": x})["y"], -np.maximum(x, 0))


def test_negative_bound_dims_are_refused():
    graph = import_onnx(helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [_vi("x", F32, ["N", 3])], [_vi("y", F32, ["N", 3])]),
        opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(InputError, match=r"input 'x': shape \(-2, 3\) has a negative dimension"):
        specialize(graph, {"x": (-2, 3)})
