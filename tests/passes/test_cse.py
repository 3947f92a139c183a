"""Common-subexpression elimination (ember/passes/cse.py): one node per distinct
computation, one constant per distinct value; random ops and differing subgraphs stay."""

from __future__ import annotations

import numpy as np

from ember.core.traced import SizeTrace, remember_traced, tracing
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.parser import parse_graph
from ember.passes.infer_shapes import infer_shapes
from ember.passes.cse import eliminate_common_subexpressions as cse
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics, ops


def test_duplicate_nodes_merge_and_defaults_count_as_given():
    assert_pass(cse, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %a = Relu(%x)
          %b = Relu(%x)
          %s = Softmax(%a)
          %t = Softmax(%b) {axis=-1}
          %y = Add(%s, %t)
        }""", """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %a = Relu(%x)
          %s = Softmax(%a)
          %y = Add(%s, %s)
        }""", changed=2)


def test_commutative_operands_match_either_way_others_do_not():
    assert_pass(cse, """
        graph g(%x: f32[3], %z: f32[3]) -> (%y: f32[3], %w: f32[3]) {
          %a = Add(%x, %z)
          %b = Add(%z, %x)
          %y = Mul(%a, %b)
          %c = Sub(%x, %z)
          %d = Sub(%z, %x)
          %w = Mul(%c, %d)
        }""", """
        graph g(%x: f32[3], %z: f32[3]) -> (%y: f32[3], %w: f32[3]) {
          %a = Add(%x, %z)
          %y = Mul(%a, %a)
          %c = Sub(%x, %z)
          %d = Sub(%z, %x)
          %w = Mul(%c, %d)
        }""", changed=1)


def _merge_swapped(op: str, dtype: str) -> tuple[Graph, Graph]:
    """``Concat(op(x, z), op(z, x))`` before and after CSE (the Concat shows both values)."""
    text = f"""
        graph g(%x: {dtype}[2, 3], %z: {dtype}[3]) -> (%y: {dtype}[4, 3]) {{
          %a = {op}(%x, %z)
          %b = {op}(%z, %x)
          %y = Concat(%a, %b) {{axis=0}}
        }}"""
    before, after = parse_graph(text), parse_graph(text)
    infer_shapes(before)
    infer_shapes(after)
    assert cse(after) == 1
    return before, after


def test_swapped_operands_of_add_and_and_merge_into_one_node():
    """The commutativity CSE reads from the OpDef: one Add (one And) is left, and the graph
    computes what numpy says before and after."""
    rng = np.random.default_rng(0)
    cases = {
        "Add": ("f32", rng.standard_normal((2, 3)).astype(np.float32),
                rng.standard_normal(3).astype(np.float32), np.add),
        "And": ("bool", rng.random((2, 3)) < 0.5, np.array([True, False, True]),
                np.logical_and),
    }
    for op, (dtype, x, z, oracle) in cases.items():
        before, after = _merge_swapped(op, dtype)
        assert ops(after) == [op, "Concat"]
        assert after.nodes[1].inputs == ["a", "a"]
        expected = np.concatenate([oracle(x, z), oracle(z, x)])
        for graph in (before, after):
            y = ReferenceExecutor(graph).run({"x": x, "z": z})["y"]
            assert y.dtype == expected.dtype
            np.testing.assert_array_equal(y, expected)


def test_swapped_operands_of_max_do_not_merge():
    """Max is not commutative in ember's semantics (a tie returns the second operand, so the
    sign of a zero depends on the order): its two nodes stay."""
    assert_unchanged(cse, """
        graph g(%x: f32[3], %z: f32[3]) -> (%y: f32[6]) {
          %a = Max(%x, %z)
          %b = Max(%z, %x)
          %y = Concat(%a, %b) {axis=0}
        }""")


def test_different_attributes_do_not_merge():
    assert_unchanged(cse, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3], %z: f32[2, 3]) {
          %y = Softmax(%x) {axis=0}
          %z = Softmax(%x) {axis=1}
        }""")


def test_equal_constants_merge_by_value_and_then_their_readers():
    assert_pass(cse, """
        graph g(%x: f32[2]) -> (%y: f32[2]) {
          const %a: f32[2] = [1.0, 2.0]
          const %b: f32[2] = [1.0, 2.0]
          const %c: f32[2] = [1.0, 2.5]
          %p = Add(%x, %a)
          %q = Add(%x, %b)
          %r = Add(%x, %c)
          %s = Mul(%p, %q)
          %y = Mul(%s, %r)
        }""", """
        graph g(%x: f32[2]) -> (%y: f32[2]) {
          const %a: f32[2] = [1.0, 2.0]
          const %c: f32[2] = [1.0, 2.5]
          %p = Add(%x, %a)
          %r = Add(%x, %c)
          %s = Mul(%p, %p)
          %y = Mul(%s, %r)
        }""", changed=2)


