"""The pass infrastructure (ember/passes/context.py, pipeline.py): opt levels, the runner's
bookkeeping (inference, verification, timing, IR dumps) and every level agreeing with O0."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

from ember.core.errors import ConfigError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.parser import parse_graph
from ember.passes import pipeline
from ember.passes.context import (ALL_PASSES, GraphPass, PassContext, graph_pass,
                                  run_passes)
from ember.passes.infer_shapes import infer_shapes
from ember.passes.specialize import specialize

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.models import bert, example_inputs, mlp, resnet18  # noqa: E402

SMALL = """
    graph g(%x: f32[2, 4]) -> (%y: f32[2, 4]) {
      const %one: f32[] = 1.0
      %a = Identity(%x)
      %b = Mul(%a, %one)
      %c = Relu(%b)
      %d = Relu(%b)
      %y = Add(%c, %d)
    }"""


def _small() -> Graph:
    return infer_shapes(parse_graph(SMALL))


@pytest.mark.parametrize("level", [3, -1, True, "2", 1.0])
def test_an_opt_level_that_does_not_exist_is_an_error_naming_the_levels(level):
    with pytest.raises(ConfigError) as info:
        pipeline.optimize(_small(), level)
    message = str(info.value)
    assert f"opt_level {level!r} does not exist" in message
    for valid in sorted(pipeline.PIPELINES):
        assert f"{valid} = O{valid}" in message


def test_every_level_is_a_named_pipeline_and_o2_starts_with_o1():
    assert sorted(pipeline.PIPELINES) == [0, 1, 2]
    assert pipeline.passes_for(0) == []
    o1, o2 = pipeline.passes_for(1), pipeline.passes_for(2)
    assert [p.name for p in o1] == ["lower_einsum", "fold_constants", "lower_conv_transpose",
                                    "unroll_recurrent", "simplify",
                                    "eliminate_common_subexpressions", "eliminate_dead_code",
                                    "split_wide_variadics", "fuse"]
    # O2 = O1's cleanup, its own rewrites, and fusion last (it sees the final graph)
    assert o2[:len(o1) - 1] == o1[:-1] and o1[-1] == o2[-1] == pipeline.FUSE
    assert "fold_batchnorm" in str(pipeline.PIPELINES[2])


def test_optimize_logs_each_pass_and_the_context_records_timings():
    graph = _small()
    log: list[str] = []
    context = PassContext()
    pipeline.optimize(graph, 1, log, context=context)
    assert log == ["lower_einsum: 0", "fold_constants: 0", "lower_conv_transpose: 0",
                   "unroll_recurrent: 0",
                   "simplify: 2",
                   "eliminate_common_subexpressions: 1", "eliminate_dead_code: 0",
                   "split_wide_variadics: 0", "fuse: 2"]
    assert [r.name for r in context.records] == [entry.split(":")[0] for entry in log]
    assert all(r.seconds >= 0 and r.verify_seconds > 0 for r in context.records)
    assert "simplify" in context.timing_report()
    assert [n.op for n in graph.nodes] == ["Relu", "Add"]


def test_dumps_of_a_named_pass_show_it_before_and_after():
    seen = []
    context = PassContext(dump="simplify", on_dump=seen.append)
    pipeline.optimize(_small(), 1, context=context)
    assert [(d.pass_name, d.when) for d in context.dumps] == [("simplify", "before"),
                                                              ("simplify", "after")]
    assert seen == context.dumps
    before, after = context.dumps
    assert "Identity" in before.text and "Identity" not in after.text and after.changed == 2
    assert parse_graph(after.text).nodes[0].op == "Relu"  # a dump is parseable IR


def test_dumping_all_passes_shows_the_input_and_every_change():
    context = PassContext(dump=ALL_PASSES)
    pipeline.optimize(_small(), 1, context=context)
    assert [(d.pass_name, d.when) for d in context.dumps] == [
        ("lower_einsum", "before"), ("simplify", "after"),
        ("eliminate_common_subexpressions", "after"), ("fuse", "after")]
    assert "# kernel 0: 2 node(s), Relu+Add" in context.dumps[-1].text


def test_the_runner_infers_types_after_a_change_and_forgets_stale_ones():
    def replace_relu(graph: Graph) -> int:
        """Replace the Relu by a Neg under a new name (no type given)."""
        graph.nodes[0] = Node("Neg", ["x"], ["n"])
        graph.nodes[1].inputs = ["n", "n"]
        return 1

    graph = infer_shapes(parse_graph("""
        graph g(%x: f32[3]) -> (%y: f32[3]) {
          %r = Relu(%x)
          %y = Add(%r, %r)
        }"""))
    run_passes(graph, [graph_pass(replace_relu)], PassContext())
    assert "r" not in graph.types and str(graph.types["n"]) == "f32[3]"


def test_passes_receive_the_memory_budget_and_the_target(monkeypatch):
    seen = {}

    def fold(graph, limit=None):
        seen["limit"] = limit
        return 0

    monkeypatch.setattr(pipeline, "fold_constants", fold)
    pipeline.optimize(_small(), 1, memory_limit=12345)
    assert seen["limit"] == 12345
    probe = GraphPass("probe", lambda graph, ctx: seen.setdefault("target", ctx.target) and 0)
    run_passes(_small(), [probe], PassContext(target="a target"))  # type: ignore[arg-type]
    assert seen["target"] == "a target"


# ---------------------------------------------------------------------- whole models


@pytest.mark.parametrize("name, build", [
    ("mlp", lambda: mlp(2, sizes=(16, 32, 8))),
    ("resnet18", lambda: resnet18(1, image=32, num_classes=10)),
    ("bert", lambda: bert(1, seq=8, layers=2, hidden=32, heads=4, vocab=50,
                          max_positions=16)),
])
def test_every_level_computes_what_o0_does(name, build):
    model = build()
    feeds = example_inputs(model)
    graph = specialize(import_onnx(model), {})
    results, sizes = {}, {}
    for level in sorted(pipeline.PIPELINES):
        optimized = pipeline.optimize(copy.deepcopy(graph), level)
        results[level] = ReferenceExecutor(optimized).run(feeds)
        # (the layout conversions of blocked convolutions add nodes, not work)
        sizes[level] = sum(n.op not in ("Reshape", "Transpose", "Pad") for n in optimized.nodes)
    for level in (1, 2):
        for output, value in results[0].items():
            np.testing.assert_allclose(results[level][output], value, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} O{level} {output}")
    assert sizes[2] <= sizes[1] <= sizes[0]
    if name == "bert":
        ops = pipeline.optimize(copy.deepcopy(graph), 2).op_histogram()
        assert ops.get("Gelu") == 2 and ops.get("Split") == 2 and "Erf" not in ops
