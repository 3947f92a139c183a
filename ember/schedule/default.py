"""The default schedule of a kernel: parallelize outer loops, vectorize the inner one.

For every top-level loop nest of a lowered kernel:

* the outer spatial loops are fused until there are enough iterations to share among threads,
  and the fused loop runs in parallel when the nest does enough work to pay for a fork/join;
* the innermost loop of the nest is vectorized when its body is a plain store (an elementwise
  or broadcast computation), so that codegen emits SIMD code for it;
* an accumulation nest (matrix product, convolution) that does enough work is register tiled
  (``cache_accumulator``): a few rows by two vectors of output accumulate in registers across
  the reduction loops.

Only loops whose iterations store to distinct locations run in parallel or vectorized; a
reduction into a scalar accumulator (a kernel with a scalar output) stays serial.

It is deliberately simple; the tuner searches real schedules over the same primitives.
"""

from __future__ import annotations

from ember.core.traced import as_size, is_traced, may_be_nonzero
from ember.core.target import Target
from ember.ir.loop.expr import Const, Load
from ember.ir.loop.functor import walk
from ember.ir.loop.stmt import Allocate, For, PrimFunc, Store
from ember.schedule.primitives import (Schedule, expr_uses, is_reduction_loop, loop_nests,
                                       perfect_chain)

PARALLEL_MIN_WORK = 1 << 15   # loop iterations (innermost statements) worth a fork/join
PARALLEL_MIN_OUTER = 8        # iterations of the parallel loop: enough to balance 2+ threads
PARALLEL_BALANCED = 16        # outer iterations below which the row tiles are shared instead


CHUNK = 1024  # elements per parallel task when a flat loop is split for threads
COLUMN_BLOCK = 256  # output columns per block in accumulation nests (a 1 KiB row of floats)
# Register tiling of accumulation nests (see schedule/tiling.py) pays from this much work
# (iterations of the nest) and this many reduction terms per output element.
REGISTER_TILE_MIN_WORK = 1 << 17
REGISTER_TILE_MIN_REDUCTION = 8


def default_schedule(func: PrimFunc, target: Target) -> PrimFunc:
    schedule = Schedule(func)
    # Accumulation nests first, while the init and epilogue passes beside them are as lowering
    # emitted them: register tiling folds those passes into its tiles.
    for nest in loop_nests(func.body):
        if dict(nest.annotations).get("accumulation") == "update":
            _schedule_nest(schedule, nest, target, fuse_passes=True)
    for nest in loop_nests(schedule.func.body):
        if not any(isinstance(n, For) and dict(n.annotations).get("tiled")
                   for n in walk(nest)):
            _schedule_nest(schedule, nest, target, fuse_passes=False)
    return schedule.func


def _schedule_nest(schedule: Schedule, nest: For, target: Target, fuse_passes: bool) -> None:
    chain = perfect_chain(nest)
    innermost = chain[-1]
    vectorizable = isinstance(innermost.body, Store) and _extent(innermost) >= 4 and \
        _independent(innermost)
    parallel_worthy = _work(nest) >= PARALLEL_MIN_WORK
    if len(chain) == 1:
        name = innermost.var.name
        if parallel_worthy and _extent(innermost) >= 2 * CHUNK and vectorizable:
            outer, inner = schedule.split(name, CHUNK, tail="peel")
            schedule.parallel(outer)
            schedule.vectorize(inner)
            if may_be_nonzero(_extent(innermost) % CHUNK):
                schedule.vectorize(f"{name}_t")
        elif vectorizable:
            schedule.vectorize(name)
        return
    reduce_loops = [l for l in chain if is_reduction_loop(l)]
    spatial = [l for l in chain if not is_reduction_loop(l)]
    if reduce_loops and spatial and isinstance(innermost.body, Store):
        # Accumulation into the output (lowering chose it because the innermost output
        # loop walks memory contiguously): move the reduction loops outside that loop and
        # vectorize it.
        row = _register_tile_row(chain, spatial, reduce_loops, spatial[-1])
        if fuse_passes and row is None:
            return  # not tiled: scheduled with its init and epilogue passes, as they are
        inner = spatial[-1]
        outer_names = [l.var.name for l in spatial[:-1]]
        inner_name = inner.var.name
        if _extent(inner) >= 2 * COLUMN_BLOCK and not is_traced(_extent(inner)) and \
                _extent(inner) % COLUMN_BLOCK == 0:
            # Column blocks outermost: a block of the reused operand (a matrix product's
            # B) stays in cache while every row accumulates against it.
            block, inner_name = schedule.split(inner_name, COLUMN_BLOCK)
            outer_names = [block] + outer_names
        reduce_names = [l.var.name for l in reduce_loops]
        if row is not None:
            # Register tiling: a rows x cols tile of the output accumulates in registers
            # across the reduction loops (see schedule/tiling.py).
            col_extent = _extent(schedule.get_loop(inner_name))
            rows, cols = _register_tile_shape(col_extent, target.lanes_for(
                innermost.body.buffer.dtype))
            others = [n for n in outer_names if n != row.var.name]
            schedule.reorder(*others, row.var.name, *reduce_names, inner_name)
            row_tiles, _ = schedule.cache_accumulator(row.var.name, inner_name, rows, cols,
                                                      fuse_passes=fuse_passes)
            other_work = 1
            for name in others:
                other_work *= _extent(schedule.get_loop(name))
            # Parallelize the outer loops, unless they are too few to share evenly (the
            # late layers of a CNN: a 7x7 output but 512 channels): then the row tiles.
            done = other_work >= PARALLEL_BALANCED and \
                _parallelize_names(schedule, others, parallel_worthy)
            if parallel_worthy and not done and _extent(row) // rows >= 2:
                schedule.parallel(row_tiles)
            return
        schedule.reorder(*outer_names, *reduce_names, inner_name)
        _parallelize_names(schedule, outer_names, parallel_worthy)
        if _extent(inner) >= 4:
            schedule.vectorize(inner_name)
        return
    if parallel_worthy and _independent(chain[0]):
        name, extent = chain[0].var.name, _extent(chain[0])
        for following in chain[1:-1]:
            if extent >= PARALLEL_MIN_OUTER or not _independent(following):
                break
            name = schedule.fuse(name, following.var.name)
            extent *= _extent(following)
        if extent >= 2:
            schedule.parallel(name)
    if vectorizable:
        schedule.vectorize(innermost.var.name)


