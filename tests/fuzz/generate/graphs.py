"""Deep and wide graphs (kinds ``deep`` and ``wide``): valid models whose size, not their
content, is the test.

Compile time that grows faster than the graph, or recursion whose depth grows with it
(a RecursionError after ~1,000 levels of Python calls), shows only in graphs far larger than
the seed models: chains of hundreds to thousands of nodes, fans of hundreds of branches
joined by one variadic node.  Every model here is valid and checked, so an EmberError is a
failure too (``must_succeed``); the oracle judges the result.

The numbers are kept well-conditioned on purpose, so that a long chain differs from the
oracle only by rounding: every op is 1-Lipschitz (constants of magnitude <= 1, orthonormal
MatMul weights, skip connections through Mean), and a squashing op (Tanh, Sigmoid, Sin)
comes at least every 12 ops, so values stay O(1) and rounding errors do not grow.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuzz.generate.base import (choose, compile_budget, draw_size, feeds_for, mix, model,
                                tensor, value)
from fuzz.mutate.base import Mutant

UNARY = ("Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Sin", "Softsign", "LeakyRelu")
SQUASH = ("Tanh", "Sigmoid", "Sin", "Softsign")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")
SQUASH_EVERY = 12

# Node counts per size tier (see fuzz.generate.base.size_tier).
CHAIN_CAPS = (300, 900, 1800, 3000)
FAN_CAPS = (250, 500, 800, 1000)


class _Builder:
    """Nodes, initializers and the shape of every value of a graph under construction."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.initializers.append(tensor(name, array))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self.fresh("v")
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{self.counter}", **attrs))
        self.shapes[out] = shape
        return out

    def small(self, shape: tuple[int, ...]) -> np.ndarray:
        """Constants of magnitude <= 0.5 (<= 1 keeps every binary op 1-Lipschitz)."""
        seed = self.rng.randrange(2**32)
        return (np.random.default_rng(seed).uniform(-0.5, 0.5, shape)).astype(np.float32)

    def unary(self, current: str, op: str) -> str:
        shape = self.shapes[current]
        if op == "LeakyRelu":
            return self.node(op, [current], shape, alpha=round(self.rng.uniform(0.01, 0.9), 3))
        return self.node(op, [current], shape)


def _side(builder: _Builder, current: str, inputs: dict[str, tuple[int, ...]]) -> tuple[str, str]:
    """A second operand for a binary op on ``current``: a graph input of the same shape (a
    long-range edge), a constant of the whole shape, of the last dim (broadcast) or a
    scalar.  Returns (name, description)."""
    shape = builder.shapes[current]
    same = [name for name, s in inputs.items() if s == shape]
    options = ["full", "row", "scalar"] + (["input"] * 2 if same else [])
    how = builder.rng.choice(options)
    if how == "input":
        return builder.rng.choice(same), "input"
    if how == "row":
        return builder.const(builder.small(shape[-1:])), "row"
    if how == "scalar":
        return builder.const(builder.small(())), "scalar"
    return builder.const(builder.small(shape)), "full"


def _orthonormal(rng: random.Random, rows: int, cols: int) -> np.ndarray:
    """A rows x cols matrix of spectral norm 1 (orthonormal rows or columns)."""
    generator = np.random.default_rng(rng.randrange(2**32))
    q, _ = np.linalg.qr(generator.standard_normal((max(rows, cols), max(rows, cols))))
    return q[:rows, :cols].astype(np.float32)


