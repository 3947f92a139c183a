"""The workspace plan of a compiled model: where every value between kernels, and every
kernel's scratch, lives in the one arena.

Lifetimes are counted in steps of ``ember_run`` -- fused groups, not nodes: a value that a
group keeps inside never reaches the arena at all.  A value lives from the step that writes
it to the last step that reads it; a kernel's scratch lives during its own step only.  Values
whose lifetimes do not overlap share memory (``passes/memory_plan.py``: best fit).

In place: the output of a purely elementwise kernel (every member elementwise or broadcast,
one output, one loop nest, no scratch) takes the buffer of an input of the same size that
dies at that step -- each element is read before the same element is written, by the same
iteration, so nothing is overwritten before it is used.  Inputs and constants of the model
are never overwritten.

The report gives the arena size against the naive plan (every value its own buffer) and the
peak of live bytes (the least any plan could use), at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.core.traced import DIMS_ARRAY, plain
from ember.driver.kernels import KernelImpl
from ember.ir.graph import Graph
from ember.ir.loop.stmt import For, Seq
from ember.ir.types import TensorType
from ember.ops.registry import PatternKind, get_op
from ember.passes.memory_plan import Interval, align, plan_memory


@dataclass
class MemoryPlanReport:
    offsets: dict[str, int]
    workspace_size: int
    # step index -> workspace offsets of that kernel's scratch buffers, in parameter order
    scratch_offsets: dict[int, list[int]] = field(default_factory=dict)
    naive_bytes: int = 0
    peak_live_bytes: int = 0
    in_place: list[tuple[str, str]] = field(default_factory=list)  # (output, input it reuses)
    values: int = 0

    def summary(self) -> str:
        parts = [f"workspace {self.workspace_size:,} B for {self.values} values and scratch "
                 f"({self.naive_bytes:,} B without reuse, peak live {self.peak_live_bytes:,} B)"]
        if self.in_place:
            parts.append(f"{len(self.in_place)} written in place")
        return "; ".join(parts)


def plan_workspace(g: Graph, impls: list[KernelImpl]) -> MemoryPlanReport:
    external = set(g.inputs) | set(g.outputs) | set(g.constants)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for impl in impls:
        for name in _writes(impl):
            if name not in external:
                first.setdefault(name, impl.index)
                last[name] = impl.index
                sizes[name] = _nbytes(g, name)
        for name in _reads(impl):
            if name in first:
                last[name] = impl.index
    # Scratch buffers are keyed by (step, position) tuples, a key no value name can equal
    # (a string like "#3.scratch0" could: a model may name its values anything).
    scratch_names: dict[int, list[tuple[int, int]]] = {}
    for impl in impls:
        buffers = _scratch_buffers(impl)
        scratch_names[impl.index] = [(impl.index, j) for j in range(len(buffers))]
        for name, nbytes in zip(scratch_names[impl.index], buffers):
            first[name] = last[name] = impl.index
            sizes[name] = nbytes
    reuse = _in_place_pairs(g, impls, first, last, sizes, external)
    # an output written in place joins its input's interval
    owner = {out: inp for out, inp in reuse}

    def root(name: str) -> str:
        while name in owner:
            name = owner[name]
        return name

    members: dict[str, list[str]] = {}
    for name in first:
        members.setdefault(root(name), []).append(name)
    intervals = [Interval(head, max(sizes[n] for n in names),
                          min(first[n] for n in names), max(last[n] for n in names))
                 for head, names in members.items()]
    plan = plan_memory(intervals)
    offsets = {name: plan.offsets[root(name)] for name in first}
    # statistics of the report, at the traced sample's sizes (no decision on run-time sizes)
    peak = max((sum(align(plain(sizes[n])) for n in first if first[n] <= step <= last[n])
                for step in range(len(impls))), default=0)
    return MemoryPlanReport(
        {n: o for n, o in offsets.items() if isinstance(n, str)}, plan.workspace_size,
        {step: [offsets[n] for n in names] for step, names in scratch_names.items()},
        naive_bytes=sum(align(max(plain(s), 1)) for s in sizes.values()), peak_live_bytes=peak,
        in_place=reuse, values=sum(1 for n in first if isinstance(n, str)))


def _writes(impl: KernelImpl) -> list[str]:
    if impl.kind == "host":
        return [n for n in impl.node.outputs if n]
    return list(impl.group.outputs)


def _reads(impl: KernelImpl) -> list[str]:
    if impl.kind == "host":
        node = impl.node
        return [n for n in node.inputs if n] + node.implicit_inputs()
    return list(impl.group.inputs)


def _nbytes(g: Graph, name: str) -> int:
    vtype = g.types[name]
    assert isinstance(vtype, TensorType)
    return vtype.nbytes


def _scratch_buffers(impl: KernelImpl) -> list[int]:
    if impl.func is None or not impl.scratch:
        return []
    # buffers, but not the run-time dims array of a traced build (the caller's, not scratch)
    params = [p for p in impl.func.params if hasattr(p, "nbytes") and p.name != DIMS_ARRAY]
    return [p.nbytes for p in params[len(params) - impl.scratch:]]


def _in_place_pairs(g: Graph, impls: list[KernelImpl], first: dict[str, int],
                    last: dict[str, int], sizes: dict[str, int], external: set[str]
                    ) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    taken: set[str] = set()
    for impl in impls:
        if not _elementwise_kernel(impl) or len(impl.group.outputs) != 1:
            continue
        output = impl.group.outputs[0]
        if output in external:
            continue
        out_type = g.types[output]
        for name in impl.group.inputs:
            in_type = g.types.get(name)
            if name in external or name in taken or last.get(name) != impl.index:
                continue
            if isinstance(in_type, TensorType) and in_type.shape == out_type.shape and \
                    sizes[name] == sizes[output]:
                pairs.append((output, name))
                taken.add(name)
                break
    return pairs


def _elementwise_kernel(impl: KernelImpl) -> bool:
    """A kernel that reads each input element only where it writes the same output element:
    elementwise members, one loop nest, no scratch."""
    if impl.kind != "kernel" or impl.scratch:
        return False
    if any(get_op(n.op).pattern not in (PatternKind.ELEMENTWISE, PatternKind.BROADCAST)
           for n in impl.group.nodes):
        return False
    body = impl.func.body
    return isinstance(body, For) or (isinstance(body, Seq) and len(body.stmts) == 1)
