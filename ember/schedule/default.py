"""The default schedule of a kernel: parallelize outer loops, vectorize the inner one.

For every top-level loop nest of a lowered kernel:

* the outer spatial loops are fused until there are enough iterations to share among threads,
  and the fused loop runs in parallel when the nest does enough work to pay for a fork/join;
* the innermost loop of the nest is vectorized when its body is a plain store (an elementwise
  or broadcast computation), so that codegen emits SIMD code for it.

It is deliberately simple; the tuner searches real schedules over the same primitives.
"""

from __future__ import annotations

from ember.core.target import Target
from ember.ir.loop.stmt import For, PrimFunc, Store
from ember.schedule.primitives import Schedule, loop_nests, perfect_chain

PARALLEL_MIN_WORK = 1 << 15   # loop iterations (innermost statements) worth a fork/join
PARALLEL_MIN_OUTER = 8        # iterations of the parallel loop: enough to balance 2+ threads


CHUNK = 1024  # elements per parallel task when a flat loop is split for threads


def default_schedule(func: PrimFunc, target: Target) -> PrimFunc:
    schedule = Schedule(func)
    for nest in loop_nests(func.body):
        chain = perfect_chain(nest)
        innermost = chain[-1]
        vectorizable = isinstance(innermost.body, Store) and _extent(innermost) >= 4
        parallel_worthy = _work(nest) >= PARALLEL_MIN_WORK
        if len(chain) == 1:
            name = innermost.var.name
            if parallel_worthy and _extent(innermost) >= 2 * CHUNK and vectorizable:
                outer, inner = schedule.split(name, CHUNK, tail="peel")
                schedule.parallel(outer)
                schedule.vectorize(inner)
                if _extent(innermost) % CHUNK:
                    schedule.vectorize(f"{name}_t")
            elif vectorizable:
                schedule.vectorize(name)
            continue
        reduce_loops = [l for l in chain if _is_reduce(l)]
        spatial = [l for l in chain if not _is_reduce(l)]
        if reduce_loops and spatial and isinstance(innermost.body, Store):
            # Accumulation into the output (lowering chose it because the innermost output
            # loop walks memory contiguously): move the reduction loops outside that loop and
            # vectorize it.
            order = [l.var.name for l in spatial[:-1] + reduce_loops + spatial[-1:]]
            schedule.reorder(*order)
            _parallelize_outer(schedule, spatial[:-1], parallel_worthy)
            if _extent(spatial[-1]) >= 4:
                schedule.vectorize(spatial[-1].var.name)
            continue
        if parallel_worthy:
            name, extent = chain[0].var.name, _extent(chain[0])
            for following in chain[1:-1]:
                if extent >= PARALLEL_MIN_OUTER:
                    break
                name = schedule.fuse(name, following.var.name)
                extent *= _extent(following)
            if extent >= 2:
                schedule.parallel(name)
        if vectorizable:
            schedule.vectorize(innermost.var.name)
    return schedule.func


def _is_reduce(loop: For) -> bool:
    return bool(dict(loop.annotations).get("reduce"))


def _parallelize_outer(schedule: Schedule, loops: list[For], worthy: bool) -> None:
    """Fuse the leading loops until there are enough iterations, then run them in parallel."""
    if not worthy or not loops:
        return
    name, extent = loops[0].var.name, _extent(loops[0])
    for following in loops[1:]:
        if extent >= PARALLEL_MIN_OUTER:
            break
        name = schedule.fuse(name, following.var.name)
        extent *= _extent(following)
    if extent >= 2:
        schedule.parallel(name)


def _extent(loop: For) -> int:
    from ember.ir.loop.expr import Const

    return int(loop.extent.value) if isinstance(loop.extent, Const) else 0


def _work(loop: For) -> int:
    """Iterations of the innermost statements of a nest (product of loop extents)."""
    from ember.ir.loop.functor import walk

    total = 1
    for node in walk(loop):
        if isinstance(node, For):
            total *= max(_extent(node), 1)
    return total
