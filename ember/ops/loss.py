"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position, the (log-)probability of its target class along axis 1
of an (N, C, d1, ..., dk) input, optionally weight it per class, zero it where the target is
``ignore_index``, and reduce with ``reduction``: 'none', 'sum', or 'mean' (the sum divided by
the total weight of the samples that are not ignored).
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import dims_equal
from ember.ir.types import TensorType, ValueType
from ember.ops.norm import log_softmax_values
from ember.ops.reduce import widened
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape_infer import tensor_input

_REDUCTIONS = ("none", "sum", "mean")
_LOSS_ATTRS = {"ignore_index": Attr.int(None), "reduction": Attr.string("mean")}


def _check_reduction(ctx, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _infer_loss(ctx: InferContext) -> list[ValueType | None]:
    """loss: the target's shape ('none') or a scalar; the optional log_prob: the input's type."""
    _check_reduction(ctx, ctx.attrs["reduction"])
    scores = tensor_input(ctx, 0)
    target = tensor_input(ctx, 1)
    if not target.dtype.is_int:
        raise ctx.error(f"the target/labels must hold integer class indices, got {target}")
    if scores.shape is not None:
        if len(scores.shape) < 2:
            raise ctx.error(f"the input must have shape (N, C, d1, ..., dk), got {scores}")
        expected = (scores.shape[0],) + scores.shape[2:]
        if target.shape is not None and (len(target.shape) != len(expected) or any(
                dims_equal(a, b) is False for a, b in zip(target.shape, expected))):
            raise ctx.error(f"the target {target} must have the shape of the input {scores} "
                            f"without its class axis 1")
    if ctx.has_input(2):
        weight = tensor_input(ctx, 2)
        classes = None if scores.shape is None else scores.shape[1]
        if weight.shape is not None and (len(weight.shape) != 1 or
                                         dims_equal(weight.shape[0], classes) is False):
            raise ctx.error(f"the weights must have shape [C] = [{classes}], got {weight}")
    if ctx.attrs["reduction"] == "none":
        loss_shape = target.shape if target.shape is not None else (
            None if scores.shape is None else (scores.shape[0],) + scores.shape[2:])
    else:
        loss_shape = ()
    return [TensorType(scores.dtype, loss_shape), scores]


def _negative_log_likelihood(ctx, log_prob: np.ndarray, target: np.ndarray,
                             weight: np.ndarray | None, ignore_index: int | None,
                             reduction: str) -> np.ndarray:
    """The (weighted, reduced) loss -log_prob[n, target[n, d...], d...], in log_prob's dtype."""
    _check_reduction(ctx, reduction)
    if log_prob.ndim < 2:
        raise ctx.error(f"the input must have shape (N, C, d1, ..., dk), got {log_prob.shape}")
    expected = (log_prob.shape[0],) + log_prob.shape[2:]
    if target.shape != expected:
        raise ctx.error(f"the target has shape {target.shape}; the input {log_prob.shape} "
                        f"needs {expected}")
    classes = log_prob.shape[1]
    if weight is not None and weight.shape != (classes,):
        raise ctx.error(f"the weights have shape {weight.shape}; expected ({classes},)")
    kept = target != ignore_index if ignore_index is not None else np.ones(target.shape, bool)
    bad = kept & ((target < 0) | (target >= classes))
    if bad.any():
        raise ctx.error(f"target value {int(target[bad].flat[0])} is not a class in "
                        f"[0, {classes}) nor the ignore_index {ignore_index}")
    index = np.where(kept, target, 0).astype(np.int64)
    work = widened(log_prob)
    picked = np.take_along_axis(work, np.expand_dims(index, 1), axis=1).squeeze(1)
    sample_weight = np.ones_like(picked) if weight is None else weight.astype(work.dtype)[index]
    sample_weight = np.where(kept, sample_weight, 0)
    loss = -picked * sample_weight
    if reduction == "sum":
        loss = np.sum(loss)
    elif reduction == "mean":
        loss = np.sum(loss) / np.sum(sample_weight)
    return np.asarray(loss).astype(log_prob.dtype, copy=False)


def _infer_nll(ctx: InferContext) -> list[ValueType | None]:
    return _infer_loss(ctx)[:1]


@op("NegativeLogLikelihoodLoss", family="loss", infer=_infer_nll, attrs=_LOSS_ATTRS)
def negative_log_likelihood_loss(ctx, log_prob, target, weight=None, *, ignore_index,
                                 reduction):
    """-log_prob[n, target[n, d...], d...] per sample (times weight), reduced."""
    return _negative_log_likelihood(ctx, log_prob, target, weight, ignore_index, reduction)


@op("SoftmaxCrossEntropyLoss", family="loss", infer=_infer_loss, attrs=_LOSS_ATTRS,
    outputs=(1, 2))
def softmax_cross_entropy_loss(ctx, scores, labels, weights=None, *, ignore_index, reduction):
    """NegativeLogLikelihoodLoss of LogSoftmax(scores) over axis 1; also returns log_prob."""
    if scores.ndim < 2:
        raise ctx.error(f"scores must have shape (N, C, d1, ..., dk), got {scores.shape}")
    log_prob = log_softmax_values(scores, axis=1)
    loss = _negative_log_likelihood(ctx, log_prob, labels, weights, ignore_index, reduction)
    return loss, log_prob
