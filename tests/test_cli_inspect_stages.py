"""``ember inspect --stages``: passes, kernels, memory plan, a kernel's C, the HTML page.

Run in-process on small models made with onnx.helper (each compiles in well under a second):
a residual block ``Gemm+Gelu+Add`` that fuses into one kernel, an Einsum that has no compute
definition (a host fallback), and ``Mul+Relu`` after it.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.cli import main
from ember.driver import BuildOptions
from ember.frontend.onnx import import_onnx
from ember.inspect import FunctionNotFound, collect_stages, extract_c_function
from ember.inspect.layout import Box, layered_layout
from ember.passes.pipeline import passes_for

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(11)
SCRIPT_NAME = "<script>alert(1)</script>"
ATTRIBUTE_BREAKER = '"><img src=x onerror=alert(1)>'

# fusion is the last pass of the default pipeline; the stages number passes from 0
FUSE_INDEX = len(passes_for(2)) - 1


def _model(tmp_path, names=("gemm", "gelu", "residual", "einsum", "square", "relu"),
           batch="N", file_name="model.onnx", value="r"):
    """x: f32[batch, 32] -> Gemm+Gelu+Add(x) -> Einsum (host) -> Mul(e, e) -> Relu; ``value``
    names the output of the Add, which lives in the workspace."""
    gemm, gelu, residual, einsum, square, relu = names
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], transB=1, name=gemm),
             helper.make_node("Gelu", ["h"], ["a"], name=gelu),
             helper.make_node("Add", ["a", "x"], [value], name=residual),
             # a diagonal of W2 (the repeated j): an Einsum that lower_einsum leaves alone
             helper.make_node("Einsum", [value, "W2"], ["e"], equation="ij,jjk->ik",
                              name=einsum),
             helper.make_node("Mul", ["e", "e"], ["m"], name=square),
             helper.make_node("Relu", ["m"], ["y"], name=relu)]
    weights = {"W": RNG.standard_normal((32, 32)), "b": RNG.standard_normal(32),
               "W2": RNG.standard_normal((32, 32, 8))}
    graph = helper.make_graph(
        nodes, "stages", [helper.make_tensor_value_info("x", F32, [batch, 32])],
        [helper.make_tensor_value_info("y", F32, None)],
        initializer=[numpy_helper.from_array(w.astype(np.float32), n)
                     for n, w in weights.items()])
    path = tmp_path / file_name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def _stages(path, batch=4):
    return collect_stages(import_onnx(path), {"x": (batch, 32)}, BuildOptions())


# ---------------------------------------------------------------------- terminal


def test_stages_list_every_pass_the_kernels_and_the_memory_plan(tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # table cells unfolded
    status, out, err = _run(capsys, "inspect", _model(tmp_path), "--stages", "--dim", "N=4")
    assert status == 0 and err == "", err
    passes = out[out.index("Graph passes"):out.index("Kernels:")]
    for graph_pass in passes_for(2):
        assert f" {graph_pass.name} " in passes, graph_pass.name
    kernels = out[out.index("Kernels:"):out.index("Memory plan")]
    assert "k0_gemm_fused" in kernels and "Gemm+Gelu+Add" in kernels
    assert "gemm, gelu, residual" in kernels
    assert "host fallback: op has no compute definition yet" in kernels
    assert "Mul+Relu" in kernels
    # the values between steps: r (Gemm+Gelu+Add -> Einsum) and e (Einsum -> Mul+Relu)
    memory = out[out.index("Memory plan"):]
    assert "workspace 640 B" in memory and "naive (no reuse) 640 B" in memory
    assert "0 -> 1" in memory and "1 -> 2" in memory
    # a small graph: the IR after each pass that changed it (here, fusion's kernel list)
    assert f"after pass {FUSE_INDEX} fuse" in out and "# kernel 0: 3 node(s), Gemm+Gelu+Add" in out


def test_opt_level_0_runs_no_pass_and_compiles_node_by_node(tmp_path, capsys):
    status, out, err = _run(capsys, "inspect", _model(tmp_path), "--stages", "--dim", "N=4",
                            "--opt-level", "0", "--no-ir")
    assert status == 0, err
    assert "opt level 0" in out and "fold_constants" not in out
    assert "k0_gemm " in out and "k1_gelu " in out and "Gemm+Gelu" not in out


def test_opt_level_needs_stages(tmp_path, capsys):
    status, out, err = _run(capsys, "inspect", _model(tmp_path), "--opt-level", "1")
    assert status == 2 and out == "" and "--stages" in err


def test_unbound_symbolic_dims_are_named_before_anything_is_printed(tmp_path, capsys):
    html_path = tmp_path / "page.html"
    status, out, err = _run(capsys, "inspect", _model(tmp_path), "--stages", "--html",
                            html_path)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and "'N'" in err and "input 'x'" in err
    assert "--dim N=SIZE" in err
    assert not html_path.exists()


# ---------------------------------------------------------------------- kernel C


def test_kernel_prints_its_c_function_as_compiled(tmp_path, capsys):
    model = _model(tmp_path)
    stages = _stages(model)
    kernel = stages.kernels[0]
    source = stages.kernel_source(kernel)
    # kernels are compiled as units of their own, under the symbol of their unit
    link = stages.build.kernel_definition_symbol(kernel.symbol)
    assert link.startswith("ember_k_")
    assert source.startswith(f"EMBER_INTERNAL void {link}(") and source.endswith("}")
    assert source.count("{") == source.count("}")
    assert source in stages.build.source
    for selector in ("0", "gelu", kernel.symbol):  # index, a member node's name, the symbol
        status, out, err = _run(capsys, "inspect", model, "--kernel", selector, "--dim", "N=4",
                                "--no-ir")
        assert status == 0, err
        assert f"kernel 0: {kernel.symbol} (Gemm+Gelu+Add; nodes gemm, gelu, residual)" in out
        assert source in out
    status, out, err = _run(capsys, "inspect", model, "--stages", "--dim", "N=4", "--no-ir")
    assert "static void" not in out  # without --kernel: the list only


def test_kernel_shows_its_loop_ir_after_every_loop_stage_and_its_config(tmp_path, capsys):
    from ember.schedule.pipeline import LOOP_STAGES

    model = _model(tmp_path)
    status, out, err = _run(capsys, "inspect", model, "--kernel", "0", "--dim", "N=4", "--no-ir")
    assert status == 0, err
    headings = [line for line in out.splitlines() if line.startswith("loop IR after ")]
    assert [h.split()[3].rstrip(":") for h in headings] == \
        ["lower"] + [stage.name for stage in LOOP_STAGES]
    # the lowered kernel is printed, and the GEMM template replaced its product
    lowered = out[out.index("loop IR after lower:"):out.index("loop IR after gemm_template")]
    assert "func k0_" in lowered and "gemm 4x" not in lowered
    assert "loop IR after gemm_template (changed" in out and "gemm 4x32x32" in out
    assert "workload key " in out and "gemm0.tile=" in out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_extracted_kernel_is_a_complete_c_function(tmp_path):
    """Everything before the function in its translation unit, then the function alone: it
    compiles only if the extraction ends exactly at the function's closing brace."""
    stages = _stages(_model(tmp_path))
    for kernel in stages.kernels:
        if kernel.symbol is None:
            continue
        function = stages.kernel_source(kernel)
        source, = [unit.source for unit in stages.build.units.kernels if function in unit.source]
        start = source.index(function)
        unit = tmp_path / f"{kernel.symbol}.c"
        unit.write_text(source[:start] + function + "\n")
        result = subprocess.run(["gcc", "-std=gnu11", "-fsyntax-only", str(unit)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


def test_kernel_selectors_that_name_nothing_or_a_host_step(tmp_path, capsys):
    model = _model(tmp_path)
    status, out, err = _run(capsys, "inspect", model, "--kernel", "9", "--dim", "N=4")
    assert status == 2 and "kernels 0 to 2" in err
    status, out, err = _run(capsys, "inspect", model, "--kernel", "nowhere", "--dim", "N=4")
    assert status == 2 and "'nowhere'" in err
    status, out, err = _run(capsys, "inspect", model, "--kernel", "einsum", "--dim", "N=4")
    assert status == 2 and "host fallback" in err and "no compute definition" in err


def test_extract_c_function_skips_strings_comments_calls_and_prototypes():
    source = (
        '#define OPEN {\n'
        'static void kern(float *x);\n'                        # a prototype
        'const char *text(void) { return "kern(x) { }}"; }\n'  # braces in a string
        'static void\n'
        'kern(float *x)  /* { */ {\n'                          # return type on its own line
        "  char c = '}';\n"
        '  if (x) { x[0] = 1; } // }\n'
        '}\n'
        'int run(void) { kern(0); return 0; }\n')               # a call
    assert extract_c_function(source, "kern") == (
        "static void\nkern(float *x)  /* { */ {\n  char c = '}';\n"
        "  if (x) { x[0] = 1; } // }\n}")
    assert extract_c_function(source, "run") == "int run(void) { kern(0); return 0; }"
    with pytest.raises(FunctionNotFound):
        extract_c_function(source, "missing")


# ---------------------------------------------------------------------- HTML


class _Elements(HTMLParser):
    """Every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def all(self, tag, css_class=None):
        return [a for t, a in self.tags if t == tag and
                (css_class is None or css_class in a.get("class", "").split())]


def _parse(path):
    parser = _Elements()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def _box(attrs):
    return Box(float(attrs["x"]), float(attrs["y"]), float(attrs["width"]),
               float(attrs["height"]))


def _graph_edges(graph):
    """The edges between drawn things, computed here independently: graph inputs, nodes and
    graph outputs; a constant is not drawn; two values between the same pair are one edge."""
    producer = {name: ("input", name) for name in graph.inputs}
    for index, node in enumerate(graph.nodes):
        for name in node.outputs:
            producer[name] = ("node", index)
    edges = {(producer[name], ("node", index)) for index, node in enumerate(graph.nodes)
             for name in node.inputs if name in producer}
    edges |= {(producer[name], ("output", name)) for name in graph.outputs if name in producer}
    return edges


def test_html_page_draws_groups_edges_and_host_fallbacks(tmp_path, capsys):
    model = _model(tmp_path)
    page = tmp_path / "stages.html"
    status, out, err = _run(capsys, "inspect", model, "--html", page, "--dim", "N=4", "--no-ir")
    assert status == 0, err
    assert f"wrote the stages as HTML to {page}" in out
    text = page.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    parsed = _parse(page)
    assert not parsed.all("script") and not parsed.all("link") and not parsed.all("img")
    assert not any("src" in attrs for _, attrs in parsed.tags)  # nothing to fetch

    stages = _stages(model)
    fused = [k for k in stages.kernels if k.fused]
    groups = parsed.all("rect", "group")
    assert len(groups) == len(fused) == 2
    nodes = {attrs["id"]: attrs for attrs in parsed.all("g", "node")}
    boxes = {}  # drawn id (node, input, output) -> the first rect.box inside its <g>
    for i, (tag, attrs) in enumerate(parsed.tags):
        if tag == "g" and attrs.get("id"):
            box = next(a for t, a in parsed.tags[i:] if t == "rect" and a.get("class") == "box")
            boxes[attrs["id"]] = _box(box)
    assert len(boxes) == len(stages.graph.nodes) + 2  # and the input x, the output y
    for group, kernel in zip(groups, fused):
        assert int(group["data-kernel"]) == kernel.index
        members = group["data-members"].split()
        expected = [f"n{i}" for i, node in enumerate(stages.graph.nodes)
                    if any(node is member for member in kernel.impl.nodes)]
        assert members == expected
        outline = _box(group)
        for node_id in members:
            assert nodes[node_id]["data-kernel"] == str(kernel.index)
            assert outline.contains(boxes[node_id])
        others = [b for key, b in boxes.items() if key not in members]
        assert not any(outline.overlaps(b) for b in others)

    edges = parsed.all("path", "edge")
    assert len(edges) == len(_graph_edges(stages.graph)) == 8
    drawn = set(boxes)
    assert all(e["data-source"] in drawn and e["data-target"] in drawn for e in edges)
    host = parsed.all("g", "host")
    assert len(host) == 1 and host[0]["id"] == "n3"  # the Einsum

    # the rest of the page: a diff per pass that changed something, the kernel table, the C
    assert f'id="pass-{FUSE_INDEX}"' in text and "Gemm+Gelu+Add" in text
    assert len(parsed.all("tr", "kernel")) == 2 and len(parsed.all("tr", "host")) == 1
    assert html.escape(stages.kernel_source(stages.kernels[0]), quote=True) in text


def test_model_text_is_escaped_everywhere(tmp_path, capsys):
    names = ("gemm", SCRIPT_NAME, ATTRIBUTE_BREAKER, "einsum", "square", "relu")
    model = _model(tmp_path, names, file_name="<svg onload=alert(1)>.onnx",
                   value=f"r{SCRIPT_NAME}")
    page = tmp_path / "page.html"
    status, out, err = _run(capsys, "inspect", model, "--html", page, "--dim", "N=4",
                            "--kernel", SCRIPT_NAME)
    assert status == 0, err
    assert SCRIPT_NAME in out  # the terminal shows names as they are
    text = page.read_text(encoding="utf-8")
    for raw in ("<script", "<img", "<svg onload"):
        assert raw not in text.lower(), raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in text
    parsed = _parse(page)
    assert not parsed.all("script") and not parsed.all("img")
    assert not any(key.startswith("on") for _, attrs in parsed.tags for key in attrs)


# ---------------------------------------------------------------------- layout


def _random_dag(rng, size):
    names = [f"v{i}" for i in range(size)]
    edges = [(names[j], names[i]) for i in range(1, size)
             for j in rng.choice(i, size=min(i, int(rng.integers(1, 3))), replace=False)]
    return names, edges


@pytest.mark.parametrize("seed", range(4))
def test_layout_keeps_blocks_apart_and_edges_pointing_down(seed):
    rng = np.random.default_rng(seed)
    names, edges = _random_dag(rng, 40)
    sizes = {n: (float(rng.integers(60, 200)), 48.0) for n in names}
    # blocks: chains of consecutive nodes joined by an edge (convex, as fused groups are)
    blocks, used = [], set()
    for source, target in edges:
        if source not in used and target not in used and len(blocks) < 6 and \
                not any(s == source and t != target for s, t in edges):
            blocks.append([source, target])
            used |= {source, target}
    layout = layered_layout(sizes, edges, blocks, top=["v0"])
    boxes = layout.nodes
    for a in names:
        assert (boxes[a].width, boxes[a].height) == sizes[a]
        for b in names:
            assert a == b or not boxes[a].overlaps(boxes[b]), (a, b)
    for members, outline in zip(blocks, layout.blocks):
        assert all(outline.contains(boxes[m]) for m in members)
        assert not any(outline.overlaps(boxes[n]) for n in names if n not in members)
    assert {(r.source, r.target) for r in layout.edges} == set(edges)
    for route in layout.edges:
        ys = [y for _, y in route.points]
        assert ys == sorted(ys), route  # every edge runs downwards
        assert boxes[route.source].y < ys[0] <= boxes[route.source].bottom
        assert boxes[route.target].y <= ys[-1] < boxes[route.target].bottom
    assert layout.width >= max(b.right for b in boxes.values())


def test_layout_of_blocks_that_would_make_a_cycle_still_encloses_them():
    # a -> b -> c with {a, c} bound together: no order of blocks exists, so the nodes are
    # laid out one by one and the block is drawn around its members
    sizes = {n: (80.0, 40.0) for n in "abc"}
    layout = layered_layout(sizes, [("a", "b"), ("b", "c")], [["a", "c"]])
    outline = layout.blocks[0]
    assert outline.contains(layout.nodes["a"]) and outline.contains(layout.nodes["c"])
    assert layout.nodes["a"].bottom <= layout.nodes["b"].y < layout.nodes["c"].y
