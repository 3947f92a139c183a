"""LayerNormalization recognition (ember/passes/recognize_layer_norm.py)."""

from __future__ import annotations

import pytest

from ember.passes.recognize_layer_norm import recognize_layer_norm
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics

# torch.onnx (opset < 17): ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul, Add
TORCH = """
    graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
      const %axes: i64[1] = [-1]
      const %two: f32[] = 2.0
      const %eps: f32[] = 1e-05
      const %gamma: f32[8] = random
      const %beta: f32[8] = random
      %mean = ReduceMean(%x, %axes)
      %d = Sub(%x, %mean)
      %sq = Pow(%d, %two)
      %var = ReduceMean(%sq, %axes)
      %ve = Add(%var, %eps)
      %std = Sqrt(%ve)
      %n = Div(%d, %std)
      %s = Mul(%n, %gamma)
      %y = Add(%s, %beta)
    }"""

# Keras/TF converters: d*d, eps first, Reciprocal and Mul, gamma first, [1, 1, 8] parameters
KERAS = """
    graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
      const %axes: i64[1] = [2]
      const %eps: f32[1] = [0.001]
      const %gamma: f32[1, 1, 8] = random
      const %beta: f32[1, 1, 8] = random
      %mean = ReduceMean(%x, %axes)
      %d = Sub(%x, %mean)
      %sq = Mul(%d, %d)
      %var = ReduceMean(%sq, %axes)
      %ve = Add(%eps, %var)
      %std = Sqrt(%ve)
      %inv = Reciprocal(%std)
      %n = Mul(%d, %inv)
      %s = Mul(%gamma, %n)
      %y = Add(%beta, %s)
    }"""

# Over the two last axes, Pow 0.5 for the root, no affine part.
TWO_AXES_NO_AFFINE = """
    graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
      const %axes: i64[2] = [1, 2]
      const %two: f32[] = 2.0
      const %half: f32[] = 0.5
      const %eps: f32[] = 1e-06
      %mean = ReduceMean(%x, %axes)
      %d = Sub(%x, %mean)
      %sq = Pow(%d, %two)
      %var = ReduceMean(%sq, %axes)
      %ve = Add(%var, %eps)
      %std = Pow(%ve, %half)
      %y = Div(%d, %std)
    }"""


def test_the_torch_form_becomes_layer_normalization():
    assert_pass(recognize_layer_norm, TORCH, """
        graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
          const %gamma: f32[8] = random
          const %beta: f32[8] = random
          %y = LayerNormalization(%x, %gamma, %beta) {axis=2, epsilon=9.999999747378752e-06}
        }""", changed=1)


def test_the_keras_form_reshapes_its_parameters():
    graph = assert_pass(recognize_layer_norm, KERAS, """
        graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
          const %gamma: f32[8] = random
          const %beta: f32[8] = random
          %y = LayerNormalization(%x, %gamma, %beta) {axis=2, epsilon=0.0010000000474974513}
        }""", changed=1, values=False)
    assert graph.nodes[0].op == "LayerNormalization"


def test_without_gamma_and_beta_the_scale_is_ones():
    assert_pass(recognize_layer_norm, TWO_AXES_NO_AFFINE, """
        graph g(%x: f32[2, 5, 8]) -> (%y: f32[2, 5, 8]) {
          const %ones: f32[5, 8] = 1.0
          %y = LayerNormalization(%x, %ones) {axis=1, epsilon=9.999999974752427e-07}
        }""", changed=1)


@pytest.mark.parametrize("text", [TORCH, KERAS, TWO_AXES_NO_AFFINE],
                         ids=["torch", "keras", "two_axes"])
def test_recognized_layer_norms_compute_the_same_values(text):
    check_numerics(recognize_layer_norm, text, rtol=1e-4, atol=1e-5)


def test_float64_keeps_float64_statistics():
    text = TORCH.replace("f32", "f64")
    graph = check_numerics(recognize_layer_norm, text, rtol=1e-12, atol=1e-12)
    assert graph.nodes[0].attrs["stash_type"] == 11


def test_computed_gamma_and_beta_are_taken_as_inputs():
    text = TORCH.replace("const %gamma: f32[8] = random\n", "").replace(
        "graph g(%x: f32[2, 5, 8])", "graph g(%x: f32[2, 5, 8], %gamma: f32[8])")
    graph = check_numerics(recognize_layer_norm, text, rtol=1e-4, atol=1e-5)
    assert graph.nodes[0].inputs[1] == "gamma"


@pytest.mark.parametrize("old, new", [
    ("const %axes: i64[1] = [-1]\n", "const %axes: i64[1] = [1]\n"),   # not trailing
    ("%var = ReduceMean(%sq, %axes)", "%var = ReduceSum(%sq, %axes)"),
    ("const %two: f32[] = 2.0", "const %two: f32[] = 3.0"),
    ("%d = Sub(%x, %mean)", "%d = Sub(%mean, %x)"),
])
def test_near_misses_stay(old, new):
    assert_unchanged(recognize_layer_norm, TORCH.replace(old, new))


def test_an_intermediate_read_elsewhere_keeps_the_pattern():
    text = TORCH.replace("-> (%y: f32[2, 5, 8])",
                         "-> (%y: f32[2, 5, 8], %var: f32[2, 5, 1])")
    assert_unchanged(recognize_layer_norm, text)


def test_the_affine_tail_is_left_out_when_its_value_is_read_elsewhere():
    text = TORCH.replace("-> (%y: f32[2, 5, 8])", "-> (%y: f32[2, 5, 8], %s: f32[2, 5, 8])")
    graph = check_numerics(recognize_layer_norm, text, rtol=1e-4, atol=1e-5)
    assert [n.op for n in graph.nodes] == ["LayerNormalization", "Add"]
