"""``ember_run``'s status (node_index * 256 + code) becomes the right error in a deployment.

Code 1: a fallback node's callback failed; the runtime re-raises the very exception it caught.
Code 2: an index input was out of range; the runtime names the node, its op, the input and the
allowed range, read from the manifest's ``checks``.  numpy indexing is the oracle for valid
indices.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
import ember.runtime
from artifact_tools import (TOPK_K, TOPK_LENGTH, TOPK_ROWS, numpy_topk, read_manifest,
                            topk_model)
from ember.core.errors import ExecutionError

DATA = np.arange(12, dtype=np.float32).reshape(4, 3)


def _gather_model():
    node = helper.make_node("Gather", ["data", "idx"], ["out"], axis=0, name="pick_rows")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3]),
                      helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_out_of_range_index_names_node_op_input_and_range(tmp_path):
    artifact = ember.compile(_gather_model()).save(tmp_path / "gather.ember")
    assert read_manifest(artifact)["checks"] == [
        {"node_index": 0, "node": "pick_rows", "op": "Gather", "input": "idx", "low": -4,
         "high": 4}]
    model = ember.runtime.load(artifact)
    good = np.array([3, -4], np.int64)
    np.testing.assert_array_equal(model(DATA, good), DATA[good])
    for bad in ([0, 4], [-5, 0], [2**40, 0]):
        with pytest.raises(ExecutionError) as error:
            model(DATA, np.array(bad, np.int64))
        assert ("node 0 'pick_rows' (Gather) got an index out of range: input 'idx' must lie "
                "in [-4, 4)") in str(error.value)
    np.testing.assert_array_equal(model(DATA, good), DATA[good])  # still usable


def test_each_component_of_an_index_tuple_is_checked_against_its_own_dim(tmp_path):
    """GatherND's tuples address dims of 4 and 3: the deployed library checks every other
    value against each, and the error gives the range of each component."""
    node = helper.make_node("GatherND", ["data", "idx"], ["out"], name="pick_cells")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3]),
                      helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    artifact = ember.compile(onnx_model).save(tmp_path / "cells.ember")
    assert read_manifest(artifact)["checks"] == [
        {"node_index": 0, "node": "pick_cells", "op": "GatherND", "input": "idx", "low": low,
         "high": -low, "start": start, "stride": 2} for start, low in ((0, -4), (1, -3))]
    model = ember.runtime.load(artifact)
    good = np.array([[3, -3], [-4, 2]], np.int64)
    np.testing.assert_array_equal(model(DATA, good), DATA[good[:, 0], good[:, 1]])
    for bad in ([[3, 3], [0, 0]], [[0, 0], [4, 0]], [[0, -4], [0, 0]], [[-5, 0], [0, 0]]):
        with pytest.raises(ExecutionError) as error:  # 3 and -4 are valid for the first dim
            model(DATA, np.array(bad, np.int64))
        assert ("node 0 'pick_cells' (GatherND) got an index out of range: component 0 of "
                "each 2-tuple of input 'idx' must lie in [-4, 4), component 1 of each 2-tuple "
                "of input 'idx' must lie in [-3, 3)") in str(error.value)


class _ReferenceFailed(Exception):
    pass


def test_a_failing_fallback_node_raises_its_own_error(tmp_path):
    artifact = ember.compile(topk_model()).save(tmp_path / "topk.ember")
    calls = []

    def resolver(entry):
        def run(inputs):
            calls.append([a.shape for a in inputs])
            if len(calls) == 2:
                raise _ReferenceFailed(f"{entry.op} broke on call 2")
            values = np.sort(inputs[0], axis=1)[:, :TOPK_K]  # the smallest, as the node
            return [np.ascontiguousarray(values),
                    np.argsort(inputs[0], axis=1, kind="stable")[:, :TOPK_K]]
        return run

    model = ember.runtime.load(artifact, host_resolver=resolver)
    x = np.random.default_rng(0).uniform(1, 2, (TOPK_ROWS, TOPK_LENGTH)).astype(
        np.float32)
    y, indices = model(x)
    expected_y, expected_indices = numpy_topk(x)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)
    np.testing.assert_array_equal(indices, expected_indices)
    # the callback's views have the manifest's shapes
    assert calls == [[(TOPK_ROWS, TOPK_LENGTH), (1,)]]
    with pytest.raises(_ReferenceFailed, match="TopK broke on call 2"):
        model(x)
    y, _ = model(x)  # the error did not stick
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)


def test_a_fallback_returning_the_wrong_shape_is_an_execution_error(tmp_path):
    artifact = ember.compile(topk_model()).save(tmp_path / "topk.ember")
    model = ember.runtime.load(artifact, host_resolver=lambda entry: lambda inputs: [
        np.zeros((3, 5), np.float32), np.zeros((TOPK_ROWS, TOPK_K), np.int64)])
    with pytest.raises(ExecutionError, match=r"fallback node 'topk' \(TopK\) produced "
                                             r"float32\[3, 5\], compiled code expects"):
        model(np.ones((TOPK_ROWS, TOPK_LENGTH), np.float32))
