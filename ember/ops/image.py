"""Image ops: resampling (Resize, GridSample, AffineGrid) and detection (RoiAlign,
NonMaxSuppression).

Resize and GridSample share their interpolation kernels (nearest, linear, Keys cubic).
Interpolation runs in float64 (complex128 for complex data) and the result is cast back to
the input's dtype; integer outputs are rounded and saturated, as the ONNX reference does.
Nearest-neighbour resampling gathers values without arithmetic, so it works for every dtype.

Resize's plan (:func:`resize_plan`: which axes change, their lengths, scales and rois), its
coordinate formulas (:func:`source_coordinate`) and its tap positions (:func:`tap_offsets`) are
public: the compiled kernel (``ember/ops/compute/image.py``) evaluates the very same formulas
on loop-IR expressions, so the two cannot drift apart.

The older forms of these ops (Resize-10, Upsample, GridSample-16, RoiAlign-10) are rewritten
into the newest ones by ``ember/frontend/onnx/upgrades/image.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ember.core.dims import Dim, dims_equal
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import Attr, InferContext, op
from ember.ops.shape_infer import normalize_axis, shape_from_constant, tensor_input

Kernel = Callable[[np.ndarray], np.ndarray]

# ----------------------------------------------------------------------------- shared helpers


def _linear_kernel(t: np.ndarray) -> np.ndarray:
    """The triangle kernel: 1 - |t| on (-1, 1), 0 elsewhere."""
    return np.maximum(0.0, 1.0 - np.abs(t))


def _cubic_kernel(a: float) -> Kernel:
    """Keys' cubic convolution kernel with coefficient ``a`` (support (-2, 2))."""

    def kernel(t: np.ndarray) -> np.ndarray:
        t = np.abs(t)
        near = ((a + 2) * t - (a + 3)) * t * t + 1
        far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

    return kernel


def _working_dtype(ctx, dtype: np.dtype) -> np.dtype:
    """The dtype interpolation arithmetic runs in for data of ``dtype``."""
    if dtype.kind == "c":
        return np.dtype(np.complex128)
    if dtype.kind in "iuf" or DType.from_numpy(dtype).is_float:
        return np.dtype(np.float64)
    raise ctx.error(f"cannot interpolate values of dtype {dtype}; only nearest mode "
                    f"supports it")


