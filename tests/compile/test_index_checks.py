"""Out-of-range indices are errors, as ONNX says, not rows to clamp to.

Constant indices are checked at compile time (shape inference); run-time indices by the
compiled model before the kernel runs, which then fails with an ExecutionError naming the node,
the input and the valid range.  numpy's own indexing is the oracle for in-range indices.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.core.errors import EmberError, ExecutionError, ShapeError


def _model(op: str, data_shape, indices_shape, indices=None, axis=0, index_type=TensorProto.INT64):
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape)]
    initializers = []
    if indices is None:
        inputs.append(helper.make_tensor_value_info("idx", index_type, indices_shape))
    else:
        initializers.append(helper.make_tensor("idx", index_type, indices_shape,
                                               np.asarray(indices).reshape(-1).tolist()))
    out_shape = (list(data_shape[:axis]) + list(indices_shape) + list(data_shape[axis + 1:])
                 if op == "Gather" else list(indices_shape))
    node = helper.make_node(op, ["data", "idx"], ["out"], axis=axis, name="pick_rows")
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


DATA = np.arange(12, dtype=np.float32).reshape(4, 3)


@pytest.mark.parametrize("index_type,dtype", [(TensorProto.INT64, np.int64),
                                              (TensorProto.INT32, np.int32)])
def test_gather_run_time_indices(index_type, dtype):
    module = ember.compile(_model("Gather", [4, 3], [3], index_type=index_type))
    good = np.array([3, -4, 1], dtype=dtype)
    np.testing.assert_array_equal(module(DATA, good), DATA[good])
    for bad in ([0, 10**6, 1], [-5, 0, 0], [4, 0, 0]):
        with pytest.raises(ExecutionError) as caught:
            module(DATA, np.array(bad, dtype=dtype))
        message = str(caught.value)
        assert "pick_rows" in message and "Gather" in message and "'idx'" in message
        assert "[-4, 4)" in message
    # the model still works after an error
    np.testing.assert_array_equal(module(DATA, good), DATA[good])


def test_gather_elements_run_time_indices():
    module = ember.compile(_model("GatherElements", [4, 3], [2, 3], axis=0))
    good = np.array([[0, 3, -1], [1, 2, -4]], dtype=np.int64)
    np.testing.assert_array_equal(module(DATA, good), np.take_along_axis(DATA, good % 4, axis=0))
    with pytest.raises(ExecutionError, match="pick_rows"):
        module(DATA, np.array([[0, 4, 0], [0, 0, 0]], dtype=np.int64))


@pytest.mark.parametrize("op,indices_shape,indices", [
    ("Gather", [2], [1, 10**6]),
    ("Gather", [2], [-5, 0]),
    ("Gather", [], 4),
    ("GatherElements", [1, 3], [[0, 1, 7]]),
])
def test_constant_indices_are_checked_at_compile_time(op, indices_shape, indices):
    with pytest.raises(ShapeError, match="pick_rows.*out of range"):
        ember.compile(_model(op, [4, 3], indices_shape, indices=indices))


def test_reference_mode_agrees():
    """The reference executor (the numpy oracle) rejects the same indices."""
    import ember.onnx_backend as backend

    rep = backend.prepare(_model("Gather", [4, 3], [2]), mode="reference")
    with pytest.raises(EmberError, match="out of range"):
        rep.run([DATA, np.array([0, 4], dtype=np.int64)])
