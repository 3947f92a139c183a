"""Finding the parts of an ONNX model a mutator can damage.

Mutators pick a *site* (a node, a declared type, a tensor) uniformly among all of them,
including those inside If branches and model-local functions, so that nested graphs are
damaged as often as the main graph: they are where importers tend to forget a check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import onnx
from onnx import AttributeProto


@dataclass
class NodeSite:
    """A node and the repeated field that holds it (to reorder or delete it)."""

    where: str
    container: object  # RepeatedCompositeFieldContainer[NodeProto]
    node: onnx.NodeProto

    @property
    def label(self) -> str:
        return f"{self.where}:{self.node.name or self.node.op_type}"


def graphs(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The main graph and every subgraph (If/Loop/Scan bodies), in the main graph's and in
    functions' nodes, labelled by their path."""

    def walk(graph: onnx.GraphProto, label: str) -> Iterator[tuple[str, onnx.GraphProto]]:
        yield label, graph
        for node in graph.node:
            yield from _subgraphs_of(node, f"{label}/{node.name or node.op_type}", walk)

    yield from walk(model.graph, "main")
    for function in model.functions:
        for node in function.node:
            yield from _subgraphs_of(node, f"function {function.name}/{node.name}", walk)


def _subgraphs_of(node: onnx.NodeProto, label: str, walk):
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield from walk(attr.g, f"{label}.{attr.name}")
        elif attr.type == AttributeProto.GRAPHS:
            for i, sub in enumerate(attr.graphs):
                yield from walk(sub, f"{label}.{attr.name}[{i}]")


def node_sites(model: onnx.ModelProto) -> list[NodeSite]:
    sites = [NodeSite(label, graph.node, node)
             for label, graph in graphs(model) for node in graph.node]
    for function in model.functions:
        sites += [NodeSite(f"function {function.name}", function.node, node)
                  for node in function.node]
    return sites


def value_infos(model: onnx.ModelProto) -> list[tuple[str, onnx.ValueInfoProto]]:
    """Every declared value type: graph inputs, outputs and value_info of every graph."""
    sites = []
    for label, graph in graphs(model):
        for field in ("input", "output", "value_info"):
            sites += [(f"{label} {field} '{vi.name}'", vi) for vi in getattr(graph, field)]
    return sites


def tensor_value_infos(model: onnx.ModelProto) -> list[tuple[str, onnx.ValueInfoProto]]:
    return [(label, vi) for label, vi in value_infos(model)
            if vi.type.WhichOneof("value") == "tensor_type"]


def tensors(model: onnx.ModelProto) -> list[tuple[str, onnx.TensorProto]]:
    """Every stored tensor: initializers of every graph and tensor attributes (Constant
    values) of every node, functions included."""
    found = []
    for label, graph in graphs(model):
        found += [(f"{label} initializer '{t.name}'", t) for t in graph.initializer]
    for site in node_sites(model):
        for attr in site.node.attribute:
            if attr.type == AttributeProto.TENSOR:
                found.append((f"{site.label} attribute '{attr.name}'", attr.t))
    return found


def produced_names(graph: onnx.GraphProto) -> list[str]:
    return [name for node in graph.node for name in node.output if name]


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """Names visible in ``graph`` without looking at enclosing graphs."""
    return ({vi.name for vi in graph.input} | {t.name for t in graph.initializer}
            | {s.values.name for s in graph.sparse_initializer} | set(produced_names(graph)))


def all_value_names(model: onnx.ModelProto) -> list[str]:
    """Value names of the main graph (inputs, initializers, node outputs), in order."""
    names: list[str] = []
    graph = model.graph
    for name in ([vi.name for vi in graph.input] + [t.name for t in graph.initializer]
                 + produced_names(graph)):
        if name and name not in names:
            names.append(name)
    return names


def rename_value(model: onnx.ModelProto, old: str, new: str) -> None:
    """Rename a value of the main graph everywhere it is named, subgraphs included (they see
    outer values by name); function bodies have their own namespace and are left alone."""

    def in_graph(graph: onnx.GraphProto) -> None:
        for field in ("input", "output", "value_info"):
            for vi in getattr(graph, field):
                if vi.name == old:
                    vi.name = new
        for tensor in graph.initializer:
            if tensor.name == old:
                tensor.name = new
        for sparse in graph.sparse_initializer:
            if sparse.values.name == old:
                sparse.values.name = new
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new
            for i, name in enumerate(node.output):
                if name == old:
                    node.output[i] = new
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    in_graph(attr.g)
                for sub in attr.graphs:
                    in_graph(sub)

    in_graph(model.graph)


def clear_attribute_value(attr: onnx.AttributeProto) -> None:
    for field in ("f", "i", "s", "t", "g", "sparse_tensor", "tp"):
        attr.ClearField(field)
    for field in ("floats", "ints", "strings", "tensors", "graphs", "sparse_tensors",
                  "type_protos"):
        attr.ClearField(field)
