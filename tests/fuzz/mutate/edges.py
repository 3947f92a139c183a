"""Mutations of the dataflow (``edge``): dangling and missing values, self-loops, cycles,
nodes out of order, two producers of one value, outputs nobody produces, wrong arities.

These break the graph invariants (SSA, topological order, every use defined) that every
later pass assumes; a verifier that misses one turns into a KeyError or an infinite loop far
away from the cause.
"""

from __future__ import annotations

import random

import onnx
from onnx import TensorProto, helper

from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick
from fuzz.mutate.walk import NodeSite, graphs, node_sites


def _with_inputs(model: onnx.ModelProto) -> list[NodeSite]:
    return [s for s in node_sites(model) if any(s.node.input)]


def _input_index(site: NodeSite, rng: random.Random) -> int:
    return pick(rng, [i for i, name in enumerate(site.node.input) if name], "node input")


def _missing_input(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _with_inputs(model), "node with inputs")
    index = _input_index(site, rng)
    old = site.node.input[index]
    site.node.input[index] = "fuzz_missing"
    return f"{site.label} input {index} '{old}' -> 'fuzz_missing' (defined nowhere)"


def _self_loop(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, [s for s in _with_inputs(model) if any(s.node.output)], "node")
    index = _input_index(site, rng)
    site.node.input[index] = site.node.output[0]
    return f"{site.label} input {index} is its own output '{site.node.output[0]}'"


def _back_edge(model: onnx.ModelProto, rng: random.Random) -> str:
    """Make an earlier node read a later node's output: a cycle when the later node depends
    on the earlier one (always, in the seeds' chains), else an out-of-order use."""
    candidates = [(label, graph) for label, graph in graphs(model) if len(graph.node) >= 2]
    label, graph = pick(rng, candidates, "graph with two nodes")
    later = rng.randrange(1, len(graph.node))
    earlier = rng.randrange(0, later)
    node = graph.node[earlier]
    if not any(node.input):
        raise NotApplicable("earlier node has no input")
    index = pick(rng, [i for i, name in enumerate(node.input) if name])
    node.input[index] = graph.node[later].output[0]
    return (f"{label}: node {earlier} '{node.name}' input {index} <- output of later node "
            f"{later} '{graph.node[later].name}' (cycle)")


def _swap_order(model: onnx.ModelProto, rng: random.Random) -> str:
    candidates = [(label, graph) for label, graph in graphs(model) if len(graph.node) >= 2]
    label, graph = pick(rng, candidates, "graph with two nodes")
    i, j = sorted(rng.sample(range(len(graph.node)), 2))
    first, second = onnx.NodeProto(), onnx.NodeProto()
    first.CopyFrom(graph.node[i])
    second.CopyFrom(graph.node[j])
    graph.node[i].CopyFrom(second)
    graph.node[j].CopyFrom(first)
    return f"{label}: nodes {i} '{first.name}' and {j} '{second.name}' swapped (not topological)"