def _cast_result(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast interpolated values back to ``dtype``: integers are rounded and saturated."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(values), info.min, info.max).astype(dtype)
    return values.astype(dtype)


def _static_ints(dims: Sequence[Dim]) -> list[int] | None:
    return [int(d) for d in dims] if all(isinstance(d, int) for d in dims) else None


def _same_dim(ctx, a: Dim, b: Dim, what: str) -> Dim:
    """The common value of two dims that must agree (the more precise one)."""
    if dims_equal(a, b) is False:
        raise ctx.error(f"{what} disagree: {a} vs {b}")
    if a is None or (isinstance(b, int) and not isinstance(a, int)):
        return b
    return a


# ----------------------------------------------------------------------------- Resize

_RESIZE_MODES = ("nearest", "linear", "cubic")
# "tf_half_pixel_for_nn" is Resize-11's; opset 13 removed it and it has no exact newest-form
# equivalent, so ember keeps accepting it for models exported at opset 11.
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                     "align_corners", "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _check_resize_attrs(ctx, attrs: dict) -> None:
    for name, allowed in (("mode", _RESIZE_MODES),
                          ("coordinate_transformation_mode", _COORDINATE_MODES),
                          ("nearest_mode", _NEAREST_MODES),
                          ("keep_aspect_ratio_policy", _ASPECT_POLICIES)):
        if attrs[name] not in allowed:
            raise ctx.error(f"{name} must be one of {list(allowed)}, got {attrs[name]!r}")


def _resize_axes(ctx, axes: list[int] | None, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    normalized = [normalize_axis(a, rank, ctx) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise ctx.error(f"axes {axes} repeat an axis")
    return normalized


def _nonempty(value: np.ndarray | None) -> np.ndarray | None:
    """Resize-11 passes an empty tensor for an unused roi/scales; treat it as absent."""
    return None if value is None or np.asarray(value).size == 0 else np.asarray(value)


def _resize_lengths(ctx, in_dims: Sequence[int], scales: np.ndarray | None,
                    sizes: Sequence[int] | None, policy: str) -> tuple[list[float], list[int]]:
    """Per resized axis: the scale the coordinate transform uses and the output length."""
    count = len(in_dims)
    if scales is not None:
        scales32 = np.asarray(scales, dtype=np.float32).reshape(-1)
        if scales32.size != count:
            raise ctx.error(f"scales has {scales32.size} values for {count} resized axes")
        if np.any(~(scales32 > 0)):
            raise ctx.error(f"scales must be positive, got {scales32.tolist()}")
        # ONNX computes floor(dim * scale) in float32.
        lengths = [int(np.floor(np.float32(d) * s)) for d, s in zip(in_dims, scales32)]
        return [float(s) for s in scales32], lengths
    assert sizes is not None
    if len(sizes) != count:
        raise ctx.error(f"sizes has {len(sizes)} values for {count} resized axes")
    if any(s < 0 for s in sizes):
        raise ctx.error(f"sizes must not be negative, got {list(sizes)}")
    ratios = [s / d if d else 1.0 for s, d in zip(sizes, in_dims)]
    if policy == "stretch":
        return ratios, [int(s) for s in sizes]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    return [scale] * count, [int(np.floor(scale * d + 0.5)) for d in in_dims]


def _infer_resize(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _check_resize_attrs(ctx, ctx.attrs)
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    axes = _resize_axes(ctx, ctx.attrs["axes"], len(x.shape))
    has_scales = ctx.has_input(2) and not (ctx.value(2) is not None and ctx.value(2).size == 0)
    has_sizes = ctx.has_input(3)
    if not has_scales and not has_sizes:
        raise ctx.error("one of the inputs scales and sizes must be given")
    if has_scales and has_sizes and ctx.value(2) is not None:
        raise ctx.error("only one of the inputs scales and sizes may be given")
    out = list(x.shape)
    for a in axes:
        out[a] = None
    in_dims = [x.shape[a] for a in axes]
    if has_scales:
        scales = ctx.value(2)
        if scales is None:
            return [x.with_shape(out)]
        _resize_lengths(ctx, [1] * len(in_dims), scales, None, "stretch")  # validates
        lengths = [_scaled_dim(d, s) for d, s in zip(in_dims, scales.reshape(-1))]
    else:
        sizes = shape_from_constant(ctx.value(3))
        if sizes is None:
            return [x.with_shape(out)]
        if len(sizes) != len(axes):
            raise ctx.error(f"sizes has {len(sizes)} values for {len(axes)} resized axes")
        if any(isinstance(s, int) and s < 0 for s in sizes):
            raise ctx.error(f"sizes must not be negative, got {list(sizes)}")
        policy = ctx.attrs["keep_aspect_ratio_policy"]
        if policy == "stretch":
            lengths = list(sizes)
        elif _static_ints(in_dims) is not None and _static_ints(sizes) is not None:
            _, lengths = _resize_lengths(ctx, _static_ints(in_dims), None,
                                         _static_ints(sizes), policy)
        else:
            lengths = [None] * len(axes)
    for a, length in zip(axes, lengths):
        out[a] = length
    return [x.with_shape(out)]


def _scaled_dim(dim: Dim, scale: float) -> Dim:
    """floor(dim * scale) as ONNX computes it (in float32), or None if not expressible."""
    scale32 = np.float32(scale)
    if isinstance(dim, int):
        return int(np.floor(np.float32(dim) * scale32))
    if dim is not None and float(scale32).is_integer():
        return dim * int(scale32)
    return None


@dataclass(frozen=True)
class ResizeAxis:
    """One axis that Resize resamples: its position, input and output lengths, the scale its
    coordinate transform uses and its region of interest (start, end)."""

    axis: int
    in_len: int
    out_len: int
    scale: float
    roi: tuple[float, float]


def resize_plan(ctx, shape: Sequence[int], roi: np.ndarray | None, scales: np.ndarray | None,
                sizes: np.ndarray | None, attrs: dict) -> list[ResizeAxis]:
    """The axes Resize changes, in the order it resamples them.

    Axes it leaves as they are (same length, scale 1, whole roi) are not listed: the reference
    skips them, so the kernel must too, rather than re-derive each position through floats.
    """
    axes = _resize_axes(ctx, attrs["axes"], len(shape))
    scales, sizes, roi = _nonempty(scales), _nonempty(sizes), _nonempty(roi)
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of the inputs scales and sizes must be given")
    in_dims = [int(shape[a]) for a in axes]
    axis_scales, lengths = _resize_lengths(
        ctx, in_dims, scales, None if sizes is None else [int(s) for s in sizes.reshape(-1)],
        attrs["keep_aspect_ratio_policy"])
    if roi is None:
        rois = [(0.0, 1.0)] * len(axes)
    else:
        roi = roi.astype(np.float64).reshape(-1)
        if roi.size != 2 * len(axes):
            raise ctx.error(f"roi has {roi.size} values; it needs 2 per resized axis "
                            f"({2 * len(axes)})")
        rois = [(float(a), float(b)) for a, b in zip(roi[:len(axes)], roi[len(axes):])]
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    plan = []
    for axis, in_len, scale, length, axis_roi in zip(axes, in_dims, axis_scales, lengths, rois):
        if length == in_len and scale == 1.0 and (not crop or axis_roi == (0, 1)):
            continue  # identity along this axis
        plan.append(ResizeAxis(axis, in_len, length, scale, axis_roi))
    return plan


def source_coordinate(mode: str, y: Any, out_len: int, in_len: int, scale: float,
                      roi: tuple[float, float]) -> Any:
    """Where output position ``y`` along one axis samples the input (ONNX's x_original).

    ``y`` is a float64 array of positions (the reference) or a float64 loop-IR expression (the
    compiled kernel): the formulas use only + - * / on it, in the same order for both, so the
    two agree bit for bit.
    """
    out_width = scale * in_len  # the fractional output length the formulas refer to
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_width)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_width > 1 else y * 0.0
    if mode == "align_corners":
        return y * 0.0 if out_width == 1 else y * (in_len - 1) / (out_width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    start, end = roi  # tf_crop_and_resize
    if out_width > 1:
        return start * (in_len - 1) + y * (end - start) * (in_len - 1) / (out_width - 1)
    return y * 0.0 + 0.5 * (start + end) * (in_len - 1)


def round_nearest(x: Any, nearest_mode: str, floor: Callable[[Any], Any] = np.floor,
                  ceil: Callable[[Any], Any] = np.ceil) -> Any:
    """The input position nearest to coordinate ``x`` by ``nearest_mode`` (before clamping);
    ``floor``/``ceil`` work on arrays or, for the kernel, on expressions."""
    if nearest_mode == "round_prefer_floor":
        return ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return floor(x + 0.5)
    if nearest_mode == "floor":
        return floor(x)
    return ceil(x)


def tap_offsets(support: float, stretch: float = 1.0) -> list[int]:
    """Offsets from floor(coordinate) of the input positions a kernel of half-width
    ``support``, widened by 1/``stretch``, may weigh ([0, 1] for linear, [-1 .. 2] for cubic)."""
    radius = support / stretch
    return [int(o) for o in np.arange(np.floor(-radius) + 1, np.ceil(radius) + 1)]


def _interpolation_matrix(coords: np.ndarray, in_len: int, kernel: Kernel, support: float,
                          stretch: float, normalize: bool, exclude_outside: bool) -> np.ndarray:
    """The (out, in) matrix of weights sampling ``kernel`` at every coordinate.

    ``stretch`` < 1 widens the kernel by 1/stretch (antialiasing).  Taps outside the input
    are clamped to the edge, or dropped and the weights renormalized if ``exclude_outside``.
    """
    offsets = np.array(tap_offsets(support, stretch), dtype=np.float64)
    taps = np.floor(coords)[:, None] + offsets[None, :]
    weights = kernel((taps - coords[:, None]) * stretch)
    if normalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    matrix = np.zeros((len(coords), in_len))
    rows = np.broadcast_to(np.arange(len(coords))[:, None], taps.shape)
    np.add.at(matrix, (rows, np.clip(taps, 0, in_len - 1).astype(np.intp)), weights)
    return matrix


def _resize_axis(data: np.ndarray, axis: int, out_len: int, scale: float,
                 roi: tuple[float, float], attrs: dict) -> np.ndarray:
    """Resample ``data`` along one axis (resizing is separable)."""
    in_len = data.shape[axis]
    if in_len == 0 or out_len == 0:
        shape = list(data.shape)
        shape[axis] = out_len
        return np.zeros(shape, dtype=data.dtype)
    mode = attrs["coordinate_transformation_mode"]
    coords = source_coordinate(mode, np.arange(out_len, dtype=np.float64), out_len, in_len,
                               scale, roi)
    if attrs["mode"] == "nearest":
        index = np.clip(round_nearest(coords, attrs["nearest_mode"]), 0, in_len - 1)
        result = np.take(data, index.astype(np.intp), axis=axis)
    else:
        if attrs["mode"] == "linear":
            kernel, support = _linear_kernel, 1.0
        else:
            kernel, support = _cubic_kernel(attrs["cubic_coeff_a"]), 2.0
        antialias = bool(attrs["antialias"])
        stretch = min(scale, 1.0) if antialias else 1.0
        matrix = _interpolation_matrix(coords, in_len, kernel, support, stretch, antialias,
                                       bool(attrs["exclude_outside"]))
        result = np.moveaxis(np.tensordot(matrix, data, axes=([1], [axis])), 0, axis)
    if mode == "tf_crop_and_resize":
        outside = (coords < 0) | (coords > in_len - 1)
        if outside.any():
            result = np.array(result)
            index = [slice(None)] * result.ndim
            index[axis] = outside
            result[tuple(index)] = np.asarray(attrs["extrapolation_value"]).astype(result.dtype)
    return result


@op("Resize", family="image", infer=_infer_resize, attrs={
    "antialias": Attr.int(0),
    "axes": Attr.ints(None),
    "coordinate_transformation_mode": Attr.string("half_pixel"),
    "cubic_coeff_a": Attr.float(-0.75),
    "exclude_outside": Attr.int(0),
    "extrapolation_value": Attr.float(0.0),
    "keep_aspect_ratio_policy": Attr.string("stretch"),
    "mode": Attr.string("nearest"),
    "nearest_mode": Attr.string("round_prefer_floor"),
})
def resize(ctx, x, roi=None, scales=None, sizes=None, **attrs):
    """Resample X to new sizes or by scales with nearest, (N-)linear or (N-)cubic interpolation."""
    _check_resize_attrs(ctx, attrs)
    plan = resize_plan(ctx, x.shape, roi, scales, sizes, attrs)
    interpolate = attrs["mode"] != "nearest"
    data = x.astype(_working_dtype(ctx, x.dtype)) if interpolate else x
    for step in plan:
        data = _resize_axis(data, step.axis, step.out_len, step.scale, step.roi, attrs)
    return _cast_result(data, x.dtype) if interpolate else np.array(data, dtype=x.dtype)


# ----------------------------------------------------------------------------- GridSample

_GRID_MODES = ("linear", "nearest", "cubic")
_PADDING_MODES = ("zeros", "border", "reflection")


def _infer_grid_sample(ctx: InferContext) -> list[ValueType | None]:
    x, grid = tensor_input(ctx, 0), tensor_input(ctx, 1)
    _check_grid_attrs(ctx, ctx.attrs)
    if x.shape is not None and len(x.shape) < 3:
        raise ctx.error(f"X must have rank >= 3 (N, C, spatial...), got {x}")
    if grid.shape is None:
        rank = None if x.shape is None else len(x.shape)
        shape = None if rank is None else (x.shape[0], x.shape[1]) + (None,) * (rank - 2)
        return [TensorType(x.dtype, shape)]
    spatial = len(grid.shape) - 2
    if spatial < 1:
        raise ctx.error(f"grid must have rank >= 3 (N, spatial..., r), got {grid}")
    if dims_equal(grid.shape[-1], spatial) is False:
        raise ctx.error(f"grid's last dimension must be {spatial} (its number of spatial "
                        f"dims), got {grid}")
    if x.shape is None:
        return [TensorType(x.dtype, (grid.shape[0], None) + tuple(grid.shape[1:-1]))]
    if len(x.shape) != len(grid.shape):
        raise ctx.error(f"X and grid must have the same rank, got {x} and {grid}")
    batch = _same_dim(ctx, x.shape[0], grid.shape[0], "batch sizes of X and grid")
    return [TensorType(x.dtype, (batch, x.shape[1]) + tuple(grid.shape[1:-1]))]


def _check_grid_attrs(ctx, attrs: dict) -> None:
    if attrs["mode"] not in _GRID_MODES:
        raise ctx.error(f"mode must be one of {list(_GRID_MODES)}, got {attrs['mode']!r}")
    if attrs["padding_mode"] not in _PADDING_MODES:
        raise ctx.error(f"padding_mode must be one of {list(_PADDING_MODES)}, "
                        f"got {attrs['padding_mode']!r}")


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Reflect coordinates at the borders ``low`` and ``high`` until they fall inside."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below, above = x < low, x > high
    distance = np.where(below, low - x, np.where(above, x - high, 0.0))
    flips = np.floor(distance / span)
    rest = distance - flips * span
    even = flips % 2 == 0
    from_low = np.where(even, low + rest, high - rest)
    from_high = np.where(even, high - rest, low + rest)
    return np.where(below, from_low, np.where(above, from_high, x))


def _sample_borders(size: int, align_corners: bool) -> tuple[float, float]:
    """The coordinate range covered by an axis of ``size`` pixels."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def _gather_padded(x: np.ndarray, indices: list[np.ndarray], padding_mode: str,
                   align_corners: bool) -> np.ndarray:
    """x[n, :, i1, i2, ...] for integer index arrays shaped (N, out...), with padding.

    Returns (N, C, out...).
    """
    spatial = x.shape[2:]
    valid = np.ones(indices[0].shape, dtype=bool)
    fixed = []
    for index, size in zip(indices, spatial):
        if padding_mode == "zeros":
            valid &= (index >= 0) & (index < size)
        elif padding_mode == "reflection":
            low, high = _sample_borders(size, align_corners)
            index = np.trunc(_reflect(index.astype(np.float64), low, high)).astype(np.int64)
        fixed.append(np.clip(index, 0, size - 1))
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (indices[0].ndim - 1))
    values = x[(batch, slice(None)) + tuple(fixed)]  # (N, out..., C)
    values = np.moveaxis(values, -1, 1)
    if padding_mode == "zeros":
        values = np.where(valid[:, None], values, np.zeros((), dtype=values.dtype))
    return values


@op("GridSample", family="image", infer=_infer_grid_sample, attrs={
    "align_corners": Attr.int(0),
    "mode": Attr.string("linear"),
    "padding_mode": Attr.string("zeros"),
})
def grid_sample(ctx, x, grid, *, align_corners, mode, padding_mode):
    """Sample X at the normalized positions of grid (N-D; nearest, linear or cubic)."""
    _check_grid_attrs(ctx, {"mode": mode, "padding_mode": padding_mode})
    spatial = x.shape[2:]
    if grid.ndim != x.ndim or grid.shape[-1] != len(spatial) or grid.shape[0] != x.shape[0]:
        raise ctx.error(f"grid of shape {grid.shape} does not fit X of shape {x.shape}; it "
                        f"must be (N, out..., {len(spatial)})")
    align = bool(align_corners)
    # Denormalize in the grid's precision (float32 at least), as PyTorch does.
    coord_type = np.float64 if grid.dtype == np.float64 else np.float32
    coords = []
    for axis, size in enumerate(spatial):
        n = grid[..., len(spatial) - 1 - axis].astype(coord_type)  # grid lists x (last) first
        c = (n + 1) / 2 * (size - 1) if align else ((n + 1) * size - 1) / 2
        c = c.astype(np.float64)
        if mode == "nearest":
            c = np.rint(c)  # half to even
        low, high = _sample_borders(size, align)
        if padding_mode == "border":
            c = np.where((c < low) | (c > high), np.clip(c, 0, size - 1), c)
        elif padding_mode == "reflection":
            c = _reflect(c, low, high)
        coords.append(c)
    if mode == "nearest":
        indices = [np.trunc(c).astype(np.int64) for c in coords]
        return _gather_padded(x, indices, padding_mode, align).astype(x.dtype)
    data = x.astype(_working_dtype(ctx, x.dtype))
    if mode == "linear":
        kernel, offsets = _linear_kernel, (0, 1)
    else:
        kernel, offsets = _cubic_kernel(-0.75), (-1, 0, 1, 2)
    bases = [np.floor(c) for c in coords]
    result = np.zeros((x.shape[0], x.shape[1]) + grid.shape[1:-1], dtype=data.dtype)
    for taps in np.ndindex(*([len(offsets)] * len(spatial))):
        indices, weight = [], 1.0
        for axis, tap in enumerate(taps):
            index = bases[axis] + offsets[tap]
            weight = weight * kernel(index - coords[axis])
            indices.append(index.astype(np.int64))
        result += weight[:, None] * _gather_padded(data, indices, padding_mode, align)
    return result.astype(x.dtype)  # integers truncate: "cast to integer at the end"


# ----------------------------------------------------------------------------- AffineGrid


def _infer_affine_grid(ctx: InferContext) -> list[ValueType | None]:
    theta, size = tensor_input(ctx, 0), tensor_input(ctx, 1)
    if not theta.dtype.is_float:
        raise ctx.error(f"theta must be a float tensor, got {theta}")
    spatial: int | None = None
    if theta.shape is not None:
        if len(theta.shape) != 3:
            raise ctx.error(f"theta must have shape (N, 2, 3) or (N, 3, 4), got {theta}")
        if isinstance(theta.shape[1], int):
            spatial = theta.shape[1]
    if size.shape is not None and len(size.shape) == 1 and isinstance(size.shape[0], int):
        if spatial is not None and size.shape[0] != spatial + 2:
            raise ctx.error(f"size must hold {spatial + 2} values for theta {theta}, got {size}")
        spatial = size.shape[0] - 2
    if spatial is not None and spatial not in (2, 3):
        raise ctx.error(f"AffineGrid makes 2-D or 3-D grids, got {spatial} spatial dims")
    batch = theta.shape[0] if theta.shape is not None else None
    value = shape_from_constant(ctx.value(1))
    if value is not None:
        if spatial is not None and len(value) != spatial + 2:
            raise ctx.error(f"size {list(value)} must hold {spatial + 2} values")
        spatial = len(value) - 2
        batch = _same_dim(ctx, batch, value[0], "batch sizes of theta and size")
        return [TensorType(theta.dtype, (batch,) + tuple(value[2:]) + (spatial,))]
    if spatial is None:
        return [TensorType(theta.dtype, None)]
    return [TensorType(theta.dtype, (batch,) + (None,) * spatial + (spatial,))]


def _grid_positions(count: int, align_corners: bool) -> np.ndarray:
    """Normalized centres of ``count`` pixels in [-1, 1]."""
    if count <= 1:
        return np.zeros(count)
    positions = np.linspace(-1.0, 1.0, count)
    return positions if align_corners else positions * (count - 1) / count


@op("AffineGrid", family="image", infer=_infer_affine_grid, attrs={
    "align_corners": Attr.int(0),
})
def affine_grid(ctx, theta, size, *, align_corners):
    """The sampling grid (N, [D,] H, W, r) of affine matrices theta over an output of size."""
    size = [int(v) for v in np.asarray(size).reshape(-1)]
    spatial = size[2:]
    r = len(spatial)
    if r not in (2, 3) or theta.shape != (size[0], r, r + 1):
        raise ctx.error(f"theta of shape {theta.shape} and size {size} do not match: 2-D needs "
                        f"theta (N, 2, 3) and size (N, C, H, W); 3-D theta (N, 3, 4) and size "
                        f"(N, C, D, H, W)")
    axes = [_grid_positions(n, bool(align_corners)) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    # Homogeneous positions (x, y[, z], 1) with x along the last spatial axis.
    base = np.stack(list(reversed(mesh)) + [np.ones(spatial)], axis=-1)
    grid = np.einsum("nij,...j->n...i", theta.astype(np.float64), base)
    return grid.astype(theta.dtype)


# ----------------------------------------------------------------------------- RoiAlign


def _infer_roi_align(ctx: InferContext) -> list[ValueType | None]:
    x, rois, indices = (tensor_input(ctx, i) for i in range(3))
    _check_roi_attrs(ctx, ctx.attrs)
    if x.shape is not None and len(x.shape) != 4:
        raise ctx.error(f"X must be 4-D (N, C, H, W), got {x}")
    if rois.shape is not None and (len(rois.shape) != 2 or dims_equal(rois.shape[1], 4) is False):
        raise ctx.error(f"rois must have shape (num_rois, 4), got {rois}")
    if indices.shape is not None and len(indices.shape) != 1:
        raise ctx.error(f"batch_indices must have shape (num_rois,), got {indices}")
    count = _same_dim(ctx, None if rois.shape is None else rois.shape[0],
                      None if indices.shape is None else indices.shape[0],
                      "numbers of rois and batch_indices")
    channels = None if x.shape is None else x.shape[1]
    return [TensorType(x.dtype, (count, channels, ctx.attrs["output_height"],
                                 ctx.attrs["output_width"]))]


def _check_roi_attrs(ctx, attrs: dict) -> None:
    if attrs["mode"] not in ("avg", "max"):
        raise ctx.error(f"mode must be 'avg' or 'max', got {attrs['mode']!r}")
    if attrs["coordinate_transformation_mode"] not in ("half_pixel", "output_half_pixel"):
        raise ctx.error("coordinate_transformation_mode must be 'half_pixel' or "
                        f"'output_half_pixel', got {attrs['coordinate_transformation_mode']!r}")
    if attrs["output_height"] < 1 or attrs["output_width"] < 1:
        raise ctx.error("output_height and output_width must be positive")


def _roi_sample_axis(coords: np.ndarray, size: int):
    """Bilinear taps of RoiAlign sample points along one axis (ONNX Runtime's rules).

    Returns (low index, high index, low weight, high weight, valid): a point more than one
    pixel outside the map is invalid and contributes nothing.
    """
    valid = (coords >= -1.0) & (coords <= size)
    c = np.maximum(coords, 0.0)
    low = np.floor(c).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    frac = np.where(at_edge, 0.0, c - low)
    return low, high, 1.0 - frac, frac, valid


@op("RoiAlign", family="image", infer=_infer_roi_align, attrs={
    "coordinate_transformation_mode": Attr.string("half_pixel"),
    "mode": Attr.string("avg"),
    "output_height": Attr.int(1),
    "output_width": Attr.int(1),
    "sampling_ratio": Attr.int(0),
    "spatial_scale": Attr.float(1.0),
})
def roi_align(ctx, x, rois, batch_indices, *, coordinate_transformation_mode, mode,
              output_height, output_width, sampling_ratio, spatial_scale):
    """Pool each region of interest to a fixed size by averaging (or maxing) bilinear samples."""
    _check_roi_attrs(ctx, {"mode": mode, "output_height": output_height,
                           "output_width": output_width,
                           "coordinate_transformation_mode": coordinate_transformation_mode})
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or \
            batch_indices.shape != (rois.shape[0],):
        raise ctx.error(f"expected X (N, C, H, W), rois (R, 4) and batch_indices (R,), got "
                        f"{x.shape}, {rois.shape} and {batch_indices.shape}")
    if batch_indices.size and (batch_indices.min() < 0 or batch_indices.max() >= x.shape[0]):
        raise ctx.error(f"batch_indices {batch_indices.tolist()} out of range for a batch of "
                        f"{x.shape[0]}")
    height, width = x.shape[2:]
    half_pixel = coordinate_transformation_mode == "half_pixel"
    data = x.astype(np.float64)
    out = np.zeros((rois.shape[0], x.shape[1], output_height, output_width))
    for r, (roi, image) in enumerate(zip(rois.astype(np.float64), batch_indices)):
        x1, y1, x2, y2 = roi * spatial_scale - (0.5 if half_pixel else 0.0)
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # malformed rois are forced to 1x1
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / output_height, roi_w / output_width
        grid_h = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_h / output_height))
        grid_w = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_w / output_width))
        if grid_h <= 0 or grid_w <= 0:
            continue
        ys = (y1 + np.arange(output_height)[:, None] * bin_h
              + (np.arange(grid_h)[None, :] + 0.5) * bin_h / grid_h)  # (oh, gh)
        xs = (x1 + np.arange(output_width)[:, None] * bin_w
              + (np.arange(grid_w)[None, :] + 0.5) * bin_w / grid_w)  # (ow, gw)
        y_lo, y_hi, wy_lo, wy_hi, y_ok = (a[:, :, None, None] for a in _roi_sample_axis(ys, height))
        x_lo, x_hi, wx_lo, wx_hi, x_ok = (a[None, None] for a in _roi_sample_axis(xs, width))
        valid = y_ok & x_ok
        plane = data[int(image)]  # (C, H, W)
        corners = [plane[:, yi, xi] * np.where(valid, wy * wx, 0.0)  # (C, oh, gh, ow, gw)
                   for yi, wy in ((y_lo, wy_lo), (y_hi, wy_hi))
                   for xi, wx in ((x_lo, wx_lo), (x_hi, wx_hi))]
        if mode == "avg":
            out[r] = sum(corners).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        else:  # ONNX Runtime's max: the largest weighted corner over all samples of a bin
            out[r] = np.max(np.stack(corners), axis=(0, 3, 5))
    return out.astype(x.dtype)


# ----------------------------------------------------------------------------- NonMaxSuppression


def _infer_nms(ctx: InferContext) -> list[ValueType | None]:
    boxes, scores = tensor_input(ctx, 0), tensor_input(ctx, 1)
    if ctx.attrs["center_point_box"] not in (0, 1):
        raise ctx.error(f"center_point_box must be 0 or 1, got {ctx.attrs['center_point_box']}")
    if boxes.shape is not None and (len(boxes.shape) != 3 or
                                    dims_equal(boxes.shape[2], 4) is False):
        raise ctx.error(f"boxes must have shape (batches, boxes, 4), got {boxes}")
    if scores.shape is not None and len(scores.shape) != 3:
        raise ctx.error(f"scores must have shape (batches, classes, boxes), got {scores}")
    if boxes.shape is not None and scores.shape is not None:
        _same_dim(ctx, boxes.shape[0], scores.shape[0], "batch sizes of boxes and scores")
        _same_dim(ctx, boxes.shape[1], scores.shape[2], "box counts of boxes and scores")
    return [TensorType(DType.INT64, (None, 3))]


def _box_corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max) rows, whatever their input format."""
    if center_point_box:
        cx, cy, w, h = boxes.T
        return np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2),
                     np.maximum(y1, y2), np.maximum(x1, x2)], axis=1)


def _overlaps_too_much(corners: np.ndarray, candidate: int, kept: list[int],
                       iou_threshold: float) -> bool:
    """Whether box ``candidate`` has IoU > threshold with any box in ``kept``."""
    if not kept:
        return False
    box, others = corners[candidate], corners[kept]
    inter_h = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0])
    inter_w = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1])
    overlapping = (inter_h > 0) & (inter_w > 0)
    inter = np.where(overlapping, inter_h * inter_w, 0.0)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    meaningful = overlapping & (area > 0) & (areas > 0) & (union > 0)
    iou = np.where(meaningful, inter / np.where(union > 0, union, 1.0), 0.0)
    return bool(np.any(meaningful & (iou > iou_threshold)))


