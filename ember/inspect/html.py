"""``ember inspect --stages --html OUT``: every stage of a compilation on one HTML page.

The page is self-contained -- inline CSS and SVG, no script at all, nothing fetched -- so it
can be mailed, attached to a bug report or opened offline; a Content-Security-Policy that
forbids scripts and every external load backs that up.  Sections: the compiled graph (SVG, see
:mod:`ember.inspect.svg`), the graph after each pass (the changes as a diff, the whole IR in a
collapsed ``<details>``), the kernels with their generated C, and the memory plan.

All model text is untrusted and goes through :func:`ember.inspect.svg.escape`.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ember.inspect.stages import KernelStage, MemoryStage, PassStage, Stages
from ember.inspect.svg import HOST_FILL, HOST_STROKE, PALETTE, escape, render_svg

# Scripts, frames, fonts, images from anywhere: none.  Only the inline style is allowed.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
DIFF_CONTEXT = 1
ARENA_WIDTH, ARENA_HEIGHT = 900.0, 260.0

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 1.5em 3em;
       color: #0f172a; background: #f8fafc; }
header { position: sticky; top: 0; background: #f8fafc; padding: .6em 0 .4em;
         border-bottom: 1px solid #cbd5e1; z-index: 1; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { margin-top: 1.6em; font-size: 1.15em; }
nav a { margin-right: 1.2em; }
pre, code { font: 12px/1.4 ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace; }
pre { background: #fff; border: 1px solid #e2e8f0; padding: .6em; overflow: auto;
      max-height: 32em; }
.scroll { overflow: auto; max-height: 85vh; border: 1px solid #cbd5e1; background: #fff; }
table { border-collapse: collapse; background: #fff; margin: .4em 0; }
th, td { border: 1px solid #e2e8f0; padding: .2em .6em; text-align: left; vertical-align: top; }
th { background: #f1f5f9; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.unchanged { color: #94a3b8; } tr.host { background: #fef2f2; }
details { margin: .3em 0; } summary { cursor: pointer; }
.add { color: #166534; background: #dcfce7; display: block; }
.del { color: #991b1b; background: #fee2e2; display: block; }
.hunk { color: #6366f1; display: block; }
.legend span.swatch { display: inline-block; width: 1.1em; height: .9em; margin: 0 .3em 0 1em;
                      vertical-align: middle; border: 1px solid #475569; border-radius: 3px; }
.bar { height: 1.1em; background: #93c5fd; display: inline-block; vertical-align: middle; }
"""


def render_html(stages: Stages, title: str) -> str:
    """The whole page."""
    sections = [_summary(stages), _graph_section(stages), _passes_section(stages),
                _kernels_section(stages), _memory_section(stages.memory, len(stages.kernels))]
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(f'ember stages: {title}')}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<header><h1>{escape(title)}: compilation stages</h1>",
        '<nav><a href="#graph">Graph</a><a href="#passes">Passes</a>'
        '<a href="#kernels">Kernels</a><a href="#memory">Memory</a></nav></header>',
        *sections,
        "</body></html>",
    ])


def write_html(stages: Stages, path: Path, title: str) -> Path:
    path = Path(path)
    path.write_text(render_html(stages, title), encoding="utf-8")
    return path


# ---------------------------------------------------------------------- sections


def _summary(stages: Stages) -> str:
    return (f'<section id="summary"><p>{escape(f"opt level {stages.opt_level}: {stages.pipeline}")}'
            f"</p><pre>{escape(stages.build.report())}</pre></section>")


def _graph_section(stages: Stages) -> str:
    fused = sum(1 for kernel in stages.kernels if kernel.fused)
    swatches = "".join(f'<span class="swatch" style="background:{fill};border-color:{stroke}">'
                       f"</span>" for fill, stroke in PALETTE[:min(fused, 5)])
    legend = (f'<p class="legend">{len(stages.graph.nodes)} nodes in '
              f"{len(stages.kernels)} steps.{swatches}"
              f"{' fused kernels (one colour each)' if fused else ''}"
              f'<span class="swatch" style="background:{HOST_FILL};border-color:{HOST_STROKE};'
              f'border-style:dashed"></span> host (numpy) fallback. Hover a node for its '
              f"inputs and outputs; click it for its step.</p>")
    return (f'<section id="graph"><h2>Compiled graph</h2>{legend}'
            f'<div class="scroll">{render_svg(stages.graph, stages.build.impls)}</div>'
            f"</section>")


def _passes_section(stages: Stages) -> str:
    rows = []
    for stage in stages.passes:
        name = (f'<a href="#pass-{stage.position}">{escape(stage.name)}</a>' if stage.ir
                else escape(stage.name))
        rows.append(f'<tr class="{"changed" if stage.changed else "unchanged"}">'
                    f'<td class="num">{stage.position}</td><td>{name}</td>'
                    f'<td class="num">{stage.changed}</td>'
                    f'<td class="num">{stage.seconds * 1e3:.2f}</td>'
                    f'<td class="num">{stage.check_seconds * 1e3:.2f}</td></tr>')
    table = ("<table><tr><th>#</th><th>pass</th><th>changed</th><th>ms</th>"
             "<th>infer + verify ms</th></tr>" + "".join(rows) + "</table>") if rows else \
        "<p>No graph passes at this opt level: every node is compiled as imported.</p>"
    details = [f"<details><summary>input graph (specialized to the input shapes)</summary>"
               f"<pre>{escape(stages.input_ir)}</pre></details>"]
    previous = stages.input_ir
    for stage in stages.passes:
        if stage.ir is None:
            continue
        details.append(_pass_details(stage, previous))
        previous = stage.ir
    return (f'<section id="passes"><h2>Graph passes ({escape(stages.pipeline)})</h2>{table}'
            + "".join(details) + "</section>")


