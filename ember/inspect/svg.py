"""The compiled graph as an SVG drawing: nodes, edges, fused kernels, host fallbacks.

Nodes are boxes (op, node name, output type), graph inputs and outputs are pills, edges run
from producer to consumer (constants are left out: a weight is not a step).  Every fused
kernel is a rounded rectangle, one colour per kernel from a cycling palette, around its member
nodes; a host fallback is a dashed red box.  :mod:`ember.inspect.layout` places everything.

Model text -- node, op, value and graph names -- comes from an untrusted file: every string
goes through :func:`escape` (``html.escape(..., quote=True)``), in text and in attributes.
Ids and attributes are built from indices, never from names.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ember.codegen.c import kernel_symbol
from ember.driver.kernels import KernelImpl
from ember.inspect.layout import Box, Layout, Route, layered_layout
from ember.inspect.stages import node_label
from ember.ir.graph import Graph, Node

# (fill, stroke) of fused kernels, in turn; none of them red, which marks host fallbacks.
PALETTE = (
    ("#dbeafe", "#2563eb"), ("#dcfce7", "#16a34a"), ("#fef3c7", "#d97706"),
    ("#f3e8ff", "#9333ea"), ("#cffafe", "#0891b2"), ("#ecfccb", "#65a30d"),
    ("#ffedd5", "#ea580c"), ("#e0e7ff", "#4f46e5"), ("#fce7f3", "#db2777"),
    ("#ccfbf1", "#0d9488"),
)
HOST_FILL, HOST_STROKE = "#fee2e2", "#b91c1c"
TERMINAL_FILL, TERMINAL_STROKE = "#f1f5f9", "#475569"
EDGE_COLOUR = "#64748b"

FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"
CHAR_WIDTH = 6.8  # of the 11 px monospace font, with a little room
BOLD_CHAR_WIDTH = 7.6  # of the 12 px bold op names
NODE_MIN_WIDTH, NODE_MAX_WIDTH = 72.0, 216.0
NODE_HEIGHT, TERMINAL_HEIGHT = 48.0, 34.0
PAD = 8.0


def escape(text: object) -> str:
    """Text made safe for HTML and SVG content and for quoted attributes."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class _Shape:
    """What one drawn node shows."""

    key: str  # the SVG id: n<index>, in<index>, out<index>
    lines: tuple[str, ...]  # op (bold), name, type
    tooltip: str
    kind: str  # "kernel", "host", "input", "output"
    kernel: int | None = None


def graph_edges(graph: Graph) -> list[tuple[str, str]]:
    """The edges drawn: (producer, consumer) ids, one per pair of drawn nodes that a value
    joins (inputs ``in<i>``, nodes ``n<i>``, outputs ``out<i>``; constants are not drawn)."""
    producer = {name: f"in{i}" for i, name in enumerate(graph.inputs)}
    for index, node in enumerate(graph.nodes):
        producer.update({name: f"n{index}" for name in node.outputs if name})
    edges: dict[tuple[str, str], None] = {}
    for index, node in enumerate(graph.nodes):
        for name in [n for n in node.inputs if n] + node.implicit_inputs():
            if name in producer:
                edges[(producer[name], f"n{index}")] = None
    for i, name in enumerate(graph.outputs):
        if name in producer:
            edges[(producer[name], f"out{i}")] = None
    return list(edges)


def render_svg(graph: Graph, impls: list[KernelImpl]) -> str:
    """The SVG element (no XML prolog: it is meant to be inlined in HTML)."""
    shapes = _shapes(graph, impls)
    fused = _fused(impls)
    layout = _layout(graph, shapes, fused)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" '
             f'width="{layout.width:.0f}" height="{layout.height:.0f}" '
             f'viewBox="0 0 {layout.width:.0f} {layout.height:.0f}" '
             f'font-family="{escape(FONT)}" font-size="11">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
             'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" '
             f'fill="{EDGE_COLOUR}"/></marker></defs>']
    parts.append('<g class="groups">')
    for number, (impl, box) in enumerate(zip(fused, layout.blocks)):
        parts.append(_group(impl, box, _member_ids(graph, impl),
                            PALETTE[number % len(PALETTE)]))
    parts.append('</g><g class="edges">')
    parts.extend(_edge(route) for route in layout.edges)
    parts.append('</g><g class="nodes">')
    parts.extend(_node(shape, layout.nodes[shape.key]) for shape in shapes)
    parts.append("</g></svg>")
    return "\n".join(parts)