def _scalar_or(value: np.ndarray | None, default: float) -> float:
    value = _nonempty(value)
    return default if value is None else value.reshape(-1)[0].item()


@op("NonMaxSuppression", family="image", infer=_infer_nms, attrs={
    "center_point_box": Attr.int(0),
})
def non_max_suppression(ctx, boxes, scores, max_output_boxes_per_class=None,
                        iou_threshold=None, score_threshold=None, *, center_point_box):
    """Greedily select boxes by descending score, dropping those overlapping a kept box."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ctx.error(f"boxes {boxes.shape} and scores {scores.shape} must be "
                        f"(batches, boxes, 4) and (batches, classes, boxes)")
    limit = max(int(_scalar_or(max_output_boxes_per_class, 0)), 0)
    iou_limit = float(_scalar_or(iou_threshold, 0.0))
    min_score = _nonempty(score_threshold)
    selected: list[tuple[int, int, int]] = []
    for batch in range(boxes.shape[0]):
        corners = _box_corners(boxes[batch].astype(np.float64), center_point_box)
        for cls in range(scores.shape[1]):
            class_scores = scores[batch, cls]
            candidates = np.arange(boxes.shape[1])
            if min_score is not None:
                candidates = candidates[class_scores > min_score.reshape(-1)[0]]
            # Highest score first; equal scores keep the lower box index first.
            order = candidates[np.argsort(-class_scores[candidates], kind="stable")]
            kept: list[int] = []
            for box in order:
                if len(kept) >= limit:
                    break
                if not _overlaps_too_much(corners, int(box), kept, iou_limit):
                    kept.append(int(box))
                    selected.append((batch, cls, int(box)))
    return np.array(selected, dtype=np.int64).reshape(len(selected), 3)
