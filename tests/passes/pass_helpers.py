"""Numerical checks of graph passes against the reference executor.

A rewrite is right when the rewritten graph computes what the original did: both run on the
same random inputs through ``ember.interp`` (the numpy references of the ops), and the outputs
must agree to rounding.  The Before/Expected structure is checked separately with
``ember.passes.testing.assert_pass``.
"""

from __future__ import annotations

import copy

import numpy as np

from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph
from ember.ir.parser import parse_graph
from ember.ir.types import TensorType
from ember.passes.infer_shapes import infer_shapes
from ember.passes.testing import PassLike, run_pass
from ember.passes.verify import verify_graph


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every graph input: normal floats, small integers, random booleans."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        vtype = graph.types[name]
        assert isinstance(vtype, TensorType) and vtype.is_static, f"input {name}: {vtype}"
        shape = tuple(int(d) for d in vtype.shape)  # type: ignore[union-attr]
        if vtype.dtype.is_float:
            feeds[name] = rng.standard_normal(shape).astype(vtype.dtype.numpy)
        elif vtype.dtype.name == "BOOL":
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 4, size=shape).astype(vtype.dtype.numpy)
    return feeds


def check_numerics(pass_: PassLike, graph: Graph | str, *, changed: bool = True,
                   feeds: dict[str, np.ndarray] | None = None, rtol: float = 1e-5,
                   atol: float = 1e-5, seeds: int = 2) -> Graph:
    """Run ``pass_`` on ``graph`` (or its text) and check that every output is unchanged on
    random inputs; ``changed`` says whether the pass must have rewritten something.
    Returns the rewritten graph."""
    original = parse_graph(graph) if isinstance(graph, str) else graph
    infer_shapes(original)
    verify_graph(original)
    rewritten = copy.deepcopy(original)
    count = run_pass(pass_, rewritten)
    if count:
        infer_shapes(rewritten)
    verify_graph(rewritten, stage="after the pass under test")
    assert bool(count) == changed, f"the pass reported {count} changes"
    for seed in range(seeds):
        inputs = feeds if feeds is not None else random_feeds(original, seed)
        expected = ReferenceExecutor(original).run(inputs)
        actual = ReferenceExecutor(rewritten).run(inputs)
        for name, value in expected.items():
            assert actual[name].dtype == value.dtype and actual[name].shape == value.shape, name
            np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol, err_msg=name)
        if feeds is not None:
            break
    return rewritten


def ops(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes]
