"""Facts about ops that passes read from the OpDef (ember/ops/registry.py) instead of keeping
op-name tables of their own: ``commutative`` (CSE, the pattern matcher) and ``random`` (CSE).

The declared sets are pinned, and checked against the references: swapping the inputs of every
commutative op gives the same bits, special values included; Max and Min, which are left out
on purpose, do not (a tie returns the second operand)."""

from __future__ import annotations

import numpy as np
import pytest

from ember.ops.registry import all_ops, get_op, op
from op_helpers import run_node

COMMUTATIVE = {"Add", "Mul", "And", "Or", "Xor", "Equal", "BitwiseAnd", "BitwiseOr",
               "BitwiseXor", "Sum", "Mean"}


def test_the_commutative_ops_are_the_expected_ones():
    declared = {name for name, opdef in all_ops().items() if opdef.commutative}
    assert declared == COMMUTATIVE
    for name in ("Sub", "Div", "Pow", "Mod", "MatMul", "Less", "Greater", "Max", "Min",
                 "PRelu", "Where", "Concat"):
        assert not get_op(name).commutative, name


def test_the_random_ops_are_the_expected_ones_and_every_op_with_a_seed_is_one():
    ops = all_ops()
    assert {name for name, opdef in ops.items() if opdef.random} == {"Dropout"}
    seeded = {name for name, opdef in ops.items() if "seed" in opdef.attrs}
    assert seeded <= {name for name, opdef in ops.items() if opdef.random}


def _floats(dtype) -> tuple[np.ndarray, np.ndarray]:
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.25, 3.0e-39, 1.0e30, -1.0e30]
    a = np.array(special * 2, dtype=dtype).reshape(4, 5)
    b = np.array([-0.0, 0.0, np.inf, np.nan, 2.0], dtype=dtype)  # broadcast along rows
    return a, b


def _samples(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    if name in ("And", "Or", "Xor"):
        return [(rng.random((4, 5)) < 0.5, rng.random(5) < 0.5)]
    ints = (rng.integers(-100, 100, (4, 5)).astype(np.int32),
            rng.integers(-100, 100, 5).astype(np.int32))
    if name.startswith("Bitwise"):
        return [ints]
    if name == "Mean":
        return [_floats(np.float32), _floats(np.float16)]
    return [_floats(np.float32), _floats(np.float16), ints]


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype.kind != "f":
        return bool(np.array_equal(x, y))
    return bool(np.array_equal(x, y, equal_nan=True) and
                np.array_equal(np.signbit(x), np.signbit(y)))


@pytest.mark.parametrize("name", sorted(COMMUTATIVE))
def test_swapping_the_inputs_of_a_commutative_op_gives_the_same_bits(name):
    for a, b in _samples(name):
        assert _same_bits(run_node(name, a, b), run_node(name, b, a)), (name, a.dtype)


@pytest.mark.parametrize("name", ["Max", "Min"])
def test_max_and_min_are_not_commutative_in_the_sign_of_zero(name):
    neg, pos = np.array([-0.0], np.float32), np.array([0.0], np.float32)
    first, second = run_node(name, neg, pos), run_node(name, pos, neg)
    assert first == second  # equal as numbers ...
    assert np.signbit(first) != np.signbit(second)  # ... but not as values


def test_only_an_op_of_two_inputs_can_be_declared_commutative():
    with pytest.raises(ValueError, match="commutative"):
        op("NotARealOp", family="elementwise", infer=lambda ctx: [None],
           commutative=True)(lambda ctx, a, b, c: a)
    assert get_op("NotARealOp") is None
