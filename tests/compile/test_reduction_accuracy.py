"""Compiled float reductions stay accurate at any length.

A float32 accumulator stops counting at 2**24 (16777216 + 1 == 16777216 in float32), so every
test here reduces more elements than that in one sum, where a float32 kernel is visibly wrong
(ReduceSum of 2**25 ones gave 2**24, a mean of 2**26 ones 0.25).  The compute definitions
accumulate float sums in float64 (``accumulator_dtype`` / ``accurate_sum`` in
``ember/ops/compute/reduce.py``); the oracle is numpy in float64, and results must be within a
few float32 ulps of it -- or exact, where the answer is a small integer or a power of two.

The models are small ONNX graphs compiled through ``ember.compile`` (every node must be a
compiled kernel: a numpy fallback would test numpy).  Inputs hold at most 2**26 float32 values
(256 MB), are 64-byte aligned (else the runtime copies them) and float64 oracles are computed
in chunks, so each test stays well under 1 GB.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

LONG = 2 ** 25  # elements per sum: twice as many as a float32 accumulator can count
CHUNK = 2 ** 22  # elements per chunk of the float64 oracles (32 MB as float64)
SAMPLE = 16  # every 16th element of a normalized row is compared with float64
EPSILON = 1e-5  # the normalizations' default epsilon
ULPS = 4  # "a few float32 ulps"
RNG_SEED = 20250101


# ----------------------------------------------------------------------------- helpers


def _model(nodes: Sequence[onnx.NodeProto], x_shape: Sequence[int], outputs: Sequence[str],
           x_type: int = TensorProto.FLOAT,
           constants: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model with one input ``x``, the ``nodes`` and ``constants`` as initializers (so that
    axes, scales, ... are known at compile time, as the kernels require)."""
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in (constants or {}).items()]
    graph = helper.make_graph(
        list(nodes), "reduction_accuracy", [helper.make_tensor_value_info("x", x_type, x_shape)],
        [helper.make_tensor_value_info(name, x_type, None) for name in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def _single(op: str, x_shape: Sequence[int], x_type: int = TensorProto.FLOAT,
            axes: Sequence[int] | None = None, **attrs: Any) -> onnx.ModelProto:
    """A model computing ``y = op(x[, axes])``."""
    inputs, constants = ["x"], {}
    if axes is not None:
        inputs.append("axes")
        constants["axes"] = np.array(axes, np.int64)
    return _model([helper.make_node(op, inputs, ["y"], **attrs)], x_shape, ["y"], x_type,
                  constants)


def _run(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    module = ember.compile(model)
    assert module.build.host_nodes == [], module.build.report()
    return module.run({"x": x})


def _aligned(shape: Sequence[int], dtype: Any, fill: float) -> np.ndarray:
    """A 64-byte aligned array filled with ``fill``: the runtime copies a misaligned input
    into an aligned buffer first, which for these sizes costs more than the kernels."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    offset = (-raw.ctypes.data) % 64
    array = raw[offset:offset + nbytes].view(dtype).reshape(shape)
    array.fill(fill)
    return array


def _chunks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """Corresponding flat chunks of equally sized arrays."""
    flat = [a.reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, CHUNK):
        yield tuple(a[start:start + CHUNK] for a in flat)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of ``want`` (``want`` in float64)."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def _check_ulps(got: np.ndarray, want: float | np.ndarray, what: str, ulps: float = ULPS,
                atol: float = 0.0) -> list[str]:
    """Why ``got`` (float32) is not within ``ulps`` float32 ulps of the float64 ``want`` (or
    ``atol``): one message, or none."""
    got = np.asarray(got)
    want = np.broadcast_to(np.asarray(want, np.float64), got.shape)
    if got.dtype != np.float32:
        return [f"{what}: dtype {got.dtype}"]
    off = _ulps(got, want)
    close = (off <= ulps) | (np.abs(got.astype(np.float64) - want) <= atol)
    if close.all():
        return []
    worst = int(np.argmax(np.where(close, 0.0, off).reshape(-1)))
    return [f"{what}: {int((~close).sum())} of {got.size} values off by more than {ulps} "
            f"ulps; e.g. {got.reshape(-1)[worst]!r} for float64 {want.reshape(-1)[worst]!r}"]


def _assert_all(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- inputs of ones


@pytest.fixture(scope="module")
def ones() -> np.ndarray:
    """2**25 float32 ones as [1, 1, 2**25] (128 MB).  Ones make the float64 answers exact
    and known, and a float32 accumulator, stopping at 2**24, wrong by a factor of two."""
    return _aligned((1, 1, LONG), np.float32, 1.0)


LN2 = math.log(2.0)

# op, attributes, the exact answer (rounded once to float32 by a correct kernel)
SUMS_OF_ONES = [
    ("ReduceSum", {}, float(LONG)),
    ("ReduceL1", {}, float(LONG)),
    ("ReduceSumSquare", {}, float(LONG)),
    ("ReduceL2", {}, math.sqrt(LONG)),
    ("ReduceLogSum", {}, 25 * LN2),
    ("ReduceLogSumExp", {}, 1.0 + 25 * LN2),
    ("GlobalLpPool", {"p": 2}, math.sqrt(LONG)),
    ("AveragePool", {"kernel_shape": [LONG]}, 1.0),
    ("LpPool", {"kernel_shape": [LONG], "p": 2}, math.sqrt(LONG)),
]


def test_sums_of_ones_count_past_two_to_the_24(ones):
    nodes = [helper.make_node(op, ["x"], [op], **attrs) for op, attrs, _ in SUMS_OF_ONES]
    got = _run(_model(nodes, ones.shape, [op for op, _, _ in SUMS_OF_ONES]), ones)
    # 0.5 ulp: the float32 nearest the answer
    _assert_all([p for op, _, answer in SUMS_OF_ONES for p in _check_ulps(got[op], answer, op,
                                                                          ulps=0.5)])


def test_means_of_two_to_the_26_ones():
    """ReduceMean and GlobalAveragePool over 8192 x 8192 ones (256 MB) are exactly 1."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"]),
             helper.make_node("GlobalAveragePool", ["x"], ["pool"])]
    x = _aligned((1, 1, 8192, 8192), np.float32, 1.0)
    got = _run(_model(nodes, x.shape, ["mean", "pool"]), x)
    assert got["mean"].reshape(-1).tolist() == [1.0]
    assert got["pool"].reshape(-1).tolist() == [1.0]


