"""The memory budget counts the outputs a model returns.

The runtime allocates a fresh array for every output on every call, outside the workspace
arena, so a model whose outputs alone exceed ``memory_limit`` must be refused at compile time
like an oversized workspace.  Sizes are computed here independently (product of the dims times
the element size), and the refusal must happen before anything of that size is allocated.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.errors import MemoryBudgetError

GiB, MiB = 2**30, 2**20


def _four_expands(elements: int):
    """Four outputs, each ``x`` (one float) expanded to ``elements`` floats: no workspace, no
    weights beyond the shape, so only the outputs can exceed a budget."""
    nodes = [helper.make_node("Expand", ["x", "shape"], [f"y{i}"], name=f"expand{i}")
             for i in range(4)]
    graph = helper.make_graph(
        nodes, "outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(4)],
        initializer=[numpy_helper.from_array(np.array([elements], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_four_outputs_of_1_5_gib_are_refused_under_a_2_gib_limit_before_allocating():
    elements = (3 * GiB // 2) // 4
    expected = 4 * math.prod([elements]) * np.dtype(np.float32).itemsize
    tracemalloc.start()
    try:
        with pytest.raises(MemoryBudgetError) as info:
            ember.compile(_four_expands(elements), memory_limit="2GiB")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.needed >= expected and info.value.limit == 2 * GiB
    message = str(info.value)
    assert "outputs 6.0 GiB" in message and "memory limit of 2.0 GiB" in message
    assert "memory_limit='6GiB'" in message
    assert peak < 256 * MiB, f"compiling allocated {peak:,} bytes before refusing"


def test_outputs_within_the_budget_compile_and_run_like_numpy():
    elements = MiB // 4  # 1 MiB per output, 4 MiB in all
    module = ember.compile(_four_expands(elements), memory_limit=5 * MiB)
    x = np.array([1.5], np.float32)
    for got in module(x):
        np.testing.assert_array_equal(got, np.broadcast_to(x, (elements,)))
    with pytest.raises(MemoryBudgetError, match="outputs 4.0 MiB"):
        ember.compile(_four_expands(elements), memory_limit=4 * MiB - 1)
