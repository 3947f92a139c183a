"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im and
CausalConvWithState, plus the sliding-window geometry that pooling (``pool.py``) shares.

Layout is channels-first throughout: ``X`` is ``(N, C, D1, ..., Dn)`` and ``W`` is
``(M, C / group, k1, ..., kn)`` (``(C, M / group, k1, ..., kn)`` for ConvTranspose).

The references are vectorised: a convolution is an im2col (one strided copy per kernel tap)
followed by one batched matmul per group, and the transposed forms (ConvTranspose, Col2Im) are
a matmul followed by a scatter-add; both loop over kernel taps only, never over output pixels.
16-bit floats are computed in float32 and rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ember.core.dims import Dim, exact_divide
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.quant import requantize, subtract_zero_point
from ember.ops.registry import Attr, InferContext, RefContext, op
from ember.ops.shape_infer import shape_from_constant

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

Context = InferContext | RefContext

# ----------------------------------------------------------------------------- dim arithmetic


def floor_div(num: Dim, den: int) -> Dim:
    """``num // den`` for a possibly symbolic ``num``; None when it is not knowable."""
    if num is None:
        return None
    if isinstance(num, int):
        return num // den
    return num if den == 1 else exact_divide(num, den)


def ceil_div(num: Dim, den: int) -> Dim:
    """``ceil(num / den)`` for a possibly symbolic ``num``; None when it is not knowable."""
    if num is None:
        return None
    if isinstance(num, int):
        return -(-num // den)
    return num if den == 1 else exact_divide(num, den)


def window_out_dim(in_dim: Dim, extent: int, stride: int, pad_begin: int, pad_end: int,
                   ceil_mode: bool = False) -> Dim:
    """Number of window positions along one axis (ONNX pooling / convolution formula).

    In ceil mode a last window that would start inside the end padding is dropped.
    """
    if in_dim is None:
        return None
    span = in_dim + pad_begin + pad_end - extent
    steps = ceil_div(span, stride) if ceil_mode else floor_div(span, stride)
    if steps is None:
        return None
    if ceil_mode:
        overshoot = steps * stride - (in_dim + pad_begin)
        if not isinstance(overshoot, int):
            return None
        if overshoot >= 0:
            steps = steps - 1
    return steps + 1


# ----------------------------------------------------------------------------- window geometry


@dataclass(frozen=True)
class Plan:
    """A window resolved against an input: output spatial dims and the pads actually used.

    Pads are None when they depend on a dim that is not known at compile time.
    """

    out: tuple[Dim, ...]
    pads_begin: tuple[int | None, ...]
    pads_end: tuple[int | None, ...]


@dataclass(frozen=True)
class Window:
    """Kernel, strides, dilations and padding of a sliding window over the spatial axes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begin..., end...; used when auto_pad is NOTSET
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def extents(self) -> tuple[int, ...]:
        """The span of the dilated kernel along each axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @staticmethod
    def from_attrs(ctx: Context, kernel: Sequence[int], attrs: dict, *,
                   ceil_mode: bool = False) -> "Window":
        """Validate the usual attributes (strides, dilations, pads, auto_pad) for ``kernel``."""
        rank = len(kernel)
        kernel = tuple(int(k) for k in kernel)
        strides = _spatial_ints(ctx, attrs.get("strides"), rank, "strides", default=1)
        dilations = _spatial_ints(ctx, attrs.get("dilations"), rank, "dilations", default=1)
        pads = attrs.get("pads")
        pads = (0,) * (2 * rank) if pads is None else tuple(int(p) for p in pads)
        auto_pad = attrs.get("auto_pad") or "NOTSET"
        if any(k < 1 for k in kernel):
            raise ctx.error(f"kernel_shape {list(kernel)} must be positive")
        if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
            raise ctx.error(f"strides {list(strides)} and dilations {list(dilations)} must be "
                            f"positive")
        if len(pads) != 2 * rank:
            raise ctx.error(f"pads has {len(pads)} values; a {rank}-D window needs {2 * rank} "
                            f"(begin and end of each spatial axis)")
        if any(p < 0 for p in pads):
            raise ctx.error(f"pads {list(pads)} must not be negative")
        if auto_pad not in AUTO_PADS:
            raise ctx.error(f"auto_pad '{auto_pad}' is not one of {', '.join(AUTO_PADS)}")
        return Window(kernel, strides, dilations, pads, auto_pad, bool(ceil_mode))

    def plan(self, ctx: Context, in_dims: Sequence[Dim]) -> Plan:
        """Output dims and effective pads for spatial input dims ``in_dims``."""
        if len(in_dims) != self.rank:
            raise ctx.error(f"the kernel has {self.rank} spatial dims but the input has "
                            f"{len(in_dims)}")
        out: list[Dim] = []
        begins: list[int | None] = []
        ends: list[int | None] = []
        for axis, (size, ext, stride) in enumerate(zip(in_dims, self.extents, self.strides)):
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                n_out = ceil_div(size, stride)
                begin = end = None
                if isinstance(size, int) and isinstance(n_out, int):
                    total = max(0, (n_out - 1) * stride + ext - size)
                    small = total // 2
                    begin = small if self.auto_pad == "SAME_UPPER" else total - small
                    end = total - begin
            else:
                if self.auto_pad == "VALID":
                    begin = end = 0
                else:
                    begin, end = self.pads[axis], self.pads[axis + self.rank]
                n_out = window_out_dim(size, ext, stride, begin, end,
                                       self.ceil_mode and self.auto_pad == "NOTSET")
            if isinstance(n_out, int) and n_out < 1:
                raise ctx.error(f"spatial axis {axis}: the input size {size} with pads "
                                f"({begin}, {end}) is smaller than the window extent {ext}")
            out.append(n_out)
            begins.append(begin)
            ends.append(end)
        return Plan(tuple(out), tuple(begins), tuple(ends))


def _spatial_ints(ctx: Context, value, rank: int, name: str, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank:
        raise ctx.error(f"{name} has {len(value)} values; the window has {rank} spatial axes")
    return value


def spatial_rank(ctx: Context, x: TensorType | None, w: TensorType | None = None,
                 kernel: Sequence[int] | None = None) -> int | None:
    """Number of spatial axes, from whichever of X, W or kernel_shape is known."""
    if x is not None and x.shape is not None:
        if len(x.shape) < 3:
            raise ctx.error(f"input must have rank >= 3 (N, C, spatial...), got {x}")
        return len(x.shape) - 2
    if w is not None and w.shape is not None:
        return len(w.shape) - 2
    if kernel is not None:
        return len(kernel)
    return None


def spatial_out_dims(ctx: InferContext, x: TensorType, kernel: Sequence[Dim] | None,
                     rank: int, *, ceil_mode: bool = False) -> tuple[Dim, ...]:
    """Output spatial dims of a sliding window over ``x``; None dims where not knowable."""
    if kernel is None or any(not isinstance(k, int) for k in kernel):
        return (None,) * rank
    in_dims = x.shape[2:] if x.shape is not None else (None,) * rank
    window = Window.from_attrs(ctx, kernel, ctx.attrs, ceil_mode=ceil_mode)
    return window.plan(ctx, in_dims).out


# ----------------------------------------------------------------------------- array helpers


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to accumulate in: float32 for the 16-bit and 8-bit floats, else unchanged."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return dtype
    if dtype.kind in "iub":
        return dtype
    return np.dtype(np.float32)  # float16 and the ml_dtypes floats


def pad_spatial(x: np.ndarray, begins: Sequence[int], ends: Sequence[int],
                value: float | int = 0) -> np.ndarray:
    """Pad the spatial axes (2...) of ``x`` with a constant."""
    if not any(begins) and not any(ends):
        return x
    widths = [(0, 0), (0, 0)] + [(int(b), int(e)) for b, e in zip(begins, ends)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def pad_for_windows(x: np.ndarray, window: Window, plan: Plan,
                    fill: float | int = 0) -> np.ndarray:
    """``x`` padded with ``fill`` by the plan's pads, and at the end by however much more the
    last window needs (the ceil-mode overhang)."""
    ends = []
    for axis, size in enumerate(x.shape[2:]):
        needed = (plan.out[axis] - 1) * window.strides[axis] + window.extents[axis]
        ends.append(max(plan.pads_end[axis], needed - size - plan.pads_begin[axis]))
    return pad_spatial(x, plan.pads_begin, ends, fill)


def window_taps(padded: np.ndarray, window: Window, plan: Plan) -> Iterator[np.ndarray]:
    """For each kernel tap in row-major order, the ``(N, C, *out)`` strided view of the input
    element that tap reads in every window of a padded input (see :func:`pad_for_windows`)."""
    for tap in np.ndindex(*window.kernel):
        index = tuple(slice(t * d, t * d + (n - 1) * s + 1, s) for t, d, n, s in
                      zip(tap, window.dilations, plan.out, window.strides))
        yield padded[(slice(None), slice(None)) + index]


def conv_core(x: np.ndarray, w: np.ndarray, window: Window, plan: Plan, group: int,
              acc_dtype: np.dtype) -> np.ndarray:
    """Grouped N-D convolution without bias, accumulated in ``acc_dtype``: im2col + matmul."""
    n, c = x.shape[:2]
    m = w.shape[0]
    padded = pad_for_windows(x.astype(acc_dtype, copy=False), window, plan)
    taps = int(np.prod(window.kernel, dtype=np.int64))
    # im2col: (N, C, taps, *out), viewed per image and group as (C/G * taps, prod(out)).
    cols = np.empty((n, c, taps) + tuple(plan.out), dtype=acc_dtype)
    for k, view in enumerate(window_taps(padded, window, plan)):
        cols[:, :, k] = view
    cols = cols.reshape(n, group, (c // group) * taps, int(np.prod(plan.out, dtype=np.int64)))
    kernels = w.astype(acc_dtype, copy=False).reshape(group, m // group, -1)
    out = np.matmul(kernels[None], cols)  # (N, G, M/G, prod(out))
    return out.reshape((n, m) + tuple(plan.out))


def check_conv_channels(ctx: Context, x_channels: Dim, w_shape: Sequence[Dim] | None,
                        group: int) -> None:
    """Conv weights must be (M, C / group, ...) with M divisible by group."""
    if group < 1:
        raise ctx.error(f"group must be positive, got {group}")
    if w_shape is None:
        return
    m, per_group = w_shape[0], w_shape[1]
    if isinstance(x_channels, int) and isinstance(per_group, int) \
            and x_channels != per_group * group:
        raise ctx.error(f"input has {x_channels} channels but W has {per_group} per group "
                        f"x {group} groups = {per_group * group}")
    if isinstance(m, int) and m % group:
        raise ctx.error(f"W has {m} output channels, not divisible by group={group}")


def kernel_of(ctx: Context, attrs: dict, w_shape: Sequence[Dim] | None) -> list[Dim] | None:
    kernel = attrs.get("kernel_shape")
    if kernel is not None:
        kernel = [int(k) for k in kernel]
        if w_shape is not None and (len(w_shape) - 2 != len(kernel) or any(
                isinstance(wk, int) and wk != k for k, wk in zip(kernel, w_shape[2:]))):
            raise ctx.error(f"kernel_shape {kernel} does not match W's shape {list(w_shape)}")
        return kernel
    return list(w_shape[2:]) if w_shape is not None else None


def optional_tensor(ctx: InferContext, index: int) -> TensorType | None:
    """Input ``index`` if it is present and a tensor of known type, else None."""
    if not ctx.has_input(index):
        return None
    t = ctx.inputs[index]
    return t if isinstance(t, TensorType) else None


def _check_rank(ctx: Context, t: TensorType | None, rank: int, what: str) -> None:
    if t is not None and t.shape is not None and len(t.shape) != rank:
        raise ctx.error(f"{what} must have rank {rank}, got {t}")


# ----------------------------------------------------------------------------- Conv family


CONV_ATTRS = {
    "auto_pad": Attr.string("NOTSET"),
    "dilations": Attr.ints(),
    "group": Attr.int(1),
    "kernel_shape": Attr.ints(),
    "pads": Attr.ints(),
    "strides": Attr.ints(),
}


def _conv_type(ctx: InferContext, x_index: int, w_index: int, dtype: DType | None,
               bias_index: int | None = None) -> list[ValueType | None]:
    """Output type of a (possibly quantized) convolution of inputs x_index and w_index."""
    x, w = optional_tensor(ctx, x_index), optional_tensor(ctx, w_index)
    if x is None:
        return [None]
    dtype = dtype or x.dtype
    kernel = kernel_of(ctx, ctx.attrs, w.shape if w is not None else None)
    rank = spatial_rank(ctx, x, w, kernel)
    if rank is None:
        return [TensorType(dtype, None)]
    _check_rank(ctx, w, rank + 2, "W")
    group = int(ctx.attrs["group"])
    w_shape = w.shape if w is not None else None
    x_shape = x.shape if x.shape is not None else (None,) * (rank + 2)
    check_conv_channels(ctx, x_shape[1], w_shape, group)
    m = w_shape[0] if w_shape is not None else None
    bias = optional_tensor(ctx, bias_index) if bias_index is not None else None
    if bias is not None and bias.shape is not None:
        if len(bias.shape) != 1 or (isinstance(m, int) and isinstance(bias.shape[0], int)
                                    and bias.shape[0] != m):
            raise ctx.error(f"bias must be 1-D with one value per output channel ({m}), "
                            f"got {bias}")
    out = spatial_out_dims(ctx, TensorType(x.dtype, x_shape), kernel, rank)
    return [TensorType(dtype, (x_shape[0], m) + tuple(out))]


def run_conv(ctx: RefContext, x: np.ndarray, w: np.ndarray, attrs: dict,
             acc_dtype: np.dtype) -> np.ndarray:
    """The Conv reference without bias, accumulated in ``acc_dtype``."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ctx.error(f"X {x.shape} and W {w.shape} must both have rank >= 3 and equal rank")
    group = int(attrs["group"])
    check_conv_channels(ctx, x.shape[1], w.shape, group)
    kernel = kernel_of(ctx, attrs, w.shape)
    window = Window.from_attrs(ctx, kernel, attrs)
    plan = window.plan(ctx, x.shape[2:])
    return conv_core(x, w, window, plan, group, acc_dtype)


def _add_bias(y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if bias is None:
        return y
    return y + bias.astype(y.dtype, copy=False).reshape((1, -1) + (1,) * (y.ndim - 2))


@op("Conv", family="conv", infer=lambda ctx: _conv_type(ctx, 0, 1, None, bias_index=2),
    attrs=CONV_ATTRS)
def conv(ctx, x, w, b=None, **conv_attrs):
    """N-D grouped convolution (cross-correlation) of X with W, plus bias B."""
    y = run_conv(ctx, x, w, conv_attrs, compute_dtype(x.dtype))
    return _add_bias(y, b).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- blocked depthwise


def _depthwise_blocked_geometry(ctx: Context, x_shape: Sequence[Dim], w_shape: Sequence[Dim],
                                strides: Sequence[int], dilations: Sequence[int],
                                check_lanes: bool = True) -> tuple[Dim, Dim]:
    """(OH, OW) of a blocked convolution, after checking that the shapes fit together
    (``w_shape`` is (C/L, KH, KW, L); ``check_lanes``: that C/L and L are the input's)."""
    if len(x_shape) != 5 or len(w_shape) != 4:
        raise ctx.error(f"X must be (N, C/L, H, W, L) and W (C/L, KH, KW, L), got ranks "
                        f"{len(x_shape)} and {len(w_shape)}")
    if len(strides) != 2 or len(dilations) != 2 or min(*strides, *dilations) < 1:
        raise ctx.error(f"strides {list(strides)} and dilations {list(dilations)} must be two "
                        f"positive integers each")
    for what, xd, wd in (("channel blocks", x_shape[1], w_shape[0]),
                         ("lanes", x_shape[4], w_shape[3])) if check_lanes else ():
        if isinstance(xd, int) and isinstance(wd, int) and xd != wd:
            raise ctx.error(f"X and W disagree on the {what}: {xd} and {wd}")
    out = []
    for size, k, s, d in zip(x_shape[2:4], w_shape[1:3], strides, dilations):
        if not isinstance(size, int) or not isinstance(k, int):
            out.append(None)
            continue
        span = (k - 1) * d + 1
        if k < 1 or size < span:
            raise ctx.error(f"a {k}-tap kernel with dilation {d} does not fit an input of "
                            f"{size}")
        out.append((size - span) // s + 1)
    return out[0], out[1]


def _blocked_operands(ctx: InferContext
                      ) -> tuple[TensorType | None, TensorType | None, TensorType | None]:
    """X, W and B of a blocked convolution, checked to share one float type (X or W None, or
    without a shape: nothing more to infer)."""
    x, w, b = optional_tensor(ctx, 0), optional_tensor(ctx, 1), optional_tensor(ctx, 2)
    if x is None or w is None or x.shape is None or w.shape is None:
        return x, None, None
    if not x.dtype.is_float or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise ctx.error(f"X, W and B must share one float type, got {x}, {w}"
                        + (f", {b}" if b is not None else ""))
    return x, w, b


def _depthwise_blocked_type(ctx: InferContext) -> list[ValueType | None]:
    x, w, b = _blocked_operands(ctx)
    if w is None:
        return [TensorType(x.dtype, None) if x is not None else None]
    oh, ow = _depthwise_blocked_geometry(ctx, x.shape, w.shape, ctx.attrs["strides"],
                                         ctx.attrs["dilations"])
    if b is not None and b.shape is not None and (len(b.shape) != 2 or
                                                  tuple(b.shape) != (w.shape[0], w.shape[3])):
        raise ctx.error(f"B must be (C/L, L) = ({w.shape[0]}, {w.shape[3]}), got {b}")
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], oh, ow, x.shape[4]))]


@op("DepthwiseConvBlocked", family="conv", infer=_depthwise_blocked_type,
    attrs={"strides": Attr.ints([1, 1]), "dilations": Attr.ints([1, 1])})
def depthwise_conv_blocked(ctx, x, w, b=None, *, strides, dilations):
    """A depthwise 2-D convolution over channels blocked by L (ember's own op, made by
    ``passes/block_depthwise.py``; no frontend maps to it): ``X`` is ``(N, C/L, H, W, L)``
    (padding applied before), ``W`` ``(C/L, KH, KW, L)``, ``B`` ``(C/L, L)``, and
    ``Y[n, cb, oh, ow, l] = sum over taps of X[n, cb, oh*sh + kh*dh, ow*sw + kw*dw, l] *
    W[cb, kh, kw, l] + B[cb, l]``, the taps summed in row-major order."""
    oh, ow = _depthwise_blocked_geometry(ctx, x.shape, w.shape, strides, dilations)
    work = compute_dtype(x.dtype)
    total = None
    for kh in range(w.shape[1]):
        for kw in range(w.shape[2]):
            top, left = kh * dilations[0], kw * dilations[1]
            window = x[:, :, top:top + (oh - 1) * strides[0] + 1:strides[0],
                       left:left + (ow - 1) * strides[1] + 1:strides[1], :].astype(work)
            term = window * w[:, kh, kw, :].astype(work).reshape(1, w.shape[0], 1, 1,
                                                                  w.shape[3])
            total = term if total is None else total + term
    if b is not None:
        total = total + b.astype(work)[None, :, None, None, :]
    return total.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- blocked dense


def _check_blocked_groups(ctx: Context, x_shape: Sequence[Dim], w_shape: Sequence[Dim],
                          group: int) -> None:
    """That X's channel blocks are the groups' (W's second dim each) and its lanes W's."""
    if group < 1:
        raise ctx.error(f"group must be positive, got {group}")
    for what, xd, wd in (("input channel blocks", x_shape[1], w_shape[1] * group
                          if isinstance(w_shape[1], int) else None),
                         ("input lanes", x_shape[4], w_shape[4])):
        if isinstance(xd, int) and isinstance(wd, int) and xd != wd:
            raise ctx.error(f"X and W disagree on the {what} (group {group}): {xd} and {wd}")
    if isinstance(w_shape[0], int) and w_shape[0] % group:
        raise ctx.error(f"{w_shape[0]} output channel blocks do not split into {group} groups")


def _blocked_type(ctx: InferContext) -> list[ValueType | None]:
    x, w, b = _blocked_operands(ctx)
    if w is None:
        return [TensorType(x.dtype, None) if x is not None else None]
    if len(x.shape) != 5 or len(w.shape) != 6:
        raise ctx.error(f"X must be (N, C/Li, H, W, Li) and W (M/Lo, C/Li, KH, KW, Li, Lo), "
                        f"got ranks {len(x.shape)} and {len(w.shape)}")
    group = int(ctx.attrs["group"])
    _check_blocked_groups(ctx, x.shape, w.shape, group)
    oh, ow = _depthwise_blocked_geometry(ctx, x.shape, (w.shape[0],) + tuple(w.shape[2:5]),
                                         ctx.attrs["strides"], ctx.attrs["dilations"],
                                         check_lanes=False)
    if b is not None and b.shape is not None and (len(b.shape) != 2 or
                                                  tuple(b.shape) != (w.shape[0], w.shape[5])):
        raise ctx.error(f"B must be (M/Lo, Lo) = ({w.shape[0]}, {w.shape[5]}), got {b}")
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], oh, ow, w.shape[5]))]


