"""MaxPool ignores NaN (as ``np.fmax``), where ONNX's oracles do; PyTorch's pooling keeps
propagating it.

The oracle is numpy's ``nanmax`` over each window (computed here from a sliding window view,
independent of ember's reference), checked against the ONNX reference evaluator and ONNX
Runtime where those skip NaN consistently: the reference's general path (stride 1, no
dilation; it fails on an all-NaN window) and ONNX Runtime's 1-D pool (which gives -FLT_MAX
for an all-NaN window).  Their other paths depend on where the NaN falls in the window
(``ember/ops/pool.py`` has the survey), so they are not an oracle there.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.interp import ReferenceExecutor
from ember.frontend.onnx import import_onnx

ort = pytest.importorskip("onnxruntime")

ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
             np.float16: TensorProto.FLOAT16}

CASES = [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
    dict(kernel_shape=[2, 2], dilations=[2, 2]),
    dict(kernel_shape=[3, 2], pads=[0, 1, 2, 0], ceil_mode=1, strides=[2, 2]),
    dict(kernel_shape=[3]),
    dict(kernel_shape=[2, 2, 2]),
]
SHAPES = {1: (2, 3, 19), 2: (2, 3, 9, 10), 3: (1, 2, 5, 4, 6)}


def _model(attrs: dict, shape: tuple[int, ...], dtype, outputs: int = 1):
    names = ["y", "indices"][:outputs]
    elem = ONNX_TYPE[dtype]
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], names, name="pool", **attrs)], "maxpool_nan",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, None)] +
        ([helper.make_tensor_value_info("indices", TensorProto.INT64, None)] if outputs > 1
         else []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _windows(x: np.ndarray, attrs: dict) -> np.ndarray:
    """Every window's values (padding and the ceil-mode overhang as NaN), last axis."""
    rank = x.ndim - 2
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    pads = list(attrs.get("pads", [0] * 2 * rank))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if attrs.get("ceil_mode"):  # room for the last, partial window
        for i in range(rank):
            span = x.shape[2 + i] + pads[i] + pads[i + rank] - extent[i]
            pads[i + rank] += (-span) % strides[i]
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] +
                    [(pads[i], pads[i + rank]) for i in range(rank)], constant_values=np.nan)
    view = sliding_window_view(padded, extent, axis=tuple(range(2, 2 + rank)))
    view = view[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) +
                tuple(slice(None, None, d) for d in dilations)]
    return view.reshape(view.shape[:2 + rank] + (-1,))


def _nanmax(x: np.ndarray, attrs: dict) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows: NaN, as wanted
        return np.nanmax(_windows(x, attrs), axis=-1).astype(x.dtype)


def _input(shape, dtype, seed: int, nan_share: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) < nan_share] = np.nan
    x[rng.random(shape) < 0.05] = -np.inf
    x[rng.random(shape) < 0.05] = np.inf
    return x


def _same(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(got, want)  # NaN equals NaN here


def _all_nan_window(x: np.ndarray, attrs: dict) -> np.ndarray:
    return np.isnan(_windows(x, attrs)).all(axis=-1)


@pytest.mark.parametrize("attrs", CASES, ids=lambda a: "-".join(f"{k}{v}" for k, v in a.items()))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=lambda t: t.__name__)
def test_maxpool_ignores_nan_compiled_and_in_the_reference(attrs, dtype):
    shape = SHAPES[len(attrs["kernel_shape"])]
    model = _model(attrs, shape, dtype)
    modules = [ember.compile(model, opt_level=level) for level in (0, 1)]
    reference = ReferenceExecutor(import_onnx(model))
    for seed in range(4):
        x = _input(shape, dtype, seed)
        want = _nanmax(x, attrs)
        for module in modules:
            _same(module(x), want)
        _same(reference.run({"x": x})["y"], want)


