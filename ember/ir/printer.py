"""Text form of the graph IR, for ``ember inspect``, debugging and tests that compare IR.

    graph main(%x: f32[N, 3, 224, 224]) -> (%y: f32[N, 1000]) {
      const %w: f32[64, 3, 7, 7]
      const %eps: f32[] = 1e-05
      %y = Relu(%x) : f32[N, 3, 224, 224]                      # relu_0
      %v, %i = TopK(%y, %k) {axis=1} : f32[N, 3, 224, 5], i64[N, 3, 224, 5]
    }

The text is also an input: :func:`ember.ir.parser.parse_graph` reads it back, which is how
pass tests write their Before/Expected graphs.  For that, a few things print in a form the
parser can take apart unambiguously, and only where plain text would be ambiguous, so that
ordinary graphs print as they always did:

* a value or graph name that is not a plain identifier (letters, digits, ``_ . - /`` and
  inner ``:``, as in ``layer1/conv:0``) is written as a JSON string: ``%"my value"``;
* a node of several outputs lists the type of each output (``_`` where unknown);
* a node whose domain is not the prefix of its op name prints it: ``com.example::Op(...)``;
* a node name that a trailing comment could not carry (a newline, leading or trailing
  spaces, a leading quote) is written as a JSON string after the ``#``.

Constants of at most :data:`SMALL_CONSTANT_ELEMENTS` elements print their values; larger ones
print their type only (the parser's ``= random`` declares such a constant in a test).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ember.ir.graph import Graph, Node

# Constants (and tensor attributes) with at most this many elements print their values.
SMALL_CONSTANT_ELEMENTS = 8

# A name that prints without quotes.  A ':' may only sit between name characters, so that
# the ': ' before a type ends the name.
BARE_NAME = re.compile(r"[A-Za-z0-9_.\-/]+(?::[A-Za-z0-9_.\-/]+)*")


def format_graph(graph: Graph, indent: str = "") -> str:
    def typed(name: str) -> str:
        vtype = graph.types.get(name)
        return f"%{format_name(name)}: {vtype}" if vtype is not None else \
            f"%{format_name(name)}"

    lines = [f"{indent}graph {format_name(graph.name)}"
             f"({', '.join(typed(n) for n in graph.inputs)}) -> "
             f"({', '.join(typed(n) for n in graph.outputs)}) {{"]
    for name, array in graph.constants.items():
        lines.append(f"{indent}  const {typed(name)}{_small_value(array)}")
    kernel_of = _kernel_numbers(graph)
    previous = None
    for node in graph.nodes:
        kernel = kernel_of.get(id(node))
        if kernel is not None and kernel != previous:
            group = graph.groups[kernel]  # type: ignore[index]
            members = "+".join(n.op for n in group.nodes)
            lines.append(f"{indent}  # kernel {kernel}: {len(group.nodes)} node(s), {members}")
        previous = kernel
        lines.append(format_node(node, indent + "  ", graph))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _kernel_numbers(graph: Graph) -> dict[int, int]:
    """Node (by id) -> the index of its fused group, once fusion has run (else empty).  The
    printer marks where each kernel starts with a whole-line comment, which the parser skips."""
    return {id(node): index for index, group in enumerate(graph.groups or ())
            for node in group.nodes}


def format_node(node: Node, indent: str = "", graph: Graph | None = None) -> str:
    outputs = ", ".join(f"%{format_name(o)}" if o else "_" for o in node.outputs)
    inputs = ", ".join(f"%{format_name(i)}" if i else "_" for i in node.inputs)
    simple_attrs = {k: v for k, v in node.attrs.items() if not _is_graph(v)}
    attr_text = ""
    if simple_attrs:
        attr_text = " {" + ", ".join(f"{k}={_format_attr(v)}" for k, v in
                                     sorted(simple_attrs.items())) + "}"
    text = f"{indent}{outputs} = {_op_text(node)}({inputs}){attr_text}"
    if graph is not None:
        text += _output_types(node, graph)
    if node.name:
        text = f"{text:<60} # {_comment_name(node.name)}"
    for key, value in node.attrs.items():
        for sub in (value if isinstance(value, list) else [value]):
            if isinstance(sub, Graph):
                text += f"\n{indent}  {key} = " + format_graph(sub, indent + "  ").lstrip()
    return text


def format_name(name: str) -> str:
    """``name`` as it follows a ``%`` (or ``graph``): bare if unambiguous, else a JSON string."""
    return name if BARE_NAME.fullmatch(name) else json.dumps(name)


def domain_of_op(op: str) -> str:
    """The domain an op name implies: ``ai.onnx.ml`` for ``ai.onnx.ml.Binarizer``, else ``""``.

    ember names the ops of other domains ``<domain>.<op_type>``, so the domain is printed only
    when it is not this prefix."""
    return op.rsplit(".", 1)[0] if "." in op else ""


def _op_text(node: Node) -> str:
    if node.domain != domain_of_op(node.op):
        return f"{node.domain}::{node.op}"
    return node.op


def _output_types(node: Node, graph: Graph) -> str:
    """`` : T`` for a node of one output, `` : T1, T2`` (``_`` where unknown) for more."""
    if len(node.outputs) == 1:
        vtype = graph.types.get(node.outputs[0]) if node.outputs[0] else None
        return f" : {vtype}" if vtype is not None else ""
    types = [graph.types.get(o) if o else None for o in node.outputs]
    if all(t is None for t in types):
        return ""
    return " : " + ", ".join("_" if t is None else str(t) for t in types)


def _comment_name(name: str) -> str:
    plain = name.isprintable() and name == name.strip() and not name.startswith('"')
    return name if plain else json.dumps(name)


def _is_graph(value: Any) -> bool:
    return isinstance(value, Graph) or (isinstance(value, list) and value
                                        and isinstance(value[0], Graph))


def _format_attr(value: Any) -> str:
    """An attribute value as a Python-like literal (numpy scalars as plain numbers)."""
    if isinstance(value, np.ndarray):
        return f"tensor<{value.dtype}{list(value.shape)}>" + _small_value(value)
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_format_attr(v) for v in value) + "]"
    if isinstance(value, tuple):
        items = ", ".join(_format_attr(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    return str(value)


def _small_value(array: Any) -> str:
    array = np.asarray(array)
    if array.size > SMALL_CONSTANT_ELEMENTS:
        return ""
    if array.dtype == object and not all(isinstance(v, str) for v in array.flat):
        return ""
    return f" = {array.tolist()}"