@op("ConvBlocked", family="conv", infer=_blocked_type,
    attrs={"strides": Attr.ints([1, 1]), "dilations": Attr.ints([1, 1]), "group": Attr.int(1)})
def conv_blocked(ctx, x, w, b=None, *, strides, dilations, group):
    """A 2-D convolution over channels blocked by the vector width (ember's own op, made by
    ``passes/block_convolutions.py``; no frontend maps to it): ``X`` is
    ``(N, C/Li, H, W, Li)`` (padding applied before), ``W`` ``(M/Lo, C/G/Li, KH, KW, Li, Lo)``,
    ``B`` ``(M/Lo, Lo)``, and ``Y[n, mb, oh, ow, lo] = sum over (cb, kh, kw, li) of
    X[n, g * C/G/Li + cb, oh*sh + kh*dh, ow*sw + kw*dw, li] * W[mb, cb, kh, kw, li, lo] +
    B[mb, lo]``, ``g = mb // (M/G/Lo)`` the group of output block ``mb``."""
    w_taps = (w.shape[0],) + tuple(w.shape[2:5])
    oh, ow = _depthwise_blocked_geometry(ctx, x.shape, w_taps, strides, dilations,
                                         check_lanes=False)
    _check_blocked_groups(ctx, x.shape, w.shape, group)
    work = compute_dtype(x.dtype)
    total = np.zeros((x.shape[0], w.shape[0], oh, ow, w.shape[5]), dtype=work)
    in_blocks, out_blocks = w.shape[1], w.shape[0] // group
    for g in range(group):
        source = x[:, g * in_blocks:(g + 1) * in_blocks]
        outs = slice(g * out_blocks, (g + 1) * out_blocks)
        for kh in range(w.shape[2]):
            for kw in range(w.shape[3]):
                top, left = kh * dilations[0], kw * dilations[1]
                window = source[:, :, top:top + (oh - 1) * strides[0] + 1:strides[0],
                                left:left + (ow - 1) * strides[1] + 1:strides[1], :].astype(work)
                # (n, cb, oh, ow, li) x (mb, cb, li, lo) -> (n, mb, oh, ow, lo)
                total[:, outs] += np.einsum("ncyxi,mcio->nmyxo", window,
                                            w[outs, :, kh, kw].astype(work))
    if b is not None:
        total = total + b.astype(work)[None, :, None, None, :]
    return total.astype(x.dtype, copy=False)


