"""Text form of the graph IR, for ``ember inspect``, debugging and tests that compare IR.

    graph main(%x: f32[N, 3, 224, 224]) -> (%y: f32[N, 1000]) {
      const %w: f32[64, 3, 7, 7]
      %y = Relu(%x)                                # relu_0
    }
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.ir.graph import Graph, Node


def format_graph(graph: Graph, indent: str = "") -> str:
    def typed(name: str) -> str:
        vtype = graph.types.get(name)
        return f"%{name}: {vtype}" if vtype is not None else f"%{name}"

    lines = [f"{indent}graph {graph.name}({', '.join(typed(n) for n in graph.inputs)}) -> "
             f"({', '.join(typed(n) for n in graph.outputs)}) {{"]
    for name, array in graph.constants.items():
        lines.append(f"{indent}  const {typed(name)}{_small_value(array)}")
    for node in graph.nodes:
        lines.append(format_node(node, indent + "  ", graph))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def format_node(node: Node, indent: str = "", graph: Graph | None = None) -> str:
    outputs = ", ".join(f"%{o}" if o else "_" for o in node.outputs)
    inputs = ", ".join(f"%{i}" if i else "_" for i in node.inputs)
    simple_attrs = {k: v for k, v in node.attrs.items() if not _is_graph(v)}
    attr_text = ""
    if simple_attrs:
        attr_text = " {" + ", ".join(f"{k}={_format_attr(v)}" for k, v in
                                     sorted(simple_attrs.items())) + "}"
    text = f"{indent}{outputs} = {node.op}({inputs}){attr_text}"
    if graph is not None and node.outputs and node.outputs[0] in graph.types:
        text += f" : {graph.types[node.outputs[0]]}"
    if node.name:
        text = f"{text:<60} # {node.name}"
    for key, value in node.attrs.items():
        for sub in (value if isinstance(value, list) else [value]):
            if isinstance(sub, Graph):
                text += f"\n{indent}  {key} = " + format_graph(sub, indent + "  ").lstrip()
    return text


def _is_graph(value: Any) -> bool:
    return isinstance(value, Graph) or (isinstance(value, list) and value
                                        and isinstance(value[0], Graph))


def _format_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor<{value.dtype}{list(value.shape)}>" + _small_value(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _small_value(array: Any) -> str:
    array = np.asarray(array)
    if array.size <= 8 and array.dtype != object:
        return f" = {array.tolist()}"
    return ""
