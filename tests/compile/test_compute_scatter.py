"""Compiled scatters (ember/ops/compute/scatter.py) against the numpy references.

ScatterElements, ScatterND and TensorScatter are a copy of the data followed by writes in the
order of the updates: with repeated positions the last write wins or every write combines, so
the writes must stay in order -- checked here three ways: the outputs equal the reference's
exactly (repeated indices in every case), the loop interpreter runs the scheduled kernel with
its independence checks on (a parallel or vectorized loop whose iterations write one element
fails there), and a fused chain around a scatter matches too.
"""

from __future__ import annotations

import numpy as np
import pytest
from compute_cases import Case
from test_compute_reduce import check_cases, compile_cases, floats, integers

import ember
from ember.core.errors import EmberError
from ember.interp.loops import run_outputs
from ember.ir.graph import Graph, Node
from ember.ir.loop.expr import Load
from ember.ir.loop.functor import walk, walk_stmts
from ember.ir.loop.stmt import For, ForKind, Store
from ember.ir.types import TensorType
from ember.core.dtypes import DType
from ember.interp import ReferenceExecutor
from ember.passes.infer_shapes import infer_shapes

RNG = np.random.default_rng(20261127)
REDUCTIONS = ("none", "add", "mul", "max", "min")
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]


def _data(shape, dtype) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return floats(shape, dtype)
    return integers(shape, dtype, -9 if np.dtype(dtype).kind == "i" else 0, 9)


def _elements(data, indices, updates, axis, reduction) -> Case:
    return Case("ScatterElements", [data, indices, updates],
                {"axis": axis, "reduction": reduction})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_scatter_elements_every_reduction_and_axis(dtype):
    data = _data((5, 6, 4), dtype)
    cases = []
    for reduction in REDUCTIONS:
        for axis in (0, 1, -1):
            length = data.shape[axis]
            # fewer updates than data along the other axes; repeated and negative positions
            shape = tuple(3 if a != axis % 3 else 7 for a in range(3))
            indices = RNG.integers(-length, length, shape).astype(np.int64)
            cases.append(_elements(data, indices, _data(shape, dtype), axis, reduction))
    cases.append(_elements(data, RNG.integers(0, 5, (2, 6, 4)).astype(np.int32),
                           _data((2, 6, 4), dtype), 0, "none"))
    check_cases(cases)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_scatter_nd_tuples_of_every_length(dtype):
    data = _data((4, 5, 6), dtype)
    cases = []
    for reduction in REDUCTIONS:
        for k in (1, 2, 3):
            tuples = np.stack([RNG.integers(-d, d, (3, 2)) for d in data.shape[:k]], axis=-1)
            updates = _data((3, 2) + data.shape[k:], dtype)
            cases.append(Case("ScatterND", [data, tuples.astype(np.int64), updates],
                              {"reduction": reduction}))
    check_cases(cases)


def test_scatters_of_booleans_replace_and_leave_reductions_to_the_reference():
    data = RNG.integers(0, 2, (4, 5)).astype(bool)
    indices = RNG.integers(0, 4, (6, 5)).astype(np.int64)
    updates = RNG.integers(0, 2, (6, 5)).astype(bool)
    cases = [_elements(data, indices, updates, 0, "none"),
             _elements(data, indices, updates, 0, "add")]
    module, feeds, expected = compile_cases(cases)
    assert [impl.node.name for impl in module.build.host_nodes] == ["c1_ScatterElements"]
    outputs = module.run(feeds)
    for name, want in expected.items():
        np.testing.assert_array_equal(outputs[name], want)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_batch_at_its_index(mode):
    cache = floats((3, 2, 10, 4))
    update = floats((3, 2, 4, 4))
    starts = np.array([0, 6, 3] if mode == "linear" else [8, -3, 25], np.int64)
    cases = [Case("TensorScatter", [cache, update, starts], {"axis": 2, "mode": mode}),
             Case("TensorScatter", [cache, update], {"axis": -2, "mode": mode}),
             Case("TensorScatter", [floats((2, 7, 3)), floats((2, 7, 1)),
                                    np.array([2, 0], np.int64)], {"axis": -1, "mode": mode})]
    check_cases(cases)