@op("ConvInteger", family="conv", infer=lambda ctx: _conv_type(ctx, 0, 1, DType.INT32),
    attrs=CONV_ATTRS)
def conv_integer(ctx, x, w, x_zero_point=None, w_zero_point=None, **conv_attrs):
    """Convolution of 8-bit integers minus their zero points, accumulated in int32."""
    xs = subtract_zero_point(ctx, x, x_zero_point, channel_axis=1)
    ws = subtract_zero_point(ctx, w, w_zero_point, channel_axis=0)
    # Padding adds zeros to the zero-point-corrected input, as the spec's formula implies.
    return run_conv(ctx, xs, ws, conv_attrs, np.dtype(np.int32)).astype(np.int32)


def _qlinear_conv_type(ctx: InferContext) -> list[ValueType | None]:
    y_zero_point = optional_tensor(ctx, 7)
    x = optional_tensor(ctx, 0)
    dtype = y_zero_point.dtype if y_zero_point is not None else (x.dtype if x else None)
    return _conv_type(ctx, 0, 3, dtype, bias_index=8)


@op("QLinearConv", family="conv", infer=_qlinear_conv_type, attrs=CONV_ATTRS)
def qlinear_conv(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point, b=None, **conv_attrs):
    """Quantized convolution: int32 accumulation of zero-point-corrected inputs, requantized."""
    xs = subtract_zero_point(ctx, x, x_zero_point, channel_axis=1)
    ws = subtract_zero_point(ctx, w, w_zero_point, channel_axis=0)
    acc = run_conv(ctx, xs, ws, conv_attrs, np.dtype(np.int32))
    if b is not None:
        acc = acc + b.astype(np.int32).reshape((1, -1) + (1,) * (acc.ndim - 2))
    w_scale = np.asarray(w_scale)
    if w_scale.ndim == 1 and w_scale.size > 1:
        if w_scale.size != w.shape[0]:
            raise ctx.error(f"w_scale has {w_scale.size} values; W has {w.shape[0]} output "
                            f"channels")
        w_scale = w_scale.reshape((-1,) + (1,) * (acc.ndim - 2))
    multiplier = np.asarray(x_scale) * w_scale / np.asarray(y_scale)
    out_dtype = y_zero_point.dtype if y_zero_point is not None else x.dtype
    return requantize(acc, multiplier, y_zero_point, out_dtype)


