"""From a Graph to a native library.

1. Specialize the graph to concrete input shapes and infer every type.
2. Run the graph passes of the opt level (``passes/pipeline.py``), the last of which groups
   the nodes into kernels (``passes/fuse.py``; every node alone at opt level 0), asking node
   by node what compiles (``driver/support.py``).
3. Give every group an implementation: one kernel lowered from its members' compute
   definitions, or, for a node that does not compile, its numpy reference called back from
   the library ("host" steps -- reported, never silent).
4. Schedule every kernel with the config its workload key has in
   ``BuildOptions.kernel_configs``, else the default heuristic (the loop stages of
   ``schedule/pipeline.py``), and start compiling its C translation unit.
5. Plan memory: one workspace arena for the values between kernels and the kernels' scratch,
   one weights blob for constants.
6. Generate the ``ember_run`` entry point and link it with the kernels' objects (a
   WebAssembly module is compiled from one translation unit).
"""

from __future__ import annotations

import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ember.driver.entry import EntryStep, IndexCheck, generate_entry, signature
from ember.driver.kernels import KernelImpl, implement_groups
from ember.driver.memory import MemoryPlanReport, plan_workspace
from ember.driver.progress import BuildProgress
from ember.driver.support import node_support
from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.dtypes import DType
from ember.core.errors import CompileError, EmberError
from ember.core.target import Target
from ember.core.traced import DIMS_ARRAY, active_trace
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.passes.context import PassContext
from ember.passes.fuse import NodeSupport, singleton_groups
from ember.passes.memory_budget import check_build_memory, graph_outputs_nbytes
from ember.passes.memory_plan import ALIGNMENT, align
from ember.passes.pipeline import optimize
from ember.passes.specialize import specialize

if TYPE_CHECKING:
    from ember.codegen.c import CUnits
    from ember.schedule.config import KernelConfig
    from ember.ir.loop.stmt import PrimFunc
    from ember.toolchain.units import UnitBuild


# (kernel as lowered, constant parameters, FLOPs, workload key) -> a config, or None
ConfigChooser = Callable[["PrimFunc", frozenset, float, str], "KernelConfig | None"]


class TuningRecordWarning(UserWarning):
    """A tuning database's record could not be applied (the kernel took its defaults)."""


# Element types that may live in the arena at all (fixed-size, no Python objects).
STORABLE_DTYPES = frozenset(d for d in DType if d not in (DType.STRING,))


@dataclass
class BuildOptions:
    target: Target = field(default_factory=Target.native)
    opt_level: int = 2
    sanitize: bool = False
    # Memory budget in bytes or "8GiB"; None: $EMBER_MEMORY_LIMIT, else the available memory.
    memory_limit: int | str | None = None
    # Which graph passes to print before/after (PassContext.dump: a pass name or "all"); the
    # dumps stay on Build.pass_context, which is how `ember inspect --stages` shows each stage.
    dump: str | None = None
    # Schedule configs by workload key (ember.schedule.workload): a kernel whose key is listed
    # is scheduled with that config, any other with the default heuristic (a tuner's records).
    kernel_configs: Mapping[str, "KernelConfig"] = field(default_factory=dict)
    # Configs from a tuning database (ember.tune), by workload key: like kernel_configs, but
    # a record this ember's kernel no longer accepts (a stale database) falls back to the
    # default heuristic with a warning instead of failing the build.
    tuned_configs: Mapping[str, "KernelConfig"] = field(default_factory=dict)
    # Proposes a config for a kernel that neither mapping lists (ember.compile's
    # schedule="predicted": the tuner's cost model ranks candidates, nothing is measured);
    # called with the kernel as lowered, its constant parameters, its FLOPs and its key.
    config_chooser: "ConfigChooser | None" = None
    # Keep each kernel's loop IR after every loop stage (KernelImpl.stages), for inspection;
    # and verify the loop IR after every stage.
    keep_loop_stages: bool = False
    verify_loop_stages: bool = False