def test_an_index_out_of_range_is_an_error_naming_the_node():
    data, updates = floats((4, 3)), floats((2, 3))
    cases = [_elements(data, np.array([[0, 1, 2], [3, 0, 1]], np.int64), updates, 0, "none"),
             Case("ScatterND", [data, np.array([[1], [2]], np.int64), updates], {}),
             Case("TensorScatter", [floats((2, 5, 3)), floats((2, 2, 3)),
                                    np.array([0, 3], np.int64)], {"axis": 1})]
    module, feeds, _ = compile_cases(cases)
    assert module.build.host_nodes == []
    for name, bad, op in (("c0_in1", np.array([[0, 1, 2], [4, 0, 1]]), "ScatterElements"),
                          ("c1_in1", np.array([[1], [-5]]), "ScatterND"),
                          # 4 + 2 steps pass the cache's 5
                          ("c2_in2", np.array([0, 4]), "TensorScatter")):
        with pytest.raises(EmberError, match=f"'c{name[1]}_{op}' \\({op}\\) got an index "
                                             f"out of range: input '{name}'"):
            module.run({**feeds, name: bad.astype(np.int64)})


def _graph(nodes: list[Node], inputs: dict[str, np.ndarray], outputs: list[str]) -> Graph:
    graph = Graph(name="scatter")
    for name, array in inputs.items():
        graph.types[name] = TensorType(DType.from_numpy(array.dtype), array.shape)
        graph.inputs.append(name)
    graph.nodes.extend(nodes)
    graph.outputs.extend(outputs)
    infer_shapes(graph)
    return graph


def test_a_scatter_fused_between_elementwise_ops_matches_the_reference():
    """Add -> ScatterND (updates from a Relu) -> Mul: the data's producer is inlined into the
    copy, the updates' producer stored and read by the writes, the consumer reads the result."""
    feeds = {"a": floats((6, 8)), "b": floats((6, 8)), "u": floats((5, 8)),
             "i": RNG.integers(-6, 6, (5, 1)).astype(np.int64)}
    graph = _graph([Node("Add", ["a", "b"], ["s"], name="add"),
                    Node("Relu", ["u"], ["r"], name="relu"),
                    Node("ScatterND", ["s", "i", "r"], ["t"], {"reduction": "add"},
                         name="scatter"),
                    Node("Mul", ["t", "a"], ["y"], name="mul")], feeds, ["y"])
    expected = ReferenceExecutor(graph).run(feeds)["y"]
    module = ember.compile(graph)
    assert module.build.host_nodes == []
    kernel = next(impl for impl in module.build.kernels
                  if any(n.op == "ScatterND" for n in impl.group.nodes))
    assert {n.op for n in kernel.group.nodes} >= {"Add", "ScatterND"}, kernel.group.nodes
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=1e-6, atol=1e-6)


def test_the_writes_stay_in_order_in_the_scheduled_kernel():
    """Large enough to be parallelized and vectorized: the copy is, the loop over the updates
    is not (its positions come from data), the rows of one update's slice may be; the
    interpreter's independence checks and the reference agree."""
    data = floats((64, 48, 32))
    feeds = {"d": data, "i": RNG.integers(0, 4, (40, 1)).astype(np.int64),
             "u": floats((40, 48, 32))}
    graph = _graph([Node("ScatterND", ["d", "i", "u"], ["y"], {"reduction": "add"},
                         name="scatter")], feeds, ["y"])
    expected = ReferenceExecutor(graph).run(feeds)["y"]
    module = ember.compile(graph)
    [kernel] = module.build.kernels
    parallel = [loop for loop in walk_stmts(kernel.func.body) if isinstance(loop, For) and
                loop.kind in (ForKind.PARALLEL, ForKind.VECTORIZED)]
    assert parallel, "the copy runs in parallel"
    for loop in parallel:
        for store in (n for n in walk_stmts(loop.body) if isinstance(n, Store)):
            position_loads = [n for n in walk(store.index) if isinstance(n, Load)]
            assert not any(loop.var in set(walk(load.index)) for load in position_loads), \
                f"loop {loop.var.name} ({loop.kind.name}) writes at positions read with it"
    inputs = [feeds["d"], feeds["i"], feeds["u"]]
    for func in (kernel.lowered, kernel.func):
        [result] = run_outputs(func, inputs)
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=1e-5, atol=1e-5)