def _reshape_target(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Another shape with the same element count (rank 1 to 3)."""
    total = int(np.prod(shape))
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    rank = rng.choice([1, 2, 2, 3])
    if rank == 1:
        return (total,)
    first = rng.choice(divisors)
    if rank == 2:
        return (first, total // first)
    rest = total // first
    second = rng.choice([d for d in range(1, rest + 1) if rest % d == 0])
    return (first, second, rest // second)


def chain(rng: random.Random, number: int) -> Mutant:
    """A chain of ``length`` nodes: unary and binary elementwise ops, MatMul, Reshape,
    Transpose and skip connections, in proportions drawn per case."""
    length = draw_size(rng, number, 20, CHAIN_CAPS)
    rows, cols = rng.choice([1, 2, 3, 4]), rng.choice([2, 3, 4, 8])
    builder = _Builder(rng)
    inputs = {"x": (rows, cols)}
    if rng.random() < 0.5:
        inputs["z"] = (rows, cols)
    builder.shapes.update(inputs)
    weights = mix(rng, ["unary", "binary", "matmul", "reshape", "transpose", "skip"])
    current, since_squash = "x", 0
    outputs: list[str] = []
    counts: dict[str, int] = {}
    for _ in range(length):
        shape = builder.shapes[current]
        kind = "squash" if since_squash >= SQUASH_EVERY else choose(rng, weights)
        if kind == "transpose" and len(shape) < 2:
            kind = "reshape"
        if kind == "skip":
            same = [n for n, s in builder.shapes.items() if s == shape and n != current]
            kind = "skip" if same else "unary"
        counts[kind] = counts.get(kind, 0) + 1
        since_squash += 1
        if kind == "squash":
            current = builder.unary(current, rng.choice(SQUASH))
            since_squash = 0
        elif kind == "unary":
            op = rng.choice(UNARY)
            current = builder.unary(current, op)
            since_squash = 0 if op in SQUASH else since_squash
        elif kind == "binary":
            side, _ = _side(builder, current, inputs)
            op = rng.choice(BINARY)
            operands = [current, side] if rng.random() < 0.7 or op != "Sub" else [side, current]
            current = builder.node(op, operands, shape)
        elif kind == "matmul":
            width = rng.choice([1, 2, 3, 4, 8])
            weight = builder.const(_orthonormal(rng, shape[-1], width), "w")
            current = builder.node("MatMul", [current, weight], shape[:-1] + (width,))
        elif kind == "reshape":
            target = _reshape_target(rng, shape)
            spelled = list(target)
            if rng.random() < 0.3:
                spelled[rng.randrange(len(spelled))] = -1
            shape_name = builder.const(np.array(spelled, np.int64), "shape")
            current = builder.node("Reshape", [current, shape_name], target)
        elif kind == "transpose":
            perm = list(range(len(shape)))
            while perm == sorted(perm):
                rng.shuffle(perm)
            current = builder.node("Transpose", [current], tuple(shape[p] for p in perm),
                                   perm=perm)
        else:  # skip: the mean of the current value and an earlier one of the same shape
            earlier = rng.choice(sorted(n for n, s in builder.shapes.items()
                                        if s == shape and n != current))
            current = builder.node("Mean", [current, earlier], shape)
        if rng.random() < 0.004:
            outputs.append(current)  # an intermediate value is also a graph output
    outputs.append(current)
    outputs = list(dict.fromkeys(outputs))
    graph = helper.make_graph(
        builder.nodes, f"chain{length}", [value(n, shape=s) for n, s in inputs.items()],
        [value(n, shape=builder.shapes[n]) for n in outputs], initializer=builder.initializers)
    mixture = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return Mutant(model(graph).SerializeToString(),
                  f"chain: {len(builder.nodes)} nodes on [{rows}, {cols}] ({mixture}); "
                  f"{len(outputs)} output(s)",
                  feed_overrides=feeds_for(rng.randrange(2**32), inputs), must_succeed=True,
                  budgets={"compile": compile_budget(len(builder.nodes))})


def _branch(builder: _Builder, source: str, depth: int, squash_last: bool) -> str:
    current = source
    for step in range(depth):
        if builder.rng.random() < 0.5:
            op = builder.rng.choice(UNARY)
            current = builder.unary(current, op)
        else:
            side = builder.const(builder.small(builder.shapes[current][-1:]))
            current = builder.node(builder.rng.choice(BINARY), [current, side],
                                   builder.shapes[current])
    if squash_last:
        current = builder.unary(current, "Sigmoid")  # positive: a sum of many cannot cancel
    return current


def fan(rng: random.Random, number: int) -> Mutant:
    """One input feeding ``width`` branches, joined by one variadic node (Sum, Max, Min,
    Mean, Concat), a balanced tree or a left-deep chain of Adds, or returned as ``width``
    graph outputs; or the input Split in ``width`` pieces that are processed and joined."""
    width = draw_size(rng, number, 8, FAN_CAPS)
    builder = _Builder(rng)
    cols = rng.choice([1, 2, 4, 8])
    join = rng.choice(["Sum", "Max", "Min", "Mean", "Concat", "tree", "left-deep", "outputs",
                       "split"])
    depth = rng.choice([1, 1, 2, 3])
    if join == "split":
        inputs = {"x": (width, cols)}
        builder.shapes.update(inputs)
        pieces = [builder.fresh("piece") for _ in range(width)]
        builder.nodes.append(helper.make_node("Split", ["x", builder.const(
            np.ones(width, np.int64), "sizes")], pieces, name="split", axis=0))
        builder.shapes.update({p: (1, cols) for p in pieces})
        branches = [_branch(builder, p, depth, False) for p in pieces]
        out = builder.node("Concat", branches, (width, cols), axis=0)
        outputs = [out]
    else:
        rows = rng.choice([1, 2, 3])
        inputs = {"x": (rows, cols)}
        builder.shapes.update(inputs)
        squash = join in ("Sum", "Mean", "tree", "left-deep")
        branches = [_branch(builder, "x", depth, squash) for _ in range(width)]
        if join in ("Sum", "Max", "Min", "Mean"):
            outputs = [builder.node(join, branches, (rows, cols))]
        elif join == "Concat":
            axis = rng.choice([0, 1, -1])
            shape = (rows * width, cols) if axis == 0 else (rows, cols * width)
            outputs = [builder.node("Concat", branches, shape, axis=axis)]
        elif join == "tree":
            level = branches
            while len(level) > 1:
                paired = [builder.node("Add", [a, b], (rows, cols))
                          for a, b in zip(level[::2], level[1::2])]
                level = paired + ([level[-1]] if len(level) % 2 else [])
            outputs = level
        elif join == "left-deep":
            total = branches[0]
            for branch in branches[1:]:
                total = builder.node("Add", [total, branch], (rows, cols))
            outputs = [total]
        else:
            outputs = branches
    graph = helper.make_graph(
        builder.nodes, f"fan{width}", [value(n, shape=s) for n, s in inputs.items()],
        [value(n, shape=builder.shapes[n]) for n in outputs], initializer=builder.initializers)
    return Mutant(model(graph).SerializeToString(),
                  f"fan: {width} branches of {depth} op(s) joined by {join} "
                  f"({len(builder.nodes)} nodes, {len(outputs)} output(s))",
                  feed_overrides=feeds_for(rng.randrange(2**32), inputs), must_succeed=True,
                  budgets={"compile": compile_budget(len(builder.nodes))})
