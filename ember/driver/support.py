"""Which nodes can become (part of) a kernel: the fusion pass's view of the code generator.

A node compiles when its op has a compute definition that covers its configuration (dtypes,
attributes, which inputs are compile-time constants), the C backend stores its element types,
and its output shapes follow from its inputs at compile time.  The definition is *applied*
here, on placeholders, to find out -- cheap: it only builds expressions -- so that fusion
never puts a node into a kernel that lowering would then refuse.  The nodes that do not
compile run their numpy reference (reported, never silent).
"""

from __future__ import annotations

from typing import Any

from ember.codegen.c_types import SUPPORTED_DTYPES
from ember.core.errors import EmberError
from ember.core.traced import traced_value
from ember.ir.compute import ComputeContext, placeholder
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import InferContext, NoCompute, OpDef, get_op
from ember.passes.fuse import NodeSupport


def node_support(node: Node, graph: Graph) -> NodeSupport:
    """Whether ``node`` of ``graph`` (static types) compiles, and why not."""
    opdef = get_op(node.op)
    if opdef is None or opdef.compute is None:
        return NodeSupport(False, "op has no compute definition yet")
    if any(node.subgraphs()):
        return NodeSupport(False, "nodes with subgraphs run their reference")
    in_types = [graph.types.get(n) if n else None for n in node.inputs]
    out_types = [graph.types.get(n) for n in node.outputs]
    if any(not isinstance(t, TensorType) or not t.is_static
           for t in [t for t in in_types if t is not None] + out_types):
        return NodeSupport(False, "a value is not a tensor of static shape")
    dtypes = {t.dtype for t in in_types + out_types if isinstance(t, TensorType)}
    unsupported = sorted(str(d) for d in dtypes - SUPPORTED_DTYPES)
    if unsupported:
        return NodeSupport(False, f"no kernels for element type(s) {', '.join(unsupported)}")
    if any(not name for name in node.outputs):
        return NodeSupport(False, "node leaves an output unnamed")
    if not output_types_derivable(node, opdef, graph):
        # A kernel computes its output's shape from the graph's types; here those come from
        # the model's declarations, not from what the node computes.  The fallback checks
        # the shape its reference produces at run time instead of trusting the declaration.
        return NodeSupport(False, "its output shape depends on values known only at run time")
    return _try_compute(node, opdef, graph, in_types, out_types)


def _try_compute(node: Node, opdef: OpDef, graph: Graph, in_types: list, out_types: list
                 ) -> NodeSupport:
    attrs = opdef.resolve_attrs(node)
    constants: dict[int, Any] = {i: graph.constants[n] for i, n in enumerate(node.inputs)
                                 if n in graph.constants}
    ctx = ComputeContext(node, in_types, out_types, attrs, constants)
    tensors = [placeholder(t.shape, t.dtype, name=f"in{i}") if t is not None else None
               for i, t in enumerate(in_types)]
    try:
        result = opdef.compute(ctx, *tensors, **attrs)
    except NoCompute as reason:
        detail = str(reason)
        return NodeSupport(False, "compute does not cover this configuration"
                           + (f" ({detail})" if detail else ""))
    except EmberError as error:
        return NodeSupport(False, f"compute failed: {error}")
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    for tensor, expected in zip(outputs, out_types):
        if tensor.shape != tuple(expected.shape) or tensor.dtype != expected.dtype:
            return NodeSupport(False, f"compute gives {tensor.dtype}{list(tensor.shape)} where "
                                      f"the graph has {expected}")
    return NodeSupport(True, checked_inputs=frozenset(c.input for c in ctx.index_checks))


def output_types_derivable(node: Node, opdef: OpDef, graph: Graph) -> bool:
    """Whether the node's output types follow from its input types and compile-time constants
    alone, as its op's shape inference derives them.

    Shape inference fills a dim it cannot derive from a type the model declares (value_info,
    graph outputs), which is right for reporting but is a claim of the model file, not a fact:
    a Reshape whose target shape is computed at run time would otherwise be compiled to the
    declared shape and silently give another one.
    """
    input_types = [graph.types.get(n) if n else None for n in node.inputs]
    context = InferContext(node, opdef, input_types, opdef.resolve_attrs(node),
                           lambda name: traced_value(name, graph.constants[name])
                           if name in graph.constants else None,
                           lambda body, types: [None] * len(body.outputs))
    try:
        derived = opdef.infer(context)
    except Exception:  # noqa: BLE001 - not derivable without run-time values: not a kernel
        return False
    for position, name in enumerate(node.outputs):
        if name and (position >= len(derived) or derived[position] != graph.types.get(name)):
            return False
    return True