def _reverse_order(model: onnx.ModelProto, rng: random.Random) -> str:
    nodes = list(model.graph.node)
    if len(nodes) < 2:
        raise NotApplicable("fewer than two nodes")
    copies = []
    for node in reversed(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copies.append(copy)
    del model.graph.node[:]
    model.graph.node.extend(copies)
    return "main graph nodes in reverse order"


def _two_producers(model: onnx.ModelProto, rng: random.Random) -> str:
    candidates = [(label, graph) for label, graph in graphs(model) if len(graph.node) >= 2]
    label, graph = pick(rng, candidates, "graph with two nodes")
    i, j = rng.sample(range(len(graph.node)), 2)
    old = graph.node[j].output[0]
    graph.node[j].output[0] = graph.node[i].output[0]
    return (f"{label}: node '{graph.node[j].name}' output '{old}' renamed to "
            f"'{graph.node[i].output[0]}' (two producers)")


def _shadow_input(model: onnx.ModelProto, rng: random.Random) -> str:
    """A node output named like a graph input or initializer: two definitions."""
    graph = model.graph
    defined = [vi.name for vi in graph.input] + [t.name for t in graph.initializer]
    site = pick(rng, [s for s in node_sites(model) if s.where == "main"], "main-graph node")
    name = pick(rng, defined, "input or initializer")
    old = site.node.output[0]
    site.node.output[0] = name
    return f"{site.label} output '{old}' renamed to input/initializer '{name}'"


def _ghost_output(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    if rng.random() < 0.5 and graph.output:
        old = graph.output[0].name
        graph.output[0].name = "fuzz_ghost"
        return f"graph output '{old}' renamed to 'fuzz_ghost' (nobody produces it)"
    graph.output.append(helper.make_tensor_value_info("fuzz_ghost", TensorProto.FLOAT, [1]))
    return "extra graph output 'fuzz_ghost' that nobody produces"


def _output_is_input(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    sources = list(graph.input) + [helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                   for t in graph.initializer]
    source = pick(rng, sources, "graph input or initializer")
    graph.output.append(source)
    return f"graph output is the graph input/initializer '{source.name}' itself (valid)"


def _duplicate_graph_output(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    if not graph.output:
        raise NotApplicable("no outputs")
    graph.output.append(graph.output[0])
    return f"graph output '{graph.output[0].name}' listed twice"


def _dangling_node(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    source = pick(rng, [vi.name for vi in graph.input] or list(graph.output), "value")
    op = pick(rng, ["Relu", "FuzzNoSuchOp"])
    graph.node.append(helper.make_node(op, [source], ["fuzz_unused"], name="fuzz_dangling"))
    return f"extra {op} node on '{source}' whose output nobody uses"


def _no_output_node(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, node_sites(model), "node")
    removed = list(site.node.output)
    del site.node.output[:]
    return f"{site.label} has no outputs (was {removed})"


def _remove_node(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, node_sites(model), "node")
    label = site.label
    site.container.remove(site.node)
    return f"{label} removed (its outputs are now undefined)"


def _duplicate_node(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, node_sites(model), "node")
    twin = onnx.NodeProto()
    twin.CopyFrom(site.node)
    site.container.append(twin)
    return f"{site.label} appears twice (same outputs)"


def _remove_graph_input(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    runtime = [vi for vi in graph.input if vi.name not in initializers]
    victim = pick(rng, runtime, "run-time input")
    name = victim.name
    graph.input.remove(victim)
    return f"graph input '{name}' removed (still used)"


def _duplicate_graph_input(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    if not graph.input:
        raise NotApplicable("no inputs")
    graph.input.append(graph.input[0])
    return f"graph input '{graph.input[0].name}' listed twice"


def _drop_initializer(model: onnx.ModelProto, rng: random.Random) -> str:
    label, graph = pick(rng, [(lb, g) for lb, g in graphs(model) if g.initializer],
                        "graph with initializers")
    victim = pick(rng, list(graph.initializer))
    name = victim.name
    graph.initializer.remove(victim)
    return f"{label} initializer '{name}' removed (still used)"


def _initializer_as_input(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    tensor = pick(rng, list(graph.initializer), "initializer")
    graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                     list(tensor.dims)))
    return f"initializer '{tensor.name}' also listed as a graph input (a default; valid)"


def _empty_required_input(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _with_inputs(model), "node with inputs")
    index = _input_index(site, rng)
    site.node.input[index] = ""
    return f"{site.label} input {index} is '' (absent)"


def _extra_input(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _with_inputs(model), "node with inputs")
    site.node.input.append(site.node.input[_input_index(site, rng)])
    return f"{site.label} gets an extra input (now {len(site.node.input)})"


def _drop_last_input(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _with_inputs(model), "node with inputs")
    del site.node.input[-1]
    return f"{site.label} loses its last input (now {len(site.node.input)})"


def _extra_output(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, node_sites(model), "node")
    site.node.output.append("fuzz_extra_output")
    return f"{site.label} declares an extra output 'fuzz_extra_output'"


def _subgraph_forward_reference(model: onnx.ModelProto, rng: random.Random) -> str:
    """A subgraph reads an outer value that is produced only after the node owning it."""
    sub_graphs = [(label, g) for label, g in graphs(model) if label != "main" and g.node]
    label, graph = pick(rng, sub_graphs, "subgraph")
    later = model.graph.node[-1].output[0]
    node = graph.node[0]
    if not node.input:
        raise NotApplicable("the subgraph's first node has no input")
    node.input[0] = later
    return f"{label}: node '{node.name}' reads '{later}', produced later in the outer graph"


def mutate_edges(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "missing-input": _missing_input, "self-loop": _self_loop, "cycle": _back_edge,
        "swap-order": _swap_order, "reverse-order": _reverse_order,
        "two-producers": _two_producers, "shadow-input": _shadow_input,
        "ghost-output": _ghost_output, "output-is-input": _output_is_input,
        "duplicate-graph-output": _duplicate_graph_output, "dangling-node": _dangling_node,
        "no-output-node": _no_output_node, "remove-node": _remove_node,
        "duplicate-node": _duplicate_node, "remove-graph-input": _remove_graph_input,
        "duplicate-graph-input": _duplicate_graph_input,
        "drop-initializer": _drop_initializer, "initializer-as-input": _initializer_as_input,
        "empty-required-input": _empty_required_input, "extra-input": _extra_input,
        "drop-last-input": _drop_last_input, "extra-output": _extra_output,
        "subgraph-forward-reference": _subgraph_forward_reference,
    })
