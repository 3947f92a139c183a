"""Matrix products onto the GEMM template.

Lowering emits a contraction -- MatMul, Gemm (any ``transA``/``transB``), a 1x1 or
fully-connected Conv, a batched matmul -- as a loop nest that accumulates products of two
loads, in one of two shapes:

* *update*: an ``init`` pass over the output, ``out[..] = out[..] + a[..] * b[..]`` inside
  the reduction loops, then an ``epilogue`` pass (the fused bias, activation, residual);
* *scalar*: per output element, a local accumulator over the reduction, then one store of
  the epilogue applied to it (the choice when the output is not contiguous along the
  innermost loop, e.g. ``transB``).

:func:`use_gemm_template` recognizes both by their indices alone (affine analysis, no op
names), so that every exporter's idiom and every layout reaches the same kernel: it drops
unit loops, merges loops that walk memory as one (a conv's ``H x W``), and asks for exactly
one reduction loop ``k``, an output loop ``j`` along which the output is contiguous and only
one operand (B) moves, and optionally a loop ``i`` along which only the other operand (A)
moves; remaining output loops are batch loops.  Such a nest becomes one
:class:`~ember.ir.loop.stmt.Gemm` statement, which codegen expands into the blocked,
register-tiled template (``codegen/c_gemm.py``) with the epilogue applied to each tile.

When B is a constant of the graph (a weight), it is packed at compile time into the layout
the micro-kernel reads (:class:`Prepack`), so a transposed or strided weight costs nothing at
run time; so is a constant A (a convolution's weights), into strips of MR rows.  A run-time B
with contiguous rows is read in place (only a partial last panel is copied); any other B is
gathered into panels in a scratch buffer by the kernel itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ember.core.traced import as_size, is_traced, may_be_nonzero, plain, size_class
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.loop.affine import affine_coefficients
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, Binary, Const, Expr, Load, Var
from ember.ir.loop.functor import rewrite, substitute, walk
from ember.ir.loop.simplify import simplify
from ember.schedule.primitives import ScheduleError
from ember.ir.loop.stmt import (Allocate, For, Gemm, GemmKnobs, PrimFunc, Seq, Stmt, Store,
                                seq)

# Products smaller than this (multiply-adds) stay plain loops: the template's blocking and
# packing cost more than they save.
MIN_GEMM_WORK = 1 << 12
# Work (multiply-adds) per parallel task that pays for sharing among threads.
WORK_PER_TASK = 1 << 20
# ... and bytes of B per task: a product with few rows (a batch-1 Linear) does little work per
# byte of its weights and is bound by streaming them, so its tasks are sized by B's bytes
# (the MLP 784-1024-1024 at batch 1 ran one task per layer: 13 % slower than split in 16).
B_BYTES_PER_TASK = 256 << 10
MAX_TASKS = 32
ROWS_PER_TASK = 96  # rows of A per task: a 96 x kc block of A stays in L2
# The most scratch that B's panels for every batch element may take (more: one at a time).
# Packing every element at once makes one parallel loop of all their tasks instead of a pack
# and a task loop per element: ResNet-18 at batch 16 (its last two stages) ran 5 % faster
# with 32 MiB than with 8.
ALL_COPIES_BYTES = 32 << 20
# Products with fewer rows do not pay for packing B at run time.
MIN_ROWS_TO_PACK = 4
# The most scratch a run-time packed (im2col) B may take.
MAX_PACK_BYTES = 64 << 20
# A batch whose elements' products have fewer columns than this (images up to 31x31) is
# folded into the columns by default: the weights stream once for the batch instead of once
# per element, and a 7x7 image's 49 columns no longer pad to 64 per element.
FOLD_BELOW_COLUMNS = 1024
# A folded product's task accumulates its block of the output in a scratch on the stack (a
# tile's columns may belong to two elements, whose outputs are apart): at most this big.
FOLD_SCRATCH_BYTES = 64 << 10
# Products with at most this many rows whose B runs are a multiple of the vector width but
# not of the default tile's take one-vector tiles, so that their panels are read in place
# (tinynet's 16-channel convolutions over 16x16 images: the model 10 % faster).
RUN_TILE_MAX_ROWS = 32
# Products with fewer rows than this take the register tile height that pads the fewest rows
# (among heights with enough accumulators); more rows pad too few to matter.
MANY_ROWS = 160
# Multiply-adds of one product (per batch element when B differs per element) from which its
# tasks run on the thread pool.
PARALLEL_WORK = 1 << 17
# A product of at least MIN_TASKS_PER_THREAD x PARALLEL_WORK multiply-adds gets at least this
# many tasks per thread, however few its size rules give: a bidirectional LSTM's step
# (8 x 384 x 96, one task by work and bytes) ran on one thread; with 4 tasks the layer took
# 580 us instead of 740 (Zen 3, 2 threads).
MIN_TASKS_PER_THREAD = 2
# Rows from which a product whose columns fill their vectors badly turns its tile around
# (GemmKnobs.vector_rows), and by how much less the rows must waste than the columns: a
# convolution over a 7x7 image (49 columns: 64 lanes of work) with 512 output channels.
VECTOR_ROWS_MIN_ROWS = 64
VECTOR_ROWS_MIN_GAIN = 1.1


@dataclass(frozen=True)
class Prepack:
    """Pack a constant B (read through ``base + k*rs + j*cs`` of its flat array) into panels
    of ``nr`` columns, ``(ceil(n / nr), k, nr)``, zero padded: the layout the micro-kernel
    streams.  A constant A is packed the same way as the transposed matrix, into strips of
    ``mr`` rows.  ``param`` is the position of the parameter that receives the packed
    array."""

    param: int
    k: int
    n: int
    rs: int
    cs: int
    base: int
    nr: int

    def apply(self, array: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(array).reshape(-1)
        rows = self.base + np.arange(self.k)[:, None] * self.rs + \
            np.arange(self.n)[None, :] * self.cs
        matrix = flat[rows]                                     # (k, n)
        panels = -(-self.n // self.nr)
        padded = np.zeros((self.k, panels * self.nr), dtype=flat.dtype)
        padded[:, :self.n] = matrix
        return np.ascontiguousarray(padded.reshape(self.k, panels, self.nr).transpose(1, 0, 2))


@dataclass
class _Product:
    """An accumulation nest in normal form: loops (variable, extent) outer to inner."""

    spatial: list[tuple[Var, int]]
    reduce: list[tuple[Var, int]]
    out: Buffer
    out_index: Expr
    lhs: Load
    rhs: Load
    init: Expr
    finish: Expr | None      # an expression of ``result`` and the loop variables
    result: Var


@dataclass(frozen=True)
class GemmShape:
    """What a chooser of a product's blocking knows about it: its sizes, the batch its
    blocking plans for (1 when B differs per batch element), how many products the batch
    loops run in all, whether B is a weight packed at compile time and whether the run-time
    packing of B is an im2col gather."""

    m: int
    n: int
    k: int
    batch: int
    products: int
    b_prepacked: bool
    gathered: bool
    # whether the batch may be folded into the columns (GemmKnobs.fold_batch)
    foldable: bool = False
    # whether B is a run-time matrix with contiguous rows, which may be read in place
    # (GemmKnobs.b_in_place)
    b_rows_contiguous: bool = False
    # a gathered B's runs of consecutive columns (a stride-1 convolution's output row), 0 if
    # none: panels within a run may be read in place (GemmKnobs.b_panels_in_place)
    row_width: int = 0
    # whether the output's columns lie in runs apart (Gemm.out_in_runs): a task then
    # accumulates its block in a stack scratch, which caps its columns as a fold's are
    out_runs: bool = False
    # whether A is a constant packed at compile time into row strips (Gemm.a_packed)
    a_prepacked: bool = False
    # whether A's reduction walk spans several strides (Gemm.a_gathered: a blocked
    # convolution's input), read in place through a table of offsets, never copied
    a_gathered: bool = False

    def folded(self) -> "GemmShape":
        """The shape the template runs with the batch folded into the columns."""
        return replace(self, n=self.n * self.products, batch=1, foldable=False)

    def default_knobs(self, target: Target, tile: tuple[int, int] | None = None) -> GemmKnobs:
        """The default blocking (sizes planned for by class: call it only for a product that
        takes the template, or its guards would tie a traced build to sizes it need not)."""
        return default_knobs(self.m, self.n, self.k, self.batch, target,
                             tile if tile is not None else self._run_tile(target))

    def _run_tile(self, target: Target) -> tuple[int, int] | None:
        """A one-vector-wide tile where a product with few rows reads its B in runs that the
        default tile's panels straddle but one vector's fit (a convolution with 16 output
        channels over 16-pixel rows: every panel read in place instead of packed); None for
        the default tile.  With few rows the packing is most of the product's cost."""
        lanes = target.lanes_for(DType.FLOAT32)
        _, nr = register_tile_columns(target)
        width = self.row_width
        if not width or self.m > RUN_TILE_MAX_ROWS or lanes >= nr or width % nr == 0 or \
                width % lanes:
            return None
        heights = [rows for rows, cols in tile_choices(target) if cols == lanes]
        return (_fewest_padded_rows(self.m, heights), lanes) if heights else None


