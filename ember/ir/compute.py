"""Tensor expressions: the declarative compute definitions ops give for lowering.

An op describes each output element as an expression over input elements, in the spirit of
TVM's ``te.compute``:

    def relu(ctx, x):
        return compute(x.shape, lambda *i: maximum(x[i], zero(x.dtype)), name="relu")

    def matmul(ctx, a, b):
        k = reduce_axis(a.shape[1], "k")
        return compute((a.shape[0], b.shape[1]),
                       lambda i, j: reduce_sum(a[i, k] * b[k, j], k), name="matmul")

``x[i]`` on a :class:`Tensor` is an N-d ``BufferLoad`` (flattened by lowering, through the
buffer's layout); the body is an ordinary loop-IR expression, which may contain one
:class:`Reduce` (optionally wrapped in an epilogue such as ``reduce_sum(...) / n``).
Multi-stage ops (softmax) chain several ``compute`` calls, and a fused group chains the
definitions of all its nodes; lowering (``ember.lower``) inlines what it can and materializes
the rest.

Shapes here are static ints: ember compiles for concrete shapes.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ember.core.dtypes import DType
from ember.core.traced import as_size, is_traced, traced_value
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, BufferLoad, Cast, Const, Expr, Load, Var, as_expr

_names = itertools.count()


@dataclass(frozen=True)
class RangeCheck:
    """Integer input ``input`` must hold values in ``[low, high)`` at every ``stride``-th
    element from ``start`` (all of them by default).  A stride lets each component of an
    index tuple (GatherND's last axis) have the range of the dim it addresses.  ``outside``
    turns the check around: no value may lie in ``[low, high)`` (an integer divisor must not
    be 0: ``[0, 1)``)."""

    input: int
    low: int
    high: int
    start: int = 0
    stride: int = 1
    outside: bool = False


@dataclass
class ComputeContext:
    """What an op's compute function sees: the node, its static types and attributes."""

    node: Any
    input_types: list[Any]
    output_types: list[Any]
    attrs: dict[str, Any]
    constants: dict[int, Any]  # input index -> numpy value, for inputs known at compile time
    # the index inputs the compiled model range-checks before the kernel runs
    index_checks: list[RangeCheck] = field(default_factory=list)

    def value(self, index: int):
        """The compile-time value of input ``index`` (e.g. Reshape's shape), or None.
        In a traced build a value computed from run-time sizes comes with those sizes."""
        value = self.constants.get(index)
        if value is None or index >= len(self.node.inputs):
            return value
        return traced_value(self.node.inputs[index], value)

    def require_in_range(self, index: int, low: int, high: int, *, start: int = 0,
                         stride: int = 1) -> None:
        """Declare that every element of integer input ``index`` must lie in ``[low, high)``
        (or every ``stride``-th element from ``start``: one component of each index tuple).

        A kernel whose loads are addressed by run-time data (Gather's indices) must not read
        outside its input, and ONNX calls an out-of-range index an error, not a value to
        clamp: the compiled model checks the input before the kernel runs and fails with an
        error naming the node (``ember.driver.entry``)."""
        if not 0 <= start < stride:
            raise ValueError(f"range check starts at {start}, outside its stride {stride}")
        self.index_checks.append(RangeCheck(int(index), as_size(low), as_size(high),
                                            int(start), int(stride)))

    def require_nonzero(self, index: int) -> None:
        """Declare that no element of integer input ``index`` may be 0 (an integer divisor).

        Integer division by zero has no value (C leaves it undefined, ONNX Runtime fails):
        the compiled model checks the input before the kernel runs and fails with an error
        naming the node, through the same channel as :meth:`require_in_range`."""
        self.index_checks.append(RangeCheck(int(index), 0, 1, outside=True))

    @property
    def num_outputs(self) -> int:
        return len(self.output_types)


@dataclass(eq=False)
class Tensor:
    """A tensor of a compute definition: a placeholder (an input) or a computed stage."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    buffer: Buffer
    stage: "Stage | None" = None  # None for placeholders

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self.buffer.size

    def __getitem__(self, indices) -> Expr:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) == 1 and isinstance(indices[0], (tuple, list)):
            indices = tuple(indices[0])
        if len(indices) != len(self.shape):
            raise ValueError(f"tensor {self.name} has rank {len(self.shape)}, "
                             f"indexed with {len(indices)} indices")
        return BufferLoad(self.buffer, tuple(as_expr(i) for i in indices))

    def flat(self, index: Expr) -> Expr:
        """Element ``index`` of the row-major flattened tensor."""
        return BufferLoad(self.buffer, (as_expr(index),), flat=True)

    def masked(self, indices: Sequence[Expr], mask: Expr) -> Expr:
        """``self[indices]`` where ``mask`` holds; where it does not, nothing is read (the
        caller selects another value there)."""
        return BufferLoad(self.buffer, tuple(as_expr(i) for i in indices), mask)


@dataclass(frozen=True, eq=True)
class IterVar(Var):
    """A reduction axis: a loop variable that also knows its extent."""

    extent: int = 0

    @property
    def var(self) -> Var:
        return self


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """``combiner`` over ``axes`` of ``source`` starting from ``init``.

    Combiners: ``sum``, ``prod``, ``max``, ``min`` (NaN propagates, as ember's ``max`` and
    ``min`` do) and ``fmax`` (floats: the maximum of the numbers, NaN only when every term is
    NaN, as C's ``fmax`` and ``np.fmax``).  Only valid inside a compute body.
    """

    combiner: str
    source: Expr
    axes: tuple[IterVar, ...]
    init: Expr
    condition: Expr | None = None  # lanes where it is false do not contribute

    @property
    def dtype(self) -> DType:
        return self.source.dtype

    @property
    def lanes(self) -> int:
        return 1


@dataclass(frozen=True, eq=False)
class ScatterUpdate:
    """Writes at data-dependent positions after a stage's elementwise pass: for every index
    ``u`` of ``shape`` (in row-major order, one after another), element ``target(u)`` of the
    output becomes ``value(u)``, or ``combine(old, value(u))`` with ``combiner`` ("sum",
    "prod", "max", "min"), where ``condition(u)`` holds.

    The order is part of the meaning: with repeated targets the last write wins (or every
    write is combined), so the loops over ``shape`` stay serial wherever a target depends on
    them through loaded data (see ``ember.schedule.default``)."""

    axes: tuple[Var, ...]
    shape: tuple[int, ...]
    target: tuple[Expr, ...]
    value: Expr
    combiner: str | None = None
    condition: Expr | None = None

    def exprs(self) -> tuple[Expr, ...]:
        """Every expression the updates evaluate (what they read)."""
        return (*self.target, self.value, *(() if self.condition is None else
                                            (self.condition,)))


@dataclass(eq=False)
class Stage:
    """How one computed tensor is defined: its index variables and element expression.

    ``inputs`` are the tensors the body reads (placeholders or other stages), in first-use order.
    ``scatter``, when set, writes into the tensor after the body has defined every element
    (:func:`scatter`): such a stage is always stored, never inlined into its readers.
    """

    axes: tuple[Var, ...]
    body: Expr
    output: Tensor
    inputs: tuple[Tensor, ...] = ()
    scatter: ScatterUpdate | None = None


# Every live tensor by its buffer, so a stage can name the tensors its body loads from.
# Keyed by identity: buffers of equal name and shape are different tensors (and comparing
# the sizes of a traced build's buffers would record guards).
_TENSORS: "weakref.WeakValueDictionary[int, Tensor]" = weakref.WeakValueDictionary()


def _read_tensors(body: Expr) -> tuple[Tensor, ...]:
    from ember.ir.loop.functor import walk

    found: dict[int, Tensor] = {}
    for node in walk(body):
        if isinstance(node, (Load, BufferLoad)):
            tensor = _TENSORS.get(id(node.buffer))
            if tensor is not None:
                found.setdefault(id(tensor), tensor)
    return tuple(found.values())


def placeholder(shape: Sequence[int], dtype: DType, name: str = "in") -> Tensor:
    shape = tuple(as_size(d) for d in shape)
    tensor = Tensor(name, dtype, shape, Buffer(name, dtype, shape))
    _TENSORS[id(tensor.buffer)] = tensor
    return tensor


def compute(shape: Sequence[int], fcompute: Callable[..., Expr], name: str = "T",
            dtype: DType | None = None) -> Tensor:
    """A tensor whose element at index ``i`` is ``fcompute(*i)``."""
    shape = tuple(as_size(d) for d in shape)
    unique = f"{name}_{next(_names)}"
    axes = tuple(Var(f"{unique}_i{a}") for a in range(len(shape)))
    body = as_expr(fcompute(*axes))
    out_dtype = dtype or body.dtype
    if body.dtype != out_dtype:
        body = Cast(out_dtype, body)
    tensor = Tensor(unique, out_dtype, shape, Buffer(unique, out_dtype, shape))
    tensor.stage = Stage(axes, body, tensor, _read_tensors(body))
    _TENSORS[id(tensor.buffer)] = tensor
    return tensor


_SCATTER_COMBINERS = (None, "sum", "prod", "max", "min")


def scatter(base: Callable[..., Expr], shape: Sequence[int], updates: Sequence[int],
            target: Callable[..., Sequence[Expr]], value: Callable[..., Expr],
            combiner: str | None = None, condition: Callable[..., Expr] | None = None,
            name: str = "scatter", dtype: DType | None = None) -> Tensor:
    """A tensor of ``shape`` that starts as ``base(*i)`` everywhere, then takes
    ``value(*u)`` at ``target(*u)`` for every index ``u`` of ``updates`` in order (combined
    with the old element by ``combiner``, only where ``condition(*u)`` holds): ScatterND,
    ScatterElements and the writes of a sort by rank.

    ``target`` must stay inside ``shape`` for every ``u`` (clamp data-dependent positions,
    and range-check the index inputs with ``ComputeContext.require_in_range``)."""
    if combiner not in _SCATTER_COMBINERS:
        raise ValueError(f"unknown scatter combiner {combiner!r}")
    tensor = compute(shape, base, name=name, dtype=dtype)
    if _has_reduce(tensor.stage.body):
        raise ValueError(f"scatter {name}: the base must be elementwise (no reduction)")
    updates = tuple(as_size(d) for d in updates)
    axes = tuple(Var(f"{tensor.name}_u{a}") for a in range(len(updates)))
    coords = tuple(as_expr(c) for c in target(*axes))
    if len(coords) != len(tensor.shape):
        raise ValueError(f"scatter {name}: target has {len(coords)} coordinates, the tensor "
                         f"rank {len(tensor.shape)}")
    written = as_expr(value(*axes))
    if written.dtype != tensor.dtype:
        written = Cast(tensor.dtype, written)
    where = None if condition is None else as_expr(condition(*axes))
    update = ScatterUpdate(axes, updates, coords, written, combiner, where)
    stage = tensor.stage
    reads = {id(t): t for t in stage.inputs}
    for expr in update.exprs():
        for t in _read_tensors(expr):
            reads.setdefault(id(t), t)
    tensor.stage = Stage(stage.axes, stage.body, tensor, tuple(reads.values()), update)
    return tensor


def _has_reduce(body: Expr) -> bool:
    from ember.ir.loop.functor import walk

    return any(isinstance(node, Reduce) for node in walk(body))


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    return IterVar(f"{name}_{next(_names)}", INDEX, as_size(extent))


def _axes(axis: IterVar | Sequence[IterVar]) -> tuple[IterVar, ...]:
    return (axis,) if isinstance(axis, IterVar) else tuple(axis)


def identity(combiner: str, dtype: DType) -> Const:
    """The neutral element of a combiner in ``dtype``."""
    import numpy as np

    if combiner == "sum":
        return Const(0.0 if dtype.is_float else 0, dtype)
    if combiner == "prod":
        return Const(1.0 if dtype.is_float else 1, dtype)
    if combiner in ("max", "min"):
        if dtype.is_float:
            return Const(float("-inf") if combiner == "max" else float("inf"), dtype)
        if dtype == DType.BOOL:
            return Const(combiner == "min", dtype)
        info = np.iinfo(dtype.numpy)
        return Const(int(info.min if combiner == "max" else info.max), dtype)
    if combiner == "fmax" and dtype.is_float:
        return Const(float("nan"), dtype)
    raise ValueError(f"unknown combiner {combiner!r} for {dtype}")


def reduce_sum(source: Expr, axis, condition: Expr | None = None) -> Reduce:
    return Reduce("sum", source, _axes(axis), identity("sum", source.dtype), condition)


def reduce_prod(source: Expr, axis, condition: Expr | None = None) -> Reduce:
    return Reduce("prod", source, _axes(axis), identity("prod", source.dtype), condition)


def reduce_max(source: Expr, axis, condition: Expr | None = None) -> Reduce:
    return Reduce("max", source, _axes(axis), identity("max", source.dtype), condition)


def reduce_fmax(source: Expr, axis, condition: Expr | None = None) -> Reduce:
    """The maximum of the terms that are numbers (NaN terms are skipped; all NaN: NaN)."""
    return Reduce("fmax", source, _axes(axis), identity("fmax", source.dtype), condition)


def reduce_min(source: Expr, axis, condition: Expr | None = None) -> Reduce:
    return Reduce("min", source, _axes(axis), identity("min", source.dtype), condition)


# 16-bit floats are stored as such but computed in float32 (rounded back on store), as the
# numpy references do.
NARROW_FLOATS = frozenset({DType.FLOAT16, DType.BFLOAT16})


def compute_dtype(dtype: DType) -> DType:
    """The type to compute a float value in: float32 for 16-bit floats, else ``dtype``."""
    return DType.FLOAT32 if dtype in NARROW_FLOATS else dtype


def cast(value: Expr, dtype: DType) -> Expr:
    """``value`` converted to ``dtype`` (no node when it already has it)."""
    return value if value.dtype == dtype else Cast(dtype, value)


def widen(value: Expr) -> Expr:
    """``value`` in its :func:`compute_dtype`."""
    return cast(value, compute_dtype(value.dtype))


def const_like(value: float | int | bool, dtype: DType) -> Const:
    """A constant of ``dtype`` (ints for integer types, floats for float types)."""
    if dtype == DType.BOOL:
        return Const(bool(value), dtype)
    if is_traced(value):  # a size of a traced build: printed as its expression
        return Const(value, dtype)
    return Const(float(value) if dtype.is_float else int(value), dtype)


def unravel(flat: Expr, shape: Sequence[int]) -> list[Expr]:
    """Per-axis indices of a row-major flat index (``flat`` must be in range)."""
    from ember.ir.loop.simplify import simplify

    strides, stride = [], 1
    for d in reversed(shape):
        strides.append(stride)
        stride *= d
    strides.reverse()
    indices: list[Expr] = []
    for axis, (d, s) in enumerate(zip(shape, strides)):
        index = flat // s if s != 1 else flat
        if axis > 0:
            index = index % d
        indices.append(simplify(index))
    return indices