@dataclass
class Build:
    """The result of compiling a graph for one set of input shapes."""

    graph: Graph
    target: Target
    source: str
    library: Path
    impls: list[KernelImpl]
    weights: dict[str, np.ndarray]
    weight_offsets: dict[str, int]
    weights_size: int
    workspace_size: int
    seconds: float
    pass_log: list[str] = field(default_factory=list)
    memory: MemoryPlanReport | None = None
    # Run-time range checks of index inputs (ember_run fails naming the node if one fails).
    checks: list[IndexCheck] = field(default_factory=list)
    # What the library's ember_signature() returns (the loader cross-checks the manifest).
    signature: dict[str, Any] = field(default_factory=dict)
    # SHA-256 of the library bytes the compile cache verified (copies are checked against it).
    library_sha256: str = ""
    # The graph passes' context: per-pass records (changes, times) and the requested dumps.
    pass_context: PassContext | None = None
    # The translation units, when the kernels were compiled as units of their own (``source``
    # then lists every unit; the library was linked from ``units.sources()``).
    units: CUnits | None = None
    # Seconds per compile phase ("specialize", "passes", "lower", "kernels", "finish"): where a
    # slow compile spends its time (benchmarks/bench_compile_time.py reports them per node).
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def kernel_definition_symbol(self, name: str) -> str:
        """The symbol under which ``source`` defines kernel ``name``."""
        return self.units.links.get(name, name) if self.units is not None else name

    @property
    def host_nodes(self) -> list[KernelImpl]:
        return [impl for impl in self.impls if impl.kind == "host"]

    @property
    def kernels(self) -> list[KernelImpl]:
        return [impl for impl in self.impls if impl.kind == "kernel"]

    @property
    def memory_summary(self) -> str:
        return self.memory.summary() if self.memory is not None else ""

    @property
    def tuned_kernels(self) -> list[KernelImpl]:
        """The kernels scheduled with a config from a tuning database."""
        return [impl for impl in self.kernels if impl.config_source == "tuned"]

    def report(self) -> str:
        nodes = sum(len(impl.nodes) for impl in self.impls)
        fused = sum(1 for impl in self.kernels if len(impl.nodes) > 1)
        lines = [f"{_count(nodes, 'node')} in {_count(len(self.kernels), 'compiled kernel')} "
                 f"({fused} fused from several nodes) and "
                 f"{_count(len(self.host_nodes), 'numpy fallback')}; workspace "
                 f"{self.workspace_size:,} B, weights {self.weights_size:,} B; "
                 f"built in {self.seconds:.2f} s"]
        if self.pass_log:
            lines.append(f"  graph passes: {', '.join(self.pass_log)}")
        if self.memory_summary:
            lines.append(f"  memory plan: {self.memory_summary}")
        if self.tuned_kernels:
            lines.append(f"  tuned: {len(self.tuned_kernels)} of {len(self.kernels)} kernels "
                         f"scheduled from the tuning database")
        predicted = sum(1 for impl in self.kernels if impl.config_source == "predicted")
        if predicted:
            lines.append(f"  predicted: {predicted} of {len(self.kernels)} kernels scheduled "
                         f"by the cost model's pick (the others: the default heuristic)")
        for impl in self.host_nodes:
            lines.append(f"  fallback: node '{impl.node.name}' ({impl.node.op}): {impl.reason}")
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def build_graph(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None = None,
                options: BuildOptions | None = None) -> Build:
    """Compile ``graph`` for the given input shapes (required for dynamic dims); a build
    that runs for a while shows its progress on a terminal (``driver/progress.py``)."""
    options = options or BuildOptions()
    with BuildProgress(graph.name) as progress:
        return _build(graph, input_shapes, options, progress)


