"""Statements and functions of the loop-level IR.

A :class:`PrimFunc` is one kernel: buffer (and scalar) parameters and a statement body.  Loops
carry a :class:`ForKind` that schedules set (``parallel`` over threads, ``vectorized`` into SIMD
lanes, ``unrolled``) and codegen honours.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Union

from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Expr, Var


class ForKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"


class Stmt:
    """Base of all statements."""

    def __str__(self) -> str:
        from ember.ir.loop.printer import format_stmt

        return format_stmt(self)


@dataclass(frozen=True)
class For(Stmt):
    """``for var in [start, start + extent)``; ``annotations`` are (key, value) pairs."""

    var: Var
    start: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    annotations: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[index] = value``; vector index and value store lanes; ``mask`` disables lanes."""

    buffer: Buffer
    index: Expr
    value: Expr
    mask: Expr | None = None


@dataclass(frozen=True)
class LetStmt(Stmt):
    """Bind ``var = value`` for the statements of ``body``."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True)
class IfThenElse(Stmt):
    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True)
class Allocate(Stmt):
    """A ``local`` buffer that exists for the duration of ``body``."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class Evaluate(Stmt):
    """Evaluate an expression for its effect (an intrinsic call such as a prefetch)."""

    value: Expr


@dataclass(frozen=True)
class GemmKnobs:
    """The tunable blocking of one :class:`Gemm`: a register tile of ``mr`` rows by ``nr``
    columns (``nr`` a multiple of the vector width), reduction blocks of ``kc`` terms (so a
    ``kc x nr`` panel of B stays in L1 while the rows stream past it), tasks of ``mc``
    rows by ``nc`` columns shared among the threads, whether each task first copies its
    ``mc x kc`` block of A into ``mr``-row strips (``pack_a``: pays when many panels reuse
    it), whether each task packs its own panels of B right before using them instead of one
    loop packing all of B first (``pack_in_task``; the schedule sets it only where every
    panel belongs to one task), whether the tasks run on the thread pool
    (``parallel``), and whether the batch elements are folded into the columns
    (``fold_batch``: one product of ``batch * n`` columns, A streamed once for the whole
    batch; legal where A does not move with the batch and B does, as a convolution's
    weights and its input), and whether a run-time B whose rows are contiguous is read in
    place (``b_in_place``) rather than packed into panels, and whether the tasks that pack
    their own panels of a gathered B leave the panels that are one run of B's columns where
    they are (``b_panels_in_place``: a stride-1 convolution's panel within one output row is
    B's rows ``koff[k]`` apart, read by the micro-kernel through that table).

    With ``vector_rows`` the register tile turns around: ``mr`` rows (a multiple of the
    vector width) lie along the vectors and ``nr`` columns (any count) are broadcast one by
    one, for products with many rows and few columns -- a convolution over a 7x7 image has
    49 columns, four 16-lane vectors' worth (64) of work as columns, none wasted as rows.
    A's strips (``mr`` rows) are then the vector operand and B's panels (``nr`` columns)
    the broadcast one; each task accumulates its block in a scratch, column by column, and
    stores it transposed."""

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    lanes: int
    pack_a: bool = True
    pack_in_task: bool = False
    parallel: bool = True
    fold_batch: bool = False
    b_in_place: bool = True
    b_panels_in_place: bool = False
    vector_rows: bool = False

    def to_dict(self) -> dict[str, int | bool]:
        return {"mr": self.mr, "nr": self.nr, "kc": self.kc, "mc": self.mc, "nc": self.nc,
                "lanes": self.lanes, "pack_a": self.pack_a, "pack_in_task": self.pack_in_task,
                "parallel": self.parallel, "fold_batch": self.fold_batch,
                "b_in_place": self.b_in_place, "b_panels_in_place": self.b_panels_in_place,
                "vector_rows": self.vector_rows}

    @property
    def vector_width(self) -> int:
        """The side of the register tile that lies along the vectors: ``nr``, or ``mr``
        with ``vector_rows``."""
        return self.mr if self.vector_rows else self.nr


