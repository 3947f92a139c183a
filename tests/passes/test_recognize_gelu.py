"""GELU recognition (ember/passes/recognize_gelu.py): the erf and tanh forms exporters write,
in every association and operand order, become one Gelu node; near misses stay."""

from __future__ import annotations

import pytest

from ember.passes.recognize_gelu import recognize_gelu
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics

GELU = """
    graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
      %y = Gelu(%x)
    }"""
GELU_TANH = """
    graph g(%x: f32[2, 8]) -> (%y: f32[2, 8]) {
      %y = Gelu(%x) {approximate='tanh'}
    }"""

ERF_FORMS = {
    # torch (x * 0.5) * (1 + erf(x / sqrt 2)), as exported before opset 20
    "torch": """
      const %sqrt2: f32[] = 1.4142135381698608
      const %one: f32[] = 1.0
      const %half: f32[] = 0.5
      %d = Div(%x, %sqrt2)
      %e = Erf(%d)
      %p = Add(%e, %one)
      %m = Mul(%x, %p)
      %y = Mul(%m, %half)""",
    # HF BERT: x * 0.5 * (1.0 + erf(x / sqrt 2)) with 1-element tensors, constants first
    "hf": """
      const %sqrt2: f32[1] = [1.4142135381698608]
      const %one: f32[1] = [1.0]
      const %half: f32[1] = [0.5]
      %h = Mul(%half, %x)
      %d = Div(%x, %sqrt2)
      %e = Erf(%d)
      %p = Add(%one, %e)
      %y = Mul(%h, %p)""",
    # x * (1 + erf(x * 0.7071)) / 2
    "reciprocal_and_halving": """
      const %r: f32[] = 0.7071067690849304
      const %one: f32[] = 1.0
      const %two: f32[] = 2.0
      %d = Mul(%r, %x)
      %e = Erf(%d)
      %p = Add(%one, %e)
      %m = Mul(%p, %x)
      %y = Div(%m, %two)""",
}

TANH_FORM = """
      const %c: f32[] = 0.044715
      const %k: f32[] = 0.7978845608028654
      const %three: f32[] = 3.0
      const %one: f32[] = 1.0
      const %half: f32[] = 0.5
      %cube = Pow(%x, %three)
      %t = Mul(%c, %cube)
      %i = Add(%x, %t)
      %j = Mul(%i, %k)
      %th = Tanh(%j)
      %p = Add(%one, %th)
      %h = Mul(%x, %half)
      %y = Mul(%h, %p)"""

TANH_FORM_CUBED_BY_MULS = """
      const %c: f32[] = 0.044715
      const %k: f32[] = 0.7978845608028654
      const %one: f32[] = 1.0
      const %half: f32[] = 0.5
      %sq = Mul(%x, %x)
      %cube = Mul(%sq, %x)
      %t = Mul(%cube, %c)
      %i = Add(%t, %x)
      %j = Mul(%k, %i)
      %th = Tanh(%j)
      %p = Add(%th, %one)
      %m = Mul(%p, %x)
      %y = Mul(%half, %m)"""


def _graph(body: str, dtype: str = "f32") -> str:
    return (f"graph g(%x: {dtype}[2, 8]) -> (%y: {dtype}[2, 8]) {{\n{body}\n}}"
            .replace("f32[", f"{dtype}[").replace("float32", "float16" if dtype == "f16"
                                                   else "float32"))


@pytest.mark.parametrize("form", sorted(ERF_FORMS))
def test_erf_forms_become_gelu(form):
    assert_pass(recognize_gelu, _graph(ERF_FORMS[form]), GELU, changed=1)
    check_numerics(recognize_gelu, _graph(ERF_FORMS[form]))


@pytest.mark.parametrize("body", [TANH_FORM, TANH_FORM_CUBED_BY_MULS], ids=["pow", "muls"])
def test_tanh_forms_become_gelu_tanh(body):
    assert_pass(recognize_gelu, _graph(body), GELU_TANH, changed=1)
    check_numerics(recognize_gelu, _graph(body))


def test_float16_constants_match_within_their_precision():
    text = _graph(ERF_FORMS["torch"], "f16").replace("1.4142135381698608", "1.4140625")
    check_numerics(recognize_gelu, text, rtol=2e-3, atol=2e-3)


def test_an_intermediate_read_elsewhere_keeps_the_pattern():
    body = ERF_FORMS["torch"] + "\n      %z = Neg(%e)"
    text = _graph(body).replace("-> (%y: f32[2, 8])", "-> (%y: f32[2, 8], %z: f32[2, 8])")
    assert_unchanged(recognize_gelu, text)


@pytest.mark.parametrize("old, new", [
    ("const %half: f32[] = 0.5", "const %half: f32[] = 0.6"),        # not GELU
    ("const %sqrt2: f32[] = 1.4142135381698608", "const %sqrt2: f32[] = 1.5"),
    ("%e = Erf(%d)", "%e = Tanh(%d)"),
])
def test_near_misses_stay(old, new):
    assert_unchanged(recognize_gelu, _graph(ERF_FORMS["torch"].replace(old, new)))


def test_a_constant_that_broadcasts_the_result_to_a_larger_shape_stays():
    body = ERF_FORMS["torch"].replace("const %half: f32[] = 0.5",
                                      "const %half: f32[3, 1, 1] = 0.5")
    text = _graph(body).replace("-> (%y: f32[2, 8])", "-> (%y: f32[3, 2, 8])")
    assert_unchanged(recognize_gelu, text)


def test_the_erf_of_another_value_is_not_gelu():
    text = """
        graph g(%x: f32[4], %z: f32[4]) -> (%y: f32[4]) {
          const %sqrt2: f32[] = 1.4142135381698608
          const %one: f32[] = 1.0
          const %half: f32[] = 0.5
          %d = Div(%z, %sqrt2)
          %e = Erf(%d)
          %p = Add(%e, %one)
          %m = Mul(%x, %p)
          %y = Mul(%m, %half)
        }"""
    assert_unchanged(recognize_gelu, text)


def test_constants_from_onnx_constant_nodes_and_initializers_match():
    """Exporters give the constants as Constant nodes (value_float, 1-element tensors) or as
    initializers; the importer makes both graph constants, and after folding the pattern is
    the same."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from ember.frontend.onnx import import_onnx
    from ember.passes.fold_constants import fold_constants

    nodes = [
        helper.make_node("Constant", [], ["sqrt2"], value_float=1.4142135),
        helper.make_node("Constant", [], ["one"],
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Constant", [], ["half64"],
                         value=numpy_helper.from_array(np.array(0.5, np.float64))),
        helper.make_node("Cast", ["half64"], ["half"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["p"]),
        helper.make_node("Mul", ["x", "p"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(
        nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(model)
    fold_constants(graph)
    rewritten = check_numerics(recognize_gelu, graph)
    assert [n.op for n in rewritten.nodes] == ["Gelu"]