def _build(graph: Graph, input_shapes: Mapping[str, Sequence[int]] | None,
           options: BuildOptions, progress: BuildProgress) -> Build:
    from ember.codegen.c import kernel_unit
    from ember.toolchain.units import UnitBuild, UnitSource

    started = time.perf_counter()
    phases = _PhaseClock()
    limit = resolve_memory_limit(options.memory_limit)
    progress.stage("specializing and optimizing the graph")
    with _internal_errors("specializing the graph to its input shapes"):
        g = specialize(graph, dict(input_shapes or {}), memory_limit=limit)
    phases.lap("specialize")
    pass_log: list[str] = []
    support: dict[int, NodeSupport] = {}

    def kernel_support(node: Node) -> NodeSupport:
        if id(node) not in support:
            support[id(node)] = node_support(node, g)
        return support[id(node)]

    context = PassContext(opt_level=options.opt_level, target=options.target,
                          memory_limit=limit, kernel_support=kernel_support,
                          dump=options.dump)
    g.groups = None
    optimize(g, options.opt_level, pass_log, context=context)
    _check_static(g)
    if g.groups is None:  # a pipeline without fusion: one kernel per node
        g.groups = singleton_groups(g)
    phases.lap("passes")
    progress.stage("lowering kernels")
    impls = implement_groups(g, g.groups, {id(node): kernel_support(node) for node in g.nodes})
    phases.lap("lower")
    progress.stage("scheduling kernels", total=len(impls))
    trace = active_trace()
    if trace is not None:
        _check_traceable(impls)
    with ExitStack() as scope:
        # Kernel units start compiling as soon as each kernel is scheduled, while the next
        # ones are (a WebAssembly module is one unit, compiled at the end).
        unit_build = scope.enter_context(UnitBuild(options.target, sanitize=options.sanitize)) \
            if options.target.arch != "wasm32" else None
        made = []
        packed_weights: dict[tuple, str] = {}  # one packed copy of each (weight, layout)
        for impl in impls:
            if impl.func is None:
                continue
            with _internal_errors(f"scheduling kernel {impl.index} ({_members(impl)})"):
                _schedule(g, impl, options, packed_weights)
                impl.func = _element_aligned_inputs(g, impl, impl.func)
                if trace is not None:
                    impl.func = _with_runtime_dims(impl.func, len(trace.names))
            if unit_build is not None:
                with _internal_errors(f"generating C for kernel {impl.index}"):
                    of = kernel_unit(impl.func, options.target)
                made.append((impl.func, of))
                for unit in (of.unit, *of.shared):
                    unit_build.submit(UnitSource(unit.source, unit.flags))
            progress.advance()
        phases.lap("kernels")
        progress.stage("compiling C")
        build = _finish_build(g, impls, options, context, limit, pass_log, started, unit_build,
                              made, progress)
    phases.lap("finish")
    build.phase_seconds = phases.laps
    return build


