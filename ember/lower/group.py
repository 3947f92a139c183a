"""Lower a fused group -- several nodes -- to one PrimFunc.

Each member's compute definition is applied to the tensors its inputs are bound to: fresh
placeholders for the values the group reads from outside (one per value, so two members
reading the same value share it and two different values never alias), the member's own
stages for values computed inside.  The resulting stage DAG is one compute, which
``lower_compute`` turns into loop nests, inlining what does not need memory.

Parameters of the PrimFunc: the group's inputs, then its outputs, then scratch buffers (the
``scratch`` attribute counts them).  Index checks that members ask for (Gather's indices) are
collected as (input position in the group, low, high), for the caller to run first.
Constants the members only read at compile time are not parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.traced import holds_traced, traced_value
from ember.ir.compute import (ComputeContext, RangeCheck, Tensor, compute, const_like,
                              placeholder)
from ember.ir.loop.expr import Expr, Select, as_expr
from ember.ir.graph import FusedGroup, Graph, Node
from ember.ir.loop.stmt import PrimFunc
from ember.ir.types import TensorType
from ember.lower.lower import LoweringError, Placement, lower_compute
from ember.ops.compute.shape import constant_padding
from ember.ops.registry import NoCompute, get_op


# The most elements of a constant computed from run-time sizes that a kernel computes in
# place (shape arithmetic: a handful).
MAX_SIZES_COMPUTED = 64


@dataclass
class LoweredGroup:
    func: PrimFunc
    # (index of the group input, the range its values must lie in, the node asking)
    index_checks: list[tuple[int, RangeCheck, Node]]
    # the group inputs the kernel takes, in parameter order: a constant that only told the
    # compute what to do (a Reshape's target, a Slice's ends) is not passed at run time
    inputs: list[str]


def lower_group(group: FusedGroup, graph: Graph, name: str) -> LoweredGroup:
    """One kernel for ``group`` of ``graph``; NoCompute if a member has no compute for its
    configuration, LoweringError if the members do not compose (both name the node)."""
    inputs: dict[str, Tensor] = {}
    for position, value in enumerate(group.inputs):
        vtype = graph.types.get(value)
        if not (isinstance(vtype, TensorType) and vtype.is_static):
            raise NoCompute(f"input '{value}' of the group has no static tensor type")
        sizes = traced_value(value, graph.constants[value]) if value in graph.constants else None
        if holds_traced(sizes) and sizes.size <= MAX_SIZES_COMPUTED:
            inputs[value] = _sizes_tensor(sizes, vtype.dtype, f"in{position}")
        else:
            inputs[value] = placeholder(vtype.shape, vtype.dtype, name=f"in{position}")
    env: dict[str, Tensor] = dict(inputs)
    checked: list[tuple[str, RangeCheck, Node]] = []
    placed: dict[str, Placement] = {}
    for node in group.nodes:
        placement = _padding_as_store(node, group, graph, env, inputs)
        if placement is not None:
            env[node.outputs[0]] = env[node.inputs[0]]
            placed[node.outputs[0]] = placement
            continue
        outputs, node_checks = _apply_compute(node, graph, env)
        for check in node_checks:
            value = node.inputs[check.input]
            if value not in inputs:
                raise LoweringError(f"node '{node.name}' ({node.op}) range-checks input "
                                    f"'{value}', which its own kernel computes; fusion must "
                                    f"keep its producer outside")
            checked.append((value, check, node))
        for value, tensor in zip(node.outputs, outputs):
            if value:
                env[value] = tensor
    for value in list(placed):  # a tensor that is another output too is stored plainly
        if any(env[other] is env[value] for other in group.outputs if other != value):
            del placed[value]
            pad = next(n for n in group.nodes if n.outputs and n.outputs[0] == value)
            env[value] = _apply_compute(pad, graph, env)[0][0]
    results = [env[value] for value in group.outputs]
    read = _tensors_read(results)
    kept = [value for value in group.inputs if value not in graph.constants or
            (id(inputs[value]) in read and inputs[value].stage is None)]
    func = lower_compute(name, [inputs[value] for value in kept], results,
                         attrs=(("nodes", tuple(n.name for n in group.nodes)),),
                         placements={position: placed[value]
                                     for position, value in enumerate(group.outputs)
                                     if value in placed})
    checks = [(kept.index(value), check, node) for value, check, node in checked]
    return LoweredGroup(func, checks, kept)


def _sizes_tensor(sizes: np.ndarray, dtype: DType, name: str) -> Tensor:
    """A small constant computed from a traced build's run-time sizes (``N * S``, the
    offsets of a batch), computed where it is read: the weights can only hold one sample."""
    flat = sizes.reshape(-1)

    def body(*index: Expr) -> Expr:
        position: Expr | int = 0
        for axis, extent in zip(index, sizes.shape):
            position = position * extent + axis
        value: Expr = const_like(flat[-1], dtype)
        for k in range(len(flat) - 2, -1, -1):
            value = Select(as_expr(position).eq(k), const_like(flat[k], dtype), value)
        return value

    return compute(sizes.shape, body, name=name)


def _tensors_read(results: list[Tensor]) -> set[int]:
    """The ids of the tensors the results are computed from, transitively."""
    seen: set[int] = set()
    pending = list(results)
    while pending:
        tensor = pending.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.stage is not None:
            pending.extend(tensor.stage.inputs)
    return seen


def _padding_as_store(node: Node, group: FusedGroup, graph: Graph, env: Mapping[str, Tensor],
                      inputs: Mapping[str, Tensor]) -> Placement | None:
    """How the group stores the input of ``node`` inside ``node``'s padded output, when
    ``node`` is a Pad that only surrounds its input with one known value, that input is
    computed in the group and read by nothing else, and the padded value is a group output
    that no other member reads: then the producer's loops store into the padded buffer (at
    an offset) and the border is filled, with no pass copying the whole tensor (a
    convolution's output padded for the next convolution).  None otherwise."""
    if node.op != "Pad" or len(node.outputs) != 1 or not node.inputs or not node.inputs[0]:
        return None
    data, padded = node.inputs[0], node.outputs[0]
    if data in inputs or data not in env or env[data].stage is None or \
            data in group.outputs or padded not in group.outputs:
        return None
    if any(member is not node and (data in member.inputs or padded in member.inputs)
           for member in group.nodes):
        return None
    data_type, padded_type = graph.types.get(data), graph.types.get(padded)
    if not (isinstance(data_type, TensorType) and data_type.is_static and
            isinstance(padded_type, TensorType) and padded_type.is_static):
        return None
    found = constant_padding(_compute_context(node, graph), data_type.dtype)
    if found is None:
        return None
    before, fill = found
    shape = tuple(int(d) for d in padded_type.shape)
    if any(b + int(d) > s for b, d, s in zip(before, data_type.shape, shape)):
        return None
    return Placement(before, shape, fill)


def _compute_context(node: Node, graph: Graph) -> ComputeContext:
    opdef = get_op(node.op)
    in_types = [graph.types.get(n) if n else None for n in node.inputs]
    out_types = [graph.types.get(n) for n in node.outputs]
    constants: dict[int, Any] = {i: graph.constants[n] for i, n in enumerate(node.inputs)
                                 if n in graph.constants}
    return ComputeContext(node, in_types, out_types, opdef.resolve_attrs(node), constants)


def _apply_compute(node: Node, graph: Graph, env: Mapping[str, Tensor]
                   ) -> tuple[list[Tensor], list[tuple[int, int, int]]]:
    opdef = get_op(node.op)
    if opdef is None or opdef.compute is None:
        raise NoCompute(f"{node.op} has no compute definition")
    ctx = _compute_context(node, graph)
    out_types, attrs = ctx.output_types, ctx.attrs
    tensors = [env[n] if n else None for n in node.inputs]
    try:
        result = opdef.compute(ctx, *tensors, **attrs)
    except (NoCompute, EmberError):
        raise
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    for index, (tensor, expected) in enumerate(zip(outputs, out_types)):
        if not isinstance(expected, TensorType) or tensor.shape != tuple(expected.shape) \
                or tensor.dtype != expected.dtype:
            raise LoweringError(f"compute of {node.op} (node '{node.name}') gives output "
                                f"{index} as {tensor.dtype}{list(tensor.shape)}, the graph "
                                f"expects {expected}")
    return outputs, list(ctx.index_checks)
