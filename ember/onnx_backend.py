"""A standard ONNX backend (``onnx.backend.base``) over ember, like ``onnxruntime.backend``.

    import ember.onnx_backend as backend
    rep = backend.prepare("model.onnx")          # mode="compiled": one native library
    outputs = rep.run([x])                       # a tuple of arrays, in graph-output order

``mode="reference"`` runs ember's numpy oracle (every op's reference) instead of compiling;
``opt_level`` (compiled mode) picks the graph-pass pipeline, 2 by default.

``prepare`` accepts a path, bytes or a ModelProto.  ``run`` binds its inputs as every ember
model does (:mod:`ember.runtime.binding`): a list/tuple in graph-input order or a dict by
name; a single ndarray is one input, never a stack of inputs.  It returns a tuple, as the
``onnx.backend`` API says.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from ember.core.errors import EmberError
from ember.frontend.onnx.importer import import_onnx, load_onnx_model
from ember.interp.reference import ReferenceExecutor
from ember.ir.graph import Graph
from ember.runtime.binding import bind_run

MODES = ("compiled", "reference")
DEFAULT_MODE = "compiled"


class EmberRep(BackendRep):
    """A prepared model: runs inputs given as a list (graph-input order) or a dict."""

    def __init__(self, graph: Graph, mode: str, opt_level: int = 2):
        self.graph = graph
        self.mode = mode
        if mode == "reference":
            self._executor = ReferenceExecutor(graph)
        else:
            from ember.api import Module
            from ember.driver.pipeline import BuildOptions

            self._module = Module(graph, BuildOptions(opt_level=opt_level))

    @property
    def module(self):
        """The compiled ember.Module (mode="compiled" only)."""
        return self._module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on a list/tuple of inputs in graph-input order (a single ndarray is one input)
        or a dict name -> value; returns the outputs as a tuple in graph-output order."""
        feeds = bind_run(self.graph.inputs, [] if inputs is None else inputs)
        if self.mode == "reference":
            outputs = self._executor.run(feeds)
        else:
            outputs = self._module.run(feeds)
        return tuple(outputs[name] for name in self.graph.outputs)


class EmberBackend(Backend):
    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            import_onnx(model, base_dir=kwargs.get("base_dir"))
            return True
        except EmberError:
            return False

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", mode: str = DEFAULT_MODE,
                opt_level: int = 2, base_dir: str | None = None, **kwargs: Any) -> EmberRep:
        """``base_dir``: the directory a model given as bytes or a ModelProto reads its
        external tensor data from (a model file reads it from its own directory)."""
        if not cls.supports_device(device):
            raise EmberError(f"device '{device}' is not supported; ember runs on CPU")
        if mode not in MODES:
            raise EmberError(f"unknown mode '{mode}'; choose one of {MODES}")
        graph = import_onnx(load_onnx_model(model, base_dir))
        return EmberRep(graph, mode, opt_level)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Sequence[Any], device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any):
        """Run a single NodeProto on numpy inputs by wrapping it in a one-node model."""
        from onnx import helper

        opset = kwargs.get("opset_version")
        input_infos = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            np.asarray(value).dtype), np.asarray(value).shape)
            for name, value in zip(node.input, inputs) if name]
        output_infos = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], "run_node", input_infos, output_infos)
        opsets = [helper.make_opsetid(node.domain or "", opset)] if opset else None
        model = helper.make_model(graph, opset_imports=opsets) if opsets else \
            helper.make_model(graph)
        return cls.prepare(model, device, **kwargs).run([v for n, v in zip(node.input, inputs)
                                                         if n])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
is_compatible = EmberBackend.is_compatible
