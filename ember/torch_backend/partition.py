"""Split an ATen graph into the parts ember compiles and the parts PyTorch runs.

Every call of the graph is probed on its own (``node_problem``: converted over stand-ins of its
arguments, then checked by shape inference); the supported ones are grouped into the largest
subgraphs that keep the graph acyclic (``CapabilityBasedPartitioner``), each of which becomes
one ``fused_N`` submodule that ember compiles.  Unsupported nodes stay ATen calls, run by
PyTorch: that is the fallback, and each one is recorded with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ember.frontend.torch import node_problem
from ember.frontend.torch.table import IGNORED, target_name


@dataclass(frozen=True)
class Fallback:
    """An ATen node that PyTorch runs, and why ember does not."""

    op: str
    node: str
    reason: str


@dataclass
class Partitioning:
    module: torch.fx.GraphModule  # the graph with ``fused_N`` submodules for ember's parts
    fused: list[str] = field(default_factory=list)  # names of those submodules
    fallbacks: list[Fallback] = field(default_factory=list)
    compute_nodes: int = 0  # ATen calls in the graph (assertions and size glue excluded)


class _Support(OperatorSupportBase):
    def __init__(self, supported: set[torch.fx.Node]):
        self.supported = supported

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: torch.fx.Node) -> bool:
        return node in self.supported


def is_size_node(node: torch.fx.Node) -> bool:
    """A node computing a size or a condition on sizes (SymInt, SymBool), not tensor data:
    glue that runs in Python, never counted as a fallback."""
    value = node.meta.get("val")
    return isinstance(value, (torch.SymInt, torch.SymBool, int, bool))


def partition(gm: torch.fx.GraphModule, frozen: Mapping[str, torch.Tensor]) -> Partitioning:
    supported: set[torch.fx.Node] = set()
    fallbacks: list[Fallback] = []
    compute = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = target_name(node.target)
        if name in IGNORED:
            continue
        glue = is_size_node(node) or name == "operator.getitem"
        problem = node_problem(node, frozen)
        if problem is None:
            supported.add(node)
        elif not glue:
            fallbacks.append(Fallback(name, node.name, problem))
        compute += 0 if glue else 1
    partitioner = CapabilityBasedPartitioner(gm, _Support(supported),
                                             allows_single_node_partition=True)
    # a getitem of a fallback node's tuple output stays with that node
    partitions = [p for p in partitioner.propose_partitions()
                  if not all(_is_glue(n) for n in p.nodes)]
    fused_module = partitioner.fuse_partitions(partitions, prefix="ember_") if partitions \
        else gm
    fused = [n.target for n in fused_module.graph.nodes if n.op == "call_module"
             and str(n.target).startswith("ember_")]
    return Partitioning(fused_module, fused, fallbacks, compute)


def _is_glue(node: torch.fx.Node) -> bool:
    return is_size_node(node) or target_name(node.target) in ("operator.getitem",) or \
        target_name(node.target) in IGNORED


def frozen_of_submodule(call: torch.fx.Node, submodule: torch.fx.GraphModule,
                        frozen: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The submodule's placeholders that receive a frozen outer value (a weight)."""
    result: dict[str, torch.Tensor] = {}
    placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
    for placeholder, arg in zip(placeholders, call.args):
        if isinstance(arg, torch.fx.Node) and arg.op == "placeholder" and arg.name in frozen:
            result[placeholder.name] = frozen[arg.name]
    return result


def copy_meta(call: torch.fx.Node, submodule: torch.fx.GraphModule) -> None:
    """Give the submodule's placeholders the recorded values of the outer arguments (the
    importer reads types and sizes from them)."""
    placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
    for placeholder, arg in zip(placeholders, call.args):
        if isinstance(arg, torch.fx.Node) and "val" in arg.meta and "val" not in \
                placeholder.meta:
            placeholder.meta["val"] = arg.meta["val"]


def flops_of(node: torch.fx.Node) -> int:
    """Multiply-add FLOPs of a matmul/conv/attention node (PyTorch's own FLOP formulas),
    0 for the rest; symbolic sizes count at their traced hint."""
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is None:
        return 0
    try:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                             lambda n: n.meta.get("val"))
        count = formula(*args, out_val=node.meta.get("val"), **kwargs)
    except Exception:  # noqa: BLE001 -- a formula that does not cover these arguments
        return 0
    return _concrete(count)


def _concrete(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