def test_the_oracles_agree_where_they_skip_nan():
    """The ONNX reference (stride 1, no dilation) and ONNX Runtime's 1-D pool skip NaN: the
    numpy oracle is theirs there.  Aside: windows that are all NaN (the reference fails, ONNX
    Runtime gives -FLT_MAX), and for ONNX Runtime windows of NaN and -inf (-FLT_MAX again,
    even with no NaN: it starts from the lowest finite value)."""
    for attrs, checked in [(dict(kernel_shape=[3, 3]), "reference"),
                           (dict(kernel_shape=[2, 2, 2]), "reference"),
                           (dict(kernel_shape=[3]), "onnxruntime"),
                           (dict(kernel_shape=[4], strides=[3]), "onnxruntime")]:
        shape = SHAPES[len(attrs["kernel_shape"])]
        model = _model(attrs, shape, np.float32)
        module = ember.compile(model)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        for seed in range(6):
            x = _input(shape, np.float32, 100 + seed, nan_share=0.2)
            defined = ~_all_nan_window(x, attrs)
            if checked == "onnxruntime":
                defined = (_windows(x, attrs) > -np.inf).any(axis=-1)
            if checked == "reference":
                if not defined.all():  # the reference fails on an all-NaN window
                    continue
                oracle = ReferenceEvaluator(model).run(None, {"x": x})[0]
            else:
                oracle = session.run(None, {"x": x})[0]
            got = module(x)
            _same(got[defined], oracle[defined])
            _same(got, _nanmax(x, attrs))


def test_indices_point_at_the_first_maximum_number():
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    shape = SHAPES[2]
    module = ember.compile(_model(attrs, shape, np.float32, outputs=2))
    x = _input(shape, np.float32, 7)
    values, indices = module(x)
    want = _nanmax(x, attrs)
    _same(values, want)
    flat = x.reshape(-1)
    numbers = ~np.isnan(want)
    _same(flat[indices[numbers]], want[numbers])  # the index holds the maximum
    # the first window position holding it, in row-major order (ONNX's Indices)
    windows = _windows(x, attrs)
    firsts = np.argmax(np.where(np.isnan(windows), -np.inf, windows) == want[..., None],
                       axis=-1)
    n, c, oh, ow = want.shape
    rows = np.arange(oh)[:, None] * 2 - 1 + firsts // 3
    cols = np.arange(ow)[None, :] * 2 - 1 + firsts % 3
    plane = (np.arange(n)[:, None, None, None] * c + np.arange(c)[None, :, None, None]) * \
        shape[2] * shape[3]
    _same(indices[numbers], (plane + rows * shape[3] + cols)[numbers])


def test_an_all_nan_window_is_nan_not_the_lowest_value():
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    x = np.full((1, 1, 4, 4), np.nan, np.float32)
    x[0, 0, 0, 0] = -np.inf      # a window of -inf and NaNs: -inf
    x[0, 0, 3, 3] = 5.0
    module = ember.compile(_model(attrs, x.shape, np.float32))
    _same(module(x), np.array([[[[-np.inf, np.nan], [np.nan, 5.0]]]], np.float32))
    _same(module(x), _nanmax(x, attrs))


def test_all_nan_border_windows_at_opt_level_2():
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    x = np.full((1, 1, 4, 4), np.nan, np.float32)
    x[0, 0, 3, 3] = 5.0
    _same(ember.compile(_model(attrs, x.shape, np.float32), opt_level=2)(x), _nanmax(x, attrs))


def test_pytorch_max_pool_still_propagates_nan_like_eager():
    torch = pytest.importorskip("torch")

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 3, 2, 1)

    x = _input((1, 2, 8, 8), np.float32, 3)
    with torch.no_grad():
        want = Pool()(torch.from_numpy(x)).numpy()
    assert np.isnan(want).any() and not np.array_equal(want, _nanmax(
        x, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])), equal_nan=True)
    _same(ember.compile(Pool(), (torch.from_numpy(x),))(x), want)


@pytest.mark.parametrize("attrs,separable", [
    (dict(kernel_shape=[3, 3]), True),
    (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), True),
    (dict(kernel_shape=[2, 2], dilations=[2, 2]), True),
    (dict(kernel_shape=[2, 2], strides=[3, 3]), False),   # rows no window reads
    (dict(kernel_shape=[3, 1]), False),                   # one axis of taps
])
def test_a_window_is_taken_one_axis_at_a_time(attrs, separable):
    """A pool over more than one axis of taps runs as one short window per axis (the last
    axis into a scratch at the input's height, then the other), which vectorizes along the
    output row; a maximum is the same in any grouping, so the NaN-ignoring result is the
    oracle's.  Pools striding past their window, or with one axis of taps, stay one nest."""
    shape = SHAPES[2]
    module = ember.compile(_model(attrs, shape, np.float32), opt_level=1)
    x = _input(shape, np.float32, 11)
    want = _nanmax(x, attrs)
    _same(module(x), want)
    scratch = [tuple(p.shape) for impl in module.build.kernels for p in impl.func.params
               if p.name.startswith("scratch")]
    # (padding made explicit at opt level 2 only: here the window tests its borders)
    assert scratch == ([shape[:3] + want.shape[3:]] if separable else []), scratch
