"""Give every fused group an implementation: one compiled kernel, or a host call.

A group lowers to one PrimFunc (``ember.lower.group``), which the default schedule then makes
parallel and vectorized.  Should a group of several nodes fail to lower -- a combination the
compute definitions do not compose for -- it is split into its nodes, each lowered alone, so
a fusion decision never costs more than the fusion.  A node that does not compile at all runs
its numpy reference through the ``host`` callback (reported with its reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ember.codegen.c_names import c_identifier
from ember.core.errors import CompileError, EmberError
from ember.ir.compute import RangeCheck
from ember.ir.graph import FusedGroup, Graph, Node
from ember.ir.loop.stmt import PrimFunc
from ember.lower.group import lower_group
from ember.ops.registry import NoCompute
from ember.passes.fuse import NodeSupport, readers_by_value, single_node_group


@dataclass
class KernelImpl:
    """How one step of ``ember_run`` runs: ``kernel`` (a compiled fused group) or ``host``
    (one node's numpy reference, called back).  ``index`` is the step's position, which names
    it in run-time statuses and in the manifest."""

    index: int
    group: FusedGroup
    kind: str
    func: PrimFunc | None = None
    reason: str = ""
    # (group input position, its range, node): range checks to run before the kernel
    index_checks: list[tuple[int, RangeCheck, Node]] = field(default_factory=list)
    # group input position -> constant that replaces it (a weight packed at compile time
    # into the layout the kernel reads: see ember.schedule.gemm.Prepack)
    packed_inputs: dict[int, str] = field(default_factory=dict)
    # The schedule (set once the kernel is scheduled, see ember.schedule.pipeline): the
    # kernel's workload key, the kernel as lowered, the complete config applied, its knobs (the search space), the
    # trace of the steps applied, and what each loop stage did.
    workload_key: str = ""
    lowered: PrimFunc | None = None  # the kernel as lowered, before the loop stages
    config: Any = None
    space: tuple = ()
    trace: Any = None
    stages: tuple = ()
    # where the kernel's config came from: "default" (the heuristic), "given" (the caller's
    # kernel_configs), "tuned" (a tuning database) or "predicted" (the cost model's pick)
    config_source: str = "default"

    @property
    def inputs(self) -> list[str]:
        """The values the step passes to the kernel, in parameter order."""
        return [self.packed_inputs.get(i, name) for i, name in enumerate(self.group.inputs)]

    @property
    def node(self) -> Node:
        """The node of a single-node step (every host step is one)."""
        return self.group.nodes[0]

    @property
    def nodes(self) -> list[Node]:
        return self.group.nodes

    @property
    def scratch(self) -> int:
        """How many scratch buffers the kernel takes after its outputs."""
        return int(self.func.attr("scratch", 0)) if self.func is not None else 0


def implement_groups(graph: Graph, groups: list[FusedGroup],
                     support: dict[int, NodeSupport]) -> list[KernelImpl]:
    """One implementation per group, in order (groups that fail to lower are split)."""
    impls: list[KernelImpl] = []
    for group in groups:
        for part in _implement(graph, group, support, len(impls)):
            part.index = len(impls)
            impls.append(part)
    return impls


def _implement(graph: Graph, group: FusedGroup, support: dict[int, NodeSupport],
               index: int) -> list[KernelImpl]:
    if len(group.nodes) == 1 and not support[id(group.nodes[0])].kernel:
        return [KernelImpl(index, group, "host", reason=support[id(group.nodes[0])].reason)]
    try:
        lowered = lower_group(group, graph, _kernel_name(index, group))
    except (NoCompute, EmberError) as error:
        if len(group.nodes) == 1:
            return [KernelImpl(index, group, "host",
                               reason=f"compute does not cover this configuration ({error})")]
        return _split(graph, group, support, index)
    except Exception as error:  # noqa: BLE001 -- a lowering bug: name the node, or split
        if len(group.nodes) > 1:
            return _split(graph, group, support, index)
        node = group.nodes[0]
        named = f"'{node.name}' " if node.name else ""
        raise CompileError(f"internal compiler error lowering node {named}({node.op}, "
                           f"output(s) {', '.join(repr(o) for o in node.outputs)}): "
                           f"{type(error).__name__}: {error}. This is a bug in ember; please "
                           f"report it with the model.") from error
    if lowered.inputs != group.inputs:
        group = replace(group, inputs=lowered.inputs)
    return [KernelImpl(index, group, "kernel", func=lowered.func,
                       index_checks=list(lowered.index_checks))]


def _split(graph: Graph, group: FusedGroup, support: dict[int, NodeSupport],
           index: int) -> list[KernelImpl]:
    """The group's nodes implemented one by one (when the fused lowering fails), each named
    after the step index it will get."""
    parts: list[KernelImpl] = []
    readers = readers_by_value(graph)
    for node in group.nodes:
        parts.extend(_implement(graph, single_node_group(graph, node, readers), support,
                                index + len(parts)))
    return parts


def _kernel_name(index: int, group: FusedGroup) -> str:
    master = next((n for n in group.nodes if n.name == group.master), group.nodes[-1])
    suffix = "_fused" if len(group.nodes) > 1 else ""
    return f"k{index}_{c_identifier(master.op).lower()}{suffix}"
