"""Before/Expected tests of graph passes, written as printed IR.

    assert_pass(simplify, '''
        graph main(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %t = Identity(%x)
          %y = Relu(%t)
        }''', '''
        graph main(%x: f32[2, 3]) -> (%y: f32[2, 3]) {
          %y = Relu(%x)
        }''')

Both texts are parsed (:func:`ember.ir.parser.parse_graph`) and their types inferred; the
pass runs on Before; the result must print like Expected after both are put in a canonical
form, :func:`canonical_text`:

* graph inputs and outputs keep their names: they are the interface;
* every other value is renamed in order of definition -- node outputs ``v0, v1, ...`` in node
  order, constants ``c0, c1, ...`` in order of first use (and listed in that order) -- so
  that the names a pass invents (``w_bn_3``) need not be guessed, while the structure, the
  ops, their attributes, the types and the values of small constants must match exactly;
* node names (the ``# comment``) are ignored, and so are constants nothing reads (removing
  them is dead-code elimination's job, not every pass's);
* the node order must match: a pass that inserts a node decides where, and the test says so.

Subgraph bodies are compared as printed, apart from the renamed enclosing values they read.
"""

from __future__ import annotations

import copy
import difflib
import re
from typing import Callable

from ember.ir.graph import Graph
from ember.ir.parser import parse_graph
from ember.ir.printer import format_graph
from ember.passes.context import GraphPass, PassContext
from ember.passes.infer_shapes import infer_shapes
from ember.passes.rewrite import rename_reads
from ember.passes.verify import verify_graph

PassLike = GraphPass | Callable[[Graph], int]


def assert_pass(pass_: PassLike, before: str, expected: str, *,
                changed: int | None = None, values: bool = True) -> Graph:
    """Run ``pass_`` on the graph ``before`` and compare with ``expected`` (canonically);
    ``changed`` checks what the pass reported.  ``values=False`` compares constants by type
    only, for passes that compute new weights (check those numerically).  Returns the
    rewritten graph."""
    graph = parse_graph(before)
    infer_shapes(graph)
    verify_graph(graph, stage="before the pass under test")
    count = run_pass(pass_, graph)
    if count:
        infer_shapes(graph)
    verify_graph(graph, stage="after the pass under test")
    wanted = parse_graph(expected)
    infer_shapes(wanted)
    actual_text = canonical_text(graph, values=values)
    expected_text = canonical_text(wanted, values=values)
    if actual_text != expected_text:
        diff = "\n".join(difflib.unified_diff(expected_text.splitlines(),
                                              actual_text.splitlines(), "expected", "actual",
                                              lineterm=""))
        raise AssertionError(f"the pass produced another graph:\n{diff}\n\nactual:\n"
                             f"{format_graph(graph)}")
    if changed is not None and count != changed:
        raise AssertionError(f"the pass reported {count} changes, expected {changed}")
    return graph


def assert_unchanged(pass_: PassLike, text: str) -> Graph:
    """The pass leaves ``text`` as it is and says so (reports 0 changes)."""
    return assert_pass(pass_, text, text, changed=0)


def run_pass(pass_: PassLike, graph: Graph, ctx: PassContext | None = None) -> int:
    """Run a GraphPass or a plain ``fn(graph) -> int`` pass."""
    if isinstance(pass_, GraphPass):
        return int(pass_.run(graph, ctx or PassContext()) or 0)
    return int(pass_(graph) or 0)


def canonical_text(graph: Graph, *, values: bool = True) -> str:
    """``graph`` printed with canonical value names and no node names (see the module doc);
    without ``values`` constants print as types only."""
    graph = copy.deepcopy(graph)
    interface = set(graph.inputs) | set(graph.outputs)
    taken = set(interface)

    def fresh(prefix: str, number: int) -> str:
        name = f"{prefix}{number}"
        while name in taken:
            name = "_" + name
        taken.add(name)
        return name

    mapping: dict[str, str] = {}
    for node in graph.nodes:
        for name in node.inputs + node.implicit_inputs():
            if name in graph.constants and name not in mapping and name not in interface:
                mapping[name] = fresh("c", sum(1 for v in mapping.values()
                                               if v.lstrip("_").startswith("c")))
        for name in node.outputs:
            if name and name not in interface:
                mapping[name] = fresh("v", sum(1 for v in mapping.values()
                                               if v.lstrip("_").startswith("v")))
        node.name = ""
    read = set(mapping) | interface
    graph.constants = {n: a for n, a in graph.constants.items() if n in read}
    rename_reads(graph, mapping)
    for node in graph.nodes:
        node.outputs = [mapping.get(o, o) for o in node.outputs]
    order = sorted(graph.constants, key=lambda n: (n not in mapping,
                                                   list(mapping).index(n) if n in mapping
                                                   else 0))
    graph.constants = {mapping.get(n, n): graph.constants[n] for n in order}
    graph.types = {mapping.get(n, n): t for n, t in graph.types.items()}
    text = format_graph(graph)
    if not values:
        text = re.sub(r"^(\s*const [^\n]*?) = [^\n]*$", r"\1", text, flags=re.M)
    return text


__all__ = ["assert_pass", "assert_unchanged", "canonical_text", "run_pass"]
