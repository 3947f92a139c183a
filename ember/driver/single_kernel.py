"""One kernel of a model, compiled on its own with any schedule config: what a tuner measures.

A tuner tries many configs of one kernel; rebuilding the whole model for each would run the
graph passes and schedule every other kernel again, and the passes might even form another
kernel around a subgraph taken out of its model (a padded store depends on the reader).  A
:class:`KernelProblem` instead keeps the kernel *as the model's build lowered it* -- its
loop IR before the loop stages, its fused nodes, the values it reads and writes -- and
:func:`build_kernel` schedules that with a config and links it into a library of its own with
one step, a complete artifact: the runtime loads it, runs it and times its step like any
model's (``CompiledModel.profile``).  The scheduled kernel gets the attributes the model's
build gave it (which parameters are the model's inputs, and so only element-aligned; whether
its output may alias an input), so the code measured is the code the model runs.

The kernel's nodes also form a graph of their own (:attr:`KernelProblem.graph`), which the
reference executor runs: the oracle every candidate's output is checked against.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ember.core.errors import CompileError
from ember.core.target import Target
from ember.ir.graph import FusedGroup, Graph
from ember.ir.loop.stmt import PrimFunc
from ember.ir.types import TensorType
from ember.passes.context import PassContext
from ember.runtime.model import aligned_empty

if TYPE_CHECKING:
    from ember.driver.pipeline import Build
    from ember.schedule.config import KernelConfig
    from ember.schedule.pipeline import ScheduledKernel

# Attributes the model's build adds to a scheduled kernel from what surrounds it.
_CONTEXT_ATTRS = ("element_aligned", "noalias")


@dataclass
class KernelProblem:
    """One kernel of a build, with everything needed to build it again under any config."""

    graph: Graph  # the kernel's nodes alone: its non-constant inputs are the graph's inputs
    group: FusedGroup
    lowered: PrimFunc  # the kernel as lowered, before the loop stages
    workload_key: str
    constant_params: frozenset[int]
    opt_level: int
    context_attrs: tuple = ()
    index_checks: list = field(default_factory=list)
    label: str = ""  # "Conv+Relu (stem.conv, stem.relu)"
    flops: float = 0.0

    @property
    def ops(self) -> str:
        return "+".join(node.op for node in self.group.nodes)


def kernel_problems(build: "Build", opt_level: int = 2) -> list[KernelProblem]:
    """The compiled kernels of ``build`` as problems, in step order (one per kernel step;
    steps that share a workload key share a problem object's key, not the object).
    A build traced over run-time sizes has none: its kernels read their sizes at run time."""
    from ember.driver.pipeline import kernel_flops

    g = build.graph
    problems = []
    for impl in build.kernels:
        if impl.lowered is None or any(p.name == "em_dims" for p in impl.func.params):
            continue
        names = ", ".join(node.name for node in impl.nodes[:3]) + \
            (" ..." if len(impl.nodes) > 3 else "")
        problems.append(KernelProblem(
            graph=_kernel_graph(g, impl.group),
            group=impl.group,
            lowered=impl.lowered,
            workload_key=impl.workload_key,
            constant_params=frozenset(i for i, name in enumerate(impl.group.inputs)
                                      if name in g.constants),
            opt_level=opt_level,
            context_attrs=tuple((k, v) for k, v in impl.func.attrs if k in _CONTEXT_ATTRS),
            index_checks=list(impl.index_checks),
            label=f"{'+'.join(n.op for n in impl.nodes)} ({names})",
            flops=kernel_flops(g, impl),
        ))
    return problems


def _kernel_graph(g: Graph, group: FusedGroup) -> Graph:
    """The group's nodes as a graph: constants stay constants (also those the kernel reads
    at compile time only, such as a Pad's widths), every other value the group reads is an
    input, the values it writes for others are its outputs."""
    values = set(group.inputs) | {o for n in group.nodes for o in n.outputs if o} | \
        {i for n in group.nodes for i in n.inputs if i}
    return Graph(name=f"{g.name}.kernel",
                 inputs=[name for name in group.inputs if name not in g.constants],
                 outputs=list(group.outputs),
                 nodes=list(group.nodes),
                 types={name: g.types[name] for name in values if name in g.types},
                 constants={name: g.constants[name] for name in values
                            if name in g.constants})


def schedule_problem(problem: KernelProblem, target: Target,
                     config: "KernelConfig | None") -> "ScheduledKernel":
    """Schedule the problem's kernel with ``config``, ignoring knobs the kernel does not ask
    for (a mutated config may switch off the part that had them): the scheduled kernel's
    ``config`` is the complete config it applied, the canonical form of a candidate."""
    from ember.schedule.pipeline import schedule_kernel

    return schedule_kernel(problem.lowered, target, config,
                           constant_params=problem.constant_params,
                           opt_level=problem.opt_level, strict=False)


def build_kernel(problem: KernelProblem, target: Target, config: "KernelConfig | None",
                 sanitize: bool = False) -> "Build":
    """A one-step build of the problem's kernel scheduled with ``config`` (None: the default
    heuristic), linked as a library of its own.  A config the kernel cannot take is a
    ``ScheduleConfigError``; a kernel the C compiler rejects, a ``ToolchainError``."""
    from ember.codegen.c import kernel_unit
    from ember.driver.kernels import KernelImpl
    from ember.driver.pipeline import BuildOptions, _finish_build, _schedule
    from ember.toolchain.units import UnitBuild, UnitSource

    started = time.perf_counter()
    if config is not None:
        # the complete, canonical config: a knob the kernel no longer asks is dropped here
        config = schedule_problem(problem, target, config).config
    graph = replace(problem.graph, constants=dict(problem.graph.constants),
                    types=dict(problem.graph.types), groups=[problem.group])
    options = BuildOptions(target=target, opt_level=problem.opt_level, sanitize=sanitize,
                           kernel_configs={problem.workload_key: config} if config else {})
    impl = KernelImpl(index=0, group=problem.group, kind="kernel", func=problem.lowered,
                      index_checks=list(problem.index_checks))
    _schedule(graph, impl, options, {})
    if impl.workload_key != problem.workload_key:
        raise CompileError(f"kernel '{problem.label}' has workload key {impl.workload_key} "
                           f"when built alone, {problem.workload_key} in its model (a bug)")
    impl.func = replace(impl.func, attrs=impl.func.attrs + problem.context_attrs)
    context = PassContext(opt_level=problem.opt_level, target=target)
    with ExitStack() as scope:
        unit_build = scope.enter_context(UnitBuild(target, sanitize=sanitize))
        of = kernel_unit(impl.func, target)
        for unit in (of.unit, *of.shared):
            unit_build.submit(UnitSource(unit.source, unit.flags))
        return _finish_build(graph, [impl], options, context, context.memory_limit, [],
                             started, unit_build, [(impl.func, of)])


def random_inputs(problem: KernelProblem, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for the problem's kernel (see :func:`random_feeds`)."""
    return random_feeds(problem.graph, seed)


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``graph`` (a kernel's, or a whole model's at static shapes): standard
    normal floats, random booleans, and zeros for integers (integer inputs are often
    positions, and zero is always one).

    Every array is 64-byte aligned: in its model, a kernel input that is not a model input
    lives in the workspace, and its kernel was compiled to rely on that alignment (the
    runtime passes an input array to the kernel where it lies)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        vtype = graph.types[name]
        if not isinstance(vtype, TensorType):
            raise CompileError(f"input '{name}' is not a tensor")
        dtype = vtype.dtype.numpy
        shape = tuple(int(d) for d in vtype.shape)
        if np.issubdtype(dtype, np.floating) or dtype.kind == "V":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = np.zeros(shape, dtype=dtype)
    return {name: _aligned_copy(array) for name, array in feeds.items()}


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    copy = aligned_empty(array.nbytes, zeroed=False).view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy
