"""Turn compute definitions (``ember.ir.compute``) into loop nests.

First the stages that need no memory of their own are inlined into their readers
(:mod:`ember.lower.inline`).  Each remaining stage becomes one loop nest over its output axes.
A stage whose body holds a :class:`~ember.ir.compute.Reduce` gets a local accumulator:
initialise, loop over the reduction axes combining, then store the body with the accumulator
substituted for the reduction -- which is how epilogues such as ``sum / n``, and the
elementwise consumers fused into a reduction, apply before the one store.  Stages that are
not outputs are materialized in *scratch* buffers: extra kernel parameters that the caller
places in the workspace arena (the ``scratch`` attribute of the PrimFunc counts them; they
follow the outputs).  Finally N-d accesses are flattened through each buffer's layout.

The loop nests are naive on purpose; schedules (``ember.schedule``) make them fast.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ember.core.errors import EmberError
from ember.core.traced import is_traced
from ember.ir.compute import ComputeContext, Reduce, ScatterUpdate, Stage, Tensor, placeholder
from ember.ir.graph import Node
from ember.lower.flatten import element_offset, flatten
from ember.lower.inline import at_own_index, inline_stages
from ember.ir.loop.affine import local_stride
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, Binary, BufferLoad, Const, Expr, Load, Select, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import (Allocate, For, ForKind, IfThenElse, PrimFunc, Stmt, Store,
                                 seq)
from ember.ir.types import TensorType
from ember.ops.registry import NoCompute, OpDef


# Loads whose innermost-output-axis stride is at most this still vectorize well (strided
# loads become a few permutes); larger strides are gathers, better left to a scalar reduction.
MAX_VECTOR_LOAD_STRIDE = 4
# Shorter innermost output axes are not worth vectorizing (a scalar accumulator wins).
MIN_VECTOR_EXTENT = 4
# A window of at most this many terms, each of its loops at most MAX_WINDOW_LOOP long, is
# summed in a register per output element (see _is_short_window).  Measured on depthwise
# convolutions (one process, against accumulating in the output): 3x3 1.2-2.8x and 5x5
# 1.25-2.6x faster; 7x7 2-2.3x faster with its taps marked to be unrolled -- left to itself
# GCC keeps 49 taps rolled and scalar (1.5-1.8x slower than accumulating) -- while marking
# the taps of 3x3 and 5x5 windows made them up to 1.8x slower than GCC's own unrolling.
MAX_WINDOW_TERMS = 49
MAX_WINDOW_LOOP = 16
MAX_SELF_UNROLLED_TERMS = 25


class LoweringError(EmberError):
    """A compute definition could not be lowered (a bug in an op's compute, named here)."""


def lower_node(node: Node, opdef: OpDef, input_types: Sequence[TensorType | None],
               output_types: Sequence[TensorType], attrs: dict[str, Any],
               constants: dict[int, Any], name: str) -> PrimFunc | None:
    """Lower one node for its static types; None if the op has no compute for this case.

    The kernel's ``index_checks`` attribute lists the inputs whose values the caller must
    range-check before calling it (see ``ComputeContext.require_in_range``)."""
    if opdef.compute is None:
        return None
    inputs = [placeholder(t.shape, t.dtype, name=f"in{i}") if t is not None else None
              for i, t in enumerate(input_types)]
    ctx = ComputeContext(node, list(input_types), list(output_types), attrs, constants)
    try:
        result = opdef.compute(ctx, *inputs, **attrs)
    except NoCompute:
        return None
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    for i, (tensor, expected) in enumerate(zip(outputs, output_types)):
        if tensor.shape != tuple(expected.shape) or tensor.dtype != expected.dtype:
            raise LoweringError(
                f"compute of {node.op} (node '{node.name}') gives output {i} as "
                f"{tensor.dtype}{list(tensor.shape)}, the graph expects {expected}")
    attrs: tuple[tuple[str, object], ...] = (("op", node.op), ("node", node.name))
    if ctx.index_checks:  # read by the entry point, which checks before calling the kernel
        attrs += (("index_checks", tuple(ctx.index_checks)),)
    return lower_compute(name, [t for t in inputs if t is not None], outputs, attrs=attrs)


@dataclass(frozen=True)
class Placement:
    """An output stored inside a larger buffer, the rest of which holds one value: a
    computed tensor written straight into the padded buffer of a Pad that reads only it
    (``before``: the elements in front of the tensor along each axis; ``shape``: the
    buffer's).  The producer's loops then store at an offset, and small nests fill the
    border, instead of a second kernel copying the whole tensor."""

    before: tuple[int, ...]
    shape: tuple[int, ...]
    fill: Expr


def lower_compute(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                  attrs: tuple = (), placements: Mapping[int, Placement] | None = None
                  ) -> PrimFunc:
    """Build a PrimFunc computing ``outputs`` from placeholder ``inputs``.

    Outputs that are placeholders themselves (an op that returns an input unchanged) or that
    appear twice are copied into fresh output buffers.  ``placements`` (by output position)
    store a computed output inside a larger buffer (:class:`Placement`).
    """
    placements = dict(placements or {})
    stages = inline_stages(_topological_stages(outputs), list(outputs)).stages
    out_buffers: list[Buffer] = []
    body_parts: list[Stmt] = []
    borders: list[Stmt] = []
    offsets: dict[Buffer, tuple[int, ...]] = {}
    seen: set[int] = set()
    for index, tensor in enumerate(outputs):
        placement = placements.get(index)
        if placement is not None and (tensor.stage is None or id(tensor) in seen or
                                      tensor.stage.scatter is not None or
                                      any(id(t) == id(tensor) for t in outputs[index + 1:])):
            raise LoweringError(f"output {index} of {name}: only a tensor computed once "
                                f"may be placed inside a larger buffer")
        shape = placement.shape if placement is not None else tensor.shape
        out = Buffer(f"out{index}", tensor.dtype, shape)
        out_buffers.append(out)
        if placement is not None:
            offsets[out] = placement.before
            borders.append(fill_border(out, placement.before, tensor.shape, placement.fill))
        elif tensor.stage is None or id(tensor) in seen:
            body_parts.append(_copy(tensor, out))
        seen.add(id(tensor))
    rename: dict[int, Buffer] = {}  # a computed output is stored in its first output buffer
    for t, b in zip(outputs, out_buffers):
        if t.stage is not None:
            rename.setdefault(id(t), b)
    buffer_map = {t.buffer: rename[id(t)] for t in outputs if id(t) in rename}
    for stage, into in _stored_in_outputs(stages, outputs, placements):
        buffer_map[stage.output.buffer] = buffer_map[into.output.buffer]
    scratch: list[Buffer] = []
    for stage in stages:
        if stage.output.buffer not in buffer_map:
            buffer = Buffer(f"scratch{len(scratch)}", stage.output.dtype, stage.output.shape)
            buffer_map[stage.output.buffer] = buffer
            scratch.append(buffer)
    nests = [_lower_stage(stage, buffer_map, offsets) for stage in stages]
    # copies of repeated outputs read the buffer the stage was stored in
    body = seq(*nests, *(_rebind_all(part, buffer_map) for part in body_parts), *borders)
    body = flatten(_rebind_all(body, buffer_map))
    params = tuple(t.buffer for t in inputs) + tuple(out_buffers) + tuple(scratch)
    return PrimFunc(name, params, _canonical_names(simplify(body)),
                    tuple(attrs) + (("scratch", len(scratch)),))


def _stored_in_outputs(stages: list[Stage], outputs: Sequence[Tensor],
                       placements: Mapping[int, Placement]) -> list[tuple[Stage, Stage]]:
    """(stage, last stage) pairs where an intermediate stage can be stored in the buffer of
    the last stage's output instead of a scratch of its own: the last stage computes an
    output of the same shape and type elementwise, reading the intermediate only at its own
    index, and every other reader of the intermediate runs before it (a softmax's
    exponentials, summed by one stage and divided by the last: kept in the output, they
    are not a second tensor-sized buffer written out to memory and read back)."""
    if not stages:
        return []
    last = stages[-1]
    # (inlining rebuilds stages: an output is known by its buffer)
    positions = [i for i, t in enumerate(outputs) if t.buffer == last.output.buffer]
    if len(positions) != 1 or positions[0] in placements or last.scatter is not None or \
            any(isinstance(n, Reduce) for n in walk(last.body)):
        return []
    produced = {t.buffer for t in outputs}
    for stage in stages[:-1]:
        if stage.output.buffer in produced or stage.output.shape != last.output.shape or \
                stage.output.dtype != last.output.dtype or stage.scatter is not None:
            continue
        reads = [n for n in walk(last.body)
                 if isinstance(n, BufferLoad) and n.buffer == stage.output.buffer]
        if reads and all(n.mask is None and not n.flat and at_own_index(n, last)
                         for n in reads):
            return [(stage, last)]
    return []


def _canonical_names(body: Stmt) -> Stmt:
    """Rename loop variables and local buffers by order of appearance (``i0``, ``t0``, ...).

    Stage names come from a process-wide counter; renaming makes the generated code depend on
    the kernel alone, so identical kernels give identical C and hit the compile cache."""
    var_names: dict[Var, Var] = {}
    buffer_names: dict[Buffer, Buffer] = {}
    for node in walk(body):
        if isinstance(node, For) and node.var not in var_names:
            var_names[node.var] = Var(f"i{len(var_names)}", node.var.dtype)
        elif isinstance(node, Allocate) and node.buffer not in buffer_names:
            b = node.buffer
            buffer_names[b] = Buffer(f"t{len(buffer_names)}", b.dtype, b.shape, b.scope,
                                     b.align)

    def rename(n):
        if isinstance(n, Var) and n in var_names:
            return var_names[n]
        if isinstance(n, For) and n.var in var_names:
            return For(var_names[n.var], n.start, n.extent, n.kind, n.body, n.annotations)
        if isinstance(n, Allocate) and n.buffer in buffer_names:
            return Allocate(buffer_names[n.buffer], n.body)
        if isinstance(n, Load) and n.buffer in buffer_names:
            return Load(buffer_names[n.buffer], n.index, n.mask)
        if isinstance(n, Store) and n.buffer in buffer_names:
            return Store(buffer_names[n.buffer], n.index, n.value, n.mask)
        return None

    return rewrite(body, rename)


def _topological_stages(outputs: Sequence[Tensor]) -> list[Stage]:
    """Every stage the outputs depend on, producers before consumers (a depth-first
    post-order, iterative: a chain of any length is ordered without recursion)."""
    order: list[Stage] = []
    visited: set[int] = set()
    for output in outputs:
        if output.stage is None or id(output) in visited:
            continue
        visited.add(id(output))
        stack: list[tuple[Tensor, int]] = [(output, 0)]
        while stack:
            tensor, next_input = stack[-1]
            sources = tensor.stage.inputs
            if next_input < len(sources):
                stack[-1] = (tensor, next_input + 1)
                source = sources[next_input]
                if source.stage is not None and id(source) not in visited:
                    visited.add(id(source))
                    stack.append((source, 0))
                continue
            stack.pop()
            order.append(tensor.stage)
    return order


def _lower_stage(stage: Stage, buffer_map: dict[Buffer, Buffer],
                 offsets: Mapping[Buffer, tuple[int, ...]] | None = None) -> Stmt:
    out = buffer_map.get(stage.output.buffer, stage.output.buffer)
    before = (offsets or {}).get(out)
    axes: list[Expr] = list(stage.axes) if before is None else \
        [axis + Const(b, INDEX) if b else axis for axis, b in zip(stage.axes, before)]
    index = out.flat_index(axes) if stage.axes else Const(0, INDEX)
    # The same reduction may appear several times in an epilogue (x * erf(x) of a matmul's
    # result): equal Reduce nodes are one reduction, accumulated once.
    reduce_nodes = list(dict.fromkeys(n for n in walk(stage.body) if isinstance(n, Reduce)))
    if len(reduce_nodes) > 1:
        raise LoweringError(f"stage {stage.output.name}: at most one Reduce per stage")
    # a short window is summed in a register whatever its strides (see _is_short_window)
    window = bool(reduce_nodes and stage.axes and
                  _is_short_window(reduce_nodes[0], stage.axes))
    if reduce_nodes and stage.axes and reduce_nodes[0].dtype == out.dtype and not window and \
            _prefers_output_accumulation(stage, reduce_nodes[0]):
        return _rebind_all(_lower_reduction_into_output(stage, reduce_nodes[0], out, index),
                           buffer_map)
    if reduce_nodes:
        red = reduce_nodes[0]
        acc = Buffer(f"{stage.output.name}_acc", red.dtype, (1,), scope="local")
        acc_value = Load(acc, Const(0, INDEX))
        combined = _combine(red.combiner, acc_value, red.source)
        if red.condition is not None:
            combined = Select(red.condition, combined, acc_value)
        update: Stmt = Store(acc, Const(0, INDEX), combined)
        # the taps of a window longer than the C compiler writes out by itself are marked to
        # be (see MAX_WINDOW_TERMS), so that the output loop around them is straight-line
        # code it vectorizes
        taps = ForKind.UNROLLED if window and _window_terms(red) > MAX_SELF_UNROLLED_TERMS \
            else ForKind.SERIAL
        for axis in reversed(red.axes):
            update = For(axis.var, Const(0, INDEX), Const(axis.extent, INDEX), taps, update)
        epilogue = rewrite(stage.body, lambda n: acc_value if n == red else None)
        inner: Stmt = Allocate(acc, seq(Store(acc, Const(0, INDEX), red.init), update,
                                        Store(out, index, epilogue)))
    else:
        inner = Store(out, index, stage.body)
    for axis, extent in reversed(list(zip(stage.axes, stage.output.shape))):
        inner = For(axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, inner)
    if stage.scatter is not None:  # (never placed: lower_compute refuses it)
        inner = seq(inner, _lower_scatter(stage.scatter, out))
    return _rebind_all(inner, buffer_map)


def _lower_scatter(update: ScatterUpdate, out: Buffer) -> Stmt:
    """The scattered writes of a stage: one serial nest over the updates, in order, each
    iteration storing (or combining into) the element its target names."""
    index = out.flat_index(list(update.target))
    value = update.value
    if update.combiner is not None:
        value = _combine(update.combiner, Load(out, index), value)
    write: Stmt = Store(out, index, value)
    if update.condition is not None:
        write = IfThenElse(update.condition, write, None)
    for axis, extent in reversed(list(zip(update.axes, update.shape))):
        write = For(axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, write)
    return write


def _lower_reduction_into_output(stage: Stage, red: Reduce, out: Buffer, index: Expr) -> Stmt:
    """``out = init`` over the output, then ``out = combine(out, source)`` over output and
    reduction axes in one perfect nest whose reduction loops are annotated ``reduce``: the
    schedule may then move them outside the innermost output loop and vectorize that loop
    (the order in which each output element accumulates is unchanged, so results are too).
    An epilogue around the reduction (``gelu(sum + bias)``) becomes a last elementwise pass.

    The nests follow each other and are tagged by their role (``accumulation`` = init,
    update, epilogue on their outer loops), and the outermost reduction loop carries the
    initial value and the epilogue as expressions of the output indices and the accumulated
    value (``accumulate_result``): a schedule that keeps a tile of the output in registers
    (``cache_accumulator``) starts it from the initial value and applies the epilogue before
    its one store, and then drops the other two passes."""
    current = Load(out, index)
    combined = _combine(red.combiner, current, red.source)
    if red.condition is not None:
        combined = Select(red.condition, combined, current)
    notes: tuple[tuple[str, object], ...] = (("accumulate_init", red.init),)
    epilogue: Stmt | None = None
    if red is not stage.body:  # e.g. a bias added to a convolution: one more pass
        result = Var("acc", red.dtype)
        notes += (("accumulate_epilogue", rewrite(stage.body, lambda n: result if n == red
                                                  else None)),
                  ("accumulate_result", result))
        finished = rewrite(stage.body, lambda n: current if n == red else None)
        epilogue_axes = tuple(Var(f"{axis.name}_epilogue") for axis in stage.axes)
        epilogue = substitute(Store(out, index, finished), dict(zip(stage.axes, epilogue_axes)))
        for axis, extent in reversed(list(zip(epilogue_axes, stage.output.shape))):
            epilogue = For(axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, epilogue)
    update: Stmt = Store(out, index, combined)
    for position, axis in reversed(list(enumerate(red.axes))):
        update = For(axis.var, Const(0, INDEX), Const(axis.extent, INDEX), ForKind.SERIAL,
                     update, annotations=(("reduce", True),) + (notes if position == 0 else ()))
    init: Stmt = Store(out, index, red.init)
    init_axes = tuple(Var(f"{axis.name}_init") for axis in stage.axes)
    init = substitute(init, dict(zip(stage.axes, init_axes)))
    for axis, init_axis, extent in reversed(list(zip(stage.axes, init_axes,
                                                      stage.output.shape))):
        init = For(init_axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, init)
        update = For(axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, update)
    parts = [_tag(init, "init"), _tag(update, "update")]
    if epilogue is not None:
        parts.append(_tag(epilogue, "epilogue"))
    return seq(*parts)


def _tag(nest: Stmt, role: str) -> Stmt:
    assert isinstance(nest, For)
    return replace(nest, annotations=nest.annotations + (("accumulation", role),))


def _prefers_output_accumulation(stage: Stage, red: Reduce) -> bool:
    """Accumulate in the output (rather than a scalar) when the innermost output axis walks
    memory with a small stride (contiguous, or a strided convolution's 2-4) in every load
    that uses it, and runs long enough to vectorize: the shape of matrix products and
    convolutions, not of row reductions (whose innermost output axis strides a whole row)."""
    axis, extent = stage.axes[-1], stage.output.shape[-1]
    if extent < MIN_VECTOR_EXTENT:
        return False
    extents = {a: e for a, e in zip(stage.axes, stage.output.shape)}
    extents.update({r: r.extent for r in red.axes})
    used = False
    for node in walk(red.source):
        if not isinstance(node, (Load, BufferLoad)):
            continue
        offset = node.index if isinstance(node, Load) else element_offset(node)
        if any(v == axis for v in walk(offset)):
            used = True
            stride = local_stride(offset, axis, extents)
            if stride is None or not 1 <= abs(stride) <= MAX_VECTOR_LOAD_STRIDE:
                return False
    return used


def _uses(expr: Expr, var: Var) -> bool:
    return any(node == var for node in walk(expr))


def _is_short_window(red: Reduce, axes: Sequence[Var]) -> bool:
    """Whether ``red`` is a short window sliding along the output: few terms
    (``MAX_WINDOW_TERMS``, loops of at most ``MAX_WINDOW_LOOP``), and every reduction loop
    longer than 1 a tap, in one index of a load with an output axis (``oh * s + kh``: a
    depthwise convolution's or a pool's window; a dense convolution also sums over channels,
    an index of their own).  Such a window is summed in a register
    per output element, its loops unrolled inside the output loop: accumulated in the
    output, each of its few terms cost a load and a store of the output row (a depthwise 3x3
    convolution over 14x14 images ran 2.4x slower so, 0.29x ONNX Runtime's speed; ResNet's
    2x2 max pool 2.7x)."""
    # (a size traced at run time is no short window: comparing it would tie the build to it)
    if any(is_traced(r.extent) or not isinstance(r.extent, int) for r in red.axes):
        return False
    taps = [r for r in red.axes if r.extent != 1]
    if not taps or any(r.extent > MAX_WINDOW_LOOP for r in taps) or \
            _window_terms(red) > MAX_WINDOW_TERMS:
        return False
    # the index components of the loads: a tap slides when it is in one component with an
    # output axis (``oh * s + kh``), not alone in one of its own (a channel summed over)
    components = [index for node in walk(red.source) if isinstance(node, BufferLoad)
                  for index in node.indices]

    def slides(tap: Var) -> bool:
        return any(_uses(index, tap) and any(_uses(index, a) for a in axes)
                   for index in components)

    return all(slides(r) for r in taps)


def _window_terms(red: Reduce) -> int:
    """How many terms each output element of ``red`` sums (its loops' extents multiplied)."""
    return math.prod(int(r.extent) for r in red.axes)


def _combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    if combiner == "fmax":
        # C's fmax as selects, which vectorize (a NaN is the one value unequal to itself):
        # a NaN term keeps the accumulator, a NaN accumulator (the initial value) takes the
        # term, else the larger one.
        return Select(value.eq(value), Select(acc.eq(acc), Binary("max", acc, value), value),
                      acc)
    op = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}.get(combiner)
    if op is None:
        raise LoweringError(f"unknown reduction combiner {combiner!r}")
    return Binary(op, acc, value)


