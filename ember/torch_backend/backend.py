"""``torch.compile(model, backend="ember")``: the Dynamo backend.

Dynamo hands each captured FX graph (graph breaks are Dynamo's) and its example inputs to
:func:`ember_backend`.  The graph goes through AOT autograd to core ATen IR (functionalized,
decomposed); parameters and buffers are frozen into constants, so ember can fold and pre-pack
them; the ATen graph is partitioned (``partition.py``) and every supported part is compiled by
ember, while the rest runs in PyTorch.  Tensors cross into ember without copies: a contiguous
CPU tensor is handed over as a numpy view of its memory, and results come back as tensors
over the arrays ember wrote.

Shapes: the ember graph keeps Dynamo's symbolic sizes symbolic, and the compiled
``ember.Module`` serves a new batch size from the blocks it compiled when the part keeps its
samples apart, else specializes per input shape on first use (cached, and logged); Dynamo
itself does not recompile for a new size when the model was compiled with ``dynamic=True`` or
marked dynamic after a size change.

Weights are frozen: a call whose parameters are other tensors, or tensors modified in place
since compilation (their version counter moved), recompiles the parts from the current
weights, and says so in the log.  So are the Python floats Dynamo passes as 0-d tensors (a
module's ``eps`` or dropout ``p``, ``math.pi`` in a tanh-GELU): frozen by value, they are
constants the graph passes can fold and recognize patterns with; a call with other values
recompiles, and past ``MAX_FLOAT_RECOMPILES`` such recompiles they stay run-time inputs.
Training graphs (inputs that require grad while autograd is on) run in PyTorch whole, with a
message.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx

from ember.api import Module
from ember.core.config import env_flag
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.driver.pipeline import BuildOptions
from ember.frontend.torch import import_fx
from ember.frontend.torch.importer import numpy_to_tensor, tensor_to_numpy
from ember.frontend.torch.table import target_name
from ember.ir.graph import Graph
from ember.torch_backend.partition import (Fallback, copy_meta, flops_of, frozen_of_submodule,
                                           is_size_node, partition)

LOG = logging.getLogger("ember.torch")


@dataclass
class GraphReport:
    """What happened to one graph Dynamo handed to ember."""

    index: int
    compiled: bool = True  # False: the whole graph ran in PyTorch (``reason``)
    reason: str = ""
    compute_nodes: int = 0
    compiled_nodes: int = 0
    fallbacks: list[Fallback] = field(default_factory=list)
    flops_total: int = 0
    flops_compiled: int = 0
    kernels: int = 0  # ember-compiled subgraphs
    recompiles: list[str] = field(default_factory=list)
    # ATen calls inside ember's parts whose ember nodes run as numpy references (known once
    # a part has been built, at its first call); counted out of compiled_nodes/flops
    references: list[Fallback] = field(default_factory=list)
    flops_by_node: dict[str, int] = field(default_factory=dict, repr=False)

    def count_references(self, build_host_nodes: Sequence[Any], aten_ops: dict[str, str]
                         ) -> None:
        """Record the fallback (host) nodes of a part's build: each is the ATen call of the
        same name, run as a numpy reference inside the part."""
        known = {fallback.node for fallback in self.references}
        for impl in build_host_nodes:
            name = impl.node.name
            if name in known or name not in aten_ops:
                continue
            known.add(name)
            self.references.append(Fallback(aten_ops[name], name,
                                            f"runs as a numpy reference inside ember "
                                            f"({impl.node.op}: {impl.reason})"))
            self.compiled_nodes -= 1
            self.flops_compiled -= self.flops_by_node.get(name, 0)


class _Reports:
    """Every graph report of the process, for ``ember.explain`` and the log switch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.graphs: list[GraphReport] = []

    def new(self) -> GraphReport:
        with self._lock:
            report = GraphReport(index=len(self.graphs))
            self.graphs.append(report)
            return report

    def since(self, start: int) -> list[GraphReport]:
        with self._lock:
            return list(self.graphs[start:])

    def __len__(self) -> int:
        with self._lock:
            return len(self.graphs)


REPORTS = _Reports()


@dataclass(frozen=True)
class BackendOptions:
    """``torch.compile(..., options={...})`` keys the backend understands."""

    target: str = "native"
    opt_level: int = 2
    threads: int | None = None  # threads of every compiled part (default: ember's)

    @staticmethod
    def parse(options: dict[str, Any]) -> "BackendOptions":
        known = {"target", "opt_level", "threads"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown ember backend option(s) {unknown}; known: "
                             f"{', '.join(sorted(known))}")
        return BackendOptions(**options)


