"""ember.onnx_backend follows onnx.backend.base, like onnxruntime.backend."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember.onnx_backend as backend
from ember.core.dims import sym
from ember.core.errors import EmberError, InputError
from ember.frontend.onnx import import_onnx
from ember.ir.types import TensorType
from ember.core.dtypes import DType
from ember.models import default_model_path


def _model():
    node = helper.make_node("Add", ["x", "y"], ["z"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_prepare_and_run(mode):
    x, y = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    rep = backend.prepare(_model(), device="CPU", mode=mode)
    (z,) = rep.run([x, y])
    np.testing.assert_array_equal(z, x + y)
    (z,) = backend.run_model(_model(), {"x": x, "y": y}, mode=mode)
    np.testing.assert_array_equal(z, x + y)


def test_default_mode_is_compiled():
    rep = backend.prepare(_model())
    assert rep.mode == "compiled"


def test_run_node():
    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    (y,) = backend.run_node(node, [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_supports_device_and_errors():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    with pytest.raises(EmberError, match="device"):
        backend.prepare(_model(), device="CUDA")
    with pytest.raises(EmberError, match="unknown mode"):
        backend.prepare(_model(), mode="turbo")
    with pytest.raises(InputError, match="takes 2 input"):
        backend.prepare(_model(), mode="reference").run([np.ones((2, 3), np.float32)])


def test_dynamic_batch_imports_symbolically_through_the_whole_graph():
    graph = import_onnx(default_model_path())
    n = sym("N")
    assert graph.types["input"] == TensorType(DType.FLOAT32, (n, 3, 32, 32))
    assert graph.types["gap"] == TensorType(DType.FLOAT32, (n, 32, 1, 1))
    assert graph.types["flat"] == TensorType(DType.FLOAT32, (n, 32))
    assert graph.types["logits"] == TensorType(DType.FLOAT32, (n, 10))
