"""ATen-level FX graphs -> ember Graph: the PyTorch frontend.

Two producers give ATen graphs: ``torch.export`` (an ExportedProgram, decomposed to core ATen
IR) and AOT autograd inside ``torch.compile``.  Both are FX graphs whose nodes call ATen op
overloads and carry what PyTorch inferred for them in ``node.meta["val"]`` (FakeTensors with
possibly symbolic sizes).  :func:`import_fx` converts one such graph: placeholders become graph
inputs, or constants when the caller freezes them (parameters, buffers); every call goes
through its converter in ``table.py``; symbolic sizes become ``SymDim`` dims of the inputs and
int64 values computed with ``Shape`` inside the graph.

:func:`node_problem` tells, without building anything lasting, whether one node converts;
the ``torch.compile`` backend partitions graphs with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.fx

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import EmberError, UnsupportedOpError
from ember.frontend.torch.context import (ImportContext, Unsupported, ember_dtype, meta_value,
                                          to_numpy)
from ember.frontend.torch.table import IGNORED, converter_for, target_name
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.passes.infer_shapes import infer_shapes
from ember.passes.verify import verify_graph


@dataclass
class ImportedGraph:
    """An ember graph and how its inputs and outputs relate to the FX graph's."""

    graph: Graph
    # FX placeholder name -> ember input name, for the run-time inputs (frozen ones are gone)
    inputs: dict[str, str] = field(default_factory=dict)
    # per FX output position: the ember output name
    outputs: list[str] = field(default_factory=list)