def ember_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any
                  ) -> Callable[..., Any]:
    """The Dynamo backend (registered as ``"ember"`` through the ``torch_dynamo_backends``
    entry point)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    settings = BackendOptions.parse(dict(options.get("options") or options))
    report = REPORTS.new()
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in example_inputs):
        report.compiled = False
        report.reason = ("a training graph (inputs require grad while autograd is on): ember "
                         "compiles inference only; run under torch.no_grad() or "
                         "torch.inference_mode() to compile it")
        LOG.warning("graph %d runs in PyTorch: %s", report.index, report.reason)
        _announce(report)
        return gm.forward
    weights = _weight_positions(gm, example_inputs)
    floats = _python_float_positions(gm, example_inputs)

    def compile_forward(aten: torch.fx.GraphModule, aten_inputs: Sequence[Any]):
        placeholders = [n for n in aten.graph.nodes if n.op == "placeholder"]
        matched = len(placeholders) == len(example_inputs)
        positions = sorted(weights + floats) if matched else []
        # Buffers the graph updates (batch norm's running statistics in training mode) are
        # run-time inputs: frozen, every call would see them changed and recompile.
        mutated = _mutated_inputs()
        positions = [i for i in positions if i not in mutated]
        return _CompiledGraph(aten, [placeholders[i].name for i in positions], positions,
                              [example_inputs[i] for i in positions], settings, report,
                              by_value=frozenset(floats) if matched else frozenset())

    return aot_autograd(fw_compiler=compile_forward,
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def _mutated_inputs() -> set[int]:
    """Positions of the inputs whose data the graph AOT autograd is compiling writes (it
    returns their new values, and copies them back after the call)."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if metadata is None:
        return set()
    return {i for i, info in enumerate(metadata.input_info) if info.mutates_data}


