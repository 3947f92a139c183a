"""Inlining bombs and endless loops (kind ``bomb``): small files that ask for a vast amount of
work.

A model-local function that calls the next one k times, over d levels, is a file of a few
kilobytes that inlines to k**d nodes; a recursive function never stops inlining; a Loop with
a trip count of 2**62 and a condition that stays true never stops running.  ember must
either compute the result or refuse with a clear EmberError *quickly*: a hang (the case's
deadline passes) is a failure, and so is a MemoryError.  The outputs are known without an
oracle (the reference evaluator would run the bomb too): each bomb is built so that its
value is a simple function of the input.
"""

from __future__ import annotations

import math
import random

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuzz.generate.base import (compile_budget, draw_size, family, feeds_for, model, tensor,
                                value)
from fuzz.mutate.base import Mutant

DOMAIN = "bomb"
FUNCTION_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
# Expansions up to this many nodes are ordinary models: ember must compute them.
MUST_INLINE = 3000
MANY_OUTPUT_CAPS = (300, 600, 1000, 1000)
CYCLE_CAPS = (50, 200, 1000, 2000)
HUGE_TRIPS = {"2^31": 2**31, "2^40": 2**40, "2^62": 2**62, "int64-max": 2**63 - 1}
# The deadline of a bomb that expands past MUST_INLINE nodes, or loops without end: to
# refuse it (or compute it) "quickly".  An expansion up to MUST_INLINE nodes is an ordinary
# model and gets the deadline of its size (fuzz.generate.base.compile_budget).
BOMB_BUDGET = 20.0

IDEMPOTENT = {"Relu": lambda x: np.maximum(x, 0), "Abs": np.abs,
              "Floor": np.floor, "Ceil": np.ceil, "Sign": np.sign}


def _function(name: str, nodes: list[onnx.NodeProto], inputs: list[str],
              outputs: list[str]) -> onnx.FunctionProto:
    return helper.make_function(DOMAIN, name, inputs, outputs, nodes,
                                opset_imports=FUNCTION_OPSETS)


def _call(function: str, inputs: list[str], outputs: list[str], name: str) -> onnx.NodeProto:
    return helper.make_node(function, inputs, outputs, name=name, domain=DOMAIN)


def _bomb_model(functions: list[onnx.FunctionProto], entry: str, shape: list[int],
                check: bool = True) -> onnx.ModelProto:
    graph = helper.make_graph([_call(entry, ["x"], ["y"], "entry")], "bomb",
                              [value("x", shape=shape)], [value("y", shape=shape)])
    return model(graph, functions, extra_opsets=[(DOMAIN, 1)], check=check)


def fanout(rng: random.Random, number: int) -> Mutant:
    """F0 applies an idempotent op; Fi calls F(i-1) k times -- all on the input, joined by
    Max, or each on the previous call's result -- so Fd(x) = F0(x) while inlining Fd makes
    about k**d nodes.  log2 of the expansion is drawn uniformly from 1 to 40."""
    target = rng.uniform(1, 40)
    k = rng.choice([2, 2, 3, 4, 8, 16])
    depth = max(1, round(target / math.log2(k)))
    join = rng.choice(["max", "compose", "mean"])
    op = rng.choice(sorted(IDEMPOTENT))
    functions = [_function("F0", [helper.make_node(op, ["X"], ["Y"], name="base")],
                           ["X"], ["Y"])]
    for level in range(1, depth + 1):
        callee = f"F{level - 1}"
        if join == "compose":
            names = ["X"] + [f"t{j}" for j in range(1, k)] + ["Y"]
            nodes = [_call(callee, [names[j]], [names[j + 1]], f"call{j}") for j in range(k)]
        else:
            parts = [f"t{j}" for j in range(k)]
            nodes = [_call(callee, ["X"], [p], f"call{j}") for j, p in enumerate(parts)]
            nodes.append(helper.make_node("Max" if join == "max" else "Mean", parts, ["Y"],
                                          name="join"))
        functions.append(_function(f"F{level}", nodes, ["X"], ["Y"]))
    shape = [2, rng.choice([2, 3])]
    feeds = feeds_for(rng.randrange(2**32), {"x": shape})
    expansion = k ** depth
    return Mutant(_bomb_model(functions, f"F{depth}", shape).SerializeToString(),
                  f"fanout: {depth} levels of {k} calls joined by {join} over {op} "
                  f"(inlines to ~2^{math.log2(expansion):.1f} nodes)",
                  feed_overrides=feeds, expected=[IDEMPOTENT[op](feeds["x"])],
                  oracle="expected", must_succeed=expansion <= MUST_INLINE,
                  budgets={"compile": compile_budget(expansion) if expansion <= MUST_INLINE
                           else BOMB_BUDGET, "run": BOMB_BUDGET})


