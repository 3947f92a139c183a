"""From a Graph to a native library.

1. Specialize the graph to concrete input shapes and infer every type.
2. Run the graph passes of the opt level (constant folding, dead-code elimination).
3. Give every node an implementation: a kernel lowered from its op's compute definition and
   scheduled, or, when the op has no compute (or not for these dtypes), its numpy reference
   called back from the library ("host" nodes — reported, never silent).
4. Plan memory: one workspace arena for intermediates, one weights blob for constants.
5. Generate one C translation unit (kernels + the ``ember_run`` entry point) and compile it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ember.build.entry import EntryStep, IndexCheck, generate_entry, signature
from ember.codegen.c_names import c_identifier
from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.codegen.c_types import SUPPORTED_DTYPES
from ember.core.target import Target
from ember.ir.graph import Graph, Node
from ember.ir.loop.stmt import PrimFunc
from ember.ir.types import TensorType
from ember.lower.lower import lower_node
from ember.ops.registry import get_op
from ember.passes.memory_budget import check_build_memory
from ember.passes.memory_plan import ALIGNMENT, Interval, align, plan_memory
from ember.passes.pipeline import optimize
from ember.passes.specialize import specialize

# Element types that may live in the arena at all (fixed-size, no Python objects).
STORABLE_DTYPES = frozenset(d for d in DType if d not in (DType.STRING,))


class CompileError(EmberError):
    """The graph cannot be compiled to a static native library (named values and reasons)."""


@dataclass
class BuildOptions:
    target: Target = field(default_factory=Target.native)
    opt_level: int = 2
    sanitize: bool = False
    # Memory budget in bytes or "8GiB"; None: $EMBER_MEMORY_LIMIT, else the available memory.
    memory_limit: int | str | None = None


@dataclass
class NodeImpl:
    """How one node runs: ``kernel`` (compiled) or ``host`` (numpy reference via callback)."""

    index: int
    node: Node
    kind: str
    func: PrimFunc | None = None
    reason: str = ""


@dataclass
class Build:
    """The result of compiling a graph for one set of input shapes."""

    graph: Graph
    target: Target
    source: str
    library: Path
    impls: list[NodeImpl]
    weights: dict[str, np.ndarray]
    weight_offsets: dict[str, int]
    weights_size: int
    workspace_size: int
    seconds: float
    pass_log: list[str] = field(default_factory=list)
    memory_summary: str = ""
    # Run-time range checks of index inputs (ember_run fails naming the node if one fails).
    checks: list[IndexCheck] = field(default_factory=list)
    # What the library's ember_signature() returns (the loader cross-checks the manifest).
    signature: dict[str, Any] = field(default_factory=dict)
    # SHA-256 of the library bytes the compile cache verified (copies are checked against it).
    library_sha256: str = ""

    @property
    def host_nodes(self) -> list[NodeImpl]:
        return [impl for impl in self.impls if impl.kind == "host"]

    def report(self) -> str:
        kernels = sum(1 for i in self.impls if i.kind == "kernel")
        lines = [f"{len(self.impls)} nodes: {kernels} compiled kernels, "
                 f"{len(self.host_nodes)} numpy fallbacks; workspace "
                 f"{self.workspace_size:,} B, weights {self.weights_size:,} B; "
                 f"built in {self.seconds:.2f} s"]
        if self.pass_log:
            lines.append(f"  graph passes: {', '.join(self.pass_log)}")
        if self.memory_summary:
            lines.append(f"  memory plan: {self.memory_summary}")
        for impl in self.host_nodes:
            lines.append(f"  fallback: node '{impl.node.name}' ({impl.node.op}): {impl.reason}")
        return "\n".join(lines)


def build_graph(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None = None,
                options: BuildOptions | None = None) -> Build:
    """Compile ``graph`` for the given input shapes (required for dynamic dims)."""
    from ember.codegen.c import CModule, generate_c, kernel_symbol
    from ember.schedule.default import default_schedule
    from ember.toolchain.compiler import build_library

    options = options or BuildOptions()
    started = time.perf_counter()
    limit = resolve_memory_limit(options.memory_limit)
    g = specialize(graph, dict(input_shapes or {}), memory_limit=limit)
    pass_log: list[str] = []
    optimize(g, options.opt_level, pass_log, memory_limit=limit)
    _check_static(g)

    impls = [_implement(index, node, g) for index, node in enumerate(g.nodes)]
    funcs = [default_schedule(impl.func, options.target) for impl in impls if impl.func]
    for impl, func in zip([i for i in impls if i.func], funcs):
        impl.func = func

    used_constants = _used_constants(g)
    weight_offsets, weights_size = _layout_weights(used_constants)
    workspace_offsets, workspace_size, memory_summary = _plan_workspace(g)
    check_build_memory(workspace_size, weights_size, limit)
    steps = [EntryStep(impl.index, impl.node, impl.kind,
                       kernel_symbol(impl.func) if impl.func else None, _index_checks(impl))
             for impl in impls]
    entry = generate_entry(g, steps, weight_offsets, workspace_offsets, workspace_size,
                           weights_size)
    module = CModule(kernels=[impl.func for impl in impls if impl.func], extra_source=entry,
                     exports=["ember_run", "ember_workspace_size", "ember_signature"],
                     target=options.target)
    source = generate_c(module)
    library = build_library(source, options.target, sanitize=options.sanitize)
    return Build(g, options.target, source, library.path, impls, used_constants, weight_offsets,
                 weights_size, workspace_size, time.perf_counter() - started, pass_log,
                 memory_summary, checks=[c for step in steps for c in step.index_checks],
                 signature=signature(g, steps, workspace_size, weights_size, weight_offsets),
                 library_sha256=library.sha256)


# ---------------------------------------------------------------------- validation


def _check_static(g: Graph) -> None:
    problems = []
    producers = g.producers()
    names = list(dict.fromkeys(list(g.inputs) + [o for n in g.nodes for o in n.outputs if o]))
    for name in names:
        vtype = g.types.get(name)
        origin = producers.get(name)
        where = f"'{name}'" + (f" (output of {origin.op} node '{origin.name}')" if origin else "")
        if not isinstance(vtype, TensorType):
            problems.append(f"{where} is a {type(vtype).__name__ if vtype else 'value of unknown type'};"
                            " compiled models take tensors only")
        elif not vtype.is_static:
            problems.append(f"{where} has shape {vtype}, not static (data-dependent or unbound)")
        elif vtype.dtype not in STORABLE_DTYPES:
            problems.append(f"{where} has element type {vtype.dtype}, which compiled code "
                            "cannot store")
    if problems:
        raise CompileError("cannot compile this graph to static native code:\n  - " +
                           "\n  - ".join(problems[:20]) +
                           (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "") +
                           "\nrun it with ember's reference executor (mode='reference') instead")


# ---------------------------------------------------------------------- implementation


def _implement(index: int, node: Node, g: Graph) -> NodeImpl:
    opdef = get_op(node.op)
    assert opdef is not None
    in_types = [g.types.get(n) if n else None for n in node.inputs]
    out_types = [g.types.get(n) for n in node.outputs]
    if opdef.compute is None:
        return NodeImpl(index, node, "host", reason="op has no compute definition yet")
    dtypes = {t.dtype for t in in_types + out_types if isinstance(t, TensorType)}
    unsupported = sorted(str(d) for d in dtypes - SUPPORTED_DTYPES)
    if unsupported:
        return NodeImpl(index, node, "host",
                        reason=f"no kernels for element type(s) {', '.join(unsupported)}")
    if any(not name for name in node.outputs):
        return NodeImpl(index, node, "host", reason="node leaves an output unnamed")
    if not _output_types_derivable(node, opdef, g):
        # A kernel computes its output's shape from the graph's types; here those come from
        # the model's declarations, not from what the node computes.  The fallback checks the
        # shape its reference produces at run time instead of trusting the declaration.
        return NodeImpl(index, node, "host",
                        reason="its output shape depends on values known only at run time")
    constants = {i: g.constants[n] for i, n in enumerate(node.inputs) if n in g.constants}
    func = lower_node(node, opdef, in_types, out_types, opdef.resolve_attrs(node), constants,
                      name=f"k{index}_{c_identifier(node.op).lower()}")
    if func is None:
        return NodeImpl(index, node, "host", reason="compute does not cover this configuration")
    return NodeImpl(index, node, "kernel", func=func)


def _output_types_derivable(node: Node, opdef, g: Graph) -> bool:
    """Whether the node's output types follow from its input types and compile-time constants
    alone, as its op's shape inference derives them.

    Shape inference fills a dim it cannot derive from a type the model declares (value_info,
    graph outputs), which is right for reporting but is a claim of the model file, not a fact:
    a Reshape whose target shape is computed at run time would otherwise be compiled to the
    declared shape and silently give another one.
    """
    from ember.ops.registry import InferContext

    input_types = [g.types.get(n) if n else None for n in node.inputs]
    context = InferContext(node, opdef, input_types, opdef.resolve_attrs(node),
                           lambda name: g.constants.get(name),
                           lambda body, types: [None] * len(body.outputs))
    try:
        derived = opdef.infer(context)
    except Exception:  # noqa: BLE001 - not derivable without run-time values: not a kernel
        return False
    for position, name in enumerate(node.outputs):
        if name and (position >= len(derived) or derived[position] != g.types.get(name)):
            return False
    return True


def _index_checks(impl: NodeImpl) -> list[IndexCheck]:
    """The range checks the node's kernel asks of its caller (input index, low, high)."""
    if impl.func is None:
        return []
    node = impl.node
    return [IndexCheck(impl.index, node.name, node.op, node.inputs[position], low, high)
            for position, low, high in impl.func.attr("index_checks", ())]


