"""The pattern matcher (ember/passes/patterns.py) on small graphs."""

from __future__ import annotations

from ember.ir.parser import parse_graph
from ember.passes.infer_shapes import infer_shapes
from ember.passes.patterns import (AnyOf, Constant, Op, Product, Value, flatten_product, match,
                                   scalar)
from ember.passes.rewrite import GraphIndex


def _index(text: str) -> GraphIndex:
    return GraphIndex(infer_shapes(parse_graph(text)))


GRAPH = """
    graph g(%x: f32[4], %z: f32[4]) -> (%y: f32[4], %w: f32[4]) {
      const %half: f32[1] = [0.5]
      const %two: f32[] = 2.0
      %s = Sigmoid(%x)
      %a = Mul(%s, %x)
      %b = Mul(%half, %a)
      %y = Div(%b, %two)
      %w = Add(%z, %x)
    }"""


def test_values_bind_once_and_commutative_operands_match_either_way():
    index = _index(GRAPH)
    found = match(Op("Mul", Value("x"), Op("Sigmoid", Value("x"))), index, "a")
    assert found is not None and found.values == {"x": "x"}
    assert [n.op for n in found.covered] == ["Mul", "Sigmoid"]
    assert match(Op("Mul", Value("x"), Op("Sigmoid", Value("z"))), index, "a") is not None
    assert match(Op("Add", Value("x"), Value("x")), index, "w") is None
    found = match(Op("Add", Value("x", check=lambda i, v: v == "x"), Value("other")), index, "w")
    assert found is not None and found.values == {"x": "x", "other": "z"}


def test_every_commutative_op_of_the_registry_matches_either_way():
    """The matcher asks the OpDef (``commutative``), not a list of its own: Equal and And
    match with their operands swapped, Sub and Less do not."""
    index = _index("""
        graph g(%x: f32[4], %p: bool[4]) -> (%e: bool[4], %a: bool[4], %s: f32[4], %l: bool[4]) {
          const %one: f32[] = 1.0
          %e = Equal(%one, %x)
          %a = And(%p, %e)
          %s = Sub(%one, %x)
          %l = Less(%one, %x)
        }""")
    one = Constant("c", scalar(1.0))
    found = match(Op("Equal", Value("v"), one), index, "e")
    assert found is not None and found.values == {"v": "x", "c": "one"}
    found = match(Op("And", Op("Equal", Value("v"), one), Value("q")), index, "a")
    assert found is not None and found.values["q"] == "p"
    assert match(Op("Sub", Value("v"), one), index, "s") is None
    assert match(Op("Less", Value("v"), one), index, "l") is None
    assert match(Op("Less", one, Value("v")), index, "l") is not None


def test_products_match_in_any_association_with_their_scale():
    index = _index(GRAPH)
    factors, scale, nodes = flatten_product(index, "y")
    assert sorted(factors) == ["s", "x"] and scale == 0.25 and len(nodes) == 3
    assert match(Product(Value("x"), Op("Sigmoid", Value("x")), scale=0.25), index, "y")
    assert match(Product(Value("x"), Op("Sigmoid", Value("x")), scale=0.5), index, "y") is None
    found = match(Product(Value("x"), Op("Sigmoid", Value("x")), scale=None,
                          scale_name="k"), index, "y")
    assert found is not None and found.scales["k"] == 0.25


def test_constants_and_alternatives():
    index = _index(GRAPH)
    half = Constant("c", scalar(0.5))
    assert match(Op("Mul", half, Value("v")), index, "b").values["v"] == "a"
    assert match(Op("Mul", Constant("c", scalar(0.4)), Value("v")), index, "b") is None
    either = AnyOf(Op("Div", Value("v"), Constant("c", scalar(3.0))),
                   Op("Div", Value("v"), Constant("c", scalar(2.0))))
    assert match(either, index, "y").constants["c"].tolist() == 2.0


def test_is_private_sees_readers_outside_the_match():
    index = _index(GRAPH.replace("-> (%y: f32[4], %w: f32[4])",
                                 "-> (%y: f32[4], %w: f32[4], %s: f32[4])"))
    found = match(Op("Mul", Value("x"), Op("Sigmoid", Value("x"))), index, "a")
    assert found is not None and not found.is_private(index)
    index = _index(GRAPH)
    found = match(Op("Mul", Value("x"), Op("Sigmoid", Value("x"))), index, "a")
    assert found is not None and found.is_private(index)


def test_a_named_op_seen_twice_must_be_the_same_node():
    index = _index("""
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          %e = Exp(%x)
          %f = Exp(%x)
          %y = Div(%e, %f)
        }""")
    pattern = Op("Div", Op("Exp", Value("x"), name="e"), Op("Exp", Value("x"), name="e"))
    assert match(pattern, index, "y") is None
    loose = Op("Div", Op("Exp", Value("x")), Op("Exp", Value("x")))
    assert match(loose, index, "y") is not None
