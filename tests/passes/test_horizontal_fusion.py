"""Horizontal fusion (ember/passes/horizontal_fusion.py): sibling projections of one input
become one MatMul/Gemm/Conv over concatenated weights and a Split."""

from __future__ import annotations

from ember.passes.horizontal_fusion import fuse_horizontal
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics, ops

QKV = """
    graph g(%x: f32[2, 5, 8]) -> (%q: f32[2, 5, 8], %k: f32[2, 5, 8], %v: f32[2, 5, 4]) {
      const %wq: f32[8, 8] = random
      const %wk: f32[8, 8] = random
      const %wv: f32[8, 4] = random
      const %bq: f32[8] = random
      const %bk: f32[8] = random
      const %bv: f32[1, 1, 4] = random
      %mq = MatMul(%x, %wq)
      %q = Add(%mq, %bq)
      %mk = MatMul(%x, %wk)
      %k = Add(%bk, %mk)
      %mv = MatMul(%x, %wv)
      %v = Add(%mv, %bv)
    }"""


def test_qkv_projections_with_biases_become_one_matmul_one_add_and_a_split():
    assert_pass(fuse_horizontal, QKV, """
        graph g(%x: f32[2, 5, 8]) -> (%q: f32[2, 5, 8], %k: f32[2, 5, 8], %v: f32[2, 5, 4]) {
          const %w: f32[8, 20] = random
          const %b: f32[20] = random
          const %sizes: i64[3] = [8, 8, 4]
          %m = MatMul(%x, %w)
          %a = Add(%m, %b)
          %q, %k, %v = Split(%a, %sizes) {axis=2}
        }""", changed=1, values=False)
    check_numerics(fuse_horizontal, QKV)


def test_without_biases_on_every_sibling_only_the_matmuls_merge():
    text = """
        graph g(%x: f32[4, 8]) -> (%q: f32[4, 8], %k: f32[4, 6]) {
          const %wq: f32[8, 8] = random
          const %wk: f32[8, 6] = random
          const %bq: f32[8] = random
          %mq = MatMul(%x, %wq)
          %q = Add(%mq, %bq)
          %k = MatMul(%x, %wk)
        }"""
    assert_pass(fuse_horizontal, text, """
        graph g(%x: f32[4, 8]) -> (%q: f32[4, 8], %k: f32[4, 6]) {
          const %w: f32[8, 14] = random
          const %sizes: i64[2] = [8, 6]
          const %bq: f32[8] = random
          %m = MatMul(%x, %w)
          %mq, %k = Split(%m, %sizes) {axis=1}
          %q = Add(%mq, %bq)
        }""", values=False)
    check_numerics(fuse_horizontal, text)


def test_gemm_siblings_merge_with_their_biases_missing_ones_as_zeros():
    text = """
        graph g(%x: f32[4, 6]) -> (%a: f32[4, 3], %b: f32[4, 5], %c: f32[4, 2]) {
          const %w1: f32[3, 6] = random
          const %w2: f32[5, 6] = random
          const %w3: f32[2, 6] = random
          const %c1: f32[3] = random
          const %c2: f32[1, 5] = random
          %a = Gemm(%x, %w1, %c1) {alpha=0.5, transB=1}
          %b = Gemm(%x, %w2, %c2) {alpha=0.5, transB=1}
          %c = Gemm(%x, %w3) {alpha=0.5, transB=1}
        }"""
    graph = check_numerics(fuse_horizontal, text)
    assert ops(graph) == ["Gemm", "Split"]
    assert graph.constants[graph.nodes[0].inputs[1]].shape == (10, 6)


def test_gemm_siblings_with_different_attributes_stay_apart():
    assert_unchanged(fuse_horizontal, """
        graph g(%x: f32[4, 6]) -> (%a: f32[4, 3], %b: f32[4, 3]) {
          const %w1: f32[3, 6] = random
          const %w2: f32[6, 3] = random
          %a = Gemm(%x, %w1) {transB=1}
          %b = Gemm(%x, %w2)
        }""")


def test_pointwise_convolutions_of_one_feature_map_merge():
    text = """
        graph g(%x: f32[1, 8, 5, 5]) -> (%a: f32[1, 4, 5, 5], %b: f32[1, 6, 5, 5]) {
          const %w1: f32[4, 8, 1, 1] = random
          const %w2: f32[6, 8, 1, 1] = random
          const %b1: f32[4] = random
          %a = Conv(%x, %w1, %b1) {kernel_shape=[1, 1]}
          %b = Conv(%x, %w2) {kernel_shape=[1, 1]}
        }"""
    assert_pass(fuse_horizontal, text, """
        graph g(%x: f32[1, 8, 5, 5]) -> (%a: f32[1, 4, 5, 5], %b: f32[1, 6, 5, 5]) {
          const %w: f32[10, 8, 1, 1] = random
          const %bias: f32[10] = random
          const %sizes: i64[2] = [4, 6]
          %m = Conv(%x, %w, %bias) {kernel_shape=[1, 1]}
          %a, %b = Split(%m, %sizes) {axis=1}
        }""", values=False)
    check_numerics(fuse_horizontal, text)


def test_convolutions_with_other_strides_or_groups_stay_apart():
    assert_unchanged(fuse_horizontal, """
        graph g(%x: f32[1, 8, 6, 6]) -> (%a: f32[1, 4, 6, 6], %b: f32[1, 4, 3, 3],
                                         %c: f32[1, 8, 6, 6], %d: f32[1, 8, 6, 6]) {
          const %w1: f32[4, 8, 1, 1] = random
          const %w2: f32[4, 8, 1, 1] = random
          const %w3: f32[8, 1, 1, 1] = random
          const %w4: f32[8, 1, 1, 1] = random
          %a = Conv(%x, %w1)
          %b = Conv(%x, %w2) {strides=[2, 2]}
          %c = Conv(%x, %w3) {group=8}
          %d = Conv(%x, %w4) {group=8}
        }""")


def test_runtime_weights_and_x_on_the_right_do_not_merge():
    assert_unchanged(fuse_horizontal, """
        graph g(%x: f32[8, 8], %w: f32[8, 8]) -> (%a: f32[8, 8], %b: f32[8, 8],
                                                  %c: f32[8, 8], %d: f32[8, 8]) {
          const %w1: f32[8, 8] = random
          const %w2: f32[8, 8] = random
          %a = MatMul(%x, %w)
          %b = MatMul(%x, %w1)
          %c = MatMul(%w1, %x)
          %d = MatMul(%w2, %x)
        }""")


def test_graph_outputs_and_later_readers_keep_their_values():
    check_numerics(fuse_horizontal, """
        graph g(%x: f32[3, 4]) -> (%y: f32[3, 4], %a: f32[3, 4]) {
          const %w1: f32[4, 4] = random
          const %w2: f32[4, 4] = random
          const %w3: f32[4, 4] = random
          %a = MatMul(%x, %w1)
          %r = Relu(%a)
          %b = MatMul(%x, %w2)
          %c = MatMul(%x, %w3)
          %s = Add(%r, %b)
          %y = Mul(%s, %c)
        }""")
