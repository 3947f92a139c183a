"""Deep nesting (kind ``nest``): If and Loop bodies inside each other, and chains of
model-local functions each calling the next.

Code that walks a nested structure recursively fails with a RecursionError at a depth
Python's stack allows, not at one ONNX forbids.  Subgraph nesting is bounded by protobuf
itself (the Python runtime parses 31 levels of If, not 32), so nesting up to there must
work, and deeper nesting -- written here byte by byte, since protobuf will not build it --
must be refused with an EmberError.  Function chains have no such bound (functions are
siblings in the file, not nested messages): a chain of thousands is a valid model.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuzz.generate.base import (compile_budget, draw_size, family, feeds_for, model, tensor,
                                value)
from fuzz.mutate.base import Mutant

# Subgraph levels protobuf's Python runtime parses (an If inside an If ... 31 deep).
PROTOBUF_SUBGRAPH_DEPTH = 31
IF_CAPS = (24, 28, 31, 31)
LOOP_CAPS = (16, 24, 31, 31)
FUNCTION_CAPS = (600, 1500, 3000, 5000)
ONNX_CALL_DEPTH = 100  # onnx.checker's limit on nested function calls
# The ops of a function chain and their numpy equivalents (float32 in, float32 out).
UNARY = {"Neg": np.negative, "Abs": np.abs, "Relu": lambda x: np.maximum(x, np.float32(0)),
         "Sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(np.float32), "Tanh": np.tanh,
         "Softsign": lambda x: (x / (1 + np.abs(x))).astype(np.float32)}
TOO_DEEP_CAPS = (100, 300, 1000, 2000)


def _leaf_graph(name: str, op: str, source: str, out: str, shape: list[int]) -> onnx.GraphProto:
    return helper.make_graph([helper.make_node(op, [source], [out], name=f"{name}_{op}")],
                             name, [], [value(out, shape=shape)])


def nested_ifs(rng: random.Random, number: int) -> Mutant:
    """``depth`` Ifs, each in the then-branch of the one above; each level's condition is its
    own graph input, and the innermost branch reads the outer graph's input ``x`` (an
    implicit input crossing every scope)."""
    depth = draw_size(rng, number, 2, IF_CAPS)
    shape = [2, rng.choice([1, 3, 4])]
    ops = ["Neg", "Abs", "Relu", "Sigmoid", "Tanh"]
    inner = _leaf_graph("leaf", rng.choice(ops), "x", "out0", shape)
    conds = [f"c{level}" for level in range(1, depth + 1)]
    for level in range(1, depth + 1):
        out = f"out{level}"
        else_branch = _leaf_graph(f"else{level}", rng.choice(ops), "x", f"e{level}", shape)
        node = helper.make_node("If", [conds[level - 1]], [out], name=f"if{level}",
                                then_branch=inner, else_branch=else_branch)
        inner = helper.make_graph([node], f"level{level}", [], [value(out, shape=shape)])
    graph = helper.make_graph(
        list(inner.node), "nested_ifs",
        [value("x", shape=shape)] + [value(c, TensorProto.BOOL, []) for c in conds],
        list(inner.output))
    feeds = feeds_for(rng.randrange(2**32), {"x": shape})
    # Mostly true, so the case reaches deep; a false condition returns from its level.
    feeds.update({c: np.array(rng.random() < 0.9) for c in conds})
    return Mutant(model(graph).SerializeToString(),
                  f"nested-if: {depth} Ifs nested in then-branches", feed_overrides=feeds,
                  must_succeed=True, budgets={"compile": compile_budget(depth * 10)})


def nested_loops(rng: random.Random, number: int) -> Mutant:
    """``depth`` Loops, each in the body of the one above, carrying a value that each body
    changes; trip counts of 1 or 2 (at most 2**10 iterations of the innermost body in all)."""
    depth = draw_size(rng, number, 2, LOOP_CAPS)
    shape = [rng.choice([1, 2]), rng.choice([1, 3])]
    doubled = set(rng.sample(range(depth), min(depth, rng.randint(0, 10))))
    body: onnx.GraphProto | None = None
    for level in range(depth, 0, -1):
        carried_in, carried_out = f"v_in{level}", f"v_out{level}"
        step = f"step{level}"
        nodes = [helper.make_node("Identity", [f"cond_in{level}"], [f"cond_out{level}"],
                                  name=f"cond{level}")]
        initializers = [tensor(step, np.float32(0.25 if level % 2 else -0.125))]
        if body is None:
            nodes.append(helper.make_node("Add", [carried_in, step], [carried_out],
                                          name=f"add{level}"))
        else:
            trips = f"trips{level + 1}"
            initializers.append(tensor(trips, np.int64(2 if level in doubled else 1)))
            inner = f"inner{level}"
            nodes += [
                helper.make_node("Loop", [trips, "", carried_in], [inner], name=f"loop{level}",
                                 body=body),
                helper.make_node("Add", [inner, step], [carried_out], name=f"add{level}"),
            ]
        body = helper.make_graph(
            nodes, f"body{level}",
            [value(f"i{level}", TensorProto.INT64, []),
             value(f"cond_in{level}", TensorProto.BOOL, []), value(carried_in, shape=shape)],
            [value(f"cond_out{level}", TensorProto.BOOL, []), value(carried_out, shape=shape)],
            initializer=initializers)
    assert body is not None
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips0", "", "x"], ["y"], name="loop0", body=body)],
        "nested_loops", [value("x", shape=shape)], [value("y", shape=shape)],
        initializer=[tensor("trips0", np.int64(2 if 0 in doubled else 1))])
    return Mutant(model(graph).SerializeToString(),
                  f"nested-loop: {depth} Loops nested in bodies "
                  f"({len(doubled)} level(s) run twice)",
                  feed_overrides=feeds_for(rng.randrange(2**32), {"x": shape}),
                  must_succeed=True, budgets={"compile": compile_budget(depth * 10)})


def function_chain(rng: random.Random, number: int) -> Mutant:
    """Functions F1 .. Fd in one domain, each applying an op and calling the next (the last
    applies its op only); the graph calls F1.  Inlining makes d nodes, nested d deep."""
    depth = draw_size(rng, number, 10, FUNCTION_CAPS)
    attribute = rng.random() < 0.3  # pass an attribute down the whole chain
    functions = []
    applied = []
    for level in range(1, depth + 1):
        op = rng.choice(sorted(UNARY))
        applied.append(op)
        nodes = [helper.make_node(op, ["X"], ["t"], name=f"f{level}_op")]
        if level < depth:
            call = helper.make_node(f"F{level + 1}", ["t"], ["Y"], name=f"call{level + 1}",
                                    domain="chain")
            if attribute:
                call.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
            nodes.append(call)
        elif attribute:
            constant = helper.make_node("Constant", [], ["alpha"], name="alpha")
            constant.attribute.append(helper.make_attribute_ref("value_float",
                                                                onnx.AttributeProto.FLOAT,
                                                                ref_attr_name="alpha"))
            nodes += [constant, helper.make_node("Mul", ["t", "alpha"], ["Y"], name="scale")]
        else:
            nodes.append(helper.make_node("Identity", ["t"], ["Y"], name="last"))
        functions.append(helper.make_function(
            "chain", f"F{level}", ["X"], ["Y"], nodes,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("chain", 1)],
            attributes=["alpha"] if attribute else []))
    shape = [2, rng.choice([2, 3])]
    call = helper.make_node("F1", ["x"], ["y"], name="call1", domain="chain")
    if attribute:
        call.attribute.append(helper.make_attribute("alpha", 0.5))
    graph = helper.make_graph([call], "function_chain", [value("x", shape=shape)],
                              [value("y", shape=shape)])
    # onnx.checker refuses call chains deeper than ONNX_CALL_DEPTH ("may be malformed or
    # malicious"): beyond it ember may refuse too, but not recurse or hang.
    within = depth <= ONNX_CALL_DEPTH
    built = model(graph, functions, extra_opsets=[("chain", 1)], check=within)
    # The value is the ops applied in order: known without an oracle (the oracle process
    # died of SIGSEGV on a chain of 3,796 calls).
    feeds = feeds_for(rng.randrange(2**32), {"x": shape})
    expected = feeds["x"]
    for op in applied:
        expected = UNARY[op](expected)
    if attribute:
        expected = expected * np.float32(0.5)
    return Mutant(built.SerializeToString(),
                  f"function-chain: {depth} functions each calling the next"
                  + (" (an attribute forwarded down the chain)" if attribute else ""),
                  feed_overrides=feeds, expected=[expected.astype(np.float32)],
                  oracle="expected", must_succeed=within,
                  budgets={"compile": compile_budget(depth)})


# ---------------------------------------------------------------------------- too deep
# Protobuf wire format, to write nesting that protobuf's own builders refuse.


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def too_deep(rng: random.Random, number: int) -> Mutant:
    """Ifs nested deeper than protobuf parses (32 to thousands of levels), as raw bytes:
    each level is a graph whose one If node's then_branch is the level below.  Must be an
    EmberError (never a crash: a C parser without a depth limit overflows its stack)."""
    depth = draw_size(rng, number, PROTOBUF_SUBGRAPH_DEPTH + 1, TOO_DEEP_CAPS)
    shape = [2]
    leaf = _leaf_graph("leaf", "Neg", "x", "o", shape).SerializeToString()
    else_attr = helper.make_attribute("else_branch", _leaf_graph("else", "Abs", "x", "o", shape))
    level_template = helper.make_node("If", ["c"], ["o"], name="if")
    level_template.attribute.append(else_attr)
    node_prefix = level_template.SerializeToString()
    outputs = _field(12, value("o", shape=shape).SerializeToString())
    graph_bytes = leaf
    node = b""
    for level in range(depth):
        then_attr = _field(1, b"then_branch") + _varint(20 << 3) + _varint(5) + \
            _field(6, graph_bytes)  # name, type = GRAPH, g
        node = node_prefix + _field(5, then_attr)
        graph_bytes = _field(1, node) + _field(2, f"level{level}".encode()) + outputs
    main = helper.make_graph([], "too_deep", [value("x", shape=shape),
                                              value("c", TensorProto.BOOL, [])],
                             [value("o", shape=shape)])
    # Appending a graph field merges it into the parsed graph: the outermost If node.
    data = model(main, check=False).SerializeToString() + _field(7, _field(1, node))
    feeds = feeds_for(rng.randrange(2**32), {"x": shape})
    feeds["c"] = np.array(True)
    return Mutant(data, f"too-deep: {depth} nested Ifs, deeper than protobuf parses",
                  feed_overrides=feeds, budgets={"compile": 30.0})


KINDS = {"nested-if": nested_ifs, "nested-loop": nested_loops,
         "function-chain": function_chain, "too-deep": too_deep}
WEIGHTS = {"nested-if": 2, "nested-loop": 2, "function-chain": 3, "too-deep": 1}


def nest(rng: random.Random, number: int) -> Mutant:
    """One of the nesting generators (each in turn for a session's first cases)."""
    return KINDS[family(rng, number, WEIGHTS)](rng, number)
