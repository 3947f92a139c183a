"""Artifacts the server tests serve, built once per session, and their numpy references.

* ``mlp``: a batch-blocked artifact; x[N, 16] and a shared scale[32] (an input without the
  batch) -> y[N, 32] and z[2N, 16] (two rows per sample), so joined requests must be split
  back by rows per sample and only requests with equal ``scale`` may share a call.
* ``lookup``: a batch-blocked Gather of idx[N, 4] from a constant table: an index out of range
  makes the compiled call fail, the case of one bad request in a batch.
* ``fixed``: compiled for one shape, x[2, 8] -> softmax(x @ w): no batching.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

RNG = np.random.default_rng(7)
W_MLP = RNG.standard_normal((16, 32)).astype(np.float32)
TABLE = RNG.standard_normal((10, 8)).astype(np.float32)
W_FIXED = RNG.standard_normal((8, 5)).astype(np.float32)


def mlp_reference(x: np.ndarray, scale: np.ndarray) -> dict[str, np.ndarray]:
    hs = (x.astype(np.float64) @ W_MLP) * scale
    return {"y": np.maximum(hs, 0), "z": hs.reshape(-1, 16)}


def lookup_reference(idx: np.ndarray) -> dict[str, np.ndarray]:
    return {"rows": TABLE[idx]}


def fixed_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    logits = x.astype(np.float64) @ W_FIXED
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"p": e / e.sum(axis=1, keepdims=True)}


def _model(nodes, name, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _mlp() -> onnx.ModelProto:
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Mul", ["h", "scale"], ["hs"]),
         helper.make_node("Relu", ["hs"], ["y"]),
         helper.make_node("Reshape", ["hs", "shape"], ["z"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 16])],
        [numpy_helper.from_array(W_MLP, "w"),
         numpy_helper.from_array(np.array([-1, 16], np.int64), "shape")])


def _lookup() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)], "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 4, 8])],
        [numpy_helper.from_array(TABLE, "table")])


def _fixed() -> onnx.ModelProto:
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["p"], axis=1)], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(W_FIXED, "w")])


@dataclass(frozen=True)
class Artifacts:
    mlp: Path
    lookup: Path
    fixed: Path


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    root = tmp_path_factory.mktemp("served")
    mlp = ember.compile(_mlp())
    mlp(RNG.standard_normal((4, 16)).astype(np.float32), np.ones(32, np.float32))
    lookup = ember.compile(_lookup())
    lookup(np.zeros((4, 4), np.int64))
    assert mlp.batch_split is not None and lookup.batch_split is not None
    fixed = ember.compile(_fixed())
    return Artifacts(mlp.save(root / "mlp.ember"), lookup.save(root / "lookup.ember"),
                     fixed.save(root / "fixed.ember"))