def _pass_details(stage: PassStage, previous: str) -> str:
    assert stage.ir is not None
    return (f'<details class="pass" id="pass-{stage.position}"><summary>'
            f"{escape(f'{stage.position}. {stage.name}: {stage.changed} change(s), ')}"
            f"{stage.seconds * 1e3:.2f} ms</summary>"
            f'<pre class="diff">{_diff(previous, stage.ir)}</pre>'
            f"<details><summary>graph after {escape(stage.name)}</summary>"
            f"<pre>{escape(stage.ir)}</pre></details></details>")


def _diff(before: str, after: str) -> str:
    lines = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="",
                                     n=DIFF_CONTEXT):
        if line.startswith(("---", "+++")):
            continue
        css = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1])
        text = escape(line)
        lines.append(f'<span class="{css}">{text}</span>' if css else text + "\n")
    return "".join(lines) or "(the printed graph is the same)"


def _kernels_section(stages: Stages) -> str:
    rows, sources = [], []
    for kernel in stages.kernels:
        rows.append(_kernel_row(kernel))
        if kernel.symbol is not None:
            sources.append(f'<details id="c-{kernel.index}"><summary>'
                           f"{escape(f'step {kernel.index}: {kernel.symbol} ({kernel.ops})')}"
                           f"</summary><pre>{escape(stages.kernel_source(kernel))}</pre>"
                           f"</details>")
    return ('<section id="kernels"><h2>Kernels</h2>'
            "<table><tr><th>step</th><th>kind</th><th>C symbol</th><th>ops</th><th>nodes</th>"
            "<th>note</th></tr>" + "".join(rows) + "</table><h3>Generated C</h3>"
            + "".join(sources) + "</section>")


def _kernel_row(kernel: KernelStage) -> str:
    symbol = (f'<a href="#c-{kernel.index}"><code>{escape(kernel.symbol)}</code></a>'
              if kernel.symbol else "-")
    note = escape(kernel.reason) if kernel.kind == "host" else (
        "fused" if kernel.fused else "")
    return (f'<tr id="step-{kernel.index}" class="{escape(kernel.kind)}">'
            f'<td class="num">{kernel.index}</td><td>{escape(kernel.kind)}</td>'
            f"<td>{symbol}</td><td>{escape(kernel.ops)}</td>"
            f"<td>{escape(', '.join(kernel.nodes))}</td><td>{note}</td></tr>")


def _memory_section(memory: MemoryStage, steps: int) -> str:
    largest = max(memory.naive_bytes, memory.workspace_size, memory.peak_live_bytes, 1)
    bars = "".join(
        f"<tr><td>{label}</td><td class=\"num\">{value:,} B</td><td>"
        f'<span class="bar" style="width:{400 * value / largest:.0f}px"></span></td></tr>'
        for label, value in (("workspace (planned)", memory.workspace_size),
                             ("peak live (least possible)", memory.peak_live_bytes),
                             ("naive (no reuse)", memory.naive_bytes)))
    rows = "".join(
        f"<tr><td><code>{escape(v.name)}</code></td><td class=\"num\">{v.offset:,}</td>"
        f'<td class="num">{v.size:,}</td><td class="num">{v.first} &#8594; {v.last}</td>'
        f"<td>{'<code>' + escape(v.reuses) + '</code>' if v.reuses else ''}</td></tr>"
        for v in memory.values)
    values = ("<table><tr><th>value</th><th>offset</th><th>bytes</th><th>steps</th>"
              "<th>written over (in place)</th></tr>" + rows + "</table>") if rows else \
        "<p>No value lives between kernels: the workspace holds kernel scratch only.</p>"
    return (f'<section id="memory"><h2>Memory plan</h2><p>{escape(memory.summary)}</p>'
            f"<table>{bars}</table>{_arena(memory, steps)}{values}</section>")


def _arena(memory: MemoryStage, steps: int) -> str:
    """Each value as a rectangle: its steps across, its bytes of the workspace down."""
    if not memory.values or memory.workspace_size <= 0:
        return ""
    sx = ARENA_WIDTH / max(steps, 1)
    sy = ARENA_HEIGHT / memory.workspace_size
    rects = []
    for number, value in enumerate(memory.values):
        fill, stroke = PALETTE[number % len(PALETTE)]
        tip = (f"{value.name}: offset {value.offset:,}, {value.size:,} B, steps {value.first}"
               f" to {value.last}" + (f", in place of {value.reuses}" if value.reuses else ""))
        rects.append(f'<rect x="{value.first * sx:.1f}" y="{value.offset * sy:.1f}" '
                     f'width="{max((value.last - value.first + 1) * sx, 1):.1f}" '
                     f'height="{max(value.size * sy, 1):.1f}" fill="{fill}" stroke="{stroke}">'
                     f"<title>{escape(tip)}</title></rect>")
    return (f"<p>The workspace over the steps of ember_run (across: steps 0 to {steps - 1}; "
            f"down: offset 0 to {memory.workspace_size:,} B):</p>"
            f'<svg xmlns="http://www.w3.org/2000/svg" class="arena" width="{ARENA_WIDTH:.0f}" '
            f'height="{ARENA_HEIGHT:.0f}" style="background:#fff;border:1px solid #cbd5e1">'
            + "".join(rects) + "</svg>")