def layout_of(graph: Graph, impls: list[KernelImpl]) -> Layout:
    """The layout that render_svg draws (``blocks``: the fused kernels, in step order)."""
    return _layout(graph, _shapes(graph, impls), _fused(impls))


def _fused(impls: list[KernelImpl]) -> list[KernelImpl]:
    return [impl for impl in impls if impl.kind == "kernel" and len(impl.nodes) > 1]


def _member_ids(graph: Graph, impl: KernelImpl) -> list[str]:
    members = {id(node) for node in impl.nodes}
    return [f"n{i}" for i, node in enumerate(graph.nodes) if id(node) in members]


def _layout(graph: Graph, shapes: list[_Shape], fused: list[KernelImpl]) -> Layout:
    return layered_layout({s.key: _size(s) for s in shapes}, graph_edges(graph),
                          [_member_ids(graph, impl) for impl in fused],
                          top=[s.key for s in shapes if s.kind == "input"])


# ---------------------------------------------------------------------- shapes


def _shapes(graph: Graph, impls: list[KernelImpl]) -> list[_Shape]:
    step_of: dict[int, KernelImpl] = {id(n): impl for impl in impls for n in impl.nodes}
    shapes = [_Shape(f"in{i}", (name, _type(graph, name)),
                     f"graph input {name}: {_type(graph, name)}", "input")
              for i, name in enumerate(graph.inputs)]
    for index, node in enumerate(graph.nodes):
        impl = step_of.get(id(node))
        kind = "host" if impl is not None and impl.kind == "host" else "kernel"
        out_type = next((_type(graph, o) for o in node.outputs if o), "")
        shapes.append(_Shape(f"n{index}", (node.op, node_label(node), out_type),
                             _node_tooltip(graph, node, impl), kind,
                             impl.index if impl is not None else None))
    shapes += [_Shape(f"out{i}", (name, _type(graph, name)),
                      f"graph output {name}: {_type(graph, name)}", "output")
               for i, name in enumerate(graph.outputs)]
    return shapes


def _type(graph: Graph, name: str) -> str:
    vtype = graph.types.get(name)
    return str(vtype).replace(", ", ",") if vtype is not None else "?"


def _node_tooltip(graph: Graph, node: Node, impl: KernelImpl | None) -> str:
    lines = [f"{node.op} {node.name}".rstrip()]
    lines += [f"in  {name}: {_type(graph, name)}" for name in node.inputs if name]
    lines += [f"out {name}: {_type(graph, name)}" for name in node.outputs if name]
    if impl is not None:
        ops = "+".join(n.op for n in impl.nodes)
        lines.append(f"step {impl.index}: {impl.kind} {ops}")
        if impl.kind == "host":
            lines.append(f"host fallback: {impl.reason}")
    return "\n".join(lines)


def _size(shape: _Shape) -> tuple[float, float]:
    if shape.kind in ("input", "output"):
        width = max(len(shape.lines[0]) * BOLD_CHAR_WIDTH, len(shape.lines[1]) * CHAR_WIDTH)
        return min(max(width + 2 * PAD, NODE_MIN_WIDTH), NODE_MAX_WIDTH), TERMINAL_HEIGHT
    op, name, vtype = shape.lines
    width = max(len(op) * BOLD_CHAR_WIDTH, len(name) * CHAR_WIDTH, len(vtype) * CHAR_WIDTH)
    return min(max(width + 2 * PAD, NODE_MIN_WIDTH), NODE_MAX_WIDTH), NODE_HEIGHT


def _fit(text: str, width: float, char_width: float, keep_end: bool = False) -> str:
    """``text`` cut with an ellipsis to fit ``width`` pixels; ``keep_end`` keeps its end
    (exported names share long prefixes: ``/encoder/layer.0/attention/self/query/MatMul``)."""
    room = max(int((width - 2 * PAD) / char_width + 1e-6), 3)
    if len(text) <= room:
        return text
    return "\u2026" + text[-(room - 1):] if keep_end else text[:room - 1] + "\u2026"


# ---------------------------------------------------------------------- elements


