"""One build for every size of a symbolic dim: builds traced over run-time dims.

A :class:`ember.Module` with dynamic dims other than the batch (a sequence length) used to
compile a specialization per size.  Here the module instead compiles *once* with those dims
traced (``ember.core.traced``): loop extents, strides and workspace offsets become
expressions of an ``em_dims`` array that the library reads at run time, and the compiler's
decisions on the traced sizes become guards.  A later call whose sizes satisfy the guards
runs on the same library; one that breaks a guard gets a build of its own, and the module
says which guard (and which compiler line decided on it).

Sizes that escape the trace (read as plain numbers, e.g. by numpy while folding constants)
would be baked into the code.  A read through ``int()`` is recorded and refuses the build;
other reads (numpy's) cannot be seen, so the graph is also traced twice, at the call's sizes and at
nearby sizes that satisfy the same guards, and the build is kept only if both traces give
the same source, the same weights and the same guards; otherwise the module falls back to
specializations and says why.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.dims import single_symbol
from ember.core.errors import EmberError, InputError
from ember.core.traced import Guard, SizeExpr, SizeTrace, expr_of, tracing
from ember.driver.pipeline import Build, BuildOptions, build_graph
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.runtime.dims_model import DimsBinding, RuntimeDimsModel

RUNTIME_DIMS_ENV = "EMBER_RUNTIME_DIMS"
# How far the second trace's sizes may lie from the first's (it must satisfy every guard).
_SECOND_SAMPLE_OFFSETS = (1, 2, 3, 5, 7, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16)


def runtime_dims_enabled() -> bool:
    """On unless ``EMBER_RUNTIME_DIMS=0``, which asks for a specialization per size (the
    way to tell whether a problem comes from a traced build)."""
    return os.environ.get(RUNTIME_DIMS_ENV, "1").strip() not in ("0", "")


# Traces refused for a size compiled in as a number after which a module stops trying (each
# costs two traces of the graph, and the next would likely be refused alike).  Traces
# refused because the code depends on the exact sizes do not count: those sizes are kept
# out of later attempts by the refused trace's guards.
MAX_REFUSED_TRACES = 2


class NotTraceable(EmberError):
    """The graph cannot be compiled once for every size of its dims; says why.  ``trace`` is
    the first trace when there was one: sizes that satisfy its guards would be refused
    again."""

    def __init__(self, message: str, trace: SizeTrace | None = None,
                 pinned: bool = False) -> None:
        super().__init__(message)
        self.trace = trace
        self.pinned = pinned    # refused because the code depends on the exact sizes


class GuardFailed(NotTraceable):
    """A call's dims break a guard of a traced build (the other failures of ``dims_for`` are
    shapes the build cannot take at all, such as another batch block size).

    Raised on every call that another build serves, so its message -- which searches the
    sizes the build covers -- is written only when read."""

    def __init__(self, describe: Callable[[], str]) -> None:
        super().__init__("a size breaks a guard of the build")
        self._describe = describe
        self._message: str | None = None

    def __str__(self) -> str:
        if self._message is None:
            self._message = self._describe()
        return self._message


# Sizes per traced build whose guard checks are remembered (see TracedVariant._admitted).
MAX_ADMITTED_DIMS = 256


@dataclass
class TracedVariant:
    """A build whose library takes ``trace.names`` at run time, and what it needs to run."""

    trace: SizeTrace
    fixed: dict[str, int]  # the symbols compiled in (a batch block size), by name
    inputs: dict[str, tuple[SizeExpr, ...]]
    outputs: tuple[tuple[SizeExpr, ...], ...]
    workspace: SizeExpr
    build: Build
    runtime: RuntimeDimsModel | None = None
    # Dims that passed every guard, and their bindings: a model called again at sizes it has
    # seen skips the guards (hundreds of expressions for a CNN whose image sizes are traced:
    # 1.7 ms a call, against 0.2 ms for its kernels).  Bounded (emptied when full); plain
    # dict operations, which calls from several threads may interleave.
    _admitted: dict[tuple[int, ...], DimsBinding | None] = field(
        default_factory=dict, repr=False, compare=False)

    def dims_for(self, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
        """The run-time dims of a call with these input shapes; NotTraceable says why the
        build does not serve them (a shape it cannot take, or the guard they break)."""
        values: dict[int, int] = {}
        for name, exprs in self.inputs.items():
            shape = shapes.get(name)
            if shape is None or len(shape) != len(exprs):
                raise NotTraceable(f"input '{name}' has shape {shape}")
            for expr, size in zip(exprs, shape):
                if expr.op == "sym":
                    values.setdefault(expr.args[0], int(size))
        if len(values) != len(self.trace.names):
            raise NotTraceable("the inputs do not give every traced dim")
        dims = tuple(values[i] for i in range(len(self.trace.names)))
        self._check_shapes(shapes, dims)
        if dims in self._admitted:
            return dims
        failed = self.trace.failed_guard(dims)
        if failed is not None:
            raise GuardFailed(lambda: f"{self._outside(dims, failed)} (the guard '{failed}' "
                                      f"of the build traced at "
                                      f"{self.describe(self.trace.samples)}, decided at "
                                      f"{failed.where})")
        if len(self._admitted) >= MAX_ADMITTED_DIMS:
            self._admitted.clear()
        self._admitted.setdefault(dims, None)
        return dims

    def _check_shapes(self, shapes: Mapping[str, tuple[int, ...]], dims: tuple[int, ...]
                      ) -> None:
        """Every input's shape is the one the build computes from ``dims``."""
        for name, exprs in self.inputs.items():
            expected = tuple(e.evaluate(dims) for e in exprs)
            if expected != tuple(shapes[name]):
                raise NotTraceable(f"input '{name}' has shape {list(shapes[name])}, the build "
                                   f"expects {list(expected)} for {self.describe(dims)}")

    def _outside(self, dims: tuple[int, ...], failed: Guard) -> str:
        """The failure in the user's terms: which size falls outside the sizes the build
        covers ("seq=40 is outside 16..31, the sizes of seq this build covers at batch=2"),
        for the first dim of the broken guard whose covered sizes can be told."""
        for index in sorted(_symbols_of(failed.lhs) | _symbols_of(failed.rhs)):
            covered = covered_sizes(self.trace, dims, index)
            if covered is None:
                continue
            name, others = self.trace.names[index], [
                f"{n}={d}" for i, (n, d) in enumerate(zip(self.trace.names, dims)) if i != index]
            low, high = covered
            open_ended = high >= self.trace.samples[index] + COVER_REACH
            span = f"{low} and up" if open_ended else f"{low}..{high}"
            at = f" at {', '.join(others)}" if others else ""
            return (f"{name}={dims[index]} is outside {span}, the sizes of {name} this build "
                    f"covers{at}")
        return f"{self.describe(dims)} breaks a guard"

    def binding(self, shapes: Mapping[str, tuple[int, ...]]) -> DimsBinding:
        try:
            dims = self.dims_for(shapes)
        except NotTraceable as why:
            raise InputError(f"this build does not serve the input shapes: {why}") from None
        bound = self._admitted.get(dims)
        if bound is None:
            bound = DimsBinding(dims, tuple(tuple(e.evaluate(dims) for e in shape)
                                            for shape in self.outputs),
                                self.workspace.evaluate(dims))
            self._admitted[dims] = bound
        return bound

    def describe(self, dims: Sequence[int]) -> str:
        return ", ".join(f"{name}={size}" for name, size in zip(self.trace.names, dims))


