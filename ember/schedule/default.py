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

Before that, the loops of an elementwise nest that every access walks as one are merged into
one loop (an ``[8, 64, 56, 56]`` activation is one loop of 1.6 M elements, not rows of 56), and
a loop over rows whose bodies hold loops of their own (after row fusion, see
:mod:`ember.schedule.row_fusion`) runs its rows in parallel with their inner elementwise loops
vectorized.

Each of those decisions is a knob of the kernel's config (``nest<i>.coalesce``, ``.chunk``,
``.vectorize``, ``.vectorize_inner``, ``.parallel``, ``.parallel_loops``,
``.register_tile``, ``.column_block``: see :mod:`ember.schedule.config`): the rules above
propose the defaults, a config may choose any other legal value, and a tuner searches over
them.
"""

from __future__ import annotations

from dataclasses import replace

from ember.core.traced import as_size, is_traced, may_be_nonzero, plain
from ember.core.target import Target
from ember.ir.loop.affine import affine_coefficients
from ember.ir.loop.expr import Const, Load, Var
from ember.ir.loop.functor import rewrite_stmts, walk, walk_stmts
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import Allocate, For, ForKind, PrimFunc, Seq, Stmt, Store
from ember.schedule.config import Decisions
from ember.schedule.primitives import (Schedule, ScheduleError, expr_uses, is_reduction_loop, loop_nests,
                                       perfect_chain)

PARALLEL_MIN_WORK = 1 << 15   # loop iterations (innermost statements) worth a fork/join
PARALLEL_MIN_OUTER = 8        # iterations of the parallel loop: enough to balance 2+ threads
PARALLEL_BALANCED = 16        # outer iterations below which the row tiles are shared instead


CHUNK = 1024  # elements per parallel task when a flat loop is split for threads
COLUMN_BLOCK = 256  # output columns per block in accumulation nests (a 1 KiB row of floats)
# The values a search may try for those knobs (see ember.schedule.config).
CHUNK_CHOICES = tuple(1 << p for p in range(2, 13))         # 4 .. 4096
COLUMN_BLOCK_CHOICES = tuple(1 << p for p in range(2, 11))  # 4 .. 1024
TILE_ROW_CHOICES = (2, 4, 6, 8)
# Register tiling of accumulation nests (see schedule/tiling.py) pays from this much work
# (iterations of the nest) and this many reduction terms per output element.
REGISTER_TILE_MIN_WORK = 1 << 17
REGISTER_TILE_MIN_REDUCTION = 8


def default_schedule(func: PrimFunc, target: Target,
                     decisions: Decisions | None = None,
                     schedule: Schedule | None = None) -> PrimFunc:
    """Parallelize and vectorize the loop nests of ``func`` (see the module docstring); every
    decision is asked of ``decisions`` (``nest<i>.*`` knobs, ``i`` the nest's position in
    ``func``), whose defaults are the heuristic described above.  The primitives applied are
    recorded on ``schedule`` (a fresh one over ``func`` when not given)."""
    decisions = decisions if decisions is not None else Decisions(kernel=func.name)
    schedule = schedule if schedule is not None else Schedule(func)
    schedule.func = _label_nests(schedule.func)
    answered: dict[str, tuple[int, ...]] = {}
    # Accumulation nests first, while the init and epilogue passes beside them are as lowering
    # emitted them: register tiling folds those passes into its tiles.
    for nest in loop_nests(schedule.func.body):
        if dict(nest.annotations).get("accumulation") == "update":
            _schedule_nest(schedule, nest, target, decisions, answered, fuse_passes=True)
    unlabeled = 0
    for nest in loop_nests(schedule.func.body):
        if any(isinstance(n, For) and dict(n.annotations).get("tiled") for n in walk(nest)):
            continue
        if _NEST not in dict(nest.annotations):  # a loop a primitive made (a peeled tail)
            nest = _relabel(schedule, nest, f"x{unlabeled}")
            unlabeled += 1
        _schedule_nest(schedule, nest, target, decisions, answered, fuse_passes=False)
    schedule.func = _strip_labels(schedule.func)
    return schedule.func


_NEST = "nest"  # the annotation naming a nest's knobs while the schedule runs


def _label_nests(func: PrimFunc) -> PrimFunc:
    """``func`` with each top-level loop nest annotated with its position (its knob prefix),
    in the order of :func:`loop_nests` (by position: equal nests may be one shared object)."""
    counter = iter(range(1 << 62))

    def label(stmt: Stmt) -> Stmt:
        if isinstance(stmt, For):
            return replace(stmt, annotations=stmt.annotations + ((_NEST, next(counter)),))
        if isinstance(stmt, Seq):
            return Seq(tuple(label(s) for s in stmt.stmts))
        if isinstance(stmt, Allocate):
            return replace(stmt, body=label(stmt.body))
        return stmt

    return func.with_body(label(func.body))


def _relabel(schedule: Schedule, nest: For, label: str) -> For:
    labeled = replace(nest, annotations=nest.annotations + ((_NEST, label),))
    schedule.func = schedule.func.with_body(rewrite_stmts(
        schedule.func.body, lambda n: labeled if n is nest else None))
    return labeled


def _strip_labels(func: PrimFunc) -> PrimFunc:
    return func.with_body(rewrite_stmts(func.body, lambda n: replace(
        n, annotations=tuple(a for a in n.annotations if a[0] != _NEST))
        if isinstance(n, For) and any(a[0] == _NEST for a in n.annotations) else None))


def _schedule_nest(schedule: Schedule, nest: For, target: Target, decisions: Decisions,
                   answered: dict[str, tuple[int, ...]], fuse_passes: bool) -> None:
    knob = f"nest{dict(nest.annotations)[_NEST]}"
    chain = perfect_chain(nest)
    innermost = chain[-1]
    vectorizable = isinstance(innermost.body, Store) and _extent(innermost) >= 4 and \
        _independent(innermost)
    parallel_worthy = _work(nest) >= PARALLEL_MIN_WORK
    reduce_loops = [l for l in chain if is_reduction_loop(l)]
    spatial = [l for l in chain if not is_reduction_loop(l)]
    accumulation = bool(reduce_loops and spatial and isinstance(innermost.body, Store))
    if fuse_passes and not accumulation:
        return  # (an "update" over no reduction loop: scheduled as the plain nest it is)
    if not accumulation and not reduce_loops:
        mergeable = _coalescible(chain)
        if mergeable > 1 and decisions.choose(
                f"{knob}.coalesce", True, [False, True],
                f"merge the {mergeable} innermost loops, which every access walks as one, "
                f"into one loop"):
            nest = _coalesce(schedule, chain[-mergeable:], nest)
            chain = perfect_chain(nest)
            innermost = chain[-1]
            vectorizable = isinstance(innermost.body, Store) and _extent(innermost) >= 4 and \
                _independent(innermost)
    if len(chain) == 1 and not isinstance(innermost.body, Store):
        # one loop over rows whose bodies reduce or hold loops of their own (a coalesced
        # LayerNorm's statistics): its iterations are the parallel tasks
        independent = _independent(innermost)
        fused = decisions.choose(
            f"{knob}.parallel_loops",
            1 if parallel_worthy and independent and _extent(innermost) >= 2 else 0,
            [0, *([1] if independent else [])], "whether the loop is shared among threads")
        if fused:
            schedule.parallel(innermost.var.name)
        inner = [n for n in walk_stmts(innermost.body) if isinstance(n, For) and
                 n.kind is ForKind.SERIAL and isinstance(n.body, Store) and
                 _extent(n) >= 4 and _independent(n)]
        if inner and decisions.choose(
                f"{knob}.vectorize_inner", True, [False, True],
                "map the innermost elementwise loops inside each row onto SIMD lanes"):
            for loop in inner:
                schedule.vectorize(loop.var.name)
        return
    if len(chain) == 1:
        name = innermost.var.name
        extent = _extent(innermost)
        # (the choices compare samples: only the heuristic's own tests guard a traced size)
        chunks = [c for c in CHUNK_CHOICES if vectorizable and plain(extent) >= 2 * c]
        proposed = CHUNK if parallel_worthy and extent >= 2 * CHUNK and vectorizable else 0
        chunk = decisions.choose(
            f"{knob}.chunk", proposed, [0, *chunks],
            "elements per parallel task of a flat loop (0: the loop stays serial)")
        vectorize = decisions.choose(f"{knob}.vectorize", vectorizable,
                                     [False, *([True] if vectorizable else [])],
                                     "map the loop onto SIMD lanes")
        if chunk:
            outer, inner = schedule.split(name, chunk, tail="peel")
            schedule.parallel(outer)
            if vectorize:
                schedule.vectorize(inner)
                if may_be_nonzero(extent % chunk):
                    schedule.vectorize(f"{name}_t")
        elif vectorize:
            schedule.vectorize(name)
        return
    if accumulation:
        # Accumulation into the output (lowering chose it because the innermost output
        # loop walks memory contiguously): move the reduction loops outside that loop and
        # vectorize it.
        inner = spatial[-1]
        row = _tile_row_candidate(chain, spatial, inner)
        if knob in answered:
            tile = answered[knob]
        else:
            lanes = target.lanes_for(innermost.body.buffer.dtype)
            tiles = _register_tiles(plain(_extent(inner)), lanes) if row is not None else []
            pays = row is not None and _register_tiling_pays(chain, reduce_loops, inner)
            tile = decisions.choose(
                f"{knob}.register_tile",
                _register_tile_shape(_extent(inner), lanes) if pays else (), [(), *tiles],
                "rows x columns of output accumulated in registers across the reduction "
                "(empty: none)")
            answered[knob] = tile
        if fuse_passes and not tile:
            return  # not tiled: scheduled with its init and epilogue passes, as they are
        outer_names = [l.var.name for l in spatial[:-1]]
        inner_name = inner.var.name
        width = _extent(inner)
        blocks = [] if is_traced(width) else \
            [b for b in COLUMN_BLOCK_CHOICES if width >= 2 * b and width % b == 0]
        block = decisions.choose(
            f"{knob}.column_block", COLUMN_BLOCK if COLUMN_BLOCK in blocks else 0,
            [0, *blocks], "output columns per block, outermost, so that a block of the "
            "reused operand stays in cache while every row accumulates against it (0: none)")
        if block:
            block_name, inner_name = schedule.split(inner_name, block)
            outer_names = [block_name] + outer_names
        reduce_names = [l.var.name for l in reduce_loops]
        if tile:
            # Register tiling: a rows x cols tile of the output accumulates in registers
            # across the reduction loops (see schedule/tiling.py).
            if row is None:
                raise ScheduleError(f"{schedule.func.name}: {knob}.register_tile {tile} needs "
                                    f"a row loop that the vector operands do not depend on")
            rows, cols = tile
            others = [n for n in outer_names if n != row.var.name]
            other_work = 1
            for name in others:
                other_work *= _extent(schedule.get_loop(name))
            # Parallelize the outer loops, unless they are too few to share evenly (the
            # late layers of a CNN: a 7x7 output but 512 channels): then the row tiles.
            if not parallel_worthy:
                proposed = "none"
            elif other_work >= PARALLEL_BALANCED and others:
                proposed = "outer"
            else:
                proposed = "row_tiles" if _extent(row) // rows >= 2 else "none"
            where = decisions.choose(
                f"{knob}.parallel", proposed,
                ["none", *(["outer"] if others else []),
                 *(["row_tiles"] if plain(_extent(row)) // rows >= 2 else [])],
                "the loops shared among threads: the fused outer output loops, the row "
                "tiles, or none")
            schedule.reorder(*others, row.var.name, *reduce_names, inner_name)
            row_tiles, _ = schedule.cache_accumulator(row.var.name, inner_name, rows, cols,
                                                      fuse_passes=fuse_passes)
            if where == "outer":
                _parallelize_names(schedule, others)
            elif where == "row_tiles":
                schedule.parallel(row_tiles)
            return
        where = decisions.choose(
            f"{knob}.parallel", "outer" if parallel_worthy and outer_names else "none",
            ["none", *(["outer"] if outer_names else [])],
            "whether the fused outer output loops are shared among threads")
        vectorize = decisions.choose(f"{knob}.vectorize", _extent(inner) >= 4,
                                     [False, *([True] if _extent(inner) >= 4 else [])],
                                     "map the innermost output loop onto SIMD lanes")
        schedule.reorder(*outer_names, *reduce_names, inner_name)
        if where == "outer":
            _parallelize_names(schedule, outer_names)
        if vectorize:
            schedule.vectorize(inner_name)
        return
    fusable = 0  # leading loops that may run in parallel, fused
    if _independent(chain[0]):
        fusable = 1
        for following in chain[1:-1]:
            if not _independent(following):
                break
            fusable += 1
    proposed = 0
    if parallel_worthy and fusable:
        extent = _extent(chain[0])
        proposed = 1
        while proposed < fusable and extent < PARALLEL_MIN_OUTER:
            extent *= _extent(chain[proposed])
            proposed += 1
        if extent < 2:
            proposed = 0
    fused = decisions.choose(
        f"{knob}.parallel_loops", proposed, range(fusable + 1),
        "how many leading loops are fused and shared among threads (0: none)")
    vectorize = decisions.choose(f"{knob}.vectorize", vectorizable,
                                 [False, *([True] if vectorizable else [])],
                                 "map the innermost loop onto SIMD lanes")
    if fused:
        name = chain[0].var.name
        for following in chain[1:fused]:
            name = schedule.fuse(name, following.var.name)
        schedule.parallel(name)
    if vectorize:
        schedule.vectorize(innermost.var.name)


def _coalescible(chain: list[For]) -> int:
    """How many innermost loops of the perfect nest ``chain`` every access walks as one loop
    (for each adjacent pair, every load and store moves by the inner loop's extent times its
    step along the inner loop when the outer one steps): an elementwise kernel over
    ``[8, 64, 56, 56]`` is one loop of 1.6 M elements, vectorized without 56-element rows
    and their tails.  The loops must have plain constant extents and their variables may
    appear only in access indices (a guard of a padded window needs them apart)."""
    body = chain[-1].body
    accesses = [n.index for n in walk(body) if isinstance(n, (Load, Store))]
    coefficients = [affine_coefficients(simplify(index)) for index in accesses]
    if any(c is None for c in coefficients) or \
            any(is_traced(_extent(l)) or _extent(l) < 1 for l in chain):
        return 0
    loop_vars = {l.var for l in chain}

    def uses(node) -> int:
        return sum(1 for n in walk(node) if isinstance(n, Var) and n in loop_vars)

    if sum(uses(index) for index in accesses) != uses(body):
        return 0  # a loop variable outside an index (a guard, a value)
    # the merged group so far: per access, the step of its innermost loop of extent > 1,
    # and its extent (unit loops merge with anything: they do not move)
    steps: list[int] | None = None
    span = 1
    count = 0
    for loop in reversed(chain):
        extent = _extent(loop)
        if extent > 1:
            moves = [c.get(loop.var, 0) for c in coefficients]
            if steps is not None and moves != [step * span for step in steps]:
                break
            if steps is None:
                steps = moves
            span *= extent
        count += 1
    return count


def _coalesce(schedule: Schedule, loops: list[For], nest: For) -> For:
    """Fuse ``loops`` (perfectly nested, innermost last) into one loop; returns the nest."""
    name = loops[0].var.name
    for following in loops[1:]:
        name = schedule.fuse(name, following.var.name)
    return schedule.get_loop(nest.var.name if loops[0] is not nest else name)


def _independent(loop: For) -> bool:
    """Whether the iterations of ``loop`` write disjoint memory, as PARALLEL and VECTORIZED
    promise: every store to memory that outlives an iteration is indexed by the loop variable.
    A scalar accumulator (a reduction to a single value: ``acc[0] = acc[0] + x[k]``) is not,
    nor is a scatter over its updates: a store whose position is read from memory at an index
    that moves with the loop (two iterations may name one element, and then the later one
    must win).  Within one update's slice -- the position read once, outside the loop -- the
    iterations are independent again."""

    private = {n.buffer for n in walk(loop.body) if isinstance(n, Allocate)}
    stores = [n for n in walk(loop.body) if isinstance(n, Store) and n.buffer not in private]
    return all(expr_uses(n.index, loop.var) and
               not any(isinstance(m, Load) and expr_uses(m.index, loop.var)
                       for m in walk(n.index)) for n in stores)


def _parallelize_outer(schedule: Schedule, loops: list[For]) -> bool:
    """Fuse the leading loops until there are enough iterations, then run them in parallel
    (returns whether a loop became parallel)."""
    if not loops:
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


def _parallelize_names(schedule: Schedule, names: list[str]) -> bool:
    """Like :func:`_parallelize_outer`, for loops given by name (after a split)."""
    return _parallelize_outer(schedule, [schedule.get_loop(n) for n in names])


def _tile_row_candidate(chain: list[For], spatial: list[For], inner: For) -> For | None:
    """The output loop to tile in rows when register tiling the accumulation nest ``chain``
    (else None): the innermost outer output loop that the vector operands (the loads indexed
    by the innermost output loop ``inner``) do not depend on, so that every row of a tile
    reuses them."""
    if _extent(inner) < 4:
        return None
    store = chain[-1].body
    vector_loads = [n for n in walk(store.value) if isinstance(n, Load) and
                    n.buffer != store.buffer and expr_uses(n.index, inner.var)]
    for loop in reversed(spatial[:-1]):
        if _extent(loop) >= 2 and not any(expr_uses(n.index, loop.var) for n in vector_loads):
            return loop
    return None


def _register_tiling_pays(chain: list[For], reduce_loops: list[For], inner: For) -> bool:
    """The heuristic: register tiling pays when the nest does enough work and reduces over
    enough terms per output element."""
    if _work(chain[0]) < REGISTER_TILE_MIN_WORK:
        return False
    reduction = 1
    for l in reduce_loops:
        reduction *= max(_extent(l), 1)
    return reduction >= REGISTER_TILE_MIN_REDUCTION


def _register_tiles(col_extent: int, lanes: int) -> list[tuple[int, int]]:
    """The register tiles a search may try: a few rows by one or two vectors (by the whole
    row when it is shorter than a vector)."""
    widths = [c for c in (lanes, 2 * lanes) if c <= col_extent] or [col_extent]
    return [(rows, cols) for rows in TILE_ROW_CHOICES for cols in widths]


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
