"""Activation functions: the Relu family, sigmoid-like and smooth activations, gated SwiGLU.

Float activations are evaluated in float32 (float64 for float64 inputs) and rounded once to
the input's type, so float16/bfloat16 results are as exact as their type allows.  The ops that
ONNX also defines on integers (Relu, PRelu, Shrink) keep integer results for integer inputs.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import dims_equal
from ember.ir.types import ValueType
from ember.ops.elementwise import (
    FLOAT_TENSOR,
    check_same_dtype,
    erf_of,
    in_compute_dtype,
    input_tensor_type,
    is_float,
    same_type_infer,
)
from ember.ops.registry import Attr, InferContext, op

float_infer = same_type_infer(is_float, FLOAT_TENSOR)


def sigmoid_of(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e**-x) without overflow for large |x|."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z))


def softplus_of(x: np.ndarray) -> np.ndarray:
    """log(1 + e**x) without overflow."""
    return np.logaddexp(0, x)


# ----------------------------------------------------------------------------- Relu family


@op("Relu", family="activation", infer=same_type_infer())
def relu(ctx, x):
    """max(0, x); integers stay integers."""
    return np.asarray(np.maximum(x, np.zeros((), x.dtype)))


@op("LeakyRelu", family="activation", infer=float_infer, attrs={"alpha": Attr.float(0.01)})
def leaky_relu(ctx, x, *, alpha):
    """x for x >= 0, alpha * x otherwise."""
    return in_compute_dtype(lambda a: np.where(a >= 0, a, alpha * a), x)


def _prelu_infer(ctx: InferContext) -> list[ValueType | None]:
    check_same_dtype(ctx, (0, 1))
    x, slope = input_tensor_type(ctx, 0), input_tensor_type(ctx, 1)
    if x is not None and slope is not None and x.shape is not None and slope.shape is not None:
        if len(slope.shape) > len(x.shape):
            raise ctx.error(f"slope {slope} has a higher rank than the input {x}")
        for s, d in zip(reversed(slope.shape), reversed(x.shape)):
            if s != 1 and dims_equal(s, d) is False:
                raise ctx.error(f"slope {slope} does not broadcast to the input {x}")
    return [x]


@op("PRelu", family="activation", infer=_prelu_infer)
def prelu(ctx, x, slope):
    """x for x >= 0, slope * x otherwise; slope broadcasts to x (unidirectionally)."""
    if x.dtype.kind in "iu":
        return np.where(x < 0, slope * x, x).astype(x.dtype)
    return in_compute_dtype(lambda a, s: np.where(a < 0, s * a, a), x, slope)


@op("ThresholdedRelu", family="activation", infer=float_infer,
    attrs={"alpha": Attr.float(1.0)})
def thresholded_relu(ctx, x, *, alpha):
    """x for x > alpha, 0 otherwise."""
    return in_compute_dtype(lambda a: np.where(a > alpha, a, 0), x)


@op("Elu", family="activation", infer=float_infer, attrs={"alpha": Attr.float(1.0)})
def elu(ctx, x, *, alpha):
    """x for x >= 0, alpha * (e**x - 1) otherwise."""
    return in_compute_dtype(lambda a: np.where(a >= 0, a, alpha * np.expm1(a)), x)


@op("Selu", family="activation", infer=float_infer,
    attrs={"alpha": Attr.float(1.67326319217681884765625),
           "gamma": Attr.float(1.05070102214813232421875)})
def selu(ctx, x, *, alpha, gamma):
    """gamma * x for x > 0, gamma * alpha * (e**x - 1) otherwise."""
    return in_compute_dtype(lambda a: gamma * np.where(a > 0, a, alpha * np.expm1(a)), x)


@op("Celu", family="activation", infer=float_infer, attrs={"alpha": Attr.float(1.0)})
def celu(ctx, x, *, alpha):
    """max(0, x) + min(0, alpha * (e**(x / alpha) - 1))."""
    if alpha == 0:
        raise ctx.error("attribute alpha must not be 0")
    return in_compute_dtype(
        lambda a: np.maximum(a, 0) + np.minimum(0, alpha * np.expm1(a / alpha)), x)


# ----------------------------------------------------------------------------- sigmoid-like


@op("Sigmoid", family="activation", infer=float_infer)
def sigmoid(ctx, x):
    """1 / (1 + e**-x)."""
    return in_compute_dtype(sigmoid_of, x)


@op("HardSigmoid", family="activation", infer=float_infer,
    attrs={"alpha": Attr.float(0.2), "beta": Attr.float(0.5)})
def hard_sigmoid(ctx, x, *, alpha, beta):
    """max(0, min(1, alpha * x + beta))."""
    return in_compute_dtype(lambda a: np.clip(alpha * a + beta, 0, 1), x)


@op("HardSwish", family="activation", infer=float_infer)
def hard_swish(ctx, x):
    """x * max(0, min(1, x / 6 + 1/2))."""
    return in_compute_dtype(lambda a: a * np.clip(a / 6 + 0.5, 0, 1), x)


@op("Swish", family="activation", infer=float_infer, attrs={"alpha": Attr.float(1.0)})
def swish(ctx, x, *, alpha):
    """x * sigmoid(alpha * x)."""
    return in_compute_dtype(lambda a: a * sigmoid_of(alpha * a), x)


@op("Softplus", family="activation", infer=float_infer)
def softplus(ctx, x):
    """log(1 + e**x)."""
    return in_compute_dtype(softplus_of, x)


@op("Softsign", family="activation", infer=float_infer)
def softsign(ctx, x):
    """x / (1 + |x|)."""
    return in_compute_dtype(lambda a: a / (1 + np.abs(a)), x)


@op("Mish", family="activation", infer=float_infer)
def mish(ctx, x):
    """x * tanh(softplus(x))."""
    return in_compute_dtype(lambda a: a * np.tanh(softplus_of(a)), x)


_GELU_APPROXIMATIONS = ("none", "tanh")


def _gelu_of(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + erf_of(x / np.sqrt(2)))


@op("Gelu", family="activation", infer=float_infer, attrs={"approximate": Attr.string("none")})
def gelu(ctx, x, *, approximate):
    """0.5 * x * (1 + erf(x / sqrt(2))), or its tanh approximation if approximate='tanh'."""
    if approximate not in _GELU_APPROXIMATIONS:
        raise ctx.error(f"attribute approximate must be one of {_GELU_APPROXIMATIONS}, "
                        f"got {approximate!r}")
    return in_compute_dtype(lambda a: _gelu_of(a, approximate), x)


# ----------------------------------------------------------------------------- others


@op("Shrink", family="activation", infer=same_type_infer(),
    attrs={"bias": Attr.float(0.0), "lambd": Attr.float(0.5)})
def shrink(ctx, x, *, bias, lambd):
    """x + bias for x < -lambd, x - bias for x > lambd, 0 otherwise."""
    wide = x.astype(np.float64)
    result = np.where(wide < -lambd, wide + bias, np.where(wide > lambd, wide - bias, 0))
    if x.dtype.kind in "iu":
        result = np.trunc(result)
    return result.astype(x.dtype)


def _swiglu_infer(ctx: InferContext) -> list[ValueType | None]:
    dtype = check_same_dtype(ctx, (0, 1))
    if dtype is not None and not dtype.is_float:
        raise ctx.error(f"inputs must be float tensors, got {dtype}")
    gate, value = input_tensor_type(ctx, 0), input_tensor_type(ctx, 1)
    if gate is None or value is None:
        return [gate or value]
    if gate.shape is None or value.shape is None:
        return [gate.with_shape(gate.shape if gate.shape is not None else value.shape)]
    if len(gate.shape) != len(value.shape) or \
            any(dims_equal(a, b) is False for a, b in zip(gate.shape, value.shape)):
        raise ctx.error(f"gate A {gate} and value B {value} must have the same shape "
                        f"(SwiGLU does not broadcast)")
    return [gate.with_shape(b if a is None else a for a, b in zip(gate.shape, value.shape))]


@op("SwiGLU", family="activation", infer=_swiglu_infer, attrs={"alpha": Attr.float(1.0)})
def swiglu(ctx, a, b, *, alpha):
    """Swish(A) * B = A * sigmoid(alpha * A) * B, for A and B of the same shape."""
    if a.shape != b.shape:
        raise ctx.error(f"inputs A {list(a.shape)} and B {list(b.shape)} must have the same "
                        f"shape (SwiGLU does not broadcast)")
    return in_compute_dtype(lambda g, v: g * sigmoid_of(alpha * g) * v, a, b)