# Each normalization of the ones is followed by ReduceMax and ReduceMin, so that only scalars
# leave the model.  Centered ones normalize to exactly 0 when the mean is exactly 1.
# (LayerNormalization and Softmax are in the random test; GroupNormalization and LogSoftmax
# share their statistics code with InstanceNormalization and Softmax.)
NORMALIZED_ONES = [
    ("InstanceNormalization", ["scale", "bias"], {}, 0.0),
    ("RMSNormalization", ["scale"], {}, 1.0 / math.sqrt(1.0 + EPSILON)),
    ("LpNormalization", [], {"p": 2}, 1.0 / math.sqrt(LONG)),
]


def test_normalizations_of_ones(ones):
    nodes, outputs = [], []
    for k, (op, params, attrs, _) in enumerate(NORMALIZED_ONES):
        nodes += [helper.make_node(op, ["x", *params], [f"n{k}"], **attrs),
                  helper.make_node("ReduceMax", [f"n{k}"], [f"high{k}"], keepdims=0),
                  helper.make_node("ReduceMin", [f"n{k}"], [f"low{k}"], keepdims=0)]
        outputs += [f"high{k}", f"low{k}"]
    constants = {"scale": np.ones(1, np.float32), "bias": np.zeros(1, np.float32)}
    got = _run(_model(nodes, ones.shape, outputs, constants=constants), ones)
    _assert_all([p for k, (op, _, attrs, answer) in enumerate(NORMALIZED_ONES)
                 for name in (f"high{k}", f"low{k}")
                 for p in _check_ulps(got[name], answer, f"{op} {attrs} {name}")])