def fill_border(out: Buffer, before: Sequence[int], inner: Sequence[int], fill: Expr) -> Stmt:
    """Nests that store ``fill`` everywhere in ``out`` but the box of shape ``inner`` at
    ``before``: along each axis the slabs in front of and behind the box (every element of
    the later axes) and, between them, the border of the later axes.  Leading axes without
    padding are one loop around everything, so the nests share an outer (parallel) loop.
    Every loop has a variable of its own (sibling loops over one axis too)."""
    shape = [int(d) for d in out.shape]
    count = itertools.count()

    def loop(axis: int, start: int, stop: int, bound: list[Var],
             body_of) -> Stmt:
        var = Var(f"{out.name}_border{axis}_{next(count)}")
        return For(var, Const(start, INDEX), Const(stop - start, INDEX), ForKind.SERIAL,
                   body_of(bound + [var]))

    def everything(axis: int, bound: list[Var]) -> Stmt:
        if axis == len(shape):
            return Store(out, out.flat_index(bound), fill)
        return loop(axis, 0, shape[axis], bound, lambda b: everything(axis + 1, b))

    def padded(axis: int) -> bool:
        """Whether any axis from ``axis`` on has elements outside the box."""
        return any(int(b) or int(d) != int(i)
                   for b, d, i in zip(before[axis:], shape[axis:], inner[axis:]))

    def border(axis: int, bound: list[Var]) -> Stmt | None:
        if axis == len(shape):
            return None  # inside the box
        if not padded(axis):
            return None  # no padding along this axis or any later one
        first, last = int(before[axis]), int(before[axis]) + int(inner[axis])
        parts: list[Stmt] = []
        if first > 0:
            parts.append(loop(axis, 0, first, bound, lambda b: everything(axis + 1, b)))
        if padded(axis + 1):
            parts.append(loop(axis, first, last, bound, lambda b: border(axis + 1, b)))
        if last < shape[axis]:
            parts.append(loop(axis, last, shape[axis], bound,
                              lambda b: everything(axis + 1, b)))
        return seq(*parts)

    nests = border(0, [])
    return nests if nests is not None else seq()


def _copy(tensor: Tensor, out: Buffer) -> Stmt:
    i = Var(f"{out.name}_copy")
    return For(i, Const(0, INDEX), Const(out.size, INDEX), ForKind.SERIAL,
               Store(out, i, Load(tensor.buffer, i)))


def _rebind_all(node, mapping: dict[Buffer, Buffer]):
    if not mapping:
        return node

    def fn(n):
        if isinstance(n, Load) and n.buffer in mapping:
            return Load(mapping[n.buffer], n.index, n.mask)
        if isinstance(n, BufferLoad) and n.buffer in mapping:
            return BufferLoad(mapping[n.buffer], n.indices, n.mask, n.flat)
        if isinstance(n, Store) and n.buffer in mapping:
            return Store(mapping[n.buffer], n.index, n.value, n.mask)
        return None

    return rewrite(node, fn)


__all__ = ["ComputeContext", "LoweringError", "Placement", "fill_border", "lower_compute",
           "lower_node"]