def many_outputs(rng: random.Random, number: int) -> Mutant:
    """A function with m outputs (each a different op of its input); the call takes all of
    them, or only some (the others named ""), and the graph returns or concatenates them."""
    count = draw_size(rng, number, 8, MANY_OUTPUT_CAPS)
    unary = ["Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Sin", "Cos", "Softsign"]
    nodes, outs = [], []
    for j in range(count):
        out = f"Y{j}"
        nodes.append(helper.make_node(unary[j % len(unary)], ["X"], [out], name=f"op{j}"))
        outs.append(out)
    function = _function("Many", nodes, ["X"], outs)
    shape = [2, rng.choice([1, 3])]
    used = [f"y{j}" if rng.random() < 0.8 or j == count - 1 else "" for j in range(count)]
    join = rng.choice(["outputs", "concat"])
    graph_nodes = [_call("Many", ["x"], used, "many")]
    kept = [u for u in used if u]
    if join == "concat":
        graph_nodes.append(helper.make_node("Concat", kept, ["y"], name="join", axis=0))
        outputs = [value("y", shape=[shape[0] * len(kept), shape[1]])]
    else:
        outputs = [value(u, shape=shape) for u in kept]
    graph = helper.make_graph(graph_nodes, "many_outputs", [value("x", shape=shape)], outputs)
    built = model(graph, [function], extra_opsets=[(DOMAIN, 1)])
    return Mutant(built.SerializeToString(),
                  f"many-outputs: a function with {count} outputs, {len(kept)} used, "
                  f"joined by {join}",
                  feed_overrides=feeds_for(rng.randrange(2**32), {"x": shape}),
                  must_succeed=True, budgets={"compile": compile_budget(count * 2)})


def recursive(rng: random.Random, number: int) -> Mutant:
    """Recursion ONNX forbids: a function calling itself, a cycle of L functions, recursion
    reached only through an If inside the function (or after a long chain), or a call
    with no end in a Loop body.  Must be refused (an EmberError), quickly."""
    how = rng.choice(["self", "cycle", "guarded", "chain-then-cycle", "in-loop-body"])
    length = draw_size(rng, number, 2, CYCLE_CAPS)
    functions: list[onnx.FunctionProto] = []
    if how == "self":
        functions.append(_function("R", [helper.make_node("Neg", ["X"], ["t"], name="neg"),
                                         _call("R", ["t"], ["Y"], "again")], ["X"], ["Y"]))
        entry, detail = "R", "a function calls itself"
    elif how in ("cycle", "chain-then-cycle"):
        back = 1 if how == "cycle" else rng.randint(1, length)
        for level in range(1, length + 1):
            callee = f"R{level + 1}" if level < length else f"R{back}"
            functions.append(_function(f"R{level}", [
                helper.make_node("Relu", ["X"], ["t"], name="op"),
                _call(callee, ["t"], ["Y"], "next")], ["X"], ["Y"]))
        entry = "R1"
        detail = (f"a cycle of {length} functions" if how == "cycle" else
                  f"a chain of {length} functions whose last calls R{back}")
    elif how == "guarded":
        then_branch = helper.make_graph([_call("R", ["t"], ["r"], "recurse")], "then", [],
                                        [value("r")])
        else_branch = helper.make_graph([helper.make_node("Identity", ["X"], ["e"],
                                                          name="stop")], "else", [], [value("e")])
        functions.append(_function("R", [
            helper.make_node("Neg", ["X"], ["t"], name="neg"),
            helper.make_node("ReduceSum", ["X"], ["s"], name="sum", keepdims=0),
            helper.make_node("Constant", [], ["zero"], name="zero", value_float=0.0),
            helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
            helper.make_node("If", ["c"], ["Y"], name="if", then_branch=then_branch,
                             else_branch=else_branch)], ["X"], ["Y"]))
        entry, detail = "R", "a function calls itself in an If branch (recursion with a base case)"
    else:
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond"),
             _call("R", ["v_in"], ["v_out"], "recurse")], "body",
            [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
             value("v_in")], [value("cond_out", TensorProto.BOOL, []), value("v_out")])
        trips = helper.make_node("Constant", [], ["trips"], name="trips", value_int=2)
        functions.append(_function("R", [
            trips, helper.make_node("Loop", ["trips", "", "X"], ["Y"], name="loop",
                                    body=body)], ["X"], ["Y"]))
        entry, detail = "R", "a function calls itself in the body of its Loop"
    shape = [2, 3]
    return Mutant(_bomb_model(functions, entry, shape, check=False).SerializeToString(),
                  f"recursive: {detail}",
                  feed_overrides=feeds_for(rng.randrange(2**32), {"x": shape}),
                  budgets={"compile": BOMB_BUDGET, "run": BOMB_BUDGET})