def test_float16_column_means_of_ones():
    """float16 terms compute in float32, whose accumulator would give 2**24 / (5 * 2**22) =
    0.8 here; a sum over rows also gets a float64 stage of its own (``sum_stage``)."""
    x = _aligned((5 * 2 ** 22, 4), np.float16, 1.0)  # 160 MB
    got = _run(_single("ReduceMean", x.shape, TensorProto.FLOAT16, axes=[0]), x)["y"]
    assert got.dtype == np.float16 and got.tolist() == [[1.0] * 4]


@pytest.mark.parametrize("dtype, onnx_type, shape, axis", [
    (np.float16, TensorProto.FLOAT16, [4096, 4], 0),  # numpy adds strided float16 in float16
    (ml_dtypes.bfloat16, TensorProto.BFLOAT16, [2, 512], 1),  # ... and bfloat16 in bfloat16
], ids=["float16-axis0", "bfloat16"])
def test_narrow_softmax_denominators_count_past_the_narrow_type(dtype, onnx_type, shape, axis):
    """Softmax of zeros is 1/n: a denominator added in the narrow type stops counting at 2048
    (float16) or 256 (bfloat16) and gives 1/2048 or 1/256."""
    got = _run(_single("Softmax", shape, onnx_type, axis=axis), np.zeros(shape, dtype))["y"]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), 1.0 / shape[axis])


# ----------------------------------------------------------------------------- random values


@pytest.fixture(scope="module")
def row() -> np.ndarray:
    """2**25 seeded standard-normal float32 values as one row (128 MB)."""
    values = _aligned((1, LONG), np.float32, 0.0)
    np.random.default_rng(RNG_SEED).standard_normal(dtype=np.float32, out=values)
    return values


def test_random_row_matches_float64(row):
    """Sums, a mean, a sum of squares, LayerNormalization (with its statistics) and Softmax
    over one row of 2**25 random values, against float64 numpy.  The statistics are compared
    whole, the normalized rows on a sample: every element of a row shares the statistics."""
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
        helper.make_node("ReduceSumSquare", ["x"], ["sum_square"], keepdims=0),
        helper.make_node("LayerNormalization", ["x", "scale"], ["ln", "ln_mean", "ln_inv_std"],
                         axis=-1, epsilon=EPSILON),
        helper.make_node("Softmax", ["x"], ["softmax"], axis=-1),
    ]
    outputs = ["sum", "mean", "sum_square", "ln", "ln_mean", "ln_inv_std", "softmax"]
    got = _run(_model(nodes, row.shape, outputs, constants={"scale": np.ones(1, np.float32)}),
               row)

    # float64 oracles, chunk by chunk (np.sum with a float64 dtype converts as it goes)
    total = float(np.sum(row, dtype=np.float64))
    mean = total / LONG
    squares = variance = denominator = 0.0
    peak = row.max()
    for (x,) in _chunks(row):
        wide = x.astype(np.float64)
        squares += float(np.dot(wide, wide))
        variance += float(np.sum(np.square(wide - mean)))
        # Every float32 softmax (numpy's, the ONNX reference's, ember's) subtracts the maximum
        # in float32, so the oracle starts from that difference; exp and sum in float64.
        denominator += float(np.sum(np.exp((x - peak).astype(np.float64))))
    inv_std = 1.0 / math.sqrt(variance / LONG + EPSILON)
    problems = (_check_ulps(got["sum"], total, "ReduceSum")
                + _check_ulps(got["mean"], mean, "ReduceMean")
                + _check_ulps(got["sum_square"], squares, "ReduceSumSquare")
                + _check_ulps(got["ln_mean"], mean, "LayerNormalization Mean")
                + _check_ulps(got["ln_inv_std"], inv_std, "LayerNormalization InvStdDev"))
    x = row.reshape(-1)[::SAMPLE]
    # float32 rounds x - mean once; near the mean, its rounding is an absolute error
    problems += _check_ulps(got["ln"].reshape(-1)[::SAMPLE],
                            (x.astype(np.float64) - mean) * inv_std, "LayerNormalization",
                            atol=ULPS * 2.0 ** -30)
    problems += _check_ulps(got["softmax"].reshape(-1)[::SAMPLE],
                            np.exp((x - peak).astype(np.float64)) / denominator, "Softmax")
    _assert_all(problems)
