"""Normalizations: softmax and its relatives, batch/instance/layer/group/RMS normalization,
LRN, LpNormalization, MeanVarianceNormalization, and Dropout (an identity at inference).

Softmax, LogSoftmax and Hardmax work along one axis (opset 13 semantics; the frontend
rewrites the older "coerce to 2-D" versions) and compute in the input's precision, as ONNX's
own function definitions do.  The other normalizations compute their statistics in float32
for half-precision inputs, or in the ``stash_type`` precision for the ops that have one, and
cast the result back to the input's dtype.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ember.core.dims import Dim, dims_equal
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.reduce import normalize_axes, widened
from ember.ops.registry import REQUIRED, Attr, InferContext, PatternKind, op
from ember.ops.shape_infer import broadcast_shapes, normalize_axis, tensor_input

# ----------------------------------------------------------------------------- helpers


def _standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x - mean) / sqrt(var + epsilon) over ``axes``, with the mean and 1/sqrt(var + eps)."""
    mean = np.mean(x, axis=axes, keepdims=True)
    deviation = x - mean
    variance = np.mean(deviation * deviation, axis=axes, keepdims=True)
    inv_std = np.reciprocal(np.sqrt(variance + np.asarray(epsilon, dtype=x.dtype)))
    return deviation * inv_std, mean, inv_std


def _stash_dtype(ctx, stash_type: int) -> np.dtype:
    """The numpy dtype named by a ``stash_type`` attribute (an ONNX float type code)."""
    try:
        dtype = DType.from_onnx(stash_type)
    except EmberError:
        dtype = None
    if dtype is None or not dtype.is_float:
        raise ctx.error(f"stash_type {stash_type} is not an ONNX floating-point type code")
    return dtype.numpy


def _check_rank(ctx, x: TensorType, minimum: int, what: str) -> None:
    if x.shape is not None and len(x.shape) < minimum:
        raise ctx.error(f"{what} must have rank >= {minimum}, got {x}")


def _check_per_channel(ctx, names: Sequence[str], first_input: int, channels: Dim) -> None:
    """Inputs ``first_input``... (named ``names``) must be 1-D tensors of ``channels`` values."""
    for offset, name in enumerate(names):
        index = first_input + offset
        if not ctx.has_input(index):
            continue
        t = tensor_input(ctx, index)
        if t.shape is None:
            continue
        if len(t.shape) != 1 or dims_equal(t.shape[0], channels) is False:
            raise ctx.error(f"{name} must have shape [{channels}] (one value per channel), "
                            f"got {t}")


def _check_sizes(ctx, channels: int, **params: np.ndarray | None) -> None:
    """Run-time version of :func:`_check_per_channel`."""
    for name, value in params.items():
        if value is not None and value.size != channels:
            raise ctx.error(f"{name} has {value.size} values, the input has {channels} channels")


def _check_broadcastable(ctx, target: TensorType, index: int, name: str) -> None:
    """Input ``index`` must broadcast to ``target``'s shape without changing it."""
    if not ctx.has_input(index):
        return
    t = tensor_input(ctx, index)
    if target.shape is None or t.shape is None:
        return
    try:
        result = broadcast_shapes([target.shape, t.shape])
    except ShapeError:
        result = None
    if result is None or len(result) != len(target.shape) or any(
            dims_equal(a, b) is False for a, b in zip(result, target.shape)):
        raise ctx.error(f"{name} {t} does not broadcast to the input {target}")


