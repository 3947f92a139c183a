"""Scaled dot-product attention recognition (ember/passes/recognize_attention.py)."""

from __future__ import annotations

import pytest

from ember.passes.recognize_attention import recognize_attention
from ember.passes.simplify import simplify
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics, ops

# BERT as Hugging Face exports it: K transposed by [0, 2, 3, 1] straight from [B, S, H, d],
# scores divided by sqrt(d), an additive [B, 1, 1, S] mask.
BERT = """
    graph g(%q0: f32[2, 5, 4, 8], %k0: f32[2, 5, 4, 8], %v0: f32[2, 5, 4, 8],
            %mask: f32[2, 1, 1, 5]) -> (%y: f32[2, 4, 5, 8]) {
      const %sqrt_d: f32[] = 2.8284270763397217
      %q = Transpose(%q0) {perm=[0, 2, 1, 3]}
      %kt = Transpose(%k0) {perm=[0, 2, 3, 1]}
      %v = Transpose(%v0) {perm=[0, 2, 1, 3]}
      %s = MatMul(%q, %kt)
      %d = Div(%s, %sqrt_d)
      %a = Add(%d, %mask)
      %p = Softmax(%a) {axis=-1}
      %y = MatMul(%p, %v)
    }"""


def test_bert_attention_becomes_one_attention_node():
    assert_pass(recognize_attention, BERT, """
        graph g(%q0: f32[2, 5, 4, 8], %k0: f32[2, 5, 4, 8], %v0: f32[2, 5, 4, 8],
                %mask: f32[2, 1, 1, 5]) -> (%y: f32[2, 4, 5, 8]) {
          %q = Transpose(%q0) {perm=[0, 2, 1, 3]}
          %kt = Transpose(%k0) {perm=[0, 2, 3, 1]}
          %v = Transpose(%v0) {perm=[0, 2, 1, 3]}
          %k = Transpose(%kt) {perm=[0, 1, 3, 2]}
          %y = Attention(%q, %k, %v, %mask) {scale=0.3535533966440824}
        }""", changed=1)


def test_the_key_transposes_compose_into_one():
    def recognize_then_simplify(graph):
        return recognize_attention(graph) + simplify(graph)

    graph = check_numerics(recognize_then_simplify, BERT, rtol=1e-5, atol=1e-6)
    assert ops(graph) == ["Transpose", "Transpose", "Transpose", "Attention"]
    assert graph.nodes[1].attrs["perm"] == [0, 2, 1, 3]


def test_scale_by_mul_and_no_mask_and_no_scale():
    for scaling in ("%d = Mul(%c, %s)", "%d = Identity(%s)"):
        text = f"""
            graph g(%q: f32[1, 2, 3, 4], %kt: f32[1, 2, 4, 6], %v: f32[1, 2, 6, 5])
                    -> (%y: f32[1, 2, 3, 5]) {{
              const %c: f32[1] = [0.125]
              %s = MatMul(%q, %kt)
              {scaling}
              %p = Softmax(%d) {{axis=3}}
              %y = MatMul(%p, %v)
            }}"""
        if "Identity" in scaling:
            text = text.replace("%d = Identity(%s)\n", "").replace("Softmax(%d)",
                                                                   "Softmax(%s)")
        graph = check_numerics(recognize_attention, text, rtol=1e-5, atol=1e-6)
        assert ops(graph) == ["Transpose", "Attention"]
        expected = 0.125 if "Mul" in scaling else 1.0
        assert graph.nodes[1].attrs["scale"] == pytest.approx(expected)


def test_attention_computes_the_same_values():
    check_numerics(recognize_attention, BERT, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("old, new", [
    ("%p = Softmax(%a) {axis=-1}", "%p = Softmax(%a) {axis=2}"),        # not over the keys
    ("%mask: f32[2, 1, 1, 5]", "%mask: f32[2, 1, 1, 1]"),              # mask not per key
    ("%d = Div(%s, %sqrt_d)", "%d = Div(%sqrt_d, %s)"),
])
def test_near_misses_stay(old, new):
    assert_unchanged(recognize_attention, BERT.replace(old, new))


def test_probabilities_read_elsewhere_keep_the_pattern():
    text = BERT.replace("-> (%y: f32[2, 4, 5, 8])",
                        "-> (%y: f32[2, 4, 5, 8], %p: f32[2, 4, 5, 5])")
    assert_unchanged(recognize_attention, text)


def test_broadcast_batch_dims_are_not_attention():
    # K shared by every batch element ([1, H, d, S]): MatMul broadcasts, Attention does not.
    assert_unchanged(recognize_attention, """
        graph g(%q: f32[2, 2, 3, 4], %kt: f32[1, 2, 4, 6], %v: f32[2, 2, 6, 5])
                -> (%y: f32[2, 2, 3, 5]) {
          %s = MatMul(%q, %kt)
          %p = Softmax(%s) {axis=-1}
          %y = MatMul(%p, %v)
        }""")