def loop_trips(rng: random.Random, number: int) -> Mutant:
    """A Loop counting its iterations (and stacking them, with a scan output) under a trip
    count of 2**31 .. 2**63-1 or none at all, a condition that stays true or turns false
    after k iterations; or a small or negative count.  The iteration count -- hence every
    output -- follows from ONNX's rule (run while i < M and cond), so a result is checked
    exactly; with no end in sight, only an EmberError passes in time."""
    how = rng.choice(["huge-true", "huge-true", "no-count-true", "huge-terminating",
                      "small", "negative", "cond-false"])
    runtime_count = rng.random() < 0.4
    scan = rng.random() < 0.4
    terminate_after = rng.randint(1, 300)
    if how in ("huge-true", "huge-terminating"):
        trips_name, trips = rng.choice(sorted(HUGE_TRIPS.items()))
    elif how == "small":
        trips_name, trips = "small", rng.randint(0, 300)
    elif how == "negative":
        trips_name, trips = "negative", rng.choice([-1, -7, -(2**63)])
    else:
        trips_name, trips = "small", rng.randint(1, 50)
    condition = how != "cond-false"
    body_nodes = [helper.make_node("Add", ["c_in", "one"], ["c_out"], name="count")]
    if how == "huge-terminating":
        body_nodes += [helper.make_node("Constant", [], ["limit"], name="limit",
                                        value_int=terminate_after - 1),
                       helper.make_node("Less", ["i", "limit"], ["cond_out"], name="more")]
    elif how == "no-count-true":
        body_nodes.append(helper.make_node("Constant", [], ["cond_out"], name="forever",
                                           value=tensor("t", np.array(True))))
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"))
    body_outputs = [value("cond_out", TensorProto.BOOL, []),
                    value("c_out", TensorProto.INT64, [])]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["i"], ["i_out"], name="scan"))
        body_outputs.append(value("i_out", TensorProto.INT64, []))
    body = helper.make_graph(
        body_nodes, "body", [value("i", TensorProto.INT64, []),
                             value("cond_in", TensorProto.BOOL, []),
                             value("c_in", TensorProto.INT64, [])], body_outputs,
        initializer=[tensor("one", np.int64(1))])
    count_input = "" if how == "no-count-true" else "M"
    outputs = [value("count", TensorProto.INT64, [])]
    if scan:
        outputs.append(value("iterations", TensorProto.INT64, [None]))
    graph_inputs = [value("cond", TensorProto.BOOL, []), value("start", TensorProto.INT64, [])]
    initializers = []
    feeds = {"cond": np.array(condition), "start": np.array(rng.randint(0, 5), np.int64)}
    if count_input:
        if runtime_count:
            graph_inputs.append(value("M", TensorProto.INT64, []))
            feeds["M"] = np.array(trips, np.int64)
        else:
            initializers.append(tensor("M", np.int64(trips)))
    graph = helper.make_graph(
        [helper.make_node("Loop", [count_input, "cond", "start"],
                          ["count"] + (["iterations"] if scan else []), name="loop",
                          body=body)],
        "loop_trips", graph_inputs, outputs, initializer=initializers)
    if not condition or (count_input and trips <= 0):
        iterations = 0
    elif how == "huge-terminating":
        iterations = min(trips, terminate_after)
    else:
        iterations = trips if count_input else None  # None: never ends
    # What a result must be: the count is exact for any number of iterations (a compiler
    # may find the closed form); the stacked iterations only exist up to 2**24 of them.
    possible = iterations is not None and not (scan and iterations > 2**24)
    expected = None
    if possible:
        assert iterations is not None
        count = int(feeds["start"]) + iterations
        expected = [np.array((count + 2**63) % 2**64 - 2**63, np.int64)]  # int64 wraps
        if scan:
            expected.append(np.arange(iterations, dtype=np.int64))
    parts = [f"loop-trips: {how}"]
    parts.append(f"M = {trips_name} ({trips:,})" + (" fed at run time" if runtime_count else "")
                 if count_input else "no trip count")
    if how == "huge-terminating":
        parts.append(f"cond turns false after {terminate_after}")
    if scan:
        parts.append("scan output")
    ends = "never ends" if iterations is None else f"{iterations:,} iterations"
    return Mutant(model(graph).SerializeToString(), f"{', '.join(parts)}: {ends}",
                  feed_overrides=feeds, expected=expected,
                  oracle="expected" if possible else "impossible",
                  # A scan output's length depends on the condition, a graph input: a
                  # data-dependent shape, which ember's static code refuses by design.
                  must_succeed=iterations is not None and iterations <= 10_000 and not scan,
                  budgets={"compile": BOMB_BUDGET, "run": BOMB_BUDGET})


KINDS = {"fanout": fanout, "many-outputs": many_outputs, "recursive": recursive,
         "loop-trips": loop_trips}
WEIGHTS = {"fanout": 4, "many-outputs": 1, "recursive": 2, "loop-trips": 3}


def bomb(rng: random.Random, number: int) -> Mutant:
    """One of the bomb generators (each in turn for a session's first cases, then inlining
    bombs most often)."""
    return KINDS[family(rng, number, WEIGHTS)](rng, number)