def folded_knobs(knobs: GemmKnobs) -> GemmKnobs:
    """``knobs`` for the folded product, with tasks narrow enough for their scratch block of
    the output (``FOLD_SCRATCH_BYTES``)."""
    return replace(knobs, fold_batch=True, nc=min(knobs.nc, fold_columns_limit(knobs.mc,
                                                                              knobs.nr)))


def fold_columns_limit(mc: int, nr: int) -> int:
    """The most columns a task of ``mc`` rows may take (whole panels) when it accumulates
    in a stack scratch (a folded batch, or an output in runs)."""
    return max(nr, FOLD_SCRATCH_BYTES // (4 * mc) // nr * nr)


def fold_pays(shape: GemmShape, target: Target) -> bool:
    """The heuristic: fold a foldable batch whose elements have few columns (see
    ``FOLD_BELOW_COLUMNS``), when the folded product takes the template."""
    return shape.foldable and shape.n < FOLD_BELOW_COLUMNS and \
        template_pays(shape.folded(), target)


_UNCHOSEN = GemmKnobs(0, 0, 0, 0, 0, 0)  # a product's knobs until its chooser decides them


class GemmChooser:
    """Decides, product by product (``index`` counts the products of a kernel met so far),
    whether it takes the template and with which knobs.  The base class is the default
    heuristic; :class:`ember.schedule.pipeline` subclasses it to ask a kernel config."""

    def __init__(self, target: Target):
        self.target = target

    def knobs(self, index: int, shape: GemmShape) -> GemmKnobs | None:
        """The blocking of product ``index``, or None to keep its plain loops."""
        if reads_a_in_place(shape, self.target):
            return gathered_a_knobs(shape, self.target) \
                if template_pays(shape, self.target) else None
        if fold_pays(shape, self.target):
            return folded_knobs(shape.folded().default_knobs(self.target))
        if not template_pays(shape, self.target):
            return None
        if vector_rows_pay(shape, self.target):
            return vector_rows_knobs(shape, self.target)
        knobs = shape.default_knobs(self.target)
        return replace(knobs, nc=min(knobs.nc, fold_columns_limit(knobs.mc, knobs.nr))) \
            if shape.out_runs else knobs

    def finish(self, index: int, gemm: Gemm, pack_in_task_legal: bool) -> GemmKnobs:
        """The final knobs once B's packing is known: pack in the task wherever every panel
        belongs to one task; run the tasks in parallel when there is enough work."""
        return replace(gemm.knobs, pack_in_task=pack_in_task_legal,
                       parallel=default_parallel(gemm),
                       b_panels_in_place=pack_in_task_legal and panels_in_place_legal(gemm))


def vector_rows_pay(shape: GemmShape, target: Target) -> bool:
    """The heuristic: turn the register tile around (``GemmKnobs.vector_rows``) for a product
    of a constant A with at least ``VECTOR_ROWS_MIN_ROWS`` rows whose columns waste at least
    ``VECTOR_ROWS_MIN_GAIN`` times as many vector lanes as its rows would (49 columns take 64
    lanes, 512 rows exactly 512)."""
    if not shape.a_prepacked or is_traced(shape.m) or is_traced(shape.n) or \
            shape.m < VECTOR_ROWS_MIN_ROWS:
        return False
    lanes = target.lanes_for(DType.FLOAT32)
    if lanes < 4:
        return False

    def waste(size: int) -> float:
        return -(-size // lanes) * lanes / size

    return waste(shape.n) >= VECTOR_ROWS_MIN_GAIN * waste(shape.m)


def reads_a_in_place(shape: GemmShape, target: Target) -> bool:
    """Whether the product reads A where it lies, never copied, on a tall tile of one or two
    vectors (:func:`gathered_a_knobs`): its reduction walks A through a table of offsets
    (``a_gathered``, a blocked convolution), or its columns are one vector whose B needs no
    packing (a blocked 1x1 convolution, its pixels merged into one run of rows: each row of
    A meets one panel only, so copying it into strips costs what the product does, and the
    usual two-vector tile would multiply as many zero columns)."""
    if shape.a_gathered:
        return True
    # (sizes known at compile time only: a blocked convolution's always are, and a traced
    # product keeps the blocking its class plans)
    return not (is_traced(shape.m) or is_traced(shape.n) or is_traced(shape.k) or
                shape.a_prepacked or shape.foldable) and \
        shape.n == target.lanes_for(DType.FLOAT32) and \
        (shape.b_prepacked or shape.b_rows_contiguous)


def gathered_a_tiles(target: Target, n: int) -> list[tuple[int, int]]:
    """Register tiles (rows, columns) of a product whose A is read in place (``a_gathered``):
    taller than the packed products' -- every row is one broadcast of A's element, an
    operand of its multiply-add -- as tall as the accumulators, one B vector and a broadcast
    fit the target's vector registers (28 rows of one AVX-512 vector), and no wider than the
    product's columns need."""
    lanes = target.lanes_for(DType.FLOAT32)
    registers = 32 if lanes >= 16 else 16
    if lanes < 4:
        return [register_tile_columns(target)]
    widths = [vectors for vectors in (1, 2) if vectors == 1 or plain(n) > lanes]
    return [(rows, vectors * lanes) for vectors in widths
            for rows in (4, 6, 7, 8, 12, 14, 16, 20, 24, 28)
            if rows * vectors + vectors + 1 <= registers]


def gathered_a_knobs(shape: GemmShape, target: Target,
                     tile: tuple[int, int] | None = None) -> GemmKnobs:
    """The default blocking of a product whose A is read in place (``a_gathered``): the
    rows split into the fewest strips of the tallest tile (a 56-pixel output row in two
    strips of 28, a 7-pixel one in one of 7), B's columns in one or two vectors, A never
    copied (its reads are the broadcasts)."""
    if tile is None:
        tiles = gathered_a_tiles(target, shape.n)
        nr = max(cols for _, cols in tiles) if plain(shape.n) > tiles[0][1] else tiles[0][1]
        tallest = max(rows for rows, cols in tiles if cols == nr)
        m = size_class(shape.m)  # (a traced size: planned for its class)
        strips = -(-m // tallest)
        tile = (-(-m // strips), nr)
    knobs = default_knobs(shape.m, shape.n, shape.k, shape.batch, target, tile)
    return replace(knobs, pack_a=False, b_in_place=True)


def vector_rows_tiles(target: Target) -> list[tuple[int, int]]:
    """Register tiles (rows, columns) with the rows along the vectors: the usual tiles
    turned around."""
    return [(cols, rows) for rows, cols in tile_choices(target)]


def vector_rows_knobs(shape: GemmShape, target: Target,
                      tile: tuple[int, int] | None = None) -> GemmKnobs:
    """The default blocking of a product with its rows along the vectors: the target's
    tile turned around (or ``tile``), tasks as wide as their scratch block allows, A in
    strips and B in packed panels."""
    if tile is None:
        rows, cols = register_tile_columns(target)
        tile = (cols, rows)
    knobs = default_knobs(shape.m, shape.n, shape.k, shape.batch, target, tile)
    return replace(knobs, nc=min(knobs.nc, fold_columns_limit(knobs.mc, knobs.nr)),
                   pack_a=True, b_in_place=False, vector_rows=True)


class ReplayChooser(GemmChooser):
    """Knobs as a trace recorded them (one entry per product met; None: plain loops)."""

    def __init__(self, target: Target, recorded: list[dict[str, Any] | None], kernel: str):
        super().__init__(target)
        self.recorded = list(recorded)
        self.kernel = kernel

    def _entry(self, index: int) -> GemmKnobs | None:
        if index >= len(self.recorded):
            raise ScheduleError(f"{self.kernel}: the trace lists {len(self.recorded)} matrix "
                                f"product(s) but the kernel has more")
        entry = self.recorded[index]
        return GemmKnobs(**entry) if entry is not None else None

    def knobs(self, index: int, shape: GemmShape) -> GemmKnobs | None:
        return self._entry(index)

    def finish(self, index: int, gemm: Gemm, pack_in_task_legal: bool) -> GemmKnobs:
        knobs = self._entry(index)
        if knobs is None or (knobs.pack_in_task and not pack_in_task_legal):
            raise ScheduleError(f"{self.kernel}: matrix product {index} cannot pack B in its "
                                f"tasks (its panels are shared between tasks)")
        return knobs


class RecordingChooser(GemmChooser):
    """Passes the questions to ``inner`` and keeps the final knobs of every product."""

    def __init__(self, target: Target, inner: GemmChooser | None):
        super().__init__(target)
        self.inner = inner if inner is not None else GemmChooser(target)
        self.final: list[GemmKnobs | None] = []

    def knobs(self, index: int, shape: GemmShape) -> GemmKnobs | None:
        self.final.append(None)  # until finished (a product may still keep its loops)
        return self.inner.knobs(index, shape)

    def finish(self, index: int, gemm: Gemm, pack_in_task_legal: bool) -> GemmKnobs:
        knobs = self.inner.finish(index, gemm, pack_in_task_legal)
        self.final[index] = knobs
        return knobs

    def used(self) -> list[dict[str, Any] | None]:
        return [k.to_dict() if k is not None else None for k in self.final]


def template_pays(shape: GemmShape, target: Target) -> bool:
    """The heuristic: the template pays for products with at least a vector of columns and
    ``MIN_GEMM_WORK`` multiply-adds, and, when B is packed at run time, at least
    ``MIN_ROWS_TO_PACK`` rows (packing costs as much as a product with fewer rows -- a
    depthwise convolution: one row per channel -- gains)."""
    if shape.n < target.lanes_for(DType.FLOAT32) or \
            shape.m * shape.n * shape.k * shape.products < MIN_GEMM_WORK:
        return False
    if reads_a_in_place(shape, target):  # B must be packed already or read in place
        return shape.b_prepacked or shape.b_rows_contiguous
    return shape.b_prepacked or shape.m >= MIN_ROWS_TO_PACK


def default_parallel(gemm: Gemm) -> bool:
    """Tasks run on the thread pool when each batch element's product (or all of them, when
    their panels are packed together) does at least ``PARALLEL_WORK`` multiply-adds."""
    # Sizes a traced build takes at run time count by their class, as the blocking plans
    # them: a decision on the exact size would cut the class (a length of 24 refused by the
    # build traced at 16).
    batch = 1 if gemm.knobs.fold_batch else size_class(math.prod(e for _, e in gemm.batch))
    m, columns, k = size_class(gemm.m), size_class(gemm.columns), size_class(gemm.k)
    per_element = per_element_packing(gemm)
    knobs = gemm.knobs
    blocks = -(-m // knobs.mc) * -(-(-(-columns // knobs.nr)) // (knobs.nc // knobs.nr))
    tasks = blocks if per_element else blocks * batch
    # (one task runs on the caller whatever the knob says: its work is not compared, so a
    # traced size takes no guard for a decision without effect)
    return tasks > 1 and m * columns * k * (1 if per_element else batch) >= PARALLEL_WORK


def per_element_packing(gemm: Gemm) -> bool:
    """Whether B is packed and multiplied one batch element at a time (its panels differ per
    element and the scratch holds one element's)."""
    return gemm.pack is not None and gemm.b_moves_with_batch and gemm.pack.shape[0] == 1 and \
        not gemm.knobs.fold_batch


def panels_in_place_legal(gemm: Gemm) -> bool:
    """Whether a task packing its own panels may leave those that are one run of B's
    columns where they are (``GemmKnobs.b_panels_in_place``): B gathered with its columns
    one element apart (a stride-1 convolution's input)."""
    # (the table of row offsets is a constant of the kernel: sizes known at compile time)
    return gemm.pack is not None and not gemm.b_direct and not gemm.b_packed and \
        not gemm.knobs.vector_rows and \
        bool(gemm.b_j_dims) and gemm.b_j_dims[-1][1] == 1 and not is_traced(gemm.k) and \
        not any(is_traced(value) for dim in gemm.b_k_dims for value in dim)


def can_pack_in_task(gemm: Gemm) -> bool:
    """Whether each task may pack its own panels of B right before multiplying them.

    Packing in the task keeps the panels in the core's L2 between their packing and their use
    (a convolution's im2col B is megabytes: packed all at once, it went to memory and came
    back).  It needs every panel to belong to exactly one task: one block of rows (else each
    row block would pack the same panels again), and per batch element either its own copy of
    the panels or one element at a time."""
    if gemm.pack is None or gemm.b_direct or -(-gemm.m // gemm.knobs.mc) != 1:
        return False
    batch = math.prod(e for _, e in gemm.batch)
    return gemm.knobs.fold_batch or per_element_packing(gemm) or batch == 1 or \
        gemm.pack.shape[0] == batch


def use_gemm_template(func: PrimFunc, target: Target, constant_params: frozenset[int] = frozenset(),
                      chooser: GemmChooser | None = None
                      ) -> tuple[PrimFunc, tuple[Prepack, ...]]:
    """``func`` with every matrix-product nest replaced by a :class:`Gemm`, and the packings
    of constant B operands the caller must apply to the arrays it passes (see
    :class:`Prepack`).  Parameters at ``constant_params`` are compile-time constants;
    ``chooser`` decides each product's knobs (by default, the heuristic)."""
    chooser = chooser if chooser is not None else GemmChooser(target)
    stmts = list(func.body.stmts) if isinstance(func.body, Seq) else [func.body]
    params = list(func.params)
    prepacks: list[Prepack] = []
    scratch = int(func.attr("scratch", 0))
    out: list[Stmt] = []
    position = 0
    products = 0
    while position < len(stmts):
        found = _match_update(stmts, position) or _match_scalar(stmts[position])
        product, consumed = found if found else (None, 1)
        gemm = _to_gemm(product, target) if product is not None else None
        if gemm is not None:
            gemm = _choose_and_pack(gemm, stmts, position, consumed, params, constant_params,
                                    prepacks, chooser, products, len(out))
            products += 1
        if gemm is None:
            out.extend(stmts[position:position + consumed])
            position += consumed
            continue
        if gemm.pack is not None:
            params.append(gemm.pack)
            scratch += 1
        out.append(gemm)
        position += consumed
    if not any(isinstance(s, Gemm) for s in out):
        return func, ()
    attrs = tuple((k, v) for k, v in func.attrs if k != "scratch") + (("scratch", scratch),)
    return PrimFunc(func.name, tuple(params), seq(*out), attrs), tuple(prepacks)


def _choose_and_pack(gemm: Gemm, stmts: list[Stmt], position: int, consumed: int,
                     params: list, constant_params: frozenset[int], prepacks: list[Prepack],
                     chooser: GemmChooser, index: int, emitted: int) -> Gemm | None:
    """Product ``index`` with its knobs chosen and its operands' packing settled (constant
    operands prepacked: ``params`` and ``prepacks`` are updated), or None for plain loops."""
    others = stmts[:position] + stmts[position + consumed:]
    b_elsewhere = any(isinstance(n, (Load, Store)) and n.buffer == gemm.b
                      for s in others for n in walk(s))
    a_param = params.index(gemm.a) if gemm.a in params else -1
    a_elsewhere = any(isinstance(n, (Load, Store)) and n.buffer == gemm.a
                      for s in others for n in walk(s))
    b_param = params.index(gemm.b) if gemm.b in params else -1
    b_prepacked = b_param in constant_params and not gemm.b_moves_with_batch and \
        not b_elsewhere and isinstance(gemm.b_base, Const) and gemm.b_is_matrix
    gathered = len(gemm.b_k_dims) > 1 or len(gemm.b_j_dims) > 1
    products = math.prod(e for _, e in gemm.batch)
    batch = 1 if gemm.b_moves_with_batch else products
    contiguous = not b_prepacked and gemm.b_is_matrix and gemm.b_j_dims[0][1] == 1
    run = gemm.b_j_dims[-1] if gathered and not b_prepacked and gemm.b_j_dims else (0, 0)
    row_width = run[0] if run[1] == 1 and not is_traced(run[0]) else 0
    a_prepacked = a_param in constant_params and not a_elsewhere and gemm.a != gemm.b and \
        isinstance(gemm.a_base, Const) and gemm.m > 1 and not gemm.a_gathered
    knobs = chooser.knobs(index, GemmShape(gemm.m, gemm.n, gemm.k, batch, products,
                                           b_prepacked, gathered,
                                           _foldable(gemm, b_prepacked), contiguous,
                                           row_width, gemm.out_in_runs, a_prepacked,
                                           gemm.a_gathered))
    if knobs is None:
        return None
    gemm = replace(gemm, knobs=knobs)
    if (gathered or knobs.fold_batch or knobs.vector_rows) and not b_prepacked and \
            4 * _panels(gemm) * knobs.nr * gemm.k > MAX_PACK_BYTES:
        return None  # an im2col too large for scratch: the plain loops stream it instead
    if a_prepacked:
        # a constant A (a convolution's weights) in MR-row strips: the transposed
        # matrix packed like B, panels of MR "columns"
        mr = knobs.mr
        strips = Buffer(f"{gemm.a.name}_strips", gemm.a.dtype, (-(-gemm.m // mr), gemm.k, mr))
        prepacks.append(Prepack(a_param, gemm.k, gemm.m, gemm.a_cs, gemm.a_rs,
                                int(gemm.a_base.value), mr))
        params[a_param] = strips
        gemm = replace(gemm, a=strips, a_packed=True, a_base=Const(0, INDEX))
    if b_prepacked:
        packed = Buffer(f"{gemm.b.name}_packed", gemm.b.dtype,
                        (_panels(gemm), gemm.k, knobs.nr))
        (_, rs), = gemm.b_k_dims
        (_, cs), = gemm.b_j_dims
        prepacks.append(Prepack(b_param, gemm.k, gemm.n, rs, cs, int(gemm.b_base.value),
                                knobs.nr))
        params[b_param] = packed
        gemm = replace(gemm, b=packed, b_packed=True, b_base=Const(0, INDEX))
    else:
        # B with contiguous rows is read in place but for its partial last panel; any
        # other B is gathered into panels (per batch element when it moves with them, or
        # all elements' columns as one matrix when the batch is folded)
        direct = gemm.b_is_matrix and gemm.b_j_dims[0][1] == 1 and \
            not knobs.fold_batch and knobs.b_in_place
        panels = (1 if may_be_nonzero(gemm.n % knobs.nr) else 0) if direct \
            else _panels(gemm)
        if panels:
            # every batch element's panels at once (one parallel loop for all) when
            # they fit, else one element at a time
            copies = math.prod(e for _, e in gemm.batch) \
                if gemm.b_moves_with_batch and not knobs.fold_batch else 1
            if copies * panels * gemm.k * knobs.nr * 4 > ALL_COPIES_BYTES:
                copies = 1
            pack = Buffer(f"pack{emitted}", gemm.b.dtype, (copies, panels, gemm.k, knobs.nr))
            gemm = replace(gemm, pack=pack)
        gemm = replace(gemm, b_direct=direct)
    return replace(gemm, knobs=chooser.finish(index, gemm, can_pack_in_task(gemm)))


def _panels(gemm: Gemm) -> int:
    return -(-gemm.columns // gemm.knobs.nr)


def _foldable(gemm: Gemm, b_prepacked: bool) -> bool:
    """Whether the batch may be folded into the columns: a static batch along which B and
    the output move and A does not (so one A serves every element's columns), B packed at
    run time, and all elements' panels within the scratch allowed for them."""
    if not gemm.batch or b_prepacked or not gemm.b_moves_with_batch or \
            any(is_traced(e) for _, e in gemm.batch) or is_traced(gemm.n) or \
            is_traced(gemm.k):
        return False
    batch_vars = {v for v, _ in gemm.batch}
    if any(n in batch_vars for n in walk(gemm.a_base)):
        return False
    widest = 32  # no register tile is wider (16 lanes x 2 vectors): a bound on the padding
    columns = gemm.n * math.prod(e for _, e in gemm.batch)
    return 4 * -(-columns // widest) * widest * gemm.k <= ALL_COPIES_BYTES


# ---------------------------------------------------------------------- matching


def _chain(nest: For) -> list[For]:
    chain = [nest]
    while isinstance(chain[-1].body, For):
        chain.append(chain[-1].body)
    return chain


def _role(stmt: Stmt | None) -> object:
    return dict(stmt.annotations).get("accumulation") if isinstance(stmt, For) else None


def _match_update(stmts: list[Stmt], position: int) -> tuple[_Product, int] | None:
    """``init`` nest, ``update`` nest, optional ``epilogue`` nest starting at ``position``."""
    if _role(stmts[position]) != "init" or position + 1 >= len(stmts) or \
            _role(stmts[position + 1]) != "update":
        return None
    chain = _chain(stmts[position + 1])
    reduce = [l for l in chain if dict(l.annotations).get("reduce")]
    spatial = [l for l in chain if not dict(l.annotations).get("reduce")]
    if not reduce or chain[:len(spatial)] != spatial:
        return None
    notes = dict(reduce[0].annotations)
    store = chain[-1].body
    if not isinstance(store, Store) or "accumulate_init" not in notes:
        return None
    terms = _product_terms(store.value, lambda n: isinstance(n, Load) and
                           n.buffer == store.buffer and n.index == store.index)
    if terms is None:
        return None
    consumed = 2
    finish = notes.get("accumulate_epilogue")
    result = notes.get("accumulate_result")
    if finish is not None:
        if position + 2 >= len(stmts) or _role(stmts[position + 2]) != "epilogue":
            return None
        consumed = 3
    if not isinstance(result, Var):
        result = Var("acc", store.buffer.dtype)
    init = notes["accumulate_init"]
    if not isinstance(init, Expr):
        return None
    return _Product(_loops(spatial), _loops(reduce), store.buffer, store.index, *terms,
                    init, finish, result), consumed


def _match_scalar(stmt: Stmt) -> tuple[_Product, int] | None:
    """``for spatial: alloc t[1]; t = init; for k: t = t + a * b; out[..] = f(t)``."""
    if not isinstance(stmt, For) or _role(stmt) is not None:
        return None
    chain = _chain(stmt)
    body = chain[-1].body
    if not isinstance(body, Allocate) or body.buffer.scope != "local" or \
            body.buffer.size != 1 or not isinstance(body.body, Seq) or len(body.body.stmts) != 3:
        return None
    acc = body.buffer
    start, loop, final = body.body.stmts
    if not (isinstance(start, Store) and start.buffer == acc and isinstance(loop, For) and
            isinstance(final, Store) and final.buffer != acc):
        return None
    reduce = _chain(loop)
    update = reduce[-1].body
    if not isinstance(update, Store) or update.buffer != acc:
        return None
    terms = _product_terms(update.value, lambda n: isinstance(n, Load) and n.buffer == acc)
    if terms is None or any(isinstance(n, Load) and n.buffer == acc
                            for n in walk(start.value)):
        return None
    result = Var("acc", acc.dtype)
    finish = rewrite(final.value, lambda n: result if isinstance(n, Load) and n.buffer == acc
                     else None)
    if any(isinstance(n, Load) and n.buffer in (acc, final.buffer) for n in walk(finish)):
        return None
    return _Product(_loops(chain), _loops(reduce), final.buffer, final.index, *terms,
                    start.value, None if finish == result else finish, result), 1


def _loops(loops: list[For]) -> list[tuple[Var, int]]:
    return [(l.var, as_size(l.extent.value)) if isinstance(l.extent, Const) and
            isinstance(l.start, Const) and l.start.value == 0 else (l.var, -1) for l in loops]


def _product_terms(value: Expr, is_accumulator) -> tuple[Load, Load] | None:
    """The two loads of ``acc + a * b`` (either order of both sums and products)."""
    if not (isinstance(value, Binary) and value.op == "add"):
        return None
    for acc, product in ((value.a, value.b), (value.b, value.a)):
        if is_accumulator(acc) and isinstance(product, Binary) and product.op == "mul" and \
                isinstance(product.a, Load) and isinstance(product.b, Load) and \
                not is_accumulator(product.a) and not is_accumulator(product.b):
            return product.a, product.b
    return None


# ---------------------------------------------------------------------- normal form


def _to_gemm(p: _Product, target: Target) -> Gemm | None:
    if any(e < 1 for _, e in p.spatial + p.reduce):
        return None
    if not (p.out.dtype == p.lhs.dtype == p.rhs.dtype == DType.FLOAT32) or \
            p.lhs.lanes != 1 or p.rhs.lanes != 1 or p.lhs.buffer == p.out or \
            p.rhs.buffer == p.out:
        return None
    if p.lhs.buffer.scope == "local" or p.rhs.buffer.scope == "local":
        return None
    # unit loops disappear
    zero = {v: Const(0, INDEX) for v, e in p.spatial + p.reduce if e == 1}
    p = _substituted(p, zero)
    p = _split_divided_loops(p)
    spatial = [(v, e) for v, e in p.spatial if e > 1]
    reduce = [(v, e) for v, e in p.reduce if e > 1]
    coeffs = [affine_coefficients(simplify(i))
              for i in (p.out_index, p.lhs.index, p.rhs.index)]
    if any(c is None for c in coeffs) or not spatial or not reduce:
        return None
    out_c, lhs_c, rhs_c = coeffs
    # A is the operand that does not move along the innermost output loop
    j_var = spatial[-1][0]
    if lhs_c.get(j_var, 0) and not rhs_c.get(j_var, 0):
        lhs_c, rhs_c = rhs_c, lhs_c
        a_load, b_load = p.rhs, p.lhs
    else:
        a_load, b_load = p.lhs, p.rhs
    extras = [n for n in walk((p.init, p.finish)) if isinstance(n, Load)]
    extra_coeffs = [affine_coefficients(simplify(n.index)) for n in extras]
    pinned = {v for n, c in zip(extras, extra_coeffs) if c is None
              for v in walk(n.index) if isinstance(v, Var)}
    pinned |= {v for v in _free_vars((p.init, p.finish)) if not _only_in_loads(v, p)}
    epilogue_coeffs = [c for c in extra_coeffs if c is not None]
    if any(out_c.get(v, 0) for v, _ in reduce):
        return None
    # 1. loops that every access walks as one merge (a batched matmul's leading dims)
    spatial = _merge(spatial, [out_c, lhs_c, rhs_c, *epilogue_coeffs], pinned)
    reduce = _merge(reduce, [out_c, lhs_c, rhs_c], pinned)
    # 2. B is gathered by the packing, so it may walk the trailing output loops (those A
    # does not move along) and the reduction loops in any affine way: a convolution's input
    # along (output row, output column) and (channel, kernel row, kernel column) is im2col.
    walks = {v: ((e, rhs_c.get(v, 0)),) for v, e in spatial + reduce}
    tail = len(spatial)
    while tail > 0 and not lhs_c.get(spatial[tail - 1][0], 0):
        tail -= 1
    # 3. the output too may walk the trailing output loops in runs (rows of a padded buffer:
    # a convolution storing into the next one's padded input), when that is all that keeps
    # them from merging: the template then stores each tile run by run
    out_walks = _output_runs(spatial[tail:], out_c, [lhs_c, *epilogue_coeffs], pinned)
    if out_walks is None:
        spatial = spatial[:tail] + _merge(spatial[tail:], [out_c, lhs_c, *epilogue_coeffs],
                                          pinned, [walks])
    else:
        spatial = spatial[:tail] + _merge(spatial[tail:], [lhs_c, *epilogue_coeffs], pinned,
                                          [walks, out_walks])
    # 4. A is read in place: its reduction walk is one stride, or (a blocked convolution's
    # input: channel block, kernel row, kernel column, lane) a walk through a table of offsets
    a_walks = {v: ((e, lhs_c.get(v, 0)),) for v, e in reduce}
    if len(_merge(reduce, [dict(out_c), dict(lhs_c)], pinned)) == 1:
        reduce = _merge(reduce, [out_c, lhs_c], pinned, [walks])
        a_k_dims: tuple[tuple[int, int], ...] = ()
    else:
        # (the walk's dims do not join into one: that is the merge just refused)
        reduce = _merge(reduce, [out_c], pinned, [walks, a_walks])
        if len(reduce) != 1 or any(is_traced(v) for dim in a_walks[reduce[0][0]]
                                   for v in dim):
            return None
        a_k_dims = a_walks[reduce[0][0]]
    if len(reduce) != 1:
        return None
    (k_var, k_ext), = reduce
    j_var, n_ext = spatial[-1]
    b_k, b_j = _moves(walks[k_var]) or ((k_ext, 0),), _moves(walks[j_var])
    if out_c.get(j_var, 0) != 1 or lhs_c.get(j_var, 0) or not b_j or \
            not (a_k_dims or lhs_c.get(k_var, 0)):
        return None
    others = spatial[:-1]
    rows = [(v, e) for v, e in others if lhs_c.get(v, 0) and not rhs_c.get(v, 0)]
    i_var, m_ext = rows[-1] if rows else (Var("row", INDEX), 1)
    batch = [(v, e) for v, e in others if v is not i_var]
    out_j_dims = _combine(out_walks[j_var]) if out_walks is not None else ()
    # (a walk in runs spans from its first column to its last: that is its extent here)
    j_span = sum((e - 1) * stride for e, stride in out_j_dims) + 1 if out_j_dims else n_ext
    if len(out_j_dims) == 1:
        out_j_dims = ()  # the runs are adjacent after all: one run
    if not _one_to_one(out_c, [(i_var, m_ext), (j_var, j_span)] + batch) or \
            (out_j_dims and not _one_to_one(dict(enumerate(s for _, s in out_j_dims)),
                                            list(enumerate(e for e, _ in out_j_dims)))):
        return None
    if any(not out_c.get(v, 0) for v, _ in batch):
        return None  # a batch loop must move the output (else it would be a reduction)
    batch_vars = {v for v, _ in batch}

    def base(c: dict) -> Expr:
        expr: Expr = Const(c.get(None, 0), INDEX)
        for v, _ in batch:
            if c.get(v, 0):
                expr = expr + Const(c[v], INDEX) * v
        return simplify(expr)

    result = p.result
    finish = p.finish
    if not (isinstance(p.init, Const) and p.init.value == 0):
        finish = Binary("add", p.init, result) if finish is None else substitute(
            finish, {result: Binary("add", p.init, result)})
    row, col = Var(f"{i_var.name}", INDEX), Var(f"{j_var.name}", INDEX)
    if finish is not None:
        finish = simplify(_rebuild_loads(finish, dict(zip(extras, extra_coeffs)),
                                         {i_var: row, j_var: col}))
        if _free_vars(finish) - batch_vars - {row, col, result}:
            return None
    b_moves_with_batch = any(rhs_c.get(v, 0) for v in batch_vars)
    knobs = _UNCHOSEN  # the chooser's, once it decided that the template pays
    stmt = Gemm(p.out, a_load.buffer, b_load.buffer, None, tuple(batch), m_ext, n_ext, k_ext,
                base(out_c), base(lhs_c), base(rhs_c), out_c.get(i_var, 0),
                lhs_c.get(i_var, 0), 0 if a_k_dims else lhs_c[k_var], b_k, b_j, False,
                row, col, result, finish, knobs, out_j_dims=out_j_dims, a_k_dims=a_k_dims)
    return stmt


def _output_runs(loops: list[tuple[Var, int]], out_c: dict, coeffs: list[dict],
                 pinned: set[Var]) -> dict | None:
    """The output's walks along ``loops`` (one (extent, stride) dim each) when the output
    is all that keeps them from merging into fewer loops -- the others' accesses merge, the
    output's strides do not (rows of a padded buffer) -- and its innermost stride is 1;
    None when the output merges as well as the others (or the loops have traced sizes)."""
    if len(loops) < 2 or any(is_traced(e) for _, e in loops) or \
            any(is_traced(out_c.get(v, 0)) for v, _ in loops) or \
            out_c.get(loops[-1][0], 0) != 1:
        return None
    with_output = _merge(loops, [dict(out_c), *(dict(c) for c in coeffs)], pinned)
    without = _merge(loops, [dict(c) for c in coeffs], pinned)
    if len(without) >= len(with_output):
        return None
    return {v: ((e, out_c.get(v, 0)),) for v, e in loops}


def _split_divided_loops(p: _Product) -> _Product:
    """``p`` with every output loop ``v`` that an index divides by a constant ``c`` (``v // c``,
    ``v % c``, ``c`` a proper divisor of the loop's extent) split into ``v_o`` and ``v_i``,
    ``v = v_o * c + v_i``: then ``v // c`` is ``v_o`` and ``v % c`` is ``v_i``, and the
    indices are affine again.  A grouped convolution reads the input channels of output
    channel ``m``'s group, ``(m // (M / G)) * (C / G) + c``: split, the group is a batch loop
    of products and each group's product takes the template."""
    spatial = list(p.spatial)
    for position in range(len(spatial) - 1, -1, -1):
        var, extent = spatial[position]
        divisors = {n.b.value for n in walk((p.out_index, p.lhs, p.rhs, p.init, p.finish))
                    if isinstance(n, Binary) and n.op in ("floordiv", "floormod") and
                    n.a == var and isinstance(n.b, Const)}
        if extent < 1 or len(divisors) != 1:
            continue
        divisor, = divisors
        if not (isinstance(divisor, int) and 1 < divisor < extent and extent % divisor == 0):
            continue
        outer, inner = Var(f"{var.name}_o", INDEX), Var(f"{var.name}_i", INDEX)

        def quotients(n, var=var, divisor=divisor, outer=outer, inner=inner):
            if isinstance(n, Binary) and n.a == var and isinstance(n.b, Const) and \
                    n.b.value == divisor:
                return {"floordiv": outer, "floormod": inner}.get(n.op)
            return None

        def apply(e: Expr | None, var=var, divisor=divisor, outer=outer,
                  inner=inner) -> Expr | None:
            if e is None:
                return None
            # (the divisions first: the rewrite would otherwise meet ``v`` inside them)
            e = rewrite(e, quotients)
            return simplify(substitute(e, {var: outer * Const(divisor, INDEX) + inner}))

        p = replace(p, out_index=apply(p.out_index), lhs=Load(p.lhs.buffer, apply(p.lhs.index)),
                    rhs=Load(p.rhs.buffer, apply(p.rhs.index)), init=apply(p.init),
                    finish=apply(p.finish))
        spatial[position:position + 1] = [(outer, extent // divisor), (inner, divisor)]
    return replace(p, spatial=spatial)


def _moves(walk: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """A walk, or () when it does not move at all."""
    return walk if any(stride for _, stride in walk) else ()


def _substituted(p: _Product, mapping: dict) -> _Product:
    if not mapping:
        return p
    sub = lambda e: simplify(substitute(e, mapping))  # noqa: E731
    return replace(p, out_index=sub(p.out_index),
                   lhs=Load(p.lhs.buffer, sub(p.lhs.index)),
                   rhs=Load(p.rhs.buffer, sub(p.rhs.index)), init=sub(p.init),
                   finish=sub(p.finish) if p.finish is not None else None)


def _free_vars(node) -> set[Var]:
    return {n for n in walk(node) if isinstance(n, Var)}


def _only_in_loads(var: Var, p: _Product) -> bool:
    """Whether ``var`` occurs in the init and epilogue only inside load indices."""
    def strip(n):
        return Const(0, INDEX) if isinstance(n, Load) else None
    return var not in _free_vars(rewrite((p.init, p.finish), strip))


def _merge(loops: list[tuple[Var, int]], coeffs: list[dict], pinned: set[Var],
           walks: Sequence[dict] = ()) -> list[tuple[Var, int]]:
    """Merge adjacent loops that every access of ``coeffs`` walks as one (``c[outer] ==
    c[inner] * extent(inner)``), rewriting the coefficient dicts in place to the merged
    (inner) variable.  ``walks`` (the (extent, stride) dims per loop of an access that is
    walked rather than indexed -- B when it is gathered, an output in runs -- and need not
    agree) get the merged loop's dims joined."""
    merged = list(loops)
    position = 0
    while position + 1 < len(merged):
        (outer, eo), (inner, ei) = merged[position], merged[position + 1]
        if outer not in pinned and inner not in pinned and \
                all(c.get(outer, 0) == c.get(inner, 0) * ei for c in coeffs):
            for c in coeffs:
                c.pop(outer, None)
            for walk_dims in walks:
                walk_dims[inner] = _combine(walk_dims.pop(outer) + walk_dims[inner])
            merged[position:position + 2] = [(inner, eo * ei)]
        else:
            position += 1
    return merged


def _combine(dims: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """(extent, stride) dims, outer to inner, with adjacent ones that are one walk joined."""
    out: list[tuple[int, int]] = []
    for extent, stride in dims:
        if out and out[-1][1] == stride * extent:
            out[-1] = (out[-1][0] * extent, stride)
        else:
            out.append((extent, stride))
    return tuple(out)


def _one_to_one(coeffs: dict, loops: list[tuple[Var, int]]) -> bool:
    """Whether distinct iterations of ``loops`` store to distinct elements."""
    terms = sorted((coeffs.get(v, 0), e) for v, e in loops if e > 1)
    span = 1
    for coefficient, extent in terms:
        if coefficient < span:
            return False
        span = coefficient * extent
    return True


def _rebuild_loads(expr: Expr, coeffs: dict, rename: dict[Var, Var]) -> Expr:
    """Loads of the epilogue re-indexed from their (merged) coefficients, with the row and
    column variables renamed."""
    def fn(n):
        if isinstance(n, Load) and n in coeffs and coeffs[n] is not None:
            c = coeffs[n]
            index: Expr = Const(c.get(None, 0), INDEX)
            for v, factor in c.items():
                if v is not None and factor:
                    index = index + Const(factor, INDEX) * rename.get(v, v)
            return Load(n.buffer, simplify(index))
        return None
    rebuilt = rewrite(expr, fn)
    return substitute(rebuilt, dict(rename))


# ---------------------------------------------------------------------- knobs


def register_tile(target: Target) -> tuple[int, int]:
    """(rows, vectors per row) of the micro-kernel's register tile for the target: enough
    independent accumulators to cover the FMA latency on every FMA port, leaving registers
    for the B vectors and the broadcast A element."""
    lanes = target.lanes_for(DType.FLOAT32)
    if lanes >= 16:
        return 12, 2        # 24 of 32 zmm registers
    if lanes >= 4:
        return 6, 2         # 12 of 16 ymm/xmm registers
    return 4, 4             # scalar: 16 accumulators


def default_knobs(m: int, n: int, k: int, batch: int, target: Target,
                  tile: tuple[int, int] | None = None) -> GemmKnobs:
    """The default blocking for an ``m x n x k`` product (``batch`` times), with the given
    register tile (rows, columns) or the target's: the tuner searches the same knobs.

    Reduction blocks: ``kc`` terms such that a ``kc x nr`` panel of B takes at most a quarter
    of the L1 data cache (256 terms, else 128), split evenly.  Tasks: about one per
    ``WORK_PER_TASK`` multiply-adds or ``B_BYTES_PER_TASK`` bytes of B, whichever gives more
    (a multiple of the target's threads, at most ``MAX_TASKS``, at least
    ``MIN_TASKS_PER_THREAD`` per thread for products worth sharing), cut along the dimension
    whose operand is cheaper to read again -- every task reads its rows of A against its
    panels of B, so with few rows (an MLP, a batch-1 transformer) the columns are split and
    A is re-read, and with many rows the rows are.
    """
    # sizes a traced build takes at run time are planned for by their class (the blocking is
    # correct for every size: its loops run to the run-time extents)
    m, n, k, batch = (size_class(size) for size in (m, n, k, batch))
    lanes = target.lanes_for(DType.FLOAT32)
    if tile is None:
        mr, vectors = register_tile(target)
        nr = vectors * lanes
        heights = [rows for rows, cols in tile_choices(target) if cols == nr]
        if m < 4 * mr:
            mr = _fewest_padded_rows(m, heights or [mr])
        elif m < MANY_ROWS:
            # a few more strips, but of tiles with at least 2/3 of the accumulators, cost
            # less than a padded last strip: Cout 64 in 12-row tiles computes 72 rows, in
            # 8-row tiles 64 (ResNet-18's 64-channel convolutions 5 % faster on Zen 4)
            mr = _fewest_padded_rows(m, [rows for rows in heights if 3 * rows >= 2 * mr])
    else:
        mr, nr = tile
    kc_target = 256 if nr * 4 * 256 <= target.l1d_bytes else 128
    kc = -(-k // -(-k // kc_target)) if k > kc_target * 5 // 4 else k
    panels = -(-n // nr)
    micro_rows = -(-m // mr)
    work = m * n * k * batch
    streamed = 4 * k * n * batch  # bytes of B the product reads
    tasks = max(1, min(MAX_TASKS, max(work // WORK_PER_TASK, streamed // B_BYTES_PER_TASK)))
    if work >= PARALLEL_WORK * MIN_TASKS_PER_THREAD:
        tasks = max(tasks, MIN_TASKS_PER_THREAD * target.threads)
    if tasks > 1 and target.threads > 1:
        tasks = -(-tasks // target.threads) * target.threads
    per_batch = max(1, -(-tasks // batch))
    blocks_m = min(micro_rows, -(-m // ROWS_PER_TASK))
    if m * k <= k * n:   # A is the smaller operand: split the columns first
        blocks_n = min(panels, max(1, -(-per_batch // blocks_m)))
        blocks_m = min(micro_rows, max(blocks_m, -(-per_batch // blocks_n)))
    else:
        blocks_m = min(micro_rows, max(blocks_m, per_batch))
        blocks_n = min(panels, max(1, -(-per_batch // blocks_m)))
    mc = -(-micro_rows // blocks_m) * mr
    nc = -(-panels // blocks_n) * nr
    # copying A's block pays when enough panels reuse it
    return GemmKnobs(mr, nr, kc, mc, nc, lanes, pack_a=nc // nr >= 4 and m > mr)


def _fewest_padded_rows(m: int, candidates: list[int]) -> int:
    """The tile height that computes the fewest padded rows for ``m`` rows (the tallest on a
    tie): with few rows the last, partial tile is a large share of the work -- 16 rows in
    tiles of 12 compute 24, in tiles of 8 exactly 16 (convolutions of 16 channels and an MLP
    at batch 16 ran 5 % faster)."""
    return min(sorted(set(candidates), reverse=True), key=lambda rows: -(-m // rows) * rows)


def tile_choices(target: Target) -> list[tuple[int, int]]:
    """Register tiles (rows, columns) a search may try: rows by one or two vectors, with the
    accumulators, two B vectors and a broadcast within the target's vector registers."""
    lanes = target.lanes_for(DType.FLOAT32)
    registers = 32 if lanes >= 16 else 16
    if lanes < 4:
        return [register_tile_columns(target)]
    return [(rows, vectors * lanes) for vectors in (1, 2) for rows in (4, 6, 8, 12)
            if rows * vectors + vectors + 1 <= registers]


def register_tile_columns(target: Target) -> tuple[int, int]:
    """The target's default register tile as (rows, columns)."""
    rows, vectors = register_tile(target)
    return rows, vectors * target.lanes_for(DType.FLOAT32)
