"""Algebraic simplification (ember/passes/simplify.py): no-op nodes go, pairs compose, and
nothing that changes a value, a type or a shape is touched."""

from __future__ import annotations

import pytest

from ember.core.dtypes import DType
from ember.passes.simplify import lossless_cast, simplify
from ember.passes.testing import assert_pass, assert_unchanged
from pass_helpers import check_numerics


def test_identity_and_inference_dropout_go():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %a = Identity(%x)
          %b = Dropout(%a)
          %y = Relu(%b)
        }""", """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %y = Relu(%x)
        }""", changed=2)


def test_dropout_with_a_constant_false_training_mode_goes_but_not_a_runtime_one():
    assert_pass(simplify, """
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          const %r: f32[] = 0.5
          const %mode: bool[] = False
          %d = Dropout(%x, %r, %mode)
          %y = Neg(%d)
        }""", """
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          %y = Neg(%x)
        }""")
    assert_unchanged(simplify, """
        graph g(%x: f32[4], %mode: bool[]) -> (%y: f32[4]) {
          const %r: f32[] = 0.0
          %d = Dropout(%x, %r, %mode)
          %y = Neg(%d)
        }""")


def test_dropout_whose_mask_is_read_stays():
    assert_unchanged(simplify, """
        graph g(%x: f32[4]) -> (%y: f32[4], %m: bool[4]) {
          %y, %m = Dropout(%x)
        }""")


def test_a_removed_node_that_produced_a_graph_output_passes_the_name_on():
    assert_pass(simplify, """
        graph g(%x: f32[3]) -> (%y: f32[3]) {
          %r = Relu(%x)
          %y = Identity(%r)
        }""", """
        graph g(%x: f32[3]) -> (%y: f32[3]) {
          %y = Relu(%x)
        }""")


def test_an_identity_from_an_input_to_an_output_stays():
    assert_unchanged(simplify, """
        graph g(%x: f32[3]) -> (%y: f32[3]) {
          %y = Identity(%x)
        }""")


def test_casts_to_the_same_type_go_and_lossless_double_casts_merge():
    assert_pass(simplify, """
        graph g(%x: f16[4]) -> (%y: f64[4], %z: f16[4]) {
          %a = Cast(%x) {to=1}
          %y = Cast(%a) {to=11}
          %b = Cast(%x) {to=10}
          %z = Neg(%b)
        }""", """
        graph g(%x: f16[4]) -> (%y: f64[4], %z: f16[4]) {
          %y = Cast(%x) {to=11}
          %z = Neg(%x)
        }""")


def test_a_lossy_double_cast_stays():
    # f32 -> f16 -> f32 rounds to half precision: not the identity.
    text = """
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          %a = Cast(%x) {to=10}
          %y = Cast(%a) {to=1}
        }"""
    assert_unchanged(simplify, text)


@pytest.mark.parametrize("source, middle, lossless", [
    (DType.FLOAT16, DType.FLOAT32, True), (DType.FLOAT32, DType.FLOAT16, False),
    (DType.BFLOAT16, DType.FLOAT16, False), (DType.INT8, DType.FLOAT16, True),
    (DType.INT16, DType.FLOAT16, False), (DType.INT32, DType.FLOAT64, True),
    (DType.INT64, DType.FLOAT64, False), (DType.UINT8, DType.INT16, True),
    (DType.INT8, DType.UINT16, False), (DType.BOOL, DType.INT8, True),
    (DType.FLOAT32, DType.INT32, False), (DType.FLOAT8E4M3FN, DType.FLOAT16, True),
    (DType.FLOAT16, DType.FLOAT8E8M0, False),
])
def test_lossless_cast(source, middle, lossless):
    assert lossless_cast(source, middle) is lossless


def test_transposes_compose_and_identities_go():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3, 4, 5]) -> (%y: f32[2, 4, 3, 5], %z: f32[2, 3, 4, 5]) {
          %a = Transpose(%x) {perm=[0, 2, 3, 1]}
          %y = Transpose(%a) {perm=[0, 1, 3, 2]}
          %b = Transpose(%x) {perm=[1, 0, 2, 3]}
          %c = Transpose(%b) {perm=[1, 0, 2, 3]}
          %z = Neg(%c)
        }""", """
        graph g(%x: f32[2, 3, 4, 5]) -> (%y: f32[2, 4, 3, 5], %z: f32[2, 3, 4, 5]) {
          %y = Transpose(%x) {perm=[0, 2, 1, 3]}
          %z = Neg(%x)
        }""")


