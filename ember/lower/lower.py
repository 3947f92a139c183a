"""Turn compute definitions (``ember.ir.compute``) into loop nests.

Each computed stage becomes one loop nest over its output axes.  A stage whose body holds a
:class:`~ember.ir.compute.Reduce` gets a local accumulator: initialise, loop over the
reduction axes combining, then store the body with the accumulator substituted for the
reduction (which is how epilogues such as ``sum / n`` apply).  Stages that are not outputs
live in local buffers allocated around the whole kernel.

The loop nests are naive on purpose; schedules (``ember.schedule``) make them fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ember.core.errors import EmberError
from ember.ir.compute import ComputeContext, Reduce, Stage, Tensor, placeholder
from ember.ir.graph import Node
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, Binary, Const, Expr, Load, Select, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import Allocate, For, ForKind, PrimFunc, Stmt, Store, seq
from ember.ir.types import TensorType
from ember.ops.registry import NoCompute, OpDef


class LoweringError(EmberError):
    """A compute definition could not be lowered (a bug in an op's compute, named here)."""


def lower_node(node: Node, opdef: OpDef, input_types: Sequence[TensorType | None],
               output_types: Sequence[TensorType], attrs: dict[str, Any],
               constants: dict[int, Any], name: str) -> PrimFunc | None:
    """Lower one node for its static types; None if the op has no compute for this case."""
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
    return lower_compute(name, [t for t in inputs if t is not None], outputs,
                         attrs=(("op", node.op), ("node", node.name)))


def lower_compute(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                  attrs: tuple = ()) -> PrimFunc:
    """Build a PrimFunc computing ``outputs`` from placeholder ``inputs``.

    Outputs that are placeholders themselves (an op that returns an input unchanged) or that
    appear twice are copied into fresh output buffers.
    """
    stages = _topological_stages(outputs)
    out_buffers: list[Buffer] = []
    body_parts: list[Stmt] = []
    seen: set[int] = set()
    for index, tensor in enumerate(outputs):
        out = Buffer(f"out{index}", tensor.dtype, tensor.shape)
        out_buffers.append(out)
        if tensor.stage is None or id(tensor) in seen:
            body_parts.append(_copy(tensor, out))
        seen.add(id(tensor))
    rename = {id(t): b for t, b in zip(outputs, out_buffers) if t.stage is not None}
    buffer_map = {t.buffer: rename[id(t)] for t in outputs if id(t) in rename}
    nests = [_lower_stage(stage, buffer_map) for stage in stages]
    body = seq(*nests, *body_parts)
    for stage in reversed(stages):
        if stage.output.buffer not in buffer_map:
            local = Buffer(stage.output.buffer.name, stage.output.dtype, stage.output.shape,
                           scope="local")
            body = _rebind(body, stage.output.buffer, local)
            body = Allocate(local, body)
    params = tuple(t.buffer for t in inputs) + tuple(out_buffers)
    return PrimFunc(name, params, simplify(body), attrs)


def _topological_stages(outputs: Sequence[Tensor]) -> list[Stage]:
    """Every stage the outputs depend on, producers before consumers."""
    order: list[Stage] = []
    visited: set[int] = set()

    def visit(tensor: Tensor) -> None:
        if tensor.stage is None or id(tensor) in visited:
            return
        visited.add(id(tensor))
        for source in tensor.stage.inputs:
            visit(source)
        order.append(tensor.stage)

    for t in outputs:
        visit(t)
    return order


def _lower_stage(stage: Stage, buffer_map: dict[Buffer, Buffer]) -> Stmt:
    out = buffer_map.get(stage.output.buffer, stage.output.buffer)
    index = out.flat_index(list(stage.axes)) if stage.axes else Const(0, INDEX)
    reduce_nodes = [n for n in walk(stage.body) if isinstance(n, Reduce)]
    if len(reduce_nodes) > 1:
        raise LoweringError(f"stage {stage.output.name}: at most one Reduce per stage")
    if reduce_nodes:
        red = reduce_nodes[0]
        acc = Buffer(f"{stage.output.name}_acc", red.dtype, (1,), scope="local")
        acc_value = Load(acc, Const(0, INDEX))
        combined = _combine(red.combiner, acc_value, red.source)
        if red.condition is not None:
            combined = Select(red.condition, combined, acc_value)
        update: Stmt = Store(acc, Const(0, INDEX), combined)
        for axis in reversed(red.axes):
            update = For(axis.var, Const(0, INDEX), Const(axis.extent, INDEX), ForKind.SERIAL,
                         update)
        epilogue = rewrite(stage.body, lambda n: acc_value if n is red else None)
        inner: Stmt = Allocate(acc, seq(Store(acc, Const(0, INDEX), red.init), update,
                                        Store(out, index, epilogue)))
    else:
        inner = Store(out, index, stage.body)
    for axis, extent in reversed(list(zip(stage.axes, stage.output.shape))):
        inner = For(axis, Const(0, INDEX), Const(extent, INDEX), ForKind.SERIAL, inner)
    return _rebind_all(inner, buffer_map)


def _combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    op = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}.get(combiner)
    if op is None:
        raise LoweringError(f"unknown reduction combiner {combiner!r}")
    return Binary(op, acc, value)


def _copy(tensor: Tensor, out: Buffer) -> Stmt:
    i = Var(f"{out.name}_copy")
    return For(i, Const(0, INDEX), Const(out.size, INDEX), ForKind.SERIAL,
               Store(out, i, Load(tensor.buffer, i)))


def _rebind(node, old: Buffer, new: Buffer):
    return _rebind_all(node, {old: new})


def _rebind_all(node, mapping: dict[Buffer, Buffer]):
    if not mapping:
        return node

    def fn(n):
        if isinstance(n, Load) and n.buffer in mapping:
            return Load(mapping[n.buffer], n.index, n.mask)
        if isinstance(n, Store) and n.buffer in mapping:
            return Store(mapping[n.buffer], n.index, n.value, n.mask)
        return None

    return rewrite(node, fn)


__all__ = ["ComputeContext", "LoweringError", "lower_compute", "lower_node"]
