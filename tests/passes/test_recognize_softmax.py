"""Softmax recognition (ember/passes/recognize_softmax.py)."""

from __future__ import annotations

import pytest

from ember.passes.recognize_softmax import recognize_softmax
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics

STABLE = """
    graph g(%x: f32[2, 3, 7]) -> (%y: f32[2, 3, 7]) {
      const %axes: i64[1] = [-1]
      %m = ReduceMax(%x, %axes)
      %s = Sub(%x, %m)
      %e = Exp(%s)
      %t = ReduceSum(%e, %axes)
      %y = Div(%e, %t)
    }"""

PLAIN_RECIPROCAL = """
    graph g(%x: f32[2, 3, 7]) -> (%y: f32[2, 3, 7]) {
      const %axes: i64[1] = [1]
      %e = Exp(%x)
      %t = ReduceSum(%e, %axes)
      %r = Reciprocal(%t)
      %y = Mul(%r, %e)
    }"""


def test_the_max_subtracting_form_becomes_softmax():
    assert_pass(recognize_softmax, STABLE, """
        graph g(%x: f32[2, 3, 7]) -> (%y: f32[2, 3, 7]) {
          %y = Softmax(%x) {axis=2}
        }""", changed=1)


def test_the_plain_form_with_a_reciprocal_becomes_softmax():
    assert_pass(recognize_softmax, PLAIN_RECIPROCAL, """
        graph g(%x: f32[2, 3, 7]) -> (%y: f32[2, 3, 7]) {
          %y = Softmax(%x) {axis=1}
        }""", changed=1)


@pytest.mark.parametrize("text", [STABLE, PLAIN_RECIPROCAL], ids=["stable", "plain"])
def test_recognized_softmax_computes_the_same_values(text):
    check_numerics(recognize_softmax, text, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("old, new", [
    ("const %axes: i64[1] = [-1]", "const %axes: i64[2] = [1, 2]"),   # two axes
    ("%t = ReduceSum(%e, %axes)", "%t = ReduceSum(%e, %axes) {keepdims=0}"),
])
def test_near_misses_stay(old, new):
    text = STABLE.replace(old, new)
    if "keepdims=0" in new:
        text = text.replace("%y = Div(%e, %t)", "%u = Unsqueeze(%t, %axes)\n"
                                                "      %y = Div(%e, %u)")
    assert_unchanged(recognize_softmax, text)


def test_max_over_another_axis_than_the_sum_stays():
    text = STABLE.replace("%m = ReduceMax(%x, %axes)", "%m = ReduceMax(%x, %axes0)").replace(
        "const %axes: i64[1] = [-1]",
        "const %axes: i64[1] = [-1]\n      const %axes0: i64[1] = [0]")
    assert_unchanged(recognize_softmax, text)


def test_exp_of_anything_is_a_softmax_of_that_value():
    text = STABLE.replace("%m = ReduceMax(%x, %axes)", "%m = ReduceMin(%x, %axes)")
    graph = check_numerics(recognize_softmax, text)
    assert [n.op for n in graph.nodes] == ["ReduceMin", "Sub", "Softmax"]


def test_an_exp_read_elsewhere_keeps_the_pattern():
    text = STABLE.replace("-> (%y: f32[2, 3, 7])", "-> (%y: f32[2, 3, 7], %e: f32[2, 3, 7])")
    assert_unchanged(recognize_softmax, text)