def _group(impl: KernelImpl, box: Box, members: list[str], colours: tuple[str, str]) -> str:
    fill, stroke = colours
    ops = "+".join(n.op for n in impl.nodes)
    symbol = kernel_symbol(impl.func) if impl.func is not None else ""
    return (f'<rect class="group" id="group-{impl.index}" data-kernel="{impl.index}" '
            f'data-members="{" ".join(members)}" x="{box.x:.1f}" y="{box.y:.1f}" '
            f'width="{box.width:.1f}" height="{box.height:.1f}" rx="10" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.5">'
            f"<title>{escape(f'kernel {impl.index}: {ops} ({symbol})')}</title></rect>"
            f'<text class="group-label" x="{box.x + 8:.1f}" y="{box.y + 12:.1f}" '
            f'fill="{stroke}" font-size="10" font-weight="bold">k{impl.index}</text>')


def _edge(route: Route) -> str:
    (x, y), rest = route.points[0], route.points[1:]
    commands = [f"M{x:.1f},{y:.1f}"]
    for nx, ny in rest:
        if abs(nx - x) < 0.5 or abs(ny - y) < 0.5:
            commands.append(f"L{nx:.1f},{ny:.1f}")
        else:
            middle = (y + ny) / 2
            commands.append(f"C{x:.1f},{middle:.1f} {nx:.1f},{middle:.1f} {nx:.1f},{ny:.1f}")
        x, y = nx, ny
    return (f'<path class="edge" data-source="{route.source}" data-target="{route.target}" '
            f'd="{" ".join(commands)}" fill="none" stroke="{EDGE_COLOUR}" stroke-width="1.2" '
            f'marker-end="url(#arrow)"/>')


def _node(shape: _Shape, box: Box) -> str:
    if shape.kind in ("input", "output"):
        return _terminal(shape, box)
    host = shape.kind == "host"
    fill, stroke = (HOST_FILL, HOST_STROKE) if host else ("#ffffff", "#334155")
    dash = ' stroke-dasharray="5 3"' if host else ""
    op, name, vtype = shape.lines
    cx = box.center_x
    body = [f'<rect class="box" x="{box.x:.1f}" y="{box.y:.1f}" width="{box.width:.1f}" '
            f'height="{box.height:.1f}" rx="4" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="{1.6 if host else 1}"{dash}/>',
            f'<text x="{cx:.1f}" y="{box.y + 15:.1f}" text-anchor="middle" font-size="12" '
            f'font-weight="bold" fill="#0f172a">{escape(_fit(op, box.width, BOLD_CHAR_WIDTH))}'
            f'</text>',
            f'<text x="{cx:.1f}" y="{box.y + 29:.1f}" text-anchor="middle" fill="#334155">'
            f'{escape(_fit(name, box.width, CHAR_WIDTH, keep_end=True))}</text>',
            f'<text x="{cx:.1f}" y="{box.y + 42:.1f}" text-anchor="middle" fill="#64748b" '
            f'font-size="10">{escape(_fit(vtype, box.width, CHAR_WIDTH))}</text>']
    if host:
        body.append(f'<text x="{box.right - 4:.1f}" y="{box.y + 10:.1f}" text-anchor="end" '
                    f'font-size="8" font-weight="bold" fill="{HOST_STROKE}">HOST</text>')
    kernel = f' data-kernel="{shape.kernel}"' if shape.kernel is not None else ""
    link = f"#step-{shape.kernel}" if shape.kernel is not None else "#kernels"
    return (f'<a href="{link}"><g class="node {shape.kind}" id="{shape.key}"{kernel}>'
            f"<title>{escape(shape.tooltip)}</title>{''.join(body)}</g></a>")


def _terminal(shape: _Shape, box: Box) -> str:
    name, vtype = shape.lines
    cx = box.center_x
    return (f'<g class="terminal {shape.kind}" id="{shape.key}">'
            f"<title>{escape(shape.tooltip)}</title>"
            f'<rect class="box" x="{box.x:.1f}" y="{box.y:.1f}" width="{box.width:.1f}" '
            f'height="{box.height:.1f}" rx="{box.height / 2:.1f}" fill="{TERMINAL_FILL}" '
            f'stroke="{TERMINAL_STROKE}"/>'
            f'<text x="{cx:.1f}" y="{box.y + 14:.1f}" text-anchor="middle" font-size="12" '
            f'font-weight="bold" fill="#0f172a">{escape(_fit(name, box.width, BOLD_CHAR_WIDTH))}'
            f'</text><text x="{cx:.1f}" y="{box.y + 27:.1f}" text-anchor="middle" '
            f'font-size="10" fill="#64748b">{escape(_fit(vtype, box.width, CHAR_WIDTH))}</text>'
            f"</g>")
