"""No internal exception escapes ``ember.compile``: a bug in a pass, in the lowering of a
node or in the schedule of a kernel becomes a ``CompileError`` that names where it happened.

The bugs are injected (a stage made to raise a plain Python exception); the tests check the
error the user sees, and that a failing *fused* lowering costs only the fusion: the group is
split and the model still compiles and computes the right numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.driver import kernels as driver_kernels
from ember.driver import pipeline as driver_pipeline
from ember.ir.parser import parse_graph
from ember.passes import pipeline as passes_pipeline
from ember.passes.context import GraphPass
from ember.passes.infer_shapes import infer_shapes

CHAIN = """
    graph g(%x: f32[4, 8]) -> (%y: f32[4, 8]) {
      %a = Relu(%x)
      %y = Exp(%a)
    }"""


def _graph():
    return infer_shapes(parse_graph(CHAIN))


def _broken(*args, **kwargs):
    raise KeyError("value 'ghost' has no storage")


def test_a_pass_that_raises_is_named(monkeypatch):
    level = passes_pipeline.PIPELINES[1]
    broken = GraphPass("simplify", lambda graph, ctx: _broken())
    monkeypatch.setitem(passes_pipeline.PIPELINES, 1,
                        type(level)(level.name, (broken, *level.passes[1:])))
    with pytest.raises(ember.CompileError) as caught:
        ember.compile(_graph(), opt_level=1)
    message = str(caught.value)
    assert "graph pass 'simplify'" in message and "KeyError" in message
    assert "opt_level 0" in message
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_node_whose_lowering_raises_is_named(monkeypatch):
    monkeypatch.setattr(driver_kernels, "lower_group", _broken)
    with pytest.raises(ember.CompileError) as caught:
        ember.compile(_graph(), opt_level=0)
    message = str(caught.value)
    assert "lowering node (Relu, output(s) 'a')" in message and "KeyError" in message


def test_a_fused_group_whose_lowering_raises_is_split_and_still_correct(monkeypatch):
    real = driver_kernels.lower_group

    def fails_when_fused(group, graph, name):
        if len(group.nodes) > 1:
            raise IndexError("list index out of range")
        return real(group, graph, name)

    monkeypatch.setattr(driver_kernels, "lower_group", fails_when_fused)
    module = ember.compile(_graph(), opt_level=1)
    assert [len(impl.nodes) for impl in module.build.kernels] == [1, 1]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(module(x), np.exp(np.maximum(x, 0)), rtol=1e-6)
    # nodes of one op, split apart, still get distinct kernel names
    same_ops = infer_shapes(parse_graph("""
        graph g(%x: f32[4, 8]) -> (%y: f32[4, 8]) {
          %a = Add(%x, %x)
          %b = Add(%a, %x)
          %y = Add(%b, %a)
        }"""))
    module = ember.compile(same_ops, opt_level=1)
    assert len(module.build.kernels) == 3
    np.testing.assert_allclose(module(x), 5 * x, rtol=1e-6)


def test_a_kernel_whose_schedule_raises_is_named(monkeypatch):
    import ember.schedule.pipeline as loop_pipeline

    monkeypatch.setattr(loop_pipeline, "default_schedule", _broken)
    with pytest.raises(ember.CompileError) as caught:
        ember.compile(_graph(), opt_level=1)
    message = str(caught.value)
    assert "scheduling kernel 0 (Relu+Exp" in message and "KeyError" in message
