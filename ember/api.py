"""The public entry points: ``compile``, ``load`` and the compiled ``Module``.

    module = ember.compile("resnet18.onnx")          # or a ModelProto, or an ember Graph
    y = module(x)                                    # numpy in, numpy out
    module.save("resnet18.ember")                    # artifact: library + weights + manifest
    same = ember.load("resnet18.ember")

A model with dynamic dims is compiled for the shapes of its first call (or ``input_shapes``);
calling it with other shapes compiles another specialization, as torch.compile does without
dynamic shapes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ember.build.pipeline import Build, BuildOptions, build_graph
from ember.core.errors import InputError
from ember.core.target import Target
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.runtime.model import CompiledModel


def _as_graph(model: Any) -> Graph:
    if isinstance(model, Graph):
        return model
    from ember.frontend.onnx import import_onnx

    return import_onnx(model)


class Module:
    """A compiled model: call it on numpy arrays; ``save`` writes an artifact."""

    def __init__(self, graph: Graph, options: BuildOptions,
                 input_shapes: Mapping[str, Sequence[int]] | None = None):
        self.graph = graph
        self.options = options
        self._variants: dict[tuple, tuple[Build, CompiledModel]] = {}
        self._last: tuple[Build, CompiledModel] | None = None
        self._num_threads: int | None = None
        self._workdirs: list[tempfile.TemporaryDirectory] = []
        if input_shapes is not None or self._all_static():
            self._variant(self._shapes_from(input_shapes or {}))

    # ------------------------------------------------------------------ building
    def _all_static(self) -> bool:
        return all(isinstance(self.graph.types.get(n), TensorType)
                   and self.graph.types[n].is_static for n in self.graph.inputs)

    def _shapes_from(self, given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name in self.graph.inputs:
            if name in given:
                shapes[name] = tuple(int(d) for d in given[name])
            else:
                vtype = self.graph.types.get(name)
                if isinstance(vtype, TensorType) and vtype.is_static:
                    shapes[name] = tuple(vtype.shape)
        return shapes

    def _variant(self, shapes: dict[str, tuple[int, ...]]) -> tuple[Build, CompiledModel]:
        key = tuple(sorted(shapes.items()))
        if key not in self._variants:
            from ember.package.artifact import save_artifact

            build = build_graph(self.graph, shapes, self.options)
            # Loading from the saved form runs exactly what a deployment runs; the directory
            # lives as long as the module (profilers and debuggers can then find the library).
            workdir = tempfile.TemporaryDirectory(prefix="ember-module-")
            self._workdirs.append(workdir)
            artifact = save_artifact(build, Path(workdir.name) / "model.ember")
            runtime = CompiledModel(artifact, host_resolver=_HostResolver(build))
            if self._num_threads is not None:
                runtime.set_num_threads(self._num_threads)
            self._variants[key] = (build, runtime)
        self._last = self._variants[key]
        return self._last

    # ------------------------------------------------------------------ running
    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on named inputs; returns outputs by name."""
        if not isinstance(feeds, Mapping):
            raise InputError("Module.run takes a dict of input name -> array")
        shapes = {name: tuple(feeds[name].shape) for name in self.graph.inputs
                  if isinstance(feeds.get(name), (np.ndarray, np.generic))}
        _, runtime = self._variant(self._shapes_from(shapes))
        return runtime.run(feeds)

    def __call__(self, *args: np.ndarray, **kwargs: np.ndarray):
        feeds = dict(zip(self.graph.inputs, args))
        feeds.update(kwargs)
        outputs = self.run(feeds)
        values = [outputs[name] for name in self.graph.outputs]
        return values[0] if len(values) == 1 else tuple(values)

    def set_num_threads(self, count: int) -> None:
        self._num_threads = int(count)
        for _, runtime in self._variants.values():
            runtime.set_num_threads(count)

    # ------------------------------------------------------------------ reporting
    @property
    def build(self) -> Build:
        if self._last is None:
            raise InputError("this module has dynamic input shapes and was not called yet; "
                             "call it once or compile with input_shapes=...")
        return self._last[0]

    def report(self) -> str:
        return self.build.report()

    def save(self, path: str | Path) -> Path:
        """Write the artifact of the current specialization to directory ``path``."""
        from ember.package.artifact import save_artifact

        return save_artifact(self.build, path)


class _HostResolver:
    """Builds the Python side of fallback nodes from the build that declared them."""

    def __init__(self, build: Build):
        self._impls = {impl.index: impl for impl in build.host_nodes}
        self._graph = build.graph

    def __call__(self, entry: dict[str, Any]):
        return host_function(self._impls[int(entry["index"])].node, self._graph)


def host_function(node, graph: Graph):
    """A function running ``node``'s numpy reference on a list of input arrays: its explicit
    inputs, then the values its subgraphs read from the enclosing graph (in
    ``node.implicit_inputs()`` order)."""
    from ember.interp.reference import NodeInterpreter

    interpreter = NodeInterpreter()
    implicit = node.implicit_inputs()
    explicit_count = sum(1 for name in node.inputs if name)

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        it = iter(inputs[:explicit_count])
        args = [next(it) if name else None for name in node.inputs]
        scope = dict(zip(implicit, inputs[explicit_count:]))
        outputs = interpreter.run_node(graph, node, args, scope)
        return [o for o, name in zip(outputs, node.outputs) if name]

    return run


def _resolve_from_manifest(entry: dict[str, Any]):
    from ember.ir.serialize import graph_from_json

    graph = graph_from_json(entry["node"])
    return host_function(graph.nodes[0], graph)


def compile(model: Any, target: str | Target = "native", opt_level: int = 2,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            sanitize: bool = False) -> Module:
    """Compile an ONNX model (path, bytes, ModelProto) or an ember Graph to native code.

    ``input_shapes`` fixes the shapes of dynamic inputs (otherwise the first call does);
    ``sanitize=True`` builds with AddressSanitizer and UBSan (for tests: the process must
    preload the sanitizer runtime, see ``ember.toolchain.compiler.sanitizer_preload``).
    """
    graph = _as_graph(model)
    resolved = target if isinstance(target, Target) else Target.parse(target)
    options = BuildOptions(target=resolved, opt_level=opt_level, sanitize=sanitize)
    return Module(graph, options, input_shapes)


def load(path: str | Path) -> CompiledModel:
    """Load an artifact, with ember's numpy references available for fallback nodes."""
    return CompiledModel(path, host_resolver=_resolve_from_manifest)
