"""The graph passes of each optimization level, in order: the optimization story in one place.

  level 0: nothing (every node as imported)
  level 1: constant folding, dead-code elimination
  level 2: level 1, then BatchNormalization folded into convolutions, convolution padding made
           explicit (affine, vectorizable loads), and another round of cleanup

Shape inference runs after every pass that changes the graph, so later passes and lowering
always see exact static types, and the IR verifier runs after every pass, so a pass that breaks
an invariant (a dangling value, a constant whose array is not its type) is caught where it
happened, by name, rather than as a crash in lowering or a wrong result.
"""

from __future__ import annotations

from typing import Callable

from ember.ir.graph import Graph
from ember.passes.dce import eliminate_dead_code
from ember.passes.explicit_padding import make_padding_explicit
from ember.passes.fold_batchnorm import fold_batchnorm
from ember.passes.fold_constants import fold_constants
from ember.passes.infer_shapes import infer_shapes
from ember.passes.verify import verify_graph

Pass = Callable[[Graph], int]

PASSES_BY_LEVEL: dict[int, list[Pass]] = {
    0: [],
    1: [fold_constants, eliminate_dead_code],
    2: [fold_constants, eliminate_dead_code, fold_batchnorm, make_padding_explicit,
        eliminate_dead_code],
}


def passes_for(opt_level: int) -> list[Pass]:
    return PASSES_BY_LEVEL[min(max(opt_level, 0), max(PASSES_BY_LEVEL))]


def optimize(graph: Graph, opt_level: int, log: list[str] | None = None,
             memory_limit: int | None = None) -> Graph:
    """Run the passes of ``opt_level`` in place; ``log`` collects what each one changed.

    ``memory_limit`` (bytes; default ``ember.core.config.memory_limit()``) bounds what constant
    folding may allocate.
    """
    for run in passes_for(opt_level):
        changed = _apply(run, graph, memory_limit)
        if changed:
            infer_shapes(graph)
        verify_graph(graph, stage=f"after graph pass '{run.__name__}'")
        if log is not None:
            log.append(f"{run.__name__}: {changed}")
    return graph


def _apply(run: Pass, graph: Graph, memory_limit: int | None) -> int:
    """Run one pass; those that allocate new constants of data-dependent size get the budget."""
    if run is fold_constants:
        return fold_constants(graph, memory_limit)
    return run(graph)