# ----------------------------------------------------------------------------- ConvTranspose


@dataclass(frozen=True)
class TransposePlan:
    """Output dims of a transposed convolution and where its full result is cropped from."""

    out: tuple[Dim, ...]
    crop_begin: tuple[int | None, ...]


def transpose_plan(ctx: Context, in_dims: Sequence[Dim], window: Window,
                    output_padding: Sequence[int], output_shape: Sequence[int] | None
                    ) -> TransposePlan:
    rank = window.rank
    if output_shape is not None:
        output_shape = list(output_shape)[-rank:] if len(output_shape) >= rank else None
        if output_shape is None:
            raise ctx.error(f"output_shape must give the {rank} spatial output dims")
    out: list[Dim] = []
    crops: list[int | None] = []
    for axis, size in enumerate(in_dims):
        stride, ext = window.strides[axis], window.extents[axis]
        full = None if size is None else stride * (size - 1) + output_padding[axis] + ext
        if output_shape is not None or window.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if output_shape is not None:
                n_out = int(output_shape[axis])
            else:
                n_out = None if size is None else size * stride
            crop = None
            if full is not None and n_out is not None:
                total = full - n_out
                if isinstance(total, int):
                    # Floor division, as the ONNX reference does for a negative total.
                    crop = total // 2 if window.auto_pad == "SAME_UPPER" else total - total // 2
        else:
            begin, end = (0, 0) if window.auto_pad == "VALID" else (
                window.pads[axis], window.pads[axis + rank])
            n_out = None if full is None else full - begin - end
            crop = begin
        if isinstance(n_out, int) and n_out < 1:
            raise ctx.error(f"spatial axis {axis}: the output size {n_out} is not positive")
        out.append(n_out)
        crops.append(crop)
    return TransposePlan(tuple(out), tuple(crops))


