"""Frontends: turn a framework's model into an ember Graph."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ember.core.errors import InputError
from ember.ir.graph import Graph


def import_model(model: Any, memory_limit: int | None = None, example_inputs: Any = None,
                 dynamic_shapes: Any = None, base_dir: str | Path | None = None) -> Graph:
    """Any model ``ember.compile`` and ``ember.tune`` take, as a Graph: an ember Graph as it
    is, a ``torch.nn.Module`` exported with ``torch.export`` on ``example_inputs``, else an
    ONNX model (path, bytes or ModelProto).  The frontends are imported when used, so that
    an ONNX user never imports torch."""
    if isinstance(model, Graph):
        return model
    if is_torch_module(model):
        if example_inputs is None:
            raise InputError("a torch.nn.Module needs example inputs: "
                             "ember.compile(module, (x,)), which torch.export traces it with")
        from ember.frontend.torch import import_module

        return import_module(model, example_inputs, dynamic_shapes=dynamic_shapes)
    if example_inputs is not None or dynamic_shapes is not None:
        raise InputError("example_inputs and dynamic_shapes are for torch.nn.Module models; "
                         "an ONNX model's dynamic dims are fixed by input_shapes= or the "
                         "first call")
    from ember.frontend.onnx import import_onnx

    return import_onnx(model, memory_limit=memory_limit, base_dir=base_dir)


def is_torch_module(model: Any) -> bool:
    """Whether ``model`` is a torch.nn.Module, without importing torch for other models."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)
