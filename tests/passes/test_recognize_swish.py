"""SiLU/Swish and HardSwish recognition (ember/passes/recognize_swish.py,
recognize_hard_swish.py)."""

from __future__ import annotations

import pytest

from ember.passes.recognize_hard_swish import recognize_hard_swish
from ember.passes.recognize_swish import recognize_swish
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics


def test_x_times_sigmoid_x_is_silu():
    assert_pass(recognize_swish, """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %s = Sigmoid(%x)
          %y = Mul(%s, %x)
        }""", """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %y = Swish(%x)
        }""", changed=1)


def test_a_scaled_sigmoid_is_swish_with_alpha():
    text = """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          const %beta: f32[1] = [1.702]
          %b = Mul(%x, %beta)
          %s = Sigmoid(%b)
          %y = Mul(%x, %s)
        }"""
    graph = check_numerics(recognize_swish, text)
    assert [n.op for n in graph.nodes] == ["Swish"]
    assert graph.nodes[0].attrs["alpha"] == pytest.approx(1.702, rel=1e-6)


def test_sigmoid_of_another_value_or_read_elsewhere_stays():
    assert_unchanged(recognize_swish, """
        graph g(%x: f32[4], %z: f32[4]) -> (%y: f32[4]) {
          %s = Sigmoid(%z)
          %y = Mul(%x, %s)
        }""")
    assert_unchanged(recognize_swish, """
        graph g(%x: f32[4]) -> (%y: f32[4], %s: f32[4]) {
          %s = Sigmoid(%x)
          %y = Mul(%x, %s)
        }""")


def test_hard_sigmoid_form_is_hard_swish():
    assert_pass(recognize_hard_swish, """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %h = HardSigmoid(%x) {alpha=0.16666666666666666, beta=0.5}
          %y = Mul(%x, %h)
        }""", """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %y = HardSwish(%x)
        }""", changed=1)


def test_relu6_form_is_hard_swish():
    text = """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          const %three: f32[] = 3.0
          const %zero: f32[] = 0.0
          const %six: f32[] = 6.0
          %a = Add(%three, %x)
          %c = Clip(%a, %zero, %six)
          %m = Mul(%x, %c)
          %y = Div(%m, %six)
        }"""
    assert_pass(recognize_hard_swish, text, """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %y = HardSwish(%x)
        }""", changed=1)
    check_numerics(recognize_hard_swish, text, rtol=1e-6, atol=1e-6)


def test_hard_sigmoid_with_other_parameters_is_not_hard_swish():
    assert_unchanged(recognize_hard_swish, """
        graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
          %h = HardSigmoid(%x)
          %y = Mul(%x, %h)
        }""")