def test_traced_constants_merge_only_when_they_stand_for_the_same_sizes():
    """In a build traced at S = 16, the Reshape targets [4, S, 16] and [4, 16, S] hold the
    same sample; merging them would give the second Reshape the first one's shape at every
    other S."""
    graph = parse_graph("""
        graph g(%x: f32[4, 16, 16], %w: f32[4, 16, 16]) -> (%y: f32[4, 16, 16]) {
          const %rows: i64[3] = [4, 16, 16]
          const %cols: i64[3] = [4, 16, 16]
          const %rows_again: i64[3] = [4, 16, 16]
          %a = Reshape(%x, %rows)
          %b = Reshape(%w, %cols)
          %c = Reshape(%w, %rows_again)
          %d = Add(%a, %b)
          %y = Add(%d, %c)
        }""")
    trace = SizeTrace(("S",), (16,))
    s = trace.symbol("S")
    with tracing(trace):
        remember_traced("rows", np.array([4, s, 16], dtype=object))
        remember_traced("cols", np.array([4, 16, s], dtype=object))
        remember_traced("rows_again", np.array([4, s, 16], dtype=object))
        assert cse(graph) == 1
    assert sorted(graph.constants) == ["cols", "rows"]
    assert [n.inputs[1] for n in graph.nodes if n.op == "Reshape"] == ["rows", "cols", "rows"]
    assert not trace.guards


def test_large_equal_constants_merge_and_bits_decide():
    assert_pass(cse, """
        graph g(%x: f32[64]) -> (%y: f32[64], %z: f32[64]) {
          const %a: f32[64] = 0.5
          const %b: f32[64] = 0.5
          const %zero: f32[] = 0.0
          const %negzero: f32[] = -0.0
          %p = Add(%x, %a)
          %q = Add(%x, %b)
          %r = Mul(%p, %q)
          %y = Add(%r, %zero)
          %z = Add(%r, %negzero)
        }""", """
        graph g(%x: f32[64]) -> (%y: f32[64], %z: f32[64]) {
          const %a: f32[64] = 0.5
          const %zero: f32[] = 0.0
          const %negzero: f32[] = -0.0
          %p = Add(%x, %a)
          %r = Mul(%p, %p)
          %y = Add(%r, %zero)
          %z = Add(%r, %negzero)
        }""", changed=2)


def test_a_duplicate_that_is_a_graph_output_keeps_its_name():
    assert_pass(cse, """
        graph g(%x: f32[3]) -> (%y: f32[3], %z: f32[3]) {
          %a = Relu(%x)
          %y = Neg(%a)
          %z = Relu(%x)
        }""", """
        graph g(%x: f32[3]) -> (%y: f32[3], %z: f32[3]) {
          %z = Relu(%x)
          %y = Neg(%z)
        }""")
    assert_unchanged(cse, """
        graph g(%x: f32[3]) -> (%y: f32[3], %z: f32[3]) {
          %y = Relu(%x)
          %z = Relu(%x)
        }""")


def test_multi_output_nodes_merge_output_by_output():
    assert_pass(cse, """
        graph g(%x: f32[2, 5]) -> (%y: f32[2, 3], %i: i64[2, 3]) {
          const %k: i64[1] = [3]
          %v1, %i1 = TopK(%x, %k) {axis=1}
          %v2, %i2 = TopK(%x, %k) {axis=1}
          %y = Add(%v1, %v2)
          %i = Add(%i1, %i2)
        }""", """
        graph g(%x: f32[2, 5]) -> (%y: f32[2, 3], %i: i64[2, 3]) {
          const %k: i64[1] = [3]
          %v1, %i1 = TopK(%x, %k) {axis=1}
          %y = Add(%v1, %v1)
          %i = Add(%i1, %i1)
        }""")


def test_ops_that_draw_random_numbers_never_merge():
    # ember implements no random op; Dropout (random in training) stands for them: the
    # rule is the op's OpDef.random (tests/ops/test_opdef_facts.py pins which ops).
    assert_unchanged(cse, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3], %z: f32[2, 3]) {
          %y = Dropout(%x)
          %z = Dropout(%x)
        }""")


def _if(out: str, then_op: str, else_op: str) -> Node:
    then_branch = Graph("then", [], ["t"], [Node(then_op, ["x"], ["t"])])
    else_branch = Graph("else", [], ["e"], [Node(else_op, ["x"], ["e"])])
    return Node("If", ["c"], [out], {"then_branch": then_branch, "else_branch": else_branch})


def _two_ifs(first: Node, second: Node) -> Graph:
    from ember.core.dtypes import DType
    from ember.ir.types import TensorType
    from ember.passes.infer_shapes import infer_shapes

    graph = Graph("g", ["c", "x"], ["y"], [first, second, Node("Add", ["a", "b"], ["y"])],
                  types={"c": TensorType(DType.BOOL, ()),
                         "x": TensorType(DType.FLOAT32, (3,))})
    return infer_shapes(graph)


def test_nodes_with_subgraphs_merge_only_when_identical():
    different = _two_ifs(_if("a", "Neg", "Relu"), _if("b", "Relu", "Neg"))
    assert cse(different) == 0 and ops(different) == ["If", "If", "Add"]
    identical = _two_ifs(_if("a", "Neg", "Relu"), _if("b", "Neg", "Relu"))
    assert cse(identical) == 1 and ops(identical) == ["If", "Add"]
    assert identical.nodes[-1].inputs == ["a", "a"]


def test_merged_graphs_compute_the_same_values():
    check_numerics(cse, """
        graph g(%x: f32[4, 8]) -> (%y: f32[4, 8]) {
          const %w1: f32[8, 8] = random
          const %w2: f32[8, 8] = random
          %a = MatMul(%x, %w1)
          %b = MatMul(%x, %w1)
          %c = Add(%a, %b)
          %d = Add(%b, %a)
          %e = Mul(%c, %d)
          %f = MatMul(%e, %w2)
          %y = Tanh(%f)
        }""")
