"""A model with a dynamic batch serves every batch size from at most two compilations.

``ember.Module`` compiles the first batch size it sees; when the graph keeps its samples apart
(``ember.passes.batch_split``), other sizes run block by block on that code plus a batch-1
block compiled once.  The outputs are checked against ONNX Runtime at every size, and the
compilations are counted from the module's log.  A model that mixes samples keeps compiling
per batch size, and says why.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")

COMPILING = "compiling a specialization"


@pytest.fixture(autouse=True)
def specializations(monkeypatch):
    """These tests count the specializations the batch blocks save; builds for every size of
    a dim (which serve the sizes counted here from one build) have tests of their own in
    ``tests/compile/test_runtime_dims.py``."""
    monkeypatch.setenv("EMBER_RUNTIME_DIMS", "0")


def _mlp(softmax_axis: int = 1) -> onnx.ModelProto:
    """x[N, 6] -> Gemm -> Relu -> Gemm -> Softmax; two outputs, one per sample row and one
    that does not depend on the input (to check both kinds come back)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (6, 16)), ("b1", (16,)), ("w2", (5, 16)), ("c", (3,)))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2"], ["z"], transB=1),
             helper.make_node("Softmax", ["z"], ["y"], axis=softmax_axis),
             helper.make_node("Mul", ["c", "c"], ["c2"])]
    graph = helper.make_graph(
        nodes, "dyn_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("c2", TensorProto.FLOAT, [3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _check_sizes(module, proto: onnx.ModelProto, batches) -> None:
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        y, c2 = module(x)
        want_y, want_c2 = session.run(None, {"x": x})
        assert y.shape == (batch, 5)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6,
                                   err_msg=f"batch {batch}")
        np.testing.assert_allclose(c2, want_c2, rtol=1e-6)


def _compilations(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if COMPILING in r.getMessage()]


def test_every_batch_size_runs_on_two_compilations(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ember")
    proto = _mlp()
    module = ember.compile(proto)
    assert module.batch_split is not None, module.batch_split_reason
    _check_sizes(module, proto, [4, 1, 3, 9, 4, 2, 7, 33])
    compiled = _compilations(caplog)
    assert len(compiled) == 2, compiled
    assert "x[4, 6]" in compiled[0] and "x[1, 6]" in compiled[1]


def test_a_batch_size_seen_before_reuses_its_block_plan(monkeypatch) -> None:
    """The blocks that serve a batch size are planned once; a later call of that size goes
    straight to them (planning checks every build, a third of a small model's call), and a
    new build plans again, since a new block size may serve it better."""
    proto = _mlp()
    module = ember.compile(proto)
    planned = []
    plan = module._block_plan
    monkeypatch.setattr(module, "_block_plan",
                        lambda shapes, split: planned.append(shapes["x"][0]) or
                        plan(shapes, split))
    _check_sizes(module, proto, [4, 9])
    left = (module._last_shapes, module.build)  # what planning leaves current
    _check_sizes(module, proto, [9, 9, 6, 9])
    assert planned == [4, 9, 6], planned  # 9 planned once, however often it runs
    assert (module._last_shapes, module.build) == left  # and the plan restores it
    _check_sizes(module, proto, [5, 9])
    assert planned == [4, 9, 6, 5], planned  # no new build: the plan of 9 still holds


def test_the_first_call_gets_its_own_specialization(caplog) -> None:
    """A size already compiled, or the first one, runs as one call, not in blocks."""
    caplog.set_level(logging.INFO, logger="ember")
    proto = _mlp()
    module = ember.compile(proto, input_shapes={"x": (8, 6)})
    _check_sizes(module, proto, [8, 16, 8])  # 16 = two blocks of 8: nothing new to compile
    assert len(_compilations(caplog)) == 1


def test_a_first_call_with_one_sample_does_not_make_every_batch_run_one_by_one(caplog) -> None:
    """After batch 1, the first larger batch is compiled as well (a batch of 6 run as six
    blocks of 1 would waste the GEMMs); later sizes run on blocks of those two."""
    caplog.set_level(logging.INFO, logger="ember")
    proto = _mlp()
    module = ember.compile(proto)
    _check_sizes(module, proto, [1, 6, 3, 13])
    compiled = _compilations(caplog)
    assert len(compiled) == 2, compiled
    assert "x[1, 6]" in compiled[0] and "x[6, 6]" in compiled[1]


def test_a_model_that_mixes_samples_compiles_per_batch_size(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ember")
    proto = _mlp(softmax_axis=0)  # a softmax over the batch: blocks would be wrong
    module = ember.compile(proto)
    assert module.batch_split is None
    assert "Softmax" in module.batch_split_reason and "axis 0" in module.batch_split_reason
    _check_sizes(module, proto, [4, 3, 5])
    assert len(_compilations(caplog)) == 3
    assert module.build_reasons[0] == "the first call"
    assert module.build_reasons[2].startswith("new N=5 (compiled for 3, 4); the batch does "
                                              "not run in blocks: node") and \
        "Softmax" in module.build_reasons[2]


def test_every_build_says_which_size_needed_it() -> None:
    """The guard's explanation of a recompile: the symbol, its new size, the sizes built."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "tokens", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 4])], [weight])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    module = ember.compile(proto)
    for batch, length in ((2, 5), (3, 5), (2, 7), (4, 7)):
        x = rng.standard_normal((batch, length, 4)).astype(np.float32)
        np.testing.assert_allclose(module(x), session.run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)
    assert module.build_reasons == [
        "the first call",
        "new N=1 (compiled for 2); a block size the batch runs in",
        "new S=7 (compiled for 5); sizes other than the batch are compiled into the code"]


def test_dynamic_batch_can_be_turned_off(caplog, monkeypatch) -> None:
    caplog.set_level(logging.INFO, logger="ember")
    proto = _mlp()
    module = ember.compile(proto, dynamic_batch=False)
    assert module.batch_split is None
    _check_sizes(module, proto, [2, 3])
    monkeypatch.setenv("EMBER_DYNAMIC_BATCH", "0")
    assert ember.compile(proto).batch_split is None
    assert len(_compilations(caplog)) == 2


def _first_token_model() -> onnx.ModelProto:
    """x[N, S, 4] minus its first token, times a weight: ``x[:, :1]`` has an unknown length
    while S is symbolic, so the batch split is decided with S bound to a call's length."""
    weight = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "one")]
    nodes = [helper.make_node("Slice", ["x", "zero", "one", "one"], ["first"]),
             helper.make_node("Sub", ["x", "first"], ["d"]),
             helper.make_node("MatMul", ["d", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "first_token", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["N", "S", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_batch_split_hidden_by_another_dynamic_dim_is_decided_at_its_size(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ember")
    proto = _first_token_model()
    module = ember.compile(proto)
    assert module.batch_split is None and "no known shape" in module.batch_split_reason
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    calls = [(4, 6), (3, 6), (9, 6), (2, 5), (3, 5), (4, 6)]
    for batch, length in calls:
        x = np.random.default_rng(batch * length).standard_normal(
            (batch, length, 4)).astype(np.float32)
        np.testing.assert_allclose(module(x), session.run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6, err_msg=f"batch {batch}, length {length}")
    assert module.batch_split is not None, module.batch_split_reason
    compiled = _compilations(caplog)
    # per length: its first batch size, then a batch-1 block for every other size
    assert len(compiled) == 4, compiled
    assert [c.split("x[")[1].split("]")[0] for c in compiled] == \
        ["4, 6, 4", "1, 6, 4", "2, 5, 4", "1, 5, 4"]