def _weight_positions(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[int]:
    """Inputs that are the module's parameters or buffers (Dynamo lifts them to inputs)."""
    positions = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        text = ""
        if source is not None:
            name = getattr(source, "name", "")
            text = name() if callable(name) else str(name)
        if isinstance(value, torch.nn.Parameter) or "._parameters[" in text or \
                "._buffers[" in text:
            positions.append(i)
    return positions


def _python_float_positions(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
                            ) -> list[int]:
    """Inputs that are Python floats Dynamo passes as 0-d tensors (a module attribute such as
    ``eps``, a global such as ``math.pi``): it does not specialize on float values, so they
    reach the graph as data, where they would hide a GELU's coefficients from the pattern
    passes."""
    positions = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        argument = node.meta.get("grapharg")
        if isinstance(value, torch.Tensor) and value.dim() == 0 and \
                value.dtype.is_floating_point and \
                getattr(argument, "pass_arg_as_tensor", False):
            positions.append(i)
    return positions


# Builds one graph keeps for different sets of weights (the least recently used goes first).
MAX_WEIGHT_VARIANTS = 64
# Recompiles for new values of the Python floats frozen into a graph, after which they are
# left as run-time inputs (a float that changes every call must not compile every call).
MAX_FLOAT_RECOMPILES = 4


@dataclass
class _WeightVariant:
    """A build of the graph for one set of weight tensors, as they were at the build: their
    version counters (bumped by in-place writes, an optimizer step among them) and data
    pointers (``param.data = other`` swaps the data without touching the version); for the
    frozen Python floats (``by_value``), their values."""

    weights: list[torch.Tensor]
    versions: list[int]
    pointers: list[int]
    module: torch.fx.GraphModule
    by_value: tuple[bool, ...] = ()
    values: tuple[float, ...] = ()

    def holds(self, current: list[torch.Tensor]) -> bool:
        """Whether ``current`` are these very tensors, unmodified since the build (and the
        floats these values)."""
        if len(current) != len(self.weights):
            return False
        if not self.by_value:  # (every call of the graph checks: loops in C, not Python)
            return all(map(operator.is_, current, self.weights)) and \
                list(map(_VERSION, current)) == self.versions and \
                list(map(_DATA_POINTER, current)) == self.pointers
        for a, w, v, p, by_value, value in zip(current, self.weights, self.versions,
                                               self.pointers, self.by_value, self.values):
            if by_value:
                if not _same_float(float(a), value):
                    return False
            elif not (a is w and a._version == v and a.data_ptr() == p):
                return False
        return True


def _same_float(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # (NaN is a value like any other here)


class _CompiledGraph:
    """The callable AOT autograd runs: the partitioned graph, its ember parts compiled."""

    def __init__(self, aten: torch.fx.GraphModule, weight_names: list[str],
                 weight_positions: list[int], weights: list[torch.Tensor],
                 settings: BackendOptions, report: GraphReport,
                 by_value: frozenset[int] = frozenset()):
        self.aten = aten
        self.weight_names = weight_names
        self.weight_positions = weight_positions
        # which frozen inputs are Python floats, compared by value
        self.by_value = tuple(i in by_value for i in weight_positions)
        self.float_recompiles = 0
        self.settings = settings
        self.report = report
        self._lock = threading.Lock()
        # One build per set of weight tensors: Dynamo compiles the forward of a module class
        # once and passes each instance's weights as inputs (four blocks of one class behind
        # graph breaks call this one graph with four sets), so each set keeps its own build
        # instead of the graph rebuilding at every call.  Keyed by the tensors' identities,
        # which the entry keeps alive; a tensor modified in place rebuilds its entry.
        self._variants: OrderedDict[tuple[int, ...], _WeightVariant] = OrderedDict()
        # the entry that served the last call: checked first, so that a call with the same
        # weights as the one before walks them once (the check) rather than twice (the key)
        self._latest: _WeightVariant | None = None
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # AOT autograd calls us inside its fake-tensor mode
            self.module = self._build(weights)
            self._remember(weights, self.module)

    def _key(self, weights: list[torch.Tensor]) -> tuple:
        if not any(self.by_value):
            return tuple(id(w) for w in weights)
        return tuple(float(w) if by_value else id(w)
                     for w, by_value in zip(weights, self.by_value))

    def _remember(self, weights: list[torch.Tensor], module: torch.fx.GraphModule) -> None:
        key = self._key(weights)
        values = tuple(float(w) if by_value else 0.0
                       for w, by_value in zip(weights, self.by_value))
        self._variants[key] = _WeightVariant(list(weights), [w._version for w in weights],
                                             [w.data_ptr() for w in weights], module,
                                             self.by_value if any(self.by_value) else (),
                                             values if any(self.by_value) else ())
        self._variants.move_to_end(key)
        while len(self._variants) > MAX_WEIGHT_VARIANTS:
            self._variants.popitem(last=False)

    def _build(self, weights: list[torch.Tensor]) -> torch.fx.GraphModule:
        frozen = dict(zip(self.weight_names, (w.detach() for w in weights)))
        split = partition(_copy_of(self.aten), frozen)  # partitioning rewrites its graph
        report = self.report
        report.compute_nodes = split.compute_nodes
        report.fallbacks = split.fallbacks
        report.compiled_nodes = split.compute_nodes - len(split.fallbacks)
        report.kernels = len(split.fused)
        fallen = {f.node for f in split.fallbacks}
        report.flops_total = report.flops_compiled = 0
        report.references = []
        report.flops_by_node = {}
        for node in self.aten.graph.nodes:
            if node.op == "call_function":
                count = flops_of(node)
                report.flops_by_node[node.name] = count
                report.flops_total += count
                report.flops_compiled += 0 if node.name in fallen else count
        module = split.module
        for call in list(module.graph.nodes):
            if call.op == "call_module" and call.target in split.fused:
                submodule = getattr(module, call.target)
                copy_meta(call, submodule)
                kernel = _EmberKernel(submodule, frozen_of_submodule(call, submodule, frozen),
                                      self.settings, f"graph {report.index} part {call.target}",
                                      report)
                setattr(module, call.target, kernel)
        module.recompile()
        for fallback in split.fallbacks:
            LOG.info("graph %d: %s (%s) runs in PyTorch: %s", report.index,
                     fallback.op, fallback.node, fallback.reason)
        _announce(report)
        return module

    def __call__(self, *args: Any) -> Any:
        args = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if not self.weight_positions:
            return self.module(*args)
        current = [args[i] for i in self.weight_positions]
        variant = self._latest
        if variant is not None and variant.holds(current):
            return variant.module(*args)
        key = self._key(current)
        variant = self._variants.get(key)
        if variant is None or not variant.holds(current):
            with self._lock:
                current = [args[i] for i in self.weight_positions]
                key = self._key(current)
                variant = self._variants.get(key)
                if variant is None or not variant.holds(current):
                    reason = self._recompile_reason(variant, current)
                    if self.float_recompiles > MAX_FLOAT_RECOMPILES:
                        self._stop_freezing_floats()
                        reason = (f"Python floats of the graph took new values "
                                  f"{MAX_FLOAT_RECOMPILES} times: they are run-time inputs "
                                  f"from now on")
                    LOG.info("graph %d compiles again: %s", self.report.index, reason)
                    self.report.recompiles.append(reason)
                    current = [args[i] for i in self.weight_positions]
                    self._remember(current, self._build(current))
                    variant = self._variants[self._key(current)]
        self._latest = variant
        return variant.module(*args)

    def _recompile_reason(self, variant: _WeightVariant | None,
                          current: list[torch.Tensor]) -> str:
        """Why the call needs a build (counting the builds for new float values)."""
        floats = [float(a) for a, by_value in zip(current, self.by_value) if by_value]
        if floats and any(self._same_tensors(v, current) for v in self._variants.values()):
            self.float_recompiles += 1
            return f"Python floats of the graph have new values ({floats})"
        if variant is not None:
            return "weights modified since compilation (in place, or their .data replaced)"
        return "another set of weight tensors (another module of the class)"

    def _stop_freezing_floats(self) -> None:
        """Past MAX_FLOAT_RECOMPILES builds for new float values, the floats become run-time
        inputs of every build (the builds keyed by their values are dropped)."""
        keep = [i for i, by_value in enumerate(self.by_value) if not by_value]
        self.weight_positions = [self.weight_positions[i] for i in keep]
        self.weight_names = [self.weight_names[i] for i in keep]
        self.by_value = tuple(False for _ in keep)
        self._variants.clear()
        self._latest = None

    def _same_tensors(self, variant: _WeightVariant, current: list[torch.Tensor]) -> bool:
        """Whether the weight tensors (not the floats) of ``current`` are ``variant``'s."""
        return all(a is w and a._version == version and a.data_ptr() == pointer
                   for a, w, version, pointer, by_value in zip(
                       current, variant.weights, variant.versions, variant.pointers,
                       self.by_value) if not by_value)


_VERSION = operator.attrgetter("_version")
_DATA_POINTER = torch.Tensor.data_ptr


class _EmberKernel(torch.nn.Module):
    """One ember-compiled part of a graph, called by the partitioned FX graph."""

    def __init__(self, submodule: torch.fx.GraphModule, frozen: dict[str, torch.Tensor],
                 settings: BackendOptions, label: str, report: GraphReport):
        super().__init__()
        self.report = report
        # ATen call name -> its op, to name the calls a build runs as numpy references
        self.aten_ops = {n.name: target_name(n.target) for n in submodule.graph.nodes
                         if n.op == "call_function"}
        self._references_counted = False
        imported = import_fx(submodule, frozen=frozen, name="torch_graph")
        placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
        # position in the call's arguments -> ember input name (weights are constants now)
        self.bindings = [(i, imported.inputs[p.name]) for i, p in enumerate(placeholders)
                         if p.name in imported.inputs]
        output_node = next(n for n in submodule.graph.nodes if n.op == "output")
        items = output_node.args[0]
        self.single = not isinstance(items, (tuple, list))
        items = [items] if self.single else list(items)
        self.size_outputs = [isinstance(n, torch.fx.Node) and is_size_node(n) for n in items]
        # Outputs that are views of an input: where their layout depends on sizes (a slice
        # starting at a tensor's item, symbolic sizes), AOT autograd rebuilds them from the
        # strides and storage offset of the tensor returned here, so it must be that view of
        # the input, not a fresh contiguous tensor.  The view ops (and the size arithmetic
        # they read) are replayed on the input: metadata only, as AOT autograd itself
        # replays views whose layout is static.
        self.views = {i: chain for i, n in enumerate(items)
                      if isinstance(n, torch.fx.Node) and (chain := _view_chain(n))}
        self.placeholders = placeholders
        self.output_names = imported.outputs
        self.label = label
        self.options = BuildOptions(target=Target.parse(settings.target),
                                    opt_level=settings.opt_level)
        self.graph = imported.graph
        self.threads = settings.threads
        # Sizes that reach this part as plain ints (their tensor is elsewhere in the graph):
        # the part is specialized on their values, as it is on its input shapes.
        self.size_inputs = [name for name in imported.graph.inputs
                            if imported.graph.types[name].shape == ()
                            and imported.graph.types[name].dtype == DType.INT64
                            and name in self._size_placeholders(submodule, imported)]
        # Modules are built on the first call, not here: Dynamo may discard a graph it handed
        # to the backend (it restarts its analysis after specializing Python scalars), and
        # native code for a discarded graph would be compile time for nothing.
        self._builds: dict[tuple[int, ...], Module] = {}
        self._build_lock = threading.Lock()

    @staticmethod
    def _size_placeholders(submodule: torch.fx.GraphModule, imported: Any) -> set[str]:
        return {imported.inputs[n.name] for n in submodule.graph.nodes
                if n.op == "placeholder" and n.name in imported.inputs
                and not isinstance(n.meta.get("val"), torch.Tensor)}

    def _module_for(self, sizes: tuple[int, ...]) -> Module:
        module = self._builds.get(sizes)
        if module is None:
            with self._build_lock:
                module = self._builds.get(sizes)
                if module is None:
                    module = Module(self._with_sizes(sizes), self.options)
                    if self.threads is not None:
                        module.set_num_threads(self.threads)
                    self._builds[sizes] = module
        return module

    def _with_sizes(self, sizes: tuple[int, ...]) -> Graph:
        """The graph with the size inputs bound to ``sizes`` (constants)."""
        if not self.size_inputs:
            return self.graph
        graph = Graph(name=self.graph.name, inputs=[n for n in self.graph.inputs
                                                    if n not in self.size_inputs],
                      outputs=list(self.graph.outputs), nodes=list(self.graph.nodes),
                      types=dict(self.graph.types), constants=dict(self.graph.constants),
                      metadata=dict(self.graph.metadata))
        for name, value in zip(self.size_inputs, sizes):
            graph.constants[name] = np.array(value, dtype=np.int64)
        return graph

    def forward(self, *args: Any) -> Any:
        feeds = {}
        for position, name in self.bindings:
            value = args[position]
            if isinstance(value, torch.Tensor):
                feeds[name] = tensor_to_numpy(value)
            else:
                feeds[name] = np.array(int(value), dtype=np.int64)
        sizes = tuple(int(feeds.pop(name)) for name in self.size_inputs)
        module = self._module_for(sizes)
        # positionally, in the build's input order: the module's fast path for inputs of
        # dtypes and shapes it has run before
        results = module(*[feeds[name] for name in module.graph.inputs])
        if len(self.output_names) == 1:
            results = (results,)
        if not self._references_counted:
            self._references_counted = True
            self.report.count_references(module.build.host_nodes, self.aten_ops)
        outputs = [int(array) if is_size else numpy_to_tensor(array)
                   for array, is_size in zip(results, self.size_outputs)]
        if self.views:
            env = dict(zip(self.placeholders, args))
            for i, chain in self.views.items():
                value = None
                for node in chain:
                    value = node.target(*torch.fx.node.map_arg(node.args, env.__getitem__),
                                        **torch.fx.node.map_arg(node.kwargs, env.__getitem__))
                    env[node] = value
                outputs[i] = value
        return outputs[0] if self.single else tuple(outputs)



def _view_chain(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes that compute ``node``, a view, from the placeholders, in graph order, when
    they are all view ops and size arithmetic (metadata only); None otherwise."""
    if not getattr(node.target, "is_view", False) or \
            not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    needed: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in needed or current.op == "placeholder":
            continue
        viewing = getattr(current.target, "is_view", False)
        if current.op != "call_function" or not (viewing or is_size_node(current)):
            return None
        needed.add(current)
        stack.extend(current.all_input_nodes)
    return [n for n in node.graph.nodes if n in needed]


def _copy_of(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of ``gm``'s graph (nodes keep their recorded meta)."""
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    return torch.fx.GraphModule(gm, graph)


def _announce(report: GraphReport) -> None:
    """With ``EMBER_EXPLAIN=1``, print each graph's report when it is compiled."""
    if env_flag("EMBER_EXPLAIN", default=False):
        from ember.torch_backend.explain import format_graph_report

        print(format_graph_report(report))
