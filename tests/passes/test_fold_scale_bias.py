"""Folding per-channel constant Mul/Div/Add/Sub into Conv/Gemm/MatMul weights
(ember/passes/fold_scale_bias.py)."""

from __future__ import annotations

import numpy as np

from ember.passes.fold_scale_bias import fold_scale_bias
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics, ops


def test_conv_scale_and_shift_fold_into_weights_and_bias():
    graph = assert_pass(fold_scale_bias, """
        graph g(%x: f32[1, 3, 8, 8]) -> (%y: f32[1, 4, 6, 6]) {
          const %w: f32[4, 3, 3, 3] = random
          const %s: f32[4, 1, 1] = random
          const %t: f32[1, 4, 1, 1] = random
          %c = Conv(%x, %w)
          %m = Mul(%c, %s)
          %y = Add(%t, %m)
        }""", """
        graph g(%x: f32[1, 3, 8, 8]) -> (%y: f32[1, 4, 6, 6]) {
          const %w2: f32[4, 3, 3, 3] = random
          const %b2: f32[4] = random
          %y = Conv(%x, %w2, %b2)
        }""", changed=2, values=False)
    assert graph.nodes[0].outputs == ["y"]


def test_fold_is_numerically_exact_to_rounding():
    for text in (
        # Conv with a bias, Div by a per-channel constant, Sub of a scalar
        """graph g(%x: f32[2, 3, 6, 6]) -> (%y: f32[2, 5, 6, 6]) {
          const %w: f32[5, 3, 3, 3] = random
          const %b: f32[5] = random
          const %d: f32[5, 1, 1] = 2.5
          const %t: f32[] = 0.25
          %c = Conv(%x, %w, %b) {pads=[1, 1, 1, 1]}
          %q = Div(%c, %d)
          %y = Sub(%q, %t)
        }""",
        # Gemm with transB, alpha, beta and a [1, N] bias; scale and shift per column
        """graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[3, 6] = random
          const %c: f32[1, 3] = random
          const %s: f32[3] = random
          const %t: f32[1, 3] = random
          %m = Gemm(%x, %w, %c) {alpha=0.5, beta=2.0, transB=1}
          %n = Mul(%s, %m)
          %y = Add(%n, %t)
        }""",
        # MatMul + bias Add, then a scale: into the weights and the bias
        """graph g(%x: f32[2, 4, 6]) -> (%y: f32[2, 4, 3]) {
          const %w: f32[6, 3] = random
          const %b: f32[3] = random
          const %s: f32[1, 1, 3] = random
          %m = MatMul(%x, %w)
          %a = Add(%m, %b)
          %y = Mul(%a, %s)
        }""",
    ):
        check_numerics(fold_scale_bias, text)


def test_a_matmul_absorbs_a_scale_but_a_shift_needs_its_bias_add():
    graph = check_numerics(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %s: f32[3] = random
          const %t: f32[3] = random
          %m = MatMul(%x, %w)
          %n = Mul(%m, %s)
          %y = Add(%n, %t)
        }""")
    assert ops(graph) == ["MatMul", "Add"]
    graph = check_numerics(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %b: f32[3] = random
          const %t: f32[3] = random
          %m = MatMul(%x, %w)
          %n = Add(%m, %b)
          %y = Sub(%n, %t)
        }""")
    assert ops(graph) == ["MatMul", "Add"]


def test_constants_that_are_not_per_channel_do_not_fold():
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[1, 3, 8, 8]) -> (%y: f32[1, 4, 6, 6], %z: f32[2, 4, 6, 6]) {
          const %w: f32[4, 3, 3, 3] = random
          const %s: f32[1, 4, 6, 1] = random
          const %u: f32[2, 1, 1, 1] = random
          %c = Conv(%x, %w)
          %y = Mul(%c, %s)
          %d = Conv(%x, %w)
          %z = Mul(%d, %u)
        }""")


def test_no_fold_when_the_anchor_output_has_another_reader_or_is_an_output():
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3], %m: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %s: f32[3] = random
          %m = MatMul(%x, %w)
          %y = Mul(%m, %s)
        }""")
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3], %z: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %s: f32[3] = random
          %m = MatMul(%x, %w)
          %y = Mul(%m, %s)
          %z = Relu(%m)
        }""")


def test_no_fold_with_runtime_weights_integer_types_or_constant_on_the_left_of_sub():
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[4, 6], %w: f32[6, 3]) -> (%y: f32[4, 3]) {
          const %s: f32[3] = random
          %m = MatMul(%x, %w)
          %y = Mul(%m, %s)
        }""")
    assert_unchanged(fold_scale_bias, """
        graph g(%x: i32[4, 6]) -> (%y: i32[4, 3]) {
          const %w: i32[6, 3] = random
          const %s: i32[3] = random
          %m = MatMul(%x, %w)
          %y = Mul(%m, %s)
        }""")
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %t: f32[3] = random
          %m = Gemm(%x, %w)
          %y = Sub(%t, %m)
        }""")


def test_a_division_by_zero_does_not_fold():
    assert_unchanged(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %d: f32[3] = [1.0, 0.0, 2.0]
          %m = MatMul(%x, %w)
          %y = Div(%m, %d)
        }""")


def test_the_folded_weights_are_new_constants_and_shared_ones_survive():
    graph = check_numerics(fold_scale_bias, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3], %z: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %s: f32[3] = random
          %m = MatMul(%x, %w)
          %y = Mul(%m, %s)
          %z = MatMul(%x, %w)
        }""")
    assert graph.nodes[0].inputs[1] != "w" and graph.nodes[1].inputs[1] == "w"
    assert np.array_equal(graph.constants["w"], graph.constants["w"])