def transpose_window(ctx: Context, attrs: dict, kernel: Sequence[int]
                      ) -> tuple[Window, tuple[int, ...]]:
    window = Window.from_attrs(ctx, kernel, attrs)
    output_padding = attrs.get("output_padding")
    if output_padding is None:
        output_padding = (0,) * window.rank
    output_padding = tuple(int(p) for p in output_padding)
    if len(output_padding) == 2 * window.rank:  # some exporters write begin and end values
        output_padding = output_padding[window.rank:]
    if len(output_padding) != window.rank:
        raise ctx.error(f"output_padding has {len(output_padding)} values; expected "
                        f"{window.rank}")
    return window, output_padding


def _conv_transpose_type(ctx: InferContext) -> list[ValueType | None]:
    x, w = optional_tensor(ctx, 0), optional_tensor(ctx, 1)
    if x is None:
        return [None]
    w_shape = w.shape if w is not None else None
    kernel = kernel_of(ctx, ctx.attrs, w_shape)
    rank = spatial_rank(ctx, x, w, kernel)
    if rank is None:
        return [TensorType(x.dtype, None)]
    _check_rank(ctx, w, rank + 2, "W")
    group = int(ctx.attrs["group"])
    x_shape = x.shape if x.shape is not None else (None,) * (rank + 2)
    m = None
    if w_shape is not None:
        c_in = w_shape[0]
        if isinstance(x_shape[1], int) and isinstance(c_in, int) and x_shape[1] != c_in:
            raise ctx.error(f"input has {x_shape[1]} channels but W expects {c_in}")
        m = w_shape[1] * group if w_shape[1] is not None else None
    if kernel is None or any(not isinstance(k, int) for k in kernel):
        return [TensorType(x.dtype, (x_shape[0], m) + (None,) * rank)]
    window, output_padding = transpose_window(ctx, ctx.attrs, kernel)
    plan = transpose_plan(ctx, x_shape[2:], window, output_padding,
                           ctx.attrs.get("output_shape"))
    return [TensorType(x.dtype, (x_shape[0], m) + plan.out)]