@dataclass(frozen=True)
class Gemm(Stmt):
    """``out[o(b) + i*out_rs + j] = finish(sum_k a[a(b) + i*a_rs + k*a_cs] * b[...])``: a
    matrix product expanded by codegen into the blocked GEMM template (``codegen/c_gemm.py``).

    ``batch`` lists the batch loops (variable, extent), whose variables the base offsets
    (``out_base``, ``a_base``, ``b_base``: affine expressions) may use.  B is either read
    through its strides and packed at run time into ``pack`` (a scratch buffer), or, when
    ``b_packed``, it already is the packed layout (panels of ``knobs.nr`` columns: shape
    ``(ceil(n / nr), k, nr)``, zero padded), computed at compile time from a constant.
    B's walk along ``k`` and along ``j`` may each span several loops, ``b_k_dims`` and
    ``b_j_dims`` as (extent, stride) outer to inner: a convolution's input read as
    ``(channel, kernel row, kernel column) x (output row, output column)`` is the im2col
    matrix, which the run-time packing gathers panel by panel.
    ``finish`` is the value stored for each element, an expression of ``result`` (the sum),
    ``row``/``col`` (i, j) and the batch variables; None stores the sum itself.  The epilogue
    runs on each register tile right after it is stored, while it is in L1."""

    out: Buffer
    a: Buffer
    b: Buffer
    pack: Buffer | None
    batch: tuple[tuple[Var, int], ...]
    m: int
    n: int
    k: int
    out_base: Expr
    a_base: Expr
    b_base: Expr
    out_rs: int
    a_rs: int
    a_cs: int
    b_k_dims: tuple[tuple[int, int], ...]
    b_j_dims: tuple[tuple[int, int], ...]
    b_packed: bool
    row: Var
    col: Var
    result: Var
    finish: Expr | None
    knobs: GemmKnobs
    # B is a matrix with contiguous rows (its j stride is 1): full panels are read in place,
    # only the last, narrower one (if any) is copied into ``pack``
    b_direct: bool = False
    # A is a constant packed at compile time into strips of ``knobs.mr`` rows, shape
    # ``(ceil(m / mr), k, mr)`` (a convolution's weights): no run-time copy of A at all
    a_packed: bool = False
    # The output's walk along j as (extent, stride) dims, outer to inner, when its columns
    # are not one run (a convolution storing into the padded buffer of the next one: output
    # rows W wide, W + pads apart); () for consecutive columns
    out_j_dims: tuple[tuple[int, int], ...] = ()
    # A's walk along k as (extent, stride) dims, outer to inner, when it is not one stride
    # (``a_cs`` is then unused): a blocked convolution's input, whose reduction runs over
    # (channel block, kernel row, kernel column, lane) -- the micro-kernel reads A's element
    # ``(i, k)`` at ``i * a_rs + aoff[k]`` through a table of the walk's offsets
    a_k_dims: tuple[tuple[int, int], ...] = ()

    @property
    def a_gathered(self) -> bool:
        """Whether A's reduction walk spans several strides (``a_k_dims``)."""
        return len(self.a_k_dims) > 1

    @property
    def out_in_runs(self) -> bool:
        """Whether the output's columns lie in runs apart from each other (``out_j_dims``):
        then tiles are accumulated in a scratch and stored run by run."""
        return len(self.out_j_dims) > 1

    @property
    def stores_by_runs(self) -> bool:
        """Whether a task accumulates its block in a scratch and stores it run by run (the
        batch folded into the columns, the output in runs, or tiles turned around)."""
        return self.knobs.fold_batch or self.out_in_runs or self.knobs.vector_rows

    @property
    def b_is_matrix(self) -> bool:
        """Whether B is a plain strided matrix (one loop along k, one along j)."""
        return len(self.b_k_dims) == 1 and len(self.b_j_dims) == 1

    @property
    def columns(self) -> int:
        """Columns of the product the template runs: ``n``, or ``batch * n`` when the batch
        is folded into the columns (``knobs.fold_batch``)."""
        if not self.knobs.fold_batch:
            return self.n
        return self.n * math.prod(extent for _, extent in self.batch)

    @property
    def b_moves_with_batch(self) -> bool:
        """Whether B differs between batch elements (then it is packed per element)."""
        from ember.ir.loop.functor import walk

        batch = {v for v, _ in self.batch}
        return any(n in batch for n in walk(self.b_base))

    @property
    def bound_vars(self) -> tuple[Var, ...]:
        """The variables this statement binds for its base offsets and ``finish``."""
        return tuple(v for v, _ in self.batch) + (self.row, self.col, self.result)


Param = Union[Buffer, Var]


@dataclass(frozen=True)
class PrimFunc:
    """One kernel.  ``attrs`` are (key, value) pairs (e.g. the op it came from)."""

    name: str
    params: tuple[Param, ...]
    body: Stmt
    attrs: tuple[tuple[str, object], ...] = field(default=())

    def attr(self, key: str, default: object = None) -> object:
        return dict(self.attrs).get(key, default)

    def with_body(self, body: Stmt) -> "PrimFunc":
        return PrimFunc(self.name, self.params, body, self.attrs)

    def __str__(self) -> str:
        from ember.ir.loop.printer import format_func

        return format_func(self)


def seq(*stmts: Stmt) -> Stmt:
    """A sequence, flattening nested ones; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
