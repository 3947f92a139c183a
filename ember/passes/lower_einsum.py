"""Write Einsum as the transposes, reshapes, sums and matrix products it stands for.

Why: ember has no kernel of Einsum's own, so it ran as its numpy reference on the host
between compiled kernels.  Every two-operand contraction is a batched matrix product once
its letters are sorted into four groups -- as TVM's and ONNX Runtime's Einsum lowerings do:

* **batch** letters, in both operands and still needed after (the output, or a later
  operand): the MatMul's batch dims (size-1 broadcasting included);
* **contracted** letters, in both and needed by nothing after: the MatMul's inner dim;
* letters of one operand only that are still needed: its rows (left) or columns (right);
* letters of one operand that nothing needs any more: summed out first (ReduceSum).

Each operand is transposed to ``batch, rows|columns, contracted`` order and reshaped to a
matrix per batch entry; the product is reshaped back and the next operand is folded in
(left to right).  One operand alone is a sum and a transpose.  The output is transposed to the
equation's letter order.  ``...`` becomes letters of its own (right-aligned, as numpy
broadcasts it).

Lowered: float32/float64 operands of static shapes; anything else -- a letter repeated in
one term (a diagonal), a contracted letter whose sizes differ (broadcast against 1), other
element types -- keeps the reference.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ember.core.dtypes import DType
from ember.core.traced import remember_traced
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.matmul import Equation
from ember.passes.rewrite import expand_nodes

_LOWERED_DTYPES = (DType.FLOAT32, DType.FLOAT64)


class _Refuse(Exception):
    """The node is not lowered (it keeps its reference)."""


class _ErrorMaker:
    """What ``Equation.parse`` reports errors through: here a refusal."""

    @staticmethod
    def error(message: str) -> _Refuse:
        return _Refuse(message)


def lower_einsum(graph: Graph) -> int:
    """Rewrite in place; returns how many Einsum nodes were lowered."""
    return expand_nodes(graph, "Einsum", lambda node: _Lowering(graph, node).nodes(), _Refuse)


class _Operand:
    """A value on the way: its name, its letters (one per axis) and their sizes."""

    def __init__(self, name: str, letters: str, sizes: dict[str, int]):
        self.name, self.letters, self.sizes = name, letters, sizes

    def shape(self, letters: str) -> list[int]:  # (ints, traced sizes among them)
        return [self.sizes[letter] for letter in letters]


class _Lowering:
    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node
        self.made: list[Node] = []
        types = [graph.types.get(name) if name else None for name in node.inputs]
        if not types or any(not isinstance(t, TensorType) or not t.is_static for t in types):
            raise _Refuse("operands of static shape")
        if any(t.dtype not in _LOWERED_DTYPES for t in types):
            raise _Refuse("float operands")
        equation = Equation.parse(_ErrorMaker(), node.attrs.get("equation", ""), len(types))
        self.terms, self.output = _without_ellipsis(equation, [t.shape for t in types])
        for term in self.terms:
            if len(set(term)) != len(term):
                raise _Refuse(f"term '{term}' repeats a letter (a diagonal)")
        # sizes as the types have them: a size a traced build takes at run time stays one
        self.operands = [_Operand(name, term, dict(zip(term, t.shape)))
                         for name, term, t in zip(node.inputs, self.terms, types)]

    def nodes(self) -> list[Node]:
        current = self.operands[0]
        for position, other in enumerate(self.operands[1:], start=1):
            later = set(self.output).union(*(o.letters for o in self.operands[position + 1:]))
            current = self._product(current, other, later)
        current = self._sum_out(current, set(self.output))
        self._transpose(current, self.output, final=True)
        return self.made

    # ------------------------------------------------------------------ steps
    def _product(self, a: _Operand, b: _Operand, later: set[str]) -> _Operand:
        a = self._sum_out(a, later | set(b.letters))
        b = self._sum_out(b, later | set(a.letters))
        batch = "".join(x for x in a.letters if x in b.letters and x in later)
        contracted = "".join(x for x in a.letters if x in b.letters and x not in later)
        rows = "".join(x for x in a.letters if x not in b.letters)
        columns = "".join(x for x in b.letters if x not in a.letters)
        if any(a.sizes[x] != b.sizes[x] for x in contracted):
            raise _Refuse("a contracted letter broadcasts")
        left = self._as_matrices(a, batch, rows, contracted, contracted_last=True)
        right = self._as_matrices(b, batch, columns, contracted, contracted_last=False)
        product = self._emit("MatMul", [left, right])
        sizes = {**a.sizes, **b.sizes}
        for x in batch:
            sizes[x] = max(a.sizes[x], b.sizes[x])
        letters = batch + rows + columns
        result = _Operand(product, letters, sizes)
        return self._reshape(result, [sizes[x] for x in letters])

    def _as_matrices(self, operand: _Operand, batch: str, own: str, contracted: str,
                     contracted_last: bool) -> str:
        order = batch + (own + contracted if contracted_last else contracted + own)
        moved = self._transpose(operand, order)
        inner = [math.prod(operand.shape(own)), math.prod(operand.shape(contracted))]
        if not contracted_last:
            inner.reverse()
        return self._reshape(moved, operand.shape(batch) + inner).name

    def _sum_out(self, operand: _Operand, kept: set[str]) -> _Operand:
        gone = [axis for axis, x in enumerate(operand.letters) if x not in kept]
        if not gone:
            return operand
        axes = self.graph.add_constant(np.array(gone, dtype=np.int64), hint="einsum_axes")
        name = self._emit("ReduceSum", [operand.name, axes], keepdims=0)
        letters = "".join(x for x in operand.letters if x in kept)
        return _Operand(name, letters, operand.sizes)

    def _transpose(self, operand: _Operand, order: str, final: bool = False) -> _Operand:
        perm = [operand.letters.index(x) for x in order]
        if perm == list(range(len(perm))):
            if not final:
                return operand
            if self.made and self.made[-1].outputs == [operand.name]:
                self.made[-1].outputs = [self.node.outputs[0]]  # the last step writes it
                return _Operand(self.node.outputs[0], order, operand.sizes)
        op, attrs = ("Transpose", {"perm": perm}) if perm != list(range(len(perm))) \
            else ("Identity", {})
        name = self._emit(op, [operand.name], final=final, **attrs)
        return _Operand(name, order, operand.sizes)

    def _reshape(self, operand: _Operand, shape: list[int]) -> _Operand:
        current = self.graph.types.get(operand.name)
        if isinstance(current, TensorType) and list(current.shape) == shape:
            return operand
        target = self.graph.add_constant(np.array([int.__int__(d) for d in shape],
                                                  dtype=np.int64), hint="einsum_shape")
        # (the sample's sizes; a traced build keeps what they stand for)
        remember_traced(target, np.array(list(shape), dtype=object))
        return _Operand(self._emit("Reshape", [operand.name, target]), operand.letters,
                        operand.sizes)

    def _emit(self, op: str, inputs: list[str], final: bool = False, **attrs) -> str:
        output = self.node.outputs[0] if final else \
            self.graph.fresh_name(f"{self.node.name or 'einsum'}_{op.lower()}")
        self.made.append(Node(op, inputs, [output], attrs=attrs,
                              name=f"{self.node.name}/{op.lower()}{len(self.made)}"))
        return output


def _without_ellipsis(equation: Equation, shapes: list[tuple]) -> tuple[list[str], str]:
    """The terms and output with ``...`` replaced by letters the equation does not use,
    right-aligned across the operands (numpy's broadcasting of the ellipsis dims)."""
    used = set("".join(equation.inputs) + equation.output)
    spare = [x for x in string.ascii_letters if x not in used]
    counts = [len(shape) - (len(term) - 1) for term, shape in zip(equation.inputs, shapes)
              if "." in term]
    widest = max(counts, default=0)
    if widest > len(spare):
        raise _Refuse("too many dims under '...'")
    letters = "".join(spare[:widest])
    terms = []
    for term, shape in zip(equation.inputs, shapes):
        if "." in term:
            count = len(shape) - (len(term) - 1)
            term = term.replace(".", letters[widest - count:])
        if len(term) != len(shape):
            raise _Refuse(f"term '{term}' does not match its operand's rank")
        terms.append(term)
    return terms, equation.output.replace(".", letters)