def test_reshape_chains_become_one_reshape_or_none():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3, 4]) -> (%y: f32[6, 4], %z: f32[2, 3, 4]) {
          const %s1: i64[2] = [2, 12]
          const %s2: i64[2] = [-1, 4]
          const %axes: i64[1] = [0]
          %a = Reshape(%x, %s1)
          %y = Reshape(%a, %s2)
          %b = Unsqueeze(%x, %axes)
          %c = Squeeze(%b, %axes)
          %z = Neg(%c)
        }""", """
        graph g(%x: f32[2, 3, 4]) -> (%y: f32[6, 4], %z: f32[2, 3, 4]) {
          const %s6: i64[2] = [6, 4]
          %y = Reshape(%x, %s6)
          %z = Neg(%x)
        }""")


def test_a_reshape_to_the_same_shape_goes_even_with_symbolic_dims():
    assert_pass(simplify, """
        graph g(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %s: i64[2] = [0, 4]
          %a = Reshape(%x, %s)
          %y = Relu(%a)
        }""", """
        graph g(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          %y = Relu(%x)
        }""")


def test_zero_pads_whole_slices_and_same_shape_expands_go():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          const %pads: i64[4] = [0, 0, 0, 0]
          const %starts: i64[2] = [0, 0]
          const %ends: i64[2] = [9223372036854775807, 3]
          const %shape: i64[2] = [1, 3]
          %a = Pad(%x, %pads) {mode='reflect'}
          %b = Slice(%a, %starts, %ends)
          %c = Expand(%b, %shape)
          %y = Relu(%c)
        }""", """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %y = Relu(%x)
        }""")


def test_pads_slices_and_expands_that_change_the_tensor_stay():
    assert_unchanged(simplify, """
        graph g(%x: f32[2, 3]) -> (%a: f32[2, 5], %b: f32[2, 3], %c: f32[4, 2, 3]) {
          const %pads: i64[4] = [0, 1, 0, 1]
          const %starts: i64[1] = [-1]
          const %ends: i64[1] = [-9223372036854775807]
          const %axes: i64[1] = [1]
          const %steps: i64[1] = [-1]
          const %shape: i64[3] = [4, 1, 1]
          %a = Pad(%x, %pads)
          %b = Slice(%x, %starts, %ends, %axes, %steps)
          %c = Expand(%x, %shape)
        }""")


def test_neutral_operands_go_on_either_side():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3], %i: i32[3]) -> (%y: f32[2, 3], %z: i32[3]) {
          const %one: f32[] = 1.0
          const %zero: f32[1] = [0.0]
          const %ones: f32[2, 3] = 1.0
          const %izero: i32[] = 0
          %a = Mul(%one, %x)
          %b = Add(%a, %zero)
          %c = Sub(%b, %zero)
          %d = Div(%c, %ones)
          %e = Pow(%d, %one)
          %y = Relu(%e)
          %z = Add(%izero, %i)
        }""", """
        graph g(%x: f32[2, 3], %i: i32[3]) -> (%y: f32[2, 3], %z: i32[3]) {
          const %izero: i32[] = 0
          %y = Relu(%x)
          %z = Add(%izero, %i)
        }""", changed=5)


def test_neutral_operands_that_broadcast_or_sit_on_the_wrong_side_stay():
    assert_unchanged(simplify, """
        graph g(%x: f32[3]) -> (%a: f32[2, 3], %b: f32[3], %c: f32[3], %d: f32[3]) {
          const %ones: f32[2, 3] = 1.0
          const %zero: f32[] = 0.0
          const %one: f32[] = 1.0
          const %half: f32[] = 0.5
          %a = Mul(%x, %ones)
          %b = Sub(%zero, %x)
          %c = Div(%one, %x)
          %d = Mul(%x, %half)
        }""")


def test_a_single_input_concat_goes():
    assert_pass(simplify, """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %a = Concat(%x) {axis=0}
          %y = Relu(%a)
        }""", """
        graph g(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %y = Relu(%x)
        }""")


def test_simplified_graphs_compute_the_same_values():
    check_numerics(simplify, """
        graph g(%x: f32[2, 3, 4], %h: f16[3, 4]) -> (%y: f32[6, 4], %z: f32[3, 2, 4],
                                                    %w: f64[3, 4]) {
          const %s1: i64[2] = [2, 12]
          const %s2: i64[2] = [-1, 4]
          const %one: f32[1] = [1.0]
          const %pads: i64[6] = [0, 0, 0, 0, 0, 0]
          %a = Reshape(%x, %s1)
          %b = Mul(%a, %one)
          %y = Reshape(%b, %s2)
          %t = Transpose(%x) {perm=[2, 0, 1]}
          %u = Transpose(%t) {perm=[2, 1, 0]}
          %p = Pad(%u, %pads)
          %z = Identity(%p)
          %c = Cast(%h) {to=1}
          %w = Cast(%c) {to=11}
        }""")


def test_dropout_whose_mask_only_dead_nodes_read_goes():
    # Older opsets' Dropout masks reach the graph through a Cast that nothing reads.
    assert_pass(simplify, """
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          %d, %m = Dropout(%x)
          %unused = Cast(%m) {to=1}
          %y = Neg(%d)
        }""", """
        graph g(%x: f32[4]) -> (%y: f32[4]) {
          %y = Neg(%x)
        }""")