def scatter_blocks(blocks: np.ndarray, window: Window, grid: Sequence[int],
                   crop_begin: Sequence[int], out_dims: Sequence[int]) -> np.ndarray:
    """Sum kernel-sized blocks back into an image (the adjoint of im2col).

    ``blocks`` is ``(N, C, prod(kernel), *grid)``: block ``g`` at kernel offset ``k`` adds to
    position ``g * stride + k * dilation - crop_begin``; positions outside ``out_dims`` drop.
    """
    n, c = blocks.shape[:2]
    canvas_dims = [(g - 1) * s + e for g, s, e in zip(grid, window.strides, window.extents)]
    canvas = np.zeros((n, c, *canvas_dims), dtype=blocks.dtype)
    for k, offset in enumerate(np.ndindex(*window.kernel)):
        index = tuple(slice(o * d, o * d + (g - 1) * s + 1, s)
                      for o, d, g, s in zip(offset, window.dilations, grid, window.strides))
        canvas[(slice(None), slice(None)) + index] += blocks[:, :, k]
    return _crop(canvas, crop_begin, out_dims)


def _crop(canvas: np.ndarray, begins: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Spatial window ``[begin, begin + size)`` of ``canvas``; zeros where it lies outside."""
    out = np.zeros(canvas.shape[:2] + tuple(sizes), dtype=canvas.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for begin, size, have in zip(begins, sizes, canvas.shape[2:]):
        lo, hi = max(begin, 0), min(begin + size, have)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - begin, hi - begin))
    out[tuple(dst)] = canvas[tuple(src)]
    return out


@op("ConvTranspose", family="conv", infer=_conv_transpose_type,
    attrs={**CONV_ATTRS, "output_padding": Attr.ints(), "output_shape": Attr.ints()})
def conv_transpose(ctx, x, w, b=None, *, group, output_shape, **window_attrs):
    """Transposed convolution (the gradient of Conv w.r.t. its input), plus bias B."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ctx.error(f"X {x.shape} and W {w.shape} must both have rank >= 3 and equal rank")
    n, c = x.shape[:2]
    if c != w.shape[0] or c % group:
        raise ctx.error(f"input has {c} channels; W {w.shape} expects {w.shape[0]} and they "
                        f"must divide into group={group}")
    kernel = kernel_of(ctx, window_attrs, w.shape)
    window, out_pad = transpose_window(ctx, window_attrs, kernel)
    plan = transpose_plan(ctx, x.shape[2:], window, out_pad, output_shape)
    acc = compute_dtype(x.dtype)
    m_group = w.shape[1]
    grid = x.shape[2:]
    # Per group: (M/G * prod(K), C/G) @ (C/G, prod(grid)) gives every block's contribution.
    kernels = w.astype(acc, copy=False).reshape(group, c // group, -1).transpose(0, 2, 1)
    images = x.astype(acc, copy=False).reshape(n, group, c // group, int(np.prod(grid)))
    blocks = np.matmul(kernels[None], images)  # (N, G, M/G * prod(K), prod(grid))
    blocks = blocks.reshape(n, group * m_group, int(np.prod(window.kernel)), *grid)
    y = scatter_blocks(blocks, window, grid, plan.crop_begin, plan.out)
    return _add_bias(y, b).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- Col2Im


def _col2im_type(ctx: InferContext) -> list[ValueType | None]:
    x = optional_tensor(ctx, 0)
    if x is None:
        return [None]
    _check_rank(ctx, x, 3, "input")
    image = ctx.value(1)
    block = ctx.value(2)
    rank = None
    for index in (1, 2):
        t = optional_tensor(ctx, index)
        if t is not None and t.shape is not None and len(t.shape) == 1 \
                and isinstance(t.shape[0], int):
            rank = t.shape[0]
    image_dims = shape_from_constant(image, rank) if image is not None or rank else None
    if image_dims is None:
        return [TensorType(x.dtype, None)]
    n, channels = (x.shape[0], x.shape[1]) if x.shape is not None else (None, None)
    if block is not None and channels is not None:
        block_size = int(np.prod(np.asarray(block, dtype=np.int64)))
        c = exact_divide(channels, block_size)
        if c is None and isinstance(channels, int):
            raise ctx.error(f"input dim 1 ({channels}) is not a multiple of the block size "
                            f"{block_size}")
        channels = c
    else:
        channels = None
    return [TensorType(x.dtype, (n, channels) + tuple(image_dims))]


@op("Col2Im", family="conv", infer=_col2im_type,
    attrs={"dilations": Attr.ints(), "pads": Attr.ints(), "strides": Attr.ints()})
def col2im(ctx, x, image_shape, block_shape, *, dilations, pads, strides):
    """Sum column blocks (N, C*prod(block), L) back into images (N, C, *image_shape)."""
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    if len(image) != len(block):
        raise ctx.error(f"image_shape {image} and block_shape {block} differ in length")
    window = Window.from_attrs(ctx, block, dict(dilations=dilations, pads=pads, strides=strides))
    plan = window.plan(ctx, image)
    n, cols, length = x.shape
    block_size = int(np.prod(block))
    if cols % block_size:
        raise ctx.error(f"input dim 1 ({cols}) is not a multiple of the block size {block_size}")
    if length != int(np.prod(plan.out)):
        raise ctx.error(f"input has {length} blocks; image {image} with block {block}, pads, "
                        f"strides and dilations gives {list(plan.out)} = "
                        f"{int(np.prod(plan.out))}")
    blocks = x.reshape(n, cols // block_size, block_size, *plan.out)
    return scatter_blocks(blocks, window, plan.out, plan.pads_begin, image)


# ----------------------------------------------------------------------------- DeformConv


def _deform_conv_type(ctx: InferContext) -> list[ValueType | None]:
    [result] = _conv_type(ctx, 0, 1, None, bias_index=3)
    offset = optional_tensor(ctx, 2)
    if isinstance(result, TensorType) and result.shape is not None and offset is not None \
            and offset.shape is not None:
        # The offsets' spatial dims are the output's; use them where inference had none.
        dims = tuple(d if d is not None else o
                     for d, o in zip(result.shape[2:], offset.shape[2:]))
        result = TensorType(result.dtype, result.shape[:2] + dims)
    return [result]


def _sample_linear(images: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Multilinear interpolation of ``images`` (N, C, *S) at ``coords`` (N, P, D), zero outside.

    Returns (N, C, P).
    """
    n, c = images.shape[:2]
    sizes = images.shape[2:]
    flat = images.reshape(n, c, int(np.prod(sizes)))
    base = np.floor(coords)
    frac = coords - base
    base = base.astype(np.int64)
    result = np.zeros((n, c, coords.shape[1]), dtype=images.dtype)
    for corner in np.ndindex(*(2,) * len(sizes)):
        weight = np.ones(coords.shape[:2], dtype=images.dtype)
        index = np.zeros(coords.shape[:2], dtype=np.int64)
        inside = np.ones(coords.shape[:2], dtype=bool)
        for axis, bit in enumerate(corner):
            pos = base[..., axis] + bit
            weight = weight * (frac[..., axis] if bit else 1 - frac[..., axis])
            inside &= (pos >= 0) & (pos < sizes[axis])
            index = index * sizes[axis] + np.clip(pos, 0, sizes[axis] - 1)
        values = np.take_along_axis(flat, index[:, None, :], axis=2)
        result += values * np.where(inside, weight, 0)[:, None, :].astype(images.dtype)
    return result


@op("DeformConv", family="conv", infer=_deform_conv_type,
    attrs={"dilations": Attr.ints(), "group": Attr.int(1), "kernel_shape": Attr.ints(),
           "offset_group": Attr.int(1), "pads": Attr.ints(), "strides": Attr.ints()})
def deform_conv(ctx, x, w, offset, b=None, mask=None, *, group, offset_group,
                **window_attrs):
    """Deformable convolution: kernel taps sampled (bilinearly) at learned offsets."""
    n, c = x.shape[:2]
    check_conv_channels(ctx, c, w.shape, group)
    kernel = kernel_of(ctx, window_attrs, w.shape)
    window = Window.from_attrs(ctx, kernel, window_attrs)
    out = tuple(offset.shape[2:])
    rank, taps = window.rank, int(np.prod(kernel))
    if offset_group < 1 or c % offset_group:
        raise ctx.error(f"offset_group={offset_group} must divide the {c} input channels")
    if offset.shape[:2] != (n, offset_group * taps * rank):
        raise ctx.error(f"offset {offset.shape} must be (N, offset_group * prod(kernel) * "
                        f"{rank}, *out) = ({n}, {offset_group * taps * rank}, ...)")
    if window.plan(ctx, x.shape[2:]).out != out:
        raise ctx.error(f"offset spatial dims {list(out)} differ from the convolution's "
                        f"output {list(window.plan(ctx, x.shape[2:]).out)}")
    acc = compute_dtype(x.dtype)
    positions = int(np.prod(out))
    # Undeformed sampling grid: out_pos * stride - pad_begin + kernel_pos * dilation.
    grid = np.stack(np.meshgrid(*[np.arange(o) * s - p for o, s, p in
                                  zip(out, window.strides, window.pads[:rank])],
                                 indexing="ij"), -1)
    taps_grid = np.stack(np.meshgrid(*[np.arange(k) * d for k, d in
                                       zip(kernel, window.dilations)], indexing="ij"), -1)
    base = taps_grid.reshape(taps, 1, rank) + grid.reshape(1, positions, rank)
    shifts = offset.astype(acc).reshape(n, offset_group, taps, rank, positions)
    coords = base[None, None] + shifts.transpose(0, 1, 2, 4, 3)  # (N, OG, taps, P, D)
    if mask is None:
        weights = np.ones((n, offset_group, taps, positions), dtype=acc)
    else:
        weights = mask.astype(acc).reshape(n, offset_group, taps, positions)
    per_group = c // offset_group
    sampled = np.empty((n, c, taps, positions), dtype=acc)
    for g in range(offset_group):
        channels = slice(g * per_group, (g + 1) * per_group)
        values = _sample_linear(x[:, channels].astype(acc),
                                coords[:, g].reshape(n, taps * positions, rank))
        sampled[:, channels] = values.reshape(n, per_group, taps, positions) \
            * weights[:, g][:, None]
    cols = sampled.reshape(n, group, (c // group) * taps, positions)
    kernels = w.astype(acc).reshape(group, w.shape[0] // group, -1)
    y = np.matmul(kernels[None], cols).reshape((n, w.shape[0]) + out)
    return _add_bias(y, b).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- causal conv


def _causal_conv_type(ctx: InferContext) -> list[ValueType | None]:
    x, w = optional_tensor(ctx, 0), optional_tensor(ctx, 1)
    if x is None:
        return [None, None]
    _check_rank(ctx, x, 3, "input")
    _check_rank(ctx, w, 3, "weight")
    shape = x.shape if x.shape is not None else (None, None, None)
    k = w.shape[2] if w is not None and w.shape is not None else None
    if w is not None and w.shape is not None:
        channels, one = w.shape[0], w.shape[1]
        if isinstance(shape[1], int) and isinstance(channels, int) and shape[1] != channels \
                or isinstance(one, int) and one != 1:
            raise ctx.error(f"weight must be (channels, 1, k) with channels = {shape[1]}, "
                            f"got {w}")
    state = None if k is None else k - 1
    return [TensorType(x.dtype, shape), TensorType(x.dtype, (shape[0], shape[1], state))]


@op("CausalConvWithState", family="conv", infer=_causal_conv_type,
    attrs={"activation": Attr.string("none")}, outputs=(1, 2))
def causal_conv_with_state(ctx, x, w, b=None, past_state=None, *, activation):
    """Depthwise causal 1-D convolution over [past_state, x]; returns output and new state."""
    if activation not in ("none", "silu", "swish"):
        raise ctx.error(f"activation '{activation}' is not one of none, silu, swish")
    if x.ndim != 3 or w.ndim != 3 or w.shape[1] != 1 or w.shape[0] != x.shape[1]:
        raise ctx.error(f"input {x.shape} must be (batch, channels, length) and weight "
                        f"{w.shape} (channels, 1, k)")
    batch, channels, _ = x.shape
    k = w.shape[2]
    if past_state is None:
        past_state = np.zeros((batch, channels, k - 1), dtype=x.dtype)
    elif past_state.shape != (batch, channels, k - 1):
        raise ctx.error(f"past_state {past_state.shape} must be {(batch, channels, k - 1)}")
    acc = compute_dtype(x.dtype)
    padded = np.concatenate([past_state.astype(acc), x.astype(acc)], axis=2)
    windows = sliding_window_view(padded, k, axis=2)  # (B, C, L, k)
    y = np.einsum("bclk,ck->bcl", windows, w[:, 0].astype(acc))
    if b is not None:
        y = y + b.astype(acc)[None, :, None]
    if activation != "none":
        y = y / (1 + np.exp(-y))
    present = padded[:, :, padded.shape[2] - (k - 1):]
    return y.astype(x.dtype), present.astype(x.dtype)

