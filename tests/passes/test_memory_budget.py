"""The memory budget: oversized models are refused by name before anything is allocated.

Sizes are checked against the product of the static dims (computed here independently), and
"before anything is allocated" is measured with tracemalloc, which sees numpy's allocations.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.config import MEMORY_LIMIT_ENV
from ember.core.errors import ConfigError, MemoryBudgetError, ShapeError
from ember.frontend.onnx import import_onnx
from ember.ops.registry import get_op
from ember.passes.fold_constants import fold_constants
from ember.passes.infer_shapes import infer_shapes
from ember.passes.memory_budget import MAX_RANK, check_build_memory
from ember.passes.specialize import specialize

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
MiB = 2**20


def _model(nodes, inputs, outputs, initializers=None):
    inits = [numpy_helper.from_array(np.asarray(a), name)
             for name, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "budget", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _expand_model(shape):
    return _model([helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
                  [helper.make_tensor_value_info("x", F32, [1])],
                  [helper.make_tensor_value_info("y", F32, None)],
                  {"shape": np.array(shape, np.int64)})


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------ (a) single values


def test_an_intermediate_larger_than_the_budget_is_refused_by_name():
    shape = (100_000, 100_000, 3)  # 111.8 GiB of float32
    with pytest.raises(MemoryBudgetError) as info:
        ember.compile(_expand_model(shape), memory_limit="1GiB")
    message = str(info.value)
    assert "value 'y' (output of node 'expand' (Expand))" in message
    assert "111.8 GiB (120,000,000,000 bytes)" in message
    assert "memory limit of 1.0 GiB" in message
    assert "memory_limit='112GiB'" in message and MEMORY_LIMIT_ENV in message
    assert info.value.needed == math.prod(shape) * 4 and info.value.limit == 2**30


def test_sizes_beyond_what_numpy_can_describe_are_a_budget_error_too():
    """2**124 elements: numpy says 'array is too big'; ember must say what and why."""
    with pytest.raises(MemoryBudgetError, match="value 'y'"):
        ember.compile(_expand_model([2**31 - 1] * 4))


def test_the_environment_variable_sets_the_budget(monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1MiB")
    with pytest.raises(MemoryBudgetError, match="memory limit of 1.0 MiB"):
        ember.compile(_expand_model([1024, 1024]))  # 4 MiB


def test_a_typo_in_the_limit_fails_at_compile():
    with pytest.raises(ConfigError, match="memory_limit='8 gigs'"):
        ember.compile(_expand_model([2]), memory_limit="8 gigs")


def test_every_oversized_value_is_listed_largest_first():
    model = _model([helper.make_node("Expand", ["x", "small"], ["a"], name="first"),
                    helper.make_node("Expand", ["x", "large"], ["b"], name="second")],
                   [helper.make_tensor_value_info("x", F32, [1])],
                   [helper.make_tensor_value_info("a", F32, None),
                    helper.make_tensor_value_info("b", F32, None)],
                   {"small": np.array([2, MiB], np.int64), "large": np.array([4, MiB], np.int64)})
    graph = import_onnx(model)
    with pytest.raises(MemoryBudgetError) as info:
        specialize(graph, {}, memory_limit=MiB)
    message = str(info.value)
    assert message.index("value 'b'") < message.index("value 'a'")
    assert info.value.needed == 16 * MiB


def test_ranks_numpy_cannot_hold_are_refused():
    graph = import_onnx(_expand_model([1] * (MAX_RANK + 1)))
    with pytest.raises(ShapeError, match=f"value 'y' .* has rank {MAX_RANK + 1}"):
        specialize(graph, {}, memory_limit=2**40)


def test_a_sparse_tensor_too_large_once_dense_is_refused_at_import():
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(1, np.float32), "w"),
                                       numpy_helper.from_array(np.zeros(1, np.int64), "w_idx"),
                                       [2**20, 2**20])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"], name="id")], "g", [],
                              [helper.make_tensor_value_info("y", F32, None)],
                              sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(MemoryBudgetError, match="sparse initializer 'w'.* 4.0 TiB"):
        import_onnx(model, memory_limit="1GiB")


# ------------------------------------------------------------------ (b) constant folding


def _constant_of_shape_graph(*shapes):
    nodes, outputs, inits = [], [], {}
    for i, shape in enumerate(shapes):
        inits[f"shape{i}"] = np.array(shape, np.int64)
        nodes.append(helper.make_node("ConstantOfShape", [f"shape{i}"], [f"c{i}"],
                                      name=f"fill{i}"))
        outputs.append(helper.make_tensor_value_info(f"c{i}", F32, None))
    return specialize(import_onnx(_model(nodes, [], outputs, inits)), {}, memory_limit=2**40)


def test_a_fold_too_large_to_keep_is_never_evaluated():
    graph = _constant_of_shape_graph([4096, 4096])  # 64 MiB: over the growth cap of folding
    peak = _peak_bytes(lambda: fold_constants(graph, memory_limit=2**40))
    assert [node.op for node in graph.nodes] == ["ConstantOfShape"]
    assert peak < 8 * MiB, f"folding allocated {peak:,} bytes for a result it did not keep"


def test_folded_constants_stay_within_the_budget():
    graph = _constant_of_shape_graph([512, 1024], [512, 1024])  # 2 MiB each
    assert fold_constants(graph, memory_limit=3 * MiB) == 1
    assert "c0" in graph.constants and "c1" not in graph.constants
    assert graph.constants["c0"].shape == (512, 1024)
    assert [node.name for node in graph.nodes] == ["fill1"]  # left to run time


def test_shape_inference_never_folds_a_value_of_unknown_size(monkeypatch):
    """The known-value folding of shape inference runs references only for small static
    outputs; a Range whose length inference cannot tell must not be materialized."""
    model = _model([helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range")],
                   [], [helper.make_tensor_value_info("r", I64, None)],
                   {"start": np.array(0, np.int64), "limit": np.array(20_000_000, np.int64),
                    "delta": np.array(1, np.int64)})
    graph = import_onnx(model, infer_shapes=False)
    monkeypatch.setattr(get_op("Range"), "infer", lambda ctx: [None])
    peak = _peak_bytes(lambda: infer_shapes(graph))
    assert peak < 16 * MiB, f"shape inference allocated {peak:,} bytes"


# ------------------------------------------------------------------ (c) the build


def test_workspace_plus_weights_over_the_budget_is_refused():
    """Each value fits (4 MiB < 6 MiB) but two live at once in the workspace (one kernel
    per node, opt level 0: fused, the chain would need no workspace at all)."""
    n = MiB  # float32 elements: 4 MiB per value
    model = _model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                    helper.make_node("Neg", ["a"], ["b"], name="neg"),
                    helper.make_node("Add", ["a", "b"], ["c"], name="add"),
                    helper.make_node("Abs", ["c"], ["y"], name="abs")],
                   [helper.make_tensor_value_info("x", F32, [n])],
                   [helper.make_tensor_value_info("y", F32, [n])])
    with pytest.raises(MemoryBudgetError, match="the compiled model needs .*workspace") as info:
        ember.compile(model, memory_limit=6 * MiB, opt_level=0)
    assert info.value.needed >= 8 * MiB and info.value.limit == 6 * MiB


def test_build_check_counts_weights_and_workspace():
    check_build_memory(3 * MiB, 3 * MiB, 6 * MiB)
    with pytest.raises(MemoryBudgetError, match=r"workspace 3.0 MiB .*weights 3.0 MiB"):
        check_build_memory(3 * MiB, 3 * MiB + 1, 6 * MiB)