# How far from the traced size a covered range is searched, each way (guards that mention
# the dim are evaluated at every size in between).
COVER_REACH = 1024


def covered_sizes(trace: SizeTrace, dims: Sequence[int], index: int
                  ) -> tuple[int, int] | None:
    """The sizes of traced dim ``index`` around its traced sample that every guard admits,
    the other dims at ``dims``, as (lowest, highest) within :data:`COVER_REACH` of the sample;
    None when the sample itself is not admitted there."""
    guards = [g for g in trace.guards if index in _symbols_of(g.lhs) | _symbols_of(g.rhs)]
    point = list(dims)

    def admitted(size: int) -> bool:
        point[index] = size
        return size >= 1 and all(guard.holds(point) for guard in guards)

    sample = trace.samples[index]
    if not admitted(sample):
        return None
    low = sample
    while low > max(1, sample - COVER_REACH) and admitted(low - 1):
        low -= 1
    high = sample
    while high < sample + COVER_REACH and admitted(high + 1):
        high += 1
    return low, high


def _symbols_of(expr: SizeExpr) -> set[int]:
    if expr.op == "sym":
        return {int(expr.args[0])}
    return {index for arg in expr.args if isinstance(arg, SizeExpr)
            for index in _symbols_of(arg)}


def traced_symbols(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
                   keep: frozenset[str] = frozenset()) -> dict[str, int]:
    """The symbols of the graph's input dims to trace (all but ``keep``), with their sizes in
    ``shapes`` (in order of first appearance)."""
    symbols: dict[str, int] = {}
    for name in graph.inputs:
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None or name not in shapes:
            continue
        for dim, size in zip(vtype.shape, shapes[name]):
            symbol = single_symbol(dim)
            if symbol is not None and symbol not in keep:
                symbols.setdefault(symbol, int(size))
    return symbols


