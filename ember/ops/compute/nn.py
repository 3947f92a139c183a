"""Compute definitions of the neural-network ops: the softmax family, the normalizations,
MatMul/Gemm, the convolutions and the poolings.

They follow the numpy references in ``ember/ops/norm.py``, ``matmul.py``, ``conv.py`` and
``pool.py``: 16-bit floats compute in float32 and are rounded once at the end, statistics
(means, variances) use two passes as the references do, and sliding windows reuse the
references' own geometry (:class:`ember.ops.conv.Window`) so that pads, ``auto_pad`` and
``ceil_mode`` resolve exactly as there.

Sums over data -- softmax denominators, normalization statistics, pooling windows -- go
through :func:`~ember.ops.compute.reduce.accurate_sum` (a float64 accumulator for floats,
rounded once), so they stay accurate at any length.  The contractions (MatMul, Gemm, Conv,
ConvTranspose) accumulate in their element type on purpose: see ``reduce.py``'s docstring.

Products reduce innermost over the axis that is contiguous in memory where the layout allows
it: MatMul over ``K`` (contiguous in A; B is read down a column unless it is transposed by
Gemm's ``transB``), Conv over ``(C/group, k1, ..., kn)`` so that the last kernel axis walks
along an input row and the weights contiguously.

Windows that reach into padding guard their taps with a reduction condition and clamp the
index they load from, so no load ever leaves its buffer even if a later schedule evaluates
both sides of the guard.

Intermediate stages (row maxima and sums, statistics, BatchNorm factors, AveragePool counts)
that lowering does not inline become scratch buffers in the workspace arena, sized with the
rest of the model's memory (and bounded by its memory budget), not on the kernel's stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ember.core.traced import as_size
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.compute import (NARROW_FLOATS, IterVar, Reduce, Tensor, cast, compute,
                              compute_dtype, const_like, reduce_axis, reduce_fmax, reduce_max,
                              reduce_sum, widen)
from ember.ir.loop.expr import INDEX, Const, Expr, Select, call, maximum, minimum
from ember.ops.compute.reduce import (Reduction, absolute, accumulator_dtype, accurate_sum,
                                      broadcast_index, extreme_index, float_dtype,
                                      logical_and, normalize_axis, ordered, reduce_stage,
                                      require_kernel_dtypes, sum_stage)
# The references' own window geometry, so compiled and numpy padding cannot drift apart.
from ember.ops.conv import Window, kernel_of, transpose_plan, transpose_window
from ember.ops.registry import NoCompute, compute_of

_FLOATS = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


def _require_float(*tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.dtype not in _FLOATS:
            raise NoCompute(f"no compute for element type {t.dtype}")


def _flat(index: Sequence[Expr], shape: Sequence[int]) -> Expr:
    """Row-major flat position of ``index`` in ``shape``."""
    total: Expr = Const(0, INDEX)
    for i, d in zip(index, shape):
        total = total * d + i
    return total


# ----------------------------------------------------------------------------- softmax family


def _as_reference(value: Expr, dtype: DType) -> Expr:
    """``value`` rounded to a 16-bit float ``dtype`` where the reference's numpy code rounds
    an intermediate (identity for other types)."""
    if dtype not in NARROW_FLOATS:
        return value
    return cast(cast(value, dtype), value.dtype)


def _softmax_parts(x: Tensor, axis: int
                   ) -> tuple[Reduction, Callable[..., Expr], Tensor, Tensor]:
    """The shifted input x - max(x) (a function of the index), its exponentials (a stage in
    the compute type) and their sums along ``axis`` (a kept-shape stage in the compute type).

    Softmax and LogSoftmax compute in the input's precision in the reference, so for 16-bit
    floats the shift and each exp are rounded where numpy rounds them.  The sum accumulates in
    float64 (:func:`accurate_sum`) and is rounded once, to the input's type: numpy sums
    float16 along a contiguous axis with float32 partial sums, but adds strided float16 and
    bfloat16 (ml_dtypes) terms in the narrow type, which stops counting at 2048 (float16) or
    256 (bfloat16) -- an error not worth copying.  The exponentials are a stage of their own
    so that a softmax, which reads them twice (in the sum and in the quotient), computes
    each once: lowering stores an expensive stage read twice instead of inlining it into
    both readers (``lower.inline``), and row fusion keeps the stored row in L1.
    """
    red = Reduction(x.shape, (normalize_axis(axis, x.ndim),), keepdims=True)
    peak = reduce_stage(x, red, "max", "softmax_peak", element=widen, shape=red.kept_shape)

    def shifted(index: Sequence[Expr]) -> Expr:
        return _as_reference(widen(x[index]) - peak[red.kept(index)], x.dtype)

    exps = compute(x.shape, lambda *i: _as_reference(call("exp", shifted(i)), x.dtype),
                   name="softmax_exp", dtype=compute_dtype(x.dtype))

    def total(*index: Expr) -> Reduce:
        rvars = red.axis_vars()
        return accurate_sum(exps[red.source(index, rvars)], rvars)

    sums = sum_stage(red.kept_shape, total, "softmax_sum", compute_dtype(x.dtype),
                     lambda s, index: widen(cast(s, x.dtype)), columns=red.keeps_innermost)
    return red, shifted, exps, sums


@compute_of("Softmax")
def softmax(ctx, x, *, axis):
    _require_float(x)
    red, _, exps, total = _softmax_parts(x, axis)
    return compute(x.shape, lambda *i: exps[list(i)] / total[red.kept(i)], name="softmax",
                   dtype=x.dtype)


@compute_of("LogSoftmax")
def log_softmax(ctx, x, *, axis):
    _require_float(x)
    red, shifted, _, total = _softmax_parts(x, axis)
    return compute(x.shape, lambda *i: shifted(i) - _as_reference(
        call("log", total[red.kept(i)]), x.dtype), name="logsoftmax", dtype=x.dtype)


@compute_of("Hardmax")
def hardmax(ctx, x, *, axis):
    _require_float(x)
    axis = normalize_axis(axis, x.ndim)
    red = Reduction(x.shape, (axis,), keepdims=True)
    first = extreme_index(x, axis, True, "max", False, "hardmax_index")
    one, zero = const_like(1, x.dtype), const_like(0, x.dtype)
    return compute(x.shape, lambda *i: Select(i[axis].eq(first[red.kept(i)]), one, zero),
                   name="hardmax")


# ----------------------------------------------------------------------------- normalizations


def _group_statistics(x: Tensor, stat_shape: Sequence[int], work: DType, epsilon: float,
                      centered: bool = True) -> tuple[Tensor | None, Tensor]:
    """Mean and 1 / sqrt(variance + epsilon) of contiguous groups of ``x``'s elements.

    Row-major, ``x`` is ``prod(stat_shape)`` consecutive groups of equal size; statistic
    ``i`` describes group ``flat(i)``.  Without ``centered`` (RMS normalization) there is no
    mean and the "variance" is the mean square.  Elements and deviations are computed in
    ``work`` (the stash type); the sums, the divisions by the count and ``1 / sqrt`` in the
    wider accumulator type, rounded once to ``work`` when the statistic is stored.
    """
    rows = math.prod(as_size(d) for d in stat_shape)
    size = math.prod(as_size(d) for d in x.shape)
    cols = size // rows if rows else 0
    acc = accumulator_dtype(work)
    count = const_like(cols, acc)

    def element(index: Sequence[Expr], k: IterVar) -> Expr:
        return cast(x.flat(_flat(index, stat_shape) * cols + k), work)

    mean = None
    if centered:
        def mean_body(*index: Expr) -> Expr:
            k = reduce_axis(cols, "g")
            return accurate_sum(element(index, k), k) / count

        mean = compute(stat_shape, mean_body, name="norm_mean", dtype=work)

    def inv_std_body(*index: Expr) -> Expr:
        k = reduce_axis(cols, "g")
        value = element(index, k)
        if mean is not None:
            value = value - mean[index]
        variance = accurate_sum(value * value, k) / count
        return const_like(1, acc) / call("sqrt", variance + const_like(epsilon, acc))

    return mean, compute(stat_shape, inv_std_body, name="norm_inv_std", dtype=work)


def _stash(stash_type: int) -> DType:
    """The statistics type a ``stash_type`` names (float32 or float64 only)."""
    try:
        dtype = DType.from_onnx(int(stash_type))
    except EmberError:  # an unknown code: let the reference report it
        raise NoCompute(f"stash_type {stash_type}") from None
    if dtype not in (DType.FLOAT32, DType.FLOAT64):
        raise NoCompute(f"stash_type {stash_type} is not float32/float64")
    return dtype


@compute_of("BatchNormalization")
def batch_normalization(ctx, x, scale, b, input_mean, input_var, *, epsilon, momentum,
                        training_mode):
    """Inference form: (x - mean) * (scale / sqrt(var + epsilon)) + B, per channel."""
    params = (scale, b, input_mean, input_var)
    _require_float(x, *params)
    if training_mode or ctx.num_outputs > 1:
        raise NoCompute("training-mode BatchNormalization")
    work = float_dtype(*(compute_dtype(t.dtype) for t in (x, *params)))
    channels = x.shape[1] if x.ndim > 1 else 1
    if any(p.shape != (channels,) for p in params):
        raise NoCompute("per-channel parameters of the wrong size")
    factor = compute((channels,), lambda c: cast(scale[c], work) / call(
        "sqrt", cast(input_var[c], work) + const_like(epsilon, work)), name="bn_factor")

    def body(*i: Expr) -> Expr:
        c = i[1] if x.ndim > 1 else Const(0, INDEX)
        centered = cast(x[i], work) - cast(input_mean[c], work)
        return centered * factor[c] + cast(b[c], work)

    return compute(x.shape, body, name="batchnorm", dtype=x.dtype)


@compute_of("InstanceNormalization")
def instance_normalization(ctx, x, scale, b, *, epsilon):
    _require_float(x, scale, b)
    if x.ndim < 2 or scale.shape != (x.shape[1],) or b.shape != (x.shape[1],):
        raise NoCompute("InstanceNormalization needs (N, C, ...) and C-sized parameters")
    work = compute_dtype(x.dtype)
    mean, inv_std = _group_statistics(x, x.shape[:2], work, epsilon)

    def body(*i: Expr) -> Expr:
        row = list(i[:2])
        normalized = (widen(x[i]) - mean[row]) * inv_std[row]
        return normalized * widen(scale[i[1]]) + widen(b[i[1]])

    return compute(x.shape, body, name="instancenorm", dtype=x.dtype)


def _scale_shift(normalized: Expr, x: Tensor, index: Sequence[Expr], scale: Tensor,
                 bias: Tensor | None, channel: bool = False) -> Expr:
    """``normalized`` rounded to x's type, then * scale (+ bias), as the references do.

    Parameters broadcast numpy-style against x, or are per channel (axis 1) with
    ``channel``.
    """
    value = widen(cast(normalized, x.dtype))

    def param(t: Tensor) -> Expr:
        where = [index[1]] if channel else broadcast_index(index, t.shape)
        return widen(t[where])

    value = value * param(scale)
    if bias is None:
        return value
    if scale.dtype == x.dtype:  # numpy rounds the product to x's (16-bit) type before + B
        value = _as_reference(value, x.dtype)
    return value + param(bias)


def _check_broadcast(x: Tensor, *params: Tensor | None) -> None:
    for t in params:
        if t is None:
            continue
        if t.ndim > x.ndim or any(d not in (1, xd) for d, xd in
                                  zip(reversed(t.shape), reversed(x.shape))):
            raise NoCompute(f"parameter {list(t.shape)} does not broadcast to {list(x.shape)}")


@compute_of("LayerNormalization")
def layer_normalization(ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    """Normalize over axes [axis, rank); the Mean and InvStdDev outputs are the statistics."""
    _require_float(x, scale, b)
    _check_broadcast(x, scale, b)
    work = _stash(stash_type)
    axis = normalize_axis(axis, x.ndim)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    mean, inv_std = _group_statistics(x, stat_shape, work, epsilon)
    assert mean is not None

    def body(*i: Expr) -> Expr:
        row = list(i[:axis]) + [Const(0, INDEX)] * (x.ndim - axis)
        normalized = (cast(x[i], work) - mean[row]) * inv_std[row]
        return _scale_shift(normalized, x, i, scale, b)

    y = compute(x.shape, body, name="layernorm", dtype=x.dtype)
    return (y, mean, inv_std)[:ctx.num_outputs] if ctx.num_outputs > 1 else y


@compute_of("RMSNormalization")
def rms_normalization(ctx, x, scale, *, axis, epsilon, stash_type):
    """x / sqrt(mean(x**2) + epsilon) over axes [axis, rank), then * scale."""
    _require_float(x, scale)
    _check_broadcast(x, scale)
    work = _stash(stash_type)
    axis = normalize_axis(axis, x.ndim)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    _, inv_rms = _group_statistics(x, stat_shape, work, epsilon, centered=False)

    def body(*i: Expr) -> Expr:
        row = list(i[:axis]) + [Const(0, INDEX)] * (x.ndim - axis)
        return _scale_shift(cast(x[i], work) * inv_rms[row], x, i, scale, None)

    return compute(x.shape, body, name="rmsnorm", dtype=ctx.output_types[0].dtype)


@compute_of("GroupNormalization")
def group_normalization(ctx, x, scale, bias, *, num_groups, epsilon, stash_type):
    _require_float(x, scale, bias)
    work = _stash(stash_type)
    if x.ndim < 2 or num_groups <= 0 or x.shape[1] % num_groups:
        raise NoCompute("channels do not split into the groups")
    channels = x.shape[1]
    if scale.shape != (channels,) or bias.shape != (channels,):
        raise NoCompute("GroupNormalization parameters must be per channel")
    per_group = channels // num_groups
    mean, inv_std = _group_statistics(x, (x.shape[0], num_groups), work, epsilon)

    def body(*i: Expr) -> Expr:
        row = [i[0], i[1] // per_group]
        normalized = (cast(x[i], work) - mean[row]) * inv_std[row]
        return _scale_shift(normalized, x, i, scale, bias, channel=True)

    return compute(x.shape, body, name="groupnorm", dtype=x.dtype)


@compute_of("LpNormalization")
def lp_normalization(ctx, x, *, axis, p):
    """x / ||x||_p along ``axis``; 0 where the norm is 0."""
    _require_float(x)
    if p not in (1, 2):
        raise NoCompute(f"p={p}")
    red = Reduction(x.shape, (normalize_axis(axis, x.ndim),), keepdims=True)
    work = compute_dtype(x.dtype)  # the norm is rounded to it once, after the root
    if p == 1:
        norm = reduce_stage(x, red, "sum", "lp_norm", element=lambda v: absolute(widen(v)),
                            dtype=work, shape=red.kept_shape)
    else:
        norm = reduce_stage(x, red, "sum", "lp_norm", element=lambda v: widen(v) * widen(v),
                            finish=lambda s: call("sqrt", s), dtype=work,
                            shape=red.kept_shape)

    def body(*i: Expr) -> Expr:
        n = norm[red.kept(i)]
        zero, one = const_like(0, n.dtype), const_like(1, n.dtype)
        return widen(x[i]) / Select(n.eq(zero), one, n)

    return compute(x.shape, body, name="lpnorm", dtype=x.dtype)


# ----------------------------------------------------------------------------- MatMul, Gemm


def _product_dtype(a: Tensor, b: Tensor) -> DType:
    require_kernel_dtypes(a, b, allow_bool=False)
    if a.dtype != b.dtype:
        raise NoCompute(f"operands of types {a.dtype} and {b.dtype}")
    return compute_dtype(a.dtype)


@compute_of("MatMul")
def matmul(ctx, a, b):
    """Batched ``a @ b`` with numpy semantics; the reduction runs along A's rows."""
    acc = _product_dtype(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise NoCompute("MatMul of a scalar")
    inner = a.shape[-1]
    if inner != (b.shape[0] if b.ndim == 1 else b.shape[-2]):
        raise NoCompute("inner dimensions differ")
    out = ctx.output_types[0]

    def body(*index: Expr) -> Expr:
        rest = list(index)
        col = rest.pop() if b.ndim > 1 else None
        row = rest.pop() if a.ndim > 1 else None
        k = reduce_axis(inner, "k")
        a_index = broadcast_index(rest, a.shape[:-2]) + [row, k] if a.ndim > 1 else [k]
        b_index = broadcast_index(rest, b.shape[:-2]) + [k, col] if b.ndim > 1 else [k]
        return reduce_sum(cast(a[a_index], acc) * cast(b[b_index], acc), k)

    return compute(out.shape, body, name="matmul", dtype=out.dtype)


@compute_of("Gemm")
def gemm(ctx, a, b, c=None, *, alpha, beta, transA, transB):
    """alpha * A' @ B' + beta * C with the reference's order of operations."""
    acc = _product_dtype(a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise NoCompute("Gemm operands must be 2-D")
    m, inner = a.shape[::-1] if transA else a.shape
    inner_b, n = b.shape[::-1] if transB else b.shape
    use_c = c is not None and beta != 0.0
    if inner != inner_b or (use_c and (c.ndim > 2 or any(
            d not in (1, t) for d, t in zip(reversed(c.shape), (n, m))))):
        raise NoCompute("Gemm shapes do not fit")
    # Integers with a non-unit alpha or beta are scaled in float64, as numpy promotes them.
    work = acc if acc.is_float or (alpha == 1.0 and (not use_c or beta == 1.0)) \
        else DType.FLOAT64

    def body(i: Expr, j: Expr) -> Expr:
        k = reduce_axis(inner, "k")
        lhs = a[k, i] if transA else a[i, k]
        rhs = b[j, k] if transB else b[k, j]
        y = cast(reduce_sum(cast(lhs, acc) * cast(rhs, acc), k), work)
        if alpha != 1.0:
            y = y * const_like(alpha, work)
        if use_c:
            term = cast(c[broadcast_index([i, j], c.shape)], work)
            y = y + (term if beta == 1.0 else term * const_like(beta, work))
        return y

    return compute((m, n), body, name="gemm", dtype=ctx.output_types[0].dtype)


# ----------------------------------------------------------------------------- windows


class _Refuse:
    """Stands in for a node context in the references' geometry helpers: their errors
    become NoCompute, so the numpy reference reports them."""

    @staticmethod
    def error(message: str) -> NoCompute:
        return NoCompute(message)


_REFUSE = _Refuse()


# A kernel of more taps than this is not written out as one sum (7x7 is the largest that
# depthwise networks use).
MAX_WRITTEN_OUT_TAPS = 49


@dataclass(frozen=True)
class _Taps:
    """Input positions read by the kernel taps of a sliding window over ``in_dims``.

    Tap ``t`` of the window at output position ``o`` reads ``o * stride - pad_begin + t *
    dilation`` along each spatial axis.  Guards are only built for the axes where some tap
    can leave the region that counts (the input, or input plus pads for AveragePool's
    ``count_include_pad``), so unpadded windows compile to plain reductions.
    """

    window: Window
    pads_begin: tuple[int, ...]
    in_dims: tuple[int, ...]
    out_dims: tuple[int, ...]

    def variables(self) -> list[IterVar]:
        return [reduce_axis(k, f"t{a}") for a, k in enumerate(self.window.kernel)]

    def positions(self, out: Sequence[Expr], taps: Sequence[Expr]) -> list[Expr]:
        return [self.position(axis, o, t) for axis, (o, t) in enumerate(zip(out, taps))]

    def position(self, axis: int, out: Expr, tap: Expr) -> Expr:
        """The input position tap ``tap`` of the window at ``out`` reads along ``axis``."""
        stride, dilation = self.window.strides[axis], self.window.dilations[axis]
        pad = self.pads_begin[axis]
        return out * stride - pad + tap * dilation if pad else out * stride + tap * dilation

    def _leaves(self, axis: int, low: int, high: int) -> bool:
        """Whether some tap along ``axis`` falls outside [low, high)."""
        first = -self.pads_begin[axis]
        last = (self.out_dims[axis] - 1) * self.window.strides[axis] - \
            self.pads_begin[axis] + (self.window.kernel[axis] - 1) * self.window.dilations[axis]
        return first < low or last >= high

    def stays_within(self, bounds: Sequence[tuple[int, int]]) -> bool:
        """Whether every tap of every window lies in ``bounds`` (low, high) per axis."""
        return not any(self._leaves(axis, low, high) for axis, (low, high) in enumerate(bounds))

    def guard(self, positions: Sequence[Expr],
              bounds: Sequence[tuple[int, int]] | None = None) -> Expr | None:
        """True where every position lies in its bounds (default: the input); None if the
        window never leaves them."""
        bounds = bounds or [(0, d) for d in self.in_dims]
        terms = []
        for axis, (pos, (low, high)) in enumerate(zip(positions, bounds)):
            if self._leaves(axis, low, high):
                terms += [pos.ge(low), pos.lt(high)]
        return logical_and(*terms)

    def axis_guard(self, axis: int, pos: Expr) -> Expr | None:
        """:meth:`guard` along ``axis`` alone (input bounds)."""
        size = self.in_dims[axis]
        return logical_and(pos.ge(0), pos.lt(size)) if self._leaves(axis, 0, size) else None

    def clamped(self, positions: Sequence[Expr]) -> list[Expr]:
        """``positions`` clamped into the input where they may leave it (safe to load)."""
        return [self.axis_clamped(axis, pos) for axis, pos in enumerate(positions)]

    def axis_clamped(self, axis: int, pos: Expr) -> Expr:
        """:meth:`clamped` along ``axis`` alone."""
        size = self.in_dims[axis]
        if not self._leaves(axis, 0, size):
            return pos
        return minimum(maximum(pos, Const(0, INDEX)), Const(size - 1, INDEX))


def _taps(x: Tensor, kernel: Sequence[int], attrs: dict, out_shape: Sequence[int],
          ceil_mode: bool = False) -> _Taps:
    """The window geometry of a conv or pool node, checked against its inferred output."""
    if x.ndim != len(kernel) + 2:
        raise NoCompute("kernel rank does not match the input")
    window = Window.from_attrs(_REFUSE, kernel, attrs, ceil_mode=ceil_mode)
    plan = window.plan(_REFUSE, x.shape[2:])
    if tuple(plan.out) != tuple(out_shape[2:]):
        raise NoCompute(f"window gives {plan.out}, shape inference {out_shape}")
    return _Taps(window, tuple(int(p) for p in plan.pads_begin), tuple(x.shape[2:]),
                 tuple(plan.out))


# ----------------------------------------------------------------------------- Conv


@compute_of("Conv")
def conv(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """y[n, m, o] = sum over (c, taps) of x[n, g * C/G + c, o * s - p + t * d] * w[m, c, t]."""
    acc = _product_dtype(x, w)
    if b is not None and b.dtype != x.dtype:
        raise NoCompute("bias of another type")
    if x.ndim < 3 or w.ndim != x.ndim or group < 1:
        raise NoCompute("Conv needs X and W of equal rank >= 3")
    kernel = kernel_of(_REFUSE, dict(kernel_shape=kernel_shape), w.shape)
    out = ctx.output_types[0]
    taps = _taps(x, kernel, dict(auto_pad=auto_pad, dilations=dilations, pads=pads,
                                          strides=strides), out.shape)
    per_group, m_total = w.shape[1], w.shape[0]
    if x.shape[1] != per_group * group or m_total % group:
        raise NoCompute("channels do not match the groups")
    m_per_group = m_total // group

    def body(n: Expr, m: Expr, *o: Expr) -> Expr:
        c = reduce_axis(per_group, "c")
        t = taps.variables()
        channel = c if group == 1 else (m // m_per_group) * per_group + c
        pos = taps.positions(o, t)
        product = cast(x[[n, channel] + taps.clamped(pos)], acc) * cast(w[[m, c] + t], acc)
        total = reduce_sum(product, [c] + t, condition=taps.guard(pos))
        return total if b is None else total + cast(b[m], acc)

    return compute(out.shape, body, name="conv", dtype=out.dtype)


@compute_of("DepthwiseConvBlocked")
def depthwise_conv_blocked(ctx, x, w, b=None, *, strides, dilations):
    """y[n, cb, oh, ow, l] = the explicit sum, tap by tap, of x[n, cb, oh*sh + kh*dh,
    ow*sw + kw*dw, l] * w[cb, kh, kw, l] (+ b[cb, l]).

    Written out rather than as a reduction: with the lanes ``l`` innermost and contiguous in
    X, W and Y, each output vector is KH*KW multiply-adds of vector loads computed in
    registers and stored once (a reduction would accumulate into the output in memory)."""
    if x.ndim != 5 or w.ndim != 4 or (b is not None and b.ndim != 2):
        raise NoCompute("DepthwiseConvBlocked needs X (N, C/L, H, W, L) and W (C/L, KH, KW, L)")
    if not x.dtype.is_float or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise NoCompute("X, W and B of one float type")
    taps = w.shape[1] * w.shape[2]
    if taps > MAX_WRITTEN_OUT_TAPS:
        raise NoCompute(f"{taps} taps: more than are written out ({MAX_WRITTEN_OUT_TAPS})")
    acc = _product_dtype(x, w)
    out = ctx.output_types[0]

    def body(n: Expr, cb: Expr, oh: Expr, ow: Expr, lane: Expr) -> Expr:
        total = None
        for kh in range(w.shape[1]):
            for kw in range(w.shape[2]):
                row = oh * strides[0] + kh * dilations[0]
                column = ow * strides[1] + kw * dilations[1]
                term = cast(x[[n, cb, row, column, lane]], acc) * cast(w[[cb, kh, kw, lane]],
                                                                       acc)
                total = term if total is None else total + term
        return total if b is None else total + cast(b[[cb, lane]], acc)

    return compute(out.shape, body, name="dwconv", dtype=out.dtype)


@compute_of("ConvBlocked")
def conv_blocked(ctx, x, w, b=None, *, strides, dilations, group=1):
    """y[n, mb, oh, ow, lo] = sum over (cb, kh, kw, li) of x[n, cb, oh*sh + kh*dh,
    ow*sw + kw*dw, li] * w[mb, cb, kh, kw, li, lo] (+ b[mb, lo]): a matrix product per output
    row, of its pixels (rows, each input element broadcast) by the weights (columns: the
    output lanes ``lo``, contiguous in W and Y), which the GEMM template takes."""
    if x.ndim != 5 or w.ndim != 6 or (b is not None and b.ndim != 2):
        raise NoCompute("ConvBlocked needs X (N, C/Li, H, W, Li) and W (M/Lo, C/Li, KH, KW, Li, "
                        "Lo)")
    if not x.dtype.is_float or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise NoCompute("X, W and B of one float type")
    acc = _product_dtype(x, w)
    out = ctx.output_types[0]
    if group < 1 or w.shape[0] % group or x.shape[1] != w.shape[1] * group:
        raise NoCompute("channel blocks do not split into the groups")
    out_blocks = w.shape[0] // group

    def body(n: Expr, mb: Expr, oh: Expr, ow: Expr, lane: Expr) -> Expr:
        cb, kh, kw, li = (reduce_axis(w.shape[1], "cb"), reduce_axis(w.shape[2], "kh"),
                          reduce_axis(w.shape[3], "kw"), reduce_axis(w.shape[4], "li"))
        row = oh * strides[0] + kh * dilations[0]
        column = ow * strides[1] + kw * dilations[1]
        # (a group's input blocks: the GEMM template splits mb into group and block)
        block = cb if group == 1 else (mb // out_blocks) * w.shape[1] + cb
        product = cast(x[[n, block, row, column, li]], acc) * \
            cast(w[[mb, cb, kh, kw, li, lane]], acc)
        total = reduce_sum(product, [cb, kh, kw, li])
        return total if b is None else total + cast(b[[mb, lane]], acc)

    return compute(out.shape, body, name="conv", dtype=out.dtype)


@compute_of("ConvTranspose")
def conv_transpose(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape,
                   output_padding, output_shape, pads, strides):
    """Gather form of the transposed convolution: output position o (shifted by the crop)
    takes input position i wherever o = i * stride + tap * dilation."""
    acc = _product_dtype(x, w)
    if b is not None and b.dtype != x.dtype:
        raise NoCompute("bias of another type")
    if x.ndim < 3 or w.ndim != x.ndim or group < 1:
        raise NoCompute("ConvTranspose needs X and W of equal rank >= 3")
    attrs = dict(auto_pad=auto_pad, dilations=dilations, kernel_shape=kernel_shape,
                 output_padding=output_padding, pads=pads, strides=strides)
    kernel = kernel_of(_REFUSE, attrs, w.shape)
    window, out_pad = transpose_window(_REFUSE, attrs, kernel)
    plan = transpose_plan(_REFUSE, x.shape[2:], window, out_pad, output_shape)
    out = ctx.output_types[0]
    channels, m_per_group = x.shape[1], w.shape[1]
    if tuple(plan.out) != tuple(out.shape[2:]) or channels != w.shape[0] or channels % group:
        raise NoCompute("ConvTranspose shapes do not fit")
    per_group = channels // group

    def body(n: Expr, m: Expr, *o: Expr) -> Expr:
        c = reduce_axis(per_group, "c")
        t = [reduce_axis(k, f"t{a}") for a, k in enumerate(kernel)]
        g = Const(0, INDEX) if group == 1 else m // m_per_group
        channel = c if group == 1 else g * per_group + c
        conditions, sources = [], []
        for axis, (oa, ta) in enumerate(zip(o, t)):
            stride, size = window.strides[axis], x.shape[2 + axis]
            shifted = oa + plan.crop_begin[axis] - ta * window.dilations[axis]
            source = shifted // stride if stride > 1 else shifted
            conditions += [shifted.ge(0), source.lt(size)]
            if stride > 1:
                conditions.append((shifted % stride).eq(0))
            sources.append(minimum(maximum(source, Const(0, INDEX)), Const(size - 1, INDEX)))
        tap_weight = w[[channel, m if group == 1 else m % m_per_group] + t]
        product = cast(x[[n, channel] + sources], acc) * cast(tap_weight, acc)
        total = reduce_sum(product, [c] + t, condition=logical_and(*conditions))
        return total if b is None else total + cast(b[m], acc)

    return compute(out.shape, body, name="convtranspose", dtype=out.dtype)


# ----------------------------------------------------------------------------- pooling


def _pool_taps(ctx, x: Tensor, kernel_shape, attrs: dict, ceil_mode: int) -> _Taps:
    require_kernel_dtypes(x, allow_bool=False)
    return _taps(x, [int(k) for k in kernel_shape], attrs, ctx.output_types[0].shape,
                 ceil_mode=bool(ceil_mode))


@compute_of("MaxPool")
def max_pool(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order,
             strides, propagate_nan=0):
    """Maximum over each window's taps inside the input (padding never wins); NaNs are
    ignored unless ``propagate_nan`` (see ``ember/ops/pool.py``)."""
    if ctx.num_outputs > 1:
        raise NoCompute("MaxPool's Indices output")
    taps = _pool_taps(ctx, x, kernel_shape, dict(
        auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides), ceil_mode)
    shape = ctx.output_types[0].shape
    if x.dtype.is_float and not propagate_nan:
        return _nan_ignoring_max_pool(x, taps, shape)
    if _separable(taps):
        return _separable_max_pool(x, taps, reduce_max, ordered, x.dtype)

    def body(n: Expr, c: Expr, *o: Expr) -> Expr:
        t = taps.variables()
        pos = taps.positions(o, t)
        return reduce_max(ordered(x[[n, c] + taps.clamped(pos)]), t,
                          condition=taps.guard(pos))

    return compute(shape, body, name="maxpool", dtype=x.dtype)


def _nan_ignoring_max_pool(x: Tensor, taps: _Taps, shape) -> Tensor:
    """MaxPool as ``np.fmax`` over each window's taps inside the input: the maximum of its
    numbers, NaN if it has none -- one reduction with the ``fmax`` combiner, accumulated in
    the output and vectorized like the NaN-propagating pool.  (It was two reductions, the
    maximum of the numbers and whether there was one, at 1.4x the time; see
    ``lower._combine`` for the selects it lowers to.)"""
    work = compute_dtype(x.dtype)
    if _separable(taps):
        wide = _separable_max_pool(x, taps, reduce_fmax, widen, work)
    else:
        def body(n: Expr, c: Expr, *o: Expr) -> Expr:
            t = taps.variables()
            pos = taps.positions(o, t)
            return reduce_fmax(widen(x[[n, c] + taps.clamped(pos)]), t,
                               condition=taps.guard(pos))

        wide = compute(shape, body, name="maxpool" if work == x.dtype else "maxpool_wide",
                       dtype=work)
    if work == x.dtype:
        return wide
    return compute(shape, lambda *i: cast(wide[list(i)], x.dtype), name="maxpool",
                   dtype=x.dtype)


def _separable(taps: _Taps) -> bool:
    """Whether a pool's window pays for being taken one axis at a time: more than one axis
    with several taps, none striding past its window (else the first pass would compute
    rows that no window reads)."""
    w = taps.window
    spread = [k for k in w.kernel if k > 1]
    return len(spread) > 1 and all(s <= k for s, k in zip(w.strides, w.kernel))


def _separable_max_pool(x: Tensor, taps: _Taps, reducer, element, dtype: DType) -> Tensor:
    """The maximum over a window taken one spatial axis at a time, last axis first: a stage
    per axis reduces that axis's taps (with that axis's guard), the axes before it still at
    input size.  A maximum is the same in any grouping (NaN-propagating or NaN-ignoring), and
    each stage is a short one-dimensional window along the output row, which the C compiler
    vectorizes; the whole window in one nest stayed scalar (ResNet's 3x3 stride-2 stem pool:
    ~12x slower in a C experiment, 2.4 ms against 0.2 for one thread)."""
    w = taps.window
    current, dims = x, list(x.shape)
    for axis in reversed(range(len(w.kernel))):
        if w.kernel[axis] == 1 and not taps.pads_begin[axis] and w.strides[axis] == 1 and \
                taps.out_dims[axis] == taps.in_dims[axis]:
            continue  # nothing to reduce along this axis
        dims[2 + axis] = taps.out_dims[axis]
        current = compute(tuple(dims), _axis_max(current, taps, axis, reducer, element),
                          name=f"maxpool_axis{axis}", dtype=dtype)
    return current


def _axis_max(source: Tensor, taps: _Taps, axis: int, reducer, element):
    """The body of one stage of :func:`_separable_max_pool`: ``reducer`` over the taps of
    ``axis`` at each output position, taps outside the input skipped."""
    def body(*index: Expr) -> Expr:
        tap = reduce_axis(taps.window.kernel[axis], f"t{axis}")
        pos = taps.position(axis, index[2 + axis], tap)
        at = list(index)
        at[2 + axis] = taps.axis_clamped(axis, pos)
        return reducer(element(source[at]), [tap], condition=taps.axis_guard(axis, pos))

    return body


def _window_sums(x: Tensor, taps: _Taps, element, name: str, finish=lambda s, o: s,
                 dtype: DType | None = None) -> Tensor:
    """A stage summing ``element(x)`` over each window's taps inside the input (in the
    accumulator type: ``finish`` sees a float64 sum for floats)."""

    def body(n: Expr, c: Expr, *o: Expr) -> Expr:
        t = taps.variables()
        pos = taps.positions(o, t)
        total = accurate_sum(element(x[[n, c] + taps.clamped(pos)]), t,
                             condition=taps.guard(pos))
        return finish(total, o)

    shape = tuple(x.shape[:2]) + taps.out_dims
    return compute(shape, body, name=name, dtype=dtype)


@compute_of("AveragePool")
def average_pool(ctx, x, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape,
                 pads, strides):
    """Window sums divided by how many positions count: those inside the input, or inside
    input and pads with ``count_include_pad`` (never the ceil-mode overhang)."""
    taps = _pool_taps(ctx, x, kernel_shape, dict(
        auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides), ceil_mode)
    work = compute_dtype(x.dtype) if x.dtype.is_float else DType.FLOAT64
    acc = accumulator_dtype(work)
    plan = taps.window.plan(_REFUSE, taps.in_dims)
    if count_include_pad:
        bounds = [(-b, d + e) for b, e, d in zip(plan.pads_begin, plan.pads_end, taps.in_dims)]
    else:
        bounds = [(0, d) for d in taps.in_dims]
    taps_per_window = int(np.prod(taps.window.kernel, dtype=np.int64))

    def count_body(*o: Expr) -> Expr:
        t = taps.variables()
        return accurate_sum(const_like(1, work), t, condition=taps.guard(taps.positions(o, t),
                                                                         bounds))

    if taps.stays_within(bounds):  # every window is wholly counted: a constant count
        full = const_like(taps_per_window, acc)
        divide = lambda total, o: total / full  # noqa: E731
    else:
        # Counts are integers up to the window size: stored in ``work`` while that holds them
        # exactly (float32 does up to 2**24), so the scratch stays small.
        exact = work if taps_per_window <= 2 ** 24 else acc
        counts = compute(taps.out_dims, count_body, name="avgpool_count", dtype=exact)
        divide = lambda total, o: total / cast(counts[list(o)], acc)  # noqa: E731
    return _window_sums(x, taps, lambda v: cast(v, work), "avgpool", divide, dtype=x.dtype)


def _lp(p: int, work: DType):
    """|x|**p (in ``work``) and the root of a sum of them (in the sum's accumulator type) for
    LpPool, as the reference writes them."""
    if p == 2:
        return (lambda v: v * v), (lambda s: call("sqrt", s))
    power = const_like(p, work)
    return (lambda v: call("pow", absolute(v), power)), \
        (lambda s: call("pow", s, const_like(1.0 / p, s.dtype)))


@compute_of("LpPool")
def lp_pool(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    _require_float(x)
    if p < 1:
        raise NoCompute(f"p={p}")
    taps = _pool_taps(ctx, x, kernel_shape, dict(
        auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides), ceil_mode)
    power, root = _lp(int(p), compute_dtype(x.dtype))
    return _window_sums(x, taps, lambda v: power(widen(v)), "lppool",
                        lambda s, o: root(s), dtype=x.dtype)


def _global(x: Tensor) -> Reduction:
    require_kernel_dtypes(x, allow_bool=False)
    if x.ndim < 3:
        raise NoCompute("global pooling needs rank >= 3")
    return Reduction(x.shape, tuple(range(2, x.ndim)), keepdims=True)


@compute_of("GlobalAveragePool")
def global_average_pool(ctx, x):
    red = _global(x)
    work = compute_dtype(x.dtype) if x.dtype.is_float else DType.FLOAT64
    count = const_like(red.count, accumulator_dtype(work))
    return reduce_stage(x, red, "sum", "globalavgpool", element=lambda v: cast(v, work),
                        finish=lambda s: s / count, dtype=x.dtype)


@compute_of("GlobalMaxPool")
def global_max_pool(ctx, x):
    return reduce_stage(x, _global(x), "max", "globalmaxpool", element=ordered,
                        dtype=x.dtype)


@compute_of("GlobalLpPool")
def global_lp_pool(ctx, x, *, p):
    _require_float(x)
    if p < 1:
        raise NoCompute(f"p={p}")
    power, root = _lp(int(p), compute_dtype(x.dtype))
    return reduce_stage(x, _global(x), "sum", "globallppool",
                        element=lambda v: power(widen(v)), finish=root, dtype=x.dtype)
