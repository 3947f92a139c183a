"""The memory budget of a compilation, checked from sizes before anything is allocated.

A model can ask for far more memory than the machine has: a 96 GB intermediate from a
misconfigured Expand, a ConstantOfShape that constant folding would fill with 40 GiB of zeros,
an arena no machine can allocate.  Without a check, ``ember.compile`` dies inside numpy
(``MemoryError``, ``array is too big``) or drives the machine into swap.  Every size is known
from the static types once the graph is specialized, so three checks refuse such models with a
:class:`MemoryBudgetError` that names the value, its size, the limit and how to raise it:

(a) :func:`check_value_sizes` after specialization: no single value may exceed the budget;
(b) :class:`FoldBudget` during constant folding: a node's outputs are sized from their types
    before its reference runs, and the folded constants together stay within the budget;
(c) :func:`check_build_memory` after memory planning: workspace arena plus weights plus the
    model's outputs (the runtime allocates a fresh array for every output on every call, so a
    model whose outputs alone exceed the budget cannot run even with an empty workspace).

The limit itself (explicit, ``EMBER_MEMORY_LIMIT``, or the available memory) is resolved in
``ember.core.config``; sizes are computed with Python ints, so they cannot overflow.
"""

from __future__ import annotations

import numpy as np

from ember.core.config import format_size, raise_limit_hint
from ember.core.errors import MemoryBudgetError, ShapeError
from ember.ir.graph import Graph
from ember.ir.types import TensorType

# numpy (the reference executor, folding, the runtime's buffers) cannot hold more dimensions.
MAX_RANK = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
_MAX_LISTED = 20


def check_value_sizes(graph: Graph, limit: int) -> None:
    """Refuse a specialized graph with a value larger than ``limit`` bytes or of a rank numpy
    cannot represent; every such value is listed, largest first.

    Graph inputs and node outputs are checked, in subgraphs too; constants are not, since they
    are loaded already (their total is part of check (c)).
    """
    too_large: list[tuple[int, str]] = []
    too_deep: list[str] = []
    for label, vtype in _values(graph, context=""):
        if not isinstance(vtype, TensorType) or not vtype.is_static:
            continue
        if len(vtype.shape) > MAX_RANK:
            too_deep.append(f"{label} has rank {len(vtype.shape)}")
            continue
        nbytes = vtype.nbytes
        if nbytes > limit:
            too_large.append((nbytes, f"{label} is {vtype}: {format_size(nbytes)}"))
    if too_deep:
        raise ShapeError(f"{len(too_deep)} value(s) have more dimensions than the {MAX_RANK} "
                         f"numpy supports:\n  - " + "\n  - ".join(too_deep[:_MAX_LISTED]))
    if too_large:
        too_large.sort(key=lambda item: -item[0])
        largest = too_large[0][0]
        listed = [text for _, text in too_large[:_MAX_LISTED]]
        if len(too_large) > _MAX_LISTED:
            listed.append(f"... and {len(too_large) - _MAX_LISTED} more")
        raise MemoryBudgetError(
            f"{len(too_large)} value(s) of this model are larger than the memory limit of "
            f"{format_size(limit)}:\n  - " + "\n  - ".join(listed) +
            f"\n{raise_limit_hint(largest)}", largest, limit)


def _values(graph: Graph, context: str):
    """(label, type) of every graph input and node output, subgraphs included."""
    for name in graph.inputs:
        yield f"{context}input '{name}'", graph.types.get(name)
    for node in graph.nodes:
        for name in node.outputs:
            if name:
                yield (f"{context}value '{name}' (output of node '{node.name}' ({node.op}))",
                       graph.types.get(name))
        for sub in node.subgraphs():
            yield from _values(sub, f"{context}in a body of node '{node.name}': ")


class FoldBudget:
    """The running total of the constants that folding creates, against the budget.

    Only new allocations count: the weights already loaded are paid for (the default budget is
    measured with them in memory), and check (c) bounds weights plus workspace.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.spent = 0

    def admits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit; a fold that does not fit leaves its node to run time."""
        return self.spent + nbytes <= self.limit

    def spend(self, nbytes: int) -> None:
        self.spent += nbytes


def output_nbytes(graph: Graph, names: list[str]) -> int | None:
    """Bytes of the named values from their static types; None when a size is unknown.

    Unnamed (unrequested optional) outputs are not counted: an op's optional outputs (a
    Dropout mask, TopK's indices) are no larger than its main ones.
    """
    total = 0
    for name in names:
        if not name:
            continue
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or not vtype.is_static:
            return None
        total += vtype.nbytes
    return total


def check_build_memory(workspace_size: int, weights_size: int, limit: int,
                       outputs_size: int = 0) -> None:
    """Refuse a compiled model whose run-time memory exceeds ``limit`` bytes.

    That is what one call of the library needs at once: the workspace arena, the weights and
    the ``outputs_size`` bytes of the outputs it returns (allocated per call by the runtime,
    outside the arena; the inputs are the caller's arrays and are not counted).
    """
    needed = workspace_size + weights_size + outputs_size
    if needed > limit:
        raise MemoryBudgetError(
            f"the compiled model needs {format_size(needed)} of memory (workspace "
            f"{format_size(workspace_size)}, weights {format_size(weights_size)}, outputs "
            f"{format_size(outputs_size)} allocated on every call), more than the memory "
            f"limit of {format_size(limit)}; {raise_limit_hint(needed)}",
            needed, limit)


def graph_outputs_nbytes(graph: Graph) -> int:
    """Bytes of the arrays one call returns: every listed graph output, a value listed twice
    counted twice (the runtime allocates one array per output); 0 for an unknown size, which
    a specialized graph does not have."""
    return sum(output_nbytes(graph, [name]) or 0 for name in graph.outputs)
