"""Compute definitions of the reductions: Reduce*, ArgMax/ArgMin and CumSum.

They mirror the numpy references in ``ember/ops/reduce.py`` and, like them, accumulate in a
wider type than they store: half-precision floats in float32 (the reference's ``widened``) and
integers in 64 bits, as ``np.sum``/``np.prod`` do, which gives the same result modulo 2**bits
once cast back (and the exact quotient for ReduceMean).

Axes must be known at compile time (an initializer or constant); a Reduce* node whose axes
are a run-time input, or any configuration not covered here, raises NoCompute and runs its
numpy reference.

The indexing helpers here (:class:`Reduction`, :func:`broadcast_index`, the accumulator types
and the two-stage arg-extreme) are shared with the normalization, matmul, convolution and
pooling definitions in ``nn.py``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.ir.compute import (NARROW_FLOATS, IterVar, Reduce, Tensor, cast, compute,
                              compute_dtype, const_like, reduce_axis, reduce_max, reduce_min,
                              reduce_prod, reduce_sum, widen)
from ember.ir.loop.expr import INDEX, Binary, Cast, Const, Expr, Select, Unary, call
from ember.ops.registry import NoCompute, compute_of

REDUCERS: dict[str, Callable[..., Reduce]] = {
    "sum": reduce_sum, "prod": reduce_prod, "max": reduce_max, "min": reduce_min,
}

# Intermediate stages live on the kernel's stack (codegen allows 1 MiB of local buffers per
# kernel); a definition needing more scratch than this falls back to the reference.
SCRATCH_LIMIT_BYTES = 512 * 1024


def scratch_bytes(outputs: Sequence[Tensor]) -> int:
    """Bytes of the intermediate (non-output) stages the ``outputs`` depend on."""
    seen: dict[int, Tensor] = {}
    pending = list(outputs)
    while pending:
        tensor = pending.pop()
        if tensor.stage is None or id(tensor) in seen:
            continue
        seen[id(tensor)] = tensor
        pending.extend(tensor.stage.inputs)
    outs = {id(t) for t in outputs}
    return sum(t.size * t.dtype.itemsize for key, t in seen.items() if key not in outs)


def compute_def(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`compute_of` for definitions with intermediate stages: NoCompute when their
    scratch would exceed :data:`SCRATCH_LIMIT_BYTES`."""

    def attach(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def bounded(ctx, *args, **kwargs):
            result = fn(ctx, *args, **kwargs)
            outputs = list(result) if isinstance(result, (tuple, list)) else [result]
            needed = scratch_bytes(outputs)
            if needed > SCRATCH_LIMIT_BYTES:
                raise NoCompute(f"needs {needed} bytes of scratch, over the stack budget")
            return result

        return compute_of(*names)(bounded)

    return attach


# ----------------------------------------------------------------------------- dtype helpers



def sum_dtype(dtype: DType) -> DType:
    """The type to accumulate sums and products in: int64 for every integer type.

    Wrapping int64 arithmetic gives the same bits as numpy's (u)int64 accumulation, so the
    result cast back to ``dtype`` is the reference's.
    """
    if dtype.is_int:
        return DType.INT64
    return compute_dtype(dtype)




def float_dtype(*dtypes: DType) -> DType:
    """A float type holding all of ``dtypes`` as numpy promotes them (float64 wins)."""
    return DType.FLOAT64 if DType.FLOAT64 in dtypes else DType.FLOAT32


def require_kernel_dtypes(*tensors: Tensor | None, allow_bool: bool = True) -> None:
    """NoCompute unless every given tensor has a plain numeric (or bool) element type."""
    for t in tensors:
        if t is None:
            continue
        if t.dtype == DType.BOOL and allow_bool:
            continue
        if not (t.dtype.is_int or t.dtype in (DType.FLOAT32, DType.FLOAT64)
                or t.dtype in NARROW_FLOATS):
            raise NoCompute(f"no compute for element type {t.dtype}")


def absolute(value: Expr) -> Expr:
    """``|value|`` in value's type (integers wrap like ``np.abs``: abs(MIN) == MIN)."""
    if value.dtype.is_float:
        return call("fabs", value)
    if not value.dtype.is_signed:
        return value
    return Select(value.lt(const_like(0, value.dtype)), Unary("neg", value), value)


def float_math(name: str, value: Expr) -> Expr:
    """A math intrinsic on ``value``; integers go through float64 (as numpy's ufuncs do)."""
    if not value.dtype.is_float:
        value = Cast(DType.FLOAT64, value)
    return call(name, value)


def is_finite(value: Expr) -> Expr:
    """True where a float ``value`` is neither infinite nor NaN."""
    bad = Binary("or", call("isinf", value, dtype=DType.BOOL),
                 call("isnan", value, dtype=DType.BOOL))
    return Unary("not", bad)


def logical_or(a: Expr, b: Expr) -> Expr:
    return Binary("or", a, b)


def logical_and(*terms: Expr) -> Expr | None:
    """The conjunction of ``terms`` (None for no terms: always true)."""
    result: Expr | None = None
    for term in terms:
        result = term if result is None else Binary("and", result, term)
    return result


# ----------------------------------------------------------------------------- axes and indices


def normalize_axis(axis: int, rank: int) -> int:
    """A non-negative axis; NoCompute when out of range (the reference reports the error)."""
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise NoCompute(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_index(out_index: Sequence[Expr], in_shape: Sequence[int]) -> list[Expr]:
    """Index into a tensor of ``in_shape`` that numpy-broadcasts to the indexed output.

    Dims align from the right; size-1 dims of the input always read element 0.
    """
    tail = list(out_index)[len(out_index) - len(in_shape):] if in_shape else []
    return [Const(0, INDEX) if d == 1 else i for i, d in zip(tail, in_shape)]


class Reduction:
    """Index bookkeeping of a reduction of a tensor of ``shape`` over ``axes``.

    The output has ``shape`` with the axes dropped, or set to 1 with ``keepdims``.  A stage of
    the "kept" shape (axes set to 1) holds per-row statistics such as softmax's maximum.
    """

    def __init__(self, shape: Sequence[int], axes: Sequence[int], keepdims: bool):
        self.shape = tuple(shape)
        self.axes = tuple(sorted(set(axes)))
        self.keepdims = keepdims

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.keepdims:
            return self.kept_shape
        return tuple(d for a, d in enumerate(self.shape) if a not in self.axes)

    @property
    def kept_shape(self) -> tuple[int, ...]:
        return tuple(1 if a in self.axes else d for a, d in enumerate(self.shape))

    @property
    def count(self) -> int:
        """How many elements each output element reduces."""
        return int(np.prod([self.shape[a] for a in self.axes], dtype=np.int64))

    def axis_vars(self) -> list[IterVar]:
        """Fresh reduction variables, one per reduced axis (outermost first)."""
        return [reduce_axis(self.shape[a], f"r{a}") for a in self.axes]

    def _full(self, out_index: Sequence[Expr]) -> list[Expr | None]:
        """``out_index`` spread over every axis, None at the reduced ones."""
        if len(out_index) == len(self.shape):
            return [None if a in self.axes else i for a, i in enumerate(out_index)]
        kept = iter(out_index)
        return [None if a in self.axes else next(kept) for a in range(len(self.shape))]

    def source(self, out_index: Sequence[Expr], rvars: Sequence[Expr]) -> list[Expr]:
        """Input index of output (or full-rank) index ``out_index`` at reduction point
        ``rvars``."""
        by_axis = dict(zip(self.axes, rvars))
        return [by_axis[a] if i is None else i for a, i in enumerate(self._full(out_index))]

    def kept(self, index: Sequence[Expr]) -> list[Expr]:
        """Index into a kept-shape stage from an output or full-rank index."""
        return [Const(0, INDEX) if i is None else i for i in self._full(index)]


def reduce_stage(x: Tensor, red: Reduction, combiner: str, name: str,
                 element: Callable[[Expr], Expr] = lambda v: v,
                 finish: Callable[[Expr], Expr] = lambda r: r,
                 dtype: DType | None = None, shape: Sequence[int] | None = None) -> Tensor:
    """A stage combining ``element(x[...])`` over the reduced axes, then ``finish``-ed.

    The stage has the reduction's output shape (or ``shape``, e.g. its kept shape) and
    ``dtype`` (the body's type by default; the body is cast to it).
    """

    def body(*index: Expr) -> Expr:
        rvars = red.axis_vars()
        value = element(x[red.source(index, rvars)])
        return finish(REDUCERS[combiner](value, rvars))

    return compute(shape if shape is not None else red.out_shape, body, name=name, dtype=dtype)


def ordered(value: Expr) -> Expr:
    """``value`` in a type where max/min compare as numpy does (bools as uint8)."""
    return Cast(DType.UINT8, value) if value.dtype == DType.BOOL else widen(value)


def extreme_index(x: Tensor, axis: int, keepdims: bool, combiner: str, last: bool,
                  name: str) -> Tensor:
    """int64 index of the first (or ``last``) maximum/minimum of ``x`` along ``axis``.

    Two stages: the extreme value, then the smallest (largest) index where it is reached.  A
    NaN is the extreme wherever one occurs (max/min propagate it), and is matched by ``x != x``,
    so the first NaN's index is returned, as ``np.argmax`` does.
    """
    red = Reduction(x.shape, (axis,), keepdims)
    length = x.shape[axis]
    peak = reduce_stage(x, red, combiner, f"{name}_peak", element=ordered, shape=red.kept_shape)

    def body(*index: Expr) -> Expr:
        [k] = red.axis_vars()
        value = ordered(x[red.source(index, [k])])
        hit = value.eq(peak[red.kept(index)])
        if value.dtype.is_float:
            hit = logical_or(hit, value.ne(value))
        if last:
            return reduce_max(Select(hit, k, Const(-1, INDEX)), k)
        return reduce_min(Select(hit, k, Const(length, INDEX)), k)

    return compute(red.out_shape, body, name=name, dtype=DType.INT64)


# ----------------------------------------------------------------------------- Reduce*


def _reduce_axes(ctx, data: Tensor, axes: Tensor | None, noop: int) -> tuple[int, ...]:
    """The axes a Reduce* node reduces (compile-time constant axes only)."""
    constant = ctx.value(1)
    if constant is None and axes is not None:
        raise NoCompute("the axes are only known at run time")
    values = [] if constant is None else [int(a) for a in np.asarray(constant).reshape(-1)]
    if not values:
        return () if noop else tuple(range(data.ndim))
    if data.ndim == 0:
        return ()
    normalized = [normalize_axis(a, data.ndim) for a in values]
    if len(set(normalized)) != len(normalized):
        raise NoCompute(f"axes {values} repeat an axis")
    return tuple(sorted(normalized))


def _register_reduce(name: str, combiner: str, element: Callable[[Expr], Expr],
                     finish: Callable[[Reduction, Expr], Expr] = lambda red, r: r,
                     accumulate: Callable[[Expr], Expr] | None = None) -> None:
    """Attach a one-stage Reduce* compute: ``finish(combiner(accumulate(element(x))))``.

    ``element`` sees x in its compute type (16-bit floats widened); ``accumulate`` converts
    the element to the accumulator type (default: 64-bit integers, floats unchanged).
    """

    @compute_def(name)
    def reduce_op(ctx, data, axes=None, *, keepdims, noop_with_empty_axes):
        require_kernel_dtypes(data, allow_bool=combiner in ("max", "min"))
        red = Reduction(data.shape, _reduce_axes(ctx, data, axes, noop_with_empty_axes),
                        bool(keepdims))
        to_acc = accumulate or (lambda v: cast(v, sum_dtype(v.dtype)))
        return reduce_stage(data, red, combiner, name.lower(),
                            element=lambda v: to_acc(element(widen(v))),
                            finish=lambda r: finish(red, r), dtype=data.dtype)

    reduce_op.__name__ = f"compute_{name.lower()}"


def _mean(red: Reduction, total: Expr) -> Expr:
    if total.dtype.is_float:
        return total / const_like(red.count, total.dtype)
    # The reference divides in float64 and truncates when casting back.
    return Cast(DType.FLOAT64, total) / const_like(red.count, DType.FLOAT64)


def _square(v: Expr) -> Expr:
    return v * v


_register_reduce("ReduceSum", "sum", lambda v: v)
_register_reduce("ReduceMean", "sum", lambda v: v, _mean)
_register_reduce("ReduceProd", "prod", lambda v: v)
_register_reduce("ReduceMax", "max", lambda v: v, accumulate=ordered)
_register_reduce("ReduceMin", "min", lambda v: v, accumulate=ordered)
_register_reduce("ReduceL1", "sum", absolute)
_register_reduce("ReduceSumSquare", "sum", _square)
_register_reduce("ReduceL2", "sum", _square, lambda red, r: float_math("sqrt", r))
_register_reduce("ReduceLogSum", "sum", lambda v: v, lambda red, r: float_math("log", r))


@compute_def("ReduceLogSumExp")
def reduce_log_sum_exp(ctx, data, axes=None, *, keepdims, noop_with_empty_axes):
    """log(sum(exp(x - peak))) + peak, the peak being the maximum where it is finite, else 0."""
    require_kernel_dtypes(data, allow_bool=False)
    red = Reduction(data.shape, _reduce_axes(ctx, data, axes, noop_with_empty_axes),
                    bool(keepdims))
    work = compute_dtype(data.dtype) if data.dtype.is_float else DType.FLOAT64
    peak = reduce_stage(data, red, "max", "lse_peak", element=lambda v: cast(v, work),
                        shape=red.kept_shape)
    zero = const_like(0, work)
    shift = compute(red.kept_shape, lambda *i: Select(is_finite(peak[i]), peak[i], zero),
                    name="lse_shift")

    def body(*index: Expr) -> Expr:
        rvars = red.axis_vars()
        offset = shift[red.kept(index)]
        total = reduce_sum(call("exp", cast(data[red.source(index, rvars)], work) - offset),
                           rvars)
        return call("log", total) + offset

    return compute(red.out_shape, body, name="reducelogsumexp", dtype=data.dtype)


# ----------------------------------------------------------------------------- ArgMax, ArgMin


def _arg_extreme(data: Tensor, axis: int, keepdims: int, select_last_index: int,
                 combiner: str) -> Tensor:
    require_kernel_dtypes(data)
    if data.ndim == 0:
        raise NoCompute("ArgMax/ArgMin need rank >= 1")
    axis = normalize_axis(axis, data.ndim)
    if data.shape[axis] == 0:
        raise NoCompute("an empty axis has no index to return (the reference reports it)")
    return extreme_index(data, axis, bool(keepdims), combiner, bool(select_last_index),
                         f"arg{combiner}")


@compute_def("ArgMax")
def arg_max(ctx, data, *, axis, keepdims, select_last_index):
    return _arg_extreme(data, axis, keepdims, select_last_index, "max")


@compute_def("ArgMin")
def arg_min(ctx, data, *, axis, keepdims, select_last_index):
    return _arg_extreme(data, axis, keepdims, select_last_index, "min")


# ----------------------------------------------------------------------------- CumSum


@compute_def("CumSum")
def cum_sum(ctx, x, axis, *, exclusive, reverse):
    """Each element sums the prefix (suffix with ``reverse``) of its line along the axis.

    A conditional reduction over the whole line: quadratic in the axis length, but a plain
    reduction that lowering and scheduling handle like any other.
    """
    require_kernel_dtypes(x, allow_bool=False)
    value = ctx.value(1)
    if value is None or np.asarray(value).size != 1 or x.ndim == 0:
        raise NoCompute("CumSum needs a compile-time scalar axis and rank >= 1")
    ax = normalize_axis(int(np.asarray(value).reshape(-1)[0]), x.ndim)
    red = Reduction(x.shape, (ax,), keepdims=True)
    acc = sum_dtype(x.dtype)

    def body(*index: Expr) -> Expr:
        [k] = red.axis_vars()
        position = index[ax]
        if reverse:
            keep = k.gt(position) if exclusive else k.ge(position)
        else:
            keep = k.lt(position) if exclusive else k.le(position)
        return reduce_sum(cast(widen(x[red.source(index, [k])]), acc), k, condition=keep)

    return compute(x.shape, body, name="cumsum", dtype=x.dtype)