def build_traced(graph: Graph, options: BuildOptions, shapes: Mapping[str, tuple[int, ...]],
                 symbols: Mapping[str, int]) -> TracedVariant:
    """Compile ``graph`` once for every size of ``symbols`` (their sizes in ``shapes`` are the
    first sample).  NotTraceable says why it cannot."""
    names = tuple(symbols)
    # one memory budget for both traces (the memory available changes between them, and
    # the budget's guards must not)
    options = replace(options, memory_limit=resolve_memory_limit(options.memory_limit))
    first = _traced_build(graph, options, shapes, SizeTrace(names, tuple(symbols.values())))
    trace, build = first
    foreign = trace.foreign_guard()
    if foreign is not None:
        raise NotTraceable(f"a size of another build reached this one: guard '{foreign}' "
                           f"(decided at {foreign.where})", trace)
    if trace.plain_reads:
        where, expr = next(iter(trace.plain_reads.items()))
        raise NotTraceable(f"a size is compiled in as a number: {expr} is read as a plain "
                           f"number at {where}", trace)
    second_samples = _second_sample(trace)
    if second_samples is None:
        guard = _pinning_guard(trace)
        raise NotTraceable(f"the code depends on the exact size: guard '{guard}' (decided at "
                           f"{guard.where})" if guard is not None else
                           "no other sizes satisfy the guards of the first trace", trace,
                           pinned=True)
    second_shapes = _with_sizes(graph, shapes, dict(zip(names, second_samples)))
    other_trace, other = _traced_build(graph, options, second_shapes,
                                       SizeTrace(names, second_samples))
    difference = _difference(build, other, trace, other_trace)
    if difference:
        raise NotTraceable(f"a size is compiled in as a number ({difference})", trace)
    return TracedVariant(
        trace, {},
        {name: tuple(expr_of(d) for d in build.graph.types[name].shape)
         for name in graph.inputs if isinstance(build.graph.types.get(name), TensorType)},
        tuple(tuple(expr_of(d) for d in build.graph.types[name].shape)
              for name in graph.outputs),
        expr_of(build.workspace_size), build)


def runtime_for(variant: TracedVariant, artifact: Any, host_resolver: Any) -> RuntimeDimsModel:
    return RuntimeDimsModel(artifact, variant.binding, host_resolver=host_resolver)


# ---------------------------------------------------------------------- tracing


def _traced_build(graph: Graph, options: BuildOptions, shapes: Mapping[str, tuple[int, ...]],
                  trace: SizeTrace) -> tuple[SizeTrace, Build]:
    traced_shapes = _with_sizes(graph, shapes, {name: trace.symbol(name)
                                                for name in trace.names})
    with tracing(trace):
        try:
            build = build_graph(graph, traced_shapes, options)
        except EmberError as error:
            raise NotTraceable(str(error)) from None
    return trace, build


def _with_sizes(graph: Graph, shapes: Mapping[str, tuple[int, ...]],
                sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """``shapes`` with every dim of a symbol in ``sizes`` (by the graph's input types) set to
    that symbol's size."""
    result = {}
    for name, shape in shapes.items():
        vtype = graph.types.get(name)
        dims = vtype.shape if isinstance(vtype, TensorType) and vtype.shape is not None \
            else (None,) * len(shape)
        result[name] = tuple(sizes.get(single_symbol(dim), size)
                             for dim, size in zip(dims, shape))
    return result


def _second_sample(trace: SizeTrace) -> tuple[int, ...] | None:
    """Sizes near the first sample's that satisfy every guard of the first trace."""
    for offset in _SECOND_SAMPLE_OFFSETS:
        for sign in (1, -1):
            candidate = tuple(size + sign * offset * (1 + i) for i, size in
                              enumerate(trace.samples))
            if all(size >= 1 for size in candidate) and trace.failed_guard(candidate) is None:
                return candidate
    return None


def _pinning_guard(trace: SizeTrace) -> Guard | None:
    """What pins the sizes: the guard that the next larger sizes break, else the one that
    the next smaller sizes break."""
    return trace.failed_guard(tuple(size + 1 for size in trace.samples)) or \
        trace.failed_guard(tuple(size - 1 for size in trace.samples))


# The parts of the source that describe the traced sample (its shapes, its workspace size),
# and the link names of kernel units (hashes of their text: the text itself is compared).
_SAMPLE_LINES = re.compile(r"^(\{ return .*; \})$", re.MULTILINE)
_UNIT_NAMES = re.compile(r"ember_(k|gemm_shared)_[0-9a-f]{32}")


def _difference(first: Build, second: Build, first_trace: SizeTrace,
                second_trace: SizeTrace) -> str:
    """What differs between two traces of one graph at different sizes ('' if nothing)."""
    if set(first_trace.guards) != set(second_trace.guards):
        extra = next(iter(set(first_trace.guards) ^ set(second_trace.guards)))
        return f"the guards differ: '{extra}' (decided at {extra.where})"
    if sorted(first.weights) != sorted(second.weights):
        return "the weights differ: " + ", ".join(
            sorted(set(first.weights) ^ set(second.weights))[:3])
    for name, value in first.weights.items():
        other = second.weights[name]
        if value.shape != other.shape or not np.array_equal(value, other):
            return f"constant '{name}' depends on the size"
    a = _UNIT_NAMES.sub("", _SAMPLE_LINES.sub("", first.source)).splitlines()
    b = _UNIT_NAMES.sub("", _SAMPLE_LINES.sub("", second.source)).splitlines()
    for line_a, line_b in zip(a, b):
        if line_a != line_b:
            return f"the code differs: '{line_a.strip()[:100]}' vs '{line_b.strip()[:100]}'"
    if len(a) != len(b):
        return "the code differs in length"
    return ""


__all__ = ["GuardFailed", "MAX_REFUSED_TRACES", "NotTraceable", "RUNTIME_DIMS_ENV", "TracedVariant", "build_traced",
           "runtime_dims_enabled", "runtime_for", "traced_symbols"]
