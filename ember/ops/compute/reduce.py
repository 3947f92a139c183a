"""Compute definitions of the reductions: Reduce*, ArgMax/ArgMin, TopK, CumSum and CumProd.

They mirror the numpy references in ``ember/ops/reduce.py`` and accumulate in a wider type
than they store.  Integers accumulate in 64 bits, as ``np.sum``/``np.prod`` do, which gives the
same result modulo 2**bits once cast back (and the exact quotient for ReduceMean).

Float *sums* over a data-sized axis accumulate in float64 and round once at the end
(:func:`accumulator_dtype`, :func:`accurate_sum`): a sequential float32 accumulator stops
counting at 2**24, so a long ReduceSum, a global average pool over a large image or the
statistics of a long LayerNormalization row would silently lose most of their terms.  Every
sum-like reduction of the compute definitions (here and in ``nn.py``: Reduce{Sum, Mean, L1,
L2, SumSquare, LogSum, LogSumExp}, the poolings that average or take norms, the softmax
denominators, the normalization statistics) goes through that one helper.

Deliberately *not* widened:

* the contractions -- MatMul, Gemm, Conv, ConvTranspose, and any Einsum-style product to
  come -- accumulate in their element type, as BLAS, oneDNN and the other compilers do: the
  length of their reduction is a weight dimension (K, C x kernel), not a data-sized axis, and
  a float64 accumulator would halve the SIMD width of the kernels that dominate a model's run
  time;
* ReduceProd, whose relative error does not depend on the magnitude of a running total;
* CumSum, a running sum by definition whose every prefix is an output: numpy's float32
  ``cumsum`` accumulates in float32 too.

Axes must be known at compile time (an initializer or constant); a Reduce* node whose axes
are a run-time input, or any configuration not covered here, raises NoCompute and runs its
numpy reference.

The indexing helpers here (:class:`Reduction`, :func:`broadcast_index`, the accumulator
types, :func:`sum_stage` and the two-stage arg-extreme) are shared with the normalization,
matmul, convolution and pooling definitions in ``nn.py``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ember.core.dtypes import DType
from ember.ir.compute import (NARROW_FLOATS, IterVar, Reduce, Tensor, cast, compute,
                              compute_dtype, const_like, reduce_axis, reduce_max, reduce_min,
                              reduce_prod, reduce_sum, scatter, widen)
from ember.ir.loop.expr import INDEX, Binary, Cast, Const, Expr, Select, Unary, call
from ember.ops.compute.shape import as_index, clamp_index
from ember.ops.registry import NoCompute, compute_of

# ----------------------------------------------------------------------------- accumulators


def accumulator_dtype(dtype: DType) -> DType:
    """The type a *sum* of ``dtype`` values accumulates in: float64 for every float type,
    int64 for every integer type and bool.

    Why float64: compiled reductions add their terms one after another into one accumulator,
    and a float32 accumulator stops counting at 2**24 (16777216 + 1 rounds back to 16777216):
    ReduceSum of 2**25 ones gives 2**24, the mean of an 8192 x 8192 image of ones 0.25, and in
    general the error grows with the running total.  A float64 accumulator carries 29 more
    bits, so a sum of float32 terms stays within about one float32 rounding of the exact sum
    for any tensor that fits in memory (and counts exactly up to 2**53); the result is rounded
    once, when it is stored in its output type.  float16 and bfloat16 terms (computed in
    float32) accumulate in float64 for the same reason; float64 keeps float64.  A wider
    accumulator keeps the loop the plain sequential reduction that lowering and the schedules
    already handle, where pairwise summation would restructure it and compensated (Kahan)
    summation cost four operations per term and be undone by any reassociation.

    The price is one conversion per term.  These kernels stream their input once and are
    bound by memory (or, summed sequentially, by the latency of the add, which is the same for
    double as for float), so it is nearly free; see the module docstring for the reductions
    that deliberately keep their element type.

    Integers accumulate in wrapping int64 arithmetic, which gives the same bits as numpy's
    (u)int64 accumulation, so the result cast back to the element type is the reference's.
    """
    if dtype.is_float:
        return DType.FLOAT64
    if dtype.is_int or dtype == DType.BOOL:
        return DType.INT64
    raise NoCompute(f"no sum accumulator for element type {dtype}")


def accurate_sum(value: Expr, axis: IterVar | Sequence[IterVar],
                 condition: Expr | None = None) -> Reduce:
    """The sum of ``value`` over ``axis`` (where ``condition`` holds) accumulated in its
    :func:`accumulator_dtype`; the Reduce has that type, so the caller (or the stage it is
    stored in) decides where to round back.  Every sum-like reduction over data uses this
    rather than ``reduce_sum``."""
    return reduce_sum(cast(value, accumulator_dtype(value.dtype)), axis, condition)


REDUCERS: dict[str, Callable[..., Reduce]] = {
    "sum": accurate_sum, "prod": reduce_prod, "max": reduce_max, "min": reduce_min,
}

# ----------------------------------------------------------------------------- dtype helpers


def running_dtype(dtype: DType) -> DType:
    """The accumulator of a product (ReduceProd) or a running sum (CumSum): int64 for every
    integer type (as :func:`accumulator_dtype`), the compute type for floats -- these are not
    widened to float64, as the module docstring explains.
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
    def keeps_innermost(self) -> bool:
        """Whether the innermost input axis is kept: then the innermost axis of the output
        (or kept-shape) stage walks the input contiguously, a sum "over columns"."""
        return bool(self.shape) and len(self.shape) - 1 not in self.axes

    @property
    def count(self) -> int:
        """How many elements each output element reduces."""
        total = 1
        for axis in self.axes:  # a product of ints, so that a traced size stays traced
            total = total * self.shape[axis]
        return total

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
    ``dtype`` (the body's type by default; the body is cast to it).  Sums go through
    :func:`sum_stage`.
    """

    def combined(*index: Expr) -> Reduce:
        rvars = red.axis_vars()
        return REDUCERS[combiner](element(x[red.source(index, rvars)]), rvars)

    out_shape = shape if shape is not None else red.out_shape
    if combiner == "sum" and dtype is not None:
        return sum_stage(out_shape, combined, name, dtype, lambda total, index: finish(total),
                         columns=red.keeps_innermost)
    return compute(out_shape, lambda *index: finish(combined(*index)), name=name, dtype=dtype)


# Lowering vectorizes an accumulation in the stage's buffer only across an innermost stage
# axis at least this long (ember.lower.lower.MIN_VECTOR_EXTENT, which ops may not import).
MIN_COLUMNS = 4


def sum_stage(shape: Sequence[int], total: Callable[..., Reduce], name: str, dtype: DType,
              finish: Callable[[Expr, Sequence[Expr]], Expr] = lambda total, index: total,
              columns: bool = False) -> Tensor:
    """A ``dtype`` stage whose element ``index`` is ``finish(total(*index), index)``, where
    ``total`` builds an :func:`accurate_sum` and ``finish`` works in its accumulator type.

    Lowering accumulates a reduction in the buffer of its stage -- reduction loops outside,
    vectorized across the stage's innermost axis -- only when that buffer has the
    accumulator's type; otherwise each element gets a scalar accumulator.  For a sum over
    ``columns`` (the stage's innermost axis walks the input contiguously, as in ReduceSum
    over axis 0) the scalar form reads the input down its columns, an order of magnitude
    slower, so the sum gets a scratch stage of its own in the accumulator type (float64),
    and a second, elementwise stage finishes it and rounds it to ``dtype`` once (the scratch
    stage lives in the workspace arena).
    """
    shape = tuple(shape)
    if columns and shape and shape[-1] >= MIN_COLUMNS:
        sums = compute(shape, total, name=f"{name}_sum")
        if sums.dtype != dtype:
            return compute(shape, lambda *index: finish(sums[index], index), name=name,
                           dtype=dtype)
    return compute(shape, lambda *index: finish(total(*index), index), name=name, dtype=dtype)


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
    the element to the accumulator type (default: :func:`running_dtype`; sums then widen
    floats to float64 in :func:`accurate_sum`).  The result is rounded once, to x's type.
    """

    @compute_of(name)
    def reduce_op(ctx, data, axes=None, *, keepdims, noop_with_empty_axes):
        require_kernel_dtypes(data, allow_bool=combiner in ("max", "min"))
        red = Reduction(data.shape, _reduce_axes(ctx, data, axes, noop_with_empty_axes),
                        bool(keepdims))
        to_acc = accumulate or (lambda v: cast(v, running_dtype(v.dtype)))
        return reduce_stage(data, red, combiner, name.lower(),
                            element=lambda v: to_acc(element(widen(v))),
                            finish=lambda r: finish(red, r), dtype=data.dtype)

    reduce_op.__name__ = f"compute_{name.lower()}"


def _mean(red: Reduction, total: Expr) -> Expr:
    if total.dtype.is_float:  # a float64 accumulator: divide before the one rounding
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


@compute_of("ReduceLogSumExp")
def reduce_log_sum_exp(ctx, data, axes=None, *, keepdims, noop_with_empty_axes):
    """log(sum(exp(x - peak))) + peak, the peak being the maximum where it is finite, else 0.

    The exponentials are computed in the compute type, their sum, its log and the shift back
    in the sum's accumulator type, rounded once to x's type."""
    require_kernel_dtypes(data, allow_bool=False)
    red = Reduction(data.shape, _reduce_axes(ctx, data, axes, noop_with_empty_axes),
                    bool(keepdims))
    work = compute_dtype(data.dtype) if data.dtype.is_float else DType.FLOAT64
    peak = reduce_stage(data, red, "max", "lse_peak", element=lambda v: cast(v, work),
                        shape=red.kept_shape)
    zero = const_like(0, work)
    shift = compute(red.kept_shape, lambda *i: Select(is_finite(peak[i]), peak[i], zero),
                    name="lse_shift")

    def total(*index: Expr) -> Reduce:
        rvars = red.axis_vars()
        offset = shift[red.kept(index)]
        return accurate_sum(call("exp", cast(data[red.source(index, rvars)], work) - offset),
                            rvars)

    def finish(total: Expr, index: Sequence[Expr]) -> Expr:
        return call("log", total) + cast(shift[red.kept(index)], total.dtype)

    return sum_stage(red.out_shape, total, "reducelogsumexp", data.dtype, finish,
                     columns=red.keeps_innermost)


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


@compute_of("ArgMax")
def arg_max(ctx, data, *, axis, keepdims, select_last_index):
    return _arg_extreme(data, axis, keepdims, select_last_index, "max")


@compute_of("ArgMin")
def arg_min(ctx, data, *, axis, keepdims, select_last_index):
    return _arg_extreme(data, axis, keepdims, select_last_index, "min")


# ----------------------------------------------------------------------------- TopK

# TopK finds up to this many values by selection passes over the line (the extreme of the
# elements not chosen yet), when that costs less than counting every element's rank in the
# sorted line (a pass over the line per element) and writing the first K ranks in place.
MAX_COMPILED_TOP_K = 8
# The longest line whose ranks are counted: the work grows with the square of the length.
# Measured on sorts of float32 lines against the reference's numpy sort (a Zen 4, 2 threads,
# the counts lane-parallel): 64 x 256 0.43 ms against 0.56, 32 x 1000 3.5 ms against 1.7.
# Longer lines keep the reference's sort unless K is small enough to select.
MAX_RANKED_LENGTH = 512


@compute_of("TopK")
def top_k(ctx, data, k, *, axis, largest, sorted):
    """The K largest (or smallest) values along ``axis`` and their indices, ties in index
    order, NaN above every number (as the reference's stable sort); also a whole sort, which
    converters write as a TopK of the whole axis.

    Two algorithms, the cheaper for the line length and K (:func:`_selects`): K selection
    passes (:func:`_top_k_by_selection`) or counting every element's rank
    (:func:`_top_k_by_rank`)."""
    require_kernel_dtypes(data, allow_bool=False)
    if data.ndim == 0:
        raise NoCompute("TopK needs rank >= 1")
    given = ctx.value(1)
    if given is None:
        raise NoCompute("K is known only at run time")
    count = int(np.asarray(given).reshape(-1)[0])
    axis = normalize_axis(axis, data.ndim)
    length = data.shape[axis]
    if not 1 <= count <= length:
        raise NoCompute(f"K={count} outside 1..{length} (the reference reports it)")
    if _selects(count, length):
        return _top_k_by_selection(data, count, axis, bool(largest))
    if length > MAX_RANKED_LENGTH:
        raise NoCompute(f"K={count} of a line of {length} elements: the compiled TopK sorts "
                        f"lines of up to {MAX_RANKED_LENGTH} elements, or selects up to "
                        f"{MAX_COMPILED_TOP_K} values from any length")
    return _top_k_by_rank(data, count, axis, bool(largest))


def _selects(count: int, length: int) -> bool:
    """Whether K selection passes cost less than counting ranks: pass ``r`` reads the line
    twice and compares each element with the ``r`` chosen before it (about
    ``K * (K / 2 + 2)`` operations per element), counting ranks compares every element with
    every other (``length`` per element)."""
    return count <= MAX_COMPILED_TOP_K and count * (count / 2 + 2) < length


def _chunk_size(count: int, length: int) -> int | None:
    """The chunk length (a power of two) at which selecting through chunks
    (:func:`_top_k_by_chunks`) costs at most half of selecting from the whole line, or None.

    Through chunks of ``S``: two passes over the line for the chunks' best elements, then the
    selection passes over the ``length / S`` bests and over the ``K * S`` elements of the
    chosen chunks; cheapest near ``S = sqrt(length / K)``."""
    per_element = count * (count / 2 + 2)
    size = 1 << max(1, round(math.log2(math.sqrt(length / count))))
    chunks = -(-length // size)
    if chunks < count:
        return None
    through_chunks = 2 * length + (chunks + count * size) * per_element
    return size if 2 * through_chunks <= length * per_element else None


def _top_k_by_selection(data: Tensor, count: int, axis: int, largest: bool
                        ) -> tuple[Tensor, Tensor]:
    """K selection passes over each whole line (:func:`_select`), or through chunks where
    that reads less (:func:`_chunk_size`); the values are read back from ``data``."""
    length = data.shape[axis]
    red = Reduction(data.shape, (axis,), keepdims=True)
    size = _chunk_size(count, length)
    if size is not None:
        chosen = _top_k_by_chunks(data, count, axis, largest, size)
    else:
        def element(index: Sequence[Expr], r: Expr) -> Expr:
            return widen(data[red.source(index, [r])])

        chosen = _select(red.kept_shape, length, element, lambda index, r: r, None, count,
                         largest, data.dtype.is_float, length, "topk")
    out = tuple(count if a == axis else d for a, d in enumerate(data.shape))
    indices = compute(out, lambda *index: _rank_element(chosen, index, axis, red.kept),
                      name="topk_indices", dtype=DType.INT64)

    def value_at(*index: Expr) -> Expr:
        # (a chosen index is always in range; the clamp lets the compiler see it)
        at = clamp_index(as_index(indices[index]), length)
        return data[index[:axis] + (at,) + index[axis + 1:]]

    return compute(out, value_at, name="topk_values"), indices


def _rank_element(chosen: Sequence[Tensor], index: Sequence[Expr], axis: int,
                  at: Callable[[Sequence[Expr]], Sequence[Expr]]) -> Expr:
    """Element ``at(index)`` of the stage of rank ``index[axis]`` among ``chosen``."""
    position: Expr = chosen[-1][at(index)]
    for rank in reversed(range(len(chosen) - 1)):
        position = Select(index[axis].eq(Const(rank, INDEX)), chosen[rank][at(index)],
                          position)
    return position


def _select(shape: Sequence[int], extent: int, element: Callable[[Sequence[Expr], Expr], Expr],
            key: Callable[[Sequence[Expr], Expr], Expr],
            valid: Callable[[Sequence[Expr], Expr], Expr] | None, count: int, largest: bool,
            is_float: bool, keys: int, name: str) -> list[Tensor]:
    """K selection passes over lines of ``extent`` positions, one line per index of
    ``shape``: ``element(index, r)`` is the value at position ``r`` and ``key(index, r)``
    (below ``keys``, distinct within a line) the element's place in the order ties follow;
    positions where ``valid`` is false take no part.

    Rank ``r`` is the key of the smallest key, among the elements ranks ``0..r-1`` did not
    choose, that reaches the extreme of those elements -- the maximum (NaN when one is NaN),
    or the minimum of the numbers (a NaN only when no number is left).  Returns the K stages
    of chosen keys (int64), best first."""
    chosen: list[Tensor] = []
    for rank in range(count):
        taken = tuple(chosen)

        def allowed(index: Sequence[Expr], r: Expr, taken=taken) -> list[Expr]:
            """Conditions on position ``r``: valid, and not chosen by an earlier rank."""
            return [*(() if valid is None else (valid(index, r),)),
                    *(key(index, r).ne(as_index(t[index])) for t in taken)]

        def peak_body(*index: Expr, allowed=allowed) -> Expr:
            r = reduce_axis(extent, "r")
            value = element(index, r)
            if largest:
                return reduce_max(value, r, logical_and(*allowed(index, r)))
            number = logical_and(*((value.eq(value),) if is_float else ()), *allowed(index, r))
            return reduce_min(value, r, number)

        peak = compute(shape, peak_body, name=f"{name}_peak{rank}")

        def key_body(*index: Expr, allowed=allowed, peak=peak) -> Expr:
            r = reduce_axis(extent, "r")
            value = element(index, r)
            place = key(index, r)
            hit = value.eq(peak[index])
            if is_float and largest:  # a NaN is the maximum
                hit = logical_or(hit, value.ne(value))
            # (smallest: a NaN only after every number, ranked behind them all)
            late = Select(value.ne(value), place + Const(keys, INDEX), Const(2 * keys, INDEX)) \
                if is_float and not largest else Const(keys, INDEX)
            return reduce_min(Select(hit, place, late), r, logical_and(*allowed(index, r)))

        found = compute(shape, key_body, name=f"{name}_key{rank}", dtype=DType.INT64)
        if is_float and not largest:
            found = compute(shape, lambda *i, found=found: Select(
                found[i].ge(Const(keys, INDEX)), found[i] - Const(keys, INDEX), found[i]),
                name=f"{name}_index{rank}", dtype=DType.INT64)
        chosen.append(found)
    return chosen


def _top_k_by_chunks(data: Tensor, count: int, axis: int, largest: bool, size: int
                     ) -> list[Tensor]:
    """The K best of a long line, from the K chunks of ``size`` elements whose own best
    elements are the K best of those: every element of the line's K best lies in one of
    them (were its chunk's best not among the K best bests, K chunks would each hold an
    element ahead of it).  Three selections (:func:`_select`): each chunk's best (its index
    in the line), the K best chunks by their bests (ties: the lower chunk, whose best has
    the lower index), the K best of the chosen chunks' elements (keyed by their index in the
    line).  Returns the chosen indices in the line, best first."""
    length = data.shape[axis]
    chunks = -(-length // size)
    is_float = data.dtype.is_float
    red = Reduction(data.shape, (axis,), keepdims=True)

    def at(index: Sequence[Expr], place: Expr) -> Expr:
        return widen(data[red.source(index, [clamp_index(place, length)])])

    def inside(place: Callable[[Sequence[Expr], Expr], Expr]
               ) -> Callable[[Sequence[Expr], Expr], Expr] | None:
        """The positions whose element exists (None: all do, the length is whole chunks)."""
        if length % size == 0:
            return None
        return lambda index, r: place(index, r).lt(Const(length, INDEX))

    def in_chunk(index: Sequence[Expr], r: Expr) -> Expr:
        return index[axis] * Const(size, INDEX) + r

    per_chunk = tuple(chunks if a == axis else d for a, d in enumerate(data.shape))
    [best] = _select(per_chunk, size, lambda index, r: at(index, in_chunk(index, r)),
                     in_chunk, inside(in_chunk), 1, largest, is_float, length, "topk_chunk")

    # the passes below read values gathered once, not through the chosen indices each time
    best_values = compute(per_chunk, lambda *index: at(index, as_index(best[index])),
                          name="topk_chunk_best")
    order = _select(red.kept_shape, chunks,
                    lambda index, c: best_values[red.source(index, [c])],
                    lambda index, c: c, None, count, largest, is_float, chunks, "topk_chunks")
    picked = compute((*red.kept_shape[:axis], count, *red.kept_shape[axis + 1:]),
                     lambda *index: _rank_element(order, index, axis, red.kept),
                     name="topk_picked", dtype=DType.INT64)

    def in_line(index: Sequence[Expr], p: Expr) -> Expr:
        chunk = as_index(picked[red.source(index, [p // Const(size, INDEX)])])
        return chunk * Const(size, INDEX) + p % Const(size, INDEX)

    candidates = tuple(count * size if a == axis else d for a, d in enumerate(data.shape))
    keys = compute(candidates, lambda *index: in_line(index, index[axis]), name="topk_key",
                   dtype=DType.INT64)
    values = compute(candidates, lambda *index: at(index, keys[index]), name="topk_candidate")

    def key_of(index: Sequence[Expr], p: Expr) -> Expr:
        return keys[red.source(index, [p])]

    return _select(red.kept_shape, count * size,
                   lambda index, p: values[red.source(index, [p])], key_of, inside(key_of),
                   count, largest, is_float, length, "topk")


def _top_k_by_rank(data: Tensor, count: int, axis: int, largest: bool
                   ) -> tuple[Tensor, Tensor]:
    """TopK by counting ranks: element ``i``'s rank is the number of elements of its line
    that come before it in the sorted order (larger -- smaller with ``largest`` off --, or
    equal at a lower index; NaN greater than every number and equal to NaN), a permutation of
    ``0..length-1``; the elements of rank below ``count`` are written, value and index, at
    their rank (:func:`ember.ir.compute.scatter`)."""
    length = data.shape[axis]
    red = Reduction(data.shape, (axis,), keepdims=True)

    def ahead(j_value: Expr, i_value: Expr, j: Expr, i: Expr) -> Expr:
        """Whether the element at ``j`` comes before the one at ``i``."""
        if largest:
            strictly = j_value.gt(i_value)
        else:
            strictly = j_value.lt(i_value)
        equal = j_value.eq(i_value)
        if data.dtype.is_float:
            j_nan, i_nan = j_value.ne(j_value), i_value.ne(i_value)
            beyond = Binary("and", j_nan, Unary("not", i_nan)) if largest else \
                Binary("and", i_nan, Unary("not", j_nan))
            strictly = logical_or(strictly, beyond)
            equal = logical_or(equal, Binary("and", j_nan, i_nan))
        return logical_or(strictly, Binary("and", equal, j.lt(i)))

    def rank_body(*index: Expr) -> Expr:
        [j] = red.axis_vars()
        mine = widen(data[index])
        other = widen(data[red.source(index, [j])])
        # (counted in int32, twice the lanes of int64: a rank is below MAX_RANKED_LENGTH)
        return reduce_sum(Const(1, DType.INT32), j,
                          condition=ahead(other, mine, j, index[axis]))

    rank = compute(data.shape, rank_body, name="topk_rank", dtype=DType.INT32)
    out = tuple(count if a == axis else d for a, d in enumerate(data.shape))

    def target(*u: Expr) -> tuple[Expr, ...]:
        # (a rank is below the length by construction; the clamp lets the compiler see it)
        place = clamp_index(as_index(rank[u]), count)
        return u[:axis] + (place,) + u[axis + 1:]

    def chosen(*u: Expr) -> Expr:
        return as_index(rank[u]).lt(Const(count, INDEX))

    values = scatter(lambda *i: const_like(0, data.dtype), out, data.shape, target,
                     lambda *u: data[u], condition=chosen, name="topk_values",
                     dtype=data.dtype)
    indices = scatter(lambda *i: Const(0, DType.INT64), out, data.shape, target,
                      lambda *u: Cast(DType.INT64, u[axis]), condition=chosen,
                      name="topk_indices", dtype=DType.INT64)
    return values, indices


# ----------------------------------------------------------------------------- CumSum


@compute_of("CumSum")
def cum_sum(ctx, x, axis, *, exclusive, reverse):
    """Each element sums the prefix (suffix with ``reverse``) of its line along the axis.

    A conditional reduction over the whole line: quadratic in the axis length, but a plain
    reduction that lowering and scheduling handle like any other.  Floats accumulate in their
    compute type, as numpy's ``cumsum`` does (:func:`running_dtype`, not float64).
    """
    return _running(ctx, x, exclusive, reverse, reduce_sum, "cumsum")


@compute_of("CumProd")
def cum_prod(ctx, x, axis, *, exclusive, reverse):
    """Each element multiplies the prefix (suffix with ``reverse``) of its line, as CumSum
    sums it (integers in int64, wrapping as numpy's; floats in their compute type)."""
    return _running(ctx, x, exclusive, reverse, reduce_prod, "cumprod")


def _running(ctx, x, exclusive: int, reverse: int, reduce: Callable[..., Reduce],
             name: str) -> Tensor:
    require_kernel_dtypes(x, allow_bool=False)
    value = ctx.value(1)
    if value is None or np.asarray(value).size != 1 or x.ndim == 0:
        raise NoCompute(f"{ctx.node.op} needs a compile-time scalar axis and rank >= 1")
    ax = normalize_axis(int(np.asarray(value).reshape(-1)[0]), x.ndim)
    red = Reduction(x.shape, (ax,), keepdims=True)
    acc = running_dtype(x.dtype)

    def body(*index: Expr) -> Expr:
        [k] = red.axis_vars()
        position = index[ax]
        if reverse:
            keep = k.gt(position) if exclusive else k.ge(position)
        else:
            keep = k.lt(position) if exclusive else k.le(position)
        return reduce(cast(widen(x[red.source(index, [k])]), acc), k, condition=keep)

    return compute(x.shape, body, name=name, dtype=x.dtype)
