"""Split an ATen graph into the parts ember compiles and the parts PyTorch runs.

Every call of the graph is probed on its own (``node_problem``: converted over stand-ins of its
arguments, then checked by shape inference and for ember ops without a compiled kernel,
which would run as numpy references); the supported ones are grouped into the largest
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

from ember.driver.support import node_support
from ember.frontend.torch import node_problem
from ember.frontend.torch.table import IGNORED, target_name
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.passes.dce import eliminate_dead_code
from ember.passes.fold_constants import fold_constants
from ember.passes.pipeline import becomes_compiled_code, has_compute

# What folding the one-node probe graph may allocate: its constants are sizes and small
# arguments (a TopK's K written as an Unsqueeze of a number), as the build folds them.
_PROBE_FOLD_BYTES = 1 << 24


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
        problem = node_problem(node, frozen, check=_compiled_by_ember)
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


def _compiled_by_ember(graph: Graph) -> str | None:
    """A node whose ember ops would run as numpy references stays with PyTorch, whose kernel
    is faster than a reference and needs no copy across (the call is then reported as a
    fallback, not as compiled).  Where the call's shapes are known, the op's compute is
    asked about this very node (a TopK of 3 compiles, a sort -- a TopK of the whole axis --
    does not)."""
    references = []
    # as the build will see it: sizes folded, what nothing reads gone (the probe graph is
    # this call's alone)
    fold_constants(graph, _PROBE_FOLD_BYTES)
    eliminate_dead_code(graph)
    for node in graph.nodes:
        if not becomes_compiled_code(node.op):
            references.append(f"ember has no kernel for {node.op}")
            continue
        types = [graph.types.get(name) for name in [*node.inputs, *node.outputs] if name]
        if has_compute(node.op) and all(isinstance(t, TensorType) and t.is_static
                                      for t in types):
            support = node_support(_without_unread_outputs(node, graph), graph)
            if not support.kernel:
                references.append(f"ember's {node.op} kernel does not cover it "
                                  f"({support.reason})")
    if references:
        return "; ".join(dict.fromkeys(references)) + " (it would run as a numpy reference)"
    return None


def _without_unread_outputs(node: Node, graph: Graph) -> Node:
    """``node`` without the trailing outputs nothing reads (MaxPool's indices when only the
    values are used), as the build's dead-code elimination leaves it."""
    read = set(graph.outputs) | {name for other in graph.nodes for name in other.inputs}
    outputs = list(node.outputs)
    while len(outputs) > 1 and outputs[-1] not in read:
        outputs.pop()
    return node if len(outputs) == len(node.outputs) else \
        Node(node.op, list(node.inputs), outputs, dict(node.attrs), name=node.name,
             domain=node.domain)


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
    """Operations of an ATen call, so that every call counts towards the share ember
    compiles: PyTorch's own FLOP formulas (matmul, convolution, attention), a recurrent
    layer's gate products, and one operation per output element for the rest (elementwise
    work; size arithmetic and tuple indexing count nothing).  Symbolic sizes count at their
    traced hint."""
    from torch.utils.flop_counter import flop_registry

    if is_size_node(node) or target_name(node.target) == "operator.getitem":
        return 0
    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is not None:
        try:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda n: n.meta.get("val"))
            return _concrete(formula(*args, out_val=node.meta.get("val"), **kwargs))
        except Exception:  # noqa: BLE001 -- a formula that does not cover these arguments
            pass
    if any(word in str(packet) for word in ("lstm", "gru", "rnn")):
        return _recurrent_flops(node)
    return _output_elements(node.meta.get("val"))


def _recurrent_flops(node: torch.fx.Node) -> int:
    """2 x (time steps x batch) x every weight matrix's elements: the gate products of a
    recurrent layer (``aten.lstm``, ``aten.mkldnn_rnn_layer`` ...); its first argument is the
    sequence."""
    def tensors(arg: Any) -> list[torch.Tensor]:
        if isinstance(arg, (list, tuple)):
            return [t for item in arg for t in tensors(item)]
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        return [value] if isinstance(value, torch.Tensor) else []

    found = tensors(list(node.args))
    if not found or found[0].dim() < 2:
        return _output_elements(node.meta.get("val"))
    sequence = found[0]
    rows = _concrete(sequence.numel()) // max(_concrete(sequence.shape[-1]), 1)
    weights = sum(_concrete(t.numel()) for t in found[1:] if t.dim() == 2)
    return 2 * rows * weights


def _output_elements(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return _concrete(value.numel())
    if isinstance(value, (list, tuple)):
        return sum(_output_elements(item) for item in value)
    return 0


def _concrete(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
