"""``torch.export`` -> ember Graph: the ahead-of-time PyTorch path.

:func:`import_exported_program` takes an ExportedProgram, decomposes it to core ATen IR, and
freezes its parameters, buffers and lifted constants into graph constants; user inputs stay
inputs, with the symbolic sizes of ``dynamic_shapes`` as symbolic dims.  :func:`import_module`
exports a module first (non-strict, the mode that works for transformers models), in
evaluation mode and without autograd.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ember.core.errors import ModelLoadError
from ember.frontend.torch.importer import import_fx
from ember.ir.graph import Graph


def import_exported_program(program: "torch.export.ExportedProgram",
                            symbol_names: dict[str, str] | None = None) -> Graph:
    """``symbol_names`` renames size symbols in the input types (see ``import_module``)."""
    from torch.export.graph_signature import InputKind, OutputKind

    program = program.run_decompositions(_decompositions(program))
    signature = program.graph_signature
    frozen: dict[str, torch.Tensor] = {}
    for spec in signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            frozen[spec.arg.name] = program.state_dict[spec.target] \
                if spec.target in program.state_dict else program.constants[spec.target]
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            frozen[spec.arg.name] = program.constants[spec.target]
        elif spec.kind != InputKind.USER_INPUT:
            raise ModelLoadError(f"exported program input '{spec.arg.name}' is a "
                                 f"{spec.kind.name}, which ember does not take")
    mutations = [spec.arg.name for spec in signature.output_specs
                 if spec.kind != OutputKind.USER_OUTPUT]
    if mutations:
        raise ModelLoadError(f"the exported program mutates buffers or inputs "
                             f"({', '.join(mutations)}); export the model in eval mode for "
                             f"inference")
    imported = import_fx(program.graph_module, frozen=frozen, name="main",
                         symbol_names=symbol_names)
    graph = imported.graph
    graph.metadata["producer"] = f"torch.export (torch {torch.__version__})"
    return graph


def _decompositions(program: "torch.export.ExportedProgram") -> Any:
    """Core ATen's decompositions, except for the recurrent layers that ember takes whole
    (``convert_rnn.convertible``): decomposed, a layer is its time steps written out with a
    copy of its weights per step."""
    from ember.frontend.torch.convert_rnn import convertible, recurrent_overloads
    from ember.passes.unroll_recurrent import MAX_UNROLLED_STEPS

    table = torch.export.default_decompositions()
    calls = [node for node in program.graph_module.graph.nodes if node.op == "call_function"]
    for overload in recurrent_overloads():
        layers = [node for node in calls if node.target == overload]
        if layers and all(convertible(node, MAX_UNROLLED_STEPS) for node in layers):
            table.pop(overload, None)
    return table


def import_module(module: torch.nn.Module, example_inputs: Sequence[Any], *,
                  dynamic_shapes: Any = None) -> Graph:
    """Export ``module`` on ``example_inputs`` (evaluation mode, no autograd) and import it.

    ``dynamic_shapes`` is passed to ``torch.export.export``: sizes declared dynamic there
    stay symbolic in the ember graph, so one compiled ``Module`` serves every size.
    """
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"expected a torch.nn.Module, got {type(module).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) \
        else (example_inputs,)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            try:
                program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes,
                                              strict=False)
            except Exception as error:  # noqa: BLE001 -- export errors are many and varied
                raise ModelLoadError(f"torch.export could not export "
                                     f"{type(module).__name__}: {type(error).__name__}: "
                                     f"{error}") from None
            return import_exported_program(program, _dim_names(program, dynamic_shapes))
    finally:
        module.train(was_training)


def _dim_names(program: "torch.export.ExportedProgram", dynamic_shapes: Any
               ) -> dict[str, str]:
    """Size symbol -> the name of the ``torch.export.Dim`` the user declared for it."""
    if dynamic_shapes is None:
        return {}
    from torch.export.graph_signature import InputKind

    specs = list(dynamic_shapes.values()) if isinstance(dynamic_shapes, dict) \
        else list(dynamic_shapes)
    user_inputs = [spec.arg.name for spec in program.graph_signature.input_specs
                   if spec.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in program.graph_module.graph.nodes
                    if n.op == "placeholder"}
    names: dict[str, str] = {}
    for input_name, spec in zip(user_inputs, specs):
        value = placeholders[input_name].meta.get("val")
        if not isinstance(spec, dict) or not isinstance(value, torch.Tensor):
            continue
        for axis, dim in spec.items():
            size = value.shape[axis]
            label = getattr(dim, "__name__", None)
            if isinstance(size, torch.SymInt) and label:
                names[str(size.node.expr)] = label
    return names