def import_fx(gm: torch.fx.GraphModule, *, frozen: Mapping[str, torch.Tensor] | None = None,
              name: str = "main", symbol_names: Mapping[str, str] | None = None
              ) -> ImportedGraph:
    """Convert an ATen-level GraphModule.

    ``frozen`` maps placeholder names to the tensors they always hold (weights): those become
    constants.  ``symbol_names`` renames size symbols (``s77`` -> ``batch``) in the input
    types.  Every node must convert; all that do not are listed in one UnsupportedOpError.
    """
    frozen = dict(frozen or {})
    graph = Graph(name=name)
    ctx = ImportContext(graph)
    ctx.symbol_names = dict(symbol_names or {})
    result = ImportedGraph(graph)
    problems: list[tuple[str, str, str]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    symbols = _symbol_sources(placeholders, frozen)

    # Tensors first: a size placeholder is read off a tensor input that may come after it.
    ordered = sorted(gm.graph.nodes, key=lambda n: not (n.op == "placeholder" and
                                                        isinstance(n.meta.get("val"),
                                                                   torch.Tensor)))
    for node in ordered:
        ctx.current = node
        try:
            if node.op == "placeholder":
                _import_placeholder(ctx, node, frozen, symbols, result)
            elif node.op == "get_attr":
                ctx.values[node] = ctx.constant(to_numpy(_fetch_attr(gm, node.target)),
                                                hint=node.name)
            elif node.op == "call_function":
                if target_name(node.target) in IGNORED:
                    continue
                ctx.values[node] = convert_node(ctx, node)
            elif node.op == "output":
                result.outputs = _import_outputs(ctx, node)
            else:
                raise Unsupported(f"FX node kind '{node.op}' (call modules and methods are "
                                  f"not ATen-level)")
        except Unsupported as reason:
            problems.append((target_name(node.target) if node.op == "call_function" else node.op,
                             node.name, str(reason)))
    if problems:
        raise UnsupportedOpError(problems)
    graph.outputs = list(dict.fromkeys(result.outputs))
    verify_graph(graph, stage="after PyTorch import")
    infer_shapes(graph)
    return result


def convert_node(ctx: ImportContext, node: torch.fx.Node) -> Any:
    """Run the converter of ``node`` (its arguments must be converted already)."""
    converter = converter_for(node.target)
    if converter is None:
        raise Unsupported("no converter for this op")
    _check_types(node)
    try:
        return converter(ctx, node, *node.args, **node.kwargs)
    except TypeError as error:  # an argument list the converter does not know
        raise Unsupported(f"arguments not covered ({error})") from None


def _check_types(node: torch.fx.Node) -> None:
    """Every tensor the node reads or writes has an element type ember has."""
    values = [meta_value(node)]
    values += [a.meta.get("val") for a in node.all_input_nodes]
    for value in values:
        for item in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(item, torch.Tensor):
                ember_dtype(item.dtype)
                if item.layout != torch.strided:
                    raise Unsupported(f"tensor layout {item.layout}")


def node_problem(node: torch.fx.Node, frozen: Mapping[str, torch.Tensor] | None = None,
                 check: Callable[[Graph], str | None] | None = None) -> str | None:
    """Why ``node`` does not convert, or None if it does: the node is converted on its own,
    over stand-in inputs of its argument's recorded types, and checked by shape inference,
    then by ``check`` (given the one-node graph it became; returns a problem or None)."""
    if node.op != "call_function":
        return None
    if target_name(node.target) in IGNORED:
        return None
    if converter_for(node.target) is None:
        return "no converter for this op"
    graph = Graph(name="probe")
    ctx = ImportContext(graph)
    try:
        _check_types(node)
        for arg in node.all_input_nodes:
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                if frozen and arg.name in frozen:
                    ctx.values[arg] = ctx.constant(to_numpy(frozen[arg.name]), hint="w")
                    continue
                name = graph.fresh_name("in")
                graph.inputs.append(name)
                graph.types[name] = TensorType(ember_dtype(value.dtype), _shape_of(value))
                ctx.values[arg] = name
                ctx.note_symbols(name, value)
            elif isinstance(value, (torch.SymInt, int)):
                name = graph.fresh_name("size")
                graph.inputs.append(name)
                graph.types[name] = TensorType(DType.INT64, ())
                ctx.values[arg] = name
            elif isinstance(value, (tuple, list)):
                names = []
                for item in value:
                    if isinstance(item, torch.Tensor):
                        name = graph.fresh_name("in")
                        graph.inputs.append(name)
                        graph.types[name] = TensorType(ember_dtype(item.dtype), _shape_of(item))
                        names.append(name)
                    else:
                        names.append(None)
                ctx.values[arg] = names
            else:
                return f"input '{arg.name}' is a {type(value).__name__}"
        ctx.current = node
        output = convert_node(ctx, node)
        outputs = output if isinstance(output, list) else [output]
        read = set(range(len(outputs)))  # the outputs the FX graph reads (all, unless known)
        if isinstance(output, list):
            indices = [user.args[1] if target_name(user.target) == "operator.getitem"
                       else None for user in node.users]
            for index in indices:
                if isinstance(index, int) and (index >= len(output) or output[index] is None):
                    return f"its output {index} is used, and ember does not compute it"
            if all(isinstance(index, int) for index in indices):
                read = set(indices)
        graph.outputs = list(dict.fromkeys(o for i, o in enumerate(outputs) if o and i in read))
        verify_graph(graph, stage="probe")
        infer_shapes(graph)
    except Unsupported as reason:
        return str(reason)
    except EmberError as error:
        return f"{type(error).__name__}: {error}"
    return check(graph) if check is not None else None


# ---------------------------------------------------------------------------- inputs

def _shape_of(value: torch.Tensor, names: Mapping[str, str] | None = None
              ) -> tuple[Any, ...]:
    """Ints, and a symbol per symbolic size (named as the user named it, if known)."""
    dims = []
    for d in value.shape:
        if isinstance(d, int):
            dims.append(int(d))
        else:
            expr = d.node.expr
            if getattr(expr, "is_Symbol", False):
                dims.append(sym((names or {}).get(str(expr), str(expr))))
            else:
                dims.append(None)
    return tuple(dims)


def _symbol_sources(placeholders: list[torch.fx.Node], frozen: Mapping[str, Any]
                    ) -> dict[str, tuple[torch.fx.Node, int]]:
    """Each size symbol -> a run-time tensor input and the dim that has that size."""
    sources: dict[str, tuple[torch.fx.Node, int]] = {}
    for node in placeholders:
        value = node.meta.get("val")
        if node.name in frozen or not isinstance(value, torch.Tensor):
            continue
        for axis, d in enumerate(value.shape):
            if isinstance(d, torch.SymInt) and getattr(d.node.expr, "is_Symbol", False):
                sources.setdefault(str(d.node.expr), (node, axis))
    return sources


def _import_placeholder(ctx: ImportContext, node: torch.fx.Node,
                        frozen: Mapping[str, torch.Tensor],
                        symbols: dict[str, tuple[torch.fx.Node, int]],
                        result: ImportedGraph) -> None:
    graph = ctx.graph
    if node.name in frozen:
        ctx.values[node] = ctx.constant(to_numpy(frozen[node.name]), hint=node.name)
        return
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        name = node.name
        graph.inputs.append(name)
        graph.types[name] = TensorType(ember_dtype(value.dtype),
                                       _shape_of(value, ctx.symbol_names))
        ctx.values[node] = name
        ctx.note_symbols(name, value)
        result.inputs[node.name] = name
        return
    if isinstance(value, torch.SymInt) and str(value.node.expr) in symbols:
        # A size Dynamo passes separately: read it off the tensor that has it.
        source, axis = symbols[str(value.node.expr)]
        ctx.values[node] = ctx.dim_size(ctx.tensor(source), axis)
        return
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        name = node.name
        graph.inputs.append(name)
        graph.types[name] = TensorType(DType.INT64, ())
        ctx.values[node] = name
        result.inputs[node.name] = name
        return
    raise Unsupported(f"input '{node.name}' is a {type(value).__name__}, not a tensor or size")


def _fetch_attr(gm: torch.nn.Module, target: str) -> torch.Tensor:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise Unsupported(f"attribute '{target}' is not a tensor")
    return value


def _import_outputs(ctx: ImportContext, node: torch.fx.Node) -> list[str]:
    items = node.args[0]
    items = list(items) if isinstance(items, (tuple, list)) else [items]
    outputs: list[str] = []
    taken: set[str] = set(ctx.graph.inputs) | set(ctx.graph.constants)
    for item in items:
        if not isinstance(item, torch.fx.Node):
            raise Unsupported(f"an output that is a {type(item).__name__}, not a tensor")
        value = ctx.values.get(item)
        if not isinstance(value, str):
            raise Unsupported(f"output '{item.name}' is not a tensor")
        if value in taken:  # an input, a weight, or an output listed twice: a copy
            value = ctx.add("Identity", [value])
        taken.add(value)
        outputs.append(value)
    return outputs


def numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (bfloat16 through an int16 view)."""
    if array.dtype.kind == "V" and array.dtype.name == "bfloat16":  # (kind: no string made)
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy; bfloat16 as ml_dtypes)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