class _PhaseClock:
    """Seconds between successive ``lap`` calls, by phase name."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._last
        self._last = now


def _finish_build(g: Graph, impls: list[KernelImpl], options: BuildOptions,
                  context: PassContext, limit: int, pass_log: list[str], started: float,
                  unit_build: "UnitBuild | None", made: list,
                  progress: BuildProgress | None = None) -> Build:
    """Plan memory, generate the entry point and link the library of a scheduled graph."""
    from ember.codegen.c import CModule, generate_c, generate_units, kernel_symbol
    from ember.toolchain.compiler import build_library
    from ember.toolchain.units import UnitSource

    with _internal_errors("planning memory and generating the entry point"):
        used_constants = _used_constants(g, impls)
        weight_offsets, weights_size = _layout_weights(used_constants)
        memory = plan_workspace(g, impls)
        check_build_memory(memory.workspace_size, weights_size, limit,
                           outputs_size=graph_outputs_nbytes(g))
        _allow_aliasing(impls, memory)
        steps = [_entry_step(impl, memory, kernel_symbol) for impl in impls]
        trace = active_trace()
        runtime_dims = len(trace.names) if trace is not None else 0
        for step in steps:
            step.runtime_dims = bool(runtime_dims)
        entry = generate_entry(g, steps, weight_offsets, memory.offsets, memory.workspace_size,
                               weights_size, runtime_dims)
    with _internal_errors("generating C"):
        module = CModule(kernels=[impl.func for impl in impls if impl.func], extra_source=entry,
                         exports=["ember_run", "ember_workspace_size", "ember_signature"],
                         target=options.target)
        # Kernels compile as units of their own, in parallel and cached one by one; a
        # WebAssembly module is linked from one unit.
        units = generate_units(module, made) if unit_build is not None else None
        source = units.listing() if units is not None else generate_c(module)
    if units is not None:
        library = unit_build.link(
            [UnitSource(text, flags) for text, flags in units.flagged_sources()],
            on_progress=progress.done if progress is not None else None)
    else:
        library = build_library(source, options.target, sanitize=options.sanitize)
    return Build(g, options.target, source, library.path, impls, used_constants, weight_offsets,
                 weights_size, memory.workspace_size, time.perf_counter() - started, pass_log,
                 memory, checks=[c for step in steps for c in step.index_checks],
                 signature=signature(g, steps, memory.workspace_size, weights_size,
                                     weight_offsets),
                 library_sha256=library.sha256, pass_context=context,
                 units=units)


@contextmanager
def _internal_errors(stage: str) -> Iterator[None]:
    """Turn an unexpected exception of a compile stage into a CompileError that names the
    stage (ember's own errors pass through: they already say what is wrong)."""
    try:
        yield
    except EmberError:
        raise
    except Exception as error:  # noqa: BLE001 -- an internal bug must not escape unexplained
        raise CompileError(f"internal compiler error while {stage}: {type(error).__name__}: "
                           f"{error}. This is a bug in ember; compiling with opt_level=0 may "
                           f"avoid it.") from error


def _members(impl: KernelImpl) -> str:
    names = ", ".join(f"'{node.name}'" for node in impl.nodes[:4])
    more = f" and {len(impl.nodes) - 4} more" if len(impl.nodes) > 4 else ""
    return f"{'+'.join(node.op for node in impl.nodes)}: node(s) {names}{more}"


def _allow_aliasing(impls: list[KernelImpl], memory: MemoryPlanReport) -> None:
    """A kernel that writes its output over one of its inputs must not promise ``restrict``
    pointers (that would be undefined behaviour in C, even where the accesses coincide)."""
    in_place = {output for output, _ in memory.in_place}
    for impl in impls:
        if impl.func is not None and in_place & set(impl.group.outputs):
            impl.func = replace(impl.func, attrs=impl.func.attrs + (("noalias", False),))


def _check_traceable(impls: list[KernelImpl]) -> None:
    """A build traced over run-time dims runs compiled kernels only: a fallback node is
    handed buffers of the shapes of one specialization."""
    hosts = [impl for impl in impls if impl.kind == "host"]
    if hosts:
        node, reason = hosts[0].node, hosts[0].reason
        raise CompileError(f"node '{node.name}' ({node.op}) runs as a numpy fallback ({reason}), "
                           f"which takes static shapes only")


def _with_runtime_dims(func: PrimFunc, count: int) -> PrimFunc:
    """``func`` with the run-time dims array as its last parameter (its sizes print as
    expressions of ``em_dims``; see ``ember.core.traced``)."""
    from ember.ir.loop.buffer import Buffer

    dims = Buffer(DIMS_ARRAY, DType.INT64, (count,), align=8)
    return replace(func, params=func.params + (dims,))


def _element_aligned_inputs(g: Graph, impl: KernelImpl, func: PrimFunc) -> PrimFunc:
    """Mark the kernel parameters that receive a model input as aligned to their element only.

    The runtime passes a caller's input array to the kernels where it lies; numpy places large
    arrays 16 or 32 bytes past a page, so promising 64-byte alignment there would force a copy
    of every input on every call (0.3-0.5 ms for a 5 MB image batch, mostly page faults).
    Values in the workspace and the weights blob keep their 64-byte promise."""
    model_inputs = set(g.inputs)
    positions = tuple(i for i, name in enumerate(impl.inputs) if name in model_inputs)
    if not positions:
        return func
    return replace(func, attrs=func.attrs + (("element_aligned", positions),))


def _entry_step(impl: KernelImpl, memory: MemoryPlanReport, kernel_symbol) -> EntryStep:
    group = impl.group
    names = ", ".join(f"'{n.name}'" for n in group.nodes[:4])
    label = "+".join(n.op for n in group.nodes) + " " + names + \
        (" ..." if len(group.nodes) > 4 else "")
    if impl.kind == "host":
        node = impl.node
        reads = [n for n in node.inputs if n] + node.implicit_inputs()
        return EntryStep(impl.index, "host", None, reads, [n for n in node.outputs if n], label)
    checks = [IndexCheck(impl.index, node.name, node.op, group.inputs[position], check.low,
                         check.high, check.start, check.stride, check.outside)
              for position, check, node in impl.index_checks]
    return EntryStep(impl.index, "kernel", kernel_symbol(impl.func), impl.inputs,
                     list(group.outputs), label, memory.scratch_offsets.get(impl.index, []),
                     checks)


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


# ---------------------------------------------------------------------- memory


def node_reads(node: Node) -> list[str]:
    """Every value a node reads: its inputs, then what its subgraphs read from outside."""
    return [n for n in node.inputs if n] + node.implicit_inputs()


def _schedule(g: Graph, impl: KernelImpl, options: BuildOptions,
              packed_weights: dict[tuple, str]) -> None:
    """Run the loop stages on ``impl``'s kernel with the config its workload key has in
    ``options.kernel_configs``, else in ``options.tuned_configs``, else the one
    ``options.config_chooser`` proposes (one of these two that no longer applies: a warning),
    else the default heuristic; constant operands the GEMM
    template packs are packed here into new constants that the step passes instead of the
    originals.  ``packed_weights`` maps (weight, layout) to the constant already made for it: a
    weight that several kernels read in one layout (a layer applied many times, shared
    weights) is packed and stored once."""
    from ember.schedule.config import ScheduleConfigError
    from ember.schedule.pipeline import schedule_kernel
    from ember.schedule.workload import workload_key

    constants = frozenset(i for i, name in enumerate(impl.group.inputs) if name in g.constants)
    impl.workload_key = workload_key(impl.func, options.target, constants)
    impl.lowered = impl.func

    def schedule(config: "KernelConfig | None"):
        return schedule_kernel(impl.func, options.target, config, constant_params=constants,
                               opt_level=options.opt_level, verify=options.verify_loop_stages,
                               keep_ir=options.keep_loop_stages)

    if impl.workload_key in options.kernel_configs:
        scheduled = schedule(options.kernel_configs[impl.workload_key])
        impl.config_source = "given"
    else:
        proposed, source = options.tuned_configs.get(impl.workload_key), "tuned"
        if proposed is None and options.config_chooser is not None:
            proposed = options.config_chooser(impl.func, constants, kernel_flops(g, impl),
                                              impl.workload_key)
            source = "predicted"
        try:
            scheduled = schedule(proposed)
            impl.config_source = source if proposed is not None else "default"
        except ScheduleConfigError as error:
            origin = "the tuning database's" if source == "tuned" else "the predicted"
            warnings.warn(f"kernel {impl.index} ({_members(impl)}): {origin} config does not "
                          f"apply to this ember's kernel ({error}); scheduled with the "
                          f"default heuristic", TuningRecordWarning, stacklevel=2)
            scheduled = schedule(None)
    impl.func, impl.config, impl.trace = scheduled.func, scheduled.config, scheduled.trace
    impl.space, impl.stages = scheduled.space, scheduled.stages
    for prepack in scheduled.prepacks:
        source = impl.group.inputs[prepack.param]
        layout = (source, replace(prepack, param=0))
        if layout in packed_weights:
            impl.packed_inputs[prepack.param] = packed_weights[layout]
            continue
        name = f"{source}.packed{impl.index}"
        while name in g.constants or name in g.types:
            name += "_"
        packed = prepack.apply(g.constants[source])
        g.constants[name] = packed
        g.types[name] = TensorType(DType.from_numpy(packed.dtype), tuple(packed.shape))
        impl.packed_inputs[prepack.param] = name
        packed_weights[layout] = name


def kernel_flops(g: Graph, impl: KernelImpl) -> float:
    """The FLOPs of a kernel's nodes (0 for ops without a FLOPs rule)."""
    from ember.ops.cost import node_flops

    total = 0.0
    for node in impl.nodes:
        flops = node_flops(node, g.types)
        total += float(flops) if isinstance(flops, int | float) else 0.0
    return total


def _used_constants(g: Graph, impls: list[KernelImpl]) -> dict[str, np.ndarray]:
    reads = [name for impl in impls for name in
             (impl.inputs if impl.kind == "kernel" else node_reads(impl.node))]
    used = {n for n in reads if n in g.constants}
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



def describe_value(g: Graph, name: str) -> dict[str, Any]:
    vtype = g.types[name]
    assert isinstance(vtype, TensorType)
    return {"name": name, "dtype": vtype.dtype.numpy.name, "shape": [int(d) for d in vtype.shape]}