# ---------------------------------------------------------------------- memory


def node_reads(node: Node) -> list[str]:
    """Every value a node reads: its inputs, then what its subgraphs read from outside."""
    return [n for n in node.inputs if n] + node.implicit_inputs()


def _used_constants(g: Graph) -> dict[str, np.ndarray]:
    used = {n for node in g.nodes for n in node_reads(node) if n in g.constants}
    used.update(o for o in g.outputs if o in g.constants)
    # (np.ascontiguousarray would turn a 0-d constant into shape (1,): keep the shape)
    return {name: np.require(g.constants[name], requirements="C") for name in g.constants
            if name in used}


def _layout_weights(constants: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    offsets, cursor = {}, 0
    for name, array in constants.items():
        offsets[name] = cursor
        cursor += align(max(array.nbytes, 1), ALIGNMENT)
    return offsets, cursor



def _plan_workspace(g: Graph) -> tuple[dict[str, int], int, str]:
    """Offsets of every intermediate (not an input, output or constant), the arena size and
    a one-line summary of the plan."""
    external = set(g.inputs) | set(g.outputs) | set(g.constants)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, node in enumerate(g.nodes):
        for name in node.outputs:
            if name and name not in external:
                first.setdefault(name, step)
                last[name] = step
        for name in node_reads(node):
            if name in first:
                last[name] = step
    intervals = [Interval(name, g.types[name].nbytes, first[name], last[name])
                 for name in first]
    plan = plan_memory(intervals)
    return plan.offsets, plan.workspace_size, plan.summary(intervals)


def describe_value(g: Graph, name: str) -> dict[str, Any]:
    vtype = g.types[name]
    assert isinstance(vtype, TensorType)
    return {"name": name, "dtype": vtype.dtype.numpy.name, "shape": [int(d) for d in vtype.shape]}
