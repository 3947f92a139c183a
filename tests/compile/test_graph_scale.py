"""Large and deep graphs compile: no recursion whose depth grows with the graph, kernels of
bounded size, and the right results.

Each case failed before (a RecursionError surfacing as an internal compiler error, or a
compile of minutes): 500 chained Adds deepened one fused expression until C generation
recursed past Python's limit; 1,000 chained Muls by constants did so in GELU recognition
(the product walk), 1,000 chained Adds of constants in scale folding; a Sum/Max/Mean of
1,000 inputs built a left-folded expression 1,000 deep, and a Concat of 1,000 inputs a chain
of 1,000 selects (minutes of C compiler time).

The recursion test compiles under a recursion limit only a few hundred frames above the
caller's: any walk whose depth follows the graph's length fails it.  Compile *time* is
shown by ``benchmarks/bench_compile_time.py`` (time per node), not asserted here.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.lower.inline import MAX_INLINED_DEPTH, expression_size
from ember.passes.fuse import MAX_GROUP_NODES

SHAPE = [4, 16]


def _model(nodes, inits, output, out_shape=SHAPE):
    graph = helper.make_graph(
        nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _scalar(name, value):
    return numpy_helper.from_array(np.asarray([value], np.float32), name)


def add_chain(n):
    """v = v + x, n times: x * (n + 1)."""
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"v{i - 1}", "x"], [f"v{i}"])
             for i in range(n)]
    return _model(nodes, [], f"v{n - 1}"), lambda x: x * (n + 1)


def mul_constant_chain(n):
    """v = v * c_i with distinct scalar constants (products GELU recognition walks)."""
    scales = [1.0 + (i % 7) * 1e-3 for i in range(n)]
    nodes = [helper.make_node("Mul", ["x" if i == 0 else f"v{i - 1}", f"c{i}"], [f"v{i}"])
             for i in range(n)]
    inits = [_scalar(f"c{i}", s) for i, s in enumerate(scales)]
    factor = np.prod(np.asarray(scales, np.float64))
    return _model(nodes, inits, f"v{n - 1}"), lambda x: x * factor


def add_constant_chain(n):
    """v = v + c_i (Adds of constants: what scale folding looks through for a bias)."""
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"v{i - 1}", f"c{i}"], [f"v{i}"])
             for i in range(n)]
    inits = [_scalar(f"c{i}", 1e-3 * (i % 5)) for i in range(n)]
    total = sum(1e-3 * (i % 5) for i in range(n))
    return _model(nodes, inits, f"v{n - 1}"), lambda x: x + total


def relu_chain(n):
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"v{i - 1}"], [f"v{i}"])
             for i in range(n)]
    return _model(nodes, [], f"v{n - 1}"), lambda x: np.maximum(x, 0)


def wide(op, n):
    """x feeds n branches (x * s_i, Relu), joined by one ``op`` node of n inputs."""
    nodes, inits, branches = [], [], []
    for i in range(n):
        inits.append(_scalar(f"s{i}", 0.5 + i / n))
        nodes += [helper.make_node("Mul", ["x", f"s{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        branches.append(f"r{i}")
    attrs = {"axis": 0} if op == "Concat" else {}
    nodes.append(helper.make_node(op, branches, ["y"], **attrs))
    out_shape = [SHAPE[0] * n, SHAPE[1]] if op == "Concat" else SHAPE

    def expected(x):
        parts = [np.maximum(x * np.float32(0.5 + i / n), 0).astype(np.float64)
                 for i in range(n)]
        if op == "Concat":
            return np.concatenate(parts, axis=0)
        stacked = np.stack(parts)
        return {"Sum": stacked.sum(0), "Max": stacked.max(0), "Min": stacked.min(0),
                "Mean": stacked.mean(0)}[op]

    return _model(nodes, inits, "y", out_shape), expected


@contextmanager
def shallow_recursion(headroom: int = 400):
    """Allow only ``headroom`` frames above the current depth while the block runs."""
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + headroom)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


# Sizes above the recursion headroom (400 frames): a walk that recursed once per node, or
# per level of a left-folded expression, fails; the sizes keep the suite quick.
CASES = {
    "add_chain_600": lambda: add_chain(600),
    "mul_constant_chain_500": lambda: mul_constant_chain(500),
    "add_constant_chain_500": lambda: add_constant_chain(500),
    "sum_of_500": lambda: wide("Sum", 500),
    "max_of_500": lambda: wide("Max", 500),
    "mean_of_500": lambda: wide("Mean", 500),
    "concat_of_500": lambda: wide("Concat", 500),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_large_graph_compiles_without_deep_recursion(case):
    model, expected = CASES[case]()
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    with shallow_recursion():
        compiled = ember.compile(model)
        got = compiled(x)
    np.testing.assert_allclose(got, expected(x.astype(np.float64)), rtol=1e-4, atol=1e-3)


def test_long_chain_is_cut_into_bounded_kernels():
    """A 600-node elementwise chain becomes several kernels of at most MAX_GROUP_NODES
    nodes, each with expressions no deeper than the inlining bound (not one kernel whose
    expression is 600 levels deep)."""
    model, expected = relu_chain(600)
    compiled = ember.compile(model)
    kernels = compiled.build.kernels
    assert len(kernels) >= 600 // MAX_GROUP_NODES
    assert all(len(k.nodes) <= MAX_GROUP_NODES for k in kernels)
    from ember.ir.loop.functor import walk
    from ember.ir.loop.stmt import Store

    for kernel in kernels:
        for node in walk(kernel.func.body):
            if isinstance(node, Store):
                # scheduling may wrap a stored value in a few more levels (vector lanes,
                # casts), but never anything near the chain's length
                assert expression_size(node.value)[1] <= MAX_INLINED_DEPTH + 16
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(compiled(x), expected(x))


def test_wide_variadic_nodes_are_split_into_narrow_ones():
    from ember.passes.split_wide_variadic import MAX_VARIADIC_INPUTS

    model, _ = wide("Sum", 40)
    compiled = ember.compile(model)
    widest = max(len(node.inputs) for k in compiled.build.impls for node in k.nodes
                 if node.op == "Sum")
    assert widest <= MAX_VARIADIC_INPUTS