def _channel_view(param: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast against an (N, C, D1, ...) tensor."""
    return param.reshape((-1,) + (1,) * max(rank - 2, 0))


# ----------------------------------------------------------------------------- softmax family

_AXIS_LAST = {"axis": Attr.int(-1)}


def _infer_along_axis(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    if x.shape is not None:
        normalize_axis(ctx.attrs["axis"], len(x.shape), ctx)
    return [x]


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    """x minus its maximum along ``axis``, so that exp() cannot overflow."""
    return x - np.max(x, axis=axis, keepdims=True)


def log_softmax_values(x: np.ndarray, axis: int) -> np.ndarray:
    """log(softmax(x)) along ``axis``, in x's precision."""
    if x.size == 0:
        return x.copy()
    shifted = _shifted(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@op("Softmax", family="norm", infer=_infer_along_axis, attrs=_AXIS_LAST)
def softmax(ctx, x, *, axis):
    """exp(x) / sum(exp(x)) along ``axis``."""
    axis = normalize_axis(axis, x.ndim, ctx)
    if x.size == 0:
        return x.copy()
    exp = np.exp(_shifted(x, axis))
    return (exp / np.sum(exp, axis=axis, keepdims=True)).astype(x.dtype, copy=False)


@op("LogSoftmax", family="norm", infer=_infer_along_axis, attrs=_AXIS_LAST)
def log_softmax(ctx, x, *, axis):
    """log(softmax(x)) along ``axis``."""
    axis = normalize_axis(axis, x.ndim, ctx)
    return log_softmax_values(x, axis).astype(x.dtype, copy=False)


@op("Hardmax", family="norm", infer=_infer_along_axis, attrs=_AXIS_LAST)
def hardmax(ctx, x, *, axis):
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    axis = normalize_axis(axis, x.ndim, ctx)
    result = np.zeros_like(x)
    if x.size:
        first = np.expand_dims(np.argmax(widened(x), axis=axis), axis)
        np.put_along_axis(result, first, 1, axis=axis)
    return result


# ----------------------------------------------------------------------------- BatchNormalization


def _infer_batch_norm(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _check_rank(ctx, x, 1, "X")
    channels = None if x.shape is None else (x.shape[1] if len(x.shape) > 1 else 1)
    _check_per_channel(ctx, ("scale", "B", "input_mean", "input_var"), 1, channels)
    extra_outputs = [o for o in ctx.node.outputs[1:] if o]
    if extra_outputs and not ctx.attrs["training_mode"]:
        raise ctx.error("running_mean/running_var outputs exist only with training_mode=1")
    stats = [tensor_input(ctx, i).with_shape((channels,)) for i in (3, 4)]
    return [x, *stats]


@op("BatchNormalization", family="norm", infer=_infer_batch_norm, outputs=(1, 3),
    attrs={"epsilon": Attr.float(1e-5), "momentum": Attr.float(0.9),
           "training_mode": Attr.int(0)},
    pattern=PatternKind.BROADCAST)  # inference: a per-channel scale and shift
def batch_normalization(ctx, x, scale, b, input_mean, input_var, *, epsilon, momentum,
                        training_mode):
    """Per-channel (x - mean) / sqrt(var + epsilon) * scale + B; batch statistics in training."""
    channels = x.shape[1] if x.ndim > 1 else 1
    _check_sizes(ctx, channels, scale=scale, B=b, input_mean=input_mean, input_var=input_var)
    work = np.result_type(*(widened(v).dtype for v in (x, scale, b, input_mean, input_var)))
    data = x.astype(work)
    view = [_channel_view(p.astype(work), x.ndim) for p in (scale, b, input_mean, input_var)]
    scale_v, bias_v, mean_v, var_v = view
    if not training_mode:
        normalized = (data - mean_v) / np.sqrt(var_v + np.asarray(epsilon, dtype=work))
        return (normalized * scale_v + bias_v).astype(x.dtype, copy=False)
    axes = tuple(i for i in range(x.ndim) if i != 1)
    normalized, batch_mean, inv_std = _standardize(data, axes, epsilon)
    y = (normalized * scale_v + bias_v).astype(x.dtype, copy=False)
    batch_mean = batch_mean.reshape(-1)
    batch_var = np.var(data, axis=axes)  # population variance
    running_mean = input_mean.astype(work) * momentum + batch_mean * (1 - momentum)
    running_var = input_var.astype(work) * momentum + batch_var * (1 - momentum)
    return (y, running_mean.astype(input_mean.dtype, copy=False),
            running_var.astype(input_var.dtype, copy=False))


# ------------------------------------------------------------------------ InstanceNormalization


def _infer_instance_norm(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _check_rank(ctx, x, 2, "input")
    channels = None if x.shape is None else x.shape[1]
    _check_per_channel(ctx, ("scale", "B"), 1, channels)
    return [x]


@op("InstanceNormalization", family="norm", infer=_infer_instance_norm,
    attrs={"epsilon": Attr.float(1e-5)})
def instance_normalization(ctx, x, scale, b, *, epsilon):
    """Normalize each (instance, channel) over its spatial dims, then scale and shift."""
    if x.ndim < 2:
        raise ctx.error(f"input must have rank >= 2, got shape {x.shape}")
    _check_sizes(ctx, x.shape[1], scale=scale, B=b)
    work = widened(x)
    normalized, _, _ = _standardize(work, tuple(range(2, x.ndim)), epsilon)
    y = normalized * _channel_view(scale, x.ndim) + _channel_view(b, x.ndim)
    return y.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- Layer, RMS, Group

_STASH_ATTRS = {"epsilon": Attr.float(1e-5), "stash_type": Attr.int(1)}


def _infer_layer_norm(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    stash = DType.from_numpy(_stash_dtype(ctx, ctx.attrs["stash_type"]))
    _check_broadcastable(ctx, x, 1, "Scale")
    _check_broadcastable(ctx, x, 2, "B")
    if x.shape is None:
        return [x, TensorType(stash, None), TensorType(stash, None)]
    axis = normalize_axis(ctx.attrs["axis"], len(x.shape), ctx)
    stats = TensorType(stash, x.shape[:axis] + (1,) * (len(x.shape) - axis))
    return [x, stats, stats]


@op("LayerNormalization", family="norm", infer=_infer_layer_norm, outputs=(1, 3),
    attrs={"axis": Attr.int(-1), **_STASH_ATTRS})
def layer_normalization(ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    """Normalize over dims [axis, rank) in stash_type precision, then * Scale + B."""
    stash = _stash_dtype(ctx, stash_type)
    axis = normalize_axis(axis, x.ndim, ctx)
    normalized, mean, inv_std = _standardize(x.astype(stash), tuple(range(axis, x.ndim)),
                                             epsilon)
    y = normalized.astype(x.dtype) * scale
    if b is not None:
        y = y + b
    return y.astype(x.dtype, copy=False), mean, inv_std


def _infer_rms_norm(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    scale = tensor_input(ctx, 1)
    _stash_dtype(ctx, ctx.attrs["stash_type"])
    _check_broadcastable(ctx, x, 1, "scale")
    if x.shape is not None:
        normalize_axis(ctx.attrs["axis"], len(x.shape), ctx)
    return [x.with_dtype(scale.dtype)]


@op("RMSNormalization", family="norm", infer=_infer_rms_norm,
    attrs={"axis": Attr.int(-1), **_STASH_ATTRS})
def rms_normalization(ctx, x, scale, *, axis, epsilon, stash_type):
    """x / sqrt(mean(x**2 over dims [axis, rank)) + epsilon) * scale."""
    stash = _stash_dtype(ctx, stash_type)
    axis = normalize_axis(axis, x.ndim, ctx)
    work = x.astype(stash)
    mean_square = np.mean(work * work, axis=tuple(range(axis, x.ndim)), keepdims=True)
    normalized = work / np.sqrt(mean_square + np.asarray(epsilon, dtype=stash))
    return (normalized.astype(x.dtype) * scale).astype(scale.dtype, copy=False)


def _infer_group_norm(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _stash_dtype(ctx, ctx.attrs["stash_type"])
    _check_rank(ctx, x, 2, "X")
    channels = None if x.shape is None else x.shape[1]
    groups = ctx.attrs["num_groups"]
    if groups <= 0:
        raise ctx.error(f"num_groups must be positive, got {groups}")
    if isinstance(channels, int) and channels % groups:
        raise ctx.error(f"{channels} channels cannot be split into {groups} groups")
    _check_per_channel(ctx, ("scale", "bias"), 1, channels)
    return [x]


@op("GroupNormalization", family="norm", infer=_infer_group_norm,
    attrs={"num_groups": Attr.int(REQUIRED), **_STASH_ATTRS})
def group_normalization(ctx, x, scale, bias, *, num_groups, epsilon, stash_type):
    """Normalize each group of channels of each instance, then per-channel scale and shift."""
    stash = _stash_dtype(ctx, stash_type)
    if x.ndim < 2:
        raise ctx.error(f"X must have rank >= 2, got shape {x.shape}")
    batch, channels = x.shape[:2]
    if num_groups <= 0 or channels % num_groups:
        raise ctx.error(f"{channels} channels cannot be split into {num_groups} groups")
    _check_sizes(ctx, channels, scale=scale, bias=bias)
    group_size = channels // num_groups * int(np.prod(x.shape[2:], dtype=np.int64))
    grouped = x.astype(stash).reshape(batch, num_groups, group_size)
    normalized, _, _ = _standardize(grouped, (2,), epsilon)
    y = normalized.reshape(x.shape).astype(x.dtype)
    y = y * _channel_view(scale, x.ndim) + _channel_view(bias, x.ndim)
    return y.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- LRN, Lp, MVN


def _infer_lrn(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _check_rank(ctx, x, 2, "X")
    if ctx.attrs["size"] <= 0:
        raise ctx.error(f"size must be positive, got {ctx.attrs['size']}")
    return [x]


@op("LRN", family="norm", infer=_infer_lrn,
    attrs={"size": Attr.int(REQUIRED), "alpha": Attr.float(1e-4), "beta": Attr.float(0.75),
           "bias": Attr.float(1.0)})
def lrn(ctx, x, *, size, alpha, beta, bias):
    """x / (bias + alpha / size * sum of x**2 over ``size`` neighbouring channels) ** beta."""
    if size <= 0:
        raise ctx.error(f"size must be positive, got {size}")
    if x.ndim < 2:
        raise ctx.error(f"X must have rank >= 2, got shape {x.shape}")
    work = widened(x)
    before = (size - 1) // 2
    padding = [(0, 0)] * x.ndim
    padding[1] = (before, size - 1 - before)  # floor((size-1)/2) before, ceil(...) after
    squares = np.pad(work * work, padding)
    windows = np.lib.stride_tricks.sliding_window_view(squares, size, axis=1)
    square_sum = np.sum(windows, axis=-1)
    y = work / (bias + alpha / size * square_sum) ** beta
    return y.astype(x.dtype, copy=False)


def _infer_lp_norm(ctx: InferContext) -> list[ValueType | None]:
    if ctx.attrs["p"] not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {ctx.attrs['p']}")
    return _infer_along_axis(ctx)


@op("LpNormalization", family="norm", infer=_infer_lp_norm,
    attrs={"axis": Attr.int(-1), "p": Attr.int(2)})
def lp_normalization(ctx, x, *, axis, p):
    """x / ||x||_p along ``axis`` (p is 1 or 2); 0 where the norm is 0."""
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")
    axis = normalize_axis(axis, x.ndim, ctx)
    work = widened(x)
    if p == 1:
        norm = np.sum(np.abs(work), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(work * work, axis=axis, keepdims=True))
    safe = np.where(norm == 0, 1, norm)  # x is all zeros there, so the result is 0
    return (work / safe).astype(x.dtype, copy=False)


def _infer_mvn(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    if x.shape is not None:
        normalize_axes(ctx, ctx.attrs["axes"], len(x.shape))
    return [x]


@op("MeanVarianceNormalization", family="norm", infer=_infer_mvn,
    attrs={"axes": Attr.ints([0, 2, 3])})
def mean_variance_normalization(ctx, x, *, axes):
    """(x - E[x]) / (sqrt(E[x**2] - E[x]**2) + 1e-9) over ``axes``."""
    axes = normalize_axes(ctx, axes, x.ndim)
    work = widened(x)
    mean = np.mean(work, axis=axes, keepdims=True)
    variance = np.mean(work * work, axis=axes, keepdims=True) - mean * mean
    y = (work - mean) / (np.sqrt(variance) + np.asarray(1e-9, dtype=work.dtype))
    return y.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- Dropout

_DEFAULT_DROPOUT_RATIO = 0.5


def _scalar(ctx, value: np.ndarray, name: str):
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ctx.error(f"{name} must be a scalar, got shape {np.shape(value)}")
    return flat[0]


def _check_dropout_mode(ctx, ratio: np.ndarray | None, training_mode: np.ndarray | None
                        ) -> None:
    """Only inference mode, or training with ratio 0, is deterministic."""
    if training_mode is None or not bool(_scalar(ctx, training_mode, "training_mode")):
        return
    rate = _DEFAULT_DROPOUT_RATIO if ratio is None else float(_scalar(ctx, ratio, "ratio"))
    if not 0 <= rate < 1:
        raise ctx.error(f"ratio must be in [0, 1), got {rate}")
    if rate != 0:
        raise ctx.error(f"training-mode Dropout with ratio {rate} drops random elements; "
                        f"ember does not implement random ops (run in inference mode: "
                        f"training_mode=False)")


def _infer_dropout(ctx: InferContext) -> list[ValueType | None]:
    data = tensor_input(ctx, 0)
    ratio, training_mode = ctx.value(1), ctx.value(2)
    if training_mode is not None and (ratio is not None or not ctx.has_input(1)):
        _check_dropout_mode(ctx, ratio, training_mode)
    return [data, TensorType(DType.BOOL, data.shape)]


@op("Dropout", family="norm", infer=_infer_dropout, outputs=(1, 2),
    attrs={"seed": Attr.int(None)}, random=True)
def dropout(ctx, data, ratio=None, training_mode=None, *, seed):
    """Identity with an all-true mask (inference, or training with ratio 0)."""
    _check_dropout_mode(ctx, ratio, training_mode)
    if ctx.output_requested(1):
        return data, np.ones(data.shape, dtype=np.bool_)
    return data