def _independent(loop: For) -> bool:
    """Whether the iterations of ``loop`` write disjoint memory, as PARALLEL and VECTORIZED
    promise: every store to memory that outlives an iteration is indexed by the loop variable.
    A scalar accumulator (a reduction to a single value: ``acc[0] = acc[0] + x[k]``) is not."""

    private = {n.buffer for n in walk(loop.body) if isinstance(n, Allocate)}
    return all(expr_uses(n.index, loop.var) for n in walk(loop.body)
               if isinstance(n, Store) and n.buffer not in private)


def _parallelize_outer(schedule: Schedule, loops: list[For], worthy: bool) -> bool:
    """Fuse the leading loops until there are enough iterations, then run them in parallel
    (returns whether a loop became parallel)."""
    if not worthy or not loops:
        return False
    name, extent = loops[0].var.name, _extent(loops[0])
    for following in loops[1:]:
        if extent >= PARALLEL_MIN_OUTER:
            break
        name = schedule.fuse(name, following.var.name)
        extent *= _extent(following)
    if extent >= 2:
        schedule.parallel(name)
        return True
    return False


def _parallelize_names(schedule: Schedule, names: list[str], worthy: bool) -> bool:
    """Like :func:`_parallelize_outer`, for loops given by name (after a split)."""
    return _parallelize_outer(schedule, [schedule.get_loop(n) for n in names], worthy)


def _register_tile_row(chain: list[For], spatial: list[For], reduce_loops: list[For],
                       inner: For) -> For | None:
    """The output loop to tile in rows when register tiling the accumulation nest ``chain``
    pays (else None): the innermost outer output loop that the vector operands (the loads
    indexed by the innermost output loop) do not depend on, so that every row of a tile reuses
    them; the nest must do enough work and reduce over enough terms."""

    if _work(chain[0]) < REGISTER_TILE_MIN_WORK or _extent(inner) < 4:
        return None
    reduction = 1
    for l in reduce_loops:
        reduction *= max(_extent(l), 1)
    if reduction < REGISTER_TILE_MIN_REDUCTION:
        return None
    store = chain[-1].body
    vector_loads = [n for n in walk(store.value) if isinstance(n, Load) and
                    n.buffer != store.buffer and expr_uses(n.index, inner.var)]
    for loop in reversed(spatial[:-1]):
        if _extent(loop) >= 2 and not any(expr_uses(n.index, loop.var) for n in vector_loads):
            return loop
    return None


def _register_tile_shape(col_extent: int, lanes: int) -> tuple[int, int]:
    """Rows x columns of a register tile: 2 vectors wide and 6 rows (12 accumulator vectors
    plus 2 operand vectors and a broadcast fit 16 registers), narrower for short rows."""
    if col_extent >= 2 * lanes:
        return 6, 2 * lanes
    if col_extent >= lanes:
        return 8, lanes
    return 8, col_extent


def _extent(loop: For) -> int:

    return as_size(loop.extent.value) if isinstance(loop.extent, Const) else 0


def _work(loop: For) -> int:
    """Iterations of the innermost statements of a nest (product of loop extents)."""

    total = 1
    for node in walk(loop):
        if isinstance(node, For):
            total *= max(_extent(node), 1)
    return total
