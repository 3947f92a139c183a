"""The graph IR parser (ember/ir/parser.py) reads back what the printer writes.

Round trips: ``print(parse_graph(print(g)))`` is ``print(g)`` for every kind of graph the
printer meets (types, symbolic dims, attributes of every kind, subgraphs, multi-output nodes,
names that need quoting, domains), constants come back bit for bit, and malformed text is an
error naming the line and column.  The whole ONNX backend suite is round-tripped in
tests/ir/test_parser_suite below (the node cases: every op's attributes).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.ir.graph import Graph, Node
from ember.ir.parser import IRParseError, parse_graph, random_array
from ember.ir.printer import format_graph
from ember.ir.types import OptionalType, SequenceType, TensorType


def _round_trip(text: str) -> Graph:
    graph = parse_graph(text)
    assert format_graph(graph) == text, format_graph(graph)
    return graph


def test_a_small_graph_round_trips_with_types_constants_and_names():
    text = "\n".join([
        "graph main(%x: f32[N, 3], %k: i64[]) -> (%y: f32[N, 3], %i: i64[N, 2]) {",
        "  const %w: f32[3] = [1.0, -2.5, 0.10000000149011612]",
        "  const %eps: f64[] = 1e-05",
        "  const %flags: bool[2] = [True, False]",
        "  %t = Add(%x, %w) : f32[N, 3]                               # add_0",
        "  %y, %i = TopK(%t, %k) {axis=1} : f32[N, 3], i64[N, 2]",
        "}"])
    graph = _round_trip(text)
    assert graph.inputs == ["x", "k"] and graph.outputs == ["y", "i"]
    assert graph.types["x"] == TensorType(DType.FLOAT32, (sym("N"), 3))
    assert graph.constants["w"].dtype == np.float32
    assert graph.constants["w"][2] == np.float32(0.1)
    assert graph.constants["eps"].shape == () and graph.constants["eps"].dtype == np.float64
    assert graph.nodes[0].name == "add_0" and graph.nodes[1].name == ""
    assert graph.types["i"] == TensorType(DType.INT64, (sym("N"), 2))


def test_every_attribute_kind_round_trips():
    text = "\n".join([
        "graph g(%x: f32[2, 3]) -> (%y: f32[*]) {",
        "  %a = Custom(%x) {f=0.5, fs=[0.25, nan, -inf], i=-3, is=[1, 2], s='it''s', "
        "ss=['a', \"b'c\"], t=tensor<float32[2]> = [1.0, 2.0], "
        "ty=seq<f32[2, ?]>, u=None} : f32[2, 3]",
        "  %y = Other(%a, _) {o=opt<?>, st=tensor<object[2]> = ['p', 'q']} : f32[*]",
        "}"])
    # 'it''s' is not the printer's spelling; use the printer's own output as the reference.
    text = text.replace("'it''s'", repr("it's"))
    graph = _round_trip(text)
    attrs = graph.nodes[0].attrs
    assert attrs["f"] == 0.5 and attrs["i"] == -3 and attrs["is"] == [1, 2]
    assert attrs["s"] == "it's" and attrs["ss"] == ["a", "b'c"] and attrs["u"] is None
    assert attrs["fs"][0] == 0.25 and np.isnan(attrs["fs"][1]) and attrs["fs"][2] == -np.inf
    assert attrs["t"].dtype == np.float32 and attrs["t"].tolist() == [1.0, 2.0]
    assert attrs["ty"] == SequenceType(TensorType(DType.FLOAT32, (2, None)))
    assert graph.nodes[1].attrs["o"] == OptionalType(None)
    assert graph.nodes[1].inputs == ["a", ""]
    assert graph.nodes[1].attrs["st"].tolist() == ["p", "q"]


def test_subgraphs_round_trip():
    body = Graph("then", [], ["t"], [Node("Neg", ["x"], ["t"], name="neg")])
    other = Graph("else", [], ["x"])
    graph = Graph("main", ["c", "x"], ["y"],
                  [Node("If", ["c"], ["y"], {"then_branch": body, "else_branch": other},
                        name="if")],
                  types={"c": TensorType(DType.BOOL, ()),
                         "x": TensorType(DType.FLOAT32, (4,))})
    text = format_graph(graph)
    parsed = _round_trip(text)
    branches = parsed.nodes[0].attrs
    assert branches["then_branch"].nodes[0].op == "Neg"
    assert branches["else_branch"].outputs == ["x"]


def test_names_that_are_not_identifiers_are_quoted():
    graph = Graph('my "model"', ["a b"], ["out:0"],
                  [Node("Relu", ["a b"], ["out:0"], name="layer 1\n(relu)")],
                  types={"a b": TensorType(DType.FLOAT32, (2,))})
    text = format_graph(graph)
    assert '%"a b"' in text and "%out:0" in text and '"layer 1\\n(relu)"' in text
    parsed = _round_trip(text)
    assert parsed.name == 'my "model"' and parsed.inputs == ["a b"]
    assert parsed.nodes[0].name == "layer 1\n(relu)"


def test_a_domain_that_the_op_name_does_not_carry_is_printed():
    graph = Graph("g", ["x"], ["y", "z"],
                  [Node("ai.onnx.ml.Binarizer", ["x"], ["y"], domain="ai.onnx.ml"),
                   Node("Relu", ["y"], ["z"], domain="com.example")])
    text = format_graph(graph)
    assert "ai.onnx.ml.Binarizer(" in text and "com.example::Relu(" in text
    parsed = _round_trip(text)
    assert [n.domain for n in parsed.nodes] == ["ai.onnx.ml", "com.example"]


def test_random_constants_are_deterministic_and_typed():
    text = """graph g(%x: f32[4, 4]) -> (%y: f32[4, 4]) {
      const %w: f32[4, 4] = random
      const %i: i32[16] = random
      const %m: bool[3] = random
      %y = MatMul(%x, %w)
    }"""
    first, second = parse_graph(text), parse_graph(text)
    assert np.array_equal(first.constants["w"], second.constants["w"])
    assert first.constants["w"].dtype == np.float32 and first.constants["w"].std() > 0
    assert first.constants["i"].dtype == np.int32 and first.constants["m"].dtype == np.bool_
    assert not np.array_equal(random_array(DType.FLOAT32, (4,), "a"),
                              random_array(DType.FLOAT32, (4,), "b"))


def test_a_number_fills_the_declared_shape_and_comments_are_skipped():
    graph = parse_graph("""
    # a comment line
    graph g(%x: f32[2]) -> (%y: f32[2]) {
      # another
      const %b: f32[2, 2] = 0.5
      %y = Add(%x, %b)
    }""")
    assert graph.constants["b"].tolist() == [[0.5, 0.5], [0.5, 0.5]]


@pytest.mark.parametrize("text, fragment", [
    ("graph g() -> () {\n  const %w: f32[100]\n}", "constant 'w' has no value"),
    ("graph g() -> () {\n  const %w: f32[2] = [1.0, 2.0, 3.0]\n}", "declared [2]"),
    ("graph g(%x: q32[2]) -> () {\n}", "unknown element type 'q32'"),
    ("graph g(%x: f32[2]) -> (%y) {\n  %y = Relu(%x\n}", "expected ',' or ')'"),
    ("graph g() -> () {\n  %y = Relu() {a=}\n}", "expected a value"),
    ("graph g() -> () {\n}\nextra", "unexpected text after"),
    ("graph g() -> () {\n  body = graph b() -> () {\n  }\n}", "before any node"),
])
def test_malformed_text_names_the_line_and_column(text, fragment):
    with pytest.raises(IRParseError) as info:
        parse_graph(text)
    message = str(info.value)
    assert fragment in message and re.search(r"line \d+, column \d+", message)


def test_the_onnx_backend_suite_round_trips():
    """Every node case of the suite imports, prints, parses and prints the same; small
    constants come back bit for bit (large ones are declared '= random' for the parse)."""
    import onnx
    from onnx.backend.test.loader import load_model_tests

    from ember.frontend.onnx import import_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    checked = 0
    for case in cases:
        try:
            graph = import_onnx(case.model or onnx.load(f"{case.model_dir}/model.onnx"))
        except Exception:  # noqa: BLE001 - cases ember does not import are not this test's
            continue
        text = format_graph(graph)
        declared = re.sub(r"^(\s*const %\S+: [^\n=]*\])$", r"\1 = random", text, flags=re.M)
        parsed = parse_graph(declared)
        assert format_graph(parsed) == text, case.name
        for name, array in graph.constants.items():
            if array.size <= 8 and array.dtype != object:
                assert parsed.constants[name].tobytes() == array.tobytes(), (case.name, name)
        checked += 1
    assert checked > 1500
