"""ember's vectorizable float32 exp, tanh, erf and sigmoid (``codegen/c_fast_math.py``):
their error in ulp against a float64 reference over 2^20 points per function, IEEE special
values, and that compiled kernels no longer call libm for them (inline, branch-free code)."""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember

RNG = np.random.default_rng(11)
# max error in ulp each function must keep (the bounds c_fast_math.py documents)
BOUNDS = {"Exp": 1.0, "Tanh": 2.0, "Erf": 3.0, "Sigmoid": 3.0}
REFERENCE = {
    "Exp": np.exp,
    "Tanh": np.tanh,
    "Erf": np.vectorize(math.erf, otypes=[np.float64]),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}
EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-45, 0.625, -0.625, 1.0, -1.0, 3.925, -3.925,
                  9.0, -9.0, 88.72, 88.7228, 88.73, -87.33, -103.9, -104.5, 500.0, -500.0,
                  np.inf, -np.inf], dtype=np.float32)


def _points(name: str) -> np.ndarray:
    span = {"Exp": (-104.0, 89.0), "Tanh": (-10.0, 10.0), "Erf": (-5.0, 5.0),
            "Sigmoid": (-104.0, 104.0)}[name]
    uniform = RNG.uniform(*span, size=1 << 19)
    magnitudes = np.exp(RNG.uniform(math.log(1e-8), math.log(abs(span[1])), size=1 << 19))
    signed = magnitudes * RNG.choice([-1.0, 1.0], size=magnitudes.size)
    return np.concatenate([uniform, signed, EDGES]).astype(np.float32)


def _model(op: str, n: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ulp_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at ``want``."""
    with np.errstate(over="ignore"):
        finite = np.isfinite(want.astype(np.float32))  # overflow: the isinf check covers it
    spacing = np.spacing(np.abs(want[finite]).astype(np.float32)).astype(np.float64)
    return np.abs(got[finite].astype(np.float64) - want[finite]) / spacing


@pytest.mark.parametrize("op", sorted(BOUNDS))
def test_error_in_ulp_is_within_the_documented_bound(op):
    x = _points(op)
    module = ember.compile(_model(op, x.size))
    got = module(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = REFERENCE[op](x.astype(np.float64))
    errors = _ulp_errors(got, want)
    with np.errstate(over="ignore"):
        finite = np.isfinite(want.astype(np.float32))
    assert errors.max() <= BOUNDS[op], (op, float(errors.max()),
                                        float(x[finite][errors.argmax()]))
    # what the reference rounds to an infinity or zero, the kernel does too
    with np.errstate(over="ignore"):
        assert np.array_equal(np.isinf(got), np.isinf(want.astype(np.float32)))


@pytest.mark.parametrize("op", sorted(BOUNDS))
def test_special_values(op):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    got = ember.compile(_model(op, x.size))(x)
    assert np.isnan(got[0])
    with np.errstate(over="ignore"):
        want = REFERENCE[op](x[1:].astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got[1:], want)
    assert np.signbit(got[4]) == np.signbit(want[3])  # -0 stays -0 where it should


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_kernels_do_not_call_libm_for_these_functions():
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("Erf", ["s"], ["e"]), helper.make_node("Tanh", ["e"], ["t"]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = ember.compile(model)
    imported = subprocess.run(["nm", "-D", "--undefined-only", str(module.build.library)],
                              capture_output=True, text=True, check=True).stdout.split()
    assert not {"expf", "erff", "tanhf"} & set(imported), imported
