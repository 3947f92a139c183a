"""ONNX import: loading, errors, initializers, external data, symbolic dims, versions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import InputError, ModelLoadError, UnsupportedOpError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.types import TensorType


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _add_model():
    return _model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        import_onnx(tmp_path / "nope.onnx")


def test_truncated_file_is_a_clear_error(tmp_path):
    data = _add_model().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated.onnx"):
        import_onnx(path)


def test_garbage_file_is_a_clear_error(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x00\x01this is not a protobuf" * 10)
    with pytest.raises(ModelLoadError):
        import_onnx(path)


def test_every_unsupported_op_is_listed_at_once():
    nodes = [helper.make_node("FancyOpA", ["x"], ["a"], name="first_fancy"),
             helper.make_node("Add", ["a", "x"], ["b"], name="add"),
             helper.make_node("FancyOpB", ["b"], ["c"], name="second_fancy"),
             helper.make_node("FancyOpA", ["c"], ["d"], name="third_fancy")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])])
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(model)
    message = str(info.value)
    for name in ("first_fancy", "second_fancy", "third_fancy", "FancyOpA", "FancyOpB"):
        assert name in message
    assert len(info.value.unsupported) == 3


def test_random_op_names_the_reason():
    model = _model([helper.make_node("RandomUniformLike", ["x"], ["y"], name="rnd")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(UnsupportedOpError, match="random ops are not supported"):
        import_onnx(model)


def test_symbolic_batch_survives_import_and_binds_at_run_time():
    graph = import_onnx(_add_model())
    assert graph.types["x"] == TensorType(DType.FLOAT32, (sym("N"), 4))
    assert graph.types["z"] == TensorType(DType.FLOAT32, (sym("N"), 4))
    executor = ReferenceExecutor(graph)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.ones(4, np.float32)
    np.testing.assert_array_equal(executor.run({"x": x, "y": y})["z"], x + y)


def test_graph_input_with_initializer_is_a_constant():
    weight = numpy_helper.from_array(np.full(4, 2.0, np.float32), "w")
    model = _model([helper.make_node("Mul", ["x", "w"], ["z"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])], [weight])
    graph = import_onnx(model)
    assert graph.inputs == ["x"]
    assert "w" in graph.constants
    out = ReferenceExecutor(graph).run({"x": np.ones(4, np.float32)})["z"]
    np.testing.assert_array_equal(out, np.full(4, 2.0, np.float32))


def test_external_data_is_loaded(tmp_path):
    big = np.arange(4096, dtype=np.float32)
    model = _model([helper.make_node("Add", ["x", "w"], ["z"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4096])],
                   [numpy_helper.from_array(big, "w")])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    graph = import_onnx(path)
    np.testing.assert_array_equal(graph.constants["w"], big)


def test_missing_external_data_is_a_clear_error(tmp_path):
    model = _model([helper.make_node("Add", ["x", "w"], ["z"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64])],
                   [numpy_helper.from_array(np.ones(64, np.float32), "w")])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin",
                    size_threshold=0)
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ModelLoadError, match="external"):
        import_onnx(path)


def test_constant_nodes_become_constants():
    model = _model([helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0]),
                    helper.make_node("Add", ["x", "c"], ["z"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.constants["c"], np.array([1.0, 2.0], np.float32))


@pytest.mark.parametrize("feeds,pattern", [
    ({"x": np.ones((3, 4), np.float32)}, "missing input"),
    ({"x": np.ones((3, 4), np.float32), "y": np.ones(4, np.float32), "q": np.ones(1)},
     "unknown input"),
    ({"x": np.ones((3, 4), np.float64), "y": np.ones(4, np.float32)}, "dtype float64"),
    ({"x": np.ones((3, 5), np.float32), "y": np.ones(4, np.float32)}, "dimension 1 must be 4"),
    ({"x": np.ones((4,), np.float32), "y": np.ones(4, np.float32)}, "rank 2"),
    ({"x": [[1.0] * 4], "y": np.ones(4, np.float32)}, "must be a numpy array"),
])
def test_wrong_run_time_inputs_are_clear_errors(feeds, pattern):
    executor = ReferenceExecutor(import_onnx(_add_model()))
    with pytest.raises(InputError, match=pattern):
        executor.run(feeds)


def test_inconsistent_symbolic_dims_across_inputs():
    model = _model([helper.make_node("Add", ["x", "y"], ["z"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    executor = ReferenceExecutor(import_onnx(model))
    with pytest.raises(InputError, match="'N'"):
        executor.run({"x": np.ones((2, 4), np.float32), "y": np.ones((3, 4), np.float32)})


def test_local_functions_are_inlined():
    fn = helper.make_function("custom", "AddTwice", ["a", "b"], ["c"],
                              [helper.make_node("Add", ["a", "b"], ["t"]),
                               helper.make_node("Add", ["t", "b"], ["c"])],
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("AddTwice", ["x", "y"], ["z"], domain="custom")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[fn],
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("custom", 1)])
    imported = import_onnx(model)
    assert [n.op for n in imported.nodes] == ["Add", "Add"]
    out = ReferenceExecutor(imported).run({"x": np.ones(2, np.float32),
                                           "y": np.full(2, 2.0, np.float32)})["z"]
    np.testing.assert_array_equal(out, np.full(2, 5.0, np.float32))
