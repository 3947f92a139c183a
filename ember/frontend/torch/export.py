"""``torch.export`` -> ember Graph: the ahead-of-time PyTorch path.

:func:`import_exported_program` takes an ExportedProgram, decomposes it to core ATen IR, and
freezes its parameters, buffers and lifted constants into graph constants; user inputs stay
inputs, with the symbolic sizes of ``dynamic_shapes`` as symbolic dims.  :func:`import_module`
exports a module first (non-strict, the mode that works for transformers models), in
evaluation mode and without autograd.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

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
    _name_outputs(graph, _output_names(program, len(graph.outputs)))
    graph.metadata["producer"] = f"torch.export (torch {torch.__version__})"
    return graph


def _output_names(program: "torch.export.ExportedProgram", count: int) -> list[str | None]:
    """What the model calls each output: the keys of a dict, a ``ModelOutput`` or a
    namedtuple it returns (``last_hidden_state``; nested ones joined, ``hidden_states_2``);
    None for outputs that are only positions in a tuple (they keep ember's names)."""
    from torch.utils import _pytree as pytree

    spec = getattr(getattr(program, "call_spec", None), "out_spec", None)
    if spec is None or spec.num_leaves != count:
        return [None] * count
    paths = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(count)), spec))[0]
    names: list[str | None] = []
    for path, _ in paths:
        if not any(isinstance(key, (pytree.MappingKey, pytree.GetAttrKey)) for key in path):
            names.append(None)
            continue
        parts = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", ""))))
                 for key in path]
        names.append(re.sub(r"[^0-9A-Za-z_]+", "_", "_".join(parts)).strip("_") or None)
    return names


def _name_outputs(graph: Graph, names: list[str | None]) -> None:
    """Rename the graph's outputs to ``names`` where given, free and distinct."""
    producers = graph.producers()
    taken = set(graph.inputs) | set(graph.constants) | set(producers)
    for position, (old, new) in enumerate(zip(list(graph.outputs), names)):
        if new is None or new in taken or old not in producers or \
                graph.outputs.count(old) > 1:
            continue
        node = producers[old]
        node.outputs = [new if name == old else name for name in node.outputs]
        for reader in graph.nodes:
            reader.inputs = [new if name == old else name for name in reader.inputs]
        if old in graph.types:
            graph.types[new] = graph.types.pop(old)
        graph.outputs[position] = new
        taken.add(new)


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


def import_module(module: torch.nn.Module, example_inputs: Any, *,
                  dynamic_shapes: Any = None) -> Graph:
    """Export ``module`` on ``example_inputs`` (evaluation mode, no autograd) and import it.

    ``example_inputs`` is a tensor, a tuple of positional arguments, or a mapping of keyword
    arguments (``{"input_ids": ids, "attention_mask": mask}``); the graph's inputs take the
    names of the forward's parameters either way.  ``dynamic_shapes`` is passed to
    ``torch.export.export``: sizes declared dynamic there stay symbolic in the ember graph,
    so one compiled ``Module`` serves every size.
    """
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"expected a torch.nn.Module, got {type(module).__name__}")
    kwargs: dict[str, Any] = {}
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), {str(name): value for name, value in example_inputs.items()}
    elif isinstance(example_inputs, (list, tuple)):
        args = tuple(example_inputs)
    else:
        args = (example_inputs,)
    # each submodule's own mode, restored one by one: ``module.train(was_training)`` would
    # put a wrapper's evaluation-mode parts (a model inside a training-mode wrapper) into
    # training mode, turning their dropout on for every later call
    modes = [(part, part.training) for part in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            try:
                program = torch.export.export(module, args, kwargs=kwargs or None,
                                              dynamic_shapes=dynamic_shapes, strict=False)
            except Exception as error:  # noqa: BLE001 -- export errors are many and varied
                raise ModelLoadError(f"torch.export could not export "
                                     f"{type(module).__name__}: {type(error).__name__}: "
                                     f"{error}") from None
            return import_exported_program(program, _dim_names(program, dynamic_shapes))
    finally:
        for part, training in modes:
            part.training = training


def _dim_names(program: "torch.export.ExportedProgram", dynamic_shapes: Any
               ) -> dict[str, str]:
    """Size symbol -> the name of the ``torch.export.Dim`` the user declared for it."""
    if dynamic_shapes is None:
        return {}
    from torch.export.graph_signature import InputKind

    user_inputs = [spec.arg.name for spec in program.graph_signature.input_specs
                   if spec.kind == InputKind.USER_INPUT]
    if isinstance(dynamic_shapes, Mapping) and set(dynamic_shapes) <= set(user_inputs):
        specs = [dynamic_shapes.get(name) for name in user_inputs]  # keyed by argument name
    else:
        specs = list(dynamic_shapes.values()) if isinstance(dynamic_shapes, Mapping) \
            else list(dynamic_shapes)
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
