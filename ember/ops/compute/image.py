"""Compute definition of Resize (what ``F.interpolate`` and ``nn.Upsample`` export to).

Resizing is separable: along each resized axis an output position ``y`` maps to a coordinate
in the input (``source_coordinate``), and the output element combines the input elements at a
few positions around it:

* nearest: the one position ``round_nearest(coordinate)``, clamped to the axis -- a gather,
  exact for every dtype;
* linear / cubic: the taps ``floor(coordinate) + offset`` weighted by the kernel at their
  distance from the coordinate, clamped to the axis (or dropped and the weights renormalized
  with ``exclude_outside``); an N-d resize sums over every combination of the axes' taps.

The coordinates are computed in float64 by the formulas the reference uses
(``ember/ops/image.py``: ``source_coordinate``, ``round_nearest``, ``tap_offsets``), in the same
order, so nearest resizing picks exactly the reference's elements.  Interpolation accumulates
in float64 as the reference does, and rounds once to the float output type.

Left to the reference: antialiasing (its kernel width depends on the scale), interpolating
integer or 16-bit float data (the reference rounds and saturates those), and parameters that are
only known at run time.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

import ember.ops.families  # noqa: F401  (registers the ops these definitions attach to)
from ember.core.dtypes import DType
from ember.ir.compute import ComputeContext, Tensor, cast, compute, const_like
from ember.ir.loop.expr import INDEX, Cast, Const, Expr, Select, call, maximum, minimum
from ember.ops.compute.elementwise import logical_or, require
from ember.ops.compute.shape import out_shape, python_scalar, ref_ctx, require_storable
from ember.ops.image import (ResizeAxis, resize_plan, round_nearest, source_coordinate,
                             tap_offsets)
from ember.ops.registry import compute_of

F64 = DType.FLOAT64
_INTERPOLATED_DTYPES = (DType.FLOAT32, DType.FLOAT64)


def _f64(value: float) -> Const:
    return Const(float(value), F64)


def _known(ctx: ComputeContext, index: int, tensor: Tensor | None):
    """The compile-time value of an optional input (None when absent); NoCompute if it is
    given but only known at run time."""
    if tensor is None:
        return None
    value = ctx.value(index)
    require(value is not None)
    return value


def _coordinate(step: ResizeAxis, position: Expr, mode: str) -> Expr:
    """The input coordinate (float64) of output ``position`` along ``step``'s axis."""
    return source_coordinate(mode, Cast(F64, position), step.out_len, step.in_len, step.scale,
                             step.roi)


def _clamped_index(position: Expr, in_len: int) -> Expr:
    """A float64 input position clamped to [0, in_len - 1], as an index."""
    return Cast(INDEX, minimum(maximum(position, _f64(0.0)), _f64(in_len - 1)))


def _linear_weight(distance: Expr) -> Expr:
    """The triangle kernel max(0, 1 - |t|)."""
    return maximum(_f64(0.0), _f64(1.0) - call("fabs", distance))


def _cubic_weight(distance: Expr, a: float) -> Expr:
    """Keys' cubic kernel with coefficient ``a``, as the reference writes it."""
    t = call("fabs", distance)
    near = ((_f64(a + 2) * t - _f64(a + 3)) * t * t) + _f64(1.0)
    far = ((_f64(a) * t - _f64(5 * a)) * t + _f64(8 * a)) * t - _f64(4 * a)
    return Select(t.le(_f64(1.0)), near, Select(t.lt(_f64(2.0)), far, _f64(0.0)))


def _taps(step: ResizeAxis, coordinate: Expr, attrs: dict) -> list[tuple[Expr, Expr]]:
    """(input index, weight) of every tap along one axis, for one output position."""
    if attrs["mode"] == "linear":
        offsets = tap_offsets(1.0)
        kernel = _linear_weight
    else:
        offsets = tap_offsets(2.0)
        a = float(attrs["cubic_coeff_a"])

        def kernel(distance: Expr) -> Expr:
            return _cubic_weight(distance, a)

    base = call("floor", coordinate)
    positions = [base + _f64(offset) for offset in offsets]
    weights = [kernel(position - coordinate) for position in positions]
    if attrs["exclude_outside"]:
        inside = [Select(logical_or(p.lt(_f64(0.0)), p.ge(_f64(step.in_len))), _f64(0.0), w)
                  for p, w in zip(positions, weights)]
        total: Expr = inside[0]
        for w in inside[1:]:
            total = total + w
        total = Select(total.eq(_f64(0.0)), _f64(1.0), total)
        weights = [w / total for w in inside]
    return [(_clamped_index(p, step.in_len), w) for p, w in zip(positions, weights)]


def _outside(step: ResizeAxis, coordinate: Expr) -> Expr:
    """Whether a tf_crop_and_resize coordinate falls outside the input."""
    return logical_or(coordinate.lt(_f64(0.0)), coordinate.gt(_f64(step.in_len - 1)))


@compute_of("Resize")
def resize(ctx, x, roi=None, scales=None, sizes=None, **attrs):
    """out[i] = x at the nearest input position of every resized axis (nearest), or the
    weighted sum over every combination of the axes' taps (linear, cubic)."""
    require_storable(x)
    interpolate = attrs["mode"] != "nearest"
    if interpolate:
        require(x.dtype in _INTERPOLATED_DTYPES and not attrs["antialias"])
    plan = resize_plan(ref_ctx(ctx), x.shape, _known(ctx, 1, roi), _known(ctx, 2, scales),
                       _known(ctx, 3, sizes), attrs)
    shape = out_shape(ctx)
    mode = attrs["coordinate_transformation_mode"]
    if any(step.in_len == 0 for step in plan):  # nothing to sample: the reference gives zeros
        return compute(shape, lambda *i: const_like(0, x.dtype), name="resize")

    def body(*i: Expr) -> Expr:
        coordinates = {step.axis: _coordinate(step, i[step.axis], mode) for step in plan}
        if interpolate:
            value = _interpolated(x, i, plan, coordinates, attrs)
        else:
            index = list(i)
            for step in plan:
                nearest = round_nearest(coordinates[step.axis], attrs["nearest_mode"],
                                        floor=lambda e: call("floor", e),
                                        ceil=lambda e: call("ceil", e))
                index[step.axis] = _clamped_index(nearest, step.in_len)
            value = x[tuple(index)]
        if mode != "tf_crop_and_resize":
            return value
        outside: Expr | None = None
        for step in plan:
            here = _outside(step, coordinates[step.axis])
            outside = here if outside is None else logical_or(outside, here)
        if outside is None:
            return value
        fill = np.asarray(attrs["extrapolation_value"])  # converted as the reference does
        return Select(outside, const_like(python_scalar(fill, x.dtype), x.dtype), value)

    return compute(shape, body, name="resize", dtype=x.dtype)


def _interpolated(x: Tensor, i: Sequence[Expr], plan: list[ResizeAxis],
                  coordinates: dict[int, Expr], attrs: dict) -> Expr:
    """The float64 sum over every combination of taps, rounded to x's dtype."""
    per_axis = [_taps(step, coordinates[step.axis], attrs) for step in plan]
    total: Expr | None = None
    for combination in itertools.product(*per_axis):
        index = list(i)
        weight: Expr | None = None
        for step, (position, tap_weight) in zip(plan, combination):
            index[step.axis] = position
            weight = tap_weight if weight is None else weight * tap_weight
        term = Cast(F64, x[tuple(index)])
        term = term if weight is None else weight * term
        total = term if total is None else total + term
    assert total is not None
    return cast(total, x.dtype)
